"""The options of a replay as frozen dataclasses: what the command line parses, scripts and tests build."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xsim.netmodels.ns3_options import Ns3Options


@dataclass(frozen=True)
class NetworkOptions:
    """Which network model to build and from what (docs/api.md).

    `model` None picks "analytical", or the ASTRA-sim model when `astra_network` is given ("astra-aware"
    with `congestion_aware`). Contradictions (a topology model with ASTRA-sim files, --congestion-aware
    outside ASTRA-sim mode) are one error line.
    """

    model: str | None = None
    topology: str | None = None  # topology spec, e.g. "switch:8:50GBps:500ns"
    astra_network: str | None = None  # ASTRA-sim network.yml
    astra_system: str | None = None  # ASTRA-sim system.json
    congestion_aware: bool = False
    chunks: int = 1
    chunks_in_flight: int = 1
    comm: str = "network"  # "network", or "measured": communication replays its recorded duration
    # How --model ns3 runs its packets (netmodels.ns3_options.Ns3Options); None: its defaults.
    ns3: Ns3Options | None = None


@dataclass(frozen=True)
class ComputeOptions:
    """Which compute model to build (besides the deployment's GPUs, when the traces come with one)."""

    astra_system: str | None = None  # ASTRA-sim system.json: its roofline, when roofline-enabled
    device_profile: str | None = None  # roofline devices per rank (docs/replay.md)
    speed: tuple[str, ...] = ()  # "RANK=FACTOR" or "A-B=FACTOR"
    as_gpu: str | None = None  # what-if: replay measured compute as if on this GPU
    from_gpu: str | None = None  # what-if: the GPU the trace was measured on (None: the recorded one)
    gpu_file: str | None = (
        None  # hypothetical GPUs --as-gpu/--from-gpu may name (tracegen.spec.read_gpu_file)
    )


@dataclass(frozen=True)
class ReplayOptions:
    """Everything `simulate` needs besides the trace set."""

    network: NetworkOptions = field(default_factory=NetworkOptions)
    compute: ComputeOptions = field(default_factory=ComputeOptions)
    comm_groups: str | None = None  # process groups file (ASTRA-sim format)
    compute_streams: int = 1
    comm_channels: int = 1
    honour_stream: bool = False
    fold: bool = True  # fold symmetric replicas when proven, else replay unfolded (the result says which)
    progress: bool = False


@dataclass(frozen=True)
class OutputOptions:
    """Files a replay writes (each None = not written)."""

    out: str | None = None  # ops/ranks/collectives (.parquet, .csv), summary.json, source.json, cost.json
    timeline: str | None = None  # Chrome-trace JSON
    annotate: str | None = None  # the trace set with simulated times written back
    force: bool = False  # replace an output folder holding files xsim did not write, as a whole
    comm_groups: str | None = None  # the replay's process groups file: an input, never overwritten
