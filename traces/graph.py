"""One rank's dependency graph, and edits on it: the one topological sort of the trace layer.

`DepGraph` reads a node list (positions 0..n-1; a dependency names a node id of the same list) and answers
children, topological order, descendants, the frontier of a set and one cycle. `GraphEdit` queues
insertions, added dependencies and replacements on a node list and applies them at once, in the spirit
of torch.fx's graph passes: a pass reads the original graph, records its edits, and `apply` writes the
new node list (inserted nodes stand where the pass put them relative to the original nodes).

Duplicate ids (reported by traces.checks) resolve to the last node with that id.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from xsim.traces import pb

T = TypeVar("T")


def unready(ndeps: Sequence[int], children: Sequence[Iterable[int]]) -> list[int]:
    """Positions that can never become ready (on or behind a dependency cycle), ascending: Kahn's
    algorithm over in-degrees `ndeps` and each position's `children`. The one cycle test of xsim (the
    replay's program builders and DepGraph.cycle use it)."""
    indeg = list(ndeps)
    stack = [i for i, c in enumerate(indeg) if c == 0]
    seen = len(stack)
    while stack:
        for c in children[stack.pop()]:
            indeg[c] -= 1
            if indeg[c] == 0:
                stack.append(c)
                seen += 1
    if seen == len(indeg):
        return []
    return [i for i, c in enumerate(indeg) if c > 0]


class DepGraph:
    """The dependencies of one node list, by position; ctrl=False keeps data dependencies only."""

    def __init__(self, nodes: Sequence[pb.Node], *, ctrl: bool = True) -> None:
        self.nodes = nodes
        self.index: dict[int, int] = {n.id: i for i, n in enumerate(nodes)}
        index = self.index
        self.deps: list[list[int]] = []
        for n in nodes:
            ids = (*n.data_deps, *n.ctrl_deps) if ctrl else n.data_deps
            self.deps.append(list(dict.fromkeys(index[d] for d in ids if d in index)))
        self._children: list[list[int]] | None = None
        # The graph never changes after construction: its order and frontiers are computed once.
        self._rank: dict[int, int] | None = None
        self._frontiers: dict[tuple[int, ...], list[int]] = {}

    def children(self, i: int) -> list[int]:
        """Positions of the nodes depending on the node at position i."""
        return self._child_lists()[i]

    def _child_lists(self) -> list[list[int]]:
        if self._children is None:
            ch: list[list[int]] = [[] for _ in self.nodes]
            for j, ds in enumerate(self.deps):
                for d in ds:
                    ch[d].append(j)
            self._children = ch
        return self._children

    def topological_order(self) -> list[int]:
        """Positions in the order a one-at-a-time replayer issues them: ready nodes smallest id first.

        Nodes on a cycle (or depending on one) are left out.
        """
        indeg = [len(ds) for ds in self.deps]
        heap = [(self.nodes[i].id, i) for i, k in enumerate(indeg) if k == 0]
        heapq.heapify(heap)
        order: list[int] = []
        while heap:
            _, i = heapq.heappop(heap)
            order.append(i)
            for c in self.children(i):
                indeg[c] -= 1
                if indeg[c] == 0:
                    heapq.heappush(heap, (self.nodes[c].id, c))
        return order

    def cycle(self) -> list[int] | None:
        """Node ids of one dependency cycle (dependency first, smallest id first), or None if acyclic."""
        left = set(unready([len(ds) for ds in self.deps], self._child_lists()))
        if not left:
            return None
        # Every node left has a dependency left (else Kahn would have taken it): walking deps must revisit.
        ident = self.nodes
        cur = min(left, key=lambda i: ident[i].id)
        walk: list[int] = []
        seen: dict[int, int] = {}
        while cur not in seen:
            seen[cur] = len(walk)
            walk.append(cur)
            cur = min((d for d in self.deps[cur] if d in left), key=lambda i: ident[i].id)
        ids = [ident[i].id for i in reversed(walk[seen[cur] :])]
        k = ids.index(min(ids))  # canonical rotation: the same cycle always reads the same
        return ids[k:] + ids[:k]

    def descendants(self, start: Iterable[int]) -> set[int]:
        """`start` (positions) and every position depending on them, transitively."""
        seen = set(start)
        stack = list(seen)
        while stack:
            for c in self.children(stack.pop()):
                if c not in seen:
                    seen.add(c)
                    stack.append(c)
        return seen

    def frontier(self, positions: Sequence[int]) -> list[int]:
        """The positions of `positions` that no other one depends on, transitively (the last to finish)."""
        if not positions:
            return []
        key = tuple(positions)
        hit = self._frontiers.get(key)
        if hit is not None:
            return list(hit)
        if self._rank is None:
            self._rank = {i: k for k, i in enumerate(self.topological_order())}
        rank = self._rank
        # A path between two nodes of the set only visits nodes topologically between them: stop below.
        floor = min(rank.get(i, 0) for i in positions)
        seen: set[int] = set()
        stack = [d for s in positions for d in self.deps[s]]
        while stack:
            x = stack.pop()
            if x in seen or rank.get(x, -1) < floor:
                continue
            seen.add(x)
            stack.extend(self.deps[x])
        out = self._frontiers[key] = [i for i in positions if i not in seen]
        return list(out)


class GraphEdit:
    """Edits on one node list, applied at once by `apply` (positions refer to the original list)."""

    def __init__(self, nodes: list[pb.Node], graph: DepGraph | None = None) -> None:
        self.nodes = nodes
        # The DepGraph of `nodes` (or of a list with the same ids and dependencies at the same positions),
        # for graphs whose ids are unique: `apply` then visits only the nodes it edits.
        self._graph = graph
        self._new: list[tuple[float, pb.Node]] = []
        self._extra: dict[int, list[int]] = {}
        self._replaced: dict[int, list[int]] = {}

    def __bool__(self) -> bool:
        return bool(self._new or self._extra or self._replaced)

    @property
    def inserted(self) -> list[pb.Node]:
        """The nodes inserted so far, in insertion order."""
        return [n for _, n in self._new]

    def replaced(self, nid: int) -> bool:
        """True when the node with id `nid` is removed (its uses replaced)."""
        return nid in self._replaced

    def insert_after(self, node: pb.Node, position: int) -> int:
        """Insert `node` right after the original node at `position` (-1: before all); returns its id."""
        self._new.append((position + 0.5, node))
        return node.id

    def insert_before(self, node: pb.Node, position: int) -> int:
        """Insert `node` right before the original node at `position`; returns its id."""
        self._new.append((position - 0.5, node))
        return node.id

    def add_deps(self, nid: int, deps: Iterable[int]) -> None:
        """Make the original node `nid` also depend (data) on `deps`."""
        self._extra.setdefault(nid, []).extend(deps)

    def replace_all_uses(self, nid: int, replacement: Sequence[int]) -> None:
        """Remove the original node `nid`; whatever depended on it depends on `replacement` instead."""
        self._replaced[nid] = list(replacement)

    def _resolve(self, ids: Iterable[int]) -> list[int]:
        out: list[int] = []
        for i in ids:
            out.extend(self._resolve(self._replaced[i]) if i in self._replaced else [i])
        return list(dict.fromkeys(out))

    def apply(self, *, copy: bool = False) -> list[pb.Node]:
        """The edited node list: originals in order (redirected), inserted nodes where they were put.

        With `copy` the nodes are copies and the original list stays as it was (a preview, e.g. to check
        the graph after one pass while further passes still queue edits on the original).
        """
        if not copy and self._graph is not None:
            return self._apply_indexed(self._graph)
        if not copy and not self._replaced:
            return self._apply_inserts()
        items: list[tuple[float, int, pb.Node]] = []
        replaced = self._replaced
        for i, n in enumerate(self.nodes):
            if replaced and n.id in replaced:
                continue
            n = _copy(n) if copy else n
            add = self._extra.get(n.id, [])
            if add or (replaced and any(d in replaced for d in (*n.data_deps, *n.ctrl_deps))):
                data = self._resolve([*n.data_deps, *add])
                ctrl = [d for d in self._resolve(n.ctrl_deps) if d not in data]
                _set(n.data_deps, data)
                _set(n.ctrl_deps, ctrl)
            items.append((float(i), 0, n))
        for k, (p, n) in enumerate(self._new):
            n = _copy(n) if copy else n
            if any(d in self._replaced for d in n.data_deps):
                _set(n.data_deps, self._resolve(n.data_deps))
            items.append((p, k + 1, n))
        items.sort(key=lambda t: (t[0], t[1]))
        return [n for _, _, n in items]

    def _apply_indexed(self, graph: DepGraph) -> list[pb.Node]:
        """`apply` without a copy, reading positions from `graph`: only the nodes gaining dependencies or
        depending on a removed one are rewritten (as `apply` rewrites them), the others are not read."""
        return self.apply_refs(self.nodes, self.nodes.__getitem__, _same, graph)

    def apply_refs(
        self,
        refs: list[T],
        read: Callable[[int], pb.Node],
        emit: Callable[[pb.Node], T],
        graph: DepGraph | None = None,
    ) -> list[T]:
        """`apply` on stand-ins for the nodes (e.g. their serialized bytes): `refs[i]` stands for the
        original node at position i, `read(i)` gives that node to edit, and `emit(node)` the stand-in of an
        edited or inserted node. Needs the DepGraph (given here or to the constructor); `refs` may change."""
        graph = graph or self._graph
        assert graph is not None, "apply_refs reads positions from a DepGraph"
        index, replaced, extra = graph.index, self._replaced, self._extra
        gone = sorted({index[i] for i in replaced if i in index})
        touch = {index[i] for i, add in extra.items() if add and i in index}
        for p in gone:
            touch.update(graph.children(p))
        for p in sorted(touch.difference(gone)):
            n = read(p)
            data = self._resolve([*n.data_deps, *extra.get(n.id, ())])
            ctrl = [d for d in self._resolve(n.ctrl_deps) if d not in data]
            _set(n.data_deps, data)
            _set(n.ctrl_deps, ctrl)
            refs[p] = emit(n)
        if gone:
            dropped = set(gone)
            kept = [x for i, x in enumerate(refs) if i not in dropped]
        else:
            kept = refs
        new = sorted(((p, k, n) for k, (p, n) in enumerate(self._new)), key=lambda t: (t[0], t[1]))
        out: list[T] = []
        start = 0
        for p, _, n in new:
            if replaced and any(d in replaced for d in n.data_deps):
                _set(n.data_deps, self._resolve(n.data_deps))
            # p is an original position +- 0.5: originals 0..floor(p) come first, less the removed ones.
            cut = min(max(int(p + 0.5), 0), len(refs))
            cut -= bisect.bisect_left(gone, cut)
            if cut > start:
                out.extend(kept[start:cut])
                start = cut
            out.append(emit(n))
        out.extend(kept[start:])
        return out

    def _apply_inserts(self) -> list[pb.Node]:
        """`apply` when nothing is replaced and no copy is asked for: the same list, without a sort key
        per node (originals keep their order; inserted nodes go between them by position, then order)."""
        if self._extra:
            for n in self.nodes:
                add = self._extra.get(n.id)
                if add:
                    _set(n.data_deps, list(dict.fromkeys([*n.data_deps, *add])))
                    _set(n.ctrl_deps, [d for d in dict.fromkeys(n.ctrl_deps) if d not in n.data_deps])
        new = sorted(((p, k, n) for k, (p, n) in enumerate(self._new)), key=lambda t: (t[0], t[1]))
        out: list[pb.Node] = []
        start = 0
        for p, _, n in new:
            # p is an original position +- 0.5: originals 0..floor(p) come first.
            cut = min(max(int(p + 0.5), 0), len(self.nodes))
            if cut > start:
                out.extend(self.nodes[start:cut])
                start = cut
            out.append(n)
        out.extend(self.nodes[start:])
        return out


def _same(n: pb.Node) -> pb.Node:
    return n


def _copy(n: pb.Node) -> pb.Node:
    out = pb.Node()
    out.CopyFrom(n)
    return out


def _set(field, values: list[int]) -> None:
    del field[:]
    field.extend(values)


def unique(ids: Iterable[int]) -> list[int]:
    """`ids` without repeats, first occurrence kept."""
    return list(dict.fromkeys(ids))
