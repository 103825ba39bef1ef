"""Property tests over random deployments: every gradient byte of every layer is reduced exactly once per
DP group, by one rank of every covering device group, and all members of a ring reduce equal chunks."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st
from xsim.tracegen.planner import chunk_extent, plan_groups, view_device_groups


@st.composite
def deployments(draw):
    """1-4 DP replicas, each cutting N layers into 1-4 stages of random TP (1..8); ranks numbered in order."""
    n_layers = draw(st.integers(min_value=1, max_value=24))
    groups, rank, gid = [], 0, 0
    for replica in range(draw(st.integers(min_value=1, max_value=4))):
        n_stages = draw(st.integers(min_value=1, max_value=min(4, n_layers)))
        cuts = (
            sorted(draw(st.sets(st.integers(1, n_layers - 1), min_size=n_stages - 1, max_size=n_stages - 1)))
            if n_layers > 1
            else []
        )
        starts = [1, *[c + 1 for c in cuts]]
        ends = [*cuts, n_layers]
        for stage, (s, e) in enumerate(zip(starts, ends, strict=True)):
            tp = draw(st.integers(min_value=1, max_value=8))
            ranks = list(range(rank, rank + tp))
            if draw(st.booleans()):
                ranks.reverse()  # ranks need not be ascending: the local index is the position
            groups.append(
                SimpleNamespace(
                    id=gid, ranks=ranks, tp=tp, layer_start=s, layer_end=e, pp_stage=stage, dp_replica=replica
                )
            )
            rank, gid = rank + tp, gid + 1
    layer_bytes = {la: draw(st.integers(min_value=0, max_value=60)) for la in range(1, n_layers + 1)}
    return view_device_groups(groups, n_layers), layer_bytes


@settings(max_examples=150, deadline=None)
@given(deployments())
def test_every_byte_reduced_exactly_once(dep):
    groups, layer_bytes = dep
    plan = plan_groups(groups, layer_bytes)
    checked: set[int] = set()
    for layer, d in layer_bytes.items():
        covering = [g for g in groups if g.layer_start <= layer <= g.layer_end]
        owners = [g for g in plan.dp_groups if g.layers[0] <= layer <= g.layers[1]]
        if len(covering) < 2:
            assert owners == []
            continue
        assert len(owners) == 1
        (dp,) = owners
        assert dp.device_groups == tuple(g.id for g in covering)
        L = dp.lcm
        # Chunk extents tile [0, d) exactly once.
        covered = [0] * d
        for c in range(L):
            a, b = chunk_extent(d, L, c)
            for x in range(a, b):
                covered[x] += 1
        assert covered == [1] * d
        # Each byte's chunk c is reduced on ring c, which holds exactly one rank of every covering group:
        # the rank whose chunk list contains c (checked once per DP group).
        if dp.id in checked:
            continue
        checked.add(dp.id)
        served = {r: set(dp.rings_of(r)) for r in dp.ranks}
        # Independently: the rank at index k of a TP-t group serves chunks k, k + t, k + 2t, ... (appendix B).
        assert all(served[r] == set(range(g.ranks.index(r), L, g.tp)) for g in covering for r in g.ranks)
        for c, ring in enumerate(dp.rings):
            assert len(ring) == len(covering)
            for g, r in zip(covering, ring, strict=True):
                assert r in g.ranks and [x for x in g.ranks if c in served[x]] == [r]


@settings(max_examples=150, deadline=None)
@given(deployments())
def test_rings_reduce_equal_chunks(dep):
    groups, layer_bytes = dep
    plan = plan_groups(groups, layer_bytes)
    by_id = {g.id: g for g in groups}
    for dp in plan.dp_groups:
        assert dp.lcm <= 840  # appendix E
        assert len(set(dp.rings)) == dp.lcm  # distinct rings
        assert dp.chunk_bytes == sum(b for _, b in dp.layer_chunk_bytes)
        assert dp.grad_bytes == sum(layer_bytes[x] for x in range(dp.layers[0], dp.layers[1] + 1))
        for gid in dp.device_groups:
            g = by_id[gid]
            for r in g.ranks:
                k = len(dp.rings_of(r))
                assert k == dict(dp.chunks_per_rank)[r] == dp.lcm // g.tp
                # A rank reduces its d/t share, up to the per-layer padding of its chunks.
                held = k * dp.chunk_bytes
                assert held * g.tp >= dp.grad_bytes
                assert held * g.tp - dp.grad_bytes < dp.lcm * (dp.layers[1] - dp.layers[0] + 1)
