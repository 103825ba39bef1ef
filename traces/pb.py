"""The Chakra protobuf messages and enums, under short names (`pb.Node`, `pb.COMP_NODE`, ...)."""

from __future__ import annotations

from xsim.traces import et_def_pb2 as _m

Node = _m.Node
GlobalMetadata = _m.GlobalMetadata
AttributeProto = _m.AttributeProto
IOInfo = _m.IOInfo
Tensor = _m.Tensor

NodeType = _m.NodeType
CollectiveCommType = _m.CollectiveCommType

INVALID_NODE = _m.INVALID_NODE
METADATA_NODE = _m.METADATA_NODE
MEM_LOAD_NODE = _m.MEM_LOAD_NODE
MEM_STORE_NODE = _m.MEM_STORE_NODE
COMP_NODE = _m.COMP_NODE
COMM_SEND_NODE = _m.COMM_SEND_NODE
COMM_RECV_NODE = _m.COMM_RECV_NODE
COMM_COLL_NODE = _m.COMM_COLL_NODE

ALL_REDUCE = _m.ALL_REDUCE
REDUCE = _m.REDUCE
ALL_GATHER = _m.ALL_GATHER
GATHER = _m.GATHER
SCATTER = _m.SCATTER
BROADCAST = _m.BROADCAST
ALL_TO_ALL = _m.ALL_TO_ALL
REDUCE_SCATTER = _m.REDUCE_SCATTER
REDUCE_SCATTER_BLOCK = _m.REDUCE_SCATTER_BLOCK
BARRIER = _m.BARRIER

NODE_TYPE_NAMES: dict[int, str] = {
    v.number: v.name for v in _m.DESCRIPTOR.enum_types_by_name["NodeType"].values
}
COMM_TYPE_NAMES: dict[int, str] = {
    v.number: v.name for v in _m.DESCRIPTOR.enum_types_by_name["CollectiveCommType"].values
}


def node_type_name(value: int) -> str:
    """Name of a NodeType value, or `UNKNOWN(<n>)` for values outside the enum."""
    return NODE_TYPE_NAMES.get(value, f"UNKNOWN({value})")


def comm_type_name(value: int) -> str:
    """Name of a CollectiveCommType value, or `UNKNOWN(<n>)` for values outside the enum."""
    return COMM_TYPE_NAMES.get(value, f"UNKNOWN({value})")
