"""A resharding plan: the explicit point-to-point messages that move a tensor from one TP layout to another."""

from __future__ import annotations

from dataclasses import dataclass

from xsim.tracegen.planner.errors import PlanError


@dataclass(frozen=True)
class Message:
    """`nbytes` from global rank `src` to `dst`, in phase `step` (a step starts when the previous is done)."""

    src: int
    dst: int
    nbytes: int
    step: int
    ring: int = -1  # xsim: ring c; hetauto: virtual group; -1 where the strategy has no such channel
    chunk: int = -1  # xsim: chunk c; alpacomm: unit index; hetauto/naive: shard index moved


@dataclass(frozen=True)
class VirtualGroup:
    """HetAuto's virtual cluster g: source and destination ranks owning tensor slice g, and their leaders."""

    src_ranks: tuple[int, ...]
    dst_ranks: tuple[int, ...]

    @property
    def src_leader(self) -> int:
        """Rank that gathers the source slice (the group's first source rank)."""
        return self.src_ranks[0]

    @property
    def dst_leader(self) -> int:
        """Rank that receives the slice and scatters it (the group's first destination rank)."""
        return self.dst_ranks[0]


@dataclass(frozen=True)
class ReshardPlan:
    """Messages of one strategy for one tensor; `cutpoints` (AlpaComm) and `groups` (HetAuto) explain them."""

    strategy: str
    src_ranks: tuple[int, ...]
    dst_ranks: tuple[int, ...]
    tensor_bytes: int
    messages: tuple[Message, ...]
    cutpoints: tuple[int, ...] = ()
    groups: tuple[VirtualGroup, ...] = ()

    @property
    def total_bytes(self) -> int:
        """Bytes put on the wire by all messages."""
        return sum(m.nbytes for m in self.messages)

    @property
    def num_steps(self) -> int:
        """Number of sequential phases."""
        return 1 + max((m.step for m in self.messages), default=-1)

    def received(self, rank: int) -> int:
        """Bytes `rank` receives."""
        return sum(m.nbytes for m in self.messages if m.dst == rank)

    def sent(self, rank: int) -> int:
        """Bytes `rank` sends."""
        return sum(m.nbytes for m in self.messages if m.src == rank)


def shard_bounds(total: int, t: int) -> tuple[int, ...]:
    """Boundaries of a contiguous TP layout: shard i is [i*total//t, (i+1)*total//t) (Megatron, Fig. 2)."""
    return tuple(i * total // t for i in range(t + 1))


def check_layouts(src_ranks: tuple[int, ...], dst_ranks: tuple[int, ...], tensor_bytes: int) -> None:
    """Reject empty or overlapping layouts and negative sizes."""
    if not src_ranks or not dst_ranks:
        raise PlanError("resharding needs at least one source and one destination rank")
    if len(set(src_ranks)) != len(src_ranks) or len(set(dst_ranks)) != len(dst_ranks):
        raise PlanError(f"resharding ranks repeat: {list(src_ranks)} -> {list(dst_ranks)}")
    if set(src_ranks) & set(dst_ranks):
        raise PlanError(f"source and destination stages share ranks: {list(src_ranks)} -> {list(dst_ranks)}")
    if tensor_bytes < 0:
        raise PlanError(f"tensor size must be >= 0, got {tensor_bytes}")
