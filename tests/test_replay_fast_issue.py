"""Timed nodes of chain queues start the moment they are ready (replay/engine.py, FAST); hand-worked cases."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from xsim.replay import simulate
from xsim.replay.engine import FAST, _fast_queues

from tests.test_replay_support import FakeNet, coll, comp, write_set


def _prog(queue: list[int], children: list[list[int]]) -> SimpleNamespace:
    ptr = np.cumsum([0] + [len(c) for c in children])
    idx = np.array([c for cs in children for c in cs], dtype=np.int64)
    return SimpleNamespace(queue=np.array(queue), child_ptr=ptr, child_idx=idx)


def test_chain_queues_by_hand():
    # q0: 0 -> (collective 1 on q1) -> 2 -> 3 -> 4, linked through the collective: a chain. Node 3 takes 0 ns
    # (it could finish in the instant it starts), so it keeps its queue; 1 is a collective (-1).
    # q2: 5 and 6 are both roots: both can be ready at once, not a chain.
    # q3: 7 ... 12 linked only through five edges (8-11 on q4, a chain): further than the search looks, so
    # q3 is treated as no chain (slower, never wrong).
    children = [[1], [2], [3], [4], [], [], [], [8], [9], [10], [11], [12], []]
    queue = [0, 1, 0, 0, 0, 2, 2, 3, 4, 4, 4, 4, 3]
    dur = [5, -1, 5, 0, 7, 3, 3, 2, 1, 1, 1, 1, 2]
    got = _fast_queues(_prog(queue, children), dur, 5).tolist()
    F = FAST
    assert got == [F, 1, F, 0, F, 2, 2, 3, F, F, F, F, 3]


def test_fast_roots_do_not_delay_the_first_issue(tmp_path):
    # Per rank: compute 1 (10 us, a root of a chain queue: starts at once), AllReduce 2 (a root: issues at 0,
    # the fake network takes 1000 ns), compute 3 after both (10 us). Everything issues at t = 0, so compute 3
    # runs 10,000..20,000; issuing the AllReduce only at compute 1's finish would end it at 21,000.
    per = [[comp(1, 10), coll(2, 1 << 20), comp(3, 10, deps=[1, 2])] for _ in range(2)]
    res = simulate(write_set(tmp_path, per), network=FakeNet(2))
    ops = {(r["rank"], r["node_id"]): (r["start_ns"], r["end_ns"]) for r in res.ops.iter_rows(named=True)}
    for rank in (0, 1):
        assert ops[(rank, 1)] == (0, 10_000)
        assert ops[(rank, 2)] == (0, 1_000)
        assert ops[(rank, 3)] == (10_000, 20_000)


def test_a_queue_that_is_no_chain_still_issues_ascending_ids(tmp_path):
    # Compute 4 (5 us) is a root and compute 3 (5 us) follows the 10 us compute 1: the queue 1, 3, 4 is no
    # chain (4 does not depend on 3). At t = 0 only 1 and 4 are ready: 1 runs first (smaller id), 0..10,000;
    # at 10,000 both 3 and 4 are ready and 3 (the smaller id) goes first: 3 at 10,000..15,000, 4 after it.
    per = [[comp(1, 10), comp(3, 5, deps=[1]), comp(4, 5)]]
    res = simulate(write_set(tmp_path, per), network=None)
    ops = {r["node_id"]: (r["start_ns"], r["end_ns"]) for r in res.ops.iter_rows(named=True)}
    assert ops == {1: (0, 10_000), 3: (10_000, 15_000), 4: (15_000, 20_000)}


def test_a_run_of_compute_nodes_is_one_event_with_every_node_timed(tmp_path):
    # Per rank: AllReduce 1 (fake network: 1000 ns), then computes 2, 3, 4 (10, 20, 30 us) one after another,
    # each the only child of the one before: a run the loop schedules as one event, 4 ending at
    # 1000 + 60,000. Every node still gets its own times, and the summary counts every node as an event.
    per = [
        [coll(1, 1 << 20), comp(2, 10, deps=[1]), comp(3, 20, deps=[2]), comp(4, 30, deps=[3])]
        for _ in range(2)
    ]
    res = simulate(write_set(tmp_path, per), network=FakeNet(2))
    rows = {(r["rank"], r["node_id"]): r for r in res.ops.iter_rows(named=True)}
    for rank in (0, 1):
        got = [
            (rows[(rank, i)]["ready_ns"], rows[(rank, i)]["start_ns"], rows[(rank, i)]["end_ns"])
            for i in (2, 3, 4)
        ]
        assert got == [(1_000, 1_000, 11_000), (11_000, 11_000, 31_000), (31_000, 31_000, 61_000)]
    assert res.summary_dict()["events"] == 8
    assert res.per_rank_finish_ns == [61_000, 61_000]


def test_children_of_multi_child_nodes_in_csr_order():
    # Node 0 has children 3, 1; node 1 has one (2); node 2 none; node 3 has 4, 2, 1: the engine reads the
    # one child from child1 and the others' from `many`, in the CSR order the node-by-node loop used.
    from xsim.replay.engine import _MANY, _NONE, _many_children, _single_child

    ptr = np.array([0, 2, 3, 3, 6, 6])
    idx = np.array([3, 1, 2, 4, 2, 1])
    child1 = _single_child(ptr, idx, 5)
    assert child1.tolist() == [_MANY, 2, _NONE, _MANY, _NONE]
    assert _many_children(ptr, idx, child1) == {0: [3, 1], 3: [4, 2, 1]}
