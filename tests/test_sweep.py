"""`xsim sweep`: each row is exactly the gen + replay of its spec; rows sorted; cost from catalog prices."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def xsim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "xsim", *args], capture_output=True, text=True, timeout=300)


def test_sweep_rows_match_individual_replays(tmp_path: Path) -> None:
    specs = [str(EXAMPLES / "table4_c02.yaml"), str(EXAMPLES / "table4_c01.yaml")]
    res = xsim("sweep", *specs, "--out", str(tmp_path / "sw"), "--json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert [Path(r["spec"]).name for r in rows] == [
        "table4_c01.yaml",
        "table4_c02.yaml",
    ]  # H100 pair is faster
    assert rows[0]["iteration_time_ns"] < rows[1]["iteration_time_ns"]
    assert rows[0]["gpus"] == "2xH100" and rows[1]["gpus"] == "2xA100-40GB"
    for r, price in zip(rows, (12.29, 4.0966), strict=True):
        # The same traces replayed on their own give the same iteration time.
        alone = xsim("replay", str(Path(r["result"]).parent / "traces"), "--json", "--no-progress")
        assert json.loads(alone.stdout)["iteration_time_ns"] == r["iteration_time_ns"]
        hours = r["iteration_time_ns"] / 3.6e12
        assert abs(r["cost_usd_per_iteration"] - 2 * price * hours) < 1e-6
        # 2 replicas x 4 micro-batches x 2 sequences x 2048 tokens.
        assert abs(r["tokens_per_s"] - 32_768 / (r["iteration_time_ns"] / 1e9)) < 1e-2


def test_sweep_bad_spec_is_one_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: llama2-7b\ndevice_groups: []\n")
    res = xsim("sweep", str(EXAMPLES / "table4_c01.yaml"), str(bad), "--out", str(tmp_path / "sw"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0]
