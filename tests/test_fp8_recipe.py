"""`fp8_recipe: current` (Transformer Engine's current scaling): every FP8 quantize computes its amax first
(one more read of its input, three kernels), a LayerNormLinear's norm writes BF16 and is quantized after
it, and the delayed recipe's amax reduction and scale update are gone; each against a hand count."""

from __future__ import annotations

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.spec import spec_to_mapping
from xsim.traces import attrs as A

TINY = {"name": "tiny", "layers": 1, "hidden": 64, "ffn_hidden": 128, "heads": 4, "vocab": 256, "seq_len": 8}


def _spec(recipe: str | None, precision: str = "fp8") -> dict:
    spec = {"model": TINY, "precision": precision, "parallel": {"gpu": "H100"}, "micro_batches": 1}
    return spec if recipe is None else {**spec, "fp8_recipe": recipe}


def _nodes(recipe: str | None) -> dict:
    bundle = generate(load_spec(_spec(recipe)), rewrite=False)
    return {n.name: {a.name: a for a in n.attr} for n in bundle.nodes[0]}


def _value(attr):  # noqa: ANN001, ANN202
    return getattr(attr, attr.WhichOneof("value"))


def _size(nodes: dict, name: str) -> int:
    return nodes[name][A.TENSOR_SIZE].uint64_val


def test_current_scaling_node_list_and_bytes_by_hand() -> None:
    """Tiny model (hidden 64, 8 tokens, 4 heads of 16, SwiGLU FFN 128, BF16 activations, TP 1)."""
    delayed, current = _nodes(None), _nodes("current")
    assert _nodes("delayed").keys() == delayed.keys()  # the default is delayed scaling
    fwd = lambda ns: [n.split(".")[1] for n in ns if n.startswith("L1.") and ".fwd." in n]  # noqa: E731
    assert fwd(current) == [
        "attn_norm", "qkv_proj_fp8_cast", "qkv_proj", "rope", "attn_core", "attn_out_proj_fp8_cast",
        "attn_out_proj", "attn_bias_dropout_add", "mlp_norm", "mlp_up_gate_fp8_cast", "mlp_up_gate", "mlp_act",
        "mlp_down_fp8_cast", "mlp_down", "mlp_bias_dropout_add",
    ]  # fmt: skip
    # delayed: the norms write the FP8 input themselves (no forward cast) and the amax update runs
    assert "L1.qkv_proj_fp8_cast.fwd.mb0" not in delayed and "L1.fp8_scale_update.fwd.mb0" in delayed
    assert not any("amax" in n or "scale_update" in n for n in current)
    e = 8 * 64  # a norm's elements
    assert _size(delayed, "L1.attn_norm.fwd.mb0") == e * (2 + 1)  # read BF16, write FP8
    assert _size(current, "L1.attn_norm.fwd.mb0") == e * (2 + 2)  # read BF16, write BF16 (amax fused)
    assert _size(current, "L1.qkv_proj_fp8_cast.fwd.mb0") == e * (2 + 1)  # scale, then read BF16 write FP8
    # a Linear's input: 8 x 128 activations: delayed read 2 + write 2 (FP8 and transpose); current + 2 (amax)
    assert _size(delayed, "L1.mlp_down_fp8_cast.fwd.mb0") == 1024 * 4
    assert _size(current, "L1.mlp_down_fp8_cast.fwd.mb0") == 1024 * 6
    # backward output gradients of the SwiGLU up/gate (8 x 256): 8192 -> 12288 B
    assert _size(current, "L1.mlp_up_gate_fp8_cast.bwd.mb0") == 8 * 256 * 6
    # the weight re-cast after the step: 4 linears, 64 x 192 + 64 x 64 + 64 x 256 + 128 x 64 = 40,960
    # weights: read 2 + write 2 -> read 2 + 2 + write 2
    assert _size(delayed, "fp8_weight_cast.opt") == 40_960 * 4
    assert _size(current, "fp8_weight_cast.opt") == 40_960 * 6
    # the casts are launch-bound here: 3 kernels of 3.8 us (tracegen.gemm.LAUNCH_FLOOR_S) against 1
    dur = lambda ns, n: _value(ns[n][A.DURATION_NS])  # noqa: E731
    assert dur(delayed, "L1.mlp_down_fp8_cast.fwd.mb0") == 3_800
    assert dur(current, "L1.mlp_down_fp8_cast.fwd.mb0") == 3 * 3_800
    assert dur(current, "L1.qkv_proj_fp8_cast.fwd.mb0") == 2 * 3_800


def test_fp8_recipe_key_round_trips_and_refuses_bf16() -> None:
    assert spec_to_mapping(load_spec(_spec("current")))["fp8_recipe"] == "current"
    assert "fp8_recipe" not in spec_to_mapping(load_spec(_spec("delayed")))
    with pytest.raises(SpecError) as exc:
        load_spec(_spec("current", "bf16"))
    assert "fp8_recipe: current needs precision: fp8" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(SpecError) as exc:
        load_spec(_spec("nvfp4"))
    assert "fp8_recipe" in str(exc.value) and "\n" not in str(exc.value)


def test_current_scaling_amax_allreduce_under_sequence_parallelism_by_hand() -> None:
    """TP 2 with sequence parallelism: the inputs of the two column-parallel LayerNormLinears (forward) and
    the output gradients of the two row-parallel Linears (backward) have their amax all-reduced over the TP
    group (one FP32, MAX) between the norm or the gradient and the quantize; nothing under delayed scaling
    (its amaxes go in the per-chunk reduction) nor without sequence parallelism."""
    spec = {**_spec("current"), "sequence_parallel": True, "parallel": {"gpu": "H100", "tp": 2}}
    bundle = generate(load_spec(spec), rewrite=False)
    names = [n.name for n in bundle.nodes[0] if n.name.startswith("L1.")]
    reduces = [n for n in names if "amax_allreduce" in n]
    assert reduces == [
        "L1.qkv_proj_amax_allreduce.fwd.mb0",
        "L1.mlp_up_gate_amax_allreduce.fwd.mb0",
        "L1.mlp_down_amax_allreduce.bwd.mb0",
        "L1.attn_out_proj_amax_allreduce.bwd.mb0",
    ]
    for r in reduces:  # each right before its quantize
        assert names[names.index(r) + 1] == r.replace("amax_allreduce", "fp8_cast")
    sizes = {_value({a.name: a for a in n.attr}[A.COMM_SIZE]) for n in bundle.nodes[0] if n.name in reduces}
    assert sizes == {4}
    no_sp = generate(load_spec({**spec, "sequence_parallel": False}), rewrite=False)
    assert not any("_amax_allreduce" in n.name for n in no_sp.nodes[0])
