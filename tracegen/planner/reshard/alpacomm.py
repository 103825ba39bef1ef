"""AlpaComm's resharding (paper section 2.3, Fig. 2b): cutpoint-union slices sent point to point."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from xsim.tracegen.planner.reshard.message import Message, ReshardPlan, check_layouts, shard_bounds


def cutpoint_union(a: int, b: int, tensor_bytes: int) -> tuple[int, ...]:
    """Union of the source and destination shard boundaries, sorted."""
    return tuple(sorted(set(shard_bounds(tensor_bytes, a)) | set(shard_bounds(tensor_bytes, b))))


def alpacomm_reshard(src_ranks: Sequence[int], dst_ranks: Sequence[int], tensor_bytes: int) -> ReshardPlan:
    """One message per atomic unit between consecutive cut points, from its source owner to its destination
    owner, all in one step; units are irregular in size (Fig. 2b: [2, 1, 1, 2, 2, 1, 1, 2])."""
    src, dst = tuple(src_ranks), tuple(dst_ranks)
    check_layouts(src, dst, tensor_bytes)
    sb, db = shard_bounds(tensor_bytes, len(src)), shard_bounds(tensor_bytes, len(dst))
    cuts = cutpoint_union(len(src), len(dst), tensor_bytes)
    msgs = []
    for u, (x, y) in enumerate(zip(cuts, cuts[1:], strict=False)):
        i = bisect.bisect_right(sb, x) - 1  # owner of byte x: last shard starting at or before it
        j = bisect.bisect_right(db, x) - 1
        msgs.append(Message(src[i], dst[j], y - x, 0, -1, u))
    return ReshardPlan("alpacomm", src, dst, tensor_bytes, tuple(msgs), cutpoints=cuts)
