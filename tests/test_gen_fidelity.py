"""Megatron training features in the generator: recompute, interleaved 1F1B, distributed optimizer, `parallel:`.

Every expected number here is worked out by hand (or copied from Megatron-LM's own documentation), not
read back from the generator.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.ops import ATTN_CORE_OPS
from xsim.tracegen.schedule import interleaved
from xsim.tracegen.spec import spec_to_mapping
from xsim.traces import attrs as A
from xsim.traces import pb

from xsim.cli import main

REPO = Path(__file__).resolve().parents[1]
# 4 layers of a tiny SwiGLU / RMSNorm model: per layer 41,088 parameters per rank at TP 1 (QKV 64*192,
# output 64*64, up/gate 64*256, down 128*64, two norms of 64), embedding and head 256*64 = 16,384 each.
TINY = {
    "name": "tiny", "layers": 4, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 4, "vocab": 256,
    "seq_len": 32, "activation": "swiglu", "norm": "rmsnorm",
}  # fmt: skip
# One layer forward as Megatron-Core runs it (the default `framework:`): RoPE, fused bias-dropout-add.
LAYER_FWD = [
    "attn_norm", "qkv_proj", "rope", "attn_core", "attn_out_proj", "attn_bias_dropout_add",
    "mlp_norm", "mlp_up_gate", "mlp_act", "mlp_down", "mlp_bias_dropout_add",
]  # fmt: skip
# Backward adds the two residual-gradient accumulations and the q/k/v split's gradient cat (Megatron-Core,
# RoPE): 14 compute ops. Embedding: lookup + dropout (2 per
# pass); head: final norm, LM head, loss (3); optimizer step: grad_norm, grad_clip, Adam, param_copy,
# zero_grad (5 COMP) and the grad-norm AllReduce when the model-parallel group has more than one rank.
# Megatron-Core's DDP hook adds the layer's norm gains (one node after each layer's backward) and the final
# norm's (one after the head's backward) into main_grad: 14 + 1 layer and 3 + 1 head backward nodes.
LAYER_BWD_OPS, EMB_OPS, HEAD_OPS, OPT_OPS = 15, 2, 3, 5
HEAD_BWD_OPS = HEAD_OPS + 1
# Megatron-Core's embedding backward adds the gradient's zero fill and the main_grad add (2 more nodes);
# at DP 1 each model chunk's one bucket is NaN-checked before the step (a node per chunk).
EMB_BWD_OPS, NAN_CHECKS_PER_CHUNK = EMB_OPS + 2, 1


def pp2(**extra) -> dict:
    """TP 1, PP 2, one replica, 4 micro-batches, interleaved over 2 model chunks unless overridden."""
    return {
        "model": TINY,
        "micro_batches": 4,
        "schedule": "1f1b",
        "virtual_stages": 2,
        "device_groups": [
            {"id": 0, "gpu": "H100", "ranks": [0], "pp_stage": 0},
            {"id": 1, "gpu": "H100", "ranks": [1], "pp_stage": 1},
        ],
        **extra,
    }


def compute_passes(nodes, chunk_of_layer):
    """The (F|B, model chunk, micro-batch) passes of a rank's compute chain, in node order."""
    out = []
    for n in nodes:
        phase = A.get_str(n, A.PHASE)
        if n.type != pb.COMP_NODE or phase not in ("fwd", "bwd"):
            continue
        layer = A.get_int(n, A.LAYER)
        if layer == 0:
            continue  # embedding / head belong to the pass of the adjacent layer
        key = (phase[0].upper(), chunk_of_layer[layer], A.get_int(n, A.MICRO_BATCH))
        if not out or out[-1] != key:
            out.append(key)
    return out


# Megatron-LM forward_backward_pipelining_with_interleaving, P = 2, V = 2, M = 4, written out by hand:
# forward k (k = 0..7) runs chunk (k mod 4) // 2 on micro-batch (k // 4) * 2 + k mod 2, i.e. the
# sequence c0m0 c0m1 c1m0 c1m1 c0m2 c0m3 c1m2 c1m3; backward k the mirror chunk: c1m0 c1m1 c0m0 c0m1 c1m2
# c1m3 c0m2 c0m3. Warm-up: rank 0 (2-0-1)*2 + (2-1)*2 = 4 forwards, rank 1 (2-1-1)*2 + 2 = 2; then one
# forward and one backward alternate; the rest are cool-down backwards.
INTERLEAVED_P2_V2_M4 = {
    0: [
        ("F", 0, 0), ("F", 0, 1), ("F", 1, 0), ("F", 1, 1),
        ("F", 0, 2), ("B", 1, 0), ("F", 0, 3), ("B", 1, 1), ("F", 1, 2), ("B", 0, 0), ("F", 1, 3), ("B", 0, 1),
        ("B", 1, 2), ("B", 1, 3), ("B", 0, 2), ("B", 0, 3),
    ],
    1: [
        ("F", 0, 0), ("F", 0, 1),
        ("F", 1, 0), ("B", 1, 0), ("F", 1, 1), ("B", 1, 1), ("F", 0, 2), ("B", 0, 0), ("F", 0, 3), ("B", 0, 1),
        ("F", 1, 2), ("B", 1, 2), ("F", 1, 3), ("B", 1, 3),
        ("B", 0, 2), ("B", 0, 3),
    ],
}  # fmt: skip


def test_interleaved_schedule_matches_megatron_by_hand():
    for rank, want in INTERLEAVED_P2_V2_M4.items():
        assert interleaved(4, 2, rank, 2) == want


# The 76B row's shape (narayanan21-t1-76b: P = 4, V = 3), at M = 8 micro-batches, written out by hand from
# Megatron-LM de7dc40f88 megatron/schedules.py forward_backward_pipelining_with_interleaving ("F2.5":
# forward of chunk 2 on micro-batch 5). Forward k (k = 0..23) runs chunk (k mod 12) // 4 on micro-batch
# (k // 12) * 4 + k mod 4: F0.0-F0.3 F1.0-F1.3 F2.0-F2.3 F0.4-F0.7 F1.4-F1.7 F2.4-F2.7; backward k the mirror
# chunk 2 - (k mod 12) // 4: B2.0-B2.3 B1.0-B1.3 B0.0-B0.3 B2.4-B2.7 B1.4-B1.7 B0.4-B0.7. Warm-up: stage 0
# (4-0-1)*2 + (3-1)*4 = 14 forwards, stage 3 (4-3-1)*2 + 8 = 8; then forward 14 (8) pairs with backward 0,
# one of each per step; the last 14 (8) backwards cool down. 14 + 2*10 + 14 = 8 + 2*16 + 8 = 48 = 2*M*V.
INTERLEAVED_P4_V3_M8 = {
    0: "F0.0 F0.1 F0.2 F0.3 F1.0 F1.1 F1.2 F1.3 F2.0 F2.1 F2.2 F2.3 F0.4 F0.5 "
    "F0.6 B2.0 F0.7 B2.1 F1.4 B2.2 F1.5 B2.3 F1.6 B1.0 F1.7 B1.1 F2.4 B1.2 F2.5 B1.3 F2.6 B0.0 F2.7 B0.1 "
    "B0.2 B0.3 B2.4 B2.5 B2.6 B2.7 B1.4 B1.5 B1.6 B1.7 B0.4 B0.5 B0.6 B0.7",
    3: "F0.0 F0.1 F0.2 F0.3 F1.0 F1.1 F1.2 F1.3 "
    "F2.0 B2.0 F2.1 B2.1 F2.2 B2.2 F2.3 B2.3 F0.4 B1.0 F0.5 B1.1 F0.6 B1.2 F0.7 B1.3 "
    "F1.4 B0.0 F1.5 B0.1 F1.6 B0.2 F1.7 B0.3 F2.4 B2.4 F2.5 B2.5 F2.6 B2.6 F2.7 B2.7 "
    "B1.4 B1.5 B1.6 B1.7 B0.4 B0.5 B0.6 B0.7",
}


def test_interleaved_schedule_of_the_76b_shape_matches_megatron_by_hand():
    for rank, text in INTERLEAVED_P4_V3_M8.items():
        want = [(t[0], int(t[1]), int(t[3])) for t in text.split()]
        assert interleaved(8, 4, rank, 3) == want


def test_interleaved_with_as_many_micro_batches_as_stages_warms_up_every_pass_in_2021_code():
    # P = 2, V = 2, M = 2: forwards F0.0 F0.1 F1.0 F1.1, backwards B1.0 B1.1 B0.0 B0.1. Megatron-LM
    # de7dc40f88 (get_num_microbatches() == pipeline_parallel_size): every stage warms up with all 4
    # forwards, then 4 backwards. The rule of 2024-11 on (and xsim's default): stage 1 warms up with
    # min((2-1-1)*2 + (2-1)*2, 4) = 2 forwards, then F1.0 B1.0 F1.1 B1.1, then B0.0 B0.1; stage 0's
    # min(2 + 2, 4) = 4 is all of them either way.
    def seq(text: str) -> list[tuple[str, int, int]]:
        return [(t[0], int(t[1]), int(t[3])) for t in text.split()]

    every = seq("F0.0 F0.1 F1.0 F1.1 B1.0 B1.1 B0.0 B0.1")
    assert interleaved(2, 2, 1, 2, all_warmup_at_m_eq_p=True) == every
    assert interleaved(2, 2, 0, 2, all_warmup_at_m_eq_p=True) == every
    assert interleaved(2, 2, 0, 2) == every
    assert interleaved(2, 2, 1, 2) == seq("F0.0 F0.1 F1.0 B1.0 F1.1 B1.1 B0.0 B0.1")
    # M = 2P: the rule does not apply (stage 1 warms up with 2 of 8, as INTERLEAVED_P2_V2_M4)
    assert interleaved(4, 2, 1, 2, all_warmup_at_m_eq_p=True) == INTERLEAVED_P2_V2_M4[1]


def test_interleaved_graph_order_chunks_and_node_counts_by_hand():
    dep = load_spec(pp2())
    # Megatron's assignment: 4 layers in P*V = 4 chunks, chunk j on stage j mod 2.
    assert [[(c.start, c.end) for c in dg.chunks] for dg in dep.device_groups] == [
        [(1, 1), (3, 3)],
        [(2, 2), (4, 4)],
    ]
    b = generate(dep)
    chunk_of_layer = {1: 0, 3: 1, 2: 0, 4: 1}
    for rank, want in INTERLEAVED_P2_V2_M4.items():
        assert compute_passes(b.nodes[rank], chunk_of_layer) == want
    # Per micro-batch, rank 0: chunk 0 forward = embedding (2) + 11 layer ops, chunk 1 forward 11, chunk 1
    # backward 15, chunk 0 backward 15 + embedding (4) = 58 compute nodes; P2P: send act (c0), recv act (c1,
    # from the last stage: the wrap-around hop), send act (c1), recv grad (c1), send grad (c1, the hop
    # back), recv grad (c0) = 6. Times 4 micro-batches, plus the two chunks' bucket NaN checks and the
    # optimizer step: 4*58 + 2 + 5 = 239 and 24.
    # Rank 1: layer 2 fwd 11, layer 4 fwd 11 + head 3, bwd 15 + 15 + 4: 59 compute; P2P: recv act (c0), send
    # act (c0 -> stage 0 chunk 1), recv act (c1), send grad (c1), recv grad (c0), send grad (c0) = 6.
    fwd, bwd = len(LAYER_FWD), LAYER_BWD_OPS
    per0 = EMB_OPS + 2 * fwd + 2 * bwd + EMB_BWD_OPS
    per1 = 2 * fwd + HEAD_OPS + 2 * bwd + HEAD_BWD_OPS
    assert (per0, per1) == (58, 59)
    nan = 2 * NAN_CHECKS_PER_CHUNK
    want = {0: (4 * per0 + nan + OPT_OPS, 4 * 3, 4 * 3), 1: (4 * per1 + nan + OPT_OPS, 4 * 3, 4 * 3)}
    for rank, (comp, sends, recvs) in want.items():
        c = Counter(n.type for n in b.nodes[rank])
        assert (c[pb.COMP_NODE], c[pb.COMM_SEND_NODE], c[pb.COMM_RECV_NODE]) == (comp, sends, recvs)
        assert c[pb.COMM_COLL_NODE] == 1  # TP 1, one replica: only the grad-norm AllReduce over PP 2
    # The last stage -> first stage hop carries activations of chunk 0 into chunk 1 of stage 0, with a tag
    # of its own: 2 * (boundary chunk * M + micro-batch) + 0.
    hop = [
        n for n in b.nodes[1]
        if n.type == pb.COMM_SEND_NODE and A.get_int(n, A.LAYER) == 2 and A.get_str(n, A.PHASE) == "fwd"
    ]  # fmt: skip
    assert [(A.comm_dst(n), A.get_int(n, A.COMM_TAG)) for n in hop] == [(0, 0), (0, 2), (0, 4), (0, 6)]
    back = [n for n in b.nodes[0] if n.type == pb.COMM_SEND_NODE and A.get_str(n, A.PHASE) == "bwd"]
    assert sorted(A.get_int(n, A.COMM_TAG) for n in back) == [1, 3, 5, 7]  # chunk-1 grads back to stage 1
    # every send has exactly one matching receive on its peer
    sends = Counter(
        (r, A.comm_dst(n), A.get_int(n, A.COMM_TAG)) for r, ns in b.nodes.items() for n in ns
        if n.type == pb.COMM_SEND_NODE
    )  # fmt: skip
    recvs = Counter(
        (A.comm_src(n), r, A.get_int(n, A.COMM_TAG)) for r, ns in b.nodes.items() for n in ns
        if n.type == pb.COMM_RECV_NODE
    )  # fmt: skip
    assert sends == recvs and max(sends.values()) == 1


def test_interleaving_replays_and_shrinks_the_bubble(tmp_path, capsys):
    # Interleaving cuts the warm-up/cool-down bubble, so the same work finishes sooner on the same network;
    # a wrong order or a missing hop would deadlock the replay instead.
    model = {
        **TINY,
        "hidden": 2048,
        "ffn_hidden": 8192,
        "heads": 16,
        "kv_heads": 16,
        "seq_len": 1024,
        "layers": 8,
    }
    times = {}
    for v in (1, 2):
        out = tmp_path / f"v{v}"
        spec = tmp_path / f"v{v}.json"
        spec.write_text(json.dumps(pp2(model=model, virtual_stages=v)))
        assert main(["gen", str(spec), "--out", str(out)]) == 0
        capsys.readouterr()
        assert main(["replay", str(out), "--no-progress", "--json"]) == 0
        times[v] = json.loads(capsys.readouterr().out)["iteration_time_ns"]
    # Closed form for equal stages and free transfers (Narayanan et al. 2021, section 2.2): iteration time
    # goes as M + (P-1)/V, so V = 2 over V = 1 at P = 2, M = 4 is 4.5 / 5 = 0.9; the head and embedding
    # on the end stages and the real transfers keep the replay within a few percent of it.
    assert times[2] < times[1]
    assert times[2] / times[1] == pytest.approx(0.9, abs=0.03)


def test_interleaved_chunks_given_by_hand():
    # Uneven chunks, virtual stage order (s0 c0) (s1 c0) (s0 c1) (s1 c1) = [1] [2-3] [4] [5-6].
    spec = pp2(model={**TINY, "layers": 6}, micro_batches=2)
    spec["device_groups"][0]["layers"] = [[1, 1], [4, 4]]
    spec["device_groups"][1]["layers"] = [[2, 3], [5, 6]]
    dep = load_spec(spec)
    assert load_spec(spec_to_mapping(dep)) == dep
    b = generate(dep)
    layers = {
        r: sorted({A.get_int(n, A.LAYER) for n in ns if A.get_str(n, A.PHASE) == "fwd"})
        for r, ns in b.nodes.items()
    }
    assert layers == {0: [0, 1, 4], 1: [0, 2, 3, 5, 6]}  # 0: embedding on rank 0, head on rank 1
    # per micro-batch: rank 0 = (2 + 11 + 11) fwd + (15 + 15 + 4) bwd = 58; rank 1 = (4 x 11 + 3) fwd +
    # (4 x 15 + 4) bwd = 111; plus each rank's two chunks' bucket NaN checks and the 5 optimizer-step nodes
    comp = {r: sum(n.type == pb.COMP_NODE for n in ns) for r, ns in b.nodes.items()}
    assert comp == {0: 2 * 58 + 2 + OPT_OPS, 1: 2 * 111 + 2 + OPT_OPS}


def layer_chain(nodes, layer, mb):
    """Names (op.phase) of the compute/TP chain nodes of one layer and micro-batch, in order."""
    return [
        n.name.split(".", 1)[1].rsplit(".", 1)[0]
        for n in nodes
        if n.type in (pb.COMP_NODE, pb.COMM_COLL_NODE)
        and A.get_int(n, A.LAYER) == layer
        and A.get_int(n, A.MICRO_BATCH) == mb
    ]


def test_selective_recompute_repeats_exactly_the_attention_core_before_its_backward():
    plain = generate(load_spec(pp2(virtual_stages=1, micro_batches=2, schedule="gpipe")))
    b = generate(load_spec(pp2(virtual_stages=1, micro_batches=2, schedule="gpipe", recompute="selective")))
    for rank in (0, 1):
        rec = [n for n in b.nodes[rank] if A.get_str(n, A.PHASE) == "recompute"]
        # one attention core per layer (2 per stage) per micro-batch (2)
        assert len(rec) == 2 * 2 and {n.name.split(".")[1] for n in rec} == {"attn_core"} <= ATTN_CORE_OPS
        assert len(b.nodes[rank]) == len(plain.nodes[rank]) + 4
    chain = layer_chain(b.nodes[0], 1, 0)
    bwd = chain[chain.index("mlp_down.bwd") :]
    assert bwd == [
        "mlp_down.bwd", "mlp_act.bwd", "mlp_up_gate.bwd", "mlp_norm.bwd", "mlp_residual.bwd",
        "attn_bias_dropout_add.bwd", "attn_out_proj.bwd", "attn_core.recompute", "attn_core.bwd", "rope.bwd",
        "qkv_grad_cat.bwd", "qkv_proj.bwd", "attn_norm.bwd", "attn_residual.bwd", "layer_main_grad_add.bwd",
    ]  # fmt: skip
    # The recomputation costs what the forward op costs.
    dur = {n.name: n.duration_micros for n in b.nodes[0]}
    assert dur["L1.attn_core.recompute.mb0"] == dur["L1.attn_core.fwd.mb0"] > 0


def test_full_recompute_repeats_the_whole_layer_forward_with_tp_collectives():
    spec = pp2(virtual_stages=1, micro_batches=1, schedule="gpipe", recompute="full")
    spec["device_groups"] = [
        {"id": 0, "gpu": "H100", "ranks": [0, 1], "pp_stage": 0},
        {"id": 1, "gpu": "H100", "ranks": [2, 3], "pp_stage": 1},
    ]
    b = generate(load_spec(spec))
    fwd = [*LAYER_FWD[:5], "attn_tp_out", *LAYER_FWD[5:10], "mlp_tp_out", LAYER_FWD[10]]
    for layer in (1, 2):
        chain = layer_chain(b.nodes[0], layer, 0)
        # forward, then right before the backward the same 13 steps again (TP AllReduces included)
        assert chain[:13] == [f"{s}.fwd" for s in fwd]
        assert chain[13:26] == [f"{s}.recompute" for s in fwd]
        assert chain[26:28] == ["mlp_bias_dropout_add.bwd", "mlp_down.bwd"]
    rec = [n for n in b.nodes[0] if A.get_str(n, A.PHASE) == "recompute"]
    assert Counter(n.type for n in rec) == {pb.COMP_NODE: 2 * 11, pb.COMM_COLL_NODE: 2 * 2}
    # ... costing exactly the forward again (same FLOPs, bytes, durations and collective sizes)
    fwd_nodes = [n for n in b.nodes[0] if A.get_str(n, A.PHASE) == "fwd" and A.get_int(n, A.LAYER) > 0]
    fwd_nodes = [n for n in fwd_nodes if n.type in (pb.COMP_NODE, pb.COMM_COLL_NODE)]

    def cost(n):
        return (n.name.replace(".fwd.", ".").replace(".recompute.", "."), n.duration_micros,
                A.get_int(n, A.NUM_OPS, 0), A.get_int(n, A.COMM_SIZE, 0))  # fmt: skip

    assert sorted(map(cost, rec)) == sorted(map(cost, fwd_nodes))
    # The recomputation sits between layer 2's received gradient and layer 2's backward: the chain runs
    # L2 recompute, L2 backward, L1 recompute, L1 backward.
    names = [
        n.name for n in b.nodes[0] if A.get_str(n, A.PHASE) in ("recompute", "bwd") and n.type == pb.COMP_NODE
    ]
    firsts = [names.index(x) for x in ("L2.attn_norm.recompute.mb0", "L2.mlp_down.bwd.mb0",
                                       "L1.attn_norm.recompute.mb0", "L1.mlp_down.bwd.mb0")]  # fmt: skip
    assert firsts == sorted(firsts)


def _recompute_backward_order(b) -> list[tuple[str, int]]:
    """Rank 0's recompute (R) and backward (B) phases by layer, in program order, runs collapsed."""
    seq: list[tuple[str, int]] = []
    for n in b.nodes[0]:
        ph = A.get_str(n, A.PHASE)
        if n.type == pb.COMP_NODE and ph in ("recompute", "bwd") and A.get_int(n, A.LAYER):
            key = (ph[0].upper(), A.get_int(n, A.LAYER))
            if not seq or seq[-1] != key:
                seq.append(key)
    return seq


def test_full_recompute_uniform_units_of_k_layers():
    # Megatron's uniform method, --recompute-num-layers 2: stage 0 holds layers 1-4 as units {1,2}, {3,4};
    # in backward, unit {3,4} is re-run forward (layers 3 then 4) before layer 4's backward, unit {1,2}
    # before layer 2's.
    spec = pp2(virtual_stages=1, micro_batches=1, schedule="gpipe", recompute="full", recompute_layers=2)
    spec["device_groups"] = [{"id": 0, "gpu": "H100", "ranks": [0]}]
    b = generate(load_spec(spec))
    assert _recompute_backward_order(b) == [
        ("R", 3),
        ("R", 4),
        ("B", 4),
        ("B", 3),
        ("R", 1),
        ("R", 2),
        ("B", 2),
        ("B", 1),
    ]


def test_full_recompute_block_method_recomputes_the_first_k_layers_alone():
    # Megatron's block method, --recompute-num-layers 2 (transformer_block._checkpointed_forward: layer i
    # of the chunk is checkpointed alone when i < 2): of layers 1-4 only 1 and 2 are re-run, each right
    # before its own backward; 3 and 4 keep their activations.
    spec = pp2(virtual_stages=1, micro_batches=1, schedule="gpipe", recompute="full", recompute_layers=2)
    spec["device_groups"] = [{"id": 0, "gpu": "H100", "ranks": [0]}]
    b = generate(load_spec({**spec, "recompute_method": "block"}))
    assert _recompute_backward_order(b) == [("B", 4), ("B", 3), ("R", 2), ("B", 2), ("R", 1), ("B", 1)]
    # Each recomputed layer re-runs its whole forward (LAYER_FWD, 11 ops), nothing else is recomputed.
    for layer, want in ((1, LAYER_FWD), (2, LAYER_FWD), (3, ()), (4, ())):
        rec = [s for s in layer_chain(b.nodes[0], layer, 0) if s.endswith(".recompute")]
        assert rec == [f"{s}.recompute" for s in want]
    # 8 layers, PP 2, V 2: stage 0 holds chunks of layers 1-2 and 5-6; K = 1: the first layer of each chunk.
    il = pp2(model={**TINY, "layers": 8}, recompute="full", recompute_method="block")
    names = {n.name for n in generate(load_spec(il)).nodes[0] if n.name.endswith(".recompute.mb0")}
    assert sorted({x.split(".")[0] for x in names}) == ["L1", "L5"]


def test_recompute_early_stop_ends_each_checkpoint_before_its_last_gemm(tmp_path):
    # PyTorch's non-reentrant checkpoint with early stop: the recompute of a checkpointed unit stops when
    # its last saved tensor is packed, i.e. at the input of the unit's last layer's down projection (saved
    # before the GEMM runs); that GEMM and the residual add after it are not recomputed. One stage of 4
    # layers: with units of 1 every layer's recompute is the forward less those two ops (9 of 11); with
    # units of 2 (--recompute-num-layers 2) only the unit's last layer (2 and 4) loses them.
    from xsim.replay import simulate
    from xsim.traces.traceset import discover

    from tests.test_replay_support import FakeNet

    base = pp2(virtual_stages=1, micro_batches=1, schedule="gpipe", recompute="full")
    base["device_groups"] = [{"id": 0, "gpu": "H100", "ranks": [0]}]
    for k, cut in ((1, (1, 2, 3, 4)), (2, (2, 4))):
        spec = {**base, "recompute_layers": k}
        full = generate(load_spec(spec))
        early = generate(load_spec({**spec, "recompute_early_stop": True}))
        for layer in (1, 2, 3, 4):
            rec = [s for s in layer_chain(early.nodes[0], layer, 0) if s.endswith(".recompute")]
            want = LAYER_FWD[:9] if layer in cut else LAYER_FWD
            assert rec == [f"{s}.recompute" for s in want]
        # The replay is shorter by exactly the dropped nodes' durations (one rank: a single chain).
        dropped = {n.name: n.duration_micros for n in full.nodes[0]}
        for n in early.nodes[0]:
            dropped.pop(n.name, None)
        assert sorted(dropped) == sorted(
            f"L{layer}.{op}.recompute.mb0" for layer in cut for op in ("mlp_down", "mlp_bias_dropout_add")
        )
        ends = []
        for name, bundle in (("full", full), ("early", early)):
            bundle.write(tmp_path / f"{name}{k}", "t")
            ops = simulate(discover(tmp_path / f"{name}{k}"), network=FakeNet(1)).ops
            ends.append(int(ops["end_ns"].max()))
        exact = {n.name: A.get_int(n, A.DURATION_NS, 0) for n in full.nodes[0]}
        assert ends[0] - ends[1] == sum(exact[name] for name in dropped)
    # Only with full recompute, and a boolean.
    with pytest.raises(SpecError, match="recompute: full only"):
        load_spec(pp2(recompute="selective", recompute_early_stop=True))
    with pytest.raises(SpecError, match="true or false"):
        load_spec({**base, "recompute_early_stop": "yes"})
    assert spec_to_mapping(load_spec({**base, "recompute_early_stop": True}))["recompute_early_stop"] is True


def dist_opt_spec(dp: int, bucket: int) -> dict:
    return {
        "model": {**TINY, "layers": 2},
        "parallel": {"gpu": "H100", "dp": dp, "micro_batch": 1, "global_batch": dp},
        "distributed_optimizer": True,
        "dp_bucket_bytes": bucket,
        "overlap_grad_reduce": True,  # buckets smaller than everything exist only with overlap (Megatron)
    }


def sync_sizes(nodes):
    return [
        (n.name.split(".")[0], A.get_int(n, A.COMM_SIZE))
        for n in nodes
        if n.type == pb.COMM_COLL_NODE and A.get_str(n, A.PHASE) == "sync"
    ]


@pytest.mark.parametrize(
    ("dp", "bucket", "buckets"),
    [
        # Rank parameters: 2 layers * 41,088 + embedding 16,384 + final norm 64 + head 16,384 = 115,008, one
        # bucket. Padded to a multiple of lcm(DP, 128): DP 2 -> 128 * 899 = 115,072; DP 3 -> 384 * 300 = 115,200.
        (2, 1 << 30, [115_072]),
        (3, 1 << 30, [115_200]),
        # 200,000-byte buckets of FP32 gradients, filled in backward order: head 16,448 + layer 2 41,088 =
        # 57,536 (230,144 B, closes) -> 57,600 padded; layer 1 + embedding = 57,472 (already a multiple of 128).
        (2, 200_000, [57_600, 57_472]),
    ],
)
def test_distributed_optimizer_sizes_by_hand(dp, bucket, buckets):
    b = generate(load_spec(dist_opt_spec(dp, bucket)))
    for rank in range(dp):
        want = [("dp_grad_reducescatter", e * 4) for e in buckets]  # FP32 gradient buffer, whole bucket
        want += [("dp_param_allgather", e // dp * 2) for e in buckets]  # BF16 parameters, per-rank shard
        assert sync_sizes(b.nodes[rank]) == want
        opt = next(n for n in b.nodes[rank] if n.name == "optimizer.opt")
        shard = sum(e // dp for e in buckets)
        # AdamW on the shard: 15 FLOPs per parameter; reads the FP32 grad (4) + FP32 master, m, v read and
        # written (24); the BF16 weight is written by the separate param_copy (read 4, write 2).
        assert (A.get_int(opt, A.NUM_OPS), A.get_int(opt, A.TENSOR_SIZE)) == (15 * shard, 28 * shard)
        step = {
            n.name: A.get_int(n, A.TENSOR_SIZE) for n in b.nodes[rank]
            if A.get_str(n, A.PHASE) == "opt" and n.type == pb.COMP_NODE
        }  # fmt: skip
        # grad norm reads the shard's FP32 grads, clip reads and writes them, zero_grad clears the whole
        # (unsharded) FP32 buffer of the rank's 115,008 parameters.
        assert step["grad_norm.opt"] == 4 * shard and step["grad_clip.opt"] == 8 * shard
        assert step["param_copy.opt"] == 6 * shard and step["zero_grad.opt"] == 4 * 115_008
        # The grad-norm AllReduce: one FP32 over every rank (DP ranks hold disjoint shards).
        (norm,) = [n for n in b.nodes[rank] if n.name == "grad_norm_allreduce.opt"]
        assert A.comm_size(norm) == 4 and b.comm_groups[A.pg_name(norm)] == tuple(range(dp))
        # reduce-scatters before the optimizer, all-gathers after it
        ids = {n.name.split(".")[0]: n.id for n in b.nodes[rank]}
        assert ids["dp_grad_reducescatter"] < opt.id < ids["param_copy"] < ids["dp_param_allgather"]
    assert {n.type for n in b.nodes[0] if A.get_str(n, A.PHASE) == "sync"} == {pb.COMM_COLL_NODE}
    kinds = [A.comm_type(n) for n in b.nodes[0] if A.get_str(n, A.PHASE) == "sync"]
    assert kinds == [pb.REDUCE_SCATTER] * len(buckets) + [pb.ALL_GATHER] * len(buckets)


def test_without_distributed_optimizer_the_optimizer_updates_all_parameters():
    spec = dist_opt_spec(2, 1 << 30)
    spec["distributed_optimizer"] = False
    b = generate(load_spec(spec))
    # BF16 training reduces FP32 gradients (Megatron's accumulate_allreduce_grads_in_fp32, the default
    # grad_reduce_dtype): 4 B each; Adam reads that FP32 gradient (4) + FP32 master, m, v read and written
    # (24) = 28 B per parameter (the BF16 weight write is param_copy's).
    assert sync_sizes(b.nodes[0]) == [("dp_grad_allreduce", 115_008 * 4)]
    opt = next(n for n in b.nodes[0] if n.name == "optimizer.opt")
    assert (A.get_int(opt, A.NUM_OPS), A.get_int(opt, A.TENSOR_SIZE)) == (15 * 115_008, 28 * 115_008)
    step = {n.name: A.get_int(n, A.TENSOR_SIZE) for n in b.nodes[0] if A.get_str(n, A.PHASE) == "opt"}
    # grad norm reads the FP32 gradients, zero_grad writes them
    assert step["grad_norm.opt"] == step["zero_grad.opt"] == 4 * 115_008
    # grad_reduce_dtype: bf16 (Megatron's --grad-reduce-in-bf16) halves the reduction and the read.
    b = generate(load_spec({**spec, "grad_reduce_dtype": "bf16"}))
    assert sync_sizes(b.nodes[0]) == [("dp_grad_allreduce", 115_008 * 2)]
    opt = next(n for n in b.nodes[0] if n.name == "optimizer.opt")
    # Adam on every parameter: BF16 grad (2) + FP32 master, m, v read and written (24); the weight copy
    # (read FP32, write BF16) is param_copy's.
    assert (A.get_int(opt, A.NUM_OPS), A.get_int(opt, A.TENSOR_SIZE)) == (15 * 115_008, 26 * 115_008)
    # No distributed optimizer, TP 1, PP 1: the model-parallel group is the rank alone, so no grad-norm
    # AllReduce (Megatron reduces the norm over TP x PP only; each DP replica holds the same gradients).
    assert not [n for n in b.nodes[0] if n.name == "grad_norm_allreduce.opt"]


def test_parallel_expands_in_megatron_rank_order():
    # Megatron-LM initialize_model_parallel's docstring: 16 GPUs, TP 2, PP 4 (so DP 2) give tensor groups
    # [g0, g1], [g2, g3], ...; pipeline groups [g0, g4, g8, g12], [g1, g5, g9, g13], [g2, g6, g10, g14],
    # [g3, g7, g11, g15]; data-parallel groups [g0, g2], [g1, g3], [g4, g6], ...
    dep = load_spec(
        {
            "model": {**TINY, "layers": 8},
            "parallel": {"gpu": "A100", "tp": 2, "pp": 4, "dp": 2, "global_batch": 16, "order": "tp-dp-pp"},
        }
    )
    assert dep.micro_batches == 16 // (1 * 2)
    by = {(dg.dp_replica, dg.pp_stage): list(dg.ranks) for dg in dep.device_groups}
    assert sorted(by.values()) == [[2 * i, 2 * i + 1] for i in range(8)]
    pipelines = sorted([by[(d, s)][t] for s in range(4)] for d in range(2) for t in range(2))
    assert pipelines == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    assert {(by[(0, s)][t], by[(1, s)][t]) for s in range(4) for t in range(2)} == {
        (0, 2),
        (1, 3),
        (4, 6),
        (5, 7),
        (8, 10),
        (9, 11),
        (12, 14),
        (13, 15),
    }
    # 8 layers cut into 4 equal stages
    assert [(dg.layer_start, dg.layer_end) for dg in sorted(dep.device_groups, key=lambda d: d.pp_stage)][
        ::2
    ] == [(1, 2), (3, 4), (5, 6), (7, 8)]
    # The generated process groups: the TP pairs and the DP groups of the docstring, and each replica's
    # model-parallel group (TP x PP: the grad-norm AllReduce), nothing else.
    b = generate(dep)
    want = {(2 * i, 2 * i + 1) for i in range(8)} | {
        (4 * s + t, 4 * s + 2 + t) for s in range(4) for t in range(2)
    }
    want |= {(0, 1, 4, 5, 8, 9, 12, 13), (2, 3, 6, 7, 10, 11, 14, 15)}
    assert set(b.comm_groups.values()) == want


def test_parallel_tp2_pp2_dp2_with_virtual_stages_round_trips():
    spec = {"model": TINY, "parallel": {"gpu": "H100", "tp": 2, "pp": 2, "dp": 2, "micro_batch": 2,
                                        "global_batch": 8, "virtual_stages": 2}}  # fmt: skip
    dep = load_spec(spec)
    # default order tp-pp-dp (Megatron's --use-tp-pp-dp-mapping): rank = t + 2*(s + 2*d)
    assert [(list(dg.ranks), dg.pp_stage, dg.dp_replica) for dg in dep.device_groups] == [
        ([0, 1], 0, 0), ([4, 5], 0, 1), ([2, 3], 1, 0), ([6, 7], 1, 1)
    ]  # fmt: skip
    assert (dep.micro_batches, dep.virtual_stages, dep.schedule) == (2, 2, "1f1b")
    assert load_spec(spec_to_mapping(dep)) == dep
    # Megatron's initialize_model_parallel default order: rank = t + 2*(d + 2*s): stage 0 holds ranks 0-3
    spec["parallel"]["order"] = "tp-dp-pp"
    dep = load_spec(spec)
    assert [(list(dg.ranks), dg.pp_stage, dg.dp_replica) for dg in dep.device_groups] == [
        ([0, 1], 0, 0),
        ([2, 3], 0, 1),
        ([4, 5], 1, 0),
        ([6, 7], 1, 1),
    ]


def test_parallel_mixes_with_hand_written_groups():
    spec = {
        "model": TINY,
        "parallel": {"gpu": "H100", "tp": 2, "pp": 2, "global_batch": 2},
        "device_groups": [{"gpu": "A100", "ranks": [4, 5, 6, 7], "tp": 4, "dp_replica": 1}],
    }
    dep = load_spec(spec)
    assert [(dg.id, dg.gpu, list(dg.ranks), dg.dp_replica) for dg in dep.device_groups] == [
        (0, "H100", [0, 1], 0),
        (1, "H100", [2, 3], 0),
        (2, "A100-40GB", [4, 5, 6, 7], 1),
    ]
    generate(dep)  # heterogeneous: the rewriter synchronizes the replicas


BAD = [
    ({"micro_batches": 3}, "micro_batches 3 is not a multiple of its 2 pipeline stages"),
    ({"schedule": "gpipe"}, "virtual_stages 2 needs schedule: 1f1b"),
    ({"model": {**TINY, "layers": 6}}, "6 layers do not split into 2 stages x 2 virtual stages"),
    ({"recompute": "partial"}, "recompute must be one of none, selective, full"),
    (
        {
            "device_groups": [
                {"gpu": "H100", "ranks": [0], "layers": [[1, 2], [3, 3]], "pp_stage": 0},
                {"gpu": "H100", "ranks": [1], "layers": [[4, 4], [5, 6]], "pp_stage": 1},
            ],
            "model": {**TINY, "layers": 6},
        },
        "stage 1 chunk 0 (device group 1) starts at layer 4, expected 3",
    ),  # fmt: skip
    ({"recompute": "selective", "recompute_layers": 2}, "recompute_layers applies to recompute: full only"),
    (
        {"recompute": "selective", "recompute_method": "block"},
        "recompute_method applies to recompute: full only",
    ),
    ({"recompute": "full", "recompute_method": "blocks"}, "recompute_method must be one of uniform, block"),
    (
        {
            "device_groups": [
                {"gpu": "H100", "ranks": [0], "layers": [1, 2], "pp_stage": 0},
                {"gpu": "H100", "ranks": [1], "layers": [3, 4], "pp_stage": 1},
            ]
        },
        "layers must list 2 ranges",
    ),  # fmt: skip
    (
        {
            "device_groups": [
                {"gpu": "H100", "ranks": [0, 1], "pp_stage": 0},
                {"gpu": "H100", "ranks": [2], "pp_stage": 1},
            ]
        },
        "virtual_stages with stages of different TP",
    ),  # fmt: skip
    (
        {
            "device_groups": None,
            "parallel": {"gpu": "H100", "pp": 2, "dp": 2, "micro_batch": 2, "global_batch": 6},
        },
        "global_batch 6 is not a multiple of micro_batch 2 x dp 2",
    ),
    (
        {
            "parallel": {"gpu": "H100", "pp": 2},
            "device_groups": [{"gpu": "H100", "ranks": [1, 2], "dp_replica": 1}],
        },
        "rank 1 of device group 2 is already in the parallel: block",
    ),
    ({"parallel": {"gpu": "H100", "pp": 2, "dpp": 2}, "device_groups": None}, "parallel: unknown key(s) dpp"),
    (
        {"parallel": {"gpu": "H100", "pp": 2, "order": "pp-tp-dp"}, "device_groups": None},
        "order must be one of",
    ),
]


@pytest.mark.parametrize(("change", "message"), BAD)
def test_bad_specs_give_one_line(change, message):
    spec = {**pp2(), **change}
    spec = {k: v for k, v in spec.items() if v is not None}
    with pytest.raises(SpecError) as e:
        load_spec(spec)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_cli_bad_interleaving_exits_2_with_one_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(
        "model: {layers: 4, hidden: 64, ffn_hidden: 128, heads: 4, kv_heads: 4, vocab: 256, seq_len: 32}\n"
        "parallel: {gpu: H100, pp: 2, global_batch: 3, virtual_stages: 2}\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "xsim", "gen", str(f), "--out", str(tmp_path / "o")],
        capture_output=True, text=True, cwd=REPO, check=False,
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "micro_batches 3 is not a multiple" in r.stderr
    assert str(f) in r.stderr


FEATURES = {
    "model": TINY,
    "parallel": {"gpu": "H100", "tp": 2, "pp": 2, "dp": 2, "global_batch": 4, "virtual_stages": 2},
    "recompute": "full",
    "distributed_optimizer": True,
    "sequence_parallel": True,
    "dp_bucket_bytes": 100_000,
}


def test_feature_traces_pass_the_validator_and_copies_equal_rebuilds(tmp_path):
    from xsim.tracegen.workload import _Generator

    from tests.test_gen_workload import _validate

    dep = load_spec(FEATURES)
    bundle = generate(dep)
    rebuilt = _Generator(dep, clone=False).run()
    for rank, nodes in bundle.nodes.items():
        assert [n.SerializeToString() for n in nodes] == [n.SerializeToString() for n in rebuilt.nodes[rank]]
    _, findings = _validate(bundle, tmp_path, "f")
    assert [str(f) for f in findings] == []


def test_a_1024_gpu_plan_is_a_few_lines():
    # GPT-3 175B as Narayanan et al. 2021 Table 1 ran it: 1,024 A100s, TP 8, PP 16 (so DP 8), batch 1536
    dep = load_spec(
        {
            "model": "gpt3-175b",
            "parallel": {"gpu": "A100-80GB", "tp": 8, "pp": 16, "dp": 8, "global_batch": 1536},
        }
    )
    assert len(dep.device_groups) == 16 * 8 and dep.micro_batches == 1536 // 8
    assert sorted(r for dg in dep.device_groups for r in dg.ranks) == list(range(1024))
    assert {(dg.layer_start, dg.layer_end) for dg in dep.device_groups} == {
        (6 * k + 1, 6 * k + 6) for k in range(16)
    }
