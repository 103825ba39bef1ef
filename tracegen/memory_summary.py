"""The replay summary's `memory`, read back from the memory.json `xsim gen` writes (tracegen/memory.py).

Its own module: `xsim replay` reads the file without loading the memory model (and the op cost model,
fractions and the spec parser it imports).
"""

from __future__ import annotations

import os
from typing import Any

from xsim.traces.errors import XsimError
from xsim.traces.io import read_json


def peak_summary(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The replay summary's `memory`: peak bytes per rank from a memory.json (None when unreadable)."""
    try:
        doc = read_json(path)
        ranks = sorted(doc["ranks"], key=lambda r: r["rank"])
        return {
            "peak_bytes": int(doc["peak_bytes"]),
            "peak_rank": int(doc["peak_rank"]),
            "fits": bool(doc["fits"]),
            "per_rank_peak_bytes": [int(r["total"]) for r in ranks],
            "per_rank_capacity_bytes": [int(r["capacity"]) for r in ranks],
        }
    except (XsimError, ValueError, KeyError, TypeError):
        return None  # a damaged memory.json must not stop a replay; the summary just omits it
