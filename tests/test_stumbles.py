"""A newcomer's stumbles (issue 13 items 2-7, 10) and output safety (issue 16 "Outputs"): one test each."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import polars as pl
import pytest
from xsim.traces.outputs import OutputError, atomic_write_bytes

from tests.conftest import REPO, SHARED
from tests.test_replay_support import coll, comp, recv, send, write_set
from xsim.cli import main

RING2 = ["--topology", "switch:2:50GBps:1us"]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# --- item 2: the bundled examples are installed with the package -----------------------------------------


def test_installed_package_finds_its_examples(tmp_path) -> None:
    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if files.returncode != 0:
        pytest.skip("not a git checkout: cannot list the files a wheel would be built from")
    for name in files.stdout.splitlines():
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(src),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {r.stderr.strip().splitlines()[-1:]}")
    # Our own packaging config warns of nothing (issue 26 item 8: license as a TOML table, data folders
    # missing from `packages`).
    assert "BuildBackendWarning" not in r.stdout + r.stderr, r.stderr
    (wheel,) = tmp_path.glob("xsim_replay-*.whl")  # the distribution xsim-replay (PyPI's xsim is taken)
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    assert (site / "xsim" / "examples" / "figure1.yaml").is_file()
    # One namespace (issue 25 item 5): the wheel's only top-level names are `xsim` and its metadata.
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"xsim"}
    # From another folder, with only the installed copy importable: the demo's spec is found and plans.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = (
        "from xsim.tracegen.bundled import example_spec; from xsim.cli import main; p = example_spec('figure1.yaml');"
        "print(p); raise SystemExit(main(['plan', p, '--allow-oom']))"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == str(site / "xsim" / "examples" / "figure1.yaml")


# --- item 3: a bandwidth needs its unit --------------------------------------------------------------------


def test_bare_bandwidth_number_is_refused(capsys) -> None:
    argv = ["net", "p2p", "--topology", "ring:2:50:0ns", "--size", "1GB", "--src", "0", "--dst", "1"]
    assert main(argv) == 2
    line = _one_line_error(capsys)
    assert "'50' has no unit" in line and "50GBps" in line and "50Gbps" in line
    # With the unit: 1 GB over 50 GB/s is 20 ms.
    assert main([*argv[:3], "ring:2:50GBps:0ns", *argv[4:], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["finish_ns"] == 20_000_000


# --- item 4: one file of a set opens alone -----------------------------------------------------------------


def _set_with_groups(tmp_path: Path):
    ts = write_set(tmp_path, [[comp(1, 5), coll(2, 1024, deps=[1], pg="1")], [coll(2, 1024, pg="1")]])
    (tmp_path / "comm_group.json").write_text('{"1": [0, 1]}\n')
    return ts


def test_one_file_of_a_set_opens_alone(tmp_path, capsys) -> None:
    _set_with_groups(tmp_path)
    one = str(tmp_path / "t.0.et")
    assert main(["trace", "info", one]) == 0
    out = capsys.readouterr().out
    assert "1 rank," in out and "ALL_REDUCE" in out
    # Replaying it alone cannot run the 2-rank collective: one line, exit 2, no hang.
    assert main(["replay", one, *RING2[:1], "switch:1:50GBps:1us", "--no-progress"]) == 2
    assert "pg_name '1'" in _one_line_error(capsys)


# --- item 5: a wrong kind of file is named for what it is -------------------------------------------------


@pytest.mark.parametrize(
    ("content", "name", "expect"),
    [
        (None, "figure1.yaml", "run `xsim gen SPEC --out DIR` first"),
        (
            "DATA\n54\nconv1\t-1\t13003\tNONE\t0\t12864\tNONE\t0\t32291\tALLREDUCE\t37632\t3229\n",
            "w.txt",
            "ASTRA-sim 1.0 text workload",
        ),
        ('{"traceEvents": [], "distributedInfo": {"rank": 0}}', "k.json", "Kineto"),
        ('{"name": "x", "device_groups": []}', "spec.json", "deployment spec (JSON)"),
        ("topology: [ Ring ]\nnpus_count: [ 4 ]\nbandwidth: [ 50 ]\n", "net.yml", "ASTRA-sim network config"),
    ],
)
def test_file_kinds_are_named(tmp_path, capsys, content, name, expect) -> None:
    path = tmp_path / name
    if content is None:
        shutil.copy(REPO / "examples" / "figure1.yaml", path)
    else:
        path.write_text(content)
    for verb in (["replay", str(path), "--comm", "measured", "--no-progress"], ["trace", "info", str(path)]):
        assert main(verb) == 2
        line = _one_line_error(capsys)
        assert "not a Chakra trace" in line and expect in line and "truncated" not in line


@pytest.mark.skipif(
    not (SHARED / "peer_traces" / "text_workloads_astra-sim-1.0_format").is_dir(), reason="../shared absent"
)
def test_real_astra_text_workloads_are_named(capsys) -> None:
    for f in sorted((SHARED / "peer_traces" / "text_workloads_astra-sim-1.0_format").glob("*.txt")):
        assert main(["trace", "info", str(f)]) == 2
        assert "ASTRA-sim 1.0 text workload" in _one_line_error(capsys), f.name


# --- item 6: progress on a terminal for phases over a second, quiet otherwise -----------------------------


class _FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_phase_progress_on_a_tty_only(monkeypatch) -> None:
    from xsim.replay import progress

    tty = _FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)
    with progress.status("generating traces"):
        time.sleep(progress.PHASE_SHOW_AFTER_S + 0.5)
    assert "generating traces" in tty.getvalue()
    quick = _FakeTTY()
    monkeypatch.setattr(sys, "stderr", quick)
    with progress.status("quick phase"):
        pass  # shorter than PHASE_SHOW_AFTER_S: nothing drawn
    assert quick.getvalue() == ""
    pipe = io.StringIO()  # not a terminal: quiet however long
    monkeypatch.setattr(sys, "stderr", pipe)
    with progress.status("long phase"):
        time.sleep(progress.PHASE_SHOW_AFTER_S + 0.3)
    assert list(progress.track(range(3), "x", 3)) == [0, 1, 2] and pipe.getvalue() == ""


# --- item 7: one catalog of GPU names ----------------------------------------------------------------------


def test_gpu_names_agree_between_compute_and_interconnect(capsys) -> None:
    from xsim.netmodels.errors import TopologyError
    from xsim.netmodels.presets import canonical_gpu
    from xsim.tracegen.catalog import ALIASES, GPU_NAMES, canonical_gpu_name

    for name in [*GPU_NAMES, *ALIASES, *(n.lower() for n in GPU_NAMES)]:
        try:
            assert canonical_gpu(name) == canonical_gpu_name(name)
        except TopologyError as exc:
            # Known to both, with no interconnect row in the paper's tables: said so, never "unknown".
            assert "in the compute catalog" in str(exc) and "unknown" not in str(exc), name
    assert (
        main(["net", "p2p", "--topology", "nodes:V100x2", "--size", "1MB", "--src", "0", "--dst", "1"]) == 2
    )
    line = _one_line_error(capsys)
    assert "'V100' is in the compute catalog" in line and "--topology switch" in line


# --- item 10: outputs say what they are ------------------------------------------------------------------


def test_summary_totals_and_labels(tmp_path, capsys) -> None:
    # 2-rank data parallel, no pipeline: no "pipeline bubble"; totals say they are summed over ranks.
    write_set(tmp_path, [[comp(1, 5), coll(2, 1024, deps=[1])], [comp(1, 9), coll(2, 1024, deps=[1])]])
    assert main(["replay", str(tmp_path / "t"), *RING2, "--out", str(tmp_path / "res"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "pipeline bubble" not in out and "idle in compute" in out
    assert "summed over 2 ranks" in out
    s = json.loads((tmp_path / "res" / "summary.json").read_text())
    ranks = pl.read_parquet(tmp_path / "res" / "ranks.parquet")
    assert s["compute_ns_total"] == s["compute_ns"] == ranks["compute_ns"].sum() == 14_000
    assert s["comm_ns_total"] == ranks["comm_ns"].sum() and s["exposed_comm_ns_total"] == s["exposed_comm_ns"]
    # Rank 0 waits 4 us for rank 1 at the collective: 4,000 ns of straggler waiting.
    assert s["wait_ns_total"] == 4_000


def test_pipelined_run_says_pipeline_bubble(tmp_path, capsys) -> None:
    r0 = [comp(1, 10), send(2, dst=1, tag=1, size=4096, deps=[1])]
    r1 = [comp(1, 1), recv(2, src=0, tag=1, size=4096, deps=[1]), comp(3, 5, deps=[2])]
    write_set(tmp_path, [r0, r1])
    assert main(["replay", str(tmp_path / "t"), *RING2, "--no-progress"]) == 0
    assert "pipeline bubble" in capsys.readouterr().out


def test_readme_promises_only_written_files() -> None:
    readme = (REPO / "README.md").read_text()
    assert "`summary` as Parquet" not in readme and "collectives` and `summary` as Parquet" not in readme
    assert "10MBps" not in readme  # the tour's what-if runs on a named, realistic network


# --- issue 16: outputs ---------------------------------------------------------------------------------------


def _two_rank(tmp_path: Path):
    return write_set(tmp_path, [[comp(1, 5), coll(2, 1024, deps=[1])], [comp(1, 9), coll(2, 1024, deps=[1])]])


def test_annotate_into_a_folder_of_symlinks_leaves_inputs_alone(tmp_path, capsys) -> None:
    ts = _two_rank(tmp_path)
    before = [Path(p).read_bytes() for p in ts.paths]
    links = tmp_path / "links"
    links.mkdir()
    for p in ts.paths:
        (links / Path(p).name).symlink_to(p)
    assert main(["replay", str(tmp_path / "t"), *RING2, "--annotate", str(links), "--no-progress"]) == 2
    assert "symbolic link" in _one_line_error(capsys)
    assert [Path(p).read_bytes() for p in ts.paths] == before


def test_timeline_onto_an_input_is_refused(tmp_path, capsys) -> None:
    ts = _two_rank(tmp_path)
    before = Path(ts.paths[1]).read_bytes()
    assert main(["replay", str(tmp_path / "t"), *RING2, "--timeline", ts.paths[1], "--no-progress"]) == 2
    assert "is an input of this run" in _one_line_error(capsys)
    assert Path(ts.paths[1]).read_bytes() == before


def test_rerun_removes_stale_files_of_an_earlier_run(tmp_path, capsys) -> None:
    _two_rank(tmp_path)
    res = tmp_path / "res"
    res.mkdir()
    (res / "cost.json").write_text('{"stale": true}\n')  # as a replay of a generated set wrote it
    (res / "timeline.json").write_text("[]\n")  # an earlier run's timeline (issue 26 item 9)
    assert main(["replay", str(tmp_path / "t"), *RING2, "--out", str(res), "--no-progress"]) == 0
    names = sorted(p.name for p in res.iterdir())
    assert "cost.json" not in names and "timeline.json" not in names
    assert not [n for n in names if n.startswith(".")]  # no staging folder or temporary file left
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # nor beside it
    # Not a replay output: the folder is not replaced file by file around it (issue 27 item 3), it is
    # refused in one line, or with --force replaced as a whole.
    (res / "notes.txt").write_text("mine\n")
    assert main(["replay", str(tmp_path / "t"), *RING2, "--out", str(res), "--no-progress"]) == 2
    assert "notes.txt" in _one_line_error(capsys) and (res / "notes.txt").is_file()
    assert main(["replay", str(tmp_path / "t"), *RING2, "--out", str(res), "--force", "--no-progress"]) == 0
    assert not (res / "notes.txt").exists() and (res / "summary.json").is_file()


def test_gen_refuses_a_folder_holding_another_set(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    write_set(out, [[comp(1, 1)] for _ in range(12)], name="figure1")  # 12 ranks; Figure 1 has 10
    spec = str(REPO / "examples" / "figure1.yaml")
    assert main(["gen", spec, "--out", str(out)]) == 2
    line = _one_line_error(capsys)
    assert "figure1.10.et" in line and "--force" in line
    assert main(["gen", spec, "--out", str(out), "--force"]) == 0
    assert sorted(int(p.name.split(".")[1]) for p in out.glob("figure1.*.et")) == list(range(10))


def test_atomic_write_never_leaves_half_a_file(tmp_path, monkeypatch) -> None:
    target = tmp_path / "a.bin"
    target.write_bytes(b"old")

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        atomic_write_bytes(target, b"new" * 1000)
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"]
    monkeypatch.undo()
    link = tmp_path / "link.bin"
    link.symlink_to(target)
    with pytest.raises(OutputError, match="symbolic link"):
        atomic_write_bytes(link, b"x")
    assert target.read_bytes() == b"old"
