"""HetAuto's resharding (paper section 2.3, Fig. 2a): GCD virtual groups, gather -> leader P2P -> scatter."""

from __future__ import annotations

import math
from collections.abc import Sequence

from xsim.tracegen.planner.reshard.message import (
    Message,
    ReshardPlan,
    VirtualGroup,
    check_layouts,
    shard_bounds,
)


def virtual_groups(src_ranks: Sequence[int], dst_ranks: Sequence[int]) -> tuple[VirtualGroup, ...]:
    """G = gcd(a, b) groups; group g holds a/G consecutive source and b/G consecutive destination ranks."""
    a, b = len(src_ranks), len(dst_ranks)
    G = math.gcd(a, b)
    sa, sb = a // G, b // G
    return tuple(
        VirtualGroup(tuple(src_ranks[g * sa : (g + 1) * sa]), tuple(dst_ranks[g * sb : (g + 1) * sb]))
        for g in range(G)
    )


def hetauto_reshard(src_ranks: Sequence[int], dst_ranks: Sequence[int], tensor_bytes: int) -> ReshardPlan:
    """Step 0: source shards gathered at the group's source leader; step 1: leader -> destination leader
    (slice g = tensor_bytes / G); step 2: destination leader scatters each destination rank's shard.

    With contiguous layouts, source group g's shards tile exactly slice g, and so do destination group g's,
    which is why the GCD grouping works.
    """
    src, dst = tuple(src_ranks), tuple(dst_ranks)
    check_layouts(src, dst, tensor_bytes)
    groups = virtual_groups(src, dst)
    sb, db = shard_bounds(tensor_bytes, len(src)), shard_bounds(tensor_bytes, len(dst))
    gb = shard_bounds(tensor_bytes, len(groups))
    msgs: list[Message] = []
    for g, vg in enumerate(groups):
        for r in vg.src_ranks[1:]:
            i = src.index(r)
            msgs.append(Message(r, vg.src_leader, sb[i + 1] - sb[i], 0, g, i))
        msgs.append(Message(vg.src_leader, vg.dst_leader, gb[g + 1] - gb[g], 1, g, g))
        for r in vg.dst_ranks[1:]:
            j = dst.index(r)
            msgs.append(Message(vg.dst_leader, r, db[j + 1] - db[j], 2, g, j))
    msgs.sort(key=lambda m: (m.step, m.ring, m.src, m.dst))
    return ReshardPlan("hetauto", src, dst, tensor_bytes, tuple(msgs), groups=groups)
