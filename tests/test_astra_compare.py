"""scripts/astra_compare.py: case discovery, ASTRA-sim output parsing, the side-by-side table, clean skip."""

from __future__ import annotations

import shutil
import stat
import sys
from pathlib import Path

import pytest

from tests.test_replay_support import SHARED

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import astra_compare  # noqa: E402

MICRO = SHARED / "peer_traces" / "chakra_et" / "astra-sim_microbenchmarks" / "all_reduce" / "4npus_1MB"
CFG = SHARED / "peer_configs" / "astra-sim"
pytestmark = pytest.mark.skipif(not MICRO.is_dir() or not CFG.is_dir(), reason="../shared peer traces absent")
# 1 MiB ring AllReduce on Ring-4 with Ring_4chunks.json: 4 x (6 x 1720 + 3 x 120 + 7 x 10) (test_replay_astra).
WANT = 43000


def _case(tmp_path: Path) -> Path:
    case = tmp_path / "cases" / "ar4"
    shutil.copytree(MICRO, case)
    shutil.copy(CFG / "network/repo_examples_Ring_4npus.yml", case / "network.yml")
    shutil.copy(CFG / "system/repo_examples_Ring_4chunks.json", case / "sys.json")
    return tmp_path / "cases"


def _fake_astra(tmp_path: Path, cycles: list[int]) -> Path:
    # Prints ASTRA-sim's per-NPU finish lines (Workload.cc's format), then crashes like ASTRA-sim's teardown.
    lines = "".join(
        f'echo "[2026-11-30 12:00:00.000] [workload] [info] sys[{r}] finished, {c} cycles, exposed '
        f'communication {c} cycles."\n'
        for r, c in enumerate(cycles)
    )
    exe = tmp_path / "AstraSim_Analytical_Congestion_Unaware"
    exe.write_text(f"#!/bin/sh\n{lines}echo 'free(): double free detected' >&2\nexit 134\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_cases_found_with_their_configs(tmp_path):
    root = _case(tmp_path)
    (case,) = astra_compare.find_cases(root, None, None)
    assert case.ranks == 4 and case.network.name == "network.yml" and case.groups is None
    assert case.prefix.name == "all_reduce"


def test_no_binary_runs_xsim_only(tmp_path, capsys):
    root = _case(tmp_path)
    assert astra_compare.main([str(root), "--astra", str(tmp_path / "missing")]) == 0
    out = capsys.readouterr().out
    assert "no ASTRA-sim binary" in out
    row = [ln for ln in out.splitlines() if ln.startswith("ar4")][0].split()
    assert row[2:4] == ["not", "run"] and row[4] == f"{WANT:,}"


@pytest.mark.parametrize("astra_ns,diff,agree", [(WANT, "+0", "yes"), (WANT + 5, "-5", "no")])
def test_side_by_side_with_an_astra_binary(tmp_path, capsys, astra_ns, diff, agree):
    root = _case(tmp_path)
    exe = _fake_astra(tmp_path, [WANT, WANT, WANT, astra_ns])
    assert astra_compare.main([str(root), "--astra", str(exe)]) == 0
    row = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("ar4")][0].split()
    assert row[:6] == ["ar4", "4", f"{astra_ns:,}", f"{WANT:,}", diff, agree]


def test_every_rank_is_reported(tmp_path, capsys):
    root = _case(tmp_path)
    exe = _fake_astra(tmp_path, [WANT, WANT + 5, WANT, WANT])
    assert astra_compare.main([str(root), "--astra", str(exe)]) == 0
    out = capsys.readouterr().out.split("per rank:\n", 1)[1]
    rows = [ln.split() for ln in out.splitlines()[1:]]
    assert rows == [
        ["ar4", "0,2-3", f"{WANT:,}", f"{WANT:,}", "+0"],
        ["ar4", "1", f"{WANT + 5:,}", f"{WANT:,}", "-5"],
    ]


def test_rank_lists_compress_to_ranges():
    assert astra_compare.rank_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert astra_compare.rank_list([3]) == "3"
    assert astra_compare.rank_list(list(range(1, 64, 2))) == "1-63/2"
    assert astra_compare.rank_list([16, 48]) == "16,48"
    assert astra_compare.rank_list([0, 2, 4, 6, 7]) == "0-6/2,7"
