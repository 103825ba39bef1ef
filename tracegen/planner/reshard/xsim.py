"""xsim's resharding: LCM chunking over multi-rings (Algorithms 2-3 applied to a stage boundary)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from xsim.tracegen.planner.reshard.message import Message, ReshardPlan, check_layouts, shard_bounds


def xsim_reshard(src_ranks: Sequence[int], dst_ranks: Sequence[int], tensor_bytes: int) -> ReshardPlan:
    """L = lcm(a, b) equal chunks; chunk c goes from source local c mod a to destination local c mod b.

    This is Algorithm 2's interleaved ring assignment with the two stages as the ring's members: every
    source rank sends L/a chunks (its tensor_bytes/a), every destination rank receives L/b chunks, all in one
    step, and by the Chinese remainder theorem each (source, destination) pair with equal residues modulo
    gcd(a, b) carries exactly one chunk, so the traffic is balanced over as many pairs as possible.
    """
    src, dst = tuple(src_ranks), tuple(dst_ranks)
    check_layouts(src, dst, tensor_bytes)
    a, b = len(src), len(dst)
    L = math.lcm(a, b)
    cuts = shard_bounds(tensor_bytes, L)
    msgs = tuple(Message(src[c % a], dst[c % b], cuts[c + 1] - cuts[c], 0, c, c) for c in range(L))
    return ReshardPlan("xsim", src, dst, tensor_bytes, msgs)
