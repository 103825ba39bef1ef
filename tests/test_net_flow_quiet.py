"""The flow model's quiet lookahead (issue 24): running the steps that complete nothing inside the model
gives the completions of an engine that advances it to every step, with one engine step per completion."""

from __future__ import annotations

import numpy as np
import pytest
from xsim.netmodels import CollectiveSpec, FlowModel, topology_from_spec
from xsim.netmodels.algorithms import SUPPORTED
from xsim.netmodels.api import COLLECTIVE_KINDS, QuietLookahead
from xsim.netmodels.flow import HybridFlowModel
from xsim.netmodels.topology import ring_topology, switch_topology


def _drive(model, script, quiet):
    """Start the script's transfers in time order as the engine does (the next start is the horizon, the
    replay's next node finish); the start handles, every completion in order, and the advance calls."""
    starts, done, advances = [], [], 0
    for now, what in [*script, (None, None)]:
        while True:
            n = model.next_event_quiet(now) if quiet else model.next_event_ns()
            if n is None or (now is not None and n > now):
                break
            done += [(c.handle, c.finish_ns, c.per_rank_finish_ns) for c in model.advance(n)]
            advances += 1
        if what is None:
            break
        if isinstance(what, CollectiveSpec):
            starts.append(model.start_collective(now, what))
        else:
            starts.append(model.start_p2p(now, *what))
    return starts, done, advances


def test_a_lone_ring_allreduce_takes_one_engine_step_instead_of_twelve():
    # 4 ranks on a bidirectional ring of 1 GB/s (1 B/ns) links of 100 ns: the ring AllReduce is 3
    # reduce-scatter + 3 all-gather stages, each 4 flows of 4096 / 4 = 1024 B alone on their links. A stage
    # is two model steps, its flows' last byte (t + 1024 ns) and their landing (+ 100 ns): 12 steps of
    # 1124 ns, the collective done at 6 * 1124 = 6744 ns. Advanced to each, the engine takes 12 steps;
    # with the quiet lookahead, one (the completion).
    topo = ring_topology(4, 1e9, 100)
    script = [(0, CollectiveSpec("all_reduce", 4096, (0, 1, 2, 3), "ring"))]
    plain = _drive(FlowModel(topo), script, quiet=False)
    quiet = _drive(FlowModel(topo), script, quiet=True)
    assert plain[1] == [(0, 6744, (6744,) * 4)]
    assert quiet[1] == plain[1]
    assert (plain[2], quiet[2]) == (12, 1)


def test_steps_at_the_horizon_stay_for_the_engine():
    # The same AllReduce with a node finishing at 1124 ns (its first landing, rounded up): nothing before
    # it may run past it, and a start there sees the model exactly as the plain drive does.
    topo = ring_topology(4, 1e9, 100)
    script = [
        (0, CollectiveSpec("all_reduce", 4096, (0, 1, 2, 3), "ring")),
        (1124, (0, 2, 2048)),
    ]
    plain = _drive(FlowModel(topo), script, quiet=False)
    quiet = _drive(FlowModel(topo), script, quiet=True)
    assert quiet[:2] == plain[:2]
    assert quiet[2] < plain[2]


TOPOLOGIES = {
    "ring4": lambda: ring_topology(4, 1e9, 100),
    "switch8": lambda: switch_topology(8, 50e9, 500),
    "mixed12": lambda: topology_from_spec(
        "nodes:2*H100x4,A100x2+H100x2:preset=table6:fabric=leaf_spine:nics_per_leaf=4:spines=2"
    ),
}


@pytest.mark.parametrize("cls", [FlowModel, HybridFlowModel])
@pytest.mark.parametrize("topo_name", sorted(TOPOLOGIES))
def test_random_workloads_complete_alike_with_and_without_the_lookahead(topo_name, cls):
    topo = TOPOLOGIES[topo_name]()
    assert isinstance(cls(topo), QuietLookahead)
    n = topo.num_ranks
    rng = np.random.default_rng(24 + sorted(TOPOLOGIES).index(topo_name))
    pairs = [(a, k) for a, kinds in SUPPORTED.items() for k in sorted(kinds) if k in COLLECTIVE_KINDS]
    fewer = 0
    for trial in range(10):
        opts = {
            "chunks": int(rng.choice([1, 1, 2])),
            "chunks_in_flight": int(rng.choice([1, 2])),
            "reduction_bandwidth": rng.choice([None, "4GBps"]),
        }
        script, now = [], 0
        for _ in range(int(rng.integers(3, 10))):
            now += int(rng.choice([0, 1, 700, 20_000, 3_000_000]))
            if rng.random() < 0.35:
                src, dst = (int(x) for x in rng.choice(n, size=2, replace=False))
                script.append((now, (src, dst, int(rng.choice([0, 4096, 1 << 20, 50_000_000])))))
                continue
            algo, kind = pairs[int(rng.integers(len(pairs)))]
            p = int(rng.integers(2, n + 1))
            ranks = tuple(int(r) for r in rng.choice(n, size=p, replace=False))
            size = 0 if kind == "barrier" else int(rng.choice([0, 1000, 1 << 16, 1 << 22, 30_000_001]))
            script.append((now, CollectiveSpec(kind, size, ranks, algo)))
        try:
            plain = _drive(cls(topo, **opts), script, quiet=False)
        except Exception as exc:  # an algorithm refusing a group (e.g. hierarchical on one host)
            with pytest.raises(type(exc)):
                _drive(cls(topo, **opts), script, quiet=True)
            continue
        quiet = _drive(cls(topo, **opts), script, quiet=True)
        assert quiet[:2] == plain[:2], (topo_name, trial, opts, script)
        assert quiet[2] <= plain[2]
        fewer += quiet[2] < plain[2]
    assert fewer > 0


def test_is_int_keeps_its_meaning_with_the_plain_int_shortcut():
    # The flow model checks every start time with is_int: Python and numpy integers pass, bools
    # (Python's and numpy's), floats and strings do not, whatever the shortcut for a plain int.
    from xsim.netmodels.api import is_int

    assert [is_int(x) for x in (3, -1, np.int64(3), np.uint8(1), 2**70)] == [True] * 5
    assert [is_int(x) for x in (True, False, np.bool_(True), 3.0, "3", None)] == [False] * 6
    with pytest.raises(Exception, match="non-decreasing integers"):
        FlowModel(ring_topology(4, 1e9, 100)).start_p2p(True, 0, 1, 8)
