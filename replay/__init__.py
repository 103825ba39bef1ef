"""The replay engine: dependency-driven discrete-event replay of Chakra trace sets (contract F)."""

from xsim.replay.compute import (
    ComputeModel,
    DeviceProfile,
    DurationModel,
    RooflineModel,
    SpeedScaled,
    load_device_profile,
    parse_speed,
)
from xsim.replay.config import ReplayConfig
from xsim.replay.errors import (
    DeviceProfileError,
    FoldRefused,
    ReplayDeadlock,
    ReplayError,
    StuckNode,
    TraceGraphError,
)
from xsim.replay.result import ReplayResult
from xsim.replay.simulation import simulate

__all__ = [
    "ComputeModel",
    "DeviceProfile",
    "DeviceProfileError",
    "DurationModel",
    "FoldRefused",
    "ReplayConfig",
    "ReplayDeadlock",
    "ReplayError",
    "ReplayResult",
    "RooflineModel",
    "SpeedScaled",
    "StuckNode",
    "TraceGraphError",
    "load_device_profile",
    "parse_speed",
    "simulate",
]
