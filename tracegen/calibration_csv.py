"""Reading the calibration data sets (tracegen/data/*.csv): one reader for every table of published rates.

Each table is a CSV with a header; a row whose first column starts with '#' is a comment. A caller names
the columns it reads, in its dataclass's field order, with the parser of each, so the tables share one
reading rule and a malformed number fails in the one place that reads it.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def flag(value: str) -> bool:
    """A 0/1 column."""
    return value == "1"


def read_points(path: str, cls: Callable[..., T], columns: dict[str, Callable[[str], object]]) -> list[T]:
    """The rows of the calibration table at `path` as `cls(*fields)`, each field parsed from its column."""
    with open(path, encoding="utf-8", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if not next(iter(r.values()), "").startswith("#")]
    return [cls(*(parse(r[name]) for name, parse in columns.items())) for r in rows]
