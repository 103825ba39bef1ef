"""The Chakra execution-trace format: schema, framed .et streams, trace sets, attributes and checks.

The names below are imported on first use (traces/lazy.py), so `import traces.errors` loads no protobuf.
"""

from xsim.traces.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "xsim.traces.pb": ["pb"],
        "xsim.traces.attrs": [
            "attr_dict",
            "get_bool",
            "get_float",
            "get_int",
            "get_str",
            "make_attr",
            "make_node",
        ]
        + ["set_attr"],
        "xsim.traces.errors": [
            "AttributeTypeError",
            "TraceError",
            "TraceFormatError",
            "TraceSetError",
            "XsimError",
        ],
        "xsim.traces.groups": ["ProcessGroups", "load_comm_groups", "resolve_groups"],
        "xsim.traces.stream": ["EtFile", "decode_stream", "encode_stream", "read_et", "write_et"],
        "xsim.traces.traceset": ["TraceSet", "discover", "write_trace_set"],
    },
)
