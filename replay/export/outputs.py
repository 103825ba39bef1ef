"""A replay's result folder: written whole through a staging folder, holding only this run's files."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

from replay.result import ReplayResult
from traces.outputs import install_files, staging_dir

# Every file `xsim replay --out` can write; one an earlier run wrote and this run does not is removed.
RUN_FILES: frozenset[str] = frozenset(
    [f"{t}.{e}" for t in ("ops", "ranks", "collectives") for e in ("parquet", "csv")]
    + ["summary.json", "summary.csv", "perf.json", "source.json", "cost.json"]
)


def save_run(
    result: ReplayResult, out_dir: str | os.PathLike[str], extras: Mapping[str, str] = {}
) -> list[str]:
    """Save the tables plus `extras` (name -> text) into `out_dir` via a staging folder; returns the paths.

    Each file is renamed into place only after all were written, a target that is a symbolic link or an
    input of the run is refused before any is replaced, and an earlier run's file that this run does not
    write (cost.json of a set with a deployment, replayed now without one) is removed.
    """
    out = os.fspath(out_dir)
    stage = staging_dir(out)
    try:
        result.save(stage)
        for name, text in sorted(extras.items()):
            with open(os.path.join(stage, name), "w", encoding="utf-8") as fh:
                fh.write(text)
        return install_files(stage, out, RUN_FILES | set(os.listdir(stage)), inputs=result.paths)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
