"""Hybrid sharding (`dp_shard`): ZeRO-3 / FSDP units sharded over groups of dp_shard consecutive DP replicas,
their reduced shards all-reduced across the groups (PyTorch FSDP HYBRID_SHARD, torchtitan dp_shard)."""

from __future__ import annotations

from pathlib import Path

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.compact import rank_classes, replica_block
from xsim.tracegen.errors import SpecError
from xsim.tracegen.memory import deployment_memory
from xsim.tracegen.ops import ADAM_FLOPS_PER_PARAM
from xsim.tracegen.spec import spec_to_mapping
from xsim.traces import attrs as A
from xsim.traces import pb

from tests.test_gen_overlap import TINY
from xsim import api


def dp4(**extra) -> dict:
    # TINY (two layers, h 64) at DP 4, vocabulary as given (test_gen_overlap.dp2).
    return {"model": TINY, "parallel": {"gpu": "H100", "dp": 4}, "make_vocab_size_divisible_by": 0, **extra}


def syncs(nodes):
    return [
        (n.name, A.comm_type(n), A.comm_size(n), A.get_str(n, A.PG_NAME))
        for n in nodes
        if A.get_str(n, A.PHASE) == "sync"
    ]


def test_hybrid_shard_gathers_over_the_shard_group_and_all_reduces_the_shard_by_hand():
    bundle = generate(load_spec(dp4(sharding="zero3", dp_shard=2)), rewrite=False)
    n0 = bundle.nodes[0]
    got = syncs(n0)
    shard_pg = next(pg for name, kind, _, pg in got if kind == pb.ALL_GATHER)
    rep_pg = next(pg for name, kind, _, pg in got if kind == pb.ALL_REDUCE)
    assert shard_pg != rep_pg
    ag, rs, ar = pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.ALL_REDUCE
    # Shard group of 2 (ranks 0, 1): per-rank shards of the units as at DP 2 (test_gen_overlap: embedding
    # 6,400 / 2 = 3,200, layer 41,088 / 2 = 20,544, head 6,464 / 2 = 3,232 parameters), gathered in BF16
    # (x 2 B: 6,400 / 41,088 / 6,464 B), reduce-scattered whole in FP32 (x 4 B); after each ReduceScatter the
    # rank's reduced shard all-reduced over the replicate group (ranks 0, 2) in FP32: 3,232 x 4 = 12,928,
    # 20,544 x 4 = 82,176, 3,200 x 4 = 12,800 B.
    assert [(a, b, c) for a, b, c, _ in got] == [
        ("fsdp_param_allgather.emb.mb0", ag, 6_400),
        ("fsdp_param_allgather.1.mb0", ag, 41_088),
        ("fsdp_param_allgather.2.mb0", ag, 41_088),
        ("fsdp_param_allgather.head.mb0", ag, 6_464),
        ("fsdp_param_allgather.2.mb0", ag, 41_088),
        ("fsdp_grad_reducescatter.head.mb0", rs, 6_464 * 4),
        ("fsdp_grad_allreduce.head.mb0", ar, 3_232 * 4),
        ("fsdp_param_allgather.1.mb0", ag, 41_088),
        ("fsdp_grad_reducescatter.2.mb0", rs, 41_088 * 4),
        ("fsdp_grad_allreduce.2.mb0", ar, 20_544 * 4),
        ("fsdp_param_allgather.emb.mb0", ag, 6_400),
        ("fsdp_grad_reducescatter.1.mb0", rs, 41_088 * 4),
        ("fsdp_grad_allreduce.1.mb0", ar, 20_544 * 4),
        ("fsdp_grad_reducescatter.emb.mb0", rs, 6_400 * 4),
        ("fsdp_grad_allreduce.emb.mb0", ar, 3_200 * 4),
    ]
    assert all(pg == (rep_pg if kind == ar else shard_pg) for _, kind, _, pg in got)
    # Each AllReduce follows its own ReduceScatter (same stream), the optimizer waits for the last one and
    # Adam updates the shard of the group of 2: 3,200 + 2 x 20,544 + 3,232 parameters.
    by_name = {n.name: n for n in n0}
    assert list(by_name["fsdp_grad_allreduce.2.mb0"].data_deps) == [
        by_name["fsdp_grad_reducescatter.2.mb0"].id
    ]
    assert by_name["fsdp_grad_allreduce.emb.mb0"].id in by_name["grad_norm.opt"].data_deps
    assert A.num_ops(by_name["optimizer.opt"]) == ADAM_FLOPS_PER_PARAM * (3_200 + 2 * 20_544 + 3_232)
    # Groups: shard groups {0, 1}, {2, 3}; replicate groups {0, 2}, {1, 3} (the copies' names patched).
    pgs = {r: {k: pg for _, k, _, pg in syncs(bundle.nodes[r])} for r in range(4)}
    assert pgs[0][ag] == pgs[1][ag] != pgs[2][ag] == pgs[3][ag]
    assert pgs[0][ar] == pgs[2][ar] != pgs[1][ar] == pgs[3][ar]
    assert pgs[0][ag] not in (pgs[0][ar], pgs[1][ar])


def test_dp_shard_keys_and_checks():
    m = spec_to_mapping(load_spec(dp4(sharding="fsdp", dp_shard=2)))
    assert m["dp_shard"] == 2
    # dp_shard equal to DP is plain sharding (not stored)
    assert "dp_shard" not in spec_to_mapping(load_spec(dp4(sharding="fsdp", dp_shard=4)))
    for bad, what in [
        (dp4(dp_shard=2), "dp_shard needs sharding"),
        (dp4(sharding="zero3", dp_shard=3), "dp_shard 3 must divide the DP degree 4"),
        (dp4(sharding="zero3", dp_shard=1), "dp_shard must be >= 2"),
    ]:
        with pytest.raises(SpecError, match=what):
            load_spec(bad)


def test_hybrid_shard_memory_and_fold_by_the_shard_group(tmp_path: Path):
    hybrid = load_spec(dp4(sharding="zero3", dp_shard=2))
    # Sharded state over the shard group: the same bytes as zero3 at DP 2, not DP 4.
    full2 = load_spec({**dp4(sharding="zero3"), "parallel": {"gpu": "H100", "dp": 2}})
    assert deployment_memory(hybrid)[0].optimizer == deployment_memory(full2)[0].optimizer
    # Class unit: a block of 2 replicas (one shard group); two blocks fold.
    assert replica_block(hybrid) == 2
    rc = rank_classes(hybrid, rewrite=True)
    assert rc is not None and rc.replicas == ((0, 1), (2, 3))
    # The compact set replays folded to the every-rank set's step time.
    spec = dp4(sharding="zero3", dp_shard=2, name="hy")
    times = {}
    for every in (False, True):
        d = tmp_path / str(every)
        api.generate(spec, api.GenerateOptions(out=str(d), all_ranks=every))
        run = api.simulate(str(d), api.ReplayOptions(fold=not every, progress=False))
        times[every] = (run.result.perf_dict().get("fold"), run.result.iteration_time_ns)
    assert times[False][0] == "folded"
    assert times[False][1] == times[True][1]


def test_hybrid_shard_all_reduces_every_micro_batch_under_fsdp_and_at_the_boundary_under_zero3():
    # Two micro-batches at DP 4 (global batch 8 of 1 sequence), shard groups of 2. PyTorch FSDP's
    # HYBRID_SHARD all-reduces each reduced shard after every ReduceScatter: 4 units x 2 micro-batches = 8
    # AllReduces of 2 x (3,232 + 2 x 20,544 + 3,200) x 4 B = 2 x 190,080 = 380,160 B. DeepSpeed's MiCS
    # (zero3) only at the accumulation boundary: micro-batch 1's 4, 190,080 B; ReduceScatters 8 either way.
    spec = dp4(dp_shard=2, schedule="1f1b")
    spec["parallel"] = {"gpu": "H100", "dp": 4, "global_batch": 8}
    got = {}
    for name in ("fsdp", "zero3"):
        rows = syncs(generate(load_spec({**spec, "sharding": name}), rewrite=False).nodes[0])
        ars = [(n, c) for n, k, c, _ in rows if k == pb.ALL_REDUCE]
        rss = [n for n, k, _, _ in rows if k == pb.REDUCE_SCATTER]
        got[name] = (len(rss), len(ars), sum(c for _, c in ars), {n.rsplit(".", 1)[1] for n, _ in ars})
    assert got == {"fsdp": (8, 8, 380_160, {"mb0", "mb1"}), "zero3": (8, 4, 190_080, {"mb1"})}


def test_validation_rows_carry_dp_shard_and_the_p4d_cluster(tmp_path: Path):
    # A dataset row may set dp_shard (an integer >= 2, written into the spec as given) and name cluster
    # p4d-24xlarge: 8-GPU nodes at 400 Gb/s of EFA per instance, 50 Gb/s per GPU (AWS Compute Blog, P4d deep dive).
    import importlib.util
    import sys

    path = Path(__file__).resolve().parent.parent / "scripts" / "validate_published.py"
    spec = importlib.util.spec_from_file_location("validate_published", path)
    vp = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("validate_published", vp)
    spec.loader.exec_module(vp)
    assert vp.CLUSTER_NICS["p4d-24xlarge"] == "50Gbps"
    assert vp._sm_options("f", "runs[0]", {"dp_shard": 128}) == [("dp_shard", 128)]
    with pytest.raises(vp.ValidationDataError, match="dp_shard must be an integer >= 2"):
        vp._sm_options("f", "runs[0]", {"dp_shard": 1})
