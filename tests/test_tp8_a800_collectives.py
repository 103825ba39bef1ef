"""The sequence-parallel collectives of the FlagPerf TP rows on one DGX A800 (issue 22, round tp8).

Each SP AllGather / ReduceScatter of Llama 3 8B at s 8192, micro-batch 1 moves the [s, b, h] bf16 activation:
8192 x 4096 x 2 B = 64 MiB in all, at every TP degree. xsim times it as NCCL's tuning model does
(netmodels/nccl.py, NVIDIA/nccl src/graph/tuning.cc): ring/Simple, baseLat 8.4 us + (p - 1) x 3.4 us
(hwLat NVLINK Ring Simple), plus the bytes each rank sends, (p - 1)/p x 64 MiB, over 8 NVLinks x 20 GB/s
(SM80_NVLINK_BW) = 160 GB/s, plus the preset's link latency, GPU -> NVSwitch -> GPU = 2 x 30.66 ns a step.
These tests pin that arithmetic; docs/validation.md (round tp8) compares it with published A800 timings.
"""

from __future__ import annotations

import pytest
from xsim.netmodels import AnalyticalModel, build_cluster
from xsim.netmodels.api import CollectiveSpec, simulate_collective
from xsim.netmodels.cluster import system_cluster
from xsim.tracegen.contention import SYSTEM_LINKS, nccl_node_channels

SP_BYTES = 8192 * 4096 * 2  # s x h x 2 B = 67,108,864 B = 64 MiB


def _a800_ns(kind: str, p: int) -> int:
    """One SP collective of SP_BYTES among the first `p` GPUs of a DGX A800, ns."""
    topo = build_cluster(system_cluster("dgx-a800", 8, ["A100-80GB"] * 8))
    size = SP_BYTES // p if kind == "all_gather" else SP_BYTES  # Chakra: AllGather's size is per rank
    return simulate_collective(
        AnalyticalModel(topo), CollectiveSpec(kind, size, tuple(range(p)), None)
    ).finish_ns


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize(
    ("p", "expected_ns"),
    [
        # TP 8: 8.4 + 7 x 3.4 = 32.2 us; 7/8 x 67,108,864 B / 160 GB/s = 367,001.6 ns; 7 x 61.32 = 429.24 ns
        # -> 399,630.84 ns (busBw 7/8 x 64 MiB / 399.63 us = 146.9 GB/s)
        (8, 399_631),
        # TP 4: 8.4 + 3 x 3.4 = 18.6 us; 3/4 x 67,108,864 / 160 = 314,572.8 ns; 3 x 61.32 = 183.96 ns
        # -> 333,356.76 ns
        (4, 333_357),
        # TP 2: 8.4 + 3.4 = 11.8 us; 1/2 x 67,108,864 / 160 = 209,715.2 ns; 61.32 ns -> 221,576.52 ns
        (2, 221_577),
    ],
)
def test_sp_collective_on_dgx_a800_is_nccls_tuning_model(kind: str, p: int, expected_ns: int) -> None:
    """The 64 MiB SP AllGather and ReduceScatter cost NCCL's ring/Simple prediction on the A800."""
    assert _a800_ns(kind, p) == pytest.approx(expected_ns, abs=1)


def test_sp_collective_holds_sixteen_sms_on_dgx_a800() -> None:
    """An overlapped TP collective on the A800 holds NCCL's 16 runtime channels (CTAs): 8 x 20 = 160 GB/s
    fits 4 channels at search speed 40, duplicated to 8 at 20 (speed >= 25) and doubled again in
    ncclTopoPostset -> 16 (tracegen/contention.py nccl_node_channels)."""
    links = SYSTEM_LINKS["dgx-a800"]
    assert nccl_node_channels(links.nvlinks, links.nccl_link_gbps, links.sm90) == 16


# -- round a800tp: the xsim figures the A800 evidence is set against (docs/validation.md, round a800tp) ----


@pytest.mark.parametrize(
    ("size", "expected_ns"),
    [
        # The A800 AllReduce curve's 64 MiB point (8 ranks): ring/Simple, 2 x 7 = 14 steps:
        # 8.4 + 14 x 3.4 = 56.0 us; 2 x 7/8 x 67,108,864 B / 160 GB/s = 734,003.2 ns; 14 x 61.32 ns = 858.48 ns
        # -> 790,861.68 ns. Each step moves 67,108,864 / 8 / 16 channels = 512 KiB a channel, as the TP 8 SP
        # AllGather's 7 steps do (8 MiB a rank / 16 channels).
        (SP_BYTES, 790_862),
        # Vocab-parallel cross-entropy's per-token FP32 AllReduce at s 8192 (32 KiB; core_v0.6.0 runs three,
        # xsim one of 96 KiB): ring/LL, 6.6 + 14 x 0.6 = 15.0 us; LL's busBw 0.5 x 160 = 80 GB/s (under
        # llMaxBw 87.7): 2 x 7/8 x 32,768 B / 80 GB/s = 716.8 ns; 14 x 61.32 = 858.48 ns -> 16,575.28 ns.
        (32_768, 16_576),
    ],
)
def test_allreduce_on_dgx_a800_by_hand(size: int, expected_ns: int) -> None:
    """The AllReduce figures round a800tp compares with published A800 timings."""
    topo = build_cluster(system_cluster("dgx-a800", 8, ["A100-80GB"] * 8))
    got = simulate_collective(
        AnalyticalModel(topo), CollectiveSpec("all_reduce", size, tuple(range(8)), None)
    )
    assert got.finish_ns == pytest.approx(expected_ns, abs=1)
