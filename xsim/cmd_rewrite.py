"""`xsim rewrite TRACEDIR --spec SPEC --reshard S --out DIR`: insert gradient sync, barriers, resharding."""

from __future__ import annotations

import argparse
import os

from tracegen.reshard import STRATEGY_NAMES
from tracegen.rewrite import rewrite_trace_set
from tracegen.spec import load_spec, save_deployment
from traces.errors import XsimError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `rewrite` verb."""
    p = subparsers.add_parser(
        "rewrite",
        help="rewrite a generated trace set for heterogeneous sync and resharding",
        description="Insert the heterogeneous gradient synchronization (LCM multi-rings), DP/pipeline "
        "barriers and stage-boundary resharding into a trace set generated with `xsim gen --no-rewrite`.",
    )
    p.add_argument("traces", metavar="TRACEDIR", help="trace folder, <prefix> or one .et file")
    p.add_argument("--spec", help="deployment spec (default: deployment.json beside the traces)")
    p.add_argument("--reshard", choices=STRATEGY_NAMES, help="strategy (default: the spec's reshard)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created if missing)")
    p.add_argument("--no-barriers", action="store_true", help="omit the DP and pipeline BARRIER collectives")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the spec, rewrite the set, write it with comm_group.json and deployment.json."""
    spec = args.spec
    if spec is None:
        folder = args.traces if os.path.isdir(args.traces) else os.path.dirname(args.traces) or "."
        spec = os.path.join(folder, "deployment.json")
        if not os.path.isfile(spec):
            raise XsimError(f"{args.traces}: no deployment.json beside the traces: pass --spec")
    dep = load_spec(spec)
    dep.reshard = args.reshard or dep.reshard or "xsim"
    s = rewrite_trace_set(args.traces, dep, dep.reshard, args.out, barriers=not args.no_barriers)
    save_deployment(dep, os.path.join(args.out, "deployment.json"))
    print(
        f"rewrote {s.ranks} ranks ({dep.reshard}): {s.nodes_before} -> {s.nodes_after} nodes, "
        f"{s.inserted} inserted, {s.groups_added} new process groups; wrote {args.out}/{s.name}.<rank>.et"
    )
    return 0
