"""NVLink SHARP in NCCL mode: NVLS on one node, NVLS_TREE across nodes (netmodels/nccl.py, issue 23).

Expected values are worked out by hand from NVIDIA/nccl's tuning model (src/graph/tuning.cc, search.cc,
NCCL 2.30.7) and the DGX presets' link rates, and checked against published measurements where there are.
"""

from __future__ import annotations

import pytest

from netmodels import CollectiveSpec, build_cluster, simulate_collective, topology_from_spec
from netmodels.analytical import AnalyticalModel
from netmodels.errors import AlgorithmError
from netmodels.flow import FlowModel
from netmodels.nccl import nvls_graph, nvls_group_graph

GIB = 1 << 30
# NCCL's NVLink bandwidth of an H100: 18 links x SM90_NVLINK_BW 20.6 GB/s (topo.h).
H100_NVLINK = 18 * 20.6


def test_nvls_graph_follows_nccls_search():
    # One node of 8: every GPU heads one channel, the busiest NVSwitch link carries 9 s <= 370.8 -> s = 40
    # (sm90SpeedArrayIntra 60, 50, 40); the inter bandwidth rises while under 2 x 40: 50, 60 (the top).
    one = nvls_graph("hopper", 8, 1, H100_NVLINK, float("inf"), 8)
    assert (one.algorithm, one.channels, one.bw_intra, one.bw_inter) == ("nvls", 8, 40.0, 60.0)
    # Four GPUs: 5 s <= 370.8 -> 60.
    assert nvls_graph("hopper", 4, 1, H100_NVLINK, float("inf"), 4).bw_intra == 60.0
    # Across nodes (sm90SpeedArrayInter, NIC 50 GB/s): 48 -> 6 channels, 45 -> 7, 42 -> 7, 40 -> 8 (all heads,
    # the search stops); then the inter bandwidth rises 42, 45, 48 (the NIC's 50 stops it there).
    multi = nvls_graph("hopper", 8, 2, H100_NVLINK, 50.0, 8)
    assert (multi.algorithm, multi.channels, multi.bw_intra, multi.bw_inter) == ("nvls_tree", 8, 40.0, 48.0)
    # Blackwell: 18 x SM100_NVLINK_BW 40.1 = 721.8; 9 s <= 721.8 -> 80 (sm100SpeedArrayIntra 90, 80).
    assert nvls_graph("blackwell", 8, 1, 18 * 40.1, float("inf"), 8).bw_intra == 80.0
    # No NVLS before Hopper, with one GPU per node, or with one NIC per node (one head: under 2 channels).
    assert nvls_graph("ampere", 8, 1, 240.0, float("inf"), 8) is None
    assert nvls_graph("hopper", 1, 4, H100_NVLINK, 50.0, 1) is None
    assert nvls_graph("hopper", 8, 2, H100_NVLINK, 50.0, 1) is None
    # The presets: dgx-h100 has it, dgx-a100 and the paper's nodes: clusters (no NCCL mode) do not run it.
    assert nvls_group_graph(topology_from_spec("dgx-h100:1"), tuple(range(8))) == one
    assert nvls_group_graph(topology_from_spec("dgx-h100:2"), tuple(range(16))) == multi
    assert nvls_group_graph(topology_from_spec("dgx-a100:1"), tuple(range(8))) is None


def test_nvls_allreduce_one_dgx_h100_hand_computed():
    # busBw = 8 channels x 40 x 0.85 (nvlsEfficiency, Hopper) x 7/8 x 2 (AllReduce) = 476 GB/s; algorithm
    # bandwidth 476 x 8/14 = 272 GB/s; latency 25 us (hwLatencies NVLINK NVLS); plus the route's 2 x 20.44 ns.
    topo = topology_from_spec("dgx-h100:1")
    spec = CollectiveSpec("all_reduce", GIB, tuple(range(8)))
    expect = 25_000 + GIB / 272.0 + 2 * 20.44
    for model in (AnalyticalModel(topo), FlowModel(topo)):
        assert simulate_collective(model, spec).finish_ns == pytest.approx(expect, abs=1)
    assert AnalyticalModel(topo).nccl_choice(spec) == ("nvls", "Simple")
    # Bus bandwidth 1.75 S / t = 473 GB/s. Published: "busbw: 370 -> 480 GB/s" with NVLS on 8 H100 (NCCL
    # 2.30.4, NVIDIA/nccl#2140); "when running with NVLS and getting 480GB/s" (S. Jeaugey, nccl-tests#212).
    busbw = 1.75 * GIB / expect
    assert busbw == pytest.approx(473.0, abs=0.5)
    assert abs(busbw / 480 - 1) < 0.02


def test_nccl_switches_from_ring_ll_to_nvls_at_the_hand_computed_size():
    # ring/LL: 6.6 + 14 x 0.6 = 15 us + S / (141 x 8/14 GB/s) (LL's busBw capped at llMaxBw 141 on Hopper);
    # NVLS: 25 us + S / 272 GB/s. Equal at S = 10 us / (14/(8 x 141) - 1/272) = 1.145 MB.
    cross = 10_000 / (14 / (8 * 141.0) - 1 / 272.0)
    assert cross == pytest.approx(1.1448e6, rel=1e-3)
    model = AnalyticalModel(topology_from_spec("dgx-h100:1"))
    ranks = tuple(range(8))
    assert model.nccl_choice(CollectiveSpec("all_reduce", int(cross * 0.98), ranks)) == ("ring", "LL")
    assert model.nccl_choice(CollectiveSpec("all_reduce", int(cross * 1.02), ranks)) == ("nvls", "Simple")
    # Published (NVIDIA/nccl-tests#309, NCCL's own log on one 8-GPU H100 node): "8B~1MB: uses Algo RING proto
    # LL", "2MB~16GB uses Algo NVLS proto SIMPLE".
    assert model.nccl_choice(CollectiveSpec("all_reduce", 1 << 20, ranks)) == ("ring", "LL")
    assert model.nccl_choice(CollectiveSpec("all_reduce", 2 << 20, ranks)) == ("nvls", "Simple")
    assert model.nccl_choice(CollectiveSpec("all_reduce", 16 << 30, ranks)) == ("nvls", "Simple")


def test_nvls_reduce_scatter_and_all_gather_lose_to_the_ring_on_one_node():
    # NVLS RS/AG: 8 x 40 x 0.85 x 7/8 x 7/8 ((ppn-1)/ppn) = 208.25 GB/s over the whole buffer, against the
    # ring's 370.8 x 8/7 = 423.8: NCCL keeps the ring (as measured: NVIDIA/nccl#1047, #1083).
    topo = topology_from_spec("dgx-h100:1")
    model = AnalyticalModel(topo)
    ranks = tuple(range(8))
    assert model.nccl_choice(CollectiveSpec("reduce_scatter", GIB, ranks)) == ("ring", "Simple")
    assert model.nccl_choice(CollectiveSpec("all_gather", GIB // 8, ranks)) == ("ring", "Simple")
    forced = simulate_collective(model, CollectiveSpec("reduce_scatter", GIB, ranks, "nvls")).finish_ns
    assert forced == pytest.approx(25_000 + GIB / 208.25 + 2 * 20.44, abs=1)
    ag = simulate_collective(model, CollectiveSpec("all_gather", GIB // 8, ranks, "nvls")).finish_ns
    assert ag == pytest.approx(forced, abs=1)  # the same whole buffer


def test_nvls_tree_four_nodes_hand_computed_and_ring_for_large():
    # 4 DGX H100: per channel min(40 x 0.85 x 7/8 x 2 = 59.5, bwInter 48, perChMaxNVLSTreeBw 45.5) = 45.5;
    # 8 channels -> busBw 364, algorithm bandwidth 364 x 32/62; latency 25 + 2 x log2(4) x 20.9 = 108.6 us.
    topo = topology_from_spec("dgx-h100:4")
    model = AnalyticalModel(topo)
    ranks = tuple(range(32))
    size = 64 << 20
    spec = CollectiveSpec("all_reduce", size, ranks)
    assert model.nccl_choice(spec) == ("nvls_tree", "Simple")
    nic_path = 2 * 287.5 + 2 * 368  # GPU -> NIC -> switch -> NIC -> GPU delays
    assert simulate_collective(model, spec).finish_ns == pytest.approx(
        108_600 + size / (364 * 32 / 62) + nic_path, abs=1
    )
    # At 1 GiB the ring's 8 NICs x 50 GB/s busBw beats NVLS_TREE's 364 (as measured: NVLS on or off gives
    # the same busBw beyond 2 nodes, NVIDIA/nccl#1221).
    assert model.nccl_choice(CollectiveSpec("all_reduce", GIB, ranks)) == ("ring", "Simple")


def test_nvls_transfers_share_links_in_the_flow_model():
    # Two NVLS AllReduces on the same 8 GPUs at once: each NVSwitch link carries both, so each takes twice
    # the bandwidth time (25 us latency once): 25 us + 2 S / 272 GB/s.
    topo = topology_from_spec("dgx-h100:1")
    model = FlowModel(topo)
    size = 256 << 20
    spec = CollectiveSpec("all_reduce", size, tuple(range(8)))
    model.start_collective(0, spec)
    model.start_collective(0, spec)
    done = []
    while (t := model.next_event_ns()) is not None:
        done += model.advance(t)
    assert [c.finish_ns for c in done] == pytest.approx([25_000 + 2 * size / 272.0 + 2 * 20.44] * 2, abs=2)


def test_nvls_bad_requests_are_one_error_line():
    ranks = tuple(range(8))
    with pytest.raises(AlgorithmError, match="NVLS needs Hopper"):
        AnalyticalModel(topology_from_spec("dgx-a100:1")).fixed_collective_ns(
            CollectiveSpec("all_reduce", GIB, ranks, "nvls")
        )
    with pytest.raises(AlgorithmError, match="Simple protocol only"):
        AnalyticalModel(topology_from_spec("dgx-h100:1")).fixed_collective_ns(
            CollectiveSpec("all_reduce", GIB, ranks, "nvls/LL")
        )
    with pytest.raises(AlgorithmError, match="collectives: nccl"):
        AnalyticalModel(topology_from_spec("nodes:H100x8")).fixed_collective_ns(
            CollectiveSpec("all_reduce", GIB, ranks, "nvls")
        )
    with pytest.raises(AlgorithmError, match="nvls_tree AllReduce across nodes"):
        AnalyticalModel(topology_from_spec("dgx-h100:1")).fixed_collective_ns(
            CollectiveSpec("all_reduce", GIB, ranks, "nvls_tree")
        )
    # One NIC per node: NCCL finds one NVLS head, under the 2 channels NVLS needs: no NVLS_TREE, tree/ring.
    desc = {
        "collectives": "nccl",
        "nodes": [{"name": f"n{i}", "gpu": "H100", "count": 8, "nic": "per_node"} for i in range(2)],
        "fabric": {"kind": "switch"},
    }
    desc["nodes"][1]["ranks"] = list(range(8, 16))
    del desc["nodes"][1]["count"]
    topo = build_cluster(desc)
    assert nvls_group_graph(topo, tuple(range(16))) is None
    assert (
        AnalyticalModel(topo).nccl_choice(CollectiveSpec("all_reduce", GIB, tuple(range(16))))[0]
        != "nvls_tree"
    )


def test_per_channel_caps_from_nccls_graph_channels():
    from netmodels.nccl import channel_caps, graph_channels

    # Across nodes with a NIC per GPU, NCCL's ring/tree graphs hold one channel per NIC: 8 on a DGX.
    assert graph_channels(topology_from_spec("dgx-h100:2"), tuple(range(16))) == 8
    assert graph_channels(topology_from_spec("dgx-h100:1"), tuple(range(8))) is None
    # perChMaxRingLL128Bws 36.7, perChMaxTreeBws 41.4, perChMaxTreeLL128Bws 36.7 (Hopper, 2 nodes) x 8.
    caps = channel_caps("hopper", 2, 8)
    assert (caps.ring_ll128, caps.tree, caps.tree_ll128) == pytest.approx((293.6, 331.2, 293.6))
    assert channel_caps("ampere", 4, 8).tree == pytest.approx(8 * 17.8)
    # Ring LL128 on 2 DGX H100: NCCL's LL128 busBw min(0.92 x 400, 8 x 36.7) = 293.6, where 400 GB/s is the
    # Simple ring's busBw (8 NICs x 50 GB/s): the protocol runs at 293.6 / 400 of Simple's bandwidth.
    model = AnalyticalModel(topology_from_spec("dgx-h100:2"))
    plan = model.nccl_plan(CollectiveSpec("all_reduce", GIB, tuple(range(16)), "ring/LL128"))
    assert plan[:2] == ("ring", "LL128")
    assert plan[2] == pytest.approx(293.6 / 400, rel=1e-3)
    # DGX A100 (8 x 200 Gb/s): min(0.92 x 200, 8 x 20) = 160 -> 0.8. One node: no cap (0.92).
    a100 = AnalyticalModel(topology_from_spec("dgx-a100:2"))
    assert a100.nccl_plan(CollectiveSpec("all_reduce", GIB, tuple(range(16)), "ring/LL128"))[
        2
    ] == pytest.approx(0.8, rel=1e-3)
    one = AnalyticalModel(topology_from_spec("dgx-h100:1"))
    assert one.nccl_plan(CollectiveSpec("all_reduce", GIB, tuple(range(8)), "ring/LL128"))[2] == 0.92


def test_nvls_on_eight_b200_hand_computed():
    # 8 B200 in NCCL mode (Table 5 NVLink5 900 GB/s line rate x SM100_NVLINK_BW 40.1 / 50 = 721.8 GB/s):
    # NVLS graph s = 80 (9 s <= 721.8), busBw 8 x 80 x 0.74 (nvlsEfficiency, Blackwell) x 7/8 x 2 = 828.8 GB/s,
    # algorithm bandwidth 828.8 x 8/14; latency 25 us; plus 2 x 10.22 ns (Table 5 B200 NVLink delay).
    topo = build_cluster({"collectives": "nccl", "nodes": [{"name": "n0", "gpu": "B200", "count": 8}]})
    g = nvls_group_graph(topo, tuple(range(8)))
    assert (g.channels, g.bw_intra) == (8, 80.0)
    size = 8 * GIB
    t = simulate_collective(
        AnalyticalModel(topo), CollectiveSpec("all_reduce", size, tuple(range(8)))
    ).finish_ns
    assert t == pytest.approx(25_000 + size / (828.8 * 8 / 14) + 2 * 10.22, abs=1)
    # busBw 1.75 S / t = 827.6 GB/s (for context, not validation: 8 B300, the same NVLink5, reach 845 with
    # NVLS, NVIDIA/nccl#2140).
    assert 1.75 * size / t == pytest.approx(827.6, abs=0.1)


def test_nvls_tree_pairs_heads_by_place_on_the_node_not_gpu_index():
    # GPUs 0-3 of node 0 with GPUs 4-7 of node 1 (different local indices) time as GPUs 0-3 of both nodes:
    # each node's c-th GPU heads channel c. 4 heads: at 48 GB/s (the fastest inter-node speed) the NVSwitch
    # links fit min(4, 370.8 // 48 - 1) = 4 channels, all heads, so the search stops there; per channel
    # min(48 x 0.85 x 3/4 x 2, 2 x 48, 57.7) = 57.7, x 4 channels x 8/14.
    topo = topology_from_spec("dgx-h100:2")
    model = AnalyticalModel(topo)
    a = (0, 1, 2, 3, 12, 13, 14, 15)
    b = (0, 1, 2, 3, 8, 9, 10, 11)
    assert nvls_group_graph(topo, a) == nvls_group_graph(topo, b)
    ta = model.fixed_collective_ns(CollectiveSpec("all_reduce", GIB, a, "nvls_tree"))
    tb = model.fixed_collective_ns(CollectiveSpec("all_reduce", GIB, b, "nvls_tree"))
    assert ta == tb
    nic_path = 2 * 287.5 + 2 * 368
    assert ta == pytest.approx(25_000 + 2 * 20_900 + GIB / (4 * 57.7 * 8 / 14) + nic_path, abs=1)


@pytest.mark.parametrize("model", [AnalyticalModel, FlowModel])
def test_nvls_tree_slows_on_an_oversubscribed_fabric(model):
    # 4 DGX H100, each node's 8 NICs on one leaf, 2 spines, 2:1: a leaf's uplinks carry 8 x 50 / 2 = 200 GB/s,
    # 100 per spine, 4 of the node's 8 NVLS_TREE transfers each (ECMP): 25 GB/s against the NIC's 50, so
    # the network part takes twice NCCL's bandwidth time: 108.6 us + 2 S / (364 x 32/62 GB/s) + delays.
    topo = topology_from_spec("dgx-h100:4:fabric=leaf_spine:nics_per_leaf=8:spines=2:oversubscription=2")
    size = 256 << 20
    t = simulate_collective(model(topo), CollectiveSpec("all_reduce", size, tuple(range(32)), "nvls_tree"))
    nic_path = 2 * 287.5 + 2 * 368
    assert t.finish_ns == pytest.approx(108_600 + 2 * size / (364 * 32 / 62) + nic_path, abs=10)
