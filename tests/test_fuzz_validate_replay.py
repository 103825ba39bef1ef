"""Issue 16: `xsim trace validate` runs the replay's own matching, so a set it passes does not deadlock.

Each case below passed the static cross-rank checks before (exit 0) and deadlocked in `xsim replay`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from xsim.replay.config import ReplayConfig
from xsim.replay.dryrun import validate_set
from xsim.replay.errors import ReplayDeadlock
from xsim.replay.simulation import simulate
from xsim.traces import pb
from xsim.traces.checks import INVALID, WARNING, check_all
from xsim.traces.groups import resolve_groups

from tests.test_replay_support import FakeNet, coll, comp, recv, send, write_set

ROOT = Path(__file__).resolve().parents[1]


def _meta(*groups: tuple[str, list[int]]) -> pb.Node:
    """A PyTorch `## process_group:init ##` METADATA node declaring the groups."""
    n = pb.Node(id=0, name="## process_group:init ##", type=pb.METADATA_NODE)
    n.inputs.values = json.dumps([{"pg_name": name, "ranks": ranks} for name, ranks in groups])
    return n


def _validate(prefix: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xsim", "trace", "validate", str(prefix)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


def _findings(ts):
    files = [ts.load(r) for r in range(ts.num_ranks)]
    groups = resolve_groups(((f.path, f.nodes) for f in files), ts.num_ranks, directory=ts.directory)
    return files, groups, validate_set(ts, files, groups)


def _cpu_op_set(tmp_path: Path):
    # Rank 0 records the collective as its host-side call (is_cpu_op: replayed as a CPU op, no matching);
    # rank 1 as the GPU collective, which waits for rank 0 forever. The static checks counted both.
    return write_set(
        tmp_path,
        [
            [comp(1, 5), coll(2, 1000, deps=[1], is_cpu_op=True), comp(3, 5, deps=[2])],
            [comp(1, 5), coll(2, 1000, deps=[1]), comp(3, 5, deps=[2])],
        ],
    )


def _group_removed_set(tmp_path: Path):
    # Group "1" = ranks {0, 1} = all ranks; rank 1's collective lost its pg_name (the default group). The
    # static checks key sequences by member list (equal); the replay keys instances by group name.
    return write_set(
        tmp_path,
        [
            [_meta(("1", [0, 1])), comp(1, 5), coll(2, 1000, deps=[1], pg="1")],
            [_meta(("1", [0, 1])), comp(1, 5), coll(2, 1000, deps=[1])],
        ],
    )


def test_cpu_op_collective_on_one_rank_is_invalid(tmp_path: Path) -> None:
    ts = _cpu_op_set(tmp_path)
    files, groups, found = _findings(ts)
    assert check_all(files, groups) == []  # what validate used to say
    with pytest.raises(ReplayDeadlock) as exc:
        simulate(ts, network=FakeNet(2))
    assert [(s.rank, s.node_id) for s in exc.value.stuck] == [(1, 2)]
    assert [(f.kind, f.code, f.path, f.rank, f.node_index, f.node_id) for f in found] == [
        (INVALID, "replay-deadlock", ts.paths[1], 1, 1, 2)
    ]
    # Rank 0 runs on: compute 5 us, its CPU op (recorded 0 us -> 1 ns), compute 5 us: the last event is at
    # 5,000 + 1 + 5,000 ns, rank 1 waiting since 5,000 ns.
    assert "t=10001 ns" in found[0].message and "rank(s) [0] never issued it" in found[0].message
    res = _validate(ts.prefix)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr
    assert lines[0].startswith(f"{ts.paths[1]}, rank 1, node #1, id 2: replay deadlocks")
    assert "'coll2' waits for collective #0" in lines[0] and lines[0].endswith("[replay-deadlock]")


def test_process_group_removed_on_one_rank_is_invalid(tmp_path: Path) -> None:
    ts = _group_removed_set(tmp_path)
    files, groups, found = _findings(ts)
    assert check_all(files, groups) == []
    with pytest.raises(ReplayDeadlock) as exc:
        simulate(ts, network=FakeNet(2))
    assert sorted((s.rank, s.node_id) for s in exc.value.stuck) == [(0, 2), (1, 2)]
    assert [(f.path, f.rank, f.node_id) for f in found] == [(ts.paths[0], 0, 2), (ts.paths[1], 1, 2)]
    assert "group '1'" in found[0].message and "group '(all ranks)'" in found[1].message
    res = _validate(ts.prefix)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 2  # the documented list: one line per stuck rank
    for r, line in enumerate(lines):
        assert line.startswith(f"{ts.paths[r]}, rank {r}, node #2, id 2: replay deadlocks at t=5000 ns")


def test_cross_group_order_warns_for_one_comm_slot(tmp_path: Path) -> None:
    # Two groups over the same ranks issued in opposite orders: per-group streams (the default models)
    # replay it; one comm slot per rank (ASTRA-sim's rule) deadlocks. A warning, exit 0.
    g = (("1", [0, 1]), ("2", [0, 1]))
    ts = write_set(
        tmp_path,
        [
            [_meta(*g), comp(1, 5), coll(2, 64, deps=[1], pg="1"), coll(3, 64, deps=[1], pg="2")],
            [_meta(*g), comp(1, 5), coll(2, 64, deps=[1], pg="2"), coll(3, 64, deps=[1], pg="1")],
        ],
    )
    simulate(ts, network=FakeNet(2))  # default streams: completes
    with pytest.raises(ReplayDeadlock):
        simulate(ts, network=FakeNet(2), config=ReplayConfig(comm_streams="shared"))
    _files, _groups, found = _findings(ts)
    assert [(f.kind, f.rank, f.node_id) for f in found] == [(WARNING, 0, 2), (WARNING, 1, 2)]
    assert all("one comm slot per rank" in f.message for f in found)
    res = _validate(ts.prefix)
    assert res.returncode == 0, res.stderr
    assert "OK (2 warnings)" in res.stdout


def test_matched_set_has_no_replay_findings(tmp_path: Path) -> None:
    # A pipeline hand-off and a collective that match: the dry replay completes and adds nothing.
    ts = write_set(
        tmp_path,
        [
            [comp(1, 5), send(2, 1, 7, 100, deps=[1]), coll(3, 64, deps=[2])],
            [recv(1, 0, 7, 100), comp(2, 5, deps=[1]), coll(3, 64, deps=[2])],
        ],
    )
    _files, _groups, found = _findings(ts)
    assert found == []
    res = _validate(ts.prefix)
    assert res.returncode == 0 and res.stderr == "" and "OK" in res.stdout
