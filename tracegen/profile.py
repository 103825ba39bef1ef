"""Profiled op times (GPU x op x phase x shape -> microseconds) that override the roofline.

This is how the paper's capability profiling (section 4.2) enters: time a sample GPU once per op shape,
write the table, and every generated op of that shape takes the measured time instead of the roofline.
CSV columns: gpu, op, phase, shape, micros; shape is the op's shape key written `AxBxC`.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tracegen.catalog import canonical_gpu_name
from tracegen.errors import ProfileError

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
        shape = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        raise ProfileError(f"{where}: shape {text!r} is not AxBxC integers") from None
    if not shape or any(d <= 0 for d in shape):
        raise ProfileError(f"{where}: shape {text!r} must be positive integers")
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
    return ProfileRow(gpu, str(raw["op"]), phase, parse_shape(raw["shape"], where), micros)


def read_profile_csv(path: str | os.PathLike[str]) -> list[ProfileRow]:
    """Rows of a profiled-times CSV file."""
    p = os.fspath(path)
    try:
        with open(p, encoding="utf-8", newline="") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            missing = [c for c in COLUMNS if c not in header]
            if missing:
                raise ProfileError(f"{p}: missing column(s) {', '.join(missing)}")
            return [make_row(row, f"{p}:{i + 2}") for i, row in enumerate(reader)]
    except OSError as exc:
        raise ProfileError(f"{p}: cannot read profile: {exc.strerror or exc}") from None


def build_table(rows: Iterable[ProfileRow]) -> ProfileTable:
    """Index rows; a later row for the same key replaces an earlier one."""
    return ProfileTable({(r.gpu, r.op, r.phase, r.shape): r.micros for r in rows})
