"""Resharding a tensor between TP layouts at a pipeline boundary: xsim, HetAuto, AlpaComm and naive."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from xsim.tracegen.planner.errors import PlanError
from xsim.tracegen.planner.reshard.alpacomm import alpacomm_reshard, cutpoint_union
from xsim.tracegen.planner.reshard.hetauto import hetauto_reshard, virtual_groups
from xsim.tracegen.planner.reshard.message import Message, ReshardPlan, VirtualGroup, shard_bounds
from xsim.tracegen.planner.reshard.naive import naive_reshard
from xsim.tracegen.planner.reshard.xsim import xsim_reshard

STRATEGIES: dict[str, Callable[[Sequence[int], Sequence[int], int], ReshardPlan]] = {
    "xsim": xsim_reshard,
    "hetauto": hetauto_reshard,
    "alpacomm": alpacomm_reshard,
    "naive": naive_reshard,
}
STRATEGY_NAMES: tuple[str, ...] = tuple(STRATEGIES)


def reshard_plan(
    strategy: str, src_ranks: Sequence[int], dst_ranks: Sequence[int], tensor_bytes: int
) -> ReshardPlan:
    """Messages of `strategy` moving a `tensor_bytes` tensor from TP layout `src_ranks` to `dst_ranks`."""
    fn = STRATEGIES.get(strategy)
    if fn is None:
        raise PlanError(f"unknown reshard strategy {strategy!r} (known: {', '.join(STRATEGY_NAMES)})")
    return fn(src_ranks, dst_ranks, tensor_bytes)


__all__ = [
    "STRATEGIES",
    "STRATEGY_NAMES",
    "Message",
    "ReshardPlan",
    "VirtualGroup",
    "alpacomm_reshard",
    "cutpoint_union",
    "hetauto_reshard",
    "naive_reshard",
    "reshard_plan",
    "shard_bounds",
    "virtual_groups",
    "xsim_reshard",
]
