"""Megatron-Core's token dispatchers besides the all-to-all one: flex with DeepEP (`moe_token_dispatcher_type:
flex`: the bytes of DeepEP's legs and the ops around them, tracegen.moe_ops.deepep_legs) and allgather
(tracegen.moe_ops.allgather_steps), each against a hand count."""

from __future__ import annotations

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.moe import MoeSpec
from xsim.tracegen.moe_ops import deepep_legs, hit_tokens
from xsim.traces import attrs as A
from xsim.traces import pb

H, B = 64, 2  # hidden and BF16 bytes: a token's hidden state is 128 B
TABLE = [
    [4, 4, 2, 2, 1, 1, 1, 1],
    [2, 2, 2, 2, 2, 2, 2, 2],
    [0, 0, 0, 0, 8, 8, 0, 0],
    [1, 1, 1, 1, 1, 1, 5, 5],
]  # tokens per expert routed by EP ranks 0..3: 8 tokens x top-2 = 16 per row


def _spec(experts, top_k, seq, dp, routing="uniform", **extra):
    moe = {"experts": experts, "top_k": top_k, "expert_ffn": 32, "routing": routing}
    model = {"name": "tiny-moe", "layers": 1, "hidden": H, "ffn_hidden": 128, "heads": 4, "vocab": 256,
             "seq_len": seq, "moe": moe}  # fmt: skip
    return {"model": model, "parallel": {"gpu": "H100", "dp": dp, "ep": dp}, "moe_token_dispatcher_type": "flex",
            **extra}  # fmt: skip


def _attrs(n):
    return {a.name: a for a in n.attr}


def _colls(bundle, rank):
    """name -> (comm size, pg members) of the rank's MoE collectives."""
    out = {}
    for n in bundle.nodes[rank]:
        if n.type == pb.COMM_COLL_NODE and ".moe_" in n.name:
            at = _attrs(n)
            out[n.name] = (at[A.COMM_SIZE].int64_val, bundle.comm_groups[at[A.PG_NAME].string_val])
    return out


def test_hit_tokens_by_hand():
    # 16 tokens, top-2 of 8 uniform: 4 copies per expert, a token picks an expert with p = 4/16 = 1/4;
    # a rank of 2 experts gets 16 x (1 - (3/4)^2) = 16 x 7/16 = 7 tokens (Megatron's all-to-all: 8 copies)
    assert hit_tokens((4,) * 8, range(2), 16) == 7
    # 16 tokens, top-4 of 16: p = 1/4; a node of 8 experts: 16 x (1 - (3/4)^8) = 16 - 6561/4096 = 14.40 -> 14
    assert hit_tokens((4,) * 16, range(8), 16) == 14
    assert hit_tokens((0, 0, 8, 8), range(2), 8) == 0  # no copies for these experts: nothing to send


def test_flex_ep4_one_node_by_hand():
    """EP 4 in one node: one NVLink leg, each token once per rank, its top-k indices and weights along."""
    bundle = generate(load_spec(_spec(8, 2, 16, 4)), rewrite=False)
    names = [n.name for n in bundle.nodes[0] if ".moe_" in n.name and ".fwd." in n.name]
    # no permute before the exchange, no probabilities' all-to-all, no sort by expert (flex_steps)
    assert names == [
        f"L1.moe_{x}.fwd.mb0"
        for x in ("router", "router_topk", "dispatch_indices", "dispatch_layout", "dispatch", "indices_to_multihot",
                  "permute_map", "permute", "expert_up_gate", "expert_act", "expert_down", "unpermute", "combine")
    ]  # fmt: skip
    # 7 tokens to every peer (test_hit_tokens_by_hand), 128 + 2 x (4 + 4) = 144 B each forward: one
    # ALL_TO_ALL of 4 x 7 x 144 = 4,032 B; the combine and the backward carry 128 B: 4 x 7 x 128 = 3,584 B
    colls = _colls(bundle, 0)
    assert colls["L1.moe_dispatch.fwd.mb0"] == (4032, (0, 1, 2, 3))
    assert colls["L1.moe_combine.fwd.mb0"] == (3584, (0, 1, 2, 3))
    assert colls["L1.moe_combine.bwd.mb0"][0] == colls["L1.moe_dispatch.bwd.mb0"][0] == 3584
    # the receiver permutes 4 x 7 = 28 rows into 4 x 8 = 32 copies: (28 + 32) x 128 + 32 x 4 = 7,808 B
    permute = next(n for n in bundle.nodes[0] if n.name == "L1.moe_permute.fwd.mb0")
    assert _attrs(permute)[A.TENSOR_SIZE].uint64_val == 7808


def test_flex_ep4_skewed_routing_p2p_by_hand():
    bundle = generate(load_spec(_spec(8, 2, 8, 4, {"tokens": TABLE})), rewrite=False)
    # p = count / 8 per expert. Rank 0 -> rank 1 (experts 2, 3; p 1/4, 1/4): 8 x (1 - 9/16) = 3.5 -> 4
    # tokens; -> ranks 2, 3 (p 1/8, 1/8): 8 x 15/64 = 1.875 -> 2. Rank 1 (p 1/4 each) -> 4 to everyone.
    # Rank 2 routes only to its own experts; rank 3 -> ranks 0, 1, 2: 2 each. 144 B a token.
    expect = {0: {1: 4, 2: 2, 3: 2}, 1: {0: 4, 2: 4, 3: 4}, 2: {}, 3: {0: 2, 1: 2, 2: 2}}
    for r in range(4):
        nodes = [n for n in bundle.nodes[r] if n.name.startswith("L1.moe_dispatch.fwd")]
        sends = {_attrs(n)[A.COMM_DST].int32_val: _attrs(n)[A.COMM_SIZE].int64_val
                 for n in nodes if n.type == pb.COMM_SEND_NODE}  # fmt: skip
        recvs = {_attrs(n)[A.COMM_SRC].int32_val: _attrs(n)[A.COMM_SIZE].int64_val
                 for n in nodes if n.type == pb.COMM_RECV_NODE}  # fmt: skip
        assert sends == {q: 144 * t for q, t in expect[r].items()}
        assert recvs == {s: 144 * v[r] for s, v in expect.items() if r in v}


def test_flex_ep16_two_nodes_rdma_and_nvlink_legs_by_hand():
    """EP 16 over two nodes of 8, top-4 of 16 experts (one a rank), 16 tokens a rank, uniform."""
    bundle = generate(load_spec(_spec(16, 4, 16, 16)), rewrite=False)
    # RDMA leg: each token crosses once per other node that holds one of its experts: 14 tokens
    # (test_hit_tokens_by_hand) x (128 + 4 x 8 = 160 B) = 2,240 B to the rank at the same place on the
    # other node: one ALL_TO_ALL of 2 x 2,240 = 4,480 B over {r, r + 8}.
    # NVLink leg: rank (node a, place i) forwards to (a, j) the tokens of both ranks at place i bound for
    # (a, j): 2 x 16 x 1/4 = 8 tokens x 160 B = 1,280 B: one ALL_TO_ALL of 8 x 1,280 = 10,240 B over the node.
    # Megatron's all-to-all instead sends each of 15 peers 4 copies x 128 B, 8 x 512 = 4,096 B over the NIC.
    colls = _colls(bundle, 9)
    assert colls["L1.moe_dispatch.rail.fwd.mb0"] == (4480, (1, 9))
    assert colls["L1.moe_dispatch.node.fwd.mb0"] == (10240, tuple(range(8, 16)))
    # the combine goes back the same way with 128 B a token: 2 x 14 x 128 = 3,584; 8 x 8 x 128 = 8,192 B
    assert colls["L1.moe_combine.rail.fwd.mb0"][0] == 3584
    assert colls["L1.moe_combine.node.fwd.mb0"][0] == 8192
    assert colls["L1.moe_dispatch.rail.bwd.mb0"][0] == 3584
    # every rank receives 16 sources x 4 tokens = 64 rows
    moe = MoeSpec(experts=16, top_k=4, expert_ffn=32)
    legs, rows = deepep_legs([(4,) * 16] * 16, moe, 16, (0,) * 8 + (1,) * 8, 9, 16)
    assert rows == 64 and [(g, even) for g, _, _, even in legs] == [("rail", 14), ("node", 8)]


def test_flex_legs_run_together_in_replay(tmp_path, capsys):
    """The RDMA and NVLink legs are issued together (DeepEP pipelines them): on a 1 GB/s, 0-latency switch,
    contention-free, the rail leg takes 2,240 B / 1 GB/s = 2,240 ns and the node leg 1,280 ns (its 1,280 B
    transfers run at once), and the receiver's first op starts when the longer ends."""
    import polars as pl

    from xsim.cli import main

    bundle = generate(load_spec(_spec(16, 4, 16, 16)), rewrite=False)
    bundle.write(str(tmp_path), "moe")
    out = tmp_path / "out"
    assert main(["replay", str(tmp_path), "--topology", "switch:16:1GBps:0ns", "--model", "analytical",
                 "--out", str(out), "--no-progress"]) == 0  # fmt: skip
    ops = pl.read_parquet(out / "ops.parquet").filter(pl.col("rank") == 0)
    at = {r["name"]: r for r in ops.iter_rows(named=True)}
    rail, node = at["L1.moe_dispatch.rail.fwd.mb0"], at["L1.moe_dispatch.node.fwd.mb0"]
    assert rail["start_ns"] == node["start_ns"]
    assert (rail["duration_ns"], node["duration_ns"]) == (2240, 1280)
    assert at["L1.moe_indices_to_multihot.fwd.mb0"]["start_ns"] == rail["end_ns"]


@pytest.mark.parametrize(
    ("extra", "parallel", "message"),
    [
        ({"moe_token_dispatcher_type": "allgather"}, {"dp": 4, "ep": 1}, "allgather needs ep > 1"),
        ({"moe_token_dispatcher_type": "deepep"}, {}, "moe_token_dispatcher_type must be one of alltoall, allgather, flex"),
        ({}, {"dp": 4, "ep": 1}, "flex needs ep > 1"),
        ({"sequence_parallel": True}, {"dp": 2, "ep": 2, "tp": 2}, "flex with expert TP > 1 is not generated yet"),
    ],
)  # fmt: skip
def test_flex_refusals_in_one_line(extra, parallel, message):
    spec = _spec(8, 2, 16, 4)
    spec["parallel"].update(parallel)
    spec.update(extra)
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        generate(load_spec(spec), rewrite=False)


def test_alltoall_is_the_default_bit_for_bit():
    spec = _spec(8, 2, 16, 4)
    spec["moe_token_dispatcher_type"] = "alltoall"
    given = load_spec(spec)
    del spec["moe_token_dispatcher_type"]
    assert given.SerializeToString() == load_spec(spec).SerializeToString()


def test_flex_needs_as_many_ep_ranks_on_every_node():
    # EP 12 over the derived cluster's nodes of 8: 8 ranks on one node, 4 on the next
    from xsim.tracegen.errors import GeneratorError

    with pytest.raises(
        GeneratorError, match="holds 8, 4 ranks on its nodes; DeepEP needs as many on every node"
    ):
        generate(load_spec(_spec(12, 2, 12, 12)), rewrite=False)


def test_rank_nodes_from_the_cluster_description():
    from xsim.tracegen.moe_ops import ep_nodes, rank_node

    # a system preset's nodes of 8; a nodes list's counts; nothing: 8 consecutive ranks
    assert ep_nodes((0, 1, 8, 9), rank_node('{"system": "dgx-h100"}')) == (0, 0, 1, 1)
    assert ep_nodes((0, 1, 2, 3), rank_node('{"nodes": [{"count": 2}, {"count": 2}]}')) == (0, 0, 1, 1)
    assert ep_nodes((7, 8), rank_node("")) == (0, 1)


def test_allgather_dispatcher_by_hand():
    """EP 4, top-2 of 8, 16 tokens a rank, hidden 64: everything is gathered, the rank's 2 experts' copies
    are picked out of the 64 gathered tokens and reduce-scattered back in FP32."""
    spec = _spec(8, 2, 16, 4)
    spec["moe_token_dispatcher_type"] = "allgather"
    bundle = generate(load_spec(spec), rewrite=False)
    got = {}
    for n in bundle.nodes[0]:
        at = _attrs(n)
        if n.type == pb.COMM_COLL_NODE and ".moe_" in n.name:
            got[n.name] = (at[A.COMM_TYPE].int64_val, at[A.COMM_SIZE].int64_val)
        elif ".moe_" in n.name:
            got[n.name] = at[A.TENSOR_SIZE].uint64_val
    ag, rs = pb.ALL_GATHER, pb.REDUCE_SCATTER
    # AllGather sizes are the per-rank input: map 16 x 8 x 1 B, probabilities 16 x 8 x 4 B, tokens 16 x 64 x 2 B
    assert got["L1.moe_dispatch_map.fwd.mb0"] == (ag, 128)
    assert got["L1.moe_dispatch_probs.fwd.mb0"] == (ag, 512)
    assert got["L1.moe_dispatch.fwd.mb0"] == (ag, 2048)
    # 64 gathered tokens, 2 local experts, 4 x 8 = 32 copies: slices, transposes and masked_select
    # 64 x 2 x (1 + 4) x 4 + 32 x (8 + 4) = 2,944 B; permute (64 + 32) x 128 = 12,288 B
    assert got["L1.moe_local_map.fwd.mb0"] == 2944
    assert got["L1.moe_permute.fwd.mb0"] == got["L1.moe_unpermute.fwd.mb0"] == 12288
    # the [64, 64] output in FP32, whole buffer 64 x 64 x 4 = 16,384 B; backward: its gather of 16 x 64 x 4
    # and the tokens' and probabilities' reduce-scatters of 64 x 64 x 2 and 64 x 8 x 4 B (the map has none)
    assert got["L1.moe_combine.fwd.mb0"] == (rs, 16384)
    assert got["L1.moe_combine.bwd.mb0"] == (ag, 4096)
    assert got["L1.moe_dispatch.bwd.mb0"] == (rs, 8192)
    assert got["L1.moe_dispatch_probs.bwd.mb0"] == (rs, 2048)
    assert "L1.moe_dispatch_map.bwd.mb0" not in got
