"""The flow model recomputes max-min rates only where flows changed (issue 24), and stays exact: the touched
components found by reachability, flows alone on their links kept without recomputing, and answers equal to
the reference model (tests/flow_reference.py) on many concurrent rings sharing NICs."""

from __future__ import annotations

import numpy as np
from xsim.netmodels import CollectiveSpec, FlowModel, topology_from_spec
from xsim.netmodels import flow_slots as slots_module
from xsim.netmodels.flow_slots import FlowSlots
from xsim.netmodels.flow_tables import FlowTemplates

from tests.flow_reference import ReferenceFlowModel
from tests.test_net_flow_exact import _drive


def test_components_follow_shared_links_only_and_split_when_a_flow_leaves():
    # Links 0-5. Flows (slots in admission order 0-4): 0 on [0, 1], 1 on [1, 2], 2 on [3], 3 on [3, 4], 4 on
    # [5]. Link 1 joins flows 0 and 1, link 3 joins 2 and 3; flow 4 is alone. Per link: counts 1 2 1 2 1 1,
    # the lone flow of each link carrying one (link 0: flow 0, 2: 1, 4: 3, 5: 4), the sets of links 1 and
    # 3. Taking flow 1 out leaves flow 0 alone on link 1 (its holder now), so 0's component is 0 alone.
    tpl = FlowTemplates(np.ones(6))
    routes = [[0, 1], [1, 2], [3], [3, 4], [5]]
    tids = [tpl.add(1000.0, tpl.add_route(np.array(r)), 0.0) for r in routes]
    fs = FlowSlots(tpl, tpl.cap)
    assert fs.admit([("f", i) for i in range(5)], tids, True) is False  # links 1 and 3 carry two flows
    slot = {fs.rec[s][1]: s for s in range(len(fs.rec)) if fs.rec[s] is not None}
    assert fs.on[:6] == [1, 2, 1, 2, 1, 1]
    assert {k: sorted(v) for k, v in fs.shared.items()} == {
        1: sorted([slot[0], slot[1]]),
        3: sorted([slot[2], slot[3]]),
    }
    assert [fs.holder[link] for link in (0, 2, 4, 5)] == [slot[0], slot[1], slot[3], slot[4]]

    def comp(flow):
        return sorted(fs.rec[s][1] for s in fs.component(slot[flow], set()))

    assert comp(0) == comp(1) == [0, 1] and comp(2) == comp(3) == [2, 3] and comp(4) == [4]
    recs, lands, alone = fs.take_out([slot[1]], 10.0)
    assert recs == [("f", 1)] and lands == [10.0] and alone is False
    assert fs.on[:6] == [1, 1, 0, 2, 1, 1] and sorted(fs.shared) == [3] and fs.holder[1] == slot[0]
    assert comp(0) == [0]
    # Rates: the touched links (all five flows' and flow 1's again) reach every component: 0 alone on
    # links of capacity 1 gets 1; 2 and 3 share link 3 and get 1/2 each; 4 alone gets 1.
    assert fs.solve_touched() is True
    assert [fs.rate[slot[f]] for f in (0, 2, 3, 4)] == [1.0, 0.5, 0.5, 1.0]


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
    real = slots_module.max_min_rates

    def counting(ptr, links, cap):
        flows_solved.append(len(ptr) - 1)
        return real(ptr, links, cap)

    monkeypatch.setattr(slots_module, "max_min_rates", counting)
    shared_seen = []
    real_solve = FlowSlots.solve_touched

    def solve(self):
        # The flows that share a link when the rates are recomputed (what a full computation solves).
        shared_seen.append(len(set().union(*self.shared.values())))
        return real_solve(self)

    monkeypatch.setattr(FlowSlots, "solve_touched", solve)
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
    assert model._clean and max(model._fs.on[: model._tpl.pad]) == 1
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
