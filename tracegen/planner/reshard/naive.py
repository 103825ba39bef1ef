"""The naive mapping a homogeneous simulator assumes: no resharding at all (the paper's baseline)."""

from __future__ import annotations

from collections.abc import Sequence

from xsim.tracegen.planner.reshard.message import Message, ReshardPlan, check_layouts, shard_bounds


def naive_reshard(src_ranks: Sequence[int], dst_ranks: Sequence[int], tensor_bytes: int) -> ReshardPlan:
    """Destination local j receives its shard from source local j mod a; sources at j >= b send nothing.

    This is the mapping the trace generator emits (contract C); it moves the right number of bytes into each
    destination but from the wrong owners, i.e. the cost a simulator that ignores layouts would charge.
    """
    src, dst = tuple(src_ranks), tuple(dst_ranks)
    check_layouts(src, dst, tensor_bytes)
    db = shard_bounds(tensor_bytes, len(dst))
    msgs = tuple(Message(src[j % len(src)], d, db[j + 1] - db[j], 0, -1, j) for j, d in enumerate(dst))
    return ReshardPlan("naive", src, dst, tensor_bytes, msgs)
