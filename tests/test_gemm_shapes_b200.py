"""Blackwell GEMMs against published per-shape measurements (tracegen/data/gemm_shapes_b200.csv, XLA's sm_100
table): the data set as transcribed, the K-independent B200 rate by hand, and the K0 the sweeps would fit."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from xsim.tracegen import catalog
from xsim.tracegen.gemm import SHAPES_B200_FILE, LinearGemm, linear_compute_seconds, shape_points, tile_cost

from tests.test_gemm_shapes_a100 import load_script  # scripts/gemm_shape_check.py as a module

ROOT = Path(__file__).resolve().parents[1]
B200 = catalog.gpu("B200")
# MAMF's B200 BF16 burst point, 1745.0 TFLOP/s (ml-engineering 744d01e, 1792x16128x3072), per SM of 148.
BURST_PER_SM = 1745.0e12 / 148
TILE = 2 * 256 * 128  # FLOPs per column of K of one 256 x 128 tile


def points():
    """The B200 per-shape data set."""
    return shape_points(SHAPES_B200_FILE)


def test_data_set_is_the_table_as_transcribed():
    pts = points()
    counts = Counter(p.series for p in pts)
    assert len(counts) == 12 and set(counts.values()) == {5}
    assert Counter(p.dtype for p in pts) == {"bf16": 30, "fp8": 30}
    assert all("matmul_interpolator_data.h" in p.source and p.gpu == "sm_100" for p in pts)
    # XLA's sm_100 entry b 4, m 4096, n 4096, k 4096: bf16 1670467342710337 FLOP/s, f8e4m3fn x f8e4m3fn
    # 3279676742061148, stored as 16,384 rows.
    (bf,) = [p for p in pts if (p.series, p.k) == ("xla_b4_n4096", 4096)]
    (f8,) = [p for p in pts if (p.series, p.k) == ("xla_fp8_b4_n4096", 4096)]
    assert (bf.m, bf.n, bf.tflops, f8.tflops) == (16384, 4096, 1670.467, 3279.677)


def test_blackwell_gemms_have_no_tile_cost():
    # MAMF's best B200 shapes have K 3072, so the per-tile rule is not applied on Blackwell (tracegen.gemm).
    assert tile_cost(B200, "bf16") == tile_cost(B200, "fp8") == (0, 1.0)
    assert tile_cost(catalog.gpu("GB200"), "bf16") == (0, 1.0)


def test_xla_16384_row_gemm_by_hand():
    # 16384 x 4096 x 4096 BF16 on the B200, burst: 64 x 32 = 2,048 tiles of 256 x 128 = 14 waves on 148 SMs
    # (13.84 of work): 14 x TILE x 4096 / BURST_PER_SM = 318.74 us (1724.8 TFLOP/s); XLA's sm_100 table
    # measures 2 x 16384 x 4096^2 / 1670.467e12 = 329.10 us, so xsim / measured = 0.9685.
    t = linear_compute_seconds(LinearGemm(16384, 4096, 4096), B200, "bf16", "burst")
    assert t == pytest.approx(14 * TILE * 4096 / BURST_PER_SM, rel=1e-12)
    assert t * 1e6 == pytest.approx(318.74, abs=0.01)
    assert t / (2 * 16384 * 4096**2 / 1670.467e12) == pytest.approx(0.9685, abs=1e-4)


def test_k0_the_sm_100_sweeps_would_fit():
    # With MAMF's K 3072 as the calibration K (the scan's SCAN_CALIBRATION_K), the mean |log(xsim / measured)|
    # about each BF16 sweep's median: 0.2395 without a term, 0.05346 and flat for K0 400 to 456 (a median's
    # plateau), 0.05349 at 392 and 0.05358 at 480 (K >= 1024: 0.0898 -> 0.0146 at 400). Not applied:
    # docs/compute.md, "Blackwell (round b200cal)".
    mod = load_script()
    pts = [p for p in points() if p.dtype == "bf16"]
    grid = {k0: mod.xla_spread(pts, k0, gpu="B200") for k0 in range(392, 481, 8)}
    assert all(grid[k0] == pytest.approx(grid[400], abs=1e-12) for k0 in range(400, 457, 8))
    assert grid[400] == pytest.approx(0.05346, abs=5e-6)
    assert grid[392] - grid[400] > 2e-5 and grid[480] - grid[400] > 1e-4
    # 0.2317 before round mxfp8 gave the B200 its measured stream rate (6,720.9 of 8,000 GB/s, not 0.80):
    # the shortest-K GEMMs' memory roof moved
    assert mod.xla_spread(pts, 0, gpu="B200") == pytest.approx(0.2395, abs=5e-5)
    assert mod.xla_spread(pts, 0, 1024, "B200") == pytest.approx(0.0898, abs=5e-5)
    assert mod.xla_spread(pts, 400, 1024, "B200") == pytest.approx(0.0146, abs=5e-5)
    # The scan leaves the model as it was.
    assert tile_cost(B200, "bf16") == (0, 1.0)


def test_class_table_is_the_one_in_the_docs():
    mod = load_script()
    text = (ROOT / "docs" / "compute.md").read_text()
    # Indented there as part of a list item.
    assert "\n".join("  " + line for line in mod.table(points(), "B200").splitlines()) in text
