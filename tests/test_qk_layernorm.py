"""QK layer norms (issue 22 / 28, round qknorm): the `qk_layernorm` model key.

One layer of a tiny model worked out by hand (BF16: 2 bytes; T = 16 tokens, h 64, 4 heads of 16, 2 KV heads,
FFN 128, TP 2: rank 0 holds 2 query heads and 1 KV head, so q is 16 x 2 x 16 = 512 elements and k
16 x 1 x 16 = 256), each number in the comments, not read back from the code.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import CatalogError, SpecError
from xsim.tracegen.frameworks import FRAMEWORKS
from xsim.tracegen.memory import layer_activation_bytes
from xsim.tracegen.models import model_from_mapping
from xsim.tracegen.ops import Ctx, Op, layer_steps, param_tensors, rank_params, shard_of
from xsim.tracegen.spec import spec_to_mapping
from xsim.traces import attrs as A

TINY = {"name": "qk-tiny", "layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 2,
        "vocab": 128, "seq_len": 16, "qk_layernorm": True}  # fmt: skip
NORMS = ("qk_norm_copy", "q_norm", "k_norm")


def ctx(fw: str = "megatron-core", tp: int = 2, **model: object) -> Ctx:
    m = model_from_mapping({**TINY, **model})
    f = replace(FRAMEWORKS[fw], dropout=False, attention_dropout=0.0)
    return Ctx(m, shard_of(m, tp, 0), 1, 16, 2, False, "bf16", f.attention, f)


def qk_ops(c: Ctx, phase: str) -> list[tuple[str, int, int, int]]:
    return [
        (o.op, o.flops, o.bytes, o.kernels)
        for o in layer_steps(c, phase)
        if isinstance(o, Op) and o.op in NORMS
    ]


def names(c: Ctx, phase: str) -> list[str]:
    return [s.op for s in layer_steps(c, phase) if isinstance(s, Op)]


def test_megatron_core_q_and_k_norms_by_hand():
    # TE's fused RMSNorm, one kernel each way (the existing norm cost): 4 FLOPs an element; forward read 2 +
    # write 2 B, backward read 2 x 2 (gradient, input) + write 2 B. TE >= 1.9 makes the input contiguous:
    # k is a strided view of the QKV output, and with one query group on the rank q's reshape is a view
    # too, so both are copied: (512 + 256) x (2 + 2) = 3,072 B in 2 kernels.
    # q: 4 x 512 = 2,048 FLOPs, 4 x 512 = 2,048 B; k: 1,024 FLOPs, 1,024 B.
    assert qk_ops(ctx(), "fwd") == [
        ("qk_norm_copy", 0, 3_072, 2),
        ("q_norm", 2_048, 2_048, 1),
        ("k_norm", 1_024, 1_024, 1),
    ]
    # Backward (twice the FLOPs): k 8 x 256 = 2,048 FLOPs, 6 x 256 = 1,536 B; q 4,096 FLOPs, 3,072 B; no copy.
    assert qk_ops(ctx(), "bwd") == [("k_norm", 2_048, 1_536, 1), ("q_norm", 4_096, 3_072, 1)]
    # After the QKV projection, before RoPE; backward after RoPE's, before the q/k/v gradients' cat.
    fwd, bwd = names(ctx(), "fwd"), names(ctx(), "bwd")
    assert fwd[fwd.index("qkv_proj") + 1 : fwd.index("rope")] == ["qk_norm_copy", "q_norm", "k_norm"]
    assert bwd[bwd.index("rope") + 1 : bwd.index("qkv_grad_cat")] == ["k_norm", "q_norm"]
    # LayerNorm (the model's `norm`): 7 FLOPs an element: q 3,584, k 1,792 forward.
    assert qk_ops(ctx(norm="layernorm"), "fwd")[1:] == [
        ("q_norm", 3_584, 2_048, 1),
        ("k_norm", 1_792, 1_024, 1),
    ]
    # TP 1: 4 heads (1,024 elements), 2 KV heads (512) in 2 query groups: q's reshape copies already (not
    # this key's), only k is made contiguous: 512 x 4 = 2,048 B in 1 kernel.
    assert qk_ops(ctx(tp=1), "fwd") == [
        ("qk_norm_copy", 0, 2_048, 1),
        ("q_norm", 4_096, 4_096, 1),
        ("k_norm", 2_048, 2_048, 1),
    ]
    # Off: nothing.
    assert qk_ops(ctx(qk_layernorm=False), "fwd") == qk_ops(ctx(qk_layernorm=False), "bwd") == []


def test_torchtitan_eager_rmsnorm_and_unfused_profiles():
    # torchtitan's Qwen3 (torchtitan/models/qwen3/model/model.py at e38d7abe0): nn.RMSNorm(head_dim) on the
    # contiguous wq / wk outputs, eager PyTorch's composite: forward 8 kernels, 2 x 2 + 32 = 36 B an element
    # (q 36 x 512 = 18,432 B; k 9,216 B), backward 17 kernels, 2 x 2 + 100 = 104 B (q 53,248; k 26,624).
    assert qk_ops(ctx("torchtitan"), "fwd") == [("q_norm", 2_048, 18_432, 8), ("k_norm", 1_024, 9_216, 8)]
    assert qk_ops(ctx("torchtitan"), "bwd") == [("k_norm", 2_048, 26_624, 17), ("q_norm", 4_096, 53_248, 17)]
    # InternLM's FP32 copy of the residual stream is not the q and k norms' input: one kernel each way.
    assert qk_ops(ctx("internlm"), "fwd") == [("q_norm", 2_048, 2_048, 1), ("k_norm", 1_024, 1_024, 1)]


def test_parameters_hook_adds_and_memory_by_hand():
    # Per layer the q and k norms' gains, head_dim = 16 each: 32 (LayerNorm gain and bias: 64).
    on, off = model_from_mapping(TINY), model_from_mapping({**TINY, "qk_layernorm": False})
    assert on.total_params() - off.total_params() == 2 * 32 == 64
    ln = model_from_mapping({**TINY, "norm": "layernorm"})
    assert ln.qk_norm_params == 64
    # The whole count: embedding 128 x 64 = 8,192; untied head 64 + 8,192; per layer QKV 64 x (4 + 2 x 2) x
    # 16 = 8,192, output 64 x 64 = 4,096, SwiGLU MLP 64 x 256 + 128 x 64 = 24,576, norms 2 x 64 + 2 x 16 =
    # 160: 37,024 x 2 = 74,048; 90,496 in all.
    assert on.total_params() == 90_496
    # TP rank 0 (both ends): per layer QKV 64 x (2 + 2) x 16 = 4,096, output 32 x 64 = 2,048, MLP 64 x 128 +
    # 64 x 64 = 12,288, norms 160 (whole on every TP rank) = 18,592 x 2 = 37,184; embedding and head
    # shards 64 x 64 = 4,096 each, final norm 64: 45,440. Tensors: 4 linears + 4 norm gains a layer.
    sh = shard_of(on, 2, 0)
    assert rank_params(on, sh, 2, True, True) == 45_440 == rank_params(off, sh, 2, True, True) + 64
    assert param_tensors(on, 2, False, False) == 16
    # Megatron-Core's DDP hook adds the 4 norm gains of a layer to main_grad: 4 kernels, 2 x 64 + 2 x 16
    # = 160 parameters x (4 + 2 + 4) B = 1,600 B.
    [hook] = [o for o in layer_steps(ctx(), "bwd") if isinstance(o, Op) and o.op == "layer_main_grad_add"]
    assert (hook.kernels, hook.flops, hook.bytes) == (4, 160, 1_600)
    # Activations (s 16, b 1, TP 2, no SP): the norms' BF16 inputs, q 2 x 16 x 4 x 16 = 2,048 and k 1,024 B
    # (whole model), and the FP32 rstd per head and token 4 x 16 x (4 + 2) = 384 B: 3,456 / TP 2 = 1,728 B
    # a layer; also under selective recompute (the attention core only); none under full recompute.
    for rc, extra in (("none", 1_728), ("selective", 1_728), ("full", 0)):
        diff = layer_activation_bytes(on, 16, 1, 2, recompute=rc, flash=True) - layer_activation_bytes(
            off, 16, 1, 2, recompute=rc, flash=True
        )
        assert diff == Fraction(extra)


def test_qwen3_30b_a3b_parameter_count_matches_the_checkpoint():
    # Qwen/Qwen3-30B-A3B (config.json: 48 layers, hidden 2048, 32 heads, 4 KV heads, head_dim 128, 128
    # experts of 768, top-8, vocabulary 151,936, untied; Qwen3MoeAttention's q_norm / k_norm, RMSNorm over
    # head_dim): 30,532,122,624 parameters, 3,353,032,704 active (the checkpoint's tensors as llama.cpp's
    # GGUF general.parameter_count of its conversions records them). Without the QK norms 48 x 256 = 12,288
    # fewer.
    qwen = {"name": "qwen3-30b-a3b", "layers": 48, "hidden": 2048, "ffn_hidden": 6144, "heads": 32,
            "kv_heads": 4, "kv_channels": 128, "vocab": 151936, "seq_len": 4096, "qk_layernorm": True,
            "moe": {"experts": 128, "top_k": 8, "expert_ffn": 768}}  # fmt: skip
    m = model_from_mapping(qwen)
    assert (m.total_params(), m.active_params()) == (30_532_122_624, 3_353_032_704)
    assert m.total_params() - model_from_mapping({**qwen, "qk_layernorm": False}).total_params() == 12_288


def _spec(**extra: object) -> dict:
    return {"model": TINY, "precision": "bf16", "dropout": False, "attention_dropout": 0.0,
            "parallel": {"gpu": "H100", "tp": 2, "pp": 1, "dp": 1, "micro_batch": 1, "global_batch": 1},
            **extra}  # fmt: skip


def test_tp_all_reduce_of_the_norm_gradients_and_spec_keys():
    # The q and k norms' gradients are partial on each TP rank (its own heads): Megatron-Core all-reduces
    # them over TP with or without sequence parallelism (finalize_model_grads.py of core_v0.14.0), FP32
    # main_grad: 2 layers x 32 x 4 B = 256 B. With SP they join the norms' all-reduce: (2 x 2 + 1) x 64 x 4
    # = 1,280 + 256 = 1,536 B. TP 1: none.
    for sp, size in ((False, 256), (True, 1_536)):
        nodes = generate(load_spec(_spec(sequence_parallel=sp)), rewrite=False).nodes[0]
        assert [A.comm_size(n) for n in nodes if n.name == "sp_norm_grad_allreduce"] == [size]
    dep = load_spec(_spec())
    assert dep.model.qk_layernorm and spec_to_mapping(dep)["model"]["qk_layernorm"] is True
    assert load_spec({**_spec(), "model": spec_to_mapping(dep)["model"]}).model == dep.model
    plain = load_spec(_spec(model={**TINY, "qk_layernorm": False}))
    assert "qk_layernorm" not in spec_to_mapping(plain)["model"]
    with pytest.raises((SpecError, CatalogError), match="qk_layernorm must be true or false"):
        load_spec(_spec(model={**TINY, "qk_layernorm": "yes"}))
    mla = {
        "q_lora_rank": 0,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
    }
    with pytest.raises(CatalogError, match="qk_layernorm does not apply to MLA"):
        model_from_mapping({**TINY, "kv_heads": 4, "mla": mla})


def test_validate_published_reads_the_key():
    path = Path(__file__).resolve().parents[1] / "scripts" / "validate_published.py"
    spec = importlib.util.spec_from_file_location("validate_published_qk", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    assert "qk_layernorm" in mod.MODEL_OPTIONAL
    assert mod._architecture("x.yaml", "run", {"qk_layernorm": True}) == {"qk_layernorm": True}
