"""The plan of a deployment: DP groups with rings and chunks, routing table, barrier and pipeline groups."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xsim.tracegen import deployment_pb2 as dpb
from xsim.tracegen.models import model_from_message
from xsim.tracegen.planner.barriers import dp_barrier_groups, pipeline_barrier_groups, replica_stages
from xsim.tracegen.planner.chunking import chunk_bytes
from xsim.tracegen.planner.device_groups import DeviceGroupView, view_device_groups
from xsim.tracegen.planner.errors import PlanError
from xsim.tracegen.planner.gradients import layer_grad_bytes
from xsim.tracegen.planner.rings import build_rings, lcm_of
from xsim.tracegen.planner.sweep import Segment, sync_segments


@dataclass(frozen=True)
class DpGroup:
    """One DP synchronization group (Algorithm 1) with its multi-rings (Algorithm 2) and chunks (Algorithm 3)."""

    id: int
    layers: tuple[int, int]
    device_groups: tuple[int, ...]
    tps: tuple[int, ...]
    ranks: tuple[int, ...]
    lcm: int
    rings: tuple[tuple[int, ...], ...]
    grad_bytes: int  # d: full (unsharded) gradient bytes of the segment's layers
    layer_chunk_bytes: tuple[tuple[int, int], ...]  # (layer, bytes of one of its L chunks)
    chunk_bytes: int  # what ring c reduces: chunk c of every layer of the segment (d/L when L | d_l)
    chunks_per_rank: tuple[tuple[int, int], ...]  # (rank, L / t_i)
    uniform: bool  # every member covers exactly this segment with one common TP degree

    def rings_of(self, rank: int) -> tuple[int, ...]:
        """Indices of the rings `rank` sits in (its chunks)."""
        return tuple(c for c, ring in enumerate(self.rings) if rank in ring)


@dataclass(frozen=True)
class PipelineBoundary:
    """Two adjacent pipeline stages of one DP replica and the activation tensor that crosses them."""

    replica: int
    src_stage: int
    dst_stage: int
    src_group: int
    dst_group: int
    src_ranks: tuple[int, ...]
    dst_ranks: tuple[int, ...]
    tensor_bytes: int  # seq_len x micro_batch x hidden x dtype_bytes (Megatron's p2p tensor shape)

    @property
    def reshard(self) -> bool:
        """Whether the stages differ in TP degree (a layout change, hence resharding)."""
        return len(self.src_ranks) != len(self.dst_ranks)


@dataclass(frozen=True)
class RouteEntry:
    """Layer-aware routing table entry: chunk `chunk` of layer `layer` is reduced on ring `ring` of group."""

    layer: int
    chunk: int
    group: int
    ring: tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    """Everything the rewriter needs to synchronize a (heterogeneous) deployment."""

    device_groups: tuple[DeviceGroupView, ...]
    dp_groups: tuple[DpGroup, ...]
    pipeline_barrier_groups: tuple[tuple[int, ...], ...]
    dp_barrier_groups: tuple[tuple[int, ...], ...]
    boundaries: tuple[PipelineBoundary, ...]

    @property
    def heterogeneous(self) -> bool:
        """True when some DP group mixes TP degrees or layer cuts (the generator then emits no DP sync)."""
        return any(not g.uniform for g in self.dp_groups)

    def group_of_rank(self, rank: int) -> DeviceGroupView:
        """The device group holding `rank`."""
        for g in self.device_groups:
            if rank in g.ranks:
                return g
        raise PlanError(f"rank {rank} is in no device group")

    def route(self, layer: int, chunk: int) -> RouteEntry:
        """Which ring reduces chunk `chunk` of `layer` (PlanError when no DP group covers the layer)."""
        for g in self.dp_groups:
            if g.layers[0] <= layer <= g.layers[1]:
                if not 0 <= chunk < g.lcm:
                    raise PlanError(f"layer {layer}: chunk {chunk} outside 0..{g.lcm - 1}")
                return RouteEntry(layer, chunk, g.id, g.rings[chunk])
        raise PlanError(f"layer {layer} is held by a single device group: no DP synchronization")

    def routing_table(self) -> tuple[RouteEntry, ...]:
        """The full (layer, chunk) -> ring table, layers ascending then chunks."""
        return tuple(
            RouteEntry(layer, c, g.id, ring)
            for g in self.dp_groups
            for layer in range(g.layers[0], g.layers[1] + 1)
            for c, ring in enumerate(g.rings)
        )


def make_dp_group(gid: int, seg: Segment, layer_bytes: Mapping[int, int]) -> DpGroup:
    """Algorithms 2 and 3 applied to one sweep-line segment."""
    dgs = seg.device_groups
    L = lcm_of(g.tp for g in dgs)
    layers = range(seg.start, seg.end + 1)
    per_layer = tuple((layer, chunk_bytes(layer_bytes[layer], L)) for layer in layers)
    return DpGroup(
        id=gid,
        layers=(seg.start, seg.end),
        device_groups=tuple(g.id for g in dgs),
        tps=tuple(g.tp for g in dgs),
        ranks=seg.ranks,
        lcm=L,
        rings=build_rings(dgs),
        grad_bytes=sum(layer_bytes[layer] for layer in layers),
        layer_chunk_bytes=per_layer,
        chunk_bytes=sum(b for _, b in per_layer),
        chunks_per_rank=tuple(sorted((r, L // g.tp) for g in dgs for r in g.ranks)),
        uniform=len({g.tp for g in dgs}) == 1 and all((seg.start, seg.end) in g.layer_ranges for g in dgs),
    )


def plan_groups(
    groups: Sequence[DeviceGroupView], layer_bytes: Mapping[int, int], activation_bytes: int = 0
) -> Plan:
    """Plan from validated device groups, gradient bytes per layer and activation bytes per micro-batch sample.

    `activation_bytes` is the boundary tensor of one sample (seq_len x hidden x dtype_bytes); a boundary's
    tensor is that times the micro-batch size.
    """
    held = {la for g in groups for a, b in g.layer_ranges for la in range(a, b + 1)}
    missing = sorted(held - set(layer_bytes))
    if missing:
        raise PlanError(f"no gradient size for layer(s) {missing[:5]}")
    dp = tuple(make_dp_group(i, s, layer_bytes) for i, s in enumerate(sync_segments(groups)))
    return Plan(
        device_groups=tuple(groups),
        dp_groups=dp,
        pipeline_barrier_groups=pipeline_barrier_groups(groups),
        dp_barrier_groups=dp_barrier_groups(dp),
        boundaries=_boundaries(groups, activation_bytes),
    )


def _boundaries(groups: Sequence[DeviceGroupView], activation_bytes: int) -> tuple[PipelineBoundary, ...]:
    out = []
    for replica, stages in replica_stages(groups).items():
        # The replica's layer ranges in model order: one per stage, or under interleaving every stage's
        # chunks (stage p's chunk c, then stage p + 1's chunk c, ..., the last stage's chunk c, then stage
        # 0's chunk c + 1). Each hand-over between two groups is one boundary (listed once per pair).
        ranges = sorted(
            ((a, b, g) for g in stages for a, b in g.layer_ranges), key=lambda x: (x[0], x[1], x[2].id)
        )
        seen: set[tuple[int, int]] = set()
        for (_, a_end, a), (b_start, _, b) in zip(ranges, ranges[1:], strict=False):
            if b_start != a_end + 1:
                raise PlanError(
                    f"DP replica {replica}: stage {a.pp_stage} (device group {a.id}) ends at layer "
                    f"{a_end} but stage {b.pp_stage} (device group {b.id}) starts at {b_start}"
                )
            if a.id == b.id or (a.id, b.id) in seen:
                continue
            seen.add((a.id, b.id))
            if a.micro_batch != b.micro_batch:
                raise PlanError(
                    f"DP replica {replica}: device groups {a.id} and {b.id} are adjacent stages with "
                    f"micro-batch sizes {a.micro_batch} and {b.micro_batch}"
                )
            out.append(
                PipelineBoundary(
                    replica,
                    a.pp_stage,
                    b.pp_stage,
                    a.id,
                    b.id,
                    a.ranks,
                    b.ranks,
                    activation_bytes * a.micro_batch,
                )
            )
    return tuple(out)


def build_plan(deployment: Any) -> Plan:
    """Plan a Deployment message (contract B): DP groups, rings, chunks, barrier groups, stage boundaries."""
    arch = model_from_message(deployment.model)
    if isinstance(deployment, dpb.Deployment):
        from xsim.tracegen.spec import model_arch

        arch = model_arch(deployment)  # tied or not as the spec resolves it (tie_embeddings, framework)
    dtype = int(getattr(deployment, "dtype_bytes", 0) or 2)
    seq = int(getattr(deployment, "seq_len", 0) or arch.seq_len)
    groups = view_device_groups(deployment.device_groups, arch.layers)
    # Every group holding both ends (PP 1): a tied projection is the embedding's one tensor.
    together = all(g.layer_start == 1 and g.layer_end == arch.layers for g in groups)
    return plan_groups(groups, layer_grad_bytes(arch, dtype, not together), seq * arch.hidden * dtype)
