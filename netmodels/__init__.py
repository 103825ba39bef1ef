"""Network models for xsim: cluster topologies, collectives as transfers, analytical and flow-level models.

Depends only on numpy, networkx, pyyaml and the standard library. See docs/netmodels.md.
"""

from netmodels.analytical import AnalyticalModel
from netmodels.api import (
    COLLECTIVE_KINDS,
    CollectiveSpec,
    Completion,
    NetworkModel,
    simulate_collective,
    simulate_p2p,
)
from netmodels.astra import AstraModel, astra_model, load_network_yml, load_system_json
from netmodels.cluster import build_cluster, topology_from_spec
from netmodels.errors import (
    AlgorithmError,
    AstraConfigError,
    NetworkModelError,
    RankError,
    TopologyError,
    UnitError,
)
from netmodels.flow import FlowModel, max_min_rates
from netmodels.models import build_model
from netmodels.topology import Topology

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
