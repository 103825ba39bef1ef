"""The fast flow model gives the pre-round-3 model's results exactly (issue 11): split max-min, barriers in
closed form, batched landings; differential against tests/flow_reference.py on random workloads."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from xsim.netmodels import CollectiveSpec, FlowModel, topology_from_spec
from xsim.netmodels.algorithms import SUPPORTED
from xsim.netmodels.api import COLLECTIVE_KINDS
from xsim.netmodels.maxmin import max_min_rates, max_min_rates_split, shared_flows, shared_flows_small
from xsim.netmodels.topology import Topology, add_duplex, ring_topology, switch_topology

from tests.flow_reference import ReferenceFlowModel


def csr(flows):
    ptr = np.zeros(len(flows) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(f) for f in flows])
    return ptr, np.concatenate([np.array(f, dtype=np.int64) for f in flows])


def test_flows_alone_on_their_links_get_their_narrowest_link():
    # Flow 0 alone on links 0 (5) and 1 (3): 3. Flows 1 and 2 share link 2 (10): 5 each. Flow 3 alone on
    # links 3 (7) and 4 (2): 2.
    ptr, links = csr([[0, 1], [2], [2], [3, 4]])
    cap = np.array([5.0, 3.0, 10.0, 7.0, 2.0])
    assert max_min_rates_split(ptr, links, cap).tolist() == [3.0, 5.0, 5.0, 2.0]
    assert shared_flows(np.diff(ptr), links).tolist() == [False, True, True, False]
    assert shared_flows_small(np.diff(ptr).tolist(), links.tolist()) == [1, 2]
    assert shared_flows_small([1, 1], [0, 1]) is None


def test_split_rates_are_progressive_fillings_bit_for_bit():
    # Many flows alone on their links beside a few that share: the split answer must be the same bytes as
    # progressive filling over all flows (the replay's tables depend on it to the last bit).
    rng = np.random.default_rng(5)
    for _ in range(300):
        nl = int(rng.integers(2, 60))
        flows = [
            [int(x) for x in rng.choice(nl, size=int(rng.integers(1, min(nl, 4) + 1)), replace=False)]
            for _ in range(int(rng.integers(1, 40)))
        ]
        cap = rng.choice([rng.uniform(0.1, 500), 1.25, 25.0, 64.0, 450.0], nl)
        ptr, links = csr(flows)
        assert max_min_rates_split(ptr, links, cap).tobytes() == max_min_rates(ptr, links, cap).tobytes()
        mask = shared_flows(np.diff(ptr), links)
        small = shared_flows_small(np.diff(ptr).tolist(), links.tolist())
        assert (mask is None) == (small is None)
        if mask is not None:
            assert np.flatnonzero(mask).tolist() == small


def chain3() -> Topology:
    """Ranks a - b - c in a line: a-b 100 ns, b-c 300 ns, both 1 GB/s."""
    g = nx.DiGraph()
    for n in "abc":
        g.add_node(n, kind="npu")
    add_duplex(g, "a", "b", 1e9, 100, "l")
    add_duplex(g, "b", "c", 1e9, 300, "l")
    return Topology("chain", g, ("a", "b", "c"))


def test_ring_barrier_in_closed_form_matches_hand_computed_latencies():
    # Ring 0 -> 1 -> 2 -> 0, hops of 100, 300 and 400 ns (2 -> 0 crosses both links); 2 (p - 1) = 4 zero-byte
    # steps. Entry times per stage (positions 0, 1, 2): [0, 0, 0], [400, 100, 300], [700, 500, 400],
    # [800, 800, 800], [1200, 900, 1100]; the last sends land at 900 (from 0), 1100 (from 1), 1200 (from 2), so
    # the positions finish at 1200, 1100 and 1200.
    model = FlowModel(chain3())
    h = model.start_collective(0, CollectiveSpec("barrier", 0, (0, 1, 2)))
    (c,) = model.advance(10_000)
    assert (c.handle, c.finish_ns, c.per_rank_finish_ns) == (h, 1200, (1200, 1100, 1200))
    # Uniform ring of 4: six 100 ns steps after the start at 1,000 ns.
    model = FlowModel(ring_topology(4, 1e9, 100))
    model.start_collective(1000, CollectiveSpec("barrier", 0, (0, 1, 2, 3)))
    assert model.next_event_ns() == 1100  # the first landings are still a step of the model
    (c,) = model.advance(10_000)
    assert c.per_rank_finish_ns == (1600,) * 4


class PerTransferFlowModel(FlowModel):
    """FlowModel with the closed form for barriers turned off: every zero-byte transfer lands on its own."""

    def _plan(self, *args):
        channels, _ = super()._plan(*args)
        return channels, False


def _steps(model_cls, topo, starts):
    model = model_cls(topo)
    times = []
    step = model._step

    def record(t):
        times.append(t)
        step(t)

    model._step = record
    out = []
    for now, what in starts:
        if isinstance(what, CollectiveSpec):
            model.start_collective(now, what)
        else:
            model.start_p2p(now, *what)
    while (n := model.next_event_ns()) is not None:
        out += model.advance(n)
    return times, out


def test_closed_form_barrier_keeps_every_landing_as_a_model_step():
    # A flow in flight advances (rem -= rate * dt) at every step; the closed form must leave the same steps,
    # or the flow's float bytes and so its finish could move.
    topo = topology_from_spec("nodes:2*H100x4")
    starts = [
        (0, (0, 5, 3_000_000_007)),
        (1000, CollectiveSpec("barrier", 0, tuple(range(8)))),
        (1500, CollectiveSpec("barrier", 0, (1, 2, 6, 7))),
        (2000, (4, 1, 123_456_789)),
    ]
    fast = _steps(FlowModel, topo, starts)
    slow = _steps(PerTransferFlowModel, topo, starts)
    assert fast == slow
    assert len(fast[0]) > 20


def _drive(model, script):
    """Start the script's transfers in time order the way the engine does; every answer, in order."""
    seen = []
    for now, what in script:
        while (n := model.next_event_ns()) is not None and n <= now:
            seen.append(("next", n))
            seen.append(("done", model.advance(n)))
        if isinstance(what, CollectiveSpec):
            seen.append(("start", model.start_collective(now, what)))
        else:
            seen.append(("start", model.start_p2p(now, *what)))
    while (n := model.next_event_ns()) is not None:
        seen.append(("next", n))
        seen.append(("done", model.advance(n)))
    return seen


TOPOLOGIES = {
    "ring4": lambda: ring_topology(4, 1e9, 100),
    "switch8": lambda: switch_topology(8, 50e9, 500),
    "chain3": chain3,
    "mixed12": lambda: topology_from_spec(
        "nodes:2*H100x4,A100x2+H100x2:preset=table6:fabric=leaf_spine:nics_per_leaf=4:spines=2"
    ),
}


@pytest.mark.parametrize("topo_name", sorted(TOPOLOGIES))
def test_random_workloads_give_the_reference_models_answers_exactly(topo_name):
    topo = TOPOLOGIES[topo_name]()
    n = topo.num_ranks
    rng = np.random.default_rng(sorted(TOPOLOGIES).index(topo_name))
    pairs = [
        (algo, kind)
        for algo, kinds in SUPPORTED.items()
        for kind in sorted(kinds)
        if kind in COLLECTIVE_KINDS
    ]
    for trial in range(12):
        opts = {
            "chunks": int(rng.choice([1, 1, 2, 3])),
            "chunks_in_flight": int(rng.choice([1, 2])),
            "endpoint_delay_ns": str(rng.choice(["0ns", "10ns"])),
            "reduction_bandwidth": rng.choice([None, "4GBps"]),
        }
        script = []
        now = 0
        for _ in range(int(rng.integers(3, 12))):
            now += int(rng.choice([0, 0, 1, 700, 20_000, 3_000_000]))
            if rng.random() < 0.35:
                src, dst = (int(x) for x in rng.choice(n, size=2, replace=False))
                script.append((now, (src, dst, int(rng.choice([0, 1, 4096, 1 << 20, 50_000_000])))))
                continue
            algo, kind = pairs[int(rng.integers(len(pairs)))]
            p = int(rng.integers(2, n + 1))
            ranks = tuple(int(r) for r in rng.choice(n, size=p, replace=False))
            size = 0 if kind == "barrier" else int(rng.choice([0, 1, 1000, 1 << 16, 1 << 22, 30_000_001]))
            root = ranks[int(rng.integers(p))] if rng.random() < 0.5 else None
            script.append((now, CollectiveSpec(kind, size, ranks, algo, root)))
        try:
            want = _drive(ReferenceFlowModel(topo, **opts), script)
        except Exception as exc:  # an algorithm refusing a group (e.g. hierarchical on one host)
            with pytest.raises(type(exc)):
                _drive(FlowModel(topo, **opts), script)
            continue
        assert _drive(FlowModel(topo, **opts), script) == want, (topo_name, trial, opts, script)
