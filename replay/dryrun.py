"""Dry replay for `xsim trace validate`: the replay's own program build and engine matching, no network.

The static cross-rank checks (traces/checks.py) compare per-group collective sequences and P2P keys; the
replay decides more than they see (a CPU-side collective on one rank is a CPU op, a GPU collective on the
other; the order a rank's shared comm slot issues collectives of different groups in). Rather than a
second implementation of matching, validation builds the replay's Program and runs its engine with
communication timed by the recorded durations (comm mode "measured": no network model, no contention), so
a set that validates cannot deadlock or mismatch in `xsim replay` for a reason the matching could see.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from xsim.replay.config import ReplayConfig
from xsim.replay.engine import run_engine
from xsim.replay.errors import ReplayDeadlock, ReplayError
from xsim.replay.program import build_program
from xsim.traces.checks import INVALID, WARNING, Finding
from xsim.traces.errors import TraceError
from xsim.traces.groups import ProcessGroups
from xsim.traces.stream import EtFile
from xsim.traces.traceset import TraceSet

# comm_streams "group" is the default replay's rule (analytical, flow models); "shared" (one comm slot per
# rank, ASTRA-sim's rule) is what the astra* models use. A set that deadlocks only under "shared" replays on
# the default models, so that run reports a warning, not an invalid set.
_RUNS = (("group", INVALID, ""), ("shared", WARNING, " (with one comm slot per rank, as --model astra*)"))
_LOC = re.compile(r"\brank (\d+) node (-?\d+)\b")  # Program.describe(g): "rank R node ID 'name'"


def replay_findings(ts: TraceSet, files: Sequence[EtFile], groups: ProcessGroups) -> list[Finding]:
    """Findings of dry replays of the set: each stuck rank of a deadlock, or the engine's refusal."""
    out: list[Finding] = []
    for streams, kind, note in _RUNS:
        config = ReplayConfig(comm_mode="measured", comm_streams=streams)
        try:
            prog = build_program(ts, groups, None, config, release=False)
            run_engine(prog, None, config)
        except ReplayDeadlock as exc:
            head = f"replay deadlocks at t={exc.time_ns} ns{note} ({exc.remaining} node(s) never run)"
            for s in exc.stuck:
                msg = f"{head}: node {s.name!r} waits for {s.waits_for}"
                out.append(_finding(kind, "replay-deadlock", msg, files, s.rank, s.node_id))
        except TraceError as exc:
            rank = exc.rank if isinstance(exc.rank, int) else None
            out.append(_finding(kind, "replay-refused", exc.message, files, rank, exc.node_id, exc.path))
        except ReplayError as exc:
            m = _LOC.search(str(exc))
            rank, nid = (int(m[1]), int(m[2])) if m else (None, None)
            out.append(
                _finding(kind, "replay-refused", f"replay refuses: {exc}", files, rank, nid, ts.prefix)
            )
        if out:
            break  # the shared-slot run only adds news when the default run is clean
    return out


def _finding(
    kind: str,
    code: str,
    message: str,
    files: Sequence[EtFile],
    rank: int | None,
    node_id: int | None,
    path: str | None = None,
) -> Finding:
    """A finding located by file, rank, node index and id (the index looked up in the rank's file)."""
    index = None
    if rank is not None and 0 <= rank < len(files):
        path = files[rank].path
        if node_id is not None:
            index = next((i for i, n in enumerate(files[rank].nodes) if n.id == node_id), None)
    return Finding(kind, code, message, path, rank if len(files) > 1 else None, index, node_id)


def validate_set(ts: TraceSet, files: Sequence[EtFile], groups: ProcessGroups) -> list[Finding]:
    """`xsim trace validate`: the static checks, then, when they find nothing wrong, the dry replays."""
    from xsim.traces.checks import MISMATCH, check_all

    findings = check_all(files, groups)
    if any(f.kind in (INVALID, MISMATCH) for f in findings):
        return findings
    return findings + replay_findings(ts, files, groups)
