"""The host thread (tracegen/host.py, docs/tracegen.md "Host dispatch"): CPU nodes that launch the kernels,
syncs where the framework reads a GPU result, and the replayed times they give, worked out by hand."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from xsim.replay import ReplayConfig, simulate
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.frameworks import FRAMEWORKS
from xsim.tracegen.host import HOST_LAUNCH_NS, HOST_SYNC_NS, HostCosts, HostTimeline
from xsim.traces import attrs as A
from xsim.traces import pb

from xsim import api

SYNC = 15_000  # ns: HOST_SYNC_NS, the DLRM trace's D2H cudaMemcpyAsync 8 us + cudaStreamSynchronize 7 us
DENSE = {
    "model": {"name": "tiny", "layers": 2, "hidden": 1024, "ffn_hidden": 4096, "heads": 8, "vocab": 1024,
              "seq_len": 1024},
    "micro_batches": 2,
    "device_groups": [{"gpu": "H100", "ranks": [0], "tp": 1, "micro_batch": 1}],
}  # fmt: skip


# Two pipeline stages of one layer each under Megatron-LM 2021 (1F1B, 2 micro-batches), 1 us a launch.
PP2 = {
    "model": {"name": "tiny", "layers": 2, "hidden": 1024, "ffn_hidden": 4096, "heads": 8, "vocab": 1024,
              "seq_len": 1024},
    "micro_batches": 2, "schedule": "1f1b", "framework": "megatron-2021", "host_launch_us": 1,
    "device_groups": [
        {"gpu": "A100-80GB", "ranks": [0], "tp": 1, "pp_stage": 0, "layers": [1, 1]},
        {"gpu": "A100-80GB", "ranks": [1], "tp": 1, "pp_stage": 1, "layers": [2, 2]},
    ],
}  # fmt: skip


@pytest.fixture(autouse=True)
def _exchange_syncs_only(monkeypatch) -> None:
    """These tests pin the exchange and optimizer syncs: Megatron-LM's timer syncs (Framework.step_timers)
    are off here and pinned in tests/test_step_timers.py."""
    for name in ("megatron-2021", "megatron-2022"):
        monkeypatch.setitem(FRAMEWORKS, name, dataclasses.replace(FRAMEWORKS[name], step_timers=False))


def _replay(tmp_path: Path, spec: dict, name: str, ranks: int = 1):
    out = str(tmp_path / name)
    api.generate(load_spec({**spec, "name": name}), api.GenerateOptions(out=out, all_ranks=True))
    if ranks == 1:
        return simulate(out, network=None, config=ReplayConfig(comm_mode="measured"))
    net = api.build_network(api.NetworkOptions(topology=f"switch:{ranks}:50GBps:500ns"))
    return simulate(out, network=net)


def _op(res, name: str, rank: int = 0) -> dict:
    rows = [r for r in res.ops.iter_rows(named=True) if r["name"] == name and r["rank"] == rank]
    assert len(rows) == 1, name
    return rows[0]


def test_constants_are_the_named_measurements() -> None:
    assert HOST_LAUNCH_NS == 13_480  # TransformerEngine #2053: torch Linear forward, DGX H100 CPU, 13.48 us
    assert HOST_SYNC_NS == SYNC


def test_short_kernels_after_a_sync_are_host_bound(tmp_path: Path) -> None:
    # The grad-norm read (.item()) is the sync; after it the host launches grad_clip, Adam, param_copy and
    # zero_grad at 1 ms each, longer than any of them: each waits for its launch, so the step ends at
    # sync + read + 4 launches + the last kernel.
    on = _replay(tmp_path, {**DENSE, "host_dispatch": "on", "host_launch_us": 1000}, "on")
    sync = _op(on, "grad_norm.opt")["end_ns"]
    last = _op(on, "zero_grad.opt")
    assert last["end_ns"] == sync + SYNC + 4 * 1_000_000 + last["duration_ns"]
    assert on.per_rank_finish_ns == [last["end_ns"]]
    for k, name in enumerate(("grad_clip", "optimizer", "param_copy", "zero_grad")):
        assert _op(on, f"{name}.opt")["start_ns"] == sync + SYNC + (k + 1) * 1_000_000
    # Before the sync the host is ahead (nothing gated): the same times as without the host.
    off = _replay(tmp_path, DENSE, "off")
    assert _op(off, "grad_norm.opt")["end_ns"] == sync


def test_long_kernels_hide_the_host(tmp_path: Path) -> None:
    # 1 us per launch: grad_clip (98 us) outlasts the next launch, so only the read and grad_clip's own
    # launch are exposed; one host node in all.
    spec = {**DENSE, "host_dispatch": "on", "host_launch_us": 1}
    nodes = generate(load_spec(spec)).nodes[0]
    hosts = [n for n in nodes if n.name.startswith("host:")]
    assert [n.name for n in hosts] == ["host:grad_clip.opt"]
    assert A.get_int(hosts[0], A.DURATION_NS) == SYNC + 1_000
    on, off = _replay(tmp_path, spec, "on"), _replay(tmp_path, DENSE, "off")
    clip = _op(off, "grad_clip.opt")["duration_ns"]
    assert clip > 1_000 + 1_000  # the next launch (1 us) is hidden under it
    assert on.per_rank_finish_ns[0] == off.per_rank_finish_ns[0] + SYNC + 1_000


def test_default_off_and_spec_errors() -> None:
    plain = generate(load_spec(DENSE)).nodes[0]
    assert not any(n.name.startswith("host") for n in plain)
    with pytest.raises(SpecError, match="host_dispatch must be on or off"):
        load_spec({**DENSE, "host_dispatch": "maybe"})
    with pytest.raises(SpecError, match="host_launch_us must be a number"):
        load_spec({**DENSE, "host_launch_us": -1})


MOE = {
    "model": {"name": "tiny-moe", "layers": 1, "hidden": 64, "ffn_hidden": 128, "heads": 4, "vocab": 256,
              "seq_len": 8, "moe": {"experts": 8, "top_k": 2, "expert_ffn": 32, "routing": "uniform"}},
    "parallel": {"gpu": "H100", "dp": 2, "ep": 2},
    "micro_batches": 2,
    "host_dispatch": "on",
    "host_launch_us": 10_000,
}  # fmt: skip


def test_dropless_moe_syncs_before_each_forward_dispatch() -> None:
    nodes = generate(load_spec(MOE), rewrite=False).nodes[0]
    by_id = {n.id: n for n in nodes}
    # a host node's data dep is the sync kernel it waits for (its launch chain is a ctrl dep)
    synced = sorted(by_id[d].name for n in nodes if n.name.startswith("host:") for d in n.data_deps)
    # Megatron-Core's "before_ep_alltoall": the host reads the token counts after permutation 1, once per
    # forward per micro-batch; backward reuses the splits; then the grad-norm read.
    assert synced == ["L1.moe_permute.fwd.mb0", "L1.moe_permute.fwd.mb1", "grad_norm.opt"]
    # token drop with a capacity factor (drop and pad: fixed sizes) does not sync in the dispatcher
    drop = {**MOE, "model": {**MOE["model"], "moe": {**MOE["model"]["moe"], "capacity_factor": 1.0}}}
    nodes = generate(load_spec(drop), rewrite=False).nodes[0]
    assert not any("moe_permute" in n.name for n in nodes if n.name.startswith("host:"))


def test_dropless_moe_layer_waits_for_the_host_after_its_sync(tmp_path: Path) -> None:
    # 10 ms per launch, far above every kernel of this tiny layer: after the token-count read the GPU
    # idles until the host has launched the dispatch all-to-all (the read, then one launch), on both
    # EP ranks alike; the next micro-batch's forward waits for its own launches behind it.
    on = _replay(tmp_path, MOE, "moe_on", 2)
    off = _replay(tmp_path, {**MOE, "host_dispatch": "off"}, "moe_off", 2)
    for rank in (0, 1):
        permute = _op(on, "L1.moe_permute.fwd.mb0", rank)["end_ns"]
        assert permute == _op(off, "L1.moe_permute.fwd.mb0", rank)["end_ns"]  # nothing gated before it
        assert _op(on, "L1.moe_dispatch.fwd.mb0", rank)["start_ns"] == permute + SYNC + 10_000_000
    # the second micro-batch's sync comes after every launch between the two permutes
    assert _op(on, "L1.moe_permute.fwd.mb1")["end_ns"] > permute + SYNC + 10_000_000
    assert on.per_rank_finish_ns[0] > off.per_rank_finish_ns[0] + 2 * (SYNC + 10_000_000)


def test_host_gates_by_hand() -> None:
    # s (100 ns) then a chain a, b, c of 5 ns kernels, one launch each at 20 ns, read 10 ns: the host
    # launches a at end(s) + 30, b at + 50, c at + 70; each kernel is shorter than a launch, so every one
    # is gated, and so is d (launched at + 90, after c's end at + 75); d runs 1,000 ns, so e (launched at
    # + 110) finds the GPU busy until + 1,090: not gated. Host nodes get ids 100, 101, ...
    line = HostTimeline(HostCosts(20, 10))
    assert line.launch([], 1) is None  # before the first sync the host is ahead
    line.placed(0, 100)
    assert line.sync([0]) is None  # no host node carries the launches before the first read
    got, host_id = [], 100
    for k, dur in ((1, 5), (2, 5), (3, 5), (4, 1000), (5, 5)):
        gate = line.launch([k - 1], 1)
        got.append(gate)
        line.placed(k, dur, host_id if gate else -1)
        host_id += 1 if gate else 0
    assert got == [(30, (0,), -1), (20, (), 100), (20, (), 101), (20, (), 102), None]
    # a second read: a host node carries the launch of e (20 ns) to the read, then the next kernel waits
    # for the read's end + 10 + its own launch
    assert line.sync([5]) == (20, (), 103)


def test_keys_round_trip_and_copied_ranks_wait_for_their_own_read() -> None:
    from xsim.tracegen.spec import spec_to_mapping

    spec = {
        **DENSE,
        "device_groups": [{"gpu": "H100", "ranks": [0], "tp": 1}, {"gpu": "H100", "ranks": [1], "tp": 1,
                                                                   "dp_replica": 1}],
        "distributed_optimizer": True,
        "host_dispatch": "on",
        "host_launch_us": 2.5,
    }  # fmt: skip
    dep = load_spec(spec)
    assert (dep.host_dispatch, dep.host_launch_us) == ("on", 2.5)
    again = load_spec(dict(spec_to_mapping(dep)))
    assert (again.host_dispatch, again.host_launch_us) == ("on", 2.5)
    # Under the distributed optimizer the grad-norm AllReduce spans both ranks: rank 1 (a copy of rank 0's
    # program) reads its own AllReduce's result.
    bundle = generate(dep)
    for rank in (0, 1):
        nodes = {n.id: n for n in bundle.nodes[rank]}
        hosts = [n for n in nodes.values() if n.name.startswith("host:")]
        assert [nodes[d].name for n in hosts for d in n.data_deps] == ["grad_norm_allreduce.opt"]
        assert A.get_int(hosts[0], A.DURATION_NS) == SYNC + 2_500


def test_fp16_reads_found_inf_then_the_grad_norm() -> None:
    # fp16's dynamic loss scale: found_inf.item() after its AllReduce (no model-parallel group here: after
    # the unscale kernel), then the grad-norm read; read + one launch each (launches of 1 us are hidden
    # behind the unscale and norm kernels' own lengths).
    spec = {**DENSE, "precision": "fp16", "host_dispatch": "on", "host_launch_us": 1}
    nodes = {n.id: n for n in generate(load_spec(spec)).nodes[0]}
    hosts = [n for n in nodes.values() if n.name.startswith("host:")]
    assert [(n.name, [nodes[d].name for d in n.data_deps]) for n in hosts] == [
        ("host:grad_norm.opt", ["grad_unscale.opt"]),
        ("host:grad_clip.opt", ["grad_norm.opt"]),
    ]
    assert [A.get_int(n, A.DURATION_NS) for n in hosts] == [SYNC + 1_000, SYNC + 1_000]


def test_dropless_moe_step_time_by_hand(tmp_path: Path) -> None:
    # One micro-batch of the tiny MoE layer at EP 2, 10 ms a launch: from the token-count read on, every
    # kernel waits for its launch, so the step is the permute's end + read + the launches up to the
    # grad-norm kernel + its run + read + the optimizer's four launches + zero_grad's run. Launches after
    # moe_permute, counted from the layer as Megatron-Core runs it: forward dispatch all-to-all, the
    # probabilities' all-to-all, sort, up/gate, act, down, unsort, combine all-to-all, unpermute,
    # bias-dropout-add, final norm, LM head (12) and the cross-entropy's 6 kernels: 18; backward, 27 ops
    # (the probabilities' all-to-all included) of which 7 launch 2 kernels (the loss's scale and cast, and
    # the input- and weight-gradient GEMMs of the LM head, expert down and up/gate, router, attention out
    # and QKV): 34; Megatron-Core adds the q/k/v split's gradient cat (1), the embedding gradient's zero
    # fill and main_grad add (2), the DP bucket's NaN check and 1/DP scaling (2), its DDP hook's main_grad
    # adds of the router weight (1), the layer's two RMSNorm gains (2 kernels) and the final norm's (1):
    # 43; the DP gradient AllReduce and grad_norm: 63. Then grad_clip, Adam, param_copy, zero_grad: 4.
    L = 10_000_000
    spec = {**MOE, "micro_batches": 1}
    on = _replay(tmp_path, spec, "moe1_on", 2)
    off = _replay(tmp_path, {**spec, "host_dispatch": "off"}, "moe1_off", 2)
    t0 = _op(off, "L1.moe_permute.fwd.mb0")["end_ns"]
    grad_norm, zero_grad = _op(on, "grad_norm.opt"), _op(on, "zero_grad.opt")
    assert grad_norm["start_ns"] == t0 + SYNC + 63 * L
    want = t0 + SYNC + 63 * L + grad_norm["duration_ns"] + SYNC + 4 * L + zero_grad["duration_ns"]
    assert on.per_rank_finish_ns == [want, want]


def test_host_nodes_sit_before_their_kernels_and_the_set_validates(tmp_path: Path) -> None:
    # Two micro-batches of the tiny MoE at EP 2 (nearly every kernel gated) and a TP 2 plan with the
    # distributed optimizer: dense ids, every dependency an earlier node, the validator finds nothing.
    from xsim.traces.checks import check_all
    from xsim.traces.groups import resolve_groups
    from xsim.traces.traceset import discover

    tp = {**DENSE, "device_groups": [{"gpu": "H100", "ranks": [0, 1], "tp": 2}], "sequence_parallel": True}
    for k, spec in enumerate((MOE, {**tp, "host_dispatch": "on", "host_launch_us": 50})):
        out = tmp_path / str(k)
        generate(load_spec(spec)).write(out, "h")
        ts = discover(out)
        files = list(ts)
        groups = resolve_groups(((f.path, f.nodes) for f in files), ts.num_ranks, directory=str(out))
        assert [str(f) for f in check_all(files, groups)] == []
        for et in files:
            assert [n.id for n in et.nodes] == list(range(len(et.nodes)))
            for n in et.nodes:
                assert all(d < n.id for d in (*n.data_deps, *n.ctrl_deps)), n.name
            assert any(n.name.startswith("host:") for n in et.nodes)


INTERLEAVED = {
    **PP2, "model": {**PP2["model"], "layers": 4}, "virtual_stages": 2, "micro_batches": 4,
    "host_launch_us": 2, "parallel": {"gpu": "A100-80GB", "tp": 1, "pp": 2, "dp": 1, "micro_batch": 1},
}  # fmt: skip
del INTERLEAVED["device_groups"]


@pytest.mark.parametrize(
    "spec", [{**MOE, "micro_batches": 3, "host_launch_us": 2}, INTERLEAVED], ids=["moe", "megatron-2021-vp2"]
)
def test_bounded_gates_replay_as_one_host_node_per_kernel(tmp_path: Path, monkeypatch, spec) -> None:
    # The rule gates only kernels the host can delay; gating every kernel after the first read must give
    # the same replay to the nanosecond (every GPU node's start and end), with more nodes. The second set
    # syncs at pipeline exchanges of several transfers (the interleaved schedule's).

    def starts(res) -> dict:
        return {(r["rank"], r["name"]): (r["start_ns"], r["end_ns"]) for r in res.ops.iter_rows(named=True)
                if not r["name"].startswith("host:")}  # fmt: skip

    bounded = _replay(tmp_path, spec, "bounded", 2)
    launch = HostTimeline.launch

    def every(self, deps, launches):
        got = launch(self, deps, launches)
        if got is None and self.epoch >= 0 and launches:
            got = (self.acc, self.wait, self.prev)
            self.acc, self.wait, self._start = 0, (), self.host
        return got

    monkeypatch.setattr(HostTimeline, "launch", every)
    full = _replay(tmp_path, spec, "every", 2)
    assert starts(full) == starts(bounded)
    assert full.per_rank_finish_ns == bounded.per_rank_finish_ns
    assert len(full.ops) > len(bounded.ops)


def test_megatron_2021_syncs_the_host_at_each_pipeline_exchange() -> None:
    # _communicate (megatron/p2p_communication.py, de7dc40f88): req.wait() then torch.cuda.synchronize().
    # Stage 0: send_forward(mb0); send_forward_recv_backward (act1 out, grad0 in); recv_backward (grad1).
    # Stage 1: recv_forward (act0); send_backward_recv_forward (grad0 out, act1 in); send_backward (grad1).
    nodes = generate(load_spec(PP2)).nodes
    for rank, waits in (
        (0, [["send_act.fwd.mb0.to1"], ["send_act.fwd.mb1.to1", "recv_grad.bwd.mb0.from1"],
             ["recv_grad.bwd.mb1.from1"]]),
        (1, [["recv_act.fwd.mb0.from0"], ["send_grad.bwd.mb0.to0", "recv_act.fwd.mb1.from0"],
             ["send_grad.bwd.mb1.to0"]]),
    ):  # fmt: skip
        got = [[nodes[rank][d].name for d in n.data_deps] for n in nodes[rank] if n.name.startswith("host:")]
        assert [w for w in got if w and w[0].split("_")[0] in ("send", "recv")] == waits
    assert len(nodes[0]) == len(generate(load_spec({**PP2, "host_dispatch": "off"})).nodes[0]) + 7


def test_pipeline_exchange_syncs_step_time_by_hand(tmp_path: Path, monkeypatch) -> None:
    # Every activation or gradient is 1024 tokens x 1024 x 2 B = 2,097,152 B: 41,943.04 ns at 50 GB/s plus
    # two 500 ns hops, 42,944 ns on the replay's ns grid. After each exchange the host waits for it, reads
    # (SYNC) and launches the next kernel (1 us): what it launches starts SYNC + 1 us after the exchange's
    # end. On the critical path, against the replay without a host timeline: stage 1's forward 0 after
    # receiving act0 (+16 us); its forward 1 after send_backward_recv_forward, which now exposes the
    # gradient's send (42,944 ns) and the read (+16 us); stage 0's backward 1 after recv_backward (+16 us);
    # the optimizer after the grad-norm read (+16 us, the one sync without pipeline exchanges).
    gate, send = SYNC + 1_000, 42_944
    off = _replay(tmp_path, {**PP2, "host_dispatch": "off"}, "off", 2)
    on = _replay(tmp_path, PP2, "on", 2)
    assert _op(off, "send_grad.bwd.mb0.to0", 1)["duration_ns"] == send
    assert on.per_rank_finish_ns[0] == off.per_rank_finish_ns[0] + 4 * gate + send
    for rank, first, exchange in (
        (1, "L2.attn_norm.fwd.mb0", "recv_act.fwd.mb0.from0"),
        (0, "embedding.fwd.mb1", "send_act.fwd.mb0.to1"),
        (1, "L2.attn_norm.fwd.mb1", "send_grad.bwd.mb0.to0"),
        (0, "L1.mlp_bias_dropout_add.bwd.mb1", "recv_grad.bwd.mb1.from1"),
    ):
        assert _op(on, first, rank)["start_ns"] == _op(on, exchange, rank)["end_ns"] + gate
    assert _op(off, "L2.attn_norm.fwd.mb1", 1)["start_ns"] == _op(off, "send_grad.bwd.mb0.to0", 1)["start_ns"]
    # Without the exchange syncs (megatron-core's p2p has none) only the grad-norm read remains.
    fw = FRAMEWORKS["megatron-2021"]
    monkeypatch.setitem(FRAMEWORKS, "megatron-2021", dataclasses.replace(fw, p2p_sync=False))
    reads = _replay(tmp_path, PP2, "reads", 2)
    assert reads.per_rank_finish_ns[0] == off.per_rank_finish_ns[0] + gate


def test_interleaved_exchanges_follow_megatrons_schedule_steps() -> None:
    # Stage 0 of 2, 2 chunks, 4 micro-batches: warm-up (2-0-1)*2 + (2-1)*2 = 4 forwards, then F/B pairs,
    # then 4 backwards (schedules.py of de7dc40f88). After each step one call sends the step's outputs and
    # receives the next step's inputs; a steady step's forward output leaves after its backward. By hand:
    S, R = "send_act.fwd.mb{}.to1", "recv_act.fwd.mb{}.from1"
    G, Q = "send_grad.bwd.mb{}.to1", "recv_grad.bwd.mb{}.from1"
    want = [
        [S.format(0)],  # F c0 mb0; the next forward (c0) needs no receive on the first stage
        [S.format(1), R.format(0)],  # F c0 mb1; receive c1 mb0's input
        [S.format(0), R.format(1)],  # F c1 mb0
        [S.format(1), Q.format(0)],  # F c1 mb1, the last warm-up step: B c1 mb0's gradient
        [S.format(2), G.format(0), Q.format(1)],  # F c0 mb2 + B c1 mb0
        [S.format(3), G.format(1), R.format(2), Q.format(0)],  # F c0 mb3 + B c1 mb1
        [S.format(2), R.format(3), Q.format(1)],  # F c1 mb2 + B c0 mb0 (no gradient out of chunk 0)
        [S.format(3), Q.format(2)],  # F c1 mb3 + B c0 mb1
        [G.format(2), Q.format(3)],  # cool-down B c1 mb2
        [G.format(3), Q.format(2)],  # B c1 mb3
        [Q.format(3)],  # B c0 mb2; B c0 mb3 ends the schedule
    ]
    nodes = generate(load_spec(INTERLEAVED)).nodes[0]
    got = [[nodes[d].name for d in n.data_deps] for n in nodes if n.name.startswith("host:")]
    assert [w for w in got if w and w[0].split("_")[0] in ("send", "recv")] == want
    # the steady step's forward output waits for the step's backward (the NCCL stream follows the kernels)
    sends = [n for n in nodes if n.name == S.format(2)]
    assert [A.get_str(nodes[d], A.PHASE) for d in sends[0].data_deps] == ["fwd", "bwd"]


def test_interleaved_exchanges_when_every_pass_is_warm_up() -> None:
    # P = 2, V = 2, M = 2 under megatron-2021 (de7dc40f88, all_warmup_microbatches): both stages run
    # F0.0 F0.1 F1.0 F1.1 then B1.0 B1.1 B0.0 B0.1. The warm-up calls send_forward_recv_forward (the last
    # receives nothing); then recv_backward is a call of its own (on the last stage, whose chunk 1 has no
    # next stage, it returns without one); then send_backward_recv_backward per backward. By hand:
    spec = {**INTERLEAVED, "micro_batches": 2}
    nodes = generate(load_spec(spec)).nodes
    want = {}
    for rank, peer in ((0, 1), (1, 0)):
        S, R = f"send_act.fwd.mb{{}}.to{peer}", f"recv_act.fwd.mb{{}}.from{peer}"
        G, Q = f"send_grad.bwd.mb{{}}.to{peer}", f"recv_grad.bwd.mb{{}}.from{peer}"
        want[rank] = (
            [
                [S.format(0)],  # F c0 mb0 (the next forward, c0 mb1, reads the data on the first stage)
                [S.format(1), R.format(0)],  # F c0 mb1; receive c1 mb0's input from the last stage
                [S.format(0), R.format(1)],  # F c1 mb0
                [S.format(1)],  # F c1 mb1, the last: nothing more to receive
                [Q.format(0)],  # recv_backward: B c1 mb0's gradient
                [G.format(0), Q.format(1)],  # B c1 mb0
                [G.format(1), Q.format(0)],  # B c1 mb1; B c0 mb0's gradient
                [Q.format(1)],  # B c0 mb0 (no gradient out of chunk 0); B c0 mb1 ends the schedule
            ]
            if rank == 0
            else [
                [R.format(0)],  # recv_forward before the first forward
                [S.format(0), R.format(1)],  # F c0 mb0 -> stage 0's chunk 1
                [S.format(1), R.format(0)],  # F c0 mb1; receive c1 mb0's input
                [R.format(1)],  # F c1 mb0 (the model's last chunk: no send)
                [G.format(0)],  # F c1 mb1 (no call); B c1 mb0
                [G.format(1), Q.format(0)],  # B c1 mb1; B c0 mb0's gradient from stage 0
                [G.format(0), Q.format(1)],  # B c0 mb0
                [G.format(1)],  # B c0 mb1
            ]
        )
    for rank in (0, 1):
        got = [[nodes[rank][d].name for d in n.data_deps] for n in nodes[rank] if n.name.startswith("host:")]
        assert [w for w in got if w and w[0].split("_")[0] in ("send", "recv")] == want[rank]


# PP2 at TP 2: stage 0 on ranks 0-1, stage 1 on ranks 2-3.
PP2_TP2 = {
    **PP2,
    "device_groups": [
        {"gpu": "A100-80GB", "ranks": [0, 1], "tp": 2, "pp_stage": 0, "layers": [1, 1]},
        {"gpu": "A100-80GB", "ranks": [2, 3], "tp": 2, "pp_stage": 1, "layers": [2, 2]},
    ],
}


def _boundary(nodes: list) -> dict[str, tuple]:
    """Name -> (type, COMM_SIZE, PG_NAME, data-dep names) of the boundary transfers and their gathers."""
    return {
        n.name: (n.type, A.get_int(n, A.COMM_SIZE), A.get_str(n, A.PG_NAME, ""), [nodes[d].name for d in n.data_deps])
        for n in nodes
        if n.name.startswith(("send_", "recv_", "pp_gather_"))
    }  # fmt: skip


def test_megatron_scatter_gathers_pipeline_sends_over_the_tp_group() -> None:
    # _communicate (megatron/p2p_communication.py, de7dc40f88): each TP rank sends its 1/TP chunk of the
    # 1024 x 1024 x 2 B activation (or gradient), 2,097,152 / 2 = 1,048,576 B; after the exchange's
    # synchronize the receiver all-gathers it over its TP group (per-rank input 1,048,576 B), and the pass
    # that consumes the tensor waits for the all-gather.
    bundle = generate(load_spec(PP2_TP2))
    half = 1_048_576
    for rank, peer, tp_group, what, phase in ((2, 0, {2, 3}, "act", "fwd"), (1, 3, {0, 1}, "grad", "bwd")):
        nodes = bundle.nodes[rank]
        got = _boundary(nodes)
        sent = "grad" if what == "act" else "act"
        for mb in (0, 1):
            recv, gather = f"recv_{what}.{phase}.mb{mb}.from{peer}", f"pp_gather_{what}.{phase}.mb{mb}"
            assert got[f"send_{sent}.{'bwd' if phase == 'fwd' else 'fwd'}.mb{mb}.to{peer}"][1] == half
            assert got[recv][1] == half
            kind, size, pg, deps = got[gather]
            assert (kind, size, set(bundle.comm_groups[pg]), deps[0]) == (
                pb.COMM_COLL_NODE,
                half,
                tp_group,
                recv,
            )
            node = next(n for n in nodes if n.name == gather)
            assert A.get_int(node, A.COMM_TYPE) == pb.ALL_GATHER
            # the host launches the all-gather after it synced on the exchange that brought the chunk
            host = nodes[node.data_deps[1]]
            assert host.name.startswith("host:") and recv in [nodes[d].name for d in host.data_deps]
            consumers = [n for n in nodes if node.id in n.data_deps and not n.name.startswith("host:")]
            assert consumers and all(A.get_str(n, A.PHASE) == phase for n in consumers)
    # Megatron-Core sends the whole tensor; Megatron-LM 2022 under sequence parallelism sends the rank's
    # own sequence slice (1/TP already) and gathers nothing (d898a8991d: `not args.sequence_parallel`).
    for spec, size in (({**PP2_TP2, "framework": "megatron-core"}, 2 * half),
                       ({**PP2_TP2, "framework": "megatron-2022", "sequence_parallel": True}, half)):  # fmt: skip
        got = _boundary(generate(load_spec(spec)).nodes[2])
        assert {v[1] for v in got.values()} == {size} and not any(k.startswith("pp_gather") for k in got)


def test_scatter_gather_step_time_by_hand(tmp_path: Path, monkeypatch) -> None:
    # Without a host timeline, on a 50 GB/s switch with 500 ns hops: a 1,048,576 B chunk's send and the
    # all-gather of two 1,048,576 B inputs (each rank sends its chunk once) take 20,971.52 + 1,000 ns each,
    # 21,972 ns on the ns grid; the whole 2,097,152 B send took 41,943.04 + 1,000 = 42,944 ns. On rank 0's
    # critical path (1F1B, 2 micro-batches): act0 and grad1 cross as send + all-gather (+1,000 ns each) and
    # stage 1's forward 1 now waits for act1's all-gather, launched after its backward 0 (the exchange
    # returns first): +21,972 ns. 2 x 1,000 + 21,972 = 23,972 ns in all.
    step, full_send = 21_972, 42_944
    off = {**PP2_TP2, "host_dispatch": "off"}
    sg = _replay(tmp_path, off, "sg", 4)
    assert _op(sg, "send_act.fwd.mb0.to2")["duration_ns"] == step
    assert _op(sg, "pp_gather_act.fwd.mb0", 2)["duration_ns"] == step
    assert _op(sg, "pp_gather_act.fwd.mb0", 2)["start_ns"] == _op(sg, "recv_act.fwd.mb0.from0", 2)["end_ns"]
    assert _op(sg, "L2.attn_norm.fwd.mb0", 2)["start_ns"] == _op(sg, "pp_gather_act.fwd.mb0", 2)["end_ns"]
    assert _op(sg, "pp_gather_act.fwd.mb1", 2)["start_ns"] == _op(sg, "send_grad.bwd.mb0.to0", 2)["start_ns"]
    fw = FRAMEWORKS["megatron-2021"]
    monkeypatch.setitem(FRAMEWORKS, "megatron-2021", dataclasses.replace(fw, pp_scatter_gather=False))
    full = _replay(tmp_path, off, "full", 4)
    assert _op(full, "send_act.fwd.mb0.to2")["duration_ns"] == full_send
    assert sg.per_rank_finish_ns[0] == full.per_rank_finish_ns[0] + 2 * (2 * step - full_send) + step
