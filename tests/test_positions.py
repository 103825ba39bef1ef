"""Position encodings (`position_embedding`: rope | learned | alibi | none) and the embedding output's TP
collective under sequence parallelism by Megatron-Core version (docs/tracegen.md "Models"), by hand."""

from __future__ import annotations

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.frameworks import FRAMEWORKS
from xsim.tracegen.models import model_from_mapping
from xsim.tracegen.ops import Comm, Ctx, Op, attention_steps, embedding_steps, layer_steps, shard_of
from xsim.tracegen.spec import model_arch, spec_to_mapping
from xsim.traces import attrs as A

# GPT-style (GELU, LayerNorm, biases) and Llama-style (SwiGLU, RMSNorm) tiny models: h 64, 4 heads, s 16.
GPT = {"name": "gpt-tiny", "layers": 2, "hidden": 64, "ffn_hidden": 256, "heads": 4, "vocab": 100,
       "seq_len": 16, "activation": "gelu", "norm": "layernorm", "linear_bias": True}  # fmt: skip
LLAMA = {**GPT, "name": "llama-tiny", "activation": "swiglu", "norm": "rmsnorm", "linear_bias": False}


def _dp1(model: dict, **keys) -> dict:
    # The vocabulary as given (make_vocab_size_divisible_by 0): Megatron would pad 100 to 128.
    return {
        "model": model,
        "parallel": {"gpu": "A100-80GB", "tp": 1, "dp": 1},
        "make_vocab_size_divisible_by": 0,
        **keys,
    }


def test_defaults_by_family_and_framework_and_the_key():
    # GPT-style models learn a table, the Llama family rotates (no key): as their released code does.
    assert model_arch(load_spec(_dp1(GPT))).positions == "learned"
    assert model_arch(load_spec(_dp1(LLAMA))).positions == "rope"
    # Megatron-LM 2021/2022's Embedding always has the table: a SwiGLU model learns it there too.
    assert model_arch(load_spec(_dp1(LLAMA, framework="megatron-2021"))).positions == "learned"
    # The key overrides both (Megatron-Core's default learned_absolute when a Llama script omits
    # --position-embedding-type rope; BLOOM's ALiBi), and the resolved spec keeps it (field 69).
    for pos in ("rope", "learned", "alibi", "none"):
        dep = load_spec(_dp1({**LLAMA, "position_embedding": pos}, framework="megatron-2022"))
        assert model_arch(dep).positions == pos
        again = spec_to_mapping(dep)
        assert again["model"]["position_embedding"] == pos and model_arch(load_spec(again)).positions == pos
    assert "position_embedding" not in spec_to_mapping(load_spec(_dp1(GPT)))["model"]
    with pytest.raises(SpecError, match="position_embedding must be one of rope, learned, alibi, none"):
        load_spec(_dp1({**GPT, "position_embedding": "absolute"}))
    # The family's tie default does not follow the position key: a learned-position Llama stays untied.
    assert not model_arch(load_spec(_dp1({**LLAMA, "position_embedding": "learned"}))).tied


@pytest.mark.parametrize(
    ("pos", "table", "rope"), [("learned", 16 * 64, 0), ("rope", 0, 2), ("alibi", 0, 0), ("none", 0, 0)]
)
def test_what_each_encoding_generates_by_hand(pos, table, rope):
    # The table: s x h = 16 x 64 = 1,024 parameters (+1 tensor) on the first stage, in the optimizer step and
    # the DP gradient (FP32): per layer 12 h^2 + 13 h = 49,984, embedding 6,400, final LayerNorm 128
    # (tied): 2 x 49,984 + 6,400 + 128 = 106,496 without it. RoPE: one fused `rope` op per layer forward.
    dep = load_spec({**_dp1({**GPT, "position_embedding": pos}), "parallel": {"gpu": "A100-80GB", "dp": 2}})
    nodes = generate(dep, rewrite=False).nodes[0]
    params = 106_496 + table
    assert [A.comm_size(n) for n in nodes if n.name.startswith("dp_grad_allreduce")] == [4 * params]
    assert A.get_int(next(n for n in nodes if n.name == "optimizer.opt"), A.NUM_OPS) == 15 * params
    assert len([n for n in nodes if ".rope.fwd." in n.name]) == rope
    assert len([n for n in nodes if n.name.startswith("position_embedding.")]) == (2 if table else 0)


def _sp_ctx(model: dict, framework: str) -> Ctx:
    m = model_from_mapping(model)
    return Ctx(m, shard_of(m, 2, 0), 2, 16, 2, True, fw=FRAMEWORKS[framework])


@pytest.mark.parametrize(
    ("model", "framework", "kind"),
    [
        # Megatron-Core >= core_r0.8.0 without a position table: reduce-scatter into the sequence slice.
        (LLAMA, "megatron-core", "reduce_scatter"),
        # core_v0.6.0/0.7.0 (VocabParallelEmbedding: reduce_from_tensor_model_parallel_region, then the
        # split): an all-reduce of the whole output.
        (LLAMA, "megatron-core-0.7", "all_reduce"),
        # A learned table is added to the whole output before the split, in every version.
        (GPT, "megatron-core", "all_reduce"),
        (LLAMA, "megatron-2022", "all_reduce"),
        (LLAMA, "megatron-deepspeed", "all_reduce"),
    ],
)
def test_embedding_output_collective_under_sequence_parallelism_by_hand(model, framework, kind):
    # TP 2, micro-batch 2 of 16 tokens, h 64, BF16: the whole output is 2 x 16 x 64 x 2 B = 4,096 B (the
    # ReduceScatter's and AllReduce's comm_size); backward the gradient's AllGather of the rank's 16 tokens,
    # 16 x 64 x 2 = 2,048 B (the per-rank input), in every case. The embedding dropout works on 16 tokens.
    c = _sp_ctx(model, framework)
    fwd = [(s.op, s.kind, s.size) for s in embedding_steps(c, "fwd") if isinstance(s, Comm)]
    bwd = [(s.op, s.kind, s.size) for s in embedding_steps(c, "bwd") if isinstance(s, Comm)]
    assert fwd == [("embedding_tp_out", kind, 4_096)]
    assert bwd == [("embedding_tp_out", "all_gather", 2_048)]
    drop = next(s for s in embedding_steps(c, "fwd") if isinstance(s, Op) and s.op == "embedding_dropout")
    assert drop.shape == (16 * 64,)
    # The learned table's lookup and add run on all 32 tokens on every TP rank (before the split).
    pos = [s for s in embedding_steps(c, "fwd") if isinstance(s, Op) and s.op == "position_embedding"]
    assert [s.shape for s in pos] == ([(32, 64)] if model is GPT else [])


def test_alibi_adds_the_bias_copy_and_its_read_to_unfused_scores_only_by_hand():
    # Unfused attention, TP 1, micro-batch 2, s 16, 4 heads of 16: scores 2 x 4 x 16 x 16 = 2,048 elements.
    # QK^T forward moves q 2,048 + k 2,048 + scores 2,048 elements (12,288 B); with ALiBi the broadcast bias
    # is first copied into the scores buffer (one kernel writing 2,048 x 2 B) and the GEMM reads it back as C
    # (beta 1.0): + 8,192 B, 2 kernels. Backward unchanged (the bias takes no gradient). Flash: nothing.
    out = {}
    for pos in ("learned", "alibi"):
        m = model_from_mapping({**GPT, "position_embedding": pos})
        for attn in ("unfused", "flash"):
            c = Ctx(
                m, shard_of(m, 1, 0), 2, 16, 2, False, attention=attn, fw=FRAMEWORKS["megatron-deepspeed"]
            )
            out[pos, attn] = {
                (s.op, s.phase): (s.bytes, s.kernels) for p in ("fwd", "bwd") for s in attention_steps(c, p)
            }
    assert out["learned", "unfused"][("attn_scores", "fwd")] == (12_288, 1)
    assert out["alibi", "unfused"][("attn_scores", "fwd")] == (12_288 + 8_192, 2)
    assert (
        out["alibi", "unfused"][("attn_scores", "bwd")] == out["learned", "unfused"][("attn_scores", "bwd")]
    )
    assert out["alibi", "flash"] == out["learned", "flash"]
    # No rotary kernels and no table under ALiBi.
    m = model_from_mapping({**LLAMA, "position_embedding": "alibi"})
    c = Ctx(m, shard_of(m, 1, 0), 2, 16, 2, False)
    assert not [s for s in layer_steps(c, "fwd") if isinstance(s, Op) and s.op == "rope"]
    assert m.position_params == 0
