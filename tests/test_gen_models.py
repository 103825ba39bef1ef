"""Model presets, the GPU catalog (contract A), overrides and profiled op times."""

from __future__ import annotations

import pytest
from xsim.tracegen import catalog
from xsim.tracegen.errors import CatalogError, ProfileError
from xsim.tracegen.models import MODEL_NAMES, model_from_mapping, preset
from xsim.tracegen.ops import Ctx, Op, duration_micros, layer_steps, shard_of
from xsim.tracegen.profile import build_table, make_row, read_profile_csv


def test_llama2_parameter_counts_match_the_released_checkpoints():
    # Hand count for Llama-2 7B (config.json numbers): per layer q,k,v,o 4*4096^2 = 67,108,864, SwiGLU MLP
    # 3*4096*11008 = 135,266,304, two RMSNorm gains 8,192 -> 202,383,360; x32 = 6,476,267,520; embedding and
    # untied LM head 2*32000*4096 = 262,144,000; final norm 4,096. Total 6,738,415,616, the parameter count
    # of meta-llama/Llama-2-7b-hf.
    per_layer = 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    assert per_layer == 202_383_360
    assert preset("llama2-7b").total_params() == 32 * per_layer + 2 * 32000 * 4096 + 4096 == 6_738_415_616
    # 13B and 70B (GQA: k,v are 8 heads of 128 = 1024 wide): the released checkpoints' counts.
    l13 = 4 * 5120**2 + 3 * 5120 * 13824 + 2 * 5120
    assert preset("Llama-2-13B").total_params() == 40 * l13 + 2 * 32000 * 5120 + 5120 == 13_015_864_320
    l70 = 2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
    assert preset("llama2-70b").total_params() == 80 * l70 + 2 * 32000 * 8192 + 8192 == 68_976_648_192


def test_gpt3_is_175b_within_half_a_percent():
    # GPT-3 175B: 12 * 96 * 12288^2 = 173.9e9 in the layers; the rest is embeddings, biases and norms.
    m = preset("gpt3-175b")
    assert (m.activation, m.norm, m.head_dim) == ("gelu", "layernorm", 128)
    assert abs(m.total_params() / 175e9 - 1) < 0.005
    # By hand: 96 layers of 12 h^2 + 13 h, the embedding V h once (tied, as GPT-2/GPT-3 and Megatron's
    # GPTModel), the learned position table n_ctx h (GPT-2's wpe, 2048 x 12288) and the final LayerNorm 2h:
    # 173,961,510,912 + 617,558,016 + 25,165,824 + 24,576 = 174,604,259,328.
    assert m.positions == "learned" and m.position_params == 2048 * 12288
    assert (
        m.tied and m.total_params() == 96 * (12 * 12288**2 + 13 * 12288) + (50257 + 2048) * 12288 + 2 * 12288
    )
    assert m.total_params() == 174_604_259_328


def test_user_model_inline_and_from_base():
    m = model_from_mapping({"base": "llama2-7b", "layers": 2, "name": "tiny"})
    assert (m.layers, m.hidden, m.name) == (2, 4096, "tiny")
    m2 = model_from_mapping(
        {"layers": 4, "hidden": 256, "ffn_hidden": 1024, "heads": 8, "vocab": 1000, "seq_len": 128}
    )
    assert m2.kv_heads == 8 and m2.name == "custom"
    with pytest.raises(CatalogError, match="heads do not divide hidden"):
        model_from_mapping(
            {"layers": 4, "hidden": 250, "ffn_hidden": 1024, "heads": 8, "vocab": 10, "seq_len": 8}
        )
    with pytest.raises(CatalogError, match="unknown key"):
        model_from_mapping({"base": "llama2-7b", "hiden": 5})
    with pytest.raises(CatalogError, match="unknown model"):
        preset("llama4-8b")
    assert set(MODEL_NAMES) == {
        "llama2-7b",
        "llama2-13b",
        "llama2-70b",
        "llama3-8b",
        "llama3-70b",
        "llama3-405b",
        "gpt3-175b",
        "mixtral-8x7b",
        "deepseek-v3",
    }


def test_catalog_contract_a_uses_dense_tensor_core_peaks():
    # Issue 26 added the datasheet GPUs GB200, H20, L40S and MI300X (tests/test_custom_gpus.py pins them).
    assert set(catalog.GPU_NAMES) == {
        "A100-40GB", "A100-80GB", "H100", "H200", "B200", "V100", "GB200", "H20", "L40S", "MI300X"
    }  # fmt: skip
    assert catalog.gpu("A100") == catalog.gpu("A100-40GB")
    # Datasheet dense BF16 tensor-core peaks (DESIGN.md pitfalls): not Table 2's 77.97 / 204.9.
    assert catalog.gpu("A100-40GB").peak_flops == 312e12
    assert catalog.gpu("H100").peak_flops == pytest.approx(989.4e12)
    assert catalog.gpu("H200").peak_flops == pytest.approx(989.4e12)
    assert catalog.gpu("B200").peak_flops == pytest.approx(2250e12)
    h = catalog.gpu("h100")
    assert (h.mem_bw, h.memory_bytes) == (3.35e12, 80 * 2**30)
    assert 0 < h.gemm_eff <= 1 and 0 < h.mem_eff <= 1
    assert h.price_per_hour == pytest.approx(98.32 / 8, abs=1e-3)
    assert catalog.gpu("B200").price_per_hour is None
    with pytest.raises(CatalogError, match="unknown GPU.*describe a new GPU"):
        catalog.gpu("MI400")


def test_overrides_are_checked():
    h = catalog.with_overrides(catalog.gpu("H100"), {"gemm_eff": 0.5, "price_per_hour": 2.5})
    assert (h.gemm_eff, h.price_per_hour, h.peak_flops) == (0.5, 2.5, catalog.gpu("H100").peak_flops)
    for bad in ({"gemm_eff": 1.5}, {"mem_bw": -1}, {"peak": 1.0}):
        with pytest.raises(CatalogError):
            catalog.with_overrides(catalog.gpu("H100"), bad)


def _qkv_fwd() -> Op:
    c = Ctx(preset("llama2-7b"), shard_of(preset("llama2-7b"), 1, 0), 1, 2048, 2, False)
    (op,) = [s for s in layer_steps(c, "fwd") if isinstance(s, Op) and s.op == "qkv_proj"]
    return op


def test_roofline_duration_of_a_gemm_by_hand():
    op = _qkv_fwd()
    # QKV of Llama-2 7B, 2048 tokens: [2048 x 4096] x [4096 x 12288] -> 2*2048*4096*12288 FLOPs.
    assert op.shape == (2048, 4096, 12288)
    assert op.flops == 206_158_430_208
    # Compute-bound on H100: 206.16e9 / (989.4e12 * 0.70) = 297.66 us (memory: 167.8 MB / 2.68 TB/s = 62.6 us).
    assert duration_micros(op, catalog.gpu("H100")) == 298
    slow = catalog.with_overrides(catalog.gpu("H100"), {"gemm_eff": 0.35})
    assert duration_micros(op, slow) == 595  # 595.3 us
    # Backward: input and weight gradients, twice the work.
    c = Ctx(preset("llama2-7b"), shard_of(preset("llama2-7b"), 1, 0), 1, 2048, 2, False)
    (bwd,) = [s for s in layer_steps(c, "bwd") if isinstance(s, Op) and s.op == "qkv_proj"]
    assert bwd.flops == 2 * op.flops


def test_profiled_time_overrides_the_roofline(tmp_path):
    csv_file = tmp_path / "prof.csv"
    csv_file.write_text(
        "gpu,op,phase,shape,micros\nH100,qkv_proj,fwd,2048x4096x12288,250\nA100,qkv_proj,fwd,1x2,9\n"
    )
    rows = read_profile_csv(csv_file)
    assert rows[1].gpu == "A100-40GB"
    table = build_table(rows)
    op = _qkv_fwd()
    assert duration_micros(op, catalog.gpu("H100"), table) == 250
    assert duration_micros(op, catalog.gpu("H200"), table) == 298  # no row for H200: roofline (same peak)
    with pytest.raises(ProfileError, match="phase"):
        make_row({"gpu": "H100", "op": "x", "phase": "up", "shape": "1", "micros": 1}, "row 1")
    bad = tmp_path / "bad.csv"
    bad.write_text("gpu,op,shape,micros\n")
    with pytest.raises(ProfileError, match="missing column"):
        read_profile_csv(bad)
