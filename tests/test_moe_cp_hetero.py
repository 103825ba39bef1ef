"""Issue 28 item 5: device groups that differ in EP or CP, or replicas cut differently (heterogeneous plans)
with experts or context parallelism, end in one line saying what is not supported yet; device groups of
different GPU types with one EP degree generate."""

from __future__ import annotations

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.traces import attrs as A
from xsim.traces import pb

MOE = {"name": "tiny-moe", "layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "vocab": 256, "seq_len": 16,
       "moe": {"experts": 4, "top_k": 2, "expert_ffn": 32}}  # fmt: skip
DENSE = {k: v for k, v in MOE.items() if k != "moe"}


def _g(i: int, rank: int, layers: list[int], stage: int, replica: int, gpu: str = "H100", **kw) -> dict:
    return {"id": i, "gpu": gpu, "ranks": [rank], "tp": 1, "layers": layers, "micro_batch": 1,
            "pp_stage": stage, "dp_replica": replica, **kw}  # fmt: skip


@pytest.mark.parametrize(
    ("model", "groups", "message"),
    [
        (MOE, [_g(0, 0, [1, 2], 0, 0, ep=2), _g(1, 1, [1, 2], 0, 1, ep=1)],
         "device groups give different ep (1, 2): one EP degree per deployment"),
        (DENSE, [_g(0, 0, [1, 2], 0, 0, cp=2), _g(1, 1, [1, 2], 0, 1, cp=1)],
         "device groups give different cp (1, 2): one CP degree per deployment"),
        # replica 0 in two stages, replica 1 in one: the rewriter's DP sync covers dense layers only
        (MOE, [_g(0, 0, [1, 1], 0, 0, ep=2), _g(1, 1, [2, 2], 1, 0, ep=2), _g(2, 2, [1, 2], 0, 1, ep=2)],
         "MoE with replicas cut differently (heterogeneous plans) is not supported yet"),
        (DENSE, [_g(0, 0, [1, 1], 0, 0, cp=2), _g(1, 1, [2, 2], 1, 0, cp=2), _g(2, 2, [1, 2], 0, 1, cp=2)],
         "context parallelism with replicas cut differently (heterogeneous plans) is not supported yet"),
    ],
)  # fmt: skip
def test_differing_ep_or_cp_and_heterogeneous_cuts_fail_in_one_line(model, groups, message):
    with pytest.raises(SpecError) as exc:
        load_spec({"model": model, "micro_batches": 2, "attention": "flash", "device_groups": groups})
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_a_parallel_list_with_another_ep_per_gpu_type_fails_in_one_line():
    spec = {
        "model": MOE,
        "parallel": [{"gpu": "H100", "dp": 2, "ep": 2}, {"gpu": "A100-80GB", "dp": 2, "ep": 1}],
    }
    with pytest.raises(SpecError) as exc:
        load_spec(spec)
    assert "device groups give different ep (1, 2)" in str(exc.value) and "\n" not in str(exc.value)


def test_replicas_on_different_gpus_with_one_ep_degree_generate():
    # H100 replicas 0, 1 and A100 replicas 2, 3, cut alike: EP groups {0, 1} and {2, 3}. Uniform routing of
    # 16 tokens x top-2 = 32 copies, 8 per expert: each rank sends its peer the 16 copies for the peer's two
    # experts, 16 x hidden 64 x 2 B = 2,048 B, and nothing leaves its group. Balanced, so the dispatch is one
    # ALL_TO_ALL collective over the EP group of 2 x 2,048 B.
    groups = [_g(d, d, [1, 2], 0, d, gpu="H100" if d < 2 else "A100-80GB", ep=2) for d in range(4)]
    bundle = generate(load_spec({"model": MOE, "micro_batches": 1, "device_groups": groups}), rewrite=False)
    a2a = {}
    for r in range(4):
        for n in bundle.nodes[r]:
            if n.name == "L1.moe_dispatch.fwd.mb0":
                at = {a.name: a for a in n.attr}
                members = tuple(bundle.comm_groups[at[A.PG_NAME].string_val])
                a2a[r] = (n.type, at[A.COMM_TYPE].int64_val, members, at[A.COMM_SIZE].int64_val)
    coll = (pb.COMM_COLL_NODE, pb.ALL_TO_ALL)
    assert a2a == {r: (*coll, (0, 1) if r < 2 else (2, 3), 4096) for r in range(4)}
