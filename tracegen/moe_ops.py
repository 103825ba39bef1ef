"""The ops of a mixture-of-experts layer under expert parallelism, and what a rank holds of its experts.

Megatron-Core's MoELayer with the all-to-all token dispatcher (megatron/core/transformer/moe/moe_layer.py,
token_dispatcher.py MoEAlltoAllTokenDispatcher, --moe-grouped-gemm), forward on one rank of an EP group of
`ep` ranks, each holding E/ep consecutive experts (expert e on EP rank e div E/ep):

  router (GEMM T x hidden x E) -> top-k softmax -> permute (gather the kept token copies by expert)
  -> all-to-all dispatch (to EP rank q: the copies routed to q's experts) -> grouped GEMM up/gate over the
  local experts -> activation -> grouped GEMM down -> all-to-all combine (each copy back to its source)
  -> unpermute (probability-weighted sum of each token's k copies) [-> shared experts, added].

Backward runs it in reverse: shared experts, unpermute's gradient scatter, the combine's all-to-all
mirrored (sizes of the forward dispatch), the expert GEMMs (input and weight gradients, 2x), the
dispatch's all-to-all mirrored (sizes of the forward combine), permute's gradient, the router's.
Grouped GEMM FLOPs count the tokens each local expert really receives: 2 * R * K * N over the received
copies R, so a skewed routing loads the EP ranks of popular experts. The all-to-all is emitted as P2P
send/recv pairs per peer (uneven sizes: NCCL's all-to-all-v is a set of send/recv pairs in one group call).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from xsim.tracegen.models import ModelArch
from xsim.tracegen.moe import MoeSpec, capacity, expert_mlp_params, expert_tokens
from xsim.tracegen.ops import (
    ELEM_FLOPS,
    Comm,
    Ctx,
    Op,
    Shard,
    Step,
    _elem,
    _fp8_cast,
    _gemm,
    _kern,
    layer_steps,
    linear_params,
    main_grad_hook_adds,
    rank_params,
    shard_of,
)

# P2P tags of the all-to-alls: far above the pipeline's 2 * (chunk * M + mb) + direction tags.
EP_TAG_BASE = 1 << 30
# Which all-to-all of a layer and micro-batch (tag = base + A2A_SLOTS * (layer * M + mb) + index).
A2A_INDEX = {
    ("dispatch", "fwd"): 0,
    ("combine", "fwd"): 1,
    ("combine", "bwd"): 2,
    ("dispatch", "bwd"): 3,
    ("dispatch", "recompute"): 4,
    ("combine", "recompute"): 5,
    ("dispatch_probs", "fwd"): 6,
    ("dispatch_probs", "bwd"): 7,
    ("dispatch_probs", "recompute"): 8,
}
A2A_SLOTS = 16
# The dense MLP ops a MoE layer replaces, with Transformer Engine's FP8 casts of their operands (the dense
# linears' own: the expert GEMMs' GroupedLinear casts its inputs and output gradients itself, TE
# grouped_linear.py `fused_multi_quantize`, the `moe_expert_*_fp8_cast` ops of moe_block).
DENSE_MLP_OPS = frozenset(
    {"mlp_up_gate", "mlp_act", "mlp_down", "mlp_up_bias", "mlp_up_gate_fp8_cast", "mlp_down_fp8_cast"}
)
# Router scores are softmaxed in FP32 in Megatron-Core (moe_utils: topk_softmax_with_capacity casts
# logits to float32), one 4-byte probability per (token, expert).
ROUTER_PROB_BYTES = 4
# Transformer Engine's GroupedLinear quantizes its input (forward) and its output gradient (backward) per
# expert: TE v2.6 / v2.7 module/grouped_linear.py `tex.split_quantize(inp_view, m_splits, quantizers)`,
# whose csrc/extensions/cast.cpp multi_tensor_quantize_impl launches one fused nvte_multi_cast_transpose for
# all experts only under delayed scaling ("Currently only have fused kernel for FP8 delayed scaling"; the
# existing single `_fp8_cast` op) and otherwise each split's own quantizer->quantize. Under current scaling
# that is Float8CurrentScalingQuantizer::quantize_impl (csrc/quantizer.cpp): nvte_compute_amax (reads the
# expert's rows), nvte_compute_scale_from_amax (reads the FP32 amax, writes scale and scale_inv) and
# nvte_quantize_v2 (reads the rows, writes the FP8 copy and its transpose): three kernels per local expert,
# each at least a launch floor (tracegen.gemm.LAUNCH_FLOOR_S) however few rows the expert has.
CS_SCALE_BYTES = 12  # the scale kernel per expert: amax read, scale and scale_inv written, FP32 each
# Transformer Engine's fused permute (Megatron-Core's moe_permute_fusion: moe_utils.permute ->
# fused_permute_with_probs -> TE v2.7 permutation.py _moe_permute_mask_map.forward) first builds its row-id
# map from the [T, E] routing mask in three Triton kernels (triton/permutation.py make_row_id_map), then
# permutes (the `moe_permute` op). Bytes per (token, expert) element: pass 1 reads the 1-byte mask and
# writes an int32 block cumsum (1 + 4), pass 2 reads and rewrites it (4 + 4), pass 3 reads it (4) and
# writes, per token, its k destination rows, k expert indices and the count (2k + 1 int32s).
ROW_ID_MAP_KERNELS = 3
ROW_ID_MAP_BYTES_PER_ELEM = 1 + 4 + 4 + 4 + 4
# Megatron-Core's apply_router_token_dropping with a capacity factor (moe_utils.py at core_v0.14.0, drop
# policy "probs"): torch.topk of capacity along the tokens of the [T, E] probabilities, zeros_like,
# scatter of ones at the kept indices, .bool(), then (padded to capacity) probs * mask, or (dropping only)
# logical_and with the routing map and probs * mask: 5 or 6 kernels forward; backward the product's
# gradient, grad * mask, one kernel. Bytes per (token, expert) element forward: topk reads 4, zeros_like
# writes 4, .bool() reads 4 and writes 1, the product reads 4 + 1 and writes 4 (22; logical_and reads 1 + 1
# and writes 1 more); per kept copy (capacity x E): topk writes its value and int64 index (4 + 8), scatter
# reads the index and writes 4 (24). Backward: reads the gradient and the mask, writes the gradient (9).
CAPACITY_MASK_KERNELS = {True: 5, False: 6}  # by pad_to_capacity
CAPACITY_MASK_BYTES = {True: 22, False: 25}
CAPACITY_KEPT_BYTES = 24
CAPACITY_MASK_BWD_BYTES = 9
# Megatron-Core's load-balancing loss (router.py _apply_aux_loss at core_v0.14.0: moe_router_load_balancing_type
# "aux_loss" with moe_aux_loss_coeff > 0; MoeSpec.aux_loss_coeff) under moe_router_fusion (TE v2.7 router.py
# and csrc/extensions/router.cpp), per micro-batch on the [T, E] router logits (router dtype = the input's,
# `dtype_bytes`, without moe_router_dtype). Forward: fused_score_for_moe_aux_loss_fwd (reads the logits,
# writes the scores, the 1-byte top-k mask and an intermediate copy), routing_map.sum(dim=0) (reads the
# mask), fused_moe_aux_loss_fwd (reads the scores), aux_loss / coeff and the tracker's `values[layer - 1] +=`
# (moe_utils.save_to_aux_losses_tracker; scalars): 5 kernels, 4 dtype + 2 bytes per element. Backward:
# MoEAuxLossAutoScaler's ones_like and scale (scalars), fused_moe_aux_loss_bwd (writes the scores' gradient),
# fused_score_for_moe_aux_loss_bwd (reads it and the intermediate, writes the logits' gradient) and autograd's
# sum of the logits' two gradients (the top-k's and this one: reads 2, writes 1): 5 kernels, 7 dtype bytes.
AUX_LOSS = {"fwd": (5, 4, 2), "bwd": (5, 7, 0)}  # kernels, dtype bytes, other bytes per (token, expert)


# Megatron-Core's --moe-token-dispatcher-type (transformer_config.py moe_token_dispatcher_type): "alltoall"
# (MoEAlltoAllTokenDispatcher, the default here), "allgather" (MoEAllGatherTokenDispatcher,
# `allgather_steps`) and "flex" (MoEFlexTokenDispatcher with --moe-enable-deepep: DeepEP's fused kernels,
# `deepep_legs`).
MOE_DISPATCHERS = ("alltoall", "allgather", "flex")
# DeepEP's internode dispatch sends, with each token, its top-k expert indices (int32) and FP32 weights
# (deepseek-ai/DeepEP csrc/kernels/internode.cu get_num_bytes_per_token: hidden + SourceMeta + scales +
# num_topk_idx * sizeof(int) + num_topk_weights * sizeof(float), aligned to 16 B; the 8-byte SourceMeta and
# the alignment are left out here). The combine and the backward passes carry the hidden states alone.
DEEPEP_TOPK_BYTES = 4 + 4


@dataclass(frozen=True)
class AllToAll:
    """One all-to-all of a MoE layer as seen by one EP rank: bytes it sends to and receives from each peer
    (EP indices; the rank itself is left out: its own copies stay in memory)."""

    op: str  # "moe_dispatch" | "moe_combine" | "moe_dispatch_probs"
    which: str  # "dispatch" | "combine" | "dispatch_probs" (the forward all-to-all whose bytes these are)
    sends: tuple[tuple[int, int], ...]  # (peer EP index, bytes)
    recvs: tuple[tuple[int, int], ...]
    # Bytes per peer when every EP rank exchanges the same with every peer (a balanced routing): the
    # all-to-all is then one ALL_TO_ALL collective of ep x even bytes over the EP group, its transfers
    # concurrent as NCCL runs them; 0: uneven, emitted as P2P pairs.
    even: int = 0
    # "" = the pass it runs in; "fwd" = a forward all-to-all replayed in a backward pass (the `moe` recompute
    # module's, tracegen.ops.with_recompute): tagged, and its P2P tags taken, as a recompute.
    phase: str = ""
    # The group its peers index: "" the EP group; DeepEP's legs (flex dispatcher, `deepep_legs`): "node" the
    # EP ranks on this rank's node (NVLink), "rail" the EP ranks at this rank's place on every node (RDMA).
    # The legs of one dispatch or combine are issued together and run concurrently (DeepEP pipelines them).
    group: str = ""
    # "all_to_all", or a plain collective over the group (the allgather dispatcher's, `allgather_steps`):
    # "all_gather" | "reduce_scatter", of Chakra size `size` (AllGather: the per-rank input; ReduceScatter:
    # the whole buffer).
    kind: str = "all_to_all"
    size: int = 0


MoeStep = Step | AllToAll


def expert_tp(sh: Shard) -> int:
    """The expert tensor-parallel degree of a rank's MoE layers: 1 (whole experts) or its TP degree."""
    return sh.etp or sh.tp


def group_shard(m: ModelArch, dg: object, local: int) -> Shard:
    """The shard of TP rank `local` of device group `dg`, with the group's expert TP degree."""
    return replace(shard_of(m, dg.tp, local), etp=dg.etp)  # type: ignore[attr-defined]


def local_experts(moe: MoeSpec, ep: int, index: int) -> range:
    """The experts EP rank `index` holds (E/ep consecutive ones)."""
    n = moe.experts // ep
    return range(index * n, (index + 1) * n)


def a2a_bytes(
    loads: list[tuple[int, ...]], moe: MoeSpec, ep: int, src: int, dst: int, hidden: int, b: int
) -> int:
    """Bytes source `src` dispatches to EP rank `dst`: its token copies routed to dst's experts, hidden x b each."""
    return sum(loads[src][e] for e in local_experts(moe, ep, dst)) * hidden * b


def even_bytes(loads: list[tuple[int, ...]], moe: MoeSpec, ep: int, hidden: int, b: int) -> int:
    """Bytes every source sends every other EP rank when they are all the same (0 otherwise): every
    source routes the same tokens per expert and each EP rank's experts get the same share of them."""
    if ep < 2 or any(row != loads[0] for row in loads):
        return 0
    per = {sum(loads[0][e] for e in local_experts(moe, ep, q)) for q in range(ep)}
    return per.pop() * hidden * b if len(per) == 1 else 0


def moe_loads(moe: MoeSpec, tokens: int, layer: int, sources: int) -> list[tuple[int, ...]]:
    """Tokens per expert routed by each source's micro-batch slice at `layer`. A source is EP rank q's TP
    rank j (index q * tp + j): under TP with sequence parallelism each TP rank routes its own 1/tp of the
    tokens (Megatron-Core's MoE takes the sequence-parallel input)."""
    return [expert_tokens(moe, tokens, layer, src) for src in range(sources)]


def hit_tokens(row: tuple[int, ...], experts: Iterable[int], tokens: int) -> int:
    """Tokens of a source that pick at least one of `experts`. The routing gives copies per expert, not which
    tokens share experts: each token is taken to pick expert e with probability load_e / T, independently
    across experts (tokens x (1 - prod(1 - load_e / T)), rounded half up)."""
    if tokens <= 0:
        return 0
    miss = 1.0
    for e in experts:
        miss *= 1.0 - min(1.0, row[e] / tokens)
    return int(tokens * (1.0 - miss) + 0.5)


def _same(values: list[int]) -> int:
    """The common value of `values` when they are all alike (0 otherwise or when empty)."""
    return values[0] if values and all(v == values[0] for v in values) else 0


Leg = tuple[str, tuple[tuple[int, int], ...], tuple[tuple[int, int], ...], int]


def deepep_legs(
    loads: list[tuple[int, ...]], moe: MoeSpec, ep: int, nodes: tuple[int, ...], me: int, tokens: int
) -> tuple[list[Leg], int]:
    """DeepEP's normal dispatch as seen by EP rank `me`, in tokens: its legs (group, sends, recvs, tokens per
    peer when every rank's are alike) and the tokens it receives (one row per token and destination rank,
    its own included).

    deepseek-ai/DeepEP (docs/legacy.md and csrc/kernels/intranode.cu, internode.cu at 0297fc80): a token goes
    once to every rank holding one of its experts, not once per expert as Megatron-Core's all-to-all sends
    it. Inside one node (intranode kernels) that is one NVLink leg. Across nodes (internode kernels) a token
    crosses RDMA once per destination node, to the rank at the sender's place on that node (the "rail"),
    which forwards it over NVLink to the ranks of that node that need it (the sender's own node: the sender
    itself forwards); the two legs are pipelined chunk by chunk. `nodes`: the node of each EP index."""
    ex = [local_experts(moe, ep, q) for q in range(ep)]
    gpu = [[hit_tokens(loads[s], ex[q], tokens) for q in range(ep)] for s in range(ep)]
    received = sum(gpu[s][me] for s in range(ep))
    order = sorted(set(nodes))
    on = {n: [q for q in range(ep) if nodes[q] == n] for n in order}  # EP indices per node, in EP order
    place = {q: on[nodes[q]].index(q) for q in range(ep)}
    if len(order) == 1:
        sends = tuple((q, gpu[me][q]) for q in range(ep) if q != me)
        recvs = tuple((q, gpu[q][me]) for q in range(ep) if q != me)
        return [
            ("", sends, recvs, _same([gpu[x][q] for x in range(ep) for q in range(ep) if q != x]))
        ], received
    ntok = {
        (x, n): hit_tokens(loads[x], [e for q in on[n] for e in ex[q]], tokens)
        for x in range(ep)
        for n in order
    }
    a, i = nodes[me], place[me]
    rail = (
        "rail",
        tuple((k, ntok[me, n]) for k, n in enumerate(order) if n != a),
        tuple((k, ntok[on[n][i], a]) for k, n in enumerate(order) if n != a),
        _same([ntok[x, n] for x in range(ep) for n in order if n != nodes[x]]),
    )

    def fwd(f: int, q: int) -> int:  # tokens forwarder f passes to q on its node: from its rail, bound for q
        return sum(gpu[on[n][place[f]]][q] for n in order)

    mine = on[a]
    node = (
        "node",
        tuple((j, fwd(me, q)) for j, q in enumerate(mine) if q != me),
        tuple((j, fwd(q, me)) for j, q in enumerate(mine) if q != me),
        _same([fwd(f, q) for f in range(ep) for q in on[nodes[f]] if q != f]),
    )
    return [rail, node], received


def moe_block(
    c: Ctx,
    moe: MoeSpec,
    layer: int,
    ep: int,
    me: int,
    phase: str,
    local: int = 0,
    nodes: tuple[int, ...] | None = None,
    allgather: bool = False,
) -> list[MoeStep]:
    """The MoE MLP of `layer` on TP rank `local` of EP rank `me`, in execution order.

    tp 1: as the module docstring says. tp > 1 (expert TP = TP, sequence parallelism on): each TP rank
    routes its T/tp tokens and exchanges them with the same TP rank of its EP peers; the copies the TP
    group's ranks received are all-gathered over TP (AllGather-V, emitted at the largest rank's share so all
    ranks agree) before the grouped GEMMs, which run every gathered copy through 1/tp of each expert's FFN,
    and reduce-scattered back after them (Megatron-Core's MoEAlltoAllTokenDispatcher with tp_size > 1).
    Shared experts are a TP-split MLP with their own sequence-parallel AllGather and ReduceScatter.

    etp 1 under tp > 1 (Megatron-Core's expert_tensor_parallel_size 1): the expert layer has no TP group;
    each TP rank is an EP rank of its own (the EP group spans DP x TP, tracegen.workload.ep_groups), routes
    its T/tp sequence-parallel tokens, exchanges them with its EP peers and runs whole experts: no TP
    gather or scatter around the grouped GEMMs. `tp` below is the expert TP degree.

    `nodes` (the node of each EP index) selects Megatron-Core's flex dispatcher with DeepEP (`flex_steps`),
    `allgather` its all-gather dispatcher (`allgather_steps`).
    """
    m, b, t = c.m, c.b, c.tokens
    tp = expert_tp(c.sh)
    local = local % tp  # the rank's place in its expert TP group (0 with whole experts)
    tl = c.norm_tokens  # tokens this TP rank routes (T / tp under sequence parallelism)
    h, e = m.hidden, moe.experts
    loads = moe_loads(moe, tl, layer, ep * tp)
    src = me * tp + local
    kept = sum(loads[src])  # this rank's token copies that survive the capacity cut
    got = [
        sum(loads[q * tp + j][x] for q in range(ep) for x in local_experts(moe, ep, me)) for j in range(tp)
    ]
    received = sum(got)  # copies every TP rank of this EP rank runs (all of them after the TP gather)
    n_local = e // ep
    f = moe.expert_ffn
    fl = f // tp
    up = (2 if m.gated else 1) * fl
    peers = [q for q in range(ep) if q != me]
    out_b = tuple((q, a2a_bytes(loads, moe, ep, src, q, h, b)) for q in peers)  # me -> q (dispatch)
    in_b = tuple((q, a2a_bytes(loads, moe, ep, q * tp + local, me, h, b)) for q in peers)  # q -> me
    nz = lambda pairs: tuple(p for p in pairs if p[1])  # noqa: E731 - a peer with no copies gets no message
    even = even_bytes(loads, moe, ep, h, b)
    # The routing probabilities' own all-to-all (MoEAlltoAllTokenDispatcher.token_dispatch at core_v0.14.0:
    # `global_probs = all_to_all(self.ep_group, permuted_probs, ...)` right after the tokens', the same
    # splits; its gradient goes back the same way in backward): one FP32 probability per copy.
    pb = ROUTER_PROB_BYTES
    out_p = tuple((q, a2a_bytes(loads, moe, ep, src, q, 1, pb)) for q in peers)
    in_p = tuple((q, a2a_bytes(loads, moe, ep, q * tp + local, me, 1, pb)) for q in peers)
    probs_fwd = AllToAll(
        "moe_dispatch_probs", "dispatch_probs", nz(out_p), nz(in_p), even_bytes(loads, moe, ep, 1, pb)
    )
    probs_bwd = replace(probs_fwd, sends=probs_fwd.recvs, recvs=probs_fwd.sends)
    act_f = ELEM_FLOPS[m.activation]
    fs = moe.shared_width // c.sh.tp  # shared experts: split over the attention's TP group
    s_up = (2 if m.gated else 1) * fs
    gather = [Comm("moe_tp_gather", "all_gather", max(got) * h * b)] if tp > 1 else []
    scatter = [Comm("moe_tp_scatter", "reduce_scatter", tp * max(got) * h * b)] if tp > 1 else []
    if phase == "bwd":  # the gather's gradient is a reduce-scatter and the scatter's a gather
        gather, scatter = (
            [Comm("moe_tp_gather", "reduce_scatter", tp * max(got) * h * b)] if tp > 1 else [],
            [Comm("moe_tp_scatter", "all_gather", max(got) * h * b)] if tp > 1 else [],
        )

    fp8 = c.fp8

    def grouped(op: str, rows: int, kk: int, nn: int) -> Op:
        # One grouped GEMM over the local experts: 2 R K N FLOPs for R received copies; bytes: inputs, the
        # local experts' weights, outputs (backward: input and weight gradients, twice). Under FP8 the
        # expert linears are Transformer Engine GroupedLinear modules: both operands in FP8 (1 byte), the
        # output in `dtype_bytes`, at the FP8 tensor rate (as _gemm does for the dense linears).
        mult = 2 if phase == "bwd" else 1
        flops = 2 * rows * kk * nn
        ab = 1 if fp8 else b
        byt = ab * (rows * kk + n_local * kk * nn) + b * rows * nn
        prec = "fp8" if fp8 else "bf16"
        return Op(op, phase, mult * flops, mult * byt, (n_local, rows, kk, nn), True, prec, mult)

    def cast(op: str, elems: int) -> list[Op]:
        return grouped_quantize(c, op, phase, elems, n_local)

    def act(op: str, rows: int, width: int) -> Op:
        if m.gated:
            return _elem(op, phase, rows * width, act_f, *((2, 1) if phase == "fwd" else (3, 2)), b)
        return _elem(op, phase, rows * width, act_f, *((1, 1) if phase == "fwd" else (2, 1)), b)

    # Permutation 2 (Megatron-Core's sort_chunks_by_idxs, with more than one local expert): the received
    # copies arrive grouped by source rank and are re-sorted by local expert before the grouped GEMMs, and
    # back by source after them (combine_preprocess); one read and one write of every copy and its FP32
    # probability. Backward runs the inverse sorts on the gradients (same bytes).
    sort_b = 2 * received * (h * b + ROUTER_PROB_BYTES)
    sort = [Op("moe_sort_chunks", phase, 0, sort_b, (received, h), False)] if n_local > 1 else []
    unsort = (
        [Op("moe_unsort_chunks", phase, 0, 2 * received * h * b, (received, h), False)] if n_local > 1 else []
    )

    shared: list[MoeStep] = []
    if fs:
        stp = c.sh.tp
        sp_in = [Comm("moe_shared_tp_in", "all_gather", tl * h * b)] if stp > 1 else []
        sp_out = [Comm("moe_shared_tp_out", "reduce_scatter", t * h * b)] if stp > 1 else []
        if phase == "bwd":
            sp_in = [Comm("moe_shared_tp_in", "reduce_scatter", t * h * b)] if stp > 1 else []
            sp_out = [Comm("moe_shared_tp_out", "all_gather", tl * h * b)] if stp > 1 else []
        if phase == "fwd":
            shared = [
                *sp_in,
                *cast("moe_shared_up_gate", t * h),
                _gemm("moe_shared_up_gate", phase, t, h, s_up, b, fp8),
                act("moe_shared_act", t, fs),
                *cast("moe_shared_down", t * fs),
                _gemm("moe_shared_down", phase, t, fs, h, b, fp8),
                *sp_out,
            ]
        else:  # run reversed below: the down projection's gradient first, each GEMM after its cast
            shared = [
                *sp_in,
                _gemm("moe_shared_up_gate", phase, t, h, s_up, b, fp8),
                *cast("moe_shared_up_gate", t * s_up),
                act("moe_shared_act", t, fs),
                _gemm("moe_shared_down", phase, t, fs, h, b, fp8),
                *cast("moe_shared_down", t * h),
                *sp_out,
            ]
    cap_fwd, cap_bwd = capacity_mask_ops(moe, tl)
    aux = aux_loss_ops(moe, phase, tl, b)

    def gemms_of(ph: str) -> list[MoeStep]:
        # the grouped expert MLP over the received copies (forward order; backward: the reverse)
        if ph == "fwd":
            return [
                *cast("moe_expert_up_gate", received * h),
                grouped("moe_expert_up_gate", received, h, up),
                act("moe_expert_act", received, fl),
                *cast("moe_expert_down", received * fl),
                grouped("moe_expert_down", received, fl, h),
            ]
        return [
            *cast("moe_expert_down", received * h),
            grouped("moe_expert_down", received, fl, h),
            act("moe_expert_act", received, fl),
            *cast("moe_expert_up_gate", received * up),
            grouped("moe_expert_up_gate", received, h, up),
        ]

    if allgather:
        return allgather_steps(c, moe, phase, ep, received, gemms_of(phase), cap_fwd, cap_bwd, aux, shared)
    if nodes is not None:
        legs, rows = deepep_legs(loads, moe, ep, nodes, me, tl)
        per = h * b + (DEEPEP_TOPK_BYTES * moe.top_k if phase == "fwd" else 0)  # bytes of a dispatched token

        def a2a(op: str, which: str, back: bool, width: int) -> list[MoeStep]:
            # back: the combine's direction (the recvs of the dispatch are sent)
            out = []
            for grp, snd, rcv, even in legs:
                sz = lambda pairs: nz(tuple((q, n * width) for q, n in pairs))  # noqa: B023, E731
                pair = (sz(rcv), sz(snd)) if back else (sz(snd), sz(rcv))
                out.append(AllToAll(op, which, *pair, even * width, group=grp))
            return out

        return flex_steps(
            c, moe, phase, ep, rows, received, a2a, gemms_of(phase), cap_fwd, cap_bwd, aux, shared, per
        )
    if phase == "fwd":
        return [
            *router_head(c, moe, cap_fwd, aux),
            permute_map_op(tl, e, moe.top_k),
            Op("moe_permute", "fwd", 0, (tl + kept) * h * b, (kept, h), False),
            AllToAll("moe_dispatch", "dispatch", nz(out_b), nz(in_b), even),
            probs_fwd,
            *gather,
            *sort,
            *cast("moe_expert_up_gate", received * h),
            grouped("moe_expert_up_gate", received, h, up),
            act("moe_expert_act", received, fl),
            *cast("moe_expert_down", received * fl),
            grouped("moe_expert_down", received, fl, h),
            *unsort,
            *scatter,
            AllToAll("moe_combine", "combine", nz(in_b), nz(out_b), even),
            Op("moe_unpermute", "fwd", 2 * kept * h, (kept + tl) * h * b + kept * ROUTER_PROB_BYTES, (kept, h), False),
            *shared,
            *([_elem("moe_shared_add", "fwd", tl * h, ELEM_FLOPS["add"], 2, 1, b)] if fs else []),
        ]  # fmt: skip
    return [
        *shared[::-1],
        Op("moe_unpermute", "bwd", kept * h, (tl + kept) * h * b, (kept, h), False),
        AllToAll("moe_combine", "combine", nz(out_b), nz(in_b), even),  # gradients of the combined copies go back
        *scatter,
        *unsort,
        *cast("moe_expert_down", received * h),  # the output gradient, cast for both backward GEMMs
        grouped("moe_expert_down", received, fl, h),
        act("moe_expert_act", received, fl),
        *cast("moe_expert_up_gate", received * up),
        grouped("moe_expert_up_gate", received, h, up),
        *sort,
        *gather,
        AllToAll("moe_dispatch", "dispatch", nz(in_b), nz(out_b), even),  # input gradients to their sources
        probs_bwd,
        Op("moe_permute", "bwd", kept * h, (kept + tl) * h * b, (kept, h), False),
        *router_tail(c, moe, cap_bwd, aux),
    ]  # fmt: skip


def router_head(c: Ctx, moe: MoeSpec, cap_fwd: list[Op], aux: list[Op]) -> list[Op]:
    """The router's forward, the same under every dispatcher: the gating GEMM, top-k over the softmax of
    the scores, then the capacity mask and the load-balancing loss where they run."""
    tl, h, e, b = c.norm_tokens, c.m.hidden, moe.experts, c.b
    return [
        _gemm("moe_router", "fwd", tl, h, e, b),
        _kern("moe_router_topk", "fwd", tl * e, ELEM_FLOPS["softmax"], b + ROUTER_PROB_BYTES),
        *cap_fwd,
        *aux,
    ]


def router_tail(c: Ctx, moe: MoeSpec, cap_bwd: list[Op], aux: list[Op]) -> list[Op]:
    """The router's backward, the same under every dispatcher: the loss's and the capacity mask's
    gradients, top-k's, the gating GEMM's, and the DDP hook's main_grad add of the router weight (a plain
    parameter: router.py's RouterGatingLinearFunction returns its gradient), one kernel over hidden x E."""
    tl, h, e, b = c.norm_tokens, c.m.hidden, moe.experts, c.b
    return [
        *aux,
        *cap_bwd,
        _kern("moe_router_topk", "bwd", tl * e, 2 * ELEM_FLOPS["softmax"], 2 * b + ROUTER_PROB_BYTES),
        _gemm("moe_router", "bwd", tl, h, e, b),
        *main_grad_hook_adds(c, "moe_router_main_grad_add", 1, h * e),
    ]


def allgather_steps(
    c: Ctx,
    moe: MoeSpec,
    phase: str,
    ep: int,
    received: int,
    gemms: list[MoeStep],
    cap_fwd: list[Op],
    cap_bwd: list[Op],
    aux: list[Op],
    shared: list[MoeStep],
) -> list[MoeStep]:
    """The MoE MLP under Megatron-Core's MoEAllGatherTokenDispatcher (token_dispatcher.py at NVIDIA/Megatron-LM
    0014f137), over the EP group (its tp_ep group with whole experts): the routing map (bool), the
    probabilities (FP32) and the tokens are all-gathered (`moe_dispatch_map`, `moe_dispatch_probs`,
    `moe_dispatch`); the rank slices its experts' columns of the map and probabilities (`moe_local_map`:
    the slices' copies, the transposes and masked_select of the probabilities), permutes its experts'
    `received` copies out of the ep x T gathered tokens (the fused permute), runs the grouped GEMMs, and
    unpermute sums each token's local copies into an [ep x T, hidden] buffer, which is cast to FP32 and
    reduce-scattered back (`moe_combine`; the probabilities' dtype, `output_total.to(local_probs.dtype)`)
    and cast back. Backward: each gather's gradient is a reduce-scatter and the reduce-scatter's a gather
    (the routing map has none)."""
    m, b, tl, e = c.m, c.b, c.norm_tokens, moe.experts
    h, n_local, gt = m.hidden, moe.experts // ep, ep * tl  # gt: the gathered tokens
    fs = moe.shared_width // c.sh.tp
    pb = ROUTER_PROB_BYTES

    def coll(op: str, kind: str, size: int) -> AllToAll:
        return AllToAll(op, op.removeprefix("moe_"), (), (), 0, kind=kind, size=size)

    # the map and probabilities' columns of the local experts (two slice copies), their transposes, and
    # masked_select of the probabilities at the map (nonzero, then a gather of `received` values)
    local_b = gt * n_local * (1 + pb) * 2 * 2 + received * (8 + pb)
    local = Op("moe_local_map", phase, 0, local_b, (gt, n_local), False, kernels=6)
    if phase == "fwd":
        return [
            *router_head(c, moe, cap_fwd, aux),
            coll("moe_dispatch_map", "all_gather", tl * e),
            coll("moe_dispatch_probs", "all_gather", tl * e * pb),
            coll("moe_dispatch", "all_gather", tl * h * b),
            local,
            permute_map_op(gt, n_local, moe.top_k),
            Op("moe_permute", "fwd", 0, (gt + received) * h * b, (received, h), False),
            *gemms,
            Op("moe_unpermute", "fwd", received * h, (received + gt) * h * b, (received, h), False),
            _kern("moe_combine_cast", "fwd", gt * h, 0, b + pb),
            coll("moe_combine", "reduce_scatter", gt * h * pb),
            _kern("moe_combine_cast", "fwd", tl * h, 0, pb + b),
            *shared,
            *([_elem("moe_shared_add", "fwd", tl * h, ELEM_FLOPS["add"], 2, 1, b)] if fs else []),
        ]  # fmt: skip
    return [
        *shared[::-1],
        _kern("moe_combine_cast", "bwd", tl * h, 0, b + pb),
        coll("moe_combine", "all_gather", tl * h * pb),
        _kern("moe_combine_cast", "bwd", gt * h, 0, pb + b),
        Op("moe_unpermute", "bwd", 0, (gt + received) * h * b, (received, h), False),
        *gemms,
        Op("moe_permute", "bwd", received * h, (received + gt) * h * b, (received, h), False),
        coll("moe_dispatch", "reduce_scatter", gt * h * b),
        coll("moe_dispatch_probs", "reduce_scatter", gt * e * pb),
        *router_tail(c, moe, cap_bwd, aux),
    ]  # fmt: skip


def flex_steps(
    c: Ctx,
    moe: MoeSpec,
    phase: str,
    ep: int,
    rows: int,
    received: int,
    a2a: Callable[[str, str, bool, int], list[MoeStep]],
    gemms: list[MoeStep],
    cap_fwd: list[Op],
    cap_bwd: list[Op],
    aux: list[Op],
    shared: list[MoeStep],
    per: int,
) -> list[MoeStep]:
    """The MoE MLP under Megatron-Core's MoEFlexTokenDispatcher with DeepEP (token_dispatcher.py and
    fused_a2a.py at NVIDIA/Megatron-LM 0014f137, core_r0.13/0.14): no permute before the exchange (DeepEP
    takes the tokens as they are); setup_metadata's torch.topk turns the routing into k indices and FP32
    weights per token (`moe_dispatch_indices`), DeepEP's get_dispatch_layout counts tokens per rank and node
    (`moe_dispatch_layout`), fused_dispatch moves `rows` tokens (one per token and rank, `deepep_legs`; the
    weights ride along, so no probabilities' all-to-all), the receiver turns the indices into a multihot map
    (`moe_indices_to_multihot`, fused_indices_to_multihot) and permutes the rows into `received` copies by
    local expert (the fused permute: `moe_permute_map`, `moe_permute`; no sort_chunks), the grouped GEMMs
    run, unpermute sums each row's copies weighted by its probabilities (`moe_unpermute`, combine_preprocess)
    and fused_combine sends one row per token back, DeepEP adding the ranks' rows. Backward mirrors it: the
    combine's gradient goes out as a dispatch, the dispatch's as a combine."""
    m, b, tl, e, k = c.m, c.b, c.norm_tokens, moe.experts, moe.top_k
    h, n_local = m.hidden, moe.experts // ep
    fs = moe.shared_width // c.sh.tp
    bytes_hb = h * b
    multihot = rows * k * (8 + ROUTER_PROB_BYTES) + rows * n_local * (1 + ROUTER_PROB_BYTES)
    if phase == "fwd":
        return [
            *router_head(c, moe, cap_fwd, aux),
            # torch.topk over the [T, E] FP32 probabilities: k values (FP32) and indices (int64) per token
            Op("moe_dispatch_indices", "fwd", 0, tl * e * ROUTER_PROB_BYTES + tl * k * 12, (tl, e), False),
            # get_dispatch_layout: reads the int64 indices, writes is_token_in_rank [T, ep] (bool) and counts
            Op("moe_dispatch_layout", "fwd", 0, tl * k * 8 + tl * ep + 4 * (e + 2 * ep), (tl, ep), False),
            *a2a("moe_dispatch", "dispatch", False, per),
            Op("moe_indices_to_multihot", "fwd", 0, multihot, (rows, n_local), False),
            permute_map_op(rows, n_local, k),
            Op("moe_permute", "fwd", 0, (rows + received) * bytes_hb + received * ROUTER_PROB_BYTES, (received, h), False),
            *gemms,
            Op("moe_unpermute", "fwd", 2 * received * h, (received + rows) * bytes_hb + received * ROUTER_PROB_BYTES, (received, h), False),
            *a2a("moe_combine", "combine", True, bytes_hb),
            *shared,
            *([_elem("moe_shared_add", "fwd", tl * h, ELEM_FLOPS["add"], 2, 1, b)] if fs else []),
        ]  # fmt: skip
    return [
        *shared[::-1],
        Op("moe_unpermute", "bwd", received * h, (rows + received) * bytes_hb, (received, h), False),
        *a2a("moe_combine", "combine", False, per),  # the combined rows' gradients go out as a dispatch
        *gemms,
        Op("moe_permute", "bwd", received * h, (received + rows) * bytes_hb, (received, h), False),
        # IndicesToMultihot's backward: the multihot probabilities' gradient back to [rows, k]
        Op("moe_indices_to_multihot", "bwd", 0, rows * n_local * ROUTER_PROB_BYTES + rows * k * ROUTER_PROB_BYTES, (rows, n_local), False),
        *a2a("moe_dispatch", "dispatch", True, per),  # the rows' gradients back to their sources as a combine
        *router_tail(c, moe, cap_bwd, aux),
    ]  # fmt: skip


def grouped_quantize(c: Ctx, op: str, phase: str, elems: int, experts: int) -> list[Op]:
    """Transformer Engine GroupedLinear's FP8 quantize of `elems` elements split over `experts` local
    experts: delayed scaling one fused cast-transpose (ops._fp8_cast); current scaling per expert an amax,
    a scale and a cast-transpose kernel (CS_SCALE_BYTES: `{op}_fp8_amax`, `{op}_fp8_scale`, `{op}_fp8_cast`)."""
    if not c.fp8_current:
        return _fp8_cast(c, op, phase, elems)
    n = max(1, experts)
    return [
        _kern(f"{op}_fp8_amax", phase, elems, 0, c.b, n),
        Op(f"{op}_fp8_scale", phase, 0, CS_SCALE_BYTES * n, (n,), False, kernels=n),
        _kern(f"{op}_fp8_cast", phase, elems, 0, c.b + 2, n),
    ]


def permute_map_op(tokens: int, experts: int, top_k: int) -> Op:
    """The fused permute's row-id map (ROW_ID_MAP_KERNELS Triton kernels) over a [tokens, experts] mask."""
    nbytes = tokens * experts * ROW_ID_MAP_BYTES_PER_ELEM + tokens * (2 * top_k + 1) * 4
    return Op("moe_permute_map", "fwd", 0, nbytes, (tokens, experts), False, kernels=ROW_ID_MAP_KERNELS)


def aux_loss_ops(moe: MoeSpec, phase: str, tokens: int, b: int) -> list[Op]:
    """The load-balancing loss's kernels in `phase` (AUX_LOSS; none without an aux_loss_coeff)."""
    if not moe.aux_loss_coeff:
        return []
    kernels, per_dtype, other = AUX_LOSS[phase]
    flops = ELEM_FLOPS["softmax"] * (2 if phase == "bwd" else 1)  # the scores' softmax, as moe_router_topk
    return [_kern("moe_aux_loss", phase, tokens * moe.experts, flops, per_dtype * b + other, kernels)]


def capacity_mask_ops(moe: MoeSpec, tokens: int) -> tuple[list[Op], list[Op]]:
    """(forward, backward) ops of the router's capacity mask (CAPACITY_MASK_*; none when dropless)."""
    if not moe.capacity_factor:
        return [], []
    pad, te, shape = moe.pad_to_capacity, tokens * moe.experts, (tokens, moe.experts)
    kept = min(capacity(moe, tokens), tokens) * moe.experts
    fwd_b = te * CAPACITY_MASK_BYTES[pad] + kept * CAPACITY_KEPT_BYTES
    fwd = Op("moe_capacity_mask", "fwd", te, fwd_b, shape, False, kernels=CAPACITY_MASK_KERNELS[pad])
    return [fwd], [Op("moe_capacity_mask", "bwd", te, te * CAPACITY_MASK_BWD_BYTES, shape, False)]


# The dense layer's sequence-parallel collectives around the MLP, replaced with the MoE block's own.
DENSE_MLP_COMMS = frozenset({"mlp_tp_in", "mlp_tp_out", "mlp_down_amax_allreduce"})


def moe_layer_steps(
    c: Ctx,
    moe: MoeSpec,
    layer: int,
    ep: int,
    me: int,
    phase: str,
    local: int = 0,
    nodes: tuple[int, ...] | None = None,
    allgather: bool = False,
) -> list[MoeStep]:
    """A whole MoE layer: the dense layer's steps with its MLP (GEMMs, activation and TP collectives)
    replaced by `moe_block` (`nodes`, `allgather`: the flex and allgather dispatchers, moe_block), placed where the MLP's first GEMM was."""
    dense = layer_steps(c, phase, dense_mlp=False)
    at = next(i for i, s in enumerate(dense) if isinstance(s, Op) and s.op in DENSE_MLP_OPS)

    def mlp(s: Step) -> bool:
        return (isinstance(s, Op) and s.op in DENSE_MLP_OPS) or (
            isinstance(s, Comm) and s.op in DENSE_MLP_COMMS
        )

    before = [s for s in dense[:at] if not mlp(s)]
    after = [s for s in dense[at:] if not mlp(s)]
    return [*before, *moe_block(c, moe, layer, ep, me, phase, local, nodes, allgather), *after]


def moe_dense_params(m: ModelArch, moe: MoeSpec, sh: Shard | None = None) -> int:
    """Parameters of one MoE layer a rank holds outside the routed experts: its attention (its TP shard),
    norms and router (whole on every TP rank), shared experts (1/tp of their FFN)."""
    from xsim.tracegen.mla import mla_rank_params

    if sh is None or sh.tp == 1:
        attn, tp = m.attention_params(), 1
    else:
        attn, tp = (mla_rank_params(m, m.mla, sh) if m.mla else _attention_rank_params(m, sh)), sh.tp
    shared = (
        expert_mlp_params(moe.shared_width // tp, m.hidden, m.activation, m.linear_bias)
        if moe.shared_width
        else 0
    )
    return attn + m.layer_norm_params + m.hidden * moe.experts + shared


def moe_expert_params(m: ModelArch, moe: MoeSpec, ep: int, tp: int = 1) -> int:
    """Parameters of the routed experts one rank holds in one MoE layer (E/ep experts, 1/tp of each FFN)."""
    return moe.experts // ep * expert_mlp_params(moe.expert_ffn // tp, m.hidden, m.activation, m.linear_bias)


def fp8_layer_split(m: ModelArch, sh: Shard, layer: int, ep: int) -> tuple[int, int]:
    """(dense, expert) weights of the FP8 linear modules one rank holds of `layer`, split as layer_split
    splits the parameters: a dense layer's four linears (ops.linear_params); a MoE layer's attention and
    shared-expert linears, and its routed experts' GroupedLinear weights (the router stays a BF16/FP32
    GEMM; the linears' biases stay BF16)."""
    if m.moe is None or not m.moe.is_moe(layer):
        return linear_params(m, sh, 1), 0
    shared = (
        expert_mlp_params(m.moe.shared_width // sh.tp, m.hidden, m.activation) if m.moe.shared_width else 0
    )
    plain = replace(m, linear_bias=False)
    return _attention_rank_params(plain, sh) + shared, moe_expert_params(plain, m.moe, ep, expert_tp(sh))


def fp8_linear_params_ep(m: ModelArch, sh: Shard, layers: list[int], ep: int) -> int:
    """Weights of the FP8 linear modules one rank holds for `layers` (Transformer Engine re-casts them once
    per iteration): both parts of fp8_layer_split."""
    return sum(sum(fp8_layer_split(m, sh, x, ep)) for x in layers)


def _attention_rank_params(m: ModelArch, sh: Shard) -> int:
    """The MHA/GQA attention weights `rank_params` counts for one layer of a TP rank."""
    d = m.head_dim
    qkv = (sh.heads + 2 * sh.kv_heads) * d
    return m.hidden * qkv + sh.heads * d * m.hidden + ((qkv + m.hidden) if m.linear_bias else 0)


def layer_split(m: ModelArch, sh: Shard, layer: int, ep: int) -> tuple[int, int]:
    """(dense, expert) parameters one rank holds of `layer`: the expert part syncs over the expert-DP group.
    MLA models count MLA's attention weights (tracegen.mla) in place of MHA's."""
    from xsim.tracegen.mla import mla_rank_params

    if m.moe is None or not m.moe.is_moe(layer):
        fix = mla_rank_params(m, m.mla, sh) - _attention_rank_params(m, sh) if m.mla is not None else 0
        return rank_params(m, sh, 1, False, False) + fix, 0
    return moe_dense_params(m, m.moe, sh), moe_expert_params(m, m.moe, ep, expert_tp(sh))


def rank_params_ep(
    m: ModelArch, sh: Shard, layers: list[int], ep: int, first: bool, last: bool
) -> tuple[int, int]:
    """(dense, expert) parameters a rank holds for `layers` plus the embedding / head on the end stages."""
    dense = expert = 0
    for x in layers:
        d, e = layer_split(m, sh, x, ep)
        dense, expert = dense + d, expert + e
    return dense + rank_params(m, sh, 0, first, last), expert


def _mla_error(dep: object, model: ModelArch) -> str:
    """What is not generated with MLA attention ("" when the plan is fine)."""
    from xsim.tracegen.spec import chunk_ranges, replicas

    what = ""
    if any(dg.cp > 1 for dg in dep.device_groups):  # type: ignore[attr-defined]
        what = "context parallelism"
    elif getattr(dep, "attention", "flash") == "unfused":
        what = "attention: unfused"
    elif getattr(dep, "precision", "") == "fp8":
        what = "precision fp8"
    elif getattr(dep, "sharding", "none") not in ("", "none", "fsdp", "zero3"):
        what = f"sharding {dep.sharding}"  # type: ignore[attr-defined]
    else:
        reps = list(replicas(dep).values())  # type: ignore[arg-type]
        layout = [(chunk_ranges(d), d.tp) for d in reps[0]]
        if any([(chunk_ranges(d), d.tp) for d in r] != layout for r in reps[1:]):
            what = "replicas cut differently (heterogeneous plans)"
    return f"model {model.name}: MLA attention with {what} is not supported yet" if what else ""


# Ranks a node holds where the cluster does not say (tracegen.spec.derive_cluster's NODE_SIZE, a DGX).
DEFAULT_NODE_GPUS = 8


def rank_node(cluster_json: str) -> Callable[[int], int]:
    """The node of each rank in a deployment's cluster description: a `system` preset's nodes
    (tracegen.contention.SYSTEM_LINKS), a `nodes` list's (consecutive counts or rank lists), else nodes of
    DEFAULT_NODE_GPUS consecutive ranks."""
    import json

    from xsim.tracegen.contention import SYSTEM_LINKS

    try:
        desc = json.loads(cluster_json or "{}")
    except ValueError:
        desc = {}
    desc = desc if isinstance(desc, dict) else {}
    links = SYSTEM_LINKS.get(str(desc.get("system", "")).lower())
    if links is not None:
        return lambda r: r // links.gpus_per_node
    where: dict[int, int] = {}
    nodes = desc.get("nodes") if "clusters" not in desc else None
    if isinstance(nodes, list):
        nxt = 0
        for i, node in enumerate(nodes):
            ranks = node.get("ranks") if isinstance(node, dict) else None
            if not isinstance(ranks, list):
                count = int(node.get("count", 0)) if isinstance(node, dict) else 0
                ranks = list(range(nxt, nxt + count))
            for r in ranks:
                where[int(r)] = i
            nxt = max(where, default=-1) + 1
    return lambda r: where.get(r, r // DEFAULT_NODE_GPUS)


def ep_nodes(members: tuple[int, ...], node_of: Callable[[int], int]) -> tuple[int, ...]:
    """The node of each EP index of an EP group (its member ranks), numbered from 0 in order of first use."""
    seen: dict[int, int] = {}
    return tuple(seen.setdefault(node_of(r), len(seen)) for r in members)


def _flex_error(dep: object, model: ModelArch) -> str:
    """What the flex (DeepEP) or allgather dispatcher cannot generate here ("" when it can)."""
    moe = model.moe
    kind = getattr(dep, "moe_token_dispatcher_type", "")
    if moe is None:
        return f"moe_token_dispatcher_type {kind} needs a mixture-of-experts model (model: moe)"
    groups = list(dep.device_groups)  # type: ignore[attr-defined]
    if max(max(1, dg.ep) for dg in groups) < 2:
        return f"moe_token_dispatcher_type {kind} needs ep > 1 (xsim runs it over the EP group)"
    if any(dg.tp > 1 and dg.etp != 1 for dg in groups):
        return f"moe_token_dispatcher_type {kind} with expert TP > 1 is not generated yet: give etp: 1"
    if kind == "flex" and moe.pad_to_capacity:
        return "moe_token_dispatcher_type flex does not support pad_to_capacity (Megatron-Core asserts it)"
    return ""


def moe_plan_error(dep: object, model: ModelArch) -> str:
    """What this generator cannot do with a deployment's experts ("" when it can), as one sentence."""
    from xsim.tracegen.moe import check_routing
    from xsim.tracegen.spec import chunk_ranges, replicas

    groups = list(dep.device_groups)  # type: ignore[attr-defined]
    eps = sorted({max(1, dg.ep) for dg in groups})
    if getattr(dep, "moe_token_dispatcher_type", ""):
        err = _flex_error(dep, model)
        if err:
            return err
    if model.mla is not None:
        err = _mla_error(dep, model)
        if err:
            return err
    if model.moe is None:
        return f"ep {eps[-1]} needs a mixture-of-experts model (model: moe)" if eps[-1] > 1 else ""
    moe = model.moe
    if len(eps) > 1:
        return f"device groups give different ep ({', '.join(map(str, eps))}): one EP degree per deployment"
    ep = eps[0]
    if moe.experts % ep:
        return f"ep {ep} does not divide the {moe.experts} experts of {model.name}"
    reps = list(replicas(dep).values())  # type: ignore[arg-type]
    # EP slots per stage: the replicas, times tp with whole experts (etp 1: each TP rank is an EP rank)
    slots = {len(reps) * (dg.tp if dg.etp == 1 else 1) for dg in groups}
    if any(n % ep for n in slots):
        return f"ep {ep} does not divide the {len(reps)} data-parallel replicas (x tp under etp 1: EP is carved out of DP)"
    if any(dg.tp > 1 for dg in groups) and not getattr(dep, "sequence_parallel", False):
        # megatron/training/arguments.py: expert parallelism with tensor parallelism needs sequence parallelism
        return "MoE layers with tp > 1 need sequence_parallel: true (Megatron-Core asserts it)"
    for dg in groups:
        if moe.expert_ffn % (1 if dg.etp == 1 else dg.tp) or moe.shared_width % dg.tp:
            return f"device group {dg.id}: tp {dg.tp} does not divide the expert FFN {moe.expert_ffn} (or the shared one)"
    sharding = getattr(dep, "sharding", "none")
    if sharding not in ("", "none") and (sharding not in ("fsdp", "zero3") or ep > 1):
        # torchtitan's FSDP2 with EP 1 wraps each transformer block, its experts included (one unit); with
        # EP it shards the experts over another mesh (dp_shard_mod_ep), and Megatron-FSDP's MoE buffers
        # differ again: neither is generated
        what = f"sharding {sharding}" + (f" at ep {ep}" if sharding in ("fsdp", "zero3") else "")
        return f"MoE layers with {what} are not supported yet (sharding fsdp or zero3 at ep 1 is)"
    layout = [chunk_ranges(d) for d in reps[0]]
    if any([chunk_ranges(d) for d in r] != layout for r in reps[1:]):
        return (
            "MoE with replicas cut differently (heterogeneous plans) is not supported yet: the planner's "
            "rewriter syncs dense layers only"
        )
    for dg in groups:
        # the tokens one source routes: its micro-batch's seq / cp, and 1/tp of them under sequence parallelism
        tokens = dg.micro_batch * (int(getattr(dep, "seq_len", 0) or model.seq_len) // max(1, dg.cp))
        tokens = -(-tokens // dg.tp) if dg.tp > 1 else tokens
        err = check_routing(moe, tokens)
        if err:
            return f"device group {dg.id}: {err}"
    return ""


def moe_activation_model(m: ModelArch) -> ModelArch:
    """The dense stand-in whose per-layer activations tracegen.memory counts for a MoE model: each token
    passes top_k routed experts and the shared ones, so the MLP tensors are those of an FFN of width
    top_k * expert_ffn + shared_ffn (the permuted copies of the hidden state are not counted)."""
    if m.moe is None:
        return m
    return replace(m, ffn_hidden=m.moe.top_k * m.moe.expert_ffn + m.moe.shared_width)
