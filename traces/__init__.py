"""The Chakra execution-trace format: schema, framed .et streams, trace sets, attributes and checks."""

from traces import pb
from traces.attrs import attr_dict, get_bool, get_float, get_int, get_str, make_attr, make_node, set_attr
from traces.errors import AttributeTypeError, TraceError, TraceFormatError, TraceSetError, XsimError
from traces.groups import ProcessGroups, load_comm_groups, resolve_groups
from traces.stream import EtFile, decode_stream, encode_stream, read_et, write_et
from traces.traceset import TraceSet, discover, write_trace_set

__all__ = [
    "AttributeTypeError",
    "EtFile",
    "ProcessGroups",
    "TraceError",
    "TraceFormatError",
    "TraceSet",
    "TraceSetError",
    "XsimError",
    "attr_dict",
    "decode_stream",
    "discover",
    "encode_stream",
    "get_bool",
    "get_float",
    "get_int",
    "get_str",
    "load_comm_groups",
    "make_attr",
    "make_node",
    "pb",
    "read_et",
    "resolve_groups",
    "set_attr",
    "write_et",
    "write_trace_set",
]
