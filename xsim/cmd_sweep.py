"""`xsim sweep SPEC...`: generate and replay several deployment plans and compare time, throughput and cost.

Each spec goes through exactly what `xsim gen` and `xsim replay --json` do (same defaults, same cluster
derivation), so a sweep row equals the replay of that spec on its own.
"""

from __future__ import annotations

import argparse
import json
import os

from netmodels.models import model_names
from xsim.verbs import add_verb

SORT_KEYS = {
    "time": lambda r: (r["iteration_time_ns"], r["spec"]),
    "throughput": lambda r: (-(r["tokens_per_s"] or 0.0), r["spec"]),
    "cost": lambda r: (
        r["cost_usd_per_million_tokens"] is None,
        r["cost_usd_per_million_tokens"] or 0.0,
        r["spec"],
    ),
}


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `sweep` verb."""
    p = add_verb(
        sub,
        "sweep",
        help="generate and replay several deployment specs; compare iteration time, tokens/s and cost",
        description=__doc__.splitlines()[0] if __doc__ else None,
        examples=("xsim sweep examples/table4_c0*.yaml --sort cost",),
    )
    p.add_argument("specs", nargs="+", metavar="SPEC", help="deployment specs (.yaml, .toml, .json)")
    p.add_argument(
        "--out", default="out/sweep", help="folder for each spec's traces and results (default: out/sweep)"
    )
    p.add_argument(
        "--model",
        choices=model_names("topology"),
        default="analytical",
        help="network model (default: analytical)",
    )
    p.add_argument(
        "--sort", choices=sorted(SORT_KEYS), default="time", help="order of the table (default: time)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON list of rows")
    p.set_defaults(func=run)


def _name(spec: str) -> str:
    return os.path.splitext(os.path.basename(spec))[0]


def _row(spec: str, args: argparse.Namespace) -> dict:
    name = _name(spec)
    traces = os.path.join(args.out, name, "traces")
    result = os.path.join(args.out, name, "result")
    from xsim import api

    # Exactly what `xsim gen` and `xsim replay --json` do, through the same API calls.
    api.generate(spec, api.GenerateOptions(out=traces, name=name))
    run = api.simulate(traces, api.ReplayOptions(network=api.NetworkOptions(model=args.model)))
    api.write_outputs(run, api.OutputOptions(out=result))
    s = run.summary()
    cost = s.get("cost") or {}
    gpus: dict[str, int] = {}
    for dg in run.deployment.device_groups:
        gpus[dg.gpu] = gpus.get(dg.gpu, 0) + len(dg.ranks)
    return {
        "spec": spec,
        "ranks": s["num_ranks"],
        "gpus": "+".join(f"{n}x{g}" for g, n in sorted(gpus.items())),
        "iteration_time_ns": s["iteration_time_ns"],
        "tokens_per_s": cost.get("tokens_per_s"),
        "cost_usd_per_iteration": cost.get("cost_usd_per_iteration"),
        "cost_usd_per_million_tokens": cost.get("cost_usd_per_million_tokens"),
        "wait_ns_max": s["wait_ns_max"],
        "bubble_ns_max": s["bubble_ns_max"],
        "exposed_comm_ns": s["exposed_comm_ns"],
        "result": result,
    }


def run(args: argparse.Namespace) -> int:
    """Generate and replay every spec, then print the comparison."""
    from tracegen.spec import NAME_RE
    from traces.errors import XsimError

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
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0

    def money(v: float | None) -> str:
        return "-" if v is None else f"{v:,.4f}"

    print(
        f"{'spec':<28} {'GPUs':<22} {'iteration s':>12} {'tokens/s':>10} {'$/iter':>9} {'$/Mtok':>9} {'max wait s':>11}"
    )
    for r in rows:
        tps = "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"
        print(
            f"{os.path.basename(r['spec']):<28} {r['gpus']:<22} {r['iteration_time_ns'] / 1e9:>12.4f} {tps:>10} "
            f"{money(r['cost_usd_per_iteration']):>9} {money(r['cost_usd_per_million_tokens']):>9} "
            f"{r['wait_ns_max'] / 1e9:>11.4f}"
        )
    print(f"results under {args.out}/<spec>/result; sorted by {args.sort}")
    return 0
