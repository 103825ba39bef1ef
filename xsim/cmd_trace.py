"""`xsim trace info|validate|to-json|from-json`: look at, check and convert Chakra trace sets."""

from __future__ import annotations

import argparse
import json
import os
import sys

from xsim.traces.wording import plural
from xsim.verbs import add_verb

# `trace validate` lists this many findings of each code before counting the rest (issue 26 item 9: 1,292
# warnings printed with no summary); --all lists them all.
SHOWN_PER_CODE = 5


PATH_HELP = "a .et/.json file, a <prefix> of <prefix>.<rank>.et files, or a folder holding one trace set"


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `trace` verb and its sub-commands."""
    p = add_verb(
        sub,
        "trace",
        help="inspect, validate and convert Chakra ET trace sets",
        examples=(
            "xsim trace info traces/examples/tiny_pipeline",
            "xsim trace validate out/fig1",
            "xsim trace to-json out/fig1 out/fig1-json",
        ),
    )
    tsub = p.add_subparsers(dest="trace_command", metavar="SUBCOMMAND", required=True)

    _add_info(tsub)
    _add_validate(tsub)
    _add_conversions(tsub)


def _add_info(tsub: argparse._SubParsersAction) -> None:
    """`trace info`."""
    info = add_verb(
        tsub,
        "info",
        help="ranks, nodes by type, collectives, process groups",
        examples=("xsim trace info out/fig1 --json",),
    )
    info.add_argument("path", help=PATH_HELP)
    info.add_argument(
        "--comm-groups", metavar="FILE", help='process groups {"<id>": [ranks]} (ASTRA-sim format)'
    )
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(func=_info)


def _add_validate(tsub: argparse._SubParsersAction) -> None:
    """`trace validate`."""
    val = add_verb(
        tsub,
        "validate",
        help="check graphs and cross-rank consistency",
        description="Exit status: 0 clean (warnings allowed); 1 cross-rank findings (unmatched P2P, "
        "collective mismatches); 2 unreadable or invalid trace (bad bytes, cycle, dangling data dependency, "
        "duplicate id, wrong-typed attribute, unknown enum, collective or P2P without its attributes), or a "
        "set the replay's own matching cannot run (a dry replay on recorded durations deadlocks or refuses "
        "it: one line per stuck rank).",
        examples=("xsim trace validate out/fig1 --json",),
    )
    val.add_argument("path", help=PATH_HELP)
    val.add_argument(
        "--comm-groups", metavar="FILE", help='process groups {"<id>": [ranks]} (ASTRA-sim format)'
    )
    val.add_argument("--json", action="store_true", help="print findings as a JSON list")
    val.add_argument(
        "--all",
        action="store_true",
        help=f"list every finding (default: the first {SHOWN_PER_CODE} of each kind, then a count by kind)",
    )
    val.set_defaults(func=_validate)


def _add_conversions(tsub: argparse._SubParsersAction) -> None:
    """`trace to-json` and `trace from-json`."""
    tj = add_verb(
        tsub,
        "to-json",
        help="write the lossless JSON view (one document per rank)",
        examples=("xsim trace to-json out/fig1/figure1.0.et rank0.json",),
    )
    tj.add_argument("path", help=PATH_HELP)
    tj.add_argument("out", help="output .json file (one rank) or folder (<name>.<rank>.json per rank)")
    tj.set_defaults(func=_to_json)

    fj = add_verb(
        tsub,
        "from-json",
        help="convert the JSON view or Chakra feeder JSON back to .et",
        examples=("xsim trace from-json rank0.json rank0.et",),
    )
    fj.add_argument("path", help="JSON file, or a folder/prefix of <prefix>.<rank>.json files")
    fj.add_argument("out", help="output .et file (one rank) or prefix (<prefix>.<rank>.et per rank)")
    fj.set_defaults(func=_from_json)


def _load(path: str, comm_groups: str | None = None):
    from xsim.replay.progress import track
    from xsim.traces.traceset import discover

    ts = discover(path, compact=True)
    if ts.classes is not None:
        ts = whole_set(ts, comm_groups)
    n = ts.num_ranks
    return ts, list(track((ts.load(r) for r in range(n)), "reading traces", n))


def whole_set(ts, comm_groups: str | None):
    """A compact set with its unwritten ranks' files derived from their representatives' (as `xsim gen
    --all-ranks` writes them; replay.simulation.compact_source), so every rank can be read."""
    from xsim.replay import DurationModel, ReplayConfig
    from xsim.replay.simulation import compact_source, load_groups

    pgs = load_groups(ts, comm_groups, scan=True)
    return ts.with_source(compact_source(ts, pgs, DurationModel(), ReplayConfig()))


def _groups(ts, files, comm_groups: str | None):
    from xsim.traces.groups import resolve_groups

    return resolve_groups(
        ((f.path, f.nodes) for f in files),
        ts.num_ranks,
        comm_groups=comm_groups,
        directory=ts.directory,
        prefix=ts.prefix,
    )


def _info(args: argparse.Namespace) -> int:
    from xsim.traces.summary import summarize

    ts, files = _load(args.path)
    s = summarize(ts.prefix, files, _groups(ts, files, args.comm_groups))
    if args.json:
        print(json.dumps(s.to_json(), indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.print(f"[bold]{s.prefix}[/]: {plural(s.ranks, 'rank')}, {plural(s.nodes, 'node')}", soft_wrap=True)
    t = Table("node type", "count")
    for k, v in s.nodes_by_type.items():
        t.add_row(k, str(v))
    con.print(t)
    if s.collectives:
        # "collectives" as the replay counts them (one per group and issue); "nodes" over all ranks.
        t = Table("collective", "collectives", "nodes (all ranks)", "bytes (all ranks)")
        for k, v in s.collectives.items():
            t.add_row(k, f"{v['instances']:,}", f"{v['count']:,}", f"{v['bytes']:,}")
        con.print(t)
    if s.p2p["sends"] or s.p2p["recvs"]:
        con.print(f"P2P: {s.p2p['sends']} sends ({s.p2p['send_bytes']:,} B), {s.p2p['recvs']} recvs")
    con.print(f"COMP time in trace: {s.compute_micros:,} us (sum over ranks)")
    if s.process_groups:
        shown = "; ".join(f"{k}: {v}" for k, v in list(s.process_groups.items())[:12])
        con.print(
            f"process groups ({s.groups_source}): {shown}{' ...' if len(s.process_groups) > 12 else ''}"
        )
    return 0


def _validate(args: argparse.Namespace) -> int:
    from xsim.replay.dryrun import validate_set
    from xsim.replay.progress import status
    from xsim.traces import checks

    ts, files = _load(args.path)
    from xsim.api.replaying import load_deployment
    from xsim.tracegen.set_identity import plan_id_of
    from xsim.traces.setid import check_identity

    check_identity(
        ts, plan_id_of(load_deployment(ts))
    )  # a file of another set is refused, named, before the checks
    with status("checking graphs, cross-rank matches and a dry replay"):
        findings = validate_set(ts, files, _groups(ts, files, args.comm_groups))
    if args.json:
        print(json.dumps([f.__dict__ for f in findings], indent=1))
    else:
        by_code: dict[str, int] = {}
        for f in findings:
            by_code[f.code] = by_code.get(f.code, 0) + 1
            if args.all or by_code[f.code] <= SHOWN_PER_CODE:
                print(f, file=sys.stderr if checks.has_invalid([f]) else sys.stdout)
        if len(findings) > 1:
            counts = ", ".join(
                f"{n:,} {code}" for code, n in sorted(by_code.items(), key=lambda kv: (-kv[1], kv[0]))
            )
            hidden = sum(max(0, n - SHOWN_PER_CODE) for n in by_code.values()) if not args.all else 0
            more = f" ({hidden:,} not listed: --all lists them)" if hidden else ""
            print(f"{ts.prefix}: {plural(len(findings), 'finding')} by kind: {counts}{more}")
        if all(f.kind == checks.WARNING for f in findings):
            warned = f" ({plural(len(findings), 'warning')})" if findings else ""
            nodes = sum(len(f.nodes) for f in files)
            print(f"{ts.prefix}: {plural(ts.num_ranks, 'rank')}, {plural(nodes, 'node')}: OK{warned}")
    if checks.has_invalid(findings):
        return 2
    return 1 if any(f.kind == checks.MISMATCH for f in findings) else 0


def _to_json(args: argparse.Namespace) -> int:
    from xsim.traces.errors import XsimError

    ts, files = _load(args.path)
    try:
        _write_json(ts, files, args.out)
    except OSError as exc:
        raise XsimError(f"{args.out}: cannot write: {exc.strerror or exc}") from None
    return 0


def _write_json(ts, files, out: str) -> None:
    from xsim.traces.jsonview import dump_json

    if ts.num_ranks == 1 and out.endswith((".json", ".json.gz")):
        dump_json(files[0], out)
        return
    from xsim.traces.outputs import FolderKind, whole_folder

    base = os.path.basename(ts.prefix)
    # One folder of per-rank documents, written whole (a kill leaves the earlier folder, never a mix).
    kind = FolderKind("the JSON view", lambda n: n.startswith(f"{base}.") and n.endswith(".json"))
    with whole_folder(out, kind, inputs=ts.paths) as stage:
        for rank, et in enumerate(files):
            dump_json(et, os.path.join(stage, f"{base}.{rank}.json"))


def _from_json(args: argparse.Namespace) -> int:
    from xsim.traces.errors import XsimError
    from xsim.traces.jsonview import load_json
    from xsim.traces.outputs import FolderKind, whole_folder
    from xsim.traces.stream import write_et
    from xsim.traces.traceset import discover

    if os.path.isfile(args.path):
        files, inputs = [load_json(args.path)], [args.path]
    else:
        ts = discover(args.path)
        files, inputs = [load_json(p) for p in ts.paths], list(ts.paths)
    try:
        if len(files) == 1 and args.out.endswith((".et", ".et.gz")):
            write_et(args.out, files[0].nodes, files[0].metadata)
            return 0
        # A set: PREFIX's folder written whole, holding these rank files only.
        folder, name = os.path.split(args.out)
        kind = FolderKind("traces", lambda n: n.startswith(f"{name}.") and n.endswith(".et"))
        with whole_folder(folder or ".", kind, inputs=inputs, label=args.out) as stage:
            for rank, et in enumerate(files):
                write_et(os.path.join(stage, f"{name}.{rank}.et"), et.nodes, et.metadata)
    except OSError as exc:
        raise XsimError(f"{args.out}: cannot write: {exc.strerror or exc}") from None
    return 0
