"""Grouped expert GEMM timing (tracegen/grouped_gemm.py): per-expert tiles and the per-tile K0 cost, by hand,
and against DeepGEMM's published grouped-GEMM rows (its calibration source)."""

from __future__ import annotations

import pytest
from xsim.tracegen.catalog import gpu
from xsim.tracegen.gemm import tile_cost
from xsim.tracegen.grouped_gemm import K0_FP8, grouped_gemm_seconds
from xsim.tracegen.ops import Op, op_seconds

H100 = gpu("H100")
# H100 FP8 burst rate of the calibrated model: the MAMF plateau 1402.6 TFLOP/s (tracegen/gemm.py).
PER_SM = 1402.6e12 / 132
# The one per-tile rule (tracegen.gemm.tile_cost): per column of K the tile runs at the plateau x (14336 +
# 718) / 14336, so MAMF's calibration shape (K 14,336) keeps its measured rate.
SCALE = (14336 + 718) / 14336


def test_k0_is_the_fit_through_deepgemm_ends() -> None:
    """P K / (K + K0) through DeepGEMM's M 4096 rows K 512 (590 TFLOPS) and K 16384 (1358) gives K0 718."""
    k0 = (1358 / 590 * 512 * 16384 - 16384 * 512) / (16384 - 1358 / 590 * 512)
    assert K0_FP8 == round(k0)
    # one rule for dense and grouped GEMMs: K0 only where the plateau's calibration K is recorded (H100 FP8
    # and BF16, FP16 as BF16)
    assert tile_cost(H100, "fp8") == (K0_FP8, SCALE)
    assert tile_cost(H100, "bf16") == tile_cost(H100, "fp16") == (240, (17920 + 240) / 17920)
    assert tile_cost(gpu("H200"), "fp8") == tile_cost(gpu("H200"), "bf16") == (0, 1.0)


def test_one_wave_by_hand() -> None:
    """132 experts of 256 rows, K 2048, N 128 on H100: one 256x128 tile per expert, one wave of 132 SMs,
    each tile 2 * 256 * 128 * (2048 + 718) FLOPs of main loop at the per-SM plateau x SCALE."""
    t = grouped_gemm_seconds((132, 132 * 256, 2048, 128), 0, H100, "fp8", "fwd", "burst")
    assert t == pytest.approx(2 * 256 * 128 * (2048 + 718) / PER_SM / SCALE, rel=1e-12)
    # one row more per expert: a second M tile each (per-expert quantization): the 128x128 tiles win,
    # 3 of them per expert = 396 tiles = 3 waves of reuse 0.75 (64 / 85.33)
    t2 = grouped_gemm_seconds((132, 132 * 257, 2048, 128), 0, H100, "fp8", "fwd", "burst")
    assert t2 == pytest.approx(3 * 2 * 128 * 128 * 2766 / (PER_SM * 0.75) / SCALE, rel=1e-12)


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
    """DeepGEMM README (Feb 2025), grouped contiguous layout on H800 (H100's SMs and FP8 rate): within 3%
    (1298, 1077, 1298, 1077 TFLOP/s; within 8% before the rescale of the one per-tile rule)."""
    t = grouped_gemm_seconds((groups, groups * m, k, n), 0, H100, "fp8", "fwd", "burst")
    assert 2 * groups * m * n * k / t / 1e12 == pytest.approx(tflops, rel=0.03)


def test_op_seconds_routes_expert_gemms() -> None:
    """The calibrated model times moe_expert_* by the grouped model; backward as GroupedLinear's dgrad and
    wgrad, each paying K0 on its own reduction dimension, by hand: 16 experts of 4,096 rows, K 768, N 2048.
    Forward [4096 x 768] x [768 x 2048]: 16 x 16 tiles of 256 x 128 per expert, 4,096 tiles = 32 waves of
    768 + 718 columns. dgrad [4096 x 2048] x [2048 x 768]: 16 x 6 tiles per expert, 1,536 = 12 waves of
    2048 + 718; wgrad [768 x 4096] x [4096 x 2048] (over the expert's 4,096 rows): 3 x 16 per expert, 768 =
    6 waves of 4096 + 718."""
    shape = (16, 65536, 768, 2048)
    fwd = Op("moe_expert_down", "fwd", 2 * 65536 * 768 * 2048, 0, shape, True, "fp8")
    bwd = Op("moe_expert_down", "bwd", 4 * 65536 * 768 * 2048, 0, shape, True, "fp8", 2)
    per_sm = 1979e12 * (1402.6 / 1979) * (1288.7 / 1491.9) / 132  # sustained FP8 plateau per SM
    tile = 2 * 256 * 128 / per_sm / SCALE  # seconds per column of K of one 256 x 128 tile
    t = op_seconds(fwd, H100, "calibrated")
    assert t == grouped_gemm_seconds(shape, 0, H100, "fp8", "fwd", "sustained")
    assert t == pytest.approx(32 * 1486 * tile, rel=1e-12)
    assert op_seconds(bwd, H100, "calibrated") == pytest.approx((12 * 2766 + 6 * 4814) * tile, rel=1e-12)
    # K 768 + 718: under 55% of the K-independent model's rate
    assert 2 * 65536 * 768 * 2048 / t < 0.55 * 1979e12 * 0.709
    # BF16: the BF16 per-tile cost (K0 240 against MAMF's K 17,920), dgrad and wgrad on their own K as
    # above: (12 x 2288 + 6 x 4336) columns x 2 x 256 x 128 / per-SM rate / 1.01339 = 684.77 us (637.88 us
    # as twice the forward shape before the BF16 term).
    bf = Op("moe_expert_down", "bwd", 4 * 65536 * 768 * 2048, 0, shape, True, "bf16", 2)
    per_sm_bf = 989.4e12 * 792.1 / 989.4 * (708.5 / 841.9) / 132
    bf_scale = (17920 + 240) / 17920
    assert (
        op_seconds(bf, H100, "calibrated")
        == pytest.approx((12 * 2288 + 6 * 4336) * 2 * 256 * 128 / per_sm_bf / bf_scale, rel=1e-12)
        == pytest.approx(684.77e-6, rel=1e-5)
    )
