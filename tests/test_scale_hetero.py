"""The 1,024-GPU heterogeneous example (examples/hetero1024.yaml), generation shortcuts, and `flow-hybrid`.

Not timed: scripts/bench_scale.py --scenario hetero1024 measures; these pin what the example plans and what
the generator's and the flow models' shortcuts must not change.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from xsim.netmodels import AnalyticalModel, CollectiveSpec, FlowModel, build_model, simulate_collective
from xsim.netmodels.cluster import build_cluster
from xsim.netmodels.flow import HybridFlowModel
from xsim.tracegen import generate, load_spec
from xsim.tracegen.planner import build_plan
from xsim.tracegen.planner.rewrite import rewrite_bundle
from xsim.tracegen.workload import _Generator
from xsim.traces import pb
from xsim.traces.attrs import PP_BOUNDARY, RESHARD, get_int, get_str

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "examples" / "hetero1024.yaml"


def scaled(replicas: int) -> dict:
    """hetero1024 with `replicas` H100 and `replicas` A100 replicas (64 ranks each pair), ranks renumbered."""
    m = yaml.safe_load(SPEC.read_text())
    m["parallel"]["dp"] = replicas
    shift = 512 - 32 * replicas  # the A100 ranks start after the H100 blocks' 32 per replica
    groups = []
    for g in m["device_groups"]:
        rep = g["dp_replica"] - 16
        if rep < replicas:
            a, b = (int(x) - shift for x in g["ranks"].split("-"))
            gid = g["id"] - 64 + 4 * replicas
            groups.append({**g, "ranks": f"{a}-{b}", "dp_replica": replicas + rep, "id": gid})
    m["device_groups"] = groups
    m["name"] = f"hetero{64 * replicas}"
    return m


def test_the_full_example_plans_1024_ranks_with_resharding_and_multi_ring_sync():
    dep = load_spec(SPEC)
    plan = build_plan(dep)
    ranks = sorted(r for g in plan.device_groups for r in g.ranks)
    assert ranks == list(range(1024))
    gpus = [g.gpu for g in dep.device_groups]
    assert gpus.count("H100") == 64 and gpus.count("A100-80GB") == 80  # 16 x 4 stages, 16 x 5 stages
    assert plan.heterogeneous
    # Cuts 1|9|17|25 (H100, 8 layers per stage) and 1|5|10|18|26 (A100) give these segments (sweep line).
    assert [g.layers for g in plan.dp_groups] == [
        (1, 4), (5, 8), (9, 9), (10, 16), (17, 17), (18, 24), (25, 25), (26, 32)
    ]  # fmt: skip
    for g in plan.dp_groups:
        assert g.lcm == 8 and len(g.rings) == 8  # lcm(TP 8, TP 4 or 8)
        assert all(len(ring) == 32 for ring in g.rings)  # one rank of each of the 32 replicas
    # Every A100 replica changes TP 4 -> 8 between its stages 1 and 2: 16 resharded boundaries.
    resharded = [b for b in plan.boundaries if b.reshard]
    assert len(resharded) == 16
    assert {(len(b.src_ranks), len(b.dst_ranks), b.src_stage) for b in resharded} == {(4, 8, 1)}


def test_scaled_down_example_generates_resharding_and_ring_collectives(tmp_path):
    from tests.test_gen_workload import _validate

    dep = load_spec(scaled(1))
    bundle = generate(dep)
    assert sorted(bundle.nodes) == list(range(64))
    rings, reshard_p2p = set(), 0
    for nodes in bundle.nodes.values():
        for n in nodes:
            if get_str(n, RESHARD, None) is None:
                continue
            if n.type == pb.COMM_COLL_NODE and n.name.startswith("grad_sync["):
                rings.add(n.name)
            if n.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                assert get_int(n, PP_BOUNDARY, 0) == 1
                reshard_p2p += 1
    # 8 DP groups x 8 rings, each named by its layers and ring index.
    assert len(rings) == 64 and "grad_sync[26-32]/ring7" in rings
    assert reshard_p2p > 0
    _, findings = _validate(bundle, tmp_path, dep.name)
    assert [str(f) for f in findings] == []


def test_copies_across_replicas_and_shared_rewrite_state_change_no_byte():
    # The generator copies a rank's program to every rank of the same shape, across replicas too, and
    # hands the rewriter which ranks are copies; building every rank and rewriting without that record
    # must give the same bytes.
    dep = load_spec(scaled(2))
    gen = _Generator(dep)
    fast = gen.run()
    assert len(set(gen.twins().of.values())) < len(fast.nodes) // 8  # copies across replicas happened
    rewrite_bundle(fast, dep, "xsim", twins=gen.twins())
    slow = _Generator(dep, clone=False).run()
    rewrite_bundle(slow, dep, "xsim")
    assert fast.comm_groups == slow.comm_groups and fast.next_id == slow.next_id
    for rank in slow.nodes:
        assert [n.SerializeToString() for n in fast.nodes[rank]] == [
            n.SerializeToString() for n in slow.nodes[rank]
        ]


def two_hosts():
    """Two 4-GPU H100 hosts (NVLink inside, NICs to one switch): the paper's Table 5 links."""
    return build_cluster(
        {
            "preset": "table5",
            "nodes": [{"name": "a", "gpu": "H100", "ranks": [0, 1, 2, 3]}, {"name": "b", "gpu": "H100", "ranks": [4, 5, 6, 7]}],
            "fabric": {"kind": "switch"},
        }
    )  # fmt: skip


def drain(model) -> dict[int, tuple[int, tuple[int, ...]]]:
    got = {}
    while model.next_event_ns() is not None:
        for c in model.advance(model.next_event_ns()):
            got[c.handle] = (c.finish_ns, c.per_rank_finish_ns)
    return got


def test_hybrid_times_a_one_host_ring_in_closed_form_and_the_rest_as_flows():
    topo = two_hosts()
    size, p = 64 << 20, 4
    inside = CollectiveSpec("all_reduce", size, (0, 1, 2, 3))
    r = topo.route(0, 1)
    # Ring all-reduce alone on its links: 2(p-1) steps of latency + (size/p) / bandwidth (bytes/ns).
    expect = 2 * (p - 1) * (r.latency_ns + size / p / r.bottleneck_bytes_per_ns)
    hybrid = simulate_collective(HybridFlowModel(topo), inside)
    assert abs(hybrid.finish_ns - expect) <= 1
    assert hybrid == simulate_collective(AnalyticalModel(topo), inside)
    across = CollectiveSpec("all_reduce", size, (0, 4))
    assert simulate_collective(HybridFlowModel(topo), across) == simulate_collective(FlowModel(topo), across)


def test_hybrid_ignores_contention_on_one_host_links_and_keeps_it_between_hosts():
    # The documented approximation: a P2P flow 0 -> 1 slows the one-host all-gather under `flow` only.
    topo = two_hosts()
    spec = CollectiveSpec("all_gather", 16 << 20, (0, 1, 2, 3))
    alone = simulate_collective(FlowModel(topo), spec).finish_ns
    res = {}
    for name in ("flow", "flow-hybrid"):
        model = build_model(name, topo)
        hc = model.start_collective(0, spec)
        hp = model.start_p2p(0, 0, 1, 48 << 20)
        hq = model.start_collective(0, CollectiveSpec("all_reduce", 8 << 20, (0, 4)))
        got = drain(model)
        assert sorted(got) == sorted([hc, hp, hq])  # handles unique across the two halves
        res[name] = got[hc][0], got[hq][0]
    assert res["flow"][0] > alone
    assert res["flow-hybrid"][0] == simulate_collective(AnalyticalModel(topo), spec).finish_ns
    # Between hosts nothing changed: the 0 <-> 4 all-reduce crosses no link the one-host traffic uses here.
    assert res["flow-hybrid"][1] == res["flow"][1]


def test_hybrid_completions_are_ordered_by_time_then_handle():
    model = HybridFlowModel(two_hosts())
    spec = CollectiveSpec("all_reduce", 1 << 20, (0, 1))
    h0 = model.start_collective(0, spec)  # closed form
    h1 = model.start_p2p(0, 4, 5, 1 << 20)  # a flow
    h2 = model.start_collective(0, spec)  # the same closed form again: same finish, later handle
    done = model.advance(10**12)
    assert [c.handle for c in done] == sorted([h0, h1, h2], key=lambda h: (done_finish(done, h), h))
    assert done_finish(done, h0) == done_finish(done, h2)


def done_finish(done, handle: int) -> int:
    return next(c.finish_ns for c in done if c.handle == handle)


def test_hybrid_rejects_times_going_backwards():
    from xsim.netmodels import NetworkModelError

    model = HybridFlowModel(two_hosts())
    model.start_collective(100, CollectiveSpec("all_reduce", 1024, (0, 1)))
    with pytest.raises(NetworkModelError, match="non-decreasing"):
        model.start_collective(50, CollectiveSpec("all_reduce", 1024, (0, 1)))
