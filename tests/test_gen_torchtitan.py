"""Issue 22: the `torchtitan` profile, a Llama layer as eager PyTorch launches it (tracegen/frameworks.py).

Every expected number is worked out by hand in the comments (BF16: 2 bytes), not read back from the code.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from xsim.tracegen import catalog, generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.frameworks import FRAMEWORKS
from xsim.tracegen.gemm import LAUNCH_FLOOR_S, achieved_bandwidth
from xsim.tracegen.memory import layer_activation_bytes
from xsim.tracegen.models import model_from_mapping
from xsim.tracegen.ops import (
    Ctx,
    Op,
    attention_steps,
    embedding_steps,
    head_steps,
    layer_steps,
    op_sac_recompute,
    op_seconds,
    shard_of,
)
from xsim.tracegen.spec import spec_to_mapping
from xsim.traces import attrs as A
from xsim.traces import pb

# Llama-style tiny model: h 64, 4 heads (and 4 KV heads) of 16, FFN 128 (gate + up 256), 16 tokens.
LLAMA = {"name": "llama-tiny", "layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 4,
         "vocab": 100, "seq_len": 16, "activation": "swiglu", "norm": "rmsnorm", "linear_bias": False}  # fmt: skip
# Llama 3.1 8B (Meta's config: 32 layers, h 4096, FFN 14336, 32 heads, 8 KV heads, vocab 128256), seq 8192.
LLAMA3_8B = {"name": "llama3-8b", "layers": 32, "hidden": 4096, "ffn_hidden": 14336, "heads": 32, "kv_heads": 8,
             "vocab": 128256, "seq_len": 8192, "activation": "swiglu", "norm": "rmsnorm",
             "linear_bias": False}  # fmt: skip


def ctx(model: dict, fw: str, s: int) -> Ctx:
    m = model_from_mapping(model)
    f = FRAMEWORKS[fw]
    return Ctx(m, shard_of(m, 1, 0), 1, s, 2, False, "bf16", f.attention, f)


def ops(model: dict, fw: str, phase: str, s: int = 16) -> list[Op]:
    return [o for o in layer_steps(ctx(model, fw, s), phase) if isinstance(o, Op)]


def test_torchtitan_llama_layer_kernels_and_bytes_by_hand():
    # Norms on 16 x 64 = 1,024 elements. Forward: to FP32 (2 + 4), pow (8), mean (4), add_ and rsqrt (per
    # token), mul by rsqrt (8), mul by the weight in FP32 (8), type_as (4 + 2) = 36 B in 8 kernels.
    # Backward: cast to FP32 (6), weight mul's input gradient (8) and weight gradient (12 + 4, 3 kernels
    # with the per-row cast), rsqrt mul's input gradient (8) and rsqrt gradient (12 + 4, 2 kernels), rsqrt
    # (3 per-token kernels), mean (4), pow (8 + 8 + 12, 3 kernels), the sum (12), cast back (6) = 104 B,
    # 17 kernels.
    # RoPE on q and k, 16 x (4 + 4) x 16 = 2,048 elements: .float() (6), complex multiply (8), type_as (6)
    # = 20 B per element in 3 kernels a tensor, 6 in all, both directions.
    # Residual adds: read 2, write 1 (6 B x 1,024), no dropout; SwiGLU F.silu(w1) * w3 on 16 x 128 = 2,048:
    # 5 passes (10 B) in 2 kernels forward, 13 passes (26 B) in 4 backward.
    fwd = [(o.op, o.bytes, o.kernels) for o in ops(LLAMA, "torchtitan", "fwd") if not o.gemm]
    assert fwd == [
        ("attn_norm", 36 * 1024, 8), ("rope", 20 * 2048, 6), ("attn_residual", 6 * 1024, 1),
        ("mlp_norm", 36 * 1024, 8), ("mlp_act", 10 * 2048, 2), ("mlp_residual", 6 * 1024, 1),
    ]  # fmt: skip
    bwd = [(o.op, o.bytes, o.kernels) for o in ops(LLAMA, "torchtitan", "bwd") if not o.gemm]
    assert bwd == [
        ("mlp_act", 26 * 2048, 4), ("mlp_norm", 104 * 1024, 17), ("mlp_residual", 6 * 1024, 1),
        ("rope", 20 * 2048, 6), ("attn_norm", 104 * 1024, 17), ("attn_residual", 6 * 1024, 1),
    ]  # fmt: skip
    # The GEMMs and the flash attention core are those of megatron-core; attention is FlashAttention-2 (SDPA).
    names = [o.op for o in ops(LLAMA, "torchtitan", "fwd")]
    assert names == [
        "attn_norm", "qkv_proj", "rope", "attn_core", "attn_out_proj", "attn_residual",
        "mlp_norm", "mlp_up_gate", "mlp_act", "mlp_down", "mlp_residual",
    ]  # fmt: skip
    gemm = {o.op: (o.flops, o.bytes) for o in ops(LLAMA, "megatron-core", "fwd") if o.gemm}
    assert {o.op: (o.flops, o.bytes) for o in ops(LLAMA, "torchtitan", "fwd") if o.gemm} == gemm
    assert {o.kernel for o in ops(LLAMA, "torchtitan", "bwd") if o.op == "attn_core"} == {"fa2"}


def test_torchtitan_final_norm_and_no_embedding_dropout_by_hand():
    c = ctx(LLAMA, "torchtitan", 16)
    fwd = {o.op: (o.bytes, o.kernels) for o in head_steps(c, "fwd") if isinstance(o, Op)}
    bwd = {o.op: (o.bytes, o.kernels) for o in head_steps(c, "bwd") if isinstance(o, Op)}
    # The final nn.RMSNorm on 1,024 elements: 36 B in 8 kernels forward, 104 B in 17 backward (as above).
    assert fwd["final_norm"] == (36 * 1024, 8) and bwd["final_norm"] == (104 * 1024, 17)
    # torchtitan's Llama has no dropout: the embedding is the gather alone (read, write 16 x 64 x 2 B).
    assert [(o.op, o.bytes) for o in embedding_steps(c, "fwd") if isinstance(o, Op)] == [("embedding", 4096)]
    assert [o.op for o in embedding_steps(c, "bwd") if isinstance(o, Op)] == ["embedding"]


def layer_seconds(fw: str, gpu: str, skip: frozenset[str] = frozenset()) -> float:
    g = catalog.gpu(gpu)
    return sum(
        op_seconds(o, g, "calibrated")
        for ph in ("fwd", "bwd")
        for o in ops(LLAMA3_8B, fw, ph, 8192)
        if o.op not in skip
    )


def test_llama3_8b_layer_is_slower_by_the_extra_bytes_at_the_copy_bandwidth():
    # Per layer, one 8,192-token sequence, T.h = 33,554,432, T.ffn = 117,440,512, q and k T x 40 x 128 =
    # 41,943,040 elements; bytes per element torchtitan - megatron-core:
    #   forward: two norms (36 - 4) x T.h x 2 = 2,147,483,648; RoPE (20 - 4) = 671,088,640; residual add
    #   (6) vs bias-dropout-add (7), x 2 = -67,108,864; SwiGLU (10 - 6) = 469,762,048 -> 3,221,225,472;
    #   backward: norms (104 - 6) x 2 = 6,576,668,672; RoPE 671,088,640; no dropout backward (0 - 5) x 2 =
    #   -335,544,320; SwiGLU (26 - 10) = 1,879,048,192; megatron-core's q/k/v split cat under RoPE (0 - 4)
    #   x T x (32 + 2 x 8) x 128 = -201,326,592 -> 8,589,934,592. torchtitan's repeat_kv (8 KV heads to 32:
    #   q = T x 32 x 128 = 33,554,432, kv = 8,388,608 elements) copies k and v forward, 2 x 2 x (q + kv) =
    #   167,772,160 B, and sums their repeats backward, the same bytes.
    extra = 3_221_225_472 + 8_589_934_592 + 2 * 167_772_160
    # megatron-core's DDP hook adds the two RMSNorm gains into the FP32 main_grad (layer_main_grad_add: read
    # 4, read 2, write 4 = 10 B x 2 x 4,096 = 81,920 B in 2 kernels, at the launch floor: 2 x 3.8 us).
    hook, hook_s = 81_920, 2 * LAUNCH_FLOOR_S
    elem = {fw: sum(o.bytes for ph in ("fwd", "bwd") for o in ops(LLAMA3_8B, fw, ph, 8192) if not o.gemm)
            for fw in ("torchtitan", "megatron-core")}  # fmt: skip
    assert elem["torchtitan"] - elem["megatron-core"] == extra - hook
    # Every other element-wise kernel here is bandwidth-bound (far above the launch floor), the GEMMs are the
    # same and on the A100 both profiles run FlashAttention-2: the layer is slower by extra / bw - hook_s.
    a100 = achieved_bandwidth(catalog.gpu("A100-80GB"))
    diff = layer_seconds("torchtitan", "A100-80GB") - layer_seconds("megatron-core", "A100-80GB")
    assert diff == pytest.approx(extra / a100 - hook_s, rel=1e-9)
    # On the H100 the attention kernels differ (FA2 under SDPA, cuDNN under Transformer Engine); the rest
    # of the layer is slower by extra / 2,903 GB/s - 7.6 us = 4.177 ms.
    h100 = achieved_bandwidth(catalog.gpu("H100"))
    core = frozenset({"attn_core"})
    diff = layer_seconds("torchtitan", "H100", core) - layer_seconds("megatron-core", "H100", core)
    assert diff == pytest.approx(extra / h100 - hook_s, rel=1e-9) and diff == pytest.approx(
        4.1766e-3, rel=1e-4
    )


def ctx_with(model: dict, s: int, **fw: object) -> Ctx:
    m = model_from_mapping(model)
    f = replace(FRAMEWORKS["torchtitan"], **fw)  # type: ignore[arg-type]
    return Ctx(m, shard_of(m, 1, 0), 1, s, 2, False, "bf16", f.attention, f)


def test_torchtitan_2024_rmsnorm_and_fused_rmsnorm_bytes_by_hand():
    # torchtitan's own RMSNorm (norms.py at 157a12c56: `self._norm(x.float()).type_as(x) * self.weight`)
    # on 16 x 64 = 1,024 elements, BF16 (2 B). Forward, 8 kernels: to FP32 (2 + 4), pow (4 + 4), mean (4),
    # add and rsqrt (per token), mul by rsqrt (4 + 4), type_as (4 + 2), mul by the BF16 weight (2 + 2)
    # = 36 B. Backward, 16 kernels: grad * weight (2 + 2), grad * x (2 + 2 + 2) and its sum over tokens
    # (2), type_as's cast (2 + 4), rsqrt mul's input gradient (4 + 4) and rsqrt gradient (4 + 4 + 4, sum 4),
    # rsqrt backward (3 per-token kernels), mean backward (4), pow backward (8 + 8 + 12), the sum (12), cast
    # back (4 + 2) = 92 B. torch.nn.RMSNorm's (the profile's default) is 36 B / 104 B in 8 / 17 kernels.
    c = ctx_with(LLAMA, 16, rmsnorm="torchtitan-2024")
    norms = {(o.op, o.phase): (o.bytes, o.kernels) for p in ("fwd", "bwd") for o in layer_steps(c, p)
             if isinstance(o, Op) and o.op.endswith("_norm")}  # fmt: skip
    assert norms == {
        ("attn_norm", "fwd"): (36 * 1024, 8), ("mlp_norm", "fwd"): (36 * 1024, 8),
        ("attn_norm", "bwd"): (92 * 1024, 16), ("mlp_norm", "bwd"): (92 * 1024, 16),
    }  # fmt: skip
    # torchtitan's fused_rmsnorm (one Triton kernel each way): read 2, write 2 forward (4 B); read the input
    # and the gradient, write the input gradient backward (6 B).
    c = ctx_with(LLAMA, 16, rmsnorm="fused")
    norms = {(o.op, o.phase): (o.bytes, o.kernels) for p in ("fwd", "bwd") for o in layer_steps(c, p)
             if isinstance(o, Op) and o.op == "attn_norm"}  # fmt: skip
    assert norms == {("attn_norm", "fwd"): (4 * 1024, 1), ("attn_norm", "bwd"): (6 * 1024, 1)}


def test_torchtitan_loss_is_eager_cross_entropy_on_fp32_logits_by_hand():
    # 16 tokens x vocabulary 100 = 1,600 logits, BF16 logits from the LM head (2 B). torchtitan:
    # `self.output(h).float()` (2 + 4), log_softmax's three reads of a row and one write (16), nll_loss
    # (per token) = 22 B a logit in 3 kernels forward; backward nll_loss's zeroed gradient (4) and its
    # scatter (per token), log_softmax's backward (read 4 twice and the output 4, write 4: 16), the cast
    # back (4 + 2) = 26 B in 4 kernels. Megatron's fused cross-entropy: 38 B in 6, 14 B in 2.
    c = ctx(LLAMA, "torchtitan", 16)
    loss = {o.phase: (o.flops, o.bytes, o.kernels) for p in ("fwd", "bwd") for o in head_steps(c, p)
            if isinstance(o, Op) and o.op == "loss"}  # fmt: skip
    assert loss == {"fwd": (5 * 1600, 22 * 1600, 3), "bwd": (2 * 1600, 26 * 1600, 4)}
    c = ctx(LLAMA, "megatron-core", 16)
    loss = {o.phase: (o.bytes, o.kernels) for p in ("fwd", "bwd") for o in head_steps(c, p)
            if isinstance(o, Op) and o.op == "loss"}  # fmt: skip
    assert loss == {"fwd": (38 * 1600, 6), "bwd": (14 * 1600, 2)}


def test_rmsnorm_impl_is_a_torchtitan_key_and_round_trips():
    spec = {"model": LLAMA, "parallel": {"gpu": "H100", "dp": 2}, "framework": "torchtitan"}
    assert spec_to_mapping(load_spec({**spec, "rmsnorm_impl": "torchtitan-2024"}))["rmsnorm_impl"] == (
        "torchtitan-2024"
    )
    assert "rmsnorm_impl" not in spec_to_mapping(load_spec(spec))
    with pytest.raises(SpecError, match="rmsnorm_impl applies to framework: torchtitan only"):
        load_spec({**spec, "framework": "megatron-core", "rmsnorm_impl": "torch"})
    with pytest.raises(SpecError, match="rmsnorm_impl must be one of torch, torchtitan-2024, fused"):
        load_spec({**spec, "rmsnorm_impl": "apex"})


def fsdp_gathers(fw: str, **parallel: int) -> list[tuple[str, int]]:
    spec = {
        "model": LLAMA,
        "parallel": {"gpu": "H100", "dp": 2, **parallel},
        "sharding": "fsdp",
        "framework": fw,
        "schedule": "1f1b",
        "make_vocab_size_divisible_by": 0,
    }  # fmt: skip  (the toy vocabulary of 100 as given, both profiles)
    nodes = generate(load_spec(spec), rewrite=False).nodes[0]
    return [
        (n.name, A.comm_size(n))
        for n in nodes
        if A.get_str(n, A.PHASE) == "sync" and A.comm_type(n) == pb.ALL_GATHER
    ]


def test_fsdp_keeps_torchtitans_last_block_gathered_by_hand():
    # LLAMA at DP 2: a layer 4 x 64^2 + 3 x 64 x 128 + 2 x 64 = 41,088 parameters, the embedding 100 x 64
    # = 6,400, final norm + LM head 64 + 6,400 = 6,464; AllGathers of the per-rank BF16 shard (x 2 B / 2).
    # torchtitan wraps its last block with reshard_after_forward=False (parallelize_llama.py at 157a12c56):
    # L2 stays gathered from its forward to its backward, so backward gathers only L1 (megatron-core's
    # FSDP gathers L2 again, prefetched at the head).
    fwd = [("fsdp_param_allgather.emb.mb0", 6_400), ("fsdp_param_allgather.1.mb0", 41_088),
           ("fsdp_param_allgather.2.mb0", 41_088), ("fsdp_param_allgather.head.mb0", 6_464)]  # fmt: skip
    assert fsdp_gathers("torchtitan") == [*fwd, ("fsdp_param_allgather.1.mb0", 41_088)]
    assert fsdp_gathers("megatron-core") == [
        *fwd,
        *[(f"fsdp_param_allgather.{u}.mb0", 41_088) for u in (2, 1)],
    ]
    # Two micro-batches (global batch 4): FSDP2's post-backward reshards the block, so micro-batch 1's
    # forward gathers it again: 2 x 5 gathers of 6,400 + 3 x 41,088 + 6,464 = 136,128 B (megatron-core:
    # 2 x 6 of 177,216 B).
    for fw, n, b in (("torchtitan", 10, 2 * 136_128), ("megatron-core", 12, 2 * 177_216)):
        ags = fsdp_gathers(fw, global_batch=4)
        assert (len(ags), sum(s for _, s in ags)) == (n, b)


def test_selective_op_recomputes_torchtitans_unsaved_ops_by_hand():
    # torchtitan's op SAC (parallelize_llama.py at 9dec370ad): mms in forward order wq, wk, wv, wo, w1, w3,
    # w2; every second one (wk, wo, w3) and every non-listed op is recomputed, the attention and w2 are
    # saved, and the recompute stops after w2 (early stop). LLAMA, 16 tokens: attn_norm (36 B x 1,024 in
    # 8 kernels), wk = 2 x 16 x 64 x 64 = 131,072 FLOPs (4 KV heads x 16 = 64 columns) moving
    # 2 x (16 x 64 + 64 x 64) + 2 x 16 x 64 = 12,288 B, rope (20 B x 2,048), wo (131,072 FLOPs, the same
    # 12,288 B), the residual add (6 B x 1,024), mlp_norm, w3 = 2 x 16 x 64 x 128 = 262,144 FLOPs moving
    # 2 x (16 x 64 + 64 x 128) + 2 x 16 x 128 = 22,528 B, silu * mul (10 B x 2,048).
    c = ctx(LLAMA, "torchtitan", 16)
    got = [(o.op, o.flops if o.gemm else o.bytes) for o in op_sac_recompute(c)]
    assert got == [
        ("attn_norm", 36 * 1024), ("qkv_proj", 131_072), ("rope", 20 * 2048), ("attn_out_proj", 131_072),
        ("attn_residual", 6 * 1024), ("mlp_norm", 36 * 1024), ("mlp_up_gate", 262_144), ("mlp_act", 10 * 2048),
    ]  # fmt: skip
    gemm_bytes = [o.bytes for o in op_sac_recompute(c) if o.gemm]
    assert gemm_bytes == [12_288, 12_288, 22_528]
    # In the generated graph they open each layer's backward, tagged recompute.
    spec = {
        "model": LLAMA,
        "parallel": {"gpu": "H100"},
        "framework": "torchtitan",
        "recompute": "selective-op",
    }
    nodes = generate(load_spec(spec), rewrite=False).nodes[0]
    l2 = [
        (n.name, A.get_str(n, A.PHASE)) for n in nodes if n.name.startswith("L2.") and ".fwd." not in n.name
    ]
    assert [n for n, _ in l2[:9]] == [
        *(f"L2.{op}.recompute.mb0" for op, _ in got), "L2.mlp_down.bwd.mb0",
    ]  # fmt: skip
    # Memory per layer (s 16, b 1, TP 1): the block's input 2sbh and w2's output 2sbh (4 x 1,024), wq, wv and
    # the attention output (3 x 2 x 16 x 64 = 6,144), the log-sum-exp (4 B x 4 heads x 16 = 256) and w1's
    # output (2 x 16 x 128 = 4,096) = 14,592 B.
    assert layer_activation_bytes(model_from_mapping(LLAMA), 16, 1, 1, False, "selective-op", True) == 14_592


def test_selective_op_is_torchtitans():
    spec = {"model": LLAMA, "parallel": {"gpu": "H100"}, "recompute": "selective-op"}
    with pytest.raises(SpecError, match="recompute: selective-op needs framework: torchtitan"):
        load_spec(spec)
    assert spec_to_mapping(load_spec({**spec, "framework": "torchtitan"}))["recompute"] == "selective-op"


def test_the_8b_h100_example_is_torchtitans_run():
    # examples/torchtitan/llama3_8b_h100_fsdp8.yaml, written from torchtitan 9dec370ad's llama3_8b.toml and
    # benchmarks/llama3_h100_202412_torchtitan.md Table 1: eager, its own RMSNorm, op SAC, FSDP over 8 GPUs,
    # local batch 2 of 8,192 tokens, Grand Teton's 96 GiB at 2.4 TB/s.
    dep = load_spec(
        Path(__file__).resolve().parents[1] / "examples" / "torchtitan" / "llama3_8b_h100_fsdp8.yaml"
    )
    assert (dep.framework, dep.rmsnorm_impl, dep.recompute, dep.sharding) == (
        "torchtitan", "torchtitan-2024", "selective-op", "fsdp",
    )  # fmt: skip
    assert [(g.name, g.mem_bw, g.memory_bytes) for g in dep.gpus] == [("H100", 2.4e12, 96 * 2**30)]


def test_fsdp2_copy_out_and_reduce_scatter_copy_in_by_hand():
    # FSDP2's copies (Framework.fsdp2_copies; _fsdp_collectives.py foreach_all_gather_copy_out and
    # foreach_reduce_scatter_copy_in). LLAMA at DP 2 (units as in the test above, none padded: 41,088 / 2,
    # 6,400 / 2 and 6,464 / 2 are whole). Copy-out on the compute stream after each gather: read + write
    # 2 B a gathered element, 4 x 41,088 = 164,352 B a layer, 4 x 6,400 = 25,600 (embedding), 4 x 6,464 =
    # 25,856 (final norm + head). Copy-in of the BF16 gradients into the FP32 reduce-scatter input (read 2 B,
    # write 4 B): 6 x 41,088 = 246,528, 6 x 6,464 = 38,784, 6 x 6,400 = 38,400 B. The root (embedding, head)
    # and torchtitan's last block stay gathered into backward: no copy-out there; layer 1's backward gathers.
    spec = {
        "model": LLAMA,
        "parallel": {"gpu": "H100", "dp": 2},
        "sharding": "fsdp",
        "framework": "torchtitan",
        "schedule": "1f1b",
        "make_vocab_size_divisible_by": 0,
    }  # fmt: skip
    nodes = generate(load_spec(spec), rewrite=False).nodes[0]
    byid = {n.id: n for n in nodes}
    copies = [(n.name, A.get_int(n, A.TENSOR_SIZE)) for n in nodes if n.name.startswith("fsdp_") and ".mb0" in n.name
              and n.type == pb.COMP_NODE]  # fmt: skip
    assert copies == [
        ("fsdp_allgather_copy_out.emb.fwd.mb0", 25_600), ("fsdp_allgather_copy_out.1.fwd.mb0", 164_352),
        ("fsdp_allgather_copy_out.2.fwd.mb0", 164_352), ("fsdp_allgather_copy_out.head.fwd.mb0", 25_856),
        ("fsdp_reducescatter_copy_in.head.bwd.mb0", 38_784), ("fsdp_reducescatter_copy_in.2.bwd.mb0", 246_528),
        ("fsdp_allgather_copy_out.1.bwd.mb0", 164_352), ("fsdp_reducescatter_copy_in.1.bwd.mb0", 246_528),
        ("fsdp_reducescatter_copy_in.emb.bwd.mb0", 38_400),
    ]  # fmt: skip
    named = {n.name: n for n in nodes}

    def deps(name: str) -> set[str]:
        n = named[name]
        return {byid[d].name for d in [*n.data_deps, *n.ctrl_deps]}

    # the copy-out waits for its gather; the layer's first op waits for the copy-out, not the gather
    assert "fsdp_param_allgather.1.mb0" in deps("fsdp_allgather_copy_out.1.bwd.mb0")
    assert deps("L1.mlp_down.bwd.mb0") == {"L2.attn_residual.bwd.mb0", "fsdp_allgather_copy_out.1.bwd.mb0"}
    # the copy-in follows the unit's backward and the previous ReduceScatter (one stream); the ReduceScatter
    # follows the copy-in, and the next compute op waits for the copy-in
    assert deps("fsdp_reducescatter_copy_in.1.bwd.mb0") == {
        "L1.attn_residual.bwd.mb0",
        "fsdp_grad_reducescatter.2.mb0",
    }
    assert "fsdp_reducescatter_copy_in.1.bwd.mb0" in deps("fsdp_grad_reducescatter.1.mb0")
    assert "fsdp_reducescatter_copy_in.1.bwd.mb0" in deps("embedding.bwd.mb0")
    # megatron-core's FSDP path (its default layer profile) has none of them
    other = generate(load_spec({**spec, "framework": "megatron-core"}), rewrite=False).nodes[0]
    assert not [n.name for n in other if "copy_out" in n.name or "copy_in" in n.name]


def test_torchtitans_foreach_adamw_on_the_fp32_shard_by_hand():
    # torchtitan 157a12c56 build_optimizer: torch.optim.AdamW(foreach=True) on FSDP2's FP32 shards
    # (Framework.torch_adamw). LLAMA at DP 2: the rank's shard (6,400 + 2 x 41,088 + 6,464) / 2 = 47,520
    # parameters; the foreach update moves 80 B each = 3,801,600 B (megatron-core's fused Adam: 4 + 24 B =
    # 1,330,560 B, then its parameter copy 6 B = 285,120 B and the zeroing of the whole 95,040-parameter
    # gradient buffer 4 B = 380,160 B, neither of which torchtitan runs: no master copy, grads set to None).
    def opt(fw: str) -> list[tuple[str, int]]:
        spec = {
            "model": LLAMA,
            "parallel": {"gpu": "H100", "dp": 2},
            "sharding": "fsdp",
            "framework": fw,
            "schedule": "1f1b",
            "make_vocab_size_divisible_by": 0,
        }
        nodes = generate(load_spec(spec), rewrite=False).nodes[0]
        return [(n.name, A.get_int(n, A.TENSOR_SIZE)) for n in nodes if n.name.endswith(".opt")]

    assert opt("torchtitan") == [
        ("grad_norm.opt", 190_080),
        ("grad_clip.opt", 380_160),
        ("optimizer.opt", 3_801_600),
    ]
    assert opt("megatron-core")[2:] == [
        ("optimizer.opt", 1_330_560),
        ("param_copy.opt", 285_120),
        ("zero_grad.opt", 380_160),
    ]


def test_torchtitans_repeat_kv_copies_by_hand():
    # torchtitan's repeat_kv (model.py at 157a12c56) at GQA: LLAMA with 1 KV head for 4 query heads, head_dim
    # 16, 16 tokens: q = 16 x 4 x 16 = 1,024 and kv = 256 elements. Forward, k and v each copied to the query
    # heads (read 256, write 1,024 x 2 B): 2 x 2 x (1,024 + 256) = 5,120 B in 2 kernels before the attention;
    # backward, expand's gradient summed over the repeats (read 1,024, write 256) for each, the same bytes,
    # after the attention's backward. MHA (LLAMA's 4 KV heads) and megatron-core's profile: none.
    gqa = {**LLAMA, "kv_heads": 1}
    for phase, order in (("fwd", ["attn_kv_repeat", "attn_core"]), ("bwd", ["attn_core", "attn_kv_repeat"])):
        steps = attention_steps(ctx(gqa, "torchtitan", 16), phase)
        assert [o.op for o in steps] == order
        rep = next(o for o in steps if o.op == "attn_kv_repeat")
        assert (rep.bytes, rep.kernels, rep.phase) == (5_120, 2, phase)
    assert [o.op for o in attention_steps(ctx(LLAMA, "torchtitan", 16), "fwd")] == ["attn_core"]
    assert [o.op for o in attention_steps(ctx(gqa, "megatron-core", 16), "fwd")] == ["attn_core"]
    # op SAC saves SDPA's output, not its k and v inputs: the recompute copies them again
    assert "attn_kv_repeat" in [o.op for o in op_sac_recompute(ctx(gqa, "torchtitan", 16))]
