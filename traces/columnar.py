"""Columnar decoding of one rank's `.et` bytes: every node's fields as numpy arrays, no message per node.

The protobuf wire format is walked with numpy, all nodes of a file at once, one field per round: a round
reads the next tag of every node still holding bytes. It covers what Chakra producers write (the Node
fields of et_def.proto, packed dependency lists, attributes with an integer, bool or string value). Anything
else (an unknown field, a repeated scalar, unpacked deps, a float or list value on an attribute the replay
reads, bytes that protobuf's own parser rejects) raises `Unsupported`, and the caller decodes that file
with protobuf instead, so errors and edge cases keep their one implementation (traces/stream.py).

Attribute fields (most of a trace's bytes) repeat: a trace holds a few hundred distinct ones. They are
grouped by their bytes first (`traces.wire.group_by_bytes`, exact), and only the distinct ones are decoded and handed to
protobuf's parser (`_validate`), which also checks the attributes the replay does not read.

Whole nodes repeat too, across the ranks of a batch: the replicas of a stage hold the same nodes byte for
byte. When a sample says so, the distinct node payloads are decoded once and spread over the nodes holding
each (`_decode_distinct`); else, when attribute regions repeat, each distinct region is walked once
(`_walk_regions`). Either way the columns are those of walking every node (tests/test_columnar_grouping.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from google.protobuf.message import DecodeError
from xsim.traces import pb
from xsim.traces.errors import TraceFormatError
from xsim.traces.et_stream_pb2 import NodeBatch
from xsim.traces.wire import (  # noqa: F401 (F_*, VALUE_KIND, Unsupported: this decoder's public names too)
    ATTR_TAG,
    F_BOOL,
    F_INT32,
    F_INT64,
    F_STRING,
    F_UINT32,
    F_UINT64,
    NODE_ATTR,
    NODE_CTRL_DEPS,
    NODE_DATA_DEPS,
    NODE_DURATION,
    NODE_ID,
    NODE_INPUTS,
    NODE_NAME,
    NODE_OUTPUTS,
    NODE_START,
    NODE_TYPE,
    VALUE_KIND,
    WT_LEN,
    WT_VARINT,
    Unsupported,
    field_keys,
    frame_spans,
    group_by_bytes,
    length_field,
    padded,
    tag,
    varints,
)

_MASK32 = np.uint64(0xFFFFFFFF)
# AttrColumn.kind of a value the columns do not hold: a float, list or bytes value, an integer past int64,
# or the name given twice on one node. Only columns decoded from protobuf messages hold it
# (traces/node_columns.py), and every such value breaks a rule of traces/attrcheck.py, which names it.
F_OTHER = 63

# Node fields by their one-byte tag (field number << 3 | wire type; fields below 16) this decoder walks:
# varints for id, type, start_time_micros, duration_micros; length-delimited for name, the dependency
# lists (packed), inputs, outputs, attr (et_def.proto).
_TAG_OK = np.zeros(256, dtype=bool)
_TAG_OK[[tag(f, WT_VARINT) for f in (NODE_ID, NODE_TYPE, NODE_START, NODE_DURATION)]] = True
_TAG_OK[
    [
        tag(f, WT_LEN)
        for f in (NODE_NAME, NODE_CTRL_DEPS, NODE_DATA_DEPS, NODE_INPUTS, NODE_OUTPUTS, NODE_ATTR)
    ]
] = True
_VALUE_OK = np.zeros(64, dtype=bool)
_VALUE_OK[[0, F_INT32, F_INT64, F_UINT32, F_UINT64, F_BOOL, F_STRING]] = True


# Records of numpy arrays (this one and those below): no generated __eq__ / __hash__ (== on an array is
# elementwise, so they could only raise) and no __repr__ (nothing prints them); each generated method is
# a compile when the module loads, ~0.1 ms of every replay's start-up (docs/performance.md, issue 30
# round 6).
@dataclass(frozen=True, eq=False, repr=False)
class AttrColumn:
    """One attribute name over a file's nodes: -1 kind where absent, else its value field number."""

    kind: np.ndarray  # int8: value field number, 0 = present without a value, -1 = absent
    value: np.ndarray  # int64: integer / bool value (string: index into `strings`)
    strings: tuple[str, ...]
    # With decode_columns(spans=True, or a set naming it): each node's whole attribute field (tag to end) in
    # `buf`, -1 absent.
    field_start: np.ndarray | None = None
    field_end: np.ndarray | None = None


@dataclass(frozen=True, eq=False, repr=False)
class RankColumns:
    """Decoded files: their nodes in file order, file after file, as columns (deps in CSR form)."""

    paths: tuple[str, ...]
    file_ptr: np.ndarray  # nodes of file f are [file_ptr[f], file_ptr[f+1])
    num_nodes: int
    node_id: np.ndarray  # uint64 as int64 (ids >= 2**63 are Unsupported)
    node_type: np.ndarray  # int64
    duration_micros: np.ndarray  # int64
    names: list[str]
    data_ptr: np.ndarray  # CSR: deps of node i are data_idx[data_ptr[i]:data_ptr[i+1]]
    data_idx: np.ndarray
    ctrl_ptr: np.ndarray
    ctrl_idx: np.ndarray
    attrs: dict[str, AttrColumn]  # only the names asked for
    payload_start: np.ndarray  # each node's payload span in `buf` (for the few nodes decoded whole)
    payload_end: np.ndarray
    buf: bytes  # the files' bytes, concatenated
    # With decode_columns(spans=True): each node's frame start (its length prefix) and its name field
    # (tag to end, -1 when absent), for comparing other files against these bytes (replay/fold_bytes.py).
    frame_start: np.ndarray | None = None
    name_start: np.ndarray | None = None
    name_end: np.ndarray | None = None
    # Columns decoded from protobuf messages (traces/node_columns.py) keep them; `buf` is then empty.
    messages: tuple[pb.Node, ...] | None = None

    def node(self, i: int) -> pb.Node:
        """Node i as a protobuf message (for the few readers of whole nodes: a rule's message, a scalar
        compute model)."""
        if self.messages is not None:
            return self.messages[i]
        return pb.Node.FromString(self.buf[int(self.payload_start[i]) : int(self.payload_end[i])])


def _csr(owner: np.ndarray, spans_s: np.ndarray, spans_e: np.ndarray, b: np.ndarray, n: int):
    """Packed varint lists (one span per owner node) into CSR (ptr, values)."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    if len(owner) == 0:
        return ptr, np.zeros(0, dtype=np.int64)
    # Every byte < 0x80 ends a varint: count ends per span, then decode at every start.
    body_len = spans_e - spans_s
    total = int(body_len.sum())
    if total == 0:
        return ptr, np.zeros(0, dtype=np.int64)
    byte_idx = np.repeat(spans_s - np.concatenate(([0], np.cumsum(body_len)[:-1])), body_len) + np.arange(
        total
    )
    bytes_ = b[byte_idx]
    ends = bytes_ < 0x80
    last = np.cumsum(body_len) - 1
    if not ends[last].all():
        raise Unsupported("packed list ends inside a varint")
    end_pos = np.nonzero(ends)[0]
    start_pos = np.concatenate(([0], end_pos[:-1] + 1))
    vals, _ = varints(b, byte_idx[start_pos])
    if (vals >= np.uint64(1 << 63)).any():
        raise Unsupported("dependency id >= 2**63")
    span_of = np.searchsorted(np.cumsum(body_len), end_pos, side="right")
    counts = np.bincount(owner[span_of], minlength=n)
    ptr[1:] = np.cumsum(counts)
    order = np.argsort(owner[span_of], kind="stable")
    return ptr, vals.astype(np.int64)[order]


def _gather(b: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """The bytes of spans [s, e) of b, back to back."""
    n = e - s
    total = int(n.sum())
    return b[np.repeat(s - (np.cumsum(n) - n), n) + np.arange(total)]


def _validate(b: np.ndarray, s: np.ndarray, e: np.ndarray) -> None:
    """Let protobuf's C parser accept the Node fields this decoder does not walk byte by byte (attributes,
    inputs, outputs; each distinct field once), as fields of one Node of a NodeBatch: the depth they have
    in decode_stream's parse. Bytes it rejects go to the protobuf path, which reports them
    (TraceFormatError) exactly as before. Everything else of a node this decoder checks itself, at least
    as strictly as protobuf: field numbers and wire types, varints of at most 10 bytes, lengths inside
    their node, names in UTF-8 (Python's codec and protobuf's utf8_range both follow RFC 3629)."""
    if len(s) == 0:
        return
    if int((e - s).sum()) >= 1 << 30:
        raise Unsupported("too many attribute bytes to check at once")
    body = _gather(b, s, e).tobytes()
    try:
        NodeBatch().ParseFromString(length_field(1, body))  # NodeBatch.nodes
    except DecodeError:
        raise Unsupported("protobuf rejects the bytes") from None


def _names(b: np.ndarray, s: np.ndarray, e: np.ndarray) -> list[str]:
    """Each node's name (its UTF-8 span [s, e), empty when s == e): one decode of all names joined by a
    byte that none of them holds, split again."""
    n = len(s)
    ln = e - s
    if n == 0:
        return []
    if not ln.any():
        return [""] * n
    ln1 = ln + 1
    out_start = np.cumsum(ln1) - ln1
    src = np.repeat(s - out_start, ln1) + np.arange(int(ln1.sum()))
    joined = b[src]
    seps = out_start + ln
    for sep in (0x0A, 0x00, 0x1F, 0x7F):
        joined[seps] = sep
        if np.count_nonzero(joined == sep) == n:  # no name holds it
            try:
                return joined.tobytes().decode("utf-8").split(chr(sep))[:-1]
            except UnicodeDecodeError:
                raise Unsupported("node name is not UTF-8") from None
    buf = b.tobytes()
    try:
        return [buf[i:j].decode("utf-8") for i, j in zip(s.tolist(), e.tolist(), strict=True)]
    except UnicodeDecodeError:
        raise Unsupported("node name is not UTF-8") from None


@dataclass(frozen=True, eq=False, repr=False)
class _Bytes:
    """A batch's bytes twice: `buf` (slices, UTF-8, group_by_bytes' dict) and `b`, the same bytes padded, as
    numpy (varints and group_by_bytes read past span ends)."""

    buf: bytes
    b: np.ndarray


@dataclass(frozen=True, eq=False, repr=False)
class _Units:
    """The units to decode: unit i is the bytes [start[i], end[i]); those of file f are
    [file_ptr[f], file_ptr[f+1])."""

    start: np.ndarray
    end: np.ndarray
    file_ptr: np.ndarray


@dataclass(frozen=True, eq=False, repr=False)
class _Framed:
    """Files' frames over their bytes concatenated: each node's frame start (its length prefix) and end."""

    file_ptr: np.ndarray
    frame_start: np.ndarray
    end: np.ndarray


def decode_columns(
    bufs: list[bytes],
    paths: list[str],
    want: frozenset[str],
    spans: bool | frozenset[str] = False,
    layouts: dict[int, np.ndarray] | None = None,
    group: bool = True,
) -> RankColumns:
    """Decode framed `.et` files (bytes each) into one set of columns; attributes outside `want` skipped.

    spans: also keep where each node's frame, name field and wanted attribute fields lie in `buf`; a set of
    names keeps the field spans of those attributes only (16 bytes per node and attribute: a fold's byte
    template swaps four of the fourteen the replay reads).
    layouts: frame starts of files already framed, by file size (frame_spans' `like`), shared by the calls
    of one trace set; files framed here are added.
    group: decode each distinct node payload of the batch once (the ranks of a replicated set hold the
    same nodes), else each distinct attribute region (a node's attribute fields, which writers put last);
    False walks every node's fields (the reference the tests compare with). Same columns either way.
    """
    framed = _frame(bufs, paths, {} if layouts is None else layouts)
    buf = b"".join(bufs)
    src = _Bytes(buf, padded(buf))
    _, payload_start = varints(src.b, framed.frame_start)  # skip each frame's length prefix
    if ((framed.end - payload_start) >= (1 << 31) - 1).any():
        raise Unsupported("a node of 2 GiB")  # protobuf's limit for one message
    units = _Units(payload_start, framed.end, framed.file_ptr)
    span_attrs = None if spans is False else want if spans is True else spans
    nodes = _decode_distinct(src, units, want, span_attrs) if group else None
    if nodes is None:
        nodes = _decode_nodes(src, units, want, span_attrs, group)
    return RankColumns(
        paths=tuple(paths),
        file_ptr=framed.file_ptr,
        num_nodes=int(framed.file_ptr[-1]),
        node_id=nodes.node_id,
        node_type=nodes.node_type,
        duration_micros=nodes.duration_micros,
        names=nodes.names,
        data_ptr=nodes.data_ptr,
        data_idx=nodes.data_idx,
        ctrl_ptr=nodes.ctrl_ptr,
        ctrl_idx=nodes.ctrl_idx,
        attrs=nodes.attrs,
        payload_start=payload_start,
        payload_end=framed.end,
        buf=buf,
        frame_start=framed.frame_start if span_attrs is not None else None,
        name_start=nodes.name_start,
        name_end=nodes.name_end,
    )


def _frame(bufs: list[bytes], paths: list[str], layouts: dict[int, np.ndarray]) -> _Framed:
    """Every node's frame in the files, at its offset in their concatenation (layouts: updated)."""
    hs_l, end_l, counts = [], [], []
    base = 0
    for buf, path in zip(bufs, paths, strict=True):
        if not buf:
            raise TraceFormatError("empty file: no GlobalMetadata", path=path, offset=0)
        fh, fe = frame_spans(buf, path, like=layouts.get(len(buf)))
        if len(layouts) >= _MAX_LAYOUTS or sum(map(len, layouts.values())) > _MAX_LAYOUT_FRAMES:
            layouts.clear()
        layouts[len(buf)] = fh
        counts.append(len(fh) - 1)
        hs_l.append(fh[1:] + base)
        end_l.append(fe[1:] + base)
        base += len(buf)
    file_ptr = np.zeros(len(bufs) + 1, dtype=np.int64)
    file_ptr[1:] = np.cumsum(counts)
    hs = np.concatenate(hs_l) if hs_l else np.zeros(0, dtype=np.int64)
    end = np.concatenate(end_l) if end_l else np.zeros(0, dtype=np.int64)
    return _Framed(file_ptr, hs, end)


@dataclass(frozen=True, eq=False, repr=False)
class _Nodes:
    """What _decode_nodes reads from nodes' bytes (RankColumns' per-node columns)."""

    node_id: np.ndarray
    node_type: np.ndarray
    duration_micros: np.ndarray
    names: list[str]
    data_ptr: np.ndarray
    data_idx: np.ndarray
    ctrl_ptr: np.ndarray
    ctrl_idx: np.ndarray
    attrs: dict[str, AttrColumn]
    name_start: np.ndarray | None  # name field (tag to end), -1 when absent; None when not asked for
    name_end: np.ndarray | None


@dataclass(frozen=True, eq=False, repr=False)
class _Fields:
    """Non-attribute fields a _walk met, flat: unit, tag byte, field start, varint value (a length for
    length-delimited fields), value start, next field's start."""

    unit: np.ndarray
    tag: np.ndarray
    pos: np.ndarray
    val: np.ndarray
    vs: np.ndarray
    nxt: np.ndarray


@dataclass(frozen=True, eq=False, repr=False)
class _AttrFields:
    """Attribute fields a _walk met, flat: unit, field start (its tag), value start, next field's start,
    their field_keys (None when there are none) and, when asked for, the round of each."""

    unit: np.ndarray
    pos: np.ndarray
    vs: np.ndarray
    nxt: np.ndarray
    keys: tuple[np.ndarray, ...] | None
    rounds: np.ndarray | None


@dataclass(frozen=True, eq=False, repr=False)
class _Walk:
    """A _walk's result; with cut, each unit's first attribute field (-1 without) and its round."""

    fields: _Fields
    attrs: _AttrFields
    cut_at: np.ndarray | None
    cut_round: np.ndarray | None


def _decode_nodes(
    src: _Bytes, units: _Units, want: frozenset[str], spans: frozenset[str] | None, regions: bool
) -> _Nodes:
    """The columns of the nodes whose payloads are `units` (regions: walk each distinct attribute region
    once when a sample says it pays; spans: keep the name spans and those attributes' field spans)."""
    n = len(units.start)
    walked = _walk_regions(src, units) if regions else None
    if walked is None:
        w = _walk(src.b, np.nonzero(units.end > units.start)[0], units.start, units.end, cut=False)
        f, a, reg = w.fields, w.attrs, None
    else:
        f, a, reg = walked
    fi = (f.tag >> 3).astype(np.int64)
    one = fi <= 7  # singular fields, and the dependency lists (which writers pack into one field)
    if one.any() and np.bincount(f.unit[one] * 8 + fi[one]).max() > 1:
        raise Unsupported("a singular Node field appears twice")
    nid, ntype, dur = _varint_fields(f, fi, n)
    kn = np.nonzero(fi == NODE_NAME)[0]
    name_e = np.zeros(n, dtype=np.int64)
    name_tag = np.full(n, -1, dtype=np.int64)
    name_e[f.unit[kn]] = f.nxt[kn]
    name_tag[f.unit[kn]] = f.pos[kn]
    ctrl = _dep_list(src.b, f, fi == NODE_CTRL_DEPS, n)
    data = _dep_list(src.b, f, fi == NODE_DATA_DEPS, n)
    names = _node_names(src, f, kn, n)
    if reg is None:
        attrs, distinct = _decode_attrs(src, n, a, want, spans)
    else:
        attrs, distinct = _decode_attrs(src, reg.count, a, want, spans)
        attrs = {nm: reg.to_nodes(col, n) for nm, col in attrs.items()}
    io = np.nonzero((fi == NODE_INPUTS) | (fi == NODE_OUTPUTS))[0]
    cat = np.concatenate
    _validate(src.b, cat((a.pos[distinct], f.pos[io])), cat((a.nxt[distinct], f.nxt[io])))
    return _Nodes(
        node_id=nid.astype(np.int64),
        node_type=ntype.astype(np.int64),
        duration_micros=dur.astype(np.int64),
        names=names,
        data_ptr=data[0],
        data_idx=data[1],
        ctrl_ptr=ctrl[0],
        ctrl_idx=ctrl[1],
        attrs=attrs,
        name_start=name_tag if spans is not None else None,
        name_end=np.where(name_tag >= 0, name_e, -1) if spans is not None else None,
    )


def _varint_fields(f: _Fields, fi: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each node's id, type and duration_micros (uint64; 0 when absent), checked against the int64 ranges
    the columns hold."""
    out = []
    for number in (NODE_ID, NODE_TYPE, NODE_DURATION):
        arr = np.zeros(n, dtype=np.uint64)
        k = np.nonzero(fi == number)[0]
        arr[f.unit[k]] = f.val[k]
        out.append(arr)
    nid, ntype, dur = out
    if (nid >= np.uint64(1 << 63)).any() or (dur >= np.uint64(1 << 43)).any():
        raise Unsupported("id or duration out of the int64 range")
    if (ntype > np.uint64(1 << 31)).any():
        raise Unsupported("node type out of range")
    return nid, ntype, dur


def _dep_list(b: np.ndarray, f: _Fields, is_list: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """One dependency list (the fields where is_list) of every node, in CSR form."""
    k = np.nonzero(is_list)[0]
    if len(k):
        return _csr(f.unit[k], f.vs[k], f.nxt[k], b, n)
    return np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)


def _node_names(src: _Bytes, f: _Fields, kn: np.ndarray, n: int) -> list[str]:
    """Each node's name ('' without), from its name field (fields kn)."""
    if not len(kn):
        return [""] * n
    # Names repeat over ranks (the same op on every replica): the distinct name fields are decoded once.
    code, first = group_by_bytes(src.buf, src.b, f.pos[kn], f.nxt[kn])
    uniq = np.asarray(_names(src.b, f.vs[kn][first], f.nxt[kn][first]), dtype=object)
    named = np.full(n, "", dtype=object)
    named[f.unit[kn]] = uniq[code]
    return named.tolist()


def _decode_distinct(
    src: _Bytes, units: _Units, want: frozenset[str], spans: frozenset[str] | None
) -> _Nodes | None:
    """_decode_nodes of the distinct node payloads only, spread over the nodes holding each: the ranks of
    a replicated set hold the same nodes (the same ids, names, dependencies and attributes on every
    replica of a stage). None when a sample (every _SAMPLE_EVERY-th node of each file) is mostly distinct,
    as on a set whose ranks differ in every node (Table 4's device_group)."""
    grouped = _distinct_payloads(src, units)
    if grouped is None:
        return None
    code, first = grouped
    ps = units.start[first]
    one = _decode_nodes(src, _Units(ps, units.end[first], np.array([0, len(first)])), want, spans, True)
    return _spread(one, code, units.start - ps[code], spans)


def _distinct_payloads(src: _Bytes, units: _Units) -> tuple[np.ndarray, np.ndarray] | None:
    """group_by_bytes of the node payloads; None when a sample, or the whole, is mostly distinct."""
    s, e, file_ptr = units.start, units.end, units.file_ptr
    n = len(s)
    if n == 0:
        return None
    local = np.arange(n) - np.repeat(file_ptr[:-1], np.diff(file_ptr))
    pick = np.nonzero(local % _SAMPLE_EVERY == 0)[0]
    if len(group_by_bytes(src.buf, src.b, s[pick], e[pick])[1]) > _MAX_DISTINCT * len(pick):
        return None
    code, first = group_by_bytes(src.buf, src.b, s, e, like=_same_as_previous_file(src.b, s, e, file_ptr))
    if len(first) > _MAX_DISTINCT * n:
        return None
    return code, first


def _spread(one: _Nodes, code: np.ndarray, shift: np.ndarray, spans: frozenset[str] | None) -> _Nodes:
    """The columns of distinct nodes `one` over the nodes holding each (node i holds distinct node code[i],
    its bytes `shift[i]` after that one's)."""

    def moved(at: np.ndarray) -> np.ndarray:
        x = at[code]
        return np.where(x >= 0, x + shift, -1)

    attrs = {}
    for nm, col in one.attrs.items():
        fs = fe = None
        if col.field_start is not None:
            fs, fe = moved(col.field_start), moved(col.field_end)
        attrs[nm] = AttrColumn(col.kind[code], col.value[code], col.strings, fs, fe)
    data_ptr, data_idx = _spread_csr(one.data_ptr, one.data_idx, code)
    ctrl_ptr, ctrl_idx = _spread_csr(one.ctrl_ptr, one.ctrl_idx, code)
    return _Nodes(
        node_id=one.node_id[code],
        node_type=one.node_type[code],
        duration_micros=one.duration_micros[code],
        names=list(map(one.names.__getitem__, code.tolist())),
        data_ptr=data_ptr,
        data_idx=data_idx,
        ctrl_ptr=ctrl_ptr,
        ctrl_idx=ctrl_idx,
        attrs=attrs,
        name_start=moved(one.name_start) if spans is not None else None,
        name_end=moved(one.name_end) if spans is not None else None,
    )


def _spread_csr(ptr: np.ndarray, idx: np.ndarray, code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A CSR list over distinct nodes as the same list over the nodes holding each (node i: code[i])."""
    cnt = np.diff(ptr)[code]
    out = np.zeros(len(code) + 1, dtype=np.int64)
    np.cumsum(cnt, out=out[1:])
    total = int(out[-1])
    src = np.repeat(ptr[:-1][code] - out[:-1], cnt) + np.arange(total)
    return out, idx[src]


# Frame layouts kept per trace set (by file size): a set has a few sizes per role (the 512-rank Llama-2 set
# has 7 among the 32 ranks of a replica, 19 in all). Past this many layouts, or frames (32 MB of starts),
# the cache starts over: bounded memory, at worst the loop of frame_spans again.
_MAX_LAYOUTS = 256
_MAX_LAYOUT_FRAMES = 1 << 22


def _walk(
    b: np.ndarray, act: np.ndarray, start: np.ndarray, lim: np.ndarray, cut: bool, rounds: bool = False
) -> _Walk:
    """The fields of units (nodes, or attribute regions) `act`, each its bytes [start, lim) of b, walked
    in rounds: each round reads the next field of every unit that has one left.

    The non-attribute and the attribute fields come out flat in (round, unit) order (with `rounds`, the
    round of each attribute field too); with cut, each unit's walk stops at its first attribute field
    (its attribute region is walked apart), which is returned with its round.
    """
    pos, lim = start[act], lim[act]
    fields: list[tuple[np.ndarray, ...]] = []
    attrs: list[tuple] = []
    cut_at = cut_round = None
    if cut:
        cut_at = np.full(len(start), -1, dtype=np.int64)
        cut_round = np.zeros(len(start), dtype=np.int64)
    rnd = 0
    while len(act):
        t, v, p2, nxt = _next_fields(b, pos, lim)
        is_attr = t == ATTR_TAG
        more = nxt < lim
        row = (act, t, pos, v, p2, nxt)
        if not is_attr.any():
            fields.append(row)
        elif cut:
            ca = act[is_attr]
            cut_at[ca] = pos[is_attr]
            cut_round[ca] = rnd
            other = ~is_attr
            fields.append(tuple(x[other] for x in row))
            more &= other
        elif is_attr.all():
            attrs.append(_attr_part(b, (act, pos, p2, nxt), rnd if rounds else None))
        else:
            attrs.append(
                _attr_part(
                    b, (act[is_attr], pos[is_attr], p2[is_attr], nxt[is_attr]), rnd if rounds else None
                )
            )
            other = ~is_attr
            fields.append(tuple(x[other] for x in row))
        act, pos, lim = act[more], nxt[more], lim[more]
        rnd += 1
    return _Walk(_joined_fields(fields), _joined_attrs(attrs, rounds), cut_at, cut_round)


def _next_fields(b: np.ndarray, pos: np.ndarray, lim: np.ndarray) -> tuple[np.ndarray, ...]:
    """The fields starting at `pos` (each inside [pos, lim)): tag byte, varint value, value start, end."""
    t = b[pos]
    if not _TAG_OK[t].all():
        raise Unsupported("field outside the Node schema")
    v, p2 = varints(b, pos + 1)
    ln = np.where((t & 7) == 2, v, np.uint64(0))
    if (ln >= np.uint64(1 << 31)).any():
        raise Unsupported("field length")
    nxt = p2 + ln.astype(np.int64)
    if (nxt > lim).any():
        raise Unsupported("field runs past its node")
    return t, v, p2, nxt


def _attr_part(b: np.ndarray, part: tuple[np.ndarray, ...], rnd: int | None) -> tuple:
    """One round's attribute fields (unit, start, value start, end) with their field_keys and round."""
    unit, pos, _vs, nxt = part
    keys = field_keys(b, pos, nxt)  # while these bytes are in the caches
    return (*part, keys, None if rnd is None else np.full(len(unit), rnd, dtype=np.int64))


def _joined_fields(parts: list[tuple[np.ndarray, ...]]) -> _Fields:
    """The rounds' non-attribute fields as one flat _Fields."""
    if not parts:
        z = np.zeros(0, dtype=np.int64)
        return _Fields(z, np.zeros(0, dtype=np.uint8), z, np.zeros(0, dtype=np.uint64), z, z)
    return _Fields(*(np.concatenate(col) for col in zip(*parts, strict=True)))


def _joined_attrs(parts: list[tuple], rounds: bool) -> _AttrFields:
    """The rounds' attribute fields as one flat _AttrFields."""
    if not parts:
        z = np.zeros(0, dtype=np.int64)
        return _AttrFields(z, z, z, z, None, z)
    cat = np.concatenate
    keys = tuple(cat([p[4][j] for p in parts]) for j in range(3))
    unit, pos, vs, nxt = (cat([p[j] for p in parts]) for j in range(4))
    return _AttrFields(unit, pos, vs, nxt, keys, cat([p[5] for p in parts]) if rounds else None)


@dataclass(frozen=True, eq=False, repr=False)
class _Regions:
    """Nodes' attribute regions grouped by their bytes: node `nodes[i]` holds distinct region `code[i]`,
    which starts at `shift[i]` bytes after that region's first holder's."""

    count: int
    nodes: np.ndarray
    code: np.ndarray
    shift: np.ndarray

    def to_nodes(self, col: AttrColumn, n: int) -> AttrColumn:
        """A column over distinct regions as the same column over the n nodes."""
        if len(self.nodes) == n:  # every node holds attributes (the usual case): one gather per column
            kind, value = col.kind[self.code], col.value[self.code]
        else:
            kind = np.full(n, -1, dtype=np.int8)
            value = np.zeros(n, dtype=np.int64)
            kind[self.nodes] = col.kind[self.code]
            value[self.nodes] = col.value[self.code]
        fs = fe = None
        if col.field_start is not None:
            fs = np.full(n, -1, dtype=np.int64)
            fe = np.full(n, -1, dtype=np.int64)
            s = col.field_start[self.code]
            has = s >= 0
            fs[self.nodes] = np.where(has, s + self.shift, -1)
            fe[self.nodes] = np.where(has, col.field_end[self.code] + self.shift, -1)
        return AttrColumn(kind, value, col.strings, fs, fe)


# Grouping (of whole node payloads, then of attribute regions) is tried when at most _MAX_DISTINCT of a
# sample (every _SAMPLE_EVERY-th node of each file: the same op sits at the same index on every replica)
# is distinct. Measured (docs/performance.md): Table 4 C13, whose ranks differ in every node's
# device_group, has 100% of its nodes and 80% of its regions distinct (grouping would cost more than it
# saves); the 512-rank Llama-2 set 15% of its nodes per 2 MB batch (decoding ~2x faster).
_SAMPLE_EVERY = 32
_MAX_DISTINCT = 0.5


def _walk_regions(src: _Bytes, units: _Units) -> tuple[_Fields, _AttrFields, _Regions] | None:
    """_walk for nodes whose attribute fields end them (as protobuf writes a Node: field 10 is its last):
    each node is walked up to its first attribute field, its attribute region (that field to the node's
    end) is grouped with the byte-identical ones of other nodes (across ranks: the same op on every
    replica), and only the distinct regions are walked. Returns (non-attribute fields, attribute fields
    of the distinct regions, _Regions), the attribute fields ordered by the first (round, node) at which
    _walk over all nodes meets each (so distinct attributes and string tables come out in _walk's order);
    None when a region holds another field, or when a sample says grouping would not pay."""
    b, start, end, file_ptr = src.b, units.start, units.end, units.file_ptr
    act = np.nonzero(end > start)[0]
    # A sample first (every _SAMPLE_EVERY-th node of each file): when most of its regions
    # are distinct, grouping them all would not pay, and every node's fields are walked instead.
    local = np.arange(len(start)) - np.repeat(file_ptr[:-1], np.diff(file_ptr))
    pick = act[local[act] % _SAMPLE_EVERY == 0]
    cut_at = _walk(b, pick, start, end, cut=True).cut_at
    some = np.nonzero(cut_at >= 0)[0]
    if len(group_by_bytes(src.buf, b, cut_at[some], end[some])[1]) > _MAX_DISTINCT * len(some):
        return None
    w = _walk(b, act, start, end, cut=True)
    held = np.nonzero(w.cut_at >= 0)[0]
    rs, re = w.cut_at[held], end[held]
    code, first = group_by_bytes(src.buf, b, rs, re)
    d = len(first)
    r = _walk(b, np.arange(d), rs[first], re[first], cut=False, rounds=True)
    if len(r.fields.unit):
        return None  # a field after an attribute: every node's fields are walked instead
    a = r.attrs
    if len(a.unit):
        a = _in_first_seen_order(a, code, held, w.cut_round[held])
    return w.fields, a, _Regions(d, held, code, rs - rs[first][code])


def _in_first_seen_order(a: _AttrFields, code: np.ndarray, held: np.ndarray, pre: np.ndarray) -> _AttrFields:
    """The distinct regions' attribute fields `a` ordered by the (round, node) of each region's first
    appearance: least round, then least node (node held[i] holds region code[i], which starts in round
    pre[i] of its node's walk)."""
    d = int(code.max()) + 1
    pre_best = np.full(d, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(pre_best, code, pre)
    at = np.nonzero(pre == pre_best[code])[0][::-1]
    node_best = np.empty(d, dtype=np.int64)
    node_best[code[at]] = held[at]  # the last write wins: the least node
    order = np.lexsort((node_best[a.unit], pre_best[a.unit] + a.rounds))
    keys = tuple(k[order] for k in a.keys)
    return _AttrFields(a.unit[order], a.pos[order], a.vs[order], a.nxt[order], keys, a.rounds[order])


_EIGHT = np.arange(8, dtype=np.int64)


def _same_as_previous_file(b: np.ndarray, s: np.ndarray, e: np.ndarray, file_ptr: np.ndarray) -> np.ndarray:
    """For each span [s, e) of a file, the span at its index in the previous file when the two hold the same
    bytes, else -1. The replicas of a batch sit side by side (a TP group's ranks: on the 512-rank Llama-2
    set every repeated node payload repeats the one at its index in the previous file), so one numpy
    comparison of two files' bytes settles most spans; a file whose spans do not lie as the previous
    file's do (the same lengths at one fixed distance) is left to group_by_bytes' dict."""
    like = np.full(len(s), -1, dtype=np.int64)
    fp = file_ptr.tolist()
    for g in range(1, len(fp) - 1):
        a0, a1, b0, b1 = fp[g - 1], fp[g], fp[g], fp[g + 1]
        if b1 == b0 or a1 - a0 != b1 - b0:
            continue
        sp, ep, sc, ec = s[a0:a1], e[a0:a1], s[b0:b1], e[b0:b1]
        d = int(sc[0] - sp[0])
        if not ((sc - sp == d).all() and (ec - ep == d).all()):
            continue
        lo, hi = int(sc.min()), int(ec.max())
        # The two ranges compared 8 bytes at a time (b is padded past its end), then the bytes of the
        # words that differ: the offsets from lo of every byte that differs, ascending.
        m = (hi - lo + 7) >> 3
        w = np.flatnonzero(b[lo : lo + 8 * m].view(np.uint64) != b[lo - d : lo - d + 8 * m].view(np.uint64))
        if len(w):
            p = (w[:, None] * 8 + _EIGHT).ravel()
            p = p[b[lo + p] != b[lo - d + p]]
            ok = np.flatnonzero(np.searchsorted(p, ec - lo) == np.searchsorted(p, sc - lo))
        else:
            ok = np.arange(b1 - b0)
        like[b0 + ok] = a0 + ok
    return like


@dataclass(frozen=True, eq=False, repr=False)
class _Inner:
    """The fields inside each distinct attribute: its name's span (-1 when absent), its value's field number
    (0 when none), how many value fields it holds, the value's raw varint and its span."""

    name_s: np.ndarray
    name_e: np.ndarray
    vkind: np.ndarray
    nvals: np.ndarray
    vraw: np.ndarray
    vs: np.ndarray
    ve: np.ndarray


@dataclass(frozen=True, eq=False, repr=False)
class _AttrTable:
    """A batch's attribute fields grouped by their bytes, for the wanted columns over n units: field i is
    distinct attribute code[i], whose name is distinct name ncode[code[i]]."""

    src: _Bytes
    n: int
    fields: _AttrFields
    code: np.ndarray
    inner: _Inner
    ncode: np.ndarray
    val: np.ndarray  # each distinct attribute's integer or bool value as int64 (strings: per column)
    spans: frozenset[str] | None  # the wanted attributes whose field spans are kept


def _decode_attrs(
    src: _Bytes, n: int, a: _AttrFields, want: frozenset[str], spans: frozenset[str] | None
) -> tuple[dict[str, AttrColumn], np.ndarray]:
    """Attribute columns over n units for the names in `want` (each at most once per unit), and the first
        field of each distinct attribute (an index into a), for _validate.

        Fields are grouped by their bytes (tag to end) first: a trace repeats a few hundred distinct attributes
        over and over, and only the distinct ones are decoded. With spans, the field span of each wanted attribute
    named there.
    """
    if len(a.unit) == 0:
        return {}, np.zeros(0, dtype=np.int64)
    code, first = group_by_bytes(src.buf, src.b, a.pos, a.nxt, keys=a.keys)
    inner = _inner_fields(src.b, a.vs[first], a.nxt[first])
    ncode, names = _attr_names(src, inner)
    wanted = [ci for ci, nm in enumerate(names) if nm in want]
    if not wanted:
        return {}, first
    tab = _AttrTable(src, n, a, code, inner, ncode, _int_values(inner), spans)
    # The fields grouped by name: one stable sort of small codes.
    fname = ncode[code]
    order = np.argsort(fname.astype(np.int16) if len(names) < 1 << 15 else fname, kind="stable")
    bounds = np.searchsorted(fname[order], np.arange(len(names) + 1))
    out: dict[str, AttrColumn] = {}
    for ci in wanted:
        out[names[ci]] = _attr_column(tab, ci, names[ci], order[bounds[ci] : bounds[ci + 1]])
    return out, first


def _inner_fields(b: np.ndarray, ds: np.ndarray, de: np.ndarray) -> _Inner:
    """Walk the fields inside the distinct attributes (values [ds, de) of b), all of them a field a round."""
    d = len(ds)
    name_s = np.full(d, -1, dtype=np.int64)
    name_e = np.full(d, -1, dtype=np.int64)
    vkind = np.zeros(d, dtype=np.int64)  # value field number, 0 = none
    nvals = np.zeros(d, dtype=np.int64)
    vraw = np.zeros(d, dtype=np.uint64)
    vs = np.zeros(d, dtype=np.int64)
    ve = np.zeros(d, dtype=np.int64)
    cur = ds.copy()
    act = np.nonzero(cur < de)[0]
    while len(act):
        tg, p = varints(b, cur[act])
        f = (tg >> np.uint64(3)).astype(np.int64)
        wt = tg & np.uint64(7)
        nxt = np.empty(len(act), dtype=np.int64)
        w0, w2 = wt == 0, wt == 2
        w1, w5 = wt == 1, wt == 5
        if not (w0 | w1 | w2 | w5).all():
            raise Unsupported("attribute wire type")
        v = np.zeros(len(act), dtype=np.uint64)
        p2 = p.copy()
        sel = w0 | w2
        if sel.any():
            vv, pp = varints(b, p[sel])
            v[sel] = vv
            p2[sel] = pp
        nxt[w0] = p2[w0]
        if (w2 & (v >= np.uint64(1 << 31))).any():
            raise Unsupported("attribute length")
        nxt[w2] = p2[w2] + v[w2].astype(np.int64)
        nxt[w1] = p[w1] + 8
        nxt[w5] = p[w5] + 4
        if (nxt > de[act]).any():
            raise Unsupported("attribute field runs past its attribute")
        a = act
        mname = (f == 1) & w2
        if (mname & (name_s[a] >= 0)).any():
            raise Unsupported("attribute name twice")
        name_s[a[mname]] = p2[mname]
        name_e[a[mname]] = nxt[mname]
        isval = f >= 3
        nvals[a[isval]] += 1
        vkind[a[isval]] = f[isval]
        vraw[a[isval]] = v[isval]
        vs[a[isval]] = p2[isval]
        ve[a[isval]] = nxt[isval]
        cur[a] = nxt
        act = a[nxt < de[a]]
    return _Inner(name_s, name_e, vkind, nvals, vraw, vs, ve)


def _attr_names(src: _Bytes, inner: _Inner) -> tuple[np.ndarray, list[str]]:
    """Each distinct attribute's name as a code into the distinct names (an absent name reads as '')."""
    name_s, name_e = inner.name_s, inner.name_e
    if (name_s < 0).any():
        name_s = np.where(name_s < 0, 0, name_s)
        name_e = np.where(name_e < 0, 0, name_e)
    ncode, nfirst = group_by_bytes(src.buf, src.b, name_s, name_e)
    try:
        names = [
            src.buf[i:j].decode("utf-8")
            for i, j in zip(name_s[nfirst].tolist(), name_e[nfirst].tolist(), strict=True)
        ]
    except UnicodeDecodeError:
        raise Unsupported("string field is not UTF-8") from None
    return ncode, names


def _int_values(inner: _Inner) -> np.ndarray:
    """Each distinct attribute's integer or bool value as an int64, by its value's field type."""
    vkind, vraw = inner.vkind, inner.vraw
    val = np.zeros(len(vkind), dtype=np.int64)
    mk = vkind == F_INT64
    val[mk] = vraw[mk].view(np.int64)
    mk = vkind == F_INT32
    val[mk] = (vraw[mk] & _MASK32).astype(np.uint32).view(np.int32).astype(np.int64)
    mk = vkind == F_UINT32
    val[mk] = (vraw[mk] & _MASK32).astype(np.int64)
    mk = vkind == F_UINT64
    val[mk] = vraw[mk].astype(np.int64)
    mk = vkind == F_BOOL
    val[mk] = (vraw[mk] != 0).astype(np.int64)
    return val


def _attr_column(tab: _AttrTable, ci: int, nm: str, sel: np.ndarray) -> AttrColumn:
    """The column of attribute name nm (distinct name ci), whose fields are `sel`."""
    inner, n = tab.inner, tab.n
    owners = tab.fields.unit[sel]
    if len(owners) > 1 and np.bincount(owners, minlength=n).max() > 1:
        raise Unsupported(f"attribute {nm!r} twice on one node")
    dc = np.nonzero(tab.ncode == ci)[0]  # its distinct attributes
    if (inner.nvals[dc] > 1).any():
        raise Unsupported("attribute with two values")
    k = inner.vkind[dc]
    if not _VALUE_OK[np.minimum(k, 63)].all():
        raise Unsupported(f"attribute {nm!r} of a kind left to protobuf")
    if ((k == F_UINT64) & (inner.vraw[dc] >= np.uint64(1 << 63))).any():
        raise Unsupported("uint64 attribute beyond int64")
    dval, strings = _string_values(tab, dc[k == F_STRING])
    c = tab.code[sel]
    kind = np.full(n, -1, dtype=np.int8)
    value = np.zeros(n, dtype=np.int64)
    kind[owners] = inner.vkind[c]
    value[owners] = dval[c]
    fs = fe = None
    if tab.spans is not None and nm in tab.spans:
        fs = np.full(n, -1, dtype=np.int64)
        fe = np.full(n, -1, dtype=np.int64)
        fs[owners] = tab.fields.pos[sel]
        fe[owners] = tab.fields.nxt[sel]
    return AttrColumn(kind, value, strings, fs, fe)


def _string_values(tab: _AttrTable, sc: np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
    """The distinct attributes' values with string ones (sc) as indices into one name's string table, in
    the order of first appearance, and that table."""
    if not len(sc):
        return tab.val, ()
    dval = tab.val.copy()
    table: dict[str, int] = {}
    b, inner = tab.src.b, tab.inner
    try:
        for i, x, y in zip(sc.tolist(), inner.vs[sc].tolist(), inner.ve[sc].tolist(), strict=True):
            dval[i] = table.setdefault(b[x:y].tobytes().decode("utf-8"), len(table))
    except UnicodeDecodeError:
        raise Unsupported("string field is not UTF-8") from None
    return dval, tuple(table)
