"""Issue 22 items 1-3: framework kernel profiles, sustained GEMM rates, the whole optimizer step.

Every expected number is worked out by hand in the comments from the tiny models below (T = 16 tokens,
BF16: 2 bytes), not read back from the code.
"""

from __future__ import annotations

import pytest
from xsim.tracegen import catalog, choices, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.frameworks import DEFAULT_FRAMEWORK, FRAMEWORK_NAMES, FRAMEWORKS
from xsim.tracegen.gemm import (
    BURST_PLATEAUS,
    GEMM_RATES,
    LAUNCH_FLOOR_S,
    MEASURED_MEM_EFF,
    SUSTAINED_CLOCK_RATIO,
    achieved_bandwidth,
    plateau,
)
from xsim.tracegen.models import model_from_mapping, preset
from xsim.tracegen.ops import (
    Ctx,
    Op,
    embedding_steps,
    head_steps,
    layer_steps,
    op_seconds,
    optimizer_steps,
    shard_of,
    te_amax_update,
)
from xsim.tracegen.spec import spec_to_mapping
from xsim.tracegen.workload import generate
from xsim.traces import attrs as A
from xsim.traces import pb

# GPT-style: GELU, LayerNorm, biases (no RoPE). h 64, FFN 256, 4 heads of 16, QKV width 192.
GPT = {"name": "gpt-tiny", "layers": 2, "hidden": 64, "ffn_hidden": 256, "heads": 4, "kv_heads": 4, "vocab": 100,
       "seq_len": 16, "activation": "gelu", "norm": "layernorm", "linear_bias": True}  # fmt: skip
# Llama-style: SwiGLU, RMSNorm, no biases, RoPE. FFN 128 (gate + up = 256).
LLAMA = {**GPT, "name": "llama-tiny", "ffn_hidden": 128, "activation": "swiglu", "norm": "rmsnorm",
         "linear_bias": False}  # fmt: skip


def ops(model: dict, fw: str, phase: str, attention: str | None = None, precision: str = "bf16") -> list[Op]:
    m = model_from_mapping(model)
    f = FRAMEWORKS[fw]
    c = Ctx(m, shard_of(m, 1, 0), 1, 16, 2, False, precision, attention or f.attention, f)
    return [s for s in layer_steps(c, phase) if isinstance(s, Op)]


def table(model: dict, fw: str, phase: str, **kw) -> dict[str, tuple[int, int, int]]:
    """op -> (bytes, FLOPs, kernels) of the element-wise ops (the GEMMs are unchanged by the profile)."""
    return {o.op: (o.bytes, o.flops, o.kernels) for o in ops(model, fw, phase, **kw) if not o.gemm}


# -- one layer per profile, by hand ----------------------------------------------------------------------------
def test_gpt_layer_megatron_2021_kernels_by_hand():
    fwd = [o.op for o in ops(GPT, "megatron-2021", "fwd")]
    assert fwd == [
        "attn_norm", "qkv_proj", "qkv_proj_bias", "attn_scores", "attn_softmax", "attn_dropout", "attn_context",
        "attn_context_permute", "attn_out_proj", "attn_bias_dropout_add", "mlp_norm", "mlp_up_gate", "mlp_act",
        "mlp_down", "mlp_bias_dropout_add",
    ]  # fmt: skip
    t = table(GPT, "megatron-2021", "fwd")
    # The context back to [s, b, h] (permute + contiguous): read + write 16 x 64 BF16 = 4,096 B.
    assert t["attn_context_permute"] == (16 * 64 * 2 * 2, 0, 1)
    # Backward: the Q/K/V gradients concatenated into the projection's (torch.split's backward), right
    # after the attention core's backward: read + write 16 x 192 BF16 = 12,288 B.
    bwd_ops = [o.op for o in ops(GPT, "megatron-2021", "bwd")]
    assert bwd_ops[bwd_ops.index("attn_scores") + 1] == "qkv_grad_cat"
    assert table(GPT, "megatron-2021", "bwd")["qkv_grad_cat"] == (16 * 192 * 2 * 2, 0, 1)
    # QKV bias outside the GEMM (F.linear): read + write 16 x 192 BF16 = 12,288 B, 1 FLOP each.
    assert t["qkv_proj_bias"] == (16 * 192 * 2 * 2, 16 * 192, 1)
    # Bias-dropout-add (JIT-fused): read branch and residual, write sum (3 x 2 B) + 1-byte mask = 7 B per
    # element of 16 x 64; FLOPs 2 (dropout) + 1 (add).
    assert t["attn_bias_dropout_add"] == t["mlp_bias_dropout_add"] == (16 * 64 * 7, 16 * 64 * 3, 1)
    # Bias-GeLU (JIT-fused): read 16 x 256, write 16 x 256; 8 FLOPs each.
    assert t["mlp_act"] == (16 * 256 * 4, 16 * 256 * 8, 1)
    # Unfused attention computes the full s x s matrix: 2 x 4 heads x 16^2 x 16 x 2 per GEMM.
    scores = next(o for o in ops(GPT, "megatron-2021", "fwd") if o.op == "attn_scores")
    assert scores.flops == 2 * 4 * 16 * 16 * 16
    bwd = table(GPT, "megatron-2021", "bwd")
    # Backward: dropout of the branch gradient (read grad + mask, write grad: 5 B), bias gradients as
    # reductions of the output gradients (read once: 16 x 256 x 2 and 16 x 192 x 2), bias-GeLU backward
    # (read grad and input, write grad: 6 B).
    assert bwd["mlp_bias_dropout_add"] == (16 * 64 * 5, 16 * 64 * 2, 1)
    assert bwd["mlp_up_bias"][0] == 16 * 256 * 2 and bwd["qkv_proj_bias"][0] == 16 * 192 * 2
    assert bwd["mlp_act"] == (16 * 256 * 6, 2 * 16 * 256 * 8, 1)


def test_megatron_causal_softmax_reads_the_lower_triangle_by_hand():
    # GPT-tiny, s 16, 4 heads: 4 x 16^2 = 1,024 scores, of which the lower triangle holds 4 x 16 x 17 / 2 = 544.
    # Megatron's fused causal softmax reads the triangle and writes every element: forward 2 x (544 + 1,024) =
    # 3,136 B; backward reads gradient and probabilities of the triangle, writes the gradient: 2 x (2 x 544 +
    # 1,024) = 4,224 B. Without the kernel (an unfused softmax under megatron-core): 4,096 and 6,144 B.
    for fw in ("megatron-2021", "megatron-2022"):
        assert table(GPT, fw, "fwd")["attn_softmax"][0] == 3_136
        assert table(GPT, fw, "bwd")["attn_softmax"][0] == 4_224
    assert table(GPT, "megatron-core", "fwd", attention="unfused")["attn_softmax"][0] == 4_096
    assert table(GPT, "megatron-core", "bwd", attention="unfused")["attn_softmax"][0] == 6_144
    # Past the kernel's sequence limit (2,048 in the 2021 code) the whole row is read.
    long = {**GPT, "seq_len": 4096}
    m = model_from_mapping(long)
    f = FRAMEWORKS["megatron-2021"]
    c = Ctx(m, shard_of(m, 1, 0), 1, 4096, 2, False, "bf16", "unfused", f)
    (sm,) = [o for o in layer_steps(c, "fwd") if isinstance(o, Op) and o.op == "attn_softmax"]
    assert sm.bytes == 2 * 2 * 4 * 4096 * 4096


def test_gpt_layer_megatron_core_kernels_by_hand():
    fwd = [o.op for o in ops(GPT, "megatron-core", "fwd")]
    # TE adds biases in the GEMM epilogue; flash attention; fused bias-GeLU and bias-dropout-add.
    assert fwd == [
        "attn_norm", "qkv_proj", "attn_core", "attn_out_proj", "attn_bias_dropout_add", "mlp_norm",
        "mlp_up_gate", "mlp_act", "mlp_down", "mlp_bias_dropout_add",
    ]  # fmt: skip
    core = next(o for o in ops(GPT, "megatron-core", "fwd") if o.op == "attn_core")
    # Causal flash attention: half of 4 x b x s^2 x h = 4 x 16^2 x 64 / 2 = 32,768 FLOPs.
    assert core.flops == 4 * 16 * 16 * 64 // 2 == 32_768
    bwd = [o.op for o in ops(GPT, "megatron-core", "bwd")]
    # QKV's bias gradient comes out of TE's weight-gradient GEMM; the projection's and both MLP linears'
    # biases are skip_bias_add inputs of the fused kernels, whose gradients autograd sums over the tokens
    # (megatron/core/transformer/mlp.py and attention.py at core_r0.8.0): read 16 x 256 and 16 x 64 in 2 B.
    assert [n for n in bwd if n.endswith("_bias")] == ["mlp_out_bias", "mlp_up_bias", "attn_out_bias"]
    bias = {o.op: o.bytes for o in ops(GPT, "megatron-core", "bwd") if o.op.endswith("_bias")}
    assert bias == {"mlp_out_bias": 16 * 64 * 2, "mlp_up_bias": 16 * 256 * 2, "attn_out_bias": 16 * 64 * 2}
    # The full matrix is kept where the kernel computes it: explicit `attention: unfused` overrides.
    unf = [o.flops for o in ops(GPT, "megatron-core", "fwd", attention="unfused") if o.op.startswith("attn_")]
    assert sum(unf) - core.flops > 2 * core.flops  # both GEMMs at the full count (+ softmax, dropout)
    gemms = [o.flops for o in ops(GPT, "megatron-core", "fwd", attention="unfused") if o.op in ("attn_scores",
             "attn_context")]  # fmt: skip
    assert sum(gemms) == 2 * core.flops


def test_gpt_layer_megatron_deepspeed_kernels_by_hand():
    fwd = [o.op for o in ops(GPT, "megatron-deepspeed", "fwd")]
    assert fwd == [
        "attn_norm", "qkv_proj", "qkv_proj_bias", "attn_core", "attn_out_proj", "attn_out_bias",
        "attn_hidden_dropout", "attn_residual", "mlp_norm", "mlp_up_gate", "mlp_up_bias", "mlp_act", "mlp_down",
        "mlp_out_bias", "mlp_hidden_dropout", "mlp_residual",
    ]  # fmt: skip
    t = table(GPT, "megatron-deepspeed", "fwd")
    # Separate bias add over 16 x 256 (read, write), dropout (read, write, mask: 5 B), residual (6 B).
    assert t["mlp_up_bias"] == (16 * 256 * 4, 16 * 256, 1)
    assert t["attn_hidden_dropout"] == (16 * 64 * 5, 16 * 64 * 2, 1)
    assert t["attn_residual"] == (16 * 64 * 6, 16 * 64, 1)
    bwd = table(GPT, "megatron-deepspeed", "bwd")
    assert bwd["mlp_out_bias"] == (16 * 64 * 2, 16 * 64, 1)  # the gradient's reduction over tokens


def test_llama_layer_rope_and_swiglu_per_profile_by_hand():
    # q and k: 16 tokens x (4 + 4) heads x 16 = 2,048 elements. Fused RoPE reads and writes each (4 B);
    # unfused: 9 passes (36 B... x 2048 = 36,864 B) in 4 kernels per tensor, 8 in all.
    assert table(LLAMA, "megatron-core", "fwd")["rope"] == (2048 * 4, 3 * 2048, 1)
    assert table(LLAMA, "megatron-deepspeed", "fwd")["rope"] == (2048 * 9 * 2, 3 * 2048, 8)
    # SwiGLU on 16 x 128: fused reads gate and up, writes the product (3 x 2 B); unfused silu + multiply
    # moves 5 passes in 2 kernels; backward fused 5 passes, unfused 13 in 4 kernels.
    e = 16 * 128
    assert table(LLAMA, "megatron-core", "fwd")["mlp_act"] == (e * 6, e * 5, 1)
    assert table(LLAMA, "megatron-deepspeed", "fwd")["mlp_act"] == (e * 10, e * 5, 2)
    assert table(LLAMA, "megatron-core", "bwd")["mlp_act"] == (e * 10, e * 10, 1)
    assert table(LLAMA, "megatron-deepspeed", "bwd")["mlp_act"] == (e * 26, e * 10, 4)
    # No biases anywhere in a Llama layer, whatever the profile.
    assert not [n for fw in FRAMEWORK_NAMES for n in table(LLAMA, fw, "fwd") if n.endswith("_bias")]


def test_te_fp8_casts_transposes_and_scale_updates_by_hand():
    fwd = table(LLAMA, "megatron-core", "fwd", precision="fp8")
    # Cast-transpose of a Linear's input: read 2 B, write FP8 and its transpose (1 + 1 B).
    assert fwd["attn_out_proj_fp8_cast"][0] == 16 * 64 * 4 and fwd["mlp_down_fp8_cast"][0] == 16 * 128 * 4
    # QKV and MLP up/gate are LayerNormLinears: the norm writes their FP8 input (read 2 B, write 1 B) and
    # no cast runs; backward transposes the saved FP8 input for the weight gradient (read 1, write 1 B).
    assert "qkv_proj_fp8_cast" not in fwd and "mlp_up_gate_fp8_cast" not in fwd
    assert fwd["attn_norm"][0] == fwd["mlp_norm"][0] == 16 * 64 * 3
    assert table(LLAMA, "megatron-core", "fwd")["attn_norm"][0] == 16 * 64 * 4  # BF16: read 2, write 2
    # The amax/scale update is not a layer's: once per model chunk (te_amax_update, below).
    assert "fp8_scale_update" not in fwd
    bwd = table(LLAMA, "megatron-core", "bwd", precision="fp8")
    # Gradients of the outputs: QKV 16 x 192, MLP up/gate 16 x 256, projections 16 x 64.
    assert bwd["qkv_proj_fp8_cast"][0] == 16 * 192 * 4 and bwd["mlp_up_gate_fp8_cast"][0] == 16 * 256 * 4
    assert bwd["mlp_down_fp8_cast"][0] == bwd["attn_out_proj_fp8_cast"][0] == 16 * 64 * 4
    assert bwd["qkv_proj_fp8_transpose"] == bwd["mlp_up_gate_fp8_transpose"] == (16 * 64 * 2, 0, 1)
    # Megatron-DeepSpeed has no Transformer Engine: FP8 GEMMs without TE's casts.
    assert not [n for n in table(LLAMA, "megatron-deepspeed", "fwd", precision="fp8") if "fp8" in n]


def test_te_fp8_overhead_of_a_llama2_7b_layer_is_derived_from_bytes():
    # Issue 22: ~0.4 ms per layer per micro-batch on Llama-2 7B (H100, TP 1, one 4096-token sequence).
    # By hand, per element 4 B (read BF16, write FP8 and its transpose), at H100's measured 2,903 GB/s:
    # forward casts of the two Linears' inputs 4096 x (4096 + 11008) = 61.9 M elements (the LayerNormLinears'
    # are fused into their norms), backward 4096 x (4096 + 22016 + 4096 + 12288) = 174.1 M -> 943.7 MB; the
    # two LayerNormLinears' FP8 input transposes 2 x 4096 x 4096 x 2 B = 67.1 MB -> 348.2 us in all (401.7 us
    # before the norm-cast fusion and the per-chunk scale update, which took 8 launch floors per layer).
    m = preset("llama2-7b")
    c = Ctx(m, shard_of(m, 1, 0), 1, 4096, 2, False, "fp8", "flash", FRAMEWORKS["megatron-core"])
    h100 = catalog.gpu("H100")
    te = [o for p in ("fwd", "bwd") for o in layer_steps(c, p) if isinstance(o, Op) and "fp8_" in o.op]
    seconds = sum(op_seconds(o, h100, "calibrated") for o in te)
    elems = 4096 * (4096 + 11008) + 4096 * (4096 + 22016 + 4096 + 12288)
    transposed = 2 * 4096 * 4096 * 2
    assert seconds == pytest.approx((elems * 4 + transposed) / 2903e9, rel=1e-9)
    assert seconds == pytest.approx(348.2e-6, rel=1e-3)  # the "~0.4 ms"
    # The chunk's amax reduction and scale update per micro-batch and pass: 32 layers x 4 modules x 3 FP8
    # tensors = 384 forward; concatenation 384 x 8 B, update 384 x 4 x (1 + 2 x 1024 + 2) B = 3.15 MB
    # (1.09 us at 2,903 GB/s): both at the launch floor, 4 x 3.8 = 15.2 us per micro-batch for the whole
    # model, where a per-module update had cost 32 x 8 x 3.8 = 973 us.
    amax = [o for p in ("fwd", "bwd") for o in te_amax_update(c, p, 32)]
    assert [o.op for o in amax] == ["fp8_amax_concat", "fp8_scale_update"] * 2  # TP 1: no AllReduce
    assert (amax[0].bytes, amax[1].bytes) == (384 * 8, 384 * 4 * 2051)
    assert sum(op_seconds(o, h100, "calibrated") for o in amax) == pytest.approx(4 * LAUNCH_FLOOR_S)


def test_te_amax_reduction_once_per_chunk_and_micro_batch_in_generated_traces():
    # TP 2, PP 2 with 2 virtual stages (4 chunks of 1 layer), 2 micro-batches, FP8: per rank and micro-batch
    # each of its 2 chunks concatenates its amaxes, all-reduces them over the TP group (MAX; Megatron-Core's
    # amax reduction group is TP x CP) and updates the scales, after forward and after backward.
    spec = {"model": {**LLAMA, "layers": 4}, "precision": "fp8", "parallel": {"gpu": "H100", "tp": 2, "pp": 2,
            "dp": 1, "global_batch": 2, "micro_batch": 1, "virtual_stages": 2}}  # fmt: skip
    b = generate(load_spec(spec), rewrite=False)
    for rank in range(4):
        names = [n.name for n in b.nodes[rank]]
        upd = [x for x in names if ".fp8_scale_update." in x]
        assert len(upd) == 2 * 2 * 2 and len([x for x in names if ".fp8_amax_allreduce." in x]) == 8
        ar = [n for n in b.nodes[rank] if ".fp8_amax_allreduce.fwd" in n.name]
        # One chunk of one layer: 4 modules x 3 forward FP8 tensors x 4 B.
        assert {A.comm_size(n) for n in ar} == {4 * 3 * 4} and {b.comm_groups[A.pg_name(n)] for n in ar} == {
            (0, 1) if rank < 2 else (2, 3)
        }
        # Forward: right after the chunk's last layer (before anything of the next layer or the head).
        i = names.index(upd[0])
        assert (
            names[i - 2].split(".")[1] == "fp8_amax_concat"
            and names[i - 3].split(".")[1] == "mlp_bias_dropout_add"
        )
    # BF16: none of it.
    plain = generate(load_spec({**spec, "precision": "bf16"}), rewrite=False)
    assert not [n for n in plain.nodes[0] if "fp8" in n.name]


def test_loss_is_megatrons_fp32_cross_entropy_by_hand():
    m = model_from_mapping(GPT)
    c = Ctx(m, shard_of(m, 1, 0), 1, 16, 2, False)
    (fwd,) = [s for s in head_steps(c, "fwd") if isinstance(s, Op) and s.op == "loss"]
    (bwd,) = [s for s in head_steps(c, "bwd") if isinstance(s, Op) and s.op == "loss"]
    # 16 x 100 logits. Forward: cast (2 + 4), max (4), subtract (8), exp (8), sum (4), divide (8) = 38 B
    # in 6 kernels; backward: scale the softmax (8) and cast back (4 + 2) = 14 B in 2 kernels.
    assert (fwd.bytes, fwd.kernels) == (1600 * 38, 6) and (bwd.bytes, bwd.kernels) == (1600 * 14, 2)


def test_embedding_gather_dropout_and_backward_scatter_by_hand():
    # A profile whose embedding backward is the scatter-add alone (Framework.embedding_bwd ""); Megatron-
    # Core's zero fill and main_grad add: tests/test_mcore_grad_work.py.
    m = model_from_mapping(GPT)
    c = Ctx(m, shard_of(m, 1, 0), 1, 16, 2, False, fw=FRAMEWORKS["megatron-deepspeed"])
    fwd = {s.op: (s.bytes, s.kernels) for s in embedding_steps(c, "fwd") if isinstance(s, Op)}
    bwd = {s.op: (s.bytes, s.kernels) for s in embedding_steps(c, "bwd") if isinstance(s, Op)}
    # Gather: read and write 16 rows of 64 (2 x 2,048 B); the GPT model's learned positions: the lookup of
    # 16 rows (read, write: 4 B) and the add into the embedding (read 2, write 1: 6 B), 10 B x 1,024 in 2
    # kernels; dropout: read, write, mask (5 B x 1,024).
    assert fwd == {
        "embedding": (16 * 64 * 4, 1), "position_embedding": (16 * 64 * 10, 2), "embedding_dropout": (16 * 64 * 5, 1),
    }  # fmt: skip
    # Backward: dropout of the gradient (5 B), scatter-add: read the gradient, read and write the row (6 B);
    # the position table's: read the 1,024-element gradient (2,048 B), read and write the 16 x 64 table
    # (4,096 B); the add's backward passes the gradient through (no kernel).
    assert bwd == {
        "embedding_dropout": (16 * 64 * 5, 1), "position_embedding": (2_048 + 4_096, 1), "embedding": (16 * 64 * 6, 1),
    }  # fmt: skip
    # A model without a position table (RoPE: the Llama family's default) has neither node.
    rope = model_from_mapping({**GPT, "position_embedding": "rope"})
    c = Ctx(rope, shard_of(rope, 1, 0), 1, 16, 2, False)
    assert "position_embedding" not in {s.op for s in embedding_steps(c, "fwd")}


# -- the optimizer step ---------------------------------------------------------------------------------------
def test_optimizer_step_bytes_by_hand():
    # 1,000 parameters, shard 250 (distributed optimizer, DP 4), FP32 gradients, BF16 weights.
    step = optimizer_steps(1000, 250, 2, 4)
    names = [s.op for s in (*step.before, *step.after)]
    assert names == ["grad_norm", "grad_norm_allreduce", "grad_clip", "optimizer", "param_copy", "zero_grad"]
    size = {s.op: getattr(s, "bytes", getattr(s, "size", None)) for s in (*step.before, *step.after)}
    # norm reads 250 x 4; one FP32 all-reduced; clip reads and writes 250 x 4; Adam: grad 4 + master, m,
    # v read and written 24 = 28 per parameter; copy reads FP32 writes BF16 (6); zeroing the whole buffer.
    assert size == {"grad_norm": 1000, "grad_norm_allreduce": 4, "grad_clip": 2000, "optimizer": 7000,
                    "param_copy": 1500, "zero_grad": 4000}  # fmt: skip
    # FP16: unscale and inf check (read, write 2 B gradients) and its flag's AllReduce come first.
    f16 = optimizer_steps(1000, 1000, 2, 2, "fp16")
    assert [s.op for s in f16.before] == [
        "grad_unscale",
        "found_inf_allreduce",
        "grad_norm",
        "grad_norm_allreduce",
    ]
    assert f16.before[0].bytes == 1000 * 4 and f16.before[1].size == 4
    # FP8: TE re-casts the updated linear weights once per iteration (read 2, write FP8 + transpose).
    f8 = optimizer_steps(1000, 1000, 2, 2, "fp8", fp8_params=800)
    assert [o.bytes for o in f8.after if o.op == "fp8_weight_cast"] == [800 * 4]


def test_grad_norm_allreduce_group_and_chain_in_generated_traces():
    # TP 2 x PP 2 x DP 2, FP16, no distributed optimizer: Megatron reduces the norm (and the found-inf flag)
    # over each replica's model-parallel ranks, TP x PP = 4 ranks, one FP32 each.
    spec = {"model": {**LLAMA, "layers": 2}, "precision": "fp16",
            "parallel": {"gpu": "H100", "tp": 2, "pp": 2, "dp": 2, "global_batch": 4}}  # fmt: skip
    b = generate(load_spec(spec), rewrite=False)
    for rank in range(8):
        coll = [n for n in b.nodes[rank] if A.get_str(n, A.PHASE) == "opt" and n.type == pb.COMM_COLL_NODE]
        assert [n.name for n in coll] == ["found_inf_allreduce.opt", "grad_norm_allreduce.opt"]
        replica = tuple(range(4)) if rank < 4 else tuple(range(4, 8))  # rank = t + 2 (s + 2 d)
        assert {b.comm_groups[A.pg_name(n)] for n in coll} == {replica}
        assert {A.comm_size(n) for n in coll} == {4}
        opt = [n.name for n in b.nodes[rank] if A.get_str(n, A.PHASE) == "opt"]
        assert opt == ["grad_unscale.opt", "found_inf_allreduce.opt", "grad_norm.opt", "grad_norm_allreduce.opt",
                       "grad_clip.opt", "optimizer.opt", "param_copy.opt", "zero_grad.opt"]  # fmt: skip
    # Same with the distributed optimizer: the group is every rank (DP ranks hold disjoint shards).
    b = generate(load_spec({**spec, "distributed_optimizer": True}), rewrite=False)
    (norm,) = [n for n in b.nodes[5] if n.name == "grad_norm_allreduce.opt"]
    assert b.comm_groups[A.pg_name(norm)] == tuple(range(8))


# -- sustained rates ------------------------------------------------------------------------------------------
def test_sustained_rates_are_the_burst_rates_at_the_power_limited_clock():
    assert SUSTAINED_CLOCK_RATIO == 1305 / 1410  # NVIDIA's A100 HPL clock at the power limit / boost clock
    # Hopper and Blackwell: MSMF / MAMF of one mamf-finder run (ml-engineering commit 082816f): H200 BF16
    # 708.5 / 841.9, FP8 1288.7 / 1491.9 (the H100's GH100 die at the same 700 W); B200 1456.3 / 1770.9 and
    # 2795.7 / 3435.2. Every other GPU with a burst plateau (A100) keeps the HPL clock ratio.
    # The GB200 has burst points of its own (round b200cal) and the B200's ratios (its calibration GPU).
    ratios = {"H100": (708.5 / 841.9, 1288.7 / 1491.9), "H200": (708.5 / 841.9, 1288.7 / 1491.9),
              "B200": (1456.3 / 1770.9, 2795.7 / 3435.2), "GB200": (1456.3 / 1770.9, 2795.7 / 3435.2)}  # fmt: skip
    for (gpu, dtype), burst in BURST_PLATEAUS.items():
        spec = catalog.gpu(gpu)
        assert plateau(spec, dtype, "burst") == burst
        bf16, fp8 = ratios.get(gpu, (1305 / 1410, 1305 / 1410))
        assert plateau(spec, dtype) == pytest.approx(burst * (fp8 if dtype == "fp8" else bf16))
    # H100 FP8: its own MAMF row (1,402.6 of 1,979 TFLOP/s), not H200's 1,453.4.
    assert BURST_PLATEAUS[("H100", "fp8")] == 1402.6 / 1979 != BURST_PLATEAUS[("H200", "fp8")]
    # A100 BF16 sustained: 267.9 x 1305 / 1410 = 248.0 TFLOP/s at a full-wave shape.
    assert plateau(catalog.gpu("A100-80GB"), "bf16") * 312 == pytest.approx(247.95, abs=0.01)
    # H100 BF16 sustained: 792.1 (a full-wave shape: M 6144, K 17920, N 2816) x 708.5 / 841.9 = 666.6
    # TFLOP/s, 0.674 of 989.4.
    assert plateau(catalog.gpu("H100"), "bf16") * 989.4 == pytest.approx(666.6, abs=0.1)
    # fp16 runs at the bf16 rate and ratio; a GPU borrowing H100's calibration borrows its ratio too.
    assert plateau(catalog.gpu("H100"), "fp16") == plateau(catalog.gpu("H100"), "bf16")
    with pytest.raises(catalog.CatalogError, match="gemm_rates"):
        plateau(catalog.gpu("H100"), "bf16", "peak")


def test_memory_bound_kernels_at_published_copy_bandwidths():
    assert achieved_bandwidth(catalog.gpu("H100")) == pytest.approx(2903e9)
    assert achieved_bandwidth(catalog.gpu("A100-40GB")) == pytest.approx(1355e9)
    assert achieved_bandwidth(catalog.gpu("A100-80GB")) == pytest.approx(2039e9 * 1727.486 / 1935)
    # B200 (round mxfp8): CUB's DeviceTransform add, 1,610,612,736 B in 239.643 us (NVIDIA/cccl pull 7391)
    assert achieved_bandwidth(catalog.gpu("B200")) == pytest.approx(6_720.88e9, rel=1e-6)
    # No published measurement: the catalog's rule-of-thumb 0.80; a `gpus:` mem_eff override wins.
    assert (
        "V100" not in MEASURED_MEM_EFF
        and achieved_bandwidth(catalog.gpu("V100")) == catalog.gpu("V100").mem_bw * 0.80
    )
    over = catalog.with_overrides(catalog.gpu("H100"), {"mem_eff": 0.5})
    assert achieved_bandwidth(over) == 3.35e12 * 0.5


# -- spec keys ------------------------------------------------------------------------------------------------
def test_framework_and_gemm_rates_keys_defaults_and_overrides():
    assert set(choices.FRAMEWORKS) == set(FRAMEWORK_NAMES) and choices.FRAMEWORKS[0] == DEFAULT_FRAMEWORK
    assert choices.GEMM_RATES == GEMM_RATES
    base = {"model": {**GPT, "layers": 1}, "device_groups": [{"gpu": "A100-80GB", "ranks": [0]}]}
    dep = load_spec(base)
    assert (dep.framework, dep.attention, dep.gemm_rates) == ("megatron-core", "flash", "sustained")
    old = load_spec({**base, "framework": "megatron-2021"})
    assert old.attention == "unfused"  # the profile's attention ...
    assert (
        load_spec({**base, "framework": "megatron-2021", "attention": "flash"}).attention == "flash"
    )  # ... or the key
    again = load_spec(spec_to_mapping(old))
    assert again == old
    with pytest.raises(SpecError, match="framework must be one of"):
        load_spec({**base, "framework": "deepspeed"})
    with pytest.raises(SpecError, match="gemm_rates must be one of"):
        load_spec({**base, "gemm_rates": "peak"})
    # The profile reaches the traces: megatron-2021 has the QKV bias kernel, megatron-core does not.
    names = {n.name.split(".")[1] for n in generate(old, rewrite=False).nodes[0] if n.name.startswith("L1.")}
    assert "qkv_proj_bias" in names and "attn_scores" in names
    # Burst rates give shorter GEMMs than sustained, by the clock ratio: Llama-2 7B's QKV on A100,
    # 2048 x 4096 x 12288 (compute-bound, same tiles and waves in both).
    big = {**base, "model": {"base": "llama2-7b", "layers": 1}, "seq_len": 2048}
    qkv = {}
    for rates in GEMM_RATES:
        nodes = generate(load_spec({**big, "gemm_rates": rates}), rewrite=False).nodes[0]
        qkv[rates] = next(A.get_int(n, A.DURATION_NS) for n in nodes if n.name == "L1.qkv_proj.fwd.mb0")
    assert qkv["sustained"] / qkv["burst"] == pytest.approx(1410 / 1305, rel=1e-5)


def test_optimizer_step_waits_for_the_stage_sends_so_one_comm_slot_cannot_deadlock(tmp_path):
    # Two stages, H100 TP 2 -> A100 TP 1, rewritten (xsim resharding). The last stage's optimizer step opens
    # with the grad-norm AllReduce over the whole pipeline (TP x PP), which stage 0 joins only after the
    # last backward send reached it. Under one communication op at a time per rank (ASTRA-sim's rule,
    # comm_streams="shared") the AllReduce, taken before that send, deadlocked the replay; Megatron's
    # schedule waits for its sends before the step, and so does the step's first node.
    import dataclasses

    from xsim.replay import simulate

    from xsim import api
    from xsim.api.replaying import replay_config

    spec = {
        "name": "pair",
        "model": {"base": "llama2-7b", "layers": 4},
        "seq_len": 256,
        "micro_batches": 2,
        "allow_uneven_tp": True,
        "device_groups": [
            {"id": 0, "gpu": "H100", "ranks": [0, 1], "layers": [1, 2], "pp_stage": 0},
            {"id": 1, "gpu": "A100", "ranks": [2], "layers": [3, 4], "pp_stage": 1},
        ],
    }
    nodes = generate(load_spec(spec)).nodes[2]  # rewritten, as `xsim gen` writes it
    last = {n.id: n for n in nodes}
    first_opt = next(n for n in nodes if A.get_str(n, A.PHASE) == "opt")
    sends = {d for d in first_opt.data_deps if last[d].type == pb.COMM_SEND_NODE}
    assert sends, "the step's first node waits for the stage's last sends"
    api.generate(spec, api.GenerateOptions(out=str(tmp_path)))
    ts = api.load_trace_set(str(tmp_path))
    options = api.ReplayOptions()
    config = dataclasses.replace(replay_config(options), comm_streams="shared")
    result = simulate(
        ts,
        network=api.build_network(options.network, api.load_deployment(ts), ranks=ts.num_ranks),
        compute=api.build_compute(options.compute, ts.num_ranks),
        config=config,
    )
    assert result.summary_dict()["iteration_time_ns"] > 0


# -- DeepSpeed's BF16_Optimizer: FP32 gradient copy after every micro-batch ---------------------------------
def test_deepspeed_bf16_gradient_copy_per_micro_batch_by_hand():
    # GPT-tiny (h 64, FFN 256, vocab 100, LayerNorm, biases), PP 2, 3 micro-batches, bf16, megatron-deepspeed.
    # Stage 0: embedding 100 x 64 = 6,400 + learned positions 16 x 64 = 1,024 + one layer: QKV 64 x 192 + 192,
    # out 64 x 64 + 64, up 64 x 256 + 256, down 256 x 64 + 64, two LayerNorms 2 x 128 = 12,288 + 192 + 4,096 +
    # 64 + 16,384 + 256 + 16,384 + 64 + 256 = 49,984; 57,408 parameters in 2 + 4 + 4 + 2 x 2 = 14 tensors. Stage 1: the layer + final LayerNorm
    # (128) + head 6,400 = 56,512 in 12 + 2 + 1 = 15 tensors. 18 bytes per parameter, 2 kernels per tensor.
    spec = {"model": {**GPT}, "framework": "megatron-deepspeed", "precision": "bf16", "make_vocab_size_divisible_by": 0,
            "parallel": {"gpu": "A100-80GB", "tp": 1, "pp": 2, "dp": 1, "micro_batch": 1, "global_batch": 3}}  # fmt: skip
    b = generate(load_spec(spec), rewrite=False)
    for rank, params, tensors in ((0, 57_408, 14), (1, 56_512, 15)):
        acc = [n for n in b.nodes[rank] if n.name.startswith("grad_accum_fp32")]
        assert len(acc) == 3  # one per micro-batch
        assert {A.get_int(n, A.NUM_OPS) for n in acc} == {params}
        assert {A.get_int(n, A.TENSOR_SIZE) for n in acc} == {18 * params}
        # Memory-bound at the A100 80GB's measured copy bandwidth, or 2 launch floors per tensor if longer.
        want = max(18 * params / (2039e9 * 1727.486 / 1935), 2 * tensors * 3.8e-6)
        assert {A.get_int(n, A.DURATION_NS) for n in acc} == {int(want * 1e9 + 0.5)}
    # Megatron-Core accumulates FP32 main gradients in the weight-gradient GEMM: no such node; nor under FP16.
    for other in ({**spec, "framework": "megatron-core"}, {**spec, "precision": "fp16"}):
        b = generate(load_spec(other), rewrite=False)
        assert not [n for r in b.nodes.values() for n in r if n.name.startswith("grad_accum_fp32")]


def test_megatron_deepspeed_unfused_attention_by_hand():
    # Both Megatron-DeepSpeed forks (bigscience affff3d2, microsoft f4157bea69) run Megatron-LM 2021's unfused
    # attention: GPTModelPipe's causal mask type takes ScaledUpperTriangMaskedSoftmax (s <= 4096), so as in the
    # test above forward 2 x (544 + 1,024) = 3,136 B and backward 2 x (2 x 544 + 1,024) = 4,224 B (whole rows
    # before: 4,096 and 6,144); the context's permute(2, 0, 1, 3).contiguous() copies q = 16 x 4 x 16 = 1,024
    # elements (read, write: 2 x 2 x 1,024 = 4,096 B) and the Q/K/V split's backward cats q + 2 kv = 3,072
    # elements (2 x 2 x 3,072 = 12,288 B). The flash path (the profile's default) has none of them.
    fwd = table(GPT, "megatron-deepspeed", "fwd", attention="unfused")
    bwd = table(GPT, "megatron-deepspeed", "bwd", attention="unfused")
    assert fwd["attn_softmax"][0] == 3_136 and bwd["attn_softmax"][0] == 4_224
    assert fwd["attn_context_permute"] == (4_096, 0, 1)
    assert bwd["qkv_grad_cat"] == (12_288, 0, 1)
    flash = table(GPT, "megatron-deepspeed", "fwd")
    assert "attn_context_permute" not in flash and "attn_softmax" not in flash
