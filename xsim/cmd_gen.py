"""`xsim gen SPEC --out DIR`: deployment spec -> per-rank Chakra traces, comm_group.json, deployment.json."""

from __future__ import annotations

import argparse
import json
import os
import sys

from netmodels.cluster import build_cluster
from netmodels.errors import NetworkModelError
from replay.progress import status
from tracegen.errors import GeneratorError, SpecError
from tracegen.spec import NAME_RE, load_spec, num_ranks, save_deployment
from tracegen.workload import generate
from traces.outputs import prepare_set_folder


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
    p.add_argument(
        "--force",
        action="store_true",
        help="replace the trace files of another set in DIR (default: refuse to mix two sets)",
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


def run(args: argparse.Namespace) -> int:
    """Load, validate, generate and write; errors surface as one line through the CLI."""
    dep = load_spec(args.spec)
    check_cluster(dep, args.spec)
    if args.name:
        if not NAME_RE.match(args.name):
            raise SpecError(f"--name {args.name!r} is not a file-name-safe word (letters, digits, . _ -)")
        dep.name = args.name
    # Before any work: a folder holding another set is refused (or, with --force, cleared), never mixed.
    prepare_set_folder(args.out, dep.name, num_ranks(dep), args.force)
    try:
        with status("generating traces"):
            bundle = generate(dep, rewrite=not args.no_rewrite)
    except GeneratorError as exc:
        raise GeneratorError(f"{args.spec}: {exc}") from None
    try:
        with status("writing traces"):
            paths = bundle.write(args.out, dep.name)
        save_deployment(dep, os.path.join(args.out, "deployment.json"))
    except OSError as exc:
        raise GeneratorError(f"{args.out}: cannot write traces: {exc.strerror or exc}") from None
    total = sum(len(v) for v in bundle.nodes.values())
    print(
        f"wrote {len(paths)} ranks, {total} nodes to {args.out}: {dep.name}.<rank>.et, comm_group.json, "
        "deployment.json",
        file=sys.stdout,
    )
    return 0
