"""Collectives as NCCL runs them (issue 23): rail-aligned ring channels, one model of a DGX cluster."""

from __future__ import annotations

import json

import pytest
from xsim.netmodels import AnalyticalModel, FlowModel, build_cluster, topology_from_spec
from xsim.netmodels.algorithms import build_schedule
from xsim.netmodels.api import CollectiveSpec, simulate_collective, simulate_p2p
from xsim.netmodels.errors import AlgorithmError
from xsim.netmodels.nccl import rail_rings
from xsim.tracegen import load_spec

GB = 1e9
S = 1 << 30


def _two_nodes(gpus: int, collectives: str) -> dict:
    """2 nodes x `gpus` A100, zero latencies, NVLink 400 GB/s, PCIe 64 GB/s, NIC 25 GB/s (by hand)."""
    return {
        "collectives": collectives,
        "nodes": [
            {
                "name": f"n{i}",
                "gpu": "A100",
                "count": gpus,
                "scale_up_bandwidth": "400GBps",
                "scale_up_latency": 0,
                "pcie_bandwidth": "64GBps",
                "pcie_latency": 0,
                "nic_bandwidth": "25GBps",
                "nic_latency": 0,
            }
            for i in range(2)
        ],
    }


def test_rail_rings_cross_each_node_boundary_through_its_own_nic():
    rings = rail_rings(["a"] * 4 + ["b"] * 4)
    assert rings == [
        [0, 1, 2, 3, 4, 5, 6, 7],
        [1, 2, 3, 0, 5, 6, 7, 4],
        [2, 3, 0, 1, 6, 7, 4, 5],
        [3, 0, 1, 2, 7, 4, 5, 6],
    ]
    # Channel c leaves a node from local GPU c-1 and enters the next at local GPU c: the 4 channels use
    # 4 different NICs out of every node and 4 different NICs into it.
    exits = {(r[3] % 4, r[4] % 4) for r in rings}
    assert exits == {(3, 0), (0, 1), (1, 2), (2, 3)}
    assert rail_rings(["a"] * 8) is None and rail_rings(["a", "a", "b"]) is None
    sched = build_schedule("all_reduce", "ring", 8, 8.0, hosts=None, rings=rings)
    assert len(sched.channels) == 4 and sched.shared
    assert sched.channels[0][0].nbytes.tolist() == [0.25] * 8  # S / C / p per step


@pytest.mark.parametrize("model", [AnalyticalModel, FlowModel])
@pytest.mark.parametrize(
    ("kind", "steps", "per_step"),
    # p = 8 ranks, C = 4 channels: every channel carries S/C; ring steps of (S/C)/p (AR, RS) or, for
    # AllGather (S = per-rank input), of S/C.
    [("all_reduce", 14, S / 4 / 8), ("reduce_scatter", 7, S / 4 / 8), ("all_gather", 7, S / 4)],
)
def test_c_channel_ring_over_two_nodes_is_the_closed_form_with_c_nics(model, kind, steps, per_step):
    # Closed form, zero link latencies: each channel's ring crosses the node boundary through its own NIC at
    # 25 GB/s; its NVLink hops get 0.8 x 400 GB/s (NCCL's Simple-protocol share on A100, topo.h) split by
    # the 3 channels that cross each GPU's NVLink, 106.7 GB/s, and PCIe 64 GB/s: the NIC is the bottleneck
    # of every step, so T = steps x (bytes per step) / 25 GB/s, C times faster than one ring over one NIC.
    # NCCL's Simple protocol adds its per-step latencies (us, tuning.cc), which the NIC-bound pipeline
    # hides but for the last network step: 14 us on a 9-150 ms collective, inside rel=2e-3.
    spec = CollectiveSpec(kind, S, tuple(range(8)), algorithm="ring")
    nccl = simulate_collective(model(build_cluster(_two_nodes(4, "nccl"))), spec).finish_ns
    expect = steps * per_step / (25 * GB) * 1e9
    assert nccl == pytest.approx(expect, rel=2e-3)
    one_ring = simulate_collective(model(build_cluster(_two_nodes(4, "ring"))), spec).finish_ns
    assert one_ring == pytest.approx(4 * expect, abs=1)  # no protocol outside NCCL mode; ns rounded up


def test_analytical_channels_split_the_nvlink_they_share():
    # NVLink at 30 GB/s (x 0.8 = 24) split by 3 channels = 8 GB/s per channel: now NVLink, not the 25 GB/s
    # NIC, bounds each step: T = 14 x (S/32) / 8 GB/s.
    desc = _two_nodes(4, "nccl")
    for node in desc["nodes"]:
        node["scale_up_bandwidth"] = "30GBps"
    spec = CollectiveSpec("all_reduce", S, tuple(range(8)), algorithm="ring")
    t = simulate_collective(AnalyticalModel(build_cluster(desc)), spec).finish_ns
    assert t == pytest.approx(14 * S / 32 / (8 * GB) * 1e9, rel=1e-3)


def _dgx_h100_by_hand(nodes: int) -> dict:
    """Two DGX H100 written out from the datasheets (line rates) and the paper's Table 5/6 delays."""
    return {
        "collectives": "nccl",
        "nodes": [
            {
                "name": f"node{i}",
                "gpu": "H100",
                "ranks": list(range(8 * i, 8 * i + 8)),
                "scale_up_bandwidth": "450GBps",  # NVLink4, 900 GB/s bidirectional
                "scale_up_latency": "20.44ns",  # Table 5 H100
                "pcie_bandwidth": "512Gbps",  # Table 5 H100 (PCIe Gen5 x16)
                "pcie_latency": "287.5ns",  # Table 5: 2 x 143.75 ns
                "nic_bandwidth": "400Gbps",  # ConnectX-7 NDR
                "nic_latency": "368ns",  # Table 6 ConnectX-7
            }
            for i in range(nodes)
        ],
        "fabric": {"kind": "switch"},
    }


def test_one_gib_allreduce_on_two_dgx_h100_three_ways_one_time_near_published(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(_dgx_h100_by_hand(2)))
    dep = load_spec(
        {
            "model": "llama2-7b",
            "cluster": "dgx-h100",
            "device_groups": [{"gpu": "H100", "ranks": "0-15", "tp": 16, "layers": [1, 32]}],
        }
    )
    topos = [
        topology_from_spec("dgx-h100:2"),
        build_cluster(json.loads(dep.cluster_json)),
        topology_from_spec(f"cluster:{path}"),
    ]
    got = {}
    for algo in (None, "ring"):
        spec = CollectiveSpec("all_reduce", S, tuple(range(16)), algo)
        for model in (AnalyticalModel, FlowModel):
            times = {simulate_collective(model(t), spec).finish_ns for t in topos}
            assert len(times) == 1
        got[algo] = times.pop()
    # NCCL's choice on 2 DGX H100 is NVLS_TREE (NVLink SHARP in the node, a tree over the NICs): per channel
    # min(40 x 0.85 x 7/8 x 2, 48 x 2, 57.7) = 57.7 GB/s, 8 channels, x 16/30 to algorithm bandwidth; latency
    # 25 + 2 x 20.9 us (NVIDIA/nccl tuning.cc, search.cc, NCCL 2.30.7), plus the route's NIC-path delays;
    # the chunk pipeline: 16 CTAs of 64 MiB, 128 KiB chunks, 64 loops, a chunk through 3 + 2 x 1 stages
    # (scatter, reduce up, the root's multicast, down, gather): 68/64 of the bandwidth time.
    t = got[None]
    assert t == pytest.approx(66.8e3 + S / (8 * 57.7 * 16 / 30) * 68 / 64, rel=1e-3)
    # Published: NVLS on 2 nodes of 8 H100 with 8 x 400G NICs: AllReduce busBw 430 GB/s (NVIDIA/nccl#1221,
    # NCCL 2.19.3, 4-8 GiB; 330 with NVLS off) -> 2 (n-1)/n S / busBw = 4.68 ms.
    assert abs(t / (2 * 15 / 16 * S / (430 * GB) * 1e9) - 1) < 0.10
    # Ring forced (NCCL_ALGO=RING): "For NDR @ 400Gbps you should see 46-48GB/s per NIC" (NCCL maintainer,
    # NVIDIA/nccl-tests#290): 8 NICs x 47 GB/s = 376 GB/s busBw -> 5.35 ms for 1 GiB on 16 GPUs.
    ring = got["ring"]
    assert abs(ring / (2 * 15 / 16 * S / (8 * 47 * GB) * 1e9) - 1) < 0.10
    # NCCL's model: 8 channels, each NIC-bound at 50 GB/s: 30 steps of S/128 (+ latencies).
    assert ring == pytest.approx(30 * S / 128 / (50 * GB) * 1e9, rel=0.01)


def test_replay_warnings_name_slow_nics_and_foreign_gpus():
    from xsim.netmodels.nccl import topology_warnings

    # Table 5's H100 row: 10 Gb/s NICs (the default of a nodes: cluster): one line saying so.
    slow = topology_warnings(topology_from_spec("nodes:2*H100x4"))
    assert slow == (
        "network: 8 of 8 NICs run at 10 Gb/s, under 100 Gb/s (the paper's Table 5 default of nodes: "
        "clusters); set nic_bandwidth or use dgx-a100/dgx-h100",
    )
    dgx = topology_from_spec("dgx-h100:1")
    assert topology_warnings(dgx) == ()
    assert topology_warnings(dgx, {r: "H100-SXM" for r in range(8)}) == ()  # an alias of H100
    mixed = topology_warnings(dgx, {0: "H100", 1: "A100", 2: "A100"})
    assert mixed == (
        "network: 2 ranks sit on GPUs unlike the traces' device groups (rank 1: topology H100, traces A100-40GB)",
    )


def test_nccl_protocol_choice_switches_ll_ll128_simple_at_hand_computed_sizes():
    from xsim.netmodels.nccl import RingCase, choose_protocol, predicted_ns

    # 8 H100 on one node, AllReduce, X = the Simple ring's bandwidth time (us) at NCCL's 370.8 GB/s busBw.
    # tuning.cc (NCCL 2.30.7): LL 6.6 + 14 x 0.6 + X / f with f = min(0.5, llMaxBw 141 / 370.8) = 0.3803;
    # LL128 14.0 + 14 x 1.9 + X / 0.92; Simple 8.4 + 14 x 3.4 + X.
    # LL = LL128 at X (1/f - 1/0.92) = 25.6 -> X = 16.59 us; LL128 = Simple at X (1/0.92 - 1) = 15.4 -> 177.1 us.
    assert predicted_ns("Simple", RingCase("all_reduce", 8, 1), 0.0) == pytest.approx(56_000)
    f = 141 / 370.8
    ll_ll128 = 25.6 / (1 / f - 1 / 0.92) * 1e3
    ll128_simple = 15.4 / (1 / 0.92 - 1) * 1e3
    assert ll_ll128 == pytest.approx(16_593, abs=2) and ll128_simple == pytest.approx(177_100, abs=10)

    def choice(x: float) -> str:  # the size whose Simple ring takes x ns at busBw 370.8 GB/s
        return choose_protocol("all_reduce", 8, 1, x, ll_max=141.0, size=x * 370.8 / 1.75)

    assert [choice(0.99 * ll_ll128), choice(1.01 * ll_ll128)] == ["LL", "LL128"]
    assert [choice(0.99 * ll128_simple), choice(1.01 * ll128_simple)] == ["LL128", "Simple"]
    # On a DGX H100 with the ring forced (NCCL's own choice there is NVLS from 2 MiB, test_net_nvls.py):
    # X = 1.75 S / 370.8 GB/s, so LL up to 3.5 MB, LL128 to 37.5 MB.
    topo = topology_from_spec("dgx-h100:1")
    model = AnalyticalModel(topo)
    chosen = {
        size: model.nccl_protocol(CollectiveSpec("all_reduce", size, tuple(range(8)), "ring"))
        for size in (8 << 10, 1 << 20, 4 << 20, 32 << 20, 64 << 20, 1 << 30)
    }
    assert chosen == {
        8 << 10: "LL",
        1 << 20: "LL",
        4 << 20: "LL128",
        32 << 20: "LL128",
        64 << 20: "Simple",
        1 << 30: "Simple",
    }


@pytest.mark.parametrize("model", [AnalyticalModel, FlowModel])
def test_forced_protocol_small_allreduce_is_nccl_latency_plus_bytes(model):
    # One node, 8 KiB AllReduce forced to LL: a uniform NVLink ring, so the time is NCCL's LL latency
    # 6.6 + 14 x 0.6 = 15.0 us plus 14 steps of (8 KiB / 8) at LL's min(0.5 x 370.8, llMaxBw 141) = 141 GB/s
    # and 14 NVLink hops of 2 x 20.44 ns (Table 5 H100 delay, GPU -> NVSwitch -> GPU).
    spec = CollectiveSpec("all_reduce", 8 << 10, tuple(range(8)), algorithm="ring/LL")
    t = simulate_collective(model(topology_from_spec("dgx-h100:1")), spec).finish_ns
    expect = 15_000 + 14 * 1024 / 141 + 14 * 2 * 20.44
    assert t == pytest.approx(expect, abs=1)


def test_protocols_are_refused_outside_nccl_mode():
    from xsim.netmodels.errors import AlgorithmError

    spec = CollectiveSpec("all_reduce", 1 << 20, tuple(range(4)), algorithm="ring/LL")
    with pytest.raises(AlgorithmError, match="NCCL protocols run on clusters with collectives: nccl"):
        simulate_collective(AnalyticalModel(topology_from_spec("switch:4:50GBps:500ns")), spec)
    with pytest.raises(AlgorithmError, match="unknown NCCL protocol"):
        simulate_collective(
            AnalyticalModel(topology_from_spec("dgx-h100:1")),
            spec.__class__("all_reduce", 8, (0, 1), "ring/LL64"),
        )


def _pair_of_nodes() -> dict:
    """2 nodes x 1 A100 joined by 25 GB/s NICs (PCIe 64 GB/s), zero latencies, NCCL mode."""
    nodes = [
        {"name": f"n{i}", "gpu": "A100", "count": 1, "pcie_bandwidth": "64GBps", "pcie_latency": 0,
         "nic_bandwidth": "25GBps", "nic_latency": 0}
        for i in range(2)
    ]  # fmt: skip
    return {"collectives": "nccl", "nodes": nodes}


@pytest.mark.parametrize(
    ("protocol", "share", "latency_ns"),
    # tuning.cc (NCCL 2.30.7) tree rows: Simple 0.92 of the bandwidth, base 8.4 us, 14 us per network hop;
    # LL128 0.92 x 120/128, base 14 us, 8.5 us per hop; LL 0.92 / 3.8 (far under llMaxBw), base 6.8 us, 5 us.
    [
        ("Simple", 0.92, 8_400 + 2 * 14_000),
        ("LL128", 0.92 * 120 / 128, 14_000 + 2 * 8_500),
        ("LL", 0.92 / 3.8, 6_800 + 2 * 5_000),
    ],
)
def test_nccl_tree_closed_form_two_nodes(protocol, share, latency_ns):
    # Two trees (root n1 and root n0), each S/2 in K = 64 chunks (32 MiB / 64 KiB, capped at 64): slot k
    # sends chunk k up, slot k + 1 sends it down, so each direction of the NIC path carries one tree's up
    # and the other's down at once (analytical: 2 transfers share 25 GB/s), K + 1 slots of S/(2K) at
    # 12.5 GB/s x share, plus each hop's latency once (up, then down) for the first chunk.
    spec = CollectiveSpec("all_reduce", 64 << 20, (0, 1), algorithm=f"tree/{protocol}")
    t = simulate_collective(AnalyticalModel(build_cluster(_pair_of_nodes())), spec).finish_ns
    k = 64
    expect = (k + 1) * (64 << 20) / (k * 25 * share) + latency_ns
    assert t == pytest.approx(expect, abs=1)
    # Flow: the first and last slots carry one direction each, alone at the full 25 GB/s: K slots in all.
    f = simulate_collective(FlowModel(build_cluster(_pair_of_nodes())), spec).finish_ns
    assert f == pytest.approx(k * (64 << 20) / (k * 25 * share) + latency_ns, abs=1)


def test_nccl_chooses_tree_ll_for_small_and_ring_simple_for_large_multi_node_allreduce():
    # NCCL's own model on 2 DGX H100: 8 KiB -> tree/LL (latency 6.8 + 2 x (7 x 0.6 + 1 x 5.0) = 25.2 us
    # against ring/LL's 6.6 + 28 x 1.0 + 2 x 2.7 = 40.0 us); 1 GiB -> NVLS_TREE (461.6 GB/s busBw against
    # the ring's 8 NICs x 50 GB/s, test_net_nvls.py), ring/Simple among the ring's protocols.
    topo = topology_from_spec("dgx-h100:2")
    model = AnalyticalModel(topo)
    small = CollectiveSpec("all_reduce", 8 << 10, tuple(range(16)))
    large = CollectiveSpec("all_reduce", 1 << 30, tuple(range(16)))
    assert model.nccl_choice(small) == ("double_binary_tree", "LL")
    assert model.nccl_choice(large) == ("nvls_tree", "Simple")
    assert model.nccl_choice(CollectiveSpec("all_reduce", 1 << 30, tuple(range(16)), "ring")) == (
        "ring",
        "Simple",
    )
    # On one node the ring wins at 1 MiB (ring/LL 15 us + X/0.38 against tree/LL 15.2 us + X_tree/0.24).
    one = AnalyticalModel(topology_from_spec("dgx-h100:1"))
    assert one.nccl_choice(CollectiveSpec("all_reduce", 1 << 20, tuple(range(8))))[0] == "ring"


@pytest.mark.parametrize("model", [AnalyticalModel, FlowModel])
def test_alltoall_as_p2p_to_every_peer_shares_nvlink_and_nics(model):
    # S = 256 MiB per rank, S/p to each peer at once. One DGX H100: 7 peers share a GPU's NVLink at NCCL's
    # 370.8 GB/s: T = 7 (S/8) / 370.8 GB/s. Two nodes: the 8 remote peers' sends share the GPU's 50 GB/s
    # NIC (and 8 senders share each receiving NIC): T = 8 (S/16) / 50 GB/s, NVLink's 7 (S/16) / 370.8 less.
    s = 256 << 20
    one = simulate_collective(
        model(topology_from_spec("dgx-h100:1")), CollectiveSpec("all_to_all", s, tuple(range(8)))
    )
    assert one.finish_ns == pytest.approx(7 * s / 8 / 370.8 + 2 * 20.44, abs=1)
    two = simulate_collective(
        model(topology_from_spec("dgx-h100:2")), CollectiveSpec("all_to_all", s, tuple(range(16)))
    )
    # + the route's delays: PCIe 287.5 ns twice, NIC 368 ns twice.
    assert two.finish_ns == pytest.approx(8 * s / 16 / 50 + 2 * 287.5 + 2 * 368, abs=1)


def _run_all(model, specs) -> list[int]:
    """Start every spec at 0 on one model and run to the end: each one's finish (ns)."""
    handles = [model.start_collective(0, s) for s in specs]
    done: dict[int, int] = {}
    while len(done) < len(handles):
        t = model.next_event_ns()
        for c in model.advance(t):
            done[c.handle] = c.finish_ns
    return [done[h] for h in handles]


def test_concurrent_groups_share_an_oversubscribed_leaf_uplink_in_the_flow_model():
    # 4 DGX H100, each node's 8 NICs on its own leaf, one spine, 4:1 oversubscribed: a leaf's uplink
    # carries 8 x 50 / 4 = 100 GB/s. A 2-rank ring AllReduce between nodes 0 and 1 (one GPU each) moves
    # 2 steps of S/2 at its NIC's 50 GB/s alone; four such groups (GPUs 0-3 with 8-11) share the uplink,
    # 25 GB/s each: twice as long. Simple protocol: + 8.4 us base and 14 us per network step.
    topo = topology_from_spec("dgx-h100:4:fabric=leaf_spine:nics_per_leaf=8:spines=1:oversubscription=4")
    size = 1 << 30
    specs = [CollectiveSpec("all_reduce", size, (j, 8 + j), algorithm="ring/Simple") for j in range(4)]
    lat = 8_400 + 2 * 14_000
    alone = _run_all(FlowModel(topo), specs[:1])[0]
    assert alone == pytest.approx(2 * (size / 2) / 50 + lat, rel=1e-3)
    together = _run_all(FlowModel(topo), specs)
    for t in together:
        assert t == pytest.approx(2 * (size / 2) / 25 + lat, rel=1e-3)
    # The analytical model is contention-free by definition: each group alone.
    assert simulate_collective(AnalyticalModel(topo), specs[0]).finish_ns == pytest.approx(alone, rel=1e-3)


def test_rail_fabric_preset_keeps_rail_traffic_on_its_rail_switch():
    topo = topology_from_spec("dgx-h100:2:fabric=rail")
    names = topo.links
    same_rail = [names[i] for i in topo.route(3, 11).links]
    assert any("rail3" in v for _, v in same_rail) and not any("spine" in v for _, v in same_rail)
    cross = [names[i] for i in topo.route(3, 12).links]
    assert any("spine" in v for _, v in cross)


@pytest.mark.parametrize("model", [AnalyticalModel, FlowModel])
def test_cross_node_p2p_relays_through_the_destinations_rail_pxn(model):
    # dgx-h100:2 on a rail fabric: GPU 3 of node 0 -> GPU 12 (local 4) of node 1. PXN: over NVLink to GPU 4
    # of node 0 (2 x 20.44 ns, NCCL's 370.8 GB/s), through NIC 4 (PCIe 287.5 ns at 64 GB/s, NIC 368 ns at
    # 50 GB/s) on rail switch 4, never the spine: 64 MiB at the narrowest, 50 GB/s.
    topo = topology_from_spec("dgx-h100:2:fabric=rail")
    from xsim.netmodels.nccl import p2p_links, pxn_relay

    assert pxn_relay(topo, 3, 12) == 4 and pxn_relay(topo, 3, 11) is None and pxn_relay(topo, 3, 5) is None
    links, lat = p2p_links(topo, 3, 12)
    names = [topo.links[i] for i in links]
    assert ("node0/gpu4", "node0/nic4") in names and not any("spine" in v for _, v in names)
    size = 64 << 20
    t = simulate_p2p(model(topo), 3, 12, size).finish_ns
    assert t == pytest.approx(2 * 20.44 + 2 * 287.5 + 2 * 368 + size / 50, abs=1)


def test_one_host_groups_of_equal_shape_are_timed_once_and_identically():
    topo = topology_from_spec("dgx-h100:4")
    first = CollectiveSpec("all_reduce", 48 << 20, tuple(range(8)))
    other = CollectiveSpec("all_reduce", 48 << 20, tuple(range(16, 24)))
    memo = AnalyticalModel(topo)
    memo.fixed_collective_ns(first)
    assert len(memo._by_shape) == 1
    hit = memo._collective_offsets(other)
    assert len(memo._by_shape) == 1  # served from the first group's evaluation
    assert hit == AnalyticalModel(topo)._collective_offsets(other)  # what a fresh evaluation gives
    assert memo.nccl_choice(other) == memo.nccl_choice(first)


def test_groups_across_hosts_of_equal_shape_share_one_evaluation_on_a_single_switch():
    topo = topology_from_spec("dgx-h100:4")
    a = CollectiveSpec("all_reduce", 32 << 20, (0, 8, 16, 24))
    b = CollectiveSpec("all_reduce", 32 << 20, (5, 13, 21, 29))
    memo = AnalyticalModel(topo)
    memo.fixed_collective_ns(a)
    assert memo._collective_offsets(b) == AnalyticalModel(topo)._collective_offsets(b)
    assert len(memo._by_shape) == 1
    # On a rail fabric routes depend on where the ranks sit: no sharing across hosts.
    rail = AnalyticalModel(topology_from_spec("dgx-h100:4:fabric=rail"))
    rail.fixed_collective_ns(a)
    assert len(rail._by_shape) == 0


def test_bad_collectives_mode_is_one_error_line():
    from xsim.netmodels.errors import TopologyError

    desc = _two_nodes(2, "nccl")
    desc["collectives"] = "mpi"
    with pytest.raises(TopologyError, match="cluster \"collectives\" must be one of ring, nccl, got 'mpi'"):
        build_cluster(desc)


@pytest.mark.parametrize("model", [AnalyticalModel, FlowModel])
def test_pat_for_one_rank_per_node_reduce_scatter_all_gather_hand_computed(model):
    # 16 DGX H100, one rank per node (a data-parallel group of a TP 8 plan): NCCL's PAT is a candidate for
    # ReduceScatter/AllGather (tuning.cc ncclPatEnable). Its latency: 8.0 + log2(16) x 14 / 3.5 + 2.8 x 16 =
    # 68.8 us; its bandwidth: the whole buffer over 0.75 x the bus bandwidth, i.e. the ring's (n-1)/n S / B
    # times 16 / (15 x 0.75).
    topo = topology_from_spec("dgx-h100:16")
    ranks = tuple(range(0, 128, 8))
    m = model(topo)
    per_rank = 64 << 10
    spec = CollectiveSpec("all_gather", per_rank, ranks)
    # Forced, or chosen: 15 ring steps of 64 KiB over the 50 GB/s NIC, x 16/(15 x 0.75); each step pays the
    # route's delays (2 x 287.5 ns PCIe + 2 x 368 ns NIC); the PAT latency once.
    expect = 68_800 + 15 * per_rank / 50.0 * 16 / (15 * 0.75) + 15 * (2 * 287.5 + 2 * 368)
    assert simulate_collective(m, spec).finish_ns == pytest.approx(expect, abs=1)
    forced = CollectiveSpec("all_gather", per_rank, ranks, "pat")
    assert simulate_collective(model(topo), forced).finish_ns == pytest.approx(expect, abs=1)
    rs = CollectiveSpec("reduce_scatter", 16 * per_rank, ranks)
    assert simulate_collective(model(topo), rs).finish_ns == pytest.approx(expect, abs=1)
    # NCCL's choice (predictions in us, X = the ring's Simple bandwidth time 15 x S / 50 GB/s): at 64 KiB
    # per rank PAT 68.8 + 16 S / 37.5 = 96.8 against ring/LL 6.6 + 15 x 5.0 + X / min(0.5, 20.4 / 50) =
    # 129.8, LL128 141.5 + X / 0.92 = 162.9, Simple 218.4 + X = 238.1; at 1 MiB per rank ring/LL128
    # 141.5 + 314.6 / 0.92 = 483.4 beats PAT 68.8 + 447.4 = 516.2.
    chooser = AnalyticalModel(topo)
    assert chooser.nccl_choice(spec) == ("pat", "Simple")
    assert chooser.nccl_choice(CollectiveSpec("all_gather", 1 << 20, ranks)) == ("ring", "LL128")
    # Not with several ranks per node, not for AllReduce, not outside NCCL mode: one error line.
    two_per_node = CollectiveSpec("all_gather", per_rank, (0, 1, 8, 9), "pat")
    with pytest.raises(AlgorithmError, match="one rank per node"):
        simulate_collective(model(topo), two_per_node)
    with pytest.raises(AlgorithmError, match="does not implement all_reduce"):
        simulate_collective(model(topo), CollectiveSpec("all_reduce", per_rank, ranks, "pat"))
    with pytest.raises(AlgorithmError, match="one rank per node"):
        simulate_collective(
            model(topology_from_spec("nodes:4*H100x1")), CollectiveSpec("all_gather", 1, (0, 1), "pat")
        )
