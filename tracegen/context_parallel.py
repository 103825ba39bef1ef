"""Context parallelism: each sequence split over `cp` ranks, the attention's keys and values exchanged.

Megatron-Core's context parallelism (docs: "context_parallel", Transformer Engine's attention with
cp_comm_type "p2p"): every rank holds seq/cp tokens of each sequence for all ops but the attention core;
the core needs every earlier key and value. Causal load balancing: the sequence is cut into 2*cp chunks
and CP rank c takes chunks c and 2*cp - 1 - c, so every rank does the same causal work.

Ring ("p2p"): cp steps per layer. Step i computes the local queries against the K/V block the rank holds
(its own at step 0, then the block of rank c - i); the block moves one rank on along the ring while the
step computes (exchange i, sent after the block arrived, under attention step i); step i + 1 waits for
exchange i (send and receive, as TE waits both requests before its next step). With load balancing each
step is one fused attention call of two chunk x chunk blocks' work (`ring_calls`: step 0 the causal s x s
of the local tokens; a step on an earlier rank's block both query chunks against its first chunk, s x s/2
unmasked; a later rank's block the second query chunk against both its chunks, s/2 x s unmasked), so the
per-rank total is the causal total / cp. Each call is timed at its own lengths and mask
(tracegen.ops.cp_attention_seconds).
Forward: cp - 1 K/V exchanges; backward: cp - 1 K/V exchanges and cp exchanges of the K/V gradient
(accumulated on each rank, it ends at its owner), the next op waiting for the last one.

All-gather (cp_comm_type "all_gather", the Llama 3 paper's section 3.3.2 form): an AllGather of K and V
over the CP group before one attention op (local queries against the whole sequence, the causal total /
cp; TE's two calls, one per local chunk: `gathered_calls`), and in backward a ReduceScatter of the K/V
gradient after it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from xsim.tracegen.ops import Ctx, Op, Step

CP_COMM_TYPES = ("p2p", "all_gather")
# P2P tags of the ring: below the MoE all-to-alls' 2^30 and above the pipeline's 2 * (chunk * M + mb) + 1.
CP_TAG_BASE = 1 << 29
# Ring kinds (tag = base + (layer * M + mb) * 4 * cp + kind * cp + step).
RING_KIND = {("kv", "fwd"): 0, ("kv", "bwd"): 1, ("dkv", "bwd"): 2, ("kv", "recompute"): 3}


@dataclass(frozen=True)
class RingXfer:
    """Exchange `index` of the ring: send `size` bytes to the next CP rank, receive as much from the previous.
    `what` is "kv" (the block travels on: the send waits for the previous exchange's receive; exchange 0
    sends the rank's own block after the op before the attention) or "dkv" (sent after the attention step
    just emitted)."""

    what: str
    index: int
    size: int


@dataclass(frozen=True)
class RingWait:
    """The next compute op waits for the oldest pending exchange (its send and its receive)."""


@dataclass(frozen=True)
class CpComm:
    """A collective over the CP group (all_gather form): kind in all_gather / reduce_scatter."""

    op: str
    kind: str
    size: int


CpStep = RingXfer | RingWait | CpComm


def kv_bytes(c: Ctx) -> int:
    """Bytes of the K and V a rank holds for its seq/cp tokens (its local KV heads), one micro-batch."""
    return c.mb * c.s * 2 * c.sh.kv_heads * c.m.head_dim * c.b


def ring_calls(s: int, i: int, me: int) -> tuple[int, int, int]:
    """The fused attention call of ring step i on CP rank `me` (s = seq / cp local tokens): (queries, keys,
    causal). Transformer Engine's AttnFuncWithCPAndKVP2P under a causal mask (TE v1.12 7a7225c4
    transformer_engine/pytorch/attention.py; d0067d0d .../dot_product_attention/context_parallel.py
    cp_p2p_fwd_prepare_qkv and cp_p2p_fwd_fused_attn): step 0 "diagonal", both local chunks against the own
    K/V, causal (s x s); step i <= rank "lower-triangle", both query chunks against the first K/V chunk of
    rank me - i, no mask (s x s/2); step i > rank "upper-triangle", the second query chunk against both K/V
    chunks of rank me - i + cp, no mask (s/2 x s). The backward runs the same call per step."""
    if i == 0:
        return (s, s, 1)
    return (s, s // 2, 0) if i <= me else (s // 2, s, 0)


def call_flops(c: Ctx, q: int, kv: int, causal: int) -> int:
    """Forward FLOPs of one attention call, the masked half of a causal call's q x q square left out:
    4 mb heads (q kv - causal q^2 / 2) d."""
    return 4 * c.mb * c.sh.heads * (q * kv - causal * q * q // 2) * c.m.head_dim


def call_bytes(c: Ctx, q: int, kv: int) -> int:
    """Bytes of one attention call: its queries and output (q tokens), its keys and values (kv tokens)."""
    return c.b * c.mb * c.m.head_dim * (2 * c.sh.heads * q + 2 * c.sh.kv_heads * kv)


def ring_step_op(c: Ctx, cp: int, i: int, phase: str, me: int = 0) -> Op:
    """Attention step i of CP rank `me` (c.s = seq / cp): one fused call (`ring_calls`), 2 mb heads s^2 d
    FLOPs forward at every step (two chunk x chunk blocks' worth: the causal s x s, or s x s/2 in full),
    twice that backward; timed at the call's own rate (tracegen.ops.cp_attention_seconds)."""
    q, kv, causal = ring_calls(c.s, i, me)
    mult = 2 if phase == "bwd" else 1
    return Op(
        f"attn_core_cp{i}",
        phase,
        mult * call_flops(c, q, kv, causal),
        mult * call_bytes(c, q, kv),
        (c.mb, c.sh.heads, c.sh.kv_heads, c.s, c.m.head_dim, cp),
        True,
        calls=(((q, kv, causal),),),
        **_kernel(c),
    )


def _kernel(c: Ctx) -> dict[str, object]:
    """The fused attention kernel that times a CP attention op, as the layer's own `attn_core` (tracegen.ops)
    names it."""
    return {"kernel": c.fw.hopper_attention or "fa2", "dropout": c.fw.attention_dropout > 0}


def gathered_calls(s: int, cp: int, rank: int) -> tuple[tuple[int, int, int], ...]:
    """The fused attention calls of CP rank `rank` in the all-gather form (s = seq / cp local tokens, chunk
    s / 2): Transformer Engine's AttnFuncWithCPAndKVAllGather (TE v1.12 7a7225c4 attention.py;
    d0067d0d context_parallel.py get_kv_seq_info_after_all_gather) runs one call per local chunk j (chunk
    ids rank and 2 cp - 1 - rank), its queries against the gathered keys up to the chunk's end, causal
    bottom-right: (chunk, (j + 1) chunk, causal), forward and backward alike."""
    ch = s // 2
    return tuple((ch, (j + 1) * ch, 1) for j in (rank, 2 * cp - 1 - rank))


def gathered_attention_op(c: Ctx, cp: int, phase: str) -> Op:
    """All-gather form: local queries (seq/cp) against the gathered sequence, causal and load-balanced, in
    two calls (`gathered_calls`): the causal total 2 mb heads seq^2 d over cp, i.e. 2 cp mb heads s_local^2
    d (backward twice). Every CP rank runs the same work, the calls' lengths differing by rank; the ranks
    meet at the next layer's K/V AllGather, so the op carries every rank's calls and takes the slowest's
    (one program for all CP ranks, as the fold of tracegen.compact assumes)."""
    mult = 2 if phase == "bwd" else 1
    mine = gathered_calls(c.s, cp, 0)
    flops = sum(call_flops(c, q, kv, causal) for q, kv, causal in mine)
    byt = sum(call_bytes(c, q, kv) for q, kv, _ in mine)
    shape = (c.mb, c.sh.heads, c.sh.kv_heads, c.s * cp, c.m.head_dim, cp)
    calls = tuple(gathered_calls(c.s, cp, r) for r in range(cp))
    return Op("attn_core", phase, mult * flops, mult * byt, shape, True, kernels=2, calls=calls, **_kernel(c))  # type: ignore[arg-type]


def cp_attention(c: Ctx, cp: int, comm: str, phase: str, me: int = 0) -> list[Step | CpStep]:
    """The attention core of one layer under context parallelism on CP rank `me` (c: the rank's context,
    s = seq / cp)."""
    kv = kv_bytes(c)
    if comm == "all_gather":
        if phase == "fwd":
            return [CpComm("cp_kv_allgather", "all_gather", kv), gathered_attention_op(c, cp, "fwd")]
        return [
            gathered_attention_op(c, cp, "bwd"),
            CpComm("cp_dkv_reducescatter", "reduce_scatter", kv * cp),
        ]
    out: list[Step | CpStep] = []
    for i in range(cp):
        if i:
            out.append(RingWait())
            if phase == "bwd":
                out.append(RingWait())  # the K/V gradient accumulated so far arrives with the block
        if i < cp - 1:
            out.append(RingXfer("kv", i, kv))
        out.append(ring_step_op(c, cp, i, phase, me))
        if phase == "bwd":
            out.append(RingXfer("dkv", i, kv))
    if phase == "bwd":
        out.append(RingWait())  # the rank's own K/V gradient is back before the QKV backward
    return out


def with_cp(steps: list, c: Ctx, cp: int, comm: str, phase: str, me: int = 0) -> list:
    """A layer's steps on CP rank `me` with its fused attention core replaced by the context-parallel form."""
    at = next(i for i, s in enumerate(steps) if isinstance(s, Op) and s.op == "attn_core")
    return [*steps[:at], *cp_attention(c, cp, comm, phase, me), *steps[at + 1 :]]


def local_ctx(c: Ctx, cp: int) -> Ctx:
    """The context of one CP rank: seq / cp tokens of each sequence."""
    return replace(c, s=c.s // cp)


def cp_plan_error(dep: object) -> str:
    """What this generator cannot do with a deployment's context parallelism ("" when it can)."""
    from xsim.tracegen.spec import chunk_ranges, replicas

    groups = list(dep.device_groups)  # type: ignore[attr-defined]
    cps = sorted({max(1, dg.cp) for dg in groups})
    cp = cps[-1]
    if cp == 1:
        return ""
    if len(cps) > 1:
        return f"device groups give different cp ({', '.join(map(str, cps))}): one CP degree per deployment"
    seq = int(dep.seq_len)  # type: ignore[attr-defined]
    if seq % (2 * cp):
        return f"cp {cp} needs seq_len {seq} to split into 2 x cp = {2 * cp} equal chunks (causal load balancing)"
    reps = list(replicas(dep).values())  # type: ignore[arg-type]
    if len(reps) % cp:
        return f"cp {cp} does not divide the {len(reps)} replicas (each data replica is cp of them)"
    if getattr(dep, "attention", "flash") == "unfused":
        return "context parallelism needs attention: flash (it splits the fused attention core)"
    if getattr(dep, "recompute", "none") in ("selective", "selective-op"):
        return f"context parallelism with recompute: {dep.recompute} is not supported yet"
    layout = [(chunk_ranges(d), d.tp) for d in reps[0]]
    if any([(chunk_ranges(d), d.tp) for d in r] != layout for r in reps[1:]):
        return "context parallelism with replicas cut differently (heterogeneous plans) is not supported yet"
    return ""
