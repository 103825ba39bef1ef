"""The MoE layer's kernels read from Megatron-Core core_v0.14.0 and Transformer Engine v2.6 / v2.7 (round
moefid): GroupedLinear's per-expert FP8 quantize under current scaling, the fused permute's row-id map, the
router's capacity mask under token dropping, the load-balancing loss and the probabilities' all-to-all, each
against a hand count on a tiny MoE layer (hidden 64, 4 experts of FFN 32, top-2, 8 tokens, EP 2: two local experts a rank)."""

from __future__ import annotations

import json

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.gemm import LAUNCH_FLOOR_S
from xsim.tracegen.models import model_from_mapping
from xsim.tracegen.moe_ops import capacity_mask_ops, grouped_quantize, moe_block, permute_map_op
from xsim.tracegen.ops import Ctx, Op, shard_of
from xsim.tracegen.spec import spec_to_mapping
from xsim.traces import attrs as A

MOE = {"name": "tiny-moe", "layers": 1, "hidden": 64, "ffn_hidden": 128, "heads": 4, "vocab": 256, "seq_len": 8,
       "moe": {"experts": 4, "top_k": 2, "expert_ffn": 32}}  # fmt: skip
DROP = {**MOE, "moe": {**MOE["moe"], "capacity_factor": 1.0, "pad_to_capacity": True}}


def _ctx(model: dict, recipe: str) -> Ctx:
    m = model_from_mapping(model)
    return Ctx(m, shard_of(m, 1, 0), 1, 8, 2, False, "fp8", "flash", fp8_recipe=recipe)


def _attr(n, name):
    a = {x.name: x for x in n.attr}[name]
    return getattr(a, a.WhichOneof("value"))


def _gen(model: dict, recipe: str):
    spec = {"model": model, "precision": "fp8", "fp8_recipe": recipe, "parallel": {"gpu": "H100", "dp": 2, "ep": 2},
            "micro_batches": 1}  # fmt: skip
    return {n.name: n for n in generate(load_spec(spec), rewrite=False).nodes[0]}


def test_current_scaling_quantizes_each_local_expert_in_three_kernels_by_hand():
    # EP rank 0 runs its 8 tokens x top-2 copies for experts 0, 1 and its peer's: R = 16 rows of 64.
    # TE's split_quantize under current scaling: per expert amax (read 2 B), scale (FP32 amax in, scale and
    # scale_inv out: 12 B), cast (read 2 B, write the FP8 copy and its transpose: 2 B): 2 kernels each
    # (two local experts); 1,024 elements -> 2,048 B, 24 B, 4,096 B.
    c = _ctx(MOE, "current")
    amax, scale, cast = grouped_quantize(c, "moe_expert_up_gate", "fwd", 16 * 64, 2)
    assert [o.op for o in (amax, scale, cast)] == [
        "moe_expert_up_gate_fp8_amax", "moe_expert_up_gate_fp8_scale", "moe_expert_up_gate_fp8_cast"
    ]  # fmt: skip
    assert (amax.bytes, scale.bytes, cast.bytes) == (2_048, 24, 4_096)
    assert (amax.kernels, scale.kernels, cast.kernels) == (2, 2, 2)
    # delayed scaling: TE's one fused multi-tensor cast-transpose (read 2 B, write 1 + 1 B), one kernel
    (one,) = grouped_quantize(_ctx(MOE, "delayed"), "moe_expert_up_gate", "fwd", 16 * 64, 2)
    assert (one.op, one.bytes, one.kernels) == ("moe_expert_up_gate_fp8_cast", 4_096, 1)
    # in the layer: the up/gate input (16 x 64), the down input (16 x 32); backward the down projection's
    # output gradient (16 x 64) and the up/gate's (16 x 2 x 32)
    fwd = {s.op: s for s in moe_block(c, c.m.moe, 1, 2, 0, "fwd") if isinstance(s, Op)}
    bwd = {s.op: s for s in moe_block(c, c.m.moe, 1, 2, 0, "bwd") if isinstance(s, Op)}
    assert fwd["moe_expert_down_fp8_amax"].bytes == 16 * 32 * 2 == 1_024
    assert fwd["moe_expert_down_fp8_cast"].bytes == 16 * 32 * 4 == 2_048
    assert bwd["moe_expert_down_fp8_cast"].bytes == bwd["moe_expert_up_gate_fp8_cast"].bytes == 16 * 64 * 4
    # generated: each op at least one launch floor per kernel (3.8 us x 2 experts)
    nodes = _gen(MOE, "current")
    for name in ("amax", "scale", "cast"):
        n = nodes[f"L1.moe_expert_up_gate_fp8_{name}.fwd.mb0"]
        assert _attr(n, A.DURATION_NS) == round(2 * LAUNCH_FLOOR_S * 1e9) == 7_600


def test_fused_permute_builds_its_row_id_map_in_three_kernels_by_hand():
    # [8, 4] routing mask: pass 1 reads 1 B and writes 4 B, pass 2 reads and writes 4 B, pass 3 reads 4 B
    # per (token, expert) = 17 B x 32 = 544; pass 3 writes per token 2 x 2 + 1 int32s: 8 x 5 x 4 = 160
    op = permute_map_op(8, 4, 2)
    assert (op.op, op.phase, op.bytes, op.kernels) == ("moe_permute_map", "fwd", 704, 3)
    nodes = _gen(MOE, "current")
    assert _attr(nodes["L1.moe_permute_map.fwd.mb0"], A.TENSOR_SIZE) == 704
    assert not any(k.startswith("L1.moe_permute_map.bwd") for k in nodes)  # the map is kept for backward


def test_capacity_mask_of_token_dropping_by_hand():
    # capacity ceil(8 x 2 / 4 x 1.0) = 4 of each expert; [8, 4] probabilities. Forward, padded: topk reads
    # 4 B, zeros_like writes 4, .bool() 4 + 1, probs * mask 4 + 1 + 4 = 22 B x 32 = 704; per kept copy
    # (4 x 4 = 16): topk's value and index 12, scatter's index read and write 8 + 4 = 24 B x 16 = 384; 5
    # kernels. Backward: grad * mask, 4 + 1 + 4 = 9 B x 32 = 288, one kernel.
    m = model_from_mapping(DROP)
    fwd, bwd = capacity_mask_ops(m.moe, 8)
    assert [(o.op, o.bytes, o.kernels, o.flops) for o in fwd] == [("moe_capacity_mask", 1_088, 5, 32)]
    assert [(o.op, o.bytes, o.kernels, o.flops) for o in bwd] == [("moe_capacity_mask", 288, 1, 32)]
    # dropping without padding: logical_and as well (6 kernels, 25 B per element): 32 x 25 + 384 = 1,184
    nopad = model_from_mapping({**MOE, "moe": {**MOE["moe"], "capacity_factor": 1.0}})
    assert [(o.bytes, o.kernels) for o in capacity_mask_ops(nopad.moe, 8)[0]] == [(1_184, 6)]
    assert capacity_mask_ops(model_from_mapping(MOE).moe, 8) == ([], [])  # dropless: none
    nodes = _gen(DROP, "current")
    names = [k for k in nodes if k.startswith("L1.moe_")]
    assert names.index("L1.moe_capacity_mask.fwd.mb0") == names.index("L1.moe_router_topk.fwd.mb0") + 1
    assert names.index("L1.moe_capacity_mask.bwd.mb0") == names.index("L1.moe_router_topk.bwd.mb0") - 1


def test_the_probabilities_go_through_their_own_all_to_all_by_hand():
    # uniform: each source sends its peer the 8 copies for the peer's two experts, one FP32 each: 32 B a
    # peer, one ALL_TO_ALL collective of ep x 32 = 64 B forward and backward, after the tokens' 8 x 64 x 2 B
    nodes = _gen(MOE, "current")
    names = list(nodes)
    for phase in ("fwd", "bwd"):
        probs = nodes[f"L1.moe_dispatch_probs.{phase}.mb0"]
        assert _attr(probs, A.COMM_SIZE) == 2 * 8 * 4 == 64
        assert _attr(nodes[f"L1.moe_dispatch.{phase}.mb0"], A.COMM_SIZE) == 2 * 8 * 64 * 2
        assert (
            names.index(f"L1.moe_dispatch_probs.{phase}.mb0")
            == names.index(f"L1.moe_dispatch.{phase}.mb0") + 1
        )


def test_load_balancing_loss_kernels_by_hand():
    # aux_loss_coeff > 0 (Megatron-Core's moe_aux_loss_coeff, fused router): on the [8, 4] BF16 logits,
    # forward 5 kernels moving 4 x 2 + 2 = 10 B per element (scores, mask, intermediate, the mask's sum, the
    # loss): 320 B; backward 5 kernels moving 7 x 2 = 14 B per element: 448 B. Softmax FLOPs 5 (10 backward).
    aux = {**MOE, "moe": {**MOE["moe"], "aux_loss_coeff": 0.001}}
    c = _ctx(aux, "current")
    fwd = {s.op: s for s in moe_block(c, c.m.moe, 1, 2, 0, "fwd") if isinstance(s, Op)}
    bwd = {s.op: s for s in moe_block(c, c.m.moe, 1, 2, 0, "bwd") if isinstance(s, Op)}
    assert (fwd["moe_aux_loss"].bytes, fwd["moe_aux_loss"].kernels, fwd["moe_aux_loss"].flops) == (
        320,
        5,
        160,
    )
    assert (bwd["moe_aux_loss"].bytes, bwd["moe_aux_loss"].kernels, bwd["moe_aux_loss"].flops) == (
        448,
        5,
        320,
    )
    c0 = _ctx(MOE, "current")  # no coefficient: no loss kernels
    assert not any(
        s.op == "moe_aux_loss" for s in moe_block(c0, c0.m.moe, 1, 2, 0, "fwd") if isinstance(s, Op)
    )
    # the key round-trips through deployment.json and is written only when set
    spec = {"model": aux, "parallel": {"gpu": "H100", "dp": 2, "ep": 2}}
    dep = load_spec(spec)
    out = spec_to_mapping(dep)
    assert out["model"]["moe"]["aux_loss_coeff"] == 0.001 and load_spec(json.loads(json.dumps(out))) == dep
    plain = spec_to_mapping(load_spec({**spec, "model": MOE}))
    assert "aux_loss_coeff" not in plain["model"]["moe"]
    with pytest.raises(SpecError) as exc:
        load_spec({**spec, "model": {**MOE, "moe": {**MOE["moe"], "aux_loss_coeff": -1}}})
    assert "aux_loss_coeff must be a number >= 0" in str(exc.value) and "\n" not in str(exc.value)


def test_the_router_weight_gradient_is_added_into_main_grad_by_hand():
    # Megatron-Core's DDP hook: main_grad (FP32, the default gradient buffer) += the router weight's
    # gradient (BF16): 64 x 4 = 256 parameters x (4 + 4 + 2) B = 2,560 B, one kernel, 256 FLOPs
    c = _ctx(MOE, "current")
    bwd = [s for s in moe_block(c, c.m.moe, 1, 2, 0, "bwd") if isinstance(s, Op)]
    add = bwd[-1]
    assert (add.op, add.bytes, add.kernels, add.flops) == ("moe_router_main_grad_add", 2_560, 1, 256)
    assert bwd[-2].op == "moe_router"
