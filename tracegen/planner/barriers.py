"""Barrier groups (paper section 4.5): pipeline barrier groups per DP replica, DP barrier groups per DP group."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from xsim.tracegen.planner.device_groups import DeviceGroupView
from xsim.tracegen.planner.errors import PlanError

if TYPE_CHECKING:
    from xsim.tracegen.planner.plan import DpGroup


def replica_stages(groups: Sequence[DeviceGroupView]) -> dict[int, list[DeviceGroupView]]:
    """Device groups of each DP replica ordered by pipeline stage (one device group per stage)."""
    out: dict[int, list[DeviceGroupView]] = {}
    for g in groups:
        out.setdefault(g.dp_replica, []).append(g)
    for replica, gs in out.items():
        gs.sort(key=lambda g: g.pp_stage)
        stages = [g.pp_stage for g in gs]
        if len(set(stages)) != len(stages):
            dup = sorted({s for s in stages if stages.count(s) > 1})
            raise PlanError(f"DP replica {replica}: several device groups at pipeline stage {dup[0]}")
    return dict(sorted(out.items()))


def pipeline_barrier_groups(groups: Sequence[DeviceGroupView]) -> tuple[tuple[int, ...], ...]:
    """One PBG per DP replica: all its ranks (footnote 5: "the set of ranks within a single DP stage")."""
    return tuple(tuple(sorted(r for g in gs for r in g.ranks)) for gs in replica_stages(groups).values())


def dp_barrier_groups(dp_groups: Sequence[DpGroup]) -> tuple[tuple[int, ...], ...]:
    """One DBG per DP synchronization group: its ranks, which all finish backward before it reduces."""
    return tuple(g.ranks for g in dp_groups)
