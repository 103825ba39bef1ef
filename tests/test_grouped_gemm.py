"""Grouped expert GEMM timing (tracegen/grouped_gemm.py): per-expert tiles and the per-tile K0 cost, by hand,
and against DeepGEMM's published grouped-GEMM rows (its calibration source)."""

from __future__ import annotations

import pytest
from xsim.tracegen.catalog import gpu
from xsim.tracegen.grouped_gemm import K0_FP8, grouped_gemm_seconds, tile_overhead_k
from xsim.tracegen.ops import Op, op_seconds

H100 = gpu("H100")
# H100 FP8 burst rate of the calibrated model: the MAMF plateau 1402.6 TFLOP/s (tracegen/gemm.py).
PER_SM = 1402.6e12 / 132


def test_k0_is_the_fit_through_deepgemm_ends() -> None:
    """P K / (K + K0) through DeepGEMM's M 4096 rows K 512 (590 TFLOPS) and K 16384 (1358) gives K0 718."""
    k0 = (1358 / 590 * 512 * 16384 - 16384 * 512) / (16384 - 1358 / 590 * 512)
    assert K0_FP8 == round(k0)
    assert tile_overhead_k("bf16") == K0_FP8 // 2


def test_one_wave_by_hand() -> None:
    """132 experts of 256 rows, K 2048, N 128 on H100: one 256x128 tile per expert, one wave of 132 SMs,
    each tile 2 * 256 * 128 * (2048 + 718) FLOPs of main loop at the per-SM plateau."""
    t = grouped_gemm_seconds((132, 132 * 256, 2048, 128), 0, H100, "fp8", 1, "burst")
    assert t == pytest.approx(2 * 256 * 128 * (2048 + 718) / PER_SM, rel=1e-12)
    # one row more per expert: a second M tile each (per-expert quantization): the 128x128 tiles win,
    # 3 of them per expert = 396 tiles = 3 waves of reuse 0.75 (64 / 85.33)
    t2 = grouped_gemm_seconds((132, 132 * 257, 2048, 128), 0, H100, "fp8", 1, "burst")
    assert t2 == pytest.approx(3 * 2 * 128 * 128 * 2766 / (PER_SM * 0.75), rel=1e-12)


@pytest.mark.parametrize(
    ("groups", "m", "n", "k", "tflops"),
    [
        (4, 8192, 4096, 7168, 1297),
        (4, 8192, 7168, 2048, 1099),
        (8, 4096, 4096, 7168, 1288),
        (8, 4096, 7168, 2048, 1093),
    ],
)
def test_deepgemm_grouped_rows(groups: int, m: int, n: int, k: int, tflops: float) -> None:
    """DeepGEMM README (Feb 2025), grouped contiguous layout on H800 (H100's SMs and FP8 rate): within 8%."""
    t = grouped_gemm_seconds((groups, groups * m, k, n), 0, H100, "fp8", 1, "burst")
    assert 2 * groups * m * n * k / t / 1e12 == pytest.approx(tflops, rel=0.08)


def test_op_seconds_routes_expert_gemms() -> None:
    """The calibrated model times moe_expert_* by the grouped model; backward (2 kernels) twice."""
    shape = (16, 65536, 768, 2048)
    fwd = Op("moe_expert_down", "fwd", 2 * 65536 * 768 * 2048, 0, shape, True, "fp8")
    bwd = Op("moe_expert_down", "bwd", 4 * 65536 * 768 * 2048, 0, shape, True, "fp8", 2)
    t = op_seconds(fwd, H100, "calibrated")
    assert t == grouped_gemm_seconds(shape, 0, H100, "fp8", 1, "sustained")
    assert op_seconds(bwd, H100, "calibrated") == pytest.approx(2 * t)
    # K 768 + 718: under half the rate of the K-independent model
    assert 2 * 65536 * 768 * 2048 / t < 0.55 * 1979e12 * 0.709
