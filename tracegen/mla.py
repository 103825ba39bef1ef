"""Multi-head latent attention (DeepSeek-V2/V3): its ops on one TP rank and the parameters a rank holds.

DeepSeek-V2 (arXiv:2405.04434, section 2.1) and Megatron-Core's MLASelfAttention
(megatron/core/transformer/multi_latent_attention.py): the hidden state is projected down to a query
latent (q_lora_rank, RMSNorm) and up to the heads' queries (qk_nope_head_dim + qk_rope_head_dim each);
jointly down to a KV latent (kv_lora_rank, RMSNorm) plus one decoupled RoPE key (qk_rope_head_dim) shared
by the heads, and the latent up to the heads' non-RoPE keys and values (v_head_dim). The down projections
are whole on every TP rank; the up projections split the heads (column-parallel), the output projection
(heads x v_head_dim -> hidden) is row-parallel. Attention: scores over qk = nope + rope dims, weighted sum
over v dims; causal flash attention executes half of 2 b s^2 h (qk + v) forward (the FLOP rule of
tracegen.ops). In training MLA's keys and values are materialized per head (no latent caching), so the
attention kernel reads Q, K (qk wide) and V, writes O (v wide).
"""

from __future__ import annotations

from xsim.tracegen.models import ModelArch
from xsim.tracegen.moe import MlaSpec
from xsim.tracegen.ops import ELEM_FLOPS, Ctx, Op, Shard, _elem, _gemm, _kern

# The dense ops MLA replaces (in either pass).
REPLACED = ("qkv_proj", "rope", "attn_core", "attn_out_proj")


def mla_projection_steps(c: Ctx, mla: MlaSpec, phase: str) -> list[Op]:
    """Q and KV projections of one layer (forward order; backward reverses them)."""
    m, b, t, hl = c.m, c.b, c.tokens, c.sh.heads
    qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    norm = ELEM_FLOPS["rmsnorm"]
    n_bwd = (2, 1) if phase == "bwd" else (1, 1)
    ops: list[Op] = []
    if mla.q_lora_rank:
        ops += [
            _gemm("mla_q_down", phase, t, m.hidden, mla.q_lora_rank, b),
            _elem("mla_q_norm", phase, t * mla.q_lora_rank, norm, *n_bwd, b),
            _gemm("mla_q_up", phase, t, mla.q_lora_rank, hl * qk, b),
        ]
    else:
        ops.append(_gemm("mla_q_proj", phase, t, m.hidden, hl * qk, b))
    ops += [
        _gemm("mla_kv_down", phase, t, m.hidden, mla.kv_lora_rank + mla.qk_rope_head_dim, b),
        _elem("mla_kv_norm", phase, t * mla.kv_lora_rank, norm, *n_bwd, b),
        _gemm("mla_kv_up", phase, t, mla.kv_lora_rank, hl * (mla.qk_nope_head_dim + mla.v_head_dim), b),
    ]
    return ops if phase == "fwd" else ops[::-1]


def mla_rope(c: Ctx, mla: MlaSpec, phase: str) -> Op:
    """RoPE on the queries' rope dims (every local head) and the one shared rope key."""
    elems = c.tokens * (c.sh.heads + 1) * mla.qk_rope_head_dim
    return _kern("rope", phase, elems, 3, 2 * c.b)


def mla_core(c: Ctx, mla: MlaSpec, phase: str) -> Op:
    """Causal flash attention with qk-wide scores and v-wide values: 2 b s^2 h (qk + v) / 2 forward."""
    qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    v = mla.v_head_dim
    hl, s, mb = c.sh.heads, c.s, c.mb
    flops = 2 * mb * hl * s * s * (qk + v) // 2
    byt = c.b * mb * s * hl * (2 * qk + 2 * v)
    mult = 2 if phase == "bwd" else 1
    return Op("attn_core", phase, mult * flops, mult * byt, (mb, hl, hl, s, qk, v), True)


def with_mla(steps: list, c: Ctx, mla: MlaSpec, phase: str) -> list:
    """A layer's steps with the QKV projection, RoPE, attention core and output projection of MLA."""
    out = []
    for s in steps:
        if not isinstance(s, Op) or s.op not in REPLACED:
            out.append(s)
            continue
        ph = s.phase  # a recomputed forward op inside a backward pass keeps its forward cost
        if s.op == "qkv_proj":
            out += mla_projection_steps(c, mla, ph)
        elif s.op == "rope":
            out.append(mla_rope(c, mla, ph))
        elif s.op == "attn_core":
            out.append(mla_core(c, mla, ph))
        else:
            out.append(_gemm("attn_out_proj", ph, c.tokens, c.sh.heads * mla.v_head_dim, c.m.hidden, c.b))
    return out


def mla_rank_params(m: ModelArch, mla: MlaSpec, sh: Shard) -> int:
    """MLA weights one TP rank holds of one layer: the down projections and latent norms whole, the up and
    output projections for its heads."""
    qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    hl = sh.heads
    if mla.q_lora_rank:
        q = m.hidden * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * hl * qk
    else:
        q = m.hidden * hl * qk
    kv = m.hidden * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank
    kv += mla.kv_lora_rank * hl * (mla.qk_nope_head_dim + mla.v_head_dim)
    return q + kv + hl * mla.v_head_dim * m.hidden
