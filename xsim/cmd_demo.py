"""`xsim demo`: the README's first command; runs xsim's main job on a bundled example.

Plan, generate, validate and replay the paper's Figure 1 deployment (Llama-2 7B on 5 H100 + 5 A100, two DP
replicas cut differently, TP 3/2 and 2/3) made to fit in memory with 1F1B and full recompute, with the
heterogeneity-aware rewrite, on the derived Table 5 cluster; write the tables, a Perfetto timeline and an
HTML report, and say what the paper's plan as drawn would need.
"""

from __future__ import annotations

import argparse
import os

from xsim.netmodels.models import model_names
from xsim.verbs import add_verb

# Figure 1 exactly as the paper draws it (examples/figure1_paper.yaml); figure1.yaml is it made to fit.
PAPER_SPEC = "figure1_paper.yaml"


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `demo` verb."""
    p = add_verb(
        sub,
        "demo",
        help="generate, rewrite and replay the paper's Figure 1 deployment (bundled example)",
        description=" ".join(__doc__.split("\n\n")[1].split()) if __doc__ else None,
        examples=("xsim demo", "xsim demo --model analytical --out out/demo-analytical"),
    )
    p.add_argument("--spec", help="deployment spec to run (default: the bundled figure1.yaml)")
    p.add_argument("--out", default="out/demo", help="folder for the demo's outputs (default: out/demo)")
    p.add_argument(
        "--model", choices=model_names("topology"), default="flow", help="network model (default: flow)"
    )
    p.set_defaults(func=_demo)


def _step(title: str, argv: list[str]) -> int:
    from xsim import cli

    print(f"\n== {title}\n$ xsim {' '.join(argv)}", flush=True)
    return cli.main(argv)


def _demo(args: argparse.Namespace) -> int:
    bundled = args.spec is None
    if bundled:
        from xsim.tracegen.bundled import example_spec

        args.spec = example_spec("figure1.yaml")
    traces = os.path.join(args.out, "traces")
    result = os.path.join(args.out, "result")
    steps = [
        (
            "the plan: DP groups, LCM multi-rings, chunks, barrier groups, memory per rank",
            ["plan", args.spec],
        ),
        (
            "generate per-rank Chakra traces (with the xsim reshard rewrite)",
            ["gen", args.spec, "--out", traces],
        ),
        ("validate the generated trace set", ["trace", "validate", traces]),
        (
            f"replay on the derived cluster ({args.model} network model)",
            [
                "replay",
                traces,
                "--model",
                args.model,
                "--out",
                result,
                "--timeline",
                os.path.join(result, "timeline.json"),
                "--no-progress",
            ],
        ),
    ]
    steps.append(
        (
            "one HTML page: summary, time per rank, layers and phases, a Gantt",
            ["report", result, "--out", os.path.join(result, "report.html")],
        )
    )
    for title, argv in steps:
        rc = _step(title, argv)
        if rc:
            return rc
    print(
        f"\ntables: {result}/{{ops,ranks,collectives}}.parquet, summary.json; timeline: {result}/timeline.json"
    )
    print("open the timeline in Perfetto (ui.perfetto.dev), chrome://tracing or speedscope")
    if bundled:
        print(paper_plan_line())
    return 0


def paper_plan_line() -> str:
    """One line: what the paper's Figure 1 plan as drawn (GPipe, no recompute) would need, and what fits."""
    from xsim import api
    from xsim.tracegen.bundled import example_spec
    from xsim.tracegen.memory import deployment_memory, shortfall

    spec = example_spec(PAPER_SPEC)
    short = shortfall(deployment_memory(api.load_spec(spec)))
    if short is None:
        return f"the paper's plan as drawn ({PAPER_SPEC}) fits too"
    return (
        f"the paper's plan as drawn ({PAPER_SPEC}: GPipe, no recompute) would not fit: {short}); "
        "this demo ran it with 1F1B and full recompute"
    )
