"""The timeline is integer-ns exact: abutting ops abut in any viewer, no two ops on one lane overlap.

Issue 13 item 1: with float `ts + dur`, 1,117 of 16,247 abutting ops of the Figure 1 set overlapped by
~1e-12 us and speedscope drew each rank's compute lane as a staircase. Checked here on the generated Figure 1
set, on the bundled PyTorch import, and in the real viewer (speedscope in headless Chromium).
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest
from xsim.replay import DurationModel, ReplayConfig, SpeedScaled, simulate
from xsim.replay.export import write_timeline
from xsim.replay.export.timeline import lane_spans
from xsim.tracegen.spec import load_spec, save_deployment
from xsim.tracegen.workload import generate

from tests import browser
from tests.conftest import REPO
from tests.test_replay_support import FakeNet, comp, write_set
from xsim.cli import main

EX = REPO / "traces" / "examples" / "pytorch"


def _check_exact(doc: dict, ops) -> int:
    """Every B/E timestamp is the exact ns/1000 of its op; lanes never overlap; returns abutting pairs."""
    by_node = {(r, n): (s, e) for r, n, s, e in ops.select("rank", "node_id", "start_ns", "end_ns").rows()}
    begins = [e for e in doc["traceEvents"] if e["ph"] == "B"]
    assert len(begins) == ops.filter(ops["resource"] != "none").height
    for b in begins:
        s, e = by_node[(b["pid"], b["args"]["node_id"])]
        # The JSON literal, read as a decimal, is exactly start_ns / 1000.
        assert Decimal(repr(b["ts"])) * 1000 == s
    abut = 0
    for spans in lane_spans(doc).values():
        for (_, end_a), (begin_b, _) in zip(spans, spans[1:], strict=False):
            assert end_a <= begin_b  # float comparison, as a viewer does it
            abut += end_a == begin_b
    return abut


def _figure1(tmp_path: Path):
    """Figure 1 generated and replayed by the CLI (its deployment's cluster); (ops table, timeline path)."""
    dep = load_spec(str(REPO / "examples" / "figure1_paper.yaml"))
    generate(dep).write(tmp_path / "fig1", dep.name)
    save_deployment(dep, tmp_path / "fig1" / "deployment.json")
    tl = tmp_path / "timeline.json"
    argv = ["replay", str(tmp_path / "fig1"), "--out", str(tmp_path / "res"), "--timeline", str(tl)]
    assert main([*argv, "--no-progress"]) == 0
    return pl.read_parquet(tmp_path / "res" / "ops.parquet"), tl


def test_generated_set_lanes_abut_exactly(tmp_path) -> None:
    ops, tl = _figure1(tmp_path)
    doc = json.loads(tl.read_text())
    # Thousands of back-to-back ops: the case that overlapped by 1e-12 us with float ts + dur.
    assert _check_exact(doc, ops) > 1000


def test_float_sum_would_have_overlapped() -> None:
    # The example: the old `ts + dur` is not the next op's start; B/E carry both ends literally.
    assert 12218.513 + 150.243 > 12368.756


def test_bundled_pytorch_import_lanes(tmp_path) -> None:
    ets = [str(EX / f"tinygpt_2rank_et.{r}.json.gz") for r in range(2)]
    kin = [str(EX / f"tinygpt_2rank_kineto.{r}.json.gz") for r in range(2)]
    assert main(["import", "pytorch", "--et", *ets, "--kineto", *kin, "--out", str(tmp_path / "run")]) == 0
    res = simulate(str(tmp_path / "run"), network=None, config=ReplayConfig(comm_mode="measured"))
    doc = json.loads(Path(write_timeline(res, tmp_path / "tl.json")).read_text())
    _check_exact(doc, res.ops)


def test_names_flows_and_counters(tmp_path) -> None:
    # Rank 0: two abutting computes of 1 us run 3x faster: 333 ns each (ends 0.333 and 0.666 us).
    ts = write_set(tmp_path, [[comp(1, 1), comp(2, 1, deps=[1])], [comp(1, 7)]])
    res = simulate(ts, network=FakeNet(2), compute=SpeedScaled(DurationModel(), {0: 3.0}))
    doc = json.loads(Path(write_timeline(res, tmp_path / "tl.json")).read_text())
    ev = doc["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["name"] == "thread_name"}
    assert names == {(0, 100): "compute", (1, 100): "compute"}
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["name"] == "process_name"}
    assert procs == {0: "rank 0", 1: "rank 1"}
    spans = lane_spans(doc)
    assert spans[(0, 100)] == [(0.0, 0.333), (0.333, 0.666)]


def test_timeline_refuses_an_input_file(tmp_path) -> None:
    from xsim.traces.outputs import OutputError

    ts = write_set(tmp_path, [[comp(1, 1)], [comp(1, 2)]])
    res = simulate(ts, network=FakeNet(2))
    target = Path(res.paths[0])
    before = target.read_bytes()
    with pytest.raises(OutputError, match="is an input of this run"):
        write_timeline(res, target)
    assert target.read_bytes() == before


@pytest.mark.skipif(browser.missing(need_speedscope=True) is not None, reason=str(browser.missing(True)))
def test_speedscope_renders_one_level_per_lane(tmp_path) -> None:
    _, tl = _figure1(tmp_path)
    png = tmp_path / "speedscope.png"
    browser.render_speedscope(tl, png)
    px = browser.png_pixels(png)
    if px is None:
        pytest.skip("matplotlib absent: cannot read the screenshot")
    colored = (px.max(axis=2) - px.min(axis=2) > 0.15).sum(axis=1)
    # speedscope (1.25) draws rank 0's compute lane: the minimap on top, then the flame chart whose first
    # row of frames lies at y 143..162. A staircase (ops nested under their predecessor) fills rows below.
    assert colored[143:163].max() > 50
    assert colored[170:880].max() == 0


def test_comm_rate_counter_by_hand() -> None:
    from xsim.replay.export.timeline import _counters

    # Rank 0: 1,000 B active over [0, 100) ns = 10 GB/s; 3,000 B over [50, 150) after 0 wait = 30 GB/s;
    # a recv that waits 40 ns then moves 600 B over [140, 200) = 10 GB/s.
    ops = pl.DataFrame(
        {
            "rank": [0, 0, 0],
            "resource": ["comm"] * 3,
            "start_ns": [0, 50, 100],
            "end_ns": [100, 150, 200],
            "wait_ns": [0, 0, 40],
            "bytes": [1000, 3000, 600],
        }
    )
    got = [(e["ts"], e["args"]["GB/s"]) for e in _counters(ops)]
    assert got == [(0.0, 10.0), (0.05, 40.0), (0.1, 30.0), (0.14, 40.0), (0.15, 10.0), (0.2, 0.0)]
