"""Issue 27: never lose or mix a user's data. One regression test (or more) per item, through the real CLI in
a subprocess under an address-space bound and a time limit (tests/test_limits.py's helpers); each failed
before its fix (main f90b88b + issue 31's fixes: the behaviour quoted in each comment)."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.test_limits import GIB, ROOT, _bound, _one_line_exit2, _run

TINY = """name: tiny
model: {name: tiny, layers: 4, hidden: 256, ffn_hidden: 688, heads: 8, vocab: 1000, seq_len: 128}
micro_batches: MB
device_groups:
  - {gpu: H100, ranks: [0, 1], tp: 2, layers: [1, 2], micro_batch: 1, pp_stage: 0}
  - {gpu: A100, ranks: [2, 3], tp: 2, layers: [3, 4], micro_batch: 1, pp_stage: 1}
"""
RING4 = ("--topology", "ring:4:50GBps:500ns", "--no-progress")
PT = ROOT / "traces" / "examples" / "pytorch"


def _spec(tmp: Path, mb: int = 2) -> Path:
    p = tmp / f"tiny{mb}.yaml"
    p.write_text(TINY.replace("MB", str(mb)))
    return p


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (hidden ones too) -> SHA-256 of its bytes."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def hidden(folder: Path) -> list[str]:
    """Leftovers of an interrupted writer: hidden entries beside or inside the outputs."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob(".*"))


def _gen(tmp: Path, spec: Path, out: str, env: dict | None = None, *extra: str):
    return _run(tmp, "gen", str(spec), "--out", out, *extra, mem=2 * GIB, timeout=120, env=env)


@pytest.fixture()
def two_sets(tmp_path: Path):
    """An earlier 2-micro-batch set in tmp/g, and a clean 3-micro-batch set's snapshot (the new data)."""
    old, new = _spec(tmp_path, 2), _spec(tmp_path, 3)
    assert _gen(tmp_path, new, "clean").returncode == 0
    assert _gen(tmp_path, old, "g").returncode == 0
    return old, new, snapshot(tmp_path / "g"), snapshot(tmp_path / "clean")


# --- 1. a set is written whole or not at all ---------------------------------------------------------------


@pytest.mark.parametrize(
    "fault,code",
    [
        ("stage:KILL", -9),
        ("file@3:TERM", 143),
        ("file@2:INT", 130),
        ("file@3:ENOSPC", 2),
        ("file@1:EROFS", 2),
    ],
)
def test_gen_fault_leaves_the_old_set_whole(tmp_path: Path, two_sets, fault: str, code: int) -> None:
    # Before: SIGKILL/SIGTERM/SIGINT or ENOSPC halfway left old + new rank files mixed (e.g. 476 old + 550
    # new) and .tmp files no rerun removed; `trace validate` said OK on the mix.
    _, new, old_snap, new_snap = two_sets
    proc = _gen(tmp_path, new, "g", {"XSIM_FAULT": fault})
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    if code != -9:
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert snapshot(tmp_path / "g") == old_snap  # the earlier set, byte for byte
    rerun = _gen(tmp_path, new, "g")
    assert rerun.returncode == 0, rerun.stderr
    assert snapshot(tmp_path / "g") == new_snap and hidden(tmp_path) == []
    if code == -9:  # a kill skips `finally`: the next writer clears the staging folder, in one line
        assert "leftover folder(s) of an interrupted run" in rerun.stderr


def test_kill_between_the_two_renames_restores_the_old_set(tmp_path: Path, two_sets) -> None:
    # A file system without RENAME_EXCHANGE swaps with two renames; a kill between them must not lose both.
    _, new, old_snap, new_snap = two_sets
    env = {"XSIM_FAULT": "aside:KILL", "XSIM_RENAME_EXCHANGE": "0"}
    assert _gen(tmp_path, new, "g", env).returncode == -9
    assert not (tmp_path / "g").exists()  # set aside, not lost
    rerun = _gen(tmp_path, new, "g", {"XSIM_FAULT": "stage:ENOSPC"})  # restores, then fails: old set back
    assert "restored" in rerun.stderr and rerun.returncode == 2
    assert snapshot(tmp_path / "g") == old_snap and hidden(tmp_path) == []
    assert _gen(tmp_path, new, "g").returncode == 0 and snapshot(tmp_path / "g") == new_snap


def test_reimport_to_the_same_prefix_drops_the_stale_rank(tmp_path: Path) -> None:
    # Before: a 1-rank import over a 2-rank one kept run.1.et and comm_group.json; the replay deadlocked.
    two = [f"tinygpt_2rank_{k}.{r}.json.gz" for k in ("et", "kineto") for r in (0, 1)]
    one = ["tinygpt_1rank_et.0.json.gz", "tinygpt_1rank_kineto.0.json.gz"]
    args2 = ("--et", str(PT / two[0]), str(PT / two[1]), "--kineto", str(PT / two[2]), str(PT / two[3]))
    assert _run(tmp_path, "import", "pytorch", *args2, "--out", "imp/run", mem=2 * GIB).returncode == 0
    args1 = ("--et", str(PT / one[0]), "--kineto", str(PT / one[1]))
    proc = _run(tmp_path, "import", "pytorch", *args1, "--out", "imp/run", mem=2 * GIB)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "imp").iterdir()) == ["run.0.et", "set.json"]


def test_annotate_keeps_the_sets_metadata(tmp_path: Path) -> None:
    # Issue 26 item 9: --annotate dropped deployment.json/memory.json (the annotated set lost its cluster).
    assert _gen(tmp_path, _spec(tmp_path), "g", None, "--all-ranks").returncode == 0
    proc = _run(tmp_path, "replay", "g", "--no-progress", "--annotate", "an", mem=2 * GIB)
    assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in (tmp_path / "an").iterdir())
    assert {"deployment.json", "memory.json", "set.json", "comm_group.json"} <= set(names)
    assert _run(tmp_path, "replay", "an", "--no-progress", mem=2 * GIB).returncode == 0  # replays as is


def test_result_folder_with_timeline_and_annotated_set_inside_reruns_whole(tmp_path: Path) -> None:
    # docs/replay.md's own example: --out res --timeline res/timeline.json --annotate res/annotated, twice,
    # then without the extras: the folder holds this run's files only (issue 26 item 9's stale timeline).
    assert _gen(tmp_path, _spec(tmp_path), "g", None, "--all-ranks").returncode == 0
    full = (
        "replay",
        "g",
        "--no-progress",
        "--out",
        "res",
        "--timeline",
        "res/timeline.json",
        "--annotate",
        "res/annotated",
    )
    for _ in range(2):
        proc = _run(tmp_path, *full, mem=2 * GIB)
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "res" / "annotated" / "set.json").is_file() and (
        tmp_path / "res" / "timeline.json"
    ).is_file()
    assert _run(tmp_path, "replay", "g", "--no-progress", "--out", "res", mem=2 * GIB).returncode == 0
    names = {p.name for p in (tmp_path / "res").iterdir()}
    assert "annotated" not in names and "timeline.json" not in names and hidden(tmp_path) == []


# --- 2. set identity ----------------------------------------------------------------------------------------


def test_a_file_of_another_plan_is_refused_by_name(tmp_path: Path) -> None:
    # Before: a rank file of another plan in a set passed `trace validate` (OK) and `replay` (exit 0).
    assert _gen(tmp_path, _spec(tmp_path, 2), "a").returncode == 0
    assert _gen(tmp_path, _spec(tmp_path, 3), "b").returncode == 0
    (tmp_path / "a" / "tiny.2.et").write_bytes((tmp_path / "b" / "tiny.2.et").read_bytes())
    for verb in (("trace", "validate", "a"), ("replay", "a", "--no-progress")):
        line = _one_line_exit2(_run(tmp_path, *verb, mem=2 * GIB), "tiny.2.et", "does not belong")
        assert "a/" in line


def test_a_stale_rank_is_refused_by_name(tmp_path: Path) -> None:
    assert _gen(tmp_path, _spec(tmp_path), "a", None, "--all-ranks").returncode == 0
    (tmp_path / "a" / "tiny.4.et").write_bytes((tmp_path / "a" / "tiny.3.et").read_bytes())
    _one_line_exit2(_run(tmp_path, "replay", "a", *RING4, mem=2 * GIB), "tiny.4.et", "4 ranks")


def test_another_sets_deployment_is_refused_by_name(tmp_path: Path) -> None:
    # Before: a set's traces with another set's deployment.json passed validation and replayed.
    assert _gen(tmp_path, _spec(tmp_path, 2), "a").returncode == 0
    assert _gen(tmp_path, _spec(tmp_path, 3), "b").returncode == 0
    (tmp_path / "a" / "deployment.json").write_bytes((tmp_path / "b" / "deployment.json").read_bytes())
    for verb in (("trace", "validate", "a"), ("replay", "a", "--no-progress")):
        _one_line_exit2(_run(tmp_path, *verb, mem=2 * GIB), "deployment.json", "another plan")


def test_set_id_does_not_depend_on_prices_or_cluster(tmp_path: Path) -> None:
    # A what-if edit of deployment.json (a GPU price, the cluster) keeps the set: only the plan counts.
    from xsim.tracegen.set_identity import deployment_set_id
    from xsim.tracegen.spec import load_spec

    spec = _spec(tmp_path)
    a = load_spec(str(spec))
    b = load_spec(str(spec))
    b.compute_model = "measured" if a.compute_model != "measured" else "roofline"
    c = load_spec(str(_spec(tmp_path, 3)))
    assert deployment_set_id(a, 4, "gen") == deployment_set_id(b, 4, "gen")
    assert deployment_set_id(a, 4, "gen") != deployment_set_id(c, 4, "gen")
    assert deployment_set_id(a, 4, "gen") != deployment_set_id(a, 4, "gen-raw")
    assert deployment_set_id(a, 4, "gen") != deployment_set_id(a, 8, "gen")


def test_set_id_of_a_plan_without_later_keys_is_the_one_earlier_versions_wrote() -> None:
    # Sets generated before `dp_shard` existed must still match their deployment.json: the bundled Figure 1
    # plan's id as main 58f041d computed it (tracegen/set_identity.py before LATER_PLAN_KEYS), and a plan
    # that sets the later key gets another id.
    from xsim.tracegen.set_identity import deployment_set_id
    from xsim.tracegen.spec import load_spec

    dep = load_spec(str(ROOT / "examples" / "figure1.yaml"))
    assert deployment_set_id(dep, 16, "generated") == "0c2618be8d840d55"
    dep.dp_shard = 2
    assert deployment_set_id(dep, 16, "generated") != "0c2618be8d840d55"


# --- 3. outputs never land on inputs ------------------------------------------------------------------------


def test_outputs_over_inputs_are_refused(tmp_path: Path) -> None:
    assert _gen(tmp_path, _spec(tmp_path), "g", None, "--no-rewrite", "--all-ranks").returncode == 0
    before = snapshot(tmp_path / "g")
    cases = [
        # Before: replaced the set's own metadata (the set no longer replayed).
        (("replay", "g", "--no-progress", "--timeline", "g/deployment.json"), "refusing to overwrite"),
        # Before: replaced the 11 raw files in place.
        (("rewrite", "g", "--out", "g"), "holds an input"),
        (("replay", "g", "--no-progress", "--out", "g"), "holds an input"),
        (("replay", "g", "--no-progress", "--annotate", "g"), "holds an input"),
    ]
    for argv, word in cases:
        _one_line_exit2(_run(tmp_path, *argv, mem=2 * GIB), word)
    assert snapshot(tmp_path / "g") == before
    assert _run(tmp_path, "replay", "g", "--no-progress", "--out", "r", mem=2 * GIB).returncode == 0
    # Before: `report --out` could overwrite the trace it describes.
    _one_line_exit2(_run(tmp_path, "report", "r", "--out", "g/tiny.0.et", mem=2 * GIB), "trace set")
    assert snapshot(tmp_path / "g") == before


def test_a_folder_of_another_set_or_the_users_files_is_refused(tmp_path: Path) -> None:
    # Before: `import` into a folder holding another set overwrote its comm_group.json.
    assert _gen(tmp_path, _spec(tmp_path), "g").returncode == 0
    before = snapshot(tmp_path / "g")
    args = (
        "--et",
        str(PT / "tinygpt_1rank_et.0.json.gz"),
        "--kineto",
        str(PT / "tinygpt_1rank_kineto.0.json.gz"),
    )
    _one_line_exit2(
        _run(tmp_path, "import", "pytorch", *args, "--out", "g/run", mem=2 * GIB), "tiny.0.et", "--force"
    )
    assert snapshot(tmp_path / "g") == before
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "notes.txt").write_text("mine\n")
    _one_line_exit2(_run(tmp_path, "replay", "g", "--no-progress", "--out", "r", mem=2 * GIB), "notes.txt")
    assert (tmp_path / "r" / "notes.txt").read_text() == "mine\n"
    # --force replaces the folder as a whole, never file by file.
    assert (
        _run(tmp_path, "replay", "g", "--no-progress", "--out", "r", "--force", mem=2 * GIB).returncode == 0
    )
    assert not (tmp_path / "r" / "notes.txt").exists() and (tmp_path / "r" / "summary.json").is_file()


def test_symbolic_links_are_never_written_through(tmp_path: Path) -> None:
    assert _gen(tmp_path, _spec(tmp_path), "g").returncode == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine\n")
    (tmp_path / "link").symlink_to(mine)
    _one_line_exit2(
        _run(tmp_path, "replay", "g", "--no-progress", "--out", "link", mem=2 * GIB), "symbolic link"
    )
    _one_line_exit2(_gen(tmp_path, _spec(tmp_path), "link"), "symbolic link")
    assert sorted(p.name for p in mine.iterdir()) == ["keep.txt"]


# --- 4. one writer per folder -------------------------------------------------------------------------------


def test_a_second_writer_waits_then_is_refused_in_one_line(tmp_path: Path) -> None:
    # Before: two concurrent `xsim gen --out SAME` both exited 0 and left 14 + 1,013 files of two plans.
    from xsim.traces.outputs import _Lock

    assert _gen(tmp_path, _spec(tmp_path), "g").returncode == 0
    before = snapshot(tmp_path / "g")
    with _Lock(str(tmp_path / "g"), 1.0):
        t0 = time.monotonic()
        proc = _gen(tmp_path, _spec(tmp_path, 3), "g", {"XSIM_LOCK_WAIT_S": "1.5"})
        waited = time.monotonic() - t0
    line = _one_line_exit2(proc, "another xsim run", f"pid {os.getpid()}")
    assert "waited 1.5 s" in line and waited >= 1.5
    assert snapshot(tmp_path / "g") == before and hidden(tmp_path) == []


def test_a_second_sweep_into_the_same_folder_is_refused(tmp_path: Path) -> None:
    from xsim.traces.outputs import folder_lock

    with folder_lock(tmp_path / "o"):
        proc = _run(
            tmp_path,
            "sweep",
            str(_spec(tmp_path)),
            "--out",
            "o",
            env={"XSIM_LOCK_WAIT_S": "0.5"},
            mem=2 * GIB,
        )
    _one_line_exit2(proc, "another xsim run", "waited 0.5 s")
    assert not (tmp_path / "o").exists()


def test_two_concurrent_writers_leave_one_whole_set(tmp_path: Path) -> None:
    specs = [_spec(tmp_path, 2), _spec(tmp_path, 3)]
    for i, s in enumerate(specs):
        assert _gen(tmp_path, s, f"clean{i}").returncode == 0
    clean = [snapshot(tmp_path / f"clean{i}") for i in range(2)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XSIM_LOCK_WAIT_S": "300"}  # a loaded machine: wait
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "xsim", "gen", str(s), "--out", "g"],
            cwd=tmp_path, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            preexec_fn=_bound(2 * GIB),
        )
        for s in specs
    ]  # fmt: skip
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errs  # the second waited for the first (bounded wait)
    assert snapshot(tmp_path / "g") in clean and hidden(tmp_path) == []


# --- 5. every output failure is one line; Ctrl-C one line; --scheduler checked ------------------------------


@pytest.mark.parametrize("fault", ["file@1:ENOSPC", "file@2:EROFS", "stage:ENOSPC"])
def test_replay_out_failure_is_one_line_and_keeps_the_old_result(tmp_path: Path, fault: str) -> None:
    # Before: `replay` on a nearly full disk was a polars ComputeError traceback.
    assert _gen(tmp_path, _spec(tmp_path), "g").returncode == 0
    assert _run(tmp_path, "replay", "g", "--no-progress", "--out", "r", mem=2 * GIB).returncode == 0
    before = {k: v for k, v in snapshot(tmp_path / "r").items() if k != "perf.json"}
    proc = _run(
        tmp_path, "replay", "g", "--no-progress", "--out", "r", env={"XSIM_FAULT": fault}, mem=2 * GIB
    )
    line = _one_line_exit2(proc, "r: cannot write")
    assert "xsim-new" not in line  # names the folder asked for, not the staging one
    assert {k: v for k, v in snapshot(tmp_path / "r").items() if k != "perf.json"} == before
    assert hidden(tmp_path) == []


def test_non_utf8_output_paths_are_one_line(tmp_path: Path) -> None:
    # Before: replay --out, validate --out, sweep --out with a non-UTF-8 name were tracebacks.
    assert _gen(tmp_path, _spec(tmp_path), "g").returncode == 0
    bad = os.fsdecode(b"out\xff")
    for argv in (
        ("replay", "g", "--no-progress", "--out", bad),
        ("validate", "--sim", "r", "--real", "k.json", "--out", bad),
        ("sweep", str(_spec(tmp_path)), "--out", bad),
        ("gen", str(_spec(tmp_path)), "--out", bad),
    ):
        _one_line_exit2(_run(tmp_path, *argv, mem=2 * GIB), "not valid UTF-8")
    assert not any(b"\xff" in os.fsencode(p.name) for p in tmp_path.iterdir())


def test_interrupt_is_one_line(tmp_path: Path) -> None:
    assert _gen(tmp_path, _spec(tmp_path), "g").returncode == 0
    for fault, code, word in (("file@1:INT", 130, "interrupted"), ("file@1:TERM", 143, "terminated")):
        proc = _run(
            tmp_path, "replay", "g", "--no-progress", "--out", "r", env={"XSIM_FAULT": fault}, mem=2 * GIB
        )
        assert proc.returncode == code and proc.stderr.strip().splitlines()[-1] == f"xsim: {word}", (
            proc.stderr
        )
        assert "Traceback" not in proc.stderr and not (tmp_path / "r").exists() and hidden(tmp_path) == []


def _server(reply: bytes | None) -> tuple[socket.socket, int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        if reply is not None:
            conn.sendall(reply)
        time.sleep(30)  # holds the connection: a client must give up on its own

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


@pytest.mark.parametrize(
    "reply,word",
    [(b"HTTP/1.1 400 Bad Request\r\n\r\n" * 4, "other than a Dask handshake"), (None, "no Dask handshake")],
)
def test_scheduler_that_is_not_dask_is_refused_in_bounded_time(tmp_path: Path, reply, word: str) -> None:
    # Before: a non-Dask server made Dask allocate 3 EiB (MemoryError traceback); a silent one held the sweep.
    srv, port = _server(reply)
    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        "name: s\nbase:\n"
        + "".join("  " + ln + "\n" for ln in TINY.replace("MB", "2").splitlines()[1:])
        + "axes:\n  micro_batches: [2, 4]\n"
    )
    t0 = time.monotonic()
    proc = _run(
        tmp_path,
        "sweep",
        str(sweep),
        "--out",
        "o",
        "--scheduler",
        f"tcp://127.0.0.1:{port}",
        mem=3 * GIB,
        timeout=60,
    )
    assert time.monotonic() - t0 < 30
    srv.close()
    _one_line_exit2(proc, "--scheduler", word)


def test_tls_scheduler_without_config_is_one_line(tmp_path: Path) -> None:
    from xsim.explore.scheduler import SchedulerError, probe_scheduler

    with pytest.raises(SchedulerError, match="tls:// needs TLS settings"):
        probe_scheduler("tls://127.0.0.1:1")
