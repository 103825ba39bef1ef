"""Megatron-Core's DDP bucketing by model chunk and stage (round chunkbkt, docs/tracegen.md "Overlap and
sharding"): only the first pipeline stage's model chunk 0 is cut into buckets of `dp_bucket_bytes`; every
other chunk is one bucket (distributed_data_parallel.py bucket_size None for pp_rank > 0 or
disable_bucketing; training.py get_model disable_bucketing=(model_chunk_idx > 0), Megatron-LM 5d745a79cd
to core_v0.15.0). `dist_optimizer_impl: apex` (NeMo 1's Apex DistributedFusedAdam) keeps every chunk cut."""

from __future__ import annotations

import pytest
from xsim.replay import simulate
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.spec import spec_to_mapping
from xsim.traces import attrs as A
from xsim.traces.traceset import discover

from tests.test_replay_support import FakeNet

# Eight Llama-style layers (RMSNorm, SwiGLU, no biases), h 64, FFN 128, vocabulary 100 as given, PP 2, VP 2,
# DP 2, TP 1, two micro-batches of 32 tokens. Virtual stage j = 2c + k holds layers 2j + 1 and 2j + 2:
# stage 0: chunk 0 = embedding + L1 + L2, chunk 1 = L5 + L6; stage 1: chunk 0 = L3 + L4, chunk 1 = L7 + L8 +
# final norm + LM head. Per rank a layer is 41,088 parameters (4 h^2 = 16,384 attention + 3 h x FFN = 24,576
# MLP + 2 x 64 norm gains), the embedding 6,400 (100 x 64), the head 6,464 (6,400 + the final norm's 64).
# Gradients reduce in FP32 (BF16 training): 4 B each. Buckets of 100,000 B: one layer (164,352 B) fills one.
TINY8 = {"layers": 8, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 4, "vocab": 100, "seq_len": 32}


def vp2(**extra) -> dict:
    return {
        "model": TINY8,
        "parallel": {"gpu": "H100", "pp": 2, "dp": 2, "virtual_stages": 2},
        "micro_batches": 2,
        "make_vocab_size_divisible_by": 0,
        "distributed_optimizer": True,
        "overlap_grad_reduce": True,
        "dp_bucket_bytes": 100_000,
        **extra,
    }


def sizes(nodes, prefix: str) -> list[int]:
    return [A.comm_size(n) for n in nodes if n.name.startswith(prefix)]


@pytest.mark.parametrize(
    ("extra", "stage0", "stage1"),
    [
        # Megatron-Core's DDP, backward fill order (chunk 1's last backward comes first). Each bucket padded
        # to a multiple of lcm(DP 2, 128) = 128 elements, ReduceScatter = padded x 4 B:
        #   stage 0 chunk 1: L6 + L5 = 82,176 = 642 x 128 -> 328,704 B (one bucket);
        #   stage 0 chunk 0 (cut): L2 41,088 = 321 x 128 -> 164,352; L1 -> 164,352; embedding 6,400 = 50 x 128
        #   -> 25,600;
        #   stage 1 chunk 1: head 6,464 + L8 + L7 = 88,640 -> 693 x 128 = 88,704 -> 354,816 B (one bucket);
        #   stage 1 chunk 0: L4 + L3 = 82,176 -> 328,704 B (one bucket: pp_rank > 0).
        ({}, [328_704, 164_352, 164_352, 25_600], [354_816, 328_704]),
        # Apex's DistributedFusedAdam: every chunk cut at 100,000 B: stage 0: L6, L5, L2, L1 (164,352 each),
        # embedding 25,600; stage 1: head + L8 = 47,552 -> 372 x 128 = 47,616 -> 190,464 B, then L7, L4, L3.
        (
            {"dist_optimizer_impl": "apex"},
            [164_352] * 4 + [25_600],
            [190_464] + [164_352] * 3,
        ),
    ],
)
def test_bucket_list_per_chunk_by_hand(extra, stage0, stage1):
    bundle = generate(load_spec(vp2(**extra)), rewrite=False)
    assert sizes(bundle.nodes[0], "dp_grad_reducescatter") == stage0  # stage 0, DP replica 0
    assert sizes(bundle.nodes[1], "dp_grad_reducescatter") == stage1  # stage 1, DP replica 0
    # After the optimizer step each bucket's shard is all-gathered: padded / 2 x 2 B = padded bytes.
    assert sizes(bundle.nodes[1], "dp_param_allgather") == [b // 4 for b in stage1]


def test_overlap_param_gather_gathers_each_later_chunk_whole():
    # overlap_param_gather: one AllGather per bucket ahead of its first forward use (forward order: stage 1
    # runs chunk 0 first): L3 + L4 = 82,176 B, then chunk 1's 88,704 B.
    nodes = generate(load_spec(vp2(overlap_param_gather=True)), rewrite=False).nodes[1]
    gathers = [n for n in nodes if n.name.startswith("dp_param_allgather")]
    assert [(n.name, A.comm_size(n)) for n in gathers] == [
        ("dp_param_allgather.bucket1", 82_176),
        ("dp_param_allgather.bucket0", 88_704),
    ]


def test_later_chunk_reducescatter_starts_at_its_last_backward_and_delays_the_step_by_hand(tmp_path):
    # Collectives take 1 ns per byte (FakeNet), P2P 100 + size // 10 ns; compute keeps its SMs under
    # collectives (comm_sm_contention off). A bucket is ready (r_i) when its NaN check and 1/DP scaling,
    # right after its last gradient, end; on the DP stream bucket i runs from s_i = max(r_i, e_(i-1)) for
    # its size: e_i = s_i + bytes_i. Stage 0 (rank 0), at this commit's compute model:
    #   Megatron-Core: chunk 1 is one bucket, ready at r_0 = 1,004,218 (after L5's last backward): it runs
    #   to r_0 + 328,704 = 1,332,922, past L2's bucket's r_1 = 1,255,018, so L2, L1 and the embedding follow
    #   back to back: e_3 = r_0 + 328,704 + 354,304 (164,352 + 164,352 + 25,600) = 1,687,226.
    #   Apex: L6's bucket leaves at 935,818 and L5's right after it: done at 935,818 + 328,704 = 1,264,522,
    #   before L2's is ready (r_2 = 1,270,218): e_4 = r_2 + 354,304 = 1,624,522.
    # The grad-norm AllReduce waits for the later of the two stages' last ReduceScatter (stage 0's here), and
    # the rest of the step (norm, clip, Adam, copies, gathers, zero_grad) is the same on both: 189,756 ns.
    # So Megatron-Core's step is longer by 1,687,226 - 1,624,522 = 62,704 ns.
    coll = lambda s: s.size_bytes  # noqa: E731
    ends, last_rs = {}, {}
    for impl in ("megatron-core", "apex"):
        bundle = generate(load_spec(vp2(dist_optimizer_impl=impl, comm_sm_contention=False)), rewrite=False)
        out = tmp_path / impl
        bundle.write(out, "t")
        rows = list(simulate(discover(out), network=FakeNet(4, coll_ns=coll)).ops.iter_rows(named=True))
        for rank in (0, 1):
            at = {r["node_id"]: r for r in rows if r["rank"] == rank}
            prev_end, chain = 0, []
            for n in bundle.nodes[rank]:
                if n.name.startswith("dp_grad_reducescatter"):
                    (dep,) = n.data_deps
                    ready = at[dep]["end_ns"]
                    assert bundle.nodes[rank][dep].name.startswith("dp_grad_scale")  # after its last gradient
                    start = max(ready, prev_end)
                    assert (at[n.id]["start_ns"], at[n.id]["end_ns"]) == (start, start + A.comm_size(n))
                    prev_end = start + A.comm_size(n)
                    chain.append((ready, start, prev_end))
            last_rs[(impl, rank)] = chain
        ends[impl] = max(r["end_ns"] for r in rows)
    core, apex = last_rs[("megatron-core", 0)], last_rs[("apex", 0)]
    # Megatron-Core: chunk 1's bucket starts at its readiness and outlasts L2's readiness
    assert core[0][1] == core[0][0] and core[0][2] == core[0][0] + 328_704 > core[1][0]
    assert core[-1][2] == core[0][0] + 328_704 + 354_304
    # Apex: L5's bucket is done before L2's is ready; L2's leaves at its readiness
    assert apex[1][2] == apex[0][0] + 328_704 < apex[2][0] == apex[2][1]
    assert apex[-1][2] == apex[2][0] + 354_304
    # stage 0's chain ends last on both, and the same tail follows it
    assert all(last_rs[(i, 0)][-1][2] > last_rs[(i, 1)][-1][2] for i in ("megatron-core", "apex"))
    assert ends["megatron-core"] - core[-1][2] == ends["apex"] - apex[-1][2]
    assert ends["megatron-core"] - ends["apex"] == core[-1][2] - apex[-1][2]
    # this commit's compute model, for the record (the comment's numbers)
    assert (core[0][0], core[-1][2], apex[-1][2]) == (1_004_218, 1_687_226, 1_624_522)


def test_bucketing_rule_is_megatron_cores_only():
    # The legacy Megatron-LM (2021/2022: one all-reduce per gradient buffer after the backward) never
    # overlaps; torchtitan and the DeepSpeed-based profiles do not use Megatron-Core's DDP: first_chunk_buckets
    # is off and every chunk is cut as before. megatron-core-0.7 (core_v0.7.0) has the rule.
    from xsim.tracegen.frameworks import framework

    others = ("megatron-2021", "megatron-2022", "megatron-deepspeed", "torchtitan", "flagscale-2023")
    assert all(framework(n).first_chunk_buckets for n in ("megatron-core", "megatron-core-0.7"))
    assert not any(framework(n).first_chunk_buckets for n in (*others, "internlm", "gpt-neox"))


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ({"dist_optimizer_impl": "zero"}, "dist_optimizer_impl must be one of"),
        ({"dist_optimizer_impl": "apex", "distributed_optimizer": False}, "needs distributed_optimizer"),
        ({"dist_optimizer_impl": "apex", "framework": "megatron-2022"}, "megatron-core frameworks"),
    ],
)
def test_dist_optimizer_impl_checks(extra, error):
    with pytest.raises(SpecError, match=error):
        load_spec(vp2(**extra))


def test_dist_optimizer_impl_round_trips_and_defaults_to_megatron_core():
    assert "dist_optimizer_impl" not in spec_to_mapping(load_spec(vp2()))
    assert "dist_optimizer_impl" not in spec_to_mapping(load_spec(vp2(dist_optimizer_impl="megatron-core")))
    dep = load_spec(spec_to_mapping(load_spec(vp2(dist_optimizer_impl="apex"))))
    assert dep.dist_optimizer_impl == "apex"
