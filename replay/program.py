"""The replay program: every node of a trace set flattened once into plain per-node lists for the engine.

Nodes get a global index g, rank by rank and, within a rank, in ascending node id, so "issue ready nodes
in ascending id" is "pop the smallest g" from a per-queue heap of ints. Every rank is built from its
columns by replay/build.py (attributes read once, from columns); the event loop never touches a protobuf
message.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import repeat

import numpy as np
from xsim.replay.compute import ComputeModel, DurationModel
from xsim.replay.config import ReplayConfig
from xsim.traces import pb
from xsim.traces.attrs import (
    CHUNK,
    COMM_DST,
    COMM_SIZE,
    COMM_SRC,
    COMM_TAG,
    COMM_TYPE,
    DEVICE_GROUP,
    DURATION_NS,
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
)
from xsim.traces.columnar import RankColumns
from xsim.traces.groups import ALL_RANKS_NAMES, ProcessGroups
from xsim.traces.traceset import TraceSet

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
# Read for RooflineModel.comp_duration_ns (the roofline model's inputs, read in the same pass).
_ROOFLINE = frozenset({NUM_OPS, TENSOR_SIZE})
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


class NodeStrings(Sequence):
    """Per-node strings held as int32 codes into a table of distinct strings (code -1: None): a name list
    costs 8 bytes a slot plus a string object per decoded node (~80 B), a code 4 bytes; the text is
    decoded only where a table or a message needs it (`series`, indexing)."""

    __slots__ = ("codes", "table")

    def __init__(self, codes: np.ndarray, table: list[str]) -> None:
        self.codes = codes
        self.table = table

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, g):
        if isinstance(g, slice):
            return [None if c < 0 else self.table[c] for c in self.codes[g].tolist()]
        c = self.codes[g]
        return None if c < 0 else self.table[c]

    def __iter__(self):
        lut = [*self.table, None]  # code -1 reads the trailing None
        return map(lut.__getitem__, self.codes.tolist())

    def series(self):
        """The strings as a polars String Series (null for code -1): the table gathered by code."""
        import polars as pl

        lut = pl.Series([*self.table, None], dtype=pl.String)
        return lut.gather(np.where(self.codes < 0, len(self.table), self.codes))


def strings_series(v):
    """A polars String Series of per-node strings held as NodeStrings or as a list."""
    import polars as pl

    return v.series() if isinstance(v, NodeStrings) else pl.Series(v, dtype=pl.String)


class _Table(dict):
    """Distinct strings -> their codes, in first-seen order."""

    def code(self, s: str | None) -> int:
        """The code of s (-1 for None), adding it when new."""
        if s is None:
            return -1
        c = self.get(s)
        if c is None:
            c = self[s] = len(self)
        return c

    def codes(self, strs: list) -> np.ndarray:
        """The int32 codes of these strings, as code() on each in order gives them (new strings are
        coded in first-seen order), each distinct string coded once."""
        # Known strings are looked up in C (map; -2: not known); only the new ones and None go through
        # code(), in order.
        got = np.fromiter(map(self.get, strs, repeat(-2)), dtype=np.int32, count=len(strs))
        for i in np.flatnonzero(got == -2).tolist():
            got[i] = self.code(strs[i])
        return got

    def strings(self) -> list[str]:
        """The distinct strings in code order."""
        return list(self)


@dataclass
class Program:
    """Flattened trace set. Lists are indexed by global node index g unless named otherwise."""

    num_ranks: int
    rank_offset: list[int]  # rank r owns g in [rank_offset[r], rank_offset[r+1])
    node_id: list[int]
    name: NodeStrings | list[str]  # NodeStrings from replay/build.py; tests/program_reference.py: a list
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
    pg_name: NodeStrings | list[str | None]
    coll: dict[int, CollInfo]
    p2p: dict[int, P2PInfo]
    annotations: dict[
        int, dict
    ]  # g -> {annotation column: value}: tests/program_reference.py fills it (replay/build.py fills ann_cols)
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
            elif isinstance(v, NodeStrings):
                total += v.codes.nbytes + sum(sys.getsizeof(x) for x in v.table)
        if isinstance(self.name, list):  # an upper bound: shared strings count per node
            total += sum(sys.getsizeof(x) for x in self.name)
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


class _Builder:
    """Accumulates the program rank by rank (columns of numpy chunks, queues, matching infos); replay/build.py
    fills it."""

    def __init__(self, groups: ProcessGroups, compute: ComputeModel, config: ReplayConfig, n_ranks: int):
        self.groups = groups
        self.compute = compute
        self.config = config
        self.n_ranks = n_ranks
        self.measured = config.comm_mode == "measured"
        self.tcomm_types = config.duration_comm_types
        # ReplayConfig.durations: "micros" ignores xsim's exact duration_ns (ASTRA-sim reads duration_micros).
        self.exact = config.durations != "micros"
        self.n = 0
        self.rank_offset = [0]
        self.chunks: dict[str, list[np.ndarray]] = {
            k: []
            for k in ("node_id", "node_type", "kind", "dur", "ndeps", "queue", "recorded", "nbytes", "ctype")
        }
        self.child_counts: list[np.ndarray] = []
        self.child_idx: list[np.ndarray] = []
        self.names: list[np.ndarray] = []  # per rank: int32 codes into name_table
        self.pgs: list[np.ndarray] = []  # per rank: int32 codes into pg_table (-1: None)
        self.name_table = _Table()
        self.pg_table = _Table()
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
        self.memo: dict = {}  # the compute model's caches for this build (RankView.memo)
        self.bad_duration = None  # the value of the first bad duration found (build._kinds)
        self.batch: tuple | None = None  # (decoded columns, what replay/build.py computed for them)
        self.deps_cache: dict[tuple, object] = {}  # replay/build.py's edges by the rank's ids and deps

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

    def add_rank(self, cols: dict[str, np.ndarray], names, pgs, counts, cidx) -> None:
        """Append one rank's columns (names and process-group names: int32 codes into the builder's
        tables, or the strings; children as per-node counts and flat global indices)."""
        for k, v in cols.items():
            self.chunks[k].append(v)
        # Strings (tests/program_reference.py's node-by-node builder) are coded here.
        if not isinstance(names, np.ndarray):
            names = np.fromiter(map(self.name_table.code, names), dtype=np.int32, count=len(names))
        if not isinstance(pgs, np.ndarray):
            pgs = np.fromiter(map(self.pg_table.code, pgs), dtype=np.int32, count=len(pgs))
        self.names.append(names)
        self.pgs.append(pgs)
        self.child_counts.append(counts)
        self.child_idx.append(cidx)
        self.n += len(names)
        self.rank_offset.append(self.n)

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
            name=NodeStrings(_codes(self.names), self.name_table.strings()),
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
            pg_name=NodeStrings(_codes(self.pgs), self.pg_table.strings()),
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


def _codes(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int32, copy=False) if parts else np.zeros(0, dtype=np.int32)


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

    `columns` (rank -> decoded columns and the file's index in them, or None) gives the ranks' columns;
    a rank it has none for (a JSON trace, a form the columnar decoder declines, or no `columns` at all) is
    decoded with protobuf into the same columns. Every rank is built by replay/build.py:build_rank.
    """
    from xsim.replay.build import build_rank

    compute = compute or DurationModel(exact=config.durations != "micros")
    b = _Builder(groups, compute, config, trace_set.num_ranks)
    rank_list = range(trace_set.num_ranks) if ranks is None else ranks
    for rank in rank_list:
        col = columns(rank) if columns is not None else None
        if col is None:
            from xsim.traces.node_columns import columns_from_nodes  # sets the columnar decoder leaves

            col = (columns_from_nodes(trace_set.load(rank).nodes, trace_set.paths[rank], WANT_ATTRS), 0)
        build_rank(b, rank, col[0], col[1])
        if release:
            trace_set.release(rank)
    return b.program(trace_set, ranks, compute.name)
