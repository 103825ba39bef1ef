"""The paper's worked examples (section 4.3 numbering, appendices B, C, E) pinned exactly."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from xsim.tracegen.planner import (
    PlanError,
    boundary_points,
    build_rings,
    chunk_shares,
    chunks_of_rank,
    lcm_of,
    plan_groups,
    sync_segments,
    view_device_groups,
)

MB = 1_000_000


def figure1_groups():
    """Section 4.3: DG0 [1,20] {0,1,2} TP3; DG1 [21,32] {5,6} TP2; DG2 [1,15] {3,4} TP2; DG3 [16,32] {7,8,9} TP3.

    Pipelines (Fig. 1): replica 0 = DG0 -> DG1, replica 1 = DG2 -> DG3.
    """
    raw = [
        SimpleNamespace(id=0, ranks=[0, 1, 2], tp=3, layer_start=1, layer_end=20, pp_stage=0, dp_replica=0),
        SimpleNamespace(id=1, ranks=[5, 6], tp=2, layer_start=21, layer_end=32, pp_stage=1, dp_replica=0),
        SimpleNamespace(id=2, ranks=[3, 4], tp=2, layer_start=1, layer_end=15, pp_stage=0, dp_replica=1),
        SimpleNamespace(id=3, ranks=[7, 8, 9], tp=3, layer_start=16, layer_end=32, pp_stage=1, dp_replica=1),
    ]
    return view_device_groups(raw, 32)


def test_sweep_line_boundaries_and_groups():
    groups = figure1_groups()
    # Appendix B step 1-2: P = {1,21,21,33,1,16,16,33} -> {1,16,21,33}.
    assert boundary_points(groups) == (1, 16, 21, 33)
    segs = sync_segments(groups)
    assert [(s.start, s.end) for s in segs] == [(1, 15), (16, 20), (21, 32)]
    assert [s.ranks for s in segs] == [(0, 1, 2, 3, 4), (0, 1, 2, 7, 8, 9), (5, 6, 7, 8, 9)]
    assert [tuple(g.id for g in s.device_groups) for s in segs] == [(0, 2), (0, 3), (1, 3)]


def test_layer_aware_membership_rank0_in_two_groups():
    plan = plan_groups(figure1_groups(), dict.fromkeys(range(1, 33), 6))
    assert [g.layers for g in plan.dp_groups if 0 in g.ranks] == [(1, 15), (16, 20)]


def test_rings_of_segment_1_15_use_index_within_group():
    groups = figure1_groups()
    dg0, dg2 = groups[0], groups[2]
    # Appendix B step 3: DG0 chunks {0,3}->local 0, {1,4}->1, {2,5}->2; DG2 {0,2,4}->local 0, {1,3,5}->1.
    assert build_rings([dg0, dg2]) == ((0, 3), (1, 4), (2, 3), (0, 4), (1, 3), (2, 4))
    assert chunks_of_rank(dg2, 3, 6) == (0, 2, 4)  # rank 3 is DG2's local 0 although 3 mod 2 = 1
    assert chunks_of_rank(dg2, 4, 6) == (1, 3, 5)
    assert chunks_of_rank(dg0, 1, 6) == (1, 4)


def test_appendix_c_chunk_sizes():
    # t = 3 and 2, d = 60 MB: L = 6; per rank 60/3 = 20 MB and 60/2 = 30 MB; chunk multipliers 6/3 = 2 and
    # 6/2 = 3; every chunk 20/2 = 30/3 = 10 MB (the corrected appendix C numbers).
    shares = chunk_shares([3, 2], 60 * MB)
    assert [(s.data_per_rank, s.chunk_multiplier, s.data_per_chunk_per_rank) for s in shares] == [
        (20 * MB, 2, 10 * MB),
        (30 * MB, 3, 10 * MB),
    ]


def test_appendix_c_as_a_plan():
    # Appendix C: DG0 TP3 {0,1,2} and DG2 TP2 {3,4} both on layers [1,50], d = 60 MB (1.2 MB per layer,
    # which 6 divides: 1,200,000 / 6 = 200,000), so each ring reduces 50 x 200,000 = 10 MB.
    raw = [
        SimpleNamespace(id=0, ranks=[0, 1, 2], tp=3, layer_start=1, layer_end=50),
        SimpleNamespace(id=2, ranks=[3, 4], tp=2, layer_start=1, layer_end=50, dp_replica=1),
    ]
    plan = plan_groups(view_device_groups(raw, 50), dict.fromkeys(range(1, 51), 1_200_000))
    (g,) = plan.dp_groups
    assert (g.layers, g.lcm, g.grad_bytes, g.chunk_bytes) == ((1, 50), 6, 60 * MB, 10 * MB)
    assert dict(g.chunks_per_rank) == {0: 2, 1: 2, 2: 2, 3: 3, 4: 3}
    # Per rank: 2 x 10 = 20 MB in DG0, 3 x 10 = 30 MB in DG2.
    assert [len(g.rings_of(r)) * g.chunk_bytes for r in g.ranks] == [20 * MB] * 3 + [30 * MB] * 2
    assert plan.heterogeneous  # TP 3 vs 2


def test_plan_of_figure1():
    groups = figure1_groups()
    # 4 MB per layer: 6 does not divide 4,000,000, so each layer's chunk is rounded up to 666,667 bytes
    # (the last chunk of a layer padded) and a ring of [1,15] reduces 15 x 666,667 = 10,000,005 bytes.
    layer_bytes = dict.fromkeys(range(1, 33), 4 * MB)
    plan = plan_groups(groups, layer_bytes)
    g = plan.dp_groups[0]
    assert (g.layers, g.lcm, g.grad_bytes, g.chunk_bytes) == ((1, 15), 6, 60 * MB, 10_000_005)
    assert dict(g.chunks_per_rank) == {0: 2, 1: 2, 2: 2, 3: 3, 4: 3}
    assert plan.dp_groups[1].lcm == 3 and plan.dp_groups[1].rings == ((0, 7), (1, 8), (2, 9))
    assert plan.dp_groups[2].rings == ((5, 7), (6, 8), (5, 9), (6, 7), (5, 8), (6, 9))
    assert plan.pipeline_barrier_groups == ((0, 1, 2, 5, 6), (3, 4, 7, 8, 9))
    assert plan.dp_barrier_groups == ((0, 1, 2, 3, 4), (0, 1, 2, 7, 8, 9), (5, 6, 7, 8, 9))
    assert plan.heterogeneous
    # Routing table: chunk 3 of layer 7 goes to ring 3 = {0, 4} of group [1,15]; layer 18 to group [16,20].
    assert plan.route(7, 3).ring == (0, 4)
    assert plan.route(18, 2).group == 1 and plan.route(18, 2).ring == (2, 9)
    assert len(plan.routing_table()) == 15 * 6 + 5 * 3 + 12 * 6


def test_appendix_e_lcm_bound_840():
    # The lcm of a multiset equals that of its set, so all subsets of {1..8} cover every TP mix <= 8.
    worst = max(lcm_of(s) for n in range(1, 9) for s in itertools.combinations(range(1, 9), n))
    assert worst == 840 == 8 * 7 * 5 * 3
    assert lcm_of([3, 5, 7, 8]) == 840


def test_bad_groups_are_rejected_with_a_clear_line():
    bad = SimpleNamespace(id=4, ranks=[0, 1], tp=3, layer_start=1, layer_end=4)
    with pytest.raises(PlanError, match="device group 4: 2 ranks but tp 3"):
        view_device_groups([bad])
    a = SimpleNamespace(id=0, ranks=[0], tp=1, layer_start=1, layer_end=4)
    b = SimpleNamespace(id=1, ranks=[0], tp=1, layer_start=1, layer_end=4)
    with pytest.raises(PlanError, match="rank 0 belongs to device groups 0 and 1"):
        view_device_groups([a, b])
