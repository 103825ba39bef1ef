"""Engine semantics on small hand-computed cases: stragglers, P2P, resources, deadlocks, graph errors."""

from __future__ import annotations

import pytest
from xsim.replay import (
    DurationModel,
    ReplayConfig,
    ReplayDeadlock,
    ReplayError,
    SpeedScaled,
    TraceGraphError,
    simulate,
)
from xsim.traces import pb
from xsim.traces.attrs import make_node

from tests.test_replay_support import FakeNet, coll, comp, recv, send, write_set


def test_straggler_wait_exact(tmp_path) -> None:
    # 4 ranks: 100 us compute -> AllReduce (fake net: 1000 ns) -> 10 us compute. Rank 3's first compute
    # is 2x slower (200 us). The fast ranks issue the AllReduce at 100000 and wait for rank 3 until 200000:
    # wait 100000 each; the AllReduce runs 200000..201000; all finish at 211000.
    per = [[comp(1, 100), coll(2, 1 << 20, deps=[1]), comp(3, 10, deps=[2])] for _ in range(4)]
    per[3][0] = comp(1, 200)
    ts = write_set(tmp_path, per)
    res = simulate(ts, network=FakeNet(4))
    ar = res.ops.filter(name="coll2").sort("rank")
    assert ar["wait_ns"].to_list() == [100_000, 100_000, 100_000, 0]
    assert ar["start_ns"].to_list() == [100_000, 100_000, 100_000, 200_000]
    assert ar["end_ns"].to_list() == [201_000] * 4
    r = res.ranks
    assert r["wait_ns"].to_list() == [100_000, 100_000, 100_000, 0]
    assert r["finish_ns"].to_list() == [211_000] * 4
    assert r["compute_ns"].to_list() == [110_000, 110_000, 110_000, 210_000]
    assert r["comm_ns"].to_list() == [1000] * 4  # counted from the last arrival
    assert r["idle_ns"].to_list() == [100_000, 100_000, 100_000, 0]
    assert r["bubble_ns"].to_list() == [100_000, 100_000, 100_000, 0]
    s = res.summary_dict()
    assert (s["wait_ns_total"], s["wait_ns_max"], s["iteration_time_ns"]) == (300_000, 100_000, 211_000)
    c = res.collectives.row(0, named=True)
    assert (c["first_arrival_ns"], c["last_arrival_ns"], c["end_ns"], c["wait_sum_ns"]) == (
        100_000,
        200_000,
        201_000,
        300_000,
    )


def test_speed_factor(tmp_path) -> None:
    # Factor 0.5 doubles GPU compute (100 us -> 200 us), 4.0 quarters it; CPU ops keep their time.
    cpu = make_node(2, "host", pb.COMP_NODE, data_deps=[1], duration_micros=10, attrs={"is_cpu_op": True})
    ts = write_set(tmp_path, [[comp(1, 100), cpu]] * 3)
    res = simulate(ts, network=None, compute=SpeedScaled(DurationModel(), {1: 0.5, 2: 4.0}))
    assert res.per_rank_finish_ns == [110_000, 210_000, 35_000]


def test_p2p_match_and_wait(tmp_path) -> None:
    # Rank 1 posts its recv at 0; rank 0 sends after 10 us of compute. Fake net: 100 + 1000 // 10 = 200 ns.
    r0 = [comp(1, 10), send(2, dst=1, tag=7, size=1000, deps=[1])]
    r1 = [recv(1, src=0, tag=7, size=1000), comp(2, 5, deps=[1])]
    net = FakeNet(2)
    res = simulate(write_set(tmp_path, [r0, r1]), network=net)
    ops = {(row["rank"], row["node_id"]): row for row in res.ops.iter_rows(named=True)}
    snd, rcv = ops[(0, 2)], ops[(1, 1)]
    assert (snd["start_ns"], snd["end_ns"], snd["wait_ns"]) == (10_000, 10_200, 0)
    assert (rcv["start_ns"], rcv["end_ns"], rcv["wait_ns"]) == (0, 10_200, 10_000)
    assert snd["p2p"] == rcv["p2p"] == 0 and snd["peer"] == 1 and rcv["peer"] == 0
    assert ops[(1, 2)]["end_ns"] == 15_200
    assert net.started == [(10_000, (0, 1, 1000))]
    assert res.summary_dict()["bytes_moved"] == 1000


def test_p2p_recv_after_arrival(tmp_path) -> None:
    # The send completes at 200; the recv is posted only at 50 us: it completes at once, without waiting.
    r0 = [send(1, dst=1, tag=0, size=1000)]
    r1 = [comp(1, 50), recv(2, src=0, tag=0, size=1000, deps=[1])]
    res = simulate(write_set(tmp_path, [r0, r1]), network=FakeNet(2))
    assert res.ops.filter(rank=1, node_id=2)[["start_ns", "end_ns", "wait_ns"]].row(0) == (50_000, 50_000, 0)


def test_p2p_size_mismatch_names_both(tmp_path) -> None:
    r0 = [send(3, dst=1, tag=7, size=1000)]
    r1 = [recv(4, src=0, tag=7, size=2000)]
    with pytest.raises(
        ReplayError, match=r"send rank 0 node 3 'send3'.*1000.*recv rank 1 node 4 'recv4'.*2000"
    ):
        simulate(write_set(tmp_path, [r0, r1]), network=FakeNet(2))


def test_deadlock_unmatched_recv(tmp_path) -> None:
    r0 = [comp(1, 10)]
    r1 = [recv(1, src=0, tag=5, size=64), comp(2, 1, deps=[1])]
    with pytest.raises(ReplayDeadlock) as ei:
        simulate(write_set(tmp_path, [r0, r1]), network=FakeNet(2))
    e = ei.value
    assert e.remaining == 2
    assert [(s.rank, s.node_id) for s in e.stuck] == [(1, 1)]
    assert "rank 1: node 1 'recv1' waits for a send from rank 0 with tag 5" in str(e)


def test_deadlock_missing_collective_member(tmp_path) -> None:
    per = [[comp(1, 10), coll(2, 4096, deps=[1])] for _ in range(3)] + [[comp(1, 10)]]
    with pytest.raises(ReplayDeadlock) as ei:
        simulate(write_set(tmp_path, per), network=FakeNet(4))
    e = ei.value
    assert [s.rank for s in e.stuck] == [0, 1, 2]
    assert all(
        "collective #0 of group '(all ranks)' (ALL_REDUCE, 4096 B): rank(s) [3] never issued it"
        in s.waits_for
        for s in e.stuck
    )
    assert e.time_ns == 10_000


def test_deadlock_blocked_dependency_and_slot(tmp_path) -> None:
    # Rank 0: a recv that never matches blocks node 2 (dependency); rank 1's collective waits for rank 0.
    r0 = [recv(1, src=1, tag=9, size=8), coll(2, 8, deps=[1])]
    r1 = [coll(1, 8), comp(2, 1, deps=[1])]
    with pytest.raises(ReplayDeadlock) as ei:
        simulate(write_set(tmp_path, [r0, r1]), network=FakeNet(2))
    text = str(ei.value)
    assert "rank 0: node 1 'recv1' waits for a send from rank 1 with tag 9" in text
    assert "rank 1: node 1 'coll1' waits for collective #0" in text and "rank(s) [0] never issued it" in text


def test_unreceived_send_is_an_error(tmp_path) -> None:
    with pytest.raises(
        ReplayError, match=r"1 send\(s\) never received: rank 0 node 1 'send1' to rank 1 tag 2"
    ):
        simulate(write_set(tmp_path, [[send(1, dst=1, tag=2, size=8)], [comp(1, 1)]]), network=FakeNet(2))


def test_graph_errors(tmp_path) -> None:
    cyc = [comp(1, 1, deps=[2]), comp(2, 1, deps=[1]), comp(3, 1)]
    with pytest.raises(TraceGraphError, match=r"rank 0: dependency cycle: 2 node\(s\).*ids 1, 2"):
        simulate(write_set(tmp_path, [cyc], "cyc"), network=None)
    with pytest.raises(TraceGraphError, match=r"id 1: data dependency on node 42, which is not in the file"):
        simulate(write_set(tmp_path, [[comp(1, 1, deps=[42])]], "dang"), network=None)
    dup = [comp(1, 1), comp(1, 2)]
    with pytest.raises(TraceGraphError, match="duplicate node id 1"):
        simulate(write_set(tmp_path, [dup], "dup"), network=None)
    with pytest.raises(TraceGraphError, match=r"pg_name '9' is not a known process group"):
        simulate(write_set(tmp_path, [[coll(1, 8, pg="9")]], "pg"), network=FakeNet(1))


def test_ctrl_dep_cycle_falls_back_to_data_deps(tmp_path) -> None:
    # Node 1 ctrl-depends on node 2 which data-depends on node 1 (an old converter's caller <-> kernel pair).
    a = make_node(1, "caller", pb.COMP_NODE, ctrl_deps=[2], duration_micros=3)
    b = make_node(2, "kernel", pb.COMP_NODE, data_deps=[1], duration_micros=4)
    c = make_node(3, "orphan", pb.COMP_NODE, ctrl_deps=[99], data_deps=[2], duration_micros=1)
    ts = write_set(tmp_path, [[a, b, c]])
    res = simulate(ts, network=None)
    assert res.ops["end_ns"].to_list() == [3000, 7000, 8000]
    s = res.summary_dict()
    assert (s["ctrl_deps_ignored_ranks"], s["ignored_ctrl_deps"]) == (1, 1)
    with pytest.raises(TraceGraphError, match="dependency cycle"):
        simulate(ts, network=None, config=ReplayConfig(ctrl_deps="union"))


def test_resources_issue_order_and_streams(tmp_path) -> None:
    # Two ready compute nodes share the one compute slot, issued in ascending id: 3 (20 us) then 5 (10 us).
    # A CPU op and a collective run alongside; the METADATA node completes in 0 ns.
    meta = make_node(0, "meta", pb.METADATA_NODE)
    cpu = make_node(4, "host", pb.COMP_NODE, duration_micros=7, attrs={"is_cpu_op": True})
    nodes = [comp(5, 10, deps=[0]), comp(3, 20), cpu, meta, coll(6, 8)]
    ts = write_set(tmp_path, [nodes])
    res = simulate(ts, network=FakeNet(1))
    ends = dict(zip(res.ops["node_id"].to_list(), res.ops["end_ns"].to_list(), strict=True))
    assert ends == {0: 0, 3: 20_000, 4: 7_000, 5: 30_000, 6: 0}
    two = simulate(ts, network=FakeNet(1), config=ReplayConfig(compute_streams=2))
    assert dict(zip(two.ops["node_id"].to_list(), two.ops["end_ns"].to_list(), strict=True))[5] == 10_000


def test_stream_attribute(tmp_path) -> None:
    nodes = [comp(1, 10, stream=7), comp(2, 10, stream=8), comp(3, 10, stream=7)]
    ts = write_set(tmp_path, [nodes])
    shared = simulate(ts, network=None)
    assert shared.ops["end_ns"].to_list() == [10_000, 20_000, 30_000]
    streams = simulate(ts, network=None, config=ReplayConfig(honour_stream=True))
    assert streams.ops["end_ns"].to_list() == [10_000, 10_000, 20_000]


def test_measured_comm(tmp_path) -> None:
    # Measured: the collective starts when all members issued (all at 0) and lasts the shortest member's
    # recorded duration (3 us); the send/recv pair lasts the send's duration (4 us).
    per = []
    for r, us in enumerate([5, 3, 4]):
        n = make_node(1, "ar", pb.COMM_COLL_NODE, duration_micros=us, attrs={"comm_type": 0, "comm_size": 8})
        extra = (
            [send(2, dst=1, tag=0, size=8)] if r == 0 else [recv(2, src=0, tag=0, size=8)] if r == 1 else []
        )
        if extra and r == 0:
            extra[0].duration_micros = 4
        per.append([n, *extra])
    ts = write_set(tmp_path, per)
    cfg = ReplayConfig(comm_mode="measured", comm_streams="shared")
    res = simulate(ts, network=None, config=cfg)
    ends = {(r["rank"], r["node_id"]): r["end_ns"] for r in res.ops.iter_rows(named=True)}
    assert ends[(0, 1)] == ends[(1, 1)] == ends[(2, 1)] == 3000
    # Shared slot: the send waits for the comm slot held by the collective (ASTRA-sim: one comm op at a time).
    assert ends[(0, 2)] == 3000 + 4000 and ends[(1, 2)] == 7000
    # Default (streams): the send runs on the pipeline stream beside the collective's group stream.
    res = simulate(ts, network=None, config=ReplayConfig(comm_mode="measured"))
    ends = {(r["rank"], r["node_id"]): r["end_ns"] for r in res.ops.iter_rows(named=True)}
    assert ends[(0, 1)] == 3000 and ends[(0, 2)] == 4000 and ends[(1, 2)] == 4000


def test_needs_network_for_collectives(tmp_path) -> None:
    with pytest.raises(ReplayError, match=r"rank 0 node 1 'coll1': a collective needs a network model"):
        simulate(write_set(tmp_path, [[coll(1, 8)], [coll(1, 8)]]), network=None)


def test_duration_comm_types_replay_without_matching(tmp_path) -> None:
    # ASTRA-sim replays BROADCAST by its duration: no peer matching (only rank 0 has one here), comm slot
    # held for 5 us, so the AllReduce issued next on rank 0 waits for it.
    bc = make_node(
        1, "bcast", pb.COMM_COLL_NODE, duration_micros=5, attrs={"comm_type": pb.BROADCAST, "comm_size": 8}
    )
    r0 = [bc, coll(2, 8)]
    r1 = [coll(2, 8)]
    cfg = ReplayConfig(duration_comm_types=frozenset({pb.BROADCAST}))
    res = simulate(write_set(tmp_path, [r0, r1]), network=FakeNet(2), config=cfg)
    ends = {(r["rank"], r["node_id"]): (r["start_ns"], r["end_ns"]) for r in res.ops.iter_rows(named=True)}
    assert ends[(0, 1)] == (0, 5000)
    assert ends[(0, 2)] == (5000, 6000) and ends[(1, 2)] == (0, 6000)


@pytest.mark.parametrize(
    ("node_type", "attrs", "bad", "message"),
    [
        (
            pb.COMM_SEND_NODE,
            {"comm_dst": 1, "comm_size": 8},
            ("comm_tag", "x", "string_val"),
            "comm_tag 'x' is not an integer",
        ),
        (
            pb.COMM_COLL_NODE,
            {"comm_size": 8},
            ("comm_type", "x", "string_val"),
            "comm_type 'x' is not an integer",  # traces/attrcheck.py's one message (issue 16 round 2)
        ),
        (
            pb.COMM_COLL_NODE,
            {"comm_type": 0},
            ("comm_size", 8.5, "double_val"),
            "comm_size 8.5 is not an integer",
        ),
        (pb.COMM_COLL_NODE, {"comm_type": 0}, ("comm_size", -4, "int64_val"), "comm_size -4 is negative"),
        (
            pb.COMM_RECV_NODE,
            {"comm_tag": 1, "comm_size": 8},
            ("comm_src", 5, "int32_val"),
            "peer rank 5 outside 0..1",
        ),
        (pb.COMM_COLL_NODE, {"comm_type": 42}, ("comm_size", 8, "int64_val"), "unknown comm_type 42"),
    ],
)
def test_hostile_comm_attributes(tmp_path, node_type, attrs, bad, message) -> None:
    from xsim.traces.attrs import make_attr

    n = make_node(1, "bad", node_type, attrs=attrs)
    n.attr.append(make_attr(*bad))
    with pytest.raises(TraceGraphError, match=rf"t\.0\.et, rank 0, id 1: {message}"):
        simulate(write_set(tmp_path, [[n], [comp(1, 1)]]), network=FakeNet(2))


def test_stalled_network_model_is_an_error_not_a_hang(tmp_path) -> None:
    class Stuck(FakeNet):
        def next_event_ns(self):
            return 5 if self._pending else None  # forever "something at 5 ns", never a completion

        def advance(self, until_ns):
            return []

    with pytest.raises(ReplayError, match="network model 'fake' makes no progress at t=5 ns"):
        simulate(write_set(tmp_path, [[coll(1, 8)], [coll(1, 8)]]), network=Stuck(2))


def test_rank_waiting_excludes_time_spent_computing(tmp_path) -> None:
    # Rank 1 posts a recv at 0 and meanwhile computes 4 us (an independent node); rank 0 sends after 10 us.
    # The recv waits 10 us in the ops table, but the rank idles only 10 - 4 = 6 us for its peer:
    # that is its straggler waiting (the paper's GPU idle time).
    r0 = [comp(1, 10), send(2, dst=1, tag=7, size=1000, deps=[1])]
    r1 = [recv(1, src=0, tag=7, size=1000), comp(2, 4), comp(3, 5, deps=[1, 2])]
    res = simulate(write_set(tmp_path, [r0, r1]), network=FakeNet(2))
    assert res.ops.filter(rank=1, node_id=1)["wait_ns"].item() == 10_000
    assert res.ranks["wait_ns"].to_list() == [0, 6_000]
    assert res.summary_dict()["wait_ns_total"] == 6_000
