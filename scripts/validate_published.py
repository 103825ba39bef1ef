"""Validate xsim against published, measured training runs (docs/validation.md).

Each run of scripts/data/published_runs.yaml (source, table, row, full configuration, measured time per
iteration) becomes an xsim deployment spec, is generated and replayed through the library (tracegen,
netmodels, replay: no CLI output is parsed), and is compared with the measured time. The script prints the
Markdown tables (run, source, configuration, measured, predicted, error; the median |error|, max and count
within +-10%; the model-FLOPs utilisation of a data-parallel Llama-2 7B on 8 A100s; the per-layer times of
the 22B layer of Korthikanti et al. Table 4; the runs left out) and with --out writes them into the
generated blocks of docs/validation.md, leaving the hand-written text around them as it is.

    python scripts/validate_published.py --out docs/validation.md      # refresh the page
    python scripts/validate_published.py --only korthikanti22-t5-22b-full --no-layers
    python scripts/validate_published.py --max-nodes 500000 --no-layers   # the quick rows only

A run setting one of issue 22's spec keys (framework, gemm_rates, overlap_grad_reduce,
overlap_param_gather, tp_comm_overlap, grad_reduce_dtype, sharding, attention_kernel) that this checkout's tracegen does not
accept is reported as "needs feature <key>", not replayed; the keys are written only when the run sets them.

Speed: a run with data parallelism generates and replays one DP replica (a compact set, folded by
construction; a fold the network model times differently for another replica is replayed unfolded, the
tables equal either way). Every run is replayed at its real micro-batch and GPU counts; --max-nodes
bounds the nodes of one replica, and a run over it is listed as not replayed, with its node estimate.
Only with --extrapolate is such a run replayed at two smaller micro-batch counts m1 < m2 (multiples of the
pipeline depth, where 1F1B is in steady state) and its time extrapolated linearly to the real count m:
T(m) = T(m1) + (m - m1) (T(m2) - T(m1)) / (m2 - m1); the table says so on that row
(tests/test_validate_published.py checks the extrapolation against a full replay).

No calibration constant is read from or fitted to these runs: they are the validation set.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DATA = Path(__file__).resolve().parent / "data" / "published_runs.yaml"

# `selective-op`: torchtitan's op-level selective activation checkpointing (tracegen.ops.op_sac_recompute).
RECOMPUTE = ("none", "selective", "full", "selective-op")
# The dataset's precision words: "fp16" and "bf16" as the source's launch flags say; "mixed16" where the
# paper says only "mixed precision" (16-bit). The A100's dense FP16 and BF16 tensor peaks are equal
# (312 TFLOP/s, NVIDIA A100 datasheet), so the GEMMs do not depend on the mapping; Megatron-LM's gradient
# path does (tracegen/grad_path.py: under megatron-2022, fp16 accumulates every micro-batch's gradients in
# a kernel of its own, bf16 in the weight-gradient GEMM). "mixed16" stays bf16, as before that path existed.
PRECISION_SPEC = {"fp16": "fp16", "bf16": "bf16", "mixed16": "bf16", "fp8": "fp8"}
ATTENTION = ("flash", "unfused")
MODEL_KEYS = ("layers", "hidden", "heads")
# Optional architecture keys of a run's model block (defaults: the GPT of the Megatron papers, FFN 4h, GELU,
# LayerNorm, biases, kv_heads = heads; seq_len and vocab from the source's defaults).
MODEL_OPTIONAL = (
    "ffn_hidden",
    "kv_heads",
    "activation",
    "norm",
    "linear_bias",
    "tie_embeddings",
    "position_embedding",
    "embedding_norm",
    "parallel_residual",
    "rotary_pct",
    "qk_layernorm",
    "seq_len",
    "vocab",
)
ACTIVATIONS = ("gelu", "swiglu", "squared-relu", "relu", "geglu")  # tracegen.models.ACTIVATIONS
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("rope", "learned", "alibi", "none")  # tracegen.models.POSITION_EMBEDDINGS
PARALLEL_KEYS = ("tp", "pp", "dp", "micro_batch", "global_batch", "virtual_stages")
# Spec keys of issue 22 (and the distributed optimizer), written into a run's spec only when its YAML sets
# them: tracegen rejects unknown keys, so a checkout without one reports "needs feature <key>".
OPTION_VALUES: dict[str, tuple[Any, ...]] = {
    "framework": (
        "megatron-2021",
        "megatron-2022",
        "megatron-core",
        "megatron-deepspeed",
        "megatron-core-0.7",
        "torchtitan",
        "flagscale-2023",
        "internlm",
        "gpt-neox",
    ),
    # The RMSNorm a torchtitan run's code ran (tracegen.choices.RMSNORM_IMPLS).
    "rmsnorm_impl": ("torch", "torchtitan-2024", "fused"),
    # Megatron-Core's cross-entropy where the run's config fuses it (tracegen.choices.LOSS_IMPLS; te:
    # Megatron-Bridge's cross_entropy_fusion_impl "te").
    "loss_impl": ("megatron", "te"),
    "gemm_rates": ("sustained", "burst"),
    # How loaded the GPUs' boards are (tracegen.choices.BOARD_LOADS; round board).
    "board_load": ("job", "full", "alone"),
    "overlap_grad_reduce": (True, False),
    "overlap_param_gather": (True, False),
    "tp_comm_overlap": (True, False),
    "grad_reduce_dtype": ("fp32", "bf16"),
    "sharding": ("zero3", "fsdp", "megatron-fsdp"),
    # Megatron-FSDP's --data-parallel-sharding-strategy and --fsdp-double-buffer as the run's config sets them.
    "data_parallel_sharding_strategy": ("optim_grads_params", "optim_grads", "optim"),
    "fsdp_double_buffer": (True, False),
    # PyTorch FSDP's backward_prefetch as the run's trainer sets it (Composer: BACKWARD_POST).
    "fsdp_backward_prefetch": ("pre", "post", "none"),
    # PyTorch's non-reentrant checkpoint with early stop (torch >= 2.1) under full recompute.
    "recompute_early_stop": (True, False),
    "distributed_optimizer": (True, False),
    # The fused attention kernel a run's code calls (llm-foundry's attn_impl: triton; InternLM's flash-attention v1: fa1), docs/compute.md.
    "attention_kernel": ("cudnn", "fa3", "fa2", "fa1", "triton"),
    # Hidden dropout as the launch script sets it (false: --hidden-dropout 0.0), where it differs from the
    # framework's default.
    "dropout": (True, False),
    # Attention-probability dropout rate as the run's config sets it (Megatron's --attention-dropout, NeMo's
    # attention_dropout), where it differs from the framework's default (0.1 for the Megatron-based ones).
    "attention_dropout": (0.0, 0.1),
    # Megatron's vocabulary padding unit (x TP), where the run's code differs from its profile's default:
    # 0 = the vocabulary as the code builds it (llm-foundry's MPT: vocab_size as the yaml gives it).
    "make_vocab_size_divisible_by": (0, 1, 128),
    # FP8 parameters (TE fp8_model_init) where the run's config turns them on (NeMo's fp8_params).
    "fp8_params": (True, False),
    # Transformer Engine's FP8 scaling recipe (tracegen.choices.FP8_RECIPES) where the run's differs from
    # delayed scaling (Megatron-Bridge's fp8_cs: bf16_with_fp8_current_scaling_mixed, fp8_recipe tensorwise).
    "fp8_recipe": ("delayed", "current", "mxfp8"),
    # Where delayed scaling updates amax and scales (tracegen.choices.FP8_AMAX_UPDATES), where the run's
    # Transformer Engine predates v1.6 (MLPerf v3.1's TE 09ba84278a: every FP8 module, each micro-batch).
    "fp8_amax_update": ("region", "module"),
    # Megatron-Core's NaN check of each gradient bucket (NeMo 24.07: optim.check_for_nan_in_grad, default
    # False; Megatron-LM: on unless --no-check-for-nan-in-loss-and-grad), where it differs from the profile's.
    "check_for_nan_in_grad": (True, False),
    # The batch's host-to-device copy and TP broadcast each micro-batch (tracegen.batch_input), where the
    # run's code differs from its profile's (NeMo's own data path under megatron-core: nemo).
    "batch_input": ("megatron", "megatron-no-mask", "nemo", "none"),
    # DeepSpeed's synchronize_checkpoint_boundary where the run's config sets it (GPT-NeoX's
    # synchronize-each-layer): a host sync at each checkpointed unit's forward and backward start and end.
    "synchronize_each_layer": (True, False),
    # CUDA_LAUNCH_BLOCKING=1 in the run's environment (BigScience tr11-176B-ml.slurm): every launch waits for
    # its kernel to end.
    "cuda_launch_blocking": (True, False),
    # Megatron-Core's deferral of the LM head's weight-gradient GEMMs to the pipeline flush (with
    # wgrad_deferral_limit, INT_OPTIONS) and the distributed optimizer's first-chunk AllGather with the
    # optimizer step, where the run's config sets them (NeMo 2.x MegatronCommOverlapCallback).
    "defer_embedding_wgrad_compute": (True, False),
    "overlap_param_gather_with_optimizer_step": (True, False),
    # Who reduces the gradients under the distributed optimizer (megatron-core profiles): Apex's
    # DistributedFusedAdam where the run's NeMo 1 config names optim distributed_fused_adam (its buckets span
    # every model chunk), else Megatron-Core's DDP (the default; later chunks and stages one bucket each).
    "dist_optimizer_impl": ("megatron-core", "apex"),
}
# SMs communication holds (tracegen.contention), as a run's launch script sets them: the DP communicator's
# NCCL max_ctas and TE userbuffers' num_sm by layer name; copied into the spec as written.
SM_OPTIONS = ("dp_comm_ctas", "tp_overlap_sms")
# Integers as the run's config sets them, each with its least value: hybrid sharding's / the distributed
# optimizer's shard group (tracegen dp_shard: DP replicas per group) and Megatron-Core's wgrad_deferral_limit
# (micro-batches whose LM-head wgrad is deferred; 0 = all).
INT_OPTIONS: dict[str, int] = {"dp_shard": 2, "wgrad_deferral_limit": 0}
# Lists of names, as the run's launch script sets them, copied into the spec as written: Megatron-Core's
# --recompute-modules under recompute: selective (tracegen.choices.RECOMPUTE_MODULES, core_v0.14.0).
LIST_OPTIONS: dict[str, tuple[str, ...]] = {
    "recompute_modules": ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"),
}
MEASURED_KINDS = ("iteration_s", "tflops_per_gpu", "tokens_per_s_per_gpu")
RUN_KEYS = (
    "id", "source", "where", "config_source", "config_where", "model", "parallel", "recompute",
    "sequence_parallel", "precision", "measured", "notes", "gpu", "cluster", "attention", *OPTION_VALUES,
    *SM_OPTIONS, *INT_OPTIONS, *LIST_OPTIONS,
)  # fmt: skip
DEFAULT_KEYS = ("seq_len", "vocab", "gpu", "cluster", "attention")
A100_PEAK_BF16 = 312e12  # dense BF16 tensor-core FLOP/s, NVIDIA A100 datasheet
# Clusters a run may name: the DGX presets (netmodels, issue 10) and explicit 8-GPU nodes for the others,
# with the network rate per GPU. DGX A100: one 200 Gb/s HDR NIC per GPU (DGX A100 datasheet: 8 single-port
# ConnectX-6), used only on checkouts without the preset. Jean Zay's A100 partition (BigScience tr11-176B-ml
# README, "Hardware"): 8 A100 80GB per node on NVLink, 4 Omni-Path links per node; Intel Omni-Path 100
# series: 100 Gb/s per port, so 400 Gb/s per node, 50 Gb/s per GPU when the 8 GPUs share them evenly.
# DGX A800 (BAAI FlagPerf's nodes): the DGX A100 with the A800's 400 GB/s NVLink (netmodels preset dgx-a800).
CLUSTER_NICS = {
    "dgx-a100": "200Gbps",
    "dgx-a800": "200Gbps",
    "dgx-h100": "400Gbps",
    # DGX B200 and GB200 NVL72: one 400 Gb/s ConnectX-7 per GPU (netmodels presets dgx-b200, gb200-nvl72)
    "dgx-b200": "400Gbps",
    "gb200-nvl72": "400Gbps",
    "jean-zay-a100": "50Gbps",
    # Supermicro AS-4124GO-NART (HGX A100 8-GPU, NVSwitch) with four 200 Gb/s HDR ConnectX-6 HCAs, one per
    # two GPUs (Black et al. 2022, arXiv:2204.06745, section 2.3): 4 x 200 / 8 = 100 Gb/s per GPU.
    "hgx-a100-4hca": "100Gbps",
    # AWS p4d.24xlarge: 8 A100 40GB on NVSwitch (600 GB/s), 400 Gb/s of EFA networking per instance (AWS
    # Compute Blog, "Amazon EC2 P4d instances deep dive", 2020-11-03: "8 x 40 GB NVIDIA Tesla A100 GPUs with
    # NVSwitch and 400 Gbps Elastic Fabric Adapter (EFA) enabled networking"; Wu et al. 2023,
    # arXiv:2303.17564, section 3.3 "Hardware Stack", the same figures): 400 / 8 = 50 Gb/s per GPU.
    "p4d-24xlarge": "50Gbps",
    # InternLM's test cluster: 8 A100-SXM4-80GB a machine, "Inter-machine bandwidth 4 * 100Gb RoCE"
    # (InternLM/InternLM 4a3d156 doc/en/train_performance.md, hardware table; 8 GPUs a node: "zero1=8, tp=1,
    # optimizer states are distributed within 8 GPUs in a single node"): 4 x 100 / 8 = 50 Gb/s per GPU.
    "a100-4x100g-roce": "50Gbps",
}
GPUS_PER_NODE = 8  # DGX A100 / DGX H100: eight GPUs per node (NVIDIA DGX datasheets)
# Trace nodes per (rank, layer, micro-batch) by framework profile, used only to decide whether a run fits
# the node budget (never in a result): counted on the generated 22B model of Korthikanti et al. (TP 8,
# unfused attention) without / selective / full recompute, +6 at most with sequence parallelism
# (AllGather / ReduceScatter pairs, recomputed ones too).
NODES_PER_LAYER_STEP = {
    "megatron-2021": {"none": 37, "selective": 42, "full": 54},
    "megatron-2022": {"none": 37, "selective": 42, "full": 54},  # the same layer (tracegen.frameworks)
    "megatron-core": {"none": 32, "selective": 36, "full": 47},
    "megatron-core-0.7": {"none": 32, "selective": 36, "full": 47},  # the same layer (tracegen.frameworks)
    "megatron-deepspeed": {"none": 42, "selective": 46, "full": 63},
    # no more nodes than megatron-core's layer: residual adds in place of its bias-dropout-adds, no dropout
    # (selective-op: + 8 recomputed nodes a layer step, counted on a tiny generated torchtitan model)
    "torchtitan": {"none": 32, "selective": 36, "full": 47, "selective-op": 40},
    # megatron-deepspeed's + the attn_qkv_copy nodes (2 a layer step, 3 under full recompute); internlm at
    # most megatron-core's (both relations counted on tiny generated models, TP 8 with SP)
    "flagscale-2023": {"none": 44, "selective": 48, "full": 66},
    "internlm": {"none": 32, "selective": 36, "full": 47},
    # counted on the tiny model of tests/test_parallel_residual.py (TP 2, dropout on, one layer and
    # micro-batch): sequential layer 45 / 50 / 67, parallel residual 44 / 49 / 65
    "gpt-neox": {"none": 45, "selective": 50, "full": 67},
}
SP_EXTRA_NODES = 6
# Nodes of one (folded) replica per replay: ~2 minutes of generation on the 2-core dev box.
DEFAULT_MAX_NODES = 4_000_000


class ValidationDataError(Exception):
    """The dataset file is malformed: one line naming the file and the run."""


@dataclass(frozen=True)
class Source:
    """A publication or launch script the dataset cites."""

    key: str
    cite: str
    conversion: str = ""


@dataclass(frozen=True)
class Run:
    """One measured training run with its full configuration."""

    id: str
    source: str
    where: str
    config_source: str
    config_where: str
    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    gpu: str
    cluster: str
    attention: str
    tp: int
    pp: int
    dp: int
    micro_batch: int
    global_batch: int
    virtual_stages: int
    recompute: str
    sequence_parallel: bool
    precision: str
    measured_kind: str  # one of MEASURED_KINDS
    measured_value: float
    notes: str = ""
    ffn_hidden: int = 0  # 0: 4 x hidden
    kv_heads: int = 0  # 0: heads
    activation: str = "gelu"
    norm: str = "layernorm"
    linear_bias: bool = True
    tie_embeddings: bool | None = None  # None: tracegen's default (framework and model family)
    position_embedding: str = ""  # "": tracegen's default (framework and model family)
    embedding_norm: bool = (
        False  # a LayerNorm after the word embedding (Megatron-DeepSpeed --embed-layernorm)
    )
    parallel_residual: bool = False  # x + attn(ln1(x)) + mlp(ln2(x)) (GPT-NeoX gpt_j_residual)
    rotary_pct: float = 1.0  # fraction of each head RoPE rotates (GPT-NeoX rotary_pct)
    qk_layernorm: bool = False  # a norm on each q and k head (Megatron-Core --qk-layernorm)
    options: tuple[tuple[str, Any], ...] = ()  # the OPTION_VALUES keys the run sets, in that order
    stage_layers: tuple[int, ...] = ()  # layers per pipeline stage when not L / pp each (uneven stages)

    @property
    def ffn(self) -> int:
        """FFN width."""
        return self.ffn_hidden or 4 * self.hidden

    @property
    def gpus(self) -> int:
        """GPUs of the whole run."""
        return self.tp * self.pp * self.dp

    @property
    def micro_batches(self) -> int:
        """Micro-batches per pipeline per iteration."""
        return self.global_batch // (self.micro_batch * self.dp)


@dataclass(frozen=True)
class LayerRow:
    """One row of a published single-layer benchmark (forward and backward time of one layer)."""

    experiment: str
    recompute: str
    sequence_parallel: bool
    forward_ms: float
    backward_ms: float


@dataclass(frozen=True)
class LayerBenchmark:
    """A single-layer benchmark: the model and layout it ran, and its rows."""

    source: str
    where: str
    run: Run  # the layout (recompute / sequence_parallel are taken per row)
    rows: tuple[LayerRow, ...]


@dataclass(frozen=True)
class Dataset:
    """The validation set: sources, runs, the layer benchmark and the runs left out (with reasons)."""

    sources: Mapping[str, Source]
    runs: tuple[Run, ...]
    layers: LayerBenchmark | None
    excluded: tuple[tuple[str, str], ...]


def megatron_iteration_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """FLOPs of one iteration with full recomputation: Narayanan et al. 2021, equation (3).

    F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).
    """
    return 96.0 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def measured_seconds(run: Run) -> float:
    """The measured time per iteration: as printed, from tokens/s/GPU (B s / (n X)), or from achieved
    TFLOP/s per GPU by eq. (3)."""
    if run.measured_kind == "iteration_s":
        return run.measured_value
    if run.measured_kind == "tokens_per_s_per_gpu":
        return run.global_batch * run.seq_len / (run.gpus * run.measured_value)
    flops = megatron_iteration_flops(run.global_batch, run.seq_len, run.layers, run.hidden, run.vocab)
    return flops / (run.gpus * run.measured_value * 1e12)


# ---------------------------------------------------------------- dataset


def _fail(path: str, where: str, message: str) -> ValidationDataError:
    return ValidationDataError(f"{path}: {where}: {message}")


def _int(path: str, where: str, raw: Mapping, key: str) -> int:
    v = raw.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise _fail(path, where, f"{key} must be a positive integer, got {v!r}")
    return v


def _text(path: str, where: str, raw: Mapping, key: str, required: bool = True) -> str:
    v = raw.get(key, "" if not required else None)
    if not isinstance(v, str) or (required and not v.strip()):
        raise _fail(path, where, f"{key} must be a non-empty text, got {v!r}")
    return " ".join(v.split())


def _run(path: str, raw: Any, index: int, sources: Mapping[str, Mapping], defaults_of: Mapping) -> Run:
    where = f"runs[{index}]"
    if not isinstance(raw, Mapping):
        raise _fail(path, where, "must be a mapping")
    rid = _text(path, where, raw, "id")
    where = f"run {rid}"
    unknown = sorted(set(raw) - set(RUN_KEYS))
    if unknown:
        raise _fail(path, where, f"unknown key(s) {', '.join(unknown)}")
    src = _text(path, where, raw, "source")
    if src not in sources:
        raise _fail(path, where, f"source {src!r} is not in sources ({', '.join(sources)})")
    csrc = raw.get("config_source", "")
    if csrc and csrc not in sources:
        raise _fail(path, where, f"config_source {csrc!r} is not in sources")
    if csrc and not raw.get("config_where"):
        raise _fail(path, where, "config_source needs config_where (which script, which case)")
    model = raw.get("model")
    par = raw.get("parallel")
    if not isinstance(model, Mapping) or not isinstance(par, Mapping):
        raise _fail(path, where, "model and parallel must be mappings")
    for block, keys, optional in (
        (model, MODEL_KEYS, MODEL_OPTIONAL),
        (par, PARALLEL_KEYS, ("stage_layers",)),
    ):
        gone = [k for k in keys if k not in block]
        extra = sorted(set(block) - set(keys) - set(optional))
        if gone or extra:
            name = "model" if block is model else "parallel"
            what = [f"missing {', '.join(gone)}"] if gone else []
            what += [f"unknown {', '.join(extra)}"] if extra else []
            moe_cp = " (runs with ep or cp: scripts/data/published_moe_cp_runs.yaml, validate_moe_cp.py)"
            hint = moe_cp if {"ep", "cp", "etp"} & set(extra) else ""
            raise _fail(path, where, f"{name}: {'; '.join(what)} (required: {', '.join(keys)}){hint}")
    # A run's own model / gpu / cluster / attention settings win over its source's defaults.
    defaults = {**(defaults_of.get(src) or {})}
    defaults.update({k: model[k] for k in ("seq_len", "vocab") if k in model})
    defaults.update({k: raw[k] for k in ("gpu", "cluster", "attention") if k in raw})
    missing = [k for k in DEFAULT_KEYS if k not in defaults]
    if missing:
        raise _fail(path, where, f"neither the run nor source {src} gives {', '.join(missing)}")
    options = []
    for key, allowed in OPTION_VALUES.items():
        if key in raw:
            if raw[key] not in allowed or type(raw[key]) is not type(allowed[0]):
                raise _fail(
                    path, where, f"{key} must be one of {', '.join(map(str, allowed))}, got {raw[key]!r}"
                )
            options.append((key, raw[key]))
    options += _sm_options(path, where, raw)
    arch = _architecture(path, where, model)
    stage_layers = par.get("stage_layers", [])
    if not isinstance(stage_layers, list) or not all(isinstance(n, int) and n > 0 for n in stage_layers):
        raise _fail(path, where, f"stage_layers must be a list of positive integers, got {stage_layers!r}")
    if defaults["cluster"] not in CLUSTER_NICS:
        raise _fail(
            path, where, f"cluster must be one of {', '.join(CLUSTER_NICS)}, got {defaults['cluster']!r}"
        )
    rc = raw.get("recompute")
    if rc not in RECOMPUTE:
        raise _fail(path, where, f"recompute must be one of {', '.join(RECOMPUTE)}, got {rc!r}")
    sp = raw.get("sequence_parallel")
    if not isinstance(sp, bool):
        raise _fail(path, where, f"sequence_parallel must be true or false, got {sp!r}")
    prec = raw.get("precision")
    if prec not in PRECISION_SPEC:
        raise _fail(path, where, f"precision must be one of {', '.join(PRECISION_SPEC)}, got {prec!r}")
    if defaults["attention"] not in ATTENTION:
        raise _fail(path, where, f"attention must be one of {', '.join(ATTENTION)}")
    meas = raw.get("measured")
    if not isinstance(meas, Mapping) or len(meas) != 1:
        raise _fail(path, where, f"measured must hold exactly one of {', '.join(MEASURED_KINDS)}")
    ((kind, value),) = meas.items()
    if kind not in MEASURED_KINDS or not isinstance(value, int | float) or value <= 0:
        raise _fail(
            path, where, f"measured {kind}: {value!r} is not a positive {' or '.join(MEASURED_KINDS)}"
        )
    if kind != "iteration_s" and not sources[src].get("conversion"):
        raise _fail(path, where, f"source {src} states no conversion from {kind} to time")
    run = Run(
        id=rid, source=src, where=_text(path, where, raw, "where"), config_source=csrc,
        config_where=_text(path, where, raw, "config_where", required=bool(csrc)),
        layers=_int(path, where, model, "layers"), hidden=_int(path, where, model, "hidden"),
        heads=_int(path, where, model, "heads"), seq_len=_int(path, where, defaults, "seq_len"),
        vocab=_int(path, where, defaults, "vocab"), gpu=str(defaults["gpu"]), cluster=str(defaults["cluster"]),
        attention=str(defaults["attention"]),
        tp=_int(path, where, par, "tp"), pp=_int(path, where, par, "pp"), dp=_int(path, where, par, "dp"),
        micro_batch=_int(path, where, par, "micro_batch"), global_batch=_int(path, where, par, "global_batch"),
        virtual_stages=_int(path, where, par, "virtual_stages"), recompute=rc, sequence_parallel=sp,
        precision=prec, measured_kind=kind, measured_value=float(value),
        notes=_text(path, where, raw, "notes", required=False), options=tuple(options),
        stage_layers=tuple(stage_layers), **arch,
    )  # fmt: skip
    _check_layout(path, where, run)
    return run


def _architecture(path: str, where: str, model: Mapping) -> dict[str, Any]:
    """The optional architecture keys of a model block, checked."""
    out: dict[str, Any] = {}
    for k in ("ffn_hidden", "kv_heads"):
        if k in model:
            out[k] = _int(path, where, model, k)
    for k, allowed in (("activation", ACTIVATIONS), ("norm", NORMS), ("position_embedding", POSITIONS)):
        if k in model:
            if model[k] not in allowed:
                raise _fail(path, where, f"{k} must be one of {', '.join(allowed)}, got {model[k]!r}")
            out[k] = model[k]
    for k in ("linear_bias", "tie_embeddings", "embedding_norm", "parallel_residual", "qk_layernorm"):
        if k in model:
            if not isinstance(model[k], bool):
                raise _fail(path, where, f"{k} must be true or false, got {model[k]!r}")
            out[k] = model[k]
    if "rotary_pct" in model:
        pct = model["rotary_pct"]
        if isinstance(pct, bool) or not isinstance(pct, int | float) or not 0 < pct <= 1:
            raise _fail(path, where, f"rotary_pct must be a number in (0, 1], got {pct!r}")
        out["rotary_pct"] = float(pct)
    return out


def _check_layout(path: str, where: str, run: Run) -> None:
    if run.global_batch % (run.micro_batch * run.dp):
        raise _fail(path, where, f"global_batch {run.global_batch} not a multiple of micro_batch x dp")
    if run.stage_layers:
        if len(run.stage_layers) != run.pp or sum(run.stage_layers) != run.layers or run.virtual_stages > 1:
            raise _fail(
                path, where, f"stage_layers must give pp {run.pp} stages summing to {run.layers} layers"
            )
    elif run.layers % (run.pp * run.virtual_stages):
        raise _fail(path, where, f"{run.layers} layers do not split into pp x virtual_stages equal chunks")
    if run.virtual_stages > 1 and run.micro_batches % run.pp:
        # Megatron's interleaved schedule needs the micro-batch count to be a multiple of the pipeline size.
        raise _fail(
            path, where, f"interleaved: {run.micro_batches} micro-batches not a multiple of pp {run.pp}"
        )
    if run.heads % run.tp or run.hidden % run.heads:
        raise _fail(path, where, f"tp {run.tp} / heads {run.heads} / hidden {run.hidden} do not divide")
    if run.kv_heads and (run.heads % run.kv_heads or run.kv_heads % run.tp):
        raise _fail(path, where, f"kv_heads {run.kv_heads} must divide heads {run.heads} and split over tp")


def load_dataset(path: str | os.PathLike[str] = DATA) -> Dataset:
    """Read and check the dataset: every run has a source and a complete configuration."""
    p = os.fspath(path)
    try:
        with open(p, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError) as exc:
        raise ValidationDataError(f"{p}: cannot read: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("sources"), Mapping):
        raise ValidationDataError(f"{p}: needs a sources mapping and a runs list")
    raw_sources = doc["sources"]
    sources = {}
    for key, s in raw_sources.items():
        if not isinstance(s, Mapping):
            raise _fail(p, f"source {key}", "must be a mapping")
        sources[str(key)] = Source(
            str(key), _text(p, f"source {key}", s, "cite"), str(s.get("conversion", ""))
        )
    defaults_of = {k: (s.get("defaults") or {}) for k, s in raw_sources.items()}
    raw_runs = doc.get("runs")
    if not isinstance(raw_runs, list) or not raw_runs:
        raise ValidationDataError(f"{p}: runs must be a non-empty list")
    runs = tuple(_run(p, r, i, raw_sources, defaults_of) for i, r in enumerate(raw_runs))
    seen: set[str] = set()
    for r in runs:
        if r.id in seen:
            raise _fail(p, f"run {r.id}", "id used twice")
        seen.add(r.id)
    layers = _layer_benchmark(p, doc.get("layer_benchmark"), raw_sources, defaults_of)
    excluded = []
    for i, e in enumerate(doc.get("excluded") or []):
        if not isinstance(e, Mapping):
            raise _fail(p, f"excluded[{i}]", "must be a mapping")
        excluded.append((_text(p, f"excluded[{i}]", e, "what"), _text(p, f"excluded[{i}]", e, "reason")))
    return Dataset(sources, runs, layers, tuple(excluded))


def _layer_benchmark(path: str, raw: Any, sources: Mapping, defaults_of: Mapping) -> LayerBenchmark | None:
    if raw is None:
        return None
    where = "layer_benchmark"
    if not isinstance(raw, Mapping) or not isinstance(raw.get("rows"), list) or not raw["rows"]:
        raise _fail(path, where, "must be a mapping with a non-empty rows list")
    base = {
        "id": "layer-benchmark", "source": raw.get("source"), "where": raw.get("where"),
        "model": raw.get("model"), "parallel": raw.get("parallel"), "recompute": "none",
        "sequence_parallel": False, "precision": raw.get("precision"), "measured": {"iteration_s": 1.0},
        **{k: raw[k] for k in OPTION_VALUES if k in raw},
    }  # fmt: skip
    run = _run(path, base, 0, sources, defaults_of)
    rows = []
    for i, r in enumerate(raw["rows"]):
        w = f"{where}.rows[{i}]"
        if not isinstance(r, Mapping) or r.get("recompute") not in RECOMPUTE:
            raise _fail(path, w, "needs recompute none|selective|full")
        if not isinstance(r.get("sequence_parallel"), bool):
            raise _fail(path, w, "needs sequence_parallel true|false")
        ms = [r.get("forward_ms"), r.get("backward_ms")]
        if not all(isinstance(v, int | float) and v > 0 for v in ms):
            raise _fail(path, w, f"forward_ms and backward_ms must be positive numbers, got {ms}")
        rows.append(
            LayerRow(_text(path, w, r, "experiment"), r["recompute"], r["sequence_parallel"], *map(float, ms))
        )
    return LayerBenchmark(str(run.source), run.where, run, tuple(rows))


# ---------------------------------------------------------------- spec


def spec_features() -> frozenset[str]:
    """The spec keys this checkout of tracegen accepts, of those the validation needs."""
    from xsim.tracegen.spec import TOP_KEYS

    return frozenset(TOP_KEYS)


def _option_text(v: Any) -> str:
    """An option's value in the configuration column: on/off, name:count pairs, or the value."""
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, tuple) and all(isinstance(x, str) for x in v):
        return ",".join(v)
    if isinstance(v, tuple):
        return " ".join(f"{k}:{n}" for k, n in v)
    return str(v)


def _sm_options(path: str, where: str, raw: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """A run's SM_OPTIONS: dp_comm_ctas a positive integer, tp_overlap_sms a mapping of names to integers
    (kept as sorted pairs: a Run is frozen); its INT_OPTIONS; its LIST_OPTIONS, non-empty lists of the
    allowed names (kept as tuples)."""
    out: list[tuple[str, Any]] = []
    if "dp_comm_ctas" in raw:
        v = raw["dp_comm_ctas"]
        if type(v) is not int or v < 1:
            raise _fail(path, where, f"dp_comm_ctas must be a positive integer, got {v!r}")
        out.append(("dp_comm_ctas", v))
    if "tp_overlap_sms" in raw:
        v = raw["tp_overlap_sms"]
        if not isinstance(v, Mapping) or not all(type(n) is int and n >= 0 for n in v.values()):
            raise _fail(path, where, f"tp_overlap_sms must map TE layer names to SM counts, got {v!r}")
        out.append(("tp_overlap_sms", tuple(sorted(v.items()))))
    for key, least in INT_OPTIONS.items():
        if key in raw:
            v = raw[key]
            if type(v) is not int or v < least:
                raise _fail(path, where, f"{key} must be an integer >= {least}, got {v!r}")
            out.append((key, v))
    for key, allowed in LIST_OPTIONS.items():
        if key in raw:
            v = raw[key]
            if not isinstance(v, list) or not v or not all(isinstance(x, str) and x in allowed for x in v):
                raise _fail(path, where, f"{key} must be a list of {', '.join(allowed)}, got {v!r}")
            out.append((key, tuple(v)))
    return out


def _explicit_dgx_cluster(run: Run) -> dict[str, Any]:
    """Nodes of 8 GPUs in today's description keys: a DGX cluster on checkouts without its preset, or a
    cluster xsim has no preset for (CLUSTER_NICS).

    NVLink from the interconnect preset (A100 NVLink 3: 600 GB/s total, 300 GB/s per direction, NVIDIA
    A100 datasheet); the run's network rate per GPU from CLUSTER_NICS (DGX A100: 8 single-port 200 Gb/s
    ConnectX-6; DGX H100: 8 400 Gb/s ConnectX-7, DGX H100 datasheet); one non-blocking switch.
    """
    nodes = []
    ranks_per_replica = run.tp * run.pp
    total = ranks_per_replica * run.dp
    for i in range(math.ceil(total / GPUS_PER_NODE)):
        ranks = list(range(i * GPUS_PER_NODE, min(total, (i + 1) * GPUS_PER_NODE)))
        nodes.append(
            {"name": f"node{i}", "gpu": run.gpu, "ranks": ranks, "nic_bandwidth": CLUSTER_NICS[run.cluster]}
        )
    # The runs ran NCCL (GPT-NeoX: NCCL 2.10.3, Black et al. 2022 section 2.3; BLOOM, MT-NLG: Megatron-
    # DeepSpeed on torch.distributed's NCCL backend): its collectives use every GPU's NIC at once (rail
    # rings, netmodels/nccl.py), not the paper's one ring through one NIC per node boundary.
    return {"preset": "table6", "nodes": nodes, "fabric": {"kind": "switch"}, "collectives": "nccl"}


def spec_for(
    run: Run,
    *,
    micro_batches: int | None = None,
    recompute: str | None = None,
    sequence_parallel: bool | None = None,
    features: frozenset[str] | None = None,
) -> dict[str, Any]:
    """The xsim deployment spec (a mapping for tracegen.load_spec) of a run.

    With the agreed keys (`parallel:`, `recompute`, `precision`, `attention`, `cluster: dgx-a100`) when this
    checkout has them; otherwise today's explicit device groups, leaving out what cannot be said yet
    (the result of such a spec is a harness check, not a validation: `legacy_gaps` names what is missing).
    """
    feats = spec_features() if features is None else features
    m = run.micro_batches if micro_batches is None else micro_batches
    rc = run.recompute if recompute is None else recompute
    sp = run.sequence_parallel if sequence_parallel is None else sequence_parallel
    spec: dict[str, Any] = {
        "name": run.id,
        "model": {
            "name": run.id,
            "layers": run.layers,
            "hidden": run.hidden,
            "ffn_hidden": run.ffn,
            "heads": run.heads,
            "kv_heads": run.kv_heads or run.heads,
            "vocab": run.vocab,
            "seq_len": run.seq_len,
            "activation": run.activation,
            "norm": run.norm,
            "linear_bias": run.linear_bias,
            **({} if run.tie_embeddings is None else {"tie_embeddings": run.tie_embeddings}),
            **({"position_embedding": run.position_embedding} if run.position_embedding else {}),
            **({"embedding_norm": True} if run.embedding_norm else {}),
            **({"parallel_residual": True} if run.parallel_residual else {}),
            **({"rotary_pct": run.rotary_pct} if run.rotary_pct != 1.0 else {}),
            **({"qk_layernorm": True} if run.qk_layernorm else {}),
        },  # fmt: skip
        "seq_len": run.seq_len,
        "schedule": "1f1b",
        "sequence_parallel": sp,
    }
    if "parallel" in feats:
        # Every framework of the set places its ranks tp fastest, then dp, then pp (tracegen's `order:
        # tp-dp-pp`), not tracegen's default tp-pp-dp: Megatron-LM/Megatron-Core's initialize_model_parallel
        # (pipeline groups of ranks world/pp apart; `order` "tp-cp-ep-dp-pp" since core_r0.5.0, and NeMo on
        # top of it), DeepSpeed's PipeModelDataParallelTopology (axes pipe, data, model: model fastest) under
        # Megatron-DeepSpeed and GPT-NeoX, torchtitan's device mesh ("pp", "dp", "tp"). It decides which
        # of the pipeline's exchanges and the DP collectives stay inside a node when tp < 8.
        spec["parallel"] = {
            "gpu": run.gpu, "tp": run.tp, "pp": run.pp, "dp": run.dp, "micro_batch": run.micro_batch,
            "global_batch": m * run.micro_batch * run.dp, "virtual_stages": run.virtual_stages,
            "order": "tp-dp-pp",
        }  # fmt: skip
    else:
        spec["micro_batches"] = m
        spec["device_groups"] = _device_groups(run)
    if "recompute" in feats and rc != "none":
        spec["recompute"] = rc
    if "precision" in feats:
        spec["precision"] = PRECISION_SPEC[run.precision]
    if "attention" in feats:
        spec["attention"] = run.attention
    if "compute_model" in feats:
        # The shape-aware GEMM model calibrated on microbenchmarks (tracegen's default stays the flat
        # roofline for backward compatibility).
        spec["compute_model"] = "calibrated"
    # Issue 22's keys exactly as the run's YAML sets them (none invented): `needed_features` says which of
    # them this checkout's tracegen lacks, and such a run is reported, not replayed.
    spec.update(
        {k: dict(v) if k == "tp_overlap_sms" else list(v) if k in LIST_OPTIONS else v for k, v in run.options}
    )
    spec["cluster"] = run.cluster if _has_cluster_preset(run.cluster) else _explicit_dgx_cluster(run)
    if run.stage_layers:
        # Uneven pipeline stages (Megatron-DeepSpeed's partition counting embeddings as layers) are written
        # as explicit device groups with their layer ranges; the parallel: block splits layers evenly only.
        spec.pop("parallel", None)
        spec["micro_batches"] = m
        spec["device_groups"] = _device_groups(run)
    return spec


def needed_features(run: Run, features: frozenset[str] | None = None) -> list[str]:
    """The spec keys `run` sets that this checkout's tracegen does not accept (empty: it can be replayed)."""
    feats = spec_features() if features is None else features
    return [key for key, _value in run.options if key not in feats]


def legacy_gaps(run: Run, features: frozenset[str] | None = None, recompute: str | None = None) -> list[str]:
    """What the spec of `run` cannot say in this checkout (empty when every setting is expressed)."""
    feats = spec_features() if features is None else features
    rc = run.recompute if recompute is None else recompute
    gaps = []
    if rc != "none" and "recompute" not in feats:
        gaps.append(f"recompute {rc}")
    if run.virtual_stages > 1 and "parallel" not in feats and "virtual_stages" not in feats:
        gaps.append(f"virtual_stages {run.virtual_stages}")
    if "precision" not in feats:
        gaps.append("precision")
    if "attention" not in feats:
        gaps.append(f"attention {run.attention}")
    if "compute_model" not in feats:
        gaps.append("calibrated compute model")
    if run.cluster.startswith("dgx-") and not _has_cluster_preset(run.cluster):
        gaps.append(f"cluster {run.cluster} (explicit nodes used)")
    return gaps


def _has_cluster_preset(name: str) -> bool:
    """Whether netmodels knows the cluster preset `name` (dgx-a100 / dgx-h100 arrive with issue 10)."""
    from xsim.netmodels import presets
    from xsim.tracegen import spec

    return name in getattr(spec, "CLUSTER_SYSTEMS", ()) and name in getattr(presets, "SYSTEM_PRESETS", {})


def _device_groups(run: Run) -> list[dict[str, Any]]:
    """Explicit device groups in Megatron's rank order (tp fastest, then dp, then pp), no interleaving."""
    sizes = run.stage_layers or (run.layers // run.pp,) * run.pp
    starts = [1 + sum(sizes[:s]) for s in range(run.pp)]
    out = []
    for s in range(run.pp):
        for d in range(run.dp):
            base = run.tp * (d + run.dp * s)
            out.append(
                {
                    "id": len(out), "gpu": run.gpu, "ranks": list(range(base, base + run.tp)), "tp": run.tp,
                    "layers": [starts[s], starts[s] + sizes[s] - 1], "micro_batch": run.micro_batch,
                    "pp_stage": s, "dp_replica": d,
                }
            )  # fmt: skip
    return out


# ---------------------------------------------------------------- replay


@dataclass(frozen=True)
class Replay:
    """One generated and replayed spec."""

    iteration_ns: int
    nodes: int  # nodes generated (all ranks)
    replayed_ranks: int  # ranks simulated (one replica when folded)
    wall_s: float
    ops: Any = None  # polars DataFrame of the replayed ops when asked for
    phases_s: tuple[float, float, float] = (0.0, 0.0, 0.0)  # generate, write, replay (wall seconds)


def replay_spec(
    spec: Mapping[str, Any], *, keep_ops: bool = False, fold: bool = True, strict: bool | str = False
) -> Replay:
    """Generate a spec's traces and replay them on the analytical network model (folding DP replicas
    when `fold`; `strict`: a fold the network check refuses is an error, not a larger replay; `"dp"`: a
    compact set of rank classes folded by its data replicas instead, replay.fold.resolve_fold)."""
    from xsim.netmodels.cluster import build_cluster
    from xsim.netmodels.models import build_model
    from xsim.replay import DurationModel, simulate
    from xsim.tracegen import generate, load_spec
    from xsim.tracegen.compact import rank_classes
    from xsim.tracegen.spec import save_deployment
    from xsim.traces.classes import write_classes
    from xsim.traces.traceset import discover

    from xsim.api.network import collective_seconds

    t0 = time.perf_counter()
    dep = load_spec(spec)
    # Homogeneous deployments: the generator emits the DP gradient sync itself and the planner's rewrite
    # adds nothing (docs/tracegen.md), so it is skipped. With `fold`, DP replicas that are alike by
    # construction are generated once (a compact set, tracegen/compact.py) and replayed folded.
    classes = rank_classes(dep, rewrite=False) if fold else None
    # The network model the set is replayed on also times the collectives' SM-contention windows.
    network = build_model("analytical", build_cluster(json.loads(dep.cluster_json)))
    only = None if classes is None else classes.written
    bundle = generate(dep, rewrite=False, only=only, comm_time=collective_seconds(network))
    t_gen = time.perf_counter()
    nodes = bundle.node_count() * (1 if classes is None else len(classes.replicas))
    with tempfile.TemporaryDirectory(prefix="xsim-valid-") as tmp:
        bundle.write(tmp, dep.name)
        save_deployment(dep, os.path.join(tmp, "deployment.json"))
        if classes is not None:
            write_classes(tmp, classes)
        del bundle
        t_write = time.perf_counter()
        # The generator's own op times (duration_micros), which carry the spec's compute model. Folding
        # is proven, never assumed ("auto": a fold the network model times differently for another
        # replica, e.g. a DP ring crossing nodes unevenly, is replayed unfolded).
        ts = discover(tmp, compact=True)
        result = simulate(
            ts,
            network=network,
            compute=DurationModel(),
            fold=("dp" if strict == "dp" else True if strict else "auto") if fold else None,
        )
    summary = result.summary_dict()
    t_end = time.perf_counter()
    return Replay(
        iteration_ns=int(summary["iteration_time_ns"]),
        nodes=nodes,
        replayed_ranks=result.ranks_simulated,
        wall_s=t_end - t0,
        ops=result.ops if keep_ops else None,
        phases_s=(t_gen - t0, t_write - t_gen, t_end - t_write),
    )


def estimate_nodes(run: Run, micro_batches: int) -> int:
    """Rough count of generated nodes (budget decision only)."""
    framework = str(dict(run.options).get("framework", "megatron-core"))  # tracegen's default profile
    per = NODES_PER_LAYER_STEP[framework][run.recompute] + (SP_EXTRA_NODES if run.sequence_parallel else 0)
    return run.gpus * micro_batches * (run.layers // run.pp) * per


def extrapolation_points(run: Run, max_nodes: int) -> tuple[int, int] | None:
    """Micro-batch counts (m1, m2) to replay instead of m when m does not fit the budget; None if m fits.

    m1 = pp (1F1B past its warm-up; Megatron's interleaving needs multiples of pp), m2 = 2 m1.
    """
    m = run.micro_batches
    if estimate_nodes(run, m) <= max_nodes:
        return None
    m1 = run.pp
    if 2 * m1 >= m:
        return None  # nothing to gain: too large either way
    return m1, 2 * m1


@dataclass(frozen=True)
class Prediction:
    """xsim's predicted time per iteration for a run and how it was obtained."""

    run: Run
    seconds: float | None  # None: not replayed (over budget)
    method: str
    nodes: int
    wall_s: float
    gaps: tuple[str, ...] = ()

    @property
    def error_pct(self) -> float | None:
        """(predicted - measured) / measured, in percent."""
        if self.seconds is None:
            return None
        meas = measured_seconds(self.run)
        return 100.0 * (self.seconds - meas) / meas


def predict(
    run: Run, max_nodes: int = DEFAULT_MAX_NODES, fold: bool = True, extrapolate_m: bool = False
) -> Prediction:
    """Replay a run at its real micro-batch and GPU counts (with `extrapolate_m`, a run over the node
    budget at two smaller micro-batch counts, extrapolated); honours the node budget.

    A run setting a spec key this checkout lacks is reported as "needs feature <key>"; a spec that tracegen
    refuses (a value it does not know yet) as "refused by xsim: <its one-line error>": neither is replayed."""
    missing = needed_features(run)
    if missing:
        return Prediction(run, None, f"needs feature {', '.join(missing)}", 0, 0.0)
    from xsim.traces.errors import XsimError

    try:
        return _predict(run, max_nodes, fold, extrapolate_m)
    except XsimError as exc:
        return Prediction(run, None, f"refused by xsim: {str(exc).splitlines()[0]}", 0, 0.0)


def _predict(run: Run, max_nodes: int, fold: bool, extrapolate_m: bool) -> Prediction:
    gaps = tuple(legacy_gaps(run))
    # A folded run generates and simulates one rank per rank class (a compact set, tracegen/compact.py:
    # one rank per stage where TP ranks are alike, else one DP replica): the budget is its nodes.
    per = fold_factor(run) if fold else 1
    budget = max_nodes * per
    points = extrapolation_points(run, budget) if extrapolate_m else None
    m = run.micro_batches
    if points is None:
        if estimate_nodes(run, m) > budget:
            return Prediction(
                run, None, f"not replayed (~{estimate_nodes(run, m) // per:,} nodes)", 0, 0.0, gaps
            )
        rep = replay_spec(spec_for(run), fold=fold)
        folded = f", 1 of {run.dp} DP replicas" if rep.replayed_ranks < run.gpus else ""
        if rep.replayed_ranks == run.pp and per > run.dp:
            folded = f", 1 of {per} rank classes (DP replica x TP position)"
        return Prediction(run, rep.iteration_ns / 1e9, f"replayed{folded}", rep.nodes, rep.wall_s, gaps)
    m1, m2 = points
    if estimate_nodes(run, m2) > budget:
        return Prediction(
            run, None, f"not replayed (~{estimate_nodes(run, m2) // per:,} nodes at m={m2})", 0, 0.0, gaps
        )
    r1 = replay_spec(spec_for(run, micro_batches=m1), fold=fold)
    r2 = replay_spec(spec_for(run, micro_batches=m2), fold=fold)
    seconds = extrapolate(m, (m1, r1.iteration_ns), (m2, r2.iteration_ns)) / 1e9
    return Prediction(
        run, seconds, f"m={m1},{m2} extrapolated to {m}", r1.nodes + r2.nodes, r1.wall_s + r2.wall_s, gaps
    )


def fold_factor(run: Run) -> int:
    """Ranks each generated rank of a folded replay stands for: the set's rank classes (DP replicas x TP
    positions where a stage's TP ranks are alike, tracegen/compact.py), 1 when nothing folds."""
    from xsim.tracegen import load_spec
    from xsim.tracegen.compact import rank_classes

    classes = rank_classes(load_spec(spec_for(run)), rewrite=False)
    return 1 if classes is None else len(classes.replicas)


def extrapolate(m: int, p1: tuple[int, int], p2: tuple[int, int]) -> float:
    """Linear extrapolation of iteration time (ns) in the micro-batch count from two replays."""
    (m1, t1), (m2, t2) = p1, p2
    return t1 + (m - m1) * (t2 - t1) / (m2 - m1)


# ---------------------------------------------------------------- per-layer benchmark


@dataclass(frozen=True)
class LayerResult:
    """Simulated forward/backward time of one layer beside the published one."""

    row: LayerRow
    forward_ms: float
    backward_ms: float


def layer_window_ms(ops: Any, rank: int, layer: int, phases: Sequence[str]) -> float:
    """Span of a layer's ops of the given phases on a rank (first start to last end), in ms."""
    import polars as pl

    sel = ops.filter((pl.col("rank") == rank) & (pl.col("layer") == layer) & pl.col("phase").is_in(phases))
    if sel.height == 0:
        raise ValueError(f"no ops of layer {layer}, phases {list(phases)} on rank {rank}")
    return (int(sel["end_ns"].max()) - int(sel["start_ns"].min())) / 1e6


def layer_results(bench: LayerBenchmark) -> list[LayerResult]:
    """Replay the benchmark's model once per row and time a middle layer's forward and backward on rank 0."""
    out = []
    layer = bench.run.layers // 2
    for row in bench.rows:
        spec = spec_for(bench.run, recompute=row.recompute, sequence_parallel=row.sequence_parallel)
        rep = replay_spec(spec, keep_ops=True)
        fwd = layer_window_ms(rep.ops, 0, layer, ("fwd",))
        bwd = layer_window_ms(rep.ops, 0, layer, ("bwd", "recompute"))
        out.append(LayerResult(row, fwd, bwd))
    return out


# ---------------------------------------------------------------- tables


def config_text(run: Run) -> str:
    """Compact configuration of a run for the table."""
    parts = [
        f"{run.gpus}x{run.gpu}", f"L{run.layers} h{run.hidden} a{run.heads} s{run.seq_len}",
        f"TP{run.tp} PP{run.pp} DP{run.dp}" + (f" v{run.virtual_stages}" if run.virtual_stages > 1 else ""),
        f"mb{run.micro_batch} gb{run.global_batch}", f"rc {run.recompute}" + (" +SP" if run.sequence_parallel else ""),
        run.precision, run.attention,
    ]  # fmt: skip
    if run.ffn_hidden or run.kv_heads or run.activation != "gelu" or run.norm != "layernorm":
        parts.insert(
            2, f"ffn{run.ffn} kv{run.kv_heads or run.heads} {run.activation} {run.norm} v{run.vocab}"
        )
    if run.tie_embeddings is not None:
        parts.append("tied" if run.tie_embeddings else "untied")
    if run.position_embedding:
        parts.append(f"pos {run.position_embedding}")
    if run.embedding_norm:
        parts.append("embedding LN")
    if run.parallel_residual:
        parts.append("parallel residual")
    if run.rotary_pct != 1.0:
        parts.append(f"rotary {run.rotary_pct:g}")
    if run.qk_layernorm:
        parts.append("QK norm")
    parts += [f"{k}={_option_text(v)}" for k, v in run.options]
    return ", ".join(parts)


def source_label(run: Run) -> str:
    """Short citation of a run's measured number: source key and table/row (the dataset has the rest)."""
    where = re.split(r" \(|:", run.where, maxsplit=1)[0]
    return f"{run.source}, {where}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1f}%"


CONVERSION_LABEL = {
    "tflops_per_gpu": " (from TFLOP/s, eq. 3)",
    "tokens_per_s_per_gpu": " (from tokens/s/GPU)",
}


def runs_table(preds: Sequence[Prediction]) -> str:
    """The Markdown table of runs with the median |error| line (deterministic for the same inputs)."""
    lines = [
        "| run | source | configuration | measured s | predicted s | error | how |",
        "| --- | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for p in preds:
        pred = "-" if p.seconds is None else f"{p.seconds:.3f}"
        how = (p.method + (f"; missing: {', '.join(p.gaps)}" if p.gaps else "")).replace("|", "/")
        conv = CONVERSION_LABEL.get(p.run.measured_kind, "")
        lines.append(
            f"| {p.run.id} | {source_label(p.run)} | {config_text(p.run)} | "
            f"{measured_seconds(p.run):.3f}{conv} | {pred} | {_pct(p.error_pct)} | {how} |"
        )
    lines.append("")
    lines.append(summary_line(preds))
    return "\n".join(lines) + "\n"


def summary_line(preds: Sequence[Prediction]) -> str:
    """Median |error|, rows within +-10%, and how many rows were replayed."""
    errs = [abs(p.error_pct) for p in preds if p.error_pct is not None]
    if not errs:
        return f"No run of the {len(preds)} was replayed."
    within = sum(1 for e in errs if e <= 10.0)
    return (
        f"Replayed {len(errs)} of {len(preds)} runs: median |error| {statistics.median(errs):.1f}%, "
        f"max |error| {max(errs):.1f}%, {within} of {len(errs)} within +-10%."
    )


def layers_table(results: Sequence[LayerResult]) -> str:
    """Markdown table of the per-layer benchmark."""
    lines = [
        "| experiment | fwd measured ms | fwd xsim ms | fwd error | bwd measured ms | bwd xsim ms | bwd error |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        fe = 100 * (r.forward_ms - r.row.forward_ms) / r.row.forward_ms
        be = 100 * (r.backward_ms - r.row.backward_ms) / r.row.backward_ms
        lines.append(
            f"| {r.row.experiment} | {r.row.forward_ms:.1f} | {r.forward_ms:.2f} | {fe:+.1f}% | "
            f"{r.row.backward_ms:.1f} | {r.backward_ms:.2f} | {be:+.1f}% |"
        )
    return "\n".join(lines) + "\n"


def excluded_table(data: Dataset) -> str:
    """Markdown list of the runs left out and why."""
    return "".join(f"- {what}: {why}\n" for what, why in data.excluded)


# ---------------------------------------------------------------- model-FLOPs utilisation


def model_flops_per_token(run: Run) -> float:
    """Model FLOPs per trained token by PaLM's formula (Chowdhery et al. 2022, Appendix B): 6 N + 12 L h s.

    N counts the weights of every matmul: attention (Q and output h x h each, K and V h x h kv/heads each),
    MLP (2 h ffn, 3 h ffn for SwiGLU or GeGLU) and the LM head (h V); the embedding gather is no matmul. 12 L h s is
    the attention score and context matmuls over the full s x s matrix (recomputation is not counted).
    """
    h = run.hidden
    kv_dim = h * (run.kv_heads or run.heads) // run.heads
    gated = run.activation in ("swiglu", "geglu")  # tracegen.choices.GATED_ACTIVATIONS: three MLP matrices
    per_layer = 2 * h * h + 2 * h * kv_dim + (3 if gated else 2) * h * run.ffn
    n = run.layers * per_layer + h * run.vocab
    return 6.0 * n + 12.0 * run.layers * h * run.seq_len


def mfu_run() -> Run:
    """Issue 22's MFU case: data-parallel Llama-2 7B on 8 A100-80GB, bf16, flash attention, distributed
    optimizer; sizes from tracegen's llama2-7b preset; micro-batch 1 and global batch 128 as NeMo's Llama-2
    7B performance row (8 GPUs, GBS 128, MBS 1, s 4096); every other setting is tracegen's default."""
    from xsim.tracegen.models import preset

    m = preset("llama2-7b")
    return Run(
        id="mfu-llama2-7b-dp8-a100", source="tracegen preset llama2-7b", where="issue 22", config_source="",
        config_where="", layers=m.layers, hidden=m.hidden, heads=m.heads, seq_len=m.seq_len, vocab=m.vocab,
        gpu="A100-80GB", cluster="dgx-a100", attention="flash", tp=1, pp=1, dp=8, micro_batch=1,
        global_batch=128, virtual_stages=1, recompute="none", sequence_parallel=False, precision="bf16",
        measured_kind="iteration_s", measured_value=1.0, ffn_hidden=m.ffn_hidden, kv_heads=m.kv_heads,
        activation=m.activation, norm=m.norm, linear_bias=m.linear_bias,
        options=(("distributed_optimizer", True),),
    )  # fmt: skip


def mfu_line(seconds: float | None, reason: str = "not replayed", run: Run | None = None) -> str:
    """The MFU sentence of the page: predicted MFU = model FLOPs per iteration / (T n peak)."""
    run = run or mfu_run()
    what = (
        f"Model-FLOPs utilisation of a data-parallel Llama-2 7B on {run.gpus} A100-80GB (bf16, flash attention, "
        f"distributed optimizer; TP 1, PP 1, DP {run.dp}, micro-batch {run.micro_batch}, global batch "
        f"{run.global_batch}, s {run.seq_len})"
    )
    if seconds is None:
        return f"{what}: {reason}.\n"
    flops = model_flops_per_token(run) * run.global_batch * run.seq_len
    mfu = 100.0 * flops / (seconds * run.gpus * A100_PEAK_BF16)
    return (
        f"{what}: predicted {seconds:.3f} s per iteration, MFU {mfu:.1f}% (PaLM's 6N + 12Lhs FLOPs per token, "
        f"{flops:.4e} FLOPs per iteration, A100 dense BF16 peak 312 TFLOP/s; issue 22's target 40-60%).\n"
    )


# ---------------------------------------------------------------- the page


class PageError(Exception):
    """The page to write has no generated block of that name: one line naming the file and the block."""


BLOCKS = ("runs", "mfu", "layers", "excluded")


SCRIPT = "validate_published.py"


def block_markers(name: str, script: str = SCRIPT) -> tuple[str, str]:
    """The HTML comments around a generated block of docs/validation.md (written by scripts/`script`)."""
    return (
        f"<!-- BEGIN generated by scripts/{script}: {name} -->",
        f"<!-- END generated: {name} -->",
    )


def page_block(page: str, name: str, script: str = SCRIPT) -> str | None:
    """The text of the generated block `name` of a page (None when the page has no such block)."""
    begin, end = block_markers(name, script)
    i, j = page.find(begin), page.find(end)
    if i < 0 or j < i:
        return None
    return page[i + len(begin) : j].strip("\n") + "\n"


def splice_page(page: str, blocks: Mapping[str, str], path: str = "page", script: str = SCRIPT) -> str:
    """The page with each named generated block replaced; the hand-written text outside stays as it is."""
    for name, text in blocks.items():
        begin, end = block_markers(name, script)
        i, j = page.find(begin), page.find(end)
        if i < 0 or j < i:
            raise PageError(f"{path}: no generated block {name!r} (expected the lines {begin} ... {end})")
        page = page[: i + len(begin)] + "\n" + text.rstrip("\n") + "\n" + page[j:]
    return page


def new_page(blocks: Mapping[str, str]) -> str:
    """A page made of the generated blocks only (when --out names a file that does not exist yet)."""
    titles = {"runs": "## Runs", "mfu": "## Model-FLOPs utilisation", "layers": "## One layer of the 22B model "
              "(Korthikanti et al. 2022, Table 4)", "excluded": "## Left out"}  # fmt: skip
    parts = []
    for name in BLOCKS:
        if name in blocks:
            begin, end = block_markers(name)
            parts.append(f"{titles[name]}\n\n{begin}\n{blocks[name].rstrip(chr(10))}\n{end}\n")
    return "\n".join(parts)


def table_rows(block: str) -> list[list[str]]:
    """The body rows of the first Markdown table of a block, as lists of stripped cells."""
    rows = []
    for line in block.splitlines():
        if line.startswith("| ") and not line.startswith("| ---"):
            rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return rows[1:]  # without the header


def page_run_ids(page: str) -> list[str]:
    """The run ids of the page's generated runs table, in order."""
    block = page_block(page, "runs")
    return [] if block is None else [r[0] for r in table_rows(block)]


def kept_predictions(page: str, runs: Sequence[Run]) -> dict[str, Prediction]:
    """The page's previous predictions of `runs` (for rows this invocation does not replay)."""
    block = page_block(page, "runs")
    if block is None:
        return {}
    by_id = {r.id: r for r in runs}
    out = {}
    for cells in table_rows(block):
        if len(cells) == 7 and cells[0] in by_id:
            try:
                seconds = None if cells[4] == "-" else float(cells[4])
            except ValueError:  # a hand-edited cell: nothing to keep but the row
                seconds = None
            how = cells[6] if cells[6].endswith(KEPT) else cells[6] + KEPT
            out[cells[0]] = Prediction(by_id[cells[0]], seconds, how, 0, 0.0)
    return out


KEPT = " (kept from the page's previous run)"


# ---------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """Run the validation and print (and optionally write) the Markdown tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data", default=str(DATA), help="dataset YAML (default: scripts/data/published_runs.yaml)"
    )
    ap.add_argument("--only", nargs="+", metavar="ID", help="replay only these run ids")
    ap.add_argument(
        "--max-nodes",
        type=int,
        default=DEFAULT_MAX_NODES,
        help="nodes generated and simulated per replay (one DP replica of a folded run)",
    )
    ap.add_argument(
        "--extrapolate",
        action="store_true",
        help="replay a run over --max-nodes at two smaller micro-batch counts and extrapolate (default: "
        "every run at its real micro-batch count, or not replayed)",
    )
    ap.add_argument(
        "--no-fold", action="store_true", help="replay every DP replica (default: fold identical replicas)"
    )
    ap.add_argument("--no-layers", action="store_true", help="skip the per-layer benchmark")
    ap.add_argument("--no-runs", action="store_true", help="only the per-layer benchmark")
    ap.add_argument("--no-mfu", action="store_true", help="skip the Llama-2 7B model-FLOPs utilisation line")
    ap.add_argument(
        "--out",
        metavar="FILE.md",
        help="write the tables into the generated blocks of this page (docs/validation.md), keeping the "
        "hand-written text around them; a new file holds the blocks only",
    )
    args = ap.parse_args(argv)
    try:
        data = load_dataset(args.data)
    except ValidationDataError as exc:
        print(f"validate_published: error: {exc}", file=sys.stderr)
        return 2
    runs = data.runs
    if args.only:
        unknown = sorted(set(args.only) - {r.id for r in runs})
        if unknown:
            print(f"validate_published: error: unknown run id(s) {', '.join(unknown)}", file=sys.stderr)
            return 2
        runs = tuple(r for r in runs if r.id in set(args.only))
    from xsim.traces.errors import XsimError

    try:
        return _run_all(args, data, runs)
    except XsimError as exc:  # a spec or replay problem: one line, as xsim's CLI reports it
        print(f"validate_published: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2


def _run_all(args: argparse.Namespace, data: Dataset, runs: Sequence[Run]) -> int:
    """Predict every run, then print the blocks and write (or splice into) the page."""
    t0, c0 = time.perf_counter(), time.process_time()
    page = None
    if args.out and Path(args.out).exists():
        page = Path(args.out).read_text(encoding="utf-8")
    blocks: dict[str, str] = {}
    if not args.no_runs:
        done = {run.id: _predict_logged(run, args) for run in runs}
        if args.out:
            # The page always lists the whole dataset: a row this invocation did not replay (--only) keeps
            # the page's previous line, marked as kept; a row the page never had says so.
            kept = kept_predictions(page, data.runs) if page else {}
            missing = "not run in this invocation"
            preds = [
                done.get(r.id) or kept.get(r.id) or Prediction(r, None, missing, 0, 0.0) for r in data.runs
            ]
        else:
            preds = list(done.values())
        blocks["runs"] = runs_table(preds)
        if not args.only and not args.no_mfu:
            p = _predict_logged(mfu_run(), args, measured=False)
            blocks["mfu"] = mfu_line(p.seconds, p.method)
    if not args.no_layers and data.layers is not None:
        need = needed_features(data.layers.run)
        if need:
            blocks["layers"] = f"Not replayed: needs feature {', '.join(need)}.\n"
        else:
            blocks["layers"] = layers_table(layer_results(data.layers))
    if data.excluded and not args.only:
        blocks["excluded"] = excluded_table(data)
    print(new_page(blocks))
    # CPU time beside wall time: on a shared machine the wall time says more about the neighbours.
    print(
        f"wall time {time.perf_counter() - t0:.1f} s, CPU time {time.process_time() - c0:.1f} s",
        file=sys.stderr,
    )
    if args.out:
        try:
            text = new_page(blocks) if page is None else splice_page(page, blocks, args.out)
        except PageError as exc:
            print(f"validate_published: error: {exc}", file=sys.stderr)
            return 2
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


def _predict_logged(run: Run, args: argparse.Namespace, measured: bool = True) -> Prediction:
    """predict() with one progress line on stderr (wall and CPU seconds of the row)."""
    c1 = time.process_time()
    p = predict(run, args.max_nodes, fold=not args.no_fold, extrapolate_m=args.extrapolate)
    meas = f"measured {measured_seconds(run):.3f} s, " if measured else ""
    print(
        f"{run.id}: {p.method}, {meas}predicted "
        f"{'-' if p.seconds is None else f'{p.seconds:.3f} s'} ({_pct(p.error_pct) if meas else 'no measurement'}), "
        f"{p.nodes:,} nodes, {p.wall_s:.1f} s wall, {time.process_time() - c1:.1f} s CPU",
        file=sys.stderr,
    )
    return p


if __name__ == "__main__":
    sys.exit(main())
