"""DGX system presets (`cluster: dgx-a100`, `--topology dgx-h100:N`): hardware line rates, collectives as NCCL
runs them (netmodels/nccl.py), checked against closed forms and published nccl-tests bus bandwidths."""

from __future__ import annotations

import json

import pytest
from xsim.netmodels import AnalyticalModel, FlowModel, build_cluster, topology_from_spec
from xsim.netmodels.api import CollectiveSpec, simulate_collective
from xsim.netmodels.errors import TopologyError
from xsim.netmodels.presets import SYSTEM_PRESETS
from xsim.tracegen import load_spec
from xsim.tracegen.spec import CLUSTER_SYSTEMS

GB = 1e9
SIZE = 1 << 30


def _busbw(topo, n: int, algorithm: str, model=AnalyticalModel) -> float:
    spec = CollectiveSpec("all_reduce", SIZE, tuple(range(n)), algorithm=algorithm)
    t = simulate_collective(model(topo), spec).finish_ns * 1e-9
    return 2 * (n - 1) / n * SIZE / t  # nccl-tests' AllReduce bus bandwidth


@pytest.mark.parametrize("model", [AnalyticalModel, FlowModel])
@pytest.mark.parametrize(
    ("system", "nccl_model", "published"),
    # NCCL's own figure: NVLinks x per-link bandwidth of NVIDIA/nccl src/graph/topo.h (12 x 20.0 on A100,
    # 18 x 20.6 on H100). Published ring busBw (validation, not fitted): ~230 GB/s on 8 A100
    # (nccl-tests#149), 370 GB/s on 8 H100 (nccl-tests#212).
    [("dgx-a100", 240 * GB, 230 * GB), ("dgx-h100", 370.8 * GB, 370 * GB)],
)
def test_one_dgx_node_ring_allreduce_reaches_nccl_busbw(system, nccl_model, published, model):
    # 1 GiB runs with the Simple protocol, whose latency NCCL's tuning model puts at 8.4 + 14 x 3.4 = 56 us
    # for 14 NVLink ring steps (tuning.cc baseLat, hwLat); a uniform ring adds it whole.
    spec = CollectiveSpec("all_reduce", SIZE, tuple(range(8)), algorithm="ring")
    t = simulate_collective(model(topology_from_spec(f"{system}:1")), spec).finish_ns
    assert t == pytest.approx(2 * 7 / 8 * SIZE / nccl_model * 1e9 + 56_000, rel=0.002)
    assert 2 * 7 / 8 * SIZE / (t * 1e-9) == pytest.approx(published, rel=0.05)


def test_dgx_presets_are_line_rates_with_named_nics():
    a, h = SYSTEM_PRESETS["dgx-a100"], SYSTEM_PRESETS["dgx-h100"]
    assert (a.nvlink_bandwidth, h.nvlink_bandwidth) == (300 * GB, 450 * GB)  # per direction
    assert (a.nic_bandwidth, h.nic_bandwidth) == (200e9 / 8, 400e9 / 8)  # ConnectX-6 / ConnectX-7
    assert "ConnectX-6" in a.nic and "ConnectX-7" in h.nic
    assert CLUSTER_SYSTEMS == tuple(SYSTEM_PRESETS)


def test_four_dgx_a100_nodes_hierarchical_closed_form():
    # Intra-node ReduceScatter and AllGather (7 steps of S/8 on NVLink at NCCL's 12 x 20 = 240 GB/s) around
    # an inter-node ring AllReduce of S/8 over 4 nodes, one per NIC at the 25 GB/s line rate: 2*3 steps of
    # S/32. (Was 230 and 24 GB/s when the preset baked nccl-tests' efficiencies into its links.)
    topo = topology_from_spec("dgx-a100:4")
    spec = CollectiveSpec("all_reduce", SIZE, tuple(range(32)), algorithm="hierarchical")
    expect = (2 * 7 * SIZE / 8 / (240 * GB) + 2 * 3 * SIZE / 32 / (25 * GB)) * 1e9
    for model in (AnalyticalModel, FlowModel):
        assert simulate_collective(model(topo), spec).finish_ns == pytest.approx(expect, rel=0.002)


def test_spec_cluster_preset_derives_the_node_count():
    spec = {
        "model": "llama2-7b",
        "cluster": "dgx-a100",
        "device_groups": [{"gpu": "A100-80GB", "ranks": "0-19", "tp": 20, "layers": [1, 32]}],
        "allow_uneven_tp": True,
    }
    dep = load_spec(spec)
    desc = json.loads(dep.cluster_json)
    assert desc["system"] == "dgx-a100" and len(desc["gpus"]) == 20
    topo = build_cluster(desc)
    assert topo.num_ranks == 20 and len(set(topo.rank_hosts)) == 3  # 8 + 8 + 4
    # Ranks 0 and 8 sit on different nodes: the route's bottleneck is the HDR NIC's 25 GB/s line rate;
    # inside a node the NVLink line rate (the topology holds hardware; NCCL's share is the models').
    assert topo.route(0, 8).bottleneck_bytes_per_ns == pytest.approx(25.0)
    assert topo.route(0, 7).bottleneck_bytes_per_ns == pytest.approx(300.0)
    assert topo.collectives == "nccl"


def test_system_presets_reject_foreign_gpus_and_bad_counts():
    with pytest.raises(TopologyError, match="dgx-h100 holds H100 or H200 GPUs; rank 0 has A100"):
        build_cluster({"system": "dgx-h100", "gpus": ["A100"]})
    for bad in ("dgx-h100:0", "dgx-h100:x", "dgx-a100:"):
        with pytest.raises(TopologyError):
            topology_from_spec(bad)


@pytest.mark.parametrize("model", [AnalyticalModel, FlowModel])
def test_dgx_a800_is_the_dgx_a100_with_two_thirds_of_its_nvlink(model):
    """DGX A800: the DGX A100's GPUs (A100-80GB compute), NICs and delays with NVLink at 400 GB/s total,
    200 GB/s per direction. NCCL's figure is then 8 NVLinks x SM80_NVLINK_BW 20.0 = 160 GB/s (the preset's
    200 GB/s x the A100's 20/25 link efficiency), so one node's 1 GiB ring all-reduce takes, by hand,
    2 x 7/8 x 2^30 / 160e9 s = 11.744 ms + NCCL's 56 us of Simple-protocol latency = 11.800 ms: 1.5x the
    DGX A100's bandwidth term."""
    a, a8 = SYSTEM_PRESETS["dgx-a100"], SYSTEM_PRESETS["dgx-a800"]
    assert a8.nvlink_bandwidth == 200 * GB and a.nvlink_bandwidth == 1.5 * a8.nvlink_bandwidth
    assert (a8.gpus, a8.gpus_per_node, a8.nic, a8.nic_bandwidth) == (
        ("A100-80GB",),
        8,
        a.nic,
        a.nic_bandwidth,
    )
    assert (a8.interconnect_row, a8.nic_latency_ns) == (a.interconnect_row, a.nic_latency_ns)
    spec = CollectiveSpec("all_reduce", SIZE, tuple(range(8)), algorithm="ring")
    t = simulate_collective(model(topology_from_spec("dgx-a800:1")), spec).finish_ns
    assert 2 * 7 / 8 * SIZE / 160e9 * 1e9 == pytest.approx(11_744_051, abs=1)
    assert t == pytest.approx(11_744_051 + 56_000, rel=0.002)
    spec_a = simulate_collective(model(topology_from_spec("dgx-a100:1")), spec).finish_ns
    assert (t - 56_000) == pytest.approx(1.5 * (spec_a - 56_000), rel=0.002)
