"""The plan as JSON (the keys `xsim plan --json` documents) and as a human-readable text block."""

from __future__ import annotations

from typing import Any

from xsim.tracegen.planner.plan import Plan


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """JSON-ready dict: dp_groups, pipeline_barrier_groups, dp_barrier_groups (+ pp_boundaries, heterogeneous)."""
    return {
        "dp_groups": [
            {
                "layers": list(g.layers),
                "ranks": list(g.ranks),
                "device_groups": list(g.device_groups),
                "lcm": g.lcm,
                "rings": [list(r) for r in g.rings],
                "chunk_bytes": g.chunk_bytes,
                "chunks_per_rank": {str(r): k for r, k in g.chunks_per_rank},
                "grad_bytes": g.grad_bytes,
            }
            for g in plan.dp_groups
        ],
        "pipeline_barrier_groups": [list(g) for g in plan.pipeline_barrier_groups],
        "dp_barrier_groups": [list(g) for g in plan.dp_barrier_groups],
        "pp_boundaries": [
            {
                "replica": b.replica,
                "stages": [b.src_stage, b.dst_stage],
                "src_ranks": list(b.src_ranks),
                "dst_ranks": list(b.dst_ranks),
                "tensor_bytes": b.tensor_bytes,
                "reshard": b.reshard,
            }
            for b in plan.boundaries
        ],
        "heterogeneous": plan.heterogeneous,
    }


def _mb(n: int) -> str:
    return f"{n / 1e6:.3f} MB"


def format_plan(plan: Plan) -> str:
    """Text rendering: one block per DP group, then barrier groups and stage boundaries."""
    lines = [f"{len(plan.dp_groups)} DP synchronization group(s); heterogeneous: {plan.heterogeneous}"]
    for g in plan.dp_groups:
        lines.append(
            f"DP group {g.id}: layers [{g.layers[0]}, {g.layers[1]}]  device groups {list(g.device_groups)}"
            f"  TP {list(g.tps)}  ranks {list(g.ranks)}"
        )
        lines.append(
            f"  L = {g.lcm}  gradient {_mb(g.grad_bytes)}  chunk {_mb(g.chunk_bytes)}"
            f"  chunks per rank {dict(g.chunks_per_rank)}"
        )
        for c, ring in enumerate(g.rings):
            lines.append(f"  ring {c}: {list(ring)}")
    lines.append(f"pipeline barrier groups: {[list(g) for g in plan.pipeline_barrier_groups]}")
    lines.append(f"DP barrier groups: {[list(g) for g in plan.dp_barrier_groups]}")
    for b in plan.boundaries:
        lines.append(
            f"replica {b.replica} stage {b.src_stage} -> {b.dst_stage}: TP {len(b.src_ranks)} -> "
            f"{len(b.dst_ranks)}  tensor {_mb(b.tensor_bytes)}{'  (reshard)' if b.reshard else ''}"
        )
    return "\n".join(lines)
