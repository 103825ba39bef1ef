"""The ops of one transformer layer, embedding, head and optimizer on one TP rank: FLOPs, bytes, shape, time.

FLOP conventions (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", section 5.1): a GEMM of [M,K]x[K,N] costs 2MKN; attention scores and the weighted sum
cost 2*b*s^2*h each in forward, without a causal-mask discount; backward costs twice forward (input and
weight gradients). Element-wise ops are memory-bound: their time is bytes over bandwidth, their FLOPs
are small per-element counts given below (they change totals by well under 1%).
"""

from __future__ import annotations

from dataclasses import dataclass

from tracegen.catalog import GpuSpec, tensor_peak
from tracegen.choices import ATTENTIONS, COMPUTE_MODELS, PRECISIONS  # noqa: F401 - their old home
from tracegen.gemm import LAUNCH_FLOOR_S, gemm_seconds
from tracegen.models import ModelArch
from tracegen.profile import ProfileTable

# Linear-layer GEMMs: the ops Transformer Engine runs in FP8 under `precision: fp8` (Megatron's output
# layer, lm_head, is a plain ColumnParallelLinear outside TE and stays BF16).
LINEAR_OPS: frozenset[str] = frozenset({"qkv_proj", "attn_out_proj", "mlp_up_gate", "mlp_down"})
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
# The attention core that Megatron's selective recompute repeats (Korthikanti et al. 2022, section 4.2:
# QK^T, softmax, softmax dropout and attention over V): the fused FlashAttention op and the unfused ops'
# names. These ops hold the s^2 activations that make recomputing them cheap relative to storing them.
ATTN_CORE_OPS: frozenset[str] = frozenset(
    {"attn_core", "attn_scores", "attn_softmax", "attn_dropout", "attn_context"}
)
RECOMPUTE_MODES = ("none", "selective", "full")


@dataclass(frozen=True)
class Shard:
    """What one TP rank holds of each sharded dimension (uneven splits give ranks +-1 head)."""

    tp: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int


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


@dataclass(frozen=True)
class Comm:
    """A TP-group collective between compute ops: kind in all_reduce / all_gather / reduce_scatter."""

    op: str
    kind: str
    size: int  # bytes, ASTRA-sim convention: AllGather = per-rank input, others = full buffer


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

    @property
    def tokens(self) -> int:
        return self.mb * self.s

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
        return (
            [Comm(op, "all_gather", c.norm_tokens * c.m.hidden * c.b)]
            if fwd
            else [Comm(op, "reduce_scatter", full)]
        )
    return [] if fwd else [Comm(op, "all_reduce", full)]


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

    Unfused (Megatron's non-flash path) materializes the b x heads x s x s scores: a batched GEMM Q K^T,
    a memory-bound scale-mask-softmax and dropout over b*heads*s^2 elements, and a batched GEMM of the
    probabilities with V; FLOPs as the fused op (2*b*s^2*h each GEMM). Backward: each GEMM twice, softmax
    reads probabilities and their gradient, dropout reads the gradient and its 1-byte mask.
    """
    m, sh, b, s, mb = c.m, c.sh, c.b, c.s, c.mb
    d = m.head_dim
    attn_flops = 4 * mb * sh.heads * s * s * d
    if c.attention != "unfused":
        attn_bytes = b * mb * s * d * (2 * sh.heads + 2 * sh.kv_heads)
        shape = (mb, sh.heads, sh.kv_heads, s, d)
        if phase == "fwd":
            return [Op("attn_core", "fwd", attn_flops, attn_bytes, shape, True)]
        return [Op("attn_core", "bwd", 2 * attn_flops, 2 * attn_bytes, shape, True)]
    bh, scores = mb * sh.heads, mb * sh.heads * s * s
    q, kv = mb * s * sh.heads * d, mb * s * sh.kv_heads * d
    mult = 2 if phase == "bwd" else 1
    gemm_flops = mult * attn_flops // 2
    ops = [
        Op("attn_scores", phase, gemm_flops, mult * b * (q + kv + scores), (bh, s, d, s), True, kernels=mult),
        Op(
            "attn_softmax", phase, mult * ELEM_FLOPS["softmax"] * scores, (3 if mult == 2 else 2) * b * scores,
            (scores,), False,
        ),
        Op("attn_dropout", phase, mult * ELEM_FLOPS["dropout"] * scores, scores * (2 * b + 1), (scores,), False),
        Op("attn_context", phase, gemm_flops, mult * b * (scores + kv + q), (bh, s, s, d), True, kernels=mult),
    ]  # fmt: skip
    return ops if phase == "fwd" else ops[::-1]


def layer_steps(c: Ctx, phase: str) -> list[Step]:
    """Ops and TP collectives of one transformer layer in execution order."""
    m, sh, b, t = c.m, c.sh, c.b, c.tokens
    d = m.head_dim
    nt = c.norm_tokens
    norm = ELEM_FLOPS[m.norm]
    q_kv = (sh.heads + 2 * sh.kv_heads) * d
    up = (2 if m.activation == "swiglu" else 1) * sh.ffn
    act_f = ELEM_FLOPS[m.activation]
    fp8 = c.precision == "fp8"
    act_rw = (2, 1) if m.activation == "swiglu" else (1, 1)
    if phase == "fwd":
        return [
            _elem("attn_norm", "fwd", nt * m.hidden, norm, 1, 1, b),
            *_tp_in(c, "attn_tp_in", True),
            _gemm("qkv_proj", "fwd", t, m.hidden, q_kv, b, fp8),
            *attention_steps(c, "fwd"),
            _gemm("attn_out_proj", "fwd", t, sh.heads * d, m.hidden, b, fp8),
            *_tp_out(c, "attn_tp_out", True),
            _elem("attn_residual", "fwd", nt * m.hidden, ELEM_FLOPS["add"], 2, 1, b),
            _elem("mlp_norm", "fwd", nt * m.hidden, norm, 1, 1, b),
            *_tp_in(c, "mlp_tp_in", True),
            _gemm("mlp_up_gate", "fwd", t, m.hidden, up, b, fp8),
            _elem("mlp_act", "fwd", t * sh.ffn, act_f, *act_rw, b),
            _gemm("mlp_down", "fwd", t, sh.ffn, m.hidden, b, fp8),
            *_tp_out(c, "mlp_tp_out", True),
            _elem("mlp_residual", "fwd", nt * m.hidden, ELEM_FLOPS["add"], 2, 1, b),
        ]
    act_bwd_rw = (3, 2) if m.activation == "swiglu" else (2, 1)
    return [
        *_tp_out(c, "mlp_tp_out", False),
        _gemm("mlp_down", "bwd", t, sh.ffn, m.hidden, b, fp8),
        _elem("mlp_act", "bwd", t * sh.ffn, act_f, *act_bwd_rw, b),
        _gemm("mlp_up_gate", "bwd", t, m.hidden, up, b, fp8),
        *_tp_in(c, "mlp_tp_in", False),
        _elem("mlp_norm", "bwd", nt * m.hidden, norm, 2, 1, b),
        _elem("mlp_residual", "bwd", nt * m.hidden, ELEM_FLOPS["add"], 2, 1, b),
        *_tp_out(c, "attn_tp_out", False),
        _gemm("attn_out_proj", "bwd", t, sh.heads * d, m.hidden, b, fp8),
        *attention_steps(c, "bwd"),
        _gemm("qkv_proj", "bwd", t, m.hidden, q_kv, b, fp8),
        *_tp_in(c, "attn_tp_in", False),
        _elem("attn_norm", "bwd", nt * m.hidden, norm, 2, 1, b),
        _elem("attn_residual", "bwd", nt * m.hidden, ELEM_FLOPS["add"], 2, 1, b),
    ]


def attn_core_recompute(c: Ctx) -> list[Op]:
    """Selective recompute: the layer's forward attention-core ops (ATTN_CORE_OPS), in forward order."""
    return [s for s in layer_steps(c, "fwd") if isinstance(s, Op) and s.op in ATTN_CORE_OPS]


def with_selective_recompute(bwd: list[Step], recompute: list[Op]) -> list[Step]:
    """`bwd` with the recomputed attention core inserted right before its first attention-core backward op.

    Megatron checkpoints the core attention alone, so autograd re-runs its forward when the backward pass
    reaches it: after the output projection's backward, before the attention core's backward.
    """
    for i, s in enumerate(bwd):
        if isinstance(s, Op) and s.op in ATTN_CORE_OPS:
            return [*bwd[:i], *recompute, *bwd[i:]]
    return list(bwd)


def embedding_steps(c: Ctx, phase: str) -> list[Step]:
    """Vocab-parallel input embedding (first stage): lookup, then the partial rows summed over TP."""
    t, h, b = c.tokens, c.m.hidden, c.b
    if phase == "fwd":
        return [
            Op("embedding", "fwd", 0, 2 * t * h * b, (t, h), False),
            *_tp_out(c, "embedding_tp_out", True),
        ]
    # scatter-add of the token gradients into the table rows
    return [
        *_tp_out(c, "embedding_tp_out", False),
        Op("embedding", "bwd", t * h, 3 * t * h * b, (t, h), False),
    ]


def head_steps(c: Ctx, phase: str) -> list[Step]:
    """Final norm, vocab-parallel output projection and softmax cross-entropy (last stage)."""
    m, sh, b, t = c.m, c.sh, c.b, c.tokens
    logits = t * sh.vocab
    norm = ELEM_FLOPS[m.norm]
    # Megatron's vocab-parallel cross-entropy all-reduces max, sum-exp and target logit (FP32, per token):
    # emitted as one AllReduce of their total size.
    xent_ar = [Comm("loss_tp", "all_reduce", 3 * t * 4)] if sh.tp > 1 else []
    if phase == "fwd":
        return [
            _elem("final_norm", "fwd", c.norm_tokens * m.hidden, norm, 1, 1, b),
            *_tp_in(c, "head_tp_in", True),
            _gemm("lm_head", "fwd", t, m.hidden, sh.vocab, b),
            *xent_ar,
            Op("loss", "fwd", ELEM_FLOPS["xent"] * logits, logits * (b + 4), (t, sh.vocab), False),
        ]
    return [
        Op("loss", "bwd", 2 * logits, logits * (4 + b), (t, sh.vocab), False),
        _gemm("lm_head", "bwd", t, m.hidden, sh.vocab, b),
        *_tp_in(c, "head_tp_in", False),
        _elem("final_norm", "bwd", c.norm_tokens * m.hidden, norm, 2, 1, b),
    ]


def rank_params(m: ModelArch, sh: Shard, layers: int, first: bool, last: bool) -> int:
    """Parameters one TP rank holds for `layers` layers (+ embedding / head shards on the end stages)."""
    d = m.head_dim
    qkv = (sh.heads + 2 * sh.kv_heads) * d
    up = (2 if m.activation == "swiglu" else 1) * sh.ffn
    attn = m.hidden * qkv + sh.heads * d * m.hidden + ((qkv + m.hidden) if m.linear_bias else 0)
    mlp = m.hidden * up + sh.ffn * m.hidden + ((up + m.hidden) if m.linear_bias else 0)
    per_layer = attn + mlp + 2 * m.norm_params  # norms are replicated across TP ranks
    total = layers * per_layer
    if first:
        total += sh.vocab * m.hidden
    if last:
        total += m.norm_params + sh.vocab * m.hidden
    return total


def optimizer_op(params: int, b: int, grad_bytes: int | None = None) -> Op:
    """AdamW step over `params` parameters: reads the gradient, writes the weight, reads/writes FP32 state.

    `grad_bytes` is the gradient's width (default `b`; 4 under the distributed optimizer, whose gradient
    buffer is FP32 for BF16 training).
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


def op_seconds(op: Op, gpu: GpuSpec, model: str = "roofline") -> float:
    """Seconds of `op` on `gpu` under a compute model ("roofline" or "calibrated"), without a profile.

    roofline: GEMM-like ops max(FLOPs / (tensor peak of the op's precision * gemm_eff), bytes / (bw *
    mem_eff)), element-wise ops bytes / (bw * mem_eff). calibrated (tracegen.gemm): GEMMs by tile and wave
    quantization of their shape at the GPU's measured large-GEMM plateau; fused attention at gemm_eff;
    every op at least one launch floor per kernel.
    """
    mem = op.bytes / (gpu.mem_bw * gpu.mem_eff)
    if model == "calibrated":
        if op.gemm and op.op in GEMM_OPS:
            batch, (mm, k, n) = (op.shape[0], op.shape[1:]) if len(op.shape) == 4 else (1, op.shape)
            return gemm_seconds(mm, k, n, op.bytes, gpu, op.precision, batch, op.kernels)
        floor = op.kernels * LAUNCH_FLOOR_S if op.bytes or op.flops else 0.0
        compute = op.flops / (tensor_peak(gpu, op.precision) * gpu.gemm_eff) if op.gemm else 0.0
        return max(compute, mem, floor)
    if op.gemm:
        return max(op.flops / (tensor_peak(gpu, op.precision) * gpu.gemm_eff), mem)
    return mem


def op_time_seconds(
    op: Op, gpu: GpuSpec, profile: ProfileTable | None = None, model: str = "roofline"
) -> float:
    """Seconds of `op` on `gpu`: the profiled time if the table has the shape, else `op_seconds`."""
    measured = profile.lookup(gpu.name, op.op, op.phase, op.shape) if profile else None
    return measured * 1e-6 if measured is not None else op_seconds(op, gpu, model)


def duration_micros(
    op: Op, gpu: GpuSpec, profile: ProfileTable | None = None, model: str = "roofline"
) -> int:
    """Whole microseconds of `op` on `gpu` (Chakra's duration_micros): `op_time_seconds` rounded to the
    nearest microsecond, at least 1 for an op that does any work."""
    seconds = op_time_seconds(op, gpu, profile, model)
    if seconds <= 0:
        return 0
    return max(1, int(seconds * 1e6 + 0.5))


def duration_ns(op: Op, gpu: GpuSpec, profile: ProfileTable | None = None, model: str = "roofline") -> int:
    """Nanoseconds of `op` on `gpu` (the exact value the replay uses): rounded, at least 1 for real work."""
    seconds = op_time_seconds(op, gpu, profile, model)
    if seconds <= 0:
        return 0
    return max(1, int(seconds * 1e9 + 0.5))
