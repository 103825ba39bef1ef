"""The PyTorch host execution trace (ExecutionTraceObserver JSON), schemas 1.0.1 to 1.1.1(-chakra.x)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from xsim.tracegen.importers.pytorch.errors import PyTorchImportError
from xsim.traces.io import read_json

# Base versions of the ExecutionTraceObserver schema this importer reads. 1.0.1 (PyTorch <= 2.0) stores
# `parent`, flat `inputs`/`input_types` and per-node rf_id/tid fields; 1.0.2 and later store `ctrl_deps`,
# {values, shapes, types} objects and an `attrs` list. The `-chakra.x.y.z` suffix names the Chakra
# converter version the trace was written for and does not change the layout.
SUPPORTED_SCHEMAS = ("1.0.1", "1.0.2", "1.0.3", "1.1.0", "1.1.1")
ROOT_PREFIX = "[pytorch|profiler|execution_"  # [pytorch|profiler|execution_{trace,graph}|{process,thread}]
PG_INIT = "## process_group:init ##"


@dataclass(frozen=True, slots=True)
class HostOp:
    """One node of the host trace: an operator or record_function scope as PyTorch recorded it."""

    id: int
    name: str
    parent: int
    rf_id: int
    tid: int
    seq_id: int
    inputs: tuple[Any, ...]
    input_types: tuple[str, ...]

    @property
    def is_root(self) -> bool:
        """True for the process/thread root pseudo-nodes."""
        return self.name.startswith(ROOT_PREFIX)


@dataclass(frozen=True)
class HostTrace:
    """A parsed host trace: ops by id, with the schema and process groups it declares."""

    path: str
    schema: str
    ops: dict[int, HostOp]
    process_groups: tuple[dict[str, Any], ...]  # entries of `## process_group:init ##`
    pid: int | None = None  # process that recorded it (Kineto events of the same process share it)

    def children(self) -> dict[int, list[int]]:
        """Parent id -> child ids in ascending id (start) order."""
        out: dict[int, list[int]] = {}
        for op in sorted(self.ops.values(), key=lambda o: o.id):
            if op.parent != op.id:
                out.setdefault(op.parent, []).append(op.id)
        return out


def check_schema(schema: Any, path: str) -> str:
    """Validate the `schema` string and return its base version (e.g. "1.1.0")."""
    if not isinstance(schema, str):
        raise PyTorchImportError("not a PyTorch host execution trace (no 'schema' string)", path=path)
    base = schema.split("-", 1)[0]
    suffix = schema[len(base) :]
    if base not in SUPPORTED_SCHEMAS or (suffix and not suffix.startswith("-chakra.")):
        raise PyTorchImportError(
            f"unknown host trace schema {schema!r} (supported: {', '.join(SUPPORTED_SCHEMAS)},"
            " optionally with a -chakra.x suffix)",
            path=path,
        )
    return base


def _attrs(node: dict[str, Any]) -> dict[str, Any]:
    return {a.get("name"): a.get("value") for a in node.get("attrs") or () if isinstance(a, dict)}


def _parse_node(node: Any, path: str) -> HostOp:
    if not isinstance(node, dict) or "id" not in node or "name" not in node:
        raise PyTorchImportError(f"malformed host node {str(node)[:80]!r}", path=path)
    try:
        if "attrs" in node:  # schema >= 1.0.2
            a = _attrs(node)
            ins = node.get("inputs") if isinstance(node.get("inputs"), dict) else {}
            values, types = ins.get("values") or [], ins.get("types") or []
            parent = node.get("ctrl_deps", node["id"])
            return HostOp(
                id=int(node["id"]),
                name=str(node["name"]),
                parent=int(parent if parent is not None else node["id"]),
                rf_id=int(a.get("rf_id", 0) or 0),
                tid=int(a.get("tid", 0) or 0),
                seq_id=int(a.get("seq_id", -1) if a.get("seq_id") is not None else -1),
                inputs=tuple(values),
                input_types=tuple(str(t) for t in types),
            )
        return HostOp(  # schema 1.0.1
            id=int(node["id"]),
            name=str(node["name"]),
            parent=int(node.get("parent", node["id"])),
            rf_id=int(node.get("rf_id", 0) or 0),
            tid=int(node.get("tid", 0) or 0),
            seq_id=int(node.get("seq_id", -1)),
            inputs=tuple(node.get("inputs") or ()),
            input_types=tuple(str(t) for t in node.get("input_types") or ()),
        )
    except (TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise PyTorchImportError(f"host node id {node.get('id')!r}: bad field ({exc})", path=path) from None


def _pg_entries(op: HostOp, path: str) -> list[dict[str, Any]]:
    for v in op.inputs:
        if isinstance(v, str) and v.strip().startswith("["):
            try:
                entries = json.loads(v)
            except json.JSONDecodeError:
                raise PyTorchImportError(
                    f"host node id {op.id}: {PG_INIT} input is not JSON", path=path
                ) from None
            return [e for e in entries if isinstance(e, dict) and "pg_name" in e]
    return []


def load_host_trace(path: str | os.PathLike[str]) -> HostTrace:
    """Read and validate one host execution trace."""
    p = os.fspath(path)
    doc = read_json(p)
    if not isinstance(doc, dict):
        raise PyTorchImportError("not a PyTorch host execution trace (top level is not an object)", path=p)
    if "traceEvents" in doc:
        raise PyTorchImportError("this is a Kineto trace; pass it with --kineto, not --et", path=p)
    check_schema(doc.get("schema"), p)
    nodes = doc.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise PyTorchImportError("host execution trace has no 'nodes'", path=p)
    ops: dict[int, HostOp] = {}
    for raw in nodes:
        op = _parse_node(raw, p)
        if op.id in ops:
            raise PyTorchImportError(f"host node id {op.id} appears twice", path=p)
        ops[op.id] = op
    groups: list[dict[str, Any]] = []
    for op in ops.values():
        if op.name == PG_INIT:
            groups.extend(_pg_entries(op, p))
    pid = doc.get("pid")
    return HostTrace(
        path=p,
        schema=str(doc["schema"]),
        ops=ops,
        process_groups=tuple(groups),
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
    )
