"""Collective algorithms as schedules: stages of transfers between group positions, run per channel.

A schedule has one or more independent channels (trees of a double binary tree, rings of a multi-ring);
each channel is a sequence of stages. Dependency rule, shared by every model: a position issues its sends
of stage s once it has received everything addressed to it in stages < s (plus the reduction time of
reducing stages). Positions are indices into the process group (0..p-1), not global ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from xsim.netmodels.api import COLLECTIVE_KINDS
from xsim.netmodels.errors import AlgorithmError

ALGORITHMS: tuple[str, ...] = (
    "ring",
    "direct",
    "halving_doubling",
    "double_binary_tree",
    "hierarchical",
    "multi_ring",
    "nvls",
    "nvls_tree",
    "pat",
)
# ASTRA-sim's spellings (system JSON) and common short names map onto ours.
ALIASES: dict[str, str] = {
    "halvingDoubling": "halving_doubling",
    "hd": "halving_doubling",
    "doubleBinaryTree": "double_binary_tree",
    "dbt": "double_binary_tree",
    "tree": "double_binary_tree",
    "multiring": "multi_ring",
    "NVLS": "nvls",
    "NVLSTree": "nvls_tree",
    "nvlstree": "nvls_tree",
    "PAT": "pat",
}
# Every kind runs as a ring or as direct transfers; the others are specialised algorithms.
_ALL_KINDS: frozenset[str] = frozenset(COLLECTIVE_KINDS)
SUPPORTED: dict[str, frozenset[str]] = {
    "ring": _ALL_KINDS,
    "direct": _ALL_KINDS,
    "halving_doubling": frozenset({"all_reduce", "reduce_scatter", "all_gather", "barrier"}),
    "double_binary_tree": frozenset({"all_reduce"}),
    "hierarchical": frozenset({"all_reduce"}),
    "multi_ring": frozenset({"all_reduce", "reduce_scatter", "all_gather"}),
    # NVLink SHARP (netmodels/nccl.py): NCCL mode on NVSwitch clusters only; the models build its schedule.
    "nvls": frozenset({"all_reduce", "reduce_scatter", "all_gather"}),
    "nvls_tree": frozenset({"all_reduce"}),
    # NCCL's PAT (netmodels/nccl.py): NCCL mode, one rank per node.
    "pat": frozenset({"reduce_scatter", "all_gather"}),
}


@dataclass(frozen=True, eq=False)
class Stage:
    """Transfers src[i] -> dst[i] of nbytes[i] (group positions); `repeat` times in a row when > 1."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    reduce: bool = False
    repeat: int = 1
    # True when every position sends at most once and receives at most once (rings, xor partners).
    perm: bool = False
    # A pure local step (ASTRA-sim's per-phase memory-bus crossing): no transfers, every position waits.
    local: bool = False
    # Latency (ns) each transfer adds to its route's (NCCL protocols' per-step latency, netmodels/nccl.py).
    extra_ns: np.ndarray | None = None
    # Pipelined trees: which transfers carry the first chunk (a protocol's hop latency is paid once per
    # hop by the first chunk; the chunks behind it follow at the bandwidth's pace). None: every transfer.
    first: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class Schedule:
    """A collective as channels of stages over p group positions."""

    kind: str
    algorithm: str
    p: int
    channels: tuple[tuple[Stage, ...], ...]
    # True when the channels are one collective's parallel rings that split every link they share (NCCL's
    # channels): the analytical model then gives each channel its share of such a link's bandwidth.
    shared: bool = False


def canonical_algorithm(name: str) -> tuple[str, int]:
    """Our name of an algorithm and its parameter (rings for multi_ring:K, else 0)."""
    base, _, arg = str(name).partition(":")
    base = ALIASES.get(base, base)
    if base not in ALGORITHMS:
        raise AlgorithmError(f"unknown algorithm {name!r} (known: {', '.join(ALGORITHMS)})")
    if base == "multi_ring":
        try:
            k = int(arg) if arg else 2
        except ValueError:
            raise AlgorithmError(f"multi_ring takes a ring count, e.g. multi_ring:4; got {name!r}") from None
        if k < 1:
            raise AlgorithmError(f"multi_ring needs at least one ring, got {k}")
        return base, k
    if arg:
        raise AlgorithmError(f"algorithm {base} takes no parameter, got {name!r}")
    return base, 0


def ring_stage(p: int, nbytes: float, reduce: bool, repeat: int, step: int = 1) -> Stage:
    """`repeat` ring steps: every position i sends nbytes to (i + step) mod p."""
    src = np.arange(p, dtype=np.int64)
    return Stage(src, (src + step) % p, np.full(p, float(nbytes)), reduce, repeat, perm=True)


def _pairs(p: int) -> tuple[np.ndarray, np.ndarray]:
    i, j = np.meshgrid(np.arange(p, dtype=np.int64), np.arange(p, dtype=np.int64), indexing="ij")
    mask = i != j
    return i[mask], j[mask]


def _star(p: int, root: int, nbytes: float, inward: bool, reduce: bool = False) -> Stage:
    others = np.array([i for i in range(p) if i != root], dtype=np.int64)
    rootv = np.full(len(others), root, dtype=np.int64)
    src, dst = (others, rootv) if inward else (rootv, others)
    return Stage(src, dst, np.full(len(others), float(nbytes)), reduce)


def _chain(order: list[int], sizes: list[float], reduce: bool) -> list[Stage]:
    return [
        Stage(np.array([order[k]]), np.array([order[k + 1]]), np.array([float(sizes[k])]), reduce, perm=True)
        for k in range(len(order) - 1)
    ]


def in_order_tree(n: int, root_max: bool) -> list[int]:
    """Parent of each position in ASTRA-sim's binary tree (in-order ids; root n-1 or 0 with one child)."""
    parent = [-1] * n

    def build(lo: int, hi: int, up: int) -> None:
        if lo > hi:
            return
        mid = (lo + hi) // 2
        parent[mid] = up
        build(lo, mid - 1, mid)
        build(mid + 1, hi, mid)

    if n == 1:
        return parent
    if root_max:
        build(0, n - 2, n - 1)
    else:
        build(1, n - 1, 0)
    return parent


def tree_levels(parent: list[int]) -> tuple[int, list[int], list[int]]:
    """The root of a tree given by `parent` (-1 at the root), each node's depth and its subtree height."""
    n = len(parent)
    children: list[list[int]] = [[] for _ in range(n)]
    root = parent.index(-1)
    for v, u in enumerate(parent):
        if u >= 0:
            children[u].append(v)
    depth = [0] * n
    order = [root]
    for v in order:
        for c in children[v]:
            depth[c] = depth[v] + 1
            order.append(c)
    height = [0] * n
    for v in reversed(order):
        height[v] = max((height[c] + 1 for c in children[v]), default=0)
    return root, depth, height


def tree_stages(parent: list[int], nbytes: float) -> list[Stage]:
    """Reduce up a tree by subtree height, then broadcast down by depth; one full-size message per edge."""
    n = len(parent)
    root, depth, height = tree_levels(parent)
    stages = []
    for h in range(height[root]):
        vs = [v for v in range(n) if height[v] == h and parent[v] >= 0]
        stages.append(
            Stage(
                np.array(vs), np.array([parent[v] for v in vs]), np.full(len(vs), float(nbytes)), reduce=True
            )
        )
    for d in range(max(depth)):
        vs = [v for v in range(n) if depth[v] == d + 1]
        stages.append(Stage(np.array([parent[v] for v in vs]), np.array(vs), np.full(len(vs), float(nbytes))))
    return stages


def _log2(p: int, algorithm: str) -> int:
    k = p.bit_length() - 1
    if 1 << k != p:
        raise AlgorithmError(f"{algorithm} needs a power-of-two group size, got {p}")
    return k


def _hd(p: int, kind: str, size: float) -> list[Stage]:
    k = _log2(p, "halving_doubling")
    pos = np.arange(p, dtype=np.int64)
    rs = [Stage(pos, pos ^ (1 << i), np.full(p, size / 2 ** (i + 1)), True, perm=True) for i in range(k)]
    if kind == "reduce_scatter":
        return rs
    if kind == "all_reduce":
        return rs + [
            Stage(pos, pos ^ (1 << i), np.full(p, size / 2 ** (i + 1)), perm=True) for i in reversed(range(k))
        ]
    # all_gather: size is the per-rank input; the exchanged block doubles each step.
    return [Stage(pos, pos ^ (1 << i), np.full(p, size * 2**i), perm=True) for i in range(k)]


def _ring(p: int, kind: str, size: float, root: int, step: int = 1) -> list[Stage]:
    if kind == "all_reduce":
        return [ring_stage(p, size / p, True, p - 1, step), ring_stage(p, size / p, False, p - 1, step)]
    if kind == "reduce_scatter":
        return [ring_stage(p, size / p, True, p - 1, step)]
    if kind == "all_gather":
        return [ring_stage(p, size, False, p - 1, step)]
    if kind == "all_to_all":
        # Store-and-forward ring: in step s every rank forwards the (p - s) blocks still in transit.
        return [ring_stage(p, (p - s) * size / p, False, 1, step) for s in range(1, p)]
    if kind == "barrier":
        return [ring_stage(p, 0.0, False, 2 * (p - 1), step)]
    chain = [(root + k) % p for k in range(p)]
    if kind == "broadcast":
        # Pipelined along the chain, as NCCL's ring broadcast runs it (src/device/broadcast.h runRing: chunk
        # by chunk the root sends, each rank after it receives, copies and sends on, the last receives):
        # every link of the chain carries the whole message at once, not one hop after another.
        src = np.array(chain[:-1], dtype=np.int64)
        return [
            Stage(src, np.array(chain[1:], dtype=np.int64), np.full(p - 1, float(size)), False, perm=True)
        ]
    if kind == "scatter":
        return _chain(chain, [(p - 1 - k) * size / p for k in range(p - 1)], False)
    back = chain[::-1]
    if kind == "reduce":
        return _chain(back, [size] * (p - 1), True)
    return _chain(back, [(k + 1) * size / p for k in range(p - 1)], False)  # gather


def _permuted(stages: list[Stage], order: list[int]) -> list[Stage]:
    """The stages of a ring in group order, run on the ring that visits positions in `order`."""
    o = np.asarray(order, dtype=np.int64)
    return [Stage(o[s.src], o[s.dst], s.nbytes, s.reduce, s.repeat, s.perm, s.local) for s in stages]


def _direct(p: int, kind: str, size: float, root: int) -> list[Stage]:
    if kind in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
        src, dst = _pairs(p)
        m = size if kind == "all_gather" else size / p
        rs = Stage(src, dst, np.full(len(src), m), reduce=kind in ("all_reduce", "reduce_scatter"))
        if kind == "all_reduce":
            return [rs, Stage(src, dst, np.full(len(src), m))]
        return [rs]
    if kind == "broadcast":
        return [_star(p, root, size, inward=False)]
    if kind == "reduce":
        return [_star(p, root, size, inward=True, reduce=True)]
    if kind == "gather":
        return [_star(p, root, size / p, inward=True)]
    if kind == "scatter":
        return [_star(p, root, size / p, inward=False)]
    return [_star(p, root, 0.0, inward=True), _star(p, root, 0.0, inward=False)]  # barrier


def _hierarchical(p: int, size: float, hosts: list[str] | None) -> list[Stage]:
    if hosts is None:
        raise AlgorithmError("hierarchical needs a topology that places ranks on hosts")
    groups: dict[str, list[int]] = {}
    for i, h in enumerate(hosts):
        groups.setdefault(h, []).append(i)
    members = list(groups.values())
    local = len(members[0])
    if any(len(m) != local for m in members):
        raise AlgorithmError("hierarchical needs the same number of group ranks on every host")
    nh = len(members)
    intra_next = np.empty(p, dtype=np.int64)
    inter_next = np.empty(p, dtype=np.int64)
    for h, m in enumerate(members):
        for j, v in enumerate(m):
            intra_next[v] = m[(j + 1) % local]
            inter_next[v] = members[(h + 1) % nh][j]
    pos = np.arange(p, dtype=np.int64)
    stages: list[Stage] = []
    if local > 1:
        stages.append(Stage(pos, intra_next, np.full(p, size / local), True, local - 1, perm=True))
    if nh > 1:
        m = size / local / nh
        stages.append(Stage(pos, inter_next, np.full(p, m), True, nh - 1, perm=True))
        stages.append(Stage(pos, inter_next, np.full(p, m), False, nh - 1, perm=True))
    if local > 1:
        stages.append(Stage(pos, intra_next, np.full(p, size / local), False, local - 1, perm=True))
    return stages


RAIL_KINDS = frozenset({"all_reduce", "reduce_scatter", "all_gather"})
# Pipeline chunks per NCCL tree channel, a modelling choice (not NCCL's chunk size): chunks of at least
# 64 KiB, at most 64 of them, so a 1 GiB AllReduce stays a few hundred stages. With K chunks a tree of
# height H and depth D takes K + H + D - 1 slots of S/K: within (H + D - 1)/K of the ideal pipeline.
TREE_CHUNK_BYTES = 64 * 1024
TREE_MAX_CHUNKS = 64


def nccl_tree_parents(hosts: list[str]) -> list[list[int]]:
    """Parent position of every position in each NCCL tree channel (-1 at the root).

    Inside a host the GPUs form a chain; across hosts a double binary tree of the hosts' chain heads
    (two complementary in-order trees, as NCCL's `trees.cc` pairs them). With L > 1 ranks on each of
    several hosts there are 2L channels: rail c rotates every host's chain by c, tree 0 enters it at its
    first GPU and tree 1 at its last, so the channels' inter-node traffic uses every GPU's NIC.
    """
    by_host: dict[str, list[int]] = {}
    for i, h in enumerate(hosts):
        by_host.setdefault(h, []).append(i)
    members = list(by_host.values())
    nn = len(members)
    local = len(members[0])
    rails = local if nn > 1 and local > 1 and all(len(m) == local for m in members) else 1
    out = []
    for c in range(rails):
        chains = [m[c:] + m[:c] for m in members]
        for t, root_max in enumerate((True, False)):
            up = in_order_tree(nn, root_max)
            parent = [-1] * len(hosts)
            heads = [ch[0] if t == 0 else ch[-1] for ch in chains]
            for hi, ch in enumerate(chains):
                order = ch if t == 0 else ch[::-1]  # order[0] is the head
                for j in range(1, len(order)):
                    parent[order[j]] = order[j - 1]
                parent[order[0]] = heads[up[hi]] if up[hi] >= 0 else -1
            out.append(parent)
    return out


def pipelined_tree_stages(parent: list[int], nbytes: float, chunks: int) -> list[Stage]:
    """A tree AllReduce streamed in `chunks` chunks: slot t, a node of height h sends chunk t - h up;
    the root's chunk k goes down from slot k + H, a node of depth d forwarding it at slot k + H + d."""
    n = len(parent)
    root, depth, height = tree_levels(parent)
    big_h = height[root]
    nodes = np.array([v for v in range(n) if parent[v] >= 0], dtype=np.int64)
    par = np.array([parent[v] for v in nodes.tolist()], dtype=np.int64)
    h_up = np.array([height[v] for v in nodes.tolist()], dtype=np.int64)
    d_down = np.array([big_h + depth[parent[v]] for v in nodes.tolist()], dtype=np.int64)
    m = float(nbytes) / chunks
    slots = chunks + big_h + max(depth)
    stages = []
    for t in range(slots - 1 if max(depth) > 0 else slots):
        up = (t - h_up >= 0) & (t - h_up < chunks)
        down = (t - d_down >= 0) & (t - d_down < chunks)
        src = np.concatenate((nodes[up], par[down]))
        dst = np.concatenate((par[up], nodes[down]))
        first = np.concatenate((t - h_up[up] == 0, t - d_down[down] == 0))
        if len(src):
            stages.append(Stage(src, dst, np.full(len(src), m), reduce=bool(up.any()), first=first))
    return stages


@dataclass(frozen=True)
class _Collective:
    """One collective to schedule: its kind, positions, bytes (Chakra comm_size semantics) and root."""

    kind: str
    p: int
    size: float
    root: int


def build_schedule(
    kind: str,
    algorithm: str,
    p: int,
    size_bytes: float,
    root: int = 0,
    hosts: list[str] | None = None,
    rings: list[list[int]] | None = None,
    nccl: bool = False,
    tree_chunks: int | None = None,
) -> Schedule:
    """The schedule of one collective of `kind` on p positions (Chakra comm_size semantics for size).

    `rings` (NCCL mode, netmodels.nccl.rail_rings): the orders of the channels a `ring` AllReduce,
    ReduceScatter or AllGather runs on, each carrying 1/len(rings) of the data. `nccl`: a
    `double_binary_tree` AllReduce is NCCL's tree (nccl_tree_parents, pipelined in `tree_chunks` chunks,
    default by TREE_CHUNK_BYTES up to TREE_MAX_CHUNKS).
    """
    base, arg = canonical_algorithm(algorithm)
    if kind not in SUPPORTED[base]:
        raise AlgorithmError(
            f"algorithm {base} does not implement {kind} (it does: {', '.join(sorted(SUPPORTED[base]))})"
        )
    c = _Collective(kind, p, float(size_bytes), root)
    if p == 1:
        return Schedule(kind, base, 1, ())
    if base in ("nvls", "nvls_tree"):
        raise AlgorithmError(
            f"algorithm {base} (NVLink SHARP) runs on NVSwitch clusters with collectives: nccl (dgx-h100)"
        )
    if base == "pat":
        if not nccl or hosts is None or len(set(hosts)) != p:
            raise AlgorithmError(
                "algorithm pat (NCCL's PAT) runs ReduceScatter/AllGather with one rank per node on clusters "
                "with collectives: nccl (dgx-a100, dgx-a800, dgx-h100)"
            )
        from xsim.netmodels.nccl import pat_schedule

        return pat_schedule(Schedule(kind, "ring", p, (tuple(_ring(p, kind, c.size, root)),)))
    if base == "ring" and rings and kind in RAIL_KINDS:
        stages = _ring(p, kind, c.size / len(rings), root)
        return Schedule(kind, base, p, tuple(tuple(_permuted(stages, o)) for o in rings), shared=True)
    if base == "double_binary_tree" and nccl and hosts is not None:
        parents = nccl_tree_parents(hosts)
        part = c.size / len(parents)
        k = tree_chunks or max(1, min(TREE_MAX_CHUNKS, -(-int(part) // TREE_CHUNK_BYTES)))
        channels = tuple(tuple(pipelined_tree_stages(par, part, k)) for par in parents)
        return Schedule(kind, base, p, channels, shared=True)
    # NCCL runs AllToAll as concurrent P2P sends to every peer: in the analytical model the transfers of a
    # stage split the links they share (a GPU's NVLink among its node peers, its NIC among its remote
    # peers), as the flow model's concurrent flows do.
    shared = bool(nccl) and base == "direct"
    return Schedule(kind, base, p, _channels(c, base, arg, hosts), shared=shared)


def _channels(c: _Collective, base: str, arg: int, hosts: list[str] | None) -> tuple[tuple[Stage, ...], ...]:
    """The stages of each channel of algorithm `base` (arg: its ring count, for `rings`)."""
    kind, p, size = c.kind, c.p, c.size
    if base == "ring":
        return (tuple(_ring(p, kind, size, c.root)),)
    if base == "direct":
        return (tuple(_direct(p, kind, size, c.root)),)
    if base == "halving_doubling":
        if kind == "barrier":
            k = (p - 1).bit_length()
            return (tuple(ring_stage(p, 0.0, False, 1, step=1 << i) for i in range(k)),)
        return (tuple(_hd(p, kind, size)),)
    if base == "double_binary_tree":
        return tuple(tuple(tree_stages(in_order_tree(p, rm), size / 2)) for rm in (True, False))
    if base == "hierarchical":
        return (tuple(_hierarchical(p, size, hosts)),)
    # One ring per channel, each carrying 1/k of the data; odd rings run the other way round so both
    # directions of every link carry traffic.
    return tuple(tuple(_ring(p, kind, size / arg, c.root, 1 if i % 2 == 0 else p - 1)) for i in range(arg))


def default_algorithm(kind: str) -> str:
    """The generic models' default algorithm for a collective kind (ring, or direct for all-to-all)."""
    return "direct" if kind in ("all_to_all", "gather", "scatter") else "ring"
