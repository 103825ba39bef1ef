"""Pipeline boundaries and gradient sizes of a plan built from a real Deployment message."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from xsim.tracegen.models import preset
from xsim.tracegen.planner import PlanError, build_plan, layer_grad_bytes, plan_groups, view_device_groups
from xsim.tracegen.spec import load_spec


def test_boundaries_of_a_resharding_pair():
    # H100 x 6 (TP 6) -> A100 x 4 (TP 4), one replica: the activation is seq x micro_batch x hidden x 2 bytes
    # = 2048 x 2 x 4096 x 2 = 33,554,432 bytes; no DP group (a single replica), so nothing to synchronize.
    dep = load_spec(
        {
            "model": "llama2-7b",
            "seq_len": 2048,
            "allow_uneven_tp": True,
            "device_groups": [
                {"id": 0, "gpu": "H100", "ranks": "0-5", "layers": [1, 16], "micro_batch": 2},
                {"id": 1, "gpu": "A100", "ranks": "6-9", "layers": [17, 32], "pp_stage": 1, "micro_batch": 2},
            ],
        }
    )
    plan = build_plan(dep)
    (b,) = plan.boundaries
    assert (b.replica, b.src_stage, b.dst_stage, b.src_ranks, b.dst_ranks) == (
        0,
        0,
        1,
        tuple(range(6)),
        (6, 7, 8, 9),
    )
    assert b.tensor_bytes == 2048 * 2 * 4096 * 2 and b.reshard
    assert plan.dp_groups == () and not plan.heterogeneous
    assert plan.pipeline_barrier_groups == (tuple(range(10)),)


def test_layer_gradient_bytes_llama2_7b():
    # Per layer 4*4096^2 + 3*4096*11008 + 2*4096 = 202,383,360 parameters (Llama 2 7B config.json); the
    # embedding (32000 x 4096) goes to layer 1, final norm + head (4096 + 32000 x 4096) to layer 32. The sum
    # is the model's 6,738,415,616 parameters, times 2 bytes.
    g = layer_grad_bytes(preset("llama2-7b"), 2)
    assert g[2] == 2 * 202_383_360
    assert g[1] == 2 * (202_383_360 + 131_072_000) and g[32] == 2 * (202_383_360 + 4096 + 131_072_000)
    assert sum(g.values()) == 2 * 6_738_415_616


def test_non_contiguous_stages_and_micro_batch_mismatch_are_errors():
    a = SimpleNamespace(id=0, ranks=[0], tp=1, layer_start=1, layer_end=4, pp_stage=0, dp_replica=0)
    b = SimpleNamespace(id=1, ranks=[1], tp=1, layer_start=6, layer_end=8, pp_stage=1, dp_replica=0)
    with pytest.raises(PlanError, match="ends at layer 4 but stage 1 .* starts at 6"):
        plan_groups(view_device_groups([a, b]), dict.fromkeys(range(1, 9), 1))
    c = SimpleNamespace(
        id=1, ranks=[1], tp=1, layer_start=5, layer_end=8, pp_stage=1, dp_replica=0, micro_batch=2
    )
    with pytest.raises(PlanError, match="micro-batch sizes 1 and 2"):
        plan_groups(view_device_groups([a, c]), dict.fromkeys(range(1, 9), 1))
    with pytest.raises(PlanError, match="no DP synchronization"):
        plan_groups(view_device_groups([a]), dict.fromkeys(range(1, 5), 1)).route(2, 0)


def test_interleaved_plan_follows_the_model_chunks():
    # llama2-7b (32 layers) over TP 1, PP 2, DP 2, 2 model chunks per stage: 32 / (2 x 2) = 8 layers a chunk,
    # stage 0 holds [1, 8] and [17, 24], stage 1 [9, 16] and [25, 32]. Model order hands over 0 -> 1 (layer
    # 8 -> 9), 1 -> 0 (16 -> 17) and 0 -> 1 again (24 -> 25): two boundaries per replica, each pair once.
    # DP groups: one per chunk (4), each the same stage of both replicas.
    dep = load_spec(
        {
            "model": "llama2-7b",
            "seq_len": 2048,
            "parallel": {"gpu": "H100", "tp": 1, "pp": 2, "dp": 2, "micro_batch": 1, "global_batch": 8},
            "virtual_stages": 2,
            "schedule": "1f1b",
        }
    )
    plan = build_plan(dep)
    pairs = [(b.replica, b.src_stage, b.dst_stage) for b in plan.boundaries]
    assert pairs == [(0, 0, 1), (0, 1, 0), (1, 0, 1), (1, 1, 0)]
    assert all(b.tensor_bytes == 2048 * 1 * 4096 * 2 and not b.reshard for b in plan.boundaries)
    assert [g.layers for g in plan.dp_groups] == [(1, 8), (9, 16), (17, 24), (25, 32)]
    stage0 = [d.id for d in dep.device_groups if d.pp_stage == 0]
    assert [tuple(g.device_groups) for g in plan.dp_groups][::2] == [tuple(stage0)] * 2


def test_a_chunk_outside_its_group_range_is_refused():
    g = SimpleNamespace(
        id=0, ranks=[0], tp=1, layer_start=1, layer_end=8, chunks=[SimpleNamespace(start=5, end=9)]
    )
    with pytest.raises(PlanError, match=r"device group 0: chunk \[5, 9\] outside its layer range \[1, 8\]"):
        view_device_groups([g], 32)
