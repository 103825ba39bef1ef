"""Build the network model a replay runs on: from options, ASTRA-sim files or a deployment's cluster."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from xsim.api.options import NetworkOptions
from xsim.netmodels.errors import NetworkModelError
from xsim.netmodels.models import ASTRA_FAMILY, build_astra_model, build_model, model_info, model_names
from xsim.replay.errors import ReplayError
from xsim.traces.io import DEPLOYMENT_FILE

if TYPE_CHECKING:
    from xsim.tracegen.contention import CommTimer


def resolve_model(options: NetworkOptions) -> str:
    """The registry name the options select, or one error line for contradictory options."""
    astra = bool(options.astra_network)
    if options.astra_system and not astra:
        raise ReplayError("--astra-system needs --astra-network")
    if astra and options.topology:
        raise ReplayError("--topology and --astra-network both give the network: pass one of them")
    if options.model in (None, ASTRA_FAMILY):
        if options.model == ASTRA_FAMILY and not astra:
            raise ReplayError(f"--model {ASTRA_FAMILY} needs --astra-network NETWORK.yml")
        if astra:
            return "astra-aware" if options.congestion_aware else "astra-unaware"
        if options.congestion_aware:
            raise ReplayError("--congestion-aware is an ASTRA-sim mode option: it needs --astra-network")
        return "analytical"
    info = model_info(options.model)
    if info.built_from == "astra":
        if not astra:
            raise ReplayError(f"--model {info.name} needs --astra-network NETWORK.yml")
        if options.congestion_aware and info.name != "astra-aware":
            raise ReplayError(f"--model {info.name} contradicts --congestion-aware (that is astra-aware)")
        return info.name
    if astra:
        raise ReplayError(
            f"--model {info.name} contradicts --astra-network (ASTRA-sim mode): drop --model, or pick one "
            f"of {', '.join(model_names('astra'))}"
        )
    if options.congestion_aware:
        raise ReplayError(f"--congestion-aware is an ASTRA-sim mode option, not one of --model {info.name}")
    return info.name


def build_network(
    options: NetworkOptions,
    deployment=None,
    *,
    where: str = DEPLOYMENT_FILE,
    ranks: int | None = None,
    gpu_types: dict | None = None,
):
    """The network model the options (or the deployment's cluster) describe; None in measured mode.

    `deployment` is the tracegen Deployment found beside the traces (or None); `where` names its file in
    errors; `gpu_types`: hypothetical GPUs a `--topology nodes:` spec may name.
    """
    name = resolve_model(options)
    if model_info(name).built_from == "astra":
        return build_astra_model(name, options.astra_network, options.astra_system)
    extra = {"chunks": options.chunks, "chunks_in_flight": options.chunks_in_flight}
    if (options.chunks, options.chunks_in_flight) == (1, 1):
        extra = {}
    if options.ns3 is not None:
        if name == "ns3":
            extra.update(options.ns3.kwargs())
        elif not options.ns3.is_default():
            raise ReplayError(f"the --ns3-* options are options of --model ns3, not of --model {name}")
    if options.topology:
        from xsim.netmodels.cluster import topology_from_spec

        return build_model(
            name, topology_from_spec(options.topology, need=ranks, gpu_types=gpu_types), **extra
        )
    if deployment is not None and deployment.cluster_json:
        from xsim.netmodels.cluster import build_cluster

        try:
            return build_model(name, build_cluster(json.loads(deployment.cluster_json), need=ranks), **extra)
        except NetworkModelError as exc:
            raise ReplayError(f"{where}: cluster: {exc} (or pass --topology SPEC)") from None
    if options.comm == "measured":
        return None
    raise ReplayError(
        "no network: pass --topology SPEC (e.g. switch:8:50GBps:500ns), --astra-network NET.yml, "
        f"--comm measured, or replay a folder holding {DEPLOYMENT_FILE}"
    )


def collective_seconds(network) -> CommTimer:
    """A topology model's time of one collective alone (its `fixed_collective_ns`), in seconds: the window a
    collective holds its SMs in the generator's contention model (tracegen.contention.CommTimer)."""
    from xsim.netmodels.api import CollectiveSpec

    def seconds(kind: str, size: int, ranks: tuple[int, ...]) -> float:
        return network.fixed_collective_ns(CollectiveSpec(kind, size, ranks)) / 1e9

    return seconds


def deployment_collective_seconds(deployment) -> CommTimer | None:
    """`collective_seconds` of the replay's default model (analytical) on a deployment's cluster, as
    `build_network` builds it for a set replayed without --topology; None where no cluster can be built."""
    from xsim.netmodels.cluster import build_cluster
    from xsim.tracegen.spec import num_ranks

    if not deployment.cluster_json:
        return None
    try:
        topo = build_cluster(json.loads(deployment.cluster_json), need=num_ranks(deployment))
    except NetworkModelError:
        return None
    return collective_seconds(build_model("analytical", topo))
