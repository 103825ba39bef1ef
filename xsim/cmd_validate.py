"""`xsim validate --real KINETO... --sim RESULTDIR [--out DIR]`: layer-wise measured vs simulated time."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from xsim.verbs import add_verb


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `validate` verb."""
    p = add_verb(
        sub,
        "validate",
        help="compare a replay of an imported run with the real run, per layer, op class and step",
        description="Measured (Kineto) vs simulated time per layer and op class, and the step-time error "
        "(steps from ProfilerStep#N, or --window). RESULTDIR is what `xsim replay --out` wrote for a trace set "
        "that `xsim import pytorch` produced. It first checks that --real is that run (one file per rank, "
        "distinct ranks and processes, the process the import recorded, the trace's steps, and at least 90% "
        "of its ops at their recorded start) and refuses a mismatch; measured times come from --real.",
        examples=(
            "d=traces/examples/pytorch",
            "xsim import pytorch --et $d/tinygpt_1rank_et.0.json.gz --kineto $d/tinygpt_1rank_kineto.0.json.gz "
            "--out out/tiny/run",
            "xsim replay out/tiny/run --comm measured --out out/tiny/sim",
            "xsim validate --real $d/tinygpt_1rank_kineto.0.json.gz --sim out/tiny/sim --out out/tiny/validation",
        ),
    )
    p.add_argument(
        "--real", nargs="+", required=True, metavar="KINETO.json[.gz]", help="Kineto traces, one per rank"
    )
    p.add_argument("--sim", required=True, metavar="RESULTDIR", help="folder written by `xsim replay --out`")
    p.add_argument(
        "--trace", metavar="PREFIX", help="the replayed trace set (default: RESULTDIR/source.json)"
    )
    p.add_argument(
        "--out", metavar="DIR", help="write layers/classes/steps CSV, validation.json and validation.png"
    )
    p.add_argument(
        "--window",
        metavar="RANGE",
        help="for Kineto traces without ProfilerStep#N: compare ops starting in START:END of the run "
        "(e.g. 0ms:20ms, from its first op), the op range ops:FIRST:LAST (node ids) or 'matched' (every op "
        "found in --real) as one step",
    )
    p.add_argument("--json", action="store_true", help="print validation.json to stdout")
    p.set_defaults(func=run)


def _row(name: str, m: int, s: int, e: float | None) -> str:
    err = fmt_pct(e)
    return f"  {name:<14} {m / 1e6:>12.3f} {s / 1e6:>12.3f} {err:>9}"


def fmt_pct(e: float | None) -> str:
    """A signed error, or "n/a" where none is defined (no measured time): never "nan"."""
    return "n/a" if e is None or (isinstance(e, float) and not math.isfinite(e)) else f"{e:+.2f}%"


def run(args: argparse.Namespace) -> int:
    """Run the comparison, print the tables and write the files."""
    from xsim.replay.validate import parse_window, validate

    window = parse_window(args.window) if args.window else None
    v = validate(args.real, args.sim, args.trace, window)
    written = v.save(args.out) if args.out else []
    if args.json:
        json.dump(v.to_json(), sys.stdout, allow_nan=False)
        sys.stdout.write("\n")
        return 0
    found = ", ".join(f"rank {r} {m:,}/{n:,}" for r, m, n in v.matched)
    print(f"same run: ops of the trace set found in --real at their recorded start: {found}")
    head = f"  {'':<14} {'measured ms':>12} {'simulated ms':>12} {'error':>9}"
    print("per layer (0 = outside the layers):")
    print(head)
    for r in v.layers.iter_rows(named=True):
        print(_row(f"layer {r['layer']}", r["measured_ns"], r["simulated_ns"], r["error_pct"]))
    print("per op class:")
    print(head)
    for r in v.classes.iter_rows(named=True):
        print(_row(r["op_class"], r["measured_ns"], r["simulated_ns"], r["error_pct"]))
    print('steps ("job" = first rank in to last rank out):')
    print(head)
    for r in v.steps.iter_rows(named=True):
        who = "job" if r["rank"] == -1 else f"r{r['rank']}"
        print(_row(f"{who} step {r['step']}", r["measured_ns"], r["simulated_ns"], r["error_pct"]))
    print(
        f"step-time error {fmt_pct(v.step_error_pct())}" + (" (the --window as one step)" if window else "")
    )
    if args.out:
        names = ", ".join(os.path.basename(p) for p in written)
        print(f"wrote {args.out}: {names}")
        if not any(p.endswith(".png") for p in written):
            print("no validation.png: matplotlib is not installed (pip install 'xsim-replay[plot]')")
    return 0
