"""Sweeps rank plans honestly (issue 26 item 5): fits column, OOM last, tokens/s then $/Mtok by default,
identical results merged and labelled in the Pareto plot, readable plan names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl

from tests.conftest import REPO
from xsim.explore.sweep import SCHEMA, merged_points, sort_rows


def _rows(*rows: dict) -> pl.DataFrame:
    base = {k: None for k in SCHEMA}
    return pl.DataFrame([{**base, **r} for r in rows], schema=SCHEMA)


def test_default_sort_is_throughput_then_cost_with_oom_last() -> None:
    rows = _rows(
        # a: fastest iteration but a small batch: 1,000 tokens/s; b, c: 4,000 tokens/s, c cheaper; d: OOM.
        {"key": "a", "label": "a", "status": "ok", "iteration_time_ns": 1, "tokens_per_s": 1000.0,
         "cost_usd_per_million_tokens": 1.0},
        {"key": "b", "label": "b", "status": "ok", "iteration_time_ns": 4, "tokens_per_s": 4000.0,
         "cost_usd_per_million_tokens": 3.0},
        {"key": "c", "label": "c", "status": "ok", "iteration_time_ns": 4, "tokens_per_s": 4000.0,
         "cost_usd_per_million_tokens": 2.0},
        {"key": "d", "label": "d", "status": "oom", "peak_memory_bytes": 187 * 2**30},
    )  # fmt: skip
    assert sort_rows(rows)["key"].to_list() == ["c", "b", "a", "d"]
    assert sort_rows(rows, "cost")["key"].to_list() == ["a", "c", "b", "d"]
    assert sort_rows(rows, "time")["key"].to_list() == ["a", "b", "c", "d"]


def test_identical_results_are_one_labelled_point() -> None:
    same = {"status": "ok", "iteration_time_ns": 2_000_000_000, "cost_usd_per_million_tokens": 0.5}
    rows = _rows(
        {"key": "k1", "label": "tp=2", **same},
        {"key": "k2", "label": "tp=4", **same},
        {
            "key": "k3",
            "label": "tp=8",
            "status": "ok",
            "iteration_time_ns": 10**9,
            "cost_usd_per_million_tokens": 0.9,
        },
    )
    points = merged_points(rows)
    assert [(p.time_s, p.usd_per_mtok, p.label, p.keys) for p in points] == [
        (1.0, 0.9, "tp=8", ("k3",)),
        (2.0, 0.5, "tp=2, tp=4", ("k1", "k2")),
    ]


def test_spec_sweep_flags_plans_that_do_not_fit(tmp_path: Path) -> None:
    # The issue's case: Table 4's c01 (2xH100) and c02 (2xA100 40GB) hold full Adam state for Llama-2 7B
    # on one pipeline of two stages: 186.6 GiB on a rank, above 80 and 40 GB. Both are flagged and counted.
    specs = [str(REPO / "examples" / f"table4_{c}.yaml") for c in ("c01", "c02")]
    r = subprocess.run(
        [sys.executable, "-m", "xsim", "sweep", *specs, "--out", str(tmp_path / "sw")],
        capture_output=True, text=True, timeout=600, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[-2:] == ["GiB", "fits"]
    assert lines[1].startswith("table4_c01.yaml") and lines[1].split()[-2:] == ["186.6", "NO"]
    assert "2 of 2 plans do not fit in GPU memory (table4_c01, table4_c02)" in r.stdout
    assert "sorted by throughput" in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "xsim", "sweep", *specs, "--out", str(tmp_path / "sw"), "--drop-oom"],
        capture_output=True, text=True, timeout=600, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    lines = r.stdout.splitlines()
    assert not any(x.startswith("table4_c0") for x in lines) and "left out (--drop-oom)" in lines[1]


def test_plans_replayed_with_allow_oom_are_still_flagged() -> None:
    from xsim.explore.sweep import fits_column

    rows = _rows(
        # e: replayed with --allow-oom, fastest, but a rank is 2 GiB over its GPU; f fits; g did not resolve.
        {"key": "e", "label": "e", "status": "ok", "tokens_per_s": 9000.0, "min_headroom_bytes": -2 * 2**30},
        {"key": "f", "label": "f", "status": "ok", "tokens_per_s": 1000.0, "min_headroom_bytes": 0},
        {"key": "g", "label": "g", "status": "error"},
    )
    out = sort_rows(rows)
    assert out["key"].to_list() == ["f", "e", "g"]
    assert fits_column(out) == ["yes", "NO", "-"]
