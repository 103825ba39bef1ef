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
    for rank, src in enumerate(result.paths):
        dst = os.path.join(d, os.path.basename(src))
        if os.path.abspath(dst) == os.path.abspath(src):
            raise ReplayError(f"annotated trace set would overwrite its input {src}")
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
        with open(p, "w", encoding="utf-8") as fh:
            json.dump({k: list(v) for k, v in sorted(result.groups.groups.items())}, fh, indent=2)
            fh.write("\n")
        written.append(p)
    return written


def _set(node, name: str, value: int) -> None:
    for a in node.attr:
        if a.name == name:
            a.int64_val = value
            return
    node.attr.append(make_attr(name, value, "int64_val"))
