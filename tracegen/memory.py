"""GPU memory per rank of a deployment: weights, gradients, optimizer state, activations and an allowance.

Sources:
- Mixed-precision Adam: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models", section 3.1: 2 (fp16/bf16 weights) + 2 (gradients) + 12 (fp32 master weights, momentum,
  variance) = 16 bytes per parameter. The distributed optimizer (Megatron's, ZeRO stage 1) shards the 12
  bytes over the data-parallel ranks holding the same parameters. Megatron keeps BF16 runs' gradients in
  FP32 (`grad_reduce_dtype`: its docs/user-guide/features/dist_optimizer.md gives 18 bytes per parameter for
  "bf16 parameters, fp32 gradients", 6 + 12/d with the distributed optimizer). ZeRO stage 3 (FSDP,
  section 5.3 of the ZeRO paper) shards weights, gradients and optimizer state alike, and holds the gathered
  parameters of the unit in use and of the one prefetched, plus one unit's unsharded gradient.
- Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
  (arXiv:2205.05198), section 4: per layer s*b*h*(34 + 5*a*s/h) bytes without parallelism; with tensor
  parallelism t, s*b*h*(10 + 24/t + 5*a*s/(h*t)); with sequence parallelism too, s*b*h/t*(34 + 5*a*s/h);
  selective recomputation drops the 5*a*s/h term (s*b*h*(10 + 24/t), or 34*s*b*h/t with SP; Megatron-Core's
  recompute modules free the tensors recompute_frees names, by layer_activation_terms' components); full
  recomputation keeps only the layer input, 2*s*b*h (2*s*b*h/t with SP). Section 4.2.3: pipeline stage k
  (0-based) of p under 1F1B holds up to p - k micro-batches; GPipe holds all m; Megatron's interleaved
  schedule (v virtual stages) holds (p - k - 1)*2 + (v - 1)*p + 1 model chunks of L/(p*v) layers, which is
  L*(1 + (p - 1)/(p*v)) layers on the first stage. Section 4.3: input-embedding dropout mask s*b*h*p/t on
  the first stage, 4*s*b*h/t*(1 + v/h) for the output norm, projection and cross-entropy on the last.

`layer_activation_bytes` is the paper's per-component accounting for any ModelArch (GQA shrinks K and V; a
SwiGLU MLP stores its gate, up and product tensors); for a GPT layer (4h GELU MLP, kv_heads = heads) it is
exactly `korthikanti_layer_bytes`. Dropout masks (section 4.1: the hidden dropouts after attention and after
the MLP, sbh each; the attention-probability dropout's mask as^2b and its output 2as^2b; the input
embedding's sbh, section 4.3) are stored only where the run's rate is above 0: F.dropout with p = 0 returns
its input, no mask (PyTorch aten/src/ATen/native/Dropout.cpp `dropout`, as tracegen.ops cites; compiled, as
Megatron-Core's jit_fuser compiles bias-dropout-add on torch >= 2.2 (megatron/core/jit.py at d98e8a64dd),
torch/_decomp/decompositions.py `dropout` calls native_dropout only when `train and p != 0`), so a run with
`dropout: false` keeps 32sbh of the 34 and one with `attention_dropout: 0` 2as^2b of the 5as^2b (the
probabilities the softmax backward and the attention-over-V GEMM both read). FlashAttention (the generator's fused `attn_core`) never stores the
a*s*s score, softmax and dropout tensors; it keeps one fp32 log-sum-exp per (sequence, head, query).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from fractions import Fraction
from typing import Any

from xsim.tracegen import deployment_pb2 as dpb
from xsim.tracegen.catalog import GIB
from xsim.tracegen.choices import DEFAULT_RECOMPUTE_MODULES
from xsim.tracegen.errors import XsimError
from xsim.tracegen.memory_summary import peak_summary  # noqa: F401 - its old home
from xsim.tracegen.models import ModelArch
from xsim.tracegen.moe_ops import (
    fp8_linear_params_ep,
    group_shard,
    layer_split,
    moe_activation_model,
    rank_params_ep,
)
from xsim.tracegen.ops import (
    TE_AMAX_HISTORY,
    TE_MODULES_PER_LAYER,
    TE_SCALES_PER_MODULE,
    embedding_rank_params,
    head_rank_params,
    rank_params,
)
from xsim.tracegen.spec import gpu_specs, grad_reduce_bytes, model_arch, recompute_units, replicas
from xsim.traces.io import MEMORY_FILE
from xsim.traces.wording import plural

RECOMPUTE = ("none", "selective", "full", "selective-op")
# ZeRO section 3.1: mixed-precision Adam keeps an fp32 copy of the weights plus fp32 momentum and variance.
ADAM_STATE_BYTES_PER_PARAM = 12
# FlashAttention (Dao et al. 2022, Algorithm 2) saves the softmax log-sum-exp in fp32 for the backward pass.
LSE_BYTES = 4
# Transformer Engine FP8 training (delayed or current scaling; TE 1.8, transformer_engine/pytorch/module/):
# - TE_FP8_SAVED: a linear saves its GEMM input for the weight gradient in FP8, 1 byte per element, not
#   in BF16 (linear.py _Linear.forward: `if fp8 ...: saved_inputmat = inputmat` or its FP8 transpose
#   `inputmat_t`, else `inputmat_no_fp8`; layernorm_linear.py keeps ln_out, written in FP8 by the norm,
#   and the norm's BF16 input, mu and rsigma). Everything else stays as without FP8 (layer_activation_bytes).
# - TE_FP8_WEIGHT_COPIES: each FP8 linear's weight cast to FP8 and its FP8 transpose (forward reads W, the
#   input-gradient GEMM W^T: Hopper's FP8 GEMM takes TN operands only), cached across the micro-batches of
#   an iteration (get_fp8_workspace with cache_name "weight" whenever is_first_microbatch is not None;
#   Megatron-Core's TE wrappers pass it unless disable_parameter_transpose_cache), 1 byte each per weight,
#   kept beside the BF16 parameter. Under FP8 parameters (spec fp8_params: TE fp8_model_init, NeMo's
#   fp8_params, Megatron-Core's --fp8-param-gather) the parameter is itself a Float8Tensor (1 byte, no
#   BF16 copy; TE v1.6 float8_tensor.py) whose transpose TE caches the same way (v1.6 linear.py
#   _Linear.backward, primary_weights_in_fp8: weight.transpose_2d(cache=ctx.is_first_microbatch is not
#   None), kept in Float8Tensor._transpose): the same 2 bytes per weight, less the BF16 ones.
# - TE_FP8_META: per linear module, forward 3 and backward 2 FP8 tensors (ops.TE_SCALES_PER_MODULE), each
#   with an FP32 amax history of ops.TE_AMAX_HISTORY entries (delayed scaling; current scaling keeps none)
#   and an FP32 scale and scale_inv (fp8.py / module/base.py init_fp8_meta_tensors).
TE_FP8_SAVED = 1
TE_FP8_WEIGHT_COPIES = 2
TE_FP8_META_FP32 = 2  # scale and scale_inv per FP8 tensor
# LayerNorm saves its input and, per token, the mean and reciprocal standard deviation in FP32 for the
# backward (torch.native_layer_norm's save_mean / save_rstd; apex/TE fused LayerNorm the same).
NORM_STAT_BYTES = 4
# The loss's peak bytes per local logit (s*b*v/t of them) on the last stage, with every layer's activations
# still held, by Framework.loss (the code tracegen.ops.XENT reads): (FP32 bytes, multiples of dtype_bytes).
# Korthikanti section 4.3 counts one FP32 copy, 4*s*b*v/t; the implementations hold:
# - "megatron": the FP32 copy the softmax is computed in place in and saved (megatron/core/tensor_parallel/
#   cross_entropy.py calculate_logits_max `.float()`, then sub_, exp(out=), div_; older Megatron casts with
#   `output.float()` before the call), beside the 16-bit logits in forward (the Function's input) and beside
#   the 16-bit gradient in backward (the FP32 input gradient, computed in place in the saved buffer, cast to
#   the input's dtype by autograd's validate_outputs): 4 + dtype.
# - "eager": F.cross_entropy on the FP32 cast (torchtitan 9dec370ad train.py loss_fn) is log_softmax, which
#   saves its FP32 output, then nll_loss; in backward nll_loss_backward's dense FP32 gradient (zeroed, then
#   scattered), the saved output and log_softmax's FP32 input gradient are live at once: 12 (forward: dtype +
#   4 + 4, less).
# - "fused" (apex xentropy with inplace_backward) and "te" (TE's Triton cross-entropy): the 16-bit logits are
#   saved and receive their gradient in place; nothing FP32 of vocabulary size: dtype.
LOSS_PEAK_BYTES = {"megatron": (4, 1), "eager": (12, 0), "fused": (0, 1), "te": (0, 1)}
# Allowance for what is not a tensor of the model: the CUDA context, cuBLAS workspaces and NCCL buffers
# (together about 1 GiB per process on A100/H100 with PyTorch; NVIDIA NCCL docs put the default buffers at
# NCCL_BUFFSIZE = 4 MiB per channel and peer): an assumption, not a measurement (MemoryOptions.workspace_bytes).
WORKSPACE_BYTES = 1 * GIB
# The caching allocator's reserve beyond the tensors, as a fraction of the rank's ACTIVATION bytes only:
# Megatron-LM's own estimator, d98e8a64dd megatron/training/theoretical_memory_usage.py
# compute_activation_memory_without_sp, multiplies the activations by `overhead_factor = 1.05` ("buffer for
# optimizer and miscellaneous temporaries (5% overhead)"); its sequence-parallel path adds none. Weights,
# gradients and optimizer state are allocated once (Megatron-Core DDP's contiguous param/grad buffers, the
# optimizer's shards at its first step) and do not churn through the allocator; activations are allocated
# and freed every micro-batch. The 5% is Megatron's margin, not a measurement; the spec key
# `memory_fragmentation` (field 97) replaces it. (Until round memfit: 10% of everything, unsourced.)
FRAGMENTATION = 0.05


class OutOfMemory(XsimError):
    """A rank of a deployment needs more GPU memory than its GPU has."""


@dataclass(frozen=True)
class MemoryOptions:
    """Training settings that decide the memory of a rank (explicit, so callers need no Deployment)."""

    dtype_bytes: int = 2  # weights, gradients and activations (BF16)
    schedule: str = "gpipe"  # "gpipe" | "1f1b" (virtual_stages > 1 means Megatron's interleaved 1F1B)
    micro_batches: int = 1
    virtual_stages: int = 1
    # interleaved with M = P: every pass of every stage warm-up (Framework.pp_all_warmup_at_m_eq_p)
    all_warmup_at_m_eq_p: bool = False
    sequence_parallel: bool = False
    recompute: str = "none"  # "none" | "selective" | "full"
    recompute_layers: int = 1  # with "full": layers per recompute unit (Megatron's uniform method); 0 = 1
    recompute_method: str = (
        "uniform"  # with "full": "uniform" | "block" (the first recompute_layers per chunk) | "every"
    )
    # with "selective": Megatron-Core's recompute modules (tracegen.choices.RECOMPUTE_MODULES; recompute_frees)
    recompute_modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES
    distributed_optimizer: bool = False
    grad_bytes: int = 0  # width of the gradient buffer (grad_reduce_dtype: 4 for FP32); 0 = dtype_bytes
    # Transformer Engine FP8 linears ("delayed" | "current" scaling; "" = none): FP8 saved inputs, weight
    # copies and scaling metadata (TE_FP8_SAVED, TE_FP8_WEIGHT_COPIES, TE_FP8_META_FP32).
    te_fp8: str = ""
    # FP8 parameters (spec fp8_params; TE fp8_model_init): the FP8 linears' weights exist in FP8 only, their
    # BF16 copy is gone (TE_FP8_WEIGHT_COPIES then counts the FP8 parameter itself and its transpose).
    fp8_params: bool = False
    sharding: str = "none"  # "none" | "zero3" | "fsdp": weights, gradients and optimizer state over DP
    dp_shard: int = 0  # hybrid sharding: the shard group's size (0: all of DP)
    # sharding "megatron-fsdp": its data_parallel_sharding_strategy (resolved) and fsdp_double_buffer
    mfsdp_strategy: str = ""
    fsdp_double_buffer: bool = False
    attention: str = "flash"  # "flash" (the generator's fused attn_core) | "unfused" (stores a*s*s tensors)
    # Dropout rates above 0 (the resolved Framework.dropout / .attention_dropout): their masks are stored.
    hidden_dropout: bool = True
    attention_dropout: bool = True
    loss: str = "megatron"  # Framework.loss: the cross-entropy's peak (LOSS_PEAK_BYTES)
    workspace_bytes: int = WORKSPACE_BYTES
    fragmentation: float = FRAGMENTATION


@dataclass(frozen=True)
class RankMemory:
    """Bytes one rank needs at its peak, by kind, against its GPU's capacity."""

    rank: int
    device_group: int
    gpu: str
    stage: int
    layers: int
    params: int
    weights: int
    gradients: int
    optimizer: int
    activations: int
    allowance: int
    capacity: int

    @property
    def total(self) -> int:
        """Peak bytes: everything above together."""
        return self.weights + self.gradients + self.optimizer + self.activations + self.allowance

    @property
    def headroom(self) -> int:
        """Capacity left at the peak (negative: does not fit)."""
        return self.capacity - self.total

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict (memory.json rows)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}  # asdict without its deep copies
        d["total"], d["headroom"] = self.total, self.headroom
        return d


def korthikanti_layer_bytes(
    s: int,
    b: int,
    h: int,
    a: int,
    t: int = 1,
    sp: bool = False,
    recompute: str = "none",
    hidden_dropout: bool = True,
    attention_dropout: bool = True,
) -> Fraction:
    """Korthikanti et al. 2022's activation bytes of one GPT layer (section 4, Table 2), exactly; without
    a dropout (rate 0) its masks go: 2sbh of the 10sbh not split by TP, 3as^2b of the 5as^2b (section 4.1)."""
    sbh = Fraction(s * b * h)
    if recompute == "full":
        return 2 * sbh / (t if sp else 1)
    attn = 0 if recompute == "selective" else Fraction((5 if attention_dropout else 2) * a * s, h)
    rep = 10 if hidden_dropout else 8
    if sp:
        return sbh / t * (rep + 24 + attn)
    return sbh * (rep + Fraction(24, t) + attn / t)


def layer_activation_terms(
    m: ModelArch,
    s: int,
    b: int,
    t: int = 1,
    sp: bool = False,
    flash: bool = False,
    fp8: bool = False,
    hidden_dropout: bool = True,
    attention_dropout: bool = True,
) -> dict[str, Fraction]:
    """Activation bytes one TP rank stores for one layer of `m` without recomputation, by the tensor that
    holds them (Korthikanti's components, any MLP and GQA; the names recompute_frees uses). `fp8`: Transformer
    Engine FP8 linears, which save their GEMM inputs in FP8 (TE_FP8_SAVED); `hidden_dropout` /
    `attention_dropout` False: that rate is 0 and its masks are not stored."""
    h, a, f = m.hidden, m.heads, m.ffn_hidden
    sbh = Fraction(s * b * h)
    kv = Fraction(m.kv_heads, a)
    rep = Fraction(1, t) if sp else Fraction(1)  # what TP does not split is split by SP
    # Not split by TP (unless SP): each norm's input (2sbh each), the QKV and MLP inputs (the norms'
    # outputs, 2sbh each) and the two dropout masks after attention and MLP (sbh each; none at a
    # hidden-dropout rate of 0). Under TE FP8 the QKV and MLP inputs (the LayerNormLinears' ln_out) are kept
    # in FP8: sbh each.
    terms = {
        "attn_norm_in": 2 * sbh * rep,
        "qkv_in": (1 if fp8 else 2) * sbh * rep,
        "mlp_norm_in": 2 * sbh * rep,
        "mlp_in": (1 if fp8 else 2) * sbh * rep,
        "dropout_masks": (2 if hidden_dropout else 0) * sbh * rep,
    }
    # Split by TP: Q and K (2sbh + 2sbh*kv), V (2sbh*kv), the output projection's input (2sbh), and the MLP:
    # GELU stores its input and fc2's input (4sbf); SwiGLU its gate and up outputs and their product (6sbf).
    # Under TE FP8, fc2's input is kept in FP8 (sbf: GELU 3sbf, SwiGLU 5sbf), and the output projection
    # saves an FP8 copy of its input (sbq) beside the BF16 attention output the attention core keeps.
    # (Q and the output projection's input are heads x head_dim wide: hidden unless kv_channels sets it.)
    sbq = Fraction(s * b * a * m.head_dim) if m.mla is None else sbh
    terms["qkv"] = (2 * sbq + 4 * sbq * kv) / t
    terms["proj_in"] = (3 if fp8 else 2) * sbq / t
    if m.qk_layernorm:
        # The q and k norms (ModelArch.qk_layernorm) save their BF16 inputs, the QKV projection's q and k
        # (2sbq + 2sbq kv: attention keeps the normalized, rotated q and k counted above), and per head and
        # token the FP32 rstd (and LayerNorm's mean), NORM_STAT_BYTES each; TP-split like q and k. Megatron's
        # selective recompute repeats only the attention core, so they stay (full recompute: the layer
        # input only).
        stats = NORM_STAT_BYTES * (2 if m.norm == "layernorm" else 1)
        terms["qk_norm"] = (2 * sbq * (1 + kv) + stats * s * b * (a + m.kv_heads)) / t
    # The MLP's f-wide tensors: the activation's saved input (SwiGLU: gate and up, 4sbf; GELU 2sbf) and
    # fc2's input (2sbf, FP8 sbf). A MoE layer's stand-in (moe_ops.moe_activation_model: f = top_k x
    # expert_ffn + the shared experts' width) splits them into the routed experts' and the shared ones'.
    shared = min(m.moe.shared_width, f) if m.moe is not None else 0
    for part, width in (("mlp", f - shared), ("shared", shared)):
        sbf = Fraction(s * b * width)
        terms[f"{part}_act_in"] = (4 if m.gated else 2) * sbf / t
        terms[f"{part}_fc2_in"] = (1 if fp8 else 2) * sbf / t
    if flash:
        terms["attn_core"] = Fraction(LSE_BYTES * a * s * b, t)  # log-sum-exp per (sequence, head, query)
    else:
        # Softmax output 2as^2b; at an attention-dropout rate above 0 also its mask as^2b and output
        # 2as^2b (at 0 the attention-over-V GEMM saves the softmax output itself).
        terms["attn_core"] = Fraction((5 if attention_dropout else 2) * a * s * s * b, t)
    return terms


# What each selective recompute module (tracegen.choices.RECOMPUTE_MODULES, tracegen.ops.with_recompute) no
# longer stores, by layer_activation_terms' names, at Megatron-Core core_v0.14.0 with the TE layer spec:
# - core_attn: the attention core's own tensors (the log-sum-exp, or unfused attention's s^2 tensors); the
#   checkpoint's inputs q, k, v are stored anyway (Korthikanti et al. 2022, section 4.2).
# - layernorm: the discarded norm output where the norm is a module of its own: a MoE layer's pre-MLP norm
#   (the MoE block's input, mlp_in) and an MLA layer's input norm (the down projections' input, qkv_in);
#   its input, saved by the checkpoint in place of the norm, stays.
# - mlp: everything inside TE's fused MLP but its input (the checkpoint's): the norm's output (mlp_in) and
#   the f-wide tensors (a MoE model's dense layer: the stand-in's, both parts).
# - moe: the MoE block's f-wide tensors, routed and shared; its input (the pre-MLP norm's output) stays.
# - shared_experts: the shared experts' f-wide tensors; moe_act: the routed experts' activation output,
#   fc2's input (discarded; the activation's saved inputs stay).
# - mla_up_proj: the discarded query, key and value (qkv; their latents, the checkpoint's inputs, stay).
# The backward rematerializes one layer's freed tensors at a time: those of its MLP side, then those of its
# attention side (`rematerialized_bytes`); the attention core's (core_attn) are left out as they always were.
ATTENTION_SIDE = frozenset({"attn_core", "qkv", "qkv_in"})


def recompute_frees(modules: tuple[str, ...], moe_layer: bool, mla: bool) -> frozenset[str]:
    """The layer_activation_terms a layer no longer stores under the selective recompute `modules` (a MoE
    layer's when `moe_layer`, an MLA layer's when `mla`)."""
    f: set[str] = set()
    mlp_parts = {"mlp_act_in", "mlp_fc2_in", "shared_act_in", "shared_fc2_in"}
    for mod in modules:
        if mod == "core_attn":
            f.add("attn_core")
        elif mod == "layernorm":
            f |= ({"mlp_in"} if moe_layer else set()) | ({"qkv_in"} if mla else set())
        elif mod == "mlp" and not moe_layer:
            f |= mlp_parts | {"mlp_in"}
        elif mod == "moe" and moe_layer:
            f |= mlp_parts
        elif mod == "shared_experts" and moe_layer:
            f |= {"shared_act_in", "shared_fc2_in"}
        elif mod == "moe_act" and moe_layer:
            f.add("mlp_fc2_in")
        elif mod == "mla_up_proj" and mla:
            f.add("qkv")
    return frozenset(f)


def layer_activation_bytes(
    m: ModelArch,
    s: int,
    b: int,
    t: int = 1,
    sp: bool = False,
    recompute: str = "none",
    flash: bool = False,
    fp8: bool = False,
    hidden_dropout: bool = True,
    attention_dropout: bool = True,
    modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES,
    moe_layer: bool = False,
) -> Fraction:
    """Activation bytes one TP rank stores for one layer of `m` (Korthikanti's accounting, any MLP and GQA);
    `fp8`: Transformer Engine FP8 linears, which save their GEMM inputs in FP8 (TE_FP8_SAVED);
    `hidden_dropout` / `attention_dropout` False: that rate is 0 and its masks are not stored; under
    `recompute: selective` the recompute `modules` of a MoE layer (`moe_layer`) or a dense one."""
    h, a, f = m.hidden, m.heads, m.ffn_hidden
    sbh = Fraction(s * b * h)
    if recompute == "full":
        return 2 * sbh / (t if sp else 1)
    kv = Fraction(m.kv_heads, a)
    if recompute == "selective-op":
        # torchtitan's op-level SAC (tracegen.ops.op_sac_recompute): the checkpointed block's input (2sbh)
        # and the outputs its policy saves: wq (2sbq), wv (2sbq kv), the attention output (2sbq) and its
        # log-sum-exp, w1 (2sbf, its gate half under SwiGLU) and w2 (2sbh).
        sbq = Fraction(s * b * a * m.head_dim)
        sharded = 2 * sbq + 2 * sbq * kv + 2 * sbq + LSE_BYTES * a * s * b + 2 * s * b * f
        return (4 * sbh + sharded) / t if sp else 4 * sbh + sharded / t
    terms = layer_activation_terms(m, s, b, t, sp, flash, fp8, hidden_dropout, attention_dropout)
    freed = (
        recompute_frees(modules, moe_layer, m.mla is not None) if recompute == "selective" else frozenset()
    )
    return sum((v for k, v in terms.items() if k not in freed), Fraction(0))


def rematerialized_bytes(
    m: ModelArch,
    s: int,
    b: int,
    t: int,
    sp: bool,
    flash: bool,
    fp8: bool,
    modules: tuple[str, ...],
    moe_layer: bool,
    **drop: bool,
) -> Fraction:
    """The most a layer's backward holds again of what its selective recompute `modules` freed: its MLP
    side's, then its attention side's, one after the other (recompute_frees; core_attn's left out)."""
    terms = layer_activation_terms(m, s, b, t, sp, flash, fp8, **drop)
    freed = recompute_frees(modules, moe_layer, m.mla is not None) - {"attn_core"}
    attn = sum((terms[k] for k in freed & ATTENTION_SIDE), Fraction(0))
    return max(attn, sum((terms[k] for k in freed - ATTENTION_SIDE), Fraction(0)))


def in_flight(
    schedule: str,
    micro_batches: int,
    stages: int,
    stage: int,
    virtual: int = 1,
    all_warmup_at_m_eq_p: bool = False,
) -> Fraction:
    """Micro-batches (of the stage's whole layer range) whose activations stage `stage` holds at its peak
    (`all_warmup_at_m_eq_p`: Framework.pp_all_warmup_at_m_eq_p, every stage holds all M at M = P)."""
    if virtual > 1 and all_warmup_at_m_eq_p and micro_batches == stages:
        return Fraction(micro_batches)
    if virtual > 1:
        # Megatron interleaved 1F1B: warm-up (p - k - 1)*2 + (v - 1)*p chunks, +1 in steady state, each
        # chunk holding 1/v of the stage's layers.
        chunks = min((stages - stage - 1) * 2 + (virtual - 1) * stages + 1, micro_batches * virtual)
        return Fraction(chunks, virtual)
    if schedule == "1f1b":
        return Fraction(min(stages - stage, micro_batches))
    return Fraction(micro_batches)


def optimizer_bytes(params: int, dp: int, distributed: bool) -> int:
    """fp32 master weights and two moments (ZeRO's 12 B/param), sharded over `dp` with the distributed optimizer."""
    total = ADAM_STATE_BYTES_PER_PARAM * params
    return -(-total // dp) if distributed else total


def zero3_bytes(
    m: ModelArch,
    sh: Any,
    params: int,
    dp: int,
    b: int,
    grad_bytes: int,
    first: bool,
    last: bool,
    layer_unit: int = 0,
) -> tuple[int, int, int]:
    """(weights, gradients, optimizer state) of a ZeRO-3 / FSDP rank: each a 1/DP shard of its parameters
    (ceil, as FSDP pads), plus the gathered units in flight: the unit in use and the prefetched one in the
    weights' dtype, and one unit's unsharded gradient before its ReduceScatter. `layer_unit`: the largest
    layer's parameters where layers differ (MoE layers with their experts, MLA), else one dense layer's."""
    shard = -(-params // dp)
    units = [layer_unit or rank_params(m, sh, 1, False, False)]
    if first:
        units.append(embedding_rank_params(m, sh))
    if last:
        units.append(head_rank_params(m, sh, first))
    biggest = max(units)
    weights = shard * b + 2 * biggest * b
    grads = shard * grad_bytes + biggest * grad_bytes
    return weights, grads, optimizer_bytes(params, dp, True)


def mfsdp_bytes(
    m: ModelArch, sh: Any, params: int, dp: int, o: MemoryOptions, first: bool, last: bool, layers: int
) -> tuple[int, int, int]:
    """(weights, gradients, optimizer state) of a Megatron-FSDP rank (megatron/core/distributed/fsdp at
    0d8e0714cd, param_and_grad_buffer.py _init_each_parameter_group_buffers: which buffers are sharded).
    The optimizer state (FP32 main weights, preserve_fp32_weights, and Adam's moments) is ⌈params / DP⌉
    under every strategy. optim: weights and gradients whole. optim_grads: weights whole; the gradient a
    ⌈params / DP⌉ shard plus the rank's one bucket unsharded before its ReduceScatter. optim_grads_params: a
    shard of each; bucket 0 (embedding, final norm, output layer) gathered for the whole iteration, its
    gradient and one layer's unsharded before their ReduceScatters; the layers gathered at once: two with
    fsdp_double_buffer, else one and those the prefetch holds (up to 500M elements ahead)."""
    b, gb = o.dtype_bytes, o.grad_bytes or o.dtype_bytes
    shard = -(-params // dp)
    opt = optimizer_bytes(params, dp, True)
    if o.mfsdp_strategy == "optim":
        return params * b, params * gb, opt
    if o.mfsdp_strategy == "optim_grads":
        return params * b, shard * gb + params * gb, opt
    layer = rank_params(m, sh, 1, False, False)
    nu = (embedding_rank_params(m, sh) if first else 0) + (head_rank_params(m, sh, first) if last else 0)
    from xsim.tracegen.workload import MFSDP_MIN_COMM_UNIT

    ahead = 1 if o.fsdp_double_buffer else -(-(max(MFSDP_MIN_COMM_UNIT, 2 * layer) // 2) // max(1, layer))
    in_flight = min(1 + ahead, max(1, layers))
    weights = shard * b + nu * b + in_flight * layer * b
    grads = shard * gb + (nu + layer) * gb
    return weights, grads, opt


def _options_of(dep: dpb.Deployment) -> MemoryOptions:
    """The deployment's memory settings; its dropout rates as the generator resolves them (profile, spec)."""
    from xsim.tracegen.workload import _framework_of, mfsdp_strategy

    fw = _framework_of(dep)
    return MemoryOptions(
        dtype_bytes=dep.dtype_bytes or 2,
        schedule=dep.schedule or "gpipe",
        micro_batches=dep.micro_batches or 1,
        virtual_stages=max(1, dep.virtual_stages),
        all_warmup_at_m_eq_p=fw.pp_all_warmup_at_m_eq_p,
        sequence_parallel=dep.sequence_parallel,
        recompute=dep.recompute or "none",
        recompute_layers=dep.recompute_layers or 1,
        recompute_method=dep.recompute_method or "uniform",
        recompute_modules=tuple(dep.recompute_modules) or DEFAULT_RECOMPUTE_MODULES,
        distributed_optimizer=dep.distributed_optimizer,
        grad_bytes=grad_reduce_bytes(dep),
        sharding=dep.sharding or "none",
        dp_shard=dep.dp_shard,
        mfsdp_strategy=mfsdp_strategy(dep),
        fsdp_double_buffer=dep.fsdp_double_buffer,
        attention=dep.attention or "flash",
        te_fp8=_te_fp8(dep),
        fp8_params=dep.fp8_params and bool(_te_fp8(dep)),
        hidden_dropout=fw.dropout,
        attention_dropout=fw.attention_dropout > 0,
        loss=fw.loss,
        fragmentation=dep.memory_fragmentation if dep.HasField("memory_fragmentation") else FRAGMENTATION,
    )


def _te_fp8(dep: dpb.Deployment) -> str:
    """The FP8 scaling recipe when `dep` trains FP8 linears through Transformer Engine, else ""."""
    from xsim.tracegen.frameworks import DEFAULT_FRAMEWORK, framework

    if dep.precision != "fp8" or not framework(dep.framework or DEFAULT_FRAMEWORK).transformer_engine:
        return ""
    return dep.fp8_recipe or "delayed"


def te_fp8_meta_bytes(modules: int, recipe: str) -> int:
    """FP8 scaling state of `modules` TE linear modules: per FP8 tensor (3 forward, 2 backward) the FP32
    amax history (delayed scaling only) plus scale and scale_inv (TE_FP8_META_FP32)."""
    history = TE_AMAX_HISTORY if recipe == "delayed" else 0
    tensors = sum(TE_SCALES_PER_MODULE.values())
    return modules * tensors * 4 * (history + TE_FP8_META_FP32)


def deployment_memory(dep: dpb.Deployment, options: MemoryOptions | None = None) -> list[RankMemory]:
    """Peak memory of every rank of `dep`, ascending by rank."""
    o = options or _options_of(dep)
    if o.recompute not in RECOMPUTE:
        raise XsimError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {o.recompute!r}")
    m = model_arch(dep)
    s = m.seq_len
    specs = gpu_specs(dep)
    # Data-parallel degree of each layer: the device groups (replicas) that hold it.
    dp_of = [0] * (m.layers + 1)
    for dg in dep.device_groups:
        for a, b in _chunks(dg):
            for layer in range(a, b + 1):
                dp_of[layer] += 1
    out: list[RankMemory] = []
    for stages in replicas(dep).values():
        p = len(stages)
        for dg in stages:
            k, t, b = dg.pp_stage, dg.tp, dg.micro_batch
            chunks = _chunks(dg)
            n = sum(b - a + 1 for a, b in chunks)
            first, last = k == 0, k == p - 1
            sp = o.sequence_parallel and t > 1
            flight = in_flight(o.schedule, o.micro_batches, p, k, o.virtual_stages, o.all_warmup_at_m_eq_p)
            s = m.seq_len // max(
                1, dg.cp
            )  # context parallelism: each rank holds seq / cp tokens of a sequence
            act = _stage_activations(moe_activation_model(m), o, s, b, t, sp, chunks, flight)
            div = t if sp else 1  # section 4.3 assumes SP; without it these tensors are replicated
            if first and o.hidden_dropout:  # input-embedding dropout mask per micro-batch in flight (4.3)
                act += Fraction(s * b * m.hidden, div) * flight
                if m.embedding_norm:  # its LayerNorm's saved input and per-token FP32 mean and rstd
                    act += Fraction(s * b * (m.hidden * o.dtype_bytes + 2 * NORM_STAT_BYTES)) * flight
            if last:  # output norm and projection inputs (section 4.3), the loss's peak on the logits
                fp32, dtypes = LOSS_PEAK_BYTES[o.loss]
                logit = fp32 + dtypes * o.dtype_bytes
                act += Fraction(4 * s * b * m.hidden, div) + Fraction(logit * s * b * m.vocab, t)
            dp = min(dp_of[x] for a, e in chunks for x in range(a, e + 1))
            gpu = specs[dg.gpu]
            for local, r in enumerate(dg.ranks):
                sh = group_shard(m, dg, local)
                params = rank_params(m, sh, n, first, last)
                expert = unit = 0
                if (
                    m.moe is not None or m.mla is not None
                ):  # experts over EP, MLA's weights (tracegen.moe_ops)
                    layers = [x for a, e in chunks for x in range(a, e + 1)]
                    dense, expert = rank_params_ep(m, sh, layers, max(1, dg.ep), first, last)
                    params = dense + expert
                    unit = max(sum(layer_split(m, sh, x, max(1, dg.ep))) for x in layers)
                gb = o.grad_bytes or o.dtype_bytes
                if o.mfsdp_strategy:  # HSDP (dp_shard): sharded over the instance only
                    shard = min(dp, o.dp_shard) if o.dp_shard else dp
                    weights, grads, opt = mfsdp_bytes(m, sh, params, shard, o, first, last, n)
                elif o.sharding in ("zero3", "fsdp"):
                    shard = min(dp, o.dp_shard) if o.dp_shard else dp  # over the shard group only
                    weights, grads, opt = zero3_bytes(
                        m, sh, params, shard, o.dtype_bytes, gb, first, last, unit
                    )
                else:
                    weights, grads = params * o.dtype_bytes, params * gb
                    # Routed experts' state shards over the expert-DP group (dp / ep replicas), the rest over DP
                    # (dp_shard: over the shard group, a distributed-optimizer instance).
                    edp = max(1, dp // max(1, dg.ep))
                    over = min(dp, o.dp_shard) if o.dp_shard else dp
                    opt = optimizer_bytes(params - expert, over, o.distributed_optimizer)
                    opt += optimizer_bytes(expert, edp, o.distributed_optimizer) if expert else 0
                if o.te_fp8:  # TE's FP8 weight copies (weight and transpose) and scaling state
                    layers = [x for a, e in chunks for x in range(a, e + 1)]
                    fp8_params = fp8_linear_params_ep(m, sh, layers, max(1, dg.ep))
                    weights += TE_FP8_WEIGHT_COPIES * fp8_params
                    if o.fp8_params:  # no BF16 copy of the FP8 weights (fp8_model_init)
                        weights -= fp8_params * o.dtype_bytes
                    weights += te_fp8_meta_bytes(TE_MODULES_PER_LAYER * n, o.te_fp8)
                activations = int(-(-act // 1))
                # FRAGMENTATION: the allocator's reserve on what churns, the activations.
                allowance = o.workspace_bytes + int(o.fragmentation * activations)
                out.append(
                    RankMemory(
                        int(r),
                        dg.id,
                        dg.gpu,
                        k,
                        n,
                        params,
                        weights,
                        grads,
                        opt,
                        activations,
                        allowance,
                        int(gpu.memory_bytes),
                    )  # fmt: skip
                )
    return sorted(out, key=lambda x: x.rank)


def _chunks(dg: dpb.DeviceGroup) -> list[tuple[int, int]]:
    """The layer ranges a device group holds: its model chunks (interleaved), else [layer_start, layer_end]."""
    chunks = [(int(c.start), int(c.end)) for c in dg.chunks]
    return chunks or [(dg.layer_start, dg.layer_end)]


def _stage_activations(
    m: ModelArch,
    o: MemoryOptions,
    s: int,
    b: int,
    t: int,
    sp: bool,
    chunks: list[tuple[int, int]],
    flight: Fraction,
) -> Fraction:
    """Activations a stage holds: per micro-batch in flight, for its chunks' layers (first, last)."""
    flash = o.attention == "flash"
    fp8 = bool(o.te_fp8)
    drop = {"hidden_dropout": o.hidden_dropout, "attention_dropout": o.attention_dropout}
    n = sum(e - a + 1 for a, e in chunks)
    full = layer_activation_bytes(m, s, b, t, sp, "none", flash, fp8, **drop)
    if o.recompute == "selective":
        # Per layer kind (dense or MoE: the recompute modules' part differs), one layer rematerialized at a
        # time (rematerialized_bytes; nothing under the default core_attn, as before the modules existed).
        moe = m.moe
        kinds = [moe is not None and moe.is_moe(x) for a, e in chunks for x in range(a, e + 1)]
        mods = o.recompute_modules
        stored, remat = Fraction(0), Fraction(0)
        for kind in sorted(set(kinds)):
            one = layer_activation_bytes(
                m, s, b, t, sp, "selective", flash, fp8, **drop, modules=mods, moe_layer=kind
            )
            stored += one * kinds.count(kind)
            remat = max(remat, rematerialized_bytes(m, s, b, t, sp, flash, fp8, mods, kind, **drop))
        return stored * flight + remat
    if o.recompute == "selective-op":  # the saved outputs per layer, and one layer rematerialized at a time
        return layer_activation_bytes(m, s, b, t, sp, "selective-op", flash, fp8, **drop) * n * flight + full
    if o.recompute == "full":
        # Each chunk's recompute units (tracegen.spec.recompute_units: uniform, block, every) keep only their
        # input; the layers of no unit keep everything; the backward of a unit rematerializes its layers
        # once at a time (the longest unit).
        units = [
            u
            for a, e in chunks
            for u in recompute_units(o.recompute_method, o.recompute_layers, a, e).values()
        ]
        covered = sum(len(u) for u in units)
        stored = layer_activation_bytes(m, s, b, t, sp, "full", flash) * len(units) + full * (n - covered)
        return stored * flight + full * max((len(u) for u in units), default=0)
    return full * n * flight


def check_fits(mem: list[RankMemory], where: str, dep: dpb.Deployment | None = None) -> None:
    """Raise OutOfMemory naming the first rank that does not fit (the one with the least headroom)."""
    short = shortfall(mem)
    if short is not None:
        hint = gpipe_hint(dep) if dep is not None else ""
        raise OutOfMemory(f"{where}: {short}; {hint}--allow-oom to go on)")


def gpipe_hint(dep: dpb.Deployment) -> str:
    """Why a GPipe plan's activations are large, when they are: it holds every micro-batch's at once, where
    Megatron's schedules (1F1B; forward_backward_no_pipelining on one stage) hold at most PP of them."""
    m = dep.micro_batches or 1
    if (dep.schedule or "gpipe") != "gpipe" or m <= 1:
        return ""
    return f"schedule: gpipe holds all {m} micro-batches' activations, Megatron's 1F1B at most PP of them: schedule: 1f1b; "


def shortfall(mem: list[RankMemory]) -> str | None:
    """The rank with the least headroom and its breakdown, when some rank does not fit (None when all do)."""
    bad = [r for r in mem if r.headroom < 0]
    if not bad:
        return None
    r = min(bad, key=lambda x: (x.headroom, x.rank))
    has = f"{r.capacity / GIB:.1f} GiB"
    if f"{r.total / GIB:.1f}" == f"{r.capacity / GIB:.1f}":
        # "needs 80.0 GiB but has 80.0 GiB" reads as a bug: say by how much it misses.
        has += f", {-r.headroom / 2**20:.1f} MiB short"
    return (
        f"rank {r.rank} ({r.gpu}, device group {r.device_group}, stage {r.stage}) needs "
        f"{r.total / GIB:.1f} GiB (weights {r.weights / GIB:.1f}, gradients {r.gradients / GIB:.1f}, "
        f"optimizer {r.optimizer / GIB:.1f}, activations {r.activations / GIB:.1f}, workspace "
        f"{r.allowance / GIB:.1f}) but has {has} ({plural(len(bad), 'rank')} over"
    )


def memory_json(mem: list[RankMemory]) -> dict[str, Any]:
    """What memory.json holds: every rank's breakdown and the peak."""
    peak = max(mem, key=lambda x: (x.total, -x.rank))
    return {
        "peak_bytes": peak.total,
        "peak_rank": peak.rank,
        "min_headroom_bytes": min(r.headroom for r in mem),
        "fits": all(r.headroom >= 0 for r in mem),
        "ranks": [r.to_json() for r in mem],
    }


def write_memory(mem: list[RankMemory], directory: str | os.PathLike[str]) -> str:
    """Write memory.json into `directory`; returns its path."""
    path = os.path.join(os.fspath(directory), MEMORY_FILE)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(memory_json(mem), fh, indent=1)
        fh.write("\n")
    return path


def format_memory(mem: list[RankMemory]) -> str:
    """A per-rank table in GiB."""
    lines = [
        f"{'rank':>5} {'GPU':<10} {'stage':>5} {'layers':>6} {'weights':>8} {'grads':>8} {'optim':>8} "
        f"{'activ':>8} {'work':>6} {'total':>8} {'of':>7}  GiB"
    ]
    for r in mem:
        g = [x / GIB for x in (r.weights, r.gradients, r.optimizer, r.activations, r.allowance, r.total)]
        flag = "" if r.headroom >= 0 else "  OOM"
        lines.append(
            f"{r.rank:>5} {r.gpu:<10} {r.stage:>5} {r.layers:>6} {g[0]:>8.2f} {g[1]:>8.2f} {g[2]:>8.2f} "
            f"{g[3]:>8.2f} {g[4]:>6.2f} {g[5]:>8.2f} {r.capacity / GIB:>7.1f}{flag}"
        )
    return "\n".join(lines)
