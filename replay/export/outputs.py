"""A replay's result folder: written whole through a staging folder, holding only this run's files."""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping

from xsim.replay.result import ReplayResult
from xsim.traces.outputs import FolderKind, fault_point, whole_folder

# Every file `xsim replay --out` can write; one an earlier run wrote and this run does not is removed.
RUN_FILES: frozenset[str] = frozenset(
    [f"{t}.{e}" for t in ("ops", "ranks", "collectives") for e in ("parquet", "csv")]
    + ["summary.json", "summary.csv", "perf.json", "source.json", "cost.json"]
)


# What else lands in a result folder from xsim's other verbs (the timeline a replay may write there, the
# report, a validation): an earlier run's copy is replaced with the folder, not refused as foreign.
RESULT_FILES: frozenset[str] = (
    RUN_FILES
    | {"timeline.json", "report.html"}
    | {"layers.csv", "classes.csv", "steps.csv", "validation.json", "validation.png"}
)
RESULT_KIND = FolderKind("the replay result", lambda n: n in RESULT_FILES)


def stage_run(result: ReplayResult, stage: str, extras: Mapping[str, str] = {}) -> list[str]:
    """Save the tables plus `extras` (name -> text) into the staging folder `stage`; returns the names."""
    import polars as pl

    fault_point("file", os.path.join(stage, "ops.parquet"))
    try:
        result.save(stage)
    except pl.exceptions.PolarsError as exc:  # polars reports a full disk as ComputeError, not OSError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OSError(errno.EIO, f"the result tables: {first}") from None
    for name, text in sorted(extras.items()):
        fault_point("file", os.path.join(stage, name))
        with open(os.path.join(stage, name), "w", encoding="utf-8") as fh:
            fh.write(text)
    return sorted(os.listdir(stage))


def save_run(
    result: ReplayResult,
    out_dir: str | os.PathLike[str],
    extras: Mapping[str, str] = {},
    *,
    inputs: tuple[str, ...] = (),
    force: bool = False,
) -> list[str]:
    """Save the tables plus `extras` (name -> text) as the folder `out_dir`, written whole: a fresh
    sibling swapped in by one rename (traces.outputs.whole_folder), so the folder holds this run's files
    only and a kill leaves the earlier run's as they were; returns the paths."""
    out = os.fspath(out_dir)
    with whole_folder(out, RESULT_KIND, inputs=inputs or result.paths, force=force) as stage:
        names = stage_run(result, stage, extras)
    return [os.path.join(out, n) for n in names]
