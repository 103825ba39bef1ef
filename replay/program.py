"""The replay program: every node of a trace set flattened once into plain per-node lists for the engine.

Nodes get a global index g, rank by rank and, within a rank, in ascending node id, so "issue ready nodes
in ascending id" is "pop the smallest g" from a per-queue heap of ints. Protobuf attributes are read here
once; the event loop never touches a protobuf message.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from replay.compute import ComputeModel, DurationModel, RooflineModel
from replay.config import ReplayConfig
from replay.errors import ReplayError, TraceGraphError
from traces import pb
from traces.attrcheck import node_problem
from traces.attrs import (
    CHUNK,
    COMM_DST,
    COMM_SIZE,
    COMM_SRC,
    COMM_TAG,
    COMM_TYPE,
    DEVICE_GROUP,
    DURATION_NS,
    FLOAT_KINDS,
    INT_KINDS,
    IS_CPU_OP,
    LAYER,
    MICRO_BATCH,
    NUM_OPS,
    PG_NAME,
    PHASE,
    RESHARD,
    RING,
    STAGE,
    STREAM,
    TENSOR_SIZE,
    duplicate_attr_error,
)
from traces.columnar import RankColumns
from traces.graph import unready
from traces.groups import ALL_RANKS_NAMES, ProcessGroups
from traces.traceset import TraceSet

# Node kinds as the engine sees them.
K_COMP, K_CPU, K_COLL, K_SEND, K_RECV, K_MEM, K_ZERO, K_TCOMM = range(8)
KIND_RESOURCE = ("compute", "cpu", "comm", "comm", "comm", "comm", "none", "comm")

# Chakra CollectiveCommType -> netmodels CollectiveSpec.kind (contract E).
COLLECTIVE_KIND: dict[int, str] = {
    pb.ALL_REDUCE: "all_reduce",
    pb.REDUCE: "reduce",
    pb.ALL_GATHER: "all_gather",
    pb.GATHER: "gather",
    pb.SCATTER: "scatter",
    pb.BROADCAST: "broadcast",
    pb.ALL_TO_ALL: "all_to_all",
    pb.REDUCE_SCATTER: "reduce_scatter",
    pb.REDUCE_SCATTER_BLOCK: "reduce_scatter",
    pb.BARRIER: "barrier",
}

# Annotation columns of the ops table: attribute name -> ("int" | "str").
ANNOTATION_COLUMNS: dict[str, str] = {
    LAYER: "int",
    PHASE: "str",
    MICRO_BATCH: "int",
    STAGE: "int",
    DEVICE_GROUP: "int",
    RING: "int",
    CHUNK: "int",
    RESHARD: "str",
}
_SCANNED = frozenset(
    {
        IS_CPU_OP,
        STREAM,
        COMM_TYPE,
        COMM_SIZE,
        COMM_SRC,
        COMM_DST,
        COMM_TAG,
        PG_NAME,
        "comm_group",
        DURATION_NS,
    }
)
_SCAN_BIT = {name: 1 << i for i, name in enumerate(sorted(_SCANNED))}
# Read for RooflineModel.comp_duration_ns (the roofline model's inputs, read in the same pass).
_ROOFLINE = frozenset({NUM_OPS, TENSOR_SIZE})
# Oneof kinds whose value _attr_scalar returns (anything else: None).
_SCALAR_KINDS = frozenset(INT_KINDS | FLOAT_KINDS | {"bool_val", "string_val"})
_STOI = re.compile(r"^\s*([+-]?\d+)")


@dataclass(frozen=True)
class CollInfo:
    """A collective node's matching data."""

    comm_type: int
    size: int
    group: str  # canonical group key
    members: tuple[int, ...]


@dataclass(frozen=True)
class P2PInfo:
    """A send or recv node's matching data."""

    src: int
    dst: int
    tag: int
    size: int


@dataclass
class Program:
    """Flattened trace set. Lists are indexed by global node index g unless named otherwise."""

    num_ranks: int
    rank_offset: list[int]  # rank r owns g in [rank_offset[r], rank_offset[r+1])
    node_id: list[int]
    name: list[str]
    node_type: list[int]
    kind: list[int]
    dur: list[int]  # ns for timed kinds (compute, cpu, mem, duration-replayed comm); 0 otherwise
    ndeps: Sequence[int]
    child_ptr: Sequence[int]  # CSR: children of g are child_idx[child_ptr[g]:child_ptr[g+1]]
    child_idx: Sequence[int]
    queue: Sequence[int]  # queue index, -1 = takes no slot
    queue_cap: list[int]
    queue_label: list[str]
    recorded_ns: list[int]  # duration_micros x 1000 (0 -> 1), for measured communication
    nbytes: list[int]
    comm_type: list[int]  # -1 when not a collective
    pg_name: list[str | None]
    coll: dict[int, CollInfo]
    p2p: dict[int, P2PInfo]
    annotations: dict[int, dict]  # g -> {annotation column: value}, nodes built one by one (see ann_cols)
    groups: ProcessGroups
    compute_name: str
    ctrl_deps_ignored_ranks: int = 0  # ranks replayed on data deps alone (ctrl deps closed a cycle)
    ignored_ctrl_deps: int = 0  # ctrl deps on absent ids or on the node itself (dropped)
    paths: tuple[str, ...] = field(default=())
    rank_ids: tuple[int, ...] = field(default=())  # a folded program's slot -> rank; () = slot is the rank
    # Annotation columns of the nodes decoded as columns: name -> (values, valid) for int columns and
    # (codes into `strings`, -1 = null) for string columns; nodes in `annotations` are null here.
    ann_cols: dict[str, tuple] = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        """Total nodes over all ranks."""
        return len(self.node_id)

    def rank_of(self, g: int) -> int:
        """Rank owning global index g."""
        # The last rank whose first index is <= g (ranks without nodes share their successor's offset).
        lo = max(bisect_right(self.rank_offset, g, 0, self.num_ranks) - 1, 0)
        return self.rank_ids[lo] if self.rank_ids else lo

    def memory_bytes(self) -> int:
        """Approximate bytes the program holds per-node (arrays, list slots, name strings; not the dicts
        of communication nodes), to check memory stays linear in nodes (docs/performance.md)."""
        import sys

        total = 0
        for v in vars(self).values():
            if isinstance(v, np.ndarray):
                total += v.nbytes
            elif isinstance(v, list) and len(v) == self.num_nodes:
                total += 8 * len(v)
        total += sum(sys.getsizeof(x) for x in self.name)  # an upper bound: shared strings count per node
        for cols in self.ann_cols.values():
            total += sum(c.nbytes for c in cols if isinstance(c, np.ndarray))
        return total

    def children(self, g: int) -> Sequence[int]:
        """Nodes that depend on g."""
        return self.child_idx[self.child_ptr[g] : self.child_ptr[g + 1]]

    def describe(self, g: int) -> str:
        """`rank R node ID 'name'` for messages."""
        return f"rank {self.rank_of(g)} node {self.node_id[g]} {self.name[g]!r}"


def resolve_group(groups: ProcessGroups, name: str) -> tuple[str, tuple[int, ...]] | None:
    """(canonical key, members) of a pg_name; ASTRA-sim reads the name with stoi, so "1.0" is group 1."""
    if name in groups.groups:
        return name, groups.groups[name]
    if name in ALL_RANKS_NAMES:
        return "", groups.all_ranks
    m = _STOI.match(name)
    if m:
        key = str(int(m[1]))
        if key in groups.groups:
            return key, groups.groups[key]
        if key == "0":
            return "", groups.all_ranks
    return None


def _attr_scalar(a: pb.AttributeProto):
    kind = a.WhichOneof("value")
    return getattr(a, kind) if kind in _SCALAR_KINDS else None


def _attach(children: list[list[int]], fwd: dict[int, list[int]], empty: list[int]) -> None:
    """Attach edges whose parent comes after the child in id order."""
    for pg_, kids in fwd.items():
        ch = children[pg_]
        children[pg_] = (ch if ch is not empty else []) + kids


def _cycle_ids(ids: Sequence[int], children: list[list[int]], ndeps: list[int]) -> list[int]:
    """Ids of nodes that can never become ready (on or behind a cycle) on one rank."""
    return sorted(ids[i] for i in unready(ndeps, children))


def _data_only_edges(nodes, id_to_l: dict[int, int], children, ndeps, empty) -> None:
    """Rebuild one rank's edges from data deps alone (they were checked when first built)."""
    for i in range(len(nodes)):
        children[i] = empty
    fwd: dict[int, list[int]] = {}
    for i, node in enumerate(nodes):
        deps = set(node.data_deps)
        ndeps[i] = len(deps)
        for dep in deps:
            p = id_to_l[dep]
            if p > i:
                fwd.setdefault(p, []).append(i)
            elif children[p] is empty:
                children[p] = [i]
            else:
                children[p].append(i)
    _attach(children, fwd, empty)


class _Builder:
    """Accumulates the program rank by rank (columns of numpy chunks) and turns comm nodes into infos."""

    def __init__(self, groups: ProcessGroups, compute: ComputeModel, config: ReplayConfig, n_ranks: int):
        self.groups = groups
        self.compute = compute
        self.config = config
        self.n_ranks = n_ranks
        self.measured = config.comm_mode == "measured"
        self.tcomm_types = config.duration_comm_types
        self.fast_duration = type(compute) is DurationModel
        # ReplayConfig.durations: "micros" ignores xsim's exact duration_ns (ASTRA-sim reads duration_micros).
        self.exact = config.durations != "micros"
        # Roofline from the attributes this pass reads anyway (no second scan per node, same numbers).
        self.fast_roofline = type(compute) is RooflineModel
        self.n = 0
        self.rank_offset = [0]
        self.chunks: dict[str, list[np.ndarray]] = {
            k: []
            for k in ("node_id", "node_type", "kind", "dur", "ndeps", "queue", "recorded", "nbytes", "ctype")
        }
        self.child_counts: list[np.ndarray] = []
        self.child_idx: list[np.ndarray] = []
        self.names: list[str] = []
        self.pgs: list[str | None] = []
        self.queue_cap: list[int] = []
        self.queue_label: list[str] = []
        self.coll: dict[int, CollInfo] = {}
        self.p2p: dict[int, P2PInfo] = {}
        self.ann: dict[int, dict] = {}
        self.ann_chunks: dict[str, list[tuple]] = {k: [] for k in ANNOTATION_COLUMNS}
        self.ann_strings: dict[str, dict[str, int]] = {
            k: {} for k in ANNOTATION_COLUMNS if ANNOTATION_COLUMNS[k] == "str"
        }
        self.ignored_ctrl = 0
        self.ctrl_ignored_ranks = 0
        self.group_streams = config.comm_streams == "group"
        self.rank_streams: dict[str, int] = {}
        self.roofline_cache: dict[tuple, int] = {}  # RooflineModel times by (device, cpu, ops, size, rec)
        self.batch: tuple | None = None  # (decoded columns, what replay/build_fast.py computed for them)
        self.deps_cache: dict[tuple, tuple] = {}  # replay/build_fast.py's edges by the rank's ids and deps

    def rank_queues(self, rank: int) -> tuple[int, int, int]:
        """The rank's cpu, compute and comm queue indices."""
        q_cpu = len(self.queue_cap)
        c = self.config
        self.queue_cap.extend((c.cpu_slots, c.compute_streams, c.comm_channels))
        self.queue_label.extend((f"rank {rank} cpu", f"rank {rank} compute", f"rank {rank} comm"))
        self.rank_streams = {}
        return q_cpu, q_cpu + 1, q_cpu + 2

    def comm_queue(self, rank: int, kind: int, stream: str | None, q_comm: int) -> int:
        """The queue of a GPU comm node: its stream's (config.comm_streams "group") or the shared slot."""
        if not self.group_streams or stream is None:
            return q_comm
        q = self.rank_streams.get(stream)
        if q is None:
            q = self.rank_streams[stream] = len(self.queue_cap)
            self.queue_cap.append(1)  # a stream runs its ops one after another
            self.queue_label.append(f"rank {rank} {stream} stream")
        return q

    def comm(self, nt, rank, g, rec, where, a_ct, a_size, a_src, a_dst, a_tag, a_pg) -> tuple:
        """(kind, duration, bytes, comm_type, pg_name, stream) of a GPU comm node; records its matching data.

        stream: the process group's stream for a collective, the pipeline stream for a send, None for a recv.
        """
        groups, n_ranks, measured = self.groups, self.n_ranks, self.measured
        if nt == pb.COMM_COLL_NODE:
            if a_ct is None or isinstance(a_ct, str) or isinstance(a_ct, float) and not a_ct.is_integer():
                raise TraceGraphError("collective without an integer comm_type", **where)
            ct = int(a_ct)
            if ct not in COLLECTIVE_KIND:
                raise TraceGraphError(f"unknown comm_type {ct}", **where)
            size = _size(a_size, where)
            pgn = a_pg if a_pg is not None else ""
            if ct in self.tcomm_types:
                return K_TCOMM, rec, size, ct, pgn, f"group {pgn!r}"
            res = resolve_group(groups, pgn)
            if res is None:
                known = ", ".join(sorted(groups.groups)) or "none"
                raise TraceGraphError(
                    f"pg_name {pgn!r} is not a known process group (known: {known}; pass --comm-groups FILE)",
                    **where,
                )
            key, members = res
            if rank not in members:
                raise TraceGraphError(
                    f"pg_name {pgn!r} = ranks {list(members)} does not contain this rank", **where
                )
            self.coll[g] = CollInfo(ct, size, key, members)
            return K_COLL, rec if measured else 0, size, ct, pgn, f"group {key!r}"
        send = nt == pb.COMM_SEND_NODE
        size = _size(a_size, where)
        src = rank if (send and a_src is None) else a_src
        dst = rank if (not send and a_dst is None) else a_dst
        if src is None or dst is None or a_tag is None:
            need = "comm_dst" if send else "comm_src"
            raise TraceGraphError(f"{'send' if send else 'recv'} needs {need} and comm_tag", **where)
        src, dst, tag = (_int(v, k, where) for v, k in ((src, "src"), (dst, "dst"), (a_tag, "tag")))
        if (send and src != rank) or (not send and dst != rank):
            raise TraceGraphError(
                f"{'send comm_src' if send else 'recv comm_dst'} is {src if send else dst}, not this rank",
                **where,
            )
        for peer in (src, dst):
            if not 0 <= peer < n_ranks:
                raise TraceGraphError(f"peer rank {peer} outside 0..{n_ranks - 1}", **where)
        self.p2p[g] = P2PInfo(src, dst, tag, size)
        return (K_SEND if send else K_RECV), rec if measured else 0, size, -1, a_pg, "p2p" if send else None

    def add_rank(self, cols: dict[str, np.ndarray], names: list[str], pgs: list, counts, cidx) -> None:
        """Append one rank's columns (children as per-node counts and flat global indices)."""
        for k, v in cols.items():
            self.chunks[k].append(v)
        self.names.extend(names)
        self.pgs.extend(pgs)
        self.child_counts.append(counts)
        self.child_idx.append(cidx)
        self.n += len(names)
        self.rank_offset.append(self.n)

    def null_annotations(self, count: int) -> None:
        """Annotation columns of a rank built one node at a time (its values live in `ann`)."""
        for k, kind in ANNOTATION_COLUMNS.items():
            if kind == "int":
                self.ann_chunks[k].append((np.zeros(count, np.int64), np.zeros(count, bool)))
            else:
                self.ann_chunks[k].append((np.full(count, -1, np.int32),))

    def program(self, trace_set: TraceSet, ranks, compute_name: str) -> Program:
        """The finished Program."""

        def cat(k, dtype):
            ch = self.chunks[k]
            if not ch:
                return np.zeros(0, dtype)
            out = np.concatenate(ch)
            return out if out.dtype == object else out.astype(dtype, copy=False)

        counts = np.concatenate(self.child_counts) if self.child_counts else np.zeros(0, np.int64)
        child_ptr = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(counts, out=child_ptr[1:])
        ann_cols: dict[str, tuple] = {}
        for k, kind in ANNOTATION_COLUMNS.items():
            parts = self.ann_chunks[k]
            if kind == "int":
                vals = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
                ok = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, bool)
                ann_cols[k] = (vals, ok)
            else:
                codes = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int32)
                table = sorted(self.ann_strings[k], key=self.ann_strings[k].__getitem__)
                ann_cols[k] = (codes, table)
        return Program(
            num_ranks=len(self.rank_offset) - 1,
            rank_offset=self.rank_offset,
            node_id=cat("node_id", np.int64),
            name=self.names,
            node_type=cat("node_type", np.int64),
            kind=cat("kind", np.int8),
            dur=cat("dur", np.int64),
            ndeps=cat("ndeps", np.int64),
            child_ptr=child_ptr,
            child_idx=np.concatenate(self.child_idx) if self.child_idx else np.zeros(0, np.int64),
            queue=cat("queue", np.int64),
            queue_cap=self.queue_cap,
            queue_label=self.queue_label,
            recorded_ns=cat("recorded", np.int64),
            nbytes=cat("nbytes", np.int64),
            comm_type=cat("ctype", np.int64),
            pg_name=self.pgs,
            coll=self.coll,
            p2p=self.p2p,
            annotations=self.ann,
            groups=self.groups,
            compute_name=compute_name,
            ignored_ctrl_deps=self.ignored_ctrl,
            ctrl_deps_ignored_ranks=self.ctrl_ignored_ranks,
            paths=trace_set.paths,
            rank_ids=() if ranks is None else tuple(ranks),
            ann_cols=ann_cols,
        )


# Attributes the columnar decoder extracts (everything the builder reads).
WANT_ATTRS = frozenset(_SCANNED | set(ANNOTATION_COLUMNS) | _ROOFLINE)


def build_program(
    trace_set: TraceSet,
    groups: ProcessGroups,
    compute: ComputeModel | None,
    config: ReplayConfig,
    *,
    release: bool = True,
    ranks: Sequence[int] | None = None,
    columns: Callable[[int], tuple[RankColumns, int] | None] | None = None,
) -> Program:
    """Flatten every rank's nodes (or only `ranks`, for a folded replay) into a Program.

    `columns` (rank -> decoded columns and the file's index in them, or None) takes the columnar path
    (replay/build_fast.py) for every rank it can; the others are decoded with protobuf and built node by
    node here, with the same results.
    """
    from replay.build_fast import fast_rank

    compute = compute or DurationModel(exact=config.durations != "micros")
    b = _Builder(groups, compute, config, trace_set.num_ranks)
    rank_list = range(trace_set.num_ranks) if ranks is None else ranks
    for rank in rank_list:
        col = columns(rank) if columns is not None else None
        if col is not None and fast_rank(b, rank, col[0], col[1]):
            continue
        _slow_rank(b, trace_set, rank)
        if release:
            trace_set.release(rank)
    return b.program(trace_set, ranks, compute.name)


def _slow_rank(b: _Builder, trace_set: TraceSet, rank: int) -> None:
    """One rank built node by node from its protobuf messages."""
    compute, config = b.compute, b.config
    fast_duration, fast_roofline, exact = b.fast_duration, b.fast_roofline, b.exact
    ef = trace_set.load(rank)
    path = ef.path
    nodes = ef.nodes
    ids = [n.id for n in nodes]
    if any(a >= c for a, c in zip(ids, ids[1:], strict=False)):  # usually already ascending
        nodes = sorted(nodes, key=lambda n: n.id)
        ids = [n.id for n in nodes]
    base = b.n
    id_to_l: dict[int, int] = {}
    for i, nid in enumerate(ids):
        if nid in id_to_l:
            raise TraceGraphError(f"duplicate node id {nid}", path=path, rank=rank, node_id=nid)
        id_to_l[nid] = i
    q_cpu, q_comp, q_comm = b.rank_queues(rank)
    stream_q: dict[int, int] = {}
    fwd: dict[int, list[int]] = {}
    forward = False
    names: list[str] = []
    kinds: list[int] = []
    durs: list[int] = []
    ndeps: list[int] = []
    children: list[list[int]] = []
    queue: list[int] = []
    recorded: list[int] = []
    nbytes: list[int] = []
    ctypes: list[int] = []
    pgs: list[str | None] = []
    empty: list[int] = []
    for i, node in enumerate(nodes):
        g = base + i
        nid = ids[i]
        nt = node.type
        problem = node_problem(node)  # the one attribute rule of info, validate and replay
        if problem is not None:
            raise TraceGraphError(problem, path=path, rank=rank, node_id=nid)
        names.append(node.name)
        # One pass over the attributes.
        cpu = r_cpu = r_slow = False
        stream = r_ops = r_size = r_dur = None
        a_ct = a_size = a_src = a_dst = a_tag = a_pg = None
        vals = None
        attrs = node.attr
        # Slicing a upb repeated field is ~5x faster than iterating it (measured, scripts/bench_replay.py).
        seen = 0  # bits of _SCAN_BIT: a scanned name given twice is an error, as in traces.attrs readers
        for a in attrs[:] if len(attrs) else ():
            an = a.name
            if an in _SCANNED:
                bit = _SCAN_BIT[an]
                if seen & bit:
                    raise duplicate_attr_error(an, path=path, rank=rank, node_id=nid)
                seen |= bit
                kind = a.WhichOneof("value")
                v = getattr(a, kind) if kind in _SCALAR_KINDS else None
                if an == IS_CPU_OP:
                    cpu = bool(v) if not isinstance(v, str) else False
                    # RooflineModel's own reading (_roofline_attrs): bool and integer kinds only.
                    r_cpu = bool(v) if kind == "bool_val" or kind in INT_KINDS else False
                elif an == STREAM:
                    stream = v
                elif an == COMM_TYPE:
                    a_ct = v
                elif an == COMM_SIZE:
                    a_size = v
                elif an == COMM_SRC:
                    a_src = v
                elif an == COMM_DST:
                    a_dst = v
                elif an == COMM_TAG:
                    a_tag = v
                elif an == PG_NAME or (an == "comm_group" and a_pg is None):
                    a_pg = v if isinstance(v, str) else (None if v is None else str(int(v)))
                elif an == DURATION_NS and r_dur is None and kind in INT_KINDS and exact:
                    r_dur = v
            elif an in ANNOTATION_COLUMNS:
                if vals is None:
                    vals = {}
                if an not in vals:  # the first occurrence wins, even when it holds no scalar
                    kind = a.WhichOneof("value")
                    vals[an] = getattr(a, kind) if kind in _SCALAR_KINDS else None
            elif an in _ROOFLINE and fast_roofline:
                kind = a.WhichOneof("value")
                if kind in INT_KINDS:
                    if an == NUM_OPS:
                        r_ops = getattr(a, kind)
                    else:
                        r_size = getattr(a, kind)
                elif kind in FLOAT_KINDS:
                    r_slow = True  # int(float) may raise: let duration_ns do it, at the same point
        if vals is not None:
            b.ann[g] = {
                k: (str(v) if ANNOTATION_COLUMNS[k] == "str" else _ann_int(v, k, path, rank, nid))
                for k, v in vals.items()
                if v is not None
            }
        # replay_duration_ns, inlined: xsim's exact duration_ns when present (and read), else duration_micros.
        rec = (r_dur if r_dur is not None and r_dur >= 0 else node.duration_micros * 1000) or 1
        recorded.append(rec)
        size = 0
        ct = -1
        pgn = comm_stream = None
        where = {"path": path, "rank": rank, "node_id": nid}
        # Kind, duration and slot.
        if nt == pb.COMP_NODE:
            kind = K_CPU if cpu else K_COMP
            if fast_duration:
                d = rec
            elif fast_roofline and not r_slow:
                d = compute.comp_duration_ns(rank, r_cpu, r_ops, r_size, rec)
            else:
                d = compute.duration_ns(rank, node)
            if not isinstance(d, int) or d < 0:
                raise ReplayError(
                    f"compute model {compute.name!r} gave {d!r} ns for {node.name!r}: need int >= 0"
                )
        elif cpu and nt in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
            # Old PyTorch converters label the host-side c10d:: call of a collective as a comm node with
            # is_cpu_op; its GPU kernel is the real collective. ASTRA-sim throws here; xsim replays the
            # host call on the CPU by its duration.
            kind, d = K_CPU, rec
        elif nt in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
            kind, d, size, ct, pgn, comm_stream = b.comm(
                nt, rank, g, rec, where, a_ct, a_size, a_src, a_dst, a_tag, a_pg
            )
        elif nt == pb.MEM_LOAD_NODE or nt == pb.MEM_STORE_NODE:
            kind = K_MEM
            d = rec if fast_duration else compute.duration_ns(rank, node)
        else:  # METADATA, INVALID and values outside the enum complete in 0 ns, as in ASTRA-sim
            kind, d = K_ZERO, 0
        kinds.append(kind)
        durs.append(d)
        nbytes.append(size)
        ctypes.append(ct)
        pgs.append(pgn)
        # Queue.
        if kind == K_RECV or kind == K_ZERO:
            q = -1
        elif config.honour_stream and stream is not None and kind != K_CPU:
            q = stream_q.get(stream)
            if q is None:
                q = stream_q[stream] = len(b.queue_cap)
                b.queue_cap.append(1)
                b.queue_label.append(f"rank {rank} stream {stream}")
        elif kind == K_COMP:
            q = q_comp
        elif kind == K_CPU:
            q = q_cpu
        else:
            q = b.comm_queue(rank, kind, comm_stream, q_comm)
        queue.append(q)
        # Dependencies (data and ctrl, as FeederV3).
        dd = node.data_deps[:]
        cd = node.ctrl_deps[:] if len(node.ctrl_deps) else None
        if cd:
            deps = set(dd)
            for dep in cd:
                # A ctrl dep names the calling op; old converters keep it when the caller was not
                # converted, or name the node itself. Such a dep can never finish: it is dropped and
                # counted (summary key ignored_ctrl_deps), not fatal. Data deps get no such leniency.
                if dep in id_to_l and dep != nid:
                    deps.add(dep)
                elif dep not in deps:
                    b.ignored_ctrl += 1
        elif len(dd) > 1:
            deps = set(dd)
        else:
            deps = dd
        ndeps.append(len(deps))
        children.append(empty)
        for dep in deps:
            p = id_to_l.get(dep)
            if p is None:
                raise TraceGraphError(f"data dependency on node {dep}, which is not in the file", **where)
            if dep >= nid:
                if dep == nid:
                    raise TraceGraphError("node depends on itself", **where)
                forward = True
            if p > i:
                # Forward edge: the parent's entry does not exist yet; attach it after the rank.
                fwd.setdefault(p, []).append(i)
                continue
            ch = children[p]
            if ch is empty:
                children[p] = [i]
            else:
                ch.append(i)
    _attach(children, fwd, empty)
    if forward:
        cyc = _cycle_ids(ids, children, ndeps)
        if cyc and config.ctrl_deps == "auto" and any(n.ctrl_deps for n in nodes):
            # The ctrl deps close a cycle (old converters write caller<->kernel pairs): fall back, for
            # this rank, to data deps alone, the legacy Chakra ETFeeder's rule. Counted in the summary.
            _data_only_edges(nodes, id_to_l, children, ndeps, empty)
            b.ctrl_ignored_ranks += 1
            cyc = _cycle_ids(ids, children, ndeps)
        if cyc:
            shown = ", ".join(map(str, cyc[:10])) + (" ..." if len(cyc) > 10 else "")
            raise TraceGraphError(
                f"dependency cycle: {len(cyc)} node(s) can never become ready (ids {shown})",
                path=path,
                rank=rank,
            )
    counts = np.fromiter((len(c) for c in children), dtype=np.int64, count=len(children))
    cidx = np.fromiter((base + c for ch in children for c in ch), dtype=np.int64, count=int(counts.sum()))
    b.add_rank(
        {
            "node_id": np.asarray(ids, dtype=np.int64) if ids else np.zeros(0, np.int64),
            "node_type": np.fromiter((n.type for n in nodes), dtype=np.int64, count=len(nodes)),
            "kind": np.asarray(kinds, dtype=np.int8),
            "dur": _int64(durs, rank, path),
            "ndeps": np.asarray(ndeps, dtype=np.int64),
            "queue": np.asarray(queue, dtype=np.int64),
            "recorded": _int64(recorded, rank, path),
            "nbytes": _int64(nbytes, rank, path),
            "ctype": np.asarray(ctypes, dtype=np.int64),
        },
        names,
        pgs,
        counts,
        cidx,
    )
    b.null_annotations(len(nodes))


INT64_MAX = 2**63 - 1


def _int64(values: list[int], rank: int, path: str) -> np.ndarray:
    """int64 array of ns / byte values; past int64 (a corrupt duration) an object array, so the run
    still reports the overflow where it always did (simulation._check_int64)."""
    try:
        return np.asarray(values, dtype=np.int64) if values else np.zeros(0, np.int64)
    except OverflowError:
        return np.asarray(values, dtype=object)


def _ann_int(v, name: str, path: str, rank: int, nid: int) -> int | None:
    """An integer annotation (layer, stage, ...): None for a string; NaN, inf or past int64 is an error."""
    if isinstance(v, str):
        return None
    if isinstance(v, float) and not math.isfinite(v) or not -INT64_MAX - 1 <= v <= INT64_MAX:
        raise TraceGraphError(f"{name} {v!r} is not an int64 integer", path=path, rank=rank, node_id=nid)
    return int(v)


def _int(v, what: str, where: dict) -> int:
    if isinstance(v, str) or isinstance(v, float) and not v.is_integer():  # NaN and inf included
        raise TraceGraphError(f"comm_{what} {v!r} is not an integer", **where)
    return int(v)


def _size(v, where: dict) -> int:
    if v is None:
        raise TraceGraphError("communication node without comm_size", **where)
    if isinstance(v, str) or isinstance(v, float) and not v.is_integer():  # NaN and inf included
        raise TraceGraphError(f"comm_size {v!r} is not an integer number of bytes", **where)
    v = int(v)
    if v < 0:
        raise TraceGraphError(f"comm_size {v} is negative", **where)
    return v
