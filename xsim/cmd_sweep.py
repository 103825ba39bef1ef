"""`xsim sweep SWEEP.yaml | SPEC...`: generate and replay deployment plans; compare time, throughput and cost.

A sweep file (a base spec and axes, docs/decide.md) runs on Dask (xsim/explore/sweep.py): an embedded
LocalCluster by default, `--scheduler ADDRESS` for an existing one; rows go to a Parquet dataset under --out.

Each spec goes through exactly what `xsim gen` and `xsim replay --json` do (same defaults, same cluster
derivation), so a sweep row equals the replay of that spec on its own.
"""

from __future__ import annotations

import argparse
import json
import os

from xsim.netmodels.models import model_names
from xsim.traces.errors import XsimError
from xsim.verbs import add_gpu_file_argument, add_verb


def _usd(r: dict) -> tuple[bool, float]:
    return r["cost_usd_per_million_tokens"] is None, r["cost_usd_per_million_tokens"] or 0.0


# Plans that do not fit in GPU memory sort after every plan that does (issue 26 item 5); throughput ties
# break on $ per M tokens and the other way round.
SORT_KEYS = {
    "time": lambda r: (not r["fits"], r["iteration_time_ns"], r["spec"]),
    "throughput": lambda r: (not r["fits"], -(r["tokens_per_s"] or 0.0), *_usd(r), r["spec"]),
    "cost": lambda r: (not r["fits"], *_usd(r), -(r["tokens_per_s"] or 0.0), r["spec"]),
}
DEFAULT_SORT = "throughput"  # xsim.explore.sweep.DEFAULT_SORT: tokens/s, then $ per M tokens


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `sweep` verb."""
    p = add_verb(
        sub,
        "sweep",
        help="generate and replay several deployment specs; compare iteration time, tokens/s and cost",
        description=__doc__.splitlines()[0] if __doc__ else None,
        examples=("xsim sweep examples/table4_c0*.yaml --sort cost",),
    )
    p.add_argument(
        "specs",
        nargs="+",
        metavar="SPEC",
        help="one sweep file (base + axes; at most 4,096 plans, XSIM_MAX_SWEEP_PLANS raises it; exit 1 when "
        "no plan finished), or deployment specs (.yaml, .toml, .json)",
    )
    p.add_argument(
        "--out", default="out/sweep", help="folder for each spec's traces and results (default: out/sweep)"
    )
    p.add_argument(
        "--model",
        choices=model_names("topology"),
        default="analytical",
        help="network model (default: analytical); analytical is contention-free (concurrent transfers "
        "never share a link), flow shares links",
    )
    p.add_argument(
        "--sort",
        choices=sorted(SORT_KEYS),
        default=DEFAULT_SORT,
        help="order of the table (default: throughput, tokens/s then $/Mtok; plans of different global batches "
        "compare by it, not by iteration time); plans that do not fit in memory come last",
    )
    p.add_argument(
        "--drop-oom", action="store_true", help="leave plans that do not fit in GPU memory out of the table"
    )
    p.add_argument("--json", action="store_true", help="print one JSON list of rows")
    add_gpu_file_argument(p)
    d = p.add_argument_group("sweep files (docs/decide.md)")
    d.add_argument("--workers", type=int, default=2, help="workers of the embedded Dask LocalCluster (2)")
    d.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="use this Dask scheduler (tcp://host:8786) instead (sweep files only: SPEC lists are refused)",
    )
    d.add_argument("--allow-oom", action="store_true", help="replay plans that do not fit in GPU memory")
    d.add_argument("--retry-failed", action="store_true", help="run again plans whose row holds an error")
    d.add_argument("--plot", metavar="FILE.png", help="Pareto plot (default: <out>/pareto.png)")
    d.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_locked)


def _name(spec: str) -> str:
    return os.path.splitext(os.path.basename(spec))[0]


def _row(spec: str, args: argparse.Namespace) -> dict:
    """Generate and replay one spec file through the library (xsim/explore/pipeline.py), as gen + replay do."""
    from xsim.api import check_cluster
    from xsim.explore.pipeline import gen_and_replay
    from xsim.explore.sweep import gpu_mix
    from xsim.netmodels.errors import NetworkModelError
    from xsim.tracegen.spec import load_spec, read_gpu_file

    name = _name(spec)
    dep = load_spec(spec, None, read_gpu_file(args.gpu_file) if args.gpu_file else None)
    check_cluster(dep, spec)
    dep.name = name
    try:
        rep = gen_and_replay(dep, os.path.join(args.out, name), args.model)
    except OSError as exc:
        raise XsimError(f"{spec}: cannot write under {args.out}: {exc.strerror or exc}") from None
    except (XsimError, NetworkModelError) as exc:
        raise XsimError(f"{spec}: {exc}") from None
    s, cost = rep.summary, rep.cost
    return {
        "spec": spec,
        "ranks": s["num_ranks"],
        "gpus": gpu_mix(dep),
        "iteration_time_ns": s["iteration_time_ns"],
        "tokens_per_s": cost.get("tokens_per_s"),
        "cost_usd_per_iteration": cost.get("cost_usd_per_iteration"),
        "cost_usd_per_million_tokens": cost.get("cost_usd_per_million_tokens"),
        "wait_ns_max": s["wait_ns_max"],
        "bubble_ns_max": s["bubble_ns_max"],
        "exposed_comm_ns": s["exposed_comm_ns"],
        "peak_memory_bytes": max(m.total for m in rep.memory),
        "fits": all(m.headroom >= 0 for m in rep.memory),
        "result": os.path.join(args.out, name, "result"),
    }


def _is_sweep_file(specs: list[str]) -> bool:
    if len(specs) != 1 or not os.path.isfile(specs[0]):
        return False
    from xsim.tracegen.spec import read_spec_file

    return "axes" in read_spec_file(specs[0])


def run_file(args: argparse.Namespace) -> int:
    """Expand a sweep file, run its plans on Dask, print the sorted rows and the Pareto front."""
    import polars as pl

    from xsim.explore import sweep as sw

    if args.workers < 1:
        raise XsimError(f"--workers must be >= 1, got {args.workers}")
    plan = sw.load_sweep(args.specs[0])
    sw.check_sweep_size(plan, args.specs[0])
    from xsim.tracegen.spec import read_gpu_file

    defs = read_gpu_file(args.gpu_file) if args.gpu_file else None
    tasks = sw.expand(plan, args.out, allow_oom=args.allow_oom, gpu_file=defs)
    done = sw.run_sweep(
        tasks,
        args.out,
        workers=args.workers,
        scheduler=args.scheduler,
        retry_failed=args.retry_failed,
        progress=not args.no_progress and not args.json,
    )
    rows = sw.sort_rows(sw.rows_for(tasks, args.out), args.sort)
    too_big = pl.col("min_headroom_bytes").fill_null(0) < 0  # `oom` rows, and --allow-oom plans that ran
    n_oom = int(rows.select(too_big.sum()).item())
    if args.drop_oom:
        rows = rows.filter(~too_big)
    front = set(sw.pareto_keys(rows))
    plot = sw.plot_pareto(rows, args.plot or os.path.join(args.out, "pareto.png"), tuple(args.specs))
    # Exit 1 when no plan of the sweep finished (every row oom or error, this run's or an earlier one's): a
    # sweep whose plans all failed has no answer. Some failures are what a sweep is for (plans that do not
    # fit, combinations that do not resolve), so one finished plan is exit 0 (docs/decide.md).
    status = 0 if (rows["status"] == "ok").any() else 1
    if args.json:
        print(json.dumps(rows.drop("spec").to_dicts(), indent=1))
        return status
    _print_table(rows, sw.fits_column(rows), front)
    _print_footer(args, done, n_oom, plot, status)
    return status


def _print_table(rows, fits_column, front: set) -> None:
    """One line per plan (and its error under a failed one); * marks the Pareto front."""
    print(
        f"{'plan':<32} {'status':<6} {'GPUs':<20} {'iteration s':>11} {'tokens/s':>9} {'$/Mtok':>8} "
        f"{'peak GiB':>8} {'fits':>4}  key"
    )
    for r, fits in zip(rows.iter_rows(named=True), fits_column, strict=True):
        it = "-" if r["iteration_time_ns"] is None else f"{r['iteration_time_ns'] / 1e9:.4f}"
        tps = "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"
        usd = "-" if r["cost_usd_per_million_tokens"] is None else f"{r['cost_usd_per_million_tokens']:.4f}"
        peak = "-" if r["peak_memory_bytes"] is None else f"{r['peak_memory_bytes'] / 2**30:.1f}"
        star = "*" if r["key"] in front else " "
        # The plan's name is its axis values (readable); the hash key names its folder under --out.
        print(
            f"{r['label'] + star:<32} {r['status']:<6} {r['gpus'] or '-':<20} {it:>11} {tps:>9} {usd:>8} "
            f"{peak:>8} {fits:>4}  {r['key']}"
        )
        if r["status"] != "ok":
            print(f"{'':<33}{r['error']}")


def _print_footer(args: argparse.Namespace, done, n_oom: int, plot: str | None, status: int) -> None:
    """The plans left out or sorted last for memory, then what ran, what failed and where the plot is."""
    if n_oom:
        print(
            f"{n_oom} plans do not fit in GPU memory: "
            + (
                "left out (--drop-oom)"
                if args.drop_oom
                else "fits = NO, sorted last; --drop-oom leaves them out"
            )
        )
    failed = done.failed + done.failed_before
    before = (
        f" ({done.failed_before} in an earlier run: --retry-failed runs them again)"
        if done.failed_before
        else ""
    )
    print(
        f"{done.planned} plans: {done.ran} run, {done.skipped} already in {args.out}/rows, {failed} failed{before}; "
        f"{done.wall_s:.1f} s; sorted by {args.sort}; * = Pareto front (time vs $/Mtok)"
        + (f"; plot {plot}" if plot else "")
        + ("; no plan finished (exit 1)" if status else "")
    )


def run_locked(args: argparse.Namespace) -> int:
    """`run` holding the writers' lock of --out: a second sweep into it waits, then is refused in one line."""
    from xsim.traces.outputs import folder_lock

    with folder_lock(args.out):
        return run(args)


def run(args: argparse.Namespace) -> int:
    """Generate and replay every spec, then print the comparison."""
    from xsim.tracegen.spec import NAME_RE

    if _is_sweep_file(args.specs):
        return run_file(args)
    if args.scheduler:
        # Spec files run here, one after another (each as `xsim gen` + `xsim replay` would); only a sweep
        # file's plans are Dask tasks. Silently running in process instead was issue 31.
        raise XsimError(
            "--scheduler runs a sweep file's plans on Dask; SPEC files run in this process: drop --scheduler, "
            "or list them as a sweep file (docs/decide.md)"
        )
    seen: dict[str, str] = {}
    for spec in args.specs:
        if not NAME_RE.match(_name(spec)):
            raise XsimError(
                f"{spec}: {_name(spec)!r} cannot name its traces (letters, digits, . _ -): rename it"
            )
        if _name(spec) in seen:
            # One output folder per name: the later spec would overwrite the earlier one's traces and result.
            raise XsimError(
                f"{spec}: same name {_name(spec)!r} as {seen[_name(spec)]}; both would write "
                f"{os.path.join(args.out, _name(spec))} (rename one)"
            )
        seen[_name(spec)] = spec
    rows = sorted((_row(spec, args) for spec in args.specs), key=SORT_KEYS[args.sort])
    oom = [r for r in rows if not r["fits"]]
    if args.drop_oom:
        rows = [r for r in rows if r["fits"]]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0

    def money(v: float | None) -> str:
        return "-" if v is None else f"{v:,.4f}"

    print(
        f"{'spec':<28} {'GPUs':<22} {'iteration s':>12} {'tokens/s':>10} {'$/iter':>9} {'$/Mtok':>9} "
        f"{'max wait s':>11} {'peak GiB':>9} {'fits':>4}"
    )
    for r in rows:
        tps = "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"
        print(
            f"{os.path.basename(r['spec']):<28} {r['gpus']:<22} {r['iteration_time_ns'] / 1e9:>12.4f} {tps:>10} "
            f"{money(r['cost_usd_per_iteration']):>9} {money(r['cost_usd_per_million_tokens']):>9} "
            f"{r['wait_ns_max'] / 1e9:>11.4f} {r['peak_memory_bytes'] / 2**30:>9.1f} {'yes' if r['fits'] else 'NO':>4}"
        )
    if oom:
        names = ", ".join(_name(r["spec"]) for r in oom)
        print(
            f"{len(oom)} of {len(args.specs)} plans do not fit in GPU memory ({names}): "
            + (
                "left out (--drop-oom)"
                if args.drop_oom
                else "fits = NO, sorted last; --drop-oom leaves them out"
            )
        )
    print(f"results under {args.out}/<spec>/result; sorted by {args.sort}")
    return 0
