"""`xsim import pytorch --et ET... --kineto KINETO... --out PREFIX`: real PyTorch profiles -> Chakra trace set."""

from __future__ import annotations

import argparse
import json
import sys

from xsim.traces.wording import plural
from xsim.verbs import add_verb


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `import` verb and its `pytorch` sub-command."""
    p = add_verb(
        sub,
        "import",
        help="import real profiles as a Chakra trace set",
        examples=(
            "xsim import pytorch --et et.0.json.gz et.1.json.gz --kineto k.0.json.gz k.1.json.gz --out out/run",
        ),
    )
    isub = p.add_subparsers(dest="import_command", metavar="SOURCE", required=True)
    pt = add_verb(
        isub,
        "pytorch",
        help="PyTorch execution trace + Kineto trace, one pair per rank",
        description="Join each rank's host execution trace (ExecutionTraceObserver JSON, schemas 1.0.1-1.1.1) "
        "with its Kineto trace (torch.profiler), and write <PREFIX>.<rank>.et plus comm_group.json. Ranks "
        "come from Kineto distributedInfo, else from the order of the files. Exit 2 on unusable input.",
        examples=(
            "d=traces/examples/pytorch",
            "xsim import pytorch --et $d/tinygpt_1rank_et.0.json.gz --kineto $d/tinygpt_1rank_kineto.0.json.gz "
            "--out out/tiny/run",
        ),
    )
    # --kineto is required, but checked by the importer: it then says why, naming the host trace's schema.
    pt.usage = (
        "xsim import pytorch [-h] --et ET.json[.gz] [...] --kineto KINETO.json[.gz] [...] --out PREFIX "
        "[--json] [--force]"
    )
    pt.add_argument("--et", nargs="+", required=True, metavar="ET.json[.gz]", help="host execution traces")
    pt.add_argument(
        "--kineto",
        nargs="+",
        default=[],
        metavar="KINETO.json[.gz]",
        help="required: Kineto traces, in the same order (host traces alone carry no durations; without "
        "them the import names the host trace it cannot time)",
    )
    pt.add_argument("--out", required=True, metavar="PREFIX", help="output prefix: PREFIX.<rank>.et")
    pt.add_argument("--json", action="store_true", help="print the per-rank statistics as JSON")
    pt.add_argument(
        "--force",
        action="store_true",
        help="replace PREFIX's folder when it holds files xsim did not write, as a whole",
    )
    pt.set_defaults(func=_pytorch)


def _pytorch(args: argparse.Namespace) -> int:
    from xsim import api

    result, paths = api.import_pytorch(args.et, args.kineto, args.out, force=args.force)
    if args.json:
        rows = [
            {
                "rank": r.rank,
                "et": r.et_path,
                "kineto": r.kineto_path,
                "schema": r.schema,
                "method": r.method,
                "matched": r.matched,
                "eligible": r.eligible,
                "match_rate": round(r.match_rate, 6),
                "nodes": r.nodes,
                "gpu_ops": r.gpu_ops,
                "warnings": list(r.warnings),
            }
            for r in result.ranks
        ]
        json.dump({"ranks": rows, "files": paths}, sys.stdout)
        sys.stdout.write("\n")
        return 0
    print(f"{'rank':>4} {'schema':<20} {'join':<12} {'matched':>15} {'rate':>8} {'nodes':>7} {'gpu ops':>8}")
    for r in result.ranks:
        print(
            f"{r.rank:>4} {r.schema:<20} {r.method:<12} {f'{r.matched}/{r.eligible}':>15} "
            f"{r.match_rate:>8.2%} {r.nodes:>7} {r.gpu_ops:>8}"
        )
        for w in r.warnings:
            print(f"     warning: {w}")
    print(
        f"wrote {plural(len(paths), 'file')}: {args.out}.<rank>.et"
        + (" + comm_group.json" if len(paths) > len(result.ranks) else "")
    )
    return 0
