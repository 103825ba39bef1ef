"""Overlap keys, gradient-reduction width and FSDP / ZeRO-3 (docs/tracegen.md "Overlap and sharding"):
hand-computed graphs and replays of tiny models."""

from __future__ import annotations

import pytest
from xsim.replay import simulate
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.ops import ADAM_FLOPS_PER_PARAM, Comm, Op, layer_steps
from xsim.tracegen.spec import spec_to_mapping
from xsim.tracegen.workload import _Generator, _RankProgram, _stage
from xsim.traces import attrs as A
from xsim.traces import pb

from tests.test_replay_support import FakeNet, write_set

# Two layers; per rank at TP 1: a layer 4*64^2 + 3*64*128 + 2*64 = 41,088 parameters, the embedding
# 100*64 = 6,400, final norm + LM head 64 + 6,400 = 6,464.
TINY = {"layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 4, "vocab": 100, "seq_len": 32}
LAYER, EMB, HEAD = 41_088, 6_400, 6_464


def dp2(**extra) -> dict:
    # The vocabulary as given (make_vocab_size_divisible_by 0): Megatron would pad 100 to 128.
    return {"model": TINY, "parallel": {"gpu": "H100", "dp": 2}, "make_vocab_size_divisible_by": 0, **extra}


def sync_nodes(nodes):
    return [n for n in nodes if A.get_str(n, A.PHASE) == "sync"]


# -- tp_comm_overlap: the overlap rule on a two-GEMM chain ------------------------------------------------


def chain_programs(tp: int, micros: dict[tuple[str, str], int], **extra):
    """Fresh programs of the TP group's ranks of a tiny TP-`tp` SP model with tp_comm_overlap (unless
    `extra` says otherwise), and the ops of one layer; GEMM times come from profile rows (`micros` per
    (op, phase))."""
    spec = {
        "model": {**TINY, "heads": 4, "kv_heads": 4},
        "device_groups": [{"gpu": "H100", "ranks": list(range(tp))}],
        "sequence_parallel": True,
        "tp_comm_overlap": True,
        **extra,
    }
    gen = _Generator(load_spec(spec))
    gen.run()
    progs = []
    for local in range(tp):
        st = _stage(list(gen.dep.device_groups), 0)
        prog = _RankProgram(gen, st, local, local, "1", None)
        progs.append(prog)
    ops = {
        (s.op, s.phase): s for p in ("fwd", "bwd") for s in layer_steps(progs[0].ctx, p) if isinstance(s, Op)
    }
    rows = [
        {"gpu": "H100", "op": op, "phase": ph, "shape": list(ops[(op, ph)].shape), "micros": us}
        for (op, ph), us in micros.items()
    ]
    gen = _Generator(load_spec({**spec, "profile": rows}))
    gen.run()
    progs = [_RankProgram(gen, _stage(list(gen.dep.device_groups), 0), i, i, "1", None) for i in range(tp)]
    for p in progs:
        p.setup()
    return progs, ops


def replay_ns(tmp_path, per_rank: list[list[pb.Node]], tp: int) -> int:
    """Replay with collectives lasting 1 ns per byte of comm_size (a closed-form network)."""
    ts = write_set(tmp_path, per_rank)
    res = simulate(
        ts, network=FakeNet(tp, coll_ns=lambda spec: spec.size_bytes), groups={"1": tuple(range(tp))}
    )
    return max(res.ops["end_ns"])


@pytest.mark.parametrize(
    ("tp", "rs", "ag", "want"),
    [
        # GEMM1 g1 = 40 us (attn_out_proj) then its ReduceScatter (TE "pipeline", 4 chunks); an AllGather then
        # GEMM2 g2 = 30 us (mlp_up_gate; TE "ring_exchange": chunk 0 local, TP - 1 exchange steps).
        # Closed forms (equal chunks, k = 4, collectives back to back on the TP stream):
        #   pipeline   T1 = max(g1 + R/4, g1/4 + R)      (the last chunk of R is always exposed)
        #   ring       T2 = max(g2, S + g2/TP)            (hidden exactly while S <= g2 - g2/TP)
        # Hidden: R = 8,000, S = 6,000 at TP 2: 42,000 + 30,000.
        (2, 8_000, 6_000, 42_000 + 30_000),
        # S exactly g2 - g2/2 = 15,000: still hidden; one ns more shows as one ns.
        (2, 8_000, 15_000, 42_000 + 30_000),
        (2, 8_000, 15_001, 42_000 + 30_001),
        # Exposed: R = 80,000 -> max(60,000, 90,000); S = 60,000 -> 60,000 + 15,000.
        (2, 80_000, 60_000, 90_000 + 75_000),
        # TP 4: GEMM2 chunks of 7,500; S = 60,000 in 3 steps of 20,000 -> 60,000 + 7,500.
        (4, 80_000, 60_000, 90_000 + 67_500),
        (4, 8_000, 22_500, 42_000 + 30_000),  # S = g2 - g2/4: hidden exactly
    ],
)
def test_tp_overlap_on_a_two_gemm_chain_by_hand(tmp_path, tp, rs, ag, want):
    progs, ops = chain_programs(tp, {("attn_out_proj", "fwd"): 40, ("mlp_up_gate", "fwd"): 30})
    chain = [
        ops[("attn_out_proj", "fwd")],
        Comm("attn_tp_out", "reduce_scatter", rs),
        Comm("mlp_tp_in", "all_gather", ag),
        ops[("mlp_up_gate", "fwd")],
    ]
    for p in progs:
        p._phase = "fwd"
        p.steps(chain, None, 1, 0)
    nodes = progs[0].nodes
    # 4 GEMM1 chunks + 4 ReduceScatter chunks, TP - 1 exchange steps + TP GEMM2 chunks.
    kinds = [(n.type, n.name.split(".")[1]) for n in nodes]
    assert kinds.count((pb.COMP_NODE, "attn_out_proj")) == 4
    assert kinds.count((pb.COMM_COLL_NODE, "attn_tp_out")) == 4
    assert kinds.count((pb.COMM_COLL_NODE, "mlp_tp_in")) == tp - 1
    assert kinds.count((pb.COMP_NODE, "mlp_up_gate")) == tp
    assert sum(A.comm_size(n) for n in nodes if n.name.startswith("L1.attn_tp_out")) == rs
    assert sum(A.comm_size(n) for n in nodes if n.name.startswith("L1.mlp_tp_in")) == ag
    assert replay_ns(tmp_path / "on", [p.nodes for p in progs], tp) == want
    # Without the key: every step in turn, 40,000 + R + S + 30,000.
    for p in progs:
        p.tp_overlap, p.payloads, p.deps, p.frontier, p.tags, p.tp_ids = False, [], [], None, [], []
        p.steps(chain, None, 1, 0)
    assert replay_ns(tmp_path / "off", [p.nodes for p in progs], tp) == 70_000 + rs + ag


@pytest.mark.parametrize(("rs", "want"), [(15_000, 40_000), (20_000, 40_000), (25_000, 45_000)])
def test_tp_overlap_bulk_reduce_scatter_under_the_wgrad_half(tmp_path, rs, want):
    # Backward of mlp_up_gate (40 us: dgrad and wgrad halves of 20 us) then its dgrad ReduceScatter (TE
    # "bulk"): T = g/2 + max(g/2, R).
    progs, ops = chain_programs(2, {("mlp_up_gate", "bwd"): 40})
    chain = [ops[("mlp_up_gate", "bwd")], Comm("mlp_tp_in", "reduce_scatter", rs)]
    for p in progs:
        p._phase = "bwd"
        p.steps(chain, None, 1, 0)
    assert [n.name for n in progs[0].nodes] == [
        "L1.mlp_up_gate.bwd.mb0.chunk0", "L1.mlp_tp_in.bwd.mb0.chunk0", "L1.mlp_up_gate.bwd.mb0.chunk1",
    ]  # fmt: skip
    assert replay_ns(tmp_path, [p.nodes for p in progs], 2) == want


# -- the column-parallel linear's backward as Megatron / TE run it (Framework.sp_dgrad_overlap) ----------

# The re-gathered input of mlp_up_gate at TP 2 under SP: 32 / 2 tokens x 64 x 2 B = 2,048 B, so 2,048 ns on
# the closed-form network (1 ns per byte of comm_size; an AllGather's comm_size is the per-rank input).
REGATHER = 2_048


@pytest.mark.parametrize(
    ("g_us", "rs", "want"),
    [
        # Backward of mlp_up_gate, g = 40 us (dgrad and wgrad halves of 20 us), then its dgrad ReduceScatter
        # of R ns. The gather A = 2,048 ns runs under the dgrad half; the ReduceScatter starts after the
        # dgrad half and the gather, the wgrad half after the gather:
        #   T = max(g/2, A) + max(g/2, R)
        (40, 15_000, 40_000),
        (40, 20_000, 40_000),  # R exactly the wgrad half: still hidden
        (40, 20_001, 40_001),  # one ns more shows as one ns
        (40, 25_000, 45_000),
        # g = 4 us: the gather (2,048) outlasts the dgrad half (2,000), the wgrad half waits for it.
        (4, 1_000, 2_048 + 2_000),
        (4, 3_000, 2_048 + 3_000),
    ],
)
def test_sp_backward_regathers_and_hides_the_reduce_scatter_under_wgrad(tmp_path, g_us, rs, want):
    progs, ops = chain_programs(
        2, {("mlp_up_gate", "bwd"): g_us}, tp_comm_overlap=False, framework="megatron-core"
    )
    chain = [ops[("mlp_up_gate", "bwd")], Comm("mlp_tp_in", "reduce_scatter", rs)]
    for p in progs:
        p._phase = "bwd"
        p.steps(chain, None, 1, 0)
    nodes = progs[0].nodes
    assert [n.name for n in nodes] == [
        "L1.mlp_tp_in_regather.bwd.mb0.chunk0", "L1.mlp_up_gate.bwd.mb0.chunk0",
        "L1.mlp_tp_in.bwd.mb0.chunk0", "L1.mlp_up_gate.bwd.mb0.chunk1",
    ]  # fmt: skip
    gather, dgrad, rs_node, wgrad = nodes
    assert A.comm_size(gather) == REGATHER and A.get_int(gather, A.COMM_TYPE) == pb.ALL_GATHER
    # the re-gather precedes the wgrad GEMM (its data), not the dgrad GEMM; the ReduceScatter waits for both
    assert list(wgrad.data_deps) == [gather.id] and gather.id not in dgrad.data_deps
    assert sorted(rs_node.data_deps) == sorted([dgrad.id, gather.id])
    assert replay_ns(tmp_path, [p.nodes for p in progs], 2) == want


@pytest.mark.parametrize(
    ("framework", "sp", "kind", "overlapped"),
    [
        # Without SP: the dgrad AllReduce under wgrad (async_tensor_model_parallel_allreduce) where the code
        # runs it, T = g/2 + max(g/2, R); after the whole backward elsewhere, T = g + R. No re-gather.
        ("megatron-core", False, "all_reduce", True),
        ("megatron-2022", False, "all_reduce", True),
        ("megatron-2021", False, "all_reduce", False),
        ("megatron-deepspeed", False, "all_reduce", False),  # --deepspeed turns the async AllReduce off
        # SP: Megatron-2022 and Megatron-DeepSpeed as Megatron-Core (the test above); 2021 had no SP.
        ("megatron-2022", True, "reduce_scatter", True),
        ("megatron-deepspeed", True, "reduce_scatter", True),
        ("megatron-2021", True, "reduce_scatter", False),
    ],
)
def test_dgrad_collective_overlap_per_framework(tmp_path, framework, sp, kind, overlapped):
    progs, ops = chain_programs(
        2, {("mlp_up_gate", "bwd"): 40}, tp_comm_overlap=False, sequence_parallel=sp, framework=framework
    )
    r = 25_000
    chain = [ops[("mlp_up_gate", "bwd")], Comm("mlp_tp_in", kind, r)]
    for p in progs:
        p._phase = "bwd"
        p.steps(chain, None, 1, 0)
    names = [n.name.split(".")[1] for n in progs[0].nodes]
    regather = ["mlp_tp_in_regather"] if overlapped and sp else []
    assert names == (
        regather + ["mlp_up_gate", "mlp_tp_in", "mlp_up_gate"] if overlapped else ["mlp_up_gate", "mlp_tp_in"]
    )
    assert replay_ns(tmp_path, [p.nodes for p in progs], 2) == (20_000 + r if overlapped else 40_000 + r)


def test_sp_backward_regathers_every_column_parallel_input_in_a_generated_model():
    # TP 2 SP, Megatron-Core without userbuffers: per layer and micro-batch QKV's and fc1's input again,
    # and the LM head's once per micro-batch (Megatron's ColumnParallelLinear); each its forward gather's
    # bytes. Megatron-2021 has none.
    spec = {"model": TINY, "device_groups": [{"gpu": "H100", "ranks": [0, 1]}], "sequence_parallel": True}
    nodes = generate(load_spec(spec), rewrite=False).nodes[0]
    regather = [n for n in nodes if "_regather" in n.name]
    assert sorted(n.name.split(".mb")[0] for n in regather) == sorted(
        ["L1.attn_tp_in_regather.bwd", "L1.mlp_tp_in_regather.bwd", "L2.attn_tp_in_regather.bwd",
         "L2.mlp_tp_in_regather.bwd", "head_tp_in_regather.bwd"]
    )  # fmt: skip
    assert {A.comm_size(n) for n in regather} == {REGATHER}
    old = generate(load_spec({**spec, "framework": "megatron-2021"}), rewrite=False).nodes[0]
    assert not [n for n in old if "_regather" in n.name]


def test_tp_overlap_in_a_generated_layer():
    # TP 2 with SP: per layer forward the two AllGathers (ring exchange, 1 step) and two ReduceScatters
    # (4 chunks each); backward the two AllGathers (1 step) and the two dgrad ReduceScatters (bulk, 1).
    spec = {
        "model": TINY, "device_groups": [{"gpu": "H100", "ranks": [0, 1]}],
        "sequence_parallel": True, "tp_comm_overlap": True,
    }  # fmt: skip
    nodes = generate(load_spec(spec), rewrite=False).nodes[0]
    tp1 = [n for n in nodes if A.get_int(n, A.LAYER) == 1 and n.type == pb.COMM_COLL_NODE]
    by = {}
    for n in tp1:
        key = (A.get_str(n, A.PHASE), n.name.split(".")[1])
        by[key] = by.get(key, 0) + 1
    assert by == {
        ("fwd", "attn_tp_in"): 1, ("fwd", "attn_tp_out"): 4, ("fwd", "mlp_tp_in"): 1, ("fwd", "mlp_tp_out"): 4,
        ("bwd", "mlp_tp_out"): 1, ("bwd", "mlp_tp_in"): 1, ("bwd", "attn_tp_out"): 1, ("bwd", "attn_tp_in"): 1,
    }  # fmt: skip
    plain = generate(load_spec({**spec, "tp_comm_overlap": False}), rewrite=False).nodes[0]
    # The same work: FLOPs and collective bytes are only cut into chunks, except that without userbuffers
    # Megatron-Core's TE layers gather QKV's and fc1's input again in backward (sp_dgrad_overlap): 2 layers x
    # 2 x (32 / 2 tokens x 64 x 2 B) = 8,192 B more (userbuffers' bulk dgrad gather is not modelled).
    for key, more in ((A.NUM_OPS, 0), (A.COMM_SIZE, 8_192)):
        assert sum(A.get_int(n, key, 0) for n in nodes) + more == sum(A.get_int(n, key, 0) for n in plain)


# -- grad_reduce_dtype ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "dtype", "width"),
    [
        ({}, "fp32", 4),
        ({"grad_reduce_dtype": "bf16"}, "bf16", 2),
        ({"precision": "fp16"}, "fp16", 2),
        ({"precision": "fp16", "grad_reduce_dtype": "fp32"}, "fp32", 4),
    ],
)
def test_grad_reduce_bytes(extra, dtype, width):
    # One AllReduce of all 2 * 41,088 + 6,400 + 6,464 = 95,040 gradients per rank: FP32 by default for
    # BF16 (Megatron's accumulate_allreduce_grads_in_fp32), 2 B with --grad-reduce-in-bf16 or FP16 training.
    dep = load_spec(dp2(**extra))
    (ar,) = sync_nodes(generate(dep, rewrite=False).nodes[0])
    assert A.comm_size(ar) == 95_040 * width
    assert spec_to_mapping(dep)["grad_reduce_dtype"] == dtype


# -- overlap_grad_reduce / overlap_param_gather ---------------------------------------------------------


def test_overlap_param_gather_waits_only_for_its_own_bucket():
    # Distributed optimizer, 200,000-byte buckets of FP32 gradients: [head 6,464 + layer 2 41,088 =
    # 47,552 (190,208 B, open) + layer 1 -> 88,640, closes] and [embedding 6,400]; padded to multiples of
    # lcm(2, 128): 88,704 and 6,400. The next forward first uses bucket 1 (embedding), then bucket 0.
    spec = dp2(distributed_optimizer=True, overlap_grad_reduce=True, dp_bucket_bytes=200_000)
    nodes = generate(load_spec({**spec, "overlap_param_gather": True}), rewrite=False).nodes[0]
    by_id = {n.id: n for n in nodes}
    gathers = [n for n in nodes if n.name.startswith("dp_param_allgather")]
    assert [(n.name, A.comm_size(n)) for n in gathers] == [
        ("dp_param_allgather.bucket1", 6_400 // 2 * 2),
        ("dp_param_allgather.bucket0", 88_704 // 2 * 2),
    ]
    first, second = gathers
    # The first is issued at the start of the iteration; the second when the first is waited for.
    assert (list(first.data_deps), list(first.ctrl_deps)) == ([], []) and first.id == 0
    assert list(second.ctrl_deps) == [first.id]
    # Only the first forward use of each bucket waits: the embedding (bucket 1) and layer 1 (bucket 0) ...
    waits = {by_id[n.id].name for n in nodes if set(n.data_deps) & {first.id, second.id}}
    assert waits == {"embedding.fwd.mb0", "L1.attn_norm.fwd.mb0"}
    # ... and nothing follows the optimizer step: its gathers are the next iteration's (the ones above).
    assert A.get_str(nodes[-1], A.PHASE) == "opt"
    plain = generate(load_spec(spec), rewrite=False).nodes[0]
    # Off: the gathers follow param_copy inside the step, and the next iteration's zero_grad waits for them.
    assert [n.name for n in plain[-4:]] == [
        "param_copy.opt", "dp_param_allgather.bucket0", "dp_param_allgather.bucket1", "zero_grad.opt",
    ]  # fmt: skip
    assert set(plain[-1].data_deps) == {plain[-4].id, plain[-2].id}


def test_overlap_keys_follow_megatron_checks():
    for bad, what in [
        (dp2(overlap_param_gather=True, overlap_grad_reduce=True), "needs distributed_optimizer"),
        (dp2(overlap_param_gather=True, distributed_optimizer=True), "needs overlap_grad_reduce"),
        (dp2(tp_comm_overlap=True), "needs sequence_parallel"),
        (dp2(sharding="zero3", distributed_optimizer=True), "already shards"),
        (dp2(sharding="zero2"), "sharding must be one of none, zero3, fsdp"),
        (dp2(grad_reduce_dtype="fp8"), "grad_reduce_dtype must be one of"),
        (
            {
                "model": TINY,
                "sharding": "fsdp",
                "device_groups": [
                    {"gpu": "H100", "ranks": [0, 1], "dp_replica": 0},
                    {"gpu": "H100", "ranks": [2], "dp_replica": 1},
                ],
            },
            "sharding: fsdp needs replicas that cut the layers into the same stages and TP",
        ),
    ]:
        with pytest.raises(SpecError, match=what):
            load_spec(bad)
    m = spec_to_mapping(load_spec(dp2()))
    assert [m[k] for k in ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "sharding")] == [
        False, False, False, "none",
    ]  # fmt: skip


# -- FSDP / ZeRO-3 --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["zero3", "fsdp"])
def test_fsdp_gathers_and_reduce_scatters_per_layer_by_hand(name):
    nodes = generate(load_spec(dp2(sharding=name)), rewrite=False).nodes[0]
    by_id = {n.id: n for n in nodes}
    dp = [(n.name, A.comm_type(n), A.comm_size(n)) for n in sync_nodes(nodes)]
    # Units in program order: forward embedding, L1, L2, head; backward head (still gathered: same
    # visit), L2, L1, embedding. AllGather per-rank shard in BF16 (EMB 3,200, layer 20,544, head 3,232
    # parameters x 2 B); ReduceScatter the whole padded unit in FP32 (x 4 B). Each gather is issued when
    # the previous visit starts (prefetch of one), in the DP communicator's order. ZeRO-3 gathers the
    # embedding again for its backward; PyTorch FSDP keeps the root module's parameters (the embedding
    # unit's) gathered from forward to backward: no second embedding gather.
    ag, rs = pb.ALL_GATHER, pb.REDUCE_SCATTER
    emb_again = [("fsdp_param_allgather.emb.mb0", ag, 6_400)] if name == "zero3" else []
    assert dp == [
        ("fsdp_param_allgather.emb.mb0", ag, 6_400),
        ("fsdp_param_allgather.1.mb0", ag, 41_088),
        ("fsdp_param_allgather.2.mb0", ag, 41_088),
        ("fsdp_param_allgather.head.mb0", ag, 6_464),
        ("fsdp_param_allgather.2.mb0", ag, 41_088),
        ("fsdp_grad_reducescatter.head.mb0", rs, 6_464 * 4),
        ("fsdp_param_allgather.1.mb0", ag, 41_088),
        ("fsdp_grad_reducescatter.2.mb0", rs, 41_088 * 4),
        *emb_again,
        ("fsdp_grad_reducescatter.1.mb0", rs, 41_088 * 4),
        ("fsdp_grad_reducescatter.emb.mb0", rs, 6_400 * 4),
    ]
    syncs = sync_nodes(nodes)
    named = {n.name: n for n in nodes}
    # Each forward unit's first op waits for its own gather; the prefetch of L1 hangs off the embedding's
    # gather only (issued as the embedding starts, at t = 0), that of L2 off the embedding unit's last op
    # (the embedding dropout of the default megatron-core profile): L1's visit starts after it.
    emb, l1 = named["embedding.fwd.mb0"], named["L1.attn_norm.fwd.mb0"]
    emb_last = named["embedding_dropout.fwd.mb0"]
    assert list(emb.data_deps) == [syncs[0].id] and syncs[1].id in l1.data_deps
    assert list(syncs[1].ctrl_deps) == [syncs[0].id]
    assert set(syncs[2].ctrl_deps) == {emb_last.id, syncs[1].id}
    # Backward: L2 waits for the gather prefetched when the head started (the fifth); the head's
    # ReduceScatter hangs off its last backward op: under zero3 the DDP hook's add of the final norm's gain;
    # PyTorch FSDP runs no Megatron hook (its flat parameter holds the gradient), so the norm's backward.
    last = "final_norm_main_grad_add.bwd.mb0" if name == "zero3" else "final_norm.bwd.mb0"
    l2b = next(n for n in nodes if n.name.startswith("L2.") and A.get_str(n, A.PHASE) == "bwd")
    assert syncs[4].id in l2b.data_deps and by_id[syncs[5].data_deps[0]].name == last
    # No DP bucket AllReduce, no gather after the step; the optimizer step (from its grad norm) waits for
    # the last ReduceScatter, and Adam updates the 1/DP shard.
    first_opt = next(n for n in nodes if A.get_str(n, A.PHASE) == "opt")
    assert first_opt.name == "grad_norm.opt" and syncs[-1].id in first_opt.data_deps
    assert A.get_str(nodes[-1], A.PHASE) == "opt"
    assert A.num_ops(named["optimizer.opt"]) == ADAM_FLOPS_PER_PARAM * (3_200 + 2 * 20_544 + 3_232)
    # Every rank alike (rank 1 is a copy with its own group name).
    assert [
        (n.name, A.comm_size(n)) for n in sync_nodes(generate(load_spec(dp2(sharding=name))).nodes[1])
    ] == [(a, c) for a, _, c in dp]


def test_fsdp_root_unit_is_gathered_once_per_micro_batch_by_hand():
    # Two micro-batches at DP 2 (global batch 4 of 1 sequence), 1F1B: each micro-batch's forward, then its
    # backward, as a trainer's gradient accumulation runs them. The root module's parameters (the
    # embedding unit, and the head unit, whose forward and backward are one visit here) are gathered by the
    # forward and kept for the backward; the root's post-backward reshards them, so micro-batch 1 gathers
    # them again in its forward. Per micro-batch FSDP gathers emb, L1, L2, head, L2, L1: 6 AllGathers of
    # 6,400 + 4 x 41,088 + 6,464 = 177,216 B. ZeRO-3 adds the embedding's backward gather (7 of 183,616 B
    # per micro-batch), where micro-batch 0's embedding backward and micro-batch 1's embedding forward are
    # one visit (consecutive ops of one unit): 13 gathers, 2 x 183,616 - 6,400 = 360,832 B. FSDP's
    # post-backward reshard splits that visit. The embedding's backward then waits for no gather.
    spec = {"model": TINY, "parallel": {"gpu": "H100", "dp": 2, "global_batch": 4}, "schedule": "1f1b",
            "make_vocab_size_divisible_by": 0}  # fmt: skip
    counts = {}
    for name in ("fsdp", "zero3"):
        nodes = generate(load_spec({**spec, "sharding": name}), rewrite=False).nodes[0]
        ags = [n for n in sync_nodes(nodes) if A.comm_type(n) == pb.ALL_GATHER]
        counts[name] = (len(ags), sum(A.comm_size(n) for n in ags))
        if name == "fsdp":
            gathers = {n.id for n in ags}
            emb_b = [n for n in nodes if n.name.startswith("embedding_dropout.bwd.")]
            assert len(emb_b) == 2 and not any(set(n.data_deps) & gathers for n in emb_b)
            assert [n.name for n in ags if ".emb." in n.name] == [
                "fsdp_param_allgather.emb.mb0", "fsdp_param_allgather.emb.mb1",
            ]  # fmt: skip
    assert counts == {"fsdp": (12, 2 * 177_216), "zero3": (13, 2 * 183_616 - 6_400)}


# -- every key together: copies equal rebuilds, the validator agrees, the replay finishes -----------------

FEATURES = {
    "model": {**TINY, "layers": 8},
    "parallel": {"gpu": "H100", "tp": 2, "pp": 2, "dp": 2, "global_batch": 8, "virtual_stages": 2},
    "sequence_parallel": True,
    "tp_comm_overlap": True,
    "dp_bucket_bytes": 100_000,
    "make_vocab_size_divisible_by": 0,  # the vocabulary as given (Megatron would pad 100 to 256 at TP 2)
}


@pytest.mark.parametrize(
    "extra",
    [
        {
            "recompute": "full",
            "distributed_optimizer": True,
            "overlap_grad_reduce": True,
            "overlap_param_gather": True,
        },
        {"recompute": "full", "recompute_layers": 2, "sharding": "zero3"},
        {"recompute": "selective", "sharding": "fsdp", "grad_reduce_dtype": "bf16"},
        {"distributed_optimizer": True},
    ],
)
def test_overlap_traces_validate_copy_and_replay(tmp_path, capsys, extra):
    import json

    from tests.test_gen_workload import _validate
    from xsim.cli import main

    dep = load_spec({**FEATURES, **extra})
    bundle = generate(dep)
    rebuilt = _Generator(dep, clone=False).run()
    for rank, nodes in bundle.nodes.items():
        assert [n.SerializeToString() for n in nodes] == [n.SerializeToString() for n in rebuilt.nodes[rank]]
    _, findings = _validate(bundle, tmp_path / "v", "f")
    assert [str(f) for f in findings] == []
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps({**FEATURES, **extra}))
    assert main(["gen", str(spec), "--out", str(tmp_path / "t")]) == 0
    capsys.readouterr()
    assert main(["replay", str(tmp_path / "t"), "--no-progress", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_time_ns"] > 0


def test_overlap_param_gather_charges_only_what_the_forward_cannot_hide(tmp_path):
    # The distributed-optimizer plan above, replayed with collectives of size // 100 ns: bucket 1's gather
    # (6,400 B -> 64 ns) opens the iteration and delays everything by its 64 ns; bucket 0's (88,704 B ->
    # 887 ns) runs under the embedding's forward (microseconds) and costs nothing. Off, both follow the
    # optimizer: 64 + 887 ns after it. So off - on = 887 ns exactly, and on, the embedding starts at 64 ns.
    from xsim.traces.traceset import discover

    spec = dp2(distributed_optimizer=True, overlap_grad_reduce=True, dp_bucket_bytes=200_000)
    ends, starts = {}, {}
    for on in (False, True):
        bundle = generate(load_spec({**spec, "overlap_param_gather": on}), rewrite=False)
        bundle.write(tmp_path / str(on), "t")
        net = FakeNet(2, coll_ns=lambda s: s.size_bytes // 100)
        res = simulate(discover(tmp_path / str(on)), network=net)
        rows = [r for r in res.ops.iter_rows(named=True) if r["rank"] == 0]
        ends[on] = max(r["end_ns"] for r in rows)
        starts[on] = {r["name"]: r["start_ns"] for r in rows}
    assert ends[False] - ends[True] == 887
    assert starts[True]["embedding.fwd.mb0"] == 64 and starts[False]["embedding.fwd.mb0"] == 0
    # Layer 1 (bucket 0) does not wait: it starts where it would without any gather, 64 ns later.
    assert starts[True]["L1.attn_norm.fwd.mb0"] == starts[False]["L1.attn_norm.fwd.mb0"] + 64


def test_fsdp_gather_is_waited_for_by_compute_not_by_a_tp_collective():
    # TP 2 with SP: a layer's backward opens with the SP AllGather of its output gradient, which needs no
    # parameters; the gathered parameters are waited for by the unit's first compute op (under the default
    # megatron-core profile the fused bias-dropout-add's backward, then mlp_down's; the embedding, the root
    # module's unit, is still gathered from its forward).
    spec = {
        "model": TINY,
        "parallel": {"gpu": "H100", "tp": 2, "dp": 2},
        "sequence_parallel": True,
        "sharding": "fsdp",
    }
    nodes = generate(load_spec(spec), rewrite=False).nodes[0]
    gathers = {n.id for n in nodes if n.name.startswith("fsdp_param_allgather.")}
    users = [n for n in nodes if set(n.data_deps) & gathers]
    assert all(n.type == pb.COMP_NODE for n in users)
    assert [n.name for n in users if A.get_str(n, A.PHASE) == "bwd"] == [
        "L2.mlp_bias_dropout_add.bwd.mb0", "L1.mlp_bias_dropout_add.bwd.mb0",
    ]  # fmt: skip


def test_fsdp_backward_prefetch_none_exposes_reduce_scatter_and_gather_by_hand(tmp_path):
    # PyTorch FSDP's backward_prefetch. BACKWARD_PRE and BACKWARD_POST issue a unit's AllGather ahead of the
    # previous unit's ReduceScatter on the one communicator: the same graph, node for node. None issues it
    # from the unit's own pre-backward hook, after that ReduceScatter, so each backward unit waits for both.
    # Replayed with collectives of size // 100 ns (the tiny model's gathers: layer 41,088 B -> 410 ns,
    # embedding 6,400 B -> 64 ns; ReduceScatters in FP32: head 25,856 B -> 258 ns, layer 164,352 B -> 1,643
    # ns): L2 waits 258 + 410 = 668 ns after the head's backward, L1 1,643 + 410 = 2,053 ns after L2's;
    # the embedding, the root module's unit, kept gathered from its forward, waits for nothing. With
    # prefetch all of them run under the previous unit's compute (microseconds per op), so the iteration
    # is 668 + 2,053 = 2,721 ns longer without it.
    from xsim.traces.traceset import discover

    graphs, ends, starts = {}, {}, {}
    for mode in ("pre", "post", "none"):
        bundle = generate(load_spec(dp2(sharding="fsdp", fsdp_backward_prefetch=mode)), rewrite=False)
        graphs[mode] = [n.SerializeToString() for n in bundle.nodes[0]]
        bundle.write(tmp_path / mode, "t")
        res = simulate(discover(tmp_path / mode), network=FakeNet(2, coll_ns=lambda s: s.size_bytes // 100))
        rows = [r for r in res.ops.iter_rows(named=True) if r["rank"] == 0]
        ends[mode] = max(r["end_ns"] for r in rows)
        starts[mode] = {r["name"]: (r["start_ns"], r["end_ns"]) for r in rows if r["phase"] == "bwd"}
    assert graphs["pre"] == graphs["post"]
    assert ends["none"] - ends["pre"] == 668 + 2_053
    s = starts["none"]
    # (each unit's last backward op: PyTorch FSDP runs no Megatron DDP hook, so the norm's or the residual's)
    assert s["L2.mlp_bias_dropout_add.bwd.mb0"][0] - s["final_norm.bwd.mb0"][1] == 258 + 410
    assert s["L1.mlp_bias_dropout_add.bwd.mb0"][0] - s["L2.attn_residual.bwd.mb0"][1] == 1_643 + 410
    assert s["embedding_dropout.bwd.mb0"][0] == s["L1.attn_residual.bwd.mb0"][1]
    p = starts["pre"]
    assert p["L2.mlp_bias_dropout_add.bwd.mb0"][0] == p["final_norm.bwd.mb0"][1]  # no wait
    # The key needs per-layer gathers and one of PyTorch's three names.
    with pytest.raises(SpecError, match="needs sharding"):
        load_spec(dp2(fsdp_backward_prefetch="post"))
    with pytest.raises(SpecError, match="must be one of pre, post, none"):
        load_spec(dp2(sharding="fsdp", fsdp_backward_prefetch="backward_post"))
    written = spec_to_mapping(load_spec(dp2(sharding="fsdp", fsdp_backward_prefetch="none")))
    assert written["fsdp_backward_prefetch"] == "none"
