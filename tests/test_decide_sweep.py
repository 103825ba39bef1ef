"""Sweeps on Dask: a real LocalCluster (loopback, 2 workers), a killed worker, reruns, failing plans."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("distributed")

from xsim.explore import sweep as sw  # noqa: E402

TINY_SWEEP = """
name: tiny
base:
  model: {name: tiny, layers: 4, hidden: 256, ffn_hidden: 688, heads: 8, vocab: 1000, seq_len: 128}
  micro_batches: 2
  device_groups:
    - {gpu: H100, ranks: [0, 1], tp: 2, layers: [1, 2], micro_batch: 1, pp_stage: 0}
    - {gpu: A100, ranks: [2, 3], tp: 2, layers: [3, 4], micro_batch: 1, pp_stage: 1}
axes:
  tp: [[2, 2], [1, 2], [3, 1]]
  cuts: [[1], [3]]
  schedule: [gpipe, 1f1b]
"""


def xsim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "xsim", *args], capture_output=True, text=True, timeout=300)


def test_sweep_file_on_local_cluster_rerun_and_failures(tmp_path: Path) -> None:
    f = tmp_path / "tiny.yaml"
    f.write_text(TINY_SWEEP)
    out = tmp_path / "sw"
    res = xsim("sweep", str(f), "--out", str(out), "--workers", "2", "--json", "--no-progress")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert len(rows) == 12
    ok = [r for r in rows if r["status"] == "ok"]
    bad = [r for r in rows if r["status"] != "ok"]
    assert len(ok) == 8 and len(bad) == 4  # TP 3 does not divide 8 heads: 4 plans, each its own row
    assert all("tp 3 does not divide the 8 attention heads" in r["error"] for r in bad)
    times = [r["iteration_time_ns"] for r in ok]
    assert times == sorted(times)  # sorted by time, failures last
    # A row is the replay of its plan's traces on their own.
    alone = xsim("replay", os.path.join(ok[0]["dir"], "traces"), "--json", "--no-progress")
    assert json.loads(alone.stdout)["iteration_time_ns"] == ok[0]["iteration_time_ns"]
    assert json.loads(alone.stdout)["memory"]["per_rank_peak_bytes"] == ok[0]["per_rank_peak_bytes"]
    assert len(list((out / "rows").glob("*.parquet"))) == 12 and (out / "pareto.png").stat().st_size > 0
    # A rerun finds every key in the dataset and does no work (no Dask cluster is even started).
    again = xsim("sweep", str(f), "--out", str(out), "--no-progress")
    assert again.returncode == 0, again.stderr
    assert "12 plans: 0 run, 12 already in" in again.stdout


def test_killed_worker_on_an_existing_scheduler_every_plan_still_gets_its_row(tmp_path: Path) -> None:
    f = tmp_path / "tiny.yaml"
    f.write_text(TINY_SWEEP.replace("tp: [[2, 2], [1, 2], [3, 1]]", "tp: [[2, 2], [1, 2], [1, 1]]"))
    out = str(tmp_path / "sw")
    tasks = sw.expand(sw.load_sweep(f), out)
    killed: list[int] = []

    def kill_one(row, client) -> None:
        if killed:
            return
        pids = sorted(client.run(os.getpid).values())
        killed.append(pids[0])
        os.kill(pids[0], signal.SIGKILL)  # the worker process dies mid-sweep; the nanny restarts it

    # An existing cluster, as `--scheduler ADDRESS` uses one.
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0"
    ) as cluster:
        run = sw.run_sweep(tasks, out, scheduler=cluster.scheduler_address, on_row=kill_one)
    assert killed and run.ran == 12
    rows = sw.rows_for(tasks, out)
    assert sorted(rows["key"].to_list()) == sorted(t.key for t in tasks)
    assert rows["status"].to_list() == ["ok"] * 12, rows.filter(status="error")["error"].to_list()


def test_expand_axes() -> None:
    base = {
        "model": "llama2-7b",
        "device_groups": [
            {"gpu": "H100", "ranks": [0, 1], "tp": 2, "layers": [1, 16], "pp_stage": 0},
            {"gpu": "A100", "ranks": [2, 3], "tp": 2, "layers": [17, 32], "pp_stage": 1},
        ],
    }
    spec, net = sw.apply_axes(base, {"tp": [4, 1], "cuts": [20], "gpus": "H100", "network": "flow"})
    assert net == "flow"
    assert [g["ranks"] for g in spec["device_groups"]] == [[0, 1, 2, 3], [4]]
    assert [g["layers"] for g in spec["device_groups"]] == [[1, 20], [21, 32]]
    assert {g["gpu"] for g in spec["device_groups"]} == {"H100"}
    with pytest.raises(sw.SpecError, match="2 stages, replica 0 has 2|must rise"):
        sw.apply_axes(base, {"cuts": [40]})


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("base: {model: llama2-7b}\naxes: {tp: 3}\n", "axis 'tp' must be a non-empty list"),
        ("base: nothere.yaml\naxes: {tp: [1]}\n", "nothere.yaml"),
        ("base: {model: llama2-7b}\naxes: {tp: [1]}\nextra: 1\n", "unknown key(s) extra"),
    ],
)
def test_bad_sweep_file_is_one_line(tmp_path: Path, capsys, text: str, expect: str) -> None:
    from xsim.cli import main

    f = tmp_path / "bad.yaml"
    f.write_text(text)
    assert main(["sweep", str(f), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expect in err[0] and str(tmp_path) in err[0]
