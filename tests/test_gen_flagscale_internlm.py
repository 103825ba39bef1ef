"""Issue 22: the `flagscale-2023` and `internlm` profiles and the `dropout` key (tracegen/frameworks.py).

The kernels of FlagScale ed55532's legacy Megatron-LM layer (FlagPerf's Aquila2-7B case) and InternLM
4a3d156's layer, each element-wise byte worked out by hand in the comments (BF16: 2 bytes, T = 16 tokens,
h 64, 4 heads of 16, FFN 128), not read back from the code.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from xsim.tracegen import load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.frameworks import FRAMEWORKS
from xsim.tracegen.models import model_from_mapping
from xsim.tracegen.ops import Ctx, Op, head_steps, layer_steps, shard_of
from xsim.tracegen.spec import spec_to_mapping
from xsim.tracegen.workload import generate
from xsim.traces import attrs as A
from xsim.traces import pb

# Llama-style tiny model: h 64, 4 heads (and 4 KV heads) of 16, FFN 128 (gate + up 256), vocab 100, 16 tokens.
LLAMA = {"name": "llama-tiny", "layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 4,
         "vocab": 100, "seq_len": 16, "activation": "swiglu", "norm": "rmsnorm", "linear_bias": False}  # fmt: skip


def ctx(fw: str, mb: int = 1, dropout: bool | None = None) -> Ctx:
    m = model_from_mapping(LLAMA)
    f = FRAMEWORKS[fw] if dropout is None else replace(FRAMEWORKS[fw], dropout=dropout)
    return Ctx(m, shard_of(m, 1, 0), mb, 16, 2, False, "bf16", f.attention, f)


def elementwise(c: Ctx, phase: str) -> list[tuple[str, int, int]]:
    return [(o.op, o.bytes, o.kernels) for o in layer_steps(c, phase) if isinstance(o, Op) and not o.gemm]


def test_flagscale_2023_layer_kernels_and_bytes_by_hand():
    # As FlagPerf runs it (--hidden-dropout 0.0: `dropout: false`). Norms (apex fused RMSNorm) on 16 x 64 =
    # 1,024 elements: read 2 + write 2 = 4 B forward, read 2 x 2 + write 2 = 6 B backward, one kernel.
    # RoPE on q and k, 16 x (4 + 4) x 16 = 2,048 elements: the chain's 9 passes + the cat's 2 = 11 passes
    # (22 B) in 2 x (4 + 1) = 10 kernels forward; 9 + 7 (slice_backward's zeros and copy, the empty part's
    # zeros, their sum) = 16 passes (32 B) in 2 x (4 + 4) = 16 kernels backward.
    # q, k, v (16 x 64 = 1,024 elements each): q copied once, k and v twice (repeat_interleave's
    # index_select, then the [b, s] copy): 1,024 + 4 x 1,024 = 5,120 elements read and written = 20,480 B
    # in 5 kernels; backward index_select's zeros + index_add_ on k and v (4 passes each: 8 x 1,024) and the
    # split's cat (read, write 3 x 1,024: 6 x 1,024) = 14 x 1,024 x 2 B = 28,672 B in 2 x 2 + 1 = 5 kernels.
    # One sequence: no context copy. Residual adds: read 2, write 1 = 6 B x 1,024. SwiGLU F.silu(x[0]) * x[1] on 16 x 128 = 2,048:
    # 5 passes (20,480 B) in 2 kernels forward, 13 passes with the chunk's cat (53,248 B) in 4 backward.
    c = ctx("flagscale-2023", dropout=False)
    assert elementwise(c, "fwd") == [
        ("attn_norm", 4096, 1), ("rope", 22 * 2048, 10), ("attn_qkv_copy", 20480, 5), ("attn_residual", 6144, 1),
        ("mlp_norm", 4096, 1), ("mlp_act", 20480, 2), ("mlp_residual", 6144, 1),
    ]  # fmt: skip
    assert elementwise(c, "bwd") == [
        ("mlp_act", 53248, 4), ("mlp_norm", 6144, 1), ("mlp_residual", 6144, 1), ("attn_qkv_copy", 28672, 5),
        ("rope", 32 * 2048, 16), ("attn_norm", 6144, 1), ("attn_residual", 6144, 1),
    ]  # fmt: skip
    # Two sequences per micro-batch: the context (2 x 1,024 elements) is copied back to [s, b, h] too:
    # read + write 2,048 x 2 B = 8,192 B, after the attention core.
    c2 = ctx("flagscale-2023", mb=2, dropout=False)
    names = [
        (o.op, o.bytes)
        for o in layer_steps(c2, "fwd")
        if isinstance(o, Op) and not o.gemm or o.op == "attn_core"
    ]
    i = [n for n, _ in names].index("attn_core")
    assert names[i - 1] == ("attn_qkv_copy", 2 * 20480) and names[i + 1] == ("attn_context_permute", 8192)
    # FlashAttention-2, no Transformer Engine, the GEMMs of megatron-core.
    assert {o.kernel for o in layer_steps(c, "fwd") if isinstance(o, Op) and o.op == "attn_core"} == {"fa2"}
    gemm = {
        o.op: (o.flops, o.bytes)
        for o in layer_steps(ctx("megatron-core"), "fwd")
        if isinstance(o, Op) and o.gemm
    }
    assert {o.op: (o.flops, o.bytes) for o in layer_steps(c, "fwd") if isinstance(o, Op) and o.gemm} == gemm


def test_internlm_layer_and_head_kernels_and_bytes_by_hand():
    # Norms on the FP32 copy of the residual (1,024 elements): forward the cast (2 + 4) and the norm (read 4,
    # write 2) = 12 B in 2 kernels; backward the norm (read 2 + 4, write 4) and the cast back (4 + 2) = 16 B
    # in 2 kernels. RoPE: flash-attn's rotary kernel in place on q and k, 2,048 elements read and written =
    # 8,192 B, one kernel each way. No dropout: residual adds 6 B x 1,024. SwiGLU from two GEMMs (w1, w2):
    # 5 passes (20,480 B) in 2 kernels forward, 9 passes (36,864 B) in 3 backward (no concatenation).
    c = ctx("internlm")
    assert elementwise(c, "fwd") == [
        ("attn_norm", 12288, 2), ("rope", 8192, 1), ("attn_residual", 6144, 1),
        ("mlp_norm", 12288, 2), ("mlp_act", 20480, 2), ("mlp_residual", 6144, 1),
    ]  # fmt: skip
    assert elementwise(c, "bwd") == [
        ("mlp_act", 36864, 3), ("mlp_norm", 16384, 2), ("mlp_residual", 6144, 1),
        ("rope", 8192, 1), ("attn_norm", 16384, 2), ("attn_residual", 6144, 1),
    ]  # fmt: skip
    # Loss: flash-attn's CrossEntropyLoss on the BF16 logits, 16 x 100 = 1,600: forward reads each row twice
    # (2 x 2 B), backward reads the logits and writes the gradient in place (2 + 2 B): 6,400 B, one kernel
    # each (Megatron's FP32 cross-entropy would move (2 + 36) x 1,600 = 60,800 B in 6 kernels forward).
    fwd = {o.op: (o.bytes, o.kernels) for o in head_steps(c, "fwd") if isinstance(o, Op)}
    bwd = {o.op: (o.bytes, o.kernels) for o in head_steps(c, "bwd") if isinstance(o, Op)}
    assert fwd["loss"] == (6400, 1) and bwd["loss"] == (6400, 1)
    assert fwd["final_norm"] == (12288, 2) and bwd["final_norm"] == (16384, 2)
    mc = {o.op: (o.bytes, o.kernels) for o in head_steps(ctx("megatron-core"), "fwd") if isinstance(o, Op)}
    assert mc["loss"] == (60800, 6)


def test_internlm_autograd_gradient_accumulation_in_generated_traces():
    # One rank (TP 1, PP 1, DP 1), 3 micro-batches. Parameters: embedding 100 x 64 = 6,400; per layer QKV
    # 64 x 192 = 12,288, out 64 x 64 = 4,096, gate + up 64 x 256 = 16,384, down 128 x 64 = 8,192, two
    # RMSNorm gains 128 = 41,088, two layers 82,176; final norm 64; untied head 6,400: 95,040 in 1 + 2 x 6 +
    # 2 = 15 tensors. From the second micro-batch on autograd adds each gradient into .grad: read 2 x 2 B,
    # write 2 B = 6 B a parameter = 570,240 B, 2 nodes (micro-batches 1 and 2).
    spec = {"model": LLAMA, "framework": "internlm", "precision": "bf16",
            "make_vocab_size_divisible_by": 0,  # the toy vocabulary as given
            "parallel": {"gpu": "A100-80GB", "tp": 1, "pp": 1, "dp": 1, "micro_batch": 1, "global_batch": 3}}  # fmt: skip
    b = generate(load_spec(spec), rewrite=False)
    acc = [n for n in b.nodes[0] if n.name.startswith("grad_accum.")]
    assert [n.name for n in acc] == ["grad_accum.bwd.mb1", "grad_accum.bwd.mb2"]
    assert {(A.get_int(n, A.NUM_OPS), A.get_int(n, A.TENSOR_SIZE)) for n in acc} == {(95_040, 570_240)}
    # zero_grad(set_to_none=True): no zeroing kernel after the step.
    assert not [n for n in b.nodes[0] if n.name.startswith("zero_grad")]
    # Megatron-Core accumulates in the weight-gradient GEMM and zeroes its FP32 buffer: 4 B x 95,040.
    b = generate(load_spec({**spec, "framework": "megatron-core"}), rewrite=False)
    assert not [n for n in b.nodes[0] if n.name.startswith("grad_accum.")]
    zero = [n for n in b.nodes[0] if n.name.startswith("zero_grad")]
    assert [A.get_int(n, A.TENSOR_SIZE) for n in zero] == [4 * 95_040]


def test_dropout_key_overrides_the_profile_and_round_trips():
    # Megatron-Core's fused bias-dropout-add with p = 0: the residual add alone forward (read 2, write 1 =
    # 6 B x 1,024), nothing backward; no embedding dropout. With dropout (the profile's default): the fused
    # kernel reads 2, writes 1 and a 1-byte mask = 7 B x 1,024 forward.
    off = {o[0]: o[1] for o in elementwise(ctx("megatron-core", dropout=False), "fwd")}
    on = {o[0]: o[1] for o in elementwise(ctx("megatron-core"), "fwd")}
    assert off["attn_bias_dropout_add"] == 6144 and on["attn_bias_dropout_add"] == 7168
    assert "attn_bias_dropout_add" not in {
        o[0] for o in elementwise(ctx("megatron-core", dropout=False), "bwd")
    }
    spec = {"model": LLAMA, "precision": "bf16", "dropout": False,
            "parallel": {"gpu": "A100-80GB", "tp": 1, "pp": 1, "dp": 1, "micro_batch": 1, "global_batch": 1}}  # fmt: skip
    dep = load_spec(spec)
    assert dep.dropout == "off" and spec_to_mapping(dep)["dropout"] is False
    assert load_spec({**spec, "dropout": True}).dropout == "on"
    assert load_spec({k: v for k, v in spec.items() if k != "dropout"}).dropout == ""
    names = {n.name.split(".")[0] for n in generate(dep, rewrite=False).nodes[0]}
    assert "embedding_dropout" not in names
    with pytest.raises(SpecError, match="dropout must be true or false"):
        load_spec({**spec, "dropout": "0.1"})


def test_internlm_hybrid_zero_all_reduces_whole_buckets_in_generated_traces():
    # DP 2 under the sharded optimizer: InternLM all-reduces each BF16 bucket whole (reduce_rank None), where
    # Megatron-Core reduce-scatters it. One bucket (no overlap) of the rank's 95,040 parameters (as above)
    # x 2 B = 190,080 B all-reduced, unpadded; Megatron-Core's bucket padded to a multiple of lcm(DP, 128) =
    # 128: 743 x 128 = 95,104 elements x 2 B = 190,208 B, reduce-scattered.
    spec = {"model": LLAMA, "framework": "internlm", "precision": "bf16", "distributed_optimizer": True,
            "grad_reduce_dtype": "bf16",
            "make_vocab_size_divisible_by": 0,  # the toy vocabulary as given
            "parallel": {"gpu": "A100-80GB", "tp": 1, "pp": 1, "dp": 2, "micro_batch": 1, "global_batch": 2}}  # fmt: skip
    for fw, name, size in (
        ("internlm", "dp_grad_allreduce", 190_080),
        ("megatron-core", "dp_grad_reducescatter", 190_208),
    ):
        b = generate(load_spec({**spec, "framework": fw}), rewrite=False)
        grads = [n for n in b.nodes[0] if n.name.startswith("dp_grad_") and n.type == pb.COMM_COLL_NODE]
        assert [(n.name.split(".")[0], A.get_int(n, A.COMM_SIZE)) for n in grads] == [(name, size)], fw


def test_flagscale_2023_gqa_expands_k_and_v_before_rope_and_copies_by_hand():
    # One KV head for 4 query heads: q = 16 x 4 x 16 = 1,024 elements, kv = 16 x 1 x 16 = 256. Forward:
    # repeat_interleave reads 256 and writes 1,024 for k and for v, then q, k, v (1,024 each) are copied
    # (read, write): 2 x (256 + 1,024) + 3 x 2 x 1,024 = 8,704 elements x 2 B = 17,408 B. Backward: for k
    # and v zeros (256), read the expanded gradient (1,024), read and write the sum (2 x 256) = 1,792
    # each; the split's cat reads and writes 1,024 + 2 x 256 = 1,536 each way: 2 x 1,792 + 3,072 = 6,656 x
    # 2 B = 13,312 B. RoPE then rotates q and the expanded k: 16 x (4 + 4) x 16 = 2,048 elements (22 B
    # each forward, as above), where megatron-deepspeed rotates 16 x (4 + 1) x 16 = 1,280.
    m = model_from_mapping({**LLAMA, "kv_heads": 1})
    f = replace(FRAMEWORKS["flagscale-2023"], dropout=False)
    c = Ctx(m, shard_of(m, 1, 0), 1, 16, 2, False, "bf16", f.attention, f)
    fwd = {o[0]: o[1:] for o in elementwise(c, "fwd")}
    bwd = {o[0]: o[1:] for o in elementwise(c, "bwd")}
    assert fwd["attn_qkv_copy"] == (17408, 5) and bwd["attn_qkv_copy"] == (13312, 5)
    assert fwd["rope"] == (22 * 2048, 10)
    ds = replace(FRAMEWORKS["megatron-deepspeed"], dropout=False)
    cds = Ctx(m, shard_of(m, 1, 0), 1, 16, 2, False, "bf16", ds.attention, ds)
    assert {o[0]: o[1] for o in elementwise(cds, "fwd")}["rope"] == 18 * 1280
