"""The rewriter on a hand-made four-rank bundle, checked node by node.

Deployment (2 layers): DG0 = rank 0, TP 1, layers [1,2], replica 0 (one stage);
DG1 = ranks {1,2}, TP 2, layers [1,1], replica 1 stage 0; DG2 = rank 3, TP 1, layers [2,2], replica 1 stage 1.
Sweep line: points {1,2,3} -> DP group 0 = [1,1] over DG0+DG1, L = lcm(1,2) = 2, rings (0,1), (0,2);
DP group 1 = [2,2] over DG0+DG2, L = 1, ring (0,3). Layer gradients 1200 and 600 bytes, so ring chunks are
1200/2 = 600 and 600/1 = 600 bytes. Boundary DG1 (TP 2) -> DG2 (TP 1) carries a 12-byte activation.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from xsim.tracegen.bundle import TraceBundle
from xsim.tracegen.planner import plan_groups, view_device_groups
from xsim.tracegen.planner.rewrite import RewriteError, rewrite_bundle
from xsim.traces import pb
from xsim.traces.attrs import (
    CHUNK,
    LAYER,
    MICRO_BATCH,
    PHASE,
    PP_BOUNDARY,
    RESHARD,
    RING,
    attr_dict,
    make_node,
)
from xsim.traces.checks import check_all
from xsim.traces.groups import ProcessGroups
from xsim.traces.stream import EtFile

DGS = [
    SimpleNamespace(id=0, ranks=[0], tp=1, layer_start=1, layer_end=2, pp_stage=0, dp_replica=0),
    SimpleNamespace(id=1, ranks=[1, 2], tp=2, layer_start=1, layer_end=1, pp_stage=0, dp_replica=1),
    SimpleNamespace(id=2, ranks=[3], tp=1, layer_start=2, layer_end=2, pp_stage=1, dp_replica=1),
]


def plan():
    return plan_groups(view_device_groups(DGS, 2), {1: 1200, 2: 600}, activation_bytes=12)


def comp(i, name, layer, phase, data=(), ctrl=()):
    return make_node(
        i, name, pb.COMP_NODE, data_deps=data, ctrl_deps=ctrl, duration_micros=1,
        attrs={LAYER: layer, PHASE: phase, MICRO_BATCH: 0 if phase in ("fwd", "bwd") else -1},
    )  # fmt: skip


def p2p(i, send, src, dst, tag, size, layer, phase, data=()):
    kind = pb.COMM_SEND_NODE if send else pb.COMM_RECV_NODE
    attrs = {"comm_src": src, "comm_dst": dst, "comm_tag": tag, "comm_size": size, PP_BOUNDARY: 1}
    attrs.update({LAYER: layer, PHASE: phase, MICRO_BATCH: 0})
    return make_node(i, f"{'send' if send else 'recv'}{src}->{dst}", kind, data_deps=data, attrs=attrs)


def bundle():
    """The generator's shape: naive P2P (rank 1 -> 3 activations; rank 3 -> 1 and 2 gradients)."""
    nodes = {
        0: [comp(0, "f1", 1, "fwd"), comp(1, "f2", 2, "fwd", [0]), comp(2, "b2", 2, "bwd", [1]),
            comp(3, "b1", 1, "bwd", [2]), comp(4, "opt", 0, "opt", [3])],
        1: [comp(0, "f1", 1, "fwd"), p2p(1, True, 1, 3, 0, 12, 1, "fwd", [0]),
            p2p(2, False, 3, 1, 1, 12, 1, "bwd"), comp(3, "b1", 1, "bwd", [2], [0]), comp(4, "opt", 0, "opt", [3])],
        2: [comp(0, "f1", 1, "fwd"), p2p(1, False, 3, 2, 1, 12, 1, "bwd"),
            comp(2, "b1", 1, "bwd", [1], [0]), comp(3, "opt", 0, "opt", [2])],
        3: [p2p(0, False, 1, 3, 0, 12, 2, "fwd"), comp(1, "f2", 2, "fwd", [0]), comp(2, "b2", 2, "bwd", [1]),
            p2p(3, True, 3, 1, 1, 12, 2, "bwd", [2]), p2p(4, True, 3, 2, 1, 12, 2, "bwd", [2]),
            comp(5, "opt", 0, "opt", [2])],
    }  # fmt: skip
    return TraceBundle(nodes=nodes, comm_groups={}, next_id={r: len(n) for r, n in nodes.items()})


def view(b, r):
    """rank r as {id: (name, type, data_deps, selected attrs)}."""
    out = {}
    for n in b.nodes[r]:
        a = attr_dict(n)
        keep = {
            k: a[k]
            for k in ("comm_size", "pg_name", "comm_src", "comm_dst", "comm_tag", RING, CHUNK)
            if k in a
        }
        out[n.id] = (n.name, pb.node_type_name(n.type), list(n.data_deps), keep)
    return out


def group(b, ranks):
    return b.new_group(ranks)  # idempotent: the name the rewriter registered


def test_xsim_rewrite_node_by_node():
    b = rewrite_bundle(bundle(), SimpleNamespace(sequence_parallel=True), "xsim", plan=plan())
    g012, g01, g02, g03, g123 = (group(b, r) for r in ((0, 1, 2), (0, 1), (0, 2), (0, 3), (1, 2, 3)))
    AR = BAR = "COMM_COLL_NODE"
    # Resharding runs first (its sends get the lower ids, issued first when a sync collective is also
    # ready). TP 2 -> 1 with xsim: L = 2 chunks of 12/2 = 6 bytes; tags continue after the existing 0, 1;
    # the bwd boundary (sorted first) gets tags 2, 3, the fwd one 4, 5.
    r1 = view(b, 1)
    assert 1 not in r1 and 2 not in r1  # the naive send and receive are gone
    assert r1[5] == ("pp_bwd_mb0/xsim/step0/recv_from3/c0", "COMM_RECV_NODE", [],
                     {"comm_src": 3, "comm_dst": 1, "comm_tag": 2, "comm_size": 6, RING: 0, CHUNK: 0})  # fmt: skip
    assert r1[6] == ("pp_fwd_mb0/xsim/step0/send_to3/c0", "COMM_SEND_NODE", [0],
                     {"comm_src": 1, "comm_dst": 3, "comm_tag": 4, "comm_size": 6, RING: 0, CHUNK: 0})  # fmt: skip
    assert r1[3][2] == [5]  # b1 now waits for the resharded gradient
    # Rank 1's sync: DP group [1,1] after its backward (b1, id 3) and its boundary send (id 6), ring 0 of
    # {(0,1), (0,2)}, then the replica's PBG barrier before the optimizer.
    assert r1[7] == ("dp_barrier[1-1]", BAR, [3, 6], {"comm_size": 0, "pg_name": g012, RING: -1, CHUNK: -1})
    assert r1[8] == ("grad_sync[1-1]/ring0", AR, [7], {"comm_size": 600, "pg_name": g01, RING: 0, CHUNK: 0})
    assert r1[9] == (
        "pipeline_barrier[replica 1]",
        BAR,
        [8],
        {"comm_size": 0, "pg_name": g123, RING: -1, CHUNK: -1},
    )
    assert r1[4][2] == [3, 9]
    # Rank 0: sync starts after its whole backward (b1, id 3), groups in backward order: [2,2] barrier 5,
    # ring 0 (id 6, 600 B); [1,1] after ring 6: barrier 7, rings 0 and 1 (ids 8, 9). Replica 0 has one
    # stage: no PBG barrier; the optimizer waits for every ring.
    r0 = view(b, 0)
    assert r0[5] == ("dp_barrier[2-2]", BAR, [3], {"comm_size": 0, "pg_name": g03, RING: -1, CHUNK: -1})
    assert r0[6] == ("grad_sync[2-2]/ring0", AR, [5], {"comm_size": 600, "pg_name": g03, RING: 0, CHUNK: 0})
    assert r0[7] == ("dp_barrier[1-1]", BAR, [3, 6], {"comm_size": 0, "pg_name": g012, RING: -1, CHUNK: -1})
    assert r0[8] == ("grad_sync[1-1]/ring0", AR, [7], {"comm_size": 600, "pg_name": g01, RING: 0, CHUNK: 0})
    assert r0[9] == ("grad_sync[1-1]/ring1", AR, [7], {"comm_size": 600, "pg_name": g02, RING: 1, CHUNK: 1})
    assert r0[4][2] == [3, 6, 8, 9] and b.next_id[0] == 10
    # Rank 2 sent nothing in the naive mapping: its chunk-1 send hangs off its last forward node (id 0).
    r2 = view(b, 2)
    assert r2[4] == ("pp_bwd_mb0/xsim/step0/recv_from3/c1", "COMM_RECV_NODE", [],
                     {"comm_src": 3, "comm_dst": 2, "comm_tag": 3, "comm_size": 6, RING: 1, CHUNK: 1})  # fmt: skip
    assert r2[5] == ("pp_fwd_mb0/xsim/step0/send_to3/c1", "COMM_SEND_NODE", [0],
                     {"comm_src": 2, "comm_dst": 3, "comm_tag": 5, "comm_size": 6, RING: 1, CHUNK: 1})  # fmt: skip
    assert r2[2][2] == [4]
    assert r2[6][:3] == ("dp_barrier[1-1]", BAR, [2, 5])
    assert r2[7][3] == {"comm_size": 600, "pg_name": g02, RING: 1, CHUNK: 1} and r2[7][2] == [6]
    assert r2[8][:3] == ("pipeline_barrier[replica 1]", BAR, [7]) and r2[3][2] == [2, 8]
    # Rank 3: two sends replacing ids 3 and 4, two receives replacing id 0 that f2 now depends on; then the
    # [2,2] ring {0,3} (DBG and ring are the same process group here) and the PBG barrier.
    r3 = view(b, 3)
    assert [r3[i][:3] for i in (6, 7, 8, 9)] == [
        ("pp_bwd_mb0/xsim/step0/send_to1/c0", "COMM_SEND_NODE", [2]),
        ("pp_bwd_mb0/xsim/step0/send_to2/c1", "COMM_SEND_NODE", [2]),
        ("pp_fwd_mb0/xsim/step0/recv_from1/c0", "COMM_RECV_NODE", []),
        ("pp_fwd_mb0/xsim/step0/recv_from2/c1", "COMM_RECV_NODE", []),
    ]
    assert r3[10][:3] == ("dp_barrier[2-2]", BAR, [2, 6, 7]) and r3[11][:3] == (
        "grad_sync[2-2]/ring0",
        AR,
        [10],
    )
    assert r3[12][:3] == ("pipeline_barrier[replica 1]", BAR, [11])
    assert r3[1][2] == [8, 9] and r3[5][2] == [2, 12] and {0, 3, 4}.isdisjoint(r3)
    # Every inserted node names the strategy; the result is a valid trace set.
    for r, nodes in b.nodes.items():
        for n in nodes:
            a = attr_dict(n)
            if n.id >= len(bundle().nodes[r]):
                assert a[RESHARD] == "xsim" and RING in a and CHUNK in a
    files = [EtFile(f"r{r}", pb.GlobalMetadata(), b.nodes[r], [], False) for r in range(4)]
    assert check_all(files, ProcessGroups(4, b.comm_groups)) == []


def test_hetauto_and_alpacomm_messages():
    # TP 2 -> 1: GCD 1, one virtual group: rank 2 gathers into leader 1 (step 0), leader sends all 12 bytes
    # to rank 3 (step 1), so the leader's send depends on its gather receive.
    b = rewrite_bundle(bundle(), SimpleNamespace(sequence_parallel=True), "hetauto", plan=plan())
    r1 = view(b, 1)
    recv = next(i for i, v in r1.items() if v[0] == "pp_fwd_mb0/hetauto/step0/recv_from2/c1")
    send = next(v for v in r1.values() if v[0] == "pp_fwd_mb0/hetauto/step1/send_to3/c0")
    assert send[2] == [0, recv] and send[3]["comm_size"] == 12
    # AlpaComm: cut points {0,6,12}: two 6-byte units, like xsim here.
    b = rewrite_bundle(bundle(), SimpleNamespace(sequence_parallel=True), "alpacomm", plan=plan())
    sizes = sorted(v[3]["comm_size"] for v in view(b, 3).values() if v[1] == "COMM_RECV_NODE")
    assert sizes == [6, 6]


def test_allgather_without_sequence_parallelism():
    # Without SP the receiving TP group gathers the full activation after the resharded receive; the gather
    # also waits for the consumer's chain predecessor (b1's ctrl dep on f1, id 0).
    b = rewrite_bundle(bundle(), SimpleNamespace(sequence_parallel=False), "xsim", plan=plan())
    r1 = view(b, 1)
    ag = next(i for i, v in r1.items() if v[0] == "pp_bwd_mb0/xsim/allgather")
    recv = next(i for i, v in r1.items() if v[0] == "pp_bwd_mb0/xsim/step0/recv_from3/c0")
    assert r1[ag][2] == [recv, 0] and r1[ag][3]["comm_size"] == 6 and r1[3][2] == [ag]


def test_naive_one_uniform_allreduce_per_group():
    # d / min(t): [2,2] 600 / 1 = 600 on {0,3} first (backward order), then [1,1] 1200 / 1 = 1200 on {0,1,2};
    # no barrier; P2P untouched.
    b = rewrite_bundle(bundle(), SimpleNamespace(sequence_parallel=True), "naive", plan=plan())
    r0 = view(b, 0)
    assert r0[5] == (
        "grad_sync[2-2]",
        "COMM_COLL_NODE",
        [3],
        {"comm_size": 600, "pg_name": group(b, (0, 3)), RING: 0, CHUNK: -1},
    )
    assert r0[6] == (
        "grad_sync[1-1]",
        "COMM_COLL_NODE",
        [3, 5],
        {"comm_size": 1200, "pg_name": group(b, (0, 1, 2)), RING: 0, CHUNK: -1},
    )
    assert len(r0) == 7 and r0[4][2] == [3, 5, 6]
    assert view(b, 3)[0][0] == "recv1->3"


def test_errors():
    b = rewrite_bundle(bundle(), SimpleNamespace(), "xsim", plan=plan())
    with pytest.raises(RewriteError, match="already carries 'reshard'"):
        rewrite_bundle(b, SimpleNamespace(), "xsim", plan=plan())
    with pytest.raises(RewriteError, match="unknown reshard strategy 'best'"):
        rewrite_bundle(bundle(), SimpleNamespace(), "best", plan=plan())
    nodes = bundle()
    nodes.nodes[0] = [n for n in nodes.nodes[0] if n.name != "b1"]
    with pytest.raises(RewriteError, match="rank 0: no backward node of layers 1-1"):
        rewrite_bundle(nodes, SimpleNamespace(), "xsim", plan=plan())
    nodes = bundle()
    del nodes.nodes[3]
    with pytest.raises(RewriteError, match="bundle has ranks 0..2"):
        rewrite_bundle(nodes, SimpleNamespace(), "xsim", plan=plan())
