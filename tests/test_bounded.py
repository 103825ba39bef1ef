"""Issue 31: bounded and honest everywhere, the remainder. One regression test (or more) per item, through the
real CLI under an address-space bound and a time limit (tests/test_limits.py's helpers) where a process is
at stake; each failed before its fix."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from xsim.netmodels.errors import UnitError
from xsim.netmodels.units import parse_size
from xsim.traces import pb
from xsim.traces.attrs import make_attr, make_node
from xsim.traces.groups import ProcessGroups
from xsim.traces.stream import write_et

from tests.test_limits import GIB, _one_line_exit2, _run

MIB = 1 << 20

TINY_BASE = """
  model: {name: tiny, layers: 4, hidden: 256, ffn_hidden: 688, heads: 8, vocab: 1000, seq_len: 128}
  micro_batches: 2
  device_groups:
    - {gpu: H100, ranks: [0, 1], tp: 2, layers: [1, 2], micro_batch: 1, pp_stage: 0}
    - {gpu: A100, ranks: [2, 3], tp: 2, layers: [3, 4], micro_batch: 1, pp_stage: 1}
"""


def _sweep_file(tmp: Path, axes: str) -> Path:
    f = tmp / "tiny.yaml"
    f.write_text(f"name: tiny\nbase:{TINY_BASE}axes:\n{axes}")
    return f


# --- 1. a collective with no pg_name: one members tuple per group, not one per call ---------------------


def _unnamed_set(folder: Path, ranks: int) -> None:
    """RANKS identical files: a compute node, then one 1 MiB AllReduce without pg_name (every rank)."""
    ar = make_node(2, "ar", pb.COMM_COLL_NODE, data_deps=[1], attrs={"comm_type": pb.ALL_REDUCE})
    ar.attr.append(make_attr("comm_size", MIB))
    write_et(folder / "t.0.et", [make_node(1, "k", pb.COMP_NODE, duration_micros=10), ar])
    for r in range(1, ranks):
        shutil.copyfile(folder / "t.0.et", folder / f"t.{r}.et")


def test_every_rank_group_is_one_shared_tuple() -> None:
    from xsim.replay.program import resolve_group

    g = ProcessGroups(num_ranks=5, groups={"1": (0, 1)})
    names = ("", "0", "0.0", "+0")
    got = [resolve_group(g, n) for n in names]
    assert all(r == ("", (0, 1, 2, 3, 4)) for r in got)
    assert all(r[1] is g.all_ranks for r in got)  # the same object: no tuple per call
    assert g.members("") is g.members("0") is g.all_ranks


def test_unnamed_collectives_on_3072_ranks_fit_in_320_mib(tmp_path: Path) -> None:
    # Before: a 3,072-tuple of fresh ints per rank's call, 3,072^2 x ~36 B = ~340 MB (peak RSS 396 MB, and
    # a MemoryError at 65,536 ranks); now 59 MB RSS, and the whole replay fits a 320 MiB address space.
    _unnamed_set(tmp_path, 3072)
    proc = _run(
        tmp_path, "replay", str(tmp_path), "--no-progress", "--topology", "ring:3072:50GBps:500ns",
        "--json", mem=320 * MIB, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["num_ranks"] == 3072


# --- 2. plan --search: bounded GPUs and an estimated plan count before enumerating -----------------------


@pytest.mark.parametrize("gpus", [10**9, 1 << 20])
def test_search_gpu_count_is_bounded(tmp_path: Path, gpus: int) -> None:
    # Before: 10^9 GPUs spun in range(1, 10^9 + 1); 2^20 grew to 3.8 GB and a MemoryError traceback.
    proc = _run(
        tmp_path, "plan", "--search", f"{gpus}xH100", "--model", "llama2-7b", "--global-batch", "16",
        mem=2 * GIB, timeout=60,
    )  # fmt: skip
    _one_line_exit2(proc, f"{gpus:,} GPUs", "limit of 16,384", "XSIM_MAX_SEARCH_GPUS")


def test_search_plan_count_is_bounded(tmp_path: Path) -> None:
    # Twelve one-GPU pools: 12! pool orders of the pipeline family; before, itertools.permutations spun.
    cluster = "+".join(["1xH100"] * 12)
    proc = _run(
        tmp_path, "plan", "--search", cluster, "--model", "llama2-7b", "--global-batch", "16",
        mem=2 * GIB, timeout=60,
    )  # fmt: skip
    _one_line_exit2(proc, "plans or more", "limit of 20,000", "XSIM_MAX_SEARCH_PLANS")


def test_search_limits_edges_and_count_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from xsim.tracegen.models import preset

    from xsim.explore import search as se

    m = preset("llama2-7b")
    for cluster in ("4xH100+4xA100-40GB", "8xH100", "2xH100+2xA100-40GB+2xH100", "1xH100+1xH100+1xH100"):
        pools = se.parse_cluster(cluster)
        n = se.count_bound(pools, m, 16, 10**9)
        assert n >= len(se.enumerate_candidates(pools, m, 16)) > 0
    # 8xH100 alone: r in {1, 2, 4, 8}; shapes (k, t) with k = 8 / r / t <= 4 and t | 32 heads: r=1: t 2, 4, 8;
    # r=2: t 1, 2, 4; r=4: t 1, 2; r=8: t 1 -> 9 shapes, 1 pool order, 3 micro-batch sizes dividing 16 (r=8:
    # mb 1, 2 only: 16 % 32), 3 cuts, 3 reshard strategies (xsim, hetauto, alpacomm):
    # (3 + 3 + 2) x 3 x 9 + 1 x 2 x 9 = 234.
    assert se.count_bound(se.parse_cluster("8xH100"), m, 16, 10**9) == 234
    # docs/decide.md's cluster: pipeline r=1: 3 x 3 shapes x 3 mb x 3 cuts x 3 reshards x 2 orders = 486,
    # r=2: 2 x 2 x 54 = 216, r=4: 1 x 54 = 54; split: 6 x 6 shapes x 3 micro-batch counts = 108 -> 864.
    pools = se.parse_cluster("4xA100-40GB+4xH100")
    assert se.count_bound(pools, m, 16, 10**9) == 864 and len(se.enumerate_candidates(pools, m, 16)) == 574
    pools = se.parse_cluster("8xH100")
    monkeypatch.setenv("XSIM_MAX_SEARCH_PLANS", "234")
    assert se.check_search_size("8xH100", pools, m, 16) == 234  # at the limit: accepted
    monkeypatch.setenv("XSIM_MAX_SEARCH_PLANS", "233")
    with pytest.raises(se.SearchError, match="XSIM_MAX_SEARCH_PLANS"):
        se.check_search_size("8xH100", pools, m, 16)
    monkeypatch.setenv("XSIM_MAX_SEARCH_GPUS", "7")
    with pytest.raises(se.SearchError, match="8 GPUs, more than the search's limit of 7"):
        se.check_search_size("8xH100", pools, m, 16)
    assert se._divisors(10**9)[:4] == [1, 2, 4, 5] and len(se._divisors(10**9)) == 100  # 2^9 5^9: 10 x 10


# --- 3. sweep: exit status, failed rows from earlier runs, and a bounded plan count ----------------------


def test_sweep_where_every_plan_fails_exits_1(tmp_path: Path) -> None:
    # TP 3 divides neither 8 heads: both plans are error rows. Before: exit 0.
    f = _sweep_file(tmp_path, "  tp: [[3, 1], [1, 3]]\n")
    proc = _run(tmp_path, "sweep", str(f), "--out", str(tmp_path / "o"), "--workers", "1", "--no-progress",
                mem=4 * GIB, timeout=240)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "2 plans: 2 run, 0 already in" in proc.stdout and "2 failed" in proc.stdout
    assert "no plan finished (exit 1)" in proc.stdout


def test_failed_row_of_an_earlier_run_is_counted_then_retried(tmp_path: Path) -> None:
    from xsim.explore import sweep as sw

    f = _sweep_file(tmp_path, "  schedule: [1f1b]\n")
    out = tmp_path / "o"
    (task,) = sw.expand(sw.load_sweep(f), str(out))
    # What a full disk left: an error row for a plan that is fine.
    sw.write_row(str(out), sw._row(task, status="error", error="OSError: [Errno 28] No space left on device"))
    proc = _run(tmp_path, "sweep", str(f), "--out", str(out), "--no-progress", mem=4 * GIB, timeout=120)
    # Before: exit 0 and "1 plans: 0 run, 1 already in ..., 0 failed" above the error row.
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "1 plans: 0 run, 1 already in" in proc.stdout
    assert "1 failed (1 in an earlier run: --retry-failed runs them again)" in proc.stdout
    pic = tmp_path / "pic"  # item 5: a --plot without a suffix is written, and reported, as pic.png
    proc = _run(tmp_path, "sweep", str(f), "--out", str(out), "--no-progress", "--retry-failed", "--workers",
                "1", "--plot", str(pic), mem=4 * GIB, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "1 plans: 1 run, 0 already in" in proc.stdout and " 0 failed;" in proc.stdout
    assert f"plot {pic}.png" in proc.stdout and Path(f"{pic}.png").stat().st_size > 0
    assert sw.rows_for([task], str(out))["status"].to_list() == ["ok"]


def test_sweep_of_64000_plans_is_refused_before_expanding(tmp_path: Path) -> None:
    # 40 x 40 x 40 = 64,000 plans; before, each was resolved (load_spec) before anything ran.
    vals = ", ".join(str(i) for i in range(1, 41))
    f = _sweep_file(tmp_path, f"  micro_batches: [{vals}]\n  seq_len: [{vals}]\n  global_batch: [{vals}]\n")
    proc = _run(tmp_path, "sweep", str(f), "--out", str(tmp_path / "o"), "--no-progress", mem=2 * GIB,
                timeout=60)  # fmt: skip
    _one_line_exit2(proc, str(f), "64,000 plans", "limit of 4,096", "XSIM_MAX_SWEEP_PLANS")


def test_sweep_limit_edge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from xsim.explore import sweep as sw

    f = _sweep_file(tmp_path, "  micro_batches: [1, 2, 3]\n  schedule: [1f1b, gpipe]\n")
    s = sw.load_sweep(f)
    monkeypatch.setenv("XSIM_MAX_SWEEP_PLANS", "6")
    assert sw.check_sweep_size(s, str(f)) == 6
    monkeypatch.setenv("XSIM_MAX_SWEEP_PLANS", "5")
    with pytest.raises(sw.SweepError, match="6 plans .* limit of 5 \\(XSIM_MAX_SWEEP_PLANS raises it\\)"):
        sw.check_sweep_size(s, str(f))


# --- 4. the spec-list form refuses --scheduler ----------------------------------------------------------


def test_spec_list_refuses_scheduler(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    for p in (a, b):
        p.write_text(TINY_BASE.replace("\n  ", "\n"))
    # Before: ran both specs in this process (exit 0) and never contacted the scheduler.
    proc = _run(tmp_path, "sweep", str(a), str(b), "--scheduler", "tcp://127.0.0.1:9", "--out",
                str(tmp_path / "o"), mem=2 * GIB, timeout=60)  # fmt: skip
    _one_line_exit2(proc, "--scheduler", "sweep file")
    assert not (tmp_path / "o").exists()


# --- 5. exact sizes, the reported plot file, staging folders of killed runs -----------------------------


def test_sizes_parse_exactly() -> None:
    assert parse_size("9007199254740993") == 2**53 + 1  # through a float: ...992
    assert parse_size("18446744073709551617B") == 2**64 + 1
    assert parse_size("1.5KiB") == 1536 and parse_size("1e3") == 1000 and parse_size("0.5KB") == 500
    for bad in ("0.3B", "1e-999999999", "1e999999999", "1.0000000001B"):
        with pytest.raises(UnitError):
            parse_size(bad)


def test_sizes_parse_exactly_refuses_a_fraction_of_a_byte() -> None:
    with pytest.raises(UnitError, match="not a whole number"):
        parse_size("3.0000000000000000001GB")


def test_net_collective_reports_the_exact_size(tmp_path: Path) -> None:
    proc = _run(tmp_path, "net", "collective", "--topology", "ring:4:50GBps:500ns", "--collective",
                "all_reduce", "--size", "9007199254740993", "--json", mem=2 * GIB, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["size_bytes"] == 9007199254740993


def test_plot_path_is_the_file_written(tmp_path: Path) -> None:
    from xsim.explore.sweep import plot_path

    (tmp_path / "d").mkdir()
    assert plot_path(str(tmp_path / "d")) == str(tmp_path / "d" / "pareto.png")
    assert plot_path(str(tmp_path / "p")) == str(tmp_path / "p") + ".png"
    assert plot_path(str(tmp_path / "p.svg")) == str(tmp_path / "p.svg")


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_staging_folders_go_on_the_next_run(tmp_path: Path) -> None:
    # Issue 27 replaced the per-file staging inside the result folder by a sibling folder swapped in whole:
    # a killed run's sibling (this host, process gone) goes on the next run, said in one line; a live
    # run's stays; the old in-folder staging folders go with the folder they were in.
    from xsim.traces.outputs import _host

    _unnamed_set(tmp_path, 2)
    out = tmp_path / "r"
    out.mkdir()
    legacy = out / ".xsim-staging.k3j_x9a1"  # the per-file staging of an earlier xsim
    dead = tmp_path / f".r.xsim-new.{_host()}.{_dead_pid()}.ab12cd"
    live = tmp_path / f".r.xsim-new.{_host()}.{os.getpid()}.ef34gh"  # this pytest process: alive
    for d in (legacy, dead, live):
        d.mkdir()
        (d / "ops.parquet").write_bytes(b"partial")
    proc = _run(tmp_path, "replay", str(tmp_path), "--no-progress", "--topology", "ring:2:50GBps:500ns",
                "--out", str(out), mem=2 * GIB, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "removed 1 leftover folder(s) of an interrupted run" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [live.name]
    assert not legacy.exists() and (out / "summary.json").is_file()
    assert socket.gethostname()  # the owner check compares this host's name


# --- 6. the default model says it is contention-free ---------------------------------------------------


def test_summary_names_the_models_contention(tmp_path: Path) -> None:
    _unnamed_set(tmp_path, 4)
    base = ("replay", str(tmp_path), "--no-progress", "--topology", "ring:4:50GBps:500ns")
    ana = _run(tmp_path, *base, mem=2 * GIB, timeout=120)
    assert ana.returncode == 0, ana.stderr
    lines = ana.stdout.splitlines()
    assert "(network analytical, contention-free, compute " in lines[0]
    assert lines[1].startswith("note ") and "contention-free" in lines[1] and "--model flow" in lines[1]
    flow = _run(tmp_path, *base, "--model", "flow", mem=2 * GIB, timeout=120)
    assert flow.returncode == 0, flow.stderr
    assert "(network flow, links shared, compute " in flow.stdout.splitlines()[0]
    # No contention note under the flow model (the fold line may name contention-free models: it says why
    # a flow replay is not folded).
    assert not [line for line in flow.stdout.splitlines() if line.startswith("note ")]
    helptext = _run(tmp_path, "replay", "--help", mem=2 * GIB, timeout=60).stdout
    assert "contention-free" in " ".join(helptext.split())
