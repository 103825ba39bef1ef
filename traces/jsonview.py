"""A lossless JSON view of one rank's trace (one JSON document per rank), and Chakra's JSON feeder format."""

from __future__ import annotations

import json
import os
from typing import Any

from xsim.traces import attrs as A
from xsim.traces import pb
from xsim.traces.errors import TraceFormatError
from xsim.traces.io import JsonFileError, read_json
from xsim.traces.stream import GZIP_MAGIC, EtFile

FORMAT = "xsim-chakra-json/1"


def to_json_dict(et: EtFile) -> dict[str, Any]:
    """The JSON document of one file: protobuf's canonical JSON mapping (64-bit ints as strings, exact)."""
    from google.protobuf import json_format  # JSON views only: `xsim replay` of .et files never loads it

    opts = {"preserving_proto_field_name": True}
    return {
        "format": FORMAT,
        "metadata": json_format.MessageToDict(et.metadata, **opts),
        "nodes": [json_format.MessageToDict(n, **opts) for n in et.nodes],
    }


def dump_json(et: EtFile, path: str | os.PathLike[str]) -> None:
    """Write one file's JSON document (gzip when the name ends in .gz)."""
    text = json.dumps(to_json_dict(et), indent=1, sort_keys=False) + "\n"
    p = os.fspath(path)
    data = text.encode("utf-8")
    if p.endswith(".gz"):
        import gzip  # gzip files only: a replay of .et files never loads it

        data = gzip.compress(data, mtime=0)
    from xsim.traces.outputs import atomic_write_bytes  # writers only: a replay reads

    atomic_write_bytes(p, data)  # temporary name, renamed into place


def from_json_dict(doc: Any, path: str = "<json>") -> EtFile:
    """Decode our JSON document or a Chakra feeder `workload_graph` document into an EtFile."""
    if not isinstance(doc, dict):
        raise TraceFormatError("JSON trace must be an object", path=path)
    if "workload_graph" in doc:
        return _from_feeder(doc, path)
    if "nodes" not in doc:
        raise TraceFormatError(
            "JSON has neither 'nodes' (xsim JSON view) nor 'workload_graph' (Chakra feeder)", path=path
        )
    from google.protobuf import json_format

    meta = pb.GlobalMetadata()
    try:
        json_format.ParseDict(doc.get("metadata") or {}, meta)
    except json_format.ParseError as exc:
        raise TraceFormatError(f"metadata: {_first_line(exc)}", path=path) from None
    if not isinstance(doc["nodes"], list):
        raise TraceFormatError("'nodes' must be a list of node objects", path=path)
    nodes = []
    for index, nd in enumerate(doc["nodes"]):
        if not isinstance(nd, dict):
            raise TraceFormatError(f"a node must be an object, got {nd!r:.40}", path=path, node_index=index)
        node = pb.Node()
        try:
            json_format.ParseDict(nd, node)
        except json_format.ParseError as exc:
            raise TraceFormatError(_first_line(exc), path=path, node_index=index) from None
        nodes.append(node)
    return EtFile(path=path, metadata=meta, nodes=nodes)


def _first_line(exc: Exception) -> str:
    """protobuf's ParseError appends a second line listing the available fields; errors are one line."""
    return str(exc).strip().splitlines()[0]


# Chakra's WrapperNode JSON keys -> (Node field or attribute, attribute oneof); chakra-et.md section 2.3.
_FEEDER_ATTRS = {
    "is_cpu_op": "bool_val",
    "tensor_size": "uint64_val",
    "comm_type": "int64_val",
    "comm_priority": "int32_val",
    "comm_size": "int64_val",
    "comm_src": "int32_val",
    "comm_dst": "int32_val",
    "comm_tag": "int32_val",
}


def _from_feeder(doc: dict[str, Any], path: str) -> EtFile:
    graph = doc["workload_graph"]
    if not isinstance(graph, list):
        raise TraceFormatError("'workload_graph' must be a list of nodes", path=path)
    nodes = []
    for index, nd in enumerate(graph):
        try:
            node = pb.Node(
                id=int(nd["Id"]),
                name=str(nd.get("Name", "")),
                type=int(nd.get("NodeType", 0)),
                duration_micros=int(nd.get("runtime", 0)),
            )
            node.data_deps.extend(int(d) for d in nd.get("data_deps", []))
            node.ctrl_deps.extend(int(d) for d in nd.get("ctrlDeps", nd.get("ctrl_deps", [])))
            for key, kind in _FEEDER_ATTRS.items():
                if key in nd:
                    value = bool(nd[key]) if kind == "bool_val" else int(nd[key])
                    node.attr.append(A.make_attr(key, value, kind))
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceFormatError(f"bad feeder node: {exc!r}", path=path, node_index=index) from None
        nodes.append(node)
    meta = pb.GlobalMetadata()
    A.set_attr(meta, "source", "chakra-json-feeder")
    return EtFile(path=path, metadata=meta, nodes=nodes)


def load_json(path: str | os.PathLike[str]) -> EtFile:
    """Read a JSON trace file (plain or gzip): our JSON view or Chakra's feeder format."""
    p = os.fspath(path)
    try:
        doc = read_json(p)
    except JsonFileError as exc:
        raise TraceFormatError(exc.reason, path=p) from None
    return from_json_dict(doc, p)


def is_json_file(path: str | os.PathLike[str]) -> bool:
    """True when the file (possibly gzip) starts with a JSON object rather than a framed protobuf stream."""
    p = os.fspath(path)
    if p.endswith((".json", ".json.gz")):
        return True
    if p.endswith((".et", ".et.gz")):
        return False
    try:
        with open(p, "rb") as fh:
            head = fh.read(64)
    except OSError:
        return False
    if head[:2] == GZIP_MAGIC:
        import gzip

        try:
            with gzip.open(p, "rb") as fh:
                head = fh.read(64)
        except (OSError, EOFError):
            return False
    # A framed stream may also start with 0x7b (a 123-byte GlobalMetadata), but then field tag 0x0a/0x12
    # follows, never JSON's quote, brace or whitespace.
    body = head.lstrip()
    return body[:1] == b"{" and body[1:].lstrip()[:1] in (b'"', b"}")
