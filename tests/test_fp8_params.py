"""FP8 parameters (spec `fp8_params`: TE fp8_model_init, NeMo's fp8_params, Megatron-Core's
--fp8-param-gather) pinned by hand: the memory fit drops the BF16 copy of the FP8 linear weights, the
distributed optimizer all-gathers them at 1 byte, and its parameter copy writes them in FP8."""

from __future__ import annotations

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.memory import deployment_memory
from xsim.tracegen.spec import spec_to_mapping
from xsim.traces import attrs as A

# Llama-style tiny model (SwiGLU, RMSNorm, no biases), 2 layers, h 64, FFN 128, 4 heads, vocabulary 100 as
# given. Per layer at TP 1: QKV 64 x 192 = 12,288, projection 4,096, gate/up 64 x 256 = 16,384, down
# 8,192: 40,960 FP8 linear weights, + 2 x 64 norm gains = 41,088 parameters. Embedding 100 x 64 = 6,400;
# final norm + LM head 64 + 6,400 = 6,464.
TINY = {"layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 4, "vocab": 100, "seq_len": 32}
FP8_PER_LAYER = 40_960


def _spec(dp: int = 1, **extra: object) -> dict:
    return {
        "model": TINY, "parallel": {"gpu": "H100", "dp": dp}, "make_vocab_size_divisible_by": 0,
        "precision": "fp8", **extra,
    }  # fmt: skip


def test_fp8_params_memory_of_the_layers_by_hand():
    # TP 1, DP 1: 2 x 41,088 + 6,400 + 6,464 = 95,040 parameters, BF16 2 B each = 190,080 B, plus TE's
    # FP8 weight and FP8 transpose of the 2 x 40,960 = 81,920 FP8 linear weights (2 B each: 163,840 B).
    # With fp8_params the FP8 weight is the parameter itself: their BF16 copy (81,920 x 2 = 163,840 B) goes,
    # 353,920 + meta -> 190,080 + meta. Gradients, optimizer state and activations do not change.
    plain = deployment_memory(load_spec(_spec()))[0]
    fp8p = deployment_memory(load_spec(_spec(fp8_params=True)))[0]
    assert plain.params == fp8p.params == 95_040
    assert plain.weights - fp8p.weights == 2 * FP8_PER_LAYER * 2 == 163_840
    assert (fp8p.gradients, fp8p.optimizer, fp8p.activations) == (
        plain.gradients, plain.optimizer, plain.activations,
    )  # fmt: skip
    # What is left: BF16 norms, embedding and head 95,040 - 81,920 = 13,120 x 2 = 26,240 B, FP8 weight and
    # transpose 163,840 B, and the scaling state (the same with and without fp8_params).
    meta = plain.weights - 95_040 * 2 - 163_840
    assert fp8p.weights == 26_240 + 163_840 + meta


@pytest.mark.parametrize("ahead", [False, True])
def test_fp8_params_all_gather_and_parameter_copy_by_hand(ahead):
    # DP 2, distributed optimizer, 200,000-byte buckets of FP32 gradients (FP8 training reduces in FP32):
    # [head 6,464 + layer 2 41,088 + layer 1 41,088 = 88,640] padded to lcm(2, 128) -> 88,704, of which the
    # two layers' 81,920 FP8 weights; [embedding 6,400], none. Each rank's shard of bucket 0 all-gathers
    # 88,704 / 2 = 44,352 parameters: 40,960 FP8 at 1 B + 3,392 BF16 at 2 B = 47,744 B (88,704 B without);
    # bucket 1: 3,200 x 2 = 6,400 B either way. The same with overlap_param_gather.
    extra = {"distributed_optimizer": True, "overlap_grad_reduce": True, "dp_bucket_bytes": 200_000}
    if ahead:
        extra["overlap_param_gather"] = True
    sizes = {}
    ops = {}
    for on in (False, True):
        nodes = generate(load_spec(_spec(dp=2, fp8_params=on, **extra)), rewrite=False).nodes[0]
        sizes[on] = sorted((n.name, A.comm_size(n)) for n in nodes if n.name.startswith("dp_param_allgather"))
        ops[on] = {n.name: A.tensor_size(n) for n in nodes if A.get_str(n, A.PHASE) == "opt"}
    assert sizes[False] == [("dp_param_allgather.bucket0", 88_704), ("dp_param_allgather.bucket1", 6_400)]
    assert sizes[True] == [("dp_param_allgather.bucket0", 47_744), ("dp_param_allgather.bucket1", 6_400)]
    # Parameter copy over the rank's shard 44,352 + 3,200 = 47,552: FP32 read + BF16 write 6 B each =
    # 285,312 B; with fp8_params Megatron-Core takes its 40,960 FP8 weights FP32 -> BF16 -> FP8 (4 + 2 +
    # 2 + 1 = 9 B, 3 more each): 285,312 + 122,880 = 408,192.
    assert ops[False]["param_copy.opt"] == 285_312
    assert ops[True]["param_copy.opt"] == 408_192
    # TE's per-iteration weight cast of all 81,920 FP8 weights: read BF16, write FP8 weight and transpose
    # (2 + 2 B) = 327,680 B; with fp8_params the weights arrive in FP8: the transpose alone (1 + 1 B).
    assert ops[False]["fp8_weight_cast.opt"] == 327_680
    assert "fp8_weight_cast.opt" not in ops[True]
    assert ops[True]["fp8_weight_transpose.opt"] == 163_840


def test_fp8_params_round_trips_and_is_checked():
    dep = load_spec(_spec(fp8_params=True))
    assert dep.fp8_params and spec_to_mapping(dep)["fp8_params"] is True
    assert "fp8_params" not in spec_to_mapping(load_spec(_spec()))
    for bad, what in [
        ({**_spec(fp8_params=True), "precision": "bf16"}, "needs precision: fp8"),
        (_spec(fp8_params=True, framework="torchtitan"), "Transformer Engine"),
        (_spec(fp8_params="yes"), "must be true or false"),
    ]:
        with pytest.raises(SpecError, match=what):
            load_spec(bad)


def test_fp8_params_under_current_scaling_by_hand():
    # The DP 2 case above with fp8_recipe: current (TE 2.9 _cast_master_weights_to_fp8_current_scaling):
    # each of the rank's 40,960 FP8 weights is taken FP32 -> BF16 (4 + 2), its amax read (2) and cast with
    # that scale (2 + 1) = 11 B, 2 more than under delayed scaling: 408,192 + 81,920 = 490,112 B, in 3
    # kernels. Without fp8_params TE casts all 81,920 weights with their own amax pass (read 2, amax read 2,
    # write FP8 and transpose 1 + 1 = 6 B): 491,520 B; with them the transpose alone, 163,840 B, as above.
    extra = {"distributed_optimizer": True, "overlap_grad_reduce": True, "dp_bucket_bytes": 200_000}
    ops = {}
    for on in (False, True):
        nodes = generate(load_spec(_spec(dp=2, fp8_params=on, fp8_recipe="current", **extra)), rewrite=False)
        ops[on] = {n.name: n for n in nodes.nodes[0] if A.get_str(n, A.PHASE) == "opt"}
    assert A.tensor_size(ops[False]["param_copy.opt"]) == 285_312
    assert A.tensor_size(ops[True]["param_copy.opt"]) == 490_112
    assert A.tensor_size(ops[False]["fp8_weight_cast.opt"]) == 491_520
    assert "fp8_weight_cast.opt" not in ops[True]
    assert A.tensor_size(ops[True]["fp8_weight_transpose.opt"]) == 163_840
    assert spec_to_mapping(load_spec(_spec(fp8_params=True, fp8_recipe="current")))["fp8_params"] is True


@pytest.mark.parametrize("ahead", [False, True])
def test_fp8_params_of_a_moe_model_split_over_the_dense_and_expert_buckets_by_hand(ahead):
    # TINY with 4 experts of FFN 32 (SwiGLU), top-2, DP 4, EP 2 (expert-DP 2), one dense bucket (10^9 B).
    # A layer on a rank: attention QKV 12,288 + projection 4,096 = 16,384 FP8 weights, 2 norms 128, router
    # 64 x 4 = 256 (BF16) in the dense bucket; 2 local experts x 3 x 64 x 32 = 12,288 FP8 weights in the
    # expert bucket. Dense bucket: head 6,464 + 2 x 16,768 + embedding 6,400 = 46,400 padded to lcm(4, 128)
    # -> 46,464; a rank's shard 11,616 of which 2 x 16,384 / 4 = 8,192 FP8: 8,192 x 1 + 3,424 x 2 = 15,040 B
    # (23,232 B without). Expert bucket 24,576 (a multiple of lcm(2, 128)), shard 12,288, all FP8: 12,288 B
    # (24,576 without). Parameter copy over 11,616 + 12,288 = 23,904 parameters x 6 B = 143,424 B, + 3 B for
    # each of the 8,192 + 12,288 = 20,480 FP8 ones = 204,864 B; TE's per-iteration transpose of all
    # 2 x (16,384 + 12,288) = 57,344 FP8 weights, 1 + 1 B: 114,688 B.
    model = {**TINY, "moe": {"experts": 4, "top_k": 2, "expert_ffn": 32}}
    extra = {"distributed_optimizer": True, "overlap_grad_reduce": True, "dp_bucket_bytes": 10**9}
    if ahead:
        extra["overlap_param_gather"] = True
    sizes, ops = {}, {}
    for on in (False, True):
        spec = {
            **_spec(fp8_params=on, **extra),
            "model": model,
            "parallel": {"gpu": "H100", "dp": 4, "ep": 2},
        }
        nodes = generate(load_spec(spec), rewrite=False).nodes[0]
        sizes[on] = sorted((n.name, A.comm_size(n)) for n in nodes if "param_allgather" in n.name)
        ops[on] = {n.name: A.tensor_size(n) for n in nodes if A.get_str(n, A.PHASE) == "opt"}
    assert sizes[False] == [
        ("dp_param_allgather.bucket0", 23_232),
        ("expert_dp_param_allgather.bucket0", 24_576),
    ]
    assert sizes[True] == [
        ("dp_param_allgather.bucket0", 15_040),
        ("expert_dp_param_allgather.bucket0", 12_288),
    ]
    assert (ops[False]["param_copy.opt"], ops[True]["param_copy.opt"]) == (143_424, 204_864)
    assert ops[True]["fp8_weight_transpose.opt"] == 2 * (16_384 + 12_288) * 2 == 114_688
    # Not built: the first chunk's count of Megatron-Core's chained optimizer (one error line)
    bad = {**_spec(fp8_params=True), "model": {**model, "layers": 4}, "distributed_optimizer": True,
           "overlap_grad_reduce": True, "overlap_param_gather": True, "overlap_param_gather_with_optimizer_step": True,
           "parallel": {"gpu": "H100", "pp": 2, "dp": 2, "ep": 2, "virtual_stages": 2, "micro_batch": 1,
                        "global_batch": 4}}  # fmt: skip
    with pytest.raises(SpecError, match="overlap_param_gather_with_optimizer_step"):
        load_spec(bad)
