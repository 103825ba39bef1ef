"""`xsim plan SPEC [--json]`: DP groups, multi-rings, chunks and barrier groups of a deployment."""

from __future__ import annotations

import argparse
import json

from xsim.verbs import add_verb


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `plan` verb."""
    p = add_verb(
        subparsers,
        "plan",
        help="show the heterogeneity-aware plan (DP groups, rings, chunks, barrier groups) of a spec",
        description="Run the planner (sweep-line DP groups, LCM multi-rings and chunking, barrier groups, "
        "pipeline boundaries) on a deployment spec and print it.",
        examples=("xsim plan examples/figure1.yaml", "xsim plan examples/figure1.yaml --json"),
    )
    p.add_argument("spec", help="deployment spec (.yaml, .yml, .toml or .json)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON (keys in docs/planner.md)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Plan and print."""
    from tracegen.planner import format_plan, plan_to_json
    from xsim import api

    plan = api.plan(args.spec)
    if args.json:
        print(json.dumps(plan_to_json(plan), indent=2))
    else:
        print(format_plan(plan))
    return 0
