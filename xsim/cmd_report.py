"""`xsim report RESULTDIR --out report.html`: one self-contained HTML page about a replay."""

from __future__ import annotations

import argparse

from xsim.verbs import add_verb


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `report` verb."""
    p = add_verb(
        sub,
        "report",
        help="write one self-contained HTML page about a replay result folder",
        description="Summary, per-rank time shares, per-layer and per-phase op time, top collectives by "
        "exposed time, a Gantt of a few ranks and, for an imported run, the validation figure; plots are "
        "inline SVG (matplotlib), so the page needs no network.",
        examples=(
            "xsim replay out/fig1 --out out/res && xsim report out/res --out out/res/report.html",
            "xsim report out/ddp/res --validation out/ddp/val --out out/ddp/report.html  # with `xsim validate`'s",
        ),
    )
    p.add_argument("result", metavar="RESULTDIR", help="folder written by `xsim replay --out`")
    p.add_argument("--out", required=True, metavar="FILE.html", help="the page to write")
    p.add_argument(
        "--validation",
        metavar="DIR",
        help="folder written by `xsim validate --out` (default: RESULTDIR when it holds layers.csv)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the report and say where."""
    from xsim.replay.export.report import write_report

    path = write_report(args.result, args.out, args.validation)
    print(f"wrote {path}")
    return 0
