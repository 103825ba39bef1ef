"""Engine options: per-rank resources and how communication is timed."""

from __future__ import annotations

from dataclasses import dataclass, replace

from xsim.replay.errors import ReplayError

COMM_MODES = ("network", "measured")
COMM_STREAMS = ("auto", "group", "shared")
CTRL_DEPS = ("auto", "union")
DURATIONS = ("auto", "exact", "micros")


@dataclass(frozen=True)
class ReplayConfig:
    """Per-rank resources (ASTRA-sim's by default) and the communication timing mode.

    - compute_streams / comm_channels / cpu_slots: ops of that class in flight at once per rank
      (ASTRA-sim: 1 / 1 / 1). RECV, METADATA and INVALID nodes take no slot.
    - honour_stream: a node carrying the `stream` attribute runs on its own in-order queue per stream
      value (one op at a time per stream), instead of the rank's shared compute / comm slots.
    - comm_mode "network": collectives and P2P are timed by the network model; "measured": by their
      recorded duration_micros (a collective still starts when every member has issued it, and lasts the
      shortest member's duration, since the last member to arrive waited least inside its kernel).
    - ctrl_deps "union": a node waits for its data_deps and ctrl_deps (ASTRA-sim's FeederV3); "auto" (the
      default) does the same, except on a rank whose ctrl deps close a cycle that its data deps alone do
      not: there it follows data deps only, as the legacy Chakra ETFeeder always does.
    - duration_comm_types: CollectiveCommType values replayed by each node's own duration with no
      cross-rank matching (ASTRA-sim does this for BROADCAST).
    - comm_streams "group": communication runs on streams, as NCCL runs each communicator on its own
      CUDA stream: per rank, one in-order stream per process group for its collectives and one for the
      pipeline P2P sends, so they overlap each other and compute where the graph allows (comm_channels
      then sizes only the shared slot that MEM nodes use). "shared": ASTRA-sim's rule, every GPU
      communication op of a rank takes one of its comm_channels slots. "auto" (default): "shared" on an
      ASTRA-sim network model (the compatible mode), else "group".
    - durations: the recorded time of a replayed node. "exact": xsim's exact `duration_ns` attribute (the
      generator's and importer's integer ns) where present, else duration_micros x 1000; "micros":
      duration_micros x 1000 alone, as ASTRA-sim reads it; "auto" (default): "micros" on a network model
      that declares `micros_durations` (the ASTRA-sim-compatible mode), else "exact".
    """

    compute_streams: int = 1
    comm_channels: int = 1
    cpu_slots: int = 1
    honour_stream: bool = False
    comm_mode: str = "network"
    duration_comm_types: frozenset[int] = frozenset()
    ctrl_deps: str = "auto"
    comm_streams: str = "auto"
    durations: str = "auto"

    def __post_init__(self) -> None:
        for field in ("compute_streams", "comm_channels", "cpu_slots"):
            v = getattr(self, field)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ReplayError(f"replay config: {field} must be an integer >= 1, got {v!r}")
        if self.comm_mode not in COMM_MODES:
            raise ReplayError(f"replay config: comm_mode must be one of {', '.join(COMM_MODES)}")
        if self.comm_streams not in COMM_STREAMS:
            raise ReplayError(f"replay config: comm_streams must be one of {', '.join(COMM_STREAMS)}")
        if self.durations not in DURATIONS:
            raise ReplayError(f"replay config: durations must be one of {', '.join(DURATIONS)}")
        if self.ctrl_deps not in CTRL_DEPS:
            raise ReplayError(f"replay config: ctrl_deps must be one of {', '.join(CTRL_DEPS)}")


def resolve_streams(config: ReplayConfig, network_name: str | None) -> ReplayConfig:
    """The config with comm_streams "auto" made concrete for this network model."""
    if config.comm_streams != "auto":
        return config
    from xsim.netmodels.models import capabilities_named

    shared = capabilities_named(network_name).shared_comm_stream
    return replace(config, comm_streams="shared" if shared else "group")


def resolve_durations(config: ReplayConfig, network) -> ReplayConfig:
    """The config with durations "auto" made concrete: what the network model declares it needs."""
    if config.durations != "auto":
        return config
    from xsim.netmodels.models import capabilities_of

    micros = network is not None and capabilities_of(network).micros_durations
    return replace(config, durations="micros" if micros else "exact")
