"""The network-model registry: every model by name, what it is built from and what it can do.

This module imports no model (and so neither numpy nor networkx): the command line reads the names and
capabilities from here to build its `--model` choices, and a model class is imported only when built.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from xsim.netmodels.errors import NetworkModelError


@dataclass(frozen=True)
class Capabilities:
    """What a network model guarantees, queried instead of its type (e.g. by replay's folding)."""

    contention_free: bool  # a transfer's time depends on itself alone, never on concurrent traffic
    foldable: bool  # identical replicas may be simulated once (needs contention_free)
    multi_dim: bool  # runs collectives on multi-dimensional (hierarchical) networks
    # The replay times nodes by their recorded `duration_micros` x 1000 alone, ignoring xsim's exact
    # `duration_ns` attribute, as ASTRA-sim's workload layer does (its models must agree with it node by node).
    micros_durations: bool = False
    # One communication slot per rank (comm_streams "auto" becomes "shared"): ASTRA-sim's workload layer
    # issues a rank's collectives one after another.
    shared_comm_stream: bool = False
    # BROADCAST nodes replayed by their recorded duration, not simulated (ASTRA-sim's workload layer,
    # reference 3.2 in docs/netmodels.md).
    broadcast_by_duration: bool = False


@dataclass(frozen=True)
class ModelInfo:
    """One registered network model."""

    name: str  # the model's `name` attribute and its `--model` choice
    built_from: str  # "topology" (a Topology) or "astra" (ASTRA-sim network.yml + system.json)
    capabilities: Capabilities
    factory: str  # "module:callable", imported only when the model is built
    summary: str


# The replay rules of ASTRA-sim's workload layer, shared by both of its modes.
_ASTRA_RULES = {"micros_durations": True, "shared_comm_stream": True, "broadcast_by_duration": True}

REGISTRY: dict[str, ModelInfo] = {
    m.name: m
    for m in (
        ModelInfo(
            "analytical",
            "topology",
            Capabilities(contention_free=True, foldable=True, multi_dim=True),
            "xsim.netmodels.analytical:AnalyticalModel",
            "latency + size/bottleneck bandwidth along the route, no contention (the default)",
        ),
        ModelInfo(
            "flow",
            "topology",
            Capabilities(contention_free=False, foldable=False, multi_dim=True),
            "xsim.netmodels.flow:FlowModel",
            "flow-level, max-min fair sharing of every link by concurrent flows",
        ),
        ModelInfo(
            "flow-hybrid",
            "topology",
            Capabilities(contention_free=False, foldable=False, multi_dim=True),
            "xsim.netmodels.flow:HybridFlowModel",
            "flow between hosts; collectives inside one host in closed form, without contention (faster)",
        ),
        ModelInfo(
            "ns3",
            "topology",
            # Packets share every queue: contention-aware, never folded; needs the optional extra `ns3`.
            Capabilities(contention_free=False, foldable=False, multi_dim=True),
            "xsim.netmodels.ns3:Ns3Model",
            "packet-level, the real ns-3 simulator (TCP flows, queues, ECMP); pip install 'xsim-replay[ns3]'",
        ),
        ModelInfo(
            "astra-unaware",
            "astra",
            Capabilities(contention_free=True, foldable=True, multi_dim=True, **_ASTRA_RULES),
            "xsim.netmodels.astra:astra_model",
            "ASTRA-sim's congestion-unaware analytical backend, from network.yml (+ system.json)",
        ),
        ModelInfo(
            "astra-aware",
            "astra",
            # ASTRA-sim's congestion-aware analytical backend runs 1-D networks only.
            Capabilities(contention_free=False, foldable=False, multi_dim=False, **_ASTRA_RULES),
            "xsim.netmodels.astra:astra_model",
            "ASTRA-sim's congestion-aware analytical backend (1-D networks)",
        ),
    )
}

# What a model reports when the registry does not know it: nothing is assumed.
UNKNOWN = Capabilities(contention_free=False, foldable=False, multi_dim=False)


# A command-line shorthand: "astra" is the ASTRA-sim model, congestion-aware when asked for.
ASTRA_FAMILY = "astra"


def model_names(built_from: str | None = None) -> tuple[str, ...]:
    """Registered model names, optionally only those built from "topology" or "astra"."""
    return tuple(n for n, m in REGISTRY.items() if built_from in (None, m.built_from))


def model_choices() -> tuple[str, ...]:
    """What `--model` accepts: every registered name and the "astra" shorthand."""
    return (*model_names(), ASTRA_FAMILY)


def model_info(name: str) -> ModelInfo:
    """The registry entry of `name`, or one error line listing the known names."""
    info = REGISTRY.get(name)
    if info is None:
        raise NetworkModelError(f"unknown network model {name!r} (known: {', '.join(REGISTRY)})")
    return info


def capabilities_named(name: str | None) -> Capabilities:
    """The registry's capabilities of a model name; none assumed for a name it does not know."""
    info = REGISTRY.get(name) if name is not None else None
    return info.capabilities if info is not None else UNKNOWN


def capabilities_of(model: Any) -> Capabilities:
    """A model's capabilities: its own `capabilities` attribute, else its registry entry, else none."""
    own = getattr(model, "capabilities", None)
    if isinstance(own, Capabilities):
        return own
    info = REGISTRY.get(getattr(model, "name", ""))
    return info.capabilities if info is not None else UNKNOWN


def _factory(info: ModelInfo):
    module, _, attr = info.factory.partition(":")
    return getattr(importlib.import_module(module), attr)


def build_model(name: str, topology: Any, **options: Any):
    """Build the topology-based model `name` ("analytical" or "flow"); options go to its constructor."""
    info = REGISTRY.get(name)
    if info is None or info.built_from != "topology":
        raise NetworkModelError(
            f"unknown network model {name!r} (known: {', '.join(model_names('topology'))}; "
            "ASTRA-sim: build_astra_model())"
        )
    from xsim.netmodels.topology import Topology

    if not isinstance(topology, Topology):
        raise NetworkModelError(f"model {name} needs a Topology, got {type(topology).__name__}")
    try:
        return _factory(info)(topology, **options)
    except TypeError as exc:
        raise NetworkModelError(f"bad option for model {name}: {exc}") from None


def build_astra_model(name: str, network_yml: str, system_json: str | None = None):
    """Build "astra-unaware" or "astra-aware" from ASTRA-sim's network YAML and (optional) system JSON."""
    info = model_info(name)
    if info.built_from != "astra":
        raise NetworkModelError(f"model {name} is not an ASTRA-sim model ({', '.join(model_names('astra'))})")
    return _factory(info)(network_yml, system_json, name == "astra-aware")
