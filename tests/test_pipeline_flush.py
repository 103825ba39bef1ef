"""Megatron-Core's pipeline-flush keys (round nemo25gpt, docs/tracegen.md "Overlap and sharding"):
`defer_embedding_wgrad_compute` with `wgrad_deferral_limit`, and the distributed optimizer's
`overlap_param_gather_with_optimizer_step`; hand-computed graphs and replays of tiny models."""

from __future__ import annotations

import pytest
from xsim.replay import simulate
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.spec import spec_to_mapping
from xsim.traces import attrs as A
from xsim.traces.traceset import discover

from tests.test_replay_support import FakeNet

# Two layers on two stages (one each, TP 1), micro-batch 1 of 32 tokens, vocabulary 100 as given.
TINY = {"layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 4, "vocab": 100, "seq_len": 32}
# Profile rows: the loss forward 1,000 us (the last stage's forward outlasts everything the first stage does
# between two of its sends, so the last stage never waits for an activation) and the LM head's backward GEMM
# 2 us, i.e. dgrad and wgrad halves of w = 1,000 ns each. Shapes: loss (tokens, vocab) = (32, 100); the LM
# head (tokens, hidden, vocab) = (32, 64, 100).
ROWS = [
    {"gpu": "H100", "op": "loss", "phase": "fwd", "shape": [32, 100], "micros": 1000},
    {"gpu": "H100", "op": "lm_head", "phase": "bwd", "shape": [32, 64, 100], "micros": 2},
]
M, W = 3, 1_000


def pp2(**extra) -> dict:
    return {
        "model": TINY,
        "parallel": {"gpu": "H100", "pp": 2},
        "micro_batches": M,
        "schedule": "1f1b",
        "make_vocab_size_divisible_by": 0,
        "profile": ROWS,
        **extra,
    }


def replay(tmp_path, spec: dict, ranks: int, coll_ns=lambda s: 1000):
    """(bundle, ops rows) of the spec replayed with a closed-form network (p2p 100 ns + size // 10)."""
    bundle = generate(load_spec(spec), rewrite=False)
    out = tmp_path / str(abs(hash(repr(sorted(spec.items(), key=str)))))
    bundle.write(out, "t")
    res = simulate(discover(out), network=FakeNet(ranks, coll_ns=coll_ns))
    return bundle, list(res.ops.iter_rows(named=True))


@pytest.mark.parametrize(("limit", "deferred"), [(0, [0, 1, 2]), (2, [0, 1]), (1, [0]), (5, [0, 1, 2])])
def test_deferred_lm_head_wgrad_runs_after_the_flush_and_shortens_the_step_by_hand(tmp_path, limit, deferred):
    # 1F1B on 2 stages, M = 3: the last stage runs F0 B0 F1 B1 F2 B2 back to back; the first stage's last
    # backward B2 starts when the last stage's B2 has sent its gradient (p2p 100 + 4,096 // 10 = 509 ns),
    # and the grad-norm AllReduce over both stages starts the optimizer after both. With X the end of the
    # last stage's B2 when nothing is deferred, b0 the first stage's backward (+ its bucket check) after
    # that send:
    #   off: optimizer at X + 509 + b0
    #   on, the first L micro-batches deferred (L = limit, or all M when 0 or more than M): the last stage's
    #   backwards are L w shorter and the L wgrad GEMMs follow its last backward: it is done at X, the first
    #   stage at X - L w + 509 + b0; so the step is L w shorter while L w < 509 + b0 (b0 is tens of us here).
    # w = 1,000 ns: limit 0 and 5 -> 3,000 ns, limit 2 -> 2,000 ns, limit 1 -> 1,000 ns.
    _, off = replay(tmp_path, pp2(), 2)
    bundle, on = replay(tmp_path, pp2(defer_embedding_wgrad_compute=True, wgrad_deferral_limit=limit), 2)
    end = lambda rows: max(r["end_ns"] for r in rows)  # noqa: E731
    assert end(off) - end(on) == len(deferred) * W
    last = bundle.nodes[1]
    names = [n.name for n in last]
    # The deferred micro-batches' backward GEMM is its dgrad half (chunk0, 1,000 ns); the others whole.
    for mb in range(M):
        if mb in deferred:
            assert f"lm_head.bwd.mb{mb}.chunk0" in names and f"lm_head.bwd.mb{mb}.chunk1" in names
        else:
            assert f"lm_head.bwd.mb{mb}" in names
    # The wgrad halves follow the last backward pass (its gradient send is the stage's last P2P) in
    # micro-batch order, before the optimizer step.
    wgrads = [i for i, n in enumerate(names) if n.startswith("lm_head.bwd") and n.endswith("chunk1")]
    assert [names[i] for i in wgrads] == [f"lm_head.bwd.mb{mb}.chunk1" for mb in deferred]
    assert wgrads[0] > names.index(f"send_grad.bwd.mb{M - 1}.to0")
    assert wgrads[-1] < names.index("grad_norm.opt")
    rows = {r["name"]: r for r in on if r["rank"] == 1}
    assert all(rows[names[i]]["end_ns"] - rows[names[i]]["start_ns"] == W for i in wgrads)
    # back to back after the last layer backward, one after the other
    for a, b in zip(wgrads, wgrads[1:], strict=False):
        assert rows[names[b]]["start_ns"] == rows[names[a]]["end_ns"]
    # The first stage holds no output layer: unchanged.
    assert not [n for n in bundle.nodes[0] if n.name.startswith("lm_head")]


def test_deferred_wgrad_under_sequence_parallelism_regathers_its_input_double_buffered():
    # TP 2 with SP: the deferred micro-batches' head backward drops the input re-gather and keeps the dgrad
    # half and its ReduceScatter; the drain (utils.py drain_embedding_wgrad_compute) all-gathers micro-batch
    # i + 1's input (32 tokens / 2 x 64 x 2 B = 2,048 B per rank) while GEMM i runs: gather 0; gather 1;
    # GEMM 0 (after gather 0); gather 2 (after GEMM 0, the compute enqueued before it); GEMM 1; GEMM 2.
    spec = {**pp2(defer_embedding_wgrad_compute=True), "sequence_parallel": True}
    spec["parallel"] = {"gpu": "H100", "pp": 2, "tp": 2}
    spec.pop("profile")
    nodes = generate(load_spec(spec), rewrite=False).nodes[2]
    by_name = {n.name: n for n in nodes}
    assert not [n for n in nodes if n.name.startswith("head_tp_in_regather") and ".chunk" not in n.name]
    regather = [n for n in nodes if n.name.startswith("head_tp_in_regather")]
    drain = [
        n.name for n in nodes if n in regather or n.name.startswith("lm_head.bwd") and n.name.endswith("1")
    ]
    assert drain == [
        "head_tp_in_regather.bwd.mb0.chunk0", "head_tp_in_regather.bwd.mb1.chunk0", "lm_head.bwd.mb0.chunk1",
        "head_tp_in_regather.bwd.mb2.chunk0", "lm_head.bwd.mb1.chunk1", "lm_head.bwd.mb2.chunk1",
    ]  # fmt: skip
    g = [by_name[f"head_tp_in_regather.bwd.mb{i}.chunk0"] for i in range(3)]
    w = [by_name[f"lm_head.bwd.mb{i}.chunk1"] for i in range(3)]
    assert {A.comm_size(x) for x in g} == {2_048}
    assert [list(x.data_deps) for x in w] == [[g[0].id], [g[1].id], [g[2].id]]
    assert list(g[2].data_deps) == [w[0].id] and list(g[2].ctrl_deps) == [g[1].id]
    # each deferred micro-batch: dgrad half then its ReduceScatter (whole input gradient, 4,096 B)
    for mb in range(3):
        rs = by_name[f"head_tp_in.bwd.mb{mb}.chunk0"]
        assert list(rs.data_deps) == [by_name[f"lm_head.bwd.mb{mb}.chunk0"].id] and A.comm_size(rs) == 4_096


# -- overlap_param_gather_with_optimizer_step -----------------------------------------------------------

# Four layers, PP 2, VP 2, DP 2 (TP 1): stage 0 holds chunk 0 = embedding + layer 1 and chunk 1 = layer 3.
# Per rank a layer is 41,088 parameters, the embedding 6,400. Chunk 0 is one bucket (bucketing disabled):
# 47,488 = 371 x 128 parameters, already a multiple of lcm(DP 2, 128): its AllGather moves 47,488 / 2 x 2 B
# = 47,488 B per rank.
TINY4 = {**TINY, "layers": 4}


def vp2(**extra) -> dict:
    return {
        "model": TINY4,
        "parallel": {"gpu": "H100", "pp": 2, "dp": 2, "virtual_stages": 2},
        "micro_batches": 2,
        "make_vocab_size_divisible_by": 0,
        "distributed_optimizer": True,
        "overlap_grad_reduce": True,
        "overlap_param_gather": True,
        **extra,
    }


@pytest.mark.parametrize(("ns_per_byte", "exposed"), [(1, True), (0.01, False)])
def test_first_chunk_gather_leaves_with_its_optimizer_step_by_hand(tmp_path, ns_per_byte, exposed):
    # ChainedOptimizer: chunk 0's Adam and parameter copy, then its AllGather (47,488 B), while the other
    # chunk's Adam and copy and both zero_grads run. The gather starts where chunk 0's copy ends (the DP
    # stream is idle: the ReduceScatters were waited for before the grad norm). At 1 ns per byte it lasts
    # 47,488 ns, longer than the rest of the step (4 ops of a few us): the rank ends at copy0 + 47,488. At
    # 0.01 ns per byte (474 ns) it hides under the rest: the rank ends with its last zero_grad.
    coll = lambda s: int(s.size_bytes * ns_per_byte)  # noqa: E731
    bundle, rows = replay(tmp_path, vp2(overlap_param_gather_with_optimizer_step=True), 4, coll)
    nodes = bundle.nodes[0]
    opt = [n.name for n in nodes if A.get_str(n, A.PHASE) in ("opt", "sync")][-14:]
    assert opt == [
        "dp_grad_reducescatter.bucket1",
        "grad_norm.opt", "grad_norm_allreduce.opt", "grad_norm.opt", "grad_norm_allreduce.opt",
        "grad_clip.opt", "grad_clip.opt", "optimizer.opt", "param_copy.opt", "dp_param_allgather.bucket1",
        "optimizer.opt", "param_copy.opt", "zero_grad.opt", "zero_grad.opt",
    ]  # fmt: skip
    ag = next(n for n in nodes if n.name == "dp_param_allgather.bucket1")
    assert A.comm_size(ag) == 47_488
    # no other gather of chunk 0: its forward does not wait for one (the steady state's period)
    assert [n.name for n in nodes if n.name.startswith("dp_param_allgather")] == [
        "dp_param_allgather.bucket0", "dp_param_allgather.bucket1",
    ]  # fmt: skip
    emb = next(n for n in nodes if n.name == "embedding.fwd.mb0")
    assert list(emb.data_deps) == [] and list(emb.ctrl_deps) == []
    r0 = [r for r in rows if r["rank"] == 0]
    ids = {r["node_id"]: r for r in r0}
    copies = [n for n in nodes if n.name == "param_copy.opt"]
    copy0 = ids[copies[0].id]
    ag_row = ids[ag.id]
    assert ag_row["start_ns"] == copy0["end_ns"]
    assert ag_row["end_ns"] - ag_row["start_ns"] == int(47_488 * ns_per_byte)
    # the other chunk's step starts right after chunk 0's copy, not after the gather
    rest = ids[next(n for n in nodes if n.name == "optimizer.opt" and n.id > ag.id).id]
    assert rest["start_ns"] == copy0["end_ns"]
    last_compute = max(r["end_ns"] for r in r0 if r["name"] == "zero_grad.opt")
    end = max(r["end_ns"] for r in r0)
    if exposed:
        assert end == copy0["end_ns"] + 47_488 > last_compute
    else:
        assert end == last_compute


def test_first_chunk_is_one_bucket_and_its_shard_is_stepped_first():
    # 200,000-byte buckets of FP32 gradients cut no chunk here (stage 1 is never cut by Megatron-Core's DDP,
    # tests/test_chunk_buckets.py) and chunk 0 stays whole anyway. Stage 0's chunk 0 (layer 1 41,088 +
    # embedding 6,400) is below one bucket either way; stage 1's chunk 0 is layer 2 alone (41,088 -> padded
    # 41,088 = 321 x 128): its Adam runs on 41,088 / 2 = 20,544 parameters, AdamW 15 FLOPs each.
    spec = vp2(overlap_param_gather_with_optimizer_step=True, dp_bucket_bytes=200_000)
    nodes = generate(load_spec(spec), rewrite=False).nodes[1]  # stage 1, DP replica 0
    adam = [n for n in nodes if n.name == "optimizer.opt"]
    assert A.get_int(adam[0], A.NUM_OPS) == 15 * 20_544
    assert A.comm_size(next(n for n in nodes if n.name == "dp_param_allgather.bucket1")) == 41_088


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ({"wgrad_deferral_limit": 4}, "needs defer_embedding_wgrad_compute"),
        ({"defer_embedding_wgrad_compute": True, "parallel": {"gpu": "H100", "pp": 1}}, "pipeline of 2"),
        ({"defer_embedding_wgrad_compute": True, "framework": "megatron-2022"}, "megatron-core frameworks"),
        ({"defer_embedding_wgrad_compute": True, "wgrad_deferral_limit": -1}, "wgrad_deferral_limit"),
        ({"overlap_param_gather_with_optimizer_step": True}, "needs distributed_optimizer"),
    ],
)
def test_flush_keys_follow_megatron_checks(extra, error):
    with pytest.raises(SpecError, match=error):
        load_spec(pp2(**extra))
    with pytest.raises(SpecError, match="interleaved"):
        load_spec(
            {
                **vp2(overlap_param_gather_with_optimizer_step=True),
                "parallel": {"gpu": "H100", "pp": 2, "dp": 2},
            }
        )


def test_flush_keys_round_trip_and_default_off():
    m = spec_to_mapping(load_spec(pp2()))
    assert "defer_embedding_wgrad_compute" not in m and "overlap_param_gather_with_optimizer_step" not in m
    m = spec_to_mapping(load_spec(pp2(defer_embedding_wgrad_compute=True)))
    assert (m["defer_embedding_wgrad_compute"], m["wgrad_deferral_limit"]) == (True, 0)
    dep = load_spec(vp2(overlap_param_gather_with_optimizer_step=True))
    again = load_spec(spec_to_mapping(dep))
    assert again.overlap_param_gather_with_optimizer_step and not again.HasField("wgrad_deferral_limit")
