"""The workload generator: a validated Deployment -> per-rank Chakra graphs (a TraceBundle).

Every rank's graph is its device group's program (MIMD across groups; ranks of a group differ only in
rank ids, peers and, with uneven TP, one head). Compute nodes and blocking TP collectives form one chain
per rank in schedule order (ctrl deps), so a replayer needs no knowledge of pipeline schedules; P2P sends,
posted receives and data-parallel AllReduces hang off that chain and overlap with it.
"""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from operator import methodcaller
from typing import Any

from xsim.tracegen import deployment_pb2 as dpb
from xsim.tracegen.batch_input import batch_input as batch_work
from xsim.tracegen.batch_input import h2d_ns
from xsim.tracegen.bundle import RankTwins, TraceBundle
from xsim.tracegen.catalog import GpuSpec
from xsim.tracegen.choices import GRAD_REDUCE_BYTES
from xsim.tracegen.contention import (
    SYSTEM_LINKS,
    TE_UB_SMS,
    CommTimer,
    CommWindow,
    busy_fractions,
    comm_ctas,
    dp_comm_ctas,
    with_free_sms,
)
from xsim.tracegen.context_parallel import (
    CP_TAG_BASE,
    RING_KIND,
    CpComm,
    CpStep,
    RingWait,
    RingXfer,
    local_ctx,
    with_cp,
)
from xsim.tracegen.errors import GeneratorError
from xsim.tracegen.frameworks import DEFAULT_FRAMEWORK, Framework, framework
from xsim.tracegen.grad_path import accumulation_op, grad_path, legacy_optimizer, pre_reduce_op
from xsim.tracegen.host import Gate, HostTimeline, host_costs
from xsim.tracegen.mla import with_mla
from xsim.tracegen.models import ModelArch
from xsim.tracegen.moe_ops import (
    A2A_INDEX,
    A2A_SLOTS,
    EP_TAG_BASE,
    AllToAll,
    MoeStep,
    ep_nodes,
    fp8_layer_split,
    fp8_linear_params_ep,
    group_shard,
    layer_split,
    moe_layer_steps,
    rank_node,
    rank_params_ep,
)
from xsim.tracegen.ops import (
    ADAM_FLOPS_PER_PARAM,
    ADAMW_FOREACH_BYTES,
    ADAMW_FOREACH_KERNELS,
    COLUMN_TP_IN,
    LINEAR_OPS,
    Comm,
    Ctx,
    Op,
    OptimizerStep,
    Step,
    duration_micros,
    duration_ns,
    embedding_rank_params,
    embedding_steps,
    head_rank_params,
    head_steps,
    hp_grad_accumulation,
    layer_steps,
    linear_params,
    op_sac_recompute,
    optimizer_steps,
    param_tensors,
    rank_params,
    sp_regather,
    te_amax_update,
    with_recompute,
)
from xsim.tracegen.profile import ProfileTable, build_table, make_row
from xsim.tracegen.rank_nodes import CopiedRank, RankNodes, Records
from xsim.tracegen.schedule import BWD, FWD, interleaved, stage_order
from xsim.tracegen.spec import (
    chunk_ranges,
    gpu_specs,
    grad_reduce_bytes,
    model_arch,
    recompute_modules,
    recompute_units,
    replicas,
)
from xsim.traces import attrs as A
from xsim.traces import pb
from xsim.traces.et_stream_pb2 import NodeBatch
from xsim.traces.wire import node_bytes

COMM_KIND = {"all_reduce": pb.ALL_REDUCE, "all_gather": pb.ALL_GATHER, "reduce_scatter": pb.REDUCE_SCATTER}
COMM_NAME = {v: k for k, v in COMM_KIND.items()}
# Transformer Engine's userbuffers layer names (tracegen.spec.TP_OVERLAP_LAYERS) of the overlapped GEMMs that
# hold SMs: the pipeline forward GEMMs and the bulk methods' wgrad halves.
TE_LAYER_NAMES = {
    ("attn_out_proj", "fwd"): "proj_fprop",
    ("mlp_down", "fwd"): "fc2_fprop",
    ("qkv_proj", "bwd"): "qkv_wgrad",
    ("mlp_up_gate", "bwd"): "fc1_wgrad",
}
RECOMPUTE = "recompute"  # phase tag of recomputed forward ops
# Optimizer results the host reads (tracegen.host): Megatron's get_grad_norm_fp32 returns
# `total_norm.item()` after the model-parallel AllReduce (megatron/core/optimizer/clip_grads.py), and
# fp16's MixedPrecisionOptimizer reads `found_inf.item()` after its AllReduce (optimizer.py,
# _unscale_main_grads_and_check_for_nan).
HOST_READS = frozenset({"grad_norm_allreduce", "found_inf_allreduce"})
# Host syncs of Megatron-LM 2021/2022's timers (Framework.step_timers; megatron/global_vars.py _Timer.start
# and stop each run torch.cuda.synchronize(), de7dc40f88 and d898a8991d), back to back with nothing launched
# between them: before a forward step's kernels 'forward-compute' starts, 'batch-generator' starts,
# get_batch's broadcast sizes are copied to the host (mpu/data.py `sizes_cuda.cpu()`) and 'batch-generator'
# stops (its few small kernels, the token broadcast and the masks, are not generated); a backward step's
# timer starts before its kernels; each pass's timer stops after them; a pipeline exchange's timer starts
# before and stops after _communicate (charged with its synchronize: the same host time with the GPU
# drained; the stop's wait for the scatter/gather's all-gather falls to the next pass's start). The timers
# once per iteration (around the DP and embedding all-reduces and the optimizer's phases: 14 syncs) are not
# generated.
TIMER_SYNCS_FORWARD_START, TIMER_SYNCS_BACKWARD_START, TIMER_SYNCS_PASS_END, TIMER_SYNCS_EXCHANGE = 4, 1, 1, 2
# Positions of the attributes _clone patches: _RankProgram._tags puts layer, phase, micro_batch, stage and
# device_group first on every node; collectives follow with comm_type, comm_size and pg_name.
_DEVICE_GROUP_AT, _PG_NAME_AT = 4, 7
_COMM_SRC_AT = 5  # P2P nodes: comm_src, then comm_dst, right after those five
NO_MICRO_BATCH = -1  # micro_batch of nodes that span the iteration (optimizer, DP gradient sync)
ACT_TAG, GRAD_TAG = 0, 1  # comm_tag = 2 * micro_batch + direction (+ 2 * M * boundary chunk, interleaved)
# Megatron keeps the gradient buffer in FP32 for BF16 training (megatron/training/arguments.py: "bfloat16
# requires gradient accumulation and all-reduce to be done in fp32", accumulate_allreduce_grads_in_fp32) and
# reduces that buffer; the spec's `grad_reduce_dtype` (tracegen.spec.grad_reduce_bytes) says so.
DIST_OPT_GRAD_BYTES = GRAD_REDUCE_BYTES["fp32"]
# Transformer Engine's userbuffers (tp_comm_overlap) defaults, transformer_engine/pytorch/module/base.py
# (initialize_ub, get_default_config): the AllGathers before qkv_fprop, fc1_fprop, proj_dgrad and fc2_dgrad
# use "ring_exchange" with num_splits = TP; the ReduceScatters after proj_fprop and fc2_fprop "pipeline"
# with num_splits 4; the dgrad ReduceScatters of qkv and fc1 are "bulk", overlapped with their wgrad GEMM.
TE_PIPELINE_SPLITS = 4
EMB, HEAD = "emb", "head"  # parameter units besides the layers (FSDP units, gradient-bucket members)
# It pads every bucket to a multiple of lcm(DP, 128) elements so each DP rank's shard is equal and
# 256-byte aligned (megatron/core/distributed/param_and_grad_buffer.py, _pad_end_of_bucket_if_needed).
DIST_OPT_PAD_ELEMENTS = 128


def generate(
    deployment: dpb.Deployment,
    *,
    rewrite: bool = True,
    only: Collection[int] | None = None,
    comm_time: CommTimer | None = None,
) -> TraceBundle:
    """Per-rank graphs of one training iteration; with `rewrite`, heterogeneous sync/reshard is inserted.

    only: keep just these ranks (a compact set's representatives, tracegen/compact.py); the process
    groups are those of the whole plan. A homogeneous plan, which the rewrite leaves alone, builds only
    them; a heterogeneous one is built and rewritten whole (the rewriter numbers the groups it adds in
    rank order over every rank) and the others dropped before writing.

    comm_time: how long a collective holds its SMs, the replay's network model's time of it
    (tracegen.contention.CommTimer, built by xsim.api.network.collective_seconds); None: each is taken in
    flight up to its first consumer.
    """
    # Each rank's program is millions of small objects (payload lists, deps, tags) and no reference cycles;
    # with the cyclic GC on, its full collections come at a rate that grows with the nodes made and each
    # one walks every list held so far: quadratic in the micro-batches (docs/performance.md, round 24t:
    # 4.7 of 16.7 CPU-s of the 1T row at m = 128). Paused, as the replay's build and decode pause it.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _generate(deployment, rewrite, only, comm_time)
    finally:
        if gc_was_enabled:
            gc.enable()


def _generate(
    deployment: dpb.Deployment, rewrite: bool, only: Collection[int] | None, comm_time: CommTimer | None
) -> TraceBundle:
    """`generate` with the collector paused."""
    whole = rewrite and only is not None and not is_homogeneous(deployment)
    gen = _Generator(deployment, only=None if whole else only, comm_time=comm_time)
    bundle = gen.run()
    if rewrite and (only is None or whole):
        # Imported here: the rewriter (tracegen.planner.rewrite) builds on this module, not the other way round.
        try:
            from xsim.tracegen.planner.rewrite import rewrite_bundle
        except ModuleNotFoundError as exc:
            if exc.name != "xsim.tracegen.planner.rewrite":
                raise
            raise GeneratorError(
                "the graph rewriter (tracegen.planner.rewrite) is not installed: generate without rewrite"
            ) from None

        if deployment.virtual_stages <= 1:
            # Interleaved plans are homogeneous with one TP degree (the spec checks it): the rewriter would
            # insert nothing, and its planner reads one contiguous layer range per stage.
            bundle = rewrite_bundle(bundle, deployment, deployment.reshard or "xsim", twins=gen.twins())
    if whole:
        keep = frozenset(only)
        for r in [r for r in bundle.nodes if r not in keep]:
            del bundle.nodes[r]
            bundle.next_id.pop(r, None)
    return bundle


def ep_groups(
    bundle: TraceBundle, reps: dict[int, list[dpb.DeviceGroup]]
) -> dict[int, tuple[int, int, tuple[int, ...], str, str]]:
    """Each rank's expert-parallel place: (ep, EP index, EP group ranks, expert-DP group name, EP group
    name; the latter for the balanced all-to-alls, emitted as collectives).

    Megatron-Core carves EP out of DP with EP fastest: replicas d with equal d div ep form an EP group
    (EP index d mod ep), replicas with equal d mod ep hold the same experts and sync their gradients (the
    expert-data-parallel group, apart from the dense DP group). Each TP rank pairs with the same TP rank
    of its peers (expert TP = TP). With etp 1 every TP rank is an EP slot of its own, slot x = replica
    position * tp + TP index (Megatron-Core's expert rank order etp-ep-edp with etp fastest): slots with
    equal x div ep form an EP group, slots with equal x mod ep the expert-DP group.
    """
    order = sorted(reps)
    place: dict[int, tuple[int, int, tuple[int, ...], tuple[int, ...]]] = {}
    for pos, d in enumerate(order):
        for k, dg in enumerate(reps[d]):
            ep, slots = max(1, dg.ep), (dg.tp if dg.etp == 1 else 1)
            for local, rank in enumerate(dg.ranks):
                x, tl = pos * slots + local // (dg.tp // slots), local % (dg.tp // slots)
                at = lambda y: reps[order[y // slots]][k].ranks[(y % slots) + tl]  # noqa: B023, E731
                members = tuple(at(x - x % ep + i) for i in range(ep))
                edp = tuple(at(y) for y in range(x % ep, len(order) * slots, ep))
                place[rank] = (ep, x % ep, members, edp)
    names: dict[tuple[int, ...], str] = {}
    out: dict[int, tuple[int, int, tuple[int, ...], str, str]] = {}
    for r in sorted(place):
        ep, i, members, edp = place[r]
        for grp in (edp, members):
            if len(grp) > 1 and grp not in names:
                names[grp] = bundle.new_group(list(grp))
        out[r] = (ep, i, members, names.get(edp, ""), names.get(members, ""))
    return out


def flex_groups(
    bundle: TraceBundle,
    ep_of: dict[int, tuple[int, int, tuple[int, ...], str, str]],
    node_of: Callable[[int], int],
) -> dict[int, tuple[tuple[int, ...], dict[str, tuple[tuple[int, ...], str]]]]:
    """Each EP rank's place for DeepEP's legs (tracegen.moe_ops.deepep_legs): the node of each EP index of
    its group and, when the group spans nodes, its "node" group (the EP ranks on its node, NVLink) and its
    "rail" group (the EP ranks at its place on every node, RDMA), each with its pg name. Every node must hold
    as many ranks of the group (DeepEP pairs a rank with the one at its place on each node)."""
    names: dict[tuple[int, ...], str] = {}

    def pg(grp: tuple[int, ...]) -> str:
        if len(grp) > 1 and grp not in names:
            names[grp] = bundle.new_group(list(grp))
        return names.get(grp, "")

    out: dict[int, tuple[tuple[int, ...], dict[str, tuple[tuple[int, ...], str]]]] = {}
    for r in sorted(ep_of):
        _, me, members, _, ep_pg = ep_of[r]
        nodes = ep_nodes(members, node_of)
        on = [tuple(members[q] for q in range(len(members)) if nodes[q] == n) for n in range(max(nodes) + 1)]
        if len({len(x) for x in on}) > 1:
            raise GeneratorError(
                f"moe_token_dispatcher_type flex: EP group {list(members)} holds {', '.join(str(len(x)) for x in on)} "
                "ranks on its nodes; DeepEP needs as many on every node"
            )
        legs = {"": (members, ep_pg)}
        if len(on) > 1:
            mine = on[nodes[me]]
            place = mine.index(r)
            legs["node"] = (mine, pg(mine))
            rail = tuple(x[place] for x in on)
            legs["rail"] = (rail, pg(rail))
        out[r] = (nodes, legs)
    return out


def cp_groups(
    bundle: TraceBundle, reps: dict[int, list[dpb.DeviceGroup]]
) -> dict[int, tuple[int, int, tuple[int, ...], str]]:
    """Each rank's context-parallel place: (cp, CP index, CP group ranks, its pg name).

    Replicas d with equal d div cp split one data replica's sequences (CP index d mod cp), rank by rank of
    the same stage and TP index; they are ordinary members of the DP gradient group (Megatron folds CP
    into it: gradients are reduced over DP x CP).
    """
    order = sorted(reps)
    out: dict[int, tuple[int, int, tuple[int, ...], str]] = {}
    for pos, d in enumerate(order):
        for k, dg in enumerate(reps[d]):
            cp = max(1, dg.cp)
            base = pos - pos % cp
            for local, rank in enumerate(dg.ranks):
                members = tuple(reps[order[base + i]][k].ranks[local] for i in range(cp))
                out[rank] = (cp, pos % cp, members, bundle.new_group(list(members)) if cp > 1 else "")
    return out


def dist_opt_bucket(params: int, dp: int) -> int:
    """Elements of one distributed-optimizer bucket after Megatron's padding to a multiple of lcm(DP, 128)."""
    q = math.lcm(dp, DIST_OPT_PAD_ELEMENTS)
    return -(-params // q) * q


def part(total: int, k: int, i: int) -> int:
    """Part i of `total` cut into k integer parts that differ by at most one and sum to `total`."""
    return total * (i + 1) // k - total * i // k


def early_stopped(fwd: list[MoeStep]) -> list[MoeStep]:
    """The recompute of a checkpointed unit's last layer under PyTorch's early stop: up to, not including,
    its last `mlp_down` GEMM (a layer without one, e.g. MoE, is recomputed whole).

    torch.utils.checkpoint (non-reentrant, torch >= 2.1, PR 90105 / 96866) stops the recompute by raising in
    the pack hook of the last tensor the original forward saved. Autograd saves an op's inputs before it
    runs it (tools/autograd/gen_variable_type.py: setup_derivative's saved inputs, then emit_call), so the
    down projection, whose saved inputs are the activation and the weight, is stopped before its GEMM;
    what follows it (a row-parallel TP collective, the residual add) saves nothing. This holds for layers without hidden dropout (p = 0: its mask would be saved after the
    GEMM), as in the runs that set the key; xsim's layers keep a dropout mask byte regardless.
    """
    for i in range(len(fwd) - 1, -1, -1):
        if getattr(fwd[i], "op", None) == "mlp_down":
            return fwd[:i]
    return fwd


def fsdp_shard(params: int, dp: int) -> int:
    """Elements of one rank's shard of an FSDP unit: the unit padded to a multiple of DP, divided by DP
    (PyTorch FSDP pads each flattened unit so every rank holds an equal shard)."""
    return -(-params // dp)


# Megatron-FSDP's floor on suggested_communication_unit_size when unset: max(1_000_000_000, 2 x the mean
# TransformerLayer's elements); all-gather prefetch up to half of it (megatron/core/distributed/fsdp/src/
# megatron_fsdp/megatron_fsdp.py _init_fsdp_param_and_grad_buffer at 0d8e0714cd: "Cap to 1B elements").
MFSDP_MIN_COMM_UNIT = 1_000_000_000


def mfsdp_strategy(dep: dpb.Deployment) -> str:
    """Megatron-FSDP's data_parallel_sharding_strategy (sharding: megatron-fsdp; "" otherwise), resolved."""
    if dep.sharding != "megatron-fsdp":
        return ""
    return dep.data_parallel_sharding_strategy or "optim_grads_params"


def is_homogeneous(deployment: dpb.Deployment) -> bool:
    """True when every DP replica cuts the same layers into the same stages with the same TP degrees."""
    reps = list(replicas(deployment).values())
    layout = [(d.layer_start, d.layer_end, d.tp) for d in reps[0]]
    return all([(d.layer_start, d.layer_end, d.tp) for d in r] == layout for r in reps[1:])


def p2p_sources(t_src: int, t_dst: int) -> list[tuple[int, int]]:
    """Naive stage-boundary mapping as (src local, dst local) pairs: dst j receives from src j mod t_src."""
    return [(j % t_src, j) for j in range(t_dst)]


@cache
def peer_locals(my_tp: int, other_tp: int, local: int, send: bool) -> tuple[int, ...]:
    """Local indices in the adjacent group that TP rank `local` sends to (or receives from), in order."""
    if send:
        return tuple(d for s, d in p2p_sources(my_tp, other_tp) if s == local)
    return tuple(s for s, d in p2p_sources(other_tp, my_tp) if d == local)


@dataclass(frozen=True)
class _Overlap:
    """One overlapped pair of a TP collective and its GEMM (Transformer Engine's tp_comm_overlap), cut into
    chunks: what every chunk of the pair shares, and the GEMM chunks' node ids as they are added."""

    gemm: Op
    comm: Comm | None  # None: a GEMM cut alone (the LM head's dgrad half under defer_embedding_wgrad_compute)
    k: int  # GEMM chunks
    layer: int
    mb: int
    label: str  # "L{layer}." or "" (node name prefix)
    gemm_tag: str  # phase tag of the GEMM's nodes
    comm_tag: str
    method: str  # TE's overlap method: ring_exchange, pipeline or bulk
    gemm_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class _Chunk:
    """One model chunk of a stage: virtual stage c*P + k of the pipeline (Megatron's interleaving)."""

    index: int  # model chunk c on its stage
    start: int  # first layer, 1-based
    end: int  # last layer
    prev: dpb.DeviceGroup | None  # the group running the previous virtual stage
    next: dpb.DeviceGroup | None
    prev_chunk: int  # model chunk index of the previous virtual stage on `prev`
    first: bool  # virtual stage 0 (embedding)
    last: bool  # last virtual stage (head and loss)


@dataclass(frozen=True)
class _Stage:
    """One device group seen as a pipeline stage of its replica."""

    dg: dpb.DeviceGroup
    index: int
    count: int
    prev: dpb.DeviceGroup | None
    next: dpb.DeviceGroup | None
    chunks: tuple[_Chunk, ...]


def _stage(stages: list[dpb.DeviceGroup], k: int) -> _Stage:
    """Stage k of a replica with its model chunks and their neighbours (virtual stage j = c*P + k)."""
    p = len(stages)
    ranges = [chunk_ranges(dg) for dg in stages]
    v = len(ranges[k])
    chunks = []
    for c, (start, end) in enumerate(ranges[k]):
        j = c * p + k
        prev = stages[(j - 1) % p] if j > 0 else None
        nxt = stages[(j + 1) % p] if j < p * v - 1 else None
        chunks.append(_Chunk(c, start, end, prev, nxt, (j - 1) // p, j == 0, j == p * v - 1))
    return _Stage(
        stages[k], k, p, stages[k - 1] if k else None, stages[k + 1] if k + 1 < p else None, tuple(chunks)
    )


def _framework_of(dep: dpb.Deployment) -> Framework:
    """The deployment's framework profile, its Hopper attention kernel replaced by `attention_kernel`, its
    RMSNorm by `rmsnorm_impl`, its loss by `loss_impl`, its dropout by `dropout`, its gradient buckets' NaN
    check by `check_for_nan_in_grad`, its attention-dropout rate by `attention_dropout` and its batch input
    by `batch_input` where the spec sets them."""
    fw = framework(dep.framework or DEFAULT_FRAMEWORK)
    if dep.HasField("attention_dropout"):
        fw = replace(fw, attention_dropout=dep.attention_dropout)
    if dep.rmsnorm_impl:
        fw = replace(fw, rmsnorm=dep.rmsnorm_impl)
    if dep.loss_impl:
        fw = replace(fw, loss=dep.loss_impl)
    if dep.dropout:
        fw = replace(fw, dropout=dep.dropout == "on")
    if dep.check_for_nan_in_grad:
        fw = replace(fw, check_for_nan_in_grad=dep.check_for_nan_in_grad == "on")
    if dep.batch_input:
        fw = replace(fw, batch_input=dep.batch_input)
    if dep.sharding == "fsdp" and fw.main_grad_hook:
        # PyTorch FSDP accumulates each unit's gradient into its flat parameter's .grad (reduce-scattered
        # by FSDP itself): Megatron-Core DDP's main_grad hook, and so its per-tensor adds, does not run
        # (torch/distributed/fsdp/_runtime_utils.py _post_backward_hook; the megatron-core profile is
        # xsim's default layer profile, which the FSDP rows of other frameworks borrow).
        fw = replace(fw, main_grad_hook=False)
    if dep.sharding == "megatron-fsdp" and fw.main_grad_hook and mfsdp_strategy(dep) != "optim":
        # Megatron-FSDP's hook copies into the fetched bucket of a sharded gradient buffer (Framework.main_grad_copy)
        fw = replace(fw, main_grad_copy=True)
    return replace(fw, hopper_attention=dep.attention_kernel) if dep.attention_kernel else fw


class _Generator:
    def __init__(
        self,
        dep: dpb.Deployment,
        *,
        clone: bool = True,
        only: Collection[int] | None = None,
        comm_time: CommTimer | None = None,
    ) -> None:
        self.dep = dep
        self.comm_time = comm_time  # the replay's network model's collective times (tracegen.contention)
        self._comm_s: dict[tuple[str, int, tuple[int, ...]], float] = {}
        self.only = None if only is None else frozenset(only)  # the ranks to build (None: every rank)
        # At most one rank built per device group (a compact set of rank classes, tracegen/compact.py):
        # no built rank is a copy of another, so each is serialized as soon as it is built and its
        # messages dropped (~10x less memory held: generation streams rank by rank).
        self.stream = self.only is not None and all(
            len(self.only.intersection(dg.ranks)) <= 1 for dg in dep.device_groups
        )
        self.clone = clone  # copy a group's first rank for structurally identical ranks (speed only)
        self.model: ModelArch = model_arch(dep)
        # MoE ranks differ by their EP index and routing, and their all-to-all peers are not patched by _clone.
        self.clone = clone and self.model.moe is None
        self.ep_of: dict[
            int, tuple[int, int, tuple[int, ...], str, str]
        ] = {}  # rank -> (ep, index, members, edp pg, ep pg)
        self.flex_of: dict[int, tuple[tuple[int, ...], dict[str, tuple[tuple[int, ...], str]]]] = {}
        # rank -> (cp, index, members, cp pg); ring peers are not patched by _clone either
        self.cp_of: dict[int, tuple[int, int, tuple[int, ...], str]] = {}
        if any(dg.cp > 1 for dg in dep.device_groups):
            self.clone = False
        self.gpus: dict[str, GpuSpec] = gpu_specs(dep)
        self.profile: ProfileTable | None = None
        if dep.profile:
            self.profile = build_table(
                make_row(
                    {"gpu": p.gpu, "op": p.op, "phase": p.phase, "shape": list(p.shape), "micros": p.micros},
                    "profile",
                )
                for p in dep.profile
            )
        self.bundle = TraceBundle(nodes=RankNodes())
        self._attr_cache: dict[tuple[str, type, Any], pb.AttributeProto] = {}
        # id of an attribute from `attr` (held alive by _attr_cache) -> (it, its bytes inside a node)
        self._attr_bytes: dict[int, tuple[pb.AttributeProto, bytes]] = {}
        self._dur_cache: dict[tuple[str, Op], int] = {}
        self._contended: dict[tuple[str, Op, int], int] = {}
        # What NCCL sees on a DGX system, for the CTAs a collective holds (tracegen.contention); None: no preset
        cluster = json.loads(dep.cluster_json or "{}")
        system = cluster.get("system", "") if isinstance(cluster, dict) else ""
        self.links = SYSTEM_LINKS.get(str(system).lower())
        self.dp_members: dict[str, list[int]] = {}  # DP group name -> its ranks
        self.rep_groups: dict[int, str] = {}  # rank -> its replicate group under hybrid sharding (dp_shard)
        # rank -> its whole DP group under dp_shard, where the framework all-reduces the gradients over it
        # (Framework.sharded_grad_allreduce: InternLM's zero1 < DP)
        self.wide_groups: dict[int, str] = {}
        self.mp_groups: dict[int, str] = {}  # rank -> its grad-norm AllReduce group ("" when alone)
        self.emb_groups: dict[int, str] = {}  # rank -> its tied-embedding gradient group (end stages only)
        self._twin_of: dict[int, int] = {}  # rank -> the rank whose program it copies (itself when built)
        self._tags_of: dict[int, list[tuple[str, int, int]]] = {}  # built rank -> (phase, layer, mb) per node

    def attr(self, name: str, value: Any) -> pb.AttributeProto:
        key = (name, type(value), value)  # type too: True == 1 but they are different attribute kinds
        a = self._attr_cache.get(key)
        if a is None:
            try:
                a = self._attr_cache[key] = A.make_attr(name, value)
            except ValueError:  # protobuf: the value does not fit the attribute's 64-bit field
                raise GeneratorError(
                    f"attribute {name} = {value} does not fit a 64-bit trace attribute: the model is too "
                    "large (hidden, ffn_hidden, seq_len x micro_batch)"
                ) from None
        return a

    def attrs_bytes(self, attrs: Sequence[pb.AttributeProto]) -> bytes:
        """Attributes (from `attr`) as the attribute fields of a serialized node, each encoded once."""
        cache, out = self._attr_bytes, []
        for a in attrs:
            got = cache.get(id(a))
            if got is None:
                got = cache[id(a)] = (a, _attr_bytes(a))
            out.append(got[1])
        return b"".join(out)

    def attr_bytes(self, a: pb.AttributeProto) -> bytes:
        """One attribute (from `attr`) as the bytes it is serialized to inside a node (the patch paths'
        search key; tests replace it to force the general, parsing path)."""
        return self.attrs_bytes((a,))

    def duration(self, gpu: str, op: Op) -> tuple[int, pb.AttributeProto]:
        """(duration_micros, the exact `duration_ns` attribute) of `op` on `gpu`, cached."""
        key = (gpu, op)
        d = self._dur_cache.get(key)
        if d is None:
            spec, model = self.gpus[gpu], self.dep.compute_model or "roofline"
            rates = self.dep.gemm_rates or "sustained"
            ns = duration_ns(op, spec, self.profile, model, rates)
            d = self._dur_cache[key] = (
                duration_micros(op, spec, self.profile, model, rates),
                self.attr(A.DURATION_NS, ns),
            )
        return d

    def duration_ns(self, gpu: str, op: Op) -> int:
        """The exact duration of `op` on `gpu` in ns (the `duration_ns` attribute's value), cached."""
        return int(self.duration(gpu, op)[1].int64_val)

    def comm_seconds(self, kind: str, size: int, members: Sequence[int]) -> float:
        """Seconds the collective holds its SMs: its whole duration as the replay's network model times it
        (`comm_time`, cached per kind, size and group); inf without one (held up to its first consumer)."""
        key = (kind, size, tuple(members))
        s = self._comm_s.get(key)
        if s is None:
            p = len(key[2])
            s = self._comm_s[key] = (
                math.inf if self.comm_time is None else 0.0 if p < 2 else self.comm_time(*key)
            )
        return s

    def contended_ns(self, gpu: str, op: Op, busy: int) -> int:
        """ns of `op` on `gpu` while communication kernels hold `busy` of its SMs (tracegen.contention)."""
        key = (gpu, op, busy)
        ns = self._contended.get(key)
        if ns is None:
            spec = with_free_sms(self.gpus[gpu], busy)
            model, rates = self.dep.compute_model or "roofline", self.dep.gemm_rates or "sustained"
            ns = self._contended[key] = duration_ns(op, spec, self.profile, model, rates)
        return ns

    def run(self) -> TraceBundle:
        reps = replicas(self.dep)
        tp_groups = {dg.id: self.bundle.new_group(dg.ranks) for dg in self.dep.device_groups if dg.tp > 1}
        dp_groups: dict[int, str] = {}  # rank -> pg_name of its DP gradient group
        if len(reps) > 1 and is_homogeneous(self.dep):
            stages = list(reps.values())
            # Hybrid sharding (dp_shard S < DP): the DP ranks of a position split into shard groups of S
            # consecutive replicas, which gather and reduce-scatter, and replicate groups (one member of each
            # shard group, same place in it), which all-reduce the shards' gradients: PyTorch's HYBRID_SHARD
            # device mesh (replicate, shard), torchtitan's dp_replicate x dp_shard, the shard dim innermost.
            # The distributed optimizer's instances the same (Megatron-Core's intra- and inter-partial DP
            # groups: parallel_state.py of core_r0.11.0 cuts the DP ranks into consecutive blocks of DP / N and
            # strides across them); where the framework all-reduces the whole gradient over every DP rank
            # (Framework.sharded_grad_allreduce: InternLM's zero1) that whole group instead of the replicate ones.
            shard = self.dep.dp_shard if 0 < self.dep.dp_shard < len(stages) else len(stages)
            wide = self.dep.distributed_optimizer and _framework_of(self.dep).sharded_grad_allreduce
            for k in range(len(stages[0])):
                for j in range(stages[0][k].tp):
                    members = [rep[k].ranks[j] for rep in stages]
                    for b in range(0, len(members), shard):
                        block = members[b : b + shard]
                        name = self.bundle.new_group(block)
                        self.dp_members[name] = block
                        for r in block:
                            dp_groups[r] = name
                    if shard < len(members) and wide:
                        name = self.bundle.new_group(members)
                        for r in members:
                            self.wide_groups[r] = name
                    elif shard < len(members):
                        for i in range(shard):
                            name = self.bundle.new_group(members[i::shard])
                            for r in members[i::shard]:
                                self.rep_groups[r] = name
        if self.model.moe is not None:
            self.ep_of = ep_groups(self.bundle, reps)
        # flex (DeepEP) dispatcher: rank -> (node of each EP index, {leg: (members, pg)}) (tracegen.moe_ops)
        self.flex_of = {}
        if self.model.moe is not None and self.dep.moe_token_dispatcher_type == "flex":
            self.flex_of = flex_groups(self.bundle, self.ep_of, rank_node(self.dep.cluster_json))
        if any(dg.cp > 1 for dg in self.dep.device_groups):
            self.cp_of = cp_groups(self.bundle, reps)
        # The optimizer's gradient-norm AllReduce: over each replica's model-parallel ranks (TP x PP), or over
        # every rank under the distributed optimizer, whose DP ranks hold disjoint shards (Megatron's
        # get_grad_stats_parallel_group). A group of one rank needs no collective. With dp_shard, over the
        # ranks of one shard group's replicas, which hold the whole model once: Megatron-Core's
        # intra_dist_opt_group (core_v0.13.0 megatron/core/optimizer/__init__.py sets grad_stats_parallel_group
        # to it; parallel_state.py builds it of intra_partial_expert_data_parallel_size model-parallel
        # groups; core_r0.11/0.12 reduced over the world), InternLM's norm over MODEL then ZERO1
        # (4a3d156 hybrid_zero_optim.py compute_norm).
        if self.dep.distributed_optimizer and (self.rep_groups or self.wide_groups):
            shard = self.dep.dp_shard
            order = list(reps.values())
            for b in range(0, len(order), shard):
                members = sorted(r for stages in order[b : b + shard] for dg in stages for r in dg.ranks)
                name = self.bundle.new_group(members)
                for r in members:
                    self.mp_groups[r] = name
        elif self.dep.distributed_optimizer:
            world = sorted(r for dg in self.dep.device_groups for r in dg.ranks)
            world_pg = self.bundle.new_group(world) if len(world) > 1 else ""
            self.mp_groups = {r: world_pg for r in world}
        else:
            for stages in reps.values():
                members = sorted(r for dg in stages for r in dg.ranks)
                name = self.bundle.new_group(members) if len(members) > 1 else ""
                for r in members:
                    self.mp_groups[r] = name
        # Tied word embeddings under pipeline parallelism (ModelArch.tied, Framework.always_tied): each
        # first-stage rank and the last-stage rank of its TP position (Megatron's embedding group; its TP
        # degrees are equal, and a plan whose end stages differ in TP has no such pairing: none).
        if self.model.tied:
            for stages in reps.values():
                head, tail = stages[0], stages[-1]
                if len(stages) > 1 and head.tp == tail.tp:
                    for a, b in zip(head.ranks, tail.ranks, strict=True):
                        name = self.bundle.new_group([a, b])
                        self.emb_groups[a] = self.emb_groups[b] = name
        # Ranks of one shape (_shape_key: same program up to group ids, group names and P2P peers), within
        # a device group or across replicas, are copies of the first one built with those patched in.
        templates: dict[tuple, _RankProgram] = {}
        for stages in reps.values():
            for k, dg in enumerate(stages):
                st = _stage(stages, k)
                tp_pg = tp_groups.get(dg.id, "")
                for local, rank in enumerate(dg.ranks):
                    if self.only is not None and rank not in self.only:
                        continue
                    dp_pg = dp_groups.get(rank)
                    key = self._shape_key(st, local, dp_pg) if self.clone else None
                    template = templates.get(key) if key is not None else None
                    if template is not None:
                        copy = self._clone(template, st, local, rank, tp_pg, dp_pg)
                        self.bundle.nodes.set_copy(rank, copy)
                        self.bundle.next_id[rank] = len(copy)
                    else:
                        template = _RankProgram(self, st, local, rank, tp_pg, dp_pg)
                        # Held as bytes (a list of messages only when someone asks for it: the rewriter)
                        recs = Records.of_nodes(template.build_payloads())
                        self.bundle.nodes.set_copy(rank, CopiedRank(recs, [(0, len(recs))]))
                        self.bundle.next_id[rank] = len(recs)
                        if self.stream:
                            self._twin_of[rank] = template.rank
                            self._tags_of.setdefault(template.rank, template.tags)
                            del template, recs
                            continue
                        template.blobs[(dg.id, tp_pg)] = recs
                        if key is not None:
                            templates[key] = template
                    self._twin_of[rank] = template.rank
                    self._tags_of.setdefault(template.rank, template.tags)
        self.bundle.nodes.sort()
        self.bundle.next_id = dict(sorted(self.bundle.next_id.items()))
        return self.bundle

    def twins(self) -> RankTwins:
        """Which ranks were generated as copies of which (same node ids, dependencies and tags)."""
        return RankTwins(dict(self._twin_of), dict(self._tags_of))

    def _shape_key(self, st: _Stage, local: int, dp_pg: str | None) -> tuple:
        """Everything a rank's program depends on but its group ids, group names and P2P peer ranks.

        Two ranks with equal keys get the same nodes up to those (the device group id on every node, the
        TP group name on TP collectives, the DP group name on sync nodes, P2P peers and their node names).
        """
        dg, tp = st.dg, st.dg.tp
        chunks = tuple(
            (
                ch.index,
                ch.start,
                ch.end,
                ch.prev_chunk,
                ch.first,
                ch.last,
                *(
                    (o.tp, len(peer_locals(tp, o.tp, local, True)), len(peer_locals(tp, o.tp, local, False)))
                    if o is not None
                    else (None,)
                    for o in (ch.prev, ch.next)
                ),
            )  # fmt: skip
            for ch in st.chunks
        )
        dp = len(self.dp_members.get(dp_pg, ())) if dp_pg else None
        sh = group_shard(self.model, dg, local)
        hybrid = (bool(self.rep_groups), bool(self.wide_groups))
        return (dg.gpu, tp, dg.micro_batch, sh, st.index, st.count, chunks, dp, hybrid)

    def _clone(
        self, template: _RankProgram, st: _Stage, local: int, rank: int, tp_pg: str, dp_pg: str | None
    ) -> CopiedRank:
        """The template rank's nodes with this rank's group ids and names and P2P peers patched in, as bytes:
        its device group's serialized nodes plus the P2P and DP-sync nodes that differ, re-serialized."""
        dg = st.dg
        key = (dg.id, tp_pg)
        records = template.blobs.get(key)
        if records is None:
            # Once per device group: the template's nodes with this group's id and TP group name, serialized
            # (the group's other ranks then only need their peers and DP group patched). Patched on a parse
            # of the template's own batch: one C-level parse and serialization instead of a copy per node.
            own = (template.st.dg.id, template.tp_pg)
            records = template.blobs[key] = self._group_records(template, template.blobs[own], dg.id, tp_pg)
        # Node ids are positions (_RankProgram._add): the patched nodes are parsed alone, patched and
        # serialized again; every other node stays the group's bytes.
        patches: dict[int, bytes] = {}
        for nid, send, c, side, k in template.p2p_log:
            other = st.chunks[c].prev if side == "prev" else st.chunks[c].next
            assert other is not None
            peer = other.ranks[peer_locals(dg.tp, other.tp, local, send)[k]]
            n = records.node(nid)
            src, dst = (rank, peer) if send else (peer, rank)
            at = n.attr
            a, b = at[_COMM_SRC_AT], at[_COMM_SRC_AT + 1]
            if a.name == A.COMM_SRC and b.name == A.COMM_DST:  # where _RankProgram.p2p puts them
                a.int32_val, b.int32_val = src, dst
            else:
                for a in at:
                    if a.name == A.COMM_SRC:
                        a.int32_val = src
                    elif a.name == A.COMM_DST:
                        a.int32_val = dst
            n.name = f"{n.name.rsplit('.', 1)[0]}.{'to' if send else 'from'}{peer}"
            patches[nid] = n.SerializeToString()
        # The groups a clone's collectives name by rank rather than by position: DP, the tied embedding's
        # first/last-stage pair and the model-parallel group.
        reps = set(template.rep_ids) | set(template.wide_ids)
        for pg, old_pg, ids in (
            (dp_pg or "", template.dp_pg or "", [i for i in template.sync_ids if i not in reps]),
            (self.rep_groups.get(rank, ""), template.rep_pg, template.rep_ids),
            (self.wide_groups.get(rank, ""), template.wide_pg, template.wide_ids),
            (self.emb_groups.get(rank, ""), template.emb_pg, template.emb_ids),
            (self.mp_groups.get(rank, ""), template.mp_pg, template.mp_ids),
        ):
            if pg != old_pg:
                for nid in ids:
                    n = records.node(nid)
                    n.attr[_PG_NAME_AT].string_val = pg
                    patches[nid] = n.SerializeToString()
        return CopiedRank.patched(records, patches)

    def _group_records(self, template: _RankProgram, own: Records, dg_id: int, tp_pg: str) -> Records:
        """The template's records with another device group id on every node and another TP group name on
        its TP collectives.

        Each patch swaps one attribute's bytes inside a node for the new attribute's: what serializing the
        patched message gives, as a node's fields keep their order. Done only where the old attribute's
        bytes occur exactly once in every node patched (so that occurrence is the attribute itself);
        otherwise the nodes are parsed, patched and serialized.
        """
        payloads = own.payloads
        if dg_id != template.st.dg.id:
            old = self.attr_bytes(self.attr(A.DEVICE_GROUP, template.st.dg.id))
            counts = list(map(methodcaller("count", old), payloads))
            if counts.count(1) != len(counts):
                return self._group_records_parsed(template, own, dg_id, tp_pg)
            payloads = list(
                map(methodcaller("replace", old, self.attr_bytes(self.attr(A.DEVICE_GROUP, dg_id))), payloads)
            )
        if tp_pg != template.tp_pg:
            old, new = (self.attr_bytes(self.attr(A.PG_NAME, pg)) for pg in (template.tp_pg, tp_pg))
            if any(payloads[i].count(old) != 1 for i in template.tp_ids):
                return self._group_records_parsed(template, own, dg_id, tp_pg)
            payloads = list(payloads)
            for i in template.tp_ids:
                payloads[i] = payloads[i].replace(old, new)
        return Records.of_nodes(payloads)

    def _group_records_parsed(self, template: _RankProgram, own: Records, dg_id: int, tp_pg: str) -> Records:
        """`_group_records` on parsed messages (the general way)."""
        batch = NodeBatch.FromString(own.batch)
        nodes = batch.nodes
        if dg_id != template.st.dg.id:
            for n in nodes:
                n.attr[_DEVICE_GROUP_AT].int64_val = dg_id
        if tp_pg != template.tp_pg:
            for nid in template.tp_ids:
                nodes[nid].attr[_PG_NAME_AT].string_val = tp_pg
        return Records.of_batch(batch.SerializeToString())


def _attr_bytes(attr: pb.AttributeProto) -> bytes:
    """An attribute as it is serialized inside a node (field tag, length, attribute)."""
    return pb.Node(attr=[attr]).SerializeToString()


class _RankProgram:
    """Emits the nodes of one rank in program order."""

    def __init__(
        self, gen: _Generator, st: _Stage, local: int, rank: int, tp_pg: str, dp_pg: str | None
    ) -> None:
        self.gen = gen
        self.st = st
        self.local = local
        self.rank = rank
        self.tp_pg = tp_pg
        self.dp_pg = dp_pg
        dep = gen.dep
        dg = st.dg
        self.gpu = dg.gpu
        self.ctx = Ctx(
            gen.model,
            group_shard(gen.model, dg, local),
            dg.micro_batch,
            dep.seq_len,
            dep.dtype_bytes,
            dep.sequence_parallel,
            dep.precision or "bf16",
            dep.attention or "flash",
            _framework_of(dep),
            dep.fp8_recipe or "delayed",
            # main_grad as wide as the gradient buffer (the hook's adds, tracegen.ops.main_grad_hook_adds)
            grad_reduce_bytes(dep),
            dep.fp8_amax_update or "region",
        )
        self.cp = gen.cp_of.get(
            rank
        )  # (cp, CP index, CP group ranks, CP group name) under context parallelism
        if self.cp is not None:
            self.ctx = local_ctx(self.ctx, self.cp[0])
        self.ring_queue: list[list[int]] = []  # exchanges of the ring not yet waited for
        self.ring_recv = -1  # the last K/V receive (the next exchange forwards that block)
        self.mp_pg = gen.mp_groups.get(rank, "")
        self.rep_pg = gen.rep_groups.get(rank, "")  # hybrid sharding's replicate group ("" without)
        self.wide_pg = gen.wide_groups.get(rank, "")  # the whole DP group under dp_shard ("" without)
        self.emb_pg = gen.emb_groups.get(rank, "")
        self.emb_ids: list[int] = []  # the tied embedding's gradient AllReduce (PG_NAME: the embedding group)
        self.mp_ids: list[
            int
        ] = []  # grad-norm (and found-inf) AllReduces: PG_NAME is the model-parallel group
        # The nodes as protobuf serializes them (wire.node_bytes), and each node's (data, ctrl) deps.
        self.payloads: list[bytes] = []
        self.deps: list[tuple[Sequence[int], Sequence[int]]] = []
        self.hostline: HostTimeline | None = None  # the host thread (tracegen.host), set up by `setup`
        self.launch_blocking = False  # CUDA_LAUNCH_BLOCKING=1 (cuda_launch_blocking), set by `setup`
        # the pipeline exchange being emitted (its P2P nodes), when the framework syncs the host at each one
        self.exchange: list[int] | None = None
        self.exchange_side, self.in_p2p = "", False
        self.posted: dict[tuple[str, int, int], int | None] = {}  # receives posted ahead of their pass
        self.held: list[tuple] | None = None  # sends held for the end of the schedule step
        # DeepSpeed's pipeline engine (Framework.deepspeed_pipe): a backward's gradient send, issued after the
        # next forward's receive (TrainSchedule's forward slot: RecvActivation, then SendGrad)
        self.grad_send: tuple | None = None
        # scatter/gather (Framework.pp_scatter_gather): receives whose TP all-gather is still to be emitted,
        # as (receive, chunk bytes, layer, phase, micro-batch), and each gathered receive's all-gather
        self.sg_pending: list[tuple[int, int, int, str, int]] = []
        self.sg_gather: dict[int, int] = {}
        self._cost: tuple[int, int] | None = None  # (launches, ns) of the compute node `_add` emits next
        self._a2a = ""  # "first" | "rest" while an all-to-all's P2P pairs are emitted (one launch in all)
        self._heads: dict[tuple[int, str, int], bytes] = {}  # (layer, phase, mb) -> the _tags' bytes
        # id of a Step of this rank's step lists -> (the step, duration_micros, its trailing attributes' bytes)
        self._step_tail: dict[int, tuple[Step, int, bytes, int]] = {}
        self._plain: dict[int, tuple[list, bool]] = {}  # id of a step list -> (it, only plain steps?)
        # (id of a step, chunks, chunk) -> (ns, duration_micros, attribute bytes after the _tags, the step)
        self._chunk_tail: dict[tuple[int, int, int], tuple[int, int, bytes, Step]] = {}
        self._regather: dict[str, Comm] = {}  # tp_in op -> its backward re-gather (ops.sp_regather)
        self.frontier: int | None = None  # last node of the compute/TP chain
        self.base = [gen.attr(A.STAGE, st.index), gen.attr(A.DEVICE_GROUP, dg.id)]
        self.first = st.chunks[0].first
        self.last = st.chunks[-1].last
        self.layer_fwd = {p: layer_steps(self.ctx, p) for p in ("fwd", "bwd")}
        self.plain_bwd = self.layer_fwd["bwd"]  # without recompute modules (layer_of adds them after MLA)
        self.recompute = dep.recompute or "none"
        # Megatron-Core's selective recompute modules (tracegen.ops.with_recompute); () unless selective
        self.modules = recompute_modules(dep)
        if self.modules:
            self.layer_fwd["bwd"] = with_recompute(
                self.layer_fwd["bwd"], self.layer_fwd["fwd"], self.ctx, self.modules
            )
        elif self.recompute == "selective-op":  # torchtitan's op-level SAC: before the layer's backward
            self.layer_fwd["bwd"] = [*op_sac_recompute(self.ctx), *self.layer_fwd["bwd"]]
        self.ep = gen.ep_of.get(rank)  # (ep, EP index, EP group ranks, expert-DP group) of a MoE model
        self._moe_steps: dict[tuple[int, str], list[MoeStep]] = {}
        # The word table's gradient is accumulated into main_grad, as wide as the gradient buffer (Ctx.grad_bytes);
        # a tied output layer on this rank (one stage) shares the table (tracegen.ops.embedding_grad).
        tied_here = self.first and self.last and gen.model.tied
        self.emb = (
            {p: embedding_steps(self.ctx, p, tied_here) for p in ("fwd", "bwd")} if self.first else None
        )
        self.head = {p: head_steps(self.ctx, p) for p in ("fwd", "bwd")} if self.last else None
        # Transformer Engine's amax reduction and scale update, once per model chunk, micro-batch and pass
        # (tracegen.ops.te_amax_update): each list made once, as the step caches key on the list.
        self.amax = {
            (ch.index, p): te_amax_update(self.ctx, p, ch.end - ch.start + 1)
            for ch in st.chunks
            for p in ("fwd", "bwd")
        }
        self.num_layers = sum(ch.end - ch.start + 1 for ch in st.chunks)
        self.last_fwd: dict[tuple[int, int], int] = {}
        # (node, send?, model chunk, "prev" | "next" neighbour of that chunk, k-th peer)
        self.p2p_log: list[tuple[int, bool, int, str, int]] = []
        self.tp_ids: list[int] = []  # TP collectives (their PG_NAME is the TP group's)
        self.tp_async: list[int] = []  # those of them that run under compute (dgrad_overlapped)
        self.tp_async_of: dict[int, tuple[str, int]] = {}  # their (kind, comm_size)
        self.dgrad_overlap = False  # set by `setup`
        self.tags: list[tuple[str, int, int]] = []  # (phase, layer, micro_batch) of every node
        # The nodes serialized once per (device group id, TP group name) they are copied to.
        self.blobs: dict[tuple[int, str], Records] = {}

    # -- node emission -------------------------------------------------------------------------------
    def _tags(self, layer: int, phase: str, mb: int) -> list[pb.AttributeProto]:
        """The leading attributes of every node (positions fixed: _clone patches by position)."""
        g = self.gen
        self._tag = (phase, layer, mb)  # taken by the _add this list is made for
        return [g.attr(A.LAYER, layer), g.attr(A.PHASE, phase), g.attr(A.MICRO_BATCH, mb), *self.base]

    def _head(self, layer: int, phase: str, mb: int) -> bytes:
        """`_tags` as the bytes of those attribute fields (each (layer, phase, mb) encoded once)."""
        key = (layer, phase, mb)
        got = self._heads.get(key)
        if got is None:
            got = self._heads[key] = self.gen.attrs_bytes(self._tags(layer, phase, mb))
        self._tag = (phase, layer, mb)
        return got

    @property
    def nodes(self) -> list[pb.Node]:
        """The nodes emitted so far as messages (parsed copies: changing them changes nothing here)."""
        return list(NodeBatch.FromString(Records.of_nodes(self.payloads).batch).nodes)

    def _add(
        self, name: str, ntype: int, data: Sequence[int], ctrl: Sequence[int], dur: int, attrs: list | bytes
    ) -> int:
        """Append a node (its id is its position); `attrs` as messages from `attr` or as their bytes. With a
        host timeline, the host node that launches it goes right before it when the host can delay it."""
        line = self.hostline
        if line is None:
            return self._append(name, ntype, data, ctrl, dur, attrs)
        if self.exchange and not self.in_p2p:  # the node after a pipeline exchange: the host synced there
            self.end_exchange()
        launches, lb = self._launch_cost(ntype)
        gate = line.launch([*data, *ctrl], launches)
        hid = -1
        if gate is not None:
            hid = self._host_node(name if ntype == pb.COMP_NODE else name.rsplit(".", 1)[0], gate)
            data = [*data, hid]
        nid = self._append(name, ntype, data, ctrl, dur, attrs)
        line.placed(nid, lb, hid)
        if self.launch_blocking:
            # CUDA_LAUNCH_BLOCKING=1: the launch (a kernel, an NCCL call, a send or receive) returns when the
            # kernel has ended; the host then dispatches the next one (its launch cost), no read of its own.
            gate = line.sync([nid], 0)
            # launches no host node carried yet (none in practice: every launch after a sync is gated)
            if gate is not None and gate[0]:
                line.prev = self._host_node("read", gate)
        return nid

    def _append(
        self, name: str, ntype: int, data: Sequence[int], ctrl: Sequence[int], dur: int, attrs: list | bytes
    ) -> int:
        """Append a node as it is (its id is its position)."""
        nid = len(self.payloads)
        self.tags.append(self._tag)
        if attrs.__class__ is not bytes:
            attrs = self.gen.attrs_bytes(attrs)
        self.payloads.append(node_bytes(nid, name, ntype, ctrl, data, dur, attrs))
        self.deps.append((data, ctrl))
        return nid

    def step(self, s: Step, pred: int | None, layer: int, mb: int, label: str, phase: str = "") -> int:
        """Emit one chained op or TP collective depending on `pred`; it becomes the chain's frontier.

        `phase` overrides the step's own phase tag (recomputed forward ops keep their forward cost).
        """
        # Gathered parameters are waited for by the unit's first compute op (a TP collective needs none).
        data = ([] if pred is None else [pred]) + (self._take_waits() if isinstance(s, Op) else [])
        ctrl = [] if self.frontier is None or self.frontier == pred else [self.frontier]
        tag = self._tag_of(s, phase)
        head = self._head(layer, tag, mb)
        tail = self._step_tail.get(id(s))
        if tail is None:
            tail = self._step_tail[id(s)] = (s, *self._tail(s))
        name = f"{label}{s.op}.{tag}.mb{mb}"
        if isinstance(s, Op):
            if self.hostline is not None:
                self._cost = (s.kernels, tail[3])
            nid = self._add(name, pb.COMP_NODE, data, ctrl, tail[1], head + tail[2])
            self.comp_ops[nid] = (s, 0, 1)
        else:
            nid = self._add(name, pb.COMM_COLL_NODE, data, ctrl, 0, head + tail[2])
            self.tp_ids.append(nid)
        self.frontier = nid
        return nid

    def _tail(self, s: Step) -> tuple[int, bytes, int]:
        """(duration_micros, the bytes of the attributes after the _tags, exact ns) of a step's node."""
        g = self.gen
        if isinstance(s, Op):
            micros, exact = g.duration(self.gpu, s)
            extra = g.attrs_bytes([g.attr(A.NUM_OPS, s.flops), g.attr(A.TENSOR_SIZE, s.bytes), exact])
            return micros, extra, int(exact.int64_val)
        extra = [
            g.attr(A.COMM_TYPE, COMM_KIND[s.kind]),
            g.attr(A.COMM_SIZE, s.size),
            g.attr(A.PG_NAME, self.tp_pg),
        ]
        return 0, g.attrs_bytes(extra), 0

    def _tag_of(self, s: Step, phase: str) -> str:
        """The phase tag of a step: `phase` if given, recompute for a forward op inside a backward pass
        (selective recompute), else the op's own phase (collectives: the pass's)."""
        if getattr(s, "phase", "") == "fwd" and self._phase == "bwd":  # an Op, or a replayed collective
            phase = RECOMPUTE
        return phase or (s.phase if isinstance(s, Op) else self._phase)

    def _take_waits(self) -> list[int]:
        """Parameter gathers the next compute node must wait for (consumed by it)."""
        w, self.waits = self.waits, []
        return w

    def layer_of(self, layer: int, phase: str) -> list[MoeStep]:
        """The steps of `layer` in pass `phase`: the dense layer's, or a MoE layer's (tracegen.moe_ops)."""
        moe = self.gen.model.moe
        is_moe = moe is not None and moe.is_moe(layer) and self.ep is not None
        mla = self.gen.model.mla
        if not is_moe and self.cp is None and mla is None:
            return self.layer_fwd[phase]
        key = (layer if is_moe else 0, phase)
        got = self._moe_steps.get(key)
        if got is None:
            if is_moe:
                assert moe is not None and self.ep is not None
                flex = self.gen.flex_of.get(self.rank)
                gather = self.gen.dep.moe_token_dispatcher_type == "allgather"
                got = moe_layer_steps(
                    self.ctx,
                    moe,
                    layer,
                    self.ep[0],
                    self.ep[1],
                    phase,
                    self.local,
                    flex[0] if flex else None,
                    gather,
                )
            else:
                # the dense layer's (under recompute modules without them: inserted after MLA below)
                got = list(self.plain_bwd if phase == "bwd" and self.modules else self.layer_fwd[phase])
            if mla is not None:
                got = with_mla(got, self.ctx, mla, phase)
            if phase == "bwd" and self.modules:  # re-run from the layer's own forward steps
                got = with_recompute(got, self.layer_of(layer, "fwd"), self.ctx, self.modules, is_moe)
            if self.cp is not None:
                got = with_cp(
                    got, self.ctx, self.cp[0], self.gen.dep.cp_comm_type or "p2p", phase, self.cp[1]
                )
            self._moe_steps[key] = got
        return got

    def cp_step(self, s: CpStep, pred: int | None, layer: int, mb: int, phase: str) -> int | None:
        """A context-parallel exchange, wait or collective (tracegen.context_parallel); returns the new pred."""
        g = self.gen
        assert self.cp is not None
        cp, me, members, pg = self.cp
        tag_phase = phase or self._phase
        if isinstance(s, RingWait):
            self.waits += self.ring_queue.pop(0)
            return pred
        if isinstance(s, CpComm):
            data = [] if pred is None else [pred]
            ctrl = [] if self.frontier is None or self.frontier == pred else [self.frontier]
            extra = [
                g.attr(A.COMM_TYPE, COMM_KIND[s.kind]),
                g.attr(A.COMM_SIZE, s.size),
                g.attr(A.PG_NAME, pg),
            ]
            nid = self._add(
                f"L{layer}.{s.op}.{tag_phase}.mb{mb}", pb.COMM_COLL_NODE, data, ctrl, 0,
                self._tags(layer, tag_phase, mb) + extra,
            )  # fmt: skip
            self.frontier = nid
            return nid
        nxt, prv = members[(me + 1) % cp], members[(me - 1) % cp]
        tag = CP_TAG_BASE + (layer * g.dep.micro_batches + mb) * 4 * cp + RING_KIND[(s.what, tag_phase)] * cp
        tag += s.index
        ids = []
        for send, peer in ((False, prv), (True, nxt)):
            src, dst = (self.rank, peer) if send else (peer, self.rank)
            extra = [
                g.attr(A.COMM_SRC, src),
                g.attr(A.COMM_DST, dst),
                g.attr(A.COMM_TAG, tag),
                g.attr(A.COMM_SIZE, s.size),
            ]
            if not send:
                data = []
            elif s.what == "kv" and s.index > 0:
                data = [self.ring_recv]
            else:
                data = [] if pred is None else [pred]
            name = f"L{layer}.cp_{s.what}{s.index}.{tag_phase}.mb{mb}.{'to' if send else 'from'}{peer}"
            ntype = pb.COMM_SEND_NODE if send else pb.COMM_RECV_NODE
            ids.append(self._add(name, ntype, data, [], 0, self._tags(layer, tag_phase, mb) + extra))
        if s.what == "kv":
            self.ring_recv = ids[0]
        self.ring_queue.append(ids[::-1])
        return pred

    def all_to_all(self, s: AllToAll, pred: int | None, layer: int, mb: int, phase: str) -> None:
        """A MoE all-to-all as P2P pairs with the EP peers: receives posted early, sends after `pred`; the
        next compute op waits for all of them (the all-to-all returns when its sends and receives are done)."""
        g = self.gen
        assert self.ep is not None
        members, pg_name = self.ep[2], self.ep[4]
        if s.group:  # one of DeepEP's legs (tracegen.moe_ops.deepep_legs): its own group's peers
            members, pg_name = g.flex_of[self.rank][1][s.group]
        tag_phase = phase or self._phase
        if s.even or s.kind != "all_to_all":
            # balanced: one ALL_TO_ALL collective over the group (members x the bytes per peer); or the
            # allgather dispatcher's AllGather / ReduceScatter of Chakra size s.size
            ctype, size = pb.ALL_TO_ALL, len(members) * s.even
            if s.kind != "all_to_all":
                ctype, size = COMM_KIND[s.kind], s.size
            extra = [
                g.attr(A.COMM_TYPE, ctype),
                g.attr(A.COMM_SIZE, size),
                g.attr(A.PG_NAME, pg_name),
            ]
            name = f"L{layer}.{s.op}{'.' + s.group if s.group else ''}.{tag_phase}.mb{mb}"
            data = [] if pred is None else [pred]
            self.waits.append(
                self._add(name, pb.COMM_COLL_NODE, data, [], 0, self._tags(layer, tag_phase, mb) + extra)
            )
            return
        tag = EP_TAG_BASE + A2A_SLOTS * (layer * g.dep.micro_batches + mb) + A2A_INDEX[(s.which, tag_phase)]
        self._a2a = "first"
        for send, pairs in ((False, s.recvs), (True, s.sends)):
            for q, size in pairs:
                peer = members[q]
                src, dst = (self.rank, peer) if send else (peer, self.rank)
                extra = [
                    g.attr(A.COMM_SRC, src),
                    g.attr(A.COMM_DST, dst),
                    g.attr(A.COMM_TAG, tag),
                    g.attr(A.COMM_SIZE, size),
                ]
                name = f"L{layer}.{s.op}.{tag_phase}.mb{mb}.{'to' if send else 'from'}{peer}"
                ntype = pb.COMM_SEND_NODE if send else pb.COMM_RECV_NODE
                data = [pred] if send and pred is not None else []
                self.waits.append(
                    self._add(name, ntype, data, [], 0, self._tags(layer, tag_phase, mb) + extra)
                )
        self._a2a = ""

    def steps(
        self, steps: list[MoeStep], pred: int | None, layer: int, mb: int, phase: str = ""
    ) -> int | None:
        label = f"L{layer}." if layer else ""
        plain = self._plain.get(id(steps))
        if plain is None:  # no CP, MoE all-to-all, TE overlap or overlapped dgrad: each step one node
            ok = not any(isinstance(s, RingXfer | RingWait | CpComm | AllToAll) for s in steps)
            ok = ok and not any(self._dgrad_pair(steps, i) for i in range(len(steps)))
            plain = self._plain[id(steps)] = (steps, ok)
        if plain[1] and not self.tp_overlap:
            for s in steps:
                pred = self.step(s, pred, layer, mb, label, phase)
            return pred
        i = 0
        while i < len(steps):
            s = steps[i]
            if isinstance(s, RingXfer | RingWait | CpComm):
                pred = self.cp_step(s, pred, layer, mb, phase)
                i += 1
                continue
            if isinstance(s, AllToAll):
                # a forward all-to-all inside a backward pass: the `moe` recompute module's
                ph = phase or (RECOMPUTE if s.phase == "fwd" and self._phase == "bwd" else "")
                self.moe_sync(s, pred, ph)
                self.all_to_all(s, pred, layer, mb, ph)
                i += 1
                continue
            method = self._tp_overlap_method(steps, i)
            if method:
                pred = self.overlapped(method, steps[i], steps[i + 1], pred, layer, mb, label, phase)
                i += 2
                continue
            if self._dgrad_pair(steps, i):
                pred = self.dgrad_overlapped(steps[i], steps[i + 1], pred, layer, mb, label, phase)
                i += 2
                continue
            pred = self.step(steps[i], pred, layer, mb, label, phase)
            i += 1
        return pred

    # -- tensor-parallel communication overlap (tp_comm_overlap: Transformer Engine's userbuffers) --------
    def _tp_overlap_method(self, steps: list[Step], i: int) -> str:
        """TE's overlap method for steps[i] and steps[i + 1], or "" when they are not overlapped.

        Only the SP collectives next to the linear layers TE runs (LINEAR_OPS): an AllGather before a GEMM
        ("ring_exchange"), a ReduceScatter after a forward GEMM ("pipeline") or a backward GEMM ("bulk").
        """
        if not self.tp_overlap or i + 1 >= len(steps):
            return ""
        s, nxt = steps[i], steps[i + 1]
        if isinstance(s, Comm) and s.kind == "all_gather" and isinstance(nxt, Op) and nxt.op in LINEAR_OPS:
            return "ring_exchange"
        if (
            isinstance(s, Op)
            and s.op in LINEAR_OPS
            and isinstance(nxt, Comm)
            and nxt.kind == "reduce_scatter"
        ):
            return "pipeline" if s.phase == "fwd" else "bulk"
        return ""

    def overlapped(
        self, method: str, a: Step, b: Step, pred: int | None, layer: int, mb: int, label: str, phase: str
    ) -> int:
        """A TP collective and its neighbouring GEMM as chunks: GEMM chunks in order on compute, collective
        chunks in order on the TP stream, each GEMM chunk waiting for the collective chunk it consumes (or
        each collective chunk for the GEMM chunk it reduces). Returns the node the next step consumes.

        ring_exchange (AllGather then GEMM, k = TP chunks): GEMM chunk 0 runs on the local shard while the
        TP - 1 exchange steps (each 1/(TP-1) of the AllGather) arrive, chunk j > 0 after step j.
        pipeline (GEMM then ReduceScatter, k = 4): ReduceScatter chunk i after GEMM chunk i.
        bulk (backward GEMM then its dgrad ReduceScatter): the GEMM as dgrad and wgrad halves; the
        ReduceScatter after the dgrad half, under the wgrad half.
        """
        gemm, comm = (b, a) if method == "ring_exchange" else (a, b)
        assert isinstance(gemm, Op) and isinstance(comm, Comm)
        k = self.st.dg.tp if method == "ring_exchange" else TE_PIPELINE_SPLITS if method == "pipeline" else 2
        tags = (self._tag_of(gemm, phase), self._tag_of(comm, phase))
        ov = _Overlap(gemm, comm, k, layer, mb, label, *tags, method)
        chain = [] if self.frontier is None or self.frontier == pred else [self.frontier]
        after = [] if pred is None else [pred]
        if method == "ring_exchange":
            self._gemm_chunk(ov, 0, after + self._take_waits(), chain)
            prev: list[int] = chain
            for j in range(1, k):
                c = self._comm_chunk(ov, j - 1, k - 1, after, prev)  # the TP - 1 exchange steps
                prev = [c]
                self._gemm_chunk(ov, j, [c], [ov.gemm_ids[j - 1]])
            self.frontier = ov.gemm_ids[-1]
            return ov.gemm_ids[-1]
        if method == "pipeline":
            prev = []
            for i in range(k):
                ctrl = [ov.gemm_ids[i - 1]] if i else chain
                self._gemm_chunk(ov, i, after + self._take_waits(), ctrl)
                c = self._comm_chunk(ov, i, k, [ov.gemm_ids[i]], prev)
                prev = [c]
            self.frontier = c
            return c
        self._gemm_chunk(ov, 0, after + self._take_waits(), chain)  # bulk: dgrad half
        c = self._comm_chunk(ov, 0, 1, [ov.gemm_ids[0]], [])
        self.frontier = self._gemm_chunk(ov, 1, [], [ov.gemm_ids[0]])  # wgrad half, under the ReduceScatter
        return c

    def _dgrad_pair(self, steps: list[Step], i: int) -> bool:
        """steps[i] is a column-parallel linear's backward GEMM and steps[i + 1] its input gradient's TP
        collective, which the framework runs under the weight-gradient GEMM (`dgrad_overlap`)."""
        if not self.dgrad_overlap or i + 1 >= len(steps):
            return False
        s, nxt = steps[i], steps[i + 1]
        return (
            isinstance(s, Op)
            and s.phase == "bwd"
            and s.kernels == 2  # a backward GEMM: dgrad and wgrad (ops._gemm)
            and isinstance(nxt, Comm)
            and nxt.op in COLUMN_TP_IN
            and nxt.kind in ("reduce_scatter", "all_reduce")
        )

    def dgrad_overlapped(
        self,
        a: Step,
        b: Step,
        pred: int | None,
        layer: int,
        mb: int,
        label: str,
        phase: str,
        defer: bool = False,
    ) -> int:
        """A column-parallel linear's backward as Megatron's LinearWithGradAccumulationAndAsyncCommunication
        and TE's _LayerNormLinear run it (Framework.sp_dgrad_overlap / async_dgrad_allreduce): under SP the
        input's AllGather again (tracegen.ops.sp_regather), issued with the dgrad half; the dgrad's
        ReduceScatter (or AllReduce) after the dgrad half and the gather; the wgrad half after the gather, under
        the ReduceScatter. Returns the collective (the next step's input); the wgrad half is the frontier.
        `defer` (defer_embedding_wgrad_compute, the LM head): the dgrad half and its collective only; the
        gather and the wgrad half wait for the pipeline flush (drain_wgrad)."""
        gemm, comm = a, b
        assert isinstance(gemm, Op) and isinstance(comm, Comm)
        tags = (self._tag_of(gemm, phase), self._tag_of(comm, phase))
        ov = _Overlap(gemm, comm, 2, layer, mb, label, *tags, "async")
        chain = [] if self.frontier is None or self.frontier == pred else [self.frontier]
        after = [] if pred is None else [pred]
        gathered: list[int] = []
        gov: _Overlap | None = None
        if comm.kind == "reduce_scatter":
            gather = self._regather.get(comm.op)
            if gather is None:
                gather = self._regather[comm.op] = sp_regather(self.ctx, comm.op)
            gov = _Overlap(gemm, gather, 1, layer, mb, label, *tags, "async")
        if defer:
            self._gemm_chunk(ov, 0, after + self._take_waits(), chain)  # dgrad half
            c = self._comm_chunk(ov, 0, 1, [ov.gemm_ids[0]], [])
            self.tp_async.append(c)
            self.tp_async_of[c] = (comm.kind, comm.size)
            self.wgrad_deferred.append((ov, gov))
            return c
        if gov is not None:
            gathered = [self._comm_chunk(gov, 0, 1, after, chain)]
            self.tp_async.append(gathered[0])
            self.tp_async_of[gathered[0]] = (gather.kind, gather.size)
        self._gemm_chunk(ov, 0, after + self._take_waits(), chain)  # dgrad half, under the gather
        c = self._comm_chunk(ov, 0, 1, [ov.gemm_ids[0], *gathered], [])
        self._gemm_chunk(ov, 1, gathered, [ov.gemm_ids[0]])  # wgrad half, under the collective
        self.tp_async.append(c)
        self.tp_async_of[c] = (comm.kind, comm.size)
        return c

    # -- defer_embedding_wgrad_compute: the LM head's weight gradients after the pipeline flush ----------
    def defers(self, mb: int) -> bool:
        """Megatron-Core defers this micro-batch's LM-head wgrad GEMM: the last stage's output layer appends
        its input and output gradient to its buffers while fewer than wgrad_deferral_limit are held (0: no
        limit; tensor_parallel/layers.py ColumnParallelLinear.forward and
        LinearWithGradAccumulationAndAsyncCommunication.backward, core_r0.11.0 791b70e031). The buffers are
        cleared each iteration and the output layer runs once per micro-batch, in micro-batch order."""
        limit = self.defer_limit
        return limit is not None and (limit == 0 or mb < limit)

    def head_dgrad_only(self, pred: int | None, mb: int) -> int | None:
        """The head's backward with the LM head's wgrad deferred: the dgrad half of its backward GEMM (its
        input gradient's TP collective after it, as before); no SP re-gather of its input (Megatron gathers
        it only when it computes the wgrad)."""
        steps = self.head["bwd"] if self.head is not None else []
        i = 0
        while i < len(steps):
            s = steps[i]
            if isinstance(s, Op) and s.op == "lm_head":
                if self._dgrad_pair(steps, i):
                    pred = self.dgrad_overlapped(s, steps[i + 1], pred, 0, mb, "", "", defer=True)
                    i += 2
                    continue
                ov = _Overlap(s, None, 2, 0, mb, "", self._tag_of(s, ""), "", "defer")
                chain = [] if self.frontier is None or self.frontier == pred else [self.frontier]
                pred = self._gemm_chunk(ov, 0, ([] if pred is None else [pred]) + self._take_waits(), chain)
                self.wgrad_deferred.append((ov, None))
            else:
                pred = self.step(s, pred, 0, mb, "")
            i += 1
        return pred

    def drain_wgrad(self) -> None:
        """The deferred LM-head wgrad GEMMs after the last backward, before the gradients are finalized
        (schedules.py finish_embedding_wgrad_compute -> utils.py drain_embedding_wgrad_compute, core_r0.11.0):
        under SP each GEMM's input is all-gathered over TP first, double-buffered: gather 0, then per
        micro-batch i gather i + 1 (issued after the compute enqueued so far: GEMM i - 1, as NCCL's stream
        waits for the current stream) and GEMM i (the wgrad half of the head's backward GEMM) after gather i."""
        items, self.wgrad_deferred = self.wgrad_deferred, []
        if not items:
            return
        gathers: list[int | None] = []

        def issue(i: int) -> None:
            gov = items[i][1]
            if gov is None:
                gathers.append(None)
                return
            prev = [x for x in gathers[-1:] if x is not None]
            nid = self._comm_chunk(gov, 0, 1, [self.frontier] if self.frontier is not None else [], prev)
            assert gov.comm is not None
            self.tp_async.append(nid)
            self.tp_async_of[nid] = (gov.comm.kind, gov.comm.size)
            gathers.append(nid)

        issue(0)
        for i, (ov, _) in enumerate(items):
            if i + 1 < len(items):
                issue(i + 1)
            data = [gathers[i]] if gathers[i] is not None else []
            self._gemm_chunk(ov, 1, data, [self.frontier] if self.frontier is not None else [])

    def _gemm_chunk(self, ov: _Overlap, i: int, data: list[int], ctrl: list[int]) -> int:
        """Chunk i of ov.k of the GEMM: 1/k of its FLOPs, bytes and exact duration (the parts sum to the
        whole)."""
        g, s, k = self.gen, ov.gemm, ov.k
        key = (id(s), k, i)
        tail = self._chunk_tail.get(key)
        if tail is None:  # (ns, micros, the attribute bytes after the _tags), once per op and chunk
            ns = part(g.duration_ns(self.gpu, s), k, i)
            extra = [g.attr(A.NUM_OPS, part(s.flops, k, i)), g.attr(A.TENSOR_SIZE, part(s.bytes, k, i))]
            extra.append(g.attr(A.DURATION_NS, ns))
            micros = max(1, (ns + 500) // 1000) if ns else 0
            tail = self._chunk_tail[key] = (ns, micros, g.attrs_bytes(extra), s)
        ns, micros, extra_bytes, _ = tail
        head = self._head(ov.layer, ov.gemm_tag, ov.mb)
        name = f"{ov.label}{s.op}.{ov.gemm_tag}.mb{ov.mb}.chunk{i}"
        self._cost = (1, ns)
        nid = self._add(name, pb.COMP_NODE, data, ctrl, micros, head + extra_bytes)
        ov.gemm_ids.append(nid)
        self.comp_ops[nid] = (s, i, k)
        # TE launches the GEMM on the SMs its userbuffers kernels leave (pipeline: every chunk; bulk: the
        # wgrad half, under the ReduceScatter).
        if ov.method == "pipeline" or (ov.method == "bulk" and i == 1):
            te_name = TE_LAYER_NAMES.get((s.op, s.phase))
            self.te_busy[nid] = self.gen.dep.tp_overlap_sms.get(te_name, TE_UB_SMS) if te_name else TE_UB_SMS
        self.frontier = nid
        return nid

    def _comm_chunk(self, ov: _Overlap, i: int, k: int, data: list[int], ctrl: list[int]) -> int:
        """Chunk i of k of the TP collective (1/k of its bytes) on the TP group."""
        g, c = self.gen, ov.comm
        assert c is not None
        key = (id(c), k, i)
        tail = self._chunk_tail.get(key)
        if tail is None:
            extra = [
                g.attr(A.COMM_TYPE, COMM_KIND[c.kind]),
                g.attr(A.COMM_SIZE, part(c.size, k, i)),
                g.attr(A.PG_NAME, self.tp_pg),
            ]
            tail = self._chunk_tail[key] = (0, 0, g.attrs_bytes(extra), c)
        head = self._head(ov.layer, ov.comm_tag, ov.mb)
        name = f"{ov.label}{c.op}.{ov.comm_tag}.mb{ov.mb}.chunk{i}"
        nid = self._add(name, pb.COMM_COLL_NODE, data, ctrl, 0, head + tail[2])
        self.tp_ids.append(nid)
        return nid

    def p2p(
        self,
        send: bool,
        peer: int,
        size: int,
        layer: int,
        mb: int,
        direction: int,
        data: Sequence[int],
        boundary: int = 0,
    ) -> int:
        g = self.gen
        phase = "fwd" if direction == ACT_TAG else "bwd"
        what = "act" if direction == ACT_TAG else "grad"
        src, dst = (self.rank, peer) if send else (peer, self.rank)
        extra = [
            g.attr(A.COMM_SRC, src),
            g.attr(A.COMM_DST, dst),
            g.attr(A.COMM_TAG, 2 * (boundary * self.gen.dep.micro_batches + mb) + direction),
            g.attr(A.COMM_SIZE, size),
            g.attr(A.PP_BOUNDARY, 1),
        ]
        name = f"{'send' if send else 'recv'}_{what}.{phase}.mb{mb}.{'to' if send else 'from'}{peer}"
        ntype = pb.COMM_SEND_NODE if send else pb.COMM_RECV_NODE
        if self.exchange is None:
            if not self.ctx.fw.deepspeed_pipe:
                return self._add(name, ntype, data, [], 0, self._tags(layer, phase, mb) + extra)
            # DeepSpeed's blocking p2p.send / p2p.recv: after the kernels before it, before the ones after it
            ctrl = [] if self.frontier is None or self.frontier in data else [self.frontier]
            self.frontier = self._add(name, ntype, data, ctrl, 0, self._tags(layer, phase, mb) + extra)
            return self.frontier
        # Without interleaving Megatron exchanges with one neighbour per call (send_forward_recv_backward,
        # send_backward_recv_forward; warm-up's send_forward and recv_forward are two calls); interleaved, one
        # call takes every transfer of a schedule step (send_forward_recv_forward, ...).
        side = "next" if send == (direction == ACT_TAG) else "prev"
        if self.exchange and side != self.exchange_side and len(self.st.chunks) == 1:
            self.end_exchange()
        self.exchange_side, self.in_p2p = side, True
        nid = self._add(name, ntype, data, [], 0, self._tags(layer, phase, mb) + extra)
        self.in_p2p = False
        self.exchange.append(nid)
        return nid

    def end_exchange(self) -> None:
        """Megatron-LM 2021/2022's _communicate waits for every request of a pipeline exchange and then
        runs torch.cuda.synchronize() (megatron/p2p_communication.py of de7dc40f88 and d898a8991d): the
        host waits for the exchange's transfers before it launches anything after them."""
        assert self.exchange
        self.host_sync(self.exchange, 1 + (TIMER_SYNCS_EXCHANGE if self.ctx.fw.step_timers else 0))
        self.exchange = []

    def timer_sync(self, syncs: int, kernels: Sequence[int | None]) -> None:
        """Megatron-LM 2021/2022's timers at a pass's start or end (Framework.step_timers, TIMER_SYNCS_*):
        the host waits for the work launched so far (`kernels`) `syncs` times back to back."""
        if self.hostline is None or not self.ctx.fw.step_timers:
            return
        wait = sorted({k for k in kernels if k is not None})
        if not wait:  # nothing launched yet: the host is ahead
            return
        if self.exchange:  # the exchange's own synchronize comes first
            self.end_exchange()
        self.host_sync(wait, syncs)

    def layer_sync(self, kernels: Sequence[int | None]) -> None:
        """DeepSpeed's CheckpointFunction with synchronize_checkpoint_boundary (the spec's
        synchronize_each_layer, GPT-NeoX's synchronize-each-layer): torch.cuda.synchronize() at the start
        and end of a full-recompute unit's forward and of its backward (deepspeed/runtime/
        activation_checkpointing/checkpointing.py, EleutherAI/DeeperSpeed eb7f5cff36): the host waits for
        the work launched so far (`kernels`)."""
        if self.hostline is None or not self.gen.dep.synchronize_each_layer:
            return
        wait = sorted({k for k in kernels if k is not None})
        if not wait:  # nothing launched yet: the host is ahead
            return
        if self.exchange:  # a pipeline exchange's own synchronize comes first
            self.end_exchange()
        self.host_sync(wait)

    # -- boundary transfers --------------------------------------------------------------------------
    def _scatter_gather(self, other_tp: int) -> bool:
        """Megatron-LM 2021/2022 send only this TP rank's 1/TP chunk across the boundary (both stages at
        one TP degree > 1, no sequence parallelism, TP dividing the tensor's elements: d898a8991d's rule;
        the 2021 code had no sequence parallelism and needs the division for its reshape)."""
        c, tp = self.ctx, self.st.dg.tp
        return (
            c.fw.pp_scatter_gather
            and tp > 1
            and other_tp == tp
            and not c.sp
            and c.tokens * c.m.hidden % tp == 0
        )

    def _p2p_size(self, src_tp: int, dst_tp: int, direction: int = ACT_TAG) -> int:
        """Bytes of one boundary transfer (ACT_TAG | GRAD_TAG) from a stage at TP `src_tp` to one at `dst_tp`."""
        c = self.ctx
        if src_tp == dst_tp and self._scatter_gather(src_tp) and not self._grad_whole(direction):
            # this rank's 1/TP chunk of the tensor
            return c.tokens * c.m.hidden // src_tp * c.b
        tokens = -(-c.tokens // src_tp) if c.sp and src_tp > 1 else c.tokens
        return tokens * c.m.hidden * c.b

    def _grad_whole(self, direction: int) -> bool:
        """A gradient that crosses the boundary whole though activations are split (Framework.pp_grad_whole)."""
        return direction == GRAD_TAG and self.ctx.fw.pp_grad_whole

    def gather_received(self) -> None:
        """The all-gathers over the TP group that rebuild the scatter-gathered receives of the exchange
        just posted (mpu.gather_split_1d_tensor, after _communicate's synchronize: the host sync of the
        exchange comes first). Chained on the TP stream like the layer's TP collectives; the size is the
        per-rank input, as every all-gather here (Chakra's convention)."""
        g = self.gen
        for rid, size, layer, phase, mb in self.sg_pending:
            extra = [
                g.attr(A.COMM_TYPE, pb.ALL_GATHER),
                g.attr(A.COMM_SIZE, size),
                g.attr(A.PG_NAME, self.tp_pg),
            ]
            ctrl = [] if self.frontier in (None, rid) else [self.frontier]
            what = "act" if phase == "fwd" else "grad"
            gid = self._add(f"pp_gather_{what}.{phase}.mb{mb}", pb.COMM_COLL_NODE, [rid], ctrl, 0,
                            self._tags(layer, phase, mb) + extra)  # fmt: skip
            self.tp_ids.append(gid)
            self.sg_gather[rid] = self.frontier = gid
        self.sg_pending = []

    def recv_from(
        self, ch: _Chunk, side: str, layer: int, mb: int, direction: int, boundary: int = 0
    ) -> int | None:
        """Post the receive of this rank's slice from the stage on `side` ("prev" | "next") of model chunk
        `ch` (None when the mapping sends it nothing).

        `boundary` is the model chunk of the forward sender across this boundary (0 without interleaving).
        """
        other = ch.prev if side == "prev" else ch.next
        assert other is not None
        ids = []
        size = self._p2p_size(other.tp, self.st.dg.tp, direction)
        for k, s in enumerate(peer_locals(self.st.dg.tp, other.tp, self.local, False)):
            ids.append(self.p2p(False, other.ranks[s], size, layer, mb, direction, [], boundary))
            self.p2p_log.append((ids[-1], False, ch.index, side, k))
        if ids and self._scatter_gather(other.tp) and not self._grad_whole(direction):
            self.sg_pending.append((ids[0], size, layer, "fwd" if direction == ACT_TAG else "bwd", mb))
        return ids[0] if ids else None

    def pass_recv(self, kind: str, ch: _Chunk, mb: int) -> int | None:
        """The receive a pass waits for: posted at an earlier exchange (`post_recvs`) or here."""
        key = (kind, ch.index, mb)
        if key in self.posted:
            got = self.posted.pop(key)
        else:
            if kind == FWD:
                got = self.recv_from(ch, "prev", ch.start, mb, ACT_TAG, ch.prev_chunk)
                self.send_grad()  # DeepSpeed: the previous slot's gradient after this input arrived
            else:
                got = self.recv_from(ch, "next", ch.end, mb, GRAD_TAG, ch.index)
                self.regather_output(got, ch, mb)
            self.gather_received()
        return got if got is None else self.sg_gather.pop(got, got)

    def post_recvs(self, step: list[tuple[str, int, int]]) -> None:
        """Post the receives the passes of a schedule step wait for, ahead of them."""
        for kind, c, mb in step:
            ch = self.st.chunks[c]
            if (ch.prev if kind == FWD else ch.next) is not None:
                key = (kind, c, mb)
                self.posted[key] = (
                    self.recv_from(ch, "prev", ch.start, mb, ACT_TAG, ch.prev_chunk)
                    if kind == FWD
                    else self.recv_from(ch, "next", ch.end, mb, GRAD_TAG, ch.index)
                )
        self.gather_received()

    def send_grad(self) -> None:
        """Send the gradient a backward left for later (Framework.deepspeed_pipe), if any."""
        if self.grad_send is not None:
            args, self.grad_send = self.grad_send, None
            self.send_to(*args)

    def regather_output(self, recv: int | None, ch: _Chunk, mb: int) -> None:
        """DeepSpeed's _exec_backward_pass under TP: the stage's own output, kept as its 1/TP part since the
        send, is all-gathered again over the TP group (part_output.full()) before the received gradient's
        all-gather; chained like the other TP collectives, the per-rank input as its size."""
        if not self.ctx.fw.deepspeed_pipe or recv is None or not self._scatter_gather(ch.next.tp):
            return
        g = self.gen
        extra = [
            g.attr(A.COMM_TYPE, pb.ALL_GATHER),
            g.attr(A.COMM_SIZE, self._p2p_size(self.st.dg.tp, ch.next.tp)),
            g.attr(A.PG_NAME, self.tp_pg),
        ]
        ctrl = [] if self.frontier is None else [self.frontier]
        gid = self._add(f"pp_gather_out.bwd.mb{mb}", pb.COMM_COLL_NODE, [self.last_fwd[(ch.index, mb)]], ctrl,
                        0, self._tags(ch.end, "bwd", mb) + extra)  # fmt: skip
        self.tp_ids.append(gid)
        self.frontier = gid

    def send_to(
        self,
        ch: _Chunk,
        side: str,
        layer: int,
        mb: int,
        direction: int,
        after: int | list[int],
        boundary: int = 0,
    ) -> None:
        if self.held is not None:  # sent at the end of the schedule step (interleaved_steps)
            self.held.append((ch, side, layer, mb, direction, after, boundary))
            return
        other = ch.prev if side == "prev" else ch.next
        assert other is not None
        size = self._p2p_size(self.st.dg.tp, other.tp, direction)
        data = after if isinstance(after, list) else [after]
        for k, d in enumerate(peer_locals(self.st.dg.tp, other.tp, self.local, True)):
            nid = self.p2p(True, other.ranks[d], size, layer, mb, direction, data, boundary)
            self.p2p_log.append((nid, True, ch.index, side, k))

    # -- passes ---------------------------------------------------------------------------------------
    def forward(self, ch: _Chunk, mb: int) -> None:
        self._phase = "fwd"
        pred = None
        if ch.prev is not None:
            pred = self.pass_recv(FWD, ch, mb)
        self.timer_sync(TIMER_SYNCS_FORWARD_START, (self.frontier, pred))
        self.batch_input(ch, mb)
        if ch.first and self.emb is not None:
            self.enter(EMB, mb)
            pred = self.steps(self.emb["fwd"], pred, 0, mb)
        units = self.recompute_units(ch) if self.recompute == "full" else {}
        starts = {u.start for u in units.values()}
        for layer in range(ch.start, ch.end + 1):
            if layer in starts:  # CheckpointFunction.forward begins
                self.layer_sync((self.frontier, pred))
            self.enter(layer, mb)
            pred = self.steps(self.layer_of(layer, "fwd"), pred, layer, mb)
            if layer in units:  # ... and ends
                self.layer_sync((pred,))
        if self.amax[(ch.index, "fwd")]:  # at the exit of the chunk's fp8_autocast
            pred = self.steps(self.amax[(ch.index, "fwd")], pred, ch.end, mb)
        if ch.last and self.head is not None:
            self.enter(HEAD, mb)
            pred = self.steps(self.head["fwd"], pred, 0, mb)
        assert pred is not None
        self.last_fwd[(ch.index, mb)] = pred
        self.timer_sync(TIMER_SYNCS_PASS_END, (pred,))
        if ch.next is not None:
            self.send_to(ch, "next", ch.end, mb, ACT_TAG, pred, ch.index)

    def batch_input(self, ch: _Chunk, mb: int) -> None:
        """The micro-batch's batch onto the GPU before the chunk's forward (tracegen.batch_input): the
        host-to-device copy on the compute stream after the work before it, then the broadcasts over the TP
        group one after another (the NCCL stream's order); the forward's first kernel follows the last."""
        g = self.gen
        work = batch_work(
            self.ctx.fw.batch_input, self.st.dg.micro_batch, g.dep.seq_len, self.st.dg.tp, ch.first, ch.last
        )
        if work.copy_bytes:
            ns = h2d_ns(work.copy_bytes, g.gpus[self.gpu])
            if self.hostline is not None:
                self._cost = (1, ns)
            attrs = self._tags(0, "fwd", mb) + [g.attr(A.DURATION_NS, ns)]
            ctrl = [] if self.frontier is None else [self.frontier]
            micros = max(1, (ns + 500) // 1000)
            self.frontier = self._add(f"batch_h2d.fwd.mb{mb}", pb.COMP_NODE, [], ctrl, micros, attrs)
        for tensor, size in work.broadcasts:
            extra = [
                g.attr(A.COMM_TYPE, pb.BROADCAST),
                g.attr(A.COMM_SIZE, size),
                g.attr(A.PG_NAME, self.tp_pg),
            ]
            data = [] if self.frontier is None else [self.frontier]
            nid = self._add(f"batch_bcast_{tensor}.fwd.mb{mb}", pb.COMM_COLL_NODE, data, [], 0,
                            self._tags(0, "fwd", mb) + extra)  # fmt: skip
            self.tp_ids.append(nid)
            self.frontier = nid

    def recompute_units(self, ch: _Chunk) -> dict[int, range]:
        """Full recompute: the chunk's units by the spec's recompute_method (tracegen.spec.recompute_units);
        a unit's forward is recomputed, as a whole, right before the backward of its last layer."""
        dep = self.gen.dep
        return recompute_units(dep.recompute_method, dep.recompute_layers, ch.start, ch.end)

    def backward(self, ch: _Chunk, mb: int, sync: bool) -> None:
        self._phase = "bwd"
        pred: int | None = self.last_fwd[(ch.index, mb)]
        self.send_grad()  # DeepSpeed: a gradient still held leaves before this backward's receive
        if ch.next is not None:
            pred = self.pass_recv(BWD, ch, mb)
        self.timer_sync(TIMER_SYNCS_BACKWARD_START, (self.frontier, pred))
        if sync:
            self.sync_mb = mb  # the micro-batch whose backward fills the buckets (_bucket_prep's tag)
        m, sh = self.gen.model, self.ctx.sh
        self.bwd_chunk = ch.index
        if ch.last and self.head is not None:
            self.enter(HEAD, mb)
            if self.defers(mb):
                pred = self.head_dgrad_only(pred, mb)
            else:
                pred = self.steps(self.head["bwd"], pred, 0, mb)
            self.fsdp_reduce(HEAD, mb)
            if sync:  # a tied matrix held with the embedding joins the bucket at the embedding's backward
                self.bucket_add(head_rank_params(m, sh, self.emb is not None), 0)
        layer_grad = rank_params(m, sh, 1, False, False)
        units = self.recompute_units(ch) if self.recompute == "full" else {}
        starts = {u.start for u in units.values()}
        for layer in range(ch.end, ch.start - 1, -1):
            if layer in units:  # CheckpointFunction.backward begins, before the recompute
                self.layer_sync((self.frontier, pred))
            for again in units.get(layer, ()):
                self.enter(again, mb)
                fwd = self.layer_of(again, "fwd")
                if again == layer and self.gen.dep.recompute_early_stop:
                    fwd = early_stopped(fwd)
                pred = self.steps(fwd, pred, again, mb, RECOMPUTE)
            self.enter(layer, mb)
            pred = self.steps(self.layer_of(layer, "bwd"), pred, layer, mb)
            if layer in starts:  # ... and ends after the unit's backward
                self.layer_sync((pred,))
            self.fsdp_reduce(layer, mb)
            if sync:
                if self.ep is not None or m.mla is not None:
                    dense, expert = layer_split(m, sh, layer, self.ep[0] if self.ep else 1)
                else:
                    dense, expert = layer_grad, 0
                self.expert_pending += expert
                dense_fp8, expert_fp8 = self.fp8_split(layer)
                self.expert_pending_fp8 += expert_fp8
                self.bucket_add(dense, layer, dense_fp8)
        if self.amax[(ch.index, "bwd")]:  # after the backward of the chunk's first FP8 module
            pred = self.steps(self.amax[(ch.index, "bwd")], pred, ch.start, mb)
        if ch.first and self.emb is not None:
            self.enter(EMB, mb)
            pred = self.steps(self.emb["bwd"], pred, 0, mb)
            self.fsdp_reduce(EMB, mb)
            if sync:
                self.bucket_add(embedding_rank_params(m, sh), 0)
        pred = self.accumulate_grads(ch, mb, pred)
        self.timer_sync(TIMER_SYNCS_PASS_END, (pred,))
        if sync:
            self.bucket_flush(0)
            self.expert_flush()
        if ch.prev is not None and pred is not None:
            if self.ctx.fw.deepspeed_pipe:  # sent at the next forward's receive (send_grad)
                self.grad_send = (ch, "prev", ch.start, mb, GRAD_TAG, pred, ch.prev_chunk)
            else:
                self.send_to(ch, "prev", ch.start, mb, GRAD_TAG, pred, ch.prev_chunk)

    def accumulate_grads(self, ch: _Chunk, mb: int, pred: int | None) -> int | None:
        """The framework's per-micro-batch gradient accumulation after a chunk's backward, before its send."""
        autograd = self.ctx.fw.autograd_grad_accum and self.gpath is None and mb > 0
        if not self.hp_grad_copy and self.gpath is None and not autograd:
            return pred
        m, sh = self.gen.model, self.ctx.sh
        emb, head = ch.first and self.emb is not None, ch.last and self.head is not None
        layers = ch.end - ch.start + 1
        params, tensors = rank_params(m, sh, layers, emb, head), param_tensors(m, layers, emb, head)
        if self.hp_grad_copy:
            # DeepSpeed's BF16_Optimizer: this micro-batch's gradients into the FP32 buffer, before the
            # gradient is sent to the previous stage (the pipeline engine's _exec_backward_pass).
            pred = self.steps([hp_grad_accumulation(params, tensors)], pred, 0, mb)
        if self.gpath is not None:
            # Megatron-LM 2021/2022: this micro-batch's gradients into the accumulated ones, inside
            # torch.autograd.backward and so before the send (tracegen.grad_path).
            acc = accumulation_op(self.gpath, params, tensors, mb == 0)
            if acc is not None:
                pred = self.steps([acc], pred, 0, mb)
        if autograd:
            # autograd's AccumulateGrad into the parameters' .grad (Framework.autograd_grad_accum), from the
            # second micro-batch on: read both gradients, write the sum, in dtype; a kernel per tensor.
            b = self.ctx.b
            op = Op("grad_accum", "bwd", params, 3 * b * params, (params,), False, kernels=tensors)
            pred = self.steps([op], pred, 0, mb)
        return pred

    # -- data-parallel gradient buckets (homogeneous deployments only) --------------------------------
    def bucket_add(self, params: int, layer: int, fp8: int = 0) -> None:
        """Gradients of `params` (`fp8` of them FP8 linear weights under fp8_params) became ready at the
        frontier; close the bucket once it is full.

        Without overlap_grad_reduce buckets never close early: Megatron-Core then sets bucket_size to None
        (megatron/core/distributed/distributed_data_parallel.py), one bucket per model chunk.
        """
        self.pending += params
        self.pending_fp8 += fp8
        if self.splits(self.bwd_chunk) and self.pending * self.grad_bytes >= self.gen.dep.dp_bucket_bytes:
            self.bucket_flush(layer)

    def splits(self, chunk: int) -> bool:
        """Whether model chunk `chunk`'s gradients close a bucket at every `dp_bucket_bytes` (else the chunk
        is one bucket): overlap_grad_reduce on, and not a chunk Megatron-Core's DDP builds with bucket_size
        None (distributed_data_parallel.py: `if pp_rank > 0` or `if disable_bucketing`; training.py get_model
        `disable_bucketing=(model_chunk_idx > 0) or overlap_param_gather_with_optimizer_step`, core_r0.9.0
        to core_v0.15.0; 5d745a79cd to core_r0.8.0 without the second term): under
        Framework.first_chunk_buckets only the first stage's chunk 0 is split."""
        if not self.overlap_grad or self.one_bucket or (self.opt_first and chunk == 0):
            return False  # (one_bucket: Megatron-FSDP's optim / optim_grads, one bucket of the rank's parameters)
        return not (self.mcore_ddp and (chunk > 0 or self.st.index > 0))

    def bucket_flush(self, layer: int) -> None:
        """Close the open bucket: an AllReduce of its gradients, or (distributed optimizer) a ReduceScatter
        of the padded bucket whose parameters are all-gathered after the optimizer step. Without
        overlap_grad_reduce the bucket waits for the end of the iteration's backward (flush_deferred)."""
        if self.pending <= 0 or (self.dp_pg is None and not self.dp1_prep()):
            self.pending = self.pending_fp8 = 0
            return
        if self.dist_opt and self.dp_pg is not None and self.sync_final:
            self.buckets.append(self._padded(self.pending))
            self.bucket_fp8.append(self.pending_fp8)
        if self.overlap_grad:
            assert self.frontier is not None
            self._bucket_node(self.pending, layer, self.frontier)
        else:
            self.deferred.append((self.pending, layer))
        self.pending = self.pending_fp8 = 0

    def flush_deferred(self) -> None:
        """overlap_grad_reduce off: every bucket after the whole backward (Megatron's finish_grad_sync)."""
        if self.gpath is not None and self.gpath.pre_reduce_bytes and self.frontier is not None:
            # Megatron-LM 2021/2022's allreduce_gradients: coalesce and divide by DP first (on every rank,
            # DP 1 included: train_step calls it whenever --DDP-impl is local).
            op = pre_reduce_op(self.gpath, self._all_params())
            micros, exact = self.gen.duration(self.gpu, op)
            extra = [self.gen.attr(A.NUM_OPS, op.flops), self.gen.attr(A.TENSOR_SIZE, op.bytes), exact]
            tags = self._tags(0, "opt", NO_MICRO_BATCH)
            self.frontier = self._add(f"{op.op}.opt", pb.COMP_NODE, [self.frontier], [], micros, tags + extra)
        for params, layer in self.deferred:
            assert self.frontier is not None
            self._bucket_node(params, layer, self.frontier)
        self.deferred = []
        for params in self.expert_deferred:
            self._expert_node(params)
        self.expert_deferred = []

    def expert_flush(self) -> None:
        """The routed experts' gradients of the chunk just finished: one AllReduce over the expert-DP group
        (replicas holding the same experts), apart from the dense DP buckets (Megatron-Core keeps expert
        parameters in their own buffer, reduced over the expert-data-parallel group); under the
        distributed optimizer a ReduceScatter of the padded bucket, its shard updated and all-gathered."""
        params, self.expert_pending = self.expert_pending, 0
        fp8, self.expert_pending_fp8 = self.expert_pending_fp8, 0
        if params <= 0 or self.ep is None or not self.ep[3]:
            return
        if self.dist_opt:
            self.expert_buckets.append(dist_opt_bucket(params, self.edp))
            self.expert_bucket_fp8.append(fp8)
        if self.overlap_grad:
            self._expert_node(params)
        else:
            self.expert_deferred.append(params)

    def _expert_node(self, params: int) -> None:
        g = self.gen
        assert self.ep is not None and self.frontier is not None
        ctrl = [self.expert_sync_ids[-1]] if self.expert_sync_ids else []
        if self.dist_opt:
            kind, size, what = (
                pb.REDUCE_SCATTER,
                dist_opt_bucket(params, self.edp) * self.grad_bytes,
                "reducescatter",
            )
        else:
            kind, size, what = pb.ALL_REDUCE, params * self.grad_bytes, "allreduce"
        extra = [g.attr(A.COMM_TYPE, kind), g.attr(A.COMM_SIZE, size), g.attr(A.PG_NAME, self.ep[3])]
        nid = self._add(
            f"expert_dp_grad_{what}.bucket{self.expert_rs}", pb.COMM_COLL_NODE, [self.frontier], ctrl,
            0, self._tags(0, "sync", NO_MICRO_BATCH) + extra,
        )  # fmt: skip
        self.expert_sync_ids.append(nid)
        self.expert_rs += 1

    def dp1_prep(self) -> bool:
        """Whether the framework works on its gradient buckets at DP 1 too (no collective): Megatron-Core's
        NaN check, and core_v0.6.0's scaling by 1.0 (_bucket_prep)."""
        fw = self.ctx.fw
        return fw.bucket_scale == "always" or (fw.bucket_scale != "" and fw.check_for_nan_in_grad)

    def _bucket_prep(self, elems: int, layer: int, after: int) -> int:
        """Megatron-Core's Bucket.start_grad_sync before the bucket's collective (Framework.bucket_scale): the
        NaN check's `grad_data.norm(p=2)` (read the bucket, a multiply-add per element) where
        check_for_nan_in_grad, then `grad_data *= gradient_scaling_factor` (read and write it), on the compute
        stream after the bucket's last gradient; the last becomes the chain's frontier. Returns that node
        (`after` where none runs)."""
        fw = self.ctx.fw
        ops: list[Op] = []
        if fw.bucket_scale and fw.check_for_nan_in_grad:
            ops.append(Op("dp_grad_nan_check", "bwd", 2 * elems, self.grad_bytes * elems, (elems,), False))
        if fw.bucket_scale == "always" or (fw.bucket_scale == "not_one" and self.dp > 1):
            ops.append(Op("dp_grad_scale", "bwd", elems, 2 * self.grad_bytes * elems, (elems,), False))
        for op in ops:
            micros, exact = self.gen.duration(self.gpu, op)
            extra = [self.gen.attr(A.NUM_OPS, op.flops), self.gen.attr(A.TENSOR_SIZE, op.bytes), exact]
            tags = self._tags(layer, "bwd", self.sync_mb)  # in the backward of the bucket's last micro-batch
            name = f"{op.op}.bucket{self.bucket_count}"
            after = self.frontier = self._add(name, pb.COMP_NODE, [after], [], micros, tags + extra)
        return after

    def _padded(self, params: int) -> int:
        """A sharded bucket's elements: Megatron-Core's distributed optimizer pads it (dist_opt_bucket);
        Megatron-FSDP to a multiple of DP (param_and_grad_buffer.py _pad_if_needed; the per-tensor padding
        to the bucket's chunk_size_factor is not modelled)."""
        return fsdp_shard(params, self.dp) * self.dp if self.mfsdp else dist_opt_bucket(params, self.dp)

    def _bucket_node(self, params: int, layer: int, after: int) -> None:
        g = self.gen
        elems = self._padded(params) if self.dist_opt else params
        if not self.mfsdp:  # Megatron-FSDP has no DDP Bucket.start_grad_sync (its scaling: not modelled)
            after = self._bucket_prep(elems, layer, after)
        if self.dp_pg is None:  # DP 1: the NaN check (and core_v0.6.0's scaling by 1.0), no collective
            self.bucket_count += 1
            return
        ctrl = [self.sync_ids[-1]] if self.sync_ids else []  # buckets run in order, as on one NCCL stream
        pg = self.dp_pg
        if self.mfsdp == "optim":
            # Megatron-FSDP `optim`: the gradient buffer is whole on every rank, all-reduced at the last
            # micro-batch (_bucket_group_gradient_reduce: all_reduce of the padded bucket when
            # not gbuf.is_data_distributed); each rank then updates its shard of the main weights.
            kind, size, what = pb.ALL_REDUCE, elems * self.grad_bytes, "dp_grad_allreduce"
        elif self.dist_opt and not self.ctx.fw.sharded_grad_allreduce:
            padded = self._padded(params)
            kind, size, what = pb.REDUCE_SCATTER, padded * self.grad_bytes, "dp_grad_reducescatter"
        else:
            # Without a sharded optimizer, or one that all-reduces each bucket and keeps its shard
            # (Framework.sharded_grad_allreduce): the whole bucket all-reduced; under dp_shard over every DP
            # rank, not the shard group (InternLM 4a3d156 hybrid_zero_optim.py _reduce_and_copy: reduce_tensor
            # over ParallelMode.DATA, the ZERO1 group only for the optimizer state and the broadcasts).
            kind, size, what = pb.ALL_REDUCE, params * self.grad_bytes, "dp_grad_allreduce"
            pg = self.wide_pg or pg
        extra = [g.attr(A.COMM_TYPE, kind), g.attr(A.COMM_SIZE, size), g.attr(A.PG_NAME, pg)]
        nid = self._add(
            f"{what}.bucket{self.bucket_count}", pb.COMM_COLL_NODE, [after], ctrl, 0,
            self._tags(layer, "sync", NO_MICRO_BATCH) + extra,
        )  # fmt: skip
        self.sync_ids.append(nid)
        if self.wide_pg and pg == self.wide_pg:
            self.wide_ids.append(nid)
        if self.rep_pg and kind == pb.REDUCE_SCATTER:
            # dp_shard (Megatron-Core's num_distributed_optimizer_instances > 1): the reduced shard all-reduced
            # across the instances right after the bucket's ReduceScatter, both on one communication stream
            # that first waits for the compute stream (core_r0.11.0 megatron/core/distributed/
            # param_and_grad_buffer.py _ParamAndGradBucketGroup.start_grad_sync: reduce_scatter over the
            # intra-instance group, then all_reduce of the local shard over inter_distributed_optimizer_
            # instance_group; overlap_grad_reduce or not, the same order).
            size = padded // self.dp * self.grad_bytes
            extra = [
                g.attr(A.COMM_TYPE, pb.ALL_REDUCE),
                g.attr(A.COMM_SIZE, size),
                g.attr(A.PG_NAME, self.rep_pg),
            ]
            nid = self._add(
                f"dp_grad_shard_allreduce.bucket{self.bucket_count}", pb.COMM_COLL_NODE, [nid], [], 0,
                self._tags(layer, "sync", NO_MICRO_BATCH) + extra,
            )  # fmt: skip
            self.sync_ids.append(nid)
            self.rep_ids.append(nid)
        self.bucket_count += 1

    # -- parameter gathers ahead of their first use (overlap_param_gather; sharding: zero3 / fsdp) -------
    def _dp_comm(
        self,
        name: str,
        kind: int,
        size: int,
        data: list[int],
        ctrl: list[int],
        layer: int,
        mb: int,
        pg: str = "",
    ) -> int:
        """A collective on the DP group (or `pg`, hybrid sharding's replicate group), after the previous one
        (one NCCL stream, issue order)."""
        g = self.gen
        assert self.dp_pg is not None
        extra = [g.attr(A.COMM_TYPE, kind), g.attr(A.COMM_SIZE, size), g.attr(A.PG_NAME, pg or self.dp_pg)]
        chain = [self.sync_ids[-1]] if self.sync_ids else []
        ctrl = [c for c in ctrl if c not in chain] + chain
        nid = self._add(name, pb.COMM_COLL_NODE, data, ctrl, 0, self._tags(layer, "sync", mb) + extra)
        self.sync_ids.append(nid)
        return nid

    def enter(self, unit: int | str, mb: int) -> None:
        """The ops of parameter unit `unit` (a layer, EMB or HEAD) start at the frontier: wait for its
        gathered parameters and issue the next gather (prefetch of one)."""
        if self.fsdp:
            self._fsdp_enter(unit, mb)
        elif self.gather_ahead:
            self._bucket_enter(unit)

    def _bucket_enter(self, unit: int | str) -> None:
        """overlap_param_gather: bucket j's AllGather is waited for by the first forward op of its layers;
        that wait issues the next bucket's (Megatron's forward pre-hook, next_param_gather_bucket_group);
        the first is issued at the start of the iteration (zero_grad). Routed experts: their own buckets
        and chain on the expert-DP group (Megatron-Core chains the expert-parallel bucket groups apart)."""
        if self.expert_ahead:
            self._expert_enter(unit)
        j = self.unit_bucket.get(unit)
        if j is None or j in self.waited:
            return
        pos = len(self.waited)
        self.waited.add(j)
        assert self.ag_order[pos] == j, "buckets are first used in the planned order"
        if pos == 0:
            self.gathered[j] = self._bucket_gather(j, [])
        self.waits.append(self.gathered[j])
        if pos + 1 < len(self.ag_order):
            nxt = self.ag_order[pos + 1]
            after = [self.frontier] if self.frontier is not None else []
            self.gathered[nxt] = self._bucket_gather(nxt, after + [self.gathered[j]])

    def _expert_enter(self, unit: int | str) -> None:
        """overlap_param_gather, routed experts: expert bucket j's AllGather over the expert-DP group is
        waited for by the first forward op of its MoE layers; that wait issues the next expert bucket's."""
        j = self.unit_ebucket.get(unit)
        if j is None or j in self.ewaited:
            return
        pos = len(self.ewaited)
        self.ewaited.add(j)
        assert self.eag_order[pos] == j, "expert buckets are first used in the planned order"
        if pos == 0:
            self.egathered[j] = self._expert_gather(j, [])
        self.waits.append(self.egathered[j])
        if pos + 1 < len(self.eag_order):
            nxt = self.eag_order[pos + 1]
            after = [self.frontier] if self.frontier is not None else []
            self.egathered[nxt] = self._expert_gather(nxt, after + [self.egathered[j]])

    def _expert_gather(self, j: int, ctrl: list[int]) -> int:
        """Expert bucket j's AllGather: each rank's shard of the padded bucket, after the previous expert-DP
        collective (one communicator, issue order)."""
        g = self.gen
        assert self.ep is not None
        padded, members = self.plan_ebuckets[j]
        size = self.gather_bytes(padded, sum(self.fp8_split(u)[1] for u in members), self.edp)
        extra = [g.attr(A.COMM_TYPE, pb.ALL_GATHER), g.attr(A.COMM_SIZE, size), g.attr(A.PG_NAME, self.ep[3])]
        chain = [self.expert_sync_ids[-1]] if self.expert_sync_ids else []
        ctrl = [c for c in ctrl if c not in chain] + chain
        nid = self._add(
            f"expert_dp_param_allgather.bucket{j}", pb.COMM_COLL_NODE, [], ctrl, 0,
            self._tags(0, "sync", NO_MICRO_BATCH) + extra,
        )  # fmt: skip
        self.expert_sync_ids.append(nid)
        return nid

    def _bucket_gather(self, j: int, ctrl: list[int]) -> int:
        padded, members = self.plan_buckets[j]
        fp8 = sum(self.fp8_split(u)[0] for u in members if isinstance(u, int))
        size = self.gather_bytes(padded, fp8, self.dp)
        return self._dp_comm(
            f"dp_param_allgather.bucket{j}", pb.ALL_GATHER, size, [], ctrl, 0, NO_MICRO_BATCH
        )

    def _fsdp_enter(self, unit: int | str, mb: int) -> None:
        """FSDP / ZeRO-3: every run of a unit's ops (a visit) waits for that unit's parameter AllGather; the
        next visit's AllGather is issued as this one starts (FSDP's forward and backward prefetch). With
        `fsdp_backward_prefetch: none` a backward visit's AllGather is issued at the visit itself, after the
        previous unit's ReduceScatter on the DP communicator (PyTorch's BackwardPrefetch None)."""
        i = self.visit_i
        # a unit's forward right after its own backward opens a visit of its own (PyTorch FSDP, _plan)
        split = i < len(self.visits) and self.visit_split[i] and self.visits[i] == (unit, mb)
        if self.dp_pg is None or (unit == self.cur_unit and not split):
            return
        assert self.visits[i][0] == unit, "visits follow the planned order"
        after = [self.frontier] if self.frontier is not None else []
        if self.mfsdp:
            self._mfsdp_enter(i, after)
            self.cur_unit = unit
            self.visit_i = i + 1
            return
        if self.visit_gathers[i]:
            if self.visit_ag[i] < 0:  # the first visit, or a backward visit no prefetch issued
                self.visit_ag[i] = self._fsdp_gather(i, after)
            if self.ctx.fw.fsdp2_copies:
                self._fsdp_copy_out(i)
                if self.visit_bwd[i]:
                    # FSDP2's pre_backward prefetches after wait_for_unshard, whose all-gather streams wait
                    # for the copy-out's event (_wait_all_gather_streams_on_event): the next gather follows it
                    after = [self.frontier] if self.frontier is not None else after
            else:
                self.waits.append(self.visit_ag[i])
        nxt = i + 1
        if nxt < len(self.visits) and self.visit_gathers[nxt]:
            if not (self.no_bwd_prefetch and self.visit_bwd[nxt]):
                self.visit_ag[nxt] = self._fsdp_gather(nxt, after)
        self.cur_unit = unit
        self.visit_i = i + 1

    def _fsdp_op(self, op: Op, unit: int | str, mb: int, data: list[int], ctrl: list[int]) -> int:
        """One of FSDP2's copy kernels (Framework.fsdp2_copies) as a compute node of `unit`; it becomes the
        chain's frontier."""
        micros, extra, ns = self._tail(op)  # the attributes every compute step's node carries (`step`)
        if self.hostline is not None:
            self._cost = (op.kernels, ns)
        head = self._head(unit if isinstance(unit, int) else 0, op.phase, mb)
        nid = self._add(f"{op.op}.{unit}.{op.phase}.mb{mb}", pb.COMP_NODE, data, ctrl, micros, head + extra)
        self.comp_ops[nid] = (op, 0, 1)
        self.frontier = nid
        return nid

    def _fsdp_copy_out(self, i: int) -> None:
        """FSDP2's all-gather copy-out (Framework.fsdp2_copies): `split_with_sizes_copy` of visit i's gathered
        flat buffer into the unit's unsharded parameters on the compute stream, after its AllGather and the
        work before it: read and write `dtype_bytes` per gathered element (the unit padded to a multiple of
        DP, as gathered). The unit's first op waits for it (the frontier) rather than for the gather."""
        unit, mb = self.visits[i]
        elems = fsdp_shard(self.unit_params[unit], self.dp) * self.dp
        phase = "bwd" if self.visit_bwd[i] else "fwd"
        op = Op("fsdp_allgather_copy_out", phase, 0, 2 * self.ctx.b * elems, (elems,), False)
        ctrl = [self.frontier] if self.frontier is not None else []
        self._fsdp_op(op, unit, mb, [self.visit_ag[i]], ctrl)

    def _mfsdp_enter(self, i: int, after: list[int]) -> None:
        """Megatron-FSDP (optim_grads_params): the visit's all_gather_params call as _plan_mfsdp replayed it:
        one coalesced AllGather of the buckets it issues (its own and the prefetched ones not yet gathered;
        megatron_fsdp/param_and_grad_buffer.py AllGatherPipeline.all_gather_params, _coalescing_manager),
        then the visit waits for the gather that brought its own bucket."""
        unit, mb = self.visits[i]
        issue = self.visit_calls[i]
        if issue:
            names = "+".join(str(self.bucket_units[b]) for b in issue)
            size = sum(fsdp_shard(self.bucket_sizes[b], self.dp) for b in issue) * self.ctx.b
            layer = unit if isinstance(unit, int) else 0
            nid = self._dp_comm(
                f"fsdp_param_allgather.{names}.mb{mb}", pb.ALL_GATHER, size, [], after, layer, mb
            )
            for b in issue:
                self.bucket_gather[b] = nid
        own = self.unit_bucket[unit]
        if own in self.bucket_gather:  # none when gathered after the previous optimizer step (no overlap)
            self.waits.append(self.bucket_gather[own])

    def _plan_mfsdp(self, events: list[tuple[str, int]], runs_bwd: list[bool]) -> None:
        """Megatron-FSDP's parameter buckets through one iteration (megatron/core/distributed/fsdp/src/
        megatron_fsdp at 0d8e0714cd, Megatron-Bridge v0.2.0's pin). Buckets: the parameters no
        TransformerLayer holds (embedding, final norm, output layer on this rank: one parameter group,
        bucket_size unset; first where the embedding is, else after the layers), and one per layer (fsdp_unit_modules = [TransformerLayer],
        mcore_fsdp_adapter.py). Every module's forward pre-hook, and each layer's pre-backward hook, call
        all_gather_params(own bucket, prefetch): from the own bucket onward by id (forward: up, backward:
        down), buckets are added while the prefetched elements stay under suggested_AG_prefetch_size
        (max(1e9, 2 x the mean layer) / 2 elements, megatron_fsdp.py _init_fsdp_param_and_grad_buffer) and,
        with fsdp_double_buffer, at most two layer buckets (the None unit of bucket 0 counting as one,
        need_skip_prefetch); those still EMPTY are gathered. A layer is released after its forward
        (_post_forward) and its backward (_post_backward); the non-layer bucket never within the iteration. The root
        pre-backward hook marks every layer bucket releasable; the next gather's recycle_unused_buckets
        releases those a later call did not claim (layers the head's prefetch gathered)."""
        layers = [u for u in self.unit_params if isinstance(u, int)]
        nu = sum(p for u, p in self.unit_params.items() if not isinstance(u, int))
        # Bucket ids follow the parameters' first appearance (named_parameters): the embedding's group
        # before the layers; on a stage without it the final norm and output layer after them.
        units: list[int | str] = layers
        if nu:
            units = [EMB, *layers] if self.emb is not None else [*layers, HEAD]
        self.bucket_units = units
        self.bucket_sizes = [nu if not isinstance(u, int) else self.unit_params[u] for u in units]
        self.bucket_sizes = [fsdp_shard(p, self.dp) * self.dp for p in self.bucket_sizes]
        nu_id = next((k for k, u in enumerate(units) if not isinstance(u, int)), -1)
        self.unit_bucket = {u: (units.index(u) if isinstance(u, int) else nu_id) for u in self.unit_params}
        mean = sum(self.unit_params[x] for x in layers) // max(1, len(layers))  # the rank's TP shard
        limit = max(MFSDP_MIN_COMM_UNIT, 2 * mean) // 2
        double = self.gen.dep.fsdp_double_buffer
        is_layer = [isinstance(u, int) for u in units]
        # overlap_param_gather: everything released at the end of the step (finish_grad_sync); without it
        # start_param_sync gathered every bucket after the previous step (param_gathers): all held.
        held = [not self.gen.dep.overlap_param_gather] * len(units)
        releasable: set[int] = set()
        calls: list[list[int]] = []
        for kind, i in events:
            if kind == "root_pre_backward":
                releasable |= {b for b in range(len(units)) if is_layer[b]}
                continue
            if kind == "release":
                # a layer recomputed ahead of its backward stays gathered (PRE_BACKWARD skips _post_forward)
                if is_layer[self.unit_bucket[self.visits[i][0]]] and not (
                    self.visit_bwd[i] and not runs_bwd[i]
                ):
                    held[self.unit_bucket[self.visits[i][0]]] = False
                continue
            unit, _mb = self.visits[i]
            own = self.unit_bucket[unit]
            step = -1 if self.visit_bwd[i] else 1
            # a layer recomputed in backward is in PRE_BACKWARD: its forward pre-hook does not prefetch,
            # its pre-backward hook does (both at the visit's start here)
            ag, dbl = [own], ({own} if is_layer[own] else set())
            nxt = own + step
            while 0 <= nxt < len(units) and sum(self.bucket_sizes[b] for b in ag[1:]) < limit:
                if double:
                    dbl.add(nxt if is_layer[nxt] else -1)
                    if len(dbl) > 2:
                        break
                ag.append(nxt)
                nxt += step
            releasable -= set(ag)
            issue = [b for b in ag if not held[b]]
            if issue:  # async_bucket_gather's recycle_unused_buckets, then the gathers
                for b in releasable:
                    held[b] = False
                releasable = set()
                for b in issue:
                    held[b] = True
            calls.append(sorted(issue))
        self.visit_calls = calls
        self.bucket_gather: dict[int, int] = {}
        self.buckets = list(self.bucket_sizes)

    def _fsdp_gather(self, i: int, ctrl: list[int]) -> int:
        unit, mb = self.visits[i]
        layer = unit if isinstance(unit, int) else 0
        size = fsdp_shard(self.unit_params[unit], self.dp) * self.ctx.b
        return self._dp_comm(f"fsdp_param_allgather.{unit}.mb{mb}", pb.ALL_GATHER, size, [], ctrl, layer, mb)

    def fsdp_reduce(self, unit: int | str, mb: int) -> None:
        """FSDP / ZeRO-3: the unit's gradients, reduce-scattered as its backward ends (every micro-batch)."""
        if not self.fsdp or self.dp_pg is None:
            return
        assert self.frontier is not None
        layer = unit if isinstance(unit, int) else 0
        shard = fsdp_shard(self.unit_params[unit], self.dp)
        if self.mfsdp:
            # Megatron-FSDP reduces a bucket once all its gradients are in (GradReducePipeline.reduce_gradients):
            # bucket 0 (embedding, final norm, output layer) at the embedding's backward where it is here
            if not isinstance(unit, int) and unit == HEAD and self.emb is not None:
                return
            shard = self.bucket_sizes[self.unit_bucket[unit]] // self.dp
        name = f"fsdp_grad_reducescatter.{unit}.mb{mb}"
        before = self.frontier
        if self.ctx.fw.fsdp2_copies and not self.mfsdp:
            # FSDP2's reduce-scatter copy-in (Framework.fsdp2_copies): the unit's gradients copied into the
            # flat input in the reduce dtype (read dtype_bytes, write grad_bytes per element of the padded
            # unit) on the reduce-scatter stream, after the compute so far and the previous ReduceScatter of
            # that stream; the compute stream waits for it (it becomes the frontier).
            elems = shard * self.dp
            nbytes = (self.ctx.b + self.grad_bytes) * elems
            op = Op("fsdp_reducescatter_copy_in", "bwd", 0, nbytes, (elems,), False)
            prev = [self.fsdp_rs_last] if self.fsdp_rs_last >= 0 else []
            before = self._fsdp_op(op, unit, mb, [before], prev)
        nid = self._dp_comm(
            name, pb.REDUCE_SCATTER, shard * self.dp * self.grad_bytes, [before], [], layer, mb
        )
        self.fsdp_rs_last = nid
        # DeepSpeed's MiCS (zero3) all-reduces at the accumulation boundary only, i.e. after the last
        # micro-batch's ReduceScatter (microsoft/DeepSpeed c4abb4056d deepspeed/runtime/zero/mics.py
        # MiCS_Optimizer.allreduce_mics_shard_grads: returns unless is_gradient_accumulation_boundary).
        boundary = self.fsdp_root or mb == max(1, self.gen.dep.micro_batches) - 1
        if self.rep_pg and boundary:
            # Hybrid sharding: the reduced shard all-reduced across the replicas, right after its
            # ReduceScatter on the same stream (PyTorch FSDP HYBRID_SHARD, torch 2.0-2.1
            # torch/distributed/fsdp/_runtime_utils.py _post_backward_hook: reduce_scatter over the shard
            # group, then all_reduce of the shard over _inter_node_pg, every backward FSDP does not no_sync).
            name = f"fsdp_grad_allreduce.{unit}.mb{mb}"
            size = shard * self.grad_bytes
            self.rep_ids.append(self._dp_comm(name, pb.ALL_REDUCE, size, [nid], [], layer, mb, self.rep_pg))

    def _pass_units(self, kind: str, ch: _Chunk) -> list[int | str]:
        """The parameter units a pass uses, in order (backward: recomputed layers before their backward)."""
        fwd = kind != BWD
        units: list[int | str] = []
        if (ch.last if not fwd else ch.first) and (self.head if not fwd else self.emb) is not None:
            units.append(HEAD if not fwd else EMB)
        if fwd:
            units += list(range(ch.start, ch.end + 1))
        else:
            rc = self.recompute_units(ch) if self.recompute == "full" else {}
            for layer in range(ch.end, ch.start - 1, -1):
                units += [*rc.get(layer, ()), layer]
        if (ch.first if not fwd else ch.last) and (self.emb if not fwd else self.head) is not None:
            units.append(EMB if not fwd else HEAD)
        return units

    @staticmethod
    def _root_kept(
        visits: list[tuple[int | str, int]], runs_bwd: list[bool], kept: frozenset[int] = frozenset()
    ) -> list[bool]:
        """Which visits gather their unit under PyTorch FSDP (`sharding: fsdp`): the root module's
        parameters (xsim's EMB and HEAD units: the embedding, final norm and an output layer no child
        unit wraps) are not resharded after forward, so they stay gathered from a micro-batch's forward to
        its backward, which then gathers nothing; the root's post-backward hook reshards them (every
        micro-batch: FULL_SHARD), so the next forward gathers again. FSDP1 (torch 1.13-2.1
        torch/distributed/fsdp/_runtime_utils.py `_post_forward_reshard`: free_unsharded_flat_param =
        `not state._is_root and ...`, "Do not free the root's parameters in the post-forward";
        `_post_backward_hook` reshards via `_should_free_in_backward`); FSDP2 (fully_shard, torch
        2.4 torch/distributed/_composable/fsdp/_fsdp_state.py `_lazy_init`: "For the root, do not reshard
        after forward", the root group's post_forward_mesh_info = None). The layers in `kept` are held the
        same way: a block wrapped with reshard_after_forward=False (torchtitan's last block,
        Framework.fsdp_keep_last_block; FSDP2 then sets post_forward_mesh_info None for it as for the root,
        and its post-backward hook reshards it). Every other unit reshards after each visit (FULL_SHARD)."""
        held: set[int | str] = set()
        gathers: list[bool] = []
        for (unit, _mb), back in zip(visits, runs_bwd, strict=True):
            root = not isinstance(unit, int) or unit in kept
            gathers.append(not (root and unit in held))
            if root:
                # gathered for its forward and kept; a visit that runs a backward reshards after it (a
                # merged forward + backward visit, the head at the last stage, too)
                if back:
                    held.discard(unit)
                else:
                    held.add(unit)
        return gathers

    def _unit_params(self) -> dict[int | str, int]:
        """Parameters of each unit this rank holds (its TP shard)."""
        m, sh = self.gen.model, self.ctx.sh
        out: dict[int | str, int] = {}
        if self.emb is not None:
            out[EMB] = embedding_rank_params(m, sh)
        for ch in self.st.chunks:
            for layer in range(ch.start, ch.end + 1):
                # MoE layers: the dense part only (the routed experts are in their own buckets); MLA layers
                # their own attention weights: the split the backward's buckets fill with (line ~1481).
                # FSDP / ZeRO-3 (EP 1 only, tracegen.moe_ops.moe_plan_error): one unit of the whole layer,
                # experts included, as torchtitan's fully_shard of each transformer block holds them
                dense, expert = layer_split(m, sh, layer, self.ep[0] if self.ep else 1)
                out[layer] = dense + expert if self.fsdp else dense
        if self.head is not None:  # tied with the embedding on this rank: the final norm only
            out[HEAD] = head_rank_params(m, sh, self.emb is not None)
        return out

    def _plan(self, order: list[tuple[str, int, int]], last_b: dict[int, int]) -> None:
        """What forward needs to know before backward fills the buckets: FSDP visits, or (overlap_param_gather)
        each bucket's units and the order of the buckets' first forward use."""
        self.unit_params = self._unit_params()
        if self.fsdp:
            visits: list[tuple[int | str, int]] = []
            bwd: list[bool] = []  # a visit that opens in a backward pass (its recompute included)
            runs_bwd: list[bool] = []  # a visit with backward work (the head's forward + backward: one visit)
            split: list[bool] = []  # a visit of the same unit as the one before it
            events: list[tuple[str, int]] = []  # Megatron-FSDP's hook calls in order (_plan_mfsdp)
            prev_kind = ""
            for kind, c, mb in order:
                if kind == BWD:
                    events.append(("root_pre_backward", len(visits)))
                for u in self._pass_units(kind, self.st.chunks[c]):
                    # PyTorch FSDP reshards a unit in its post-backward hook: a forward after its backward
                    # (the next micro-batch's embedding after this one's) is a visit of its own
                    # (Megatron-FSDP: the next forward's pre-hook is an all_gather_params call of its own)
                    resharded = (self.fsdp_root or self.mfsdp) and runs_bwd and runs_bwd[-1] and kind != BWD
                    # Megatron-FSDP releases a layer after its forward (_post_forward): its backward right
                    # after it (a stage's last layer under 1F1B) gathers it again in a visit of its own
                    released = self.mfsdp and isinstance(u, int) and kind == BWD and prev_kind != BWD
                    prev_kind = kind
                    if not visits or visits[-1][0] != u or resharded or released:
                        if self.mfsdp and visits:  # post-forward / post-backward of the visit ending here
                            events.append(("release", len(visits) - 1))
                        events.append(("call", len(visits)))
                        split.append(bool(visits) and visits[-1][0] == u)
                        visits.append((u, mb))
                        bwd.append(kind == BWD)
                        runs_bwd.append(False)
                    runs_bwd[-1] = runs_bwd[-1] or kind == BWD
            self.visits = visits
            self.visit_bwd = bwd
            self.visit_split = split
            self.visit_ag = [-1] * len(visits)
            # torchtitan's last transformer block (reshard_after_forward=False): the model's last layer
            last = frozenset(ch.end for ch in self.st.chunks if ch.last and self.ctx.fw.fsdp_keep_last_block)
            keep = self._root_kept(visits, runs_bwd, last) if self.fsdp_root else [True] * len(visits)
            self.visit_gathers = keep
            self.buckets = [fsdp_shard(p, self.dp) * self.dp for p in self.unit_params.values()]
            if self.mfsdp:
                self._plan_mfsdp(events, runs_bwd)
            return
        if self.expert_ahead:
            self._plan_experts(order, last_b)
        if not self.gather_ahead:
            return
        # Megatron fills buckets in backward order and closes one when it reaches the bucket size
        # (bucket_add), per model chunk; replayed here on parameter counts alone.
        plan: list[tuple[int, list[int | str]]] = []
        for kind, c, mb in order:
            if kind != BWD or mb != last_b[c]:
                continue
            ch = self.st.chunks[c]
            pending, members = 0, []
            order_units: list[int | str] = [HEAD] if ch.last and self.head is not None else []
            order_units += list(range(ch.end, ch.start - 1, -1))
            order_units += [EMB] if ch.first and self.emb is not None else []
            split = self.splits(c)
            for u in order_units:
                members.append(u)
                pending += self.unit_params[u]
                if split and pending * self.grad_bytes >= self.gen.dep.dp_bucket_bytes:
                    plan.append((self._padded(pending), members))
                    pending, members = 0, []
            if pending:
                if self.opt_first and c == 0:  # bucketing disabled for model chunk 0
                    self.chunk0_bucket = len(plan)
                plan.append((self._padded(pending), members))
        self.plan_buckets = plan
        # overlap_param_gather_with_optimizer_step: chunk 0's bucket is gathered by the optimizer step, not
        # ahead of its forward (finish)
        self.unit_bucket = {
            u: j for j, (_, members) in enumerate(plan) for u in members if j != self.chunk0_bucket
        }
        first_use: list[int] = []
        for kind, c, _mb in order:
            if kind == BWD:
                continue
            for u in self._pass_units(kind, self.st.chunks[c]):
                j = self.unit_bucket.get(u)
                if j is not None and j not in first_use:
                    first_use.append(j)
        self.ag_order = first_use

    def _plan_experts(self, order: list[tuple[str, int, int]], last_b: dict[int, int]) -> None:
        """overlap_param_gather, routed experts: one expert bucket per model chunk with MoE layers, in the
        order expert_flush closes them (each chunk's last backward), and the order of their first forward use."""
        m, sh = self.gen.model, self.ctx.sh
        assert self.ep is not None
        plan: list[tuple[int, list[int]]] = []
        for kind, c, mb in order:
            if kind != BWD or mb != last_b[c]:
                continue
            ch = self.st.chunks[c]
            layers = [x for x in range(ch.end, ch.start - 1, -1) if layer_split(m, sh, x, self.ep[0])[1]]
            params = sum(layer_split(m, sh, x, self.ep[0])[1] for x in layers)
            if params:
                plan.append((dist_opt_bucket(params, self.edp), layers))
        self.plan_ebuckets = plan
        self.unit_ebucket = {u: j for j, (_, members) in enumerate(plan) for u in members}
        first_use: list[int] = []
        for kind, c, _mb in order:
            if kind == BWD:
                continue
            for u in self._pass_units(kind, self.st.chunks[c]):
                j = self.unit_ebucket.get(u)
                if j is not None and j not in first_use:
                    first_use.append(j)
        self.eag_order = first_use

    def setup(self) -> None:
        """The emission state of a fresh program (DP buckets, overlap and sharding switches)."""
        dep = self.gen.dep
        self.pending = 0
        self.pending_fp8 = 0  # FP8 linear weights among `pending` (fp8_params)
        # fp8_params: each layer's FP8 linear weights, all-gathered at 1 byte (Megatron-Core keeps them in a
        # uint8 buffer, distributed_data_parallel.py _allocate_buffers_for_parameters: param_dtype
        # torch.uint8 for a Float8Tensor). A MoE layer's per rank: fp8_split (the spec refuses MLA).
        # MXFP8 parameters are gathered in the model dtype and quantized after the gather (spec.fp8_params).
        self.layer_fp8 = (
            linear_params(self.gen.model, self.ctx.sh, 1)
            if dep.fp8_params and self.ctx.te_fp8 and not self.ctx.fp8_mx
            else 0
        )
        self.sync_ids: list[int] = []
        self.rep_ids: list[
            int
        ] = []  # hybrid sharding's AllReduces (in sync_ids too; PG_NAME: the replicate group)
        # gradient AllReduces over the whole DP group under dp_shard (in sync_ids too; PG_NAME: that group)
        self.wide_ids: list[int] = []
        # Megatron-FSDP (sharding: megatron-fsdp): its strategy; optim_grads_params is the per-layer scheme
        # above with its own buckets and prefetch (_plan_mfsdp), optim / optim_grads the DP bucket path.
        self.mfsdp = mfsdp_strategy(dep)
        self.fsdp = dep.sharding in ("zero3", "fsdp") or self.mfsdp == "optim_grads_params"
        # PyTorch FSDP keeps the root module's parameters gathered from forward to backward (_root_kept);
        # DeepSpeed ZeRO-3 (`zero3`) has no root unit: every module is released after its forward.
        self.fsdp_root = dep.sharding == "fsdp"
        # PyTorch FSDP's BackwardPrefetch (torch/distributed/fsdp/_runtime_utils.py): BACKWARD_PRE issues the
        # next unit's AllGather in the pre-backward hook, BACKWARD_POST in the post-backward hook, in both
        # ahead of the unit's ReduceScatter (the post-backward hook reshards, prefetches, then reduces), on
        # the one NCCL communicator, and released by limit_all_gathers as the previous unit's compute ends:
        # the same GPU order, one graph. None: issued by the next unit's own pre-backward hook, after the
        # ReduceScatter, so backward waits for ReduceScatter + AllGather at every unit.
        self.no_bwd_prefetch = dep.fsdp_backward_prefetch == "none"
        # DeepSpeed's BF16_Optimizer (bf16 with ZeRO stage 0, as BLOOM ran; not ZeRO-3) copies each micro-batch's
        # gradients into FP32 (tracegen.ops.hp_grad_accumulation).
        self.hp_grad_copy = (
            self.ctx.fw.fp32_grad_copy_per_micro_batch and self.ctx.precision == "bf16" and not self.fsdp
        )
        # ZeRO-3 / FSDP also updates only the rank's shard of the optimizer state (as ZeRO-1 does).
        self.dist_opt = dep.distributed_optimizer or self.fsdp or bool(self.mfsdp)
        self.dp = len(self.gen.dp_members.get(self.dp_pg, ())) if self.dp_pg else 1
        self.grad_bytes = grad_reduce_bytes(dep)
        # Megatron-LM before Megatron-Core (megatron-2021 / -2022 profiles), without a sharded optimizer; that
        # code had no MoE or MLA layers (a MoE model under these profiles keeps the Megatron-Core path).
        code = self.ctx.fw.grad_path
        legacy = code and not self.dist_opt and self.gen.model.moe is None and self.gen.model.mla is None
        self.gpath = grad_path(code, self.ctx.precision, self.ctx.b) if legacy else None
        self.overlap_grad = dep.overlap_grad_reduce
        # Megatron-FSDP optim / optim_grads: no TransformerLayer units, and bucket_size unset (Megatron-LM's
        # --ddp-bucket-size, which Megatron-Bridge's FSDP runs leave None): the rank's parameters are one bucket
        # (_get_parameter_groups), reduced by the post-backward hook that completes it, overlap or not.
        self.one_bucket = self.mfsdp in ("optim", "optim_grads")
        if self.one_bucket:
            self.overlap_grad = True
        # overlap_param_gather: the parameter AllGathers of the previous optimizer step run under this
        # iteration's forward (the steady state's wrap-around; docs/tracegen.md "Overlap").
        self.gather_ahead = (
            dep.overlap_param_gather
            and (dep.distributed_optimizer or self.one_bucket)
            and self.dp_pg is not None
        )
        # overlap_param_gather_with_optimizer_step (Megatron-Core's distributed optimizer, interleaved 1F1B):
        # model chunk 0 in one bucket, its optimizer stepped first and its AllGather issued right after
        # (optimizer/__init__.py get_megatron_optimizer, optimizer.py ChainedOptimizer.step_with_ready_grads;
        # training.py get_model disable_bucketing; core_r0.11.0 791b70e031)
        self.opt_first = (
            dep.overlap_param_gather_with_optimizer_step and self.gather_ahead and len(self.st.chunks) > 1
        )
        self.chunk0_bucket = -1  # index of chunk 0's bucket among plan_buckets (opt_first)
        # Megatron-Core's DDP bucketing (Framework.first_chunk_buckets; not under Apex's DistributedFusedAdam)
        self.mcore_ddp = self.ctx.fw.first_chunk_buckets and dep.dist_optimizer_impl != "apex"
        self.bwd_chunk = 0  # model chunk of the backward being emitted
        # defer_embedding_wgrad_compute: Megatron-Core's wgrad_deferral_limit on the last pipeline stage
        # (is_pipeline_last_stage(ignore_virtual=True): the rank holding the output layer), else None
        self.defer_limit = (
            dep.wgrad_deferral_limit if dep.HasField("wgrad_deferral_limit") and self.last else None
        )
        self.wgrad_deferred: list[tuple[_Overlap, _Overlap | None]] = []  # (head GEMM halves, its SP gather)
        self.tp_overlap = dep.tp_comm_overlap and self.ctx.sp and self.st.dg.tp > 1
        # The column-parallel linears' backward collectives under their GEMMs (Framework.sp_dgrad_overlap /
        # async_dgrad_allreduce); TE's userbuffers (tp_comm_overlap) take QKV and fc1 first.
        fw = self.ctx.fw
        self.dgrad_overlap = self.st.dg.tp > 1 and (
            fw.sp_dgrad_overlap if self.ctx.sp else fw.async_dgrad_allreduce
        )
        self.buckets: list[int] = []  # padded elements of each distributed-optimizer bucket (FSDP: unit)
        # FP8 linear weights in each distributed-optimizer bucket (fp8_params)
        self.bucket_fp8: list[int] = []
        self.bucket_count = 0
        self.sync_mb = 0
        self.sync_final = True  # the backward filling the buckets is the chunk's last (optim_grads: any)
        self.deferred: list[tuple[int, int]] = []  # buckets held for the end of backward
        self.expert_pending = 0  # routed-expert gradients not yet in an expert-DP AllReduce
        self.expert_pending_fp8 = 0  # FP8 linear weights among `expert_pending` (fp8_params)
        self.expert_deferred: list[int] = []
        self.expert_sync_ids: list[int] = []
        self.expert_rs = 0  # expert gradient buckets synced so far (their names' index)
        self.expert_buckets: list[int] = []  # padded elements of each expert bucket (distributed optimizer)
        self.expert_bucket_fp8: list[int] = []  # FP8 linear weights in each expert bucket (fp8_params)
        self.edp = len(self.gen.bundle.comm_groups[self.ep[3]]) if self.ep and self.ep[3] else 1
        self.waits: list[int] = []  # parameter gathers the next compute node waits for
        self.gathered: dict[int, int] = {}  # bucket -> its AllGather node (overlap_param_gather)
        # overlap_param_gather for the routed experts (their buckets over the expert-DP group)
        self.expert_ahead = (
            dep.overlap_param_gather
            and dep.distributed_optimizer
            and self.ep is not None
            and bool(self.ep[3])
        )
        self.egathered: dict[int, int] = {}
        self.ewaited: set[int] = set()
        self.waited: set[int] = set()  # buckets whose gather a forward op already waits for
        self.cur_unit: int | str | None = None  # FSDP: the unit whose gathered parameters are in use
        self.fsdp_rs_last = -1  # FSDP: the last ReduceScatter node (Framework.fsdp2_copies' stream order)
        self.visit_i = 0
        self.comp_ops: dict[int, tuple[Op, int, int]] = {}  # compute node -> (op, chunk, chunks)
        costs = host_costs(
            dep.host_dispatch,
            dep.host_launch_us,
            dep.compute_model or "roofline",
            # their syncs need the host thread
            self.ctx.fw.host_dispatch or dep.synchronize_each_layer or dep.cuda_launch_blocking,
        )
        self.hostline = HostTimeline(costs) if costs is not None else None
        # CUDA_LAUNCH_BLOCKING=1: each launch returns once its kernel has ended (a sync after every GPU node)
        self.launch_blocking = self.hostline is not None and dep.cuda_launch_blocking
        self.exchange = [] if self.hostline is not None and self.ctx.fw.p2p_sync else None
        self.te_busy: dict[int, int] = {}  # compute node -> SMs TE's userbuffers hold meanwhile

    def build(self) -> list[pb.Node]:
        """The rank's nodes as messages."""
        self.build_payloads()
        return self.nodes

    def build_payloads(self) -> list[bytes]:
        """Emit the rank's program; its nodes serialized, in order."""
        dep = self.gen.dep
        self.setup()
        v = len(self.st.chunks)
        if v > 1:
            order = interleaved(
                dep.micro_batches, self.st.count, self.st.index, v, self.ctx.fw.pp_all_warmup_at_m_eq_p
            )
        else:
            order = [
                (kind, 0, mb)
                for kind, mb in stage_order(dep.schedule, dep.micro_batches, self.st.count, self.st.index)
            ]
        # Gradients of a model chunk are complete after its last backward: its buckets are synced there.
        last_b = {c: mb for kind, c, mb in order if kind == BWD}
        self._plan(order, last_b)
        if v > 1 and self.exchange is not None:
            self.interleaved_steps(order, last_b)
        else:
            for kind, c, mb in order:
                self.run_pass(kind, c, mb, last_b)
            self.send_grad()  # DeepSpeed: the last backward's gradient, in the slot after it
        self.drain_wgrad()
        self.flush_deferred()
        if self.gather_ahead:
            assert self.buckets == [b for b, _ in self.plan_buckets], "bucket plan and backward agree"
        self.finish()
        if self.gen.dep.comm_sm_contention != "off":
            self.contend()
        return self.payloads

    def run_pass(self, kind: str, c: int, mb: int, last_b: dict[int, int]) -> None:
        """One forward or backward pass of model chunk `c`."""
        ch = self.st.chunks[c]
        if kind == BWD:
            buckets = self.dp_pg is not None or self.dp1_prep()
            # Megatron-FSDP optim_grads reduce-scatters every micro-batch (grad_reduce_every_bprop)
            self.sync_final = mb == last_b[c]
            every = self.mfsdp == "optim_grads" and self.dp_pg is not None
            self.backward(ch, mb, sync=buckets and not self.fsdp and (self.sync_final or every))
        else:
            self.forward(ch, mb)

    def interleaved_steps(self, order: list[tuple[str, int, int]], last_b: dict[int, int]) -> None:
        """Megatron-LM 2021/2022's interleaved schedule, exchange by exchange (schedules.py of de7dc40f88,
        forward_backward_pipelining_with_interleaving): a step is a warm-up forward, a steady-state forward
        and backward, or a cool-down backward; after it one call sends what the step produced and receives
        what the next step needs (send_forward_recv_forward, send_forward_backward_recv_forward_backward,
        send_backward_recv_backward), one before the first step receives its input. A forward's output so
        leaves with the next backward's gradient, on the NCCL stream after the step's kernels."""
        total = len(order) // 2
        first_b = next(i for i, (kind, _, _) in enumerate(order) if kind == BWD)
        warm = total if first_b == total else first_b - 1
        pairs = range(warm, warm + 2 * (total - warm), 2)
        steps = [order[i : i + 1] for i in range(warm)] + [order[i : i + 2] for i in pairs]
        steps += [order[i : i + 1] for i in range(warm + 2 * (total - warm), len(order))]
        self.post_recvs(steps[0])
        for j, step in enumerate(steps):
            self.held = []
            for kind, c, mb in step:
                self.run_pass(kind, c, mb, last_b)
            held, self.held = self.held, None
            for ch, side, layer, mb, direction, after, boundary in held:
                tail = [] if self.frontier in (None, after) else [self.frontier]
                self.send_to(ch, side, layer, mb, direction, [after, *tail], boundary)
            if j + 1 < len(steps):
                if j + 1 == warm == total and self.exchange:
                    # every pass warm-up: the last forward's send_forward_recv_forward ends, then
                    # recv_backward is a call of its own (all_warmup_microbatches, de7dc40f88)
                    self.end_exchange()
                self.post_recvs(steps[j + 1])
        assert not self.posted, "every receive posted ahead was waited for by its pass"

    def contend(self) -> None:
        """Re-time the compute nodes that run while communication holds SMs (tracegen.contention): a DP
        collective (gradient bucket, parameter gather, FSDP) for its estimated time from its issue, until
        the first node that waits for it at the latest, likewise a TP collective a column-parallel linear's
        backward overlaps (on the TP stream), and the GEMM chunks TE's userbuffers overlap."""
        g = self.gen
        sync = sorted(set(self.sync_ids) | set(self.expert_sync_ids))
        ns_of: dict[int, int] = {}  # id(op) -> its duration (ops repeat: hashing an Op costs more)
        for op, _, _ in self.comp_ops.values():
            if id(op) not in ns_of:
                ns_of[id(op)] = g.duration_ns(self.gpu, op)
        comp = [(nid, ns_of[id(op)] if k == 1 else part(ns_of[id(op)], k, i))
                for nid, (op, i, k) in self.comp_ops.items()]  # fmt: skip
        # The DP stream: each collective holds its communicator's CTAs (`dp_comm_ctas`, a launch script's
        # max_ctas, overrides them all), so its windows count by CTA class; they share the stream's axis.
        dp_windows = self._windows(sync) if sync else []
        dp_busy = [(busy_fractions(comp, dp_windows, c), c) for c in sorted({w.ctas for w in dp_windows})]
        # The overlapped TP collectives run on their own NCCL stream (the TP communicator's).
        tp_busy = (
            busy_fractions(comp, self._windows(self.tp_async, self.tp_async_of)) if self.tp_async else {}
        )
        streams = (
            *dp_busy,
            (tp_busy, comm_ctas(g.bundle.comm_groups[self.tp_pg], g.links) if tp_busy else 0),
        )
        under = set(self.te_busy).union(tp_busy, *(b for b, _ in dp_busy))
        for nid in sorted(under):  # the nodes under communication
            op, i, k = self.comp_ops[nid]
            te = self.te_busy.get(nid, 0)
            fracs = [(f, ctas) for on, ctas in streams if (f := on.get(nid, 0.0))]
            if not te and not fracs:
                continue
            plain = part(g.duration_ns(self.gpu, op), k, i)
            ns = part(g.contended_ns(self.gpu, op, te), k, i) if te else plain
            if fracs:  # the share of the node under a collective loses NCCL's CTAs as well, per stream
                base = ns
                for frac, ctas in fracs:
                    ns += (part(g.contended_ns(self.gpu, op, te + ctas), k, i) - base) * frac
                ns = round(ns)
            node = pb.Node.FromString(self.payloads[nid])
            node.duration_micros = max(1, (ns + 500) // 1000) if ns else 0
            for j, a in enumerate(node.attr):
                if a.name == A.DURATION_NS:
                    node.attr[j].CopyFrom(g.attr(A.DURATION_NS, ns))
            self.payloads[nid] = node.SerializeToString()

    def _windows(self, sync: list[int], known: dict[int, tuple[str, int]] | None = None) -> list[CommWindow]:
        """The collectives `sync` of one NCCL stream of this rank (DP, or the overlapped TP ones) in issue
        order with their first consumers and estimated times; a collective without a consumer of its own is
        done when a later one is waited for. `known`: (kind, comm_size) of TP-group collectives by id, which
        then need not be parsed."""
        g, syncset = self.gen, set(sync)
        first: dict[int, int] = {}
        for nid in range(sync[0] + 1, len(self.deps)):  # a node depends only on earlier ones
            if nid not in syncset:
                data, ctrl = self.deps[nid]
                for d in (*data, *ctrl):
                    if d in syncset and d not in first:
                        first[d] = nid
        out, end = [], len(self.payloads)
        for c in reversed(sync):
            end = min(end, first.get(c, end))
            got = known.get(c) if known is not None else None
            if got is not None:
                kind, size = got
                members, ctas = g.bundle.comm_groups[self.tp_pg], 0
            else:
                n = pb.Node.FromString(self.payloads[c])
                kind, size = COMM_NAME.get(A.get_int(n, A.COMM_TYPE), ""), A.comm_size(n)
                members = g.bundle.comm_groups[A.get_str(n, A.PG_NAME)]
                ctas = g.dep.dp_comm_ctas or dp_comm_ctas(members, g.links)
            out.append(CommWindow(c, end, g.comm_seconds(kind, size, members), ctas))
        return out[::-1]

    def _all_params(self) -> int:
        """Parameters the rank holds (every chunk, embedding and head included)."""
        return rank_params(self.gen.model, self.ctx.sh, self.num_layers, self.first, self.last)

    def _all_tensors(self) -> int:
        """Parameter tensors the rank holds (one kernel each in per-tensor gradient copies)."""
        return param_tensors(self.gen.model, self.num_layers, self.first, self.last)

    def finish(self) -> None:
        g, m, dg = self.gen, self.gen.model, self.st.dg
        deps = [self.frontier] if self.frontier is not None else []
        if self.sync_ids:
            deps.append(self.sync_ids[-1])
        if self.expert_sync_ids:
            deps.append(self.expert_sync_ids[-1])
        if (self.ctx.sp or m.qk_layernorm) and dg.tp > 1:
            # Sequence parallelism leaves the gradients of the weights every TP rank holds whole partial
            # (each rank saw its sequence slice): Megatron all-reduces every parameter marked
            # `sequence_parallel` over TP, the norms' and the row-parallel linears' biases (RowParallelLinear
            # sets it on its bias: megatron/mpu/layers.py of d898a8991d, megatron/core/tensor_parallel/
            # layers.py; Transformer Engine's fc2 and projection biases likewise, LayerNormMLP.reset_parameters),
            # their `main_grad` at the gradient buffer's width (training.py train_step of d898a8991d;
            # Megatron-Core finalize_model_grads.py _allreduce_layernorm_grads).
            # The q and k norms' weights (ModelArch.qk_layernorm) are whole on every TP rank, each of which
            # normalized its own heads: their gradients are summed over TP with or without sequence
            # parallelism, in the same all-reduce (finalize_model_grads.py _allreduce_non_tensor_model_
            # parallel_grads of core_v0.14.0: `config.qk_layernorm and ("q_layernorm" in name or
            # "k_layernorm" in name)`; core_v0.7.0 _allreduce_layernorm_grads the same).
            norm_grads = self.num_layers * m.qk_norm_params
            if self.ctx.sp:
                norm_grads += (2 * self.num_layers + (1 if self.last else 0)) * m.norm_params
            if self.ctx.sp and m.linear_bias:  # the attention output and MLP down projections' biases
                norm_grads += 2 * self.num_layers * m.hidden
            if self.ctx.sp and m.moe is not None:
                # so do the MoE routers' weights (megatron/core/transformer/moe/router.py marks them
                # sequence_parallel), whole on every TP rank
                layers = [x for ch in self.st.chunks for x in range(ch.start, ch.end + 1)]
                norm_grads += sum(m.moe.is_moe(x) for x in layers) * m.hidden * m.moe.experts
            extra = [
                g.attr(A.COMM_TYPE, pb.ALL_REDUCE),
                g.attr(A.COMM_SIZE, norm_grads * self.grad_bytes),
                g.attr(A.PG_NAME, self.tp_pg),
            ]
            deps.append(
                self._add(
                    "sp_norm_grad_allreduce",
                    pb.COMM_COLL_NODE,
                    list(deps),
                    [],
                    0,
                    self._tags(0, "sync", NO_MICRO_BATCH) + extra,
                )
            )
            self.tp_ids.append(deps[-1])
        if self.emb_pg:
            # The tied word embedding's gradient, summed between the first and the last stage after the DP
            # all-reduce (ModelArch.tied): its V/TP x h shard at the width the DP
            # all-reduce moved it (`main_grad`: the FP16 grad in 2021, the contiguous buffer in 2022).
            extra = [
                g.attr(A.COMM_TYPE, pb.ALL_REDUCE),
                g.attr(A.COMM_SIZE, self.ctx.sh.vocab * m.hidden * self.grad_bytes),
                g.attr(A.PG_NAME, self.emb_pg),
            ]
            nid = self._add(
                "embedding_grad_allreduce", pb.COMM_COLL_NODE, list(deps), [], 0,
                self._tags(0, "sync", NO_MICRO_BATCH) + extra,
            )  # fmt: skip
            self.emb_ids.append(nid)
            deps.append(nid)
        params = rank_params(m, self.ctx.sh, self.num_layers, self.first, self.last)
        expert = 0
        if self.ep is not None or m.mla is not None:
            layers = [x for ch in self.st.chunks for x in range(ch.start, ch.end + 1)]
            ep = self.ep[0] if self.ep else 1
            dense, expert = rank_params_ep(m, self.ctx.sh, layers, ep, self.first, self.last)
            params = dense + expert
        # Each DP rank updates its 1/DP shard of every (padded) bucket under the distributed optimizer or
        # ZeRO-3/FSDP; with DP 1, or without them, everything. Routed experts: the 1/expert-DP shard of
        # their buckets (all of them when the expert-DP group is one rank).
        shard = params
        if self.fsdp and self.buckets:  # FSDP / ZeRO-3 units hold a MoE layer's experts too (EP 1)
            shard = sum(b // self.dp for b in self.buckets)
        elif self.dist_opt and (self.buckets or self.expert_buckets):
            shard = sum(b // self.dp for b in self.buckets) if self.buckets else params - expert
            shard += sum(b // self.edp for b in self.expert_buckets) if self.expert_buckets else expert
        fp8 = linear_params(m, self.ctx.sh, self.num_layers) if self.ctx.te_fp8 else 0
        if fp8 and self.ep is not None:  # MoE ranks: attention, routed and shared expert linears (issue 28)
            fp8 = fp8_linear_params_ep(m, self.ctx.sh, layers, self.ep[0])
        fp8_shard = None  # fp8_params: the FP8 linear weights among the `shard` this rank updates
        if self.layer_fp8:
            expert_fp8 = sum(
                self.fp8_split(x)[1] for ch in self.st.chunks for x in range(ch.start, ch.end + 1)
            )
            fp8_shard = (
                sum(f // self.dp for f in self.bucket_fp8)
                if self.dist_opt and self.buckets
                else fp8 - expert_fp8
            )
            fp8_shard += (
                sum(f // self.edp for f in self.expert_bucket_fp8)
                if self.dist_opt and self.expert_buckets
                else expert_fp8
            )
        if self.gpath is None:
            plan = optimizer_steps(
                params, shard, self.ctx.b, self.grad_bytes, self.ctx.precision, fp8, self.ctx.fp8_recipe,
                fp8_shard,
            )  # fmt: skip
        else:
            gw = self.gpath.optimizer_grad_bytes
            plan = optimizer_steps(
                params, shard, self.ctx.b, gw, self.ctx.precision, fp8, self.ctx.fp8_recipe
            )
            plan = legacy_optimizer(plan, self.gpath, params, self._all_tensors())
        first_copy: Op | None = None  # chunk 0's parameter copy, after which its AllGather leaves (opt_first)
        if self.opt_first and self.chunk0_bucket >= 0:
            plan, first_copy = self._chained_steps(params, shard, fp8, fp8_shard)
        if self.ctx.fw.autograd_grad_accum:
            # Gradients in the parameters' .grad are set to None, not zeroed (InternLM 4a3d156
            # hybrid_zero_optim.py zero_grad(set_to_none=True)): no zeroing kernel.
            plan = replace(plan, after=tuple(s for s in plan.after if s.op != "zero_grad"))
        if self.ctx.fw.torch_adamw:
            # torch.optim.AdamW(foreach=True) on the FP32 parameters (Framework.torch_adamw): its foreach
            # calls on the rank's shard, no parameter copy, gradients set to None
            adam = Op(
                "optimizer", "opt", ADAM_FLOPS_PER_PARAM * shard, ADAMW_FOREACH_BYTES * shard, (shard,), False,
                kernels=ADAMW_FOREACH_KERNELS,
            )  # fmt: skip
            after = (adam if s.op == "optimizer" else s for s in plan.after)
            plan = replace(plan, after=tuple(s for s in after if s.op not in ("zero_grad", "param_copy")))
        # Megatron's pipeline schedule waits for its outstanding sends before it returns, so the step
        # starts after the last send to each peer (the rewriter moves these edges onto its reshard sends).
        # Without the edge, a one-op-at-a-time communication slot (ASTRA-sim's rule) could take the
        # grad-norm AllReduce, which needs the previous stage, before the send that stage waits for.
        last_send = {(c, side, k): nid for nid, send, c, side, k in self.p2p_log if send}
        pred = [*deps, *sorted(last_send.values())]
        for s in (*plan.before, *plan.after):
            tags = self._tags(0, "opt", NO_MICRO_BATCH)
            if isinstance(s, Op):
                micros, exact = g.duration(self.gpu, s)
                extra = [g.attr(A.NUM_OPS, s.flops), g.attr(A.TENSOR_SIZE, s.bytes), exact]
                self._cost = (s.kernels, int(exact.int64_val))
                nid = self._add(f"{s.op}.opt", pb.COMP_NODE, pred, [], micros, tags + extra)
                if s is first_copy:
                    # overlap_param_gather_with_optimizer_step: chunk 0's AllGather, dispatched right after its
                    # optimizer's step and waited for by the next iteration's first forward (in this one-step
                    # period: its end), under the other chunks' step
                    self._bucket_gather(self.chunk0_bucket, [nid])
                    pred = [nid]
                    continue
                if s.op == "param_copy":
                    # The updated parameters exist from here. Without overlap_param_gather, Megatron's
                    # optimizer.step() all-gathers them before it returns, and the next iteration (its
                    # zero_grad_buffer, TE's FP8 weight casts) starts after that: the ops that follow wait.
                    last = self.param_gathers(nid)
                    pred = [nid] if last is None else [nid, last]
                    continue
            elif self.mp_pg:
                extra = [
                    g.attr(A.COMM_TYPE, COMM_KIND[s.kind]),
                    g.attr(A.COMM_SIZE, s.size),
                    g.attr(A.PG_NAME, self.mp_pg),
                ]
                nid = self._add(f"{s.op}.opt", pb.COMM_COLL_NODE, pred, [], 0, tags + extra)
                self.mp_ids.append(nid)
            else:
                self.read_on_host(s.op, pred[-1])
                continue
            pred = [nid]
            self.read_on_host(s.op, nid)

    def _chained_steps(
        self, params: int, shard: int, fp8: int, fp8_shard: int | None
    ) -> tuple[OptimizerStep, Op]:
        """overlap_param_gather_with_optimizer_step: Megatron-Core's ChainedOptimizer of two distributed
        optimizers, model chunk 0's and the others' (optimizer/__init__.py get_megatron_optimizer). Its step
        (optimizer.py ChainedOptimizer.step, core_r0.11.0): each one's gradient norm and its AllReduce, each
        one's clipping, then step_with_ready_grads: chunk 0's Adam and parameter copy, chunk 0's AllGather
        (start_param_sync(force_dispatch=True)), the others' Adam and copy; each chunk's gradient buffer is
        zeroed for the next iteration. Returns the steps in that order and chunk 0's parameter copy."""
        m, sh, ch = self.gen.model, self.ctx.sh, self.st.chunks[0]
        layers = ch.end - ch.start + 1
        params0 = rank_params(m, sh, layers, ch.first and self.emb is not None, False)
        shard0 = self.plan_buckets[self.chunk0_bucket][0] // self.dp
        fp8_0 = linear_params(m, sh, layers) if fp8 else 0
        fp8_shard0 = None if fp8_shard is None else self.bucket_fp8[self.chunk0_bucket] // self.dp
        fp8_shard1 = None if fp8_shard is None or fp8_shard0 is None else fp8_shard - fp8_shard0
        c = self.ctx
        one = optimizer_steps(
            params0, shard0, c.b, self.grad_bytes, c.precision, fp8_0, c.fp8_recipe, fp8_shard0
        )
        rest = optimizer_steps(
            params - params0, shard - shard0, c.b, self.grad_bytes, c.precision, fp8 - fp8_0, c.fp8_recipe,
            fp8_shard1,
        )  # fmt: skip
        clip = tuple(s for p in (one, rest) for s in p.after if s.op == "grad_clip")
        zero = tuple(s for p in (one, rest) for s in p.after if s.op == "zero_grad")
        step = tuple(s for p in (one, rest) for s in p.after if s.op not in ("grad_clip", "zero_grad"))
        first_copy = next(s for s in one.after if s.op == "param_copy")
        return OptimizerStep(one.before + rest.before, clip + step + zero), first_copy

    # -- the host thread (tracegen.host) ------------------------------------------------------------------
    def read_on_host(self, op: str, nid: int) -> None:
        """The host reads the result of the optimizer's `op` (ending at node `nid`) if Megatron does."""
        if self.hostline is not None and op in HOST_READS:
            self.host_sync(nid)

    def host_sync(self, kernel: int | Sequence[int], syncs: int = 1) -> None:
        """The host waits for `kernel` (or all of several) here, `syncs` times back to back: the launches
        up to the wait go into a host node of their own."""
        assert self.hostline is not None
        kernels = [kernel] if isinstance(kernel, int) else list(kernel)
        gate = self.hostline.sync(kernels, syncs)
        # none when the last host node already ends where the host reaches the read, or when the node would
        # carry no host time and wait only for kernels the next host node waits for (cuda_launch_blocking)
        if gate is not None and (gate[0] or (gate[1] and not set(gate[1]) <= set(kernels))):
            self.hostline.prev = self._host_node("read", gate)

    def moe_sync(self, s: AllToAll, pred: int | None, phase: str) -> None:
        """Megatron-Core's dropless all-to-all dispatcher synchronises before the dispatch all-to-all of
        every forward (and recomputed forward): its sizes are the routing's token counts, copied to the host
        (MoEAlltoAllTokenDispatcher.preprocess, cuda_sync_point "before_ep_alltoall"; with one local expert
        and no EP "before_finish", the end of the permutation: here the same point). Token dropping with a
        capacity factor is taken as Megatron's drop-and-pad, whose fixed sizes need no sync. The allgather
        dispatcher's `tokens_per_expert.cpu()` (after its gathers) and DeepEP's host wait for the received
        counts are taken at the same point, with or without a capacity factor."""
        moe = self.gen.model.moe
        if (
            self.hostline is not None
            and moe is not None
            # the all-gather dispatcher copies its experts' token counts to the host (tokens_per_expert .cpu())
            # and DeepEP's dispatch waits on the host for the received counts, capacity factor or not
            and (not moe.capacity_factor or bool(self.gen.dep.moe_token_dispatcher_type))
            and s.op == "moe_dispatch"
            and s.group != "node"  # DeepEP's legs: one wait for the received counts, before the first
            and (phase or self._phase) != "bwd"
            and pred is not None
        ):
            self.host_sync(pred)

    def _launch_cost(self, ntype: int) -> tuple[int, int]:
        """(kernel launches, a lower bound of its time in ns) of the node `_add` emits next: a compute node
        its op's kernels (set by its caller in `_cost`), a collective or send one, a receive none (posted in
        the same NCCL group launch as its sends: Megatron's batched isend/irecv), an all-to-all's P2P pairs
        one in all (NCCL's grouped all-to-all)."""
        if ntype == pb.COMP_NODE:
            cost, self._cost = self._cost or (1, 0), None
            return cost
        if self._a2a:
            first, self._a2a = self._a2a == "first", "rest"
            return (1 if first else 0), 0
        return (0 if ntype == pb.COMM_RECV_NODE else 1), 0

    def _host_node(self, kernel: str, gate: Gate) -> int:
        """A host node (a CPU op of gate's ns) after the previous one and the sync it waits for."""
        g = self.gen
        ns, wait, prev = gate
        phase, layer, mb = self._tag
        extra = [g.attr(A.IS_CPU_OP, True), g.attr(A.DURATION_NS, ns)]
        micros = max(1, (ns + 500) // 1000) if ns else 0
        data, ctrl = list(wait), ([prev] if prev >= 0 else [])
        head = self._head(layer, phase, mb)
        return self._append(f"host:{kernel}", pb.COMP_NODE, data, ctrl, micros, head + g.attrs_bytes(extra))

    def param_gathers(self, after: int) -> int | None:
        """Distributed optimizer without overlap_param_gather: the AllGathers of the updated parameters,
        bucket by bucket on the DP stream after node `after`; the last one's id (None when there are none)."""
        # Megatron-FSDP optim_grads_params without overlap_param_gather: start_param_sync gathers every bucket
        # after the step (megatron_fsdp.py, its force_sync branch) and the next forward finds them gathered.
        mfsdp_sync = self.mfsdp == "optim_grads_params" and not self.gen.dep.overlap_param_gather
        dense = () if self.gather_ahead or (self.fsdp and not mfsdp_sync) else self.buckets
        prev = self._gathers(
            "dp_param_allgather", dense, self.dp, self.dp_pg or "", after, [], self.sync_ids, self.bucket_fp8
        )
        if self.expert_buckets and not self.expert_ahead:  # the experts' shards over the expert-DP group
            assert self.ep is not None
            # after the dense gathers: the step's next ops then wait for the last gather of either kind
            prev = self._gathers(
                "expert_dp_param_allgather", self.expert_buckets, self.edp, self.ep[3], after, prev,
                self.expert_sync_ids, self.expert_bucket_fp8,
            )  # fmt: skip
        return prev[-1] if prev else None

    def fp8_split(self, layer: int) -> tuple[int, int]:
        """(dense, expert) FP8 linear weights of `layer` on this rank under fp8_params ((0, 0) otherwise):
        the expert part goes with the expert-DP buckets, the rest with the dense ones (all of it without EP
        groups, where the experts sit in the dense buckets)."""
        if not self.layer_fp8:
            return 0, 0
        m = self.gen.model
        if m.moe is None:
            return self.layer_fp8, 0
        dense, expert = fp8_layer_split(m, self.ctx.sh, layer, self.ep[0] if self.ep else 1)
        return (dense, expert) if self.ep is not None else (dense + expert, 0)

    def gather_bytes(self, padded: int, fp8: int, group: int) -> int:
        """Bytes of one rank's shard of a padded bucket in the AllGather over `group` ranks: the parameters'
        dtype, the bucket's `fp8` FP8 linear weights (fp8_params) at 1 byte."""
        return padded // group * self.ctx.b - fp8 // group * (self.ctx.b - 1)

    def _gathers(
        self,
        name: str,
        buckets,
        group: int,
        pg: str,
        after: int,
        prev: list[int],
        ids: list[int],
        fp8: Sequence[int] = (),
    ) -> list[int]:
        """One AllGather per bucket, in order after `prev`: each rank's shard (per-rank input, the ASTRA-sim
        convention) in the parameters' dtype (`fp8[i]` FP8 weights of bucket i at 1 byte), back to every
        rank of the `group`-rank group `pg`."""
        g = self.gen
        for i, padded in enumerate(buckets):
            extra = [
                g.attr(A.COMM_TYPE, pb.ALL_GATHER),
                g.attr(A.COMM_SIZE, self.gather_bytes(padded, fp8[i] if fp8 else 0, group)),
                g.attr(A.PG_NAME, pg),
            ]
            nid = self._add(
                f"{name}.bucket{i}", pb.COMM_COLL_NODE, [after], prev, 0,
                self._tags(0, "sync", NO_MICRO_BATCH) + extra,
            )  # fmt: skip
            ids.append(nid)
            prev = [nid]
        return prev
