"""Megatron-LM 2021/2022's synchronizing timers (Framework.step_timers, tracegen.workload TIMER_SYNCS_*): host
syncs around every forward step, backward step and pipeline exchange, worked out by hand."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from xsim.replay import ReplayConfig, simulate
from xsim.tracegen import generate, load_spec
from xsim.tracegen.frameworks import FRAMEWORKS
from xsim.tracegen.host import HOST_SYNC_NS
from xsim.tracegen.ops import XENT
from xsim.traces import attrs as A

from xsim import api

SYNC = 15_000  # ns: HOST_SYNC_NS
# One rank, two micro-batches, Megatron-LM 2021 (fp16), a launch costs 1 ns: the host never binds except
# right after a sync.
ONE = {
    "model": {"name": "tiny", "layers": 2, "hidden": 1024, "ffn_hidden": 4096, "heads": 8, "vocab": 1024,
              "seq_len": 1024},
    "micro_batches": 2, "schedule": "1f1b", "framework": "megatron-2021", "precision": "fp16",
    "host_launch_us": 0.001,
    "device_groups": [{"gpu": "A100-80GB", "ranks": [0], "tp": 1, "micro_batch": 1}],
}  # fmt: skip
PP2 = {
    **ONE,
    "schedule": "1f1b",
    "device_groups": [
        {"gpu": "A100-80GB", "ranks": [0], "tp": 1, "pp_stage": 0, "layers": [1, 1]},
        {"gpu": "A100-80GB", "ranks": [1], "tp": 1, "pp_stage": 1, "layers": [2, 2]},
    ],
}


def _replay(tmp_path: Path, spec: dict, name: str):
    out = str(tmp_path / name)
    api.generate(load_spec({**spec, "name": name}), api.GenerateOptions(out=out, all_ranks=True))
    return simulate(out, network=None, config=ReplayConfig(comm_mode="measured"))


def _no_timers(monkeypatch) -> None:
    fw = FRAMEWORKS["megatron-2021"]
    monkeypatch.setitem(FRAMEWORKS, "megatron-2021", dataclasses.replace(fw, step_timers=False))


def _host_syncs(nodes: list) -> list[tuple[int, list[str]]]:
    """(sync multiples, names of the kernels waited for) of each host node that waits for kernels and
    carries whole syncs (launches cost 1 ns here, so a host node's ns is syncs x SYNC + launches)."""
    out = []
    for n in nodes:
        if n.name.startswith("host:") and n.data_deps:
            ns = A.get_int(n, A.DURATION_NS)
            out.append((ns // SYNC, [nodes[d].name for d in n.data_deps]))
    return out


def test_profiles_time_their_steps() -> None:
    assert HOST_SYNC_NS == SYNC
    assert FRAMEWORKS["megatron-2021"].step_timers and FRAMEWORKS["megatron-2022"].step_timers
    assert not FRAMEWORKS["megatron-core"].step_timers and not FRAMEWORKS["megatron-deepspeed"].step_timers


def test_timer_syncs_around_each_pass_by_hand() -> None:
    # One rank, 1F1B: F0 (nothing launched before it: the host is ahead), B0, F1, B1, then the optimizer's
    # two reads. Each host node carries one timer call's syncs after the kernel it waits for: F0's stop and
    # B0's start (1 + 1 on F0's last kernel); B0's stop, then F1's 'forward-compute' start, 'batch-generator'
    # start, the broadcast sizes' .cpu() and 'batch-generator' stop (1 + 4 on B0's last); F1's stop and
    # B1's start (1 + 1); B1's stop after its gradient accumulation (the second micro-batch's).
    got = _host_syncs(generate(load_spec(ONE)).nodes[0])
    assert [(k, w) for k, w in got if not w[0].endswith(".opt")] == [
        (1, ["loss.fwd.mb0"]), (1, ["loss.fwd.mb0"]),
        (1, ["embedding.bwd.mb0"]), (4, ["embedding.bwd.mb0"]),
        (1, ["loss.fwd.mb1"]), (1, ["loss.fwd.mb1"]),
        (1, ["grad_accum.bwd.mb1"]),
    ]  # fmt: skip


def test_timer_syncs_step_time_by_hand(tmp_path: Path, monkeypatch) -> None:
    # Each group of k syncs leaves the GPU idle k x SYNC plus the launches (1 ns each) of the op that starts
    # first after it: the loss's backward (two kernels, XENT["megatron"]["bwd"]) after F0 and after F1, the
    # embedding's forward (one) after B0, the pre-all-reduce coalesce (one) after B1:
    # (2 + 5 + 2 + 1) x SYNC + (2 + 1 + 2 + 1) ns.
    assert XENT["megatron"]["bwd"][0] == 2
    on = _replay(tmp_path, ONE, "on")
    _no_timers(monkeypatch)
    off = _replay(tmp_path, ONE, "off")
    assert on.per_rank_finish_ns[0] == off.per_rank_finish_ns[0] + 10 * SYNC + 6


def test_exchange_timer_syncs_with_the_exchange(monkeypatch) -> None:
    # Stage 1 of 2 (1F1B, 2 micro-batches; schedules.py of de7dc40f88): recv_forward, F0, B0 (the last
    # stage's send_forward_recv_backward is a no-op without a timer), send_backward_recv_forward, F1, B1,
    # send_backward. An exchange's timer starts before and stops after _communicate: with its synchronize,
    # three syncs on the exchange's transfers; the passes' syncs as in the one-rank case.
    R0, R1 = "recv_act.fwd.mb0.from0", "recv_act.fwd.mb1.from0"
    G0, G1 = "send_grad.bwd.mb0.to0", "send_grad.bwd.mb1.to0"
    B0 = "L2.attn_residual.bwd.mb0"  # stage 1's last backward kernel (no gradient accumulation at mb0)
    want = [
        (3, [R0]), (4, [R0]),  # recv_forward; F0's start
        (1, ["loss.fwd.mb0"]), (1, ["loss.fwd.mb0"]),  # F0's stop, B0's start
        (1, [B0]), (3, [G0, R1]), (4, [B0, R1]),  # B0's stop; send_backward_recv_forward; F1's start
        (1, ["loss.fwd.mb1"]), (1, ["loss.fwd.mb1"]),
        (1, ["grad_accum.bwd.mb1"]), (3, [G1]),  # B1's stop; send_backward
    ]  # fmt: skip
    got = _host_syncs(generate(load_spec(PP2)).nodes[1])
    assert [(k, w) for k, w in got if not w[0].endswith(".opt")] == want
    _no_timers(monkeypatch)
    off = _host_syncs(generate(load_spec(PP2)).nodes[1])
    assert [(k, w) for k, w in off if not w[0].endswith(".opt")] == [(1, [R0]), (1, [G0, R1]), (1, [G1])]
