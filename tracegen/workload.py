"""The workload generator: a validated Deployment -> per-rank Chakra graphs (a TraceBundle).

Every rank's graph is its device group's program (MIMD across groups; ranks of a group differ only in
rank ids, peers and, with uneven TP, one head). Compute nodes and blocking TP collectives form one chain
per rank in schedule order (ctrl deps), so a replayer needs no knowledge of pipeline schedules; P2P sends,
posted receives and data-parallel AllReduces hang off that chain and overlap with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from operator import methodcaller
from typing import Any

from tracegen import deployment_pb2 as dpb
from tracegen.bundle import RankTwins, TraceBundle
from tracegen.catalog import GpuSpec
from tracegen.errors import GeneratorError
from tracegen.frameworks import DEFAULT_FRAMEWORK, framework
from tracegen.models import ModelArch
from tracegen.ops import (
    Ctx,
    Op,
    Step,
    attn_core_recompute,
    duration_micros,
    duration_ns,
    embedding_steps,
    head_steps,
    layer_steps,
    linear_params,
    optimizer_steps,
    rank_params,
    shard_of,
    with_selective_recompute,
)
from tracegen.profile import ProfileTable, build_table, make_row
from tracegen.rank_nodes import CopiedRank, RankNodes, Records
from tracegen.schedule import BWD, interleaved, stage_order
from tracegen.spec import chunk_ranges, gpu_specs, model_arch, replicas
from traces import attrs as A
from traces import pb
from traces.et_stream_pb2 import NodeBatch

COMM_KIND = {"all_reduce": pb.ALL_REDUCE, "all_gather": pb.ALL_GATHER, "reduce_scatter": pb.REDUCE_SCATTER}
RECOMPUTE = "recompute"  # phase tag of recomputed forward ops
# Positions of the attributes _clone patches: _RankProgram._tags puts layer, phase, micro_batch, stage and
# device_group first on every node; collectives follow with comm_type, comm_size and pg_name.
_DEVICE_GROUP_AT, _PG_NAME_AT = 4, 7
_COMM_SRC_AT = 5  # P2P nodes: comm_src, then comm_dst, right after those five
NO_MICRO_BATCH = -1  # micro_batch of nodes that span the iteration (optimizer, DP gradient sync)
ACT_TAG, GRAD_TAG = 0, 1  # comm_tag = 2 * micro_batch + direction (+ 2 * M * boundary chunk, interleaved)
# Megatron's distributed optimizer keeps the gradient buffer in FP32 for BF16 training
# (megatron/training/arguments.py: "bfloat16 requires gradient accumulation and all-reduce to be done in
# fp32", accumulate_allreduce_grads_in_fp32), and reduce-scatters that buffer.
DIST_OPT_GRAD_BYTES = 4
# It pads every bucket to a multiple of lcm(DP, 128) elements so each DP rank's shard is equal and
# 256-byte aligned (megatron/core/distributed/param_and_grad_buffer.py, _pad_end_of_bucket_if_needed).
DIST_OPT_PAD_ELEMENTS = 128


def generate(deployment: dpb.Deployment, *, rewrite: bool = True) -> TraceBundle:
    """Per-rank graphs of one training iteration; with `rewrite`, heterogeneous sync/reshard is inserted."""
    gen = _Generator(deployment)
    bundle = gen.run()
    if rewrite:
        # Imported here: the rewriter (tracegen.planner.rewrite) builds on this module, not the other way round.
        try:
            from tracegen.planner.rewrite import rewrite_bundle
        except ModuleNotFoundError as exc:
            if exc.name != "tracegen.planner.rewrite":
                raise
            raise GeneratorError(
                "the graph rewriter (tracegen.planner.rewrite) is not installed: generate without rewrite"
            ) from None

        if deployment.virtual_stages <= 1:
            # Interleaved plans are homogeneous with one TP degree (the spec checks it): the rewriter would
            # insert nothing, and its planner reads one contiguous layer range per stage.
            bundle = rewrite_bundle(bundle, deployment, deployment.reshard or "xsim", twins=gen.twins())
    return bundle


def dist_opt_bucket(params: int, dp: int) -> int:
    """Elements of one distributed-optimizer bucket after Megatron's padding to a multiple of lcm(DP, 128)."""
    q = math.lcm(dp, DIST_OPT_PAD_ELEMENTS)
    return -(-params // q) * q


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


class _Generator:
    def __init__(self, dep: dpb.Deployment, *, clone: bool = True) -> None:
        self.dep = dep
        self.clone = clone  # copy a group's first rank for structurally identical ranks (speed only)
        self.model: ModelArch = model_arch(dep)
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
        self._dur_cache: dict[tuple[str, Op], int] = {}
        self.dp_members: dict[str, list[int]] = {}  # DP group name -> its ranks
        self.mp_groups: dict[int, str] = {}  # rank -> its grad-norm AllReduce group ("" when alone)
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

    def run(self) -> TraceBundle:
        reps = replicas(self.dep)
        tp_groups = {dg.id: self.bundle.new_group(dg.ranks) for dg in self.dep.device_groups if dg.tp > 1}
        dp_groups: dict[int, str] = {}  # rank -> pg_name of its DP gradient group
        if len(reps) > 1 and is_homogeneous(self.dep):
            stages = list(reps.values())
            for k in range(len(stages[0])):
                for j in range(stages[0][k].tp):
                    members = [rep[k].ranks[j] for rep in stages]
                    name = self.bundle.new_group(members)
                    self.dp_members[name] = members
                    for r in members:
                        dp_groups[r] = name
        # The optimizer's gradient-norm AllReduce: over each replica's model-parallel ranks (TP x PP), or over
        # every rank under the distributed optimizer, whose DP ranks hold disjoint shards (Megatron's
        # get_grad_stats_parallel_group). A group of one rank needs no collective.
        if self.dep.distributed_optimizer:
            world = sorted(r for dg in self.dep.device_groups for r in dg.ranks)
            world_pg = self.bundle.new_group(world) if len(world) > 1 else ""
            self.mp_groups = {r: world_pg for r in world}
        else:
            for stages in reps.values():
                members = sorted(r for dg in stages for r in dg.ranks)
                name = self.bundle.new_group(members) if len(members) > 1 else ""
                for r in members:
                    self.mp_groups[r] = name
        # Ranks of one shape (_shape_key: same program up to group ids, group names and P2P peers), within
        # a device group or across replicas, are copies of the first one built with those patched in.
        templates: dict[tuple, _RankProgram] = {}
        for stages in reps.values():
            for k, dg in enumerate(stages):
                st = _stage(stages, k)
                tp_pg = tp_groups.get(dg.id, "")
                for local, rank in enumerate(dg.ranks):
                    dp_pg = dp_groups.get(rank)
                    key = self._shape_key(st, local, dp_pg) if self.clone else None
                    template = templates.get(key) if key is not None else None
                    if template is not None:
                        copy = self._clone(template, st, local, rank, tp_pg, dp_pg)
                        self.bundle.nodes.set_copy(rank, copy)
                        self.bundle.next_id[rank] = len(copy)
                    else:
                        template = _RankProgram(self, st, local, rank, tp_pg, dp_pg)
                        nodes = template.build()
                        if key is not None:
                            templates[key] = template
                        self.bundle.nodes[rank] = nodes
                        self.bundle.next_id[rank] = len(nodes)
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
        return (dg.gpu, tp, dg.micro_batch, shard_of(self.model, tp, local), st.index, st.count, chunks, dp)

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
            if own not in template.blobs:
                template.blobs[own] = Records.of_batch(NodeBatch(nodes=template.nodes).SerializeToString())
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
        if dp_pg != template.dp_pg:
            for nid in template.sync_ids:
                n = records.node(nid)
                n.attr[_PG_NAME_AT].string_val = dp_pg or ""
                patches[nid] = n.SerializeToString()
        mp_pg = self.mp_groups.get(rank, "")
        if mp_pg != template.mp_pg:
            for nid in template.mp_ids:
                n = records.node(nid)
                n.attr[_PG_NAME_AT].string_val = mp_pg
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
            old = _attr_bytes(self.attr(A.DEVICE_GROUP, template.st.dg.id))
            counts = list(map(methodcaller("count", old), payloads))
            if counts.count(1) != len(counts):
                return self._group_records_parsed(template, own, dg_id, tp_pg)
            payloads = list(
                map(methodcaller("replace", old, _attr_bytes(self.attr(A.DEVICE_GROUP, dg_id))), payloads)
            )
        if tp_pg != template.tp_pg:
            old, new = (_attr_bytes(self.attr(A.PG_NAME, pg)) for pg in (template.tp_pg, tp_pg))
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
            shard_of(gen.model, dg.tp, local),
            dg.micro_batch,
            dep.seq_len,
            dep.dtype_bytes,
            dep.sequence_parallel,
            dep.precision or "bf16",
            dep.attention or "flash",
            framework(dep.framework or DEFAULT_FRAMEWORK),
        )
        self.mp_pg = gen.mp_groups.get(rank, "")
        self.mp_ids: list[
            int
        ] = []  # grad-norm (and found-inf) AllReduces: PG_NAME is the model-parallel group
        self.nodes: list[pb.Node] = []
        self.frontier: int | None = None  # last node of the compute/TP chain
        self.base = [gen.attr(A.STAGE, st.index), gen.attr(A.DEVICE_GROUP, dg.id)]
        self.first = st.chunks[0].first
        self.last = st.chunks[-1].last
        self.layer_fwd = {p: layer_steps(self.ctx, p) for p in ("fwd", "bwd")}
        self.recompute = dep.recompute or "none"
        if self.recompute == "selective":
            self.layer_fwd["bwd"] = with_selective_recompute(
                self.layer_fwd["bwd"], attn_core_recompute(self.ctx)
            )
        self.emb = {p: embedding_steps(self.ctx, p) for p in ("fwd", "bwd")} if self.first else None
        self.head = {p: head_steps(self.ctx, p) for p in ("fwd", "bwd")} if self.last else None
        self.num_layers = sum(ch.end - ch.start + 1 for ch in st.chunks)
        self.last_fwd: dict[tuple[int, int], int] = {}
        # (node, send?, model chunk, "prev" | "next" neighbour of that chunk, k-th peer)
        self.p2p_log: list[tuple[int, bool, int, str, int]] = []
        self.tp_ids: list[int] = []  # TP collectives (their PG_NAME is the TP group's)
        self.tags: list[tuple[str, int, int]] = []  # (phase, layer, micro_batch) of every node
        # The nodes serialized once per (device group id, TP group name) they are copied to.
        self.blobs: dict[tuple[int, str], Records] = {}

    # -- node emission -------------------------------------------------------------------------------
    def _tags(self, layer: int, phase: str, mb: int) -> list[pb.AttributeProto]:
        """The leading attributes of every node (positions fixed: _clone patches by position)."""
        g = self.gen
        self._tag = (phase, layer, mb)  # taken by the _add this list is made for
        return [g.attr(A.LAYER, layer), g.attr(A.PHASE, phase), g.attr(A.MICRO_BATCH, mb), *self.base]

    def _add(
        self, name: str, ntype: int, data: Sequence[int], ctrl: Sequence[int], dur: int, attrs: list
    ) -> int:
        nid = len(self.nodes)
        self.tags.append(self._tag)
        self.nodes.append(
            pb.Node(
                id=nid, name=name, type=ntype, duration_micros=dur, data_deps=data, ctrl_deps=ctrl, attr=attrs
            )
        )
        return nid

    def step(self, s: Step, pred: int | None, layer: int, mb: int, label: str, phase: str = "") -> int:
        """Emit one chained op or TP collective depending on `pred`; it becomes the chain's frontier.

        `phase` overrides the step's own phase tag (recomputed forward ops keep their forward cost).
        """
        g = self.gen
        data = [] if pred is None else [pred]
        ctrl = [] if self.frontier is None or self.frontier == pred else [self.frontier]
        if isinstance(s, Op) and s.phase == "fwd" and self._phase == "bwd":
            phase = RECOMPUTE  # a forward op inside a backward pass is a recomputation (selective recompute)
        tag = phase or (s.phase if isinstance(s, Op) else self._phase)
        tags = self._tags(layer, tag, mb)
        if isinstance(s, Op):
            micros, exact = g.duration(self.gpu, s)
            extra = [g.attr(A.NUM_OPS, s.flops), g.attr(A.TENSOR_SIZE, s.bytes), exact]
            nid = self._add(f"{label}{s.op}.{tag}.mb{mb}", pb.COMP_NODE, data, ctrl, micros, tags + extra)
        else:
            extra = [
                g.attr(A.COMM_TYPE, COMM_KIND[s.kind]),
                g.attr(A.COMM_SIZE, s.size),
                g.attr(A.PG_NAME, self.tp_pg),
            ]
            nid = self._add(f"{label}{s.op}.{tag}.mb{mb}", pb.COMM_COLL_NODE, data, ctrl, 0, tags + extra)
            self.tp_ids.append(nid)
        self.frontier = nid
        return nid

    def steps(self, steps: list[Step], pred: int | None, layer: int, mb: int, phase: str = "") -> int | None:
        label = f"L{layer}." if layer else ""
        for s in steps:
            pred = self.step(s, pred, layer, mb, label, phase)
        return pred

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
        return self._add(name, ntype, data, [], 0, self._tags(layer, phase, mb) + extra)

    # -- boundary transfers --------------------------------------------------------------------------
    def _p2p_size(self, src_tp: int) -> int:
        c = self.ctx
        tokens = -(-c.tokens // src_tp) if c.sp and src_tp > 1 else c.tokens
        return tokens * c.m.hidden * c.b

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
        for k, s in enumerate(peer_locals(self.st.dg.tp, other.tp, self.local, False)):
            size = self._p2p_size(other.tp)
            ids.append(self.p2p(False, other.ranks[s], size, layer, mb, direction, [], boundary))
            self.p2p_log.append((ids[-1], False, ch.index, side, k))
        return ids[0] if ids else None

    def send_to(
        self, ch: _Chunk, side: str, layer: int, mb: int, direction: int, after: int, boundary: int = 0
    ) -> None:
        other = ch.prev if side == "prev" else ch.next
        assert other is not None
        size = self._p2p_size(self.st.dg.tp)
        for k, d in enumerate(peer_locals(self.st.dg.tp, other.tp, self.local, True)):
            nid = self.p2p(True, other.ranks[d], size, layer, mb, direction, [after], boundary)
            self.p2p_log.append((nid, True, ch.index, side, k))

    # -- passes ---------------------------------------------------------------------------------------
    def forward(self, ch: _Chunk, mb: int) -> None:
        self._phase = "fwd"
        pred = None
        if ch.prev is not None:
            pred = self.recv_from(ch, "prev", ch.start, mb, ACT_TAG, ch.prev_chunk)
        if ch.first and self.emb is not None:
            pred = self.steps(self.emb["fwd"], pred, 0, mb)
        for layer in range(ch.start, ch.end + 1):
            pred = self.steps(self.layer_fwd["fwd"], pred, layer, mb)
        if ch.last and self.head is not None:
            pred = self.steps(self.head["fwd"], pred, 0, mb)
        assert pred is not None
        self.last_fwd[(ch.index, mb)] = pred
        if ch.next is not None:
            self.send_to(ch, "next", ch.end, mb, ACT_TAG, pred, ch.index)

    def recompute_units(self, ch: _Chunk) -> dict[int, range]:
        """Full recompute, Megatron's uniform method: the chunk's layers in units of K from its first layer
        (the last unit shorter when K does not divide them); a unit's forward is recomputed, as a whole,
        right before the backward of its last layer. Keyed by that last layer."""
        k = max(1, self.gen.dep.recompute_layers)
        return {
            min(u + k - 1, ch.end): range(u, min(u + k - 1, ch.end) + 1)
            for u in range(ch.start, ch.end + 1, k)
        }

    def backward(self, ch: _Chunk, mb: int, sync: bool) -> None:
        self._phase = "bwd"
        pred: int | None = self.last_fwd[(ch.index, mb)]
        if ch.next is not None:
            pred = self.recv_from(ch, "next", ch.end, mb, GRAD_TAG, ch.index)
        m, sh = self.gen.model, self.ctx.sh
        if ch.last and self.head is not None:
            pred = self.steps(self.head["bwd"], pred, 0, mb)
            if sync:
                self.bucket_add(m.norm_params + sh.vocab * m.hidden, 0)
        layer_grad = rank_params(m, sh, 1, False, False)
        units = self.recompute_units(ch) if self.recompute == "full" else {}
        for layer in range(ch.end, ch.start - 1, -1):
            for again in units.get(layer, ()):
                pred = self.steps(self.layer_fwd["fwd"], pred, again, mb, RECOMPUTE)
            pred = self.steps(self.layer_fwd["bwd"], pred, layer, mb)
            if sync:
                self.bucket_add(layer_grad, layer)
        if ch.first and self.emb is not None:
            pred = self.steps(self.emb["bwd"], pred, 0, mb)
            if sync:
                self.bucket_add(sh.vocab * m.hidden, 0)
        if sync:
            self.bucket_flush(0)
        if ch.prev is not None and pred is not None:
            self.send_to(ch, "prev", ch.start, mb, GRAD_TAG, pred, ch.prev_chunk)

    # -- data-parallel gradient buckets (homogeneous deployments only) --------------------------------
    def bucket_add(self, params: int, layer: int) -> None:
        """Gradients of `params` became ready at the frontier; close the bucket once it is full."""
        self.pending += params
        if self.pending * self.grad_bytes >= self.gen.dep.dp_bucket_bytes:
            self.bucket_flush(layer)

    def bucket_flush(self, layer: int) -> None:
        """Close the open bucket: an AllReduce of its gradients, or (distributed optimizer) a ReduceScatter
        of the padded FP32 bucket whose parameters are all-gathered after the optimizer step."""
        if self.pending <= 0 or self.dp_pg is None:
            self.pending = 0
            return
        g = self.gen
        ctrl = [self.sync_ids[-1]] if self.sync_ids else []  # buckets run in order, as on one NCCL stream
        if self.dist_opt:
            padded = dist_opt_bucket(self.pending, self.dp)
            self.buckets.append(padded)
            kind, size, what = pb.REDUCE_SCATTER, padded * self.grad_bytes, "dp_grad_reducescatter"
        else:
            kind, size, what = pb.ALL_REDUCE, self.pending * self.grad_bytes, "dp_grad_allreduce"
        extra = [g.attr(A.COMM_TYPE, kind), g.attr(A.COMM_SIZE, size), g.attr(A.PG_NAME, self.dp_pg)]
        assert self.frontier is not None
        nid = self._add(
            f"{what}.bucket{len(self.sync_ids)}", pb.COMM_COLL_NODE, [self.frontier], ctrl, 0,
            self._tags(layer, "sync", NO_MICRO_BATCH) + extra,
        )  # fmt: skip
        self.sync_ids.append(nid)
        self.pending = 0

    def build(self) -> list[pb.Node]:
        dep = self.gen.dep
        self.pending = 0
        self.sync_ids: list[int] = []
        self.dist_opt = dep.distributed_optimizer
        self.dp = len(self.gen.dp_members.get(self.dp_pg, ())) if self.dp_pg else 1
        self.grad_bytes = DIST_OPT_GRAD_BYTES if self.dist_opt else self.ctx.b
        self.buckets: list[int] = []  # padded elements of each distributed-optimizer bucket
        v = len(self.st.chunks)
        if v > 1:
            order = interleaved(dep.micro_batches, self.st.count, self.st.index, v)
        else:
            order = [
                (kind, 0, mb)
                for kind, mb in stage_order(dep.schedule, dep.micro_batches, self.st.count, self.st.index)
            ]
        # Gradients of a model chunk are complete after its last backward: its buckets are synced there.
        last_b = {c: mb for kind, c, mb in order if kind == BWD}
        for kind, c, mb in order:
            ch = self.st.chunks[c]
            if kind == BWD:
                self.backward(ch, mb, sync=self.dp_pg is not None and mb == last_b[c])
            else:
                self.forward(ch, mb)
        self.finish()
        return self.nodes

    def finish(self) -> None:
        g, m, dg = self.gen, self.gen.model, self.st.dg
        deps = [self.frontier] if self.frontier is not None else []
        if self.sync_ids:
            deps.append(self.sync_ids[-1])
        if self.ctx.sp and dg.tp > 1:
            # Sequence parallelism leaves norm-weight gradients partial per TP rank: Megatron all-reduces them.
            norm_grads = (2 * self.num_layers + (1 if self.last else 0)) * m.norm_params
            extra = [
                g.attr(A.COMM_TYPE, pb.ALL_REDUCE),
                g.attr(A.COMM_SIZE, norm_grads * self.ctx.b),
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
        params = rank_params(m, self.ctx.sh, self.num_layers, self.first, self.last)
        # Each DP rank updates its 1/DP shard of every (padded) bucket under the distributed optimizer;
        # with DP 1, or without it, everything.
        shard = sum(b // self.dp for b in self.buckets) if self.dist_opt and self.buckets else params
        grad = DIST_OPT_GRAD_BYTES if self.dist_opt else self.ctx.b
        fp8 = linear_params(m, self.ctx.sh, self.num_layers) if self.ctx.te_fp8 else 0
        plan = optimizer_steps(params, shard, self.ctx.b, grad, self.ctx.precision, fp8)
        pred = deps
        opt = -1
        for s in (*plan.before, *plan.after):
            tags = self._tags(0, "opt", NO_MICRO_BATCH)
            if isinstance(s, Op):
                micros, exact = g.duration(self.gpu, s)
                extra = [g.attr(A.NUM_OPS, s.flops), g.attr(A.TENSOR_SIZE, s.bytes), exact]
                nid = self._add(f"{s.op}.opt", pb.COMP_NODE, pred, [], micros, tags + extra)
                if s.op == "param_copy":
                    opt = nid  # the updated parameters exist from here: the AllGathers start after it
            elif self.mp_pg:
                extra = [
                    g.attr(A.COMM_TYPE, COMM_KIND[s.kind]),
                    g.attr(A.COMM_SIZE, s.size),
                    g.attr(A.PG_NAME, self.mp_pg),
                ]
                nid = self._add(f"{s.op}.opt", pb.COMM_COLL_NODE, pred, [], 0, tags + extra)
                self.mp_ids.append(nid)
            else:
                continue
            pred = [nid]
        prev: list[int] = []
        for i, padded in enumerate(self.buckets):
            # Updated parameters go back to every DP rank: AllGather of the shard (per-rank input, the
            # ASTRA-sim convention) in the parameters' dtype, bucket by bucket on the DP stream.
            extra = [
                g.attr(A.COMM_TYPE, pb.ALL_GATHER),
                g.attr(A.COMM_SIZE, padded // self.dp * self.ctx.b),
                g.attr(A.PG_NAME, self.dp_pg or ""),
            ]
            nid = self._add(
                f"dp_param_allgather.bucket{i}", pb.COMM_COLL_NODE, [opt], prev, 0,
                self._tags(0, "sync", NO_MICRO_BATCH) + extra,
            )  # fmt: skip
            self.sync_ids.append(nid)
            prev = [nid]
