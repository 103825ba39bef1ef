"""Megatron-FSDP (`sharding: megatron-fsdp`, docs/tracegen.md "Overlap and sharding"): hand-computed
collectives, their placement and the memory fit of the tiny 2-layer model at DP 2, per strategy."""

from __future__ import annotations

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.memory import deployment_memory
from xsim.traces import attrs as A
from xsim.traces import pb

from tests.test_gen_overlap import TINY

# TINY per rank at TP 1: a layer 41,088 parameters, the embedding 6,400, final norm + LM head 6,464.
# Megatron-FSDP's bucket 0 holds what no TransformerLayer holds: 6,400 + 6,464 = 12,864 parameters.
LAYER, NU = 41_088, 12_864
AG, RS, AR = pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.ALL_REDUCE
# Megatron-Bridge's FSDP runs: overlap_grad_reduce and overlap_param_gather on (recipes/llama/llama3.py
# v0.2.0; comm_overlap.py _get_optimizer_overlap_cfgs).
OVERLAP = {"overlap_grad_reduce": True, "overlap_param_gather": True}


def spec(layers: int = 2, global_batch: int = 2, **extra) -> dict:
    return {
        "model": {**TINY, "layers": layers},
        "parallel": {"gpu": "H100", "dp": 2, "global_batch": global_batch},
        "schedule": "1f1b",
        "make_vocab_size_divisible_by": 0,
        "sharding": "megatron-fsdp",
        **extra,
    }


def syncs(nodes):
    return [(n.name, A.comm_type(n), A.comm_size(n)) for n in nodes if A.get_str(n, A.PHASE) == "sync"]


def test_optim_grads_params_gathers_buckets_and_reduce_scatters_per_layer_by_hand():
    bundle = generate(load_spec(spec(**OVERLAP)), rewrite=False)
    nodes = bundle.nodes[0]
    # Buckets: 0 = embedding + final norm + head (12,864), 1 = L1, 2 = L2 (41,088 each), padded to DP 2.
    # The embedding's call (t = 0: start_param_sync after the previous step) gathers bucket 0 and prefetches
    # 1 and 2 (500M elements of window) in one coalesced AllGather: (12,864 + 2 x 41,088) / 2 x 2 B =
    # 95,040 B. L1 and L2 find theirs gathered and are released after their forward; the final norm's call
    # prefetches 1 and 2 again (82,176 B), which L2's and L1's backward then use. ReduceScatters of the
    # padded bucket in FP32 (grad_reduce_dtype's default under BF16): 41,088 x 4 = 164,352 per layer,
    # bucket 0 at the embedding's backward (its gradients complete there): 12,864 x 4 = 51,456.
    assert syncs(nodes) == [
        ("fsdp_param_allgather.emb+1+2.mb0", AG, 95_040),
        ("fsdp_param_allgather.1+2.mb0", AG, 82_176),
        ("fsdp_grad_reducescatter.2.mb0", RS, 164_352),
        ("fsdp_grad_reducescatter.1.mb0", RS, 164_352),
        ("fsdp_grad_reducescatter.emb.mb0", RS, 51_456),
    ]
    named = {n.name: n for n in nodes}
    by_id = {n.id: n for n in nodes}
    s = [n for n in nodes if A.get_str(n, A.PHASE) == "sync"]
    # Placement: the first gather at t = 0 (no deps), waited for by the embedding; L1 waits for it too
    # (its bucket came with it); the head's prefetch is issued when the final norm's visit starts (after
    # L2's last forward op and the previous DP collective) and L2's first backward op waits for it.
    assert not s[0].data_deps and not s[0].ctrl_deps
    assert s[0].id in named["embedding.fwd.mb0"].data_deps
    assert s[0].id in named["L1.attn_norm.fwd.mb0"].data_deps
    assert s[0].id in s[1].ctrl_deps and by_id[
        [c for c in s[1].ctrl_deps if c != s[0].id][0]
    ].name.startswith("L2.")
    l2b = next(n for n in nodes if n.name.startswith("L2.") and A.get_str(n, A.PHASE) == "bwd")
    assert s[1].id in l2b.data_deps
    # Each ReduceScatter hangs off its unit's last backward op: Megatron-FSDP's copy into the bucket.
    assert by_id[s[2].data_deps[0]].name == "L2.layer_main_grad_copy.bwd.mb0"
    assert by_id[s[4].data_deps[0]].name == "embedding_main_grad_copy.bwd.mb0"
    # All over the DP group of ranks 0 and 1; the optimizer updates the 95,040 / 2 = 47,520 shard.
    pg = {A.get_str(n, A.PG_NAME) for n in s}
    assert len(pg) == 1 and sorted(bundle.comm_groups[pg.pop()]) == [0, 1]
    assert not any(n.name.startswith("dp_param_allgather") for n in nodes)


def test_optim_grads_params_two_micro_batches_by_hand():
    nodes = generate(load_spec(spec(global_batch=4, **OVERLAP)), rewrite=False).nodes[0]
    # Micro-batch 1: bucket 0 stays gathered for the whole iteration (released at finish_grad_sync only);
    # the embedding's forward call prefetches 1 + 2 (released by their backward): 82,176 B; the final
    # norm's again 82,176 B. Per micro-batch 3 ReduceScatters (every backward: grad_reduce_every_bprop).
    assert [x for x in syncs(nodes) if x[0].endswith("mb1")] == [
        ("fsdp_param_allgather.1+2.mb1", AG, 82_176),
        ("fsdp_param_allgather.1+2.mb1", AG, 82_176),
        ("fsdp_grad_reducescatter.2.mb1", RS, 164_352),
        ("fsdp_grad_reducescatter.1.mb1", RS, 164_352),
        ("fsdp_grad_reducescatter.emb.mb1", RS, 51_456),
    ]
    # Micro-batch 1's first gather is issued at the embedding's visit, after micro-batch 0's last op (the
    # embedding's gradient copy) and its bucket-0 ReduceScatter; L1's forward waits for it, the embedding
    # for the t = 0 gather that brought bucket 0.
    by_id = {n.id: n for n in nodes}
    first = next(n for n in nodes if n.name == "fsdp_param_allgather.1+2.mb1")
    assert sorted(by_id[c].name for c in first.ctrl_deps) == [
        "embedding_main_grad_copy.bwd.mb0", "fsdp_grad_reducescatter.emb.mb0",
    ]  # fmt: skip
    l1 = next(n for n in nodes if n.name == "L1.attn_norm.fwd.mb1")
    emb1 = next(n for n in nodes if n.name == "embedding.fwd.mb1")
    assert first.id in l1.data_deps
    assert [by_id[c].name for c in emb1.data_deps] == ["fsdp_param_allgather.emb+1+2.mb0"]


def test_optim_grads_params_pipeline_stages_by_hand():
    # PP 2, DP 2, one micro-batch. Stage 0 (embedding, L1): buckets [emb 6,400, L1 41,088]; the embedding's
    # call gathers both ((6,400 + 41,088) / 2 x 2 B = 47,488); L1 is released after its forward and its
    # backward, right after it, gathers it again (41,088). Stage 1 (L2, final norm + head): buckets [L2,
    # head 6,464] (the non-layer parameters after the layers there); L2's call gathers both ((41,088 +
    # 6,464) / 2 x 2 = 47,552); the head's gradients reduce-scatter after its backward (6,464 x 4 = 25,856),
    # before L2's backward gathers L2 again.
    b = generate(load_spec({**spec(), "parallel": {"gpu": "H100", "pp": 2, "dp": 2, "global_batch": 2},
                            **OVERLAP}), rewrite=False)  # fmt: skip
    names = {r: {n.name for n in ns} for r, ns in b.nodes.items()}
    first = min(r for r in b.nodes if "embedding.fwd.mb0" in names[r])
    last = min(r for r in b.nodes if "final_norm.fwd.mb0" in names[r])
    assert syncs(b.nodes[first]) == [
        ("fsdp_param_allgather.emb+1.mb0", AG, 47_488),
        ("fsdp_param_allgather.1.mb0", AG, 41_088),
        ("fsdp_grad_reducescatter.1.mb0", RS, 164_352),
        ("fsdp_grad_reducescatter.emb.mb0", RS, 25_600),
    ]
    assert [x for x in syncs(b.nodes[last]) if "fsdp" in x[0]] == [
        ("fsdp_param_allgather.2+head.mb0", AG, 47_552),
        ("fsdp_grad_reducescatter.head.mb0", RS, 25_856),
        ("fsdp_param_allgather.2.mb0", AG, 41_088),
        ("fsdp_grad_reducescatter.2.mb0", RS, 164_352),
    ]


def test_optim_grads_params_double_buffer_prefetches_one_layer_by_hand():
    # 4 layers, fsdp_double_buffer: at most two layer buckets per call (need_skip_prefetch; bucket 0's None
    # unit counts as one). Forward: the embedding gathers 0 + 1 + 2 ((12,864 + 2 x 41,088) / 2 x 2 B =
    # 95,040), L2 prefetches 3, L3 prefetches 4 (41,088 each). The final norm prefetches 1 + 2 (82,176).
    # The root pre-backward marks every layer releasable; L4's call claims 4 and 3 and gathers both
    # (82,176), its recycle releasing 1 and 2 unused; L3 prefetches 2, L2 prefetches 1 again (41,088).
    nodes = generate(load_spec(spec(layers=4, fsdp_double_buffer=True, **OVERLAP)), rewrite=False).nodes[0]
    assert [x for x in syncs(nodes) if x[1] == AG] == [
        ("fsdp_param_allgather.emb+1+2.mb0", AG, 95_040),
        ("fsdp_param_allgather.3.mb0", AG, 41_088),
        ("fsdp_param_allgather.4.mb0", AG, 41_088),
        ("fsdp_param_allgather.1+2.mb0", AG, 82_176),
        ("fsdp_param_allgather.3+4.mb0", AG, 82_176),
        ("fsdp_param_allgather.2.mb0", AG, 41_088),
        ("fsdp_param_allgather.1.mb0", AG, 41_088),
    ]
    # Without the double buffer the 500M-element window takes every bucket ahead: no forward gather after
    # the embedding's (0 + 1..4: (12,864 + 4 x 41,088) / 2 x 2 B = 177,216).
    nodes = generate(load_spec(spec(layers=4, **OVERLAP)), rewrite=False).nodes[0]
    assert [x for x in syncs(nodes) if x[1] == AG][0] == ("fsdp_param_allgather.emb+1+2+3+4.mb0", AG, 177_216)


def test_optim_grads_params_without_overlap_param_gather_gathers_after_the_step():
    # start_param_sync's synchronous branch gathers every bucket after the optimizer (one AllGather each:
    # 12,864 / 2 x 2 = 12,864 B, then 41,088 B twice); micro-batch 0's forward finds them gathered.
    nodes = generate(load_spec(spec(overlap_grad_reduce=True)), rewrite=False).nodes[0]
    got = syncs(nodes)
    assert got[0] == ("fsdp_param_allgather.1+2.mb0", AG, 82_176)  # the final norm's prefetch
    assert got[-3:] == [
        ("dp_param_allgather.bucket0", AG, 12_864),
        ("dp_param_allgather.bucket1", AG, 41_088),
        ("dp_param_allgather.bucket2", AG, 41_088),
    ]
    opt = [n.id for n in nodes if A.get_str(n, A.PHASE) == "opt"]
    assert all(n.id > min(opt) for n in nodes if n.name.startswith("dp_param_allgather"))


@pytest.mark.parametrize(
    ("strategy", "kind", "per_mb"),
    [("optim_grads", RS, True), ("optim", AR, False)],
)
def test_optim_and_optim_grads_reduce_one_bucket_by_hand(strategy, kind, per_mb):
    # No TransformerLayer units and no bucket_size: the rank's 95,040 parameters are one bucket, reduced
    # in FP32 (95,040 x 4 = 380,160 B) when the embedding's backward completes it: optim_grads every
    # micro-batch (a ReduceScatter), optim at the last only (an AllReduce of the whole buffer). Each rank
    # updates its 47,520-parameter shard; the updated parameters are all-gathered at t = 0 of the next
    # iteration (overlap_param_gather: 95,040 / 2 x 2 B = 95,040 B), waited for by the embedding.
    nodes = generate(load_spec(spec(global_batch=4, data_parallel_sharding_strategy=strategy, **OVERLAP)),
                     rewrite=False).nodes[0]  # fmt: skip
    what = "reducescatter" if kind == RS else "allreduce"
    reduce = [(f"dp_grad_{what}.bucket0", kind, 380_160)]
    if per_mb:
        reduce.append((f"dp_grad_{what}.bucket1", kind, 380_160))
    assert syncs(nodes) == [("dp_param_allgather.bucket0", AG, 95_040), *reduce]
    s = next(n for n in nodes if n.name == "dp_param_allgather.bucket0")
    assert s.id in next(n for n in nodes if n.name == "embedding.fwd.mb0").data_deps
    ag_node = next(n for n in nodes if n.name == "dp_param_allgather.bucket0")
    assert not ag_node.data_deps and not ag_node.ctrl_deps
    # optim_grads: micro-batch 0's ReduceScatter hangs off its embedding's gradient copy
    first = next(n for n in nodes if n.name == reduce[0][0])
    tail = "copy" if strategy == "optim_grads" else "add"
    mb = "mb0" if per_mb else "mb1"
    assert next(n for n in nodes if n.id == first.data_deps[0]).name == f"embedding_main_grad_{tail}.bwd.{mb}"


def test_main_grad_hook_copies_into_a_sharded_gradient_buffer_by_hand():
    # Each layer's two RMSNorm gains (2 x 64 = 128 parameters) leave the weight-gradient GEMMs unfused:
    # Megatron-FSDP copies them into the fetched bucket (read BF16 2 B, write FP32 4 B: 6 x 128 = 768 B, no
    # FLOPs) under optim_grads / optim_grads_params; optim adds them to its whole buffer as Megatron-Core DDP
    # (read 4 + 2, write 4: 10 x 128 = 1,280 B).
    def op(strategy: str, name: str):
        nodes = generate(load_spec(spec(data_parallel_sharding_strategy=strategy)), rewrite=False).nodes[0]
        n = next(n for n in nodes if n.name == name)
        return A.num_ops(n), A.tensor_size(n)

    assert op("optim_grads_params", "L1.layer_main_grad_copy.bwd.mb0") == (0, 768)
    assert op("optim_grads", "L1.layer_main_grad_copy.bwd.mb0") == (0, 768)
    assert op("optim", "L1.layer_main_grad_add.bwd.mb0")[1] == 1_280


@pytest.mark.parametrize(
    ("strategy", "double", "expected"),
    [
        # shard 95,040 / 2 = 47,520. optim_grads_params: weights 47,520 x 2 + bucket 0 held 12,864 x 2 +
        # two layers gathered 2 x 41,088 x 2 = 95,040 + 25,728 + 164,352 = 285,120; gradients the FP32 shard
        # 190,080 + bucket 0's and one layer's unsharded (12,864 + 41,088) x 4 = 215,808: 405,888. The
        # window without the double buffer holds both layers too (2 of 2).
        ("optim_grads_params", False, (285_120, 405_888)),
        ("optim_grads_params", True, (285_120, 405_888)),
        # optim_grads: weights whole 95,040 x 2; gradients shard 190,080 + the one bucket whole 380,160.
        ("optim_grads", False, (190_080, 570_240)),
        # optim: weights and gradients whole: 190,080 and 380,160.
        ("optim", False, (190_080, 380_160)),
    ],
)
def test_megatron_fsdp_memory_by_hand(strategy, double, expected):
    extra = {"fsdp_double_buffer": True} if double else {}
    for r in deployment_memory(load_spec(spec(data_parallel_sharding_strategy=strategy, **extra))):
        # optimizer: FP32 main weights and two moments, 12 B x 95,040 / 2 = 570,240 in every strategy
        assert (r.weights, r.gradients, r.optimizer) == (*expected, 570_240)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"sharding": "fsdp", "data_parallel_sharding_strategy": "optim"}, "needs sharding: megatron-fsdp"),
        ({"sharding": "none", "fsdp_double_buffer": True}, "needs sharding: megatron-fsdp"),
        ({"data_parallel_sharding_strategy": "no_shard"}, "data_parallel_sharding_strategy must be one of"),
        ({"fsdp_backward_prefetch": "post"}, "drop fsdp_backward_prefetch"),
        (
            {"data_parallel_sharding_strategy": "optim", "dp_shard": 2, "parallel": {"gpu": "H100", "dp": 4}},
            "optim_grads_params only",
        ),
        # distributed_optimizer: true beside it is Megatron-FSDP v1's own (accepted since round fuzz4:
        # tests/test_launch_specs.py::test_megatron_fsdp_takes_its_distributed_optimizer_flag)
    ],
)
def test_megatron_fsdp_spec_errors(extra, message):
    with pytest.raises(SpecError, match=message):
        load_spec({**spec(), **extra})


def test_megatron_fsdp_round_trips_through_the_spec_mapping():
    from xsim.tracegen.spec import spec_to_mapping

    dep = load_spec(spec(data_parallel_sharding_strategy="optim_grads", fsdp_double_buffer=True))
    m = spec_to_mapping(dep)
    assert (m["sharding"], m["data_parallel_sharding_strategy"], m["fsdp_double_buffer"]) == (
        "megatron-fsdp", "optim_grads", True,
    )  # fmt: skip
    assert "data_parallel_sharding_strategy" not in spec_to_mapping(load_spec(spec()))


@pytest.mark.parametrize(
    "extra",
    [
        {"recompute": "full", "recompute_layers": 2, **OVERLAP},
        {"recompute": "selective", "fsdp_double_buffer": True, "grad_reduce_dtype": "bf16"},
        {"data_parallel_sharding_strategy": "optim_grads", **OVERLAP},
        {"data_parallel_sharding_strategy": "optim"},
    ],
)
def test_megatron_fsdp_traces_validate_copy_and_replay(tmp_path, capsys, extra):
    # TP 2 + SP, PP 2 (1F1B), DP 2, four micro-batches: copies equal rebuilds, the validator finds nothing,
    # the command line generates and replays the set (test_gen_overlap's FEATURES at virtual_stages 1).
    import json

    from xsim.tracegen.workload import _Generator

    from tests.test_gen_overlap import FEATURES
    from tests.test_gen_workload import _validate
    from xsim.cli import main

    full = {**FEATURES, "parallel": {**FEATURES["parallel"], "virtual_stages": 1}, "schedule": "1f1b",
            "sharding": "megatron-fsdp", **extra}  # fmt: skip
    dep = load_spec(full)
    bundle = generate(dep)
    rebuilt = _Generator(dep, clone=False).run()
    for rank, nodes in bundle.nodes.items():
        assert [n.SerializeToString() for n in nodes] == [n.SerializeToString() for n in rebuilt.nodes[rank]]
    _, findings = _validate(bundle, tmp_path / "v", "f")
    assert [str(f) for f in findings] == []
    spec_file = tmp_path / "s.json"
    spec_file.write_text(json.dumps(full))
    assert main(["gen", str(spec_file), "--out", str(tmp_path / "t")]) == 0
    capsys.readouterr()
    assert main(["replay", str(tmp_path / "t"), "--no-progress", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_time_ns"] > 0


def test_megatron_fsdp_refuses_virtual_stages():
    with pytest.raises(SpecError, match="virtual_stages: 1 only"):
        load_spec({**spec(layers=4, global_batch=4), "parallel": {"gpu": "H100", "pp": 2, "dp": 2,
                   "global_batch": 4, "virtual_stages": 2}})  # fmt: skip
