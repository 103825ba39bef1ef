"""Network models for xsim: cluster topologies, collectives as transfers, analytical and flow-level models.

Depends only on numpy, pyyaml and the standard library (topologies use netmodels.digraph, not networkx). See
docs/netmodels.md. The names below are imported on first use (PEP 562), so `netmodels.errors` or the model
registry (`netmodels.models`) loads no numpy: the command line starts fast.
"""

import importlib

_FROM = {
    "analytical": "AnalyticalModel",
    "api": "COLLECTIVE_KINDS CollectiveSpec Completion NetworkModel simulate_collective simulate_p2p",
    "astra": "AstraModel astra_model load_network_yml load_system_json",
    "cluster": "build_cluster topology_from_spec",
    "errors": "AlgorithmError AstraConfigError NetworkModelError RankError TopologyError UnitError",
    "flow": "FlowModel HybridFlowModel max_min_rates",
    "models": "Capabilities build_astra_model build_model capabilities_of model_names",
    "topology": "Topology",
}
_WHERE = {name: module for module, names in _FROM.items() for name in names.split()}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'netmodels' has no attribute {name!r}")
    globals()[name] = value = getattr(importlib.import_module(f"netmodels.{_WHERE[name]}"), name)
    return value
