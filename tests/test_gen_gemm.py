"""Calibrated compute model, FP8 precision and unfused attention (issue 10 items 4, 5, 7)."""

from __future__ import annotations

import dataclasses

import pytest
from xsim.tracegen import catalog, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.gemm import (
    LAUNCH_FLOOR_S,
    PLATEAUS,
    SUSTAINED_CLOCK_RATIO,
    LinearGemm,
    calibration_points,
    gemm_compute,
    linear_compute_seconds,
    linear_seconds,
    plateau,
)
from xsim.tracegen.models import preset
from xsim.tracegen.ops import ATTN_CORE_OPS, Ctx, Op, duration_micros, layer_steps, op_seconds, shard_of
from xsim.tracegen.profile import ProfileRow, build_table
from xsim.tracegen.workload import generate

A100, H100 = catalog.gpu("A100"), catalog.gpu("H100")


# -- tile and wave quantization, worked by hand ------------------------------------------------------------
def test_full_waves_reach_the_plateau():
    # 6912 x 16384 outputs in 256x128 tiles: 27 x 128 = 3,456 tiles = exactly 32 waves on 108 SMs.
    t = gemm_compute(6912, 2048, 16384, A100, rates="burst")
    assert (t.tile, t.waves) == ((256, 128), 32)
    assert t.efficiency == pytest.approx(267.9 / 312)
    # Sustained (the default): the burst rate at NVIDIA's power-limited A100 clock, 1305 of 1410 MHz.
    assert gemm_compute(6912, 2048, 16384, A100).efficiency == pytest.approx(267.9 / 312 * 1305 / 1410)
    # The MAMF points themselves (mamf-finder v1 printed MxNxK with N the reduction): A100 M 6912, K 16384,
    # N 2048: 27 x 16 = 432 tiles of 256x128 = 4 full waves on 108 SMs; H100 M 6144, K 17920, N 2816:
    # 24 x 22 = 528 tiles = 4 full waves on 132 SMs, so each burst plateau is its point, 792.1 / 989.4.
    a = gemm_compute(6912, 16384, 2048, A100, rates="burst")
    assert (a.tile, a.waves, a.efficiency) == ((256, 128), 4, pytest.approx(267.9 / 312))
    h = gemm_compute(6144, 17920, 2816, H100, rates="burst")
    assert (h.tile, h.waves, h.efficiency) == ((256, 128), 4, pytest.approx(792.1 / 989.4))


def test_wave_quantization_h100_4096_cube():
    # 4096^2 outputs: 16 x 32 = 512 tiles of 256x128 on 132 SMs -> 4 waves for 3.88 of work; 128x128 tiles
    # would need 1,024 tiles = 8 waves at 0.75 reuse (more time), so efficiency = plateau * 512 / (4 * 132).
    t = gemm_compute(4096, 4096, 4096, H100)
    assert (t.tile, t.waves) == ((256, 128), 4)
    assert t.efficiency == pytest.approx(plateau(H100, "bf16") * 512 / 528)
    # Time = 4 waves x one 256x128x4096 tile at the per-SM plateau rate.
    per_sm = 989.4e12 * plateau(H100, "bf16") / 132
    assert t.seconds == pytest.approx(4 * 2 * 256 * 128 * 4096 / per_sm)


def test_tile_quantization_one_extra_row():
    # M = 4097 on A100: 256x128 tiles give 17 x 32 = 544 tiles (6 waves); 128x256 give 33 x 16 = 528 tiles
    # (5 waves), so cuBLAS-like choice is 128x256 and efficiency = plateau * 4097*4096 / (5*108*128*256).
    t = gemm_compute(4097, 4096, 4096, A100)
    assert (t.tile, t.waves) == ((128, 256), 5)
    assert t.efficiency == pytest.approx(267.9 / 312 * 1305 / 1410 * 4097 * 4096 / (5 * 108 * 128 * 256))


def test_small_gemm_hits_the_launch_floor_and_memory_bound():
    assert linear_seconds(LinearGemm(64, 64, 64, "fwd"), 3 * 64 * 64 * 2, H100, "bf16") == LAUNCH_FLOOR_S
    # A skinny GEMM (M=8) reading a 8192x8192 BF16 weight is memory-bound at the achieved bandwidth: the
    # published H100 SXM device-to-device copy, 2,903 GB/s (issue 22; was 0.80 x 3.35 TB/s).
    nbytes = 2 * (8 * 8192 + 8192 * 8192 + 8 * 8192)
    assert linear_seconds(LinearGemm(8, 8192, 8192, "fwd"), nbytes, H100, "bf16") == pytest.approx(
        nbytes / 2903e9
    )


def test_calibration_points_reproduced_within_one_percent():
    points = calibration_points()
    assert len(points) >= 2 and all(p.source for p in points)
    for p in points:
        # The points are burst measurements (mamf-finder): reproduced under `gemm_rates: burst`.
        got = gemm_compute(p.m, p.k, p.n, catalog.gpu(p.gpu), p.dtype, rates="burst").efficiency
        peak = catalog.tensor_peak(catalog.gpu(p.gpu), p.dtype)
        assert got * peak / 1e12 == pytest.approx(p.tflops, rel=0.01), p


def test_gemm_eff_override_replaces_the_plateau():
    over = catalog.with_overrides(H100, {"gemm_eff": 0.5})
    assert plateau(over, "bf16") == 0.5 and plateau(over, "fp8") == 0.5
    # H100 FP8 has a row of its own (MAMF 1402.6 TFLOP/s on H100 SXM), no longer H200's 1453.4.
    assert plateau(H100, "fp8", "burst") == pytest.approx(1402.6 / 1979)
    assert plateau(catalog.gpu("H200"), "fp8", "burst") == pytest.approx(1453.4 / 1979)
    # Sustained: the H100's burst x the MSMF / MAMF ratio of the GH100 die at 700 W (H200: 1288.7 / 1491.9).
    assert plateau(H100, "fp8") == pytest.approx(1402.6 / 1979 * 1288.7 / 1491.9)
    assert plateau(catalog.gpu("V100"), "bf16") == catalog.DEFAULT_GEMM_EFF  # no public sweep recorded
    assert set(PLATEAUS) >= {("A100-40GB", "bf16"), ("H100", "bf16"), ("B200", "fp8")}


def test_gb200_has_its_own_mamf_points():
    # ml-engineering commit 744d01e, compute/accelerator/README.md MAMF tables: GB200 SXM BF16 1822.0 of 2500
    # TFLOP/s, FP8 3615.6 of 5000 (torch 2.10.0.dev20250916+cu130), where it took the B200's fractions x its
    # datasheet peak before round b200cal (1745.0 / 2250 x 2500 = 1938.9, 3432.5 / 4500 x 5000 = 3813.9).
    gb200, b200 = catalog.gpu("GB200"), catalog.gpu("B200")
    assert plateau(gb200, "bf16", "burst") * 2500 == pytest.approx(1822.0)
    assert plateau(gb200, "fp8", "burst") * 5000 == pytest.approx(3615.6)
    assert plateau(b200, "fp8", "burst") * 4500 == pytest.approx(3432.5)
    # Sustained: the B200's MSMF / MAMF (its calibration GPU): FP8 3615.6 x 2795.7 / 3435.2 = 2942.5 TFLOP/s.
    assert (
        plateau(gb200, "fp8") * 5000
        == pytest.approx(3615.6 * 2795.7 / 3435.2)
        == pytest.approx(2942.5, abs=0.1)
    )
    # Llama 3 8B's QKV forward on the rows' 16,384 tokens, FP8 (no per-tile cost on Blackwell FP8): M 16384,
    # K 4096, N 6144 -> 64 x 48 = 3,072 tiles of 256 x 128 = 21 waves on 148 SMs (20.76 of work); each wave
    # 2 x 256 x 128 x 4096 FLOPs per SM at 2942.5e12 / 148: 21 x 268,435,456 x 148 / 2942.5e12 = 283.53 us
    # (B200: 3432.5 x 2795.7 / 3435.2 = 2793.5 TFLOP/s, 298.66 us).
    t = linear_compute_seconds(LinearGemm(16384, 4096, 6144), gb200, "fp8", "sustained")
    assert t == pytest.approx(21 * 2 * 256 * 128 * 4096 * 148 / (3615.6e12 * 2795.7 / 3435.2))
    assert t == pytest.approx(283.53e-6, rel=1e-4)
    tb = linear_compute_seconds(LinearGemm(16384, 4096, 6144), b200, "fp8", "sustained")
    assert tb == pytest.approx(298.66e-6, rel=1e-4)


# -- FP8 ------------------------------------------------------------------------------------------------------
def _ops(precision: str = "bf16", attention: str = "flash", phase: str = "fwd") -> dict[str, Op]:
    m = preset("llama2-7b")
    c = Ctx(m, shard_of(m, 1, 0), 1, 2048, 2, False, precision, attention)
    return {s.op: s for s in layer_steps(c, phase) if isinstance(s, Op)}


@pytest.mark.parametrize("model", ["roofline", "calibrated"])
def test_fp8_gemm_time_is_bf16_time_times_peak_ratio(model):
    bf, f8 = _ops("bf16")["mlp_up_gate"], _ops("fp8")["mlp_up_gate"]
    assert (bf.precision, f8.precision, f8.flops) == ("bf16", "fp8", bf.flops)
    # TE keeps both GEMM operands in FP8 (1 byte), the output in BF16: [2048x4096]x[4096x22016].
    assert f8.bytes == (2048 * 4096 + 4096 * 22016) + 2 * 2048 * 22016
    gpu = catalog.with_overrides(H100, {"gemm_eff": 0.7})  # equal efficiency in both precisions
    ratio = op_seconds(f8, gpu, model) / op_seconds(bf, gpu, model)
    assert ratio == pytest.approx(989.4 / 1979)
    # H200 and B200 have FP8 peaks too (datasheets: 1,979 and 4,500 dense TFLOP/s).
    assert catalog.tensor_peak(catalog.gpu("B200"), "fp8") == 4500e12


def test_fp8_on_a_gpu_without_fp8_is_one_error_naming_it():
    spec = {"model": "llama2-7b", "precision": "fp8", "device_groups": [{"gpu": "A100", "ranks": [0]}]}
    with pytest.raises(SpecError, match=r"device group 0: GPU A100-40GB has no FP8 tensor cores"):
        load_spec(spec)
    with pytest.raises(SpecError, match="precision must be one of"):
        load_spec({**spec, "precision": "fp4"})


def test_fp8_spec_generates_and_round_trips(tmp_path):
    spec = {
        "model": "llama2-7b",
        "precision": "fp8",
        "compute_model": "calibrated",
        "attention": "unfused",
        "device_groups": [{"gpu": "H100", "ranks": [0]}],
    }
    dep = load_spec(spec)
    assert (dep.precision, dep.attention, dep.compute_model) == ("fp8", "unfused", "calibrated")
    from xsim.tracegen.spec import spec_to_mapping

    again = load_spec(spec_to_mapping(dep))
    assert again == dep


# -- unfused attention ----------------------------------------------------------------------------------------
def test_unfused_attention_ops_and_bytes_by_hand():
    fwd, bwd = _ops(attention="unfused"), _ops(attention="unfused", phase="bwd")
    names = [n for n in fwd if n.startswith("attn_") and n in ATTN_CORE_OPS]
    assert names == ["attn_scores", "attn_softmax", "attn_dropout", "attn_context"]
    assert "attn_core" not in fwd and "attn_core" in _ops()
    b, a, s, d = 2, 32, 2048, 128  # BF16, Llama-2 7B heads, sequence, head dim; one sequence
    flash = _ops()["attn_core"]
    # Unfused GEMMs compute the whole s x s matrix; causal flash attention skips the masked half.
    assert fwd["attn_scores"].flops + fwd["attn_context"].flops == 2 * flash.flops == 4 * a * s * s * d
    scores = a * s * s
    assert fwd["attn_softmax"].bytes == 2 * b * scores  # read scores, write probabilities
    assert fwd["attn_dropout"].bytes == scores * (2 * b + 1)  # read, write, 1-byte mask
    assert bwd["attn_softmax"].bytes == 3 * b * scores
    assert fwd["attn_scores"].shape == (a, s, d, s) and fwd["attn_context"].shape == (a, s, s, d)
    # Memory-bound softmax: 536,870,912 B / (3.35 TB/s * 0.80) = 200.3 us on H100 (roofline); calibrated,
    # at the measured 2,903 GB/s copy bandwidth: 184.9 us.
    assert duration_micros(fwd["attn_softmax"], H100) == 200
    assert duration_micros(fwd["attn_softmax"], H100, None, "calibrated") == 185
    # Backward runs the four ops in reverse order.
    order = [n for n in bwd if n in ATTN_CORE_OPS]
    assert order == ["attn_context", "attn_dropout", "attn_softmax", "attn_scores"]


def test_unfused_attention_nodes_in_generated_traces():
    spec = {"model": "llama2-7b", "attention": "unfused", "device_groups": [{"gpu": "H100", "ranks": [0]}]}
    nodes = generate(load_spec(spec), rewrite=False).nodes[0]
    fwd = [n.name for n in nodes if n.name.startswith("L1.attn_") and n.name.endswith(".fwd.mb0")]
    core = ("attn_scores", "attn_softmax", "attn_dropout", "attn_context")
    # Megatron-Core (the default profile): bias-dropout-add after the projection (RoPE, named `rope`, runs
    # before the core).
    assert fwd == ["L1.attn_norm.fwd.mb0", *(f"L1.{op}.fwd.mb0" for op in core), "L1.attn_out_proj.fwd.mb0",
                   "L1.attn_bias_dropout_add.fwd.mb0"]  # fmt: skip
    assert not [n for n in nodes if "attn_core" in n.name]


# -- the calibrated model keeps profiles and overrides -------------------------------------------------------
def test_profile_rows_still_win_in_the_calibrated_model():
    op = _ops()["qkv_proj"]
    table = build_table([ProfileRow("H100", "qkv_proj", "fwd", op.shape, 250.0)])
    assert duration_micros(op, H100, table, "calibrated") == 250
    # Without a row: 2048x12288 outputs in 256x128 tiles = 8 x 96 = 768 tiles, 6 waves on 132 SMs, each tile
    # 4096 + 240 columns of K (the BF16 per-tile cost) at the plateau x (17920 + 240) / 17920:
    # 6 x 2 x 256 x 128 x 4336 / (792.1e12 x 708.5/841.9 / 132) / 1.01339 = 333.16 us (318.94 without K0).
    t = gemm_compute(2048, 4096 + 240, 12288, H100)
    assert (t.tile, t.waves) == ((256, 128), 6)
    assert (
        duration_micros(op, H100, None, "calibrated")
        == round(t.seconds / ((17920 + 240) / 17920) * 1e6)
        == 333
    )


def test_fp8_peak_and_sm_count_overrides():
    # peak_flops override scales the catalog FP8 peak (same tensor cores, other clocks) ...
    slow = catalog.with_overrides(H100, {"peak_flops": 989.4e12 / 2})
    assert catalog.tensor_peak(slow, "fp8") == pytest.approx(1979e12 / 2)
    # ... unless fp8_flops is given; sms changes the waves: 512 tiles on 114 SMs = 5 waves (4.49 of work).
    over = catalog.with_overrides(H100, {"peak_flops": 989.4e12 / 2, "fp8_flops": 1.5e15, "sms": 114})
    assert catalog.tensor_peak(over, "fp8") == 1.5e15
    assert gemm_compute(4096, 4096, 4096, over).waves == 5
    with pytest.raises(catalog.CatalogError, match="sms"):
        catalog.with_overrides(H100, {"sms": 1.5})


def test_batched_attention_gemm_waves_and_fused_attention_rate():
    # 32 batched QK^T GEMMs (micro-batch 4 x 8 local heads) of 2048x128x2048 on A100: 8 x 16 = 128 tiles of
    # 256x128 each, 4,096 in all = 38 waves on 108 SMs (37.93 of work).
    t = gemm_compute(2048, 128, 2048, A100, batch=32)
    assert (t.tile, t.waves) == ((256, 128), 38)
    assert t.efficiency == pytest.approx(267.9 / 312 * SUSTAINED_CLOCK_RATIO * 4096 / (38 * 108))
    # Fused attention runs at its own published rate (tracegen/attention.py), not at gemm_eff: megatron-core's
    # Hopper kernel is cuDNN's, at its causal forward rate for head dim 128 at s 2048 (FlashAttention-3
    # paper, Figure 5d: 484 TFLOP/s on the causal half, 4 a s^2 d / 2), at the GH100's measured
    # sustained/burst ratio (H200 BF16 MSMF 708.5 / MAMF 841.9, tracegen.gemm.SUSTAINED_RATIOS).
    # Without attention dropout (megatron-core's default 0.1 adds cuDNN's dropout ratio: test_attention_dropout).
    core = dataclasses.replace(_ops()["attn_core"], dropout=False)
    assert core.kernel == "cudnn"
    assert op_seconds(core, H100, "calibrated") == pytest.approx(
        4 * 2048 * 2048 * 128 * 32 / 2 / (484e12 * 708.5 / 841.9)
    )
    # A gemm_eff override keeps the previous rule: FLOPs / (peak x gemm_eff).
    eff = catalog.with_overrides(H100, {"gemm_eff": 0.70})
    assert op_seconds(core, eff, "calibrated") == pytest.approx(core.flops / (989.4e12 * 0.70))
    # Any op with work takes at least one launch floor per kernel: a 1-element op, and a backward GEMM (2).
    tiny = Op("attn_norm", "fwd", 4, 4, (1,), False)
    assert op_seconds(tiny, H100, "calibrated") == LAUNCH_FLOOR_S
    assert op_seconds(tiny, H100, "roofline") == pytest.approx(4 / (3.35e12 * 0.8))
    small_bwd = Op("qkv_proj", "bwd", 2 * 2 * 64**3, 2 * 3 * 2 * 64**2, (64, 64, 64), True, kernels=2)
    assert op_seconds(small_bwd, H100, "calibrated") == 2 * LAUNCH_FLOOR_S


# -- FP8 dense GEMMs: per-tile cost K0 on each GEMM's own reduction dimension (issue 22, fp8gap) -------------
def test_fp8_dense_gemm_pays_the_tile_cost_k0_by_hand():
    from xsim.tracegen.gemm import CALIBRATION_K, FP8_TILE_K0, tile_cost
    from xsim.tracegen.grouped_gemm import K0_FP8

    fp8_k_terms = tile_cost
    assert FP8_TILE_K0 == K0_FP8 == 718
    assert CALIBRATION_K == {("H100", "fp8"): 14336, ("H100", "bf16"): 17920}
    # Per column of K the tile runs at plateau x (14336 + 718) / 14336, so a GEMM of the calibration K
    # (MAMF's FP8 best shape 1024 x 9216 x 14336) keeps the measured rate: time(K + K0) / scale = time(K).
    assert fp8_k_terms(H100, "fp8") == (718, (14336 + 718) / 14336)
    assert fp8_k_terms(catalog.gpu("H200"), "fp8") == (0, 1.0)
    assert fp8_k_terms(catalog.with_overrides(H100, {"gemm_eff": 0.7}), "fp8") == (0, 1.0)
    scale = (14336 + 718) / 14336
    at_cal = gemm_compute(1024, 14336 + 718, 9216, H100, "fp8").seconds / scale
    assert at_cal == pytest.approx(gemm_compute(1024, 14336, 9216, H100, "fp8").seconds)
    # Llama-2 7B QKV forward, FP8, H100: 4096 x 4096 x 12288 = 16 x 96 tiles of 256 x 128 = 1,536 -> 12
    # waves on 132 SMs, each SM at 1979 x (1402.6 / 1979) x (1288.7 / 1491.9) / 132 TFLOP/s; the K loop
    # 4096 + 718 columns: 392.80 us (351.0 us without K0).
    per_sm = 1979e12 * (1402.6 / 1979) * (1288.7 / 1491.9) / 132
    tile = 2 * 256 * 128
    ops = {o.op: o for o in layer_steps(_ctx8(), "fwd") if isinstance(o, Op)}
    qkv = op_seconds(ops["qkv_proj"], H100, "calibrated")
    assert (
        qkv == pytest.approx(12 * tile * (4096 + 718) / per_sm / scale) == pytest.approx(392.80e-6, rel=1e-4)
    )
    # mlp_down backward, [4096 x 11008] x [11008 x 4096]: dgrad [4096 x 4096] x [4096 x 11008] reduces over
    # 4096 (16 x 86 tiles -> 11 waves), wgrad [11008 x 4096] x [4096 x 4096] over the 4096 tokens (43 x 32
    # tiles -> 11 waves): 22 waves of 4096 + 718 columns = 720.13 us (628.8 us as twice the forward shape).
    bwd = {o.op: o for o in layer_steps(_ctx8(), "bwd") if isinstance(o, Op)}
    down = op_seconds(bwd["mlp_down"], H100, "calibrated")
    assert (
        down == pytest.approx(22 * tile * (4096 + 718) / per_sm / scale) == pytest.approx(720.13e-6, rel=1e-4)
    )
    # BF16 GEMMs pay the BF16 per-tile cost (240 columns against MAMF's K 17,920): the Llama-2 7B QKV of
    # test_profile_rows_still_win_in_the_calibrated_model, 6 waves of 4096 + 240 columns.
    head = _ops()["qkv_proj"]
    bf16_scale = (17920 + 240) / 17920
    assert op_seconds(head, H100, "calibrated") == pytest.approx(
        gemm_compute(2048, 4096 + 240, 12288, H100).seconds / bf16_scale
    )


def _ctx8() -> Ctx:
    m = preset("llama2-7b")
    return Ctx(m, shard_of(m, 1, 0), 1, 4096, 2, False, "fp8", "flash")
