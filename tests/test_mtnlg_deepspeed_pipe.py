"""DeepSpeed's pipeline engine as framework megatron-deepspeed generates it (Framework.deepspeed_pipe):
blocking transfers in TrainSchedule's order, partitioned over TP (microsoft/DeepSpeed v0.6.0 a32e9b3376 and
v0.7.0 5fe9d61065, deepspeed/runtime/pipe/engine.py, schedule.py, p2p.py)."""

from __future__ import annotations

from pathlib import Path

from xsim.replay import simulate
from xsim.tracegen import generate, load_spec
from xsim.traces import attrs as A
from xsim.traces import pb

from xsim import api

# Two stages of one layer, TP 2, 2 micro-batches: ranks 0, 1 on stage 0 and 2, 3 on stage 1.
PP2_TP2 = {
    "model": {"name": "tiny", "layers": 2, "hidden": 1024, "ffn_hidden": 4096, "heads": 8, "vocab": 1024,
              "seq_len": 1024},
    "micro_batches": 2, "schedule": "1f1b", "framework": "megatron-deepspeed", "precision": "fp16",
    "device_groups": [
        {"gpu": "A100-80GB", "ranks": [0, 1], "tp": 2, "pp_stage": 0, "layers": [1, 1]},
        {"gpu": "A100-80GB", "ranks": [2, 3], "tp": 2, "pp_stage": 1, "layers": [2, 2]},
    ],
}  # fmt: skip
PIPE = ("send_", "recv_", "pp_gather_")


def _pipe(nodes: list) -> list[tuple[str, int, list[str], list[str]]]:
    """The rank's transfers and their gathers in program order: name, bytes, data deps, control deps."""
    return [
        (n.name, A.get_int(n, A.COMM_SIZE), [nodes[d].name for d in n.data_deps], [nodes[d].name for d in n.ctrl_deps])
        for n in nodes
        if n.name.startswith(PIPE)
    ]  # fmt: skip


def test_transfers_follow_trainschedule_and_block_the_stream() -> None:
    # TrainSchedule, P 2, M 2 (schedule.py _step_to_micro_batch): stage 0 runs F0, [SendAct 0], F1,
    # [SendAct 1, RecvGrad 0] B0, [RecvGrad 1] B1; stage 1 [RecvAct 0] F0, B0, [RecvAct 1, SendGrad 0] F1,
    # B1, [SendGrad 1]. Each transfer waits for the kernel before it (control dep on the stream's last node)
    # and the next kernel waits for it. Sizes: the 1024 x 1024 x 2 B tensor's 1/TP part, 1,048,576 B, and
    # the all-gathers (per-rank input) of the same size: the input before the forward, the stage's own output
    # (part_output.full()) then the gradient before the backward.
    half = 1_048_576
    bundle = generate(load_spec(PP2_TP2))
    assert _pipe(bundle.nodes[0]) == [
        ("send_act.fwd.mb0.to2", half, ["L1.mlp_residual.fwd.mb0"], []),
        ("send_act.fwd.mb1.to2", half, ["L1.mlp_residual.fwd.mb1"], []),
        ("recv_grad.bwd.mb0.from2", half, [], ["send_act.fwd.mb1.to2"]),
        ("pp_gather_out.bwd.mb0", half, ["L1.mlp_residual.fwd.mb0"], ["recv_grad.bwd.mb0.from2"]),
        ("pp_gather_grad.bwd.mb0", half, ["recv_grad.bwd.mb0.from2"], ["pp_gather_out.bwd.mb0"]),
        ("recv_grad.bwd.mb1.from2", half, [], ["embedding.bwd.mb0"]),
        ("pp_gather_out.bwd.mb1", half, ["L1.mlp_residual.fwd.mb1"], ["recv_grad.bwd.mb1.from2"]),
        ("pp_gather_grad.bwd.mb1", half, ["recv_grad.bwd.mb1.from2"], ["pp_gather_out.bwd.mb1"]),
    ]
    assert _pipe(bundle.nodes[2]) == [
        ("recv_act.fwd.mb0.from0", half, [], []),
        ("pp_gather_act.fwd.mb0", half, ["recv_act.fwd.mb0.from0"], []),
        ("recv_act.fwd.mb1.from0", half, [], ["L2.attn_residual.bwd.mb0"]),
        ("send_grad.bwd.mb0.to0", half, ["L2.attn_residual.bwd.mb0"], ["recv_act.fwd.mb1.from0"]),
        ("pp_gather_act.fwd.mb1", half, ["recv_act.fwd.mb1.from0"], ["send_grad.bwd.mb0.to0"]),
        ("send_grad.bwd.mb1.to0", half, ["L2.attn_residual.bwd.mb1"], []),
    ]
    nodes = bundle.nodes[0]
    emb1 = next(n for n in nodes if n.name == "embedding.fwd.mb1")  # F1 waits for SendAct 0
    assert [nodes[d].name for d in emb1.ctrl_deps] == ["send_act.fwd.mb0.to2"]
    gather = next(n for n in nodes if n.name == "pp_gather_out.bwd.mb0")
    assert A.get_int(gather, A.COMM_TYPE) == pb.ALL_GATHER and set(
        bundle.comm_groups[A.get_str(gather, A.PG_NAME)]
    ) == {0, 1}


def test_blocking_transfers_hold_the_stream_in_the_replay(tmp_path: Path) -> None:
    # On a 50 GB/s switch with 500 ns hops a 1,048,576 B part takes 20,971.52 + 1,000 ns = 21,972 ns on the
    # ns grid (as in tests/test_host_dispatch.py's scatter/gather case). xsim's engine starts a send when
    # its rank issues it (eager, no wait for the receive: the rendezvous of NCCL is not modelled), so
    # blocking shows as the stream held for the transfer: stage 0's F1 starts when SendAct 0 ends, its
    # RecvGrad 0 after SendAct 1 ended; stage 1's RecvAct 1 issues after its B0, its SendGrad 0 after that.
    out = str(tmp_path / "ds")
    api.generate(load_spec({**PP2_TP2, "name": "ds"}), api.GenerateOptions(out=out, all_ranks=True))
    res = simulate(out, network=api.build_network(api.NetworkOptions(topology="switch:4:50GBps:500ns")))
    ops = {(r["rank"], r["name"]): r for r in res.ops.iter_rows(named=True)}
    send0 = ops[(0, "send_act.fwd.mb0.to2")]
    assert send0["duration_ns"] == 21_972
    assert ops[(0, "embedding.fwd.mb1")]["start_ns"] == send0["end_ns"]
    assert ops[(0, "recv_grad.bwd.mb0.from2")]["start_ns"] == ops[(0, "send_act.fwd.mb1.to2")]["end_ns"]
    assert ops[(2, "recv_act.fwd.mb1.from0")]["start_ns"] == ops[(2, "L2.attn_residual.bwd.mb0")]["end_ns"]
    assert ops[(2, "send_grad.bwd.mb0.to0")]["start_ns"] == ops[(2, "recv_act.fwd.mb1.from0")]["end_ns"]
