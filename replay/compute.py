"""Compute-time models: how long a COMP (or MEM) node takes on a rank, in integer nanoseconds.

Contract (F): a compute model is any object with `name` and `duration_ns(rank, node) -> int`. The program
builder asks it once per compute node before the event loop, never inside it. A model may also implement
`durations(rank, columns, rows)` (`VectorisedCompute`): the times of many rows of one rank at once, read
from the rank's columns (replay/rank_view.py) with numpy, with no protobuf message per node. The builder
calls `durations_of`, which loops the scalar `duration_ns` for a model without it. `REGISTRY` lists the
models xsim builds and their capabilities, as netmodels/models.py does for network models.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
from xsim.replay.errors import DeviceProfileError
from xsim.traces import pb
from xsim.traces.attrs import DURATION_NS, INT_KINDS, IS_CPU_OP, NUM_OPS, TENSOR_SIZE
from xsim.traces.io import JsonFileError, read_json

if TYPE_CHECKING:
    from xsim.replay.rank_view import RankView


@runtime_checkable
class ComputeModel(Protocol):
    """Duration of a node on a rank, in integer ns."""

    name: str

    def duration_ns(self, rank: int, node: pb.Node) -> int:
        """Time the node occupies its resource on `rank`, in ns."""
        ...


@runtime_checkable
class VectorisedCompute(Protocol):
    """The optional ability: durations of many rows of one rank at once, from its columns."""

    def durations(self, rank: int, columns: RankView, rows: np.ndarray) -> np.ndarray:
        """int64 ns of `rows` (ascending row indices of `columns`), each what duration_ns gives its node."""
        ...


@runtime_checkable
class RankTimed(Protocol):
    """The optional ability a folded replay needs: what, besides a node, a rank's durations depend on."""

    def timing_key(self, rank: int) -> tuple | None:
        """A value equal for two ranks exactly when the model times their equal nodes alike; None: unknown."""
        ...


def timing_key_of(model: ComputeModel | None, rank: int) -> tuple | None:
    """The model's timing key of `rank`: () without a model; None for a model that cannot say (no fold)."""
    if model is None:
        return ()
    return model.timing_key(rank) if isinstance(model, RankTimed) else None


def replay_duration_ns(node: pb.Node, exact: bool = True) -> int:
    """ASTRA-sim's replay rule: duration_micros x 1000 ns, a zero duration becoming 1 ns; with `exact`,
    xsim's exact `duration_ns` attribute (an integer kind, written by the generator) takes its place when
    present."""
    for a in node.attr if exact else ():
        if a.name == DURATION_NS:
            kind = a.WhichOneof("value")
            if kind in INT_KINDS and getattr(a, kind) >= 0:
                return getattr(a, kind) or 1
            break
    d = node.duration_micros
    return d * 1000 if d else 1


@dataclass(frozen=True)
class DurationModel:
    """Replay the recorded `duration_micros` (ASTRA-sim's default, `roofline-enabled` 0); `exact`: xsim's
    exact `duration_ns` attribute first (off in the ASTRA-sim-compatible mode, `with_exact`)."""

    name: str = "duration"
    exact: bool = True

    def timing_key(self, rank: int) -> tuple:
        """Every rank alike: durations are the recorded ones."""
        return ()

    def duration_ns(self, rank: int, node: pb.Node) -> int:
        """duration_micros x 1000, 0 -> 1 ns (or the exact duration_ns)."""
        return replay_duration_ns(node, self.exact)

    def durations(self, rank: int, columns: RankView, rows: np.ndarray) -> np.ndarray:
        """duration_ns of many rows: the recorded durations, read from the columns."""
        return columns.recorded_as(self.exact)[rows]


@dataclass(frozen=True)
class DeviceProfile:
    """What roofline needs to know about a device: peak FLOP/s and memory bandwidth in bytes/s."""

    peak_flops: float
    mem_bw: float
    label: str = ""

    def __post_init__(self) -> None:
        for field, v in (("peak_flops", self.peak_flops), ("mem_bw", self.mem_bw)):
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise DeviceProfileError(
                    f"device profile {self.label or '?'}: {field} must be > 0, got {v!r}"
                )


def _roofline_attrs(node: pb.Node) -> tuple[bool, int | None, int | None]:
    cpu, ops, size = False, None, None
    for a in node.attr:
        n = a.name
        if n == IS_CPU_OP:
            kind = a.WhichOneof("value")
            cpu = bool(getattr(a, kind)) if kind == "bool_val" or kind in INT_KINDS else False
        elif n == NUM_OPS or n == TENSOR_SIZE:
            kind = a.WhichOneof("value")
            if kind in INT_KINDS:
                v = int(getattr(a, kind))
            elif kind in ("double_val", "float_val"):
                v = int(getattr(a, kind))
            else:
                continue
            if n == NUM_OPS:
                ops = v
            else:
                size = v
    return cpu, ops, size


def roofline_ns(num_ops: int, tensor_size: int, profile: DeviceProfile) -> int:
    """ASTRA-sim's roofline: floor(1e9 x ops / min(peak, bw x ops/size)) ns; tensor_size 0 -> 0 (skipped).

    The formula equals max(ops/peak, size/bw); with 0 ops (ASTRA-sim would divide by zero) xsim takes that
    form's limit, the memory time size/bw.
    """
    if tensor_size <= 0:
        return 0
    if num_ops <= 0:
        return int(math.floor(1e9 * tensor_size / profile.mem_bw))
    perf = min(profile.peak_flops, profile.mem_bw * num_ops / tensor_size)
    return int(math.floor(1e9 * num_ops / perf))


@dataclass(frozen=True)
class RooflineModel:
    """Roofline time from `num_ops`/`tensor_size` with a per-rank device profile.

    As ASTRA-sim: CPU ops (`is_cpu_op`) replay their duration; a GPU node with `tensor_size` 0 is skipped
    (0 ns). xsim's own choice where ASTRA-sim would throw: a node lacking `num_ops` or `tensor_size`, or on a
    rank without a profile, replays its `duration_micros`. `exact` as in DurationModel, for replayed nodes.
    """

    profiles: Mapping[int, DeviceProfile]
    default: DeviceProfile | None = None
    name: str = "roofline"
    exact: bool = True

    def profile(self, rank: int) -> DeviceProfile | None:
        """The device profile of `rank` (its own, else the default)."""
        return self.profiles.get(rank, self.default)

    def timing_key(self, rank: int) -> tuple:
        """Ranks on the same device profile are timed alike."""
        return (self.profile(rank),)

    def duration_ns(self, rank: int, node: pb.Node) -> int:
        """Roofline time of a GPU compute node, else its replayed duration."""
        if node.type != pb.COMP_NODE:
            return replay_duration_ns(node, self.exact)
        cpu, ops, size = _roofline_attrs(node)
        return self.comp_duration_ns(rank, cpu, ops, size, replay_duration_ns(node, self.exact))

    def comp_duration_ns(self, rank: int, cpu: bool, ops: int | None, size: int | None, recorded: int) -> int:
        """duration_ns of a COMP node from its already-read attributes (as `_roofline_attrs` reads them).

        The program builder scans every node's attributes once anyway; calling this instead of duration_ns
        saves a second scan per node (measured: ~30% of building a 1M-node program, docs/performance.md).
        """
        prof = self.profiles.get(rank, self.default)
        if cpu or ops is None or size is None or prof is None:
            return recorded
        return roofline_ns(ops, size, prof)

    def durations(self, rank: int, columns: RankView, rows: np.ndarray) -> np.ndarray:
        """duration_ns of many rows: comp_duration_ns once per distinct (device, cpu, num_ops, tensor_size,
        recorded) of the build, and once per distinct rank content (the ranks of a stage, TP peers and DP
        replicas, run the same ops on the same device)."""
        from xsim.replay.rank_view import IS_INT

        rec = columns.recorded_as(self.exact)
        out = rec[rows].copy()
        comp = rows[columns.node_type[rows] == pb.COMP_NODE]
        if not len(comp):
            return out
        k_ops, k_size = columns.kind(NUM_OPS)[comp], columns.kind(TENSOR_SIZE)[comp]
        has_ops, has_size = IS_INT[k_ops + 1], IS_INT[k_size + 1]
        ops_a = np.where(has_ops, columns.value(NUM_OPS)[comp], -1)
        size_a = np.where(has_size, columns.value(TENSOR_SIZE)[comp], -1)
        cpu = columns.is_cpu()[comp]
        prof = self.profile(rank)
        memo = columns.memo.setdefault(("roofline", id(self)), ({}, {}))
        by_rank, by_op = memo
        rank_key = (prof, ops_a.tobytes(), size_a.tobytes(), cpu.tobytes(), rec[comp].tobytes())
        got = by_rank.get(rank_key)
        if got is None:
            ops, size, c_, r_ = ops_a.tolist(), size_a.tolist(), cpu.tolist(), rec[comp].tolist()
            ho, hs = has_ops.tolist(), has_size.tolist()
            vals = []
            for j in range(len(comp)):
                key = (prof, c_[j], ops[j] if ho[j] else None, size[j] if hs[j] else None, r_[j])
                d = by_op.get(key)
                if d is None:
                    d = by_op[key] = self.comp_duration_ns(rank, *key[1:])
                vals.append(d)
            got = by_rank[rank_key] = np.asarray(vals, dtype=np.int64)
        out[np.searchsorted(rows, comp)] = got
        return out


@dataclass(frozen=True)
class SpeedScaled:
    """Scale GPU compute of some ranks: factor 2.0 runs twice as fast (time / 2), 0.5 twice as slow.

    CPU ops keep their time (the factor describes the GPU). A non-zero time never rounds down to 0.
    """

    base: ComputeModel
    factors: Mapping[int, float]

    @property
    def name(self) -> str:
        """Base model's name with the speed factors."""
        shown = ",".join(f"{r}={f:g}" for r, f in sorted(self.factors.items()))
        return f"{self.base.name}+speed({shown})"

    def timing_key(self, rank: int) -> tuple | None:
        """The rank's speed factor with its base model's key (None when the base cannot say)."""
        inner = timing_key_of(self.base, rank)
        return None if inner is None else (self.factors.get(rank), inner)

    def duration_ns(self, rank: int, node: pb.Node) -> int:
        """Base duration divided by the rank's factor, rounded to the nearest ns."""
        d = self.base.duration_ns(rank, node)
        f = self.factors.get(rank)
        if f is None or f == 1.0 or d == 0 or node.type != pb.COMP_NODE:
            return d
        if _roofline_attrs(node)[0]:
            return d
        return max(1, int(d / f + 0.5))

    def durations(self, rank: int, columns: RankView, rows: np.ndarray) -> np.ndarray:
        """duration_ns of many rows: the base model's, then GPU compute rows divided by the factor (float64
        division and truncation, as Python's int(d / f + 0.5) on these ints below 2^53)."""
        d = np.asarray(durations_of(self.base, rank, columns, rows), dtype=np.int64)
        f = self.factors.get(rank)
        if f is None or f == 1.0:
            return d
        scale = (columns.node_type[rows] == pb.COMP_NODE) & (d != 0) & ~columns.is_cpu()[rows]
        d = d.copy()
        d[scale] = np.maximum(1, (d[scale] / f + 0.5).astype(np.int64))
        return d


@dataclass(frozen=True)
class ComputeCapabilities:
    """What a compute model guarantees, queried instead of its type (by the program builder)."""

    # durations(rank, columns, rows) from columns; else the builder asks duration_ns node by node, each
    # node decoded into a message first (correct for any model, slower).
    vectorised: bool
    # A wrapper of `base` (SpeedScaled): vectorised only when its base is.
    wraps_base: bool = False


@dataclass(frozen=True)
class ComputeInfo:
    """One compute model xsim builds (xsim/api/compute.py:build_compute chooses among them)."""

    model: str  # "module:class", imported only when asked for
    capabilities: ComputeCapabilities
    summary: str


REGISTRY: dict[str, ComputeInfo] = {
    "duration": ComputeInfo(
        "xsim.replay.compute:DurationModel",
        ComputeCapabilities(vectorised=True),
        "the recorded durations (duration_ns, else duration_micros x 1000)",
    ),
    "roofline": ComputeInfo(
        "xsim.replay.compute:RooflineModel",
        ComputeCapabilities(vectorised=True),
        "ASTRA-sim's roofline from num_ops / tensor_size and a device per rank",
    ),
    "speed": ComputeInfo(
        "xsim.replay.compute:SpeedScaled",
        ComputeCapabilities(vectorised=True, wraps_base=True),
        "another model's GPU compute divided by a per-rank speed factor (--speed)",
    ),
    "whatif": ComputeInfo(
        "xsim.replay.whatif:WhatIfModel",
        ComputeCapabilities(vectorised=False),
        "measured compute rescaled per op class, from one GPU to another (--as-gpu)",
    ),
}
_BY_CLASS = {info.model.rpartition(":")[2]: info for info in REGISTRY.values()}


def capabilities_of(model: ComputeModel) -> ComputeCapabilities:
    """The registered capabilities of a model; an unregistered model is vectorised when it implements
    `durations` (VectorisedCompute)."""
    info = _BY_CLASS.get(type(model).__name__)
    if info is None or f"{type(model).__module__}:{type(model).__name__}" != info.model:
        return ComputeCapabilities(vectorised=isinstance(model, VectorisedCompute))
    caps = info.capabilities
    if caps.wraps_base and not capabilities_of(model.base).vectorised:
        return replace(caps, vectorised=False)
    return caps


def durations_of(model: ComputeModel, rank: int, columns: RankView, rows: np.ndarray) -> np.ndarray | list:
    """Durations of `rows` of one rank: the model's `durations` when it is vectorised (an int64 array),
    else its `duration_ns` looped over the rows' messages (a list of whatever it returns)."""
    if capabilities_of(model).vectorised:
        return model.durations(rank, columns, rows)
    return [model.duration_ns(rank, columns.node(i)) for i in rows.tolist()]


def with_exact(model: ComputeModel, exact: bool) -> ComputeModel:
    """`model` reading replayed durations with this rule (DurationModel, RooflineModel and SpeedScaled over
    them); any other model keeps its own rule."""
    if isinstance(model, DurationModel | RooflineModel):
        return model if model.exact == exact else replace(model, exact=exact)
    if isinstance(model, SpeedScaled):
        base = with_exact(model.base, exact)
        return model if base is model.base else replace(model, base=base)
    return model


def _check_factor(rank: int, factor: Any, where: str) -> float:
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not (factor > 0):
        raise DeviceProfileError(f"{where}: speed factor of rank {rank} must be a number > 0, got {factor!r}")
    if not math.isfinite(factor):
        raise DeviceProfileError(f"{where}: speed factor of rank {rank} must be finite")
    return float(factor)


_RANKS = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def parse_rank_spec(text: str, where: str) -> list[int]:
    """Ranks of "3", "0-7" or "0-3,8" (ranges inclusive)."""
    out: list[int] = []
    for part in str(text).split(","):
        m = _RANKS.match(part)
        if not m:
            raise DeviceProfileError(f"{where}: bad rank spec {text!r} (examples: 3, 0-7, 0-3,8)")
        lo = int(m[1])
        hi = int(m[2]) if m[2] is not None else lo
        if hi < lo:
            raise DeviceProfileError(f"{where}: empty rank range {part.strip()!r}")
        out.extend(range(lo, hi + 1))
    return out


def parse_speed(items: Sequence[str]) -> dict[int, float]:
    """`RANK=FACTOR` strings (RANK may be a range "0-3") into {rank: factor}."""
    out: dict[int, float] = {}
    for item in items:
        ranks, sep, value = item.partition("=")
        if not sep:
            raise DeviceProfileError(f"--speed {item!r}: expected RANK=FACTOR, e.g. 3=0.5")
        try:
            f = float(value)
        except ValueError:
            raise DeviceProfileError(f"--speed {item!r}: factor {value!r} is not a number") from None
        for r in parse_rank_spec(ranks, f"--speed {item!r}"):
            out[r] = _check_factor(r, f, f"--speed {item!r}")
    return out


def _profile_from(
    obj: Any, where: str, resolve: Callable[[str], DeviceProfile] | None = None
) -> DeviceProfile:
    if isinstance(obj, str):
        if resolve is None:
            raise DeviceProfileError(f"{where}: GPU name {obj!r} given but no GPU catalog to resolve it")
        return resolve(obj)
    if not isinstance(obj, dict) or set(obj) - {"peak_flops", "mem_bw", "label"}:
        raise DeviceProfileError(
            f'{where}: a device is {{"peak_flops": FLOP/s, "mem_bw": bytes/s[, "label": name]}}, got {obj!r}'
        )
    try:
        return DeviceProfile(float(obj["peak_flops"]), float(obj["mem_bw"]), str(obj.get("label", "")))
    except KeyError as exc:
        raise DeviceProfileError(f"{where}: missing {exc.args[0]!r}") from None
    except DeviceProfileError as exc:
        raise DeviceProfileError(f"{where}: {exc}") from None  # the bad value, now with the file and key
    except (TypeError, ValueError):
        raise DeviceProfileError(f"{where}: peak_flops and mem_bw must be numbers") from None


@dataclass(frozen=True)
class DeviceProfileFile:
    """A parsed device-profile file: default device, per-rank devices, per-rank speed factors."""

    default: DeviceProfile | None
    ranks: Mapping[int, DeviceProfile]
    speed: Mapping[int, float]


def load_device_profile(
    path: str | os.PathLike[str], resolve: Callable[[str], DeviceProfile] | None = None
) -> DeviceProfileFile:
    """Read a device-profile JSON file (format in docs/replay.md); `resolve` maps GPU names to devices."""
    p = os.fspath(path)
    try:
        raw = read_json(p)
    except JsonFileError as exc:
        if exc.reason.startswith("cannot read"):
            raise DeviceProfileError(
                f"{p}: cannot read device profile: {exc.reason.removeprefix('cannot read: ')}"
            ) from None
        raise DeviceProfileError(f"{p}: device profile is not JSON: {exc.reason}") from None
    if not isinstance(raw, dict) or set(raw) - {"default", "ranks", "speed"}:
        raise DeviceProfileError(f'{p}: expected an object with keys "default", "ranks", "speed"')
    for key in ("ranks", "speed"):
        if not isinstance(raw.get(key) or {}, dict):
            raise DeviceProfileError(f'{p}: "{key}" must be an object {{"<rank or a-b>": ...}}')
    default = _profile_from(raw["default"], f"{p}: default", resolve) if "default" in raw else None
    ranks: dict[int, DeviceProfile] = {}
    for key, val in (raw.get("ranks") or {}).items():
        prof = _profile_from(val, f"{p}: ranks[{key!r}]", resolve)
        for r in parse_rank_spec(key, f"{p}: ranks"):
            ranks[r] = prof
    speed: dict[int, float] = {}
    for key, val in (raw.get("speed") or {}).items():
        for r in parse_rank_spec(key, f"{p}: speed"):
            speed[r] = _check_factor(r, val, p)
    return DeviceProfileFile(default=default, ranks=ranks, speed=speed)
