"""FlashAttention-2's last-wave tail on the A100 at few heads per rank (tracegen/attention.py
`fa2_grid_factor`, docs/compute.md "Attention's grid at few heads per rank"): hand-computed schedules."""

from __future__ import annotations

from dataclasses import replace

import pytest
from xsim.tracegen import catalog
from xsim.tracegen.attention import (
    _fa2_cta_tiles,
    _tail_ratio,
    fa2_grid_factor,
    flash_compute_seconds,
)
from xsim.tracegen.ops import Op, op_seconds

A100 = catalog.gpu("A100-80GB")


def test_cta_tiles_follow_the_fa2_launch():
    # s = 512, forward: 128-row query blocks sweep 64-column key blocks up to the diagonal: 2, 4, 6, 8;
    # without the mask every block sweeps all 8. Backward: 128-column key blocks sweep 64-row query blocks
    # from the diagonal down: 8, 6, 4, 2.
    assert _fa2_cta_tiles(512, "fwd", True) == [2, 4, 6, 8]
    assert _fa2_cta_tiles(512, "fwd", False) == [8, 8, 8, 8]
    assert _fa2_cta_tiles(512, "bwd", True) == [8, 6, 4, 2]


def test_tail_ratio_by_hand():
    # One grid of backward CTAs [8, 6, 4, 2] on 3 slots, started in block order: 8, 6 and 4 start at 0; the
    # 4 frees its slot at 4 and the 2 ends at 6; the makespan is 8 against 20 / 3 balanced: 1.2.
    assert _tail_ratio(1, 512, "bwd", True, 3) == pytest.approx(8 / (20 / 3))
    # Forward [2, 4, 6, 8] on 3 slots: 2, 4, 6 start at 0; the 2 frees at 2 and the 8 ends at 10: 10 / (20 / 3).
    assert _tail_ratio(1, 512, "fwd", True, 3) == pytest.approx(10 / (20 / 3))
    # Two slots: forward 2 | 4, then 6 on the first (2 -> 8), 8 on the second (4 -> 12): 12 / 10.
    assert _tail_ratio(1, 512, "fwd", True, 2) == pytest.approx(1.2)
    # Equal CTAs filling whole waves have no tail.
    assert _tail_ratio(3, 512, "fwd", False, 4) == pytest.approx(1.0)


def test_factor_is_one_at_the_benchmarks_grid_and_grows_as_heads_per_rank_fall():
    # s 8192, head dimension 128: the FlashAttention-2 benchmark ran 16384 / 8192 = 2 sequences of 16 heads,
    # 32 (sequence, head) grids, which Llama 3 8B's 32 heads at TP 1 and micro-batch 1 match exactly.
    for phase in ("fwd", "bwd"):
        assert fa2_grid_factor((1, 32, 8, 8192, 128), phase, A100, "fa2") == 1.0
    fwd = [fa2_grid_factor((1, h, 1, 8192, 128), "fwd", A100, "cudnn") for h in (16, 8, 4)]
    bwd = [fa2_grid_factor((1, h, 1, 8192, 128), "bwd", A100, "cudnn") for h in (16, 8, 4)]
    assert fwd == sorted(fwd) and bwd == sorted(bwd) and fwd[0] > 1 and bwd[0] > 1
    # Defined as the ratio of the two schedules: 4 heads on 108 SMs x 1 backward CTA against 32 grids.
    want = _tail_ratio(4, 8192, "bwd", True, 108) / _tail_ratio(32, 8192, "bwd", True, 108)
    assert bwd[-1] == pytest.approx(want)
    # The forward has 2 CTAs per SM: 216 slots.
    want = _tail_ratio(8, 8192, "fwd", True, 216) / _tail_ratio(32, 8192, "fwd", True, 216)
    assert fwd[1] == pytest.approx(want)


def test_factor_only_where_the_fa2_launch_was_read():
    shape = (1, 4, 1, 8192, 128)
    assert fa2_grid_factor(shape, "bwd", catalog.gpu("H100"), "fa2") == 1.0  # another GPU
    assert fa2_grid_factor(shape, "bwd", A100, "triton") == 1.0  # another kernel
    assert fa2_grid_factor((1, 4, 1, 8192, 64), "bwd", A100, "fa2") == 1.0  # another head dimension
    # The A100 40GB is timed as the 80GB (same SMs): the same factor. Fewer SMs (compute under communication,
    # tracegen.contention) are fewer slots: another schedule.
    forty = fa2_grid_factor(shape, "bwd", catalog.gpu("A100-40GB"), "fa2")
    assert forty == fa2_grid_factor(shape, "bwd", A100, "fa2")
    assert fa2_grid_factor(shape, "bwd", replace(A100, sms=96), "fa2") != forty


def test_attn_core_op_carries_the_factor():
    # The calibrated op time of a TP 8 rank's attention (4 heads, 1 KV head) is the kernel's rate time x the
    # grid factor (compute-bound: far above the bytes' time and the launch floor).
    shape = (1, 4, 1, 8192, 128)
    for phase in ("fwd", "bwd"):
        op = Op("attn_core", phase, 0, 0, shape, True, kernel="cudnn")
        base = flash_compute_seconds(shape, phase, A100, "cudnn", 1.0)
        got = op_seconds(op, A100, "calibrated", "burst")
        assert got == pytest.approx(base * fa2_grid_factor(shape, phase, A100, "cudnn"))
