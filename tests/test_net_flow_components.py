"""The flow model recomputes max-min rates only where flows changed (issue 24), and stays exact: the touched
components found by reachability, flows alone on their links kept without recomputing, and answers equal to
the reference model (tests/flow_reference.py) on many concurrent rings sharing NICs."""

from __future__ import annotations

import numpy as np
from xsim.netmodels import CollectiveSpec, FlowModel, topology_from_spec
from xsim.netmodels import flow as flow_module
from xsim.netmodels.flow_tables import FlowTemplates

from tests.flow_reference import ReferenceFlowModel
from tests.test_net_flow_exact import _drive


def test_reach_finds_the_flows_connected_to_touched_links_through_shared_links():
    # Links 0-5 (pad 6). Flows: 0 on [0, 1], 1 on [1, 2], 2 on [3], 3 on [3, 4], 4 on [5]. Link 1 joins flows
    # 0 and 1, link 3 joins 2 and 3; flow 4 is alone. Touching link 2 reaches flow 1 and, through link 1,
    # flow 0; touching link 4 reaches 3 and, through link 3, flow 2; touching link 5 reaches only flow 4.
    tpl = FlowTemplates(np.ones(6))
    pad = tpl.pad
    rows = np.array([[0, 1], [1, 2], [3, pad], [3, 4], [5, pad]])
    tpl.occupy(rows, 1)  # the flows in flight, as the model counts them
    assert tpl.reach(rows, np.array([2])).tolist() == [True, True, False, False, False]
    assert tpl.reach(rows, np.array([4])).tolist() == [False, False, True, True, False]
    assert tpl.reach(rows, np.array([5, pad])).tolist() == [False, False, False, False, True]
    assert tpl.reach(rows, np.array([pad])).tolist() == [False] * 5
    ptr, links = tpl.csr(rows[[0, 2, 3]])
    assert ptr.tolist() == [0, 2, 3, 5] and links.tolist() == [0, 1, 3, 3, 4]


def _rings_script(n_nodes: int, gpus: int, seed: int) -> list:
    """Tensor-parallel rings inside nodes (alone on NVLink) and data-parallel rings across nodes (sharing
    NICs and the fabric), started at staggered times: the traffic of a heterogeneous training step."""
    rng = np.random.default_rng(seed)
    script = []
    now = 0
    for _ in range(40):
        now += int(rng.choice([0, 0, 1, 900, 40_000, 700_000]))
        if rng.random() < 0.4:
            node = int(rng.integers(n_nodes))
            ranks = tuple(range(node * gpus, node * gpus + gpus))
        else:
            pos = int(rng.integers(gpus))
            nodes = rng.choice(n_nodes, size=int(rng.integers(2, n_nodes + 1)), replace=False)
            ranks = tuple(int(x) * gpus + pos for x in nodes)
        size = int(rng.choice([1 << 16, 1 << 20, 3_000_001, 1 << 24]))
        script.append((now, CollectiveSpec("all_reduce", size, ranks, "ring")))
    return script


def test_concurrent_rings_sharing_nics_give_the_reference_answers_with_partial_recomputation(monkeypatch):
    topo = topology_from_spec("nodes:6*H100x4:preset=table6:fabric=leaf_spine:nics_per_leaf=2:spines=2")
    flows_solved = []
    real = flow_module.max_min_rates

    def counting(ptr, links, cap):
        flows_solved.append(len(ptr) - 1)
        return real(ptr, links, cap)

    monkeypatch.setattr(flow_module, "max_min_rates", counting)
    shared_seen = []
    real_solve = FlowModel._solve_touched

    def solve(self):
        # The flows that share a link when the rates are recomputed (what a full computation solves).
        rows = self._tpl.flow_links(self._tid)
        shared_seen.append(int((self._tpl.on[rows] > 1).any(axis=1).sum()))
        return real_solve(self)

    monkeypatch.setattr(FlowModel, "_solve_touched", solve)
    for seed in range(3):
        script = _rings_script(6, 4, seed)
        assert _drive(FlowModel(topo), script) == _drive(ReferenceFlowModel(topo), script), seed
    # The test exercises the partial path: fewer flows were solved than shared flows needed new rates.
    assert len(shared_seen) > 50
    assert sum(flows_solved) < sum(shared_seen)


def test_flows_alone_on_their_links_keep_rates_without_recomputing():
    # Two 1 MiB P2Ps on disjoint routes of one switch (ranks 0 -> 1 and 2 -> 3, 50 GB/s links, 500 ns per
    # link): each alone at 50 bytes/ns drains 2^20 bytes in 20,971.52 ns (the first's next event: 20,972 ns
    # rounded up) and lands one route latency (2 links, 1,000 ns) later: 21,972 and, started at 1,000 ns,
    # 22,972 ns. The second start changes no flow's sharing: the rates stand without progressive filling.
    from xsim.netmodels.topology import switch_topology

    model = FlowModel(switch_topology(4, 50e9, 500))
    a = model.start_p2p(0, 0, 1, 1 << 20)
    assert model.next_event_ns() == 20_972
    b = model.start_p2p(1000, 2, 3, 1 << 20)
    model._settle()  # admitted as the engine's next query would (flows started at one instant wait for it)
    assert model._clean and model._tpl.on[: model._tpl.pad].max() == 1
    done = model.advance(30_000)
    assert [(c.handle, c.finish_ns) for c in done] == [(a, 21_972), (b, 22_972)]


def test_links_touched_before_a_longer_route_was_added_still_give_the_reference_answers():
    # A flow on a 2-link route inside a node finishes and leaves the model empty; then two flows from rank 0
    # to rank 4 (sharing every link of their 6-link route) start at one instant with no query between, as
    # the engine starts an instant's transfers, on a route longer than any seen before (the padded link
    # rows widen from 2 to 6). The links the first flow touched and the new flows' links are followed
    # together when the shared pair is solved; every answer is the reference model's.
    topo = topology_from_spec("nodes:2*H100x4:preset=table6:fabric=leaf_spine:nics_per_leaf=1:spines=2")

    def answers(model) -> list:
        seen = [model.start_p2p(0, 0, 1, 1 << 20)]
        while (n := model.next_event_ns()) is not None:
            seen += [n, model.advance(n)]
        seen += [model.start_p2p(1_000_000, 0, 4, 1 << 20), model.start_p2p(1_000_000, 0, 4, 3 << 19)]
        while (n := model.next_event_ns()) is not None:
            seen += [n, model.advance(n)]
        return seen

    model = FlowModel(topo)
    assert answers(model) == answers(ReferenceFlowModel(topo))
    assert model._tpl.links.shape[1] == 6  # the cross-node route did widen the rows
