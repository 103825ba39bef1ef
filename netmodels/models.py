"""The model registry: build a network model by name."""

from __future__ import annotations

from typing import Any

from netmodels.analytical import AnalyticalModel
from netmodels.api import NetworkModel
from netmodels.errors import NetworkModelError
from netmodels.flow import FlowModel
from netmodels.topology import Topology

MODELS: dict[str, type] = {"analytical": AnalyticalModel, "flow": FlowModel}


def build_model(name: str, topology: Topology, **options: Any) -> NetworkModel:
    """Build the model `name` ("analytical" or "flow") on topology; options go to its constructor."""
    cls = MODELS.get(name)
    if cls is None:
        raise NetworkModelError(
            f"unknown network model {name!r} (known: {', '.join(MODELS)}; ASTRA-sim: astra_model())"
        )
    if not isinstance(topology, Topology):
        raise NetworkModelError(f"model {name} needs a Topology, got {type(topology).__name__}")
    try:
        return cls(topology, **options)
    except TypeError as exc:
        raise NetworkModelError(f"bad option for model {name}: {exc}") from None
