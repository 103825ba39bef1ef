"""Heterogeneity-aware planning (paper sections 4.3-4.5): DP groups, multi-rings, chunks, barrier groups.

The names below are imported on first use (PEP 562): importing one planner module loads only that one.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "ChunkShare": "tracegen.planner.chunking",
    "chunk_bytes": "tracegen.planner.chunking",
    "chunk_extent": "tracegen.planner.chunking",
    "chunk_shares": "tracegen.planner.chunking",
    "DeviceGroupView": "tracegen.planner.device_groups",
    "view_device_groups": "tracegen.planner.device_groups",
    "PlanError": "tracegen.planner.errors",
    "layer_grad_bytes": "tracegen.planner.gradients",
    "model_arch": "tracegen.planner.gradients",
    "DpGroup": "tracegen.planner.plan",
    "PipelineBoundary": "tracegen.planner.plan",
    "Plan": "tracegen.planner.plan",
    "RouteEntry": "tracegen.planner.plan",
    "build_plan": "tracegen.planner.plan",
    "plan_groups": "tracegen.planner.plan",
    "format_plan": "tracegen.planner.render",
    "plan_to_json": "tracegen.planner.render",
    "build_rings": "tracegen.planner.rings",
    "chunks_of_rank": "tracegen.planner.rings",
    "lcm_of": "tracegen.planner.rings",
    "Segment": "tracegen.planner.sweep",
    "boundary_points": "tracegen.planner.sweep",
    "segments": "tracegen.planner.sweep",
    "sync_segments": "tracegen.planner.sweep",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tracegen.planner' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
