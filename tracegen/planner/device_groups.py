"""The planner's read-only view of a deployment's device groups (duck-typed over the protobuf message)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from xsim.tracegen.planner.errors import PlanError


@dataclass(frozen=True)
class DeviceGroupView:
    """One device group: ranks forming one TP group, running layers [layer_start, layer_end] (1-based)."""

    id: int
    ranks: tuple[int, ...]
    tp: int
    layer_start: int
    layer_end: int
    pp_stage: int = 0
    dp_replica: int = 0
    gpu: str = ""
    micro_batch: int = 1
    # The model chunks the group runs, in order (interleaved 1F1B: DeviceGroup.chunks, layer_start/layer_end
    # then span the first chunk's start to the last one's end); empty: one chunk [layer_start, layer_end].
    chunks: tuple[tuple[int, int], ...] = ()

    @property
    def layer_ranges(self) -> tuple[tuple[int, int], ...]:
        """The contiguous layer ranges the group holds, in order (its chunks, or its one range)."""
        return self.chunks or ((self.layer_start, self.layer_end),)

    def local_index(self, rank: int) -> int:
        """Index of `rank` within this device group (its TP rank), as appendix B defines it."""
        return self.ranks.index(rank)

    def covers(self, start: int, end: int) -> bool:
        """Whether one of this group's layer ranges contains all of [start, end]."""
        return any(a <= start and b >= end for a, b in self.layer_ranges)


def view_device_groups(groups: Iterable[Any], num_layers: int | None = None) -> tuple[DeviceGroupView, ...]:
    """Validated views of device-group messages (anything with id, ranks, tp, layer_start, layer_end, ...)."""
    out: list[DeviceGroupView] = []
    for g in groups:
        v = DeviceGroupView(
            id=int(g.id),
            ranks=tuple(int(r) for r in g.ranks),
            tp=int(g.tp),
            layer_start=int(g.layer_start),
            layer_end=int(g.layer_end),
            pp_stage=int(getattr(g, "pp_stage", 0)),
            dp_replica=int(getattr(g, "dp_replica", 0)),
            gpu=str(getattr(g, "gpu", "")),
            micro_batch=int(getattr(g, "micro_batch", 1) or 1),
            chunks=tuple((int(c.start), int(c.end)) for c in getattr(g, "chunks", ())),
        )
        _check(v, num_layers)
        out.append(v)
    if not out:
        raise PlanError("deployment has no device groups")
    ids = [v.id for v in out]
    if len(set(ids)) != len(ids):
        raise PlanError(f"device group ids repeat: {sorted(ids)}")
    owner: dict[int, int] = {}
    for v in out:
        for r in v.ranks:
            if r in owner:
                raise PlanError(f"rank {r} belongs to device groups {owner[r]} and {v.id}")
            owner[r] = v.id
    return tuple(sorted(out, key=lambda v: v.id))


def _check(v: DeviceGroupView, num_layers: int | None) -> None:
    where = f"device group {v.id}"
    if v.tp < 1:
        raise PlanError(f"{where}: tp must be >= 1, got {v.tp}")
    # A device group is one TP group (paper appendix A: "ranks {0, 1, 2} form a tensor parallel group of
    # size 3"); the multi-ring construction indexes chunks by the position within it.
    if len(v.ranks) != v.tp:
        raise PlanError(f"{where}: {len(v.ranks)} ranks but tp {v.tp} (a device group is one TP group)")
    if len(set(v.ranks)) != len(v.ranks) or any(r < 0 for r in v.ranks):
        raise PlanError(f"{where}: ranks must be distinct non-negative integers, got {list(v.ranks)}")
    if v.layer_start < 1 or v.layer_end < v.layer_start:
        raise PlanError(f"{where}: bad layer range [{v.layer_start}, {v.layer_end}] (1-based, inclusive)")
    for a, b in v.chunks:
        if a < v.layer_start or b > v.layer_end or b < a:
            raise PlanError(
                f"{where}: chunk [{a}, {b}] outside its layer range [{v.layer_start}, {v.layer_end}]"
            )
    if num_layers is not None and v.layer_end > num_layers:
        raise PlanError(f"{where}: layer_end {v.layer_end} beyond the model's {num_layers} layers")
