"""The A100 GEMM model against Anthony et al. 2024's per-shape measurements (tracegen/data/gemm_shapes_a100.csv)."""

from __future__ import annotations

import importlib.util
import math
from collections import Counter
from pathlib import Path
from statistics import median

import pytest
from xsim.tracegen import catalog
from xsim.tracegen.gemm import gemm_compute, shape_points

ROOT = Path(__file__).resolve().parents[1]
A100, H100 = catalog.gpu("A100-80GB"), catalog.gpu("H100")
BURST = 267.9 / 312  # MAMF plateau of the A100 (gemm_calibration.csv)


def measured(series: str, m: int, k: int, n: int) -> float:
    """The data set's TFLOP/s for one shape of one series."""
    (p,) = [p for p in shape_points() if (p.series, p.m, p.k, p.n) == (series, m, k, n)]
    return p.tflops


def load_script():
    """scripts/gemm_shape_check.py as a module."""
    spec = importlib.util.spec_from_file_location(
        "gemm_shape_check", ROOT / "scripts" / "gemm_shape_check.py"
    )
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def test_data_set_is_the_cookbook_files_as_transcribed():
    pts = shape_points()
    # m_sweep 9 shapes; ksweep_high N 1536..6144 step 64 (73); ksweep_low N 64..510 step 2, multiples of 16
    # kept (28); h_sweep: 192 hidden sizes 8192..32640 step 128, four linears each.
    counts = Counter(p.series for p in pts)
    assert counts == {
        "square": 9,
        "nsweep_m2304": 73,
        "nsweep_m27648": 28,
        "qkv": 192,
        "proj": 192,
        "fc1": 192,
        "fc2": 192,
    }
    assert all(
        "EleutherAI/cookbook@27dff48" in p.source and p.gpu == "A100" and p.dtype == "fp16" for p in pts
    )
    # Megatron's forward linears at TP 4, 2048 x 4 tokens: qkv [8192, h] x [h, 3h/4], proj [h/4] -> h.
    assert measured("qkv", 8192, 8192, 6144) == 228.497
    assert measured("proj", 8192, 2048, 8192) == 216.633


def test_a_128x128_tile_runs_at_the_plateau_on_the_a100():
    # M 2304, K 4096, N 2304: 18 x 18 = 324 tiles of 128x128 = 3 full waves on 108 SMs; 256x128 needs
    # 9 x 18 = 162 tiles = 2 waves for 1.5 of work. The data: 229.0 TFLOP/s here, 235.0 at N 3072 (full
    # waves either way), 0.974 of it, where a 128x128 tile at 0.75 of the plateau would give 0.75.
    assert measured("nsweep_m2304", 2304, 4096, 2304) / measured("nsweep_m2304", 2304, 4096, 3072) == (
        pytest.approx(0.9745, abs=1e-4)
    )
    t = gemm_compute(2304, 4096, 2304, A100, "fp16", rates="burst")
    assert (t.tile, t.waves) == ((128, 128), 3)
    assert t.efficiency == pytest.approx(BURST)
    # 128x64 keeps a reuse of (128*64/192) / (128*128/256) = 2/3: M 128, N 64 x 108 = 6912, one wave.
    assert gemm_compute(128, 4096, 6912, A100, "fp16", rates="burst").efficiency == pytest.approx(
        BURST * 2 / 3
    )
    # Other GPUs keep 256x128 as the smallest full-rate tile: on the H100 the same shape takes 256x128 tiles
    # (162 tiles, 2 waves of 132) against 3 waves of 128x128 at 0.75 (a tie, the first tile listed wins).
    assert gemm_compute(2304, 4096, 2304, H100, rates="burst").tile == (256, 128)


def test_large_forward_linears_are_timed_within_six_percent_of_the_measurement():
    # fc1 at h 8192 (TP 4): [8192, 8192] x [8192, 8192]: 32 x 64 = 2,048 tiles of 256x128 = 18.96 of 19 waves.
    t = gemm_compute(8192, 8192, 8192, A100, "fp16", rates="burst")
    assert (t.tile, t.waves) == ((256, 128), 19)
    assert t.efficiency * 312 == pytest.approx(267.9 * 2048 / 108 / 19)  # 267.4 TFLOP/s
    assert measured("fc1", 8192, 8192, 8192) / (t.efficiency * 312) == pytest.approx(0.950, abs=1e-3)


def test_docs_table_is_the_scripts():
    mod = load_script()
    text = (ROOT / "docs" / "compute.md").read_text(encoding="utf-8")
    assert mod.table(shape_points()) in text


def test_every_point_is_timed_no_slower_than_measured_where_the_shape_model_applies():
    # The measurements include each call's launch and synchronisation (and the h_sweep takes the slowest of
    # 200 calls), so the model's kernel time stays at or below them for the N sweep at M 2304.
    mod = load_script()
    ratios = [mod.ratio(p, "burst") for p in shape_points() if p.series == "nsweep_m2304"]
    assert max(ratios) < 1.0
    assert min(ratios) > 0.75
    assert not any(math.isnan(r) for r in ratios)


def test_forward_linears_with_k_up_to_4096_run_at_the_measured_step():
    from xsim.tracegen.gemm import LinearGemm, linear_seconds, short_k_factor

    # The step of the proj series (F.linear X.W^T, m 8192, N = 4K): against the model without the rule the 65
    # shapes with K <= 4096 read at a median 0.830 of the model's time, the 127 with K > 4096 at 0.917, so a
    # forward GEMM with K <= 4096 runs at 0.830 / 0.917 = 0.9051 of the rate (gemm.SHORT_K_FORWARD).
    mod = load_script()
    proj = [p for p in shape_points() if p.series == "proj"]
    without = [(p.k, mod.ratio(p, "burst", short_k=False)) for p in proj]
    assert median(r for k, r in without if k <= 4096) == pytest.approx(0.830, abs=5e-4)
    assert median(r for k, r in without if k > 4096) == pytest.approx(0.917, abs=5e-4)
    assert short_k_factor(A100, "fp16", 4096, "fwd") == pytest.approx(0.830 / 0.917)  # 0.9051
    # The step lies between K 4096 (235.9 TFLOP/s) and 4128 (244.3): above it, and for the backward GEMMs
    # (dgrad NN, wgrad over the tokens), other GPUs, FP8 and a gemm_eff override, the rate is the model's.
    assert measured("proj", 8192, 4096, 16384) == 235.892 and measured("proj", 8192, 4128, 16512) == 244.290
    assert short_k_factor(A100, "fp16", 4128, "fwd") == 1.0
    assert short_k_factor(A100, "bf16", 2048, "bwd") == 1.0
    assert short_k_factor(H100, "bf16", 2048, "fwd") == 1.0
    assert short_k_factor(catalog.with_overrides(A100, {"gemm_eff": 0.7}), "bf16", 2048, "fwd") == 1.0
    # With the rule both halves of the series sit at one level (0.917).
    with_rule = [(p.k, mod.ratio(p, "burst")) for p in proj]
    assert median(r for k, r in with_rule if k <= 4096) == pytest.approx(0.917, abs=5e-4)
    assert median(r for k, r in with_rule if k > 4096) == pytest.approx(0.917, abs=5e-4)
    # By hand, proj at h 8192: [8192, 2048] x [2048, 8192] in 256x128 tiles: 32 x 64 = 2,048 tiles = 19 waves
    # on 108 SMs; one tile 2 x 256 x 128 x 2048 = 134,217,728 FLOPs at 267.9e12 / 108 FLOP/s per SM (burst):
    # 19 x 134,217,728 / 2.48056e12 = 1.02805 ms, / 0.90513 = 1.13581 ms (was 1.02805). Measured:
    # 2 x 8192 x 2048 x 8192 / 216.633e12 = 1.26886 ms, so xsim / measured = 0.8951 (was 0.8102).
    nbytes = 2 * (8192 * 2048 + 2048 * 8192 + 8192 * 8192)  # 0.117 ms at 1,727 GB/s: not the bound
    t = linear_seconds(LinearGemm(8192, 2048, 8192), nbytes, A100, "fp16", "burst")
    assert t == pytest.approx(19 * 134_217_728 / (267.9e12 / 108) / (0.830 / 0.917))
    assert t == pytest.approx(1.13581e-3, rel=1e-5)
    assert t / (2 * 8192 * 2048 * 8192 / 216.633e12) == pytest.approx(0.8951, abs=1e-4)
    # The backward of the same linear (two GEMMs timed as the forward shape under K0 = 0) keeps the model's rate.
    bwd = linear_seconds(LinearGemm(8192, 2048, 8192, "bwd", 2), nbytes, A100, "fp16", "burst")
    assert bwd == pytest.approx(2 * 19 * 134_217_728 / (267.9e12 / 108))
