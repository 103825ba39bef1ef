"""Names a deployment spec chooses from: precision, attention, compute model, framework, GEMM rates, reshard.

Plain tuples in a module that imports nothing, so that reading a deployment.json (`xsim replay`) need not
load the op cost model (tracegen.ops) or the reshard strategies (tracegen.planner.reshard) to check them.
"""

from __future__ import annotations

PRECISIONS = ("bf16", "fp16", "fp8")
# Transformer Engine's FP8 scaling recipe under `precision: fp8` (`fp8_recipe`); the first is the default.
# "mxfp8": TE's MXFP8BlockScaling (Blackwell's block-scaled FP8, 1x32 blocks with E8M0 scales; Megatron-Bridge
# precision "fp8_mx", bf16_with_mxfp8_mixed).
FP8_RECIPES = ("delayed", "current", "mxfp8")
# Where Transformer Engine's delayed scaling updates amax histories and scales (`fp8_amax_update`); the first
# is the default. "region": once per fp8_autocast region and pass (TE >= v1.6, reduce_and_update_fp8_tensors);
# "module": every FP8 module in its own forward and backward prep, each micro-batch (TE before v1.6).
FP8_AMAX_UPDATES = ("region", "module")
ATTENTIONS = ("flash", "unfused")
# Gated MLP activations (a model's `activation`): the up projection is two (gate and up, 2 x ffn wide) and
# the activation multiplies act(gate) by up. swiglu: silu; geglu: GeLU (tanh), Gemma's gelu_pytorch_tanh
# gate (HF GemmaMLP; Megatron-Core's `gated_linear_unit` with `activation_func` gelu, fused as
# megatron/core/fusions/fused_bias_geglu.py under bias_activation_fusion).
GATED_ACTIVATIONS = ("swiglu", "geglu")
COMPUTE_MODELS = ("roofline", "calibrated")
# tracegen.frameworks.FRAMEWORK_NAMES (a test keeps them equal); the first is the default.
FRAMEWORKS = (
    "megatron-core",
    "megatron-2021",
    "megatron-2022",
    "megatron-deepspeed",
    "megatron-core-0.7",
    "torchtitan",
    "flagscale-2023",
    "internlm",
    "gpt-neox",
)
# `rmsnorm_impl` (framework: torchtitan): the RMSNorm its code ran, tracegen.ops.EAGER_RMSNORM's keys and
# "fused" (one kernel forward, one backward: torchtitan's norm_type fused_rmsnorm, a Triton kernel).
RMSNORM_IMPLS = ("torch", "torchtitan-2024", "fused")
# `loss_impl` (megatron-core profiles): Megatron-Core's cross-entropy, tracegen.ops.XENT's keys. "megatron"
# (the profile's): tensor_parallel.vocab_parallel_cross_entropy on FP32 logits (cross_entropy_loss_fusion
# off); "te": cross_entropy_loss_fusion with cross_entropy_fusion_impl "te" (language_module.py
# compute_language_model_loss at Megatron-LM 0d8e0714cd: TE's parallel_cross_entropy).
LOSS_IMPLS = ("megatron", "te")
# tracegen.gemm.GEMM_RATES; the first is the default.
GEMM_RATES = ("sustained", "burst")
# tracegen.gemm.BOARD_LOADS; the first is the default: `board_load`, how loaded the GPUs' boards are.
BOARD_LOADS = ("job", "full", "alone")
# tracegen.attention.KERNELS (a test keeps them equal): `attention_kernel`, the fused attention kernel (on
# Hopper; on Ampere "fa1" and "triton" differ from FlashAttention-2).
ATTENTION_KERNELS = ("fa2", "fa1", "fa3", "cudnn", "triton")
# Width of the data-parallel gradient reduction (`grad_reduce_dtype`) and its bytes per element.
GRAD_REDUCE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
GRAD_REDUCE_DTYPES = tuple(GRAD_REDUCE_BYTES)
# `sharding`: "none", ZeRO-3 / FSDP (two names for one scheme: per-layer parameter gathers), or Megatron-Core's
# own FSDP ("megatron-fsdp", megatron/core/distributed/fsdp at 0d8e0714cd, Megatron-Bridge v0.2.0's pin).
SHARDINGS = ("none", "zero3", "fsdp", "megatron-fsdp")
# `data_parallel_sharding_strategy` under sharding: megatron-fsdp, Megatron's --data-parallel-sharding-strategy
# less "no_shard" (plain DDP: sharding none): what the DP ranks shard (megatron_fsdp/param_and_grad_buffer.py
# _init_each_parameter_group_buffers): the optimizer state (optim), and the gradients (optim_grads), and the
# parameters (optim_grads_params).
MFSDP_STRATEGIES = ("optim_grads_params", "optim_grads", "optim")
# `fsdp_backward_prefetch`, PyTorch FSDP's BackwardPrefetch by its member names (torch.distributed.fsdp.api):
# BACKWARD_PRE (PyTorch's default, the first), BACKWARD_POST (Composer's default), or None.
FSDP_BACKWARD_PREFETCH = ("pre", "post", "none")
# `dist_optimizer_impl`: who reduces the gradients under the distributed optimizer with a megatron-core
# framework: Megatron-Core's DDP (the default) or Apex's DistributedFusedAdam (NeMo 1's distributed_fused_adam).
DIST_OPTIMIZER_IMPLS = ("megatron-core", "apex")
# The keys of tracegen.planner.reshard.STRATEGIES, in its order (a test keeps them equal).
RESHARD_STRATEGIES = ("xsim", "hetauto", "alpacomm", "naive")
# `batch_input`: the batch's host-to-device copy and TP broadcast each micro-batch (tracegen.batch_input).
BATCH_INPUTS = ("megatron", "megatron-no-mask", "nemo", "none")
# `recompute_modules` (recompute: selective, framework: megatron-core): Megatron-Core's
# --recompute-modules, the allowed set of megatron/core/transformer/transformer_config.py
# `recompute_modules` at core_v0.14.0 (23e00ed096; "shared_experts" arrived after core_v0.13.0). Its
# default is ["core_attn"], what `recompute: selective` always recomputed (tracegen.ops.with_recompute).
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)
