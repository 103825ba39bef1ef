"""ASTRA-sim mode remembers a congestion-unaware closed form per group shape (issue 11, round 3).

Groups whose members differ only by a rotation of a ring dimension or a renumbering of a switch dimension
see the same message costs between equal positions, so they share one closed form; groups that do not must
not. Expected numbers by hand from the congestion-unaware rules (reference 3.1-3.3): on a group smaller than
the system every bus crossing costs 10 ns (MemBus Fast), a 1-D ring AllReduce of one chunk is one phase of
2(p-1) steps, finish = 10 + 2(p-1) (T_msg + 10), T_msg = floor(hops x latency + m / B), m = size / p.
"""

from __future__ import annotations

import math

from xsim.netmodels import CollectiveSpec
from xsim.netmodels.astra import CLEAN_SYSTEM, AstraDim, AstraModel, AstraNetwork

SIZE = 4 << 20  # 4 MiB: m = 1 MiB per ring step on 4 ranks


def _net() -> AstraNetwork:
    # Ring of 8 at 50 GB/s, 500 ns per hop; a switch of 4 at 25 GB/s, 700 ns (2 hops) above it.
    return AstraNetwork((AstraDim("ring", 8, 50, 500), AstraDim("switch", 4, 25, 700)))


def _uniform_ring(hops: int, latency: float, gbps: float, p: int = 4) -> int:
    t_msg = math.floor(hops * latency + (SIZE // p) / (gbps * 2**30 / 1e9))
    return 10 + 2 * (p - 1) * (t_msg + 10)


def test_alike_groups_share_one_closed_form_with_the_hand_computed_times():
    model = AstraModel(_net(), CLEAN_SYSTEM)
    # Every other rank of the ring: each ring edge crosses 2 hops (6 -> 0 too: min(6, 8 - 6) = 2).
    two_hops = _uniform_ring(2, 500, 50)
    assert two_hops == 10 + 6 * (math.floor(1000 + 19531.25) + 10) == 123_256
    for ranks in [(0, 2, 4, 6), (1, 3, 5, 7), (4, 6, 0, 2), (9, 11, 13, 15), (25, 27, 29, 31)]:
        assert model.collective_ns(CollectiveSpec("all_reduce", SIZE, ranks)) == (two_hops,) * 4
    # One rank per switch port (stride 8): charged to the switch, 2 hops of 700 ns at 25 GB/s.
    switch = _uniform_ring(2, 700, 25)
    assert switch == 242_842
    for ranks in [(0, 8, 16, 24), (3, 11, 19, 27), (24, 16, 8, 0)]:
        assert model.collective_ns(CollectiveSpec("all_reduce", SIZE, ranks)) == (switch,) * 4
    assert len(model._shape_memo) == 2  # eight groups, two shapes


def test_groups_of_another_shape_are_not_confused():
    # (0, 1, 2, 3): three 1-hop edges and a 3-hop one (3 -> 0), unlike every-other-rank groups; each group
    # must get exactly what a model that never saw another group computes.
    shared = AstraModel(_net(), CLEAN_SYSTEM)
    groups = [
        (0, 2, 4, 6),
        (0, 1, 2, 3),
        (2, 3, 4, 5),
        (0, 1, 8, 9),
        (4, 5, 12, 13),
        (0, 9, 18, 27),
        (1, 0, 3, 2),
    ]
    got = [shared.collective_ns(CollectiveSpec("all_reduce", SIZE, g)) for g in groups]
    fresh = [
        AstraModel(_net(), CLEAN_SYSTEM).collective_ns(CollectiveSpec("all_reduce", SIZE, g)) for g in groups
    ]
    assert got == fresh
    assert got[1] != got[0] and got[3] != got[1]  # the shapes do differ in time
    assert got[1] == got[2] and got[3] == got[4]  # a rotated ring group and a renumbered switch group
