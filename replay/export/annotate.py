"""The annotated trace set: the input .et files with each node's simulated time written back.

Every node keeps everything it had; `duration_micros` becomes the simulated duration (end - start, wait
included, rounded to the nearest microsecond) and three int64 attributes give the exact ns: SIM_START_NS,
SIM_END_NS, SIM_WAIT_NS (names in traces.attrs). The result is still a plain Chakra trace.
"""

from __future__ import annotations

import json
import os

from replay.errors import ReplayError
from replay.result import ReplayResult
from traces.attrs import SIM_END_NS, SIM_START_NS, SIM_WAIT_NS, make_attr
from traces.outputs import atomic_write_text, check_target
from traces.stream import read_et, write_et


def write_annotated(result: ReplayResult, out_dir: str | os.PathLike[str]) -> list[str]:
    """Write `<out_dir>/<same file names>` (and comm_group.json when groups were defined); returns paths."""
    d = os.fspath(out_dir)
    if not result.paths:
        raise ReplayError("annotated trace set: the result does not know its input files")
    os.makedirs(d, exist_ok=True)
    written = []
    times = result.ops.select("rank", "node_id", "start_ns", "end_ns", "wait_ns").partition_by(
        "rank", as_dict=True, include_key=False
    )
    # Every target checked before any is written: a symbolic link (a folder of links to the inputs) or
    # an input file itself is refused, and write_et renames each file into place.
    targets = [os.path.join(d, os.path.basename(src)) for src in result.paths]
    for dst in [*targets, os.path.join(d, "comm_group.json")]:
        check_target(dst, result.paths)
    for rank, (src, dst) in enumerate(zip(result.paths, targets, strict=True)):
        ef = read_et(src)
        part = times.get((rank,))
        table = {} if part is None else {row[0]: row[1:] for row in part.iter_rows()}
        for node in ef.nodes:
            s, e, w = table[node.id]
            node.duration_micros = (e - s + 500) // 1000
            _set(node, SIM_START_NS, s)
            _set(node, SIM_END_NS, e)
            _set(node, SIM_WAIT_NS, w)
        write_et(dst, ef.nodes, ef.metadata)
        written.append(dst)
    if result.groups is not None and result.groups.groups:
        p = os.path.join(d, "comm_group.json")
        groups = {k: list(v) for k, v in sorted(result.groups.groups.items())}
        atomic_write_text(p, json.dumps(groups, indent=2) + "\n", result.paths)
        written.append(p)
    return written


def _set(node, name: str, value: int) -> None:
    for a in node.attr:
        if a.name == name:
            a.int64_val = value
            return
    node.attr.append(make_attr(name, value, "int64_val"))
