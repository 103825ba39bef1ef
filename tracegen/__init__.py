"""The planning layer: model presets, GPU catalog, deployment specs and the per-rank workload generator.

The names below are imported on first use (PEP 562), so importing a sub-module (e.g. the reshard strategy
names for the command line's choices) does not load the generator.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "TraceBundle": "tracegen.bundle",
    "load_spec": "tracegen.spec",
    "generate": "tracegen.workload",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tracegen' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
