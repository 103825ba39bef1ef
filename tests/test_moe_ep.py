"""Expert parallelism in the generated traces: all-to-all bytes, grouped GEMM FLOPs, node order, gradient
groups and memory, each against a hand count."""

from __future__ import annotations

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.memory import deployment_memory
from xsim.traces import attrs as A
from xsim.traces import pb

H, B = 64, 2  # hidden and BF16 bytes of the small models: one token copy is 128 B
TABLE = [
    [4, 4, 2, 2, 1, 1, 1, 1],
    [2, 2, 2, 2, 2, 2, 2, 2],
    [0, 0, 0, 0, 8, 8, 0, 0],
    [1, 1, 1, 1, 1, 1, 5, 5],
]  # tokens per expert routed by EP ranks 0..3: 8 tokens x top-2 = 16 per row


def _model(experts=8, routing=None, layers=1):
    moe = {"experts": experts, "top_k": 2, "expert_ffn": 32, "routing": routing or "uniform"}
    return {"name": "tiny-moe", "layers": layers, "hidden": H, "ffn_hidden": 128, "heads": 4, "vocab": 256,
            "seq_len": 8, "moe": moe}  # fmt: skip


def _gen(dp, ep, routing=None, layers=1, experts=8):
    spec = {"model": _model(experts, routing, layers), "parallel": {"gpu": "H100", "dp": dp, "ep": ep}}
    return generate(load_spec(spec), rewrite=False)


def _attrs(n):
    return {a.name: a for a in n.attr}


def _size(n):
    return _attrs(n)[A.COMM_SIZE].int64_val


def test_all_to_all_bytes_per_rank_top2_of_8_at_ep4():
    bundle = _gen(4, 4, {"tokens": TABLE})
    # EP rank q holds experts 2q, 2q+1; rank s sends rank q its copies for them: (TABLE[s][2q] + TABLE[s][2q+1]) x 128 B
    expect_send = {
        0: {1: 4 * 128, 2: 2 * 128, 3: 2 * 128},
        1: {0: 4 * 128, 2: 4 * 128, 3: 4 * 128},
        2: {},  # all 16 copies go to its own experts 4 and 5: nothing on the wire
        3: {0: 2 * 128, 1: 2 * 128, 2: 2 * 128},
    }
    for r in range(4):
        nodes = list(bundle.nodes[r])
        sends = {
            _attrs(n)[A.COMM_DST].int32_val: _size(n)
            for n in nodes
            if n.name.startswith("L1.moe_dispatch.fwd") and n.type == pb.COMM_SEND_NODE
        }
        recvs = {
            _attrs(n)[A.COMM_SRC].int32_val: _size(n)
            for n in nodes
            if n.name.startswith("L1.moe_dispatch.fwd") and n.type == pb.COMM_RECV_NODE
        }
        assert sends == expect_send[r]
        assert recvs == {s: v[r] for s, v in expect_send.items() if r in v}
        # the combine returns the same copies: sizes mirrored
        csend = {
            _attrs(n)[A.COMM_DST].int32_val: _size(n)
            for n in nodes
            if n.name.startswith("L1.moe_combine.fwd") and n.type == pb.COMM_SEND_NODE
        }
        assert csend == recvs
    assert sum(expect_send[0].values()) == 1024  # rank 0: 8 of its 16 copies leave, 1 KiB


def _flops(bundle, rank, name):
    return next(_attrs(n)[A.NUM_OPS].int64_val for n in bundle.nodes[rank] if n.name == name)


def test_grouped_gemm_flops_follow_the_skewed_routing():
    bundle = _gen(4, 4, {"tokens": TABLE})
    # copies each EP rank's experts receive (column sums of its two experts): 14, 10, 24, 16
    received = {
        0: 4 + 4 + 2 + 2 + 0 + 0 + 1 + 1,
        1: 2 + 2 + 2 + 2 + 0 + 0 + 1 + 1,
        2: 1 + 1 + 2 + 2 + 8 + 8 + 1 + 1,
        3: 1 + 1 + 2 + 2 + 0 + 0 + 5 + 5,
    }
    assert received == {0: 14, 1: 10, 2: 24, 3: 16}
    for r, rows in received.items():
        # SwiGLU expert: up/gate [R, 64] x [64, 2 x 32], down [R, 32] x [32, 64]; backward twice forward
        assert _flops(bundle, r, "L1.moe_expert_up_gate.fwd.mb0") == 2 * rows * 64 * 64
        assert _flops(bundle, r, "L1.moe_expert_down.fwd.mb0") == 2 * rows * 32 * 64
        assert _flops(bundle, r, "L1.moe_expert_up_gate.bwd.mb0") == 4 * rows * 64 * 64
    uniform = _gen(4, 4)
    assert {_flops(uniform, r, "L1.moe_expert_down.fwd.mb0") for r in range(4)} == {2 * 16 * 32 * 64}


def test_one_moe_layer_fwd_and_bwd_on_a_two_rank_ep_group_in_order():
    bundle = _gen(2, 2, {"tokens": [[8, 4, 2, 2], [4, 4, 4, 4]]}, experts=4)
    names = [n.name for n in bundle.nodes[0] if n.name.startswith("L1.")]
    fwd = [
        "attn_norm", "qkv_proj", "rope", "attn_core", "attn_out_proj", "attn_bias_dropout_add", "mlp_norm",
        "moe_router", "moe_router_topk", "moe_permute_map", "moe_permute", "moe_dispatch.fwd.mb0.from1",
        "moe_dispatch.fwd.mb0.to1", "moe_dispatch_probs.fwd.mb0.from1", "moe_dispatch_probs.fwd.mb0.to1",
        "moe_sort_chunks", "moe_expert_up_gate", "moe_expert_act", "moe_expert_down", "moe_unsort_chunks",
        "moe_combine.fwd.mb0.from1",
        "moe_combine.fwd.mb0.to1", "moe_unpermute", "mlp_bias_dropout_add",
    ]  # fmt: skip
    bwd = [
        "mlp_bias_dropout_add", "moe_unpermute", "moe_combine.bwd.mb0.from1", "moe_combine.bwd.mb0.to1",
        "moe_unsort_chunks", "moe_expert_down", "moe_expert_act", "moe_expert_up_gate", "moe_sort_chunks",
        "moe_dispatch.bwd.mb0.from1",
        "moe_dispatch.bwd.mb0.to1", "moe_dispatch_probs.bwd.mb0.from1", "moe_dispatch_probs.bwd.mb0.to1",
        "moe_permute", "moe_router_topk", "moe_router", "moe_router_main_grad_add", "mlp_norm", "mlp_residual",
        "attn_bias_dropout_add", "attn_out_proj", "attn_core", "rope", "qkv_grad_cat", "qkv_proj", "attn_norm",
        "attn_residual", "layer_main_grad_add",
    ]  # fmt: skip
    full = lambda ops, ph: [f"L1.{o}" if ".mb0" in o else f"L1.{o}.{ph}.mb0" for o in ops]  # noqa: E731
    assert names == full(fwd, "fwd") + full(bwd, "bwd")
    # 18 + 6 P2P forward (the fused permute's row-id map and the probabilities' all-to-all included), 22 +
    # 6 P2P backward (the q/k/v gradient cat and Megatron-Core's DDP hook adds of the router weight and the
    # norm gains included):
    # two local experts per EP
    # rank, so the received copies are sorted by expert before the grouped GEMMs and back after them
    # (Megatron-Core's permutation 2)
    assert (len(fwd), len(bwd)) == (24, 28)
    by = {n.name: n for n in bundle.nodes[0]}
    # the sort by expert waits for the permute and for both halves of the dispatch; the send leaves after the
    # permute; the expert GEMM follows the sort
    up = by["L1.moe_sort_chunks.fwd.mb0"]
    assert list(by["L1.moe_expert_up_gate.fwd.mb0"].data_deps) == [up.id]
    # rank 0 (experts 0, 1) receives 8 + 4 of its own copies and 4 + 4 of rank 1's: 20; the sort reads and
    # writes each copy (64 x 2 B) and its FP32 probability, the unsort the copies only
    size = lambda name: _attrs(by[name])[A.TENSOR_SIZE].uint64_val  # noqa: E731
    assert size("L1.moe_sort_chunks.fwd.mb0") == 2 * 20 * (H * B + 4)
    assert size("L1.moe_unsort_chunks.bwd.mb0") == 2 * 20 * H * B
    ids = {
        by[f"L1.{k}"].id
        for k in (
            "moe_permute.fwd.mb0", "moe_dispatch.fwd.mb0.from1", "moe_dispatch.fwd.mb0.to1",
            "moe_dispatch_probs.fwd.mb0.from1", "moe_dispatch_probs.fwd.mb0.to1",
        )
    }  # fmt: skip
    assert set(up.data_deps) == ids
    # the probabilities go the same way, one FP32 a copy: 4 copies sent, 8 received
    assert _size(by["L1.moe_dispatch_probs.fwd.mb0.to1"]) == 4 * 4
    assert _size(by["L1.moe_dispatch_probs.fwd.mb0.from1"]) == 8 * 4
    assert _size(by["L1.moe_dispatch_probs.bwd.mb0.to1"]) == 8 * 4
    assert list(by["L1.moe_dispatch.fwd.mb0.to1"].data_deps) == [by["L1.moe_permute.fwd.mb0"].id]
    # rank 0 sends rank 1 its copies for experts 2, 3 (2 + 2) and receives rank 1's for experts 0, 1 (4 + 4)
    assert _size(by["L1.moe_dispatch.fwd.mb0.to1"]) == 4 * H * B
    assert _size(by["L1.moe_dispatch.fwd.mb0.from1"]) == 8 * H * B
    # tags pair up across the two ranks
    peer = {n.name: n for n in bundle.nodes[1]}
    tag = lambda n: _attrs(n)[A.COMM_TAG].int32_val  # noqa: E731
    assert tag(by["L1.moe_dispatch.fwd.mb0.to1"]) == tag(peer["L1.moe_dispatch.fwd.mb0.from0"])
    assert tag(by["L1.moe_dispatch_probs.fwd.mb0.to1"]) == tag(peer["L1.moe_dispatch_probs.fwd.mb0.from0"])
    assert tag(by["L1.moe_dispatch_probs.fwd.mb0.to1"]) != tag(by["L1.moe_dispatch.fwd.mb0.to1"])


def test_expert_gradients_sync_over_the_expert_data_parallel_group():
    bundle = _gen(4, 2, layers=2, experts=4)
    groups = {k: list(v) for k, v in bundle.comm_groups.items()}
    for r in range(4):
        syncs = {
            n.name: n
            for n in bundle.nodes[r]
            if _attrs(n).get(A.PHASE) and _attrs(n)[A.PHASE].string_val == "sync"
        }
        dense, expert = syncs["dp_grad_allreduce.bucket0"], syncs["expert_dp_grad_allreduce.bucket0"]
        assert groups[_attrs(dense)[A.PG_NAME].string_val] == [0, 1, 2, 3]
        # replicas 0, 2 hold experts 0-1, replicas 1, 3 experts 2-3 (EP groups {0, 1}, {2, 3})
        assert groups[_attrs(expert)[A.PG_NAME].string_val] == [r % 2, r % 2 + 2]
        # 2 layers x 2 local experts x 3 x 64 x 32 weights, FP32 gradients
        assert _size(expert) == 2 * 2 * 3 * 64 * 32 * 4
        # dense: per layer attention 64 x 192 + 64 x 64, norms 128, router 64 x 4; embedding and head 256 x 64 (+ 64)
        assert _size(dense) == (2 * (64 * 192 + 64 * 64 + 128 + 256) + 256 * 64 + 64 + 256 * 64) * 4


def test_mixtral_memory_fit_matches_a_hand_count_per_rank():
    dep = load_spec(
        {"model": "mixtral-8x7b", "seq_len": 4096, "parallel": {"gpu": "H100", "pp": 4, "dp": 8, "ep": 8}}
    )
    mem = {m.rank: m for m in deployment_memory(dep)}
    h, f = 4096, 14336
    attn = h * 48 * 128 + 32 * 128 * h
    per_layer = attn + 2 * h + h * 8 + 1 * 3 * h * f  # one of 8 experts per EP rank
    assert per_layer == 218_144_768
    assert mem[0].params == 8 * per_layer + 32000 * h == 1_876_230_144  # stage 0: layers 1-8 + embedding
    assert mem[1].params == 8 * per_layer  # rank 1 = stage 1 (tp-pp-dp order)
    assert mem[3].params == 8 * per_layer + h + 32000 * h  # stage 3: final norm and head
    # BF16 weights, FP32 gradients, 12 B of Adam state per parameter (no distributed optimizer)
    assert (mem[1].weights, mem[1].gradients, mem[1].optimizer) == (
        2 * 8 * per_layer,
        4 * 8 * per_layer,
        12 * 8 * per_layer,
    )


@pytest.mark.parametrize(
    ("parallel", "model", "message"),
    [
        ({"dp": 4, "ep": 3}, None, "ep 3 does not divide dp x cp 4"),
        ({"dp": 2, "ep": 3, "tp": 2, "etp": 1}, None, "ep 3 does not divide dp x cp x tp 4"),
        ({"dp": 2, "ep": 2, "tp": 4, "etp": 3}, None, "etp 3: only 1 or tp (4)"),
        ({"dp": 2, "tp": 2}, None, "tp > 1"),
        ({"dp": 2, "ep": 2}, "llama2-7b", "ep 2 needs a mixture-of-experts model"),
        ({"dp": 8, "ep": 8}, None, "ep 8 does not divide the 4 experts"),
        ({"dp": 1, "cp": 2}, "deepseek-v3", "MLA attention with context parallelism is not supported yet"),
    ],
)
def test_unsupported_expert_plans_fail_in_one_line(parallel, model, message):
    spec = {"model": model or _model(4), "parallel": {"gpu": "H100", **parallel}}
    with pytest.raises(SpecError) as exc:
        load_spec(spec)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_plan_search_refuses_expert_models_in_one_line(tmp_path):
    from xsim.explore.search import SearchError, SearchRequest, search

    with pytest.raises(SearchError) as exc:
        search(SearchRequest("8xH100", "mixtral-8x7b", 8, out=str(tmp_path)))
    assert "does not place experts (ep)" in str(exc.value) and "\n" not in str(exc.value)


def test_a_moe_plan_generates_rewrites_validates_and_replays(tmp_path, capsys):
    from xsim.cli import main

    dep = load_spec(
        {"model": _model(4, None, 2), "parallel": {"gpu": "H100", "dp": 4, "ep": 2}, "micro_batches": 2}
    )
    bundle = generate(dep)  # with the planner's rewrite, as xsim gen does
    p2p = sum(
        1 for r in bundle.nodes for n in bundle.nodes[r] if n.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)
    )
    a2a = [
        {a.name: a for a in n.attr}[A.COMM_SIZE].int64_val
        for r in bundle.nodes
        for n in bundle.nodes[r]
        if n.type == pb.COMM_COLL_NODE and ".moe_" in n.name
    ]
    # uniform routing: every rank sends its EP peer 8 copies per all-to-all, so each all-to-all is one
    # ALL_TO_ALL collective of 2 x 8 x 128 B: 4 all-to-alls x 2 layers x 2 mbs x 4 ranks, no P2P; and the
    # probabilities' (forward and backward) of 2 x 8 x 4 B (one FP32 a copy)
    tokens, probs = [2 * 8 * 128] * (4 * 2 * 2 * 4), [2 * 8 * 4] * (2 * 2 * 2 * 4)
    assert p2p == 0 and sorted(a2a) == sorted(tokens + probs)
    bundle.write(str(tmp_path), "moe")
    assert main(["trace", "validate", str(tmp_path)]) == 0
    assert main(["replay", str(tmp_path), "--topology", "switch:4:50GBps:500ns"]) == 0
    # 748 before the sorts by expert and the collective all-to-alls: + 4 ranks x 2 layers x 2 mbs x 4 (sort,
    # unsort; forward, backward), - as many for the 4 all-to-alls' send + receive pairs now one node each;
    # + 4 ranks x 6 for Megatron-Core's gradient work (the embedding gradient's zero fill and main_grad add
    # per micro-batch, the bucket's NaN check and 1/DP scaling) + 4 ranks x 2 layers x 2 mbs for the q/k/v
    # split's gradient cat: 788; + 4 ranks x 2 mbs x (2 layers + the final norm) for the DDP hook's main_grad
    # adds of the norm gains (layer_main_grad_add, final_norm_main_grad_add): 812; + 4 ranks x 2 layers x
    # 2 mbs for the fused permute's row-id map (moe_permute_map, forward only): 828; + 4 ranks x 2 layers
    # x 2 mbs x 2 for the probabilities' all-to-all (forward, backward): 860; + 4 ranks x 2 layers x 2 mbs
    # for the DDP hook's add of the router weight's gradient (moe_router_main_grad_add): 876
    assert "replayed 876 nodes on 4" in capsys.readouterr().out


def test_distributed_optimizer_shards_experts_over_the_expert_dp_group():
    dep = load_spec(
        {
            "model": _model(4, None, 2),
            "parallel": {"gpu": "H100", "dp": 4, "ep": 2},
            "distributed_optimizer": True,
        }
    )
    nodes = {n.name: n for n in generate(dep, rewrite=False).nodes[0]}
    a = lambda name, key: {x.name: x for x in nodes[name].attr}[key]  # noqa: E731
    dense, expert = 66368, 2 * 2 * 3 * 64 * 32  # as in the AllReduce test: 66,368 dense, 24,576 expert
    # dense bucket padded to a multiple of lcm(4, 128) = 128: 66,432; experts over 2 ranks: lcm(2, 128)
    assert a("dp_grad_reducescatter.bucket0", A.COMM_SIZE).int64_val == 66432 * 4
    assert a("expert_dp_grad_reducescatter.bucket0", A.COMM_SIZE).int64_val == expert * 4
    # Adam on the shards: 66,432 / 4 + 24,576 / 2 = 28,896 parameters, 15 FLOPs each
    assert a("optimizer.opt", A.NUM_OPS).int64_val == 15 * (66432 // 4 + expert // 2) == 433440
    assert a("dp_param_allgather.bucket0", A.COMM_SIZE).int64_val == 66432 // 4 * 2
    assert a("expert_dp_param_allgather.bucket0", A.COMM_SIZE).int64_val == expert // 2 * 2
    assert dense == 2 * (64 * 192 + 64 * 64 + 128 + 256) + 2 * 256 * 64 + 64
    # Mixtral at PP 4, DP 8, EP 8: no expert-DP peers, so the experts' Adam state stays whole on the rank
    mix = {"model": "mixtral-8x7b", "seq_len": 4096, "distributed_optimizer": True}
    mem = {
        m.rank: m
        for m in deployment_memory(load_spec({**mix, "parallel": {"gpu": "H100", "pp": 4, "dp": 8, "ep": 8}}))
    }
    h = 4096
    d1, e1 = 8 * (h * 48 * 128 + 32 * 128 * h + 2 * h + 8 * h), 8 * 3 * h * 14336
    assert mem[1].optimizer == -(-12 * d1 // 8) + 12 * e1 == 17_415_241_728


def test_moe_under_tp2_with_sequence_parallelism_by_hand():
    # sources are (EP rank, TP rank) = q * 2 + j, each routing its 4 of 8 tokens x top-2 = 8 copies
    table = [[4, 2, 1, 1], [2, 2, 2, 2], [1, 1, 2, 4], [0, 0, 4, 4]]
    spec = {"model": _model(4, {"tokens": table}), "sequence_parallel": True,
            "parallel": {"gpu": "H100", "tp": 2, "dp": 2, "ep": 2}}  # fmt: skip
    bundle = generate(load_spec(spec), rewrite=False)
    by = [{n.name: n for n in bundle.nodes[r]} for r in range(4)]  # ranks 0, 1: EP rank 0; 2, 3: EP rank 1
    # rank 0 (source 0) sends rank 2 its copies for experts 2, 3: 1 + 1; receives source 2's for 0, 1: 1 + 1
    assert _size(by[0]["L1.moe_dispatch.fwd.mb0.to2"]) == 2 * 128
    assert _size(by[0]["L1.moe_dispatch.fwd.mb0.from2"]) == 2 * 128
    assert _size(by[1]["L1.moe_dispatch.fwd.mb0.to3"]) == 4 * 128
    assert "L1.moe_dispatch.fwd.mb0.from3" not in by[1]  # source 3 routes nothing to experts 0, 1
    # EP rank 0's TP ranks received 6 + 2 = 8 and 4 + 0 = 4 copies: gathered over TP at the larger share
    for r in (0, 1):
        assert _size(by[r]["L1.moe_tp_gather.fwd.mb0"]) == 8 * 128
        assert _size(by[r]["L1.moe_tp_scatter.fwd.mb0"]) == 2 * 8 * 128
        # all 12 copies through half of each expert's FFN (16 of 32): up/gate [12, 64] x [64, 2 x 16]
        assert _flops(bundle, r, "L1.moe_expert_up_gate.fwd.mb0") == 2 * 12 * 64 * 32
        assert _flops(bundle, r, "L1.moe_router.fwd.mb0") == 2 * 4 * 64 * 4  # 4 local tokens
    # EP rank 1: 2 + 6 = 8 and 4 + 8 = 12 copies
    assert _flops(bundle, 3, "L1.moe_expert_up_gate.fwd.mb0") == 2 * 20 * 64 * 32
    assert _size(by[3]["L1.moe_tp_gather.fwd.mb0"]) == 12 * 128
    names = [n.name.split(".")[1] for n in bundle.nodes[0] if n.name.startswith("L1.") and ".fwd." in n.name]
    i = names.index("mlp_norm")
    assert names[i : i + 17] == [
        "mlp_norm", "moe_router", "moe_router_topk", "moe_permute_map", "moe_permute", "moe_dispatch",
        "moe_dispatch", "moe_dispatch_probs", "moe_dispatch_probs",
        "moe_tp_gather", "moe_sort_chunks", "moe_expert_up_gate", "moe_expert_act", "moe_expert_down",
        "moe_unsort_chunks", "moe_tp_scatter", "moe_combine",
    ]  # fmt: skip
    assert "mlp_tp_in" not in names and "mlp_tp_out" not in names


def test_moe_with_tp_needs_sequence_parallelism():
    with pytest.raises(SpecError, match="need sequence_parallel: true"):
        load_spec({"model": _model(4), "parallel": {"gpu": "H100", "tp": 2, "dp": 2, "ep": 2}})


def test_expert_tp_1_under_tp2_by_hand():
    """etp 1, tp 2, dp 2, ep 4: every TP rank is an EP rank of its own (slot = replica x 2 + TP index, so
    ranks 0..3 are EP ranks 0..3, one expert each), routes its 4 of 8 tokens and runs whole experts."""
    table = [[4, 2, 1, 1], [2, 2, 2, 2], [1, 1, 2, 4], [0, 0, 4, 4]]  # row s: the tokens of EP rank s
    spec = {"model": _model(4, {"tokens": table}), "sequence_parallel": True,
            "parallel": {"gpu": "H100", "tp": 2, "dp": 2, "ep": 4, "etp": 1}}  # fmt: skip
    dep = load_spec(spec)
    assert [dg.etp for dg in dep.device_groups] == [1, 1]
    bundle = generate(dep, rewrite=False)
    by = [{n.name: n for n in bundle.nodes[r]} for r in range(4)]
    # rank 0 (expert 0) sends rank q its copies for expert q: 2, 1, 1; receives q's for expert 0: 2, 1, 0
    assert [_size(by[0][f"L1.moe_dispatch.fwd.mb0.to{q}"]) for q in (1, 2, 3)] == [2 * 128, 128, 128]
    assert [_size(by[0][f"L1.moe_dispatch.fwd.mb0.from{q}"]) for q in (1, 2)] == [2 * 128, 128]
    assert "L1.moe_dispatch.fwd.mb0.from3" not in by[0]  # source 3 routes nothing to expert 0
    # whole experts (FFN 32, up/gate 64 wide): rank 0 runs 4 + 2 + 1 + 0 = 7 copies, rank 3 1 + 2 + 4 + 4 = 11
    assert _flops(bundle, 0, "L1.moe_expert_up_gate.fwd.mb0") == 2 * 7 * 64 * 64
    assert _flops(bundle, 3, "L1.moe_expert_up_gate.fwd.mb0") == 2 * 11 * 64 * 64
    assert _flops(bundle, 1, "L1.moe_router.fwd.mb0") == 2 * 4 * 64 * 4  # 4 sequence-parallel tokens
    names = {n.split(".")[1] for n in by[0] if n.startswith("L1.")}
    assert not names & {"moe_tp_gather", "moe_tp_scatter", "moe_sort_chunks"}  # no expert TP, 1 local expert

    # memory: etp 1 at ep 4 holds one whole expert (3 x 64 x 32) per rank, as etp 2 at ep 2 holds half of
    # two; etp 1 at ep 2 holds two whole experts: 3 x 64 x 32 parameters more
    def par(**p):
        return {
            m.params for m in deployment_memory(load_spec({**spec, "parallel": {**spec["parallel"], **p}}))
        }

    assert par() == par(ep=2, etp=2)
    # an EP group of 4 slots spans 2 replicas of 2 TP ranks: the compact block is 2 replicas (4 under etp 2)
    from xsim.tracegen.compact import replica_block

    wide = {**spec, "parallel": {**spec["parallel"], "dp": 4}}
    assert replica_block(load_spec(wide)) == 2
    assert replica_block(load_spec({**wide, "parallel": {**wide["parallel"], "etp": 2}})) == 4
    assert len(par(ep=2)) == 1 and par(ep=2).pop() - par().pop() == 3 * 64 * 32


def test_balanced_all_to_all_bytes_by_hand():
    """The all-to-all is one collective only when every source sends every EP peer the same bytes."""
    from xsim.tracegen.moe import MoeSpec
    from xsim.tracegen.moe_ops import even_bytes

    moe = MoeSpec(experts=8, top_k=2, expert_ffn=32)
    # 8 tokens x top-2 spread 2 per expert: each of 4 EP ranks (2 experts) gets 4 copies of 64 x 2 B
    assert even_bytes([(2,) * 8] * 4, moe, 4, H, B) == 4 * H * B
    assert even_bytes([tuple(r) for r in TABLE], moe, 4, H, B) == 0  # skewed rows: P2P pairs
    assert even_bytes([(4, 0) * 4] * 4, moe, 4, H, B) == 4 * H * B  # equal per EP rank, not per expert
    assert even_bytes([(2,) * 8], moe, 1, H, B) == 0  # no EP peers
