"""Network models for xsim: cluster topologies, collectives as transfers, analytical and flow-level models.

Depends only on numpy, networkx, pyyaml and the standard library. See docs/netmodels.md.
The names below are imported on first use (PEP 562), so `import netmodels.errors` or the model registry
(`netmodels.models`) costs no numpy/networkx import: the command line starts fast.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "AnalyticalModel": "netmodels.analytical",
    "COLLECTIVE_KINDS": "netmodels.api",
    "CollectiveSpec": "netmodels.api",
    "Completion": "netmodels.api",
    "NetworkModel": "netmodels.api",
    "simulate_collective": "netmodels.api",
    "simulate_p2p": "netmodels.api",
    "AstraModel": "netmodels.astra",
    "astra_model": "netmodels.astra",
    "load_network_yml": "netmodels.astra",
    "load_system_json": "netmodels.astra",
    "build_cluster": "netmodels.cluster",
    "topology_from_spec": "netmodels.cluster",
    "AlgorithmError": "netmodels.errors",
    "AstraConfigError": "netmodels.errors",
    "NetworkModelError": "netmodels.errors",
    "RankError": "netmodels.errors",
    "TopologyError": "netmodels.errors",
    "UnitError": "netmodels.errors",
    "FlowModel": "netmodels.flow",
    "max_min_rates": "netmodels.flow",
    "Capabilities": "netmodels.models",
    "build_astra_model": "netmodels.models",
    "build_model": "netmodels.models",
    "capabilities_of": "netmodels.models",
    "model_names": "netmodels.models",
    "Topology": "netmodels.topology",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'netmodels' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
