"""`xsim demo`: the README's first command; runs xsim's main job on a bundled example.

Generate the paper's Figure 1 deployment (Llama-2 7B on 5 H100 + 5 A100, two DP replicas cut differently,
TP 3/2 and 2/3), apply the heterogeneity-aware rewrite, replay it on the derived Table 5 cluster, and write the
tables and a Perfetto timeline.
"""

from __future__ import annotations

import argparse
import os

from netmodels.models import model_names
from xsim.verbs import add_verb


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
    if args.spec is None:
        from tracegen.bundled import example_spec

        args.spec = example_spec("figure1.yaml")
    traces = os.path.join(args.out, "traces")
    result = os.path.join(args.out, "result")
    steps = [
        # Figure 1 keeps full Adam state and micro-batches of 8-16 on 40 GB A100s: it does not fit, and the
        # demo shows by how much (docs/decide.md) instead of stopping.
        (
            "the plan: DP groups, LCM multi-rings, chunks, barrier groups, memory per rank",
            ["plan", args.spec, "--allow-oom"],
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
    for title, argv in steps:
        rc = _step(title, argv)
        if rc:
            return rc
    print(
        f"\ntables: {result}/{{ops,ranks,collectives}}.parquet, summary.json; timeline: {result}/timeline.json"
    )
    print("open the timeline in Perfetto (ui.perfetto.dev), chrome://tracing or speedscope")
    print(f"one HTML page with plots: xsim report {result} --out {os.path.join(result, 'report.html')}")
    return 0
