"""DeepSpeed's engine as GPT-NeoX c560814b ran it (framework gpt-neox): DeeperSpeed eb7f5cff36's pipeline
engine sends the activation as the rank's 1/TP part but the gradient whole (`is_grad_partitioned = False`,
deepspeed/runtime/pipe/engine.py; Framework.pp_grad_whole), and its ZeRO stage 1 all-reduces the whole FP16
gradients after the last backward (`_exec_reduce_grads` -> `buffered_allreduce_fallback`, deepspeed/runtime/
engine.py), then updates the rank's partition and all-gathers the parameters (Framework.sharded_grad_allreduce)."""

from __future__ import annotations

from pathlib import Path

from xsim.replay import simulate
from xsim.tracegen import generate, load_spec
from xsim.traces import attrs as A
from xsim.traces import pb

from xsim import api

MODEL = {"name": "tiny", "layers": 2, "hidden": 1024, "ffn_hidden": 4096, "heads": 8, "vocab": 1024,
         "seq_len": 1024, "activation": "gelu", "norm": "layernorm", "linear_bias": True, "tie_embeddings": False,
         "position_embedding": "rope"}  # fmt: skip
# Two stages of one layer, TP 2, 2 micro-batches of one sequence: ranks 0, 1 on stage 0 and 2, 3 on stage 1.
PP2_TP2 = {
    "model": MODEL, "micro_batches": 2, "schedule": "1f1b", "framework": "gpt-neox", "precision": "fp16",
    "device_groups": [
        {"gpu": "A100-80GB", "ranks": [0, 1], "tp": 2, "pp_stage": 0, "layers": [1, 1]},
        {"gpu": "A100-80GB", "ranks": [2, 3], "tp": 2, "pp_stage": 1, "layers": [2, 2]},
    ],
}  # fmt: skip
PIPE = ("send_", "recv_", "pp_gather_")


def _pipe(nodes: list) -> list[tuple[str, int]]:
    """The rank's transfers and their gathers in program order: name, bytes."""
    return [(n.name, A.get_int(n, A.COMM_SIZE)) for n in nodes if n.name.startswith(PIPE)]


def test_activation_split_gradient_whole() -> None:
    # The boundary tensor is 1024 tokens x 1024 x 2 B = 2,097,152 B; its 1/TP part 1,048,576 B. TrainSchedule's
    # order as for megatron-deepspeed (tests/test_mtnlg_deepspeed_pipe.py), but the gradient crosses whole and
    # is not all-gathered after it: no pp_gather_grad; stage 0 still rebuilds its own output (pp_gather_out)
    # and stage 1 its received activation (pp_gather_act).
    whole, half = 2_097_152, 1_048_576
    bundle = generate(load_spec(PP2_TP2))
    assert _pipe(bundle.nodes[0]) == [
        ("send_act.fwd.mb0.to2", half),
        ("send_act.fwd.mb1.to2", half),
        ("recv_grad.bwd.mb0.from2", whole),
        ("pp_gather_out.bwd.mb0", half),
        ("recv_grad.bwd.mb1.from2", whole),
        ("pp_gather_out.bwd.mb1", half),
    ]
    assert _pipe(bundle.nodes[2]) == [
        ("recv_act.fwd.mb0.from0", half),
        ("pp_gather_act.fwd.mb0", half),
        ("recv_act.fwd.mb1.from0", half),
        ("send_grad.bwd.mb0.to0", whole),
        ("pp_gather_act.fwd.mb1", half),
        ("send_grad.bwd.mb1.to0", whole),
    ]
    # megatron-deepspeed (DeepSpeed v0.6.0 on: is_grad_partitioned = is_model_parallel) keeps the split grad
    ds = generate(load_spec({**PP2_TP2, "framework": "megatron-deepspeed"}))
    assert ("send_grad.bwd.mb0.to0", half) in _pipe(ds.nodes[2])


def test_whole_gradient_holds_the_stream_for_its_transfer(tmp_path: Path) -> None:
    # On a 50 GB/s switch with 500 ns hops the 2,097,152 B gradient takes 41,943.04 + 1,000 ns, 42,944 ns
    # rounded up to the ns grid (the 1,048,576 B part: 20,971.52 + 1,000 -> 21,972 ns, as in
    # tests/test_mtnlg_deepspeed_pipe.py), and stage 1's forward of micro-batch 1 (its input's all-gather
    # first) waits for it: a blocking p2p.send on the compute stream's order.
    out = str(tmp_path / "neox")
    api.generate(load_spec({**PP2_TP2, "name": "neox"}), api.GenerateOptions(out=out, all_ranks=True))
    res = simulate(out, network=api.build_network(api.NetworkOptions(topology="switch:4:50GBps:500ns")))
    ops = {(r["rank"], r["name"]): r for r in res.ops.iter_rows(named=True)}
    send = ops[(2, "send_grad.bwd.mb0.to0")]
    assert send["duration_ns"] == 42_944
    assert ops[(2, "pp_gather_act.fwd.mb1")]["start_ns"] == send["end_ns"]
    assert ops[(0, "send_act.fwd.mb0.to2")]["duration_ns"] == 21_972


# One stage of both layers, TP 1, DP 2 (ranks 0 and 1), ZeRO stage 1 as GPT-NeoX configures it.
DP2 = {
    "model": MODEL, "micro_batches": 2, "schedule": "1f1b", "framework": "gpt-neox", "precision": "fp16",
    "distributed_optimizer": True,
    "device_groups": [
        {"gpu": "A100-80GB", "ranks": [0], "tp": 1, "pp_stage": 0, "layers": [1, 2], "dp_replica": 0},
        {"gpu": "A100-80GB", "ranks": [1], "tp": 1, "pp_stage": 0, "layers": [1, 2], "dp_replica": 1},
    ],
}  # fmt: skip


def test_zero1_all_reduces_the_whole_gradient() -> None:
    # Parameters of the rank (h 1024, FFN 4096, vocabulary 1024 = a multiple of 128): per layer QKV 3h^2 + 3h,
    # projection h^2 + h, fc1 4h^2 + 4h, fc2 4h^2 + h, two layer norms 4h: 12h^2 + 13h = 12,596,224; two
    # layers 25,192,448; word embedding 1,048,576 (RoPE: no position table); final norm 2,048; untied head
    # 1,048,576: 27,291,648 parameters, all-reduced whole in FP16: 54,583,296 B after the last backward (no
    # reduce-scatter), then the 1/DP partition's parameters all-gathered.
    bundle = generate(load_spec(DP2))
    nodes = bundle.nodes[0]
    dp = [n for n in nodes if n.name.startswith("dp_grad_")]
    assert [(n.name, A.get_int(n, A.COMM_TYPE), A.get_int(n, A.COMM_SIZE)) for n in dp] == [
        ("dp_grad_allreduce.bucket0", pb.ALL_REDUCE, 54_583_296)
    ]
    gather = [
        (n.name, A.get_int(n, A.COMM_TYPE), A.get_int(n, A.COMM_SIZE))
        for n in nodes
        if n.name.startswith("dp_param")
    ]
    assert gather == [("dp_param_allgather.bucket0", pb.ALL_GATHER, 27_291_648)]  # the 1/2 shard x 2 B
