"""Flow model (max-min fair sharing) and analytical model: textbook cases and closed forms."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from xsim.netmodels import (
    AnalyticalModel,
    CollectiveSpec,
    FlowModel,
    NetworkModelError,
    build_model,
    max_min_rates,
    simulate_collective,
    simulate_p2p,
    topology_from_spec,
)
from xsim.netmodels.api import COLLECTIVE_KINDS
from xsim.netmodels.topology import Topology, add_duplex, ring_topology, switch_topology


def csr(flows):
    ptr = np.zeros(len(flows) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(f) for f in flows])
    return ptr, np.concatenate([np.array(f, dtype=np.int64) for f in flows])


def test_two_equal_flows_get_half_each():
    rates = max_min_rates(*csr([[0], [0]]), np.array([10.0]))
    assert rates.tolist() == [5.0, 5.0]


def test_flow_crossing_two_bottlenecks_gets_smaller_share_and_freed_capacity_goes_to_others():
    # Link 0 cap 1 shared by A and B; link 1 cap 2 shared by A, C, D. A and B get 1/2 on link 0; C and D
    # split what A leaves on link 1: (2 - 1/2) / 2 = 3/4 each.
    rates = max_min_rates(*csr([[0, 1], [0], [1], [1]]), np.array([1.0, 2.0]))
    assert rates.tolist() == [0.5, 0.5, 0.75, 0.75]
    # Classic: one long flow over three links of cap 1, one short flow on each link: everyone gets 1/2.
    rates = max_min_rates(*csr([[0, 1, 2], [0], [1], [2]]), np.ones(3))
    assert rates.tolist() == [0.5] * 4


def two_hosts(bw_bytes_per_s: float, lat_ns: float = 0.0) -> Topology:
    return ring_topology(2, bw_bytes_per_s, lat_ns)


def test_half_and_one_gigabyte_on_one_gbps_finish_at_1_and_1_5_s():
    model = FlowModel(two_hosts(1e9))
    a = model.start_p2p(0, 0, 1, 500_000_000)
    b = model.start_p2p(0, 0, 1, 1_000_000_000)
    assert model.next_event_ns() == 1_000_000_000
    (first,) = model.advance(model.next_event_ns())
    assert (first.handle, first.finish_ns) == (a, 1_000_000_000)
    # The freed half of the link goes to the remaining flow: 0.5 GB left at 1 GB/s.
    assert model.next_event_ns() == 1_500_000_000
    (second,) = model.advance(2_000_000_000)
    assert (second.handle, second.finish_ns) == (b, 1_500_000_000)
    assert model.next_event_ns() is None


def test_freed_capacity_on_a_chain():
    # a - b - c, links of 1 GB/s. X: a->c over both links, Y: a->b, Z: b->c; every link carries two flows,
    # so all run at 1/2. When Y ends, X stays at 1/2 (b->c still shared with Z); when Z ends, X takes the
    # whole capacity.
    g = nx.DiGraph()
    for n in "abc":
        g.add_node(n, kind="npu")
    add_duplex(g, "a", "b", 1e9, 0, "l")
    add_duplex(g, "b", "c", 1e9, 0, "l")
    topo = Topology("chain", g, ("a", "b", "c"))
    model = FlowModel(topo)
    x = model.start_p2p(0, 0, 2, 1_000_000_000)
    y = model.start_p2p(0, 0, 1, 250_000_000)
    z = model.start_p2p(0, 1, 2, 500_000_000)
    done = {}
    while model.next_event_ns() is not None:
        for c in model.advance(model.next_event_ns()):
            done[c.handle] = c.finish_ns
    # Y: 0.25 GB at 1/2 -> 0.5 s. Z: 0.5 GB at 1/2 -> 1.0 s. X: 0.5 GB by 1.0 s, then alone at 1 GB/s -> 1.5 s.
    assert done == {y: 500_000_000, z: 1_000_000_000, x: 1_500_000_000}


@pytest.mark.parametrize("p", [2, 4, 8, 16])
@pytest.mark.parametrize("cls", [AnalyticalModel, FlowModel])
def test_ring_all_reduce_closed_form_on_uniform_ring(cls, p):
    alpha, bw = 500.0, 50e9  # ns, bytes/s
    size = 64 * p * 1000
    model = cls(ring_topology(p, bw, alpha))
    c = simulate_collective(model, CollectiveSpec("all_reduce", size, tuple(range(p))))
    expect = 2 * (p - 1) * alpha + 2 * (p - 1) / p * size / (bw / 1e9)
    assert c.finish_ns == round(expect)
    assert set(c.per_rank_finish_ns) == {c.finish_ns}


def test_nccl_tests_bus_bandwidth_relation():
    # nccl-tests: busbw = algbw x 2(p-1)/p for all-reduce; with zero latency the ring reaches the link speed.
    p, bw, size = 8, 25e9, 1 << 26
    for cls in (AnalyticalModel, FlowModel):
        c = simulate_collective(
            cls(ring_topology(p, bw, 0)), CollectiveSpec("all_reduce", size, tuple(range(p)))
        )
        algbw = size / (c.finish_ns * 1e-9)
        assert algbw * 2 * (p - 1) / p == pytest.approx(bw, rel=1e-6)


def test_all_gather_uses_per_rank_input_size():
    p, bw = 4, 1e9
    c = simulate_collective(
        AnalyticalModel(ring_topology(p, bw, 0)), CollectiveSpec("all_gather", 1000, (0, 1, 2, 3))
    )
    assert c.finish_ns == 3 * 1000


def test_flow_shares_a_switch_port_that_analytical_ignores():
    # direct all-to-all on a switch: each rank's uplink carries p-1 messages at once.
    p, bw, size = 4, 1e9, 4_000_000
    topo = switch_topology(p, bw, 0)
    spec = CollectiveSpec("all_to_all", size, tuple(range(p)), "direct")
    assert simulate_collective(AnalyticalModel(topo), spec).finish_ns == size // p
    assert simulate_collective(FlowModel(topo), spec).finish_ns == (p - 1) * size // p


def test_chunking_in_flight():
    topo = ring_topology(4, 1e9, 100)
    spec = CollectiveSpec("reduce_scatter", 4_000_000, (0, 1, 2, 3))
    one = simulate_collective(AnalyticalModel(topo), spec).finish_ns
    assert one == 3 * (100 + 1_000_000)
    serial = simulate_collective(AnalyticalModel(topo, chunks=4), spec).finish_ns
    assert serial == 4 * 3 * (100 + 250_000)
    # No contention: four chunks in flight finish together, like one quarter-size collective.
    assert simulate_collective(AnalyticalModel(topo, chunks=4, chunks_in_flight=4), spec).finish_ns == 3 * (
        100 + 250_000
    )
    # The flow model shares the links among the chunks in flight: the bytes still have to cross.
    flow = simulate_collective(FlowModel(topo, chunks=4, chunks_in_flight=4), spec).finish_ns
    assert flow >= 3 * 1_000_000


def test_incremental_interface_and_errors():
    model = FlowModel(two_hosts(1e9, 10))
    h0 = model.start_p2p(0, 0, 1, 1000)
    assert model.next_event_ns() == 1000
    h1 = model.start_p2p(500, 0, 1, 1000)  # shares the link from t=500
    out = []
    while model.next_event_ns() is not None:
        out += model.advance(model.next_event_ns())
    # h0: 500 B alone, 500 B at half rate -> 1500 + 10; h1: 500 B at half, 500 B alone -> 2000 + 10.
    assert [(c.handle, c.finish_ns) for c in out] == [(h0, 1510), (h1, 2010)]
    with pytest.raises(NetworkModelError, match="non-decreasing"):
        model.start_p2p(100, 0, 1, 10)
    with pytest.raises(NetworkModelError, match="outside"):
        model.start_p2p(3000, 0, 2, 10)
    with pytest.raises(NetworkModelError, match="unknown algorithm"):
        model.start_collective(3000, CollectiveSpec("all_reduce", 10, (0, 1), "magic"))
    with pytest.raises(NetworkModelError, match="power-of-two"):
        simulate_collective(
            AnalyticalModel(ring_topology(3, 1e9, 0)),
            CollectiveSpec("all_reduce", 12, (0, 1, 2), "halving_doubling"),
        )
    with pytest.raises(NetworkModelError, match="unknown network model"):
        build_model("packet", ring_topology(2, 1e9, 0))


@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
@pytest.mark.parametrize("algorithm", ["ring", "direct"])
def test_every_kind_runs_and_flow_is_never_faster_than_analytical(kind, algorithm):
    topo = topology_from_spec("nodes:2*H100x4:preset=table6")
    spec = CollectiveSpec(kind, 1 << 20, (0, 2, 4, 6, 7, 5), algorithm, root=4)
    a = simulate_collective(AnalyticalModel(topo), spec)
    f = simulate_collective(FlowModel(topo), spec)
    assert len(a.per_rank_finish_ns) == len(f.per_rank_finish_ns) == 6
    assert a.finish_ns > 0
    assert f.finish_ns >= a.finish_ns


@pytest.mark.parametrize(
    "algorithm", ["halving_doubling", "double_binary_tree", "hierarchical", "multi_ring:2"]
)
def test_other_all_reduce_algorithms(algorithm):
    topo = topology_from_spec("nodes:2*H100x4:preset=table6")
    spec = CollectiveSpec("all_reduce", 1 << 22, tuple(range(8)), algorithm)
    a = simulate_collective(AnalyticalModel(topo), spec)
    f = simulate_collective(FlowModel(topo), spec)
    assert 0 < a.finish_ns <= f.finish_ns


def test_halving_doubling_closed_form_on_switch():
    # log2(p) exchange steps each way, m = S/2, S/4, ...: 2 x sum(2 alpha + m/B).
    p, alpha, bw, size = 8, 100.0, 1e9, 8_000_000
    c = simulate_collective(
        AnalyticalModel(switch_topology(p, bw, alpha)),
        CollectiveSpec("all_reduce", size, tuple(range(p)), "halving_doubling"),
    )
    assert c.finish_ns == 2 * sum(2 * alpha + size / 2**k for k in (1, 2, 3))


def test_hierarchical_beats_flat_ring_across_slow_nics():
    topo = topology_from_spec("nodes:2*H100x4")
    flat = simulate_collective(
        FlowModel(topo), CollectiveSpec("all_reduce", 1 << 24, tuple(range(8)), "ring")
    )
    hier = simulate_collective(
        FlowModel(topo), CollectiveSpec("all_reduce", 1 << 24, tuple(range(8)), "hierarchical")
    )
    assert hier.finish_ns < flat.finish_ns


def test_simulate_p2p_zero_bytes_costs_route_latency():
    topo = ring_topology(4, 1e9, 250)
    assert simulate_p2p(FlowModel(topo), 0, 2, 0).finish_ns == 500
    assert simulate_p2p(AnalyticalModel(topo), 0, 2, 0).finish_ns == 500


def reference_progressive_filling(flows, cap):
    """Textbook progressive filling, one bottleneck level at a time, in plain Python."""
    rates = [None] * len(flows)
    cap = list(cap)
    active = set(range(len(flows)))
    while active:
        count = {}
        for f in active:
            for link in flows[f]:
                count[link] = count.get(link, 0) + 1
        level = min(cap[link] / c for link, c in count.items())
        full = {link for link, c in count.items() if cap[link] / c <= level * (1 + 1e-12)}
        hit = [f for f in active if full & set(flows[f])]
        for f in hit:
            rates[f] = level
            for link in flows[f]:
                cap[link] -= level
        active -= set(hit)
    return rates


def test_max_min_matches_textbook_progressive_filling_on_random_instances():
    rng = np.random.default_rng(7)
    for _ in range(200):
        nl = int(rng.integers(1, 10))
        flows = [
            [int(x) for x in rng.choice(nl, size=int(rng.integers(1, min(nl, 4) + 1)), replace=False)]
            for _ in range(int(rng.integers(1, 25)))
        ]
        cap = rng.uniform(1, 10, nl)
        got = max_min_rates(*csr(flows), cap)
        assert np.allclose(got, reference_progressive_filling(flows, cap), rtol=1e-9)


def test_small_max_min_path_gives_the_numpy_paths_numbers_bit_for_bit():
    # max_min_rates takes a plain-Python path up to _SMALL_ENTRIES (flow, link) entries; replay outputs
    # stay byte-identical only if it returns exactly the vectorized path's floats (same operations in the
    # same order), so compare the bytes, on shared links, repeated capacities and flows without links.
    from xsim.netmodels.flow import _max_min_numpy, _max_min_small

    rng = np.random.default_rng(11)
    for _ in range(500):
        nl = int(rng.integers(1, 12))
        flows = [
            [int(x) for x in rng.choice(nl, size=int(rng.integers(0, min(nl, 5) + 1)), replace=False)]
            for _ in range(int(rng.integers(1, 12)))
        ]
        if not any(flows):
            continue
        cap = rng.choice([rng.uniform(0.1, 500), 25.0, 50.0, 300.0, 12.5], nl)
        ptr, links = csr(flows + [[]])
        small = _max_min_small(ptr.tolist(), links.tolist(), cap)
        assert small.tobytes() == _max_min_numpy(ptr, links, cap).tobytes()
        assert np.isinf(small[-1])


def test_concurrent_collective_and_p2p_contend_in_flow_only():
    topo = ring_topology(4, 1e9, 0)
    spec = CollectiveSpec("all_gather", 1_000_000, (0, 1, 2, 3))
    for cls, slower in ((AnalyticalModel, False), (FlowModel, True)):
        alone = simulate_collective(cls(topo), spec).finish_ns
        model = build_model(cls.name, topo)
        assert model.num_ranks == 4
        hc = model.start_collective(0, spec)
        hp = model.start_p2p(0, 0, 1, 3_000_000)  # same direction as the ring's 0 -> 1 link
        got = {}
        while model.next_event_ns() is not None:
            for c in model.advance(model.next_event_ns()):
                got[c.handle] = c.finish_ns
        assert (got[hc] > alone) is slower
        assert got[hp] >= 3_000_000


def test_same_time_completions_are_ordered_by_handle():
    model = FlowModel(switch_topology(4, 1e9, 0))
    handles = [model.start_p2p(0, s, d, 1000) for s, d in ((2, 3), (0, 1))]
    done = model.advance(10_000)
    assert [c.handle for c in done] == handles
    assert {c.finish_ns for c in done} == {1000}


def test_numpy_integers_are_accepted_and_results_are_python_ints():
    for cls in (AnalyticalModel, FlowModel):
        model = cls(ring_topology(4, 1e9, 0))
        h = model.start_collective(
            np.int64(5), CollectiveSpec("all_reduce", np.int64(4000), tuple(np.arange(4)))
        )
        (c,) = model.advance(10**9)
        assert c.handle == h and type(c.finish_ns) is int and c.finish_ns == 5 + 6000
        assert all(type(x) is int for x in c.per_rank_finish_ns)


def test_reduction_bandwidth_and_endpoint_delay_in_both_models():
    topo = ring_topology(4, 1e9, 100)
    spec = CollectiveSpec("reduce_scatter", 4_000_000, (0, 1, 2, 3))
    # 3 steps of (100 ns + 1e6 B at 1 B/ns + 10 ns endpoint delay), each followed by a 1e6 B reduction at
    # 4 GB/s (250000 ns).
    expect = 3 * (100 + 1_000_000 + 10 + 250_000)
    for cls in (AnalyticalModel, FlowModel):
        model = cls(topo, endpoint_delay_ns="10ns", reduction_bandwidth="4GBps")
        assert simulate_collective(model, spec).finish_ns == expect


def test_random_collectives_flow_never_beats_analytical_and_is_deterministic():
    rng = np.random.default_rng(11)
    topo = topology_from_spec(
        "nodes:2*H100x4,A100x2+H100x2:preset=table6:fabric=leaf_spine:nics_per_leaf=4:spines=2"
    )
    kinds = [k for k in COLLECTIVE_KINDS if k != "barrier"]
    for _ in range(25):
        p = int(rng.integers(2, 9))
        ranks = tuple(int(r) for r in rng.choice(12, size=p, replace=False))
        kind = kinds[int(rng.integers(len(kinds)))]
        algo = ["ring", "direct"][int(rng.integers(2))]
        spec = CollectiveSpec(kind, int(rng.integers(1, 1 << 22)), ranks, algo, root=ranks[-1])
        a = simulate_collective(AnalyticalModel(topo), spec)
        f1 = simulate_collective(FlowModel(topo), spec)
        f2 = simulate_collective(FlowModel(topo), spec)
        assert f1 == f2
        assert all(x >= y for x, y in zip(f1.per_rank_finish_ns, a.per_rank_finish_ns, strict=True)), spec


def _run_guarded(starts) -> list:
    """Start (now, src, dst, bytes) p2p flows on a 2-host 300 GB/s ring and run to the end; finish times.

    Under a 20 s alarm: a float time that stops advancing must fail the test, not hang it.
    """
    import signal

    def boom(*_):
        raise TimeoutError("flow model stopped advancing")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(20)
    try:
        model = FlowModel(ring_topology(2, 300e9, 0))
        for now, src, dst, size in starts:
            model.start_p2p(now, src, dst, size)
        out = []
        while (n := model.next_event_ns()) is not None:
            out += model.advance(n)
        return [c.finish_ns for c in out]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_flow_finishing_at_tens_of_seconds_terminates_with_exact_times():
    # At ~2e10 ns a float's spacing (~3.8e-6 ns) exceeds the 1e-6 ns done threshold, so a flow at
    # 300 B/ns kept ~1e-3 B after its finish time and the model stepped to the same time forever (Table 4
    # C13 under --model flow never finished). Hand-computed: 860,954,510 B / 300 B/ns = 2,869,848.37 ns
    # after 19,733,815,619 -> 19,736,685,468 (rounded up); the second flow starts after the first is done:
    # 245,631,565 / 300 = 818,771.88 ns after 19,743,733,528 -> 19,744,552,300.
    got = _run_guarded([(19_733_815_619, 0, 1, 860_954_510), (19_743_733_528, 0, 1, 245_631_565)])
    assert got == [19_736_685_468, 19_744_552_300]
    # Two flows sharing the link at 2e10 ns: 150 B/ns each until the smaller one's 3,000,000,001 B are
    # done (20,000,000.007 ns), then the other's 3,000,000,006 B left at 300 B/ns (10,000,000.02 ns).
    got = _run_guarded([(20_000_000_000, 0, 1, 3_000_000_001), (20_000_000_000, 0, 1, 6_000_000_007)])
    assert got == [20_020_000_001, 20_030_000_001]
