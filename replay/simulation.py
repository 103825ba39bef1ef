"""`simulate`: replay a trace set on a network model and a compute model (contract F)."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
from xsim.netmodels.api import NetworkModel
from xsim.replay.compute import ComputeModel, DurationModel, with_exact
from xsim.replay.config import ReplayConfig, resolve_durations, resolve_streams
from xsim.replay.engine import run_engine
from xsim.replay.errors import FoldRefused, ReplayError
from xsim.replay.heap import return_freed_heap
from xsim.replay.program import K_COLL, K_RECV, K_SEND, WANT_ATTRS, build_program
from xsim.replay.progress import progress_bar
from xsim.replay.result import ReplayResult, build_result
from xsim.traces import pb
from xsim.traces.classes import CLASSES_FILE
from xsim.traces.columnar import RankColumns, Unsupported, decode_columns
from xsim.traces.groups import ProcessGroups, resolve_groups
from xsim.traces.jsonview import is_json_file
from xsim.traces.stream import read_bytes
from xsim.traces.traceset import TraceSet, discover

if TYPE_CHECKING:
    from xsim.replay.fold import Fold, PredictedRanks, RepFile


# Files decoded together as columns: numpy calls amortized over ~12k nodes, and a batch that stays in the
# processor's caches (measured on bench_astra's set: 2 MB batches decode ~1.7x faster than 8 MB ones).
_BATCH_BYTES = 2 << 20


def load_groups(
    trace_set: TraceSet,
    groups: ProcessGroups | Mapping[str, tuple[int, ...]] | str | os.PathLike[str] | None,
    scan: bool = False,
) -> ProcessGroups:
    """Process groups: given ones, a comm-groups file, or those the set declares (METADATA, comm_group.json).

    scan: find METADATA groups from the files' bytes (metadata_groups_files) instead of decoding and
    caching every file.
    """
    n = trace_set.num_ranks
    if isinstance(groups, ProcessGroups):
        return groups
    if isinstance(groups, Mapping):
        return ProcessGroups(n, {str(k): tuple(v) for k, v in groups.items()}, "given")
    if scan:
        files = metadata_groups_files(trace_set)
    else:
        files = ((trace_set.paths[r], trace_set.load(r).nodes) for r in range(n))
    return resolve_groups(
        files, n, comm_groups=groups, directory=trace_set.directory, prefix=trace_set.prefix
    )


def metadata_nodes(cols: RankColumns, f: int) -> list[pb.Node]:
    """The METADATA nodes of file f that may declare process groups, decoded whole (few per file)."""
    lo, hi = int(cols.file_ptr[f]), int(cols.file_ptr[f + 1])
    out = []
    for i in (np.nonzero(cols.node_type[lo:hi] == pb.METADATA_NODE)[0] + lo).tolist():
        if "process_group:init" in cols.names[i]:
            out.append(pb.Node.FromString(cols.buf[int(cols.payload_start[i]) : int(cols.payload_end[i])]))
    return out


_GROUPS_MARK = b"process_group:init"  # in the name of every METADATA node that declares groups


class ColumnReader:
    """Ranks' files decoded as columns in batches of ~2 MB, in rank order, one batch held at a time.

    `get(rank)` gives (columns, file index) or None for a file left to protobuf (JSON, or a form the
    columnar decoder does not take). Visiting ranks in ascending order reads every file once. A compact
    set's unwritten ranks, with `derived` (fold.PredictedRanks), take their columns from it, one rank at a
    time: the columns of their predicted bytes without decoding them.
    """

    def __init__(self, trace_set: TraceSet, derived: PredictedRanks | None = None) -> None:
        self.ts = trace_set
        self.batch: dict[int, tuple[RankColumns, int] | None] = {}
        self.next_rank = 0
        self.layouts: dict[int, np.ndarray] = {}  # frame layouts by file size, for decode_columns
        self.derived = derived
        self.written = trace_set.written

    def get(self, rank: int) -> tuple[RankColumns, int] | None:
        """The columns of `rank`'s file (decoding the batch that starts there when needed)."""
        if self.derived is not None and rank not in self.written:
            cols = self.derived.columns(rank, self.ts.paths[rank])
            return None if cols is None else (cols, 0)
        if rank not in self.batch:
            self._load(rank)
        return self.batch[rank]

    def _load(self, first: int) -> None:
        ts = self.ts
        self.batch = {}
        files: list[tuple[int, bytes]] = []
        size = 0
        r = first
        while r < ts.num_ranks and size < _BATCH_BYTES:
            path = ts.paths[r]
            if self.derived is not None and r not in self.written:
                pass  # derived rank by rank (get)
            elif is_json_file(path):
                self.batch[r] = None
            else:
                buf = ts.read(r)
                files.append((r, buf))
                size += len(buf)
            r += 1
        if not files:
            return
        try:
            bufs, paths = [b for _r, b in files], [ts.paths[r] for r, _b in files]
            cols = decode_columns(bufs, paths, WANT_ATTRS, layouts=self.layouts)
            for f, (r, _b) in enumerate(files):
                self.batch[r] = (cols, f)
        except Unsupported:
            for r, buf in files:  # find the files that need protobuf; the others keep their columns
                try:
                    self.batch[r] = (
                        decode_columns([buf], [ts.paths[r]], WANT_ATTRS, layouts=self.layouts),
                        0,
                    )
                except Unsupported:
                    self.batch[r] = None


class RepColumns:
    """The representatives' files of a folded build, decoded as columns with field spans ~2 MB at a time in
    the order build_program asks for them (`get`), one batch held at a time. Once the build moves past a
    batch each of its files is kept only as what its byte template reads (`files`: fold.RepFile), so the
    batch's names, dependencies and other attributes go: ~0.3 KiB a representative node less held while
    the rest is built and verified (docs/performance.md, round 24t)."""

    def __init__(self, trace_set: TraceSet, ranks: Sequence[int]) -> None:
        self.ts = trace_set
        self.ranks = list(ranks)
        self.at = {r: p for p, r in enumerate(self.ranks)}
        self.batch: dict[int, tuple[RankColumns, int, bytes, int] | None] = {}  # (cols, file, bytes, base)
        self.cut: dict[int, RepFile | None] = {}
        self.layouts: dict[int, np.ndarray] = {}

    def get(self, rank: int) -> tuple[RankColumns, int] | None:
        """build_program's `columns`: `rank`'s columns and file index (None: a file left to protobuf)."""
        if rank not in self.batch:
            self._load(self.at[rank])
        e = self.batch[rank]
        return None if e is None else (e[0], e[1])

    def files(self) -> dict[int, RepFile | None]:
        """Each rank's file as its template reads it (None: left to protobuf), decoding any not asked for."""
        for p, r in enumerate(self.ranks):
            if r not in self.cut and r not in self.batch:
                self._load(p)
        self._cut_batch()
        return self.cut

    def _cut_batch(self) -> None:
        from xsim.replay.fold import rep_file

        for r, e in self.batch.items():
            self.cut[r] = None if e is None else rep_file(*e)
        self.batch = {}

    def _load(self, p: int) -> None:
        from xsim.replay.fold import TEMPLATE_ATTRS

        self._cut_batch()
        ts, files, size = self.ts, [], 0
        while p < len(self.ranks) and size < _BATCH_BYTES:
            r = self.ranks[p]
            p += 1
            if is_json_file(ts.paths[r]):
                self.batch[r] = None
                continue
            buf = ts.read(r)  # a rank-class set folded by DP only: its unwritten ranks' derived bytes
            files.append((r, buf))
            size += len(buf)
        try:
            cols = decode_columns(
                [b for _r, b in files], [ts.paths[r] for r, _b in files], WANT_ATTRS, spans=TEMPLATE_ATTRS,
                layouts=self.layouts,
            )  # fmt: skip
            base = 0
            for f, (r, b) in enumerate(files):
                self.batch[r] = (cols, f, b, base)
                base += len(b)
        except Unsupported:
            for r, b in files:
                try:
                    one = decode_columns([b], [ts.paths[r]], WANT_ATTRS, spans=TEMPLATE_ATTRS)
                    self.batch[r] = (one, 0, b, 0)
                except Unsupported:
                    self.batch[r] = None


def compact_source(
    ts: TraceSet, pgs: ProcessGroups, compute, config: ReplayConfig, columns: bool = False
) -> PredictedRanks:
    """The unwritten ranks' file bytes of a compact set, for an unfolded replay: their representatives'
    files with their labels swapped in (by construction what `xsim gen
    --all-ranks` writes; replay/fold.py, predicted_files). With `columns`, also those files' columns
    (`PredictedRanks.columns`), from each representative's file decoded alone."""
    from xsim.replay.fold import predicted_files, resolve_fold

    plan = resolve_fold("auto", ts)
    reps = RepColumns(ts, plan.replicas[0])
    prog = build_program(ts, pgs, compute, config, release=False, ranks=plan.replicas[0], columns=reps.get)
    pred = predicted_files(plan, pgs, prog, reps.files())
    if columns:
        rep_cols: dict[int, RankColumns | None] = {}
        for r in plan.replicas[0]:
            rep_cols[r] = None
            if not is_json_file(ts.paths[r]):
                try:
                    rep_cols[r] = decode_columns([ts.read(r)], [ts.paths[r]], WANT_ATTRS)
                except Unsupported:
                    pass  # its ranks' files are decoded with protobuf, as the representative's is
        pred.rep_columns = rep_cols
    return pred


def metadata_groups_files(trace_set: TraceSet):
    """(path, METADATA nodes that may declare groups) per rank, for resolve_groups: a file whose bytes
    hold no `process_group:init` cannot declare any and is not decoded here."""
    for r in trace_set.written:  # a compact set's other ranks mirror these (traces/classes.py)
        path = trace_set.paths[r]
        if is_json_file(path):
            yield path, trace_set.load(r).nodes
            continue
        buf, _gz = read_bytes(path)
        if _GROUPS_MARK not in buf:
            yield path, []
            continue
        try:
            cols = decode_columns([buf], [path], WANT_ATTRS)
            yield path, metadata_nodes(cols, 0)
        except Unsupported:
            yield path, trace_set.load(r).nodes


@dataclass(frozen=True)
class _Replay:
    """What one replay runs on: simulate()'s arguments with the trace set discovered, and its start time."""

    ts: TraceSet
    network: NetworkModel | None
    compute: ComputeModel | None
    groups: ProcessGroups | Mapping[str, tuple[int, ...]] | str | os.PathLike[str] | None
    config: ReplayConfig | None
    progress: bool | Callable[[int, int], None]
    t0: float


def simulate(
    trace_set: TraceSet | str | os.PathLike[str],
    *,
    network: NetworkModel | None,
    compute: ComputeModel | None = None,
    groups: ProcessGroups | Mapping[str, tuple[int, ...]] | str | os.PathLike[str] | None = None,
    config: ReplayConfig | None = None,
    progress: bool | Callable[[int, int], None] = False,
    fold: bool | str | Fold | Sequence[Sequence[int]] | None = None,  # noqa: F821
) -> ReplayResult:
    """Replay every node of the set; returns the ops / ranks / collectives / summary tables.

    fold (replay/fold.py, docs/replay.md): "auto" folds the DP replicas of the deployment.json beside the
    traces (else every rank alike) when the fold is proven and replays unfolded when it is not, the
    result's `fold_status` / `fold_reason` saying which and why; True (the same candidate), "tp" (its TP
    positions), a Fold or a list of replicas demand the fold: refused (FoldRefused) unless proven. Only
    one replica is simulated; the tables equal an unfolded replay's; `fold_factor` says by how much.
    """
    t0 = time.perf_counter()
    ts = trace_set if isinstance(trace_set, TraceSet) else discover(trace_set, compact=True)
    run = _Replay(ts, network, compute, groups, config, progress, t0)
    if not (isinstance(fold, str) and fold == "auto"):
        return _simulate(run, fold)
    # Folding as a wrapper: the proven fold, or (its proof failed) the same replay unfolded. The refused
    # attempt's program is dropped with its frame before the unfolded one is built (only the message is
    # kept, not the exception and its traceback).
    # The attempt runs on a private copy of the network model: a proof that fails inside the event loop
    # (NetCheck) leaves transfers pending in the model it ran on.
    # (A model that cannot fold is refused before it is used: no copy.)
    from xsim.netmodels.models import capabilities_of
    from xsim.replay.fold import private_model

    reason = None
    try:
        foldable = network is not None and capabilities_of(network).foldable
        attempt = private_model(network) if foldable else network
        return _simulate(replace(run, network=attempt), True)
    except FoldRefused as exc:
        reason = str(exc)
    if ts.classes is not None and (w := ts.classes.width) > 1 and len(ts.classes.replicas) > w:
        try:  # a rank-class set whose TP positions are not alike here: its DP replicas may still be
            attempt = private_model(network) if foldable else network
            return _simulate(replace(run, network=attempt), "dp")
        except FoldRefused as exc:
            reason = str(exc)
    res = _simulate(run, None)
    res.fold_status, res.fold_reason = "unfolded", reason
    return res


@dataclass(frozen=True)
class _Built:
    """A replay's program: the trace set it read (a compact set's with its derived files), its groups, the
    program and, folded, the fold plan and the proof's labels."""

    ts: TraceSet
    pgs: ProcessGroups
    prog: object  # replay.program.Program
    plan: object | None  # replay.fold.FoldPlan
    labels: object | None


def _simulate(run: _Replay, fold) -> ReplayResult:
    """One replay: folded (fold given: proven or FoldRefused) or not (fold None)."""
    network, ts = run.network, run.ts
    config = resolve_streams(run.config or ReplayConfig(), network.name if network is not None else None)
    config = resolve_durations(config, network)
    compute = with_exact(run.compute or DurationModel(), config.durations != "micros")
    if network is not None and network.num_ranks < ts.num_ranks:
        raise ReplayError(
            f"network model {network.name!r} has {network.num_ranks} ranks but the trace set has {ts.num_ranks}"
        )
    plan = _fold_plan(fold, run, compute, config)
    # The program holds millions of small lists and ints and no reference cycles: the cyclic GC would
    # rescan them over and over (measured: 5.9 s -> 3.3 s to build 1M nodes), so it is paused here.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        built = _build(run, plan, compute, config)
        prog, ts = built.prog, built.ts
        if prog.num_nodes == 0:
            # An iteration time of 0 would look like a result; an empty set is almost always a wrong path.
            raise ReplayError(f"{ts.prefix}: the trace set has no nodes on any of its {ts.num_ranks} rank(s)")
        if config.comm_mode == "measured":
            _check_measured(prog, ts)
        if plan is not None or ts.classes is not None:
            return_freed_heap()  # the representatives' columns and templates, freed (replay/heap.py)
        run_net = network
        if plan is not None and network is not None and config.comm_mode != "measured":
            from xsim.replay.fold import fold_checked

            run_net = fold_checked(network, plan, built.pgs)  # the network-side proof, as a model decorator
        if callable(run.progress):
            out = run_engine(prog, run_net, config, run.progress)
        else:
            with progress_bar(enabled=bool(run.progress)) as cb:
                out = run_engine(prog, run_net, config, cb)
        _check_int64(prog, out, ts)
        res = _tables(built, out, network.name if network is not None else "none", config, run.t0)
        _mark_fold(res, fold, plan)
        return res
    finally:
        if gc_was_enabled:
            gc.enable()


def _fold_plan(fold, run: _Replay, compute: ComputeModel, config: ReplayConfig):
    """The fold plan asked for and checked against the models; None unfolded (or one replica)."""
    if fold in (None, False):
        return None
    # Folding (and the model classes it checks) loads only when asked for: start-up of a plain replay.
    from xsim.replay.fold import check_models, resolve_fold

    plan = resolve_fold(fold, run.ts)
    if plan is None or plan.factor == 1:
        return None  # one replica: nothing to fold
    check_models(plan, run.network, compute, config)
    return plan


def _build(run: _Replay, plan, compute: ComputeModel, config: ReplayConfig) -> _Built:
    """The program of every rank, or folded, of the first replica's, with the trace side of the proof."""
    ts = run.ts
    pgs = load_groups(ts, run.groups, scan=True)
    if plan is None:
        # A compact set: its other ranks' files derived. The source (replica 0's columns, bytes, program
        # and templates) is read only while building: not kept for the run (~0.8 KiB per replica-0 node,
        # docs/performance.md round 24w).
        derived = compact_source(ts, pgs, compute, config, columns=True) if ts.classes is not None else None
        src = ts.with_source(derived) if derived is not None else ts
        prog = build_program(src, pgs, compute, config, columns=ColumnReader(src, derived).get)
        del derived, src
        return _Built(ts, pgs, prog, None, None)
    from xsim.replay.fold import verify

    if ts.classes is not None and ts.classes.width > plan.width:  # folded by DP only
        ts = ts.with_source(compact_source(ts, pgs, compute, config))
    reps = RepColumns(ts, plan.replicas[0])
    prog = build_program(ts, pgs, compute, config, release=False, ranks=plan.replicas[0], columns=reps.get)
    labels = verify(plan, ts, pgs, prog, reps.files())
    del reps
    return _Built(ts, pgs, prog, plan, labels)


def _tables(built: _Built, out, name: str, config: ReplayConfig, t0: float) -> ReplayResult:
    """The result tables: built from the run, or folded, every rank's rows from its representative's."""
    prog, plan = built.prog, built.plan
    if plan is not None:  # expand: every rank's rows derived from its representative's, streamed
        from xsim.replay.fold_tables import FoldedTables

        res = FoldedTables(plan, built.pgs, prog, out, built.labels, built.ts.paths).result(
            network_name=name, comm_mode=config.comm_mode, sim_wall_s=time.perf_counter() - t0
        )
    else:
        res = build_result(
            prog, out, network_name=name, comm_mode=config.comm_mode, sim_wall_s=time.perf_counter() - t0
        )
    res.ranks_simulated = prog.num_ranks
    res.fold_factor = plan.factor if plan is not None else 1
    return res


def _mark_fold(res: ReplayResult, fold, plan) -> None:
    """A replay that was asked to fold says whether it did, and why."""
    if fold in (None, False):
        return
    res.fold_status = "folded" if plan is not None else "unfolded"
    res.fold_reason = (
        (
            f"{plan.factor} {'rank classes' if plan.positions else 'replicas'} alike by construction "
            f"({CLASSES_FILE})"
            if plan.by_construction
            else f"{plan.factor} replicas proven alike ({plan.source})"
        )
        if plan is not None
        else "one replica: nothing to fold"
    )


INT64_MAX = 2**63 - 1  # the result tables hold nanoseconds as int64


def _check_int64(prog, out, ts: TraceSet) -> None:
    """Refuse times past int64 ns (~292 years): a corrupt duration_micros, not a result to tabulate."""
    if isinstance(out.end, np.ndarray) or not out.end or max(out.end) <= INT64_MAX:
        return  # the engine returns int64 arrays only when every time fits
    g = max(range(len(out.end)), key=out.end.__getitem__)
    raise ReplayError(
        f"{ts.paths[prog.rank_of(g)]}, {prog.describe(g)}: simulated end time {out.end[g]} ns overflows "
        "int64 nanoseconds (corrupt duration_micros?)"
    )


def _check_measured(prog, ts: TraceSet) -> None:
    """Measured communication needs recorded durations: with none at all (a generated trace), every
    collective would take 1 ns and the run would "succeed" with a meaningless iteration time."""
    comm = [g for g, k in enumerate(prog.kind) if k in (K_COLL, K_SEND, K_RECV)]
    if comm and all(prog.recorded_ns[g] <= 1 for g in comm):
        raise ReplayError(
            f"{ts.prefix}: comm mode 'measured', but none of its {len(comm)} communication nodes records a "
            f"duration (duration_micros is 0, e.g. {prog.describe(comm[0])}): time them on a network model"
        )
