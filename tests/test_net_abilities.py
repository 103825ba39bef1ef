"""Declared abilities (issue 25 item 4): the optional engine-facing methods are protocols in
netmodels/api.py that the engine finds with isinstance, and ASTRA-sim's replay rules are registry
capabilities, not read from a model's name.

- each model implements exactly the protocols its docs/netmodels.md row says (analytical: fixed durations;
  ASTRA-sim unaware: staggered starts; aware: members started and finished one by one);
- a model with half of an ability (fixed_collective_ns without fixed_p2p_ns) does not have it: the engine
  starts its transfers through handles (the model counts the starts);
- comm_streams "auto" follows the registry: shared for both ASTRA-sim modes, per group for every other
  name, including one that merely starts with "astra".
"""

from __future__ import annotations

from pathlib import Path

from xsim.netmodels import AnalyticalModel
from xsim.netmodels.api import FixedDurations, MemberFinishes, MemberStarts, StaggeredStarts
from xsim.netmodels.astra import astra_model
from xsim.netmodels.models import REGISTRY, capabilities_named
from xsim.netmodels.topology import ring_topology
from xsim.replay import simulate
from xsim.replay.config import ReplayConfig, resolve_streams

from tests.test_replay_fixed_durations import HandlesOnly
from tests.test_replay_support import coll, comp, write_set

RING4 = "topology: [ Ring ]\nnpus_count: [ 4 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n"


def _abilities(model) -> set[str]:
    protos = (FixedDurations, StaggeredStarts, MemberFinishes, MemberStarts)
    return {p.__name__ for p in protos if isinstance(model, p)}


def test_each_model_declares_its_abilities(tmp_path: Path) -> None:
    net = tmp_path / "net.yml"
    net.write_text(RING4)
    assert _abilities(AnalyticalModel(ring_topology(4, 1e9, 100))) == {"FixedDurations"}
    unaware, aware = astra_model(net), astra_model(net, congestion_aware=True)
    # Both ASTRA-sim modes have the member-start methods; only the aware one asks for them.
    assert _abilities(unaware) >= {"StaggeredStarts", "MemberStarts"} and not unaware.starts_members
    assert _abilities(aware) >= {"MemberStarts", "MemberFinishes"} and aware.starts_members
    assert "FixedDurations" not in _abilities(unaware) | _abilities(aware)


class HalfFixed(HandlesOnly):
    """fixed_collective_ns without fixed_p2p_ns: not the FixedDurations ability."""

    def fixed_collective_ns(self, spec) -> int:
        return self.m.fixed_collective_ns(spec)


def test_half_an_ability_is_none(tmp_path: Path) -> None:
    model = HalfFixed(AnalyticalModel(ring_topology(2, 1e9, 100)))
    assert not isinstance(model, FixedDurations)
    per_rank = {r: [comp(1, 10), coll(2, 1000, deps=[1])] for r in range(2)}
    simulate(write_set(tmp_path, per_rank), network=model)
    assert model.starts == 1  # through a handle: the engine did not take the half ability


def test_astra_rules_are_registry_capabilities() -> None:
    shared = {n for n in (*REGISTRY, "astra-custom", None) if capabilities_named(n).shared_comm_stream}
    assert shared == {"astra-unaware", "astra-aware"}
    for name in (*REGISTRY, "astra-custom", None):
        want = "shared" if name in shared else "group"
        assert resolve_streams(ReplayConfig(), name).comm_streams == want
        caps = capabilities_named(name)
        assert caps.broadcast_by_duration == caps.micros_durations == (name in shared)
