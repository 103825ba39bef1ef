"""Contention-free models time a transfer from the transfer alone (AnalyticalModel.fixed_collective_ns /
fixed_p2p_ns), so the engine puts its nodes' finishes straight on its heap: pinned to closed forms and to
the handle path (start, next event, advance) that every other model takes."""

from __future__ import annotations

from xsim.netmodels import AnalyticalModel
from xsim.netmodels.api import CollectiveSpec
from xsim.netmodels.topology import ring_topology
from xsim.replay import simulate
from xsim.traces import pb

from tests.test_replay_support import coll, comp, recv, send, write_set


class HandlesOnly:
    """The same model seen through contract E alone (no fixed_* methods): the engine's handle path."""

    def __init__(self, model: AnalyticalModel) -> None:
        self.m = model
        self.name = model.name
        self.num_ranks = model.num_ranks
        self.starts = 0

    def start_collective(self, now_ns: int, spec: CollectiveSpec) -> int:
        self.starts += 1
        return self.m.start_collective(now_ns, spec)

    def start_p2p(self, now_ns: int, src: int, dst: int, size_bytes: int) -> int:
        self.starts += 1
        return self.m.start_p2p(now_ns, src, dst, size_bytes)

    def next_event_ns(self):
        return self.m.next_event_ns()

    def advance(self, until_ns: int):
        return self.m.advance(until_ns)


def _model() -> AnalyticalModel:
    # 4 ranks on a bidirectional ring, 1 GB/s (1 B/ns) and 100 ns per link.
    return AnalyticalModel(ring_topology(4, 1e9, 100))


def _rows(res) -> list[tuple]:
    return res.ops.sort("rank", "node_id").select("rank", "node_id", "start_ns", "end_ns", "wait_ns").rows()


def test_collective_finishes_at_the_closed_form(tmp_path) -> None:
    # 10 us compute -> ReduceScatter of 4 MB -> 5 us compute; rank 2 computes 20 us first. The ring
    # reduce-scatter takes 3 steps of (100 ns + 1 MB / 1 B/ns) = 3_000_300 ns (tests/test_net_flow.py's
    # closed form) from the last arrival at 20_000: every member ends at 3_020_300, waits 10_000 but rank 2.
    per = [
        [
            comp(1, 20 if r == 2 else 10),
            coll(2, 4_000_000, deps=[1], ctype=pb.REDUCE_SCATTER),
            comp(3, 5, deps=[2]),
        ]
        for r in range(4)
    ]
    ts = write_set(tmp_path, per)
    res = simulate(ts, network=_model())
    rs = res.ops.filter(name="coll2").sort("rank")
    assert rs["start_ns"].to_list() == [10_000, 10_000, 20_000, 10_000]
    assert rs["end_ns"].to_list() == [3_020_300] * 4
    assert rs["wait_ns"].to_list() == [10_000, 10_000, 0, 10_000]
    assert res.per_rank_finish_ns == [3_025_300] * 4
    # The same replay through the handle path: the model started it there, and the tables agree.
    net = HandlesOnly(_model())
    assert _rows(simulate(ts, network=net)) == _rows(res) and net.starts == 1


def test_rooted_collective_members_all_end_at_the_last_rank(tmp_path) -> None:
    # A ring reduce to rank 0 (a chain towards the root) ends on its ranks at different offsets; a
    # completion reported at its finish ends every member at the last one's, and the direct path must do
    # the same. (The ring broadcast is pipelined: its members end together.)
    m = _model()
    spec = CollectiveSpec("reduce", 1_000_000, (0, 1, 2, 3), root=0)
    offsets = m._collective_offsets(spec)
    assert len(set(offsets)) > 1 and m.fixed_collective_ns(spec) == max(offsets)
    per = [[coll(1, 1_000_000, ctype=pb.REDUCE)] for _ in range(4)]
    ts = write_set(tmp_path, per)
    res = simulate(ts, network=_model())
    assert res.ops["end_ns"].to_list() == [max(offsets)] * 4
    assert _rows(simulate(ts, network=HandlesOnly(_model()))) == _rows(res)


def test_send_finishes_at_route_latency_plus_bytes(tmp_path) -> None:
    # Rank 0 sends 1 MB to its ring neighbour 1 after 10 us: 100 ns + 1_000_000 B / 1 B/ns = 1_000_100 ns.
    # Rank 1's recv, posted at 0, ends with it and waited the 10 us; rank 1's compute follows (5 us).
    # Rank 2 -> 0 crosses two links (2 -> 1 -> 0 or 2 -> 3 -> 0): 200 ns + 1_000_000 ns.
    r0 = [comp(1, 10), send(2, dst=1, tag=7, size=1_000_000, deps=[1]), recv(3, src=2, tag=1, size=1_000_000)]
    r1 = [recv(1, src=0, tag=7, size=1_000_000), comp(2, 5, deps=[1])]
    r2 = [send(1, dst=0, tag=1, size=1_000_000)]
    r3 = [comp(1, 1)]
    ts = write_set(tmp_path, [r0, r1, r2, r3])
    res = simulate(ts, network=_model())
    ops = {(r["rank"], r["node_id"]): r for r in res.ops.iter_rows(named=True)}
    assert (ops[(0, 2)]["start_ns"], ops[(0, 2)]["end_ns"]) == (10_000, 1_010_100)
    assert (ops[(1, 1)]["end_ns"], ops[(1, 1)]["wait_ns"]) == (1_010_100, 10_000)
    assert ops[(1, 2)]["end_ns"] == 1_015_100
    assert ops[(2, 1)]["end_ns"] == ops[(0, 3)]["end_ns"] == 1_000_200
    net = HandlesOnly(_model())
    assert _rows(simulate(ts, network=net)) == _rows(res) and net.starts == 2
