"""The annotated trace set: the input .et files with each node's simulated time written back.

Every node keeps everything it had; `duration_micros` becomes the simulated duration (end - start, wait
included, rounded to the nearest microsecond) and three int64 attributes give the exact ns: SIM_START_NS,
SIM_END_NS, SIM_WAIT_NS (names in traces.attrs). The result is still a plain Chakra trace.
"""

from __future__ import annotations

import json
import os
import re

from xsim.replay.errors import ReplayError
from xsim.replay.result import ReplayResult
from xsim.traces.attrs import SIM_END_NS, SIM_START_NS, SIM_WAIT_NS, make_attr
from xsim.traces.stream import read_et, write_et


def write_annotated(
    result: ReplayResult,
    out_dir: str | os.PathLike[str],
    *,
    inputs: tuple[str, ...] = (),
    force: bool = False,
) -> list[str]:
    """Write `<out_dir>/<same file names>`, comm_group.json when groups were defined, and the set's
    deployment.json, memory.json and set.json, as one folder written whole (traces.outputs.whole_folder);
    returns the paths. The annotated set keeps its set id: the same plan, with simulated times."""
    import shutil

    from xsim.traces.io import DEPLOYMENT_FILE, MEMORY_FILE
    from xsim.traces.outputs import whole_folder
    from xsim.traces.setid import SET_FILE, trace_set_kind

    d = os.fspath(out_dir)
    if not result.paths:
        raise ReplayError("annotated trace set: the result does not know its input files")
    src_dir = os.path.dirname(result.paths[0]) or "."
    first = os.path.basename(result.paths[0])
    m = re.match(r"^(?P<prefix>.+)\.\d+\.(?:et|json)(?:\.gz)?$", first)
    prefix = m["prefix"] if m else first
    kind = trace_set_kind(d, prefix, "annotated traces")
    names = [os.path.basename(src) for src in result.paths]
    times = result.ops.select("rank", "node_id", "start_ns", "end_ns", "wait_ns").partition_by(
        "rank", as_dict=True, include_key=False
    )
    with whole_folder(d, kind, inputs=inputs or result.paths, force=force) as stage:
        for rank, (src, name) in enumerate(zip(result.paths, names, strict=True)):
            ef = read_et(src)
            part = times.get((rank,))
            table = {} if part is None else {row[0]: row[1:] for row in part.iter_rows()}
            for node in ef.nodes:
                s, e, w = table[node.id]
                node.duration_micros = (e - s + 500) // 1000
                _set(node, SIM_START_NS, s)
                _set(node, SIM_END_NS, e)
                _set(node, SIM_WAIT_NS, w)
            write_et(os.path.join(stage, name), ef.nodes, ef.metadata)  # metadata keeps the set id
        if result.groups is not None and result.groups.groups:
            groups = {k: list(v) for k, v in sorted(result.groups.groups.items())}
            with open(os.path.join(stage, "comm_group.json"), "w", encoding="utf-8") as fh:
                fh.write(json.dumps(groups, indent=2) + "\n")
        # The set's metadata travels with it: the annotated set replays, costs and reports as the original.
        for name in (DEPLOYMENT_FILE, MEMORY_FILE, SET_FILE):
            if os.path.isfile(os.path.join(src_dir, name)):
                shutil.copyfile(os.path.join(src_dir, name), os.path.join(stage, name))
        written = sorted(os.listdir(stage))
    return [os.path.join(d, n) for n in written]


def _set(node, name: str, value: int) -> None:
    for a in node.attr:
        if a.name == name:
            a.int64_val = value
            return
    node.attr.append(make_attr(name, value, "int64_val"))
