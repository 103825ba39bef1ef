"""NVLink SHARP in NCCL mode: NVLS on one node, NVLS_TREE across nodes (netmodels/nccl.py, issue 23).

Expected values are worked out by hand from NVIDIA/nccl's tuning model (src/graph/tuning.cc, search.cc,
NCCL 2.30.7) and the DGX presets' link rates, and checked against published measurements where there are.
"""

from __future__ import annotations

import pytest
from xsim.netmodels import CollectiveSpec, build_cluster, simulate_collective, topology_from_spec
from xsim.netmodels.analytical import AnalyticalModel
from xsim.netmodels.errors import AlgorithmError
from xsim.netmodels.flow import FlowModel
from xsim.netmodels.nccl import (
    NvlsRuntime,
    nvls_graph,
    nvls_group_graph,
    nvls_pipeline_factor,
    nvls_runtime,
    nvls_tree_depth,
)

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
    # The chunk pipeline (nvls.cc, enqueue.cc): 16 CTAs of 64 MiB each, 128 KiB chunks (64 MiB is not under
    # 64 x 8 heads x 128 KiB), so 64 loops of one chunk per head; a chunk passes 3 warp groups (scatter,
    # reduce + multicast, gather): 64 + 2 chunk times, 66/64 of the bandwidth time.
    topo = topology_from_spec("dgx-h100:1")
    spec = CollectiveSpec("all_reduce", GIB, tuple(range(8)))
    expect = 25_000 + GIB / 272.0 * 66 / 64 + 2 * 20.44
    for model in (AnalyticalModel(topo), FlowModel(topo)):
        assert simulate_collective(model, spec).finish_ns == pytest.approx(expect, abs=1)
    assert AnalyticalModel(topo).nccl_choice(spec) == ("nvls", "Simple")
    # At 8 GiB: 512 loops, 514/512. Bus bandwidth 1.75 S / t = 473.8 GB/s. Published: "busbw: 370 -> 480
    # GB/s" with NVLS on 8 H100 (NCCL 2.30.4, NVIDIA/nccl#2140, large sizes: the 8 GiB row of
    # scripts/data/nccl_tests_published.yaml); "when running with NVLS and getting 480GB/s" (S. Jeaugey,
    # nccl-tests#212, who adds "256M is too small to reach peak bandwidth": the pipeline's fill and drain).
    big = CollectiveSpec("all_reduce", 8 * GIB, tuple(range(8)))
    expect8 = 25_000 + 8 * GIB / 272.0 * 514 / 512 + 2 * 20.44
    t8 = simulate_collective(AnalyticalModel(topo), big).finish_ns
    assert t8 == pytest.approx(expect8, abs=1)
    busbw = 1.75 * 8 * GIB / t8
    assert busbw == pytest.approx(473.8, abs=0.1)
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
    # Pipeline: 64 loops of 128 KiB chunks per CTA, 2 warp groups (scatter, reduce; multicast, gather): 65/64.
    forced = simulate_collective(model, CollectiveSpec("reduce_scatter", GIB, ranks, "nvls")).finish_ns
    assert forced == pytest.approx(25_000 + GIB / 208.25 * 65 / 64 + 2 * 20.44, abs=1)
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
    # Pipeline: 16 CTAs of 4 MiB; chunks at most 64 KiB from 4 nodes (treeMaxChunkSize) and 4 MiB is not
    # under 4 x 8 x 64 KiB, so 64 KiB: 8 loops; a chunk passes 3 + 2 x 2 stages (scatter, reduce up two
    # tree levels, the root's multicast, down two levels, gather): (8 + 6) / 8 of the bandwidth time.
    nic_path = 2 * 287.5 + 2 * 368  # GPU -> NIC -> switch -> NIC -> GPU delays
    assert simulate_collective(model, spec).finish_ns == pytest.approx(
        108_600 + size / (364 * 32 / 62) * 14 / 8 + nic_path, abs=1
    )
    # At 1 GiB the ring's 8 NICs x 50 GB/s busBw beats NVLS_TREE's 364 (as measured: NVLS on or off gives
    # the same busBw beyond 2 nodes, NVIDIA/nccl#1221).
    assert model.nccl_choice(CollectiveSpec("all_reduce", GIB, ranks)) == ("ring", "Simple")


def test_nvls_transfers_share_links_in_the_flow_model():
    # Two NVLS AllReduces on the same 8 GPUs at once: each NVSwitch link carries both, so each takes twice
    # the bandwidth time (25 us latency once): 25 us + 2 S / 272 GB/s; the pipeline's fill and drain are
    # time, not bytes, so they add once: 16 MiB per CTA, 64 KiB chunks, 32 loops, + 2/32 S / 272 GB/s.
    topo = topology_from_spec("dgx-h100:1")
    model = FlowModel(topo)
    size = 256 << 20
    spec = CollectiveSpec("all_reduce", size, tuple(range(8)))
    model.start_collective(0, spec)
    model.start_collective(0, spec)
    done = []
    while (t := model.next_event_ns()) is not None:
        done += model.advance(t)
    expect = 25_000 + 2 * size / 272.0 + size / 272.0 * 2 / 32 + 2 * 20.44
    assert [c.finish_ns for c in done] == pytest.approx([expect] * 2, abs=2)


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
    from xsim.netmodels.nccl import channel_caps, graph_channels

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
    # Pipeline: 24 CTAs on one Blackwell node (NVLS_NCHANNELS_SM100_NVL), S/24 bytes each, 128 KiB chunks:
    # 341 loops of 1 MiB, and a last loop of the rest whose first head carries ceil(rest / 8) aligned up
    # to 16 KiB; plus 2 chunk times of fill and drain; over (S/24)/8 per head.
    per_cta = size / 24
    full = int(per_cta // (1 << 20))
    assert full == 341
    rest = per_cta - full * (1 << 20)
    last = -(-(rest / 8) // 16384) * 16384
    factor = (full * 131072 + last + 2 * 131072) / (per_cta / 8)
    assert t == pytest.approx(25_000 + size / (828.8 * 8 / 14) * factor + 2 * 10.22, abs=1)
    # busBw 1.75 S / t = 822.7 GB/s (for context, not validation: 8 B300, the same NVLink5, reach 845 with
    # NVLS, NVIDIA/nccl#2140).
    assert 1.75 * size / t == pytest.approx(822.7, abs=0.1)


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
    # Pipeline: 64 MiB per CTA, 128 KiB chunks (2 nodes), 4 heads: 128 loops; 3 + 2 x 1 stages: 132/128.
    assert ta == pytest.approx(25_000 + 2 * 20_900 + GIB / (4 * 57.7 * 8 / 14) * 132 / 128 + nic_path, abs=1)


@pytest.mark.parametrize("model", [AnalyticalModel, FlowModel])
def test_nvls_tree_slows_on_an_oversubscribed_fabric(model):
    # 4 DGX H100, each node's 8 NICs on one leaf, 2 spines, 2:1: a leaf's uplinks carry 8 x 50 / 2 = 200 GB/s,
    # 100 per spine, 4 of the node's 8 NVLS_TREE transfers each (ECMP): 25 GB/s against the NIC's 50, so
    # the network part takes twice NCCL's bandwidth time: 108.6 us + 2 S / (364 x 32/62 GB/s) + delays, plus
    # the pipeline's fill and drain at NCCL's pace: 16 MiB per CTA, 64 KiB chunks, 32 loops, 6 more stages.
    topo = topology_from_spec("dgx-h100:4:fabric=leaf_spine:nics_per_leaf=8:spines=2:oversubscription=2")
    size = 256 << 20
    t = simulate_collective(model(topo), CollectiveSpec("all_reduce", size, tuple(range(32)), "nvls_tree"))
    nic_path = 2 * 287.5 + 2 * 368
    x = size / (364 * 32 / 62)
    assert t.finish_ns == pytest.approx(108_600 + 2 * x + 6 / 32 * x + nic_path, abs=10)


def test_nvls_chunk_pipeline_hand_computed():
    # NCCL 2.30.7 runs one-node NVLS on 16 CTAs (nvls.cc, Hopper), each with S/16 bytes; calcCollChunking
    # (enqueue.cc, per CTA, 8 heads) starts at 128 KiB and shrinks the chunk to 64 KiB under 64 x 8 x 128 KiB
    # per CTA, 32 KiB under 8 x 8 x 64 KiB, 16 KiB under 2 x 8 x 32 KiB. A CTA runs per-CTA-bytes / (8 x chunk)
    # loops; a chunk passes scatter, reduce + multicast and gather: loops + 2 chunk times over loops.
    g = nvls_group_graph(topology_from_spec("dgx-h100:1"), tuple(range(8)))
    mib = 1 << 20
    cases = {  # size: (chunk, factor)
        # 64 KiB: a CTA holds at least one 16 KiB cell (MinTrafficPerChannel 32 KiB / 2 bytes of traffic per
        # byte), so 4 CTAs of 16 KiB, not 16 of 4 KiB; one partial loop whose first head takes it all
        # (2 KiB per head aligned up to 16 KiB): 3 x 16 KiB against the balanced 4 KiB / 8 heads: 96.
        64 * 1024: (16384, 96.0),
        1 * mib: (16384, 6.0),  # 64 KiB per CTA: one partial loop, 8 KiB per head aligned up to 16 KiB: 3 x 2
        2 * mib: (16384, 3.0),  # 128 KiB per CTA: one loop of 16 KiB chunks, (1 + 2) / 1
        4 * mib: (16384, 2.0),  # 256 KiB: 2 loops, (2 + 2) / 2
        16 * mib: (32768, 1.5),  # 1 MiB: 4 loops of 32 KiB chunks, 6 / 4
        64 * mib: (65536, 1.25),  # 4 MiB is not under 8 x 8 x 64 KiB: 8 loops of 64 KiB, 10 / 8
        GIB: (131072, 66 / 64),
    }
    for size, (chunk, factor) in cases.items():
        rt = nvls_runtime(g, "all_reduce", size)
        assert (rt.ctas, rt.chunk, rt.stages) == (16, chunk, 3)
        assert nvls_pipeline_factor(g, "all_reduce", size) == pytest.approx(factor)
    # The time: NCCL's latency + the bandwidth time x the factor (+ the route's NVLink delays). 4 MiB:
    # 25 us + 2 x S / 272 GB/s = 55.84 us, busBw 1.75 S / t = 131.4 GB/s (the H200 curve of the validation
    # table measured 140.0; NCCL's own model, without the pipeline, would say 181).
    topo = topology_from_spec("dgx-h100:1")
    t = simulate_collective(AnalyticalModel(topo), CollectiveSpec("all_reduce", 4 * mib, tuple(range(8))))
    assert t.finish_ns == pytest.approx(25_000 + 2 * 4 * mib / 272.0 + 2 * 20.44, abs=1)
    assert 1.75 * 4 * mib / t.finish_ns == pytest.approx(131.4, abs=0.1)
    # NVLS_TREE: NCCL's double binary tree over the nodes is 1, 2, 3, 4 levels deep on 2, 4, 8, 16 nodes; a
    # chunk passes 3 + 2 x depth stages. 2 nodes, 4 MiB: 256 KiB per CTA, the chunk 128 KiB -> 64 KiB (under
    # 4 x 8 x 128 KiB) -> 32 KiB (under 1 x 8 x 64 KiB): one loop, (1 + 4) / 1.
    assert [nvls_tree_depth(n) for n in (1, 2, 4, 8, 16)] == [0, 1, 2, 3, 4]
    g2 = nvls_group_graph(topology_from_spec("dgx-h100:2"), tuple(range(16)))
    assert nvls_runtime(g2, "all_reduce", 4 * mib) == NvlsRuntime(16, 32768, 5)
    assert nvls_pipeline_factor(g2, "all_reduce", 4 * mib) == pytest.approx(5.0)
