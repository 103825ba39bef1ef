"""Blackwell system presets (`cluster: dgx-b200`, `cluster: gb200-nvl72`): datasheet line rates, the
72-GPU NVLink domain of a GB200 NVL72 rack, NCCL's view of NVLink 5; each against a hand count."""

from __future__ import annotations

import pytest
from xsim.netmodels import AnalyticalModel, topology_from_spec
from xsim.netmodels.api import CollectiveSpec, simulate_collective
from xsim.netmodels.cluster import system_cluster
from xsim.netmodels.errors import TopologyError
from xsim.netmodels.presets import SYSTEM_PRESETS
from xsim.tracegen import load_spec
from xsim.tracegen.contention import SYSTEM_LINKS, comm_ctas, nccl_node_channels

GB = 1e9
SIZE = 1 << 30


def test_blackwell_presets_are_datasheet_line_rates() -> None:
    b, g = SYSTEM_PRESETS["dgx-b200"], SYSTEM_PRESETS["gb200-nvl72"]
    # NVLink 5: 1.8 TB/s per GPU both ways = 900 GB/s per direction; one 400 Gb/s ConnectX-7 per GPU
    assert (b.nvlink_bandwidth, g.nvlink_bandwidth) == (900 * GB, 900 * GB)
    assert (b.nic_bandwidth, g.nic_bandwidth) == (50 * GB, 50 * GB)
    assert "ConnectX-7" in b.nic and "ConnectX-7" in g.nic
    assert (b.gpus, b.gpus_per_node, g.gpus, g.gpus_per_node) == (("B200",), 8, ("GB200",), 72)


def test_gb200_nvl72_rack_is_one_nvlink_domain() -> None:
    # 80 GPUs: one full rack of 72 and 8 in a second; 16 DGX B200 GPUs: two nodes of 8
    nodes = system_cluster("gb200-nvl72", 80)["nodes"]
    assert [len(n["ranks"]) for n in nodes] == [72, 8]
    assert {n["scale_up_bandwidth"] for n in nodes} == {900 * GB} and {n["gpu"] for n in nodes} == {"GB200"}
    assert [len(n["ranks"]) for n in system_cluster("dgx-b200", 16)["nodes"]] == [8, 8]
    with pytest.raises(TopologyError):
        system_cluster("gb200-nvl72", 8, gpus=["B200"] * 8)


def test_nvlink5_ring_allreduce_at_nccl_rate_inside_a_rack() -> None:
    # 16 GPUs of one NVL72 rack: NCCL's 18 x 40.1 = 721.8 GB/s per GPU (SM100_NVLINK_BW), Simple protocol,
    # latency 8.4 + 30 x 3.4 = 110.4 us for 30 ring steps (as the DGX presets' test: 14 steps, 56 us)
    spec = CollectiveSpec("all_reduce", SIZE, tuple(range(16)), algorithm="ring")
    t = simulate_collective(AnalyticalModel(topology_from_spec("gb200-nvl72:1")), spec).finish_ns
    assert t == pytest.approx(2 * 15 / 16 * SIZE / (721.8 * GB) * 1e9 + 110_400, rel=0.002)


def test_nccl_channels_on_nvlink5_by_hand() -> None:
    # total 18 x 40.1 = 721.8 GB/s; SM100 speeds: 90 -> 8 channels (720), 80 -> 9 (720, not larger), 70 -> 10,
    # 60 -> 12, 50 -> 14, 40 -> 16 (cap 16: 640); 30 / 90 <= 0.49 stops: 8 at 90; duplicated (90 >= 25) to 16
    # at 45; no faster speed fits 16 (50: 14); ncclTopoPostset doubles: 32
    assert nccl_node_channels(18, 40.1, False, True) == 32
    assert comm_ctas(range(8), SYSTEM_LINKS["dgx-b200"]) == 32
    assert comm_ctas(range(64), SYSTEM_LINKS["gb200-nvl72"]) == 32  # one rack: inside the NVLink domain


def test_spec_names_the_blackwell_clusters() -> None:
    model = {"name": "t", "layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 8}
    dep = load_spec({"model": model, "parallel": {"gpu": "GB200", "dp": 8}, "cluster": "gb200-nvl72"})
    assert sum(len(dg.ranks) for dg in dep.device_groups) == 8
    load_spec({"model": model, "parallel": {"gpu": "B200", "dp": 8}, "cluster": "dgx-b200"})
