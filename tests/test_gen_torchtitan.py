"""Issue 22: the `torchtitan` profile, a Llama layer as eager PyTorch launches it (tracegen/frameworks.py).

Every expected number is worked out by hand in the comments (BF16: 2 bytes), not read back from the code.
"""

from __future__ import annotations

import pytest
from xsim.tracegen import catalog
from xsim.tracegen.frameworks import FRAMEWORKS
from xsim.tracegen.gemm import achieved_bandwidth
from xsim.tracegen.models import model_from_mapping
from xsim.tracegen.ops import Ctx, Op, embedding_steps, head_steps, layer_steps, op_seconds, shard_of

# Llama-style tiny model: h 64, 4 heads (and 4 KV heads) of 16, FFN 128 (gate + up 256), 16 tokens.
LLAMA = {"name": "llama-tiny", "layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 4,
         "vocab": 100, "seq_len": 16, "activation": "swiglu", "norm": "rmsnorm", "linear_bias": False}  # fmt: skip
# Llama 3.1 8B (Meta's config: 32 layers, h 4096, FFN 14336, 32 heads, 8 KV heads, vocab 128256), seq 8192.
LLAMA3_8B = {"name": "llama3-8b", "layers": 32, "hidden": 4096, "ffn_hidden": 14336, "heads": 32, "kv_heads": 8,
             "vocab": 128256, "seq_len": 8192, "activation": "swiglu", "norm": "rmsnorm",
             "linear_bias": False}  # fmt: skip


def ctx(model: dict, fw: str, s: int) -> Ctx:
    m = model_from_mapping(model)
    f = FRAMEWORKS[fw]
    return Ctx(m, shard_of(m, 1, 0), 1, s, 2, False, "bf16", f.attention, f)


def ops(model: dict, fw: str, phase: str, s: int = 16) -> list[Op]:
    return [o for o in layer_steps(ctx(model, fw, s), phase) if isinstance(o, Op)]


def test_torchtitan_llama_layer_kernels_and_bytes_by_hand():
    # Norms on 16 x 64 = 1,024 elements. Forward: to FP32 (2 + 4), pow (8), mean (4), add_ and rsqrt (per
    # token), mul by rsqrt (8), mul by the weight in FP32 (8), type_as (4 + 2) = 36 B in 8 kernels.
    # Backward: cast to FP32 (6), weight mul's input gradient (8) and weight gradient (12 + 4, 3 kernels
    # with the per-row cast), rsqrt mul's input gradient (8) and rsqrt gradient (12 + 4, 2 kernels), rsqrt
    # (3 per-token kernels), mean (4), pow (8 + 8 + 12, 3 kernels), the sum (12), cast back (6) = 104 B,
    # 17 kernels.
    # RoPE on q and k, 16 x (4 + 4) x 16 = 2,048 elements: .float() (6), complex multiply (8), type_as (6)
    # = 20 B per element in 3 kernels a tensor, 6 in all, both directions.
    # Residual adds: read 2, write 1 (6 B x 1,024), no dropout; SwiGLU F.silu(w1) * w3 on 16 x 128 = 2,048:
    # 5 passes (10 B) in 2 kernels forward, 13 passes (26 B) in 4 backward.
    fwd = [(o.op, o.bytes, o.kernels) for o in ops(LLAMA, "torchtitan", "fwd") if not o.gemm]
    assert fwd == [
        ("attn_norm", 36 * 1024, 8), ("rope", 20 * 2048, 6), ("attn_residual", 6 * 1024, 1),
        ("mlp_norm", 36 * 1024, 8), ("mlp_act", 10 * 2048, 2), ("mlp_residual", 6 * 1024, 1),
    ]  # fmt: skip
    bwd = [(o.op, o.bytes, o.kernels) for o in ops(LLAMA, "torchtitan", "bwd") if not o.gemm]
    assert bwd == [
        ("mlp_act", 26 * 2048, 4), ("mlp_norm", 104 * 1024, 17), ("mlp_residual", 6 * 1024, 1),
        ("rope", 20 * 2048, 6), ("attn_norm", 104 * 1024, 17), ("attn_residual", 6 * 1024, 1),
    ]  # fmt: skip
    # The GEMMs and the flash attention core are those of megatron-core; attention is FlashAttention-2 (SDPA).
    names = [o.op for o in ops(LLAMA, "torchtitan", "fwd")]
    assert names == [
        "attn_norm", "qkv_proj", "rope", "attn_core", "attn_out_proj", "attn_residual",
        "mlp_norm", "mlp_up_gate", "mlp_act", "mlp_down", "mlp_residual",
    ]  # fmt: skip
    gemm = {o.op: (o.flops, o.bytes) for o in ops(LLAMA, "megatron-core", "fwd") if o.gemm}
    assert {o.op: (o.flops, o.bytes) for o in ops(LLAMA, "torchtitan", "fwd") if o.gemm} == gemm
    assert {o.kernel for o in ops(LLAMA, "torchtitan", "bwd") if o.op == "attn_core"} == {"fa2"}


def test_torchtitan_final_norm_and_no_embedding_dropout_by_hand():
    c = ctx(LLAMA, "torchtitan", 16)
    fwd = {o.op: (o.bytes, o.kernels) for o in head_steps(c, "fwd") if isinstance(o, Op)}
    bwd = {o.op: (o.bytes, o.kernels) for o in head_steps(c, "bwd") if isinstance(o, Op)}
    # The final nn.RMSNorm on 1,024 elements: 36 B in 8 kernels forward, 104 B in 17 backward (as above).
    assert fwd["final_norm"] == (36 * 1024, 8) and bwd["final_norm"] == (104 * 1024, 17)
    # torchtitan's Llama has no dropout: the embedding is the gather alone (read, write 16 x 64 x 2 B).
    assert [(o.op, o.bytes) for o in embedding_steps(c, "fwd") if isinstance(o, Op)] == [("embedding", 4096)]
    assert [o.op for o in embedding_steps(c, "bwd") if isinstance(o, Op)] == ["embedding"]


def layer_seconds(fw: str, gpu: str, skip: frozenset[str] = frozenset()) -> float:
    g = catalog.gpu(gpu)
    return sum(
        op_seconds(o, g, "calibrated")
        for ph in ("fwd", "bwd")
        for o in ops(LLAMA3_8B, fw, ph, 8192)
        if o.op not in skip
    )


def test_llama3_8b_layer_is_slower_by_the_extra_bytes_at_the_copy_bandwidth():
    # Per layer, one 8,192-token sequence, T.h = 33,554,432, T.ffn = 117,440,512, q and k T x 40 x 128 =
    # 41,943,040 elements; bytes per element torchtitan - megatron-core:
    #   forward: two norms (36 - 4) x T.h x 2 = 2,147,483,648; RoPE (20 - 4) = 671,088,640; residual add
    #   (6) vs bias-dropout-add (7), x 2 = -67,108,864; SwiGLU (10 - 6) = 469,762,048 -> 3,221,225,472;
    #   backward: norms (104 - 6) x 2 = 6,576,668,672; RoPE 671,088,640; no dropout backward (0 - 5) x 2 =
    #   -335,544,320; SwiGLU (26 - 10) = 1,879,048,192 -> 8,791,261,184.
    extra = 3_221_225_472 + 8_791_261_184
    elem = {fw: sum(o.bytes for ph in ("fwd", "bwd") for o in ops(LLAMA3_8B, fw, ph, 8192) if not o.gemm)
            for fw in ("torchtitan", "megatron-core")}  # fmt: skip
    assert elem["torchtitan"] - elem["megatron-core"] == extra
    # Every element-wise kernel here is bandwidth-bound (far above the launch floor), the GEMMs are the same
    # and on the A100 both profiles run FlashAttention-2: the whole layer is slower by exactly extra / bw.
    a100 = achieved_bandwidth(catalog.gpu("A100-80GB"))
    diff = layer_seconds("torchtitan", "A100-80GB") - layer_seconds("megatron-core", "A100-80GB")
    assert diff == pytest.approx(extra / a100, rel=1e-9)
    # On the H100 the attention kernels differ (FA2 under SDPA, cuDNN under Transformer Engine); the rest
    # of the layer is slower by extra / 2,903 GB/s = 4.138 ms.
    h100 = achieved_bandwidth(catalog.gpu("H100"))
    core = frozenset({"attn_core"})
    diff = layer_seconds("torchtitan", "H100", core) - layer_seconds("megatron-core", "H100", core)
    assert diff == pytest.approx(extra / h100, rel=1e-9) and diff == pytest.approx(4.1379e-3, rel=1e-4)
