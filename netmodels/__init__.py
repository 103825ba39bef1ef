"""Network models for xsim: cluster topologies, collectives as transfers, analytical and flow-level models.

Depends only on numpy, pyyaml and the standard library (topologies use netmodels.digraph, not networkx). See
docs/netmodels.md. The names below are imported on first use (traces/lazy.py, PEP 562), so `netmodels.errors` or the model
registry (`netmodels.models`) loads no numpy: the command line starts fast.
"""

from xsim.traces.lazy import lazy_exports

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
__getattr__, __dir__, __all__ = lazy_exports(
    __name__, {f"{__name__}.{module}": names.split() for module, names in _FROM.items()}
)
