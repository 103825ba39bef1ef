"""Layer-wise validation: measured (Kineto) vs simulated time per layer, per op class and per step.

Inputs: the Kineto traces of the real run (one per rank), the result directory of `xsim replay --out` on the
imported trace set, and that trace set (its nodes carry the measured `duration_ns`, `layer`, `module`,
`phase` and `profiler_step` written by the importer).

Identity first (issue 26 item 3): each --real file must be the run the trace set was imported from. One
Kineto file per rank, distinct ranks and processes, each process the one the importer recorded
(`kineto_pids` in the set's metadata), every profiled step of the trace present in the file, and at least
MIN_MATCHED of the rank's ops found in the file at their recorded start (`measured_start_ns` + the rank's
`measured_origin_ns`) under their own name. A mismatch is refused in one line naming the file and rank.

- Step time: measured = `ProfilerStep#N` duration in the rank's Kineto trace; simulated = from the first
  start to the last end of the rank's nodes that started inside step N. Without ProfilerStep events,
  `window` (a time range of the run, or `matched`: its first to last matched op) is the one step compared.
- Per group (layer, op class): measured = from --real, the summed self time of the Kineto events matched to
  the group's nodes (an event's duration less that of the matched events nested directly in it on its
  thread; a collective or P2P op counts its whole event), simulated = sum of their simulated durations;
  summed over ranks. error % = (simulated - measured) / measured x 100; no measured time: no error (None,
  never NaN).

Op classes: attention, mlp, norm, embedding, loss, optimizer, one per collective kind (all_reduce, ...),
other; from the node's module path and phase (rules in `op_class`).
"""

from __future__ import annotations

import bisect
import json
import os
import shutil
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import polars as pl
from xsim.replay.errors import ReplayError
from xsim.traces import pb
from xsim.traces.attrs import attr_dict
from xsim.traces.io import JsonFileError, read_json
from xsim.traces.kineto import KinetoError, KinetoTrace, load_kineto
from xsim.traces.outputs import install_files, staging_dir
from xsim.traces.traceset import TraceSet, discover

TAIL_PREFIX = "xsim::comm_tail:"  # the importer's per-rank late completion of a collective
SYNTHETIC_PREFIX = (
    "xsim::"  # nodes the importer adds (start offset, comm tails): no Kineto event of their own
)
# Fraction of a rank's ops that must be found in its --real Kineto trace at their recorded start under their
# own name. The bundled runs match 4,172 of 4,174 ops of each rank (99.95%) in their own traces and 3 of
# 4,174 (0.07%) in another run of the same program (tinygpt_pp2): any threshold between separates them; 90%
# leaves room for ops a Kineto ring buffer dropped.
MIN_MATCHED = 0.90
VALIDATION_FILES = frozenset({"layers.csv", "classes.csv", "steps.csv", "validation.json", "validation.png"})
SOURCE_FILE = "source.json"  # written by `xsim replay --out`: {"trace": <prefix it replayed>}
_CLASS_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("attn", "attention", "q_proj", "k_proj", "v_proj", "o_proj")),
    ("mlp", ("mlp", "ffn", "feed_forward", "intermediate", "fc1", "fc2", "c_fc")),
    ("norm", ("norm", "ln", "layernorm", "rmsnorm", "bn")),
    ("embedding", ("embed", "wte", "wpe", "tok_emb", "pos_emb")),
    ("loss", ("loss", "criterion")),
)


def op_class(module: str, phase: str, name: str, comm_type: str | None) -> str:
    """Validation class of an op: a collective kind, optimizer, or the module family it belongs to."""
    if comm_type:
        return comm_type.lower()
    if phase == "opt":
        return "optimizer"
    parts = [p for p in module.lower().replace("/", ".").split(".") if p]
    for cls, keys in _CLASS_RULES:
        if any(p == k or p.startswith(k) for p in parts for k in keys):
            return cls
    low = name.lower()
    if "cross_entropy" in low or "nll_loss" in low:
        return "loss"
    return "other"


@dataclass(frozen=True)
class Validation:
    """Tables of one validation."""

    layers: pl.DataFrame  # layer, measured_ns, simulated_ns, error_pct
    classes: pl.DataFrame  # op_class, measured_ns, simulated_ns, error_pct
    steps: pl.DataFrame  # rank (-1 = the whole job), step, measured_ns, simulated_ns, error_pct

    matched: tuple[tuple[int, int, int], ...] = ()  # per rank: (rank, ops found in --real, ops compared)

    def step_error_pct(self) -> float | None:
        """Signed % error of the mean step time: the job's steps (rank -1) when several ranks ran; None
        when there is no measured step time (never NaN: it reaches JSON and text)."""
        rows = self.steps.filter(pl.col("rank") == -1)
        if rows.is_empty():
            rows = self.steps
        if rows.is_empty():
            return None
        m = float(rows["measured_ns"].sum())
        s = float(rows["simulated_ns"].sum())
        return (s - m) / m * 100.0 if m else None

    def to_json(self) -> dict:
        """validation.json (and `xsim validate --json`): plain numbers, None for an undefined error."""
        e = self.step_error_pct()
        return {
            "step_error_pct": None if e is None else round(e, 4),
            "matched_ops": [{"rank": r, "matched": m, "compared": n} for r, m, n in self.matched],
            "layers": self.layers.to_dicts(),
            "classes": self.classes.to_dicts(),
            "steps": self.steps.to_dicts(),
        }

    def save(self, out_dir: str | os.PathLike[str], plot: bool = True) -> list[str]:
        """Write layers.csv, classes.csv, steps.csv, validation.json and (with matplotlib) validation.png."""
        try:
            return self._write(os.fspath(out_dir), plot)
        except OSError as exc:
            raise ReplayError(f"{os.fspath(out_dir)}: cannot write: {exc.strerror or exc}") from None

    def _write(self, out: str, plot: bool) -> list[str]:
        # Staged, then renamed into place; a validation.png of an earlier run goes when none is drawn now.
        stage = staging_dir(out)
        try:
            for name, df in (("layers", self.layers), ("classes", self.classes), ("steps", self.steps)):
                df.write_csv(os.path.join(stage, f"{name}.csv"))
            with open(os.path.join(stage, "validation.json"), "w", encoding="utf-8") as fh:
                json.dump(self.to_json(), fh, indent=1, allow_nan=False)
                fh.write("\n")
            if plot:
                plot_validation(self, os.path.join(stage, "validation.png"))
            return install_files(stage, out, VALIDATION_FILES)
        finally:
            shutil.rmtree(stage, ignore_errors=True)


def _err(measured: int, simulated: int) -> float | None:
    return round((simulated - measured) / measured * 100.0, 3) if measured else None


def _table(key: str, rows: dict, key_type: pl.DataType) -> pl.DataFrame:
    data = sorted(rows.items(), key=lambda kv: kv[0])
    return pl.DataFrame(
        {
            key: [k for k, _ in data],
            "measured_ns": [v[0] for _, v in data],
            "simulated_ns": [v[1] for _, v in data],
            "error_pct": [_err(v[0], v[1]) for _, v in data],
        },
        schema={key: key_type, "measured_ns": pl.Int64, "simulated_ns": pl.Int64, "error_pct": pl.Float64},
    )


def kineto_steps(path: str) -> tuple[int | None, dict[int, tuple[int, int]]]:
    """(rank from distributedInfo or None, {N: (start ns, duration ns) of ProfilerStep#N}) of a Kineto trace."""
    k = _load(path)
    return k.rank, {n: (e.ts, e.dur) for n, e in sorted(k.steps.items())}


def _load(path: str) -> KinetoTrace:
    try:
        return load_kineto(path)
    except (JsonFileError, KinetoError) as exc:
        raise ReplayError(f"{path}: not a readable Kineto JSON trace ({exc.reason})") from None


def trace_of(sim_dir: str) -> str:
    """The trace set a result directory was replayed from (its source.json), or a clear error."""
    p = os.path.join(sim_dir, SOURCE_FILE)
    try:
        return str(read_json(p)["trace"])
    except (JsonFileError, KeyError, TypeError):
        raise ReplayError(
            f"{sim_dir}: no {SOURCE_FILE} naming the replayed trace set; pass it with --trace PREFIX"
        ) from None


@dataclass(frozen=True)
class Window:
    """What is compared when the Kineto traces have no ProfilerStep: a time range of the run (ns from the
    origin of `measured_start_ns`, ops that start inside it), an op range (node ids FIRST..LAST of each rank,
    the importer's host-op order) or every matched op (`matched`)."""

    start_ns: int = 0
    end_ns: int | None = None
    matched: bool = False
    ops: tuple[int, int] | None = None

    def holds(self, node_id: int, start_ns: int, matched: bool) -> bool:
        """Whether an op (its node id, its recorded start, found in --real or not) is compared."""
        if self.matched:
            return matched
        if self.ops is not None:
            return self.ops[0] <= node_id <= self.ops[1]
        return self.start_ns <= start_ns and (self.end_ns is None or start_ns < self.end_ns)


def parse_window(text: str) -> Window:
    """`matched`, `ops:FIRST:LAST` (node ids), or `START:END` with time units (`0ms:20ms`; END may be empty)."""
    from xsim.netmodels.errors import UnitError
    from xsim.netmodels.units import parse_time_ns

    if text.strip() == "matched":
        return Window(matched=True)
    if text.startswith("ops:"):
        first, _, last = text[4:].partition(":")
        try:
            lo, hi = int(first), int(last)
        except ValueError:
            raise ReplayError(
                f"--window {text!r}: ops:FIRST:LAST takes two node ids, e.g. ops:100:900"
            ) from None
        if lo < 0 or hi < lo:
            raise ReplayError(f"--window {text!r}: FIRST must be >= 0 and at most LAST")
        return Window(ops=(lo, hi))
    lo, sep, hi = text.partition(":")
    try:
        if not sep:
            raise UnitError("no ':'")
        a = round(parse_time_ns(lo or "0ns"))
        b = round(parse_time_ns(hi)) if hi.strip() else None
    except UnitError as exc:
        raise ReplayError(
            f"--window {text!r}: not 'matched', ops:FIRST:LAST or START:END with units, e.g. 0ms:20ms ({exc})"
        ) from None
    if a < 0 or (b is not None and b <= a):
        raise ReplayError(f"--window {text!r}: START must be >= 0 and before END")
    return Window(a, b)


@dataclass
class _RankMatch:
    """One rank's nodes found in its --real Kineto trace: node id -> (Kineto start, measured ns)."""

    found: dict[int, tuple[int, int, int]]  # node id -> (event ts, event end, measured self time)
    compared: int


def _match_rank(nodes, k: KinetoTrace, origin: int | None, path: str, rank: int, prefix: str) -> _RankMatch:
    """Find each imported op of a rank in the Kineto trace by name at its recorded start; refuse a stranger."""
    by_name: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    for e in (*k.cpu_ops, *k.gpu_ops, *k.comm_threads, *k.runtime):
        by_name[e.name][e.ts].append(e)
    ops = [
        (n, int(a["measured_start_ns"]))
        for n in nodes
        if n.type != pb.METADATA_NODE
        and not n.name.startswith(SYNTHETIC_PREFIX)
        and "measured_start_ns" in (a := attr_dict(n))
    ]
    if origin is None:
        # An import older than `measured_origin_ns`: the origin most of the ops agree on.
        votes: Counter[int] = Counter()
        for n, start in ops[:500]:
            for t in by_name.get(n.name, {}):
                votes[t - start] += 1
        origin = votes.most_common(1)[0][0] if votes else 0
    # Where the importer split an op (at a blocking wait) or timed a device op by its kernel, the node starts
    # inside a same-named event or at a device event's start: found there.
    spans = {
        name: sorted((t, e.end, e.index, e) for t, es in d.items() for e in es) for name, d in by_name.items()
    }
    device: dict[int, list] = defaultdict(list)
    for e in k.gpu_ops:
        device[e.ts].append(e)
    hits: dict[int, tuple[int, object, bool]] = {}  # node id -> (its start on the Kineto clock, event, whole)
    used: set[int] = set()
    for n, start in ops:
        t = origin + start
        e = next((x for x in by_name.get(n.name, {}).get(t, ()) if x.index not in used), None)
        if e is None:
            e = next((x for x in device.get(t, ()) if x.index not in used), None)
        if e is None and n.name in spans:
            row = spans[n.name]
            at = bisect.bisect_right(row, (t, float("inf"))) - 1
            e = row[at][3] if at >= 0 and row[at][0] <= t < row[at][1] else None
        if e is not None:
            if e.ts == t:
                used.add(e.index)
            hits[n.id] = (t, e, n.type in COMM_TYPES)
    if ops and len(hits) < MIN_MATCHED * len(ops):
        raise ReplayError(
            f"{path}: rank {rank}: only {len(hits)} of {len(ops)} ops of {prefix} "
            f"({len(hits) / len(ops):.1%}) are in this Kineto trace at their recorded start: not the run the "
            f"trace set was imported from (another run or rank?; at least {MIN_MATCHED:.0%} needed)"
        )
    # A thread's time, partitioned: each op counts from its start to the start of the thread's next matched
    # op (its exclusive time plus the host overhead before the next op, as the importer times ops); the
    # thread's last op counts to its own end. A collective or P2P op counts its whole event.
    by_thread: dict[tuple, list] = defaultdict(list)
    for nid, (t, e, _) in hits.items():
        by_thread[(e.pid, e.tid)].append((t, e.index, nid, e))
    found: dict[int, tuple[int, int, int]] = {}
    for evs in by_thread.values():
        evs.sort(key=lambda x: (x[0], x[1]))
        for i, (t, _, nid, e) in enumerate(evs):
            nxt = evs[i + 1][0] if i + 1 < len(evs) else e.end
            whole = hits[nid][2]
            found[nid] = (t - origin, e.end - origin, e.dur if whole else max(0, nxt - t))
    return _RankMatch(found, len(ops))


COMM_TYPES = frozenset({pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE})


def _identity(ts: TraceSet, real: Sequence[str]) -> tuple[list[KinetoTrace], list[int | None]]:
    """The --real traces in rank order, and each rank's origin; refuses files that are not this run's."""
    if not real:
        raise ReplayError("no Kineto trace given with --real")
    if len(real) != ts.num_ranks:
        raise ReplayError(
            f"{len(real)} Kineto trace(s) for the {ts.num_ranks}-rank trace set {ts.prefix}: give one --real "
            "file per rank"
        )
    kins = [_load(p) for p in real]
    ranks = [k.rank for k in kins]
    if all(r is not None for r in ranks):
        if sorted(ranks) != list(range(ts.num_ranks)):
            raise ReplayError(
                f"{real[0]}: the --real files are ranks {ranks} (Kineto distributedInfo), not each of "
                f"0..{ts.num_ranks - 1} once"
            )
        kins = [kins[ranks.index(r)] for r in range(ts.num_ranks)]
    meta = attr_dict(ts.load(0).metadata)
    recorded = list(meta.get("kineto_pids", []))
    origins = list(meta.get("measured_origin_ns", []))
    seen: dict[object, str] = {}
    for rank, k in enumerate(kins):
        pid = _main_pid(k)
        if pid is not None and pid in seen:
            raise ReplayError(
                f"{k.path}: recorded by process {pid}, as {seen[pid]} is: one run's rank per file (a file "
                "given twice?)"
            )
        seen[pid] = k.path
        if pid is not None and rank < len(recorded) and recorded[rank] not in (-1, pid):
            raise ReplayError(
                f"{k.path}: recorded by process {pid}, but rank {rank} of {ts.prefix} was imported from "
                f"process {recorded[rank]}'s trace: another run"
            )
    return kins, [int(origins[r]) if r < len(origins) else None for r in range(ts.num_ranks)]


def _main_pid(k: KinetoTrace) -> object:
    """The process that recorded a Kineto trace: its CPU ops' most common pid (None when it has none)."""
    pids = Counter(e.pid for e in k.cpu_ops)
    return pids.most_common(1)[0][0] if pids else None


def _check_same_set(sim: str, ts: TraceSet) -> None:
    """Refuse a trace set whose files do not belong together, or that is not the set the result folder
    replayed (source.json's set id): the comparison would join another run's nodes by id."""
    from xsim.traces.setid import check_identity

    ident = check_identity(ts)
    try:
        with open(os.path.join(sim, SOURCE_FILE), encoding="utf-8") as fh:
            recorded = json.load(fh).get("set_id")
    except (OSError, ValueError, AttributeError):
        return
    if ident is not None and isinstance(recorded, str) and recorded != ident.set_id:
        raise ReplayError(
            f"{sim}: replayed trace set {recorded}, but {ts.prefix} is set {ident.set_id} now (regenerated "
            f"since?): replay it again or pass the set it replayed with --trace"
        )


@dataclass
class _Totals:
    """What validate sums over ranks: [measured, simulated] ns per layer and per op class, the step rows,
    and each step's window over the ranks (shared host clock), measured and simulated: step -> [min start,
    max end]."""

    by_layer: dict[int, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    by_class: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    step_rows: list[tuple] = field(default_factory=list)
    real_window: dict[int, list[int]] = field(default_factory=dict)
    sim_window: dict[int, list[int]] = field(default_factory=dict)

    def add_op(self, node: pb.Node, a: dict, measured: int, dur: int) -> None:
        """One op's measured and simulated ns, to its op class and its layer."""
        if node.name.startswith(TAIL_PREFIX):
            # A rank's late completion of a collective: part of the collective's measured time
            # already, so it adds only simulated time to that collective's class.
            measured, ctype = 0, node.name[len(TAIL_PREFIX) :]
        elif node.type == pb.COMM_COLL_NODE:
            ctype = pb.comm_type_name(a["comm_type"]).lower()
        elif node.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
            ctype = "send" if node.type == pb.COMM_SEND_NODE else "recv"
        else:
            ctype = None
        cls = op_class(str(a.get("module", "")), str(a.get("phase", "")), node.name, ctype)
        self.by_class[cls][0] += measured
        self.by_class[cls][1] += dur
        layer = int(a.get("layer", 0) or 0)
        self.by_layer[layer][0] += measured
        self.by_layer[layer][1] += dur


@dataclass(frozen=True)
class _RankRun:
    """One rank as validate compares it: its trace file and nodes, each node's replayed (start, end,
    duration) ns, its Kineto trace and the nodes found there."""

    rank: int
    path: str
    nodes: Sequence[pb.Node]
    times: dict[int, tuple[int, int, int]]
    k: KinetoTrace
    match: _RankMatch


def validate(
    real: Sequence[str],
    sim_dir: str | os.PathLike[str],
    trace: str | os.PathLike[str] | TraceSet | None = None,
    window: Window | None = None,
) -> Validation:
    """Check that --real is the replayed run, then compare per layer, op class and step (or `window`)."""
    sim = os.fspath(sim_dir)
    ops, ops_path = _read_ops(sim)
    ts = trace if isinstance(trace, TraceSet) else discover(trace if trace is not None else trace_of(sim))
    _check_same_set(sim, ts)
    kins, origins = _identity(ts, real)
    if window is None and not any(k.steps for k in kins):
        # Without steps the headline step-time error would have nothing to compare.
        raise ReplayError(
            f"{kins[0].path}: no ProfilerStep#N events in the Kineto trace(s) (profile with torch.profiler "
            "and call prof.step() each iteration), or compare a window: --window matched, --window 0ms:20ms"
        )
    totals = _Totals()
    matched_counts = []
    for rank in range(ts.num_ranks):
        times = _rank_times(ops, rank)
        if not times:
            raise ReplayError(f"{ops_path}: no ops of rank {rank}; was it replayed from {ts.prefix}?")
        nodes = ts.load(rank).nodes
        k = kins[rank]
        match = _match_rank(nodes, k, origins[rank], k.path, rank, ts.prefix)
        matched_counts.append((rank, len(match.found), match.compared))
        if window is None:
            _check_steps(nodes, k, rank)
        run = _RankRun(rank, ts.paths[rank], nodes, times, k, match)
        span, real_span = _rank_spans(totals, run, window)
        _add_steps(totals, run, span, real_span, window)
    if ts.num_ranks > 1:
        # The job's step: from the first rank entering it to the last one leaving it (rank -1).
        for step in sorted(set(totals.real_window) & set(totals.sim_window)):
            m = totals.real_window[step][1] - totals.real_window[step][0]
            sv = totals.sim_window[step][1] - totals.sim_window[step][0]
            totals.step_rows.append((-1, step, m, sv, _err(m, sv)))
    steps = pl.DataFrame(
        totals.step_rows,
        schema={
            "rank": pl.Int32,
            "step": pl.Int64,
            "measured_ns": pl.Int64,
            "simulated_ns": pl.Int64,
            "error_pct": pl.Float64,
        },
        orient="row",
    )
    return Validation(
        _table("layer", totals.by_layer, pl.Int64),
        _table("op_class", totals.by_class, pl.String),
        steps,
        tuple(matched_counts),
    )


def _read_ops(sim: str) -> tuple[pl.DataFrame, str]:
    """The replay's ops table (the columns validate compares) and its path."""
    ops_path = os.path.join(sim, "ops.parquet")
    if not os.path.isfile(ops_path):
        raise ReplayError(f"{sim}: no ops.parquet (pass the folder `xsim replay --out` wrote)")
    try:
        ops = pl.read_parquet(ops_path, columns=["rank", "node_id", "start_ns", "end_ns", "duration_ns"])
    except (pl.exceptions.PolarsError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ReplayError(f"{ops_path}: not a replay ops table ({first})") from None
    return ops, ops_path


def _rank_times(ops: pl.DataFrame, rank: int) -> dict[int, tuple[int, int, int]]:
    """node id -> (start, end, duration) ns of one rank's replayed ops."""
    sim_rank = ops.filter(pl.col("rank") == rank)
    return {
        int(n): (int(s), int(e), int(d))
        for n, s, e, d in zip(
            sim_rank["node_id"],
            sim_rank["start_ns"],
            sim_rank["end_ns"],
            sim_rank["duration_ns"],
            strict=True,
        )
    }


def _check_steps(nodes: Sequence[pb.Node], k: KinetoTrace, rank: int) -> None:
    """Every profiler step of the rank's nodes is a ProfilerStep# of its Kineto trace (else another run)."""
    want = {int(a["profiler_step"]) for n in nodes if int((a := attr_dict(n)).get("profiler_step", -1)) >= 0}
    missing = sorted(want - set(k.steps))
    if missing:
        raise ReplayError(
            f"{k.path}: rank {rank}: the trace set's step(s) {', '.join(map(str, missing))} are not in "
            f"this Kineto trace (its ProfilerStep#: {', '.join(map(str, sorted(k.steps))) or 'none'}): "
            "another run"
        )


def _rank_spans(
    totals: _Totals, run: _RankRun, window: Window | None
) -> tuple[dict[int, list[int]], list[int]]:
    """Add the rank's ops to the totals; each step's simulated [start, end] and, with a window, the
    window's measured [start, end] ([] when no op of it was found)."""
    span: dict[int, list[int]] = {}
    real_span: list[int] = []
    for node in run.nodes:
        if node.type == pb.METADATA_NODE or node.id not in run.times:
            continue
        if node.name.startswith(SYNTHETIC_PREFIX) and not node.name.startswith(TAIL_PREFIX):
            continue  # the importer's start offset: time before the rank's first op, not an op
        a = attr_dict(node)
        if "duration_ns" not in a:
            raise ReplayError(
                f"{run.path}: node {node.id} has no measured duration_ns (not an imported trace)"
            )
        start, end, dur = run.times[node.id]
        hit = run.match.found.get(node.id)
        if window is not None:
            t = int(a.get("measured_start_ns", -1))
            if not window.holds(node.id, t, hit is not None):
                continue
        totals.add_op(node, a, hit[2] if hit is not None else 0, dur)
        step = 0 if window is not None else int(a.get("profiler_step", -1))
        if step >= 0:
            s = span.setdefault(step, [start, end])
            s[0], s[1] = min(s[0], start), max(s[1], end)
            if window is not None and hit is not None:
                real_span = (
                    [min(real_span[0], hit[0]), max(real_span[1], hit[1])] if real_span else [hit[0], hit[1]]
                )
    return span, real_span


def _add_steps(
    totals: _Totals, run: _RankRun, span: dict[int, list[int]], real_span: list[int], window: Window | None
) -> None:
    """The rank's step rows (measured against simulated), and its steps into the job's windows."""
    if window is not None:
        # The window's measured span, on the run's clock (origin-relative ns, shared across ranks).
        real_steps = {0: (real_span[0], real_span[1] - real_span[0])} if real_span else {}
    else:
        real_steps = {n: (e.ts, e.dur) for n, e in run.k.steps.items()}
    for step, (t0, dur) in sorted(real_steps.items()):
        if step in span:
            simulated = span[step][1] - span[step][0]
            totals.step_rows.append((run.rank, step, dur, simulated, _err(dur, simulated)))
            for w, lo, hi in ((totals.real_window, t0, t0 + dur), (totals.sim_window, *span[step])):
                x = w.setdefault(step, [lo, hi])
                x[0], x[1] = min(x[0], lo), max(x[1], hi)


LOG_SPAN = 30.0  # a panel's bars use a log axis when its largest value exceeds its smallest this many times


def _pct(err: float) -> str:
    """Signed error to one decimal; a rounded zero is "0.0%" (no "-0.0%")."""
    return "0.0%" if round(err, 1) == 0 else f"{err:+.1f}%"


def _ms(ns: int) -> float:
    return ns / 1e6


def _bars(
    ax, labels: list[str], measured: list[int], simulated: list[int], errors: list, title: str, xlabel: str
):
    """Measured and simulated bars side by side, each simulated bar labelled with its signed error."""
    xs = list(range(len(labels)))
    m = [_ms(v) for v in measured]
    s = [_ms(v) for v in simulated]
    ax.bar([x - 0.2 for x in xs], m, 0.4, label="measured", color="#4c72b0")
    bars = ax.bar([x + 0.2 for x in xs], s, 0.4, label="simulated", color="#dd8452")
    positive = [v for v in m + s if v > 0]
    if positive and max(positive) / min(positive) > LOG_SPAN:
        ax.set_yscale("log")
    for bar, err in zip(bars, errors, strict=True):
        if err is None:
            continue
        ax.annotate(
            _pct(err),
            (bar.get_x() + bar.get_width() / 2, max(bar.get_height(), 1e-9)),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=7,
            color="#b22222" if abs(err) >= 10 else "#333333",
        )
    ax.set_xticks(
        xs, labels, rotation=45 if len(labels) > 6 else 0, ha="right" if len(labels) > 6 else "center"
    )
    ax.set_xlabel(xlabel)
    ax.set_ylabel("time (ms, summed over ranks)")
    ax.set_title(title, fontsize=10)
    ax.margins(y=0.15)


def validation_figure(v: Validation):
    """The Figure-11-style figure: per layer, per op class, and the time outside the layers apart.

    Layer 0 ("not a layer": embedding, loss, optimizer, communication outside any layer) often dwarfs the
    real layers, so it gets its own panel; a panel whose values span more than LOG_SPAN x is drawn on a log
    axis. Every simulated bar carries its signed error; the title names the step error and the op class
    with the largest error, so a small step error cannot hide a large class error.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = v.layers.filter(pl.col("layer") > 0)
    outside = v.layers.filter(pl.col("layer") <= 0)
    fig, axes = plt.subplots(
        1,
        3,
        figsize=(14, 4.6),
        gridspec_kw={"width_ratios": [max(2, len(layers)), 1.2, max(3, len(v.classes))]},
    )
    _bars(
        axes[0],
        [str(x) for x in layers["layer"]],
        layers["measured_ns"].to_list(),
        layers["simulated_ns"].to_list(),
        layers["error_pct"].to_list(),
        "per layer",
        "layer",
    )
    _bars(
        axes[1],
        ["outside layers"] if outside.height else [],
        [int(outside["measured_ns"].sum())] if outside.height else [],
        [int(outside["simulated_ns"].sum())] if outside.height else [],
        [_err(int(outside["measured_ns"].sum()), int(outside["simulated_ns"].sum()))]
        if outside.height
        else [],
        "non-layer time (layer 0)",
        "",
    )
    _bars(
        axes[2],
        [str(x) for x in v.classes["op_class"]],
        v.classes["measured_ns"].to_list(),
        v.classes["simulated_ns"].to_list(),
        v.classes["error_pct"].to_list(),
        "per op class",
        "op class",
    )
    axes[2].legend(fontsize=8, loc="upper right")
    worst = v.classes.drop_nulls("error_pct").sort(pl.col("error_pct").abs(), descending=True).head(1)
    extra = ""
    if worst.height:
        extra = f"; largest op-class error {worst['op_class'][0]} {worst['error_pct'][0]:+.1f}%"
    e = v.step_error_pct()
    head = "no measured step time" if e is None else f"Step-time error {e:+.2f}%"
    fig.suptitle(f"xsim validate: measured vs simulated. {head}{extra}")
    fig.tight_layout()
    return fig


def plot_validation(v: Validation, path: str) -> str | None:
    """Write validation_figure as a PNG; None (nothing written) without matplotlib."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return None
    import matplotlib.pyplot as plt

    fig = validation_figure(v)
    # Fixed metadata so the same tables give the same PNG bytes.
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path
