"""Algorithm 2 (paper section 4.3): LCM-based multi-ring construction for one DP synchronization group."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from xsim.tracegen.planner.device_groups import DeviceGroupView


def lcm_of(degrees: Iterable[int]) -> int:
    """Least common multiple of the TP degrees (L of Algorithms 2 and 3)."""
    return math.lcm(*degrees)


def build_rings(groups: Sequence[DeviceGroupView]) -> tuple[tuple[int, ...], ...]:
    """Ring c (0 <= c < L) holds, from each group in order, its rank at local index c mod t_i.

    The paper's pseudo-code writes `local_rank <- r mod t_i`; appendix B (and the worked example, where DG2's
    ranks {3, 4} serve chunks {0, 2, 4} from rank 3) uses the index within the device group. The two agree
    only when a group's ranks start at a multiple of t_i, so the index within the group is used here.
    """
    L = lcm_of(g.tp for g in groups)
    return tuple(tuple(g.ranks[c % g.tp] for g in groups) for c in range(L))


def chunks_of_rank(group: DeviceGroupView, rank: int, L: int) -> tuple[int, ...]:
    """Chunk (= ring) indices served by `rank`: c with c mod t_i equal to its local index."""
    k = group.local_index(rank)
    return tuple(range(k, L, group.tp))
