"""Megatron-Core's selective recompute modules (`recompute_modules`, core_v0.14.0 23e00ed096): what each
re-runs in a layer's backward and what activation memory it frees, on tiny models worked out by hand.

Tiny dense layer (megatron-core, TP 1, BF16 b = 2, one sequence of s = 32 tokens): h 64, 4 heads of d 16
(kv_heads 4), SwiGLU FFN f 128, RMSNorm, no biases; t = 32 tokens. GEMM [M,K]x[K,N]: 2MKN FLOPs, bytes
b(MK + KN) + b MN (tracegen.ops._gemm).
Tiny MoE layer: the same attention, 4 experts, top-2, expert FFN 32, one shared expert (width 32), uniform
routing: 32 x 2 = 64 token copies, 16 per expert, all on the one EP rank (ep 1).
"""

from __future__ import annotations

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.frameworks import FRAMEWORKS
from xsim.tracegen.memory import deployment_memory, layer_activation_bytes, rematerialized_bytes
from xsim.tracegen.mla import with_mla
from xsim.tracegen.models import ModelArch
from xsim.tracegen.moe import MlaSpec, MoeSpec
from xsim.tracegen.moe_ops import EP_TAG_BASE, moe_activation_model, moe_layer_steps
from xsim.tracegen.ops import Ctx, Op, layer_steps, shard_of, with_recompute
from xsim.tracegen.spec import spec_to_mapping
from xsim.traces import attrs as A
from xsim.traces import pb

FW = FRAMEWORKS["megatron-core"]  # hidden dropout 0.1 and attention dropout 0.1: masks stored, LSE kept
DENSE = ModelArch("tiny", 2, 64, 128, 4, 4, 256, 32)
MOE = ModelArch(
    "tinymoe", 2, 64, 128, 4, 4, 256, 32, moe=MoeSpec(experts=4, top_k=2, expert_ffn=32, shared_experts=1)
)
MLA = ModelArch("tinymla", 2, 64, 128, 4, 4, 256, 32, mla=MlaSpec(16, 16, 16, 8, 16))
TINY_SPEC = {
    "name": "tiny", "layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 4, "vocab": 256,
    "seq_len": 32, "activation": "swiglu", "norm": "rmsnorm", "linear_bias": False,
}  # fmt: skip


def ctx(m: ModelArch) -> Ctx:
    return Ctx(m, shard_of(m, 1, 0), 1, 32, 2, False, fw=FW)


def extra(fwd: list, bwd: list, c: Ctx, modules: tuple[str, ...], moe_layer: bool = False):
    """(names, FLOPs, bytes) of the steps `modules` add to the layer's backward `bwd`."""
    got = with_recompute(bwd, fwd, c, modules, moe_layer)
    old = {id(s) for s in bwd}
    new = [s for s in got if id(s) not in old]
    ops = [s for s in new if isinstance(s, Op)]
    return [s.op for s in new], sum(o.flops for o in ops), sum(o.bytes for o in ops)


def dense_layer():
    c = ctx(DENSE)
    return layer_steps(c, "fwd"), layer_steps(c, "bwd"), c


def moe_layer():
    c = ctx(MOE)
    return moe_layer_steps(c, MOE.moe, 1, 1, 0, "fwd"), moe_layer_steps(c, MOE.moe, 1, 1, 0, "bwd"), c


def test_dense_layer_recomputes_per_module():
    fwd, bwd, c = dense_layer()
    # core_attn: causal flash attention, 4 b s^2 heads d / 2 = 4 x 32^2 x 4 x 16 / 2 = 131,072 FLOPs; bytes
    # b s d (2 heads + 2 kv) = 2 x 32 x 16 x 16 = 16,384.
    assert extra(fwd, bwd, c, ("core_attn",)) == (["attn_core"], 131_072, 16_384)
    # mlp (TE's fused MLP from its norm through fc2): RMSNorm 4 x 2,048 = 8,192 FLOPs, 2,048 x (2 + 2) =
    # 8,192 B; up/gate 2 x 32 x 64 x 256 = 1,048,576 FLOPs, 2 (2,048 + 16,384) + 2 x 8,192 = 53,248 B;
    # SwiGLU 5 x 4,096 = 20,480 FLOPs, 3 x 4,096 x 2 = 24,576 B; down 2 x 32 x 128 x 64 = 524,288 FLOPs,
    # 2 (4,096 + 8,192) + 2 x 2,048 = 28,672 B: 1,601,536 FLOPs, 114,688 B.
    assert extra(fwd, bwd, c, ("mlp",)) == (
        ["mlp_norm", "mlp_up_gate", "mlp_act", "mlp_down"],
        1_601_536,
        114_688,
    )
    # Parts this layer lacks: its norms are inside TE's LayerNormLinear (IdentityOp under the TE spec), no MoE.
    for module in ("layernorm", "moe", "shared_experts"):
        assert extra(fwd, bwd, c, (module,)) == ([], 0, 0)
    # The MLP re-runs when its CheckpointFunction's backward starts: after the bias-dropout-add's backward,
    # before fc2's; the attention core before its own backward.
    got = [s.op for s in with_recompute(bwd, fwd, c, ("core_attn", "mlp"))]
    at = got.index("mlp_bias_dropout_add")
    assert got[at : at + 6] == [
        "mlp_bias_dropout_add",
        "mlp_norm",
        "mlp_up_gate",
        "mlp_act",
        "mlp_down",
        "mlp_down",
    ]
    assert got[got.index("attn_out_proj") + 1 : got.index("attn_out_proj") + 3] == ["attn_core", "attn_core"]


def test_dense_layer_memory_per_module():
    # Stored per layer (s 32, b 1, sbh 2,048): norm inputs 2 x 4,096, QKV and MLP inputs 2 x 4,096, dropout
    # masks 4,096 (20,480); Q, K, V 6 x 2,048 = 12,288; projection input 4,096; SwiGLU gate and up 4 x 32 x
    # 128 = 16,384, fc2 input 8,192; log-sum-exp 4 x 4 x 32 = 512: 61,952 B without recompute.
    def stored(mods):
        return layer_activation_bytes(DENSE, 32, 1, 1, False, "selective", True, modules=mods)

    assert layer_activation_bytes(DENSE, 32, 1, 1, False, "none", True) == 61_952
    assert (
        stored(("core_attn",))
        == 61_952 - 512
        == layer_activation_bytes(DENSE, 32, 1, 1, False, "selective", True)
    )
    # mlp frees the MLP input 4,096 and the f-wide 16,384 + 8,192: 28,672; it keeps the norm's input.
    assert stored(("mlp",)) == 61_952 - 28_672 == 33_280
    assert stored(("core_attn", "mlp")) == 32_768
    assert stored(("layernorm", "moe", "moe_act", "shared_experts")) == 61_952  # nothing on this layer
    # The backward holds one layer's MLP again while it runs (core_attn's LSE left out, as before).
    assert rematerialized_bytes(DENSE, 32, 1, 1, False, True, False, ("core_attn", "mlp"), False) == 28_672
    assert rematerialized_bytes(DENSE, 32, 1, 1, False, True, False, ("core_attn",), False) == 0


def test_moe_layer_recomputes_per_module():
    fwd, bwd, c = moe_layer()
    # moe_act: the weighted SwiGLU over 64 copies x 32 = 2,048 elements, 5 x 2,048 = 10,240 FLOPs, 3 x 2,048
    # x 2 = 12,288 B, then CheckpointWithoutOutput's copy of its output into the discarded storage, 2 x
    # 2,048 x 2 = 8,192 B: 10,240 FLOPs, 20,480 B, right before fc2's backward.
    names, flops, byt = extra(fwd, bwd, c, ("moe_act",), True)
    assert (names, flops, byt) == (["moe_expert_act", "moe_expert_act_restore"], 10_240, 20_480)
    got = [s.op for s in with_recompute(bwd, fwd, c, ("moe_act",), True)]
    assert got[got.index("moe_expert_act_restore") + 1] == "moe_expert_down"
    # layernorm: the MoE layer's pre-MLP norm (a TENorm of its own), 4 x 2,048 = 8,192 FLOPs, 8,192 B, and
    # its copy 8,192 B, before the MoE block's backward.
    assert extra(fwd, bwd, c, ("layernorm",), True) == (["mlp_norm", "mlp_norm_restore"], 8_192, 16_384)
    # shared_experts: up/gate 2 x 32 x 64 x 64 = 262,144 FLOPs, 2 (2,048 + 4,096) + 2 x 2,048 = 16,384 B;
    # SwiGLU 5 x 1,024 = 5,120 FLOPs, 6,144 B; down 2 x 32 x 32 x 64 = 131,072 FLOPs, 2 (1,024 + 2,048) +
    # 4,096 = 10,240 B: 398,336 FLOPs, 32,768 B.
    shared = ["moe_shared_up_gate", "moe_shared_act", "moe_shared_down"]
    assert extra(fwd, bwd, c, ("shared_experts",), True) == (shared, 398_336, 32_768)
    # moe: the whole block. Router 2 x 32 x 64 x 4 = 16,384 FLOPs, 2 (2,048 + 256) + 2 x 128 = 4,864 B; top-k
    # softmax 5 x 128 = 640 FLOPs, 128 x 6 = 768 B; permute (32 + 64) x 64 x 2 = 12,288 B; sort by expert
    # 2 x 64 x (128 + 4) = 16,896 B; grouped up/gate 2 x 64 x 64 x 64 = 524,288 FLOPs, 2 (4,096 + 4 x 4,096)
    # + 2 x 4,096 = 49,152 B; SwiGLU 10,240 FLOPs, 12,288 B; grouped down 2 x 64 x 32 x 64 = 262,144 FLOPs,
    # 2 (2,048 + 4 x 2,048) + 8,192 = 28,672 B; unsort 2 x 64 x 128 = 16,384 B; unpermute 2 x 64 x 64 =
    # 8,192 FLOPs, 96 x 128 + 64 x 4 = 12,544 B; the shared experts 398,336 FLOPs, 32,768 B; their add 2,048
    # FLOPs, 3 x 2,048 x 2 = 12,288 B; the fused permute's row-id map over the [T, E] routing mask (round
    # moefid: 17 B an element of 32 x 4 = 128, plus 32 tokens x 5 x 4 B) 2,176 + 640 = 2,816 B: 1,222,272
    # FLOPs, 201,728 B (the all-to-alls have no peer at ep 1).
    names, flops, byt = extra(fwd, bwd, c, ("moe",), True)
    assert (flops, byt) == (1_222_272, 201_728)
    assert names[0] == "moe_router" and names[-1] == "moe_shared_add" and "moe_dispatch" in names
    # Nested: under moe the shared experts' own checkpoint re-runs them once more, before their backward.
    both = [s.op for s in with_recompute(bwd, fwd, c, ("layernorm", "moe", "shared_experts"), True)]
    at = both.index("mlp_norm_restore")
    assert (
        both[at + 1] == "moe_router" and both[at + 18 : at + 21] == shared
    )  # (moefid: + moe_permute_map, moe_dispatch_probs)
    assert both.count("moe_shared_act") == 3  # the backward's own, and two recomputes
    # mlp does not apply to a MoELayer (transformer_layer.py: `not isinstance(self.mlp, MoELayer)`).
    assert extra(fwd, bwd, c, ("mlp",), True) == ([], 0, 0)


def test_moe_layer_memory_per_module():
    # The memory fit's MoE stand-in: FFN width 2 x 32 + 32 = 96. Stored: 20,480 (as dense) + Q, K, V
    # 12,288 + projection input 4,096 + routed gate/up 4 x 32 x 64 = 8,192 and fc2 input 4,096 + shared
    # 4 x 32 x 32 = 4,096 and 2,048 + LSE 512 = 55,808 B.
    m = moe_activation_model(MOE)

    def stored(mods):
        return layer_activation_bytes(m, 32, 1, 1, False, "selective", True, modules=mods, moe_layer=True)

    assert layer_activation_bytes(m, 32, 1, 1, False, "none", True) == 55_808
    assert stored(("moe_act",)) == 55_808 - 4_096  # the routed experts' fc2 input
    assert stored(("layernorm",)) == 55_808 - 4_096  # the pre-MLP norm's output (the block's input)
    assert stored(("shared_experts",)) == 55_808 - 6_144
    assert stored(("moe",)) == 55_808 - 18_432  # every f-wide tensor; the block's input stays
    assert stored(("moe", "moe_act", "shared_experts")) == 55_808 - 18_432  # contained in moe
    assert stored(("layernorm", "moe")) == 33_280
    assert rematerialized_bytes(m, 32, 1, 1, False, True, False, ("layernorm", "moe"), True) == 22_528


def test_mla_up_proj_and_input_norm():
    c = ctx(MLA)
    fwd = with_mla(layer_steps(c, "fwd"), c, MLA.mla, "fwd")
    bwd = with_mla(layer_steps(c, "bwd"), c, MLA.mla, "bwd")
    # q_lora 16, kv_lora 16, qk 16 + 8, v 16, 4 heads: q norm 4 x 512 = 2,048 FLOPs, 2,048 B; q up 2 x 32 x 16
    # x 96 = 98,304 FLOPs, 2 (512 + 1,536) + 2 x 3,072 = 10,240 B; kv norm 2,048, 2,048 B; kv up 2 x 32 x 16 x
    # 128 = 131,072 FLOPs, 2 (512 + 2,048) + 2 x 4,096 = 13,312 B; RoPE 32 x 5 x 8 = 1,280 elements, 3,840
    # FLOPs, 5,120 B; query, key, value copied back: 32 x 4 x (2 x 24 + 16) = 8,192 elements, 32,768 B.
    names, flops, byt = extra(fwd, bwd, c, ("mla_up_proj",))
    assert names == ["mla_q_norm", "mla_q_up", "mla_kv_norm", "mla_kv_up", "rope", "mla_qkv_restore"]
    assert (flops, byt) == (237_312, 65_536)
    # The hook on the attention output fires before core_attn's checkpoint: up projections first.
    got = [s.op for s in with_recompute(bwd, fwd, c, ("core_attn", "mla_up_proj"))]
    assert got[got.index("mla_qkv_restore") + 1 : got.index("mla_qkv_restore") + 3] == [
        "attn_core",
        "attn_core",
    ]
    # layernorm: an MLA layer's input norm is a TENorm: 8,192 FLOPs, 8,192 B and its copy, before the
    # output projection's backward.
    assert extra(fwd, bwd, c, ("layernorm",)) == (["attn_norm", "attn_norm_restore"], 8_192, 16_384)
    # Memory: query, key, value (the fit counts MLA's at hidden width: 6 x 2,048 = 12,288 B) and, for
    # layernorm, the norm's output 4,096 B.
    none = layer_activation_bytes(MLA, 32, 1, 1, False, "none", True)
    assert (
        none - layer_activation_bytes(MLA, 32, 1, 1, False, "selective", True, modules=("mla_up_proj",))
        == 12_288
    )
    assert (
        none - layer_activation_bytes(MLA, 32, 1, 1, False, "selective", True, modules=("layernorm",))
        == 4_096
    )


def spec(**extra) -> dict:
    out = {
        "model": dict(TINY_SPEC), "seq_len": 32, "framework": "megatron-core", "recompute": "selective",
        "parallel": {"gpu": "H100", "tp": 1, "pp": 1, "dp": 1, "micro_batch": 1, "global_batch": 1},
    }  # fmt: skip
    out.update(extra)
    return out


def test_default_modules_are_recompute_selective_bit_for_bit():
    plain = generate(load_spec(spec()))
    named = load_spec(spec(recompute_modules=["core_attn"]))
    assert "recompute_modules" not in spec_to_mapping(named)
    assert [bytes(n.SerializeToString()) for n in generate(named).nodes[0]] == [
        bytes(n.SerializeToString()) for n in plain.nodes[0]
    ]
    both = load_spec(spec(recompute_modules=["mlp", "core_attn", "mlp"]))
    assert spec_to_mapping(both)["recompute_modules"] == ["core_attn", "mlp"]  # Megatron's order, once each


def test_recomputed_tp_collectives_and_all_to_alls_are_tagged_recompute():
    tp = spec(sequence_parallel=True)
    tp["parallel"] = {"gpu": "H100", "tp": 2, "pp": 1, "dp": 1, "micro_batch": 1, "global_batch": 1}
    nodes = generate(load_spec({**tp, "recompute_modules": ["mlp"]}), only=[0]).nodes[0]
    rec = [n for n in nodes if A.get_str(n, A.PHASE) == "recompute" and A.get_int(n, A.LAYER) == 1]
    # TE's MLP under SP: the input's AllGather (16 x 64 x 2 = 2,048 B a rank) and fc2's ReduceScatter (32 x
    # 64 x 2 = 4,096 B), re-run with the forward's sizes.
    comms = [(n.name.split(".")[1], A.get_int(n, A.COMM_SIZE)) for n in rec if n.type == pb.COMM_COLL_NODE]
    assert comms == [("mlp_tp_in", 2_048), ("mlp_tp_out", 4_096)]
    dur = {n.name: n.duration_micros for n in nodes}
    assert dur["L1.mlp_up_gate.recompute.mb0"] == dur["L1.mlp_up_gate.fwd.mb0"] > 0
    moe = spec(
        model={**TINY_SPEC, "moe": {"experts": 4, "top_k": 2, "expert_ffn": 32}}, recompute_modules=["moe"]
    )
    moe["parallel"] = {"gpu": "H100", "tp": 1, "pp": 1, "dp": 2, "ep": 2, "micro_batch": 1, "global_batch": 2}
    nodes = generate(load_spec(moe), only=[0]).nodes[0]
    a2a = [
        n.name for n in nodes if A.get_int(n, A.LAYER) == 1 and ".moe_" in n.name and n.type != pb.COMP_NODE
    ]
    # balanced routing: one ALL_TO_ALL each; the backward runs the combine's gradient first
    # (round moefid: the routing probabilities' own all-to-all after the tokens', forward, recompute, backward)
    fwd_order = [
        f"L1.moe_{w}.{p}.mb0" for p in ("fwd", "recompute") for w in ("dispatch", "dispatch_probs", "combine")
    ]
    bwd_order = [f"L1.moe_{w}.bwd.mb0" for w in ("combine", "dispatch", "dispatch_probs")]
    assert a2a == [*fwd_order, *bwd_order]
    # Skewed routing (EP rank 0's experts weigh 3 + 1, rank 1's 1 + 1): P2P pairs, whose tags name the
    # recompute's own all-to-alls (moe_ops.A2A_INDEX 4 and 5): 2^30 + 16 (moe_ops.A2A_SLOTS x (layer 1 x 1
    # micro-batch + 0)) + 4, 5.
    moe["model"]["moe"]["routing"] = {"weights": [3, 1, 1, 1]}
    nodes = generate(load_spec(moe), only=[0]).nodes[0]
    tags = {n.name.rsplit(".", 1)[0]: A.get_int(n, A.COMM_TAG) for n in nodes if n.type == pb.COMM_SEND_NODE}
    assert tags["L1.moe_dispatch.recompute.mb0"] == EP_TAG_BASE + 16 + 4
    assert tags["L1.moe_combine.recompute.mb0"] == EP_TAG_BASE + 16 + 5


def test_moe_memory_fit_counts_dense_and_moe_layers_apart():
    # 4 layers, layer 1 dense (the stand-in's terms for every layer, 55,808 B each without recompute):
    # [mlp, moe] frees 22,528 on the dense layer (its MLP input too) and 18,432 on each MoE layer, and the
    # backward holds one layer's again, the most 22,528: 4 x 55,808 - (22,528 + 3 x 18,432) + 22,528 =
    # 223,232 - 55,296 = 167,936, 55,296 B less than without recompute.
    model = {
        **TINY_SPEC,
        "layers": 4,
        "moe": {"experts": 4, "top_k": 2, "expert_ffn": 32, "shared_experts": 1, "layers": "2-4"},
    }
    none = deployment_memory(load_spec(spec(model=model, recompute="none")))[0].activations
    mods = deployment_memory(load_spec(spec(model=model, recompute_modules=["mlp", "moe"])))[0].activations
    assert none - mods == 55_296


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"recompute_modules": ["moe_act"]}, "moe_act needs a MoE model"),
        ({"recompute_modules": ["mla_up_proj"]}, "mla_up_proj needs an MLA model"),
        ({"recompute_modules": ["attn"]}, "unknown module 'attn'"),
        ({"recompute_modules": []}, "recompute_modules is empty"),
        ({"recompute_modules": "mlp"}, "must be a list of module names"),
        ({"recompute": "full", "recompute_modules": ["mlp"]}, "applies to recompute: selective only"),
        (
            {"framework": "megatron-2022", "recompute_modules": ["core_attn"]},
            "needs framework: megatron-core",
        ),
        ({"precision": "fp8", "recompute_modules": ["layernorm"]}, "layernorm with precision: fp8"),
    ],
)
def test_refused_in_one_line(extra, message):
    with pytest.raises(SpecError, match=message) as e:
        load_spec(spec(**extra))
    assert "\n" not in str(e.value)


def test_modules_of_parts_the_model_lacks_are_accepted_and_skipped():
    # Megatron-Core accepts moe and shared_experts on a dense model and layernorm where TE fuses the norm, and
    # recomputes nothing for them: the trace of `none` with its phases unchanged.
    none = generate(load_spec(spec(recompute="none"))).nodes[0]
    got = generate(load_spec(spec(recompute_modules=["moe", "shared_experts", "layernorm"]))).nodes[0]
    assert [n.name for n in got] == [n.name for n in none]
