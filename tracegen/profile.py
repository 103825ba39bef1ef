"""Profiled op times (GPU x op x phase x shape -> microseconds) that override the roofline.

This is how the paper's capability profiling (section 4.2) enters: time a sample GPU once per op shape,
write the table, and every generated op of that shape takes the measured time instead of the roofline.
CSV columns: gpu, op, phase, shape, micros; shape is the op's shape key written `AxBxC`.
"""

from __future__ import annotations

import csv
import io
import math
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from xsim.tracegen.catalog import canonical_gpu_name
from xsim.tracegen.errors import ProfileError
from xsim.traces.limits import limit, short_repr

# Profiled tables hold one row per (GPU, op, phase, shape): the paper profiles a few GPUs x ~20 op kinds x a
# few shapes, hundreds of rows. These bounds sit ~1000x above that and keep a wrong file (/dev/zero, a
# multi-GB log) from being read whole: raise them with the env vars.
DEFAULT_MAX_PROFILE_BYTES = 16 << 20  # XSIM_MAX_PROFILE_BYTES
DEFAULT_MAX_PROFILE_ROWS = 1 << 17  # XSIM_MAX_PROFILE_ROWS (131,072)
MAX_SHAPE_DIMS = 8  # a shape key is an op's GEMM/tensor dims (3-4 in practice)
MAX_SHAPE_DIM = (1 << 63) - 1  # the deployment's ProfileEntry.shape is int64
# micros are durations: below 2^53 ns like every trace duration (traces.attrcheck.MAX_DURATION_NS).
MAX_MICROS = (1 << 53) / 1000

COLUMNS = ("gpu", "op", "phase", "shape", "micros")
PHASES = ("fwd", "bwd", "opt")

Key = tuple[str, str, str, tuple[int, ...]]


@dataclass(frozen=True)
class ProfileRow:
    """One measured op time."""

    gpu: str
    op: str
    phase: str
    shape: tuple[int, ...]
    micros: float


@dataclass(frozen=True)
class ProfileTable:
    """Exact-match lookup of measured op times; misses fall back to the roofline."""

    times: Mapping[Key, float]

    def lookup(self, gpu: str, op: str, phase: str, shape: tuple[int, ...]) -> float | None:
        """Measured microseconds for this op, or None when the table has no such row."""
        return self.times.get((gpu, op, phase, shape))

    def __len__(self) -> int:
        return len(self.times)


def parse_shape(text: Any, where: str) -> tuple[int, ...]:
    """`2048x4096x1536` (or a list of ints) -> (2048, 4096, 1536)."""
    try:
        parts = list(text) if isinstance(text, list | tuple) else str(text).lower().split("x")
        if len(parts) > MAX_SHAPE_DIMS:
            raise ProfileError(f"{where}: shape {short_repr(text)} has more than {MAX_SHAPE_DIMS} dimensions")
        shape = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        raise ProfileError(f"{where}: shape {short_repr(text)} is not AxBxC integers") from None
    if not shape or any(not 0 < d <= MAX_SHAPE_DIM for d in shape):
        raise ProfileError(f"{where}: shape {short_repr(text)} must be positive integers below 2^63")
    return shape


def make_row(raw: Mapping[str, Any], where: str) -> ProfileRow:
    """Validate one row given as a mapping with the CSV's columns."""
    missing = [c for c in COLUMNS if c not in raw or raw[c] in (None, "")]
    if missing:
        raise ProfileError(f"{where}: missing {', '.join(missing)}")
    try:
        gpu = canonical_gpu_name(str(raw["gpu"]))
    except Exception as exc:  # CatalogError: re-raised with the row's location
        raise ProfileError(f"{where}: {exc}") from None
    phase = str(raw["phase"])
    if phase not in PHASES:
        raise ProfileError(f"{where}: phase must be one of {', '.join(PHASES)}, got {phase!r}")
    try:
        micros = float(raw["micros"])
    except (TypeError, ValueError):
        raise ProfileError(f"{where}: micros {raw['micros']!r} is not a number") from None
    if not micros >= 0:
        raise ProfileError(f"{where}: micros must be >= 0, got {micros}")
    if not math.isfinite(micros) or micros >= MAX_MICROS:
        raise ProfileError(f"{where}: micros must be a finite duration below 2^53 ns, got {micros:g}")
    return ProfileRow(gpu, str(raw["op"]), phase, parse_shape(raw["shape"], where), micros)


def read_profile_csv(path: str | os.PathLike[str]) -> list[ProfileRow]:
    """Rows of a profiled-times CSV file (bounded: XSIM_MAX_PROFILE_BYTES, XSIM_MAX_PROFILE_ROWS)."""
    p = os.fspath(path)
    text = _read_bounded(p)
    max_rows = limit("XSIM_MAX_PROFILE_ROWS", DEFAULT_MAX_PROFILE_ROWS)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = reader.fieldnames or []
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise ProfileError(f"{p}: missing column(s) {', '.join(missing)}")
        rows = []
        for i, row in enumerate(reader):
            if i >= max_rows:
                raise ProfileError(f"{p}: more than {max_rows} rows (XSIM_MAX_PROFILE_ROWS raises the limit)")
            rows.append(make_row(row, f"{p}:{i + 2}"))
        return rows
    except csv.Error as exc:
        raise ProfileError(f"{p}: not a CSV table: {exc}") from None


def _read_bounded(p: str) -> str:
    """The file's text; a regular file's size is checked before reading, anything else read to the limit."""
    cap = limit("XSIM_MAX_PROFILE_BYTES", DEFAULT_MAX_PROFILE_BYTES)
    try:
        with open(p, "rb") as fh:
            st = os.fstat(fh.fileno())
            if stat.S_ISREG(st.st_mode) and st.st_size > cap:
                raw = b"x" * (cap + 1)
            else:
                raw = fh.read(cap + 1)
    except OSError as exc:
        raise ProfileError(f"{p}: cannot read profile: {exc.strerror or exc}") from None
    if len(raw) > cap:
        raise ProfileError(f"{p}: larger than {cap} bytes (XSIM_MAX_PROFILE_BYTES raises the limit)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProfileError(f"{p}: not a UTF-8 CSV file") from None


def build_table(rows: Iterable[ProfileRow]) -> ProfileTable:
    """Index rows; a later row for the same key replaces an earlier one."""
    return ProfileTable({(r.gpu, r.op, r.phase, r.shape): r.micros for r in rows})
