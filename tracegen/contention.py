"""Compute slowed by concurrent communication: the SMs a communication kernel holds are lost to compute.

NCCL runs a collective as one thread block (CTA) per channel, each resident on one SM for the whole
collective; Transformer Engine's userbuffers run their copy kernels on a fixed number of SMs and launch
the overlapped GEMM on the rest (`set_sm_margin`). A compute kernel that runs meanwhile gets the SMs
left: the calibrated GEMM model re-quantizes its tiles into waves of (SMs - CTAs) blocks at (SMs - CTAs)
SMs' worth of tensor throughput (so a GEMM of exactly one wave becomes two, the tail effect NVIDIA's
developer forum reports: a 132-block GEMM on an H100 next to a 24-block ncclAllGather "nearly doubles",
MFU ~80% -> ~47%, thread "Compute-Communication Overlap Causes Severe GEMM Performance Degradation
because of Tail Effect", 2025); fused attention and the roofline model lose the same share of the peak.
Memory-bound kernels keep their time: their HBM bandwidth is not divided by SM count in this model.

The generator decides which nodes run under which communication (tracegen.workload): the DP collectives
on their NCCL stream, the TP collectives a column-parallel linear's backward overlaps on theirs, each
stream placed on the compute-time axis by `busy_fractions`: it is a fact of the
emitted program, not of the replay, so the engine stays a plain dependency-driven replayer. The spec key
`comm_sm_contention: false` turns it off.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from xsim.tracegen.catalog import GpuSpec, tensor_peak

# Transformer Engine userbuffers defaults (transformer_engine/pytorch/module/base.py, initialize_ub's
# get_default_config): "num_sm": 1 if method == "ring_exchange" else 16, "set_sm_margin": not
# ring_exchange. The pipeline and bulk overlaps (ReduceScatter after a GEMM) run their communication on
# 16 SMs and launch the GEMM on the others; ring_exchange moves data with copy engines ("use_ce": True)
# and takes no SM margin.
TE_UB_SMS = 16
TE_SM_MARGIN_METHODS = ("pipeline", "bulk")

# NCCL's CTAs of a DP collective across DGX nodes: one ring graph channel per NIC (8 per DGX A100/H100
# node; netmodels/nccl.py graph_channels, NCCL src/graph/search.cc), which ncclTopoPostset duplicates
# ("Duplication should be complete now": nChannels * 2, NCCL 2.30.7 src/graph/connect.cc) into 16 runtime channels,
# one CTA each. Hopper's further doubling applies only under 16 channels (same file), so 16 on both.
NCCL_DP_CTAS = 16
# NCCL's CTAs of a TP collective inside one DGX node (the overlapped backward collectives of the column-
# parallel linears, Framework.sp_dgrad_overlap / async_dgrad_allreduce): the ring search finds six channels
# at the fastest NVLink speed on DGX A100/H100 (netmodels/nccl.py, graph_channels) and ncclTopoPostset
# duplicates them ("Duplication should be complete now": nChannels * 2, src/graph/connect.cc); Hopper's
# four runtime channels per search channel apply only across nodes (`comm->nNodes > 1`, same file). A TP
# group spanning nodes holds NCCL_DP_CTAS, as a DP collective does.
NCCL_TP_CTAS = 12


def with_free_sms(gpu: GpuSpec, busy: int) -> GpuSpec:
    """`gpu` as a compute kernel sees it while `busy` SMs run communication: fewer SMs, the tensor peaks
    scaled by the SMs left (each SM contributes peak / SMs)."""
    if busy <= 0 or gpu.sms <= 0:
        return gpu
    left = max(1, gpu.sms - busy)
    share = left / gpu.sms
    if gpu.fp8_flops is None:
        return replace(gpu, sms=left, peak_flops=gpu.peak_flops * share)
    # The FP8 peak as tensor_peak resolves it, then marked overridden so it is not rescaled by peak_flops.
    fp8 = tensor_peak(gpu, "fp8") * share
    return replace(
        gpu,
        sms=left,
        peak_flops=gpu.peak_flops * share,
        fp8_flops=fp8,
        overridden=gpu.overridden | {"fp8_flops"},
    )


@dataclass(frozen=True)
class SystemLinks:
    """Line rates a DP collective's time is estimated from: per GPU per direction, bytes/s."""

    gpus_per_node: int
    nvlink: float
    nic: float


# The DGX presets' line rates (netmodels/presets.py SYSTEM_PRESETS, from the DGX A100 / H100 datasheets;
# tracegen does not import netmodels, tests/test_gen_contention.py checks the two agree). A cluster without
# a system preset has no estimate: its DP collectives are taken in flight up to their first consumer.
SYSTEM_LINKS: dict[str, SystemLinks] = {
    "dgx-a100": SystemLinks(8, 300e9, 200e9 / 8),
    "dgx-a800": SystemLinks(8, 200e9, 200e9 / 8),
    "dgx-h100": SystemLinks(8, 450e9, 400e9 / 8),
}


@dataclass(frozen=True)
class CommWindow:
    """One DP collective on the rank's DP stream: the node it is issued after, its first consumer, and its
    estimated seconds (inf: unknown)."""

    issue: int
    consumer: int
    seconds: float


def wire_seconds(kind: str, size: int, members: Sequence[int], links: SystemLinks | None) -> float:
    """Time of a ring collective at the line rate: the bytes each rank sends ((p-1)/p of the buffer; an
    AllReduce twice; Chakra's AllGather size is the per-rank input) over its NIC when the group spans
    nodes (ranks fill nodes in order), else over NVLink. inf without `links`."""
    p = len(members)
    if links is None:
        return math.inf
    if p < 2:
        return 0.0
    sent = {"all_gather": size * (p - 1), "all_reduce": 2 * size * (p - 1) / p}.get(kind, size * (p - 1) / p)
    nodes = {r // links.gpus_per_node for r in members}
    return sent / (links.nic if len(nodes) > 1 else links.nvlink)


def comm_ctas(members: Sequence[int], links: SystemLinks | None) -> int:
    """CTAs a TP-group collective holds: NCCL_TP_CTAS inside a node, NCCL_DP_CTAS across nodes."""
    if links is not None and len({r // links.gpus_per_node for r in members}) > 1:
        return NCCL_DP_CTAS
    return NCCL_TP_CTAS


def busy_fractions(comp: Sequence[tuple[int, int]], windows: Sequence[CommWindow]) -> dict[int, float]:
    """For compute nodes `comp` ((id, ns) in stream order): the fraction of each node's time a DP collective
    is in flight. On the stream's compute-time axis (idle time not counted), a collective starts when it is
    issued and the previous one is done, and lasts its seconds, or until its first consumer, which waits
    for it (the axis stands still meanwhile)."""
    ids = [n for n, _ in comp]
    t = [0]
    for _, ns in comp:
        t.append(t[-1] + ns)
    spans, prev_end = [], 0.0
    for w in windows:
        start = max(float(t[bisect.bisect_left(ids, w.issue)]), prev_end)
        end = start + w.seconds * 1e9
        # A consumer that waits stops the axis until the collective is done: it ends there on the axis.
        stop = prev_end = min(end, float(t[bisect.bisect_left(ids, w.consumer)]))
        if stop > start:
            spans.append((start, stop))
    spans.sort()
    out: dict[int, float] = {}
    j = 0
    for k, (nid, ns) in enumerate(comp):
        lo, hi = t[k], t[k] + ns
        while j < len(spans) and spans[j][1] <= lo:
            j += 1
        busy, i = 0.0, j
        while i < len(spans) and spans[i][0] < hi:
            busy += min(hi, spans[i][1]) - max(lo, spans[i][0])
            i += 1
        if busy > 0 and ns > 0:
            out[nid] = min(1.0, busy / ns)
    return out
