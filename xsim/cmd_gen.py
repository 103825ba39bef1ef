"""`xsim gen SPEC --out DIR`: deployment spec -> per-rank Chakra traces, comm_group.json, deployment.json."""

from __future__ import annotations

import argparse
import json
import os
import sys

from netmodels.cluster import build_cluster
from netmodels.errors import NetworkModelError
from tracegen.errors import GeneratorError, SpecError
from tracegen.spec import NAME_RE, load_spec, num_ranks, save_deployment
from tracegen.workload import generate


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `gen` verb."""
    p = subparsers.add_parser(
        "gen",
        help="generate per-rank Chakra traces from a deployment spec",
        description="Generate one Chakra trace per rank (DIR/<name>.<rank>.et), comm_group.json and the "
        "resolved spec deployment.json from a YAML/TOML/JSON deployment spec.",
    )
    p.add_argument("spec", help="deployment spec (.yaml, .yml, .toml or .json)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created if missing)")
    p.add_argument("--name", help="file prefix (default: the spec's name)")
    p.add_argument(
        "--no-rewrite",
        action="store_true",
        help="skip the planner's rewrite (heterogeneous gradient sync and pipeline resharding)",
    )
    p.set_defaults(func=run)


def check_cluster(dep, spec_path: str) -> None:
    """Build a spec's explicit cluster now, so a typo in it fails here, naming the spec, not at replay."""
    if dep.cluster_derived:
        return  # derived from the device groups; V100-only sets have no preset and are replayed with --topology
    try:
        topo = build_cluster(json.loads(dep.cluster_json))
    except NetworkModelError as exc:
        raise SpecError(f"cluster: {exc}", path=spec_path) from None
    if topo.num_ranks < num_ranks(dep):
        raise SpecError(
            f"cluster: {topo.num_ranks} ranks, but the device groups have {num_ranks(dep)}", path=spec_path
        )


def _memory(dep, out: str) -> None:
    """memory.json beside the traces (the replay summary reads it); a plan that does not fit is one warning line.

    A warning, not an error, so the paper's own configurations (most of which hold full Adam state per
    GPU) still generate; `xsim plan` and `xsim sweep` refuse such plans (docs/decide.md).
    """
    from tracegen.memory import OutOfMemory, check_fits, deployment_memory, write_memory

    mem = deployment_memory(dep)
    try:
        write_memory(mem, out)
    except OSError as exc:
        raise GeneratorError(f"{out}: cannot write memory.json: {exc.strerror or exc}") from None
    try:
        check_fits(mem, dep.name)
    except OutOfMemory as exc:
        print(f"xsim: warning: {exc}".replace("--allow-oom to go on", "generated anyway"), file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Load, validate, generate and write; errors surface as one line through the CLI."""
    dep = load_spec(args.spec)
    check_cluster(dep, args.spec)
    if args.name:
        if not NAME_RE.match(args.name):
            raise SpecError(f"--name {args.name!r} is not a file-name-safe word (letters, digits, . _ -)")
        dep.name = args.name
    try:
        bundle = generate(dep, rewrite=not args.no_rewrite)
    except GeneratorError as exc:
        raise GeneratorError(f"{args.spec}: {exc}") from None
    try:
        paths = bundle.write(args.out, dep.name)
        save_deployment(dep, os.path.join(args.out, "deployment.json"))
    except OSError as exc:
        raise GeneratorError(f"{args.out}: cannot write traces: {exc.strerror or exc}") from None
    _memory(dep, args.out)
    total = sum(len(v) for v in bundle.nodes.values())
    print(
        f"wrote {len(paths)} ranks, {total} nodes to {args.out}: {dep.name}.<rank>.et, comm_group.json, "
        "deployment.json, memory.json",
        file=sys.stdout,
    )
    return 0
