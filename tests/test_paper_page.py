"""docs/paper.md and scripts/reproduce_paper.py agree; the script's own metrics on hand-made cases (no replay)."""

from __future__ import annotations

import importlib.util
import os
import re
import sys

import polars as pl
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "paper.md")


@pytest.fixture(scope="module")
def rp():
    """scripts/reproduce_paper.py as a module (importing it runs nothing)."""
    spec = importlib.util.spec_from_file_location(
        "reproduce_paper", os.path.join(ROOT, "scripts", "reproduce_paper.py")
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["reproduce_paper"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_page_lists_the_scripts_experiments_in_order(rp):
    with open(PAGE, encoding="utf-8") as fh:
        text = fh.read()
    ids = [k for k, _ in rp.EXPERIMENTS]
    assert re.findall(r"<!-- experiment: ([\w-]+) -->", text) == ids
    assert list(rp.RUNNERS) == ids
    for k, title in rp.EXPERIMENTS:
        assert f"\n## {title}\n" in text, k
    # What the issue requires at least.
    assert {"table4", "fig12", "fig17", "fig18", "fig19"} <= set(ids)
    assert re.search(r"on commit `[0-9a-f]{7,}(\+dirty)?`, \d{4}-\d\d-\d\d \d\d:\d\d UTC", text)


def test_page_images_exist(rp):
    with open(PAGE, encoding="utf-8") as fh:
        text = fh.read()
    imgs = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text)
    assert len(imgs) >= 6
    for p in imgs:
        assert os.path.isfile(os.path.join(ROOT, "docs", p)), p


def test_capex_prices_give_the_papers_mixed_tco(rp):
    # 210K / 8 and 83K / 8 from the paper's homogeneous clusters give its mixed cluster's 146K (4 + 4 GPUs).
    mixed = 4 * rp.CAPEX_USD["H100"] + 4 * rp.CAPEX_USD["A100-40GB"]
    assert mixed == 146_500.0
    assert 8 * rp.CAPEX_USD["H100"] == 210_000.0 and 8 * rp.CAPEX_USD["A100-40GB"] == 83_000.0


def _run(rp, ops: pl.DataFrame, ranks: int):
    return rp.Run(
        summary={}, ranks=pl.DataFrame({"rank": list(range(ranks))}), ops=ops, nodes=0, gen_s=0, replay_s=0
    )


def test_phase_wait_and_exposed_pp_comm_by_hand(rp):
    # rank 0: compute [0, 10); a sync all-reduce posted at 5 that waits 10 (peers at 15) and runs to 18;
    # a P2P recv posted at 20, peer there at 22, ends at 30; compute again [25, 27).
    # rank 1: compute [0, 20); the same all-reduce posted at 15, no wait, ends at 18.
    ops = pl.DataFrame(
        {
            "rank": [0, 0, 0, 0, 1, 1],
            "name": ["c", "grad", "recv", "c2", "c", "grad"],
            "resource": ["compute", "comm", "comm", "compute", "compute", "comm"],
            "phase": ["fwd", "sync", "bwd", "bwd", "fwd", "sync"],
            "start_ns": [0, 5, 20, 25, 0, 15],
            "end_ns": [10, 18, 30, 27, 20, 18],
            "wait_ns": [0, 10, 2, 0, 0, 0],
            "p2p": [None, None, 7, None, None, None],
        }
    )
    run = _run(rp, ops, 2)
    # DP wait of rank 0: [5, 15) minus its compute [0, 10) = 5; rank 1 none.
    assert rp.phase_wait(run, pl.col("phase") == "sync").tolist() == [5, 0]
    # Exposed boundary comm of rank 0: [22, 30) minus compute [25, 27) = 6; rank 1 none.
    assert rp.exposed_pp_comm(run).tolist() == [6, 0]


def test_c15_scaled_keeps_the_global_batch(rp):
    from xsim.tracegen.spec import load_spec

    for n, mbs in ((128, 8), (1024, 1)):
        spec = rp.c15_scaled(n, "llama2-13b", 256)
        dep = load_spec(spec)
        assert len({r for dg in dep.device_groups for r in dg.ranks}) == n
        assert dep.micro_batches == mbs and (n // 4) * mbs == 256
        # 13B has 40 layers: the TP-3 stage takes 30, the 1-GPU stage 10 (C15's 3:1).
        assert {(dg.layer_start, dg.layer_end) for dg in dep.device_groups} == {(1, 30), (31, 40)}
