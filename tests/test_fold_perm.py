"""A rank-class fold's renamings as a table (replay/fold_perm.py) equal `_Ctx.perm` rank by rank."""

from __future__ import annotations

import itertools

import pytest
from xsim.replay.fold import Fold, _Ctx
from xsim.replay.fold_perm import perm_table
from xsim.traces.groups import ProcessGroups


@pytest.mark.parametrize(("dp", "cp", "tp"), [(3, 1, 2), (2, 2, 2), (4, 1, 4), (2, 3, 1)])
def test_the_table_maps_every_rank_as_perm_does(dp: int, cp: int, tp: int) -> None:
    """Every pi_k of every rank, against the one-rank rule; replicas of 3 ranks in a shuffled numbering."""
    f = dp * cp * tp
    ranks = [(7 * r + 3) % (3 * f) for r in range(3 * f)]  # a permutation: 7 is prime to 3f here
    assert sorted(ranks) == list(range(3 * f))
    fold = Fold(tuple(tuple(ranks[3 * k : 3 * k + 3]) for k in range(f)), "test", tp=tp, cp=cp)
    ctx = _Ctx(fold, ProcessGroups(3 * f, {}))
    table = perm_table(fold)
    for k, r in itertools.product(range(f), range(3 * f)):
        assert table.images(k, [r]) == [ctx.perm(k, r)]
    members = (ranks[0], ranks[4], ranks[-1])
    for k in range(f):
        assert ctx.image(k, members) == frozenset(ctx.perm(k, m) for m in members)
    # pi_k is an involution swapping replica k with replica 0 (the module docstring of replay/fold.py).
    assert all(table.images(k, table.images(k, [r])) == [r] for k in range(f) for r in range(3 * f))
    assert all(table.images(k, list(fold.replicas[0])) == list(fold.replicas[k]) for k in range(f))
