"""The network side of a fold (replay/fold.py): the FoldChecked decorator, timing classes, shared memos.

A toy contention-free model times an AllReduce over ranks (a, b) as 1000 ns + 100 ns x a (so replica 1's
copy, ranks 2 and 3, takes 1200 ns where replica 0's takes 1000 ns): without a timing class the check
times the copy and refuses; a model that names all groups one class is taken at its word (the class is
the model's own statement that it times them alike), and the copy is not timed.
"""

from __future__ import annotations

import pytest
from xsim.netmodels.api import CollectiveSpec, Completion, FixedDurations, TimingClasses
from xsim.netmodels.cluster import topology_from_spec
from xsim.replay.errors import FoldRefused
from xsim.replay.fold import FoldChecked, fold_checked, make_fold, private_model
from xsim.traces.groups import ProcessGroups


class Toy:
    """Contention-free: per-rank finish 1000 + 100 x (first rank) ns after the start."""

    name = "toy"
    num_ranks = 4

    def __init__(self) -> None:
        self.pending: list[Completion] = []
        self.started: list[tuple[int, ...]] = []

    def start_collective(self, now_ns: int, spec: CollectiveSpec) -> int:
        self.started.append(spec.ranks)
        t = now_ns + 1000 + 100 * spec.ranks[0]
        self.pending.append(Completion(len(self.started), t, tuple(t for _ in spec.ranks)))
        return len(self.started)

    def start_p2p(self, now_ns: int, src: int, dst: int, size_bytes: int) -> int:
        return self.start_collective(now_ns, CollectiveSpec("send", size_bytes, (src, dst)))

    def next_event_ns(self) -> int | None:
        return min((c.finish_ns for c in self.pending), default=None)

    def advance(self, until_ns: int) -> list[Completion]:
        done = [c for c in self.pending if c.finish_ns <= until_ns]
        self.pending = [c for c in self.pending if c.finish_ns > until_ns]
        return done


class ToyClasses(Toy):
    """The toy model, saying every group is timed alike (one class) and holding one memo table."""

    def __init__(self) -> None:
        super().__init__()
        self.memo: dict = {}

    def timing_key(self, spec: CollectiveSpec) -> object | None:
        return (spec.kind, spec.size_bytes, len(spec.ranks))

    def memo_tables(self) -> tuple[dict, ...]:
        return (self.memo,)


FOLD = make_fold([[0, 1], [2, 3]], 4, "test")
GROUPS = ProcessGroups(4, {"0": (0, 1), "1": (2, 3)}, "given")
SPEC = CollectiveSpec("all_reduce", 1 << 20, (0, 1))


def test_check_times_each_copy_without_a_class() -> None:
    net = fold_checked(Toy(), FOLD, GROUPS)
    assert type(net) is FoldChecked and not isinstance(net, FixedDurations)
    with pytest.raises(FoldRefused, match=r"times all_reduce over \[2, 3\] \(replica 1\) .*1200 vs 1000 ns"):
        net.start_collective(0, SPEC)


def test_check_proves_a_copy_by_its_class() -> None:
    inner = ToyClasses()
    net = fold_checked(inner, FOLD, GROUPS)
    h = net.start_collective(0, SPEC)  # replica 1's copy is in the class of replica 0's: not timed
    assert net.check.model.started == [(0, 1)] and inner.started == [(0, 1)]
    assert [c.per_rank_finish_ns for c in net.advance(10**6) if c.handle == h] == [(1000, 1000)]
    # The check's private copy shares the model's memo tables (what one times, the other looks up).
    assert isinstance(inner, TimingClasses) and net.check.model.memo is inner.memo


def test_analytical_copy_shares_memos_and_classes() -> None:
    from xsim.netmodels.analytical import AnalyticalModel

    m = AnalyticalModel(topology_from_spec("dgx-h100:2"))
    copy = private_model(m)
    assert all(a is b for a, b in zip(copy.memo_tables(), m.memo_tables(), strict=True))
    # Two nodes alike: TP groups on node 0 and node 1 are one class; a group across the nodes is not
    # (NCCL mode shape key: hosts numbered by first appearance, each rank's scale-up links).
    a = m.timing_key(CollectiveSpec("all_reduce", 1 << 20, tuple(range(8))))
    b = m.timing_key(CollectiveSpec("all_reduce", 1 << 20, tuple(range(8, 16))))
    c = m.timing_key(CollectiveSpec("all_reduce", 1 << 20, tuple(range(4, 12))))
    assert a is not None and a == b and c != a
    assert m.fixed_collective_ns(
        CollectiveSpec("all_reduce", 1 << 20, tuple(range(8)))
    ) == copy.fixed_collective_ns(CollectiveSpec("all_reduce", 1 << 20, tuple(range(8, 16))))
