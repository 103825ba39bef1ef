"""GPT-NeoX's layer (issue 22, round neox20b): `parallel_residual`, `rotary_pct` and the `gpt-neox` profile.

One layer of a tiny GPT-NeoX-style model worked out by hand (FP16: 2 bytes; T = 16 tokens, h 64, 4 heads of
16, FFN 256, TP 2: 2 heads and 128 FFN columns a rank; RoPE on 25% of each head: 4 of 16 dimensions;
dropout 0 as in GPT-NeoX-20B's config), each number in the comments, not read back from the code.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from xsim.tracegen import load_spec
from xsim.tracegen.errors import CatalogError, SpecError
from xsim.tracegen.frameworks import FRAMEWORKS
from xsim.tracegen.models import model_from_mapping
from xsim.tracegen.ops import Comm, Ctx, Op, layer_steps, shard_of
from xsim.tracegen.spec import spec_to_mapping
from xsim.tracegen.workload import generate

NEOX = {"name": "neox-tiny", "layers": 2, "hidden": 64, "ffn_hidden": 256, "heads": 4, "kv_heads": 4,
        "vocab": 128, "seq_len": 16, "activation": "gelu", "norm": "layernorm", "linear_bias": True,
        "position_embedding": "rope", "tie_embeddings": False, "parallel_residual": True,
        "rotary_pct": 0.25}  # fmt: skip


def ctx(fw: str = "gpt-neox", tp: int = 2, **model: object) -> Ctx:
    m = model_from_mapping({**NEOX, **model})
    f = replace(FRAMEWORKS[fw], dropout=False, attention_dropout=0.0)
    return Ctx(m, shard_of(m, tp, 0), 1, 16, 2, False, "fp16", f.attention, f)


def comms(c: Ctx, phase: str) -> list[tuple[str, str, int]]:
    return [(s.op, s.kind, s.size) for s in layer_steps(c, phase) if isinstance(s, Comm)]


def elementwise(c: Ctx, phase: str) -> list[tuple[str, int, int, int]]:
    return [
        (o.op, o.flops, o.bytes, o.kernels) for o in layer_steps(c, phase) if isinstance(o, Op) and not o.gemm
    ]


def test_parallel_residual_reduces_the_summed_branches_once_forward():
    # The layer's [s, b, h] activation: 16 x 64 elements x 2 B = 2,048 B. Sequential: an AllReduce after each
    # row-parallel linear forward (attention output, MLP down); parallel: one, of the summed branches.
    # Backward both keep one AllReduce per column-parallel input (QKV's and MLP-up's input gradient).
    par, seq = ctx(), ctx(parallel_residual=False)
    assert comms(par, "fwd") == [("layer_tp_out", "all_reduce", 2048)]
    assert comms(seq, "fwd") == [("attn_tp_out", "all_reduce", 2048), ("mlp_tp_out", "all_reduce", 2048)]
    back = [("mlp_tp_in", "all_reduce", 2048), ("attn_tp_in", "all_reduce", 2048)]
    assert comms(par, "bwd") == comms(seq, "bwd") == back
    # TP 1: no collectives at all.
    assert comms(ctx(tp=1), "fwd") == comms(ctx(tp=1), "bwd") == []
    # The GEMMs are the sequential layer's: QKV 2 x 16 x 64 x 96 = 196,608 FLOPs (2 heads x 3 x 16 = 96
    # columns), output 2 x 16 x 32 x 64 = 65,536, MLP up and down 2 x 16 x 64 x 128 = 262,144 each.
    for phase in ("fwd", "bwd"):
        gemms = [(o.op, o.flops) for o in layer_steps(par, phase) if isinstance(o, Op) and o.gemm]
        assert sorted(gemms) == sorted(
            (o.op, o.flops) for o in layer_steps(seq, phase) if isinstance(o, Op) and o.gemm
        )
    fwd = {o.op: o.flops for o in layer_steps(par, "fwd") if isinstance(o, Op) and o.gemm}
    assert (fwd["qkv_proj"], fwd["attn_out_proj"], fwd["mlp_up_gate"]) == (196_608, 65_536, 262_144)


def test_gpt_neox_parallel_layer_kernels_flops_and_bytes_by_hand():
    # Forward on 16 x 64 = 1,024 hidden elements a rank (no sequence parallelism):
    # - LayerNorms: 7 FLOPs an element, read 2 + write 2 B = 4,096 B; both read the layer's input.
    # - QKV bias (F.linear on a 3-D input adds it after the GEMM): 16 x 96 = 1,536 elements, read + write
    #   = 6,144 B, 1 FLOP each.
    # - RoPE on 4 of 16 dimensions of q and k: 16 x (2 + 2) x 4 = 256 rotated elements (3 FLOPs each: 768)
    #   of 1,024; the chain's 9 passes on 256 + the cat's 2 on 1,024 = 4,352 element passes x 2 B =
    #   8,704 B in 2 x (4 + 1) = 10 kernels.
    # - Causal softmax on 2 heads x 16 x 16 = 512 scores (5 FLOPs each: 2,560): reads the lower triangle
    #   2 x 16 x 17 / 2 = 272, writes 512: (272 + 512) x 2 = 1,568 B. Context permute: read + write the
    #   16 x 32 = 512 context elements = 2,048 B.
    # - The branches' biases (skip_bias_add, added by bias_dropout_fn): read + write 1,024 = 4,096 B each;
    #   bias-GeLU on 16 x 128 = 2,048 (8 FLOPs each: 16,384): read + write = 8,192 B.
    # - branch_sum (MLP + attention output) and layer_residual (after the AllReduce): read 2, write 1 =
    #   6,144 B, 1,024 FLOPs each. No dropout kernels (dropout 0).
    assert elementwise(ctx(), "fwd") == [
        ("attn_norm", 7168, 4096, 1), ("qkv_proj_bias", 1536, 6144, 1), ("rope", 768, 8704, 10),
        ("attn_softmax", 2560, 1568, 1), ("attn_context_permute", 0, 2048, 1), ("attn_out_bias", 1024, 4096, 1),
        ("mlp_norm", 7168, 4096, 1), ("mlp_act", 16384, 8192, 1), ("mlp_out_bias", 1024, 4096, 1),
        ("branch_sum", 1024, 6144, 1), ("layer_residual", 1024, 6144, 1),
    ]  # fmt: skip
    # Backward: the sum passes its gradient to both branches (no kernel). Each bias's gradient is a
    # reduction reading the output gradient (1,024 x 2 = 2,048 B; MLP up's 2,048 x 2 = 4,096 B); bias-GeLU
    # reads input and gradient, writes one: 3 x 2,048 x 2 = 12,288 B (16 FLOPs each); LayerNorm backward
    # read 2, write 1 = 6,144 B (14 FLOPs each); the residual gradient accumulates both norms' (6,144 B
    # each); softmax backward reads gradient and probabilities of the triangle, writes the rows:
    # (2 x 272 + 512) x 2 = 2,112 B; the Q/K/V split's cat: (512 + 2 x 512) x 2 x 2 = 6,144 B; RoPE: the
    # chain's 9 passes on 256 + the slices' 7 on 1,024 = 9,472 passes = 18,944 B in 2 x (4 + 5) = 18
    # kernels (the passed part is not empty: zeros and copy for both slices, then their sum); QKV bias
    # 1,536 x 2 = 3,072 B.
    assert elementwise(ctx(), "bwd") == [
        ("mlp_out_bias", 1024, 2048, 1), ("mlp_act", 32768, 12288, 1), ("mlp_up_bias", 2048, 4096, 1),
        ("mlp_norm", 14336, 6144, 1), ("mlp_residual", 2048, 6144, 1), ("attn_out_bias", 1024, 2048, 1),
        ("attn_softmax", 5120, 2112, 1), ("qkv_grad_cat", 0, 6144, 1), ("rope", 768, 18944, 18),
        ("qkv_proj_bias", 1536, 3072, 1), ("attn_norm", 14336, 6144, 1), ("attn_residual", 2048, 6144, 1),
    ]  # fmt: skip


def test_rotary_pct_scales_the_rope_kernels_by_hand():
    # Full rotary (rotary_pct 1): 1,024 rotated elements, 3 FLOPs each = 3,072; GPT-NeoX rotates whole
    # heads without slicing: the chain's 9 passes x 1,024 x 2 B = 18,432 B in 2 x 4 = 8 kernels both ways.
    full = {(o.phase, o.op): (o.flops, o.bytes, o.kernels) for o in layer_steps(ctx(rotary_pct=1.0), "fwd")
            if isinstance(o, Op)}  # fmt: skip
    assert full[("fwd", "rope")] == (3072, 18432, 8)
    back = [o for o in layer_steps(ctx(rotary_pct=1.0), "bwd") if isinstance(o, Op) and o.op == "rope"]
    assert [(o.flops, o.bytes, o.kernels) for o in back] == [(3072, 18432, 8)]
    assert (
        model_from_mapping(NEOX).rotary_dims == 4
        and model_from_mapping({**NEOX, "rotary_pct": 0.3}).rotary_dims == 4
    )
    # (int(16 x 0.3) = int(4.8) = 4, as GPT-NeoX truncates.)
    # A fused RoPE kernel (megatron-core) at 25%: rotates 256 elements (768 FLOPs) but reads and writes every
    # element of q and k: 1,024 x 2 x 2 B = 4,096 B, one kernel.
    fused = [o for o in layer_steps(ctx("megatron-core"), "fwd") if isinstance(o, Op) and o.op == "rope"]
    assert [(o.flops, o.bytes, o.kernels) for o in fused] == [(768, 4096, 1)]
    # GPT-NeoX-20B: head 96, rotary_pct 0.25 -> 24 dimensions (the model card: "applied to the first 24").
    neox20b = model_from_mapping({**NEOX, "hidden": 6144, "heads": 64, "kv_heads": 64, "ffn_hidden": 24576})
    assert neox20b.rotary_dims == 24


def test_spec_keys_round_trip_generate_and_refuse():
    spec = {"model": NEOX, "framework": "gpt-neox", "precision": "fp16", "dropout": False,
            "attention_dropout": 0.0,
            "parallel": {"gpu": "A100-40GB", "tp": 2, "pp": 1, "dp": 1, "micro_batch": 1, "global_batch": 1}}  # fmt: skip
    dep = load_spec(spec)
    assert dep.model.parallel_residual and dep.model.rotary_pct == pytest.approx(0.25)
    model = spec_to_mapping(dep)["model"]
    assert model["parallel_residual"] is True and model["rotary_pct"] == pytest.approx(0.25)
    assert load_spec({**spec, "model": model}).model == dep.model
    # Unset: no field written (sequential residual, all dimensions rotated).
    plain = {k: v for k, v in NEOX.items() if k not in ("parallel_residual", "rotary_pct")}
    dep0 = load_spec({**spec, "model": plain})
    assert not dep0.model.parallel_residual and dep0.model.rotary_pct == 0.0
    assert "parallel_residual" not in spec_to_mapping(dep0)["model"]
    # Generated trace, 2 layers, 1 micro-batch, rank 0: one forward TP AllReduce a layer, two backward.
    names = [n.name for n in generate(dep, rewrite=False).nodes[0]]
    assert sum(n.startswith(("L1.layer_tp_out.fwd", "L2.layer_tp_out.fwd")) for n in names) == 2
    assert not [n for n in names if "attn_tp_out" in n or "mlp_tp_out" in n]
    assert sum(".attn_tp_in.bwd" in n or ".mlp_tp_in.bwd" in n for n in names) == 4
    with pytest.raises(SpecError, match="parallel_residual with sequence_parallel"):
        load_spec({**spec, "sequence_parallel": True})
    for bad in (0, 1.5, "half", True):
        with pytest.raises((SpecError, CatalogError), match="rotary_pct must be a number"):
            load_spec({**spec, "model": {**NEOX, "rotary_pct": bad}})
    with pytest.raises((SpecError, CatalogError), match="parallel_residual must be true or false"):
        load_spec({**spec, "model": {**NEOX, "parallel_residual": "yes"}})


def _validate_published():
    """scripts/validate_published.py as a module (it is a script, not a package module)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "validate_published.py"
    spec = importlib.util.spec_from_file_location("validate_published_neox", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_neox20b_row_time_follows_from_117_tflops_by_gpt_neox_formula():
    # GPT-NeoX c560814b megatron/logging.py get_flops: X = B s (6 P + 60 s h l) / (t n). P as get_total_params
    # counts it at TP 2: per layer QKV 6144 x 18432 + 18432, output 6144^2 + 6144, MLP 6144 x 24576 + 24576
    # and 24576 x 6144 + 6144, two LayerNorms 4 x 6144 = 453,064,704; x 44 = 19,934,846,976; untied
    # embedding and head 2 x 50432 x 6144 = 619,708,416; final norm 12,288: 20,554,567,680, plus the
    # TP-replicated tensors counted twice (norms 4h and the two row-parallel biases 2h a layer, the final
    # norm 2h: 266 x 6144 = 1,634,304) = 20,556,201,984, the model card's count. t = 1536 x 2048 x
    # (6 P + 60 x 2048 x 6144 x 44) / (96 x 117e12) = 43.846 s.
    vp = _validate_published()
    run = {r.id: r for r in vp.load_dataset().runs}["neox-20b-96xa100-40gb"]
    m = model_from_mapping({**NEOX, "name": "neox-20b", "layers": 44, "hidden": 6144, "heads": 64,
                            "kv_heads": 64, "ffn_hidden": 24576, "vocab": 50432, "seq_len": 2048})  # fmt: skip
    replicated = (44 * 6 + 2) * 6144
    p = m.total_params() + replicated
    assert m.total_params() == 20_554_567_680 and p == 20_556_201_984
    flops = run.global_batch * run.seq_len * (6 * p + 60 * run.seq_len * run.hidden * run.layers)
    assert flops / (run.gpus * 117e12) == pytest.approx(run.measured_value, abs=5e-4)
    assert (run.gpus, run.global_batch, run.micro_batches, run.rotary_pct, run.parallel_residual) == (
        96,
        1536,
        32,
        0.25,
        True,
    )
    spec = vp.spec_for(run)
    assert spec["model"]["parallel_residual"] is True and spec["model"]["rotary_pct"] == 0.25
