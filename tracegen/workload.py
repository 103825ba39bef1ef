"""The workload generator: a validated Deployment -> per-rank Chakra graphs (a TraceBundle).

Every rank's graph is its device group's program (MIMD across groups; ranks of a group differ only in
rank ids, peers and, with uneven TP, one head). Compute nodes and blocking TP collectives form one chain
per rank in schedule order (ctrl deps), so a replayer needs no knowledge of pipeline schedules; P2P sends,
posted receives and data-parallel AllReduces hang off that chain and overlap with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tracegen import deployment_pb2 as dpb
from tracegen.bundle import TraceBundle
from tracegen.catalog import GpuSpec
from tracegen.errors import GeneratorError
from tracegen.models import ModelArch
from tracegen.ops import (
    Ctx,
    Op,
    Step,
    duration_micros,
    embedding_steps,
    head_steps,
    layer_steps,
    optimizer_op,
    rank_params,
    shard_of,
)
from tracegen.profile import ProfileTable, build_table, make_row
from tracegen.schedule import BWD, stage_order
from tracegen.spec import gpu_specs, model_arch, replicas
from traces import attrs as A
from traces import pb

COMM_KIND = {"all_reduce": pb.ALL_REDUCE, "all_gather": pb.ALL_GATHER, "reduce_scatter": pb.REDUCE_SCATTER}
NO_MICRO_BATCH = -1  # micro_batch of nodes that span the iteration (optimizer, DP gradient sync)
ACT_TAG, GRAD_TAG = 0, 1  # comm_tag = 2 * micro_batch + direction


def generate(deployment: dpb.Deployment, *, rewrite: bool = True) -> TraceBundle:
    """Per-rank graphs of one training iteration; with `rewrite`, heterogeneous sync/reshard is inserted."""
    bundle = _Generator(deployment).run()
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

        bundle = rewrite_bundle(bundle, deployment, deployment.reshard or "xsim")
    return bundle


def is_homogeneous(deployment: dpb.Deployment) -> bool:
    """True when every DP replica cuts the same layers into the same stages with the same TP degrees."""
    reps = list(replicas(deployment).values())
    layout = [(d.layer_start, d.layer_end, d.tp) for d in reps[0]]
    return all([(d.layer_start, d.layer_end, d.tp) for d in r] == layout for r in reps[1:])


def p2p_sources(t_src: int, t_dst: int) -> list[tuple[int, int]]:
    """Naive stage-boundary mapping as (src local, dst local) pairs: dst j receives from src j mod t_src."""
    return [(j % t_src, j) for j in range(t_dst)]


def peer_locals(my_tp: int, other_tp: int, local: int, send: bool) -> list[int]:
    """Local indices in the adjacent group that TP rank `local` sends to (or receives from), in order."""
    if send:
        return [d for s, d in p2p_sources(my_tp, other_tp) if s == local]
    return [s for s, d in p2p_sources(other_tp, my_tp) if d == local]


@dataclass(frozen=True)
class _Stage:
    """One device group seen as a pipeline stage of its replica."""

    dg: dpb.DeviceGroup
    index: int
    count: int
    prev: dpb.DeviceGroup | None
    next: dpb.DeviceGroup | None


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
        self.bundle = TraceBundle(nodes={})
        self._attr_cache: dict[tuple[str, type, Any], pb.AttributeProto] = {}
        self._dur_cache: dict[tuple[str, Op], int] = {}

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

    def duration(self, gpu: str, op: Op) -> int:
        key = (gpu, op)
        d = self._dur_cache.get(key)
        if d is None:
            d = self._dur_cache[key] = duration_micros(op, self.gpus[gpu], self.profile)
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
                    for r in members:
                        dp_groups[r] = name
        for stages in reps.values():
            for k, dg in enumerate(stages):
                st = _Stage(
                    dg,
                    k,
                    len(stages),
                    stages[k - 1] if k else None,
                    stages[k + 1] if k + 1 < len(stages) else None,
                )
                template: _RankProgram | None = None
                for local, rank in enumerate(dg.ranks):
                    if template is not None and self._same_shape(st, 0, local):
                        nodes = self._clone(template, local, rank, dp_groups.get(rank))
                    else:
                        prog = _RankProgram(
                            self, st, local, rank, tp_groups.get(dg.id, ""), dp_groups.get(rank)
                        )
                        nodes = prog.build()
                        if local == 0 and self.clone:
                            template = prog
                    self.bundle.nodes[rank] = nodes
                    self.bundle.next_id[rank] = len(nodes)
        self.bundle.nodes = dict(sorted(self.bundle.nodes.items()))
        self.bundle.next_id = dict(sorted(self.bundle.next_id.items()))
        return self.bundle

    def _same_shape(self, st: _Stage, a: int, b: int) -> bool:
        """Whether TP ranks a and b of a stage get the same graph up to peers and group names."""

        def shape(local: int) -> tuple:
            sends = [len(peer_locals(st.dg.tp, o.tp, local, True)) if o else 0 for o in (st.prev, st.next)]
            return (shard_of(self.model, st.dg.tp, local), *sends)

        return shape(a) == shape(b)

    def _clone(self, template: _RankProgram, local: int, rank: int, dp_pg: str | None) -> list[pb.Node]:
        """Copies of the template rank's nodes with this rank's P2P peers and DP group patched in."""
        nodes = []
        for n in template.nodes:
            c = pb.Node()
            c.CopyFrom(n)
            nodes.append(c)
        dg = template.st.dg
        for nid, send, other, k in template.p2p_log:
            peer = other.ranks[peer_locals(dg.tp, other.tp, local, send)[k]]
            n = nodes[nid]
            src, dst = (rank, peer) if send else (peer, rank)
            for a in n.attr:
                if a.name == A.COMM_SRC:
                    a.int32_val = src
                elif a.name == A.COMM_DST:
                    a.int32_val = dst
            n.name = f"{n.name.rsplit('.', 1)[0]}.{'to' if send else 'from'}{peer}"
        for nid in template.sync_ids:
            for a in nodes[nid].attr:
                if a.name == A.PG_NAME:
                    a.string_val = dp_pg or ""
        return nodes


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
        )
        self.nodes: list[pb.Node] = []
        self.frontier: int | None = None  # last node of the compute/TP chain
        self.base = [gen.attr(A.STAGE, st.index), gen.attr(A.DEVICE_GROUP, dg.id)]
        self.first = st.index == 0
        self.last = st.index == st.count - 1
        self.layer_fwd = {p: layer_steps(self.ctx, p) for p in ("fwd", "bwd")}
        self.emb = {p: embedding_steps(self.ctx, p) for p in ("fwd", "bwd")} if self.first else None
        self.head = {p: head_steps(self.ctx, p) for p in ("fwd", "bwd")} if self.last else None
        self.last_fwd: dict[int, int] = {}
        self.p2p_log: list[
            tuple[int, bool, dpb.DeviceGroup, int]
        ] = []  # (node, send?, peer group, k-th peer)

    # -- node emission -------------------------------------------------------------------------------
    def _tags(self, layer: int, phase: str, mb: int) -> list[pb.AttributeProto]:
        g = self.gen
        return [g.attr(A.LAYER, layer), g.attr(A.PHASE, phase), g.attr(A.MICRO_BATCH, mb), *self.base]

    def _add(
        self, name: str, ntype: int, data: Sequence[int], ctrl: Sequence[int], dur: int, attrs: list
    ) -> int:
        nid = len(self.nodes)
        self.nodes.append(
            pb.Node(
                id=nid, name=name, type=ntype, duration_micros=dur, data_deps=data, ctrl_deps=ctrl, attr=attrs
            )
        )
        return nid

    def step(self, s: Step, pred: int | None, layer: int, mb: int, label: str) -> int:
        """Emit one chained op or TP collective depending on `pred`; it becomes the chain's frontier."""
        g = self.gen
        data = [] if pred is None else [pred]
        ctrl = [] if self.frontier is None or self.frontier == pred else [self.frontier]
        tags = self._tags(layer, s.phase if isinstance(s, Op) else self._phase, mb)
        if isinstance(s, Op):
            extra = [g.attr(A.NUM_OPS, s.flops), g.attr(A.TENSOR_SIZE, s.bytes)]
            nid = self._add(
                f"{label}{s.op}.{s.phase}.mb{mb}",
                pb.COMP_NODE,
                data,
                ctrl,
                g.duration(self.gpu, s),
                tags + extra,
            )
        else:
            extra = [
                g.attr(A.COMM_TYPE, COMM_KIND[s.kind]),
                g.attr(A.COMM_SIZE, s.size),
                g.attr(A.PG_NAME, self.tp_pg),
            ]
            nid = self._add(
                f"{label}{s.op}.{self._phase}.mb{mb}", pb.COMM_COLL_NODE, data, ctrl, 0, tags + extra
            )
        self.frontier = nid
        return nid

    def steps(self, steps: list[Step], pred: int | None, layer: int, mb: int) -> int | None:
        label = f"L{layer}." if layer else ""
        for s in steps:
            pred = self.step(s, pred, layer, mb, label)
        return pred

    def p2p(
        self, send: bool, peer: int, size: int, layer: int, mb: int, direction: int, data: Sequence[int]
    ) -> int:
        g = self.gen
        phase = "fwd" if direction == ACT_TAG else "bwd"
        what = "act" if direction == ACT_TAG else "grad"
        src, dst = (self.rank, peer) if send else (peer, self.rank)
        extra = [
            g.attr(A.COMM_SRC, src),
            g.attr(A.COMM_DST, dst),
            g.attr(A.COMM_TAG, 2 * mb + direction),
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

    def recv_from(self, other: dpb.DeviceGroup, layer: int, mb: int, direction: int) -> int | None:
        """Post the receive of this rank's slice from stage `other` (None when the mapping sends it nothing)."""
        ids = []
        for k, s in enumerate(peer_locals(self.st.dg.tp, other.tp, self.local, False)):
            ids.append(self.p2p(False, other.ranks[s], self._p2p_size(other.tp), layer, mb, direction, []))
            self.p2p_log.append((ids[-1], False, other, k))
        return ids[0] if ids else None

    def send_to(self, other: dpb.DeviceGroup, layer: int, mb: int, direction: int, after: int) -> None:
        size = self._p2p_size(self.st.dg.tp)
        for k, d in enumerate(peer_locals(self.st.dg.tp, other.tp, self.local, True)):
            nid = self.p2p(True, other.ranks[d], size, layer, mb, direction, [after])
            self.p2p_log.append((nid, True, other, k))

    # -- passes ---------------------------------------------------------------------------------------
    def forward(self, mb: int) -> None:
        dg = self.st.dg
        self._phase = "fwd"
        pred = None
        if self.st.prev is not None:
            pred = self.recv_from(self.st.prev, dg.layer_start, mb, ACT_TAG)
        if self.emb is not None:
            pred = self.steps(self.emb["fwd"], pred, 0, mb)
        for layer in range(dg.layer_start, dg.layer_end + 1):
            pred = self.steps(self.layer_fwd["fwd"], pred, layer, mb)
        if self.head is not None:
            pred = self.steps(self.head["fwd"], pred, 0, mb)
        assert pred is not None
        self.last_fwd[mb] = pred
        if self.st.next is not None:
            self.send_to(self.st.next, dg.layer_end, mb, ACT_TAG, pred)

    def backward(self, mb: int, sync: bool) -> None:
        dg = self.st.dg
        self._phase = "bwd"
        pred: int | None = self.last_fwd[mb]
        if self.st.next is not None:
            pred = self.recv_from(self.st.next, dg.layer_end, mb, GRAD_TAG)
        m, sh = self.gen.model, self.ctx.sh
        if self.head is not None:
            pred = self.steps(self.head["bwd"], pred, 0, mb)
            if sync:
                self.bucket_add(m.norm_params + sh.vocab * m.hidden, 0)
        layer_grad = rank_params(m, sh, 1, False, False)
        for layer in range(dg.layer_end, dg.layer_start - 1, -1):
            pred = self.steps(self.layer_fwd["bwd"], pred, layer, mb)
            if sync:
                self.bucket_add(layer_grad, layer)
        if self.emb is not None:
            pred = self.steps(self.emb["bwd"], pred, 0, mb)
            if sync:
                self.bucket_add(sh.vocab * m.hidden, 0)
        if sync:
            self.bucket_flush(0)
        if self.st.prev is not None and pred is not None:
            self.send_to(self.st.prev, dg.layer_start, mb, GRAD_TAG, pred)

    # -- data-parallel gradient buckets (homogeneous deployments only) --------------------------------
    def bucket_add(self, params: int, layer: int) -> None:
        """Gradients of `params` became ready at the frontier; close the bucket once it is full."""
        self.pending += params * self.ctx.b
        if self.pending >= self.gen.dep.dp_bucket_bytes:
            self.bucket_flush(layer)

    def bucket_flush(self, layer: int) -> None:
        if self.pending <= 0 or self.dp_pg is None:
            self.pending = 0
            return
        g = self.gen
        ctrl = [self.sync_ids[-1]] if self.sync_ids else []  # buckets run in order, as on one NCCL stream
        extra = [
            g.attr(A.COMM_TYPE, pb.ALL_REDUCE),
            g.attr(A.COMM_SIZE, self.pending),
            g.attr(A.PG_NAME, self.dp_pg),
        ]
        assert self.frontier is not None
        nid = self._add(
            f"dp_grad_allreduce.bucket{len(self.sync_ids)}", pb.COMM_COLL_NODE, [self.frontier], ctrl, 0,
            self._tags(layer, "sync", NO_MICRO_BATCH) + extra,
        )  # fmt: skip
        self.sync_ids.append(nid)
        self.pending = 0

    def build(self) -> list[pb.Node]:
        dep = self.gen.dep
        self.pending = 0
        self.sync_ids: list[int] = []
        order = stage_order(dep.schedule, dep.micro_batches, self.st.count, self.st.index)
        last_b = max(mb for kind, mb in order if kind == BWD)
        for kind, mb in order:
            if kind == BWD:
                self.backward(mb, sync=self.dp_pg is not None and mb == last_b)
            else:
                self.forward(mb)
        self.finish()
        return self.nodes

    def finish(self) -> None:
        g, m, dg = self.gen, self.gen.model, self.st.dg
        deps = [self.frontier] if self.frontier is not None else []
        if self.sync_ids:
            deps.append(self.sync_ids[-1])
        if self.ctx.sp and dg.tp > 1:
            # Sequence parallelism leaves norm-weight gradients partial per TP rank: Megatron all-reduces them.
            norm_grads = (2 * (dg.layer_end - dg.layer_start + 1) + (1 if self.last else 0)) * m.norm_params
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
        params = rank_params(m, self.ctx.sh, dg.layer_end - dg.layer_start + 1, self.first, self.last)
        op = optimizer_op(params, self.ctx.b)
        extra = [g.attr(A.NUM_OPS, op.flops), g.attr(A.TENSOR_SIZE, op.bytes)]
        self._add(
            "optimizer.opt",
            pb.COMP_NODE,
            deps,
            [],
            g.duration(self.gpu, op),
            self._tags(0, "opt", NO_MICRO_BATCH) + extra,
        )
