"""Issue 14: ASTRA-sim compatibility of communicator groups, multi-chunk non-ring algorithms and the
congestion-aware backend, to the nanosecond.

Two kinds of expected numbers: ASTRA-sim's own results quoted in issue 14 (ASTRA-sim master 518bd51 built
and run on the same inputs), and cases worked out by hand here from the rules read in ASTRA-sim's source
(listed in netmodels/astra_events.py), independently of netmodels' code.
"""

from __future__ import annotations

import math

import pytest
from xsim.netmodels import CollectiveSpec, simulate_collective
from xsim.netmodels.astra import (
    CLEAN_SYSTEM,
    AstraDim,
    AstraModel,
    AstraNetwork,
    load_network_yml,
    load_system_json,
)

from tests.test_replay_support import SHARED

CFG = SHARED / "peer_configs" / "astra-sim"
needs_cfg = pytest.mark.skipif(not CFG.is_dir(), reason="../shared peer configs absent")
MIB = 1 << 20
B50 = 50 * 2**30 / 1e9  # 50 GB/s in bytes/ns, GB = 2^30 (reference section 2)
B400 = 400 * 2**30 / 1e9


def ar(n: int, size: int, algorithm: str | None = None, ranks=None) -> CollectiveSpec:
    return CollectiveSpec("all_reduce", size, tuple(ranks if ranks is not None else range(n)), algorithm)


def ex_ring(n: int, aware: bool = False) -> AstraModel:
    """Ring-n, 50 GB/s, 500 ns with the repo's Ring_4chunks system (4 splits, 1 active, ed 10, L 1600)."""
    return AstraModel(
        AstraNetwork((AstraDim("ring", n, 50, 500),)),
        load_system_json(CFG / "system/repo_examples_Ring_4chunks.json"),
        aware,
    )


def hgx8(aware: bool = False, validated: bool = False) -> AstraModel:
    stem = "repo_examples_HGX-H100-validated" if validated else "repo_inputs_hgx_h100_8gpu"
    net = load_network_yml(CFG / f"network/{stem}.yml")
    return AstraModel(net, load_system_json(CFG / f"system/{stem}.json"), aware)


# ----- communicator groups: MemBus's 10 ns Fast transmissions -------------------------------------------


@needs_cfg
def test_group_reduce_scatter_4628_and_all_reduce_53028():
    # hgx_h100_8gpu: Switch 8 x 400 GB/s, 936.25 ns; ed 1, 4 splits, 2 active chunks, L 3350. A 2-rank group
    # is smaller than the system: a Local ring whose bundles cost 10 ns (MemBus Fast) instead of ed = 1.
    def t(m):  # Switch: 2 hops of latency, serialization once (congestion-unaware)
        return math.floor(2 * 936.25 + m / B400)

    def red(m):
        return 3 * math.floor(m / 3350)

    # 1 MiB ReduceScatter: chunk 256 KiB, m = 128 KiB, 1 step; 4 chunks run 2 at a time = 2 rounds.
    rs = 2 * (t(131072) + red(131072) + 2 * 10)
    assert rs == 4628
    c = simulate_collective(hgx8(), CollectiveSpec("reduce_scatter", MIB, (0, 1)))
    assert c.per_rank_finish_ns == (4628, 4628)
    # 32 MB (32,768,000 B) AllReduce: m = 4,096,000, 2 steps, one reduction, 3 bus crossings per chunk.
    m = 32_768_000 // 4 // 2
    assert 2 * (2 * t(m) + red(m) + 3 * 10) == 53028
    assert simulate_collective(hgx8(), ar(2, 32_768_000, ranks=(0, 1))).finish_ns == 53028
    # The whole system keeps the configured endpoint-delay (ed 1): 3 crossings of 1 ns per chunk.
    whole = simulate_collective(hgx8(), CollectiveSpec("reduce_scatter", MIB, tuple(range(8))))
    m8 = MIB // 4 // 8
    assert whole.finish_ns == 2 * (7 * t(m8) + 7 * red(m8) + 8 * 1)


def test_group_keeps_single_implementation_and_ring_replaces_per_dim_lists():
    # A 4-rank group of a 16-NPU [Ring 4, Ring 4] network, clean profile: 6 steps, 7 crossings of 10 ns.
    net = AstraNetwork((AstraDim("ring", 4, 50, 1000), AstraDim("ring", 4, 50, 1000)))
    model = AstraModel(net, CLEAN_SYSTEM)
    t = math.floor(1000 + (MIB // 4) / B50)
    assert simulate_collective(model, ar(4, MIB, ranks=(0, 1, 2, 3))).finish_ns == 6 * t + 70


# ----- multi-chunk non-ring algorithms (issue 14's ASTRA-sim runs) ---------------------------------------


@needs_cfg
def test_halving_doubling_ring8_1mib_63168():
    # Per chunk (256 KiB): messages 128, 64, 32 KiB to partners 1, 2, 4 hops away, then back. A reducing
    # bundle costs the size of the message the rank sends next (PacketBundle carries the current msg_size):
    # 64 KiB after the first receive, 32 KiB after the second.
    t1, t2, t4 = (math.floor(500 * h + (131072 >> k) / B50) for k, h in enumerate((1, 2, 4)))
    assert (t1, t2, t4) == (2941, 2220, 2610)
    chunk = 2 * (t1 + t2 + t4) + 3 * math.floor(65536 / 1600) + 3 * math.floor(32768 / 1600) + 7 * 10
    assert 4 * chunk == 63168
    assert simulate_collective(ex_ring(8), ar(8, MIB, "halvingDoubling")).finish_ns == 63168


@needs_cfg
@pytest.mark.parametrize(
    "n,size,algo,want",
    [
        (16, 64 * MIB, "halvingDoubling", 2_459_136),
        (8, MIB, "doubleBinaryTree", 139_052),
        (8, 64 * MIB, "doubleBinaryTree", 7_218_350),
        (8, 64 * MIB, "direct", 340_336),
    ],
)
def test_issue14_astra_sim_runs(n, size, algo, want):
    c = simulate_collective(ex_ring(n), ar(n, size, algo))
    assert c.finish_ns == want


@needs_cfg
def test_direct_ring8_64mib_chunk_by_hand():
    # Direct AllReduce per chunk (16 MiB, m = 2 MiB): all 7 RS messages leave at ed; a rank's AG messages go
    # out one per returning bundle once every RS message is in: two at g(1), two at g(2), two at g(3), one at
    # g(4) where g(h) = ed + T(h) + ed + reduction; the chunk ends ed after the last AG arrival.
    m = 2 * MIB

    def t(h):
        return math.floor(500 * h + m / B50)

    ed, red = 10, 3 * math.floor(m / 1600)

    def g(h):
        return ed + t(h) + ed + red

    sends = [(g(1), 1), (g(1), 2), (g(2), 3), (g(2), 4), (g(3), 3), (g(3), 2), (g(4), 1)]
    chunk = max(s + t(h) for s, h in sends) + ed
    assert 4 * chunk == 340_336
    assert simulate_collective(ex_ring(8), ar(8, 64 * MIB, "direct")).finish_ns == 4 * chunk


def test_double_binary_tree_one_chunk_with_reductions_by_hand():
    # Switch-8 (every message 2 hops), 1 chunk, ed 1, L 100: leaves wait ed, send up; every inner node and
    # the root pay ed + reduction per bundle; leaves end ed after the data comes down:
    # 6 T + 7 ed + 5 reductions of the whole chunk.
    from xsim.netmodels.astra import AstraSystem

    system = AstraSystem(1, 1, 1, 100.0, "localBWAware", "LIFO", ())
    model = AstraModel(AstraNetwork((AstraDim("switch", 8, 50, 500),)), system)
    t = math.floor(1000 + MIB / B50)
    red = 3 * math.floor(MIB / 100)
    c = simulate_collective(model, ar(8, MIB, "doubleBinaryTree"))
    assert c.finish_ns == 6 * t + 7 + 5 * red
    assert c.per_rank_finish_ns[7] == 3 * t + 4 + 3 * red  # the DBMAX root exits after sending down


def test_double_binary_tree_streams_alternate_trees_across_collectives():
    # DoubleBinaryTreeTopology's counter lives on the rank: with one chunk per collective the second
    # collective runs on the tree rooted at 0 (DBMIN), whose root finishes first.
    model = AstraModel(AstraNetwork((AstraDim("switch", 8, 50, 500),)), CLEAN_SYSTEM)
    t = math.floor(1000 + MIB / B50)
    first = simulate_collective(model, ar(8, MIB, "doubleBinaryTree"))
    second = simulate_collective(model, ar(8, MIB, "doubleBinaryTree"))
    assert first.per_rank_finish_ns[7] == second.per_rank_finish_ns[0] == 3 * t + 4


# ----- congestion-aware backend: links as FIFO servers ---------------------------------------------------


@needs_cfg
def test_aware_hgx_h100_two_active_chunks_57426():
    # HGX-H100-validated: Switch 8, 400 GB/s, 936.25 ns, ed 10, 4 splits, 2 active chunks, L 3350; 1 MiB
    # ring AllReduce, m = 32 KiB. Chunks 0 and 1 start together; on every uplink chunk 1 waits s = floor(m/B)
    # behind chunk 0 and stays exactly s behind (its next send finds the link just freed). Chunks 3 and 2
    # (LIFO) start when 0 and 1 end: total = 2 T_chunk + s with T_chunk = 14 x 2d + 7 red + 15 ed.
    m = MIB // 4 // 8
    s = math.floor(m / B400)
    d = math.floor(936.25 + m / B400)
    t_chunk = 14 * 2 * d + 7 * 3 * math.floor(m / 3350) + 15 * 10
    assert 2 * t_chunk + s == 57426
    c = simulate_collective(hgx8(aware=True, validated=True), ar(8, MIB))
    assert c.per_rank_finish_ns == (57426,) * 8


def test_aware_direct_switch4_serializes_on_uplinks():
    # Clean profile, Switch-4 aware, 1 MiB direct AllReduce, m = 256 KiB: a rank's 3 RS messages leave its
    # uplink s apart and reach 3 different destinations (no downlink conflict); every rank has all three at
    # ed + 2s + 2d, sends its AG messages then (its third bundle returns ed later), the same pattern again,
    # and ends ed after the last arrival: 3 ed + 4 s + 4 d.
    m = MIB // 4
    s, d = math.floor(m / B50), math.floor(500 + m / B50)
    model = AstraModel(AstraNetwork((AstraDim("switch", 4, 50, 500),)), CLEAN_SYSTEM, congestion_aware=True)
    c = simulate_collective(model, ar(4, MIB, "direct"))
    assert c.per_rank_finish_ns == (3 + 4 * s + 4 * d,) * 4 == (41059,) * 4


def _drain(model) -> list:
    out = []
    while model.next_event_ns() is not None:
        out += model.advance(model.next_event_ns())
    return out


def test_aware_concurrent_messages_queue_on_a_shared_link():
    # Two 1 MiB sends into rank 2 of a Switch at t = 0: both reach the switch at d; the switch->2 link takes
    # the first, the second waits s for it: 2d and 2d + s.
    s, d = math.floor(MIB / B50), math.floor(500 + MIB / B50)
    model = AstraModel(AstraNetwork((AstraDim("switch", 4, 50, 500),)), CLEAN_SYSTEM, congestion_aware=True)
    a = model.start_p2p(0, 0, 2, MIB)
    b = model.start_p2p(0, 1, 2, MIB)
    done = {c.handle: c.finish_ns for c in _drain(model)}
    assert done == {a: 2 * d, b: 2 * d + s} == {a: 40062, b: 59593}


def test_aware_ring_route_and_fifo_across_collective_and_p2p():
    # Ring-4 aware, clean profile. A 2-rank group {0, 1} AllReduce of 2 MiB (m = 1 MiB per step, 10 ns bus)
    # and, at the same time, a 1 MiB send 0 -> 2 (route 0 -> 1 -> 2, clockwise on the tie). The send is
    # injected at 0 and takes link 0->1 first; the group's first message leaves rank 0 at 10 ns and waits
    # for it until s; everything later is uncontended.
    s, d = math.floor(MIB / B50), math.floor(500 + MIB / B50)
    model = AstraModel(AstraNetwork((AstraDim("ring", 4, 50, 500),)), CLEAN_SYSTEM, congestion_aware=True)
    coll = model.start_collective(0, ar(4, 2 * MIB, ranks=(0, 1)))
    p2p = model.start_p2p(0, 0, 2, MIB)
    done = {c.handle: c for c in _drain(model)}
    assert done[p2p].finish_ns == 2 * d
    # Rank 1's message 1 -> 0 is free: it arrives at 10 + d. Rank 0's waits for the send: it holds link 0->1
    # from s to 2s and arrives at s + d. Step 2: rank 0 has 1's message at 10 + d, its bundle returns at
    # 20 + d, but link 0->1 is busy until 2s: the message arrives at 2s + d, rank 1 ends 10 ns later. Rank 1
    # sends at s + d + 10 (free link); rank 0 ends 10 ns after that arrives.
    r0 = (s + d + 10) + d + 10
    r1 = 2 * s + d + 10
    assert done[coll].per_rank_finish_ns == (r0, r1)


# ----- the closed forms are the event machine's own results where they apply --------------------------


def _events_only(monkeypatch):
    monkeypatch.setattr(AstraModel, "_contention_free", lambda self, spec, ranks: False)


@pytest.mark.parametrize("topo", ["ring", "switch", "fc"])
@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "all_gather", "all_to_all"])
@pytest.mark.parametrize("ranks", [tuple(range(8)), (0, 2, 4, 6), (1, 2)])
def test_aware_ring_closed_form_equals_event_run(monkeypatch, topo, kind, ranks):
    from xsim.netmodels.astra import AstraSystem

    system = AstraSystem(4, 1, 10, 1600.0, "localBWAware", "LIFO", ())
    spec = CollectiveSpec(kind, MIB + 12345, ranks)

    def model():
        return AstraModel(AstraNetwork((AstraDim(topo, 8, 50, 500),)), system, congestion_aware=True)

    closed = simulate_collective(model(), spec)
    _events_only(monkeypatch)
    assert simulate_collective(model(), spec) == closed


@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "all_gather", "all_to_all"])
@pytest.mark.parametrize("n,ranks", [(8, tuple(range(8))), (8, (0, 3, 5)), (16, tuple(range(16)))])
def test_unaware_ring_closed_form_equals_packet_machine(kind, n, ranks):
    # The ring closed form reproduced ASTRA-sim's 182 ring runs (reference 3.3 item 5); the packet machine
    # that runs halvingDoubling and direct must give the same numbers for ring.
    from xsim.netmodels.astra import AstraSystem
    from xsim.netmodels.astra_events import AstraWorld, CollectiveRun, PacketAlgo, UnawareNet

    system = AstraSystem(4, 2, 10, 1600.0, "localBWAware", "LIFO", ())
    model = AstraModel(AstraNetwork((AstraDim("ring", n, 50, 500),)), system)
    spec = CollectiveSpec(kind, 3 * MIB + 7, ranks)
    closed = model.collective_ns(spec)
    sub = len(ranks) < n
    chunks = [
        [(0, lambda ctx, st, mem, idx, c=c: PacketAlgo(ctx, st, mem, idx, sub, kind, "ring", c))]
        for c in model.chunk_sizes(kind, spec.size_bytes, len(ranks))
    ]
    world = AstraWorld(lambda loop: UnawareNet(loop, model._msg1), 10, 1600.0, 2, True)
    out = []
    CollectiveRun(world, 0, ranks, chunks, lambda run: out.append(tuple(run.finish))).start()
    world.loop.run_until(None)
    assert out[0] == closed


def test_aware_tentative_closed_form_is_replayed_when_traffic_joins(monkeypatch):
    # A ring AllReduce alone takes its closed form; a send started while it runs shares its links. Both must
    # finish exactly as when everything runs on the event loop from the start.
    def run():
        model = AstraModel(AstraNetwork((AstraDim("ring", 4, 50, 500),)), CLEAN_SYSTEM, congestion_aware=True)
        model.start_collective(0, ar(4, 4 * MIB))
        model.advance(30_000)
        model.start_p2p(30_000, 0, 1, MIB)
        model.start_p2p(30_000, 2, 1, MIB)
        return _drain(model)

    fast = run()
    _events_only(monkeypatch)
    slow = run()
    assert fast == slow
    alone = simulate_collective(
        AstraModel(AstraNetwork((AstraDim("ring", 4, 50, 500),)), CLEAN_SYSTEM, congestion_aware=True),
        ar(4, 4 * MIB),
    )
    assert fast[-1].finish_ns > alone.finish_ns  # the sends delayed the collective


# ----- multi-dimensional collectives: phases per dimension, chunks pipelined across dimension queues -----


def test_multi_dim_two_chunks_pipeline_across_dimension_queues():
    # [Ring 4, Ring 4], 50 GB/s, 1000 ns, ed 1, 2 splits, 1 active chunk, 1 MiB AllReduce (chunk 512 KiB).
    # Chunk A: RS dim 0 (R = 3 t(128 KiB) + 4), AR dim 1 (6 t(32 KiB) + 7, shorter than R), AG dim 0 (G = R).
    # B starts its RS on dim 0 when A leaves for dim 1; A's AG waits for B's RS (one chunk per queue); B's AG
    # waits for A's AG: 2R + 2G instead of 2(R + AR + G) back to back.
    net = AstraNetwork((AstraDim("ring", 4, 50, 1000), AstraDim("ring", 4, 50, 1000)))
    from xsim.netmodels.astra import AstraSystem

    model = AstraModel(net, AstraSystem(2, 1, 1, 1e9, "localBWAware", "LIFO", ()))
    r = 3 * math.floor(1000 + 131072 / B50) + 4
    assert 6 * math.floor(1000 + 32768 / B50) + 7 < r
    c = simulate_collective(model, ar(16, MIB))
    assert c.per_rank_finish_ns == (2 * r + 2 * r,) * 16 == (41308,) * 16


@pytest.mark.parametrize("opt", ["localBWAware", "baseline"])
def test_multi_dim_reduce_scatter_and_all_gather_sizes_and_order(opt):
    # [Ring 4 (1000 ns), Ring 2 (3000 ns)], clean, 1 MiB. RS: dim 0 on S (3 steps of S/4), then dim 1 on
    # the S/4 it produced (1 step of S/8). AG walks the dims backwards: dim 1 on S (1 step of S), then dim 0
    # on 2S (3 steps of 2S). Each phase pays steps + 1 bus crossings of 1 ns.
    from xsim.netmodels.astra import AstraSystem

    net = AstraNetwork((AstraDim("ring", 4, 50, 1000), AstraDim("ring", 2, 50, 3000)))
    model = AstraModel(net, AstraSystem(1, 1, 1, 1e9, opt, "LIFO", ()))

    def t0(m):
        return math.floor(1000 + m / B50)

    def t1(m):
        return math.floor(3000 + m / B50)

    rs = simulate_collective(model, CollectiveSpec("reduce_scatter", MIB, tuple(range(8))))
    assert rs.finish_ns == (3 * t0(MIB // 4) + 4) + (t1(MIB // 8) + 2)
    ag = simulate_collective(model, CollectiveSpec("all_gather", MIB, tuple(range(8))))
    assert ag.finish_ns == (t1(MIB) + 2) + (3 * t0(2 * MIB) + 4)


def test_multi_dim_double_binary_tree_on_the_last_dimension():
    # [Ring 2 (1000 ns), Switch 4 (500 ns)], 50 GB/s, clean, 1 MiB AllReduce, implementations [ring, DBT]:
    # RS on dim 0 (1 step of 512 KiB), a tree AllReduce of the 512 KiB over the rank's dim-1 line (the DBMAX
    # tree of 4: root 3 -> 1 -> {0, 2}), AG on dim 0 (1 step of 512 KiB). Every message costs
    # t = floor(1000 + 512 KiB / B). Tree finishes by position: root 2t + 3, middle 3t + 4, leaves 4t + 5.
    from xsim.netmodels.astra import AstraSystem

    impl = (("all_reduce", ("ring", "doubleBinaryTree")),)
    net = AstraNetwork((AstraDim("ring", 2, 50, 1000), AstraDim("switch", 4, 50, 500)))
    model = AstraModel(net, AstraSystem(1, 1, 1, 1e9, "localBWAware", "LIFO", impl))
    t = math.floor(1000 + (MIB // 2) / B50)
    tree = {3: 2 * t + 3, 1: 3 * t + 4, 0: 4 * t + 5, 2: 4 * t + 5}
    c = simulate_collective(model, ar(8, MIB))
    assert c.per_rank_finish_ns == tuple(2 * (t + 2) + tree[r // 2] for r in range(8))


# ----- members reaching a collective at different times: no barrier in ASTRA-sim ------------------------


def _late_rank0_expected(late: int, t: int) -> tuple[int, ...]:
    # Ring-4 AllReduce, one chunk, ed 1: a rank sends message k+1 one crossing after it has message k, and it
    # has message k at max(arrival, its own k-th send) (it posts the receive when it sends). Rank 0 issues at
    # `late`, ranks 1-3 at 0; the messages of ranks 1-3 wait for rank 0's, so the steps go (worked out step by
    # step from g1 = issue + 1, r_k = max(g_k[pred] + t, g_k), g_{k+1} = r_k + 1, finish = g_7):
    return (late + 4 * t + 7, late + 5 * t + 7, late + 6 * t + 7, late + 3 * t + 7)


def test_late_member_staggered_start_by_hand():
    model = AstraModel(AstraNetwork((AstraDim("ring", 4, 50, 500),)), CLEAN_SYSTEM)
    t = math.floor(500 + (MIB // 4) / B50)
    late = 100_000
    assert model.staggered_ns(ar(4, MIB), (late, 0, 0, 0)) == _late_rank0_expected(late, t)
    # Issued together, every rank ends at the closed form 6t + 7 after the start; the last finish of the
    # staggered run is the same one, counted from the last issue.
    assert simulate_collective(model, ar(4, MIB)).finish_ns == 6 * t + 7 == max(_late_rank0_expected(0, t))


@pytest.mark.parametrize("algo", ["ring", "halvingDoubling", "direct"])
def test_staggered_issue_last_finish_is_the_synchronized_one_from_the_last_issue(algo):
    # For these algorithms every rank's last step needs data that left the late rank after it issued.
    model = AstraModel(AstraNetwork((AstraDim("switch", 8, 50, 500),)), CLEAN_SYSTEM)
    spec = ar(8, MIB, algo)
    out = model.staggered_ns(spec, (0, 0, 0, 50_000, 0, 0, 0, 0))
    assert max(out) == 50_000 + max(model.collective_ns(spec)) and min(out) > 50_000


def _dbt_late3(t: int, late: int) -> int:
    # DBMAX tree of 8 (root 7 -> 3 -> {1, 5} -> leaves), Switch (every message t), ed 1. Rank 3 issues at
    # `late`, the others at 0: leaves and ranks 1, 5 have sent up long before; at `late` rank 3 finds both
    # messages, sends to 7 one crossing later; 7 answers one crossing after it arrives; then down: 3, {1, 5}
    # one crossing after each arrival, leaves end one crossing after theirs: late + 4t + 5, not late + 6t + 7.
    return late + 4 * t + 5


def test_staggered_issue_double_binary_tree_by_hand():
    model = AstraModel(AstraNetwork((AstraDim("switch", 8, 50, 500),)), CLEAN_SYSTEM)
    t = math.floor(1000 + MIB / B50)
    out = model.staggered_ns(ar(8, MIB, "doubleBinaryTree"), (0, 0, 0, 50_000, 0, 0, 0, 0))
    assert max(out) == _dbt_late3(t, 50_000)


def test_staggered_issue_in_a_replay(tmp_path):
    # The replay engine hands each member's issue time to the model: rank 3 computes 50 us first.
    import json

    from xsim.netmodels.astra import astra_model
    from xsim.replay import simulate

    from tests.test_replay_support import coll, comp, write_set

    net = tmp_path / "net.yml"
    net.write_text("topology: [ Switch ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n")
    sysj = tmp_path / "sys.json"
    sysj.write_text(
        json.dumps(
            {
                "endpoint-delay": 1,
                "preferred-dataset-splits": 1,
                "active-chunks-per-dimension": 1,
                "local-mem-bw": 1e9,
                "all-reduce-implementation": ["doubleBinaryTree"],
            }
        )
    )
    per_rank = [[coll(2, MIB)]] * 3 + [[comp(1, 50), coll(2, MIB, deps=[1])]] + [[coll(2, MIB)]] * 4
    res = simulate(write_set(tmp_path, per_rank), network=astra_model(net, sysj))
    t = math.floor(1000 + MIB / B50)
    # Every member continues when its own part ends: root 7 after sending down, then 3, then {1, 5}, then
    # the leaves (the steps of _dbt_late3).
    late = 50_000
    by_role = {7: late + t + 2, 3: late + 2 * t + 3, 1: late + 3 * t + 4, 5: late + 3 * t + 4}
    assert res.per_rank_finish_ns == [by_role.get(r, _dbt_late3(t, late)) for r in range(8)]


def test_aware_three_messages_queue_behind_each_other_on_one_link():
    # Three 1 MiB sends into rank 2 of a Switch at t = 0 (from 0, 1, 3): all reach the switch at d; the
    # switch->2 link serves them in the order they arrived there, each waiting s per message before it:
    # 2d, 2d + s, 2d + 2s. Pins the link's free events when more than one message waits (issue 30: frees are
    # scheduled only while messages wait).
    s, d = math.floor(MIB / B50), math.floor(500 + MIB / B50)
    model = AstraModel(AstraNetwork((AstraDim("switch", 4, 50, 500),)), CLEAN_SYSTEM, congestion_aware=True)
    hs = [model.start_p2p(0, src, 2, MIB) for src in (0, 1, 3)]
    done = {c.handle: c.finish_ns for c in _drain(model)}
    assert [done[h] for h in hs] == [2 * d, 2 * d + s, 2 * d + 2 * s] == [40062, 59593, 79124]


def test_aware_send_at_a_links_free_time_goes_before_later_sends():
    # 1 MiB sends 0->1 and 1->3 at t = 0 (on the event loop: two at once) hold the uplinks of ranks 0 and 1
    # until s. The engine advances the model to every event it reports, the uplinks' frees at s included,
    # before it starts work at s; then 0->2 and 3->2 start at s, in that order, both leave at once, reach
    # the switch together at s + d, and switch->2 serves 0->2 first: s + 2d, then s + 2d + s. (Issue 30:
    # a link's free is put in the event loop only when a message waits, so it must still count as run
    # when the engine starts work at its time.)
    s, d = math.floor(MIB / B50), math.floor(500 + MIB / B50)
    model = AstraModel(AstraNetwork((AstraDim("switch", 4, 50, 500),)), CLEAN_SYSTEM, congestion_aware=True)
    a = model.start_p2p(0, 0, 1, MIB)
    b = model.start_p2p(0, 1, 3, MIB)
    out = []
    while model.next_event_ns() is not None and model.next_event_ns() <= s:  # the engine's protocol
        out += model.advance(model.next_event_ns())
    x = model.start_p2p(s, 0, 2, MIB)
    y = model.start_p2p(s, 3, 2, MIB)
    done = {c.handle: c.finish_ns for c in out + _drain(model)}
    assert done == {a: 2 * d, b: 2 * d, x: s + 2 * d, y: 2 * s + 2 * d}
    assert (done[x], done[y]) == (59593, 79124)
