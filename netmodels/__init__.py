"""Network models for xsim: cluster topologies, collectives as transfers, analytical and flow-level models.

Depends only on numpy, networkx, pyyaml and the standard library. See docs/netmodels.md.
"""

import importlib

# Names resolve on first use (PEP 562), so `import netmodels.api` (the replay engine's only need) does not
# pull in networkx, yaml and every model: measured start-up of `xsim replay` on a small trace.
_WHERE = {
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
    "build_model": "netmodels.models",
    "Topology": "netmodels.topology",
}


def __getattr__(name: str):
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'netmodels' has no attribute {name!r}")
    return getattr(importlib.import_module(mod), name)


__all__ = [
    "COLLECTIVE_KINDS",
    "AlgorithmError",
    "AnalyticalModel",
    "AstraConfigError",
    "AstraModel",
    "CollectiveSpec",
    "Completion",
    "FlowModel",
    "NetworkModel",
    "NetworkModelError",
    "RankError",
    "Topology",
    "TopologyError",
    "UnitError",
    "astra_model",
    "build_cluster",
    "build_model",
    "load_network_yml",
    "load_system_json",
    "max_min_rates",
    "simulate_collective",
    "simulate_p2p",
    "topology_from_spec",
]
