"""`xsim rewrite TRACEDIR --spec SPEC --reshard S --out DIR`: insert gradient sync, barriers, resharding."""

from __future__ import annotations

import argparse

# The strategy names from the import-free tuple (equal to tracegen.planner.reshard.STRATEGY_NAMES, a test
# checks): `xsim --help` need not load the strategies.
from xsim.tracegen.choices import RESHARD_STRATEGIES
from xsim.verbs import add_verb


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `rewrite` verb."""
    p = add_verb(
        subparsers,
        "rewrite",
        help="rewrite a generated trace set for heterogeneous sync and resharding",
        description="Insert the heterogeneous gradient synchronization (LCM multi-rings), DP/pipeline "
        "barriers and stage-boundary resharding into a trace set generated with `xsim gen --no-rewrite`.",
        examples=(
            "xsim gen examples/figure1.yaml --out out/raw --no-rewrite",
            "xsim rewrite out/raw --reshard hetauto --out out/hetauto",
        ),
    )
    p.add_argument("traces", metavar="TRACEDIR", help="trace folder, <prefix> or one .et file")
    p.add_argument("--spec", help="deployment spec (default: deployment.json beside the traces)")
    p.add_argument(
        "--reshard", choices=RESHARD_STRATEGIES, help="strategy (default: the spec's reshard, else xsim)"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created if missing)")
    p.add_argument("--no-barriers", action="store_true", help="omit the DP and pipeline BARRIER collectives")
    p.add_argument(
        "--force", action="store_true", help="replace a DIR holding files xsim did not write, as a whole"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Rewrite the set, write it with comm_group.json and deployment.json, print what changed."""
    from xsim import api

    dep, s = api.rewrite(
        args.traces,
        args.out,
        spec=args.spec,
        reshard=args.reshard,
        barriers=not args.no_barriers,
        force=args.force,
    )
    print(
        f"rewrote {s.ranks} ranks ({dep.reshard}): {s.nodes_before} -> {s.nodes_after} nodes, "
        f"{s.inserted} inserted, {s.groups_added} new process groups; wrote {args.out}/{s.name}.<rank>.et"
    )
    return 0
