"""`dp_shard` with `distributed_optimizer`: the distributed optimizer over shard groups of dp_shard consecutive
DP replicas (Megatron-Core's --num-distributed-optimizer-instances DP / dp_shard, InternLM's zero1=dp_shard)."""

from __future__ import annotations

from pathlib import Path

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.compact import rank_classes
from xsim.tracegen.errors import SpecError
from xsim.tracegen.memory import deployment_memory
from xsim.tracegen.ops import ADAM_FLOPS_PER_PARAM
from xsim.traces import attrs as A
from xsim.traces import pb

from tests.test_gen_overlap import EMB, HEAD, LAYER, TINY
from xsim import api

AG, RS, AR = pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.ALL_REDUCE
# TINY's parameters on one rank at TP 1: embedding 6,400 + 2 layers x 41,088 + head 6,464 = 95,040.
PARAMS = EMB + 2 * LAYER + HEAD


def dp4(**extra) -> dict:
    # TINY at DP 4, the vocabulary as given, the distributed optimizer, no overlap (one bucket).
    spec = {"model": TINY, "parallel": {"gpu": "H100", "dp": 4}, "make_vocab_size_divisible_by": 0}
    return {**spec, "distributed_optimizer": True, **extra}


def colls(bundle, rank: int) -> list[tuple[str, int, int, tuple[int, ...]]]:
    """(name, kind, bytes, group members) of the rank's collectives, in program order."""
    groups = bundle.comm_groups
    return [
        (n.name, A.comm_type(n), A.comm_size(n), tuple(groups[A.get_str(n, A.PG_NAME)]))
        for n in bundle.nodes[rank]
        if n.type == pb.COMM_COLL_NODE
    ]


def test_megatron_core_reduce_scatters_in_the_instance_then_all_reduces_the_shard_across_instances():
    bundle = generate(load_spec(dp4(dp_shard=2)), rewrite=False)
    # One bucket of 95,040 parameters padded to lcm(2, 128) = 128: 743 x 128 = 95,104 elements. ReduceScatter
    # over the instance {0, 1} in FP32: 95,104 x 4 = 380,416 B; the rank's shard 95,104 / 2 = 47,552
    # all-reduced over the other instances' same shard {0, 2}: 47,552 x 4 = 190,208 B; the grad norm (4 B)
    # over the instance's ranks {0, 1}; the updated shard all-gathered in the instance in BF16: 95,104 B.
    assert colls(bundle, 0) == [
        ("dp_grad_reducescatter.bucket0", RS, 380_416, (0, 1)),
        ("dp_grad_shard_allreduce.bucket0", AR, 190_208, (0, 2)),
        ("grad_norm_allreduce.opt", AR, 4, (0, 1)),
        ("dp_param_allgather.bucket0", AG, 95_104, (0, 1)),
    ]
    # The copies' groups: rank 3 in instance {2, 3}, across-instance group {1, 3}.
    assert [c[3] for c in colls(bundle, 3)] == [(2, 3), (1, 3), (2, 3), (2, 3)]
    # The AllReduce follows its ReduceScatter (one stream); the optimizer step covers the 1/2 shard:
    # Adam's 15 FLOPs x 47,552 = 713,280 (at DP 4 without dp_shard: 15 x 23,776 = 356,640).
    n0 = {n.name: n for n in bundle.nodes[0]}
    assert list(n0["dp_grad_shard_allreduce.bucket0"].data_deps) == [n0["dp_grad_reducescatter.bucket0"].id]
    assert A.num_ops(n0["optimizer.opt"]) == ADAM_FLOPS_PER_PARAM * 47_552 == 713_280
    plain = {n.name: n for n in generate(load_spec(dp4()), rewrite=False).nodes[0]}
    assert A.num_ops(plain["optimizer.opt"]) == ADAM_FLOPS_PER_PARAM * 23_776


def test_the_grad_norm_spans_the_instance_across_tp():
    # TP 2 x DP 4 (ranks 2d, 2d + 1 in replica d), dp_shard 2: instances are replicas {0, 1} and {2, 3}, so
    # the grad-norm AllReduce runs over ranks {0, 1, 2, 3} (Megatron-Core's intra_dist_opt_group); the
    # ReduceScatter over rank 0's TP position in the instance {0, 2}, the shard's AllReduce over {0, 4}.
    spec = dp4(dp_shard=2)
    spec["parallel"] = {"gpu": "H100", "dp": 4, "tp": 2}
    got = {name: members for name, _, _, members in colls(generate(load_spec(spec), rewrite=False), 0)}
    assert got["grad_norm_allreduce.opt"] == (0, 1, 2, 3)
    assert got["dp_grad_reducescatter.bucket0"] == (0, 2)
    assert got["dp_grad_shard_allreduce.bucket0"] == (0, 4)


def test_internlm_all_reduces_over_every_dp_rank_and_gathers_in_the_zero1_group():
    bundle = generate(
        load_spec(dp4(dp_shard=2, framework="internlm", grad_reduce_dtype="bf16")), rewrite=False
    )
    # InternLM's zero1=2 at DP 4: the whole bucket all-reduced over all four ranks in BF16 (95,040 x 2 =
    # 190,080 B), no ReduceScatter; the optimizer on 47,552 parameters; the parameters back from their
    # owners in the zero1 group {0, 1} (replayed as an all-gather: 95,104 B).
    assert colls(bundle, 0) == [
        ("dp_grad_allreduce.bucket0", AR, 190_080, (0, 1, 2, 3)),
        ("grad_norm_allreduce.opt", AR, 4, (0, 1)),
        ("dp_param_allgather.bucket0", AG, 95_104, (0, 1)),
    ]
    assert [c[3] for c in colls(bundle, 2)] == [(0, 1, 2, 3), (2, 3), (2, 3)]
    n0 = {n.name: n for n in bundle.nodes[0]}
    assert A.num_ops(n0["optimizer.opt"]) == 713_280


def test_memory_shards_the_optimizer_state_over_the_instance():
    # Adam's 12 B a parameter over the instance of 2: 12 x 95,040 / 2 = 570,240 B (over DP 4: 285,120).
    assert deployment_memory(load_spec(dp4(dp_shard=2)))[0].optimizer == 570_240
    assert deployment_memory(load_spec(dp4()))[0].optimizer == 285_120


def test_dp_shard_with_the_distributed_optimizer_checks():
    for bad, what in [
        (
            dp4(distributed_optimizer=False, dp_shard=2),
            "dp_shard needs sharding: fsdp or zero3 or distributed",
        ),
        (dp4(dp_shard=3), "dp_shard 3 must divide the DP degree 4"),
        (dp4(dp_shard=2, sharding="zero3"), "sharding: zero3 already shards the optimizer state"),
        (
            dp4(dp_shard=2, model={**TINY, "moe": {"experts": 4, "top_k": 2, "expert_ffn": 128}}),
            "dp_shard with distributed_optimizer: MoE models are not built",
        ),
    ]:
        with pytest.raises(SpecError, match=what):
            load_spec(bad)


@pytest.mark.parametrize("framework", ["megatron-core", "internlm"])
def test_instances_fold_by_the_shard_group(tmp_path: Path, framework: str):
    spec = dp4(dp_shard=2, framework=framework, name="inst")
    rc = rank_classes(load_spec(spec), rewrite=True)
    assert rc is not None and rc.replicas == ((0, 1), (2, 3))
    times = {}
    for every in (False, True):
        d = tmp_path / str(every)
        api.generate(spec, api.GenerateOptions(out=str(d), all_ranks=every))
        run = api.simulate(str(d), api.ReplayOptions(fold=not every, progress=False))
        times[every] = (run.result.perf_dict().get("fold"), run.result.iteration_time_ns)
    assert times[False][0] == "folded"
    assert times[False][1] == times[True][1]
