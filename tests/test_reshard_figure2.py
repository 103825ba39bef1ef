"""Figure 2 of the paper: a 12-element tensor resharded from TP 6 to TP 4, message by message."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from xsim.tracegen.planner import PlanError
from xsim.tracegen.planner.reshard import (
    STRATEGY_NAMES,
    cutpoint_union,
    reshard_plan,
    shard_bounds,
    virtual_groups,
)

SRC = (0, 1, 2, 3, 4, 5)  # source stage, TP 6: element shards [0,2) [2,4) ... [10,12)
DST = (10, 11, 12, 13)  # destination stage, TP 4: element shards [0,3) [3,6) [6,9) [9,12)


def triples(plan):
    return [(m.src, m.dst, m.nbytes, m.step) for m in plan.messages]


def test_alpacomm_cutpoint_union_and_units():
    # Section 2.3: {0,2,4,6,8,10,12} U {0,3,6,9,12} = {0,2,3,4,6,8,9,10,12}; units [2,1,1,2,2,1,1,2].
    assert cutpoint_union(6, 4, 12) == (0, 2, 3, 4, 6, 8, 9, 10, 12)
    plan = reshard_plan("alpacomm", SRC, DST, 12)
    assert plan.cutpoints == (0, 2, 3, 4, 6, 8, 9, 10, 12)
    assert [m.nbytes for m in plan.messages] == [2, 1, 1, 2, 2, 1, 1, 2]
    # Unit [0,2) lies in source shard 0 and destination shard 0; [2,3) in source 1 / destination 0; ...
    assert triples(plan) == [
        (0, 10, 2, 0), (1, 10, 1, 0), (1, 11, 1, 0), (2, 11, 2, 0),
        (3, 12, 2, 0), (4, 12, 1, 0), (4, 13, 1, 0), (5, 13, 2, 0),
    ]  # fmt: skip


def test_hetauto_two_virtual_groups_with_leaders():
    # GCD(6, 4) = 2 virtual groups: sources {0,1,2} / {3,4,5} (leaders 0, 3), destinations {10,11} / {12,13}
    # (leaders 10, 12). Slice g = 12 / 2 = 6 elements; source shards 2, destination shards 3.
    groups = virtual_groups(SRC, DST)
    assert [(g.src_ranks, g.dst_ranks) for g in groups] == [((0, 1, 2), (10, 11)), ((3, 4, 5), (12, 13))]
    assert [(g.src_leader, g.dst_leader) for g in groups] == [(0, 10), (3, 12)]
    plan = reshard_plan("hetauto", SRC, DST, 12)
    assert triples(plan) == [
        (1, 0, 2, 0), (2, 0, 2, 0), (4, 3, 2, 0), (5, 3, 2, 0),  # gather to source leaders
        (0, 10, 6, 1), (3, 12, 6, 1),  # leader to leader
        (10, 11, 3, 2), (12, 13, 3, 2),  # scatter from destination leaders
    ]  # fmt: skip
    assert plan.num_steps == 3 and plan.total_bytes == 8 + 12 + 6


def test_xsim_lcm_chunks():
    # L = lcm(6, 4) = 12 chunks of 1 element; chunk c from source local c mod 6 to destination local c mod 4.
    plan = reshard_plan("xsim", SRC, DST, 12)
    assert triples(plan) == [(SRC[c % 6], DST[c % 4], 1, 0) for c in range(12)]
    assert [m.ring for m in plan.messages] == list(range(12))
    assert all(plan.sent(r) == 2 for r in SRC) and all(plan.received(r) == 3 for r in DST)
    assert len({(m.src, m.dst) for m in plan.messages}) == 12  # every pair once (CRT)


def test_naive_mapping():
    plan = reshard_plan("naive", SRC, DST, 12)
    assert triples(plan) == [(0, 10, 3, 0), (1, 11, 3, 0), (2, 12, 3, 0), (3, 13, 3, 0)]


def test_unknown_strategy_and_overlap():
    with pytest.raises(PlanError, match="unknown reshard strategy 'ring'"):
        reshard_plan("ring", SRC, DST, 12)
    with pytest.raises(PlanError, match="share ranks"):
        reshard_plan("xsim", (0, 1), (1, 2), 12)


tp = st.integers(min_value=1, max_value=8)


@given(tp, tp, st.integers(min_value=0, max_value=10_000))
def test_every_destination_gets_its_shard(a, b, n):
    src, dst = tuple(range(a)), tuple(range(100, 100 + b))
    db = shard_bounds(n, b)
    need = {d: db[j + 1] - db[j] for j, d in enumerate(dst)}
    alpa = reshard_plan("alpacomm", src, dst, n)
    assert {d: alpa.received(d) for d in dst} == need
    assert alpa.total_bytes == n
    # AlpaComm and HetAuto both use a + b - gcd(a, b) messages when every shard is non-empty.
    g = math.gcd(a, b)
    if n >= math.lcm(a, b):
        assert len(alpa.messages) == a + b - g
        assert len(reshard_plan("hetauto", src, dst, n).messages) == a + b - g
    xs = reshard_plan("xsim", src, dst, n)
    assert xs.total_bytes == n and len(xs.messages) == math.lcm(a, b)
    if n % math.lcm(a, b) == 0:
        assert {d: xs.received(d) for d in dst} == need
        assert {s: xs.sent(s) for s in src} == dict.fromkeys(src, n // a)
    het = reshard_plan("hetauto", src, dst, n)
    # Each destination ends with its shard: leaders keep theirs from the slice, others get it scattered.
    for vg in het.groups:
        for d in vg.dst_ranks[1:]:
            assert het.received(d) == need[d]
    assert sum(m.nbytes for m in het.messages if m.step == 1) == n


def test_strategy_names():
    assert STRATEGY_NAMES == ("xsim", "hetauto", "alpacomm", "naive")
