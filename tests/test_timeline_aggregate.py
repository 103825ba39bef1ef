"""Timelines that aggregate (issue 26 item 6): event names carry kind, layer and phase only; speedscope's own
format shares frames across ops and ranks and opens with one profile summing every rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from xsim.replay import simulate
from xsim.replay.export import write_timeline
from xsim.replay.export.speedscope import speedscope_doc
from xsim.replay.export.timeline import frame_name, timeline_events

from tests import browser
from tests.test_replay_support import FakeNet, coll, comp, write_set


@pytest.mark.parametrize(
    ("name", "frame"),
    [
        ("L14.mlp_up_gate.fwd.mb2", "L14.mlp_up_gate.fwd"),
        ("L3.attn_core.recompute.mb0", "L3.attn_core.recompute"),
        ("pp_fwd_mb3/xsim/step2/recv_from5/c1", "pp_fwd/xsim/recv"),
        ("pp_bwd_mb0/xsim/step7/send_to0/c0", "pp_bwd/xsim/send"),
        ("grad_sync[1-20]/ring2", "grad_sync[1-20]"),
        ("optimizer.opt", "optimizer.opt"),
        ("aten::addmm", "aten::addmm"),
        ("send2", "send2"),
    ],
)
def test_frame_names_drop_what_tells_instances_apart(name: str, frame: str) -> None:
    assert frame_name(name) == frame


def _two_microbatches(tmp_path: Path):
    """2 ranks, each: layer-1 forward of micro-batches 0 and 1 (5 and 7 us), then an AllReduce (1 us)."""
    per_rank = [
        [
            comp(1, 5, layer=1, phase="fwd", micro_batch=0),
            comp(2, 7, deps=[1], layer=1, phase="fwd", micro_batch=1),
            coll(3, 1024, deps=[2]),
        ]
        for _ in range(2)
    ]
    for nodes in per_rank:
        nodes[0].name, nodes[1].name = "L1.mlp.fwd.mb0", "L1.mlp.fwd.mb1"
    return simulate(write_set(tmp_path, per_rank), network=FakeNet(2))


def test_chrome_timeline_names_aggregate_and_args_keep_the_instance(tmp_path) -> None:
    doc = timeline_events(_two_microbatches(tmp_path))
    begins = [e for e in doc["traceEvents"] if e["ph"] == "B"]
    assert sorted({e["name"] for e in begins}) == ["L1.mlp.fwd", "coll3"]
    mlp = [e for e in begins if e["name"] == "L1.mlp.fwd" and e["pid"] == 0]
    assert [(e["args"]["op"], e["args"]["micro_batch"]) for e in mlp] == [
        ("L1.mlp.fwd.mb0", 0),
        ("L1.mlp.fwd.mb1", 1),
    ]


def test_speedscope_shares_frames_and_sums_ranks_by_hand(tmp_path) -> None:
    result = _two_microbatches(tmp_path)
    doc = speedscope_doc(result)
    names = [f["name"] for f in doc["shared"]["frames"]]
    # One frame per op kind (L1.mlp.fwd, coll3), per layer-less kind (mlp.fwd) and per resource root.
    assert sorted(names) == sorted(["L1.mlp.fwd", "compute", "mlp.fwd", "coll3", "comm"])
    first, *lanes = doc["profiles"]
    assert first["type"] == "sampled" and first["name"] == "all 2 ranks: op time summed (ns)"
    weights = {tuple(names[i] for i in s): w for s, w in zip(first["samples"], first["weights"], strict=True)}
    # By hand: 2 ranks x (5 + 7) us of layer-1 forward; the AllReduce's 1,000 ns (FakeNet) on each rank.
    assert weights == {("compute", "mlp.fwd", "L1.mlp.fwd"): 24_000, ("comm", "coll3"): 2_000}
    assert first["endValue"] == 26_000
    assert [p["name"] for p in lanes] == ["rank 0 compute", "rank 0 comm", "rank 1 compute", "rank 1 comm"]
    ev = lanes[0]["events"]
    # Rank 0's compute lane: two opens and closes of the one shared frame, abutting at 5,000 ns.
    f = names.index("L1.mlp.fwd")
    assert [(e["type"], e["frame"], e["at"]) for e in ev] == [
        ("O", f, 0),
        ("C", f, 5_000),
        ("O", f, 5_000),
        ("C", f, 12_000),
    ]
    assert all(p["unit"] == "nanoseconds" and p["endValue"] == 13_000 for p in lanes)


def test_timeline_suffix_picks_the_format(tmp_path) -> None:
    result = _two_microbatches(tmp_path)
    write_timeline(result, tmp_path / "t.speedscope.json")
    write_timeline(result, tmp_path / "t.json")
    assert json.loads((tmp_path / "t.speedscope.json").read_text())["$schema"].endswith(
        "file-format-schema.json"
    )
    assert "traceEvents" in json.loads((tmp_path / "t.json").read_text())


def test_speedscope_opens_the_export(tmp_path) -> None:
    why = browser.missing(need_speedscope=True)
    if why:
        pytest.skip(why)
    write_timeline(_two_microbatches(tmp_path), tmp_path / "t.speedscope.json")
    r = browser.render_speedscope(tmp_path / "t.speedscope.json", tmp_path / "shot.png", view="left-heavy")
    assert r.returncode == 0 and browser.console_errors(r.stderr) == []
    assert (tmp_path / "shot.png").read_bytes()[:4] == b"\x89PNG"


def test_readme_timeline_screenshot_shows_something() -> None:
    # Issue 26 item 6: the README's screenshot was an almost empty strip. Rendered by
    # scripts/render_screenshots.py (speedscope, Left Heavy of every rank): 28% of its pixels are coloured
    # frames (the rank-0 strip it replaced: 3%).
    from tests.conftest import REPO

    px = browser.png_pixels(REPO / "docs" / "img" / "timeline-speedscope.png")
    if px is None:
        pytest.skip("matplotlib not installed: cannot read the PNG")
    colored = (px.max(axis=2) - px.min(axis=2) > 0.1).mean()
    assert colored > 0.15, colored
