"""The H100 BF16 GEMM model against published per-shape measurements (tracegen/data/gemm_shapes_h100.csv):
the BF16 per-tile cost K0 (tracegen.gemm.BF16_TILE_K0) by hand, and its fit to XLA's sm_90 K sweeps."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from xsim.tracegen import catalog
from xsim.tracegen.gemm import (
    BF16_TILE_K0,
    SHAPES_H100_FILE,
    LinearGemm,
    linear_compute_seconds,
    shape_points,
    tile_cost,
)

from tests.test_gemm_shapes_a100 import load_script  # scripts/gemm_shape_check.py as a module

ROOT = Path(__file__).resolve().parents[1]
H100 = catalog.gpu("H100")
# MAMF's H100 BF16 burst plateau, 792.1 TFLOP/s at M 6144, K 17920, N 2816 (gemm_calibration.csv), per SM.
BURST_PER_SM = 792.1e12 / 132
SUSTAINED_PER_SM = BURST_PER_SM * 708.5 / 841.9  # the GH100's MSMF / MAMF (tracegen.gemm.SUSTAINED_RATIOS)
# Per column of K a tile runs at the plateau x (17920 + 240) / 17920, so MAMF's shape keeps its rate.
SCALE = (17920 + 240) / 17920
TILE = 2 * 256 * 128  # FLOPs per column of K of one 256 x 128 tile


def points():
    """The H100 per-shape data set."""
    return shape_points(SHAPES_H100_FILE)


def test_data_set_is_the_tables_as_transcribed():
    pts = points()
    counts = Counter(p.series for p in pts)
    assert counts == {
        "xla_b1_n4096": 4,
        "xla_b2_n4096": 5,
        "xla_b4_n4096": 5,
        "xla_b1_n2048": 5,
        "xla_b2_n2048": 4,
        "xla_b4_n2048": 4,
        "f8exp_linear_bf16": 4,
        "f8exp_linear_bf16_b": 4,
        "f8exp_linear_fp16": 4,
    }
    xla = [p for p in pts if p.series.startswith("xla")]
    assert all("matmul_interpolator_data.h" in p.source and p.gpu == "sm_90" for p in xla)
    # XLA's entry b 4, m 4096, n 4096, k 1024: 725508891943538 FLOP/s, stored as 16,384 rows.
    (p,) = [p for p in xla if (p.series, p.k) == ("xla_b4_n4096", 1024)]
    assert (p.m, p.n, p.tflops) == (16384, 4096, 725.509)
    # float8_experimental pull 38, attn.w0: nn.Linear(1024, 8192) on X[16384, 1024], 5.00E-04 s:
    # 2 x 16384 x 1024 x 8192 / 5.00e-4 = 549.8 TFLOP/s.
    (w0,) = [p for p in pts if p.series == "f8exp_linear_bf16" and p.k == 1024]
    assert (w0.m, w0.n, w0.tflops) == (16384, 8192, 549.8)


def test_bf16_tile_cost_is_h100_only_and_fp16_shares_it():
    assert BF16_TILE_K0 == 240
    assert tile_cost(H100, "bf16") == tile_cost(H100, "fp16") == (240, SCALE)
    # GPUs without a recorded BF16 calibration K, and a gemm_eff override, keep the K-independent rate.
    assert tile_cost(catalog.gpu("A100-80GB"), "bf16") == (0, 1.0)
    assert tile_cost(catalog.gpu("H200"), "bf16") == (0, 1.0)
    assert tile_cost(catalog.with_overrides(H100, {"gemm_eff": 0.7}), "bf16") == (0, 1.0)


def test_mamf_calibration_shape_keeps_its_measured_rate():
    # 6144 x 17920 x 2816: 24 x 22 = 528 tiles of 256 x 128 = 4 full waves; time 4 x TILE x (17920 + 240)
    # / BURST_PER_SM / SCALE = 4 x TILE x 17920 / BURST_PER_SM, i.e. 792.1 TFLOP/s.
    t = linear_compute_seconds(LinearGemm(6144, 17920, 2816), H100, "bf16", "burst")
    assert t == pytest.approx(4 * TILE * 17920 / BURST_PER_SM, rel=1e-12)
    assert 2 * 6144 * 17920 * 2816 / t == pytest.approx(792.1e12, rel=1e-12)


@pytest.mark.parametrize(
    ("k", "micros", "tflops"),
    [(1024, 217.953, 630.59), (2048, 394.523, 696.74), (4096, 747.662, 735.30)],
)
def test_xla_16384_row_sweep_by_hand(k: int, micros: float, tflops: float):
    # XLA's 4 x 4096 x 4096 GEMMs as 16,384 x K x 4096: 64 x 32 = 2,048 tiles of 256 x 128 = 16 waves on 132
    # SMs (15.5 of work), each tile K + 240 columns at the burst plateau x SCALE:
    # K 1024: 16 x 65536 x 1264 / (792.1e12 / 132) / 1.013393 = 217.953 us = 630.59 TFLOP/s (measured 725.5);
    # K 2048: 394.523 us = 696.74 (764.6); K 4096: 747.662 us = 735.30 (793.1). Without K0 every K ran at
    # 768.10 TFLOP/s (0.945, 0.995, 1.033 of the measured time); with it 1.151, 1.097, 1.079.
    t = linear_compute_seconds(LinearGemm(16384, k, 4096), H100, "bf16", "burst")
    assert t == pytest.approx(16 * TILE * (k + 240) / BURST_PER_SM / SCALE, rel=1e-12)
    assert t * 1e6 == pytest.approx(micros, abs=1e-3)
    assert 2 * 16384 * k * 4096 / t / 1e12 == pytest.approx(tflops, abs=0.01)


def test_backward_is_dgrad_and_wgrad_on_their_own_k():
    # A BF16 linear of 4096 tokens, K 2048, N 6144, backward (two kernels), sustained: dgrad [4096 x 6144] x
    # [6144 x 2048] = 16 x 16 tiles -> 2 waves of 6144 + 240 columns; wgrad [2048 x 4096] x [4096 x 6144]
    # (over the tokens) = 8 x 48 tiles -> 3 waves of 4096 + 240: (2 x 6384 + 3 x 4336) x TILE /
    # SUSTAINED_PER_SM / SCALE = 330.09 us (318.94 us as twice the forward shape before the BF16 term: 6
    # waves of 2048 each).
    t = linear_compute_seconds(LinearGemm(4096, 2048, 6144, "bwd", 2), H100, "bf16")
    assert t == pytest.approx((2 * 6384 + 3 * 4336) * TILE / SUSTAINED_PER_SM / SCALE, rel=1e-12)
    assert t * 1e6 == pytest.approx(330.09, abs=0.01)


def test_k0_is_the_minimum_of_the_xla_spread():
    mod = load_script()
    pts = points()
    # Mean |log(xsim / measured)| about each XLA sweep's median: 0.1703 without the term, 0.0428 at 240, the
    # smallest on the grid of 8 columns from 200 to 280 (over K >= 1024: 0.0500 -> 0.0125).
    grid = {k0: mod.xla_spread(pts, k0) for k0 in range(200, 281, 8)}
    assert min(grid, key=grid.get) == BF16_TILE_K0
    assert mod.xla_spread(pts, 0) == pytest.approx(0.1703, abs=5e-5)
    assert grid[240] == pytest.approx(0.0428, abs=5e-5)
    assert mod.xla_spread(pts, 0, 1024) == pytest.approx(0.0500, abs=5e-5)
    assert mod.xla_spread(pts, 240, 1024) == pytest.approx(0.0125, abs=5e-5)


def test_class_table_is_the_one_in_the_docs():
    mod = load_script()
    text = (ROOT / "docs" / "compute.md").read_text()
    assert mod.table(points(), "H100") in text
