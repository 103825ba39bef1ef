"""`xsim gen SPEC --out DIR`: deployment spec -> per-rank Chakra traces, comm_group.json, deployment.json."""

from __future__ import annotations

import argparse
import sys

from xsim.verbs import add_gpu_file_argument, add_verb


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `gen` verb."""
    p = add_verb(
        subparsers,
        "gen",
        help="generate per-rank Chakra traces from a deployment spec",
        description="Generate one Chakra trace per rank (DIR/<name>.<rank>.et), comm_group.json and the "
        "resolved spec deployment.json (and memory.json, memory per rank) from a YAML/TOML/JSON deployment spec.",
        examples=(
            "xsim gen examples/figure1.yaml --out out/fig1",
            "xsim gen examples/table4_c01.yaml --out out/c01 --name c01 --no-rewrite",
        ),
    )
    p.add_argument("spec", help="deployment spec (.yaml, .yml, .toml or .json)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created if missing)")
    p.add_argument("--name", help="file prefix (default: the spec's name)")
    p.add_argument(
        "--no-rewrite",
        action="store_true",
        help="skip the planner's rewrite (heterogeneous gradient sync and pipeline resharding)",
    )
    p.add_argument(
        "--all-ranks",
        action="store_true",
        help="write every rank's .et (default: a plan whose DP replicas are alike writes replica 0's files, or one "
        "rank per stage where its TP ranks are alike too, and "
        "classes.json, which xsim replay folds by construction and xsim trace reads; xsim rewrite and replay --annotate need every file)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace the trace files of another set in DIR (default: refuse to mix two sets)",
    )
    add_gpu_file_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Generate and write; errors surface as one line through the CLI."""
    from xsim import api
    from xsim.traces.io import DEPLOYMENT_FILE

    gen = api.generate(
        args.spec,
        api.GenerateOptions(
            out=args.out,
            name=args.name,
            rewrite=not args.no_rewrite,
            force=args.force,
            gpu_file=args.gpu_file,
            all_ranks=args.all_ranks,
        ),
    )
    _warn_oom(gen)
    for line in gen.notes:
        print(f"note: {line}")
    if gen.classes is not None:
        c = gen.classes
        dep = gen.deployment
        # context parallelism's ring form: TP positions of whole CP blocks (tracegen/compact.py)
        ring = c.tp > 1 and c.cp == 1 and any(dg.cp > 1 for dg in dep.device_groups)
        what = (
            f"TP position 0 of each stage and CP position of CP block 0: {len(c.replicas)} rank classes (CP "
            f"block x TP position), the others mirror it"
            if ring
            else f"TP and CP position 0 of each stage of data replica 0: {len(c.replicas)} rank classes (data "
            f"replica x CP position x TP position), the others mirror it"
            if c.cp > 1
            else f"TP and EP position 0 of each stage of EP block 0: {len(c.replicas)} rank classes (EP block "
            f"x EP position x TP position), the others mirror it"
            if c.ep > 1
            else f"TP position 0 of each stage of DP replica 0: {len(c.replicas)} rank classes (DP replica x TP "
            f"position), the others mirror it"
            if c.tp > 1
            else f"DP replica 0; the other {len(c.replicas) - 1} replicas mirror it"
            if not c.classes
            else f"super-replica 0 of {len(c.classes)} classes of DP replica; the other {len(c.replicas) - 1} "
            "mirror it"
        )
        print(
            f"wrote {len(gen.paths)} of {c.num_ranks} ranks ({what}, classes.json; --all-ranks writes every "
            f"rank), {gen.nodes} nodes to {args.out}: "
            f"{gen.deployment.name}.<rank>.et, comm_group.json, {DEPLOYMENT_FILE}, memory.json"
        )
        return 0
    print(
        f"wrote {len(gen.paths)} ranks, {gen.nodes} nodes to {args.out}: {gen.deployment.name}.<rank>.et, "
        f"comm_group.json, {DEPLOYMENT_FILE}, memory.json"
    )
    return 0


def _warn_oom(gen) -> None:
    """A plan that does not fit is one warning line, not an error, so the paper's own configurations (most
    hold full Adam state per GPU) still generate; `xsim plan` and `xsim sweep` refuse them (docs/decide.md)."""
    from xsim.tracegen.memory import OutOfMemory, check_fits

    try:
        check_fits(list(gen.memory), gen.deployment.name, gen.deployment)
    except OutOfMemory as exc:
        print(f"xsim: warning: {exc}".replace("--allow-oom to go on", "generated anyway"), file=sys.stderr)
