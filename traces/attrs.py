"""Typed access to Chakra node attributes, tolerant of integer kinds as ASTRA-sim's FeederV3 is."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from xsim.traces import pb
from xsim.traces.errors import AttributeTypeError, DuplicateAttributeError

INT_KINDS = frozenset(
    {
        "int32_val",
        "int64_val",
        "uint32_val",
        "uint64_val",
        "sint32_val",
        "sint64_val",
        "fixed32_val",
        "fixed64_val",
        "sfixed32_val",
        "sfixed64_val",
    }
)
FLOAT_KINDS = frozenset({"double_val", "float_val"})
# Kinds holding one plain value (not a list or bytes): what attribute scanners read with getattr.
SCALAR_KINDS = frozenset(INT_KINDS | FLOAT_KINDS | {"bool_val", "string_val"})
LIST_KINDS = frozenset(
    {
        "double_list",
        "float_list",
        "int32_list",
        "int64_list",
        "uint32_list",
        "uint64_list",
        "sint32_list",
        "sint64_list",
        "fixed32_list",
        "fixed64_list",
        "sfixed32_list",
        "sfixed64_list",
        "bool_list",
        "string_list",
        "bytes_list",
    }
)

# Standard Chakra attribute names and the oneof each reference producer writes (chakra-et.md section 3.1).
IS_CPU_OP = "is_cpu_op"
COMM_TYPE = "comm_type"
COMM_SIZE = "comm_size"
COMM_SRC = "comm_src"
COMM_DST = "comm_dst"
COMM_TAG = "comm_tag"
COMM_PRIORITY = "comm_priority"
PG_NAME = "pg_name"
NUM_OPS = "num_ops"
TENSOR_SIZE = "tensor_size"
INVOLVED_DIM = "involved_dim"
STREAM = "stream"

STANDARD_KINDS: dict[str, str] = {
    IS_CPU_OP: "bool_val",
    COMM_TYPE: "int64_val",
    COMM_SIZE: "int64_val",
    COMM_SRC: "int32_val",
    COMM_DST: "int32_val",
    COMM_TAG: "int32_val",
    COMM_PRIORITY: "int32_val",
    PG_NAME: "string_val",
    NUM_OPS: "int64_val",
    TENSOR_SIZE: "uint64_val",
    INVOLVED_DIM: "bool_list",
    STREAM: "int64_val",
}

# xsim's own annotations: ordinary attributes with documented names (docs/trace-format.md), so a file
# xsim writes is still a plain Chakra trace.
LAYER = "layer"  # int64, 1-based model layer; 0 = not a layer op (embedding, loss, optimizer)
PHASE = "phase"  # string: "fwd" | "bwd" | "recompute" | "opt" (| "sync" for gradient synchronization)
MICRO_BATCH = "micro_batch"  # int64
STAGE = "stage"  # int64 pipeline stage
DEVICE_GROUP = "device_group"  # int64
RING = "ring"  # int64, multi-ring index of an inserted sync collective
CHUNK = "chunk"  # int64, LCM chunk index
RESHARD = "reshard"  # string: strategy that inserted the node (xsim | hetauto | alpacomm | naive)
# int64: the generator's op time in ns; duration_micros holds it rounded to whole µs (Chakra's field), and a
# replay of the recorded durations prefers this exact value (replay.compute.DurationModel).
DURATION_NS = "duration_ns"
SIM_START_NS = "xsim_start_ns"  # int64, written by `xsim replay --annotate`
SIM_END_NS = "xsim_end_ns"
SIM_WAIT_NS = "xsim_wait_ns"
ANNOTATION_NAMES: tuple[str, ...] = (LAYER, PHASE, MICRO_BATCH, STAGE, DEVICE_GROUP, RING, CHUNK, RESHARD)

_MISSING: Any = object()


def find_attr(attrs: Iterable[pb.AttributeProto], name: str) -> pb.AttributeProto | None:
    """First attribute called `name`, or None."""
    for a in attrs:
        if a.name == name:
            return a
    return None


def duplicate_attr_error(
    name: str, *, path: str | None = None, rank: int | None = None, node_id: int | None = None
) -> DuplicateAttributeError:
    """The one error for an attribute name given twice on one node (info, validate and replay all raise it).

    Readers disagreed on which copy counts (issue 16: two `comm_size` on a node, 1 MiB for info and
    validate, 1 GiB for replay), so a name the tools interpret may appear once per node.
    """
    return DuplicateAttributeError(
        f"attribute {name!r} given twice on one node (which one counts is ambiguous: keep one)",
        path=path,
        rank=rank,
        node_id=node_id,
    )


def _one_attr(node: Any, name: str, where: str | None) -> pb.AttributeProto | None:
    """The attribute called `name`, or None; a second one is duplicate_attr_error."""
    found = None
    for a in node.attr:
        if a.name == name:
            if found is not None:
                raise duplicate_attr_error(name, path=where, node_id=getattr(node, "id", None))
            found = a
    return found


def attr_value(attr: pb.AttributeProto) -> Any:
    """Python value of an attribute's oneof (a list for *_list kinds, None when unset)."""
    kind = attr.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(attr, kind)
    if kind in LIST_KINDS:
        return list(value.values)
    return value


def attr_dict(node: pb.Node | pb.GlobalMetadata) -> dict[str, Any]:
    """All attributes of a node as {name: value}; the first occurrence of a repeated name wins."""
    out: dict[str, Any] = {}
    for a in node.attr:
        if a.name not in out:
            out[a.name] = attr_value(a)
    return out


def _type_error(node: Any, name: str, kind: str | None, wanted: str, where: str | None) -> AttributeTypeError:
    node_id = getattr(node, "id", None)
    return AttributeTypeError(
        f"attribute {name!r} holds {kind or 'no value'}, expected {wanted}", path=where, node_id=node_id
    )


def get_int(node: pb.Node, name: str, default: Any = _MISSING, *, where: str | None = None) -> int:
    """Integer attribute from any integer oneof (or bool); strings and floats are rejected."""
    a = _one_attr(node, name, where)
    if a is None:
        if default is _MISSING:
            raise AttributeTypeError(f"missing attribute {name!r}", path=where, node_id=node.id)
        return default
    kind = a.WhichOneof("value")
    if kind in INT_KINDS or kind == "bool_val":
        return int(getattr(a, kind))
    raise _type_error(node, name, kind, "an integer", where)


def get_float(node: pb.Node, name: str, default: Any = _MISSING, *, where: str | None = None) -> float:
    """Number attribute from any integer or floating oneof."""
    a = _one_attr(node, name, where)
    if a is None:
        if default is _MISSING:
            raise AttributeTypeError(f"missing attribute {name!r}", path=where, node_id=node.id)
        return default
    kind = a.WhichOneof("value")
    if kind in INT_KINDS or kind in FLOAT_KINDS:
        return float(getattr(a, kind))
    raise _type_error(node, name, kind, "a number", where)


def get_bool(node: pb.Node, name: str, default: Any = _MISSING, *, where: str | None = None) -> bool:
    """Boolean attribute from bool_val or any integer oneof (STG writes is_cpu_op as int32_val)."""
    a = _one_attr(node, name, where)
    if a is None:
        if default is _MISSING:
            raise AttributeTypeError(f"missing attribute {name!r}", path=where, node_id=node.id)
        return default
    kind = a.WhichOneof("value")
    if kind == "bool_val" or kind in INT_KINDS:
        return bool(getattr(a, kind))
    raise _type_error(node, name, kind, "a boolean", where)


def get_str(node: pb.Node, name: str, default: Any = _MISSING, *, where: str | None = None) -> str:
    """String attribute; integers are accepted and rendered in decimal (legacy numeric group ids)."""
    a = _one_attr(node, name, where)
    if a is None:
        if default is _MISSING:
            raise AttributeTypeError(f"missing attribute {name!r}", path=where, node_id=node.id)
        return default
    kind = a.WhichOneof("value")
    if kind == "string_val":
        return a.string_val
    if kind in INT_KINDS:
        return str(getattr(a, kind))
    raise _type_error(node, name, kind, "a string", where)


def get_bool_list(
    node: pb.Node, name: str, default: Any = _MISSING, *, where: str | None = None
) -> list[bool]:
    """A bool_list attribute (ASTRA-sim insists on this kind for involved_dim)."""
    a = _one_attr(node, name, where)
    if a is None:
        if default is _MISSING:
            raise AttributeTypeError(f"missing attribute {name!r}", path=where, node_id=node.id)
        return default
    kind = a.WhichOneof("value")
    if kind == "bool_list":
        return list(a.bool_list.values)
    raise _type_error(node, name, kind, "a bool_list", where)


# Standard-attribute helpers; defaults follow ASTRA-sim (chakra-et.md 2.3 and 3.1).
def is_cpu_op(node: pb.Node, where: str | None = None) -> bool:
    """`is_cpu_op` (missing means a GPU op)."""
    return get_bool(node, IS_CPU_OP, False, where=where)


def comm_type(node: pb.Node, default: Any = _MISSING, where: str | None = None) -> int:
    """`comm_type` as a CollectiveCommType value."""
    return get_int(node, COMM_TYPE, default, where=where)


def comm_size(node: pb.Node, default: Any = _MISSING, where: str | None = None) -> int:
    """`comm_size` in bytes."""
    return get_int(node, COMM_SIZE, default, where=where)


def comm_src(node: pb.Node, default: Any = _MISSING, where: str | None = None) -> int:
    """`comm_src` rank of a P2P node."""
    return get_int(node, COMM_SRC, default, where=where)


def comm_dst(node: pb.Node, default: Any = _MISSING, where: str | None = None) -> int:
    """`comm_dst` rank of a P2P node."""
    return get_int(node, COMM_DST, default, where=where)


def comm_tag(node: pb.Node, default: Any = _MISSING, where: str | None = None) -> int:
    """`comm_tag` of a P2P node."""
    return get_int(node, COMM_TAG, default, where=where)


def pg_name(node: pb.Node, where: str | None = None) -> str:
    """`pg_name` (""/"0" = all ranks); the legacy int `comm_group` is honoured when pg_name is absent."""
    name = get_str(node, PG_NAME, None, where=where)
    if name is None:
        legacy = get_int(node, "comm_group", None, where=where)
        return "" if legacy is None else str(legacy)
    return name


def num_ops(node: pb.Node, default: Any = 0, where: str | None = None) -> int:
    """`num_ops` (FLOPs) for roofline timing."""
    return get_int(node, NUM_OPS, default, where=where)


def tensor_size(node: pb.Node, default: Any = 0, where: str | None = None) -> int:
    """`tensor_size` (bytes touched) for roofline timing."""
    return get_int(node, TENSOR_SIZE, default, where=where)


def involved_dim(node: pb.Node, where: str | None = None) -> list[bool] | None:
    """`involved_dim` or None when absent."""
    return get_bool_list(node, INVOLVED_DIM, None, where=where)


def make_attr(name: str, value: Any, kind: str | None = None) -> pb.AttributeProto:
    """An AttributeProto with the conventional oneof for standard names, else inferred from the value."""
    a = pb.AttributeProto(name=name)
    kind = kind or STANDARD_KINDS.get(name) or _infer_kind(value)
    if kind in LIST_KINDS:
        getattr(a, kind).values.extend(value)
    else:
        setattr(a, kind, value)
    return a


def _infer_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool_val"
    if isinstance(value, int):
        return "uint64_val" if value >= 1 << 63 else "int64_val"
    if isinstance(value, float):
        return "double_val"
    if isinstance(value, str):
        return "string_val"
    if isinstance(value, bytes):
        return "bytes_val"
    if isinstance(value, Sequence):
        items = list(value)
        if all(isinstance(v, bool) for v in items):
            return "bool_list"
        if all(isinstance(v, int) for v in items):
            return "int64_list"
        if all(isinstance(v, float | int) for v in items):
            return "double_list"
        if all(isinstance(v, str) for v in items):
            return "string_list"
    raise TypeError(f"cannot store {type(value).__name__} in a Chakra attribute")


def set_attr(node: pb.Node | pb.GlobalMetadata, name: str, value: Any, kind: str | None = None) -> None:
    """Set (replace) an attribute on a node or metadata message."""
    new = make_attr(name, value, kind)
    for i, a in enumerate(node.attr):
        if a.name == name:
            node.attr[i].CopyFrom(new)
            return
    node.attr.append(new)


def make_node(
    node_id: int,
    name: str,
    node_type: int,
    *,
    data_deps: Iterable[int] = (),
    ctrl_deps: Iterable[int] = (),
    duration_micros: int = 0,
    attrs: Mapping[str, Any] | None = None,
) -> pb.Node:
    """Build a Node with its dependencies and attributes (standard names get their conventional oneof)."""
    node = pb.Node(id=node_id, name=name, type=node_type, duration_micros=duration_micros)
    node.data_deps.extend(data_deps)
    node.ctrl_deps.extend(ctrl_deps)
    if attrs:
        node.attr.extend(make_attr(k, v) for k, v in attrs.items())
    return node


PP_BOUNDARY = "pp_boundary"  # int64 1 on stage-boundary P2P nodes the generator emits (the rewriter's anchor)
