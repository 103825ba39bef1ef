"""The replay engine: dependency-driven discrete-event replay of Chakra trace sets (contract F)."""

from replay.compute import (
    ComputeModel,
    DeviceProfile,
    DurationModel,
    RooflineModel,
    SpeedScaled,
    load_device_profile,
    parse_speed,
)
from replay.config import ReplayConfig
from replay.errors import (
    DeviceProfileError,
    FoldRefused,
    ReplayDeadlock,
    ReplayError,
    StuckNode,
    TraceGraphError,
)
from replay.result import ReplayResult
from replay.simulation import simulate

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
