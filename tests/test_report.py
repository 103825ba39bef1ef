"""`xsim report`: exclusive per-rank time shares and collective exposure (hand-computed), the HTML page
(self-contained, loads in headless Chromium without console errors)."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest
from xsim.replay import simulate
from xsim.replay.export.breakdown import collective_exposure, op_time_by, rank_breakdown

from tests import browser
from tests.test_replay_support import FakeNet, coll, comp, two_rank_pipeline, write_set
from xsim.cli import main


def _ops() -> pl.DataFrame:
    # rank, resource, start, end, wait, collective, layer, phase
    rows = [
        (0, "compute", 0, 10, 0, None, 1, "fwd"),
        (0, "comm", 5, 20, 3, 1, 1, "bwd"),  # active [8, 20)
        (0, "comm", 20, 25, 5, None, None, "fwd"),  # a recv that waits [20, 25): pipeline bubble
        (0, "compute", 25, 30, 0, None, 2, "fwd"),
        (0, "cpu", 30, 32, 0, None, None, "opt"),
        (1, "comm", 2, 20, 15, 1, 1, "bwd"),  # waits [2, 17) for rank 0, active [17, 20)
        (1, "compute", 0, 2, 0, None, 1, "fwd"),
        (1, "compute", 22, 24, 0, None, 2, "fwd"),
    ]
    df = pl.DataFrame(
        rows,
        schema={
            "rank": pl.Int32,
            "resource": pl.String,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
            "wait_ns": pl.Int64,
            "collective": pl.Int64,
            "layer": pl.Int64,
            "phase": pl.String,
        },
        orient="row",
    )
    return df.with_columns(duration_ns=pl.col("end_ns") - pl.col("start_ns"))


def test_rank_breakdown_by_hand() -> None:
    br = rank_breakdown(_ops(), 2)
    cols = [
        "compute_share_ns",
        "cpu_share_ns",
        "exposed_comm_share_ns",
        "wait_share_ns",
        "bubble_share_ns",
        "idle_share_ns",
        "finish_ns",
    ]
    # rank 0: compute [0,10)+[25,30)=15, cpu 2, comm [10,20)=10 (hidden under compute until 10), the
    # collective's wait [5,8) is under compute: 0, the recv's wait [20,25) inside the compute span: bubble 5.
    assert br.row(0, named=True) | {} == dict(zip(["rank", *cols], [0, 15, 2, 10, 0, 5, 0, 32], strict=True))
    # rank 1: compute 2+2, comm [17,20)=3, straggler wait [2,17)=15, gap [20,22) inside the span: bubble 2.
    assert br.row(1, named=True) == dict(zip(["rank", *cols], [1, 4, 0, 3, 15, 2, 0, 24], strict=True))
    assert (br.select(cols[:-1]).sum_horizontal() == br["finish_ns"]).all()


def test_collective_exposure_and_layers_by_hand() -> None:
    exp = collective_exposure(_ops())
    assert exp.rows() == [(1, 10 + 3)]
    by_layer = op_time_by(_ops(), "layer")
    # Communication counts its active time: rank 0's [8,20) = 12, rank 1's [17,20) = 3.
    assert by_layer.select("layer", "compute_ns", "comm_ns", "wait_sum_ns").rows() == [
        (1, 12, 15, 18),
        (2, 7, 0, 0),
    ]


def _result_dir(tmp_path: Path) -> Path:
    res = simulate(two_rank_pipeline(tmp_path), network=FakeNet(2))
    out = tmp_path / "res"
    res.save(out)
    return out


def test_report_is_self_contained(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    res = _result_dir(tmp_path)
    page = tmp_path / "report.html"
    assert main(["report", str(res), "--out", str(page)]) == 0
    assert main(["report", str(res), "--out", str(tmp_path / "again.html")]) == 0
    assert page.read_bytes() == (tmp_path / "again.html").read_bytes()  # deterministic
    text = page.read_text()
    for section in (
        "Summary",
        "Per-rank time",
        "Per layer",
        "Per phase",
        "Top collectives",
        "Timeline of ranks",
    ):
        assert f"<h2>{section}" in text
    # Nothing to fetch at view time: no scripts, stylesheets, images or frames by URL.
    for needle in ("<script", "<link", "<img", "<iframe", "src=", 'href="http', "@import"):
        assert needle not in text
    assert re.findall(r"url\((?!#)", text) == []  # only in-page references (SVG clip paths)
    # A 2-rank run with a P2P transfer is pipelined: the bubble is named so.
    assert (
        "<th>pipeline bubble, worst rank</th>" in text and text.count("<svg") == 4
    )  # ranks, layers, phases, Gantt


def test_report_without_pipeline_says_no_pipeline(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    res = simulate(
        write_set(tmp_path, [[comp(1, 5), coll(2, 1024, deps=[1])], [comp(1, 9), coll(2, 1024, deps=[1])]]),
        network=FakeNet(2),
    )
    res.save(tmp_path / "res")
    assert main(["report", str(tmp_path / "res"), "--out", str(tmp_path / "r.html")]) == 0
    text = (tmp_path / "r.html").read_text()
    assert "<th>pipeline bubble, worst rank</th>" not in text
    assert "<th>idle gaps in the compute span (no pipeline), worst rank</th>" in text


def test_report_bad_folder_is_one_line(tmp_path, capsys) -> None:
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no ops.parquet" in err[0]


@pytest.mark.skipif(browser.missing() is not None, reason=str(browser.missing()))
def test_report_loads_in_chromium_without_console_errors(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    page = tmp_path / "report.html"
    assert main(["report", str(_result_dir(tmp_path)), "--out", str(page)]) == 0
    png = tmp_path / "report.png"
    r = browser.run_chromium(page.as_uri(), png, size="1200,1600")
    assert r.returncode == 0 and browser.console_errors(r.stderr) == []
    px = browser.png_pixels(png)
    # Something was drawn: the stacked bars' compute blue (#4c72b0) is on the page.
    blue = (
        (abs(px[:, :, 0] - 0x4C / 255) < 0.02)
        & (abs(px[:, :, 1] - 0x72 / 255) < 0.02)
        & (abs(px[:, :, 2] - 0xB0 / 255) < 0.02)
    )
    assert blue.sum() > 500


def _cells(text: str) -> dict[str, str]:
    """The summary table's rows: header cell -> value cell."""
    return dict(re.findall(r"<tr><th>([^<]*)</th><td>([^<]*)</td></tr>", text))


def test_report_numbers_are_the_summary_and_ranks_tables(tmp_path, capsys) -> None:
    # Issue 26 item 2: the report's worst-rank bubble and its per-rank columns are the replay's own.
    pytest.importorskip("matplotlib")
    from xsim.replay.export.report import _fmt_ns

    ts = two_rank_pipeline(tmp_path)
    out = tmp_path / "res"
    assert (
        main(["replay", ts.prefix, "--topology", "switch:2:50GBps:1us", "--out", str(out), "--no-progress"])
        == 0
    )
    printed = capsys.readouterr().out
    assert main(["report", str(out), "--out", str(tmp_path / "r.html")]) == 0
    text = (tmp_path / "r.html").read_text()
    summary = __import__("json").loads((out / "summary.json").read_text())
    cells = _cells(text)
    assert cells["pipeline bubble, worst rank"] == _fmt_ns(summary["bubble_ns_max"])
    assert cells["pipeline bubble (summed over 2 ranks)"] == _fmt_ns(summary["bubble_ns_total"])
    assert cells["straggler waiting, worst rank"] == _fmt_ns(summary["wait_ns_max"])
    # ... which is what `xsim replay` printed.
    from xsim.cmd_replay import fmt_ns as cli_ns

    bubble_line = next(ln for ln in printed.splitlines() if ln.startswith("pipeline bubble"))
    assert bubble_line.endswith(f"max per rank {cli_ns(summary['bubble_ns_max'])}")
    ranks = pl.read_csv(out / "ranks.csv")
    for col in ("wait_ns", "bubble_ns", "compute_ns"):
        # The ranks table is shown under its own names, with its own values (formatted).
        assert f"<th>{col}</th>" in text
        for v in ranks[col]:
            assert f">{_fmt_ns(v)}<" in text
    # The exclusive shares carry their own names; no breakdown column reuses a ranks table name.
    assert "<th>wait_share_ns</th>" in text and "<th>bubble_share_ns</th>" in text
    assert summary["bubble_ns_max"] == ranks["bubble_ns"].max()
    # The Gantt says what its colours mean (issue 26 item 9).
    assert "GPU compute" in text and "communication (active)" in text and "waiting for peers" in text
    # The title names the trace set and the network, not the output folder.
    assert "<title>xsim report: t, 2 ranks, analytical network: " in text
