"""A row-parallel linear's output gradient under sequence parallelism, as Megatron-Core and TE order it:
bias-dropout-add backward, (FP8: amax, cast of the rank's shard,) AllGather, GEMM. Round pplast."""

from __future__ import annotations

from dataclasses import replace

from xsim.tracegen import generate, load_spec
from xsim.tracegen.frameworks import FRAMEWORKS
from xsim.tracegen.models import model_from_mapping
from xsim.tracegen.ops import Ctx, Op, layer_steps, shard_of
from xsim.traces import attrs as A

# Tiny Llama-style model: h 64, 4 heads, FFN 128, 16 tokens a micro-batch.
LLAMA = {"name": "llama-tiny", "layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 4,
         "vocab": 100, "seq_len": 16, "activation": "swiglu", "norm": "rmsnorm", "linear_bias": False}  # fmt: skip


def _mlp_down_bwd(precision: str, recipe: str = "delayed", dropout: bool = False) -> list[tuple]:
    """(kind, name, bytes, kernels) of the backward steps before `mlp_down`'s GEMM, TP 2 under SP."""
    m = model_from_mapping(LLAMA)
    fw = replace(FRAMEWORKS["megatron-core"], dropout=dropout)
    c = Ctx(m, shard_of(m, 2, 0), 1, 16, 2, True, precision, fw.attention, fw, recipe)
    steps = layer_steps(c, "bwd")
    at = next(i for i, s in enumerate(steps) if isinstance(s, Op) and s.op == "mlp_down")
    return [
        ("op", s.op, s.bytes, s.kernels) if isinstance(s, Op) else (s.kind, s.op, s.size, 0)
        for s in steps[:at]
    ]


def test_fp8_row_parallel_gradient_is_cast_on_the_shard_and_gathered_in_fp8_by_hand():
    # 16 tokens / TP 2 = 8 a rank: a shard of 8 x 64 = 512 elements, the gathered gradient 1,024.
    # Delayed scaling: cast the shard (read 2, write 1: 1,536 B) and transpose the gathered FP8 copy for the
    # wgrad GEMM (read 1, write 1: 2,048 B) = 3,584 B in 2 kernels; the AllGather moves the FP8 shard
    # (512 B per rank); dropout off: no bias-dropout-add backward kernel.
    assert _mlp_down_bwd("fp8") == [
        ("op", "mlp_down_fp8_cast", 3_584, 2),
        ("all_gather", "mlp_tp_out", 512, 0),
    ]
    # Current scaling: the shard's amax (one FP32 all-reduced, 4 B), then its amax pass, scale and cast
    # (read 2 twice, write 1: 2,560 B) and the transpose (2,048 B) = 4,608 B in 3 + 1 kernels.
    assert _mlp_down_bwd("fp8", "current") == [
        ("all_reduce", "mlp_down_amax_allreduce", 4, 0),
        ("op", "mlp_down_fp8_cast", 4_608, 4),
        ("all_gather", "mlp_tp_out", 512, 0),
    ]
    # BF16 with dropout: the fused bias-dropout-add backward on the shard (read 2 and the 1-byte mask,
    # write 2: 5 x 512 = 2,560 B) comes first, then the BF16 AllGather (512 x 2 = 1,024 B) next to the GEMM.
    assert _mlp_down_bwd("bf16", dropout=True) == [
        ("op", "mlp_bias_dropout_add", 2_560, 1),
        ("all_gather", "mlp_tp_out", 1_024, 0),
    ]


def test_backward_gathers_are_overlapped_by_userbuffers():
    # With tp_comm_overlap the AllGather now sits right before the dgrad GEMM, so TE's ring exchange
    # (proj_dgrad, fc2_dgrad) chunks it: TP - 1 = 1 exchange step, TP = 2 GEMM chunks; FP8 at 1 byte.
    spec = {"model": LLAMA, "parallel": {"gpu": "H100", "tp": 2}, "sequence_parallel": True,
            "tp_comm_overlap": True, "precision": "fp8", "make_vocab_size_divisible_by": 0}  # fmt: skip
    nodes = generate(load_spec(spec)).nodes[0]
    names = {n.name: n for n in nodes}
    for gather, gemm in (("mlp_tp_out", "mlp_down"), ("attn_tp_out", "attn_out_proj")):
        assert f"L1.{gather}.bwd.mb0.chunk0" in names and f"L1.{gather}.bwd.mb0" not in names
        assert A.get_int(names[f"L1.{gather}.bwd.mb0.chunk0"], A.COMM_SIZE) == 512
        assert {f"L1.{gemm}.bwd.mb0.chunk0", f"L1.{gemm}.bwd.mb0.chunk1"} <= set(names)
