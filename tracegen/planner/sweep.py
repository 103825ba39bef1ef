"""Algorithm 1 (paper section 4.3): sweep-line formation of layer-aware DP synchronization groups."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xsim.tracegen.planner.device_groups import DeviceGroupView


@dataclass(frozen=True)
class Segment:
    """A layer segment [start, end] and the device groups fully covering it (in device-group id order)."""

    start: int
    end: int
    device_groups: tuple[DeviceGroupView, ...]

    @property
    def ranks(self) -> tuple[int, ...]:
        """Union of the covering groups' ranks, ascending."""
        return tuple(sorted(r for g in self.device_groups for r in g.ranks))


def boundary_points(groups: Sequence[DeviceGroupView]) -> tuple[int, ...]:
    """Sorted, de-duplicated {s_i, e_i + 1} of every device group (Algorithm 1, lines 4-9)."""
    return tuple(sorted({p for g in groups for a, b in g.layer_ranges for p in (a, b + 1)}))


def segments(groups: Sequence[DeviceGroupView]) -> tuple[Segment, ...]:
    """Every segment between consecutive boundary points with its covering groups (lines 12-20)."""
    points = boundary_points(groups)
    out = []
    for a, b in zip(points, points[1:], strict=False):
        cover = tuple(g for g in groups if g.covers(a, b - 1))
        out.append(Segment(a, b - 1, cover))
    return tuple(out)


def sync_segments(groups: Sequence[DeviceGroupView]) -> tuple[Segment, ...]:
    """Segments covered by at least two device groups: the DP synchronization groups (lines 21-26)."""
    return tuple(s for s in segments(groups) if len(s.device_groups) >= 2)
