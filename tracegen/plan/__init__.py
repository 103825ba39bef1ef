"""Heterogeneity-aware planning (paper sections 4.3-4.5): DP groups, multi-rings, chunks, barrier groups."""

from tracegen.plan.chunking import ChunkShare, chunk_bytes, chunk_extent, chunk_shares
from tracegen.plan.device_groups import DeviceGroupView, view_device_groups
from tracegen.plan.errors import PlanError
from tracegen.plan.gradients import layer_grad_bytes, model_arch
from tracegen.plan.plan import DpGroup, PipelineBoundary, Plan, RouteEntry, build_plan, plan_groups
from tracegen.plan.render import format_plan, plan_to_json
from tracegen.plan.rings import build_rings, chunks_of_rank, lcm_of
from tracegen.plan.sweep import Segment, boundary_points, segments, sync_segments

__all__ = [
    "ChunkShare",
    "DeviceGroupView",
    "DpGroup",
    "PipelineBoundary",
    "Plan",
    "PlanError",
    "RouteEntry",
    "Segment",
    "boundary_points",
    "build_plan",
    "build_rings",
    "chunk_bytes",
    "chunk_extent",
    "chunk_shares",
    "chunks_of_rank",
    "format_plan",
    "layer_grad_bytes",
    "lcm_of",
    "model_arch",
    "plan_groups",
    "plan_to_json",
    "segments",
    "sync_segments",
    "view_device_groups",
]
