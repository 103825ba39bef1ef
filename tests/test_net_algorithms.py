"""Collective algorithms: per-algorithm closed forms on simple topologies, worked out by hand."""

from __future__ import annotations

import math

import pytest
from xsim.netmodels import AnalyticalModel, CollectiveSpec, FlowModel, simulate_collective, topology_from_spec
from xsim.netmodels.algorithms import build_schedule, in_order_tree
from xsim.netmodels.errors import AlgorithmError
from xsim.netmodels.topology import ring_topology, switch_topology

A, BW = 100.0, 1e9  # 100 ns per hop, 1 GB/s = 1 byte/ns
S = 1_200_000


def run(cls, topo, kind, algorithm, n, root=None, size=S):
    return simulate_collective(cls(topo), CollectiveSpec(kind, size, tuple(range(n)), algorithm, root))


def test_ring_broadcast_is_a_pipelined_chain_from_the_root():
    # chain 2 -> 3 -> 0 -> 1, pipelined as NCCL's ring broadcast (src/device/broadcast.h runRing: each rank
    # forwards chunk by chunk): the three links carry the whole 1.2 MB at once, one hop each (100 ns +
    # 1,200,000 B at 1 B/ns); the pipeline's fill (a chunk per further hop) is not modelled.
    c = run(AnalyticalModel, ring_topology(4, BW, A), "broadcast", "ring", 4, root=2)
    assert c.per_rank_finish_ns == (A + S,) * 4


def test_ring_scatter_and_gather_carry_shrinking_and_growing_blocks():
    p = 4
    blk = S / p
    sc = run(AnalyticalModel, ring_topology(p, BW, A), "scatter", "ring", p)
    assert sc.finish_ns == 3 * A + (3 + 2 + 1) * blk
    ga = run(AnalyticalModel, ring_topology(p, BW, A), "gather", "ring", p)
    assert ga.finish_ns == 3 * A + (1 + 2 + 3) * blk


def test_direct_rooted_kinds_share_the_root_port_only_in_flow():
    p = 5
    topo = switch_topology(p, BW, A)
    assert run(AnalyticalModel, topo, "broadcast", "direct", p).finish_ns == 2 * A + S
    assert run(FlowModel, topo, "broadcast", "direct", p).finish_ns == 2 * A + (p - 1) * S
    assert run(FlowModel, topo, "gather", "direct", p).finish_ns == 2 * A + (p - 1) * S / p
    assert run(FlowModel, topo, "reduce", "direct", p).finish_ns == 2 * A + (p - 1) * S


def test_ring_all_to_all_and_barrier():
    p = 4
    topo = ring_topology(p, BW, A)
    a2a = run(AnalyticalModel, topo, "all_to_all", "ring", p)
    assert a2a.finish_ns == (p - 1) * A + S / p * (3 + 2 + 1)
    bar = run(AnalyticalModel, topo, "barrier", "ring", p, size=0)
    assert bar.finish_ns == 2 * (p - 1) * A
    dis = run(AnalyticalModel, topo, "barrier", "halving_doubling", p, size=0)
    assert dis.finish_ns == A + 2 * A  # dissemination: distance 1, then distance 2 (two ring hops)


def test_double_binary_tree_two_half_trees():
    p = 8
    c = run(AnalyticalModel, switch_topology(p, BW, A), "all_reduce", "double_binary_tree", p)
    # Both trees have 3 levels below the root: 3 edges up, 3 down, each tree carries S/2.
    assert c.finish_ns == 6 * (2 * A + S / 2)
    assert in_order_tree(8, root_max=True) == [1, 3, 1, 7, 5, 3, 5, -1]
    assert in_order_tree(8, root_max=False) == [-1, 2, 4, 2, 0, 6, 4, 6]


def test_hierarchical_on_two_table5_nodes():
    topo = topology_from_spec("nodes:2*H100x4")
    c = run(AnalyticalModel, topo, "all_reduce", "hierarchical", 8)
    nv = 3600e9 / 8 / 1e9  # bytes/ns, Table 5 H100 scale-up
    nic = 10e9 / 8 / 1e9  # Table 5 NIC
    intra = 3 * (2 * 20.44 + S / 4 / nv)
    inter = 2 * (2 * 287.5 + 2 * 1500 + S / 8 / nic)
    assert c.finish_ns == math.ceil(2 * intra + inter)


def test_multi_ring_uses_both_directions():
    p = 4
    one = run(AnalyticalModel, ring_topology(p, BW, 0), "all_reduce", "ring", p).finish_ns
    two = run(FlowModel, ring_topology(p, BW, 0), "all_reduce", "multi_ring:2", p).finish_ns
    assert two == one / 2
    same_way = run(FlowModel, ring_topology(p, BW, 0), "all_reduce", "multi_ring:1", p).finish_ns
    assert same_way == one


@pytest.mark.parametrize(
    "kind,algorithm,match",
    [
        ("broadcast", "halving_doubling", "does not implement"),
        ("all_gather", "double_binary_tree", "does not implement"),
        ("all_reduce", "multi_ring:x", "ring count"),
        ("all_reduce", "ring:3", "takes no parameter"),
    ],
)
def test_schedule_errors(kind, algorithm, match):
    with pytest.raises(AlgorithmError, match=match):
        build_schedule(kind, algorithm, 4, 1000)


def test_hierarchical_needs_equal_ranks_per_host():
    topo = topology_from_spec("nodes:H100x4,H100x2")
    with pytest.raises(AlgorithmError, match="same number"):
        run(AnalyticalModel, topo, "all_reduce", "hierarchical", 6)
