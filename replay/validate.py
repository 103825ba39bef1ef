"""Layer-wise validation: measured (Kineto) vs simulated time per layer, per op class and per step.

Inputs: the Kineto traces of the real run (one per rank), the result directory of `xsim replay --out` on the
imported trace set, and that trace set (its nodes carry the measured `duration_ns`, `layer`, `module`,
`phase` and `profiler_step` written by the importer).

- Step time: measured = `ProfilerStep#N` duration in the rank's Kineto trace; simulated = from the first
  start to the last end of the rank's nodes that started inside step N.
- Per group (layer, op class): measured = sum of the measured durations of the group's nodes (the time the
  importer attributed to them from Kineto), simulated = sum of their simulated durations; summed over
  ranks. error % = (simulated - measured) / measured x 100.

Op classes: attention, mlp, norm, embedding, loss, optimizer, one per collective kind (all_reduce, ...),
other; from the node's module path and phase (rules in `op_class`).
"""

from __future__ import annotations

import json
import os
import shutil
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from replay.errors import ReplayError
from traces import pb
from traces.attrs import attr_dict
from traces.io import JsonFileError
from traces.kineto import KinetoError, load_kineto
from traces.outputs import install_files, staging_dir
from traces.traceset import TraceSet, discover

TAIL_PREFIX = "xsim::comm_tail:"  # the importer's per-rank late completion of a collective
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

    def step_error_pct(self) -> float:
        """Signed % error of the mean step time: the job's steps (rank -1) when several ranks ran."""
        rows = self.steps.filter(pl.col("rank") == -1)
        if rows.is_empty():
            rows = self.steps
        if rows.is_empty():
            return float("nan")
        m = float(rows["measured_ns"].sum())
        s = float(rows["simulated_ns"].sum())
        return (s - m) / m * 100.0 if m else float("nan")

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
                json.dump(
                    {
                        "step_error_pct": round(self.step_error_pct(), 4),
                        "layers": self.layers.to_dicts(),
                        "classes": self.classes.to_dicts(),
                        "steps": self.steps.to_dicts(),
                    },
                    fh,
                    indent=1,
                )
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
    try:
        k = load_kineto(path)
    except (JsonFileError, KinetoError) as exc:
        raise ReplayError(f"{path}: not a readable Kineto JSON trace ({exc.reason})") from None
    return k.rank, {n: (e.ts, e.dur) for n, e in sorted(k.steps.items())}


def trace_of(sim_dir: str) -> str:
    """The trace set a result directory was replayed from (its source.json), or a clear error."""
    p = os.path.join(sim_dir, SOURCE_FILE)
    try:
        with open(p, encoding="utf-8") as fh:
            return str(json.load(fh)["trace"])
    except (OSError, KeyError, TypeError, json.JSONDecodeError, UnicodeDecodeError):
        raise ReplayError(
            f"{sim_dir}: no {SOURCE_FILE} naming the replayed trace set; pass it with --trace PREFIX"
        ) from None


def _check_same_set(sim: str, ts: TraceSet) -> None:
    """Refuse a trace set whose files do not belong together, or that is not the set the result folder
    replayed (source.json's set id): the comparison would join another run's nodes by id."""
    from traces.setid import check_identity

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


def validate(
    real: Sequence[str],
    sim_dir: str | os.PathLike[str],
    trace: str | os.PathLike[str] | TraceSet | None = None,
) -> Validation:
    """Compare a replay result with the real run's Kineto traces, per layer, op class and step."""
    sim = os.fspath(sim_dir)
    ops_path = os.path.join(sim, "ops.parquet")
    if not os.path.isfile(ops_path):
        raise ReplayError(f"{sim}: no ops.parquet (pass the folder `xsim replay --out` wrote)")
    try:
        ops = pl.read_parquet(ops_path, columns=["rank", "node_id", "start_ns", "end_ns", "duration_ns"])
    except (pl.exceptions.PolarsError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ReplayError(f"{ops_path}: not a replay ops table ({first})") from None
    ts = trace if isinstance(trace, TraceSet) else discover(trace if trace is not None else trace_of(sim))
    _check_same_set(sim, ts)
    if not real:
        raise ReplayError("no Kineto trace given with --real")
    steps_by_rank: dict[int, dict[int, tuple[int, int]]] = {}
    for i, path in enumerate(real):
        rank, steps = kineto_steps(path)
        rank = i if rank is None or len(real) != ts.num_ranks else rank
        if rank >= ts.num_ranks:
            raise ReplayError(f"{path}: Kineto rank {rank} but the trace set has {ts.num_ranks} ranks")
        steps_by_rank[rank] = steps
    if not any(steps_by_rank.values()):
        # Without steps the headline step-time error would print as nan on a run that "succeeded".
        raise ReplayError(
            f"{real[0]}: no ProfilerStep#N events in the Kineto trace(s); profile with torch.profiler and "
            "call prof.step() each iteration"
        )
    by_layer: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    by_class: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    step_rows = []
    real_window: dict[int, list[int]] = {}  # step -> [min start, max end] over ranks (shared host clock)
    sim_window: dict[int, list[int]] = {}
    for rank in range(ts.num_ranks):
        sim_rank = ops.filter(pl.col("rank") == rank)
        times = {
            int(n): (int(s), int(e), int(d))
            for n, s, e, d in zip(
                sim_rank["node_id"],
                sim_rank["start_ns"],
                sim_rank["end_ns"],
                sim_rank["duration_ns"],
                strict=True,
            )
        }
        if not times:
            raise ReplayError(f"{ops_path}: no ops of rank {rank}; was it replayed from {ts.prefix}?")
        span: dict[int, list[int]] = {}
        for node in ts.load(rank).nodes:
            if node.type == pb.METADATA_NODE or node.id not in times:
                continue
            a = attr_dict(node)
            if "duration_ns" not in a:
                raise ReplayError(
                    f"{ts.paths[rank]}: node {node.id} has no measured duration_ns (not an imported trace)"
                )
            start, end, dur = times[node.id]
            measured = int(a.get("kineto_dur_ns", a["duration_ns"]))
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
            by_class[cls][0] += measured
            by_class[cls][1] += dur
            layer = int(a.get("layer", 0) or 0)
            by_layer[layer][0] += measured
            by_layer[layer][1] += dur
            step = int(a.get("profiler_step", -1))
            if step >= 0:
                s = span.setdefault(step, [start, end])
                s[0], s[1] = min(s[0], start), max(s[1], end)
        for step, (t0, dur) in sorted(steps_by_rank.get(rank, {}).items()):
            if step in span:
                simulated = span[step][1] - span[step][0]
                step_rows.append((rank, step, dur, simulated, _err(dur, simulated)))
                for window, lo, hi in ((real_window, t0, t0 + dur), (sim_window, *span[step])):
                    w = window.setdefault(step, [lo, hi])
                    w[0], w[1] = min(w[0], lo), max(w[1], hi)
    if ts.num_ranks > 1:
        # The job's step: from the first rank entering it to the last one leaving it (rank -1).
        for step in sorted(set(real_window) & set(sim_window)):
            m = real_window[step][1] - real_window[step][0]
            sv = sim_window[step][1] - sim_window[step][0]
            step_rows.append((-1, step, m, sv, _err(m, sv)))
    steps = pl.DataFrame(
        step_rows,
        schema={
            "rank": pl.Int32,
            "step": pl.Int64,
            "measured_ns": pl.Int64,
            "simulated_ns": pl.Int64,
            "error_pct": pl.Float64,
        },
        orient="row",
    )
    return Validation(_table("layer", by_layer, pl.Int64), _table("op_class", by_class, pl.String), steps)


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
    fig.suptitle(f"xsim validate: measured vs simulated. Step-time error {v.step_error_pct():+.2f}%{extra}")
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
