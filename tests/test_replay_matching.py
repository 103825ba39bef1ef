"""Cross-rank matching on its own: collective instances by (group, issue count), P2P FIFO on (src, dst, tag)."""

from __future__ import annotations

import pytest
from xsim.replay.errors import ReplayError
from xsim.replay.matching import CollectiveMatcher, P2PMatcher
from xsim.replay.program import CollInfo, P2PInfo
from xsim.traces import pb


class _Prog:
    """The few Program members the matchers read: node g belongs to rank g // 10."""

    rank_ids: tuple[int, ...] = ()

    def __init__(self, coll=None, p2p=None) -> None:
        self.coll = coll or {}
        self.p2p = p2p or {}

    def rank_of(self, g: int) -> int:
        return g // 10

    def describe(self, g: int) -> str:
        return f"rank {g // 10} node {g % 10} 'n{g}'"


def test_kth_issue_on_a_group_joins_the_kth_instance_whatever_the_order():
    # Ranks 0 and 1 each issue two AllReduces on group "g" (nodes 0, 1 and 10, 11). Rank 1 issues both of
    # its own before rank 0's second: its second joins instance 1, which completes only with node 1.
    ar = {g: CollInfo(pb.ALL_REDUCE, 64 * (g % 10 + 1), "g", (0, 1)) for g in (0, 1, 10, 11)}
    m = CollectiveMatcher(_Prog(coll=ar))
    assert m.arrive(0, 5) is None
    first = m.arrive(10, 7)
    assert m.arrive(11, 9) is None
    second = m.arrive(1, 12)
    assert (first.index, first.record.nodes, first.record.size) == (0, (0, 10), 64)
    assert (first.record.first_arrival_ns, first.record.last_arrival_ns) == (5, 7)
    assert (second.index, second.record.nodes, second.record.size) == (1, (1, 11), 128)
    assert (second.record.first_arrival_ns, second.record.last_arrival_ns) == (9, 12)
    assert second.issue_times() == (12, 9)
    assert m.collective_of == {0: 0, 10: 0, 1: 1, 11: 1}


def test_collective_members_disagreeing_are_named():
    coll = {0: CollInfo(pb.ALL_REDUCE, 64, "g", (0, 1)), 10: CollInfo(pb.ALL_GATHER, 64, "g", (0, 1))}
    m = CollectiveMatcher(_Prog(coll=coll))
    m.arrive(0, 0)
    with pytest.raises(
        ReplayError, match=r"collective #0 of group 'g': rank 0 node 0 'n0' is ALL_REDUCE but rank 1"
    ):
        m.arrive(10, 0)
    sizes = {0: CollInfo(pb.ALL_TO_ALL, 64, "", (0, 1)), 10: CollInfo(pb.ALL_TO_ALL, 96, "", (0, 1))}
    m = CollectiveMatcher(_Prog(coll=sizes))
    m.arrive(0, 0)
    assert m.arrive(10, 0).record.size == 96  # all-to-all takes the largest


def test_p2p_pairs_first_in_first_out_per_key_and_checks_sizes():
    # Two sends 0 -> 1 with tag 7 (nodes 0, 1), one with tag 8 (node 2); recvs on rank 1 (nodes 10-12).
    p2p = {
        0: P2PInfo(0, 1, 7, 100),
        1: P2PInfo(0, 1, 7, 200),
        2: P2PInfo(0, 1, 8, 300),
        10: P2PInfo(0, 1, 8, 300),
        11: P2PInfo(0, 1, 7, 100),
        12: P2PInfo(0, 1, 7, 200),
    }
    m = P2PMatcher(_Prog(p2p=p2p))
    assert m.send(0) == -1 and m.send(1) == -1
    assert m.recv(10) == -1  # tag 8: no send yet
    assert m.recv(11) == 0 and m.recv(12) == 1
    assert m.send(2) == 10
    assert m.pairs == [(0, 11), (1, 12), (2, 10)] and m.pair_of == {0: 11, 1: 12, 2: 10}
    m.check_all_received()
    bad = P2PMatcher(_Prog(p2p={0: P2PInfo(0, 1, 7, 100), 10: P2PInfo(0, 1, 7, 50)}))
    bad.send(0)
    with pytest.raises(ReplayError, match="send rank 0 node 0 'n0' has comm_size 100 but recv rank 1"):
        bad.recv(10)
    left = P2PMatcher(_Prog(p2p={3: P2PInfo(0, 2, 1, 8)}))
    left.send(3)
    with pytest.raises(ReplayError, match="1 send\\(s\\) never received: rank 0 node 3 'n3' to rank 2 tag 1"):
        left.check_all_received()


def test_members_with_equal_data_in_distinct_objects_match_and_a_late_size_differs():
    # Each rank's node carries its own CollInfo (the builder shares one per rank and distinct input):
    # equal values in distinct objects match. The third member's size differs: the instance is checked
    # member by member, and the error names member 0 and the first member that differs (rank 2).
    def info(size):
        return CollInfo(pb.ALL_REDUCE, size, "g", (0, 1, 2))

    ok = CollectiveMatcher(_Prog(coll={0: info(64), 10: info(64), 20: info(64)}))
    assert ok.arrive(20, 1) is None and ok.arrive(0, 2) is None
    inst = ok.arrive(10, 3)
    assert (inst.record.nodes, inst.record.size, inst.issue_times()) == ((0, 10, 20), 64, (2, 3, 1))
    bad = CollectiveMatcher(_Prog(coll={0: info(64), 10: info(64), 20: info(32)}))
    bad.arrive(20, 0)
    bad.arrive(0, 0)
    with pytest.raises(
        ReplayError, match=r"rank 0 node 0 'n0' has comm_size 64 but rank 2 node 0 'n20' has 32"
    ):
        bad.arrive(10, 0)


def test_two_groups_interleaved_keep_separate_issue_counts_and_missing_members():
    # Rank 0 issues on "a" then "b"; rank 1 on "b" then "a"; rank 2 only on "b", once. Instance 0 of each
    # group completes when its own members have issued it, whatever the other group does.
    a = CollInfo(pb.ALL_REDUCE, 8, "a", (0, 1))
    b = CollInfo(pb.ALL_GATHER, 8, "b", (0, 1, 2))
    m = CollectiveMatcher(_Prog(coll={0: a, 1: b, 10: b, 11: a, 20: b, 21: b}))
    assert m.arrive(0, 0) is None and m.arrive(10, 0) is None and m.arrive(1, 1) is None
    done_a = m.arrive(11, 2)
    assert (done_a.key, done_a.index, done_a.record.nodes) == ("a", 0, (0, 11))
    done_b = m.arrive(20, 3)
    assert (done_b.key, done_b.index, done_b.record.nodes) == ("b", 0, (1, 10, 20))
    assert m.arrive(21, 4) is None  # rank 2's second "b": instance 1, where ranks 0 and 1 never arrive
    assert m.instances["b"][1].missing() == [0, 1]
    assert m.waiting() == {0: done_a, 11: done_a, 1: done_b, 10: done_b, 20: done_b, 21: m.instances["b"][1]}


def test_folded_instance_completes_with_its_simulated_members():
    # Ranks 0 and 2 are simulated (a folded program); group "g" = ranks (0, 1, 2, 3). The instance
    # completes once nodes of ranks 0 and 2 arrive; positions give each node's index among the members.
    class Folded(_Prog):
        rank_ids = (0, 2)

    g = CollInfo(pb.ALL_REDUCE, 16, "g", (0, 1, 2, 3))
    m = CollectiveMatcher(Folded(coll={5: g, 25: g}))
    assert m.arrive(25, 7) is None
    inst = m.arrive(5, 9)
    assert (inst.sim, inst.record.nodes, inst.record.positions) == ((0, 2), (5, 25), (0, 2))
    assert (inst.record.first_arrival_ns, inst.record.last_arrival_ns) == (7, 9)
