"""Heterogeneity-aware planning (paper sections 4.3-4.5): DP groups, multi-rings, chunks, barrier groups,
pipeline boundaries; the reshard strategies (`reshard/`) and the rewriter (`rewrite.py`, `passes.py`).

The names below are imported on first use (traces/lazy.py): importing one planner module loads only that.
"""

from xsim.traces.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "xsim.tracegen.planner.chunking": ["ChunkShare", "chunk_bytes", "chunk_extent", "chunk_shares"],
        "xsim.tracegen.planner.device_groups": ["DeviceGroupView", "view_device_groups"],
        "xsim.tracegen.planner.errors": ["PlanError"],
        "xsim.tracegen.planner.gradients": ["layer_grad_bytes"],
        "xsim.tracegen.planner.plan": ["DpGroup", "PipelineBoundary", "Plan", "RouteEntry", "build_plan"]
        + ["plan_groups"],
        "xsim.tracegen.planner.render": ["format_plan", "plan_to_json"],
        "xsim.tracegen.planner.rings": ["build_rings", "chunks_of_rank", "lcm_of"],
        "xsim.tracegen.planner.sweep": ["Segment", "boundary_points", "segments", "sync_segments"],
    },
)
