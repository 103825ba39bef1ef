"""Routes against an independent oracle: networkx Dijkstra where GPUs never relay, then the documented ECMP rule.

The oracle knows only the routing rule of netmodels/topology.py's docstring: shortest path by link cost (1 on
scale-up links, 2 elsewhere) that never transits a GPU; among equal-cost next hops, taken in sorted device
order, the one at CRC32("src|dst|device") modulo their number. It shares no code with the route search
(composed distance arrays, level search, resumable Dijkstra), so every link tuple must come out equal.
"""

from __future__ import annotations

import zlib

import networkx as nx
import numpy as np
import pytest
from xsim.netmodels import TopologyError, topology_from_spec
from xsim.netmodels.digraph import DiGraph
from xsim.netmodels.topology import Topology, add_duplex, multi_dim_topology, ring_topology


def _cost(attrs: dict) -> int:
    return 1 if attrs.get("kind") == "scaleup" else 2


def _oracle_dist(topo: Topology, dst: str) -> dict[str, int]:
    """Cost from every device to dst over links that enter a GPU only when it is dst."""
    g = topo.graph
    allowed = nx.DiGraph()
    allowed.add_nodes_from(g.nodes)
    for u, v, d in g.edges(data=True):
        if v == dst or g.nodes[v].get("kind") != "gpu":
            allowed.add_edge(v, u, w=_cost(d))  # reversed: search outward from dst
    return nx.single_source_dijkstra_path_length(allowed, dst, weight="w")


def _oracle_route(
    topo: Topology, src: int, dst: int, dist: dict[str, int], index: dict[tuple[str, str], int]
) -> tuple[int, ...] | None:
    """Link indices of the rule's route, None when dst is unreachable."""
    g = topo.graph
    a, b = topo.rank_nodes[src], topo.rank_nodes[dst]
    if a not in dist:
        return None
    out, u = [], a
    while u != b:
        nxt = [
            v
            for v in sorted(g.successors(u))
            if (v == b or g.nodes[v].get("kind") != "gpu")
            and v in dist
            and dist[v] + _cost(g[u][v]) == dist[u]
        ]
        v = nxt[zlib.crc32(f"{a}|{b}|{u}".encode()) % len(nxt)]
        out.append(index[(u, v)])
        u = v
    return tuple(out)


def _direct_gpu_links() -> Topology:
    # Two hosts of four GPUs wired all-to-all by direct NVLink (no NVSwitch, DGX-1 style), a NIC per GPU on
    # one switch, and a dead-end NIC on host 0's GPU 0 (it reaches nothing): GPUs relay for nobody, so a
    # route between hosts leaves through the source GPU's own NIC.
    g = DiGraph()
    gpus = [f"h{h}/gpu{j}" for h in range(2) for j in range(4)]
    for x in gpus:
        g.add_node(x, kind="gpu")
    g.add_node("switch", kind="switch")
    for h in range(2):
        for j in range(4):
            for k in range(j + 1, 4):
                add_duplex(g, f"h{h}/gpu{j}", f"h{h}/gpu{k}", 300e9, 100, "scaleup")
            add_duplex(g, f"h{h}/gpu{j}", f"h{h}/nic{j}", 50e9, 500, "pcie")
            add_duplex(g, f"h{h}/nic{j}", "switch", 50e9, 500, "nic")
    g.add_node("h0/dead", kind="nic")
    g.add_edge("h0/gpu0", "h0/dead", bandwidth=50e9, latency_ns=500.0, kind="pcie")
    return Topology("direct", g, tuple(gpus))


def _islands() -> Topology:
    # Two clusters with no link between them: routes inside an island exist, across them do not.
    g = DiGraph()
    gpus = []
    for i in range(2):
        g.add_node(f"i{i}/switch", kind="switch")
        for j in range(3):
            x = f"i{i}/gpu{j}"
            g.add_node(x, kind="gpu")
            gpus.append(x)
            add_duplex(g, x, f"i{i}/nic{j}", 25e9, 300, "pcie")
            add_duplex(g, f"i{i}/nic{j}", f"i{i}/switch", 25e9, 300, "nic")
    return Topology("islands", g, tuple(gpus))


def _gpu_torus(rows: int, cols: int) -> Topology:
    # A GPU per router, routers in a 2-D torus: deep (many levels) rather than wide. Latencies are random
    # floats, so route latencies (1 to 8 links) check the summation order bit for bit.
    rng = np.random.default_rng(11)
    g = DiGraph()
    gpus = [f"gpu{r}_{c}" for r in range(rows) for c in range(cols)]
    for x in gpus:
        g.add_node(x, kind="gpu")
    for r in range(rows):
        for c in range(cols):
            add_duplex(g, f"gpu{r}_{c}", f"rt{r}_{c}", 100e9, 50 * rng.random(), "pcie")
            add_duplex(g, f"rt{r}_{c}", f"rt{r}_{(c + 1) % cols}", 50e9, 1e3 * rng.random(), "torus")
            add_duplex(g, f"rt{r}_{c}", f"rt{(r + 1) % rows}_{c}", 50e9, 1e3 * rng.random(), "torus")
    return Topology("gpu-torus", g, tuple(gpus))


TOPOLOGIES = {
    "two_level_switch": lambda: topology_from_spec("nodes:4*H100x8"),
    "leaf_spine": lambda: topology_from_spec("nodes:4*H200x8:fabric=leaf_spine:nics_per_leaf=8:spines=2"),
    "fat_tree": lambda: topology_from_spec("nodes:6*H100x8:fabric=fat_tree:k=6:oversubscription=2"),
    "rail_pcie_nic_per_node": lambda: topology_from_spec(
        "nodes:3*A100x4,2*H100x2+A100x2:fabric=rail:scale_up=pcie:nic=per_node"
    ),
    "one_host_nic_per_node": lambda: topology_from_spec("nodes:1*H100x4:nic=per_node"),
    "direct_gpu_links": _direct_gpu_links,
    "islands": _islands,
    "gpu_torus": lambda: _gpu_torus(6, 7),
    "ring": lambda: ring_topology(13, 50e9, 500),
    "torus": lambda: multi_dim_topology([("ring", 4, 50e9, 500), ("ring", 3, 25e9, 700)]),
}


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_every_route_equals_the_oracle(name):
    topo = TOPOLOGIES[name]()
    n = topo.num_ranks
    unreachable = longest = 0
    index = {e: i for i, e in enumerate(topo.graph.edges())}  # link indices: the graph's link order
    # Destinations in a scrambled order, so cached arrays are reused across unrelated queries.
    for dst in [(7 * i + 3) % n for i in range(n)] if n % 7 else range(n):
        dist = _oracle_dist(topo, topo.rank_nodes[dst])
        for src in range(n):
            want = _oracle_route(topo, src, dst, dist, index) if src != dst else ()
            if want is None:
                unreachable += 1
                with pytest.raises(TopologyError, match=f"no path from rank {src} "):
                    topo.route(src, dst)
                continue
            r = topo.route(src, dst)
            assert r.links == want, (name, src, dst)
            # Same bits as numpy's sum and min over the route's links (what every table was made from).
            idx = np.array(want, dtype=np.int64)
            assert r.latency_ns == (float(topo.link_latency[idx].sum()) if want else 0.0)
            assert r.bottleneck_bytes_per_ns == (
                float(topo.link_bandwidth[idx].min()) if want else float("inf")
            )
            longest = max(longest, len(want))
    # Only the islands have pairs without a path: 3 x 3 GPUs in each direction.
    assert unreachable == (18 if name == "islands" else 0)
    if name == "gpu_torus":
        assert longest == 8  # 3 + 3 torus hops and the two GPU links: numpy's unrolled sum from 8 on


@pytest.mark.parametrize("name", sorted(n for n in TOPOLOGIES if n not in ("ring", "torus")))
def test_composed_distances_equal_a_full_level_search_for_every_device(name):
    # _levels_full composes most arrays from in-neighbours' arrays; _levels_to searches level by level.
    # Both must agree on every device, -1 for unreached included, whatever the destination.
    topo = TOPOLOGIES[name]()
    names = list(topo.graph.nodes)
    for i, x in enumerate(names):
        assert np.array_equal(topo._levels_full(i), topo._levels_to(x, None)), (name, x)


def test_direct_gpu_link_route_never_detours_through_an_unreached_nic():
    # h0/gpu0 -> h0/gpu1 is one NVLink (cost 1). The dead-end NIC (-1: reaches nothing) is at "1 - 2 = -1"
    # by arithmetic alone; taking it crashed the route (IndexError) before unreached devices were excluded.
    topo = _direct_gpu_links()
    for dst in range(1, 4):
        (link,) = topo.route(0, dst).links
        assert topo.links[link] == ("h0/gpu0", f"h0/gpu{dst}")
    # Across hosts: own NIC, switch, destination's NIC, destination (4 links, 500 ns each).
    r = topo.route(0, 5)
    assert [topo.links[i] for i in r.links] == [
        ("h0/gpu0", "h0/nic0"),
        ("h0/nic0", "switch"),
        ("switch", "h1/nic1"),
        ("h1/nic1", "h1/gpu1"),
    ]
    assert r.latency_ns == 2000.0


def test_route_order_does_not_change_routes():
    # Arrays are cached (and evicted) per device; the same pairs asked in reverse order give the same routes.
    pairs = [(a, b) for a in range(0, 32, 3) for b in range(1, 32, 5)]
    first, second = topology_from_spec("nodes:4*H100x8"), topology_from_spec("nodes:4*H100x8")
    want = {p: first.route(*p) for p in pairs}
    assert {p: second.route(*p) for p in reversed(pairs)} == want


def test_one_level_search_per_shared_switch_and_early_exits_where_nothing_is_shared(monkeypatch):
    # 64 hosts of 8 H100s on one switch: every GPU's distances compose from its NVSwitch's, its NIC's and
    # so the fabric switch's. The first destination gets an early-exit search, the second shares the
    # switch's full search, and the other 510 destinations need none. On a GPU torus every GPU has its
    # own router, so each first route keeps the early-exit search (as before arrays were composed).
    calls = []
    real = Topology._levels_to

    def counting(self, dst, src):
        calls.append((dst, src))
        return real(self, dst, src)

    monkeypatch.setattr(Topology, "_levels_to", counting)
    topo = topology_from_spec("nodes:64*H100x8")
    for r in range(512):
        topo.route(r, (r + 1) % 512)
    assert calls == [("node0/gpu1", "node0/gpu0"), ("switch", None)]
    calls.clear()
    torus = _gpu_torus(6, 7)
    for r in range(42):
        torus.route(r, (r + 1) % 42)
    assert len(calls) == 42 and all(src is not None for _, src in calls)
