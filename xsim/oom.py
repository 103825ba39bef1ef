"""The one line a verb prints when it runs out of memory: how big the run was and what to try."""

from __future__ import annotations

import argparse
import os

# What shrinks each verb's memory, in the order to try it (docs/performance.md, issue 24).
_TRY = {
    "replay": "keep folding on (the default; not --no-fold) with a contention-free model "
    "(--model analytical) so one DP replica is simulated, lower micro_batches in the spec, or give the "
    "process more memory",
    "gen": "lower micro_batches or the ranks in the spec, or give the process more memory",
    "trace validate": "check fewer ranks at a time (a folder per subset), or give the process more memory",
}


def out_of_memory_line(verb: str, args: argparse.Namespace) -> str:
    """`out of memory <verb> <what>: <size>; try <...>`; the size is found without loading the run."""
    size = ""
    try:
        if verb == "gen" and getattr(args, "spec", None):
            size = _spec_size(args.spec)
        elif getattr(args, "path", None):
            size = _set_size(args.path)
    except Exception:  # noqa: BLE001 - a size that cannot be found leaves the line without it
        size = ""
    what = getattr(args, "spec", None) if verb == "gen" else getattr(args, "path", None)
    head = f"out of memory in `xsim {verb}`" + (f" on {what}" if what else "")
    tail = _TRY.get(verb, "give the process more memory")
    return f"{head}{f' ({size})' if size else ''}; try: {tail}"


def _set_size(path: str) -> str:
    from xsim.traces.traceset import discover

    ts = discover(path, compact=True)
    total = sum(os.path.getsize(ts.paths[r]) for r in ts.written)
    return f"{ts.num_ranks:,} ranks, {total / 1e9:.2f} GB of trace files"


def _spec_size(spec: str) -> str:
    from xsim.tracegen.spec import load_spec, num_ranks

    dep = load_spec(spec)
    return f"{num_ranks(dep):,} ranks, {len(dep.device_groups):,} device groups, {dep.micro_batches} micro-batches"
