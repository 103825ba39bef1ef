"""The flow model's flows in flight by slot (netmodels/flow_slots.py, issue 24 round 4): the finish tests run
only on candidates, components are solved once per sequence of routes, and every answer stays the
reference model's (tests/flow_reference.py), also late in a long run where float spacing exceeds the
done threshold."""

from __future__ import annotations

import numpy as np
from xsim.netmodels import CollectiveSpec, FlowModel, topology_from_spec
from xsim.netmodels import flow as flow_module
from xsim.netmodels import flow_slots as slots_module
from xsim.netmodels.topology import switch_topology

from tests.flow_reference import ReferenceFlowModel
from tests.test_net_flow_exact import _drive


def test_no_flow_outside_the_candidates_is_done_or_due():
    # The full tests (before progress: fl_t + q <= t; after: rem - rate dt <= rate * _DONE_NS) against the
    # candidate filter q <= _candidate_limit(fl_t, t), on flows placed within a few ns of finishing at
    # dt, at times from 0 to 10^13 ns (where one ulp of t is ~0.002 ns, far above _DONE_NS): every flow
    # either test marks is a candidate.
    rng = np.random.default_rng(24)
    for _ in range(400):
        t = float(rng.choice([1e3, 1e7, 9.7e9, 1.7e10, 1e13])) * rng.uniform(1, 2)
        fl_t = t - float(rng.choice([0.0, 1e-3, 1.0, 37.0, 1e6])) * rng.uniform(0, 1)
        dt = t - fl_t
        rate = rng.choice([1.25, 450.0, 3.3e-3, 1e3]) * rng.uniform(0.5, 2, 512)
        ahead = rng.choice([-1e-6, 0.0, 1e-9, 1e-7, 1e-6, 1e-5, 1e-3, 2e-3, 1e-2]) * rng.uniform(0, 2, 512)
        rem = rate * (dt + ahead + 1e-12 * t * rng.uniform(-3, 3, 512))
        q = rem / rate
        due = fl_t + q <= t
        done = due | (rem - rate * dt <= rate * flow_module._DONE_NS)
        cand = q <= flow_module._candidate_limit(fl_t, t)
        assert not (done & ~cand).any()
        # And the filter is tight: at most _CAND_NS + 3e-12 t past the step (flows further ahead are left out).
        lim = flow_module._candidate_limit(fl_t, t)
        assert dt <= lim <= dt + flow_module._CAND_NS + 3e-12 * t + 3e-12 * dt


def _two_ring_script(repeats: int) -> list:
    # Two 4-rank rings over one switch's NICs that overlap on ranks 2 and 3, started together, `repeats`
    # times, each long after the last ended: the same components with the same routes every time.
    script = []
    for k in range(repeats):
        now = k * 50_000_000
        script.append((now, CollectiveSpec("all_reduce", 1 << 22, (0, 1, 2, 3), "ring")))
        script.append((now, CollectiveSpec("all_reduce", 1 << 22, (2, 3, 4, 5), "ring")))
    return script


def test_components_with_the_same_routes_are_solved_once(monkeypatch):
    topo = switch_topology(6, 50e9, 500)
    calls = []
    real = slots_module.max_min_rates

    def counting(ptr, links, cap):
        calls.append(len(ptr) - 1)
        return real(ptr, links, cap)

    monkeypatch.setattr(slots_module, "max_min_rates", counting)
    once = _drive(FlowModel(topo), _two_ring_script(1))
    first = len(calls)
    assert first > 0  # the rings share NICs: progressive filling runs
    calls.clear()
    model = FlowModel(topo)
    assert _drive(model, _two_ring_script(3))[: len(once)] == once
    # Three repeats of the same traffic: progressive filling runs only for the first one's components.
    assert len(calls) == first and len(model._fs.memo) == first
    assert _drive(FlowModel(topo), _two_ring_script(3)) == _drive(
        ReferenceFlowModel(topo), _two_ring_script(3)
    )


def test_late_in_a_long_run_answers_stay_the_reference_models():
    # Rings and P2Ps starting around 1.7e10 ns (one ulp of t there is ~3.8e-6 ns, above _DONE_NS): the
    # candidate tests must finish the same flows at the same steps as the full tests of the reference.
    topo = topology_from_spec("nodes:3*H100x4:preset=table6")
    rng = np.random.default_rng(7)
    script = []
    now = 17_000_000_000
    for _ in range(30):
        now += int(rng.choice([0, 1, 333, 40_000]))
        if rng.random() < 0.3:
            src, dst = (int(x) for x in rng.choice(12, size=2, replace=False))
            script.append((now, (src, dst, int(rng.choice([1, 4096, 3_000_001])))))
        else:
            ranks = tuple(int(x) for x in rng.choice(12, size=int(rng.integers(2, 7)), replace=False))
            script.append(
                (now, CollectiveSpec("all_reduce", int(rng.choice([4096, 1 << 20, 7_000_003])), ranks))
            )
    assert _drive(FlowModel(topo), script) == _drive(ReferenceFlowModel(topo), script)
