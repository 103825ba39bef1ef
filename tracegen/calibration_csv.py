"""Reading the calibration data sets (tracegen/data/*.csv): one reader for every table of published rates.

Each table is a CSV with a header; a row whose first column starts with '#' is a comment. A caller names
the dataclass a row becomes; its fields, in order, are the columns read (by the same name unless renamed),
each parsed by its annotated type, so the tables share one reading rule and a malformed number fails in the
one place that reads it.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import TypeVar

T = TypeVar("T")


def flag(value: str) -> bool:
    """A 0/1 column."""
    return value == "1"


# A field's annotation (a string under `from __future__ import annotations`) -> the parser of its column.
PARSERS: dict[str, Callable[[str], object]] = {"str": str, "int": int, "float": float, "bool": flag}


def read_points(path: str, cls: type[T], renamed: Mapping[str, str] | None = None) -> list[T]:
    """The rows of the calibration table at `path` as `cls` dataclasses, each field parsed from its column
    (the field's name, or `renamed[field]`) by the field's type."""
    renamed = renamed or {}
    columns = []
    for f in fields(cls):  # type: ignore[arg-type]
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        columns.append((renamed.get(f.name, f.name), PARSERS[kind]))
    with open(path, encoding="utf-8", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if not next(iter(r.values()), "").startswith("#")]
    return [cls(*(parse(r[name]) for name, parse in columns)) for r in rows]
