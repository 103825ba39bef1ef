"""The rewriter as named passes over traces/graph.py, each followed by the trace checks; and the graph type
itself on a hand-made graph."""

from __future__ import annotations

import pytest
from xsim.tracegen.planner.rewrite import rewrite_bundle
from xsim.tracegen.spec import load_spec
from xsim.tracegen.workload import generate
from xsim.traces import pb
from xsim.traces.attrs import RESHARD
from xsim.traces.checks import check_all
from xsim.traces.graph import DepGraph, GraphEdit
from xsim.traces.groups import ProcessGroups
from xsim.traces.stream import EtFile

from tests.test_rewrite_generated import FIG1


@pytest.mark.parametrize("strategy", ["xsim", "hetauto", "alpacomm", "naive"])
def test_each_pass_leaves_valid_traces(strategy: str) -> None:
    dep = load_spec(FIG1)
    bundle = generate(dep, rewrite=False)
    seen: list[tuple[str, int]] = []

    def check(name: str, edited: dict[int, list[pb.Node]]) -> None:
        nodes = {**bundle.nodes, **edited}
        n = len(nodes)
        files = [EtFile(f"rank{r}", pb.GlobalMetadata(), nodes[r], [], False) for r in range(n)]
        assert [str(f) for f in check_all(files, ProcessGroups(n, bundle.comm_groups))] == [], name
        inserted = sum(1 for ns in nodes.values() for x in ns if any(a.name == RESHARD for a in x.attr))
        seen.append((name, inserted))

    before = {r: [x.SerializeToString() for x in ns] for r, ns in bundle.nodes.items()}
    rewrite_bundle(bundle, dep, strategy, check=check)
    names = [name for name, _ in seen]
    assert names == (["gradient_sync"] if strategy == "naive" else ["reshard_boundaries", "gradient_sync"])
    counts = [k for _, k in seen]
    assert counts[0] > 0 and counts == sorted(counts)  # each pass adds nodes, the previews are cumulative
    assert before != {r: [x.SerializeToString() for x in ns] for r, ns in bundle.nodes.items()}


def test_checked_and_unchecked_rewrites_are_identical() -> None:
    dep = load_spec(FIG1)
    a = rewrite_bundle(generate(dep, rewrite=False), dep, "xsim", check=lambda name, edited: None)
    b = rewrite_bundle(generate(dep, rewrite=False), dep, "xsim")
    assert {r: [x.SerializeToString() for x in ns] for r, ns in a.nodes.items()} == {
        r: [x.SerializeToString() for x in ns] for r, ns in b.nodes.items()
    }


def _n(nid: int, *deps: int, ctrl: tuple[int, ...] = ()) -> pb.Node:
    return pb.Node(id=nid, name=f"n{nid}", data_deps=list(deps), ctrl_deps=list(ctrl))


def test_dep_graph_by_hand() -> None:
    # 5 -> 3 -> 1 and 5 -> 4 -> 1 (a diamond listed out of order), and 7 alone.
    nodes = [_n(1, 3, 4), _n(3, 5), _n(4, 5), _n(5), _n(7)]
    g = DepGraph(nodes)
    ids = lambda ps: [nodes[p].id for p in ps]  # noqa: E731
    assert ids(g.topological_order()) == [5, 3, 4, 1, 7]  # ready nodes smallest id first
    assert ids(g.children(3)) == [3, 4] and g.cycle() is None
    assert sorted(ids(g.descendants([3]))) == [1, 3, 4, 5]  # position 3 is node 5
    assert ids(g.frontier([1, 2, 3])) == [3, 4]  # 3 and 4 depend on 5; nothing in the set depends on them
    cyclic = [_n(1, 3), _n(2, 1), _n(3, 2), _n(4, 3)]
    assert DepGraph(cyclic).cycle() == [1, 2, 3]
    assert DepGraph([_n(1, ctrl=(2,)), _n(2, 1)], ctrl=False).cycle() is None


def test_graph_edit_by_hand() -> None:
    nodes = [_n(0), _n(1, 0), _n(2, 1), _n(3, 2)]
    e = GraphEdit(nodes)
    e.insert_after(_n(10, 0), 0)  # between 0 and 1
    e.insert_before(_n(11, 1), 3)  # before 3
    e.replace_all_uses(2, [11])  # 3 now depends on 11 instead of 2
    e.add_deps(1, [10])
    preview = e.apply(copy=True)
    assert [n.id for n in preview] == [0, 10, 1, 11, 3]
    assert {n.id: list(n.data_deps) for n in preview} == {0: [], 10: [0], 1: [0, 10], 11: [1], 3: [11]}
    assert list(nodes[3].data_deps) == [2]  # the preview left the originals alone
    assert [n.id for n in e.apply()] == [0, 10, 1, 11, 3] and list(nodes[3].data_deps) == [11]
