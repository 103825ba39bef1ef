"""The Chakra execution-trace format: schema, framed .et streams, trace sets, attributes and checks.

The names below are imported on first use (PEP 562), so `import traces.errors` does not load protobuf.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "pb": "traces.pb",
    "attr_dict": "traces.attrs",
    "get_bool": "traces.attrs",
    "get_float": "traces.attrs",
    "get_int": "traces.attrs",
    "get_str": "traces.attrs",
    "make_attr": "traces.attrs",
    "make_node": "traces.attrs",
    "set_attr": "traces.attrs",
    "AttributeTypeError": "traces.errors",
    "TraceError": "traces.errors",
    "TraceFormatError": "traces.errors",
    "TraceSetError": "traces.errors",
    "XsimError": "traces.errors",
    "ProcessGroups": "traces.groups",
    "load_comm_groups": "traces.groups",
    "resolve_groups": "traces.groups",
    "EtFile": "traces.stream",
    "decode_stream": "traces.stream",
    "encode_stream": "traces.stream",
    "read_et": "traces.stream",
    "write_et": "traces.stream",
    "TraceSet": "traces.traceset",
    "discover": "traces.traceset",
    "write_trace_set": "traces.traceset",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'traces' has no attribute {name!r}")
    if name == "pb":
        value = importlib.import_module(module)
    else:
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
