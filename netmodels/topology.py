"""Topologies: a networkx graph of devices and directed links, the ranks placed on it, and its routing.

Units: link bandwidth in bytes/s (graph attribute `bandwidth`), link latency in ns (`latency_ns`, float).
Routing: shortest path by hop count that never transits another GPU; among equal-cost next hops one is
picked by a CRC32 hash of (source, destination, current device): deterministic ECMP, stable across runs.
"""

from __future__ import annotations

import heapq
import math
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from xsim.netmodels.api import validate_ranks
from xsim.netmodels.digraph import DiGraph  # networkx.DiGraph's layout and order, without its import time
from xsim.netmodels.errors import RankError, TopologyError

GPU = "gpu"
# How a topology's collectives run (Topology.collectives).
COLLECTIVE_MODES = ("ring", "nccl")
# Routing cost per link: scale-up links (NVLink/PCIe inside a host) are cheaper than scale-out hops, so
# intra-host traffic stays on the scale-up fabric even where a NIC would offer an equally short detour.
SCALE_UP_KINDS = frozenset({"scaleup"})
# Devices with more links than this pick route next hops with numpy (Topology._wide_next_hops); below it a
# Python loop over the few neighbours is cheaper than numpy's per-call overhead.
_WIDE = 32
# Topology._compose builds a GPU's distances from at most this many forwarding in-neighbours (a cluster GPU
# has two: its NVSwitch or PCIe switch and its NIC), a switch's or NIC's from at most one; past that, or
# deeper than _COMPOSE_DEPTH compositions, a level search is cheaper or needed.
_COMPOSE_GPU = 4
_COMPOSE_DEPTH = 8
# Unreached in route distance arrays: any value from _FAR up (int32: half the memory traffic of int64).
# Real distances stay far below it (each link costs at most 2 and MAX_LINKS bounds a path), and a composed
# array adds at most 2 per composition in a chain at most as long as the device count, so an unreached
# value can neither overflow int32 nor pass for a distance.
_FAR = 1 << 30


def link_cost(attrs: dict) -> int:
    """Routing cost of a link: 1 on the scale-up fabric, 2 elsewhere."""
    return 1 if attrs.get("kind") in SCALE_UP_KINDS else 2


@dataclass(frozen=True)
class Route:
    """A routed path between two ranks: link indices, summed latency (ns), bottleneck bandwidth (B/ns)."""

    links: tuple[int, ...]
    latency_ns: float
    bottleneck_bytes_per_ns: float


@dataclass(frozen=True)
class Topology:
    """Devices and directed links (networkx DiGraph) with ranks placed on GPU devices."""

    name: str
    graph: DiGraph
    rank_nodes: tuple[str, ...]
    # Host (server) of each rank: ranks on one host share its scale-up domain (hierarchical collectives).
    rank_hosts: tuple[str, ...] = ()
    # How collectives run on it: "ring" (the paper's schedules, default) or "nccl" (NCCL's rail-aligned
    # channels, protocols and algorithm choice, netmodels/nccl.py; DGX presets and `"collectives": "nccl"`).
    collectives: str = "ring"
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_graph(self.graph, self.rank_nodes)
        if self.collectives not in COLLECTIVE_MODES:
            raise TopologyError(
                f"collectives must be one of {', '.join(COLLECTIVE_MODES)}, got {self.collectives!r}"
            )
        if not self.rank_hosts:
            object.__setattr__(self, "rank_hosts", tuple(self.rank_nodes))
        edges = list(self.graph.edges(data=True))
        index = {(u, v): i for i, (u, v, _) in enumerate(edges)}
        # Per-link arrays in bytes/ns and ns: the flow model works on these, never on the graph.
        self._cache["links"] = [(u, v) for u, v, _ in edges]
        self._cache["index"] = index
        self._cache["bw"] = np.array([d["bandwidth"] / 1e9 for _, _, d in edges], dtype=np.float64)
        self._cache["lat"] = np.array([float(d["latency_ns"]) for _, _, d in edges], dtype=np.float64)
        self._cache["bwl"], self._cache["latl"] = self._cache["bw"].tolist(), self._cache["lat"].tolist()
        cost = {(u, v): link_cost(d) for u, v, d in edges}
        self._cache["adj"] = {
            n: [(v, cost[(n, v)]) for v in sorted(self.graph.successors(n))] for n in self.graph
        }
        self._cache["radj"] = {
            n: [(u, cost[(u, n)]) for u in sorted(self.graph.predecessors(n))] for n in self.graph
        }
        self._cache["dist"] = {}
        self._cache["routes"] = {}
        names = list(self.graph.nodes)
        nid = {x: i for i, x in enumerate(names)}
        self._cache["nid"] = nid
        self._cache["names"] = names
        # Cluster graphs (with non-forwarding GPUs) are shallow but wide: they are searched level by level
        # with numpy; logical topologies (rings can be thousands of hops deep) by a resumable Dijkstra.
        self._cache["levels"] = any(k == GPU for _, k in self.graph.nodes(data="kind"))
        if self._cache["levels"]:
            order = sorted(((nid[v], nid[u], cost[(u, v)]) for u, v, _ in edges))
            rdst = np.array([o[0] for o in order], dtype=np.int64)
            self._cache["rptr"] = np.searchsorted(rdst, np.arange(len(names) + 1))
            self._cache["rsrc"] = np.array([o[1] for o in order], dtype=np.int64)
            self._cache["rcost"] = np.array([o[2] for o in order], dtype=np.int64)
            self._cache["fwd"] = np.array([self.graph.nodes[x].get("kind") != GPU for x in names])
            self._cache["fwdl"] = self._cache["fwd"].tolist()
            self._cache["hops"] = {}  # device -> its out-links for _path_levels (_hops)
            self._cache["full"] = {}  # device index -> distances to it (_far_to)
            self._cache["hubs"] = {}  # device index -> the devices its full array needs searched (_hubs)
            self._cache["seen"] = set()  # destinations asked for once (_route_dist)
            self._cache["demand"] = {}  # searched device -> destinations that needed it (_route_dist)
            self._cache["ins"] = {}  # device index -> its in-neighbours split for _compose

    @property
    def num_ranks(self) -> int:
        """Number of ranks (GPUs) placed on this topology."""
        return len(self.rank_nodes)

    @property
    def link_bandwidth(self) -> np.ndarray:
        """Bandwidth of every link in bytes/ns, indexed like `links`."""
        return self._cache["bw"]

    @property
    def link_latency(self) -> np.ndarray:
        """Latency of every link in ns, indexed like `links`."""
        return self._cache["lat"]

    @property
    def links(self) -> list[tuple[str, str]]:
        """Directed links as (from device, to device), in index order."""
        return self._cache["links"]

    def _dist_to(self, dst: str, src: str) -> dict[str, int]:
        """Distances to dst, final at least for every device closer than src (a resumable Dijkstra)."""
        state = self._cache["dist"].get(dst)
        if state is None:
            state = ({dst: 0}, [(0, dst)], set())
            self._cache["dist"][dst] = state
        dist, heap, settled = state
        kinds = self.graph.nodes
        radj = self._cache["radj"]
        # Search outward from dst only until src is settled: neighbour routes (rings) stay cheap, and a
        # later query for the same destination resumes where this one stopped.
        while heap and src not in settled:
            d, v = heapq.heappop(heap)
            if v in settled or d > dist[v]:
                continue
            settled.add(v)
            if v != dst and kinds[v].get("kind") == GPU:
                continue  # GPUs originate and sink traffic but never forward it
            for u, c in radj[v]:
                nd = d + c
                if nd < dist.get(u, 1 << 62):
                    dist[u] = nd
                    heapq.heappush(heap, (nd, u))
        return dist

    def _levels_to(self, dst: str, src: str | None) -> np.ndarray:
        """Distances (by node index) to dst, final for every node closer than src (all when src is None);
        unreached devices hold -1."""
        c = self._cache
        nid, rptr, rsrc, rcost, fwd = c["nid"], c["rptr"], c["rsrc"], c["rcost"], c["fwd"]
        big = np.iinfo(np.int64).max
        dist = np.full(len(nid), big, dtype=np.int64)
        t, s = nid[dst], (nid[src] if src is not None else None)
        dist[t] = 0
        buckets: dict[int, list[np.ndarray]] = {0: [np.array([t])]}
        d = 0
        while buckets:
            parts = buckets.pop(d, None)
            if parts is not None:
                # Sorted distinct devices by a mark array: np.unique's sort and set-up cost dominated first
                # routes (~60% of them at 2,048 ranks, pyinstrument) on these small frontiers.
                mark = np.zeros(len(dist), dtype=bool)
                for part in parts:
                    mark[part] = True
                fr = np.flatnonzero(mark)
                # Only devices settled at this level forward; GPUs other than the destination never do.
                fr = fr[(dist[fr] == d) & (fwd[fr] | (fr == t))]
                counts = rptr[fr + 1] - rptr[fr]
                total = int(counts.sum())
                if total:
                    offsets = np.repeat(rptr[fr] - np.cumsum(counts) + counts, counts)
                    e = offsets + np.arange(total)
                    u, nd = rsrc[e], d + rcost[e]
                    better = nd < dist[u]
                    u, nd = u[better], nd[better]
                    np.minimum.at(dist, u, nd)
                    # Link costs are small positive integers (link_cost), so the distinct new levels are the
                    # nonzero bins of nd - d, in increasing order as np.unique gave them.
                    for val in (np.flatnonzero(np.bincount(nd - d)) + d).tolist():
                        buckets.setdefault(val, []).append(u[nd == val])
            if s is not None and dist[s] <= d + 1:
                break
            d += 1
        dist[dist == big] = -1
        return dist

    def _far_to(self, x: int, stack: tuple[int, ...] = ()) -> np.ndarray:
        """Distances (int32, by node index) to device index x, _FAR or more where unreached; cached.

        GPUs never forward, so the distance to a device is the minimum over its in-neighbours w of
        dist(to w) + cost(w, x), where a GPU w only counts for itself (the direct link). A GPU's few
        forwarding in-neighbours (its NVSwitch or PCIe switch, its NIC) are shared by the host's GPUs, and a
        NIC's only forwarding in-neighbour is its fabric switch, so one level search per switch serves every
        destination: composing an array is a few numpy passes, a search a dozen per level (~0.5 ms).
        (A vectorized Bellman-Ford over 64 destinations at once was tried on 2026-11-30: faster at 512 ranks,
        but its dense passes over every link made first routes ~50x slower at 2,048 ranks; docs/performance.md.)
        """
        c = self._cache
        full = c["full"]
        arr = full.pop(x, None)
        if arr is None:
            arr = self._compose(x, stack)
            if arr is None:
                found = self._levels_to(c["names"][x], None)
                arr = np.where(found >= 0, found, _FAR).astype(np.int32)
            # Keep at most ~64 MiB of distance arrays; the least recently used device goes first.
            if len(full) >= max(1, (64 << 20) // (4 * len(arr))):
                full.pop(next(iter(full)))
        full[x] = arr
        return arr

    def _levels_full(self, x: int) -> np.ndarray:
        """Distances (int64) to device index x with -1 where unreached, as _levels_to(x, None) gives them."""
        arr = self._far_to(x).astype(np.int64)
        arr[arr >= _FAR] = -1
        return arr

    def _route_dist(self, tb: int, ta: int) -> np.ndarray:
        """Distances to device index tb for a route from device index ta: exact for every device closer than
        ta, and _FAR or more for no device that is reached (what _path_levels reads).

        A full array when it is cached or can be composed without a new level search. Otherwise, on a
        destination's first query, the search stops once ta is settled (uncached), unless another
        destination already asked for the same switches: then they are searched in full and shared. A
        deep graph where every GPU has its own router (nothing shared) so keeps one early-exit search per
        first route, and a cluster pays one early exit before its switch's array serves every GPU.
        """
        c = self._cache
        full = c["full"]
        arr = full.pop(tb, None)
        if arr is not None:
            full[tb] = arr  # most recently used
            return arr
        hubs = c["hubs"].get(tb)
        if hubs is None:
            hubs = c["hubs"][tb] = tuple(dict.fromkeys(self._hubs(tb, ())))
        needed = [h for h in hubs if h not in full]
        if needed and tb not in c["seen"]:
            c["seen"].add(tb)
            demand = c["demand"]
            for h in needed:
                demand[h] = demand.get(h, 0) + 1
            if any(demand[h] < 2 for h in needed):
                # Route() reads only devices closer than ta, which are final here; the rest are unreached
                # (-1, now _FAR) or at least as far as ta, so none passes for a next hop.
                found = self._levels_to(c["names"][tb], c["names"][ta])
                return np.where(found >= 0, found, _FAR).astype(np.int32)
        return self._far_to(tb)

    def _hubs(self, x: int, stack: tuple[int, ...]) -> list[int]:
        """The devices _far_to(x) would search (with nothing cached): x's composition tree's leaves."""
        relays = self._relays(x, stack)
        if relays is None:
            return [x]
        return [h for w, _ in relays for h in self._hubs(w, (*stack, x))]

    def _relays(self, x: int, stack: tuple[int, ...]) -> list[tuple[int, int]] | None:
        """Device x's forwarding in-neighbours (index, cost) when x's array is to be composed from theirs;
        None where a search is cheaper (a device that is not a GPU with several of them) or needed (a cycle
        of devices composed from each other, or a chain deeper than _COMPOSE_DEPTH)."""
        c = self._cache
        ins = c["ins"].get(x)
        if ins is None:
            ins = c["ins"][x] = self._in_neighbours(x)
        relays = ins[0]
        if len(relays) > (_COMPOSE_GPU if not c["fwdl"][x] else 1) or len(stack) >= _COMPOSE_DEPTH:
            return None
        if any(w in stack for w, _ in relays):
            return None
        return relays

    def _compose(self, x: int, stack: tuple[int, ...]) -> np.ndarray | None:
        """Distances to device x composed from its in-neighbours' arrays, or None (see _relays)."""
        c = self._cache
        relays = self._relays(x, stack)
        if relays is None:
            return None
        direct = c["ins"][x][1]
        inner = (*stack, x)
        if relays:
            w, cw = relays[0]
            acc = self._far_to(w, inner) + np.int32(cw)
            for w, cw in relays[1:]:
                np.minimum(acc, self._far_to(w, inner) + np.int32(cw), out=acc)
        else:
            acc = np.full(len(c["names"]), _FAR, dtype=np.int32)
        if isinstance(direct, tuple):
            ids, costs = direct
            acc[ids] = np.minimum(acc[ids], costs)
        else:
            for g, cg in direct:
                if acc[g] > cg:
                    acc[g] = cg
        acc[x] = 0
        return acc

    def _in_neighbours(self, x: int) -> tuple[list[tuple[int, int]], list | tuple[np.ndarray, np.ndarray]]:
        """_compose's view of device x's links in: forwarding (index, cost) pairs, and the GPUs' direct links
        as (index, cost) pairs, or as index and cost arrays when there are many (an NVSwitch's)."""
        c = self._cache
        nid, fwdl = c["nid"], c["fwdl"]
        relays, direct = [], []
        for u, cu in c["radj"][c["names"][x]]:
            (relays if fwdl[nid[u]] else direct).append((nid[u], cu))
        if len(direct) > 8:
            ids, costs = zip(*direct, strict=True)
            return relays, (np.array(ids, dtype=np.int64), np.array(costs, dtype=np.int32))
        return relays, direct

    def route(self, src: int, dst: int) -> Route:
        """The deterministic route from rank src to rank dst (empty when src == dst)."""
        key = (src, dst)
        c = self._cache
        r = c["routes"].get(key)
        if r is not None:
            return r
        n = len(self.rank_nodes)
        if not (type(src) is int and type(dst) is int and 0 <= src < n and 0 <= dst < n):
            validate_ranks((src, dst), n)  # numpy integers pass, anything else raises RankError
        a, b = self.rank_nodes[src], self.rank_nodes[dst]
        links = (self._path_levels if c["levels"] else self._path_dijkstra)(a, b) if a != b else []
        if links is None:
            raise TopologyError(f"no path from rank {src} ({a}) to rank {dst} ({b}) in {self.name}")
        if not links:
            lat, bw = 0.0, float("inf")
        elif len(links) < 8:
            # numpy sums fewer than 8 float64s one by one from 0.0 (its pairwise summation unrolls from 8
            # on), so this gives its bits exactly; tests/test_net_routes.py compares both.
            lat, latl = 0.0, c["latl"]
            for i in links:
                lat += latl[i]
            bw = min([c["bwl"][i] for i in links])
        else:
            idx = np.array(links, dtype=np.int64)
            lat, bw = float(c["lat"][idx].sum()), float(c["bw"][idx].min())
        r = Route(tuple(links), lat, bw)
        c["routes"][key] = r
        return r

    def _path_levels(self, a: str, b: str) -> list[int] | None:
        """Link indices of the route from device a to device b on distance arrays; None when unreachable."""
        c = self._cache
        nid, hops = c["nid"], c["hops"]
        tb = nid[b]
        arr = self._route_dist(tb, nid[a])
        u, du = a, int(arr[nid[a]])
        if du >= _FAR:
            return None
        links = []
        while u != b:
            nb = hops.get(u)
            if nb is None:
                nb = hops[u] = self._hops(u)
            if type(nb) is tuple:
                nxt = self._wide_next_hops(nb, tb, du, arr)
            else:
                # Unreached devices are at _FAR or more, so none passes for a device a link closer (with -1
                # one could: 1 - 2 == -1 sent a route into a dead end, IndexError).
                nxt = [h for h in nb if arr[h[2]] == du - h[1] and (h[3] or h[2] == tb)]
            h = nxt[zlib.crc32(f"{a}|{b}|{u}".encode()) % len(nxt)] if len(nxt) > 1 else nxt[0]
            links.append(h[4])
            u, du = h[0], du - h[1]
        return links

    def _hops(self, u: str) -> list[tuple] | tuple:
        """Out-links of device u for _path_levels: (device, cost, index, forwards, link index) in sorted
        device order; for a wide device (a switch) the same as arrays for _wide_next_hops."""
        c = self._cache
        nid, fwdl, index = c["nid"], c["fwdl"], c["index"]
        nb = [(v, cv, nid[v], fwdl[nid[v]], index[(u, v)]) for v, cv in c["adj"][u]]
        if len(nb) <= _WIDE:
            return nb
        ids = np.array([h[2] for h in nb], dtype=np.int64)
        costs = np.array([h[1] for h in nb], dtype=np.int64)
        relay = c["fwd"][ids]
        # A switch's ports usually share one cost: then the test is against one number, not an array.
        same = int(costs[0]) if (costs == costs[0]).all() else None
        return nb, ids, costs if same is None else same, relay, bool(relay.all())

    def _path_dijkstra(self, a: str, b: str) -> list[int] | None:
        """Link indices of the route from device a to device b on the resumable Dijkstra; None when unreachable."""
        dmap = self._dist_to(b, a)
        if a not in dmap:
            return None
        adj, index, kinds = self._cache["adj"], self._cache["index"], self.graph.nodes
        links, u = [], a
        while u != b:
            du = dmap[u]
            nxt = [
                v
                for v, c in adj[u]
                if dmap.get(v, _FAR) == du - c and (v == b or kinds[v].get("kind") != GPU)
            ]
            v = nxt[zlib.crc32(f"{a}|{b}|{u}".encode()) % len(nxt)] if len(nxt) > 1 else nxt[0]
            links.append(index[(u, v)])
            u = v
        return links

    def _wide_next_hops(self, nb: tuple, tb: int, du: int, arr: np.ndarray) -> list[tuple]:
        """_path_levels' candidate next hops from a wide device (a switch) in one numpy pass, same order.

        The per-neighbour Python test made every new route through a switch with N ports cost O(N), so
        routing all ring neighbours of N ranks cost O(N^2) (8% of a 2048-rank replay, docs/performance.md).
        """
        hops, ids, costs, relay, all_relay = nb
        ok = arr[ids] == du - costs  # costs: one number or one per port; unreached (_FAR up) never matches
        if not all_relay:
            ok &= relay | (ids == tb)
        return [hops[j] for j in ok.nonzero()[0].tolist()]

    def transfer_ns(self, src: int, dst: int, nbytes: float) -> float:
        """Uncontended time (float ns) for nbytes from src to dst: path latency + bytes / bottleneck."""
        r = self.route(src, dst)
        return r.latency_ns + (nbytes / r.bottleneck_bytes_per_ns if r.links else 0.0)

    def hosts_of(self, ranks: Sequence[int]) -> list[str]:
        """Host name of each given rank."""
        validate_ranks(ranks, self.num_ranks)
        return [self.rank_hosts[r] for r in ranks]


def check_graph(graph: DiGraph, rank_nodes: Sequence[str]) -> None:
    """Validate links (positive bandwidth, non-negative latency) and rank placement."""
    if not rank_nodes:
        raise TopologyError("topology has no ranks")
    for u, v, d in graph.edges(data=True):
        bw, lat = d.get("bandwidth"), d.get("latency_ns")
        if not isinstance(bw, int | float) or not bw > 0 or bw != bw:
            raise TopologyError(f"link {u}->{v}: bandwidth must be positive bytes/s, got {bw!r}")
        if not isinstance(lat, int | float) or lat < 0 or lat != lat:
            raise TopologyError(f"link {u}->{v}: latency must be a non-negative number of ns, got {lat!r}")
    seen: set[str] = set()
    for r, n in enumerate(rank_nodes):
        if n not in graph:
            raise TopologyError(f"rank {r} is placed on device {n!r}, which is not in the topology")
        if n in seen:
            raise RankError(f"two ranks are placed on device {n!r}")
        seen.add(n)


def add_duplex(g: DiGraph, u: str, v: str, bandwidth: float, latency_ns: float, kind: str) -> None:
    """Add the two directed links u->v and v->u with the same bandwidth (bytes/s) and latency (ns)."""
    g.add_edge(u, v, bandwidth=float(bandwidth), latency_ns=float(latency_ns), kind=kind)
    g.add_edge(v, u, bandwidth=float(bandwidth), latency_ns=float(latency_ns), kind=kind)


# networkx costs ~770 B and ~13 us per directed link (measured: fully_connected_topology(300), 89,700
# links, 1.16 s, tracemalloc peak 69 MB). 2^22 links is ~3.2 GB and ~1 min; a larger logical topology is
# almost surely a typo (switch:99999999999:...) and would look like a hang, so it is refused.
MAX_LINKS = 1 << 22


def _npus(n: int, name: str, links_per_rank: int = 2) -> tuple[DiGraph, list[str]]:
    if not isinstance(n, int) or n < 1:
        raise TopologyError(f"{name}: number of ranks must be a positive integer, got {n!r}")
    if n * links_per_rank > MAX_LINKS:
        raise TopologyError(
            f"{name}: {n:,} ranks make {n * links_per_rank:,} links, over the {MAX_LINKS:,} xsim builds"
        )
    g = DiGraph()
    nodes = [f"npu{i}" for i in range(n)]
    for x in nodes:
        g.add_node(x, kind="npu")  # logical NPUs forward traffic, unlike cluster GPUs
    return g, nodes


def ring_topology(n: int, bandwidth: float, latency_ns: float) -> Topology:
    """Bidirectional ring of n ranks: 2n directed links of the given bandwidth (B/s) and latency (ns)."""
    g, nodes = _npus(n, "ring")
    for i in range(n if n > 2 else n - 1):
        add_duplex(g, nodes[i], nodes[(i + 1) % n], bandwidth, latency_ns, "ring")
    return Topology(f"ring:{n}", g, tuple(nodes))


def switch_topology(n: int, bandwidth: float, latency_ns: float) -> Topology:
    """n ranks on one switch: every rank has an up and a down link of the given bandwidth and latency."""
    g, nodes = _npus(n, "switch")
    g.add_node("switch", kind="switch")
    for x in nodes:
        add_duplex(g, x, "switch", bandwidth, latency_ns, "switch")
    return Topology(f"switch:{n}", g, tuple(nodes))


def fully_connected_topology(n: int, bandwidth: float, latency_ns: float) -> Topology:
    """n ranks with a direct link between every ordered pair."""
    g, nodes = _npus(n, "fully connected", n - 1 if isinstance(n, int) else 0)
    for i in range(n):
        for j in range(i + 1, n):
            add_duplex(g, nodes[i], nodes[j], bandwidth, latency_ns, "fc")
    return Topology(f"fc:{n}", g, tuple(nodes))


def multi_dim_topology(dims: Iterable[tuple[str, int, float, float]]) -> Topology:
    """ASTRA-sim-style multi-dimensional topology: (kind, size, bandwidth B/s, latency ns) per dim, dim 0 fastest."""
    dims = list(dims)
    if not dims:
        raise TopologyError("a multi-dimensional topology needs at least one dimension")
    sizes = [d[1] for d in dims]
    for kind, size, _, _ in dims:
        if kind not in ("ring", "switch", "fc"):
            raise TopologyError(f"unknown dimension kind {kind!r} (ring, switch, fc)")
        if not isinstance(size, int) or size < 1:
            raise TopologyError(f"dimension size must be a positive integer, got {size!r}")
    n = math.prod(sizes)  # not np.prod: int64 would wrap on absurd sizes
    per_rank = sum(size - 1 if kind == "fc" else 2 for kind, size, _, _ in dims)
    g, nodes = _npus(n, "multi-dim", per_rank)
    strides = [int(np.prod(sizes[:d])) for d in range(len(sizes))]
    for d, (kind, size, bw, lat) in enumerate(dims):
        if size == 1:
            continue
        stride = strides[d]
        for r in range(n):
            if (r // stride) % size != 0:
                continue
            members = [nodes[r + k * stride] for k in range(size)]
            if kind == "ring":
                for k in range(size if size > 2 else 1):
                    add_duplex(g, members[k], members[(k + 1) % size], bw, lat, f"dim{d}")
            elif kind == "fc":
                for i in range(size):
                    for j in range(i + 1, size):
                        add_duplex(g, members[i], members[j], bw, lat, f"dim{d}")
            else:
                sw = f"dim{d}_switch{r}"
                g.add_node(sw, kind="switch")
                for x in members:
                    add_duplex(g, x, sw, bw, lat, f"dim{d}")
    name = "x".join(f"{k}{s}" for k, s, _, _ in dims)
    return Topology(name, g, tuple(nodes))
