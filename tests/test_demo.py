"""The README's first command runs the whole pipeline: plan, gen, validate, replay, exports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl


def test_demo_end_to_end(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "xsim", "demo", "--out", str(tmp_path), "--model", "analytical"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    summary = json.loads((tmp_path / "result" / "summary.json").read_text())
    ranks = pl.read_parquet(tmp_path / "result" / "ranks.parquet")
    # Figure 1 has 10 ranks; the iteration ends when the last rank finishes.
    assert ranks.height == 10
    assert summary["iteration_time_ns"] == ranks["finish_ns"].max() > 0
    ops = pl.read_parquet(tmp_path / "result" / "ops.parquet")
    # Every generated node ran exactly once.
    nodes = sum(1 for _ in (tmp_path / "traces").glob("figure1.*.et"))
    assert (
        nodes == 10
        and ops.height
        == json.loads(
            subprocess.run(
                [sys.executable, "-m", "xsim", "trace", "info", str(tmp_path / "traces"), "--json"],
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            ).stdout
        )["nodes"]
    )
    timeline = json.loads((tmp_path / "result" / "timeline.json").read_text())
    assert timeline["traceEvents"]
    # TCO of the iteration: 5 H100 at $12.29/h and 5 A100-40GB at $4.0966/h rented for the whole
    # iteration; 196,608 tokens (4 x 8 + 4 x 16 sequences of 2048).
    cost = json.loads((tmp_path / "result" / "cost.json").read_text())
    hours = summary["iteration_time_ns"] / 3.6e12
    assert cost["tokens_per_iteration"] == 196_608
    assert abs(cost["cost_usd_per_iteration"] - (5 * 12.29 + 5 * 4.0966) * hours) < 1e-6
    assert abs(cost["tokens_per_s"] - 196_608 / (summary["iteration_time_ns"] / 1e9)) < 1e-2
