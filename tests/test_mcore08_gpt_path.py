"""Megatron-Core core_r0.8.0's GPT path outside the GEMMs and attention (issue 22, the Megatron-LM README H100
table's model): the skip_bias_add biases' gradient reductions, the DDP hook's main_grad adds of the norms'
and biases' gradients, the embedding output's transpose copy and its sequence-parallel clone. Bytes by hand."""

from __future__ import annotations

from dataclasses import replace

from xsim.tracegen import load_spec
from xsim.tracegen.frameworks import FRAMEWORKS
from xsim.tracegen.models import model_from_mapping
from xsim.tracegen.ops import Ctx, Op, embedding_steps, head_steps, layer_steps, shard_of
from xsim.tracegen.workload import generate
from xsim.traces import attrs as A

# GPT-style: hidden 64, FFN 256, 4 heads of 16, LayerNorm, GeLU, linear biases, 16-token sequences.
GPT = {"name": "gpt-tiny", "layers": 2, "hidden": 64, "ffn_hidden": 256, "heads": 4, "kv_heads": 4, "vocab": 100,
       "seq_len": 16, "activation": "gelu", "norm": "layernorm", "linear_bias": True}  # fmt: skip
LLAMA = {**GPT, "name": "llama-tiny", "ffn_hidden": 128, "activation": "swiglu", "norm": "rmsnorm",
         "linear_bias": False}  # fmt: skip


def _ctx(
    model: dict, fw: str = "megatron-core", tp: int = 1, mb: int = 1, sp: bool = False, **kw: object
) -> Ctx:
    m = model_from_mapping(model)
    return Ctx(m, shard_of(m, tp, 0), mb, 16, 2, sp, fw=FRAMEWORKS[fw], **kw)  # type: ignore[arg-type]


def _ops(steps: list) -> dict[str, tuple[int, int]]:
    return {s.op: (s.bytes, s.kernels) for s in steps if isinstance(s, Op) and not s.gemm}


def test_skip_bias_add_gradients_by_hand() -> None:
    # fc1's bias enters bias_gelu (GeLUFunction.backward returns `tmp, tmp`): the sum of the 16 x 256 input
    # gradient over tokens, read 2 B = 8,192 B; the projection's and fc2's enter bias-dropout-add (`x +
    # bias`): 16 x 64 x 2 = 2,048 B each. QKV's comes out of TE's wgrad GEMM epilogue: none.
    bwd = _ops(layer_steps(_ctx(GPT), "bwd"))
    assert bwd["mlp_up_bias"] == (8_192, 1)
    assert bwd["attn_out_bias"] == bwd["mlp_out_bias"] == (2_048, 1)
    assert "qkv_proj_bias" not in bwd
    # TP 2 with sequence parallelism: bias-dropout-add on the rank's 8 tokens (8 x 64 x 2 = 1,024 B); fc1's
    # FFN shard of 128 over all 16 tokens (16 x 128 x 2 = 4,096 B).
    sp = _ops(layer_steps(_ctx(GPT, tp=2, sp=True), "bwd"))
    assert sp["attn_out_bias"] == (1_024, 1) and sp["mlp_up_bias"] == (4_096, 1)
    # Megatron-LM 2021's jit-scripted bias_dropout_add gets the bias `expand_as(residual)`: the same sum.
    assert _ops(layer_steps(_ctx(GPT, "megatron-2021"), "bwd"))["attn_out_bias"] == (2_048, 1)
    # No biases, no reductions.
    assert not [n for n in _ops(layer_steps(_ctx(LLAMA), "bwd")) if n.endswith("_bias")]


def test_bias_gradient_with_dropout_off_by_hand() -> None:
    # p = 0: bias-dropout-add is the bias and residual add, whose backward is the bias's sum alone.
    bwd = _ops(layer_steps(_ctx(GPT, "megatron-core"), "bwd"))
    no_drop = replace(FRAMEWORKS["megatron-core"], dropout=False)
    m = model_from_mapping(GPT)
    c = Ctx(m, shard_of(m, 1, 0), 1, 16, 2, False, fw=no_drop)
    off = _ops(layer_steps(c, "bwd"))
    assert "attn_bias_dropout_add" not in off and off["attn_out_bias"] == bwd["attn_out_bias"] == (2_048, 1)


def test_main_grad_hook_adds_by_hand() -> None:
    # Per layer: two LayerNorms' gains and biases (4 tensors, 4 x 64 = 256 parameters) and the biases of QKV
    # (192), the projection (64), fc1 (256) and fc2 (64): 8 tensors, 832 parameters; FP32 main_grad: read 4,
    # read 2, write 4 = 10 B each: 8,320 B in 8 kernels, after the layer's last backward op.
    bwd = layer_steps(_ctx(GPT), "bwd")
    assert isinstance(bwd[-1], Op) and bwd[-1].op == "layer_main_grad_add"
    assert (bwd[-1].bytes, bwd[-1].kernels) == (8_320, 8)
    # A BF16 gradient buffer (grad_reduce_dtype bf16): 2 + 2 + 2 = 6 B x 832 = 4,992 B.
    assert _ops(layer_steps(_ctx(GPT, grad_bytes=2), "bwd"))["layer_main_grad_add"] == (4_992, 8)
    # TP 2: the QKV and fc1 bias shards (96, 128), the rest whole: 256 + 96 + 64 + 128 + 64 = 608 x 10 B.
    assert _ops(layer_steps(_ctx(GPT, tp=2), "bwd"))["layer_main_grad_add"] == (6_080, 8)
    # Llama-style: two RMSNorm gains, 128 parameters, 1,280 B in 2 kernels.
    assert _ops(layer_steps(_ctx(LLAMA), "bwd"))["layer_main_grad_add"] == (1_280, 2)
    # The final LayerNorm's gain and bias: 2 tensors, 128 parameters, 1,280 B.
    assert _ops(head_steps(_ctx(GPT), "bwd"))["final_norm_main_grad_add"] == (1_280, 2)
    # Profiles without Megatron-Core's hook: none.
    for fw in ("megatron-2022", "megatron-deepspeed", "torchtitan"):
        assert "layer_main_grad_add" not in _ops(layer_steps(_ctx(GPT, fw), "bwd"))


def test_embedding_transpose_copy_by_hand() -> None:
    # Micro-batch 2 of 16 tokens, hidden 64: 32 x 64 = 2,048 elements. Forward: transpose(0, 1).contiguous()
    # reads and writes 2 B each (8,192 B); backward the word table's and the position table's dense
    # backward each copy the transposed gradient (16,384 B, 2 kernels).
    gpt = {**GPT, "position_embedding": "learned"}
    fwd = _ops(embedding_steps(_ctx(gpt, mb=2), "fwd"))
    bwd = _ops(embedding_steps(_ctx(gpt, mb=2), "bwd"))
    assert fwd["embedding_transpose"] == (8_192, 1) and bwd["embedding_transpose"] == (16_384, 2)
    # RoPE (no position table): the word table's copy alone.
    assert _ops(embedding_steps(_ctx(LLAMA, mb=2), "bwd"))["embedding_transpose"] == (8_192, 1)
    # core_v0.6.0's `weight[masked_input]` (index backward not read): the position table's copy alone.
    v06 = _ops(embedding_steps(_ctx(gpt, "megatron-core-0.7", mb=2), "bwd"))
    assert v06["embedding_transpose"] == (8_192, 1)
    # One sequence: the transposed view is contiguous, no copy; profiles without the transpose: none.
    assert "embedding_transpose" not in _ops(embedding_steps(_ctx(gpt), "fwd"))
    assert "embedding_transpose" not in _ops(embedding_steps(_ctx(gpt, "torchtitan", mb=2), "fwd"))


def test_embedding_sequence_parallel_clone_by_hand() -> None:
    # TP 2, SP, learned positions (all-reduce, then split): the clone of the rank's 8 x 64 slice, read and
    # write 2 B = 2,048 B, forward only.
    gpt = {**GPT, "position_embedding": "learned"}
    assert _ops(embedding_steps(_ctx(gpt, tp=2, sp=True), "fwd"))["embedding_sp_clone"] == (2_048, 1)
    assert "embedding_sp_clone" not in _ops(embedding_steps(_ctx(gpt, tp=2, sp=True), "bwd"))
    # core_r0.8.0 with RoPE reduce-scatters into the slice: no clone; core_v0.6.0 all-reduces: the clone.
    assert "embedding_sp_clone" not in _ops(embedding_steps(_ctx(LLAMA, tp=2, sp=True), "fwd"))
    v06 = _ops(embedding_steps(_ctx(LLAMA, "megatron-core-0.7", tp=2, sp=True), "fwd"))
    assert v06["embedding_sp_clone"] == (2_048, 1)
    # Without SP, or at TP 1: none.
    assert "embedding_sp_clone" not in _ops(embedding_steps(_ctx(gpt, tp=2), "fwd"))


def test_generated_trace_carries_the_hook_adds_at_the_buffer_width() -> None:
    # One rank, 2 layers, 2 micro-batches: the layer adds once per layer and micro-batch (4 nodes), at the
    # gradient buffer's width: grad_reduce_dtype bf16 gives 6 B x 832 = 4,992 B per node.
    spec = {"model": GPT, "parallel": {"gpu": "H100", "dp": 1, "micro_batch": 1, "global_batch": 2},
            "precision": "bf16", "framework": "megatron-core", "grad_reduce_dtype": "bf16",
            "make_vocab_size_divisible_by": 0}  # fmt: skip
    nodes = generate(load_spec(spec)).nodes[0]
    adds = [n for n in nodes if "layer_main_grad_add" in n.name]
    assert len(adds) == 4
    assert {A.get_int(n, A.TENSOR_SIZE) for n in adds} == {4_992}
