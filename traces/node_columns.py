"""Protobuf messages into columns: the replay's one representation for files the columnar decoder leaves
to protobuf (JSON traces, forms traces/columnar.py declines).

The columns are those traces/columnar.py gives for the same nodes (file order, deps in CSR form, one
column per wanted attribute name holding its first occurrence). A value the columns cannot hold (a float,
list or bytes value, an integer past int64, or the name again on the same node) gets kind `F_OTHER`;
every such value breaks a rule of traces/attrcheck.py, and the replay's lint pass names it from the
message, which these columns keep (`RankColumns.node`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from xsim.traces import pb
from xsim.traces.attrcheck import CHECKED
from xsim.traces.attrs import INT_KINDS
from xsim.traces.columnar import F_OTHER, AttrColumn, RankColumns
from xsim.traces.errors import TraceFormatError
from xsim.traces.wire import F_BOOL, F_INT64, F_STRING

_INT64_MAX = (1 << 63) - 1
# Out-of-range dependency ids: no node has a negative id, so they never match one (and are reported as
# absent by the builder, from the message).
_NO_ID = -1


def _dep_array(deps: Sequence[int]) -> list[int]:
    return [d if d <= _INT64_MAX else _NO_ID for d in deps]


class _AttrBuilder:
    """One wanted attribute name's column, filled node by node."""

    def __init__(self, n: int) -> None:
        self.kind = np.full(n, -1, dtype=np.int8)
        self.value = np.zeros(n, dtype=np.int64)
        self.strings: dict[str, int] = {}

    def put(self, i: int, a: pb.AttributeProto, checked: bool) -> None:
        if self.kind[i] >= 0:  # the name again on this node
            if checked:
                self.kind[i] = F_OTHER
            return
        kind = a.WhichOneof("value")
        if kind is None:
            self.kind[i] = 0
            return
        v = getattr(a, kind)
        if kind == "bool_val":
            self.kind[i], self.value[i] = F_BOOL, int(v)
        elif kind == "string_val":
            self.kind[i], self.value[i] = F_STRING, self.strings.setdefault(v, len(self.strings))
        elif kind in INT_KINDS and -_INT64_MAX - 1 <= v <= _INT64_MAX:
            # Every integer kind reads as its value (sint, fixed: the columnar decoder declines them).
            self.kind[i], self.value[i] = F_INT64, v
        else:
            self.kind[i] = F_OTHER

    def column(self) -> AttrColumn:
        return AttrColumn(self.kind, self.value, tuple(self.strings))


def columns_from_nodes(nodes: Sequence[pb.Node], path: str, want: frozenset[str]) -> RankColumns:
    """One file's nodes (file order) as columns, attributes outside `want` left out."""
    n = len(nodes)
    ids = [x.id for x in nodes]
    for i, nid in enumerate(ids):
        if nid > _INT64_MAX:
            raise TraceFormatError(f"node id {nid} is 2^63 or more", path=path, node_index=i)
    attrs: dict[str, _AttrBuilder] = {}
    data_cnt = np.zeros(n, dtype=np.int64)
    ctrl_cnt = np.zeros(n, dtype=np.int64)
    data: list[int] = []
    ctrl: list[int] = []
    for i, x in enumerate(nodes):
        dd, cd = x.data_deps[:], x.ctrl_deps[:]
        data_cnt[i], ctrl_cnt[i] = len(dd), len(cd)
        data.extend(_dep_array(dd))
        ctrl.extend(_dep_array(cd))
        for a in x.attr[:] if len(x.attr) else ():
            if a.name in want:
                col = attrs.get(a.name)
                if col is None:
                    col = attrs[a.name] = _AttrBuilder(n)
                col.put(i, a, a.name in CHECKED)
    zero = np.zeros(n, dtype=np.int64)
    return RankColumns(
        paths=(path,),
        file_ptr=np.asarray([0, n], dtype=np.int64),
        num_nodes=n,
        node_id=np.asarray(ids, dtype=np.int64) if n else zero,
        node_type=np.fromiter((x.type for x in nodes), dtype=np.int64, count=n),
        # Past int64 (a corrupt duration) clipped: the attribute rule flags it and names the real value.
        duration_micros=np.fromiter((min(x.duration_micros, _INT64_MAX) for x in nodes), np.int64, count=n),
        names=[x.name for x in nodes],
        data_ptr=np.concatenate(([0], np.cumsum(data_cnt))).astype(np.int64),
        data_idx=np.asarray(data, dtype=np.int64),
        ctrl_ptr=np.concatenate(([0], np.cumsum(ctrl_cnt))).astype(np.int64),
        ctrl_idx=np.asarray(ctrl, dtype=np.int64),
        attrs={name: col.column() for name, col in attrs.items()},
        payload_start=zero,
        payload_end=zero,
        buf=b"",
        messages=tuple(nodes),
    )
