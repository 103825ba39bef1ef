"""The ops of one transformer layer, embedding, head and optimizer on one TP rank: FLOPs, bytes, shape, time.

FLOP conventions (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", section 5.1): a GEMM of [M,K]x[K,N] costs 2MKN; attention scores and the weighted sum
cost 2*b*s^2*h each in forward when the kernel computes the whole s x s matrix (unfused attention); a
causal flash-attention kernel skips the masked upper triangle and is charged half of that (the FLOPs it
executes); backward costs twice forward (input and weight gradients). Element-wise ops are memory-bound:
their time is bytes over bandwidth, their FLOPs are small per-element counts given below.

Which element-wise kernels a layer has (bias adds, dropout, RoPE, the activation, Transformer Engine's FP8
casts) is decided by the framework profile of the context (tracegen/frameworks.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from xsim.tracegen.attention import fa2_grid_factor, flash_compute_seconds
from xsim.tracegen.catalog import GpuSpec, tensor_peak
from xsim.tracegen.choices import ATTENTIONS, COMPUTE_MODELS, PRECISIONS  # noqa: F401 - their old home
from xsim.tracegen.frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS, Framework
from xsim.tracegen.gemm import (
    LAUNCH_FLOOR_S,
    LinearGemm,
    achieved_bandwidth,
    linear_seconds,
    sustained_ratio,
)
from xsim.tracegen.grouped_gemm import GROUPED_GEMM_OPS, grouped_gemm_seconds
from xsim.tracegen.models import ModelArch
from xsim.tracegen.profile import ProfileTable
from xsim.tracegen.unfused_attention import bandwidth_fraction

# Linear-layer GEMMs: the ops Transformer Engine runs in FP8 under `precision: fp8` (Megatron's output
# layer, lm_head, is a plain ColumnParallelLinear outside TE and stays BF16).
LINEAR_OPS: frozenset[str] = frozenset({"qkv_proj", "attn_out_proj", "mlp_up_gate", "mlp_down"})
# TP collectives in front of a LayerNormLinear (QKV and MLP up/gate): under TE FP8 with sequence parallelism
# they gather the norm's FP8 output.
FP8_GATHERED: frozenset[str] = frozenset({"attn_tp_in", "mlp_tp_in"})
# Ops whose shape key is a GEMM: (M, K, N) for one GEMM, (BATCH, M, K, N) for the batched attention GEMMs.
GEMM_OPS: frozenset[str] = LINEAR_OPS | {"lm_head", "attn_scores", "attn_context"}

# FLOPs per element of the element-wise ops (forward; backward is twice). Approximate operation counts:
# RMSNorm square, accumulate, scale, gain; LayerNorm adds mean, subtract, bias; SwiGLU = x*sigmoid(x)
# (exp, add, divide, multiply) times the up projection; GELU tanh approximation ~8; residual add 1;
# softmax cross-entropy ~5 per logit (max, subtract, exp, sum, log).
# softmax ~5 per score (max, subtract, exp, sum, divide); dropout 2 (compare a random number, scale).
ELEM_FLOPS = {
    "rmsnorm": 4,
    "layernorm": 7,
    "swiglu": 5,
    "gelu": 8,
    # GeLU of the gate (tanh form, ~8) times the up projection (1): Gemma's gelu_pytorch_tanh(gate) * up
    "geglu": 9,
    # relu then square (max, multiply): Megatron-Core's jit-fused `torch.pow(F.relu(x), 2)`, one kernel each
    # way like GeLU's unfused path (NVIDIA/Megatron-LM 1296a81 megatron/core/activations.py `squared_relu`)
    "squared-relu": 2,
    # max(x, 0): one compare a element (OPT's torch.nn.ReLU; its backward a masked copy of the gradient)
    "relu": 1,
    "add": 1,
    "xent": 5,
    "softmax": 5,
    "dropout": 2,
}
# AdamW per parameter: moments (7), bias corrections (2), update with weight decay (6).
ADAM_FLOPS_PER_PARAM = 15
# Bytes AdamW touches per parameter besides the gradient and weight in dtype: FP32 master weight, first
# and second moment, read and written (Megatron's mixed-precision optimizer).
ADAM_STATE_BYTES = 24
# torch.optim.AdamW(foreach=True) on FP32 parameters and gradients, non-capturable, no amsgrad (torch/optim/
# adamw.py _multi_tensor_adamw of pytorch/pytorch 002d2f0bb4, the torch 2.3-2.4 code; the CPU step counters
# launch nothing): _foreach_mul_(params) for the weight decay (read 4, write 4), _foreach_lerp_(exp_avgs,
# grads) (8, 4), _foreach_mul_(exp_avg_sqs) (4, 4), _foreach_addcmul_(exp_avg_sqs, grads, grads) (8: the
# gradient read once, 4), _foreach_sqrt(exp_avg_sqs) into a new list (4, 4), _foreach_div_ and _foreach_add_
# on it (4, 4 each), _foreach_addcdiv_(params, exp_avgs, sqrt) (12, 4): 80 bytes per parameter in 8 calls.
ADAMW_FOREACH_BYTES, ADAMW_FOREACH_KERNELS = 80, 8
FP32 = 4  # bytes of the FP32 master weights, main gradients and cross-entropy logits
MASK_BYTES = 1  # dropout keeps a 1-byte (bool) mask per element for backward (torch native_dropout)
# Unfused RoPE (apply_rotary_pos_emb: rotate_half's negate-and-concatenate, t*cos, rotate_half(t)*sin, the
# sum) on one of q, k: 4 kernels, 9 element passes (reads and writes: 2 + 2 + 2 + 3); fused RoPE reads and
# writes each element once.
ROPE_UNFUSED_KERNELS, ROPE_UNFUSED_PASSES = 4, 9
# Megatron-LM 2023's apply_rotary_pos_emb (megatron/core/models/common/rotary_pos_embedding.py, as FlagScale
# ed55532 carries it: `t, t_pass = t[..., :rot_dim], t[..., rot_dim:]` ... `torch.cat((t, t_pass),
# dim=-1)`, Framework.rope_slice_cat) adds, per one of q, k: forward the cat (read, write: 1 kernel, 2
# passes); backward the two slices' gradients, each a zero tensor of the input's size with the slice
# copied in (autograd's slice_backward: zeros for the rotated part, 1 + 2 passes, and for the empty passed
# part, 1 pass) and their sum (read 2, write 1): 4 kernels, 7 passes. The cat's backward is views.
ROPE_SLICE_CAT = {"fwd": (1, 2), "bwd": (4, 7)}
# Partial rotary (ModelArch.rotary_pct < 1: GPT-NeoX's `query_rot, query_pass = q[..., :rotary_ndims],
# q[..., rotary_ndims:]`, then `torch.cat((query_layer, query_pass), dim=-1)`, EleutherAI/gpt-neox c560814b
# megatron/model/transformer.py ParallelSelfAttention.forward): the same passes over the whole head as
# ROPE_SLICE_CAT, but the passed part is not empty, so its slice_backward copies it in: one more backward
# kernel (zeros, copy, zeros, copy, sum). The rotation's own chain runs on the rotated dimensions only.
ROPE_PARTIAL_SLICE_CAT = {"fwd": (1, 2), "bwd": (5, 7)}
# Eager PyTorch's RoPE on one of q, k (torchtitan apply_rotary_emb, pytorch/torchtitan e38d7abe0f
# torchtitan/models/llama3/model/model.py): xq.float() (read dtype, write 4), the complex multiply by
# freqs_cis on the view_as_complex view (read 4, write 4), type_as back (read 4, write dtype) = 2 dtype +
# 16 bytes per element in 3 kernels; reshape, view_as_complex, view_as_real and flatten are views. Autograd's
# backward is the same chain: type_as's backward casts the gradient to FP32, the multiply's multiplies it
# by conj(freqs_cis) (freqs_cis takes no gradient), .float()'s casts back. The [s, head_dim / 2] complex64
# freqs_cis read (4 / heads bytes per element) is left out.
COMPLEX_ROPE_KERNELS, COMPLEX_ROPE_FP32_BYTES = 3, 16
# Eager PyTorch's RMSNorm: torch.nn.RMSNorm as PyTorch's composite rms_norm runs it (aten/src/ATen/native/
# layer_norm.cpp rms_norm_symint before CUDA inputs were routed to the fused _fused_rms_norm, which
# pytorch/pytorch 3de78edb07 does: upcast = input.to(float); rsqrt(pow(upcast, 2).mean(-1, keepdim)
# .add_(eps)); upcast.mul(rsqrt).mul(weight), then .type_as(input)), per element of the normalized tensor:
#   forward, 8 kernels: to FP32 (read dtype, write 4), pow (4 + 4), mean (read 4), add_ and rsqrt (per
#   token), mul by rsqrt (4 + 4), mul by the weight in FP32 (4 + 4), type_as (read 4, write dtype)
#   = 2 dtype + 28 + 4 = 2 dtype + 32;
#   backward (autograd's formulas, tools/autograd/derivatives.yaml and FunctionsManual.cpp), 17 kernels:
#   type_as's cast of the gradient to FP32 (dtype + 4), the weight multiply's input gradient (grad * weight:
#   4 + 4) and weight gradient (grad * x: 8 + 4, summed over tokens: 4, cast to the weight's dtype: per
#   row), the rsqrt multiply's input gradient (4 + 4) and rsqrt gradient (grad * upcast: 8 + 4, summed over
#   the row: 4), rsqrt's backward (-0.5 * grad * result.pow(3): 3 per-token kernels), mean's backward (the
#   per-token gradient expanded and divided: write 4), pow_backward (grad * (2 * upcast.pow(1)): a copy
#   4 + 4, the scalar multiply 4 + 4, the product 8 + 4), the sum of upcast's two gradients (8 + 4) and
#   .to(float)'s cast back (4 + dtype) = 2 dtype + 100. Per-token and per-row tensors (one FP32 a token,
#   the weight's h) move no counted bytes (under 1/hidden of the rest).
# torchtitan's own RMSNorm (torchtitan/models/norms.py at 157a12c56 and 9dec370ad, until 3b39d7ab0 of
# 2025-03-19 switched to torch.nn.RMSNorm: `output = self._norm(x.float()).type_as(x); return output *
# self.weight`, _norm = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)): the weight multiply runs
# after type_as, in dtype (FSDP2's param_dtype bf16), per element:
#   forward, 8 kernels: to FP32 (dtype + 4), pow (4 + 4), mean (read 4), add and rsqrt (per token), mul
#   by rsqrt (4 + 4), type_as (4 + dtype), mul by the weight (dtype + dtype) = 4 dtype + 28;
#   backward, 16 kernels: the weight multiply's input gradient (grad * weight: dtype + dtype) and weight
#   gradient (grad * x: 2 dtype + dtype, summed over tokens: dtype), type_as's cast of the gradient to FP32
#   (dtype + 4), the rsqrt multiply's input gradient (4 + 4) and rsqrt gradient (8 + 4, summed over the
#   row: 4), rsqrt's backward (3 per-token kernels), mean's backward (write 4), pow_backward (4 + 4, 4 + 4,
#   8 + 4), the sum of the two gradients (8 + 4), .float()'s cast back (4 + dtype) = 8 dtype + 76.
# Kernels, bytes per element: x dtype, + FP32 bytes; by Framework.rmsnorm / the spec's `rmsnorm_impl`.
EAGER_RMSNORM = {
    "torch": {"fwd": (8, 2, 32), "bwd": (17, 2, 100)},
    "torchtitan-2024": {"fwd": (8, 4, 28), "bwd": (16, 8, 76)},
}
# Unfused SwiGLU, F.silu(gate) * up (GeGLU's F.gelu(gate) * up alike): silu (read 1, write 1) and the product (read 2, write 1) = 5 passes of
# ffn elements in 2 kernels forward; backward: the product's two input gradients (2 x (2 + 1)), silu's
# backward (2 + 1) and the concatenation of the two halves (2 + 2) = 13 passes in 4 kernels.
SWIGLU_UNFUSED = {"fwd": (2, 5), "bwd": (4, 13)}
# The same with gate and up from two GEMMs (Framework.swiglu_split_gemms): no concatenation backward, so
# 9 passes in 3 kernels.
SWIGLU_UNFUSED_SPLIT = {"fwd": (2, 5), "bwd": (3, 9)}
# A norm on an FP32 copy of its input (Framework.fp32_norm_input), bytes per element beyond dtype reads and
# writes: forward the cast (read dtype, write 4) and the norm reading the copy (4) and writing dtype = 2
# dtype + 8 in 2 kernels; backward the norm reading the output gradient (dtype) and the FP32 input (4),
# writing an FP32 input gradient (4), then the cast back (read 4, write dtype) = 2 dtype + 12 in 2 kernels.
FP32_NORM_INPUT = {"fwd": (2, 8), "bwd": (2, 12)}
# Megatron's vocab-parallel cross-entropy on FP32 logits (megatron/core/tensor_parallel/cross_entropy.py,
# logits.float() in the language model's loss), bytes per local logit:
#   forward: cast to FP32 (read dtype, write 4), max (read 4), subtract the max (4 + 4), exp in place
#   (4 + 4), sum (4), divide in place to keep the softmax for backward (4 + 4) = dtype + 36 in 6 kernels;
#   backward: scale the saved softmax by the loss gradient (4 + 4) and cast back for the LM head's GEMM
#   (read 4, write dtype) = dtype + 12 in 2 kernels.
# Eager PyTorch's loss on FP32 logits (Framework.loss "eager"; torchtitan's `self.output(h).float()` and
# F.cross_entropy = log_softmax, then nll_loss, torch/nn/functional.py), bytes per local logit:
#   forward, 3 kernels: .float() (read dtype, write 4); log_softmax over a vocabulary row too long for the
#   shared-memory kernel (aten/src/ATen/native/cuda/SoftMax.cu host_softmax: cunn_SoftMaxForwardSmem only
#   while the row fits the 48 KiB default shared memory, 12,288 FP32 elements; 32,000 and 128,256 do not),
#   cunn_SoftMaxForward reads the row for the max, again for the sum of exponentials and again to write
#   x - max - log(sum) (4 + 4 + 4 + 4); nll_loss reads one logit a token (per-token, not counted)
#   = dtype + 20;
#   backward, 4 kernels: nll_loss_backward zeroes the FP32 gradient (write 4; Loss.cu
#   nll_loss_backward_out_cuda_template `grad_input.zero_()`) and scatters one value a token; log_softmax's
#   backward (cunn_SoftMaxBackward: read the gradient for its sum, then the gradient and the saved output,
#   write the input gradient: 4 + 4 + 4 + 4); the cast back for the LM head's GEMM (read 4, write dtype)
#   = dtype + 24.
# A fused softmax cross-entropy on the 16-bit logits (Framework.loss "fused": flash-attn's CrossEntropyLoss
# on apex's xentropy_cuda_lib, as InternLM 4a3d156 internlm/model/loss.py calls it with inplace_backward),
# bytes per local logit beyond nothing: forward one kernel reading each row twice (apex
# csrc/xentropy/xentropy_kernel.cu cunn_SoftMaxXEntropyForward: the max, then the sum of exponentials) and
# writing per-token loss and log-sum-exp only = 2 dtype; backward one kernel reading the logits and
# writing their gradient in place = 2 dtype.
# Transformer Engine's parallel cross-entropy (Framework.loss "te": Megatron-Core's
# `cross_entropy_loss_fusion` with `cross_entropy_fusion_impl: te`, megatron/core/models/common/
# language_module/language_module.py compute_language_model_loss at Megatron-LM 0d8e0714cd, calling
# transformer_engine.pytorch.cross_entropy.parallel_cross_entropy), Triton kernels on the 16-bit logits
# (transformer_engine/pytorch/triton/cross_entropy.py, TE v2.9), bytes per local logit:
#   forward, 2 kernels: online_softmax_kernel reads each row once (running max, sum of exponentials and the
#   target logit: 3 FP32 per token, all-gathered over TP), then cross_entropy_kernel reads the row again and
#   writes the logits' gradient in place (the backward's softmax - one-hot, in the logits' dtype) = 3 dtype;
#   backward, 1 kernel: element_mul_kernel scales that gradient by the per-token loss gradient (read, write;
#   cross_entropy_backward skips it only for a scalar 1.0, and Megatron's loss is per token) = 2 dtype.
# Kernels, dtype passes, FP32 bytes per local logit, by Framework.loss (the four above).
XENT = {
    "megatron": {"fwd": (6, 1, 36), "bwd": (2, 1, 12)},
    "eager": {"fwd": (3, 1, 20), "bwd": (4, 1, 24)},
    "fused": {"fwd": (1, 2, 0), "bwd": (1, 2, 0)},
    "te": {"fwd": (2, 3, 0), "bwd": (1, 2, 0)},
}
# The loss's TP collectives in the forward, by Framework.loss: (kind, their names and FP32 values per token).
# "megatron": _VocabParallelCrossEntropy.forward runs three blocking all-reduces over TP, each of s x b FP32:
# the logits' max (ReduceOp.MAX), the target logits (SUM) and the sums of exponentials (SUM); so do
# Megatron-LM 2021 and 2022 (megatron/mpu/cross_entropy.py of de7dc40f88 and d898a8991d) and Megatron-Core
# (megatron/core/tensor_parallel/cross_entropy.py at core_v0.6.0, core_r0.12.0, core_v0.15.0 and master
# d98e8a64dd). Only the fused path (cross_entropy_loss_fusion with impl "native", megatron/core/fusions/
# fused_cross_entropy.py from core_r0.8.0) concatenates the last two into one all-reduce, which no profile
# here runs. "eager": PyTorch's loss_parallel (torch/distributed/tensor/parallel/loss.py at 02eef6b863:
# `_log_softmax` all-reduces the max and the sum of exponentials, `_nll_loss_forward` the target logits'
# partial values): three as well. "te": one all-gather of each rank's (max, sum, target logit).
# "fused" (InternLM's flash-attn loss): one all-reduce of the three, not read at its commit here.
XENT_TP: dict[str, tuple[str, tuple[tuple[str, int], ...]]] = {
    "megatron": ("all_reduce", (("loss_tp_max", 1), ("loss_tp_target", 1), ("loss_tp_sumexp", 1))),
    "eager": ("all_reduce", (("loss_tp_max", 1), ("loss_tp_sumexp", 1), ("loss_tp_target", 1))),
    "fused": ("all_reduce", (("loss_tp", 3),)),
    "te": ("all_gather", (("loss_tp", 3),)),
}
# Transformer Engine 1.8's delayed scaling (transformer_engine/pytorch/fp8.py, reduce_and_update_fp8_tensors):
# once per fp8_autocast region and micro-batch (Megatron-Core wraps each model chunk's TransformerBlock),
# at the region's exit after forward and after the backward of its first FP8 module, the amaxes of all the
# region's modules are concatenated (torch.cat, one kernel), all-reduced (MAX) over the amax reduction
# group (Megatron-Core 0.8 get_amax_reduction_group: the TP x CP group; nothing for one rank) and handed
# to one tex.fused_amax_and_scale_update_after_reduction kernel (one block per module: roll the amax
# history, take its max, write scale and scale_inv). FP8 tensors per GEMM: input, weight, output forward;
# output gradient, input gradient backward (TE's fp8_meta scaling_fwd / scaling_bwd).
TE_SCALES_PER_MODULE = {"fwd": 3, "bwd": 2}
TE_MODULES_PER_LAYER = 4  # QKV, output projection, MLP up/gate, MLP down
# Before that (TE 73f8d90fe, 2024-04-12, first in v1.6), every FP8 module updated its own scales, each
# micro-batch (`fp8_amax_update: module`; MLPerf v3.1's TE 09ba84278a): module/base.py `prepare_forward` and
# `_prepare_backward` run FP8GlobalStateManager.copy_amax_from_global_buffer (the reduced amax back into the
# history: one copy kernel) and fp8.py amax_and_scale_update, whose _fused_amax_and_scale_update is
# torch.compile'd (jit.py: jit_fuser = torch.compile under torch 2) into at least one kernel (max over the
# history, roll, scale, scale_inv): 2 kernels per module and pass, the lower bound the code shows. The region's
# torch.cat and all-reduce at the autocast exit (global_amax_reduction) stay once per region. A layer holds 3
# such modules (fp8_meta owners): LayerNormLinear (QKV), Linear (projection), LayerNormMLP (both MLP GEMMs).
TE_FP8_META_MODULES_PER_LAYER = 3
TE_MODULE_UPDATE_KERNELS = 2
# Amax history length: NeMo's fp8_amax_history_len (NeMo-Framework-Launcher 24.07 conf/training
# gpt3/5b.yaml and llama/llama2_7b.yaml: 1024); the kernels are launch-bound at any length.
TE_AMAX_HISTORY = 1024
# Transformer Engine's current scaling (`fp8_recipe: current`, TE 2.x Float8CurrentScalingQuantizer::quantize,
# pytorch/csrc/quantizer.cpp): each quantize of a BF16 tensor computes its amax (nvte_compute_amax, a kernel
# reading the input), the scale (nvte_compute_scale_from_amax, one small kernel) and casts (nvte_quantize):
# the input is read twice, in three kernels. A LayerNormLinear's norm cannot write FP8 itself then
# (extensions/normalization.cpp: FUSED_NORM_AMAX_FP8, the norm and its amax in high precision, then the
# quantize): the norm writes `dtype_bytes` and the scale and cast kernels follow (read it, write 1 byte).
# There is no amax history: the delayed recipe's reduction and scale update (te_amax_update) do not run.
CS_QUANTIZE_KERNELS = 3
CS_NORM_QUANTIZE_KERNELS = 2
# Transformer Engine's MXFP8 (`fp8_recipe: mxfp8`, TE 2.x MXFP8BlockScaling / MXFP8Quantizer; OCP Microscaling
# Formats v1.0: blocks of 32 elements sharing one E8M0 scale byte). One quantize reads the BF16 tensor once
# and writes, in one fused kernel (TE common/util/cast_kernels.cuh cast_mxfp8_2D_kernel, rowwise and
# columnwise at once), the row-wise copy (1 byte an element, scales over 1x32 blocks along a row) and the
# column-wise copy the other GEMM of the pair reads (1 byte, scales over 32x1 blocks): 2 + 2/32 bytes
# written per element; no amax, no scale kernel, no amax history. The norm of a LayerNormLinear does not
# write MXFP8 itself (TE pytorch/csrc/extensions/normalization.cpp: MXFP8 takes Impl::UNFUSED unless
# NVTE_NORM_FWD_USE_CUDNN), so it writes `dtype_bytes` and the quantize follows.
MX_BLOCK = 32


# The quantize's kernel tag (Op.kernel): its bytes move at the kernel's own measured bandwidth where one is
# published (tracegen.gemm.MEASURED_KERNEL_MEM_EFF: TE's MXFP8 quantize on the B200), else the copy rate.
MX_QUANTIZE_KERNEL = "te_mxfp8_quantize"
# Transformer Engine v2.9's MXFP8 GEMM (pytorch/csrc/extensions/gemm.cpp `gemm`: swizzle_scaling_factors of A
# and of B before the cuBLASLt call, pytorch/csrc/util.cpp): each MXFP8 operand's E8M0 scales are rearranged
# into the tiled layout cuBLASLt's block-scaled GEMM reads (nvte_swizzle_scaling_factors,
# common/swizzle/swizzle.cu), one kernel per operand reading and writing that operand's scales, every GEMM
# call. At v2.9 the quantize writes its scales unswizzled (the quantize that writes GEMM-swizzled scales came
# with TE v2.12, #2486). Forward: the input's and the weight's row-wise scales (blocks of 32 along K);
# backward: dgrad reads the output gradient's row-wise and the weight's column-wise scales, wgrad the input's
# and the output gradient's column-wise scales (blocks of 32 along the tokens). TE pads each scale tensor to
# tiles of 128 x 4 scales (not counted: nothing to pad where the rows are a multiple of 128 and the columns of
# 128, as every linear of the validated Blackwell rows).
MX_SWIZZLE_KERNELS = {"fwd": 2, "bwd": 4}


def mx_written_bytes(elems: int) -> int:
    """Bytes one MXFP8 quantize of `elems` elements writes: both FP8 copies and their E8M0 scales."""
    return 2 * elems + 2 * -(-elems // MX_BLOCK)


def mx_swizzled_scales(phase: str, mm: int, k: int, n: int) -> int:
    """E8M0 scale bytes TE v2.9 swizzles for one linear's GEMMs in `phase` (MX_SWIZZLE_KERNELS): input
    [mm, k], weight [n, k], output gradient [mm, n]; row-wise scales one per 32 along a row, column-wise one
    per 32 along a column."""

    def row(r: int, cols: int) -> int:
        return r * -(-cols // MX_BLOCK)

    def col(r: int, cols: int) -> int:
        return -(-r // MX_BLOCK) * cols

    if phase == "fwd":
        return row(mm, k) + row(n, k)
    return row(mm, n) + col(n, k) + col(mm, k) + col(mm, n)


# The attention core that Megatron's selective recompute repeats (Korthikanti et al. 2022, section 4.2:
# QK^T, softmax, softmax dropout and attention over V): the fused FlashAttention op and the unfused ops'
# names. These ops hold the s^2 activations that make recomputing them cheap relative to storing them.
# Megatron-LM's CoreAttention ends with the context's permute to [s, b, h] (attn_context_permute), so it is
# recomputed with the rest.
ATTN_CORE_OPS: frozenset[str] = frozenset(
    {"attn_core", "attn_scores", "attn_softmax", "attn_dropout", "attn_context", "attn_context_permute"}
)
RECOMPUTE_MODES = ("none", "selective", "full", "selective-op")


@dataclass(frozen=True)
class Shard:
    """What one TP rank holds of each sharded dimension (uneven splits give ranks +-1 head)."""

    tp: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    etp: int = 0  # expert tensor-parallel degree of MoE layers (0 = tp; tracegen.moe_ops)


def split(total: int, parts: int, index: int) -> int:
    """Size of part `index` when `total` is split into `parts` as evenly as possible (larger parts first)."""
    return total // parts + (1 if index < total % parts else 0)


def shard_of(m: ModelArch, tp: int, local: int) -> Shard:
    """The shard of TP rank `local` (0-based index within its device group)."""
    return Shard(
        tp, split(m.heads, tp, local), split(m.kv_heads, tp, local), split(m.ffn_hidden, tp, local),
        split(m.vocab, tp, local),
    )  # fmt: skip


@dataclass(frozen=True)
class Op:
    """One compute node's work."""

    op: str  # generator op name ("qkv_proj", ...): the profile table's key
    phase: str  # "fwd" | "bwd" | "opt"
    flops: int
    bytes: int
    shape: tuple[int, ...]
    gemm: bool  # tensor-core op (time = max(compute, memory)) vs element-wise (memory only)
    precision: str = "bf16"  # tensor-core rate of the op ("fp8": Transformer Engine linear layers)
    kernels: int = 1  # kernel launches (backward GEMMs launch two: input and weight gradient)
    kernel: str = ""  # fused attention's kernel family ("fa2" | "fa3", tracegen/attention.py); "" otherwise
    # Fused attention applies dropout to its probabilities inside the kernel (Framework.attention_dropout
    # > 0): timed at the kernel's published dropout / no-dropout ratio (tracegen.attention.dropout_ratio).
    dropout: bool = False
    # Fused attention calls a context-parallel attention op runs (tracegen.context_parallel), back to back:
    # (query length, key length, causal 0 | 1) each, at the op's (batch, heads, kv heads, _, d). Several
    # tuples are the calls of each rank of a CP group that waits for its slowest: the op takes the longest.
    calls: tuple[tuple[tuple[int, int, int], ...], ...] = ()


@dataclass(frozen=True)
class Comm:
    """A TP-group collective between compute ops: kind in all_reduce / all_gather / reduce_scatter."""

    op: str
    kind: str
    size: int  # bytes, ASTRA-sim convention: AllGather = per-rank input, others = full buffer
    # "" = the pass it runs in; "fwd" = a forward collective replayed inside a backward pass (a selective
    # recompute module's, with_recompute): tagged `recompute`, as a forward Op there is.
    phase: str = ""


Step = Op | Comm


def _gemm(op: str, phase: str, mm: int, k: int, n: int, b: int, fp8: bool = False) -> Op:
    # FP8 (Transformer Engine's convention, "Using FP8 with Transformer Engine", TE docs): the GEMM's two
    # operands are cast to FP8 (1 byte: E4M3 activations/weights, E5M2 gradients); its output, the master
    # weights, weight gradients, optimizer state and everything between GEMMs stay in `dtype_bytes`.
    ab = 1 if fp8 else b
    flops, byt = 2 * mm * k * n, ab * (mm * k + k * n) + b * mm * n
    mult = 2 if phase == "bwd" else 1  # backward = input gradient + weight gradient GEMMs
    return Op(op, phase, mult * flops, mult * byt, (mm, k, n), True, "fp8" if fp8 else "bf16", mult)


def _elem(op: str, phase: str, elems: int, flops_per: int, reads: int, writes: int, b: int) -> Op:
    mult = 2 if phase == "bwd" else 1
    return Op(op, phase, mult * flops_per * elems, (reads + writes) * elems * b, (elems,), False)


def _kern(op: str, phase: str, elems: int, flops_per: int, bytes_per: int, kernels: int = 1) -> Op:
    """An element-wise op of `kernels` kernels moving `bytes_per` bytes per element in all."""
    return Op(op, phase, flops_per * elems, bytes_per * elems, (elems,), False, kernels=kernels)


@dataclass(frozen=True)
class Ctx:
    """Shapes shared by every op of one device group for one micro-batch."""

    m: ModelArch
    sh: Shard
    mb: int  # sequences per micro-batch
    s: int  # sequence length
    b: int  # dtype bytes
    sp: bool  # sequence parallel
    precision: str = "bf16"  # "bf16" | "fp16" | "fp8" (FP8 linear GEMMs)
    attention: str = (
        "flash"  # "flash" (one fused attn_core op) | "unfused" (scores, softmax, dropout, context)
    )
    fw: Framework = FRAMEWORKS[DEFAULT_FRAMEWORK]  # which kernels the layer is made of
    fp8_recipe: str = "delayed"  # TE's FP8 scaling: "delayed" | "current" (CS_QUANTIZE_KERNELS) | "mxfp8"
    grad_bytes: int = FP32  # width of the gradient buffer's main_grad (Framework.main_grad_hook's adds)
    fp8_amax_update: str = "region"  # delayed scaling's update: "region" | "module" (TE before v1.6)

    @property
    def tokens(self) -> int:
        return self.mb * self.s

    @property
    def fp8(self) -> bool:
        """Linear GEMMs in FP8."""
        return self.precision == "fp8"

    @property
    def te_fp8(self) -> bool:
        """FP8 through Transformer Engine: its casts, transposes and scale updates are charged."""
        return self.fp8 and self.fw.transformer_engine

    @property
    def fp8_current(self) -> bool:
        """TE FP8 with current scaling: every quantize computes its own amax first (CS_QUANTIZE_KERNELS)."""
        return self.te_fp8 and self.fp8_recipe == "current"

    @property
    def fp8_mx(self) -> bool:
        """TE MXFP8: one fused quantize writes both FP8 copies and their block scales (mx_written_bytes)."""
        return self.te_fp8 and self.fp8_recipe == "mxfp8"

    @property
    def norm_tokens(self) -> int:
        """Tokens each rank normalizes: all of them, or its 1/tp sequence slice under sequence parallelism."""
        if self.sp and self.sh.tp > 1:
            return -(-self.tokens // self.sh.tp)
        return self.tokens


def _tp_in(c: Ctx, op: str, fwd: bool) -> list[Step]:
    """Megatron's `f` before a column-parallel GEMM: identity fwd / AllReduce bwd; with SP AllGather / ReduceScatter."""
    if c.sh.tp == 1:
        return []
    full = c.tokens * c.m.hidden * c.b
    if c.sp:
        # Under TE FP8 the norm wrote FP8 and LayerNormLinear gathers that (TE 1.8: gather_along_first_dim
        # of the uint8 `ln_out`): 1 byte per element.
        gather = c.norm_tokens * c.m.hidden * (1 if c.te_fp8 and op in FP8_GATHERED else c.b)
        return [Comm(op, "all_gather", gather)] if fwd else [Comm(op, "reduce_scatter", full)]
    return [] if fwd else [Comm(op, "all_reduce", full)]


# Megatron's `f` collectives of the column-parallel linears whose backward one autograd function runs with
# the GEMMs (Framework.sp_dgrad_overlap / async_dgrad_allreduce): QKV, MLP up/gate and the LM head.
COLUMN_TP_IN: frozenset[str] = frozenset({"attn_tp_in", "mlp_tp_in", "head_tp_in"})


def sp_regather(c: Ctx, op: str) -> Comm:
    """The backward's second AllGather of a column-parallel linear's input under sequence parallelism: the
    forward saved only the rank's shard (Framework.sp_dgrad_overlap), so the same bytes as the forward's."""
    (gather,) = _tp_in(c, op, True)
    assert isinstance(gather, Comm) and gather.kind == "all_gather"
    return Comm(f"{op}_regather", "all_gather", gather.size)


def _tp_out(c: Ctx, op: str, fwd: bool) -> list[Step]:
    """Megatron's `g` after a row-parallel GEMM: AllReduce fwd / identity bwd; with SP ReduceScatter / AllGather."""
    if c.sh.tp == 1:
        return []
    full = c.tokens * c.m.hidden * c.b
    if c.sp:
        return (
            [Comm(op, "reduce_scatter", full)]
            if fwd
            else [Comm(op, "all_gather", c.norm_tokens * c.m.hidden * c.b)]
        )
    return [Comm(op, "all_reduce", full)] if fwd else []


def attention_steps(c: Ctx, phase: str) -> list[Op]:
    """The attention core of one layer: FlashAttention's fused op, or unfused attention's four ops.

    Flash (causal, as every decoder trains): FLOPs 4*b*s^2*h / 2 forward, since the kernel skips the tiles
    above the diagonal (FlashAttention-2, Dao 2023, section 3.1.1 "causal masking": blocks whose column
    indices all exceed the row indices are skipped, about half); bytes Q, K, V and the output.
    Unfused (Megatron's non-flash path) materializes the b x heads x s x s scores: a batched GEMM Q K^T,
    a memory-bound scale-mask-softmax and dropout over b*heads*s^2 elements, and a batched GEMM of the
    probabilities with V; these GEMMs compute the full matrix (2*b*s^2*h each). Backward: each GEMM twice,
    softmax reads probabilities and their gradient, dropout reads the gradient and its 1-byte mask; no
    dropout op at an attention-dropout rate of 0 (Framework.attention_dropout).
    Megatron-LM's profiles (Framework.causal_softmax_max_seq, attn_layout_copies): its causal softmax
    kernel reads only the lower triangle, and its [s, b, np, hn] layout adds the context's permute copy
    forward and the Q/K/V gradients' cat backward.
    """
    m, sh, b, s, mb = c.m, c.sh, c.b, c.s, c.mb
    d = m.head_dim
    attn_flops = 4 * mb * sh.heads * s * s * d
    if c.attention != "unfused":
        causal = attn_flops // 2
        attn_bytes = b * mb * s * d * (2 * sh.heads + 2 * sh.kv_heads)
        shape = (mb, sh.heads, sh.kv_heads, s, d)
        kernel = c.fw.hopper_attention
        fwd = phase == "fwd"
        core = Op("attn_core", phase, causal * (1 if fwd else 2), attn_bytes * (1 if fwd else 2), shape, True,
                  kernel=kernel, dropout=c.fw.attention_dropout > 0)  # fmt: skip
        if c.fw.repeat_kv and sh.heads > sh.kv_heads:
            # torchtitan's repeat_kv (Framework.repeat_kv): `x[:, :, :, None, :].expand(...).reshape(...)` of
            # k and v, a copy each (read kv, write q elements); backward expand's gradient sums the repeats
            # (read q, write kv) for each: 2 (q + kv) element passes in 2 kernels either way.
            q, kv = mb * s * sh.heads * d, mb * s * sh.kv_heads * d
            rep = Op("attn_kv_repeat", phase, 0, 2 * b * (q + kv), (q,), False, kernels=2)
            return [rep, core] if fwd else [core, rep]
        if not c.fw.flash_layout_copies:
            return [core]
        q, kv = mb * s * sh.heads * d, mb * s * sh.kv_heads * d
        # k and v expanded to the query heads by `repeat_interleave` (a copy even at one query head per
        # group: PyTorch 2's int-repeats overload is an index_select with the repeated indices, aten/src/
        # ATen/native/Repeat.cpp: read kv, write q elements each), then q, k and v (all q elements wide
        # now) copied to [b, s, np, hn] (read, write each): 2 (kv + q) + 3 x 2 q = 8 q + 2 kv
        # element passes in 5 kernels; the context copied back to [s, b, h] when b > 1. Backward: the
        # contiguous copies' and rearranges' gradients are views; index_select's is index_select_backward,
        # zeros of k's (v's) size then index_add_ of the expanded gradient (write kv, read q, read and write
        # kv) for k and v; the split's concatenates the three gradients (read, write q + 2 kv): 4 q + 10 kv
        # element passes in 5 kernels.
        if fwd:
            per = 8 * q + 2 * kv
            copies = Op("attn_qkv_copy", "fwd", 0, b * per, (q + 2 * kv,), False, kernels=5)
            permute = [Op("attn_context_permute", "fwd", 0, 2 * b * q, (q,), False)] if mb > 1 else []
            return [copies, core, *permute]
        per = 4 * q + 10 * kv
        return [core, Op("attn_qkv_copy", "bwd", 0, b * per, (q + 2 * kv,), False, kernels=5)]
    bh, scores = mb * sh.heads, mb * sh.heads * s * s
    q, kv = mb * s * sh.heads * d, mb * s * sh.kv_heads * d
    mult = 2 if phase == "bwd" else 1
    gemm_flops = mult * attn_flops // 2
    # Elements the softmax reads per input (forward: scores; backward: gradient and probabilities): all of
    # them, or under Megatron's fused causal kernel the lower triangle only (it writes every element).
    tri = 0 < s <= c.fw.causal_softmax_max_seq
    read = bh * s * (s + 1) // 2 if tri else scores
    # ALiBi on unfused attention (BLOOM's Megatron-DeepSpeed, bigscience-workshop/Megatron-DeepSpeed
    # 4989bcde megatron/model/transformer.py ParallelAttention.forward): the [b*np, 1, s] bias is the QK^T
    # baddbmm's input with beta 1.0, so PyTorch first copies it, broadcast, into the b*np x s x s output
    # (aten/src/ATen/native/LinearAlgebra.cpp common_checks_baddbmm_bmm: `if (beta != 0.0)
    # result.copy_(self)`; one kernel writing the scores) and the GEMM reads it back as C; the bias takes no
    # gradient, so backward is unchanged. A fused kernel adds the bias in its registers: nothing extra.
    alibi = phase == "fwd" and c.m.positions == "alibi"
    scores_bytes = mult * b * (q + kv + scores) + (2 * b * scores if alibi else 0)
    # The probabilities' dropout runs only at a rate > 0 (Framework.attention_dropout): Megatron-LM applies
    # torch.nn.Dropout(args.attention_dropout) to them (megatron/model/transformer.py: ParallelAttention at
    # de7dc40f88, CoreAttention at d898a8991d), and F.dropout with p = 0 returns
    # its input without a kernel or a mask (PyTorch aten/src/ATen/native/Dropout.cpp `dropout`: the fused
    # native_dropout only for 0 < p < 1, then `_dropout` returns the input when p == 0); so no
    # `attn_dropout` forward, backward (autograd sees no op) or in a selective recompute.
    drop_flops, drop_bytes = mult * ELEM_FLOPS["dropout"] * scores, scores * (2 * b + 1)
    drop = (
        [Op("attn_dropout", phase, drop_flops, drop_bytes, (scores,), False)]
        if c.fw.attention_dropout > 0
        else []
    )
    ops = [
        Op("attn_scores", phase, gemm_flops, scores_bytes, (bh, s, d, s), True, kernels=mult + alibi),
        Op(
            "attn_softmax", phase, mult * ELEM_FLOPS["softmax"] * scores, b * (mult * read + scores),
            (scores,), False,
        ),
        *drop,
        Op("attn_context", phase, gemm_flops, mult * b * (scores + kv + q), (bh, s, s, d), True, kernels=mult),
    ]  # fmt: skip
    if not c.fw.attn_layout_copies:
        return ops if phase == "fwd" else ops[::-1]
    if phase == "fwd":
        # context [b, np, s, hn] -> [s, b, np, hn]: permute(...).contiguous(), a copy (read, write)
        return [*ops, Op("attn_context_permute", "fwd", 0, 2 * b * q, (q,), False)]
    # backward of the Q/K/V split of the fused projection (torch.split views): one cat of the three
    # gradients into the projection's output gradient (read, write); the permute's backward is a view
    return [*ops[::-1], Op("qkv_grad_cat", "bwd", 0, 2 * b * (q + 2 * kv), (q + 2 * kv,), False)]


def _fp8_cast(c: Ctx, op: str, phase: str, elems: int) -> list[Op]:
    """Transformer Engine's cast-transpose of a linear's FP8 operand: read it in `dtype_bytes`, write the FP8
    copy and its FP8 transpose (the other GEMM of the pair reads the transpose), 1 byte each; under current
    scaling its amax pass reads the input once more, in CS_QUANTIZE_KERNELS kernels in all."""
    if not c.te_fp8:
        return []
    if c.fp8_mx:
        return [_mx_quantize(c, f"{op}_fp8_cast", phase, elems)]
    if c.fp8_current:
        return [_kern(f"{op}_fp8_cast", phase, elems, 0, 2 * c.b + 2, CS_QUANTIZE_KERNELS)]
    return [_kern(f"{op}_fp8_cast", phase, elems, 0, c.b + 2)]


def _mx_quantize(c: Ctx, name: str, phase: str, elems: int) -> Op:
    """One TE MXFP8 quantize of `elems` elements: read `dtype_bytes`, write both copies and scales, 1 kernel."""
    nbytes = elems * c.b + mx_written_bytes(elems)
    return Op(name, phase, 0, nbytes, (elems,), False, kernel=MX_QUANTIZE_KERNEL)


def _linear(c: Ctx, op: str, phase: str, mm: int, k: int, n: int) -> list[Op]:
    """A Transformer Engine linear's GEMMs in `phase` ([mm, k] x [k, n]), under MXFP8 after the swizzles of
    their operands' scales (`<op>_fp8_swizzle`: MX_SWIZZLE_KERNELS kernels, read and write the scales)."""
    gemm = _gemm(op, phase, mm, k, n, c.b, c.fp8)
    if not c.fp8_mx:
        return [gemm]
    scales = mx_swizzled_scales(phase, mm, k, n)
    swizzle = Op(
        f"{op}_fp8_swizzle", phase, 0, 2 * scales, (scales,), False, kernels=MX_SWIZZLE_KERNELS[phase]
    )
    return [swizzle, gemm]


def _norm_fwd(c: Ctx, op: str, fused: bool = True) -> Op:
    """A pre-linear norm's forward on the rank's tokens: reads `dtype_bytes`, writes the same, or under
    Transformer Engine FP8 the FP8 input of the linear that follows (1 byte): TE's LayerNormLinear fuses the
    norm and the cast (layernorm_linear.py, TE 1.8: `ln_out` allocated as uint8 and written by the FP8
    normalization kernel), so that linear has no forward cast of its own (`fused` False: a plain norm; under
    current scaling the norm writes `dtype_bytes` and _norm_quantize follows)."""
    e, b = c.norm_tokens * c.m.hidden, c.b
    if _eager_norm(c):
        return _eager_rmsnorm(c, op, "fwd", e)
    if c.fw.fp32_norm_input:
        return _fp32_input_norm(c, op, "fwd", e)
    out = 1 if c.te_fp8 and fused and not (c.fp8_current or c.fp8_mx) else b
    return Op(op, "fwd", ELEM_FLOPS[c.m.norm] * e, e * (b + out), (e,), False)


def _eager_norm(c: Ctx) -> bool:
    """RMSNorm as an eager PyTorch composite (Framework.rmsnorm); LayerNorm is one kernel everywhere."""
    return c.fw.rmsnorm in EAGER_RMSNORM and c.m.norm == "rmsnorm"


def _eager_rmsnorm(c: Ctx, op: str, phase: str, elems: int) -> Op:
    """The composite RMSNorm's kernels in `phase` on `elems` elements (EAGER_RMSNORM[Framework.rmsnorm])."""
    kernels, per_dtype, fp32 = EAGER_RMSNORM[c.fw.rmsnorm][phase]
    flops = ELEM_FLOPS["rmsnorm"] * (2 if phase == "bwd" else 1)
    return _kern(op, phase, elems, flops, per_dtype * c.b + fp32, kernels)


def _fp32_input_norm(c: Ctx, op: str, phase: str, elems: int) -> Op:
    """A norm on an FP32 copy of its input and the cast that makes it (FP32_NORM_INPUT), in `phase`."""
    kernels, fp32 = FP32_NORM_INPUT[phase]
    flops = ELEM_FLOPS[c.m.norm] * (2 if phase == "bwd" else 1)
    return _kern(op, phase, elems, flops, 2 * c.b + fp32, kernels)


def _norm(c: Ctx, op: str, phase: str, elems: int, residual: bool = True) -> Op:
    """A norm that is not a LayerNormLinear's: the final norm forward, every norm's backward (`residual`
    False: a norm off the residual stream, the q and k norms, which no profile feeds an FP32 copy)."""
    if _eager_norm(c):
        return _eager_rmsnorm(c, op, phase, elems)
    if c.fw.fp32_norm_input and residual:
        return _fp32_input_norm(c, op, phase, elems)
    rw = (1, 1) if phase == "fwd" else (2, 1)
    return _elem(op, phase, elems, ELEM_FLOPS[c.m.norm], *rw, c.b)


def _norm_quantize(c: Ctx, linear: str, fused: bool = True) -> list[Op]:
    """Current scaling: the quantize of a LayerNormLinear's norm output (its amax computed by the norm):
    the scale and cast kernels, reading `dtype_bytes` and writing the FP8 input of `linear` (1 byte).
    MXFP8: the norm's unfused quantize (_mx_quantize: both copies, so no backward transpose)."""
    e = c.norm_tokens * c.m.hidden
    if c.fp8_mx and fused:
        return [_mx_quantize(c, f"{linear}_fp8_cast", "fwd", e)]
    if not (c.fp8_current and fused):
        return []
    return [_kern(f"{linear}_fp8_cast", "fwd", e, 0, c.b + 1, CS_NORM_QUANTIZE_KERNELS)]


def _amax_reduce(c: Ctx, linear: str) -> list[Comm]:
    """Current scaling under sequence parallelism: the amax of a column-parallel linear's input (forward)
    or of a row-parallel linear's output gradient (backward) is all-reduced (MAX, one FP32) over the TP
    group before the quantize, so the gathered FP8 shards share one scale (TE linear.py and
    layernorm_linear.py `_customize_quantizers_float8_current_scaling`: with_amax_reduction)."""
    if not (c.fp8_current and c.sp and c.sh.tp > 1):
        return []
    return [Comm(f"{linear}_amax_allreduce", "all_reduce", FP32)]


def _row_grad_in(c: Ctx, where: str, gather: str, linear: str, fused_out_bias: bool) -> list[Step]:
    """A row-parallel linear's output gradient up to its backward GEMM (`where` attn | mlp).

    The backward runs the forward's GEMM -> `g` -> bias-dropout-add in reverse: the bias-dropout-add's
    backward on the rank's tokens first (Megatron-Core's TransformerLayer applies `self_attn_bda` /
    `mlp_bda` to the linear's SP-sharded output), then the linear's backward gathers the gradient under
    sequence parallelism, so the AllGather sits right before the GEMM (where TE's userbuffers overlap it:
    `proj_dgrad` / `fc2_dgrad`). Under TE FP8 with sequence parallelism TE quantizes the rank's own shard and
    gathers FP8, 1 byte an element (grad_output_preprocess, "FP8 case with gather: unfused bgrad, cast,
    transpose for efficient gather": cast_to_fp8 of the shard, then gather_along_first_dim or the
    userbuffers AllGather, TE 1.x module/base.py; TE v2.9 base.py: `quantizer(grad_output)` on the shard,
    then fill_userbuffers_buffer_for_all_gather / gather_along_first_dim with the quantizer); current
    scaling all-reduces the shard's amax first (`_amax_reduce`). The cast node is charged the shard's cast
    (read `dtype_bytes`, write 1; current scaling's amax pass one more read) and the FP8 transpose of the
    gathered gradient for the weight-gradient GEMM (read 1, write 1), which TE runs after the gather.
    """
    head = _dropout_add(c, where, "bwd", fused_out_bias)
    full = c.tokens * c.m.hidden
    if not (c.te_fp8 and c.sp and c.sh.tp > 1):
        return [*head, *_tp_out(c, gather, False), *_fp8_cast(c, linear, "bwd", full)]
    shard = c.norm_tokens * c.m.hidden
    if c.fp8_current:
        cast_bytes, kernels = shard * (2 * c.b + 1) + 2 * full, CS_QUANTIZE_KERNELS + 1
    else:
        cast_bytes, kernels = shard * (c.b + 1) + 2 * full, 2
    cast = Op(f"{linear}_fp8_cast", "bwd", 0, cast_bytes, (shard,), False, kernels=kernels)
    return [*head, *_amax_reduce(c, linear), cast, Comm(gather, "all_gather", shard)]


def _fp8_transpose(c: Ctx, op: str, elems: int) -> list[Op]:
    """The FP8 transpose of a LayerNormLinear's saved FP8 input for its weight-gradient GEMM (TE 1.8
    layernorm_linear.py backward: `tex.fp8_transpose(ln_out_total)`): read 1 byte, write 1 byte. None under
    MXFP8: the forward quantize wrote the column-wise copy (_norm_quantize)."""
    if not c.te_fp8 or c.fp8_mx:
        return []
    return [_kern(f"{op}_fp8_transpose", "bwd", elems, 0, 2)]


def _bias(c: Ctx, op: str, phase: str, elems: int) -> list[Op]:
    """A linear's bias add as its own kernel (forward: read, write) or its gradient's reduction over tokens
    (backward: read the output gradient), where the framework does not fold it into the GEMM epilogue."""
    if not c.m.linear_bias or c.fw.bias_in_gemm:
        return []
    if phase == "fwd":
        return [_kern(f"{op}_bias", phase, elems, ELEM_FLOPS["add"], 2 * c.b)]
    return [_kern(f"{op}_bias", phase, elems, ELEM_FLOPS["add"], c.b)]


def _bias_grad(c: Ctx, op: str, elems: int) -> list[Op]:
    """The gradient of a bias that a fused kernel added (skip_bias_add: Megatron's bias-GeLU / bias-SwiGLU
    and bias-dropout-add take the linear's bias as an input): the kernel's backward returns a gradient of
    the broadcast shape, which autograd sums over the tokens to the bias's (`sum_to_size`, a reduction
    reading `elems` in dtype; megatron/core/fusions/fused_bias_gelu.py GeLUFunction.backward `return tmp,
    tmp` and fused_bias_dropout.py's `x + bias` at core_r0.8.0, the same in Megatron-LM de7dc40f88 and
    d898a8991d megatron/model/fused_bias_gelu.py and transformer.py's jit-scripted bias_dropout_add, whose
    bias arrives `expand_as(residual)`). Nothing without linear biases."""
    if not c.m.linear_bias:
        return []
    return [_kern(f"{op}_bias", "bwd", elems, ELEM_FLOPS["add"], c.b)]


def _dropout_add(c: Ctx, where: str, phase: str, linear_bias_fused: bool) -> list[Op]:
    """Hidden dropout and residual add after a row-parallel projection (`where` attn | mlp), on the rank's
    tokens (1/TP of them under sequence parallelism).

    Fused (Megatron's bias-dropout-add): forward one kernel reading the branch and the residual, writing the
    sum and the 1-byte mask; backward one kernel (the branch gradient: read gradient and mask, write) and,
    with linear biases, the bias's gradient (`{where}_out_bias`, _bias_grad). The residual's own gradient is
    the accumulation `{where}_residual` below, in every profile.
    Unfused: dropout (`{where}_hidden_dropout`: read, write, mask), then the residual add (read 2, write 1).
    """
    e, b = c.norm_tokens * c.m.hidden, c.b
    if c.fw.fused_bias_dropout_add and not c.fw.dropout:
        # Dropout off (`dropout: false`, p = 0): F.dropout returns its input (aten/src/ATen/native/
        # Dropout.cpp: `if (p == 0 || !train ...) return input`), so the fused function is the (bias and)
        # residual add (read 2, write 1) forward and passes the gradient through backward (no kernel).
        if phase == "bwd":
            return _bias_grad(c, f"{where}_out", e)
        return [_elem(f"{where}_bias_dropout_add", "fwd", e, ELEM_FLOPS["add"], 2, 1, b)]
    if c.fw.fused_bias_dropout_add:
        if phase == "fwd":
            return [
                _kern(f"{where}_bias_dropout_add", phase, e, ELEM_FLOPS["dropout"] + 1, 3 * b + MASK_BYTES)
            ]
        return [
            _kern(f"{where}_bias_dropout_add", phase, e, ELEM_FLOPS["dropout"], 2 * b + MASK_BYTES),
            *_bias_grad(c, f"{where}_out", e),
        ]
    bias = [] if linear_bias_fused else _bias(c, f"{where}_out", phase, e)
    # Without dropout (Framework.dropout off) the add alone: its backward passes the gradient through.
    drop = [_kern(f"{where}_hidden_dropout", phase, e, ELEM_FLOPS["dropout"], 2 * b + MASK_BYTES)]
    drop = drop if c.fw.dropout else []
    if phase == "fwd":
        return [*bias, *drop, _elem(f"{where}_residual", "fwd", e, ELEM_FLOPS["add"], 2, 1, b)]
    return [*drop, *bias]


def _rope(c: Ctx, phase: str) -> list[Op]:
    """Rotary position embedding on q and k (models with RoPE: `ModelArch.rope`); backward rotates the
    gradients the same way. FLOPs and the rotation's passes scale with the rotated dimensions
    (`ModelArch.rotary_dims`); a partial rotation's slices and concatenation move whole heads."""
    if not c.m.rope:
        return []
    d, rd = c.m.head_dim, c.m.rotary_dims
    # Megatron-LM's legacy attention rotates k after repeat_interleave has expanded it to the query heads
    # (Framework.flash_layout_copies; FlagScale ed55532 transformer.py).
    kv = c.sh.heads if c.fw.flash_layout_copies else c.sh.kv_heads
    full, rot = c.tokens * (c.sh.heads + kv) * d, c.tokens * (c.sh.heads + kv) * rd
    if c.fw.fused_rope:
        # One kernel reads and writes every element of q and k (the passed dimensions copied through).
        return [Op("rope", phase, 3 * rot, 2 * c.b * full, (full,), False)]
    if c.fw.complex_rope:
        # q and k by separate chains: twice the kernels.
        return [_kern("rope", phase, rot, 3, 2 * c.b + COMPLEX_ROPE_FP32_BYTES, 2 * COMPLEX_ROPE_KERNELS)]
    # q and k are rotated by separate calls: the kernel count doubles.
    slices = ROPE_PARTIAL_SLICE_CAT if rd < d else ROPE_SLICE_CAT if c.fw.rope_slice_cat else None
    kernels, passes = slices[phase] if slices else (0, 0)
    byt = c.b * (ROPE_UNFUSED_PASSES * rot + passes * full)
    return [Op("rope", phase, 3 * rot, byt, (full,), False, kernels=2 * (ROPE_UNFUSED_KERNELS + kernels))]


def _qk_norms(c: Ctx, phase: str) -> list[Op]:
    """The q and k norms (ModelArch.qk_layernorm) on the rank's heads, after the QKV projection and before
    RoPE, each the profile's own norm kernel (`_norm`: one fused kernel each way, read and write the
    elements forward, read 2 write 1 backward; eager PyTorch's composite RMSNorm, EAGER_RMSNORM, under
    torchtitan), on every token of the micro-batch (the heads are TP-split, the sequence whole after the
    sequence-parallel AllGather): tokens x local heads x head_dim for q, x local KV heads for k (GQA).

    Megatron-Core (core_v0.14.0 megatron/core/transformer/attention.py SelfAttention.
    get_query_key_value_tensors): `query = self.q_layernorm(query)`, `key = self.k_layernorm(key)` on the
    split views of the QKV projection's output, then apply_rotary_pos_emb in forward; q_layernorm /
    k_layernorm are TENorm (megatron/core/models/gpt/gpt_layer_specs.py, backends `layer_norm(for_qk=True)`:
    Transformer Engine's RMSNorm or LayerNorm by config.normalization, hidden_size = head_dim). Transformer
    Engine from v1.9 makes a norm's input contiguous first (NVIDIA/TransformerEngine 399d8a782, "Fix wrong
    results for noncontiguous input"; v2.9 transformer_engine/pytorch/ops/basic/rmsnorm.py op_forward
    `input_.contiguous()`): the key, a strided view of the fused projection's output, is copied (read and
    write its elements), and so is the query when the rank holds one query group (its reshape to
    [s, b, np, hn] is then a strided view, not a copy); `qk_norm_copy`, forward only (the copy's backward
    passes the gradient through). Profiles whose q and k are views of one projection: Framework.
    qkv_split_cat. The weight gradients (dgamma, reduced over the rows inside the backward kernel) are
    added to main_grad by the DDP hook (`_layer_hook_adds`)."""
    if not c.m.qk_layernorm:
        return []
    d = c.m.head_dim
    q, k = c.tokens * c.sh.heads * d, c.tokens * c.sh.kv_heads * d
    norms = [_norm(c, "q_norm", phase, q, residual=False), _norm(c, "k_norm", phase, k, residual=False)]
    if phase == "bwd":
        return norms[::-1]
    if not c.fw.qkv_split_cat:
        return norms
    copied = k + (q if c.sh.kv_heads == 1 else 0)
    copy = Op(
        "qk_norm_copy", "fwd", 0, 2 * c.b * copied, (copied,), False, kernels=2 if c.sh.kv_heads == 1 else 1
    )
    return [copy, *norms]


def _qkv_split_cat(c: Ctx) -> list[Op]:
    """Backward of Megatron-Core's split of the QKV projection's output into q, k, v (Framework.
    qkv_split_cat), where RoPE made dq and dk tensors of their own: torch.cat of the three gradients, read
    and write q + 2 kv elements. Without RoPE whether they are adjacent depends on the attention backend
    (cuDNN's packed sbh3d gradient is; flash-attn's three are not): not modelled. The q and k norms'
    backward (ModelArch.qk_layernorm) makes new dq and dk tensors too."""
    if not (c.fw.qkv_split_cat and (c.m.rope or c.m.qk_layernorm)):
        return []
    q, kv = c.tokens * c.sh.heads * c.m.head_dim, c.tokens * c.sh.kv_heads * c.m.head_dim
    return [Op("qkv_grad_cat", "bwd", 0, 2 * c.b * (q + 2 * kv), (q + 2 * kv,), False)]


def _activation(c: Ctx, phase: str) -> list[Op]:
    """The MLP activation (GeLU, ReLU or squared ReLU, or a gated one: SwiGLU's silu(gate) * up, GeGLU's
    gelu(gate) * up) with, for GPT-style biases, the bias add."""
    m, t, f, b = c.m, c.tokens, c.sh.ffn, c.b
    up = (2 if m.gated else 1) * f
    act_f = ELEM_FLOPS[m.activation]
    bias = [] if c.fw.fused_bias_act else _bias(c, "mlp_up", phase, t * up)
    if m.gated and not c.fw.fused_swiglu:
        kernels, passes = (SWIGLU_UNFUSED_SPLIT if c.fw.swiglu_split_gemms else SWIGLU_UNFUSED)[phase]
        act = _kern("mlp_act", phase, t * f, act_f * (2 if phase == "bwd" else 1), passes * b, kernels)
    elif m.gated:
        act = _elem("mlp_act", phase, t * f, act_f, *((2, 1) if phase == "fwd" else (3, 2)), b)
    else:
        act = _elem("mlp_act", phase, t * f, act_f, *((1, 1) if phase == "fwd" else (2, 1)), b)
    if phase == "fwd":
        return [*bias, act]
    # Fused bias-activation: the bias gradient is still a reduction of the activation's input gradient, the
    # bias being the fused kernel's input whether or not the framework's GEMMs add theirs in the epilogue.
    grad_bias = _bias_grad(c, "mlp_up", t * up) if c.fw.fused_bias_act else bias
    return [act, *grad_bias]


def main_grad_hook_adds(c: Ctx, op: str, tensors: int, params: int) -> list[Op]:
    """Megatron-Core's DDP hook adding `tensors` parameter gradients (`params` parameters) that no fused
    weight-gradient GEMM accumulated into main_grad (Framework.main_grad_hook): `main_grad.add_(grad)`, a
    kernel per tensor reading main_grad (grad_bytes) and the gradient (dtype), writing main_grad."""
    if not c.fw.main_grad_hook or tensors == 0:
        return []
    if c.fw.main_grad_copy:  # Megatron-FSDP's sharded gradient buffer: main_grad.copy_(grad)
        return [_kern(op.replace("_add", "_copy"), "bwd", params, 0, c.grad_bytes + c.b, tensors)]
    return [_kern(op, "bwd", params, ELEM_FLOPS["add"], 2 * c.grad_bytes + c.b, tensors)]


def _layer_hook_adds(c: Ctx, dense_mlp: bool) -> list[Op]:
    """The hook's adds of one layer: every norm's gain (and LayerNorm bias: the two pre-norms and, with
    `qk_layernorm`, the q and k norms) and, with linear biases, those of QKV, the output projection and (a
    dense MLP) both MLP linears; the rank's shard of each."""
    m, sh = c.m, c.sh
    tensors, params = m.layer_norm_tensors, m.layer_norm_params
    if m.linear_bias:
        up = (2 if m.gated else 1) * sh.ffn
        biases = [(sh.heads + 2 * sh.kv_heads) * m.head_dim, m.hidden, *([up, m.hidden] if dense_mlp else [])]
        tensors, params = tensors + len(biases), params + sum(biases)
    return main_grad_hook_adds(c, "layer_main_grad_add", tensors, params)


def te_amax_update(c: Ctx, phase: str, layers: int) -> list[Step]:
    """Transformer Engine's amax reduction and scale update of one model chunk of `layers` layers for one
    micro-batch in `phase`: the concatenation of the amaxes (read and write 4 B each), their AllReduce over
    the TP group when it has more than one rank, and the fused update (read the reduced amax, read and
    write each tensor's TE_AMAX_HISTORY history, write scale and scale_inv). Nothing without TE FP8, nor
    under current scaling or MXFP8 (no amax history). With `fp8_amax_update: module` (TE before v1.6) the update is
    each module's own: TE_MODULE_UPDATE_KERNELS kernels per FP8 module of the chunk, which also copy each
    reduced amax back into its history (read and write 4 B more a tensor)."""
    if not c.te_fp8 or c.fp8_recipe != "delayed":
        return []
    scales = TE_SCALES_PER_MODULE[phase] * TE_MODULES_PER_LAYER * layers
    cat = Op("fp8_amax_concat", phase, 0, 2 * FP32 * scales, (scales,), False)
    reduce = [Comm("fp8_amax_allreduce", "all_reduce", FP32 * scales)] if c.sh.tp > 1 else []
    update_bytes = scales * FP32 * (1 + 2 * TE_AMAX_HISTORY + 2)
    if c.fp8_amax_update == "module":
        kernels = TE_MODULE_UPDATE_KERNELS * TE_FP8_META_MODULES_PER_LAYER * layers
        update = Op(
            "fp8_scale_update", phase, 0, update_bytes + 2 * FP32 * scales, (scales,), False, kernels=kernels
        )
        return [cat, *reduce, update]
    return [cat, *reduce, Op("fp8_scale_update", phase, 0, update_bytes, (scales,), False)]


def _branch_end(c: Ctx, where: str, phase: str, add: bool) -> list[Op]:
    """The end of one branch of a parallel-residual layer (`where` attn | mlp), before the TP reduction: the
    row-parallel linear's bias, hidden dropout and, for the second branch (`add`), the sum with the first,
    on the rank's partial output of every token (GPT-NeoX's bias_dropout_fn with residual=None for the
    attention, residual=attention_output for the MLP; c560814b megatron/model/transformer.py).

    Fused bias-dropout-add: one kernel (read the branch, with `add` the other branch too, write the result
    and the 1-byte mask; without dropout the add alone, or the bias add where there is no add). Unfused:
    the bias (a kernel where the GEMM does not add it), dropout, the add (read 2, write 1: `branch_sum`).
    Backward: the dropout's and the bias's gradient; the sum passes its gradient to both branches."""
    e, b = c.tokens * c.m.hidden, c.b
    bias_out = f"{where}_out"
    if c.fw.fused_bias_dropout_add:
        if phase == "bwd":
            drop = [_kern(f"{where}_bias_dropout", "bwd", e, ELEM_FLOPS["dropout"], 2 * b + MASK_BYTES)]
            return [*(drop if c.fw.dropout else []), *_bias_grad(c, bias_out, e)]
        op = f"{where}_bias_dropout{'_add' if add else ''}"
        if c.fw.dropout:
            flops = ELEM_FLOPS["dropout"] + (1 if add else 0)
            return [_kern(op, "fwd", e, flops, (3 if add else 2) * b + MASK_BYTES)]
        if add:
            return [_elem(op, "fwd", e, ELEM_FLOPS["add"], 2, 1, b)]
        return [_kern(f"{bias_out}_bias", "fwd", e, ELEM_FLOPS["add"], 2 * b)] if c.m.linear_bias else []
    drop = [_kern(f"{where}_hidden_dropout", phase, e, ELEM_FLOPS["dropout"], 2 * b + MASK_BYTES)]
    drop = drop if c.fw.dropout else []
    if phase == "bwd":
        return [*drop, *_bias(c, bias_out, "bwd", e)]
    total = [_elem("branch_sum", "fwd", e, ELEM_FLOPS["add"], 2, 1, b)] if add else []
    return [*_bias(c, bias_out, "fwd", e), *drop, *total]


def _parallel_layer_steps(c: Ctx, phase: str, dense_mlp: bool) -> list[Step]:
    """A parallel-residual layer (ModelArch.parallel_residual), x + attn(ln1(x)) + mlp(ln2(x)), as GPT-NeoX's
    gpt_j_residual runs it (c560814b megatron/model/transformer.py ParallelTransformerLayer.forward): both
    norms read the layer's input; the attention's and the MLP's row-parallel outputs stay partial
    (parallel_output=True), are summed locally and reduced over TP once (`layer_tp_out`,
    reduce_from_model_parallel_region), then added to the residual (`layer_residual`). Backward each
    branch's input gradient is still all-reduced after its column-parallel linear (copy_to_model_parallel_
    region of the QKV and MLP-up linears: `attn_tp_in`, `mlp_tp_in`), and the residual's gradient
    accumulates both norms' (`mlp_residual`, `attn_residual`), as in the sequential layer."""
    m, sh, b, t = c.m, c.sh, c.b, c.tokens
    d, nt = m.head_dim, c.norm_tokens
    q_kv = (sh.heads + 2 * sh.kv_heads) * d
    up = (2 if m.gated else 1) * sh.ffn
    full = t * m.hidden
    if phase == "fwd":
        return [
            _norm_fwd(c, "attn_norm"),
            *_amax_reduce(c, "qkv_proj"),
            *_norm_quantize(c, "qkv_proj"),
            *_tp_in(c, "attn_tp_in", True),
            *_linear(c, "qkv_proj", "fwd", t, m.hidden, q_kv),
            *_bias(c, "qkv_proj", "fwd", t * q_kv),
            *_qk_norms(c, "fwd"),
            *_rope(c, "fwd"),
            *attention_steps(c, "fwd"),
            *_fp8_cast(c, "attn_out_proj", "fwd", t * sh.heads * d),
            *_linear(c, "attn_out_proj", "fwd", t, sh.heads * d, m.hidden),
            *_branch_end(c, "attn", "fwd", add=False),
            _norm_fwd(c, "mlp_norm", dense_mlp),
            *(_amax_reduce(c, "mlp_up_gate") if dense_mlp else []),
            *_norm_quantize(c, "mlp_up_gate", dense_mlp),
            *_tp_in(c, "mlp_tp_in", True),
            *_linear(c, "mlp_up_gate", "fwd", t, m.hidden, up),
            *_activation(c, "fwd"),
            *_fp8_cast(c, "mlp_down", "fwd", t * sh.ffn),
            *_linear(c, "mlp_down", "fwd", t, sh.ffn, m.hidden),
            *_branch_end(c, "mlp", "fwd", add=True),
            *_tp_out(c, "layer_tp_out", True),
            _elem("layer_residual", "fwd", nt * m.hidden, ELEM_FLOPS["add"], 2, 1, b),
        ]
    return [
        *_tp_out(c, "layer_tp_out", False),
        *_branch_end(c, "mlp", "bwd", add=True),
        *_fp8_cast(c, "mlp_down", "bwd", full),
        *_linear(c, "mlp_down", "bwd", t, sh.ffn, m.hidden),
        *_activation(c, "bwd"),
        *_fp8_cast(c, "mlp_up_gate", "bwd", t * up),
        *(_fp8_transpose(c, "mlp_up_gate", t * m.hidden) if dense_mlp else []),
        *_linear(c, "mlp_up_gate", "bwd", t, m.hidden, up),
        *_tp_in(c, "mlp_tp_in", False),
        _norm(c, "mlp_norm", "bwd", nt * m.hidden),
        _elem("mlp_residual", "bwd", nt * m.hidden, ELEM_FLOPS["add"], 2, 1, b),
        *_branch_end(c, "attn", "bwd", add=False),
        *_fp8_cast(c, "attn_out_proj", "bwd", full),
        *_attention_bwd(c, dense_mlp),
    ]


def _attention_bwd(c: Ctx, dense_mlp: bool) -> list[Step]:
    """The attention block's backward from its output projection down to the layer input's residual and the
    layer's hook adds: the same in the sequential and the parallel-residual layer."""
    m, sh, b, t = c.m, c.sh, c.b, c.tokens
    d = m.head_dim
    nt = c.norm_tokens
    q_kv = (sh.heads + 2 * sh.kv_heads) * d
    return [
        *_linear(c, "attn_out_proj", "bwd", t, sh.heads * d, m.hidden),
        *attention_steps(c, "bwd"),
        *_rope(c, "bwd"),
        *_qk_norms(c, "bwd"),
        *_qkv_split_cat(c),
        *_bias(c, "qkv_proj", "bwd", t * q_kv),
        *_fp8_cast(c, "qkv_proj", "bwd", t * q_kv),
        *_fp8_transpose(c, "qkv_proj", t * m.hidden),
        *_linear(c, "qkv_proj", "bwd", t, m.hidden, q_kv),
        *_tp_in(c, "attn_tp_in", False),
        _norm(c, "attn_norm", "bwd", nt * m.hidden),
        _elem("attn_residual", "bwd", nt * m.hidden, ELEM_FLOPS["add"], 2, 1, b),
        *_layer_hook_adds(c, dense_mlp),
    ]


def layer_steps(c: Ctx, phase: str, dense_mlp: bool = True) -> list[Step]:
    """Ops and TP collectives of one transformer layer in execution order, as the context's framework runs it
    (`dense_mlp` False: the MLP is replaced by a MoE block, whose pre-MLP norm is not a LayerNormLinear's;
    a parallel-residual model: _parallel_layer_steps)."""
    if c.m.parallel_residual:
        return _parallel_layer_steps(c, phase, dense_mlp)
    m, sh, b, t = c.m, c.sh, c.b, c.tokens
    d = m.head_dim
    nt = c.norm_tokens
    q_kv = (sh.heads + 2 * sh.kv_heads) * d
    up = (2 if m.gated else 1) * sh.ffn
    fused_out_bias = c.fw.fused_bias_dropout_add  # row-parallel biases ride in bias-dropout-add
    if phase == "fwd":
        return [
            _norm_fwd(c, "attn_norm"),
            *_amax_reduce(c, "qkv_proj"),
            *_norm_quantize(c, "qkv_proj"),
            *_tp_in(c, "attn_tp_in", True),
            *_linear(c, "qkv_proj", "fwd", t, m.hidden, q_kv),
            *_bias(c, "qkv_proj", "fwd", t * q_kv),
            *_qk_norms(c, "fwd"),
            *_rope(c, "fwd"),
            *attention_steps(c, "fwd"),
            *_fp8_cast(c, "attn_out_proj", "fwd", t * sh.heads * d),
            *_linear(c, "attn_out_proj", "fwd", t, sh.heads * d, m.hidden),
            *_tp_out(c, "attn_tp_out", True),
            *_dropout_add(c, "attn", "fwd", fused_out_bias),
            _norm_fwd(c, "mlp_norm", dense_mlp),
            *(_amax_reduce(c, "mlp_up_gate") if dense_mlp else []),
            *_norm_quantize(c, "mlp_up_gate", dense_mlp),
            *_tp_in(c, "mlp_tp_in", True),
            *_linear(c, "mlp_up_gate", "fwd", t, m.hidden, up),
            *_activation(c, "fwd"),
            *_fp8_cast(c, "mlp_down", "fwd", t * sh.ffn),
            *_linear(c, "mlp_down", "fwd", t, sh.ffn, m.hidden),
            *_tp_out(c, "mlp_tp_out", True),
            *_dropout_add(c, "mlp", "fwd", fused_out_bias),
        ]
    return [
        *_row_grad_in(c, "mlp", "mlp_tp_out", "mlp_down", fused_out_bias),
        *_linear(c, "mlp_down", "bwd", t, sh.ffn, m.hidden),
        *_activation(c, "bwd"),
        *_fp8_cast(c, "mlp_up_gate", "bwd", t * up),
        *(_fp8_transpose(c, "mlp_up_gate", t * m.hidden) if dense_mlp else []),
        *_linear(c, "mlp_up_gate", "bwd", t, m.hidden, up),
        *_tp_in(c, "mlp_tp_in", False),
        _norm(c, "mlp_norm", "bwd", nt * m.hidden),
        _elem("mlp_residual", "bwd", nt * m.hidden, ELEM_FLOPS["add"], 2, 1, b),
        *_row_grad_in(c, "attn", "attn_tp_out", "attn_out_proj", fused_out_bias),
        *_attention_bwd(c, dense_mlp),
    ]


def attn_core_recompute(c: Ctx) -> list[Op]:
    """Selective recompute: the layer's forward attention-core ops (ATTN_CORE_OPS), in forward order."""
    return [s for s in layer_steps(c, "fwd") if isinstance(s, Op) and s.op in ATTN_CORE_OPS]


def op_sac_recompute(c: Ctx) -> list[Op]:
    """torchtitan's op-level selective AC (`recompute: selective-op`): what the layer's recompute runs.

    pytorch/torchtitan 9dec370ad torchtitan/parallelisms/parallelize_llama.py (`selective_ac_option =
    'op'`, 157a12c56 the same policy): each TransformerBlock is a non-reentrant checkpoint whose policy
    MUST_SAVEs the outputs of `_save_list` ops (aten.mm, the SDPA flash / efficient attention kernels,
    reduce_scatter_tensor, abs, max) except every second mm of the block ("Saves output of all compute ops,
    except every second mm"), PREFER_RECOMPUTE everything else. The block's mms in forward order are wq,
    wk, wv, wo, w1, w3, w2 (model.py: three nn.Linear for q, k, v; `self.w2(F.silu(self.w1(x)) * self.w3(x))`
    evaluates w1 before w3): wk, wo and w3 are recomputed, wq, wv, w1, w2 and the attention are not. The
    recompute re-runs the block's forward in the layer's backward, before its first backward op, and
    stops early (torch's default since 2.1) once w2's input, the last tensor the block saved, is packed:
    attn_norm, wk (its share of `qkv_proj`: kv_heads x head_dim columns), rope, attn_out_proj,
    attn_residual, mlp_norm, w3 (half of `mlp_up_gate`) and mlp_act; the cached ops cost nothing and the
    last residual add is never reached. TP collectives are not repeated (TP under torchtitan not read)."""
    m, sh, t, b = c.m, c.sh, c.tokens, c.b
    out: list[Op] = []
    for s in layer_steps(c, "fwd"):
        if not isinstance(s, Op) or s.op in ATTN_CORE_OPS:
            continue
        if s.op == "mlp_down":
            break
        if s.op == "qkv_proj":
            s = _gemm("qkv_proj", "fwd", t, m.hidden, sh.kv_heads * m.head_dim, b, c.fp8)
        elif s.op == "mlp_up_gate" and m.gated:
            s = _gemm("mlp_up_gate", "fwd", t, m.hidden, sh.ffn, b, c.fp8)
        out.append(s)
    return out


# MLA's up projections and RoPE (tracegen.mla's op names): what `mla_up_proj` re-runs.
MLA_UP_OPS: frozenset[str] = frozenset(
    {"mla_q_norm", "mla_q_up", "mla_q_proj", "mla_kv_norm", "mla_kv_up", "rope"}
)
# Megatron-Core's selective recompute modules (`recompute_modules`, tracegen.choices.RECOMPUTE_MODULES) as
# core_v0.14.0 (23e00ed096) runs them with the Transformer Engine layer spec (gpt_layer_specs.py
# get_gpt_layer_with_transformer_engine_spec), the order in which those sharing a backward step re-run there:
# - layernorm (transformer_layer.py: CheckpointWithoutOutput of input_layernorm and pre_mlp_layernorm when
#   not IdentityOp, discarded after the block and recomputed by a hook on the block's output gradient):
#   under the TE spec the dense layer's norms are inside TE's LayerNormLinear (IdentityOp: nothing), the
#   MoE layer's pre-MLP norm is a TENorm (`mlp_norm`, before the MoE block's backward) and so is an MLA
#   layer's input norm (`attn_norm`, before the output projection's backward and its gather).
# - moe (moe_layer.py MoELayer.forward: tensor_parallel.checkpoint of router, dispatch, experts, shared
#   experts and combine): the MoE block's forward, all-to-alls and TP collectives included, when its
#   backward begins.
# - shared_experts (moe_layer.py experts_compute: tensor_parallel.checkpoint of the shared experts): their
#   forward, collectives included, before their backward (under `moe` too: the checkpoint is nested, so
#   they run a third time).
# - moe_act (experts.py TEGroupedMLP.forward: CheckpointWithoutOutput of the weighted (bias-)activation,
#   hooked on fc2's output): `moe_expert_act` before fc2's backward (under `moe` too: a third run).
# - mlp (transformer_layer.py _forward_mlp, not for a MoELayer: tensor_parallel.checkpoint of self.mlp, TE's
#   LayerNormMLP-like block from the norm through fc2's TP collective): before fc2's backward.
# - mla_up_proj (multi_latent_attention.py: CheckpointWithoutOutput of qkv_up_proj_and_rope_apply, the
#   q/kv latent norms, up projections and RoPE, hooked on the attention output): before the attention
#   core's backward, and so before core_attn's recompute.
# - core_attn (attention.py `_checkpointed_attention_forward`): the attention core (ATTN_CORE_OPS) before
#   its first backward op, what `recompute: selective` always did.
# CheckpointWithoutOutput's hook copies the recomputed output into the discarded tensor's storage
# (tensor_parallel/random.py `_recompute`: untyped_storage().copy_), one copy a tensor: `<op>_restore`, read
# and write of the output (MLA: query, key and value, 3 copies). Collectives keep their forward sizes,
# marked forward (Comm.phase, MoE AllToAll.phase) so the trace tags them `recompute`.
RECOMPUTE_INSERT_ORDER = ("layernorm", "moe", "shared_experts", "moe_act", "mlp", "mla_up_proj", "core_attn")


def _op_name(s: object) -> str:
    return str(getattr(s, "op", ""))


def _replayed(steps: list) -> list:
    """Forward steps replayed inside a backward pass: their collectives marked forward."""
    return [s if isinstance(s, Op) else replace(s, phase="fwd") for s in steps]


def _restore(c: Ctx, op: Op, elems: int = 0, kernels: int = 1) -> Op:
    """CheckpointWithoutOutput's copy of a recomputed output (`elems`, default the op's) into its storage."""
    return _kern(f"{op.op}_restore", "fwd", elems or op.shape[0], 0, 2 * c.b, kernels)


def _named_in(*names: str) -> Callable[[object], bool]:
    """A backward step named one of `names` (a recompute module's place, with_recompute)."""
    return lambda s: _op_name(s) in names


def _named_from(prefix: str) -> Callable[[object], bool]:
    """A backward step whose name starts with `prefix` (the MoE block's, its shared experts')."""
    return lambda s: _op_name(s).startswith(prefix)


def recompute_module_steps(c: Ctx, fwd: list, module: str, moe_layer: bool) -> list[tuple[list, Callable]]:
    """What recompute module `module` re-runs in a layer whose forward steps are `fwd` (a MoE layer's when
    `moe_layer`), each as (steps, the backward step they run right before); [] where it has no part."""

    def named(names: Collection[str]) -> list[Op]:
        return [s for s in fwd if isinstance(s, Op) and s.op in names]

    def with_copy(ops: list[Op]) -> list[Op]:  # CheckpointWithoutOutput: the output copied back
        return [*ops, *(_restore(c, o) for o in ops)]

    core, mla = _named_in(*ATTN_CORE_OPS), c.m.mla
    if module == "core_attn":
        return [(named(ATTN_CORE_OPS), core)]
    if module == "mla_up_proj" and mla is not None:
        qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        qkv = c.tokens * c.sh.heads * (2 * qk + mla.v_head_dim)
        restore = _restore(c, Op("mla_qkv", "fwd", 0, 0, (qkv,), False), qkv, 3)
        return [([*named(MLA_UP_OPS), restore], core)]
    if module == "layernorm":
        moe_norm = [(with_copy(named({"mlp_norm"})), _named_from("moe_"))] if moe_layer else []
        attn_norm = with_copy(named({"attn_norm"}))
        return moe_norm + (
            [(attn_norm, _named_in("attn_tp_out", "attn_out_proj"))] if mla is not None else []
        )
    if module == "moe" and moe_layer:
        return [(_replayed([s for s in fwd if _op_name(s).startswith("moe_")]), _named_from("moe_"))]
    if module == "shared_experts" and moe_layer:
        shared = [s for s in fwd if _op_name(s).startswith("moe_shared_") and _op_name(s) != "moe_shared_add"]
        return [(_replayed(shared), _named_from("moe_shared_"))]
    if module == "moe_act" and moe_layer:
        return [
            (with_copy(named({"moe_expert_act"})), _named_in("moe_expert_down_fp8_cast", "moe_expert_down"))
        ]
    if module == "mlp" and not moe_layer:
        at = [i for i, s in enumerate(fwd) if isinstance(s, Op) and s.op == "mlp_norm"]
        ends = [i for i, s in enumerate(fwd) if _op_name(s) in ("mlp_down", "mlp_tp_out")]
        if not at or not ends:
            return []
        fc2 = _named_in("mlp_tp_out", "mlp_down_amax_allreduce", "mlp_down_fp8_cast", "mlp_down")
        return [(_replayed(fwd[at[0] : max(ends) + 1]), fc2)]
    return []


def with_recompute(bwd: list, fwd: list, c: Ctx, modules: Sequence[str], moe_layer: bool = False) -> list:
    """`bwd` (a layer's backward steps) with what the selective recompute `modules` re-run of its forward
    steps `fwd` inserted right before the backward step each feeds (RECOMPUTE_INSERT_ORDER's comment).

    The default modules, ("core_attn",), are Megatron's selective recompute as Korthikanti et al. 2022 ran
    it: the attention core alone, after the output projection's backward, before the core's backward.
    """
    inserts: dict[int, list] = {}
    for module in RECOMPUTE_INSERT_ORDER:
        if module not in modules:
            continue
        for steps, before in recompute_module_steps(c, fwd, module, moe_layer):
            at = next((i for i, s in enumerate(bwd) if before(s)), None)
            if steps and at is not None:
                inserts.setdefault(at, []).extend(steps)
    if not inserts:
        return list(bwd)
    out: list = []
    for i, s in enumerate(bwd):
        out += inserts.get(i, [])
        out.append(s)
    return out


def embedding_steps(c: Ctx, phase: str, tied_here: bool = False) -> list[Step]:
    """Vocab-parallel input embedding (first stage): gather of the token rows, the partial rows summed over
    TP, the learned position table's rows added (models with `positions` learned), then the embedding
    dropout (Megatron applies hidden dropout to the embedding output). Backward, the word table's gradient
    as Framework.embedding_bwd runs it and, under Framework.main_grad_hook, its accumulation into the
    main_grad of the gradient buffer's width, Ctx.grad_bytes (`tied_here`: the output layer on this rank
    shares the table)."""
    t, h, b = c.tokens, c.m.hidden, c.b
    e = c.norm_tokens * h
    if phase == "fwd":
        return [
            # gather: read each token's row, write it
            Op("embedding", "fwd", 0, 2 * t * h * b, (t, h), False),
            *_embedding_tp(c, True),
            *_embedding_norm(c, phase),
            *_positions(c, phase),
            *_embedding_transpose(c, phase),
            *_embedding_sp_clone(c),
            *_embedding_dropout(c, phase, e),
        ]
    return [
        *_embedding_dropout(c, phase, e),
        *_embedding_norm(c, phase),
        *_embedding_tp(c, False),
        *_embedding_transpose(c, phase),
        *_positions(c, phase),
        *embedding_grad(c, tied_here),
    ]


def _embedding_transpose(c: Ctx, phase: str) -> list[Op]:
    """The embedding output's [b, s, h] -> [s, b, h] copy (Framework.embedding_transpose), micro-batches of
    more than one sequence only: forward read and write t x h; backward the gradient made contiguous again
    by the dense backward of each lookup taking it, the word table's (not under embedding_bwd "index_put",
    whose index backward is not read here) and a learned position table's: read and write t x h each."""
    if not c.fw.embedding_transpose or c.mb == 1:
        return []
    e = c.tokens * c.m.hidden
    if phase == "fwd":
        return [_kern("embedding_transpose", phase, e, 0, 2 * c.b)]
    copies = (c.fw.embedding_bwd != "index_put") + (c.m.positions == "learned")
    return [_kern("embedding_transpose", phase, e, 0, 2 * c.b * copies, copies)] if copies else []


def _embedding_sp_clone(c: Ctx) -> list[Op]:
    """Megatron-Core's clone of the rank's sequence slice after the all-reduce-then-split embedding output
    under sequence parallelism (Framework.embedding_sp_clone): read and write norm_tokens x h, forward
    only. Not on the reduce-scatter path (_embedding_tp), whose output is the rank's own tensor."""
    if not (c.fw.embedding_sp_clone and c.sp and c.sh.tp > 1):
        return []
    if c.fw.embedding_reduce_scatter and c.m.positions != "learned":
        return []
    return [_kern("embedding_sp_clone", "fwd", c.norm_tokens * c.m.hidden, 0, 2 * c.b)]


def _embedding_norm(c: Ctx, phase: str) -> list[Op]:
    """The LayerNorm on the embedding output (ModelArch.embedding_norm, Megatron-DeepSpeed's
    --embed-layernorm), one kernel each way as every LayerNorm here (`_norm`: forward reads and writes the
    tensor, backward reads the gradient and the input and writes the input gradient), on the tokens the
    embedding output holds after its TP collective: all of them after the all-reduce (Megatron-DeepSpeed
    norms the all-reduced output), the rank's sequence slice after a reduce-scatter."""
    if not c.m.embedding_norm:
        return []
    sliced = c.sp and c.sh.tp > 1 and c.fw.embedding_reduce_scatter and c.m.positions != "learned"
    elems = (c.norm_tokens if sliced else c.tokens) * c.m.hidden
    rw = (1, 1) if phase == "fwd" else (2, 1)
    return [_elem("embedding_norm", phase, elems, ELEM_FLOPS["layernorm"], *rw, c.b)]


# embedding_dense_backward_cuda (aten/src/ATen/native/cuda/Embedding.cu) takes the sorted, FP32-partial path
# only above `num_indices <= 3072`; up to 3072 tokens one embedding_backward_feature_kernel adds the token
# rows into the zeroed table (read the gradient, read and write the row).
EMBEDDING_FEATURE_KERNEL_MAX_TOKENS = 3072


def embedding_grad(c: Ctx, tied_here: bool) -> list[Op]:
    """The word table's weight gradient (Framework.embedding_bwd) and its main_grad accumulation
    (Framework.main_grad_hook; the table, and a learned position table, are not fused linears).

    Per element of the t x h token gradient: the scatter-add reads the gradient and reads and writes the
    row (3 dtype); "dense" above 3072 tokens sums into FP32 partial segments and scatters them (dtype + 4 +
    4 + dtype).
    Per parameter of the vocab/TP x h shard: the zero fill writes dtype; on a rank whose output layer is
    tied to it, that layer's zeroed weight gradient (write dtype) and autograd's sum of the two (read 2
    dtype, write dtype); the hook's add reads main_grad and the gradient and writes main_grad."""
    t, h, b = c.tokens, c.m.hidden, c.b
    if c.fw.embedding_bwd == "dense" and t > EMBEDDING_FEATURE_KERNEL_MAX_TOKENS:
        rows = Op("embedding", "bwd", t * h, (2 * b + 2 * FP32) * t * h, (t, h), False, kernels=2)
    else:
        rows = Op("embedding", "bwd", t * h, 3 * t * h * b, (t, h), False)
    if not c.fw.embedding_bwd:
        return [rows]
    table = c.sh.vocab * h
    out = [Op("embedding_grad_zero", "bwd", 0, b * table, (c.sh.vocab, h), False), rows]
    if not c.fw.main_grad_hook:
        return out
    if tied_here:
        out.append(
            Op("embedding_tied_grad_sum", "bwd", table, 4 * b * table, (c.sh.vocab, h), False, kernels=2)
        )
    params = table + c.m.position_params
    if c.fw.main_grad_copy:  # Megatron-FSDP's sharded gradient buffer (Framework.main_grad_copy)
        out.append(Op("embedding_main_grad_copy", "bwd", 0, (c.grad_bytes + b) * params, (params,), False))
        return out
    out.append(
        Op("embedding_main_grad_add", "bwd", params, (2 * c.grad_bytes + b) * params, (params,), False)
    )
    return out


def _embedding_dropout(c: Ctx, phase: str, elems: int) -> list[Op]:
    """The embedding output's dropout (read, write, 1-byte mask), where the framework's model has dropout."""
    if not c.fw.dropout:
        return []
    return [_kern("embedding_dropout", phase, elems, ELEM_FLOPS["dropout"], 2 * c.b + MASK_BYTES)]


def _embedding_tp(c: Ctx, fwd: bool) -> list[Step]:
    """The embedding output's TP collective (`embedding_tp_out`). Under sequence parallelism a profile with
    Framework.embedding_reduce_scatter on a model without a learned position table reduce-scatters the
    partial rows into the rank's slice; otherwise (Megatron-Core <= 0.7, Megatron-LM 2022, Megatron-
    DeepSpeed, and every learned-position model) they are all-reduced whole and the slice is a view of the
    sum, whose backward is the same AllGather of the gradient."""
    steps = _tp_out(c, "embedding_tp_out", fwd)
    if fwd and c.sp and steps and (not c.fw.embedding_reduce_scatter or c.m.positions == "learned"):
        return [Comm("embedding_tp_out", "all_reduce", c.tokens * c.m.hidden * c.b)]
    return steps


def _positions(c: Ctx, phase: str) -> list[Op]:
    """The learned position table's rows for the micro-batch's tokens, whole on every TP rank (before the
    sequence-parallel split). Forward, two kernels: the lookup (read and write t x h) and the add into the
    embedding output (read 2, write 1) (Megatron's LanguageModelEmbedding.forward `word_embeddings +
    position_embeddings`, megatron/core/models/common/embeddings/language_model_embedding.py of
    core_v0.6.0; llm-foundry's MPTModel `tok_emb + pos_emb`). Backward: the add passes its gradient through
    (no kernel); the lookup's backward scatter-adds the t x h gradient rows into the s x h table gradient
    (read the gradient, read and write the table: torch.nn.Embedding's dense backward)."""
    if c.m.positions != "learned":
        return []
    t, h, b = c.tokens, c.m.hidden, c.b
    if phase == "fwd":
        return [Op("position_embedding", "fwd", t * h, (2 + 3) * t * h * b, (t, h), False, kernels=2)]
    return [Op("position_embedding", "bwd", t * h, t * h * b + 2 * c.s * h * b, (t, h), False)]


def head_steps(c: Ctx, phase: str) -> list[Step]:
    """Final norm, vocab-parallel output projection and softmax cross-entropy (last stage).

    The loss is the framework's cross-entropy (Framework.loss, XENT): Megatron's vocab-parallel one on FP32
    logits, eager F.cross_entropy on the FP32 cast, one fused kernel each way on the 16-bit logits, or
    Transformer Engine's Triton parallel cross-entropy (the spec's `loss_impl: te`).
    """
    m, sh, b, t = c.m, c.sh, c.b, c.tokens
    logits = t * sh.vocab
    # (kernels, bytes per local logit) of the loss, forward and backward
    xent = {ph: (k, passes * b + fp32) for ph, (k, passes, fp32) in XENT[c.fw.loss].items()}
    # The loss's TP collectives (XENT_TP), in the order its code issues them, before the loss's kernels:
    # Megatron's vocab-parallel cross-entropy all-reduces max, target logit and sum-exp (FP32, per token) one
    # by one; TE all-gathers each rank's three (all_gather_into_tensor of the n_rows x 3 FP32 m_d_X_y,
    # triton/cross_entropy.py cross_entropy_forward, TE v2.9).
    xent_kind, xent_comms = XENT_TP[c.fw.loss]
    xent_ar = [Comm(name, xent_kind, n * t * 4) for name, n in xent_comms] if sh.tp > 1 else []
    if phase == "fwd":
        return [
            _norm(c, "final_norm", "fwd", c.norm_tokens * m.hidden),
            *_tp_in(c, "head_tp_in", True),
            _gemm("lm_head", "fwd", t, m.hidden, sh.vocab, b),
            *xent_ar,
            Op(
                "loss", "fwd", ELEM_FLOPS["xent"] * logits, logits * xent["fwd"][1], (t, sh.vocab), False,
                kernels=xent["fwd"][0],
            ),
        ]  # fmt: skip
    return [
        Op(
            "loss",
            "bwd",
            2 * logits,
            logits * xent["bwd"][1],
            (t, sh.vocab),
            False,
            kernels=xent["bwd"][0],
        ),
        _gemm("lm_head", "bwd", t, m.hidden, sh.vocab, b),
        *_tp_in(c, "head_tp_in", False),
        _norm(c, "final_norm", "bwd", c.norm_tokens * m.hidden),
        *main_grad_hook_adds(c, "final_norm_main_grad_add", 2 if m.norm == "layernorm" else 1, m.norm_params),
    ]


def rank_params(m: ModelArch, sh: Shard, layers: int, first: bool, last: bool) -> int:
    """Parameters one TP rank holds for `layers` layers (+ embedding / head shards on the end stages)."""
    d = m.head_dim
    qkv = (sh.heads + 2 * sh.kv_heads) * d
    up = (2 if m.gated else 1) * sh.ffn
    attn = m.hidden * qkv + sh.heads * d * m.hidden + ((qkv + m.hidden) if m.linear_bias else 0)
    mlp = m.hidden * up + sh.ffn * m.hidden + ((up + m.hidden) if m.linear_bias else 0)
    per_layer = attn + mlp + m.layer_norm_params  # norms are replicated across TP ranks (q, k norms too)
    total = layers * per_layer
    if first:
        total += embedding_rank_params(m, sh)
    if last:
        total += head_rank_params(m, sh, first)
    return total


def embedding_rank_params(m: ModelArch, sh: Shard) -> int:
    """The embedding's parameters on a first-stage TP rank: its vocab/TP x hidden shard of the word table
    and, with learned positions, the whole position table (Megatron keeps it whole on every TP rank, a
    plain torch.nn.Embedding, not marked for a TP gradient reduction: each rank's gradient is already the
    full sequence's after the sequence-parallel AllGather) and the embedding LayerNorm's 2 x hidden
    (ModelArch.embedding_norm; replicated on every TP rank like the layers' norms)."""
    return sh.vocab * m.hidden + m.position_params + m.embedding_norm_params


def head_rank_params(m: ModelArch, sh: Shard, first: bool) -> int:
    """The head's parameters on a last-stage TP rank: the final norm (replicated across TP) and its
    vocab/TP x hidden output matrix, unless the model ties it to the embedding and this rank holds that
    (`first`): then it is the embedding's tensor, counted once (one gradient, one Adam update)."""
    return m.norm_params + (0 if m.tied and first else sh.vocab * m.hidden)


def optimizer_op(params: int, b: int, grad_bytes: int | None = None) -> Op:
    """AdamW on `params` parameters as one op: reads the gradient, writes the weight, reads/writes FP32 state.

    `grad_bytes` is the gradient's width (default `b`; 4 under the distributed optimizer, whose gradient
    buffer is FP32 for BF16 training). The planner's estimate (xsim/explore) uses it; the generator emits
    the whole step, `optimizer_steps`.
    """
    g = b if grad_bytes is None else grad_bytes
    return Op(
        "optimizer",
        "opt",
        ADAM_FLOPS_PER_PARAM * params,
        params * (g + b + ADAM_STATE_BYTES),
        (params,),
        False,
    )


@dataclass(frozen=True)
class OptimizerStep:
    """Megatron's optimizer step on one rank, in order: (FP16: unscale and inf check, then its AllReduce),
    gradient norm, its AllReduce, clipping, Adam, the parameter copy; then zeroing the gradient buffer."""

    before: tuple[Step, ...]  # up to and including the grad-norm AllReduce (Comm steps: model-parallel group)
    after: tuple[Op, ...]  # clip, Adam, parameter copy, zero_grad


def optimizer_steps(
    params: int,
    shard: int,
    b: int,
    grad_bytes: int,
    precision: str = "bf16",
    fp8_params: int = 0,
    fp8_recipe: str = "delayed",
    fp8_shard: int | None = None,
) -> OptimizerStep:
    """The whole optimizer step of a rank holding `params` parameters and updating `shard` of them (all of
    them, or its 1/DP shard under the distributed optimizer), with gradients `grad_bytes` wide.

    Megatron (megatron/core/optimizer/optimizer.py, MixedPrecisionOptimizer.step and
    clip_grads.py): FP16 only, unscale the main gradients and check them for inf/NaN (read and write each,
    `_unscale_main_grads_and_check_for_nan`) and all-reduce the found-inf flag; compute the gradient norm
    (read each gradient, multi_tensor_l2norm) and all-reduce its square (one FP32) over the model-parallel
    group (and the DP group under the distributed optimizer, whose ranks hold disjoint shards); clip
    (scale each gradient: read, write); Adam on the FP32 master weights (gradient, master weight and both
    moments: g + 24 bytes); copy the master weights into the `dtype_bytes` model weights (read 4, write b);
    zero the gradient buffer for the next iteration (write each gradient; the whole buffer, not the shard).
    Under `precision: fp8` Transformer Engine re-casts the updated linear weights to FP8 with their
    transposes once per iteration (read b, write 2 bytes per weight of `fp8_params`; under `fp8_recipe`
    current each weight's amax pass reads it once more, CS_QUANTIZE_KERNELS kernels).
    FP8 parameters (spec fp8_params; `fp8_shard` of the `shard` parameters are FP8 linear weights, delayed
    scaling): the parameter copy takes those master weights to the model dtype, then casts them to FP8 into
    the uint8 parameter buffer (read 4, write b; read b, write 1: two kernels; Megatron-Core core_r0.9.0
    1afee59 distrib_optimizer.py _copy_main_params_to_model_params, `shard_main_param.to(model_param.dtype)`
    then `cast_to_fp8`, unchanged to core_r0.11.0); no BF16 weight is left for TE to cast, it only
    transposes the all-gathered FP8 weights once (read 1, write 1 per weight of `fp8_params`; TE v1.6
    linear.py `weight.transpose_2d(cache=...)`, the cache reset after the gather by
    _update_fp8_scale_inv_and_amax's `param._reset_caches()`). That method's amax all-reduce (one FP32 per
    FP8 weight tensor over DP) is left out.
    Under `fp8_recipe` current the copy goes through TE's cast_master_weights_to_fp8 (Megatron-Core
    core_v0.15.0 fp8_utils.py _quantize_param_shard_impl; TE v2.9 transformer_engine/pytorch/tensor/utils.py
    _cast_master_weights_to_fp8_current_scaling): the master shard taken to the model dtype (read 4, write
    b), `tex.compute_amax` of it (read b: the one extra pass, one more kernel), the amaxes' all-reduce (MAX
    over DP, left out as above) and one multi_tensor_compute_scale_and_scale_inv, then the cast with that
    scale (read b, write 1): 4 + 3 b + 1 bytes per FP8 weight in 3 kernels, the scale kernel uncounted.
    Under `fp8_recipe` mxfp8 the weights are all-gathered in the model dtype (workload.py: no `fp8_shard`)
    and every weight of `fp8_params` is quantized once an iteration (_mx_quantize: read b, write both MXFP8
    copies and their scales, one kernel; Megatron-Core's copy into the MXFP8 parameter after the gather, or
    TE's cast of the BF16 weight without FP8 parameters).
    """
    g = grad_bytes
    before: list[Step] = []
    if precision == "fp16":
        before += [
            _kern("grad_unscale", "opt", shard, 2, 2 * g),
            Comm("found_inf_allreduce", "all_reduce", FP32),
        ]
    before += [_kern("grad_norm", "opt", shard, 2, g), Comm("grad_norm_allreduce", "all_reduce", FP32)]
    after = [
        _kern("grad_clip", "opt", shard, 1, 2 * g),
        Op("optimizer", "opt", ADAM_FLOPS_PER_PARAM * shard, shard * (g + ADAM_STATE_BYTES), (shard,), False),
        _kern("param_copy", "opt", shard, 0, FP32 + b),
    ]
    if fp8_shard is not None:
        # FP8 weights: FP32 -> model dtype -> FP8, 4 + b + b + 1 bytes instead of FP32 + b; current scaling
        # reads the model-dtype copy once more for its amax (4 + 3 b + 1, a third kernel)
        current = fp8_recipe == "current"
        copy = shard * (FP32 + b) + fp8_shard * (b + 1 + (b if current else 0))
        kernels = (3 if current else 2) if fp8_shard else 1
        after[-1] = Op("param_copy", "opt", 0, copy, (shard,), False, kernels=kernels)
        if fp8_params:
            after.append(_kern("fp8_weight_transpose", "opt", fp8_params, 0, 2))
    elif fp8_params and fp8_recipe == "mxfp8":
        nbytes = fp8_params * b + mx_written_bytes(fp8_params)
        after.append(Op("fp8_weight_cast", "opt", 0, nbytes, (fp8_params,), False, kernel=MX_QUANTIZE_KERNEL))
    elif fp8_params and fp8_recipe == "current":
        after.append(_kern("fp8_weight_cast", "opt", fp8_params, 0, 2 * b + 2, CS_QUANTIZE_KERNELS))
    elif fp8_params:
        after.append(_kern("fp8_weight_cast", "opt", fp8_params, 0, b + 2))
    after.append(_kern("zero_grad", "opt", params, 0, g))
    return OptimizerStep(tuple(before), tuple(after))


# DeepSpeed BF16_Optimizer.update_hp_grads, per parameter tensor and micro-batch:
# hp_grad.add_(lp.grad.to(float32)): the cast reads the BF16 gradient (2) and writes an FP32 copy (4), the
# add reads both FP32 tensors (4 + 4) and writes the sum (4) = 18 bytes per parameter in 2 kernels.
HP_GRAD_BYTES_PER_PARAM, HP_GRAD_KERNELS_PER_TENSOR = 18, 2


def param_tensors(m: ModelArch, layers: int, first: bool, last: bool) -> int:
    """Parameter tensors of `layers` layers (+ embedding / head): per layer the four linear weights, their
    biases (GPT-style models) and each norm's gain (+ bias for LayerNorm; the q and k norms too)."""
    norm = 2 if m.norm == "layernorm" else 1
    per_layer = 4 + (4 if m.linear_bias else 0) + m.layer_norm_tensors
    head = norm + (0 if m.tied and first else 1)  # a tied output matrix is the embedding's tensor
    # the word table, the position table and the embedding LayerNorm's gain and bias
    emb = 1 + (1 if m.positions == "learned" else 0) + (2 if m.embedding_norm else 0)
    return layers * per_layer + (emb if first else 0) + (head if last else 0)


def hp_grad_accumulation(params: int, tensors: int) -> Op:
    """DeepSpeed's BF16_Optimizer copy of one micro-batch's BF16 gradients into the FP32 accumulation
    buffer (`params` parameters in `tensors` tensors, a cast and an add each)."""
    return Op(
        "grad_accum_fp32", "bwd", params, HP_GRAD_BYTES_PER_PARAM * params, (params,), False,
        kernels=HP_GRAD_KERNELS_PER_TENSOR * tensors,
    )  # fmt: skip


def linear_params(m: ModelArch, sh: Shard, layers: int) -> int:
    """Weights of the FP8 linear layers (QKV, output, MLP up/gate and down) one TP rank holds."""
    d = m.head_dim
    qkv = (sh.heads + 2 * sh.kv_heads) * d
    up = (2 if m.gated else 1) * sh.ffn
    return layers * (m.hidden * qkv + sh.heads * d * m.hidden + m.hidden * up + sh.ffn * m.hidden)


def op_seconds(op: Op, gpu: GpuSpec, model: str = "roofline", rates: str = "sustained") -> float:
    """Seconds of `op` on `gpu` under a compute model ("roofline" or "calibrated"), without a profile.

    roofline: GEMM-like ops max(FLOPs / (tensor peak of the op's precision * gemm_eff), bytes / (bw *
    mem_eff)), element-wise ops bytes / (bw * mem_eff). calibrated (tracegen.gemm): GEMMs by tile and wave
    quantization of their shape at the GPU's measured large-GEMM plateau (sustained or burst: `rates`);
    fused attention at its kernel's published rate by tiles executed (tracegen.attention; gemm_eff on GPUs
    without one), scaled to the sustained clock like the GEMMs; memory-bound work at the measured copy bandwidth
    (unfused attention's kernels at their measured share of it, tracegen.unfused_attention); every op at least
    one launch floor per kernel.
    """
    if model == "calibrated":
        if op.gemm and op.op in GROUPED_GEMM_OPS and len(op.shape) == 4:
            return grouped_gemm_seconds(op.shape, op.bytes, gpu, op.precision, op.phase, rates)
        # Unfused attention's kernels move their bytes at their measured share of the copy rate
        # (tracegen.unfused_attention; 1.0 for every other op): the same bytes, charged as more.
        nbytes = op.bytes / bandwidth_fraction(gpu, op.op, op.phase)
        if op.gemm and op.op in GEMM_OPS:
            batch, (mm, k, n) = (op.shape[0], op.shape[1:]) if len(op.shape) == 4 else (1, op.shape)
            return linear_seconds(
                LinearGemm(mm, k, n, op.phase, op.kernels, batch), nbytes, gpu, op.precision, rates
            )
        floor = op.kernels * LAUNCH_FLOOR_S if op.bytes or op.flops else 0.0
        compute = op.flops / (tensor_peak(gpu, op.precision) * gpu.gemm_eff) if op.gemm else 0.0
        if op.op == "attn_core" and len(op.shape) == 5:
            # The attention kernel is timed at the same power-limited clock as the BF16 GEMMs.
            clock = sustained_ratio(gpu, "bf16") if rates == "sustained" else 1.0
            flash = flash_compute_seconds(op.shape, op.phase, gpu, op.kernel, clock, op.dropout)
            if flash is not None:
                # The last wave's tail at this op's grid against the benchmark's (few heads per TP rank).
                flash *= fa2_grid_factor(op.shape, op.phase, gpu, op.kernel)
            compute = compute if flash is None else flash
        elif op.calls and op.kernel:
            flash = cp_attention_seconds(
                op, gpu, sustained_ratio(gpu, "bf16") if rates == "sustained" else 1.0
            )
            compute = compute if flash is None else flash
        return max(compute, nbytes / achieved_bandwidth(gpu, op.kernel), floor)

    mem = op.bytes / (gpu.mem_bw * gpu.mem_eff)
    if op.gemm:
        return max(op.flops / (tensor_peak(gpu, op.precision) * gpu.gemm_eff), mem)
    return mem


def cp_attention_seconds(op: Op, gpu: GpuSpec, clock: float) -> float | None:
    """A context-parallel attention op's time: its fused attention calls (Op.calls) each at its kernel's
    rate for its query and key lengths and mask (tracegen.attention.flash_compute_seconds), summed; the
    slowest rank's sum where the op lists several ranks'; None without a calibrated rate."""
    b, h, kvh, _s, d = op.shape[:5]
    worst = 0.0
    for calls in op.calls:
        total = 0.0
        for q, kv, causal in calls:
            shape = (b, h, kvh, q, d)
            t = flash_compute_seconds(shape, op.phase, gpu, op.kernel, clock, op.dropout, kv, bool(causal))
            if t is None:
                return None
            if q == kv:  # the FA2 launch's tail (A100) is read for square calls only
                t *= fa2_grid_factor(shape, op.phase, gpu, op.kernel, bool(causal))
            total += t
        worst = max(worst, total)
    return worst


def op_time_seconds(
    op: Op,
    gpu: GpuSpec,
    profile: ProfileTable | None = None,
    model: str = "roofline",
    rates: str = "sustained",
) -> float:
    """Seconds of `op` on `gpu`: the profiled time if the table has the shape, else `op_seconds`."""
    measured = profile.lookup(gpu.name, op.op, op.phase, op.shape) if profile else None
    return measured * 1e-6 if measured is not None else op_seconds(op, gpu, model, rates)


def duration_micros(
    op: Op,
    gpu: GpuSpec,
    profile: ProfileTable | None = None,
    model: str = "roofline",
    rates: str = "sustained",
) -> int:
    """Whole microseconds of `op` on `gpu` (Chakra's duration_micros): `op_time_seconds` rounded to the
    nearest microsecond, at least 1 for an op that does any work."""
    return _whole_units(op_time_seconds(op, gpu, profile, model, rates), 1e6)


def duration_ns(
    op: Op,
    gpu: GpuSpec,
    profile: ProfileTable | None = None,
    model: str = "roofline",
    rates: str = "sustained",
) -> int:
    """Nanoseconds of `op` on `gpu` (the exact value the replay uses): rounded, at least 1 for real work."""
    return _whole_units(op_time_seconds(op, gpu, profile, model, rates), 1e9)


def _whole_units(seconds: float, per_second: float) -> int:
    # Rounded to the nearest unit, and never 0 for an op that takes any time (0 means "no work" in Chakra).
    if seconds <= 0:
        return 0
    return max(1, int(seconds * per_second + 0.5))
