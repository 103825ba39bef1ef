"""Design-space sweeps: a base spec and axes, expanded into plans, run as Dask tasks, one Parquet row each.

A sweep file (YAML/TOML/JSON) holds `base` (a spec mapping, or a spec file relative to the sweep file),
optionally `name`, and `axes`, a mapping from axis to its list of values; the plans are the cartesian
product, in file order. Axes (docs/decide.md):

- `gpus`: one GPU per device group (a list), or one name for all groups;
- `tp`: TP per device group (a list) or one degree for all; ranks are renumbered group after group;
- `cuts`: the last layer of every stage but the final one, applied to every replica (`[16]`: 1-16, 17-L);
- `micro_batch`: sequences per micro-batch, per device group (a list) or for all;
- `network`: the replay's network model (`analytical` | `flow`);
- `cluster`: the spec's `cluster` (a preset mapping, a file, or a topology string);
- any other top-level spec key (`micro_batches`, `schedule`, `reshard`, `sequence_parallel`, ...).

Each plan's key is a hash of its resolved spec and network model. Rows land in `<out>/rows/<key>.parquet`
(written to a temporary name, then renamed: a row is there whole or not at all); the dataset is the folder.
A rerun skips every key already there. A plan that fails (bad combination, out of memory, replay error)
gets a row with its error and never stops the sweep.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from xsim.netmodels.errors import NetworkModelError
from xsim.tracegen.errors import SpecError
from xsim.tracegen.memory import OutOfMemory, check_fits, deployment_memory
from xsim.tracegen.spec import load_spec, read_spec_file, spec_to_mapping
from xsim.traces.errors import XsimError
from xsim.traces.limits import limit

NETWORKS = ("analytical", "flow")
SPECIAL_AXES = ("gpus", "tp", "cuts", "micro_batch", "network", "cluster")
ROWS_DIR = "rows"
PLANS_DIR = "plans"
# Plans a sweep file may expand to (XSIM_MAX_SWEEP_PLANS raises it; issue 31: 64,000 were accepted). A plan
# of 8 ranks took a median 13.7-34.7 s of task time on the shared 2-core machine (docs/decide.md, "24 plans,
# 1 worker vs 2"), so 4,096 plans are ~8 hours on 2 workers: past that, a sweep is a mistake more often
# than a plan; the count is the axes' product, known before any plan is resolved.
DEFAULT_MAX_SWEEP_PLANS = 4096

# One schema for every row, so the part files concatenate into one dataset.
SCHEMA: dict[str, Any] = {
    "key": pl.String,
    "label": pl.String,
    "axes": pl.String,
    "status": pl.String,  # ok | oom | error
    "error": pl.String,
    "network": pl.String,
    "ranks": pl.Int64,
    "gpus": pl.String,
    "iteration_time_ns": pl.Int64,
    "tokens_per_s": pl.Float64,
    "cost_usd_per_iteration": pl.Float64,
    "cost_usd_per_million_tokens": pl.Float64,
    "wait_ns_max": pl.Int64,
    "bubble_ns_max": pl.Int64,
    "exposed_comm_ns": pl.Int64,
    "peak_memory_bytes": pl.Int64,
    "min_headroom_bytes": pl.Int64,
    "per_rank_peak_bytes": pl.List(pl.Int64),
    "spec": pl.String,
    "dir": pl.String,
    "wall_s": pl.Float64,
}


class SweepError(XsimError):
    """A sweep file that cannot be expanded (unknown axis, malformed values)."""


@dataclass(frozen=True)
class PlanTask:
    """One plan of a sweep: what a worker needs (plain, picklable)."""

    key: str
    label: str
    axes: str  # JSON of this plan's axis values
    spec: str  # JSON of the resolved spec ("" when it did not resolve: `error` says why)
    network: str
    out_dir: str
    allow_oom: bool = False
    error: str = ""


@dataclass(frozen=True)
class Sweep:
    """A loaded sweep file."""

    name: str
    base: Mapping[str, Any]
    axes: tuple[tuple[str, tuple[Any, ...]], ...]
    base_dir: str


def load_sweep(path: str | os.PathLike[str]) -> Sweep:
    """Read a sweep file: `base`, `axes` and optionally `name`."""
    p = os.fspath(path)
    raw = read_spec_file(p)
    unknown = sorted(set(raw) - {"name", "base", "axes"})
    if unknown:
        raise SweepError(f"{p}: unknown key(s) {', '.join(unknown)} (a sweep file has name, base, axes)")
    base_dir = os.path.dirname(os.path.abspath(p))
    base = raw.get("base")
    if isinstance(base, str):
        base = read_spec_file(os.path.join(base_dir, base))
    if not isinstance(base, Mapping):
        raise SweepError(f"{p}: base must be a spec mapping or a spec file path")
    axes = raw.get("axes") or {}
    if not isinstance(axes, Mapping):
        raise SweepError(f"{p}: axes must map an axis name to a list of values")
    out = []
    for k, v in axes.items():
        if not isinstance(v, list) or not v:
            raise SweepError(f"{p}: axis {k!r} must be a non-empty list of values")
        out.append((str(k), tuple(v)))
    name = str(raw.get("name") or os.path.basename(p).split(".")[0])
    return Sweep(name, base, tuple(out), base_dir)


def _per_group(value: Any, n: int, axis: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != n:
            raise SpecError(f"axis {axis}: {len(value)} values for {n} device groups")
        return list(value)
    return [value] * n


def apply_axes(base: Mapping[str, Any], values: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The spec mapping of one plan and its network model: `base` with the axis values applied."""
    spec = json.loads(json.dumps(base))  # a deep copy of plain data
    network = "analytical"
    groups = spec.get("device_groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise SpecError("base: device_groups must be a list of mappings")
    for axis, v in values.items():
        if axis == "network":
            if v not in NETWORKS:
                raise SpecError(f"axis network: {v!r} is not one of {', '.join(NETWORKS)}")
            network = v
        elif axis == "gpus":
            for g, x in zip(groups, _per_group(v, len(groups), axis), strict=True):
                g["gpu"] = x
        elif axis == "micro_batch":
            for g, x in zip(groups, _per_group(v, len(groups), axis), strict=True):
                g["micro_batch"] = x
        elif axis == "tp":
            for g, x in zip(groups, _per_group(v, len(groups), axis), strict=True):
                g["tp"] = x
            _renumber(groups)
        elif axis == "cuts":
            _cut(spec, groups, v)
        else:
            spec[axis] = v
    return spec, network


def _renumber(groups: list[dict[str, Any]]) -> None:
    """Consecutive ranks, group after group (in list order), each group as many as its TP degree."""
    nxt = 0
    for g in groups:
        t = g.get("tp")
        if not isinstance(t, int) or isinstance(t, bool) or t < 1:
            raise SpecError(f"axis tp: {t!r} is not a positive integer")
        g["ranks"] = list(range(nxt, nxt + t))
        nxt += t


def _cut(spec: Mapping[str, Any], groups: list[dict[str, Any]], cuts: Any) -> None:
    if not isinstance(cuts, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in cuts):
        raise SpecError(f"axis cuts: {cuts!r} must be a list of layer numbers")
    model = spec.get("model")
    layers = model.get("layers") if isinstance(model, Mapping) else None
    if layers is None:
        from xsim.tracegen.models import preset

        layers = preset(str(model)).layers
    bounds = [0, *cuts, layers]
    if any(a >= b for a, b in itertools.pairwise(bounds)):
        raise SpecError(f"axis cuts: {cuts} must rise strictly inside 1..{layers - 1}")
    by_replica: dict[int, list[dict[str, Any]]] = {}
    for g in groups:
        by_replica.setdefault(int(g.get("dp_replica", 0)), []).append(g)
    for replica, stages in by_replica.items():
        if len(stages) != len(bounds) - 1:
            raise SpecError(
                f"axis cuts: {cuts} makes {len(bounds) - 1} stages, replica {replica} has {len(stages)}"
            )
        for g in stages:
            k = int(g.get("pp_stage", 0))
            g.pop("layer_start", None), g.pop("layer_end", None)
            g["layers"] = [bounds[k] + 1, bounds[k + 1]]


def plan_key(spec_json: str, network: str) -> str:
    """A plan's identity: hash of its resolved spec and network model."""
    return hashlib.sha256(f"{network}\n{spec_json}".encode()).hexdigest()[:16]


def resolve(
    spec: Mapping[str, Any], base_dir: str, gpu_file: Mapping[str, Mapping[str, Any]] | None = None
) -> str:
    """The resolved spec (as `xsim gen` writes deployment.json) as canonical JSON; raises SpecError.
    gpu_file: hypothetical GPUs (tracegen.spec.read_gpu_file), recorded in the spec when it uses them."""
    cwd = os.getcwd()
    try:
        os.chdir(base_dir)  # relative profile / cluster files are relative to the sweep file
        dep = load_spec({**spec, "name": "plan"}, None, gpu_file)
    finally:
        os.chdir(cwd)
    return json.dumps(spec_to_mapping(dep), sort_keys=True)


def plan_count(sweep: Sweep) -> int:
    """How many plans the sweep expands to before duplicates merge: the product of the axes' lengths."""
    return math.prod(len(vals) for _, vals in sweep.axes)


def check_sweep_size(sweep: Sweep, path: str) -> int:
    """The sweep's plan count, or a SweepError naming the limit and the variable raising it."""
    n, cap = plan_count(sweep), limit("XSIM_MAX_SWEEP_PLANS", DEFAULT_MAX_SWEEP_PLANS)
    if n > cap:
        raise SweepError(
            f"{path}: {n:,} plans (the product of the axes' lengths), more than a sweep's limit of {cap:,} "
            f"(XSIM_MAX_SWEEP_PLANS raises it)"
        )
    return n


def expand(
    sweep: Sweep, out: str, allow_oom: bool = False, gpu_file: Mapping[str, Mapping[str, Any]] | None = None
) -> list[PlanTask]:
    """Every plan of the sweep (cartesian product of the axes, in file order); gpu_file: hypothetical GPUs
    its axes may name (tracegen.spec.read_gpu_file)."""
    names = [a for a, _ in sweep.axes]
    tasks: list[PlanTask] = []
    seen: set[str] = set()
    for combo in itertools.product(*(vals for _, vals in sweep.axes)):
        values = dict(zip(names, combo, strict=True))
        label = " ".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in values.items()) or "base"
        axes_json = json.dumps(values, sort_keys=True)
        try:
            spec, network = apply_axes(sweep.base, values)
            spec_json = resolve(spec, sweep.base_dir, gpu_file)
            key, err = plan_key(spec_json, network), ""
        except (XsimError, NetworkModelError) as exc:
            spec_json, network = "", str(values.get("network", "analytical"))
            key, err = plan_key("invalid " + axes_json, network), str(exc)
        if key in seen:
            continue  # two axis combinations that resolve to the same plan (e.g. a no-op value)
        seen.add(key)
        tasks.append(
            PlanTask(
                key, label, axes_json, spec_json, network, os.path.join(out, PLANS_DIR, key), allow_oom, err
            )
        )
    return tasks


def _row(task: PlanTask, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(SCHEMA)
    row.update(
        key=task.key, label=task.label, axes=task.axes, network=task.network, spec=task.spec, dir=task.out_dir
    )
    row.update(fields)
    return row


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def run_plan(task: PlanTask) -> dict[str, Any]:
    """Memory-check, generate and replay one plan; a row (never raises: failures are rows too)."""
    from xsim.explore.pipeline import gen_and_replay

    t0 = time.perf_counter()
    if task.error:
        return _row(task, status="error", error=task.error, wall_s=0.0)
    try:
        dep = load_spec(json.loads(task.spec))
        mem = deployment_memory(dep)
        peak = max(r.total for r in mem)
        mem_fields = {
            "peak_memory_bytes": peak,
            "min_headroom_bytes": min(r.headroom for r in mem),
            "per_rank_peak_bytes": [r.total for r in mem],
            "ranks": len(mem),
            "gpus": gpu_mix(dep),
        }
        if not task.allow_oom:
            check_fits(mem, task.label)
        rep = gen_and_replay(dep, task.out_dir, task.network)
    except OutOfMemory as exc:
        return _row(task, status="oom", error=str(exc), wall_s=time.perf_counter() - t0, **mem_fields)
    except (XsimError, NetworkModelError) as exc:
        return _row(task, status="error", error=_one_line(exc), wall_s=time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001 - a bug in one plan must not stop the sweep; the row says what
        return _row(
            task,
            status="error",
            error=f"{type(exc).__name__}: {_one_line(exc)}",
            wall_s=time.perf_counter() - t0,
        )
    s, c = rep.summary, rep.cost
    return _row(
        task,
        status="ok",
        error="",
        iteration_time_ns=s["iteration_time_ns"],
        tokens_per_s=c["tokens_per_s"],
        cost_usd_per_iteration=c["cost_usd_per_iteration"],
        cost_usd_per_million_tokens=c["cost_usd_per_million_tokens"],
        wait_ns_max=s["wait_ns_max"],
        bubble_ns_max=s["bubble_ns_max"],
        exposed_comm_ns=s["exposed_comm_ns"],
        wall_s=time.perf_counter() - t0,
        **mem_fields,
    )


def gpu_mix(dep: Any) -> str:
    """`4xA100-40GB+4xH100`: GPUs of a deployment by type."""
    counts: dict[str, int] = {}
    for dg in dep.device_groups:
        counts[dg.gpu] = counts.get(dg.gpu, 0) + len(dg.ranks)
    return "+".join(f"{n}x{g}" for g, n in sorted(counts.items()))


def write_row(out: str, row: Mapping[str, Any]) -> str:
    """Append one row to the dataset atomically (temporary file, then rename)."""
    d = os.path.join(out, ROWS_DIR)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{row['key']}.parquet")
    import io

    from xsim.traces.outputs import atomic_write_bytes

    buf = io.BytesIO()
    pl.DataFrame([dict(row)], schema=SCHEMA).write_parquet(buf)
    return atomic_write_bytes(path, buf.getvalue())  # whole or absent, never over a link


def read_rows(out: str) -> pl.DataFrame:
    """Every row of the dataset under `out` (empty frame with the schema when there is none)."""
    d = os.path.join(out, ROWS_DIR)
    files = sorted(f for f in os.listdir(d) if f.endswith(".parquet")) if os.path.isdir(d) else []
    if not files:
        return pl.DataFrame(schema=SCHEMA)
    frames = []
    for f in files:
        path = os.path.join(d, f)
        try:
            df = pl.read_parquet(path)
        except (pl.exceptions.PolarsError, OSError) as exc:
            raise SweepError(
                f"{path}: damaged sweep row ({_one_line(exc)}); delete it to rerun that plan"
            ) from None
        if df.schema != pl.Schema(SCHEMA) or df.height != 1:
            raise SweepError(
                f"{path}: not a sweep row of this xsim (other columns); delete it to rerun that plan"
            )
        frames.append(df)
    return pl.concat(frames, how="vertical")


SORTS = ("time", "throughput", "cost")
# Plans of different global batches train different token counts per iteration: tokens/s (then $ per
# million tokens) compares them, iteration time does not (issue 26 item 5).
DEFAULT_SORT = "throughput"


def sort_rows(rows: pl.DataFrame, by: str = DEFAULT_SORT) -> pl.DataFrame:
    """Finished plans first (OOM and failed rows last), ordered by throughput (descending, then $ per M
    tokens), $ per M tokens (then throughput) or iteration time."""
    # A plan replayed with --allow-oom that does not fit (negative headroom) sorts with the failed rows.
    rows = rows.with_columns(
        ((pl.col("status") != "ok") | (pl.col("min_headroom_bytes").fill_null(0) < 0)).alias("_failed")
    )
    if by == "throughput":
        keys = ["_failed", "tokens_per_s", "cost_usd_per_million_tokens", "key"]
        desc = [False, True, False, False]
    elif by == "cost":
        keys = ["_failed", "cost_usd_per_million_tokens", "tokens_per_s", "key"]
        desc = [False, False, True, False]
    else:
        keys, desc = ["_failed", "iteration_time_ns", "key"], [False, False, False]
    return rows.sort(keys, descending=desc, nulls_last=True).drop("_failed")


def fits_column(rows: pl.DataFrame) -> list[str]:
    """Per row: "yes" when every rank fits in its GPU's memory, "NO" when one does not (an `oom` row, or a
    plan replayed with --allow-oom), "-" when the plan did not resolve."""
    return ["-" if h is None else ("yes" if h >= 0 else "NO") for h in rows["min_headroom_bytes"].to_list()]


def pareto_keys(rows: pl.DataFrame) -> list[str]:
    """Keys of finished, priced plans no other plan beats on both iteration time and $ per M tokens."""
    pts = [
        (r["iteration_time_ns"], r["cost_usd_per_million_tokens"], r["key"])
        for r in rows.iter_rows(named=True)
        if r["status"] == "ok" and r["cost_usd_per_million_tokens"] is not None
    ]
    front = []
    for t, c, k in pts:
        if not any((t2 <= t and c2 <= c) and (t2 < t or c2 < c) for t2, c2, _ in pts):
            front.append(k)
    return sorted(front)


@dataclass(frozen=True)
class PlotPoint:
    """One point of the Pareto plot: plans with identical time and cost merged, their names joined."""

    time_s: float
    usd_per_mtok: float
    keys: tuple[str, ...]
    label: str


def merged_points(rows: pl.DataFrame) -> list[PlotPoint]:
    """Finished, priced plans grouped by (iteration time, $ per M tokens): identical results are one point
    labelled with every plan's name (at most 3 shown, then "+N more")."""
    groups: dict[tuple[int, float], list[tuple[str, str]]] = {}
    for r in rows.iter_rows(named=True):
        if r["status"] != "ok" or r["cost_usd_per_million_tokens"] is None:
            continue
        at = (r["iteration_time_ns"], r["cost_usd_per_million_tokens"])
        groups.setdefault(at, []).append((r["label"], r["key"]))
    out = []
    for (t, c), members in sorted(groups.items()):
        names = sorted(m[0] for m in members)
        label = ", ".join(names[:3]) + (f" +{len(names) - 3} more" if len(names) > 3 else "")
        out.append(PlotPoint(t / 1e9, c, tuple(sorted(m[1] for m in members)), label))
    return out


def plot_path(path: str) -> str:
    """The PNG file a `--plot` argument names: DIR/pareto.png for a folder, `.png` added when it has no
    suffix (matplotlib added it itself, and the sweep reported the name without it)."""
    if os.path.isdir(path) or path.endswith(os.sep):
        return os.path.join(path, "pareto.png")
    return path if os.path.splitext(path)[1] else path + ".png"


def plot_pareto(rows: pl.DataFrame, path: str, inputs: tuple[str, ...] = ()) -> str | None:
    """Scatter of iteration time vs $ per M tokens with the Pareto front; None without matplotlib or points.
    Returns the file written (`plot_path`)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    ok = rows.filter((pl.col("status") == "ok") & pl.col("cost_usd_per_million_tokens").is_not_null())
    if ok.is_empty():
        return None
    front = set(pareto_keys(ok))
    points = merged_points(ok)
    # Every point numbered on the axes (in order of time), its plans named in a key below them: long plan
    # names beside the points ran off the figure and over each other. Identical results are one point.
    key_lines = [f"{i}{' *' if front & set(p.keys) else ''}  {p.label}" for i, p in enumerate(points, 1)]
    fig = plt.figure(figsize=(8.0, 4.4 + 0.17 * len(key_lines)))
    ax = fig.add_axes(
        (0.1, 1 - 3.6 / (4.4 + 0.17 * len(key_lines)), 0.86, 3.1 / (4.4 + 0.17 * len(key_lines)))
    )
    xs = [p.time_s for p in points]
    ys = [p.usd_per_mtok for p in points]
    ax.scatter(xs, ys, s=18, color="0.6", label="plans")
    for i, p in enumerate(points, 1):
        ax.annotate(str(i), (p.time_s, p.usd_per_mtok), fontsize=8, xytext=(4, 3), textcoords="offset points")
    pf = sorted((p.time_s, p.usd_per_mtok) for p in points if front & set(p.keys))
    ax.plot([p[0] for p in pf], [p[1] for p in pf], "o-", color="C3", label="Pareto front")
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("$ per million tokens")
    on_front = sum(1 for p in points if front & set(p.keys))
    ax.set_title(f"{len(ok)} plans at {len(points)} distinct points, {on_front} on the front (*)")
    ax.legend()
    fig.text(
        0.02, 0.01, "\n".join(line if len(line) <= 150 else line[:147] + "..." for line in key_lines),
        fontsize=6.5, family="monospace", va="bottom",
    )  # fmt: skip
    path = plot_path(path)
    import io

    from xsim.traces.outputs import atomic_write_bytes, check_target

    # Drawn in memory, then renamed into place: never over a symbolic link, the sweep file or an input.
    check_target(path, inputs)
    buf = io.BytesIO()
    try:
        fig.savefig(buf, dpi=120, format=os.path.splitext(path)[1][1:].lower() or "png")
    except ValueError as exc:  # a suffix matplotlib cannot write ("Format 'txt' is not supported")
        raise SweepError(f"--plot {path}: {_one_line(exc)}") from None
    finally:
        plt.close(fig)
    atomic_write_bytes(path, buf.getvalue(), inputs)
    return path


@dataclass(frozen=True)
class SweepRun:
    """What one `run_sweep` did."""

    planned: int
    skipped: int  # rows already in the dataset
    ran: int
    failed: int  # of the plans run now
    wall_s: float
    workers: int
    failed_before: int = 0  # skipped rows that hold an error or oom (--retry-failed runs them again)


def _client(scheduler: str | None, workers: int):
    from distributed import Client, LocalCluster

    if scheduler:
        from xsim.explore.scheduler import probe_scheduler

        probe_scheduler(scheduler)  # a non-Dask or silent server: one line, within bounded time
        try:
            return Client(scheduler, timeout="30s"), None
        except (OSError, TimeoutError, ValueError) as exc:
            raise SweepError(
                f"--scheduler {scheduler}: cannot reach a Dask scheduler: {_one_line(exc)}"
            ) from None
    # Processes, one thread each: the replay is pure Python (the GIL), so threads would not run in parallel.
    # Loopback only, no dashboard, no memory limit (a loaded machine must not get plans killed for RSS).
    cluster = LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=":0",  # a free port: never clash with a dashboard already on 8787
        memory_limit=0,
        # CRITICAL, not ERROR: on a loaded machine a worker's heartbeat can race the cluster's close and
        # log a traceback at ERROR ("Failed to communicate with scheduler during heartbeat"); a plan's own
        # failure comes back through its future, so nothing a user needs is lost.
        silence_logs=logging.CRITICAL,
    )
    return Client(cluster), cluster


def run_sweep(
    tasks: Sequence[PlanTask],
    out: str,
    *,
    workers: int = 2,
    scheduler: str | None = None,
    retry_failed: bool = False,
    progress: bool = False,
    on_row: Callable[[dict[str, Any], Any], None] | None = None,
) -> SweepRun:
    """Run every plan not yet in the dataset under `out` on Dask; each finished plan appends its row."""
    t0 = time.perf_counter()
    os.makedirs(out, exist_ok=True)
    done = read_rows(out)
    ok = set(done.filter(status="ok")["key"].to_list())
    have = ok if retry_failed else set(done["key"].to_list())
    todo = [t for t in tasks if t.key not in have]
    # A failed row from an earlier run (disk full, a lost worker) stays failed until --retry-failed: count it.
    failed_before = sum(t.key in have and t.key not in ok for t in tasks)
    failed = 0
    if todo:
        from distributed import as_completed

        client, cluster = _client(scheduler, workers)
        try:
            futures = {
                client.submit(run_plan, t, key=f"xsim-plan-{t.key}-{time.time_ns()}", pure=False): t
                for t in todo
            }
            with _progress(progress, len(todo)) as advance:
                for fut in as_completed(futures):
                    task = futures[fut]
                    try:
                        row = fut.result()
                    except Exception as exc:  # noqa: BLE001 - e.g. KilledWorker after Dask's retries
                        row = _row(task, status="error", error=f"task lost: {_one_line(exc)}", wall_s=0.0)
                    write_row(out, row)
                    failed += row["status"] != "ok"
                    advance()
                    if on_row is not None:
                        on_row(row, client)
        finally:
            client.close()
            if cluster is not None:
                cluster.close()
    n_workers = workers if scheduler is None else 0
    return SweepRun(
        len(tasks),
        len(tasks) - len(todo),
        len(todo),
        failed,
        time.perf_counter() - t0,
        n_workers,
        failed_before,
    )


class _progress:
    """A rich progress bar over plans on stderr (a no-op when disabled)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total = enabled, total

    def __enter__(self) -> Callable[[], None]:
        if not self.enabled:
            self.bar = None
            return lambda: None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        self.bar = Progress(
            "plans", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=Console(stderr=True)
        )
        self.bar.__enter__()
        tid = self.bar.add_task("plans", total=self.total)
        return lambda: self.bar.advance(tid)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)


def rows_for(tasks: Iterable[PlanTask], out: str) -> pl.DataFrame:
    """The dataset's rows of these plans (a dataset may hold rows of earlier, different sweeps)."""
    keys = [t.key for t in tasks]
    return read_rows(out).filter(pl.col("key").is_in(keys))
