"""DiGraph: the part of networkx.DiGraph that topologies use, without importing networkx.

networkx costs ~0.2 s of start-up (issue 11 item 4: `xsim replay` of a small trace in 0.5 s), yet a
topology only adds devices and links with attributes and reads them back in insertion order. This class
keeps networkx's layout (node dict, successor and predecessor dicts sharing one attribute dict per link),
so nodes, links and neighbours come out in exactly the order networkx.DiGraph gives them, and routes and
link indices are the same. `Topology` accepts a real networkx.DiGraph too; `to_networkx()` converts for
graph algorithms.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any


class _NodeView:
    """`graph.nodes`: iterate, `in`, `nodes[n]` (attribute dict), `nodes(data=...)` as networkx does."""

    __slots__ = ("_node",)

    def __init__(self, node: dict) -> None:
        self._node = node

    def __iter__(self) -> Iterator:
        return iter(self._node)

    def __len__(self) -> int:
        return len(self._node)

    def __contains__(self, n: object) -> bool:
        return n in self._node

    def __getitem__(self, n: Hashable) -> dict:
        return self._node[n]

    def __call__(self, data: bool | str = False, default: Any = None) -> Iterator:
        """Nodes; with data=True (node, attributes), with data=KEY (node, attribute KEY or default)."""
        if data is True:
            return iter(self._node.items())
        if data is False:
            return iter(self._node)
        return ((n, d.get(data, default)) for n, d in self._node.items())


class DiGraph:
    """Directed graph of hashable nodes with attribute dicts on nodes and links (networkx.DiGraph subset)."""

    def __init__(self) -> None:
        self._node: dict[Hashable, dict] = {}
        self._succ: dict[Hashable, dict[Hashable, dict]] = {}
        self._pred: dict[Hashable, dict[Hashable, dict]] = {}

    def add_node(self, n: Hashable, **attr: Any) -> None:
        """Add node n (or update its attributes)."""
        if n not in self._node:
            self._succ[n] = {}
            self._pred[n] = {}
            self._node[n] = dict(attr)
        else:
            self._node[n].update(attr)

    def add_edge(self, u: Hashable, v: Hashable, **attr: Any) -> None:
        """Add the link u -> v (adding missing nodes, u first) or update its attributes."""
        for x in (u, v):
            if x not in self._node:
                self.add_node(x)
        d = self._succ[u].get(v, {})
        d.update(attr)
        self._succ[u][v] = d
        self._pred[v][u] = d

    def has_node(self, n: Hashable) -> bool:
        """True when n is a node."""
        return n in self._node

    def has_edge(self, u: Hashable, v: Hashable) -> bool:
        """True when the link u -> v exists."""
        return u in self._succ and v in self._succ[u]

    @property
    def nodes(self) -> _NodeView:
        """The nodes in insertion order (see _NodeView)."""
        return _NodeView(self._node)

    def edges(self, data: bool = False) -> Iterator:
        """Links (u, v), or (u, v, attributes) with data=True, by source node then insertion order."""
        for u, nbrs in self._succ.items():
            for v, d in nbrs.items():
                yield (u, v, d) if data else (u, v)

    def successors(self, n: Hashable) -> Iterator:
        """Nodes n links to."""
        return iter(self._succ[n])

    def predecessors(self, n: Hashable) -> Iterator:
        """Nodes that link to n."""
        return iter(self._pred[n])

    def __getitem__(self, u: Hashable) -> dict[Hashable, dict]:
        """graph[u][v] is the attribute dict of link u -> v."""
        return self._succ[u]

    def __iter__(self) -> Iterator:
        return iter(self._node)

    def __contains__(self, n: object) -> bool:
        return n in self._node

    def __len__(self) -> int:
        return len(self._node)

    def number_of_nodes(self) -> int:
        """Number of nodes."""
        return len(self._node)

    def number_of_edges(self) -> int:
        """Number of directed links."""
        return sum(len(nbrs) for nbrs in self._succ.values())

    def to_networkx(self):
        """The same graph as a networkx.DiGraph: same nodes and links in the same order, copied attributes
        (predecessor lists follow link order, which may differ from the order the links were added)."""
        import networkx as nx

        g = nx.DiGraph()
        for n, d in self._node.items():
            g.add_node(n, **d)
        for u, v, d in self.edges(data=True):
            g.add_edge(u, v, **d)
        return g
