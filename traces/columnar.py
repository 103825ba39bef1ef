"""Columnar decoding of one rank's `.et` bytes: every node's fields as numpy arrays, no message per node.

The protobuf wire format is walked with numpy, all nodes of a file at once, one field per round: a round
reads the next tag of every node still holding bytes. It covers what Chakra producers write (the Node
fields of et_def.proto, packed dependency lists, attributes with an integer, bool or string value). Anything
else (an unknown field, a repeated scalar, unpacked deps, a float or list value on an attribute the replay
reads, bytes that protobuf's own parser rejects, which is checked first) raises `Unsupported`, and the caller decodes that file with protobuf
instead, so errors and edge cases keep their one implementation (traces/stream.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from google.protobuf.message import DecodeError

from traces.errors import TraceFormatError
from traces.et_stream_pb2 import NodeBatch
from traces.stream import frame_offsets

# AttributeProto value field numbers this decoder turns into values (et_def.proto).
F_INT32, F_INT64, F_UINT32, F_UINT64, F_BOOL, F_STRING = 7, 9, 11, 13, 27, 29
VALUE_KIND = {
    F_INT32: "int32_val",
    F_INT64: "int64_val",
    F_UINT32: "uint32_val",
    F_UINT64: "uint64_val",
    F_BOOL: "bool_val",
    F_STRING: "string_val",
}
_MASK32 = np.uint64(0xFFFFFFFF)
# Node fields (number, wire type 0 = varint / 2 = length-delimited) of et_def.proto; [field, min(wt, 3)].
_NODE_FIELD_OK = np.zeros((64, 4), dtype=bool)
_NODE_FIELD_OK[[1, 3, 6, 7], 0] = True
_NODE_FIELD_OK[[2, 4, 5, 8, 9, 10], 2] = True


_VALUE_OK = np.zeros(64, dtype=bool)
_VALUE_OK[[0, F_INT32, F_INT64, F_UINT32, F_UINT64, F_BOOL, F_STRING]] = True


class Unsupported(Exception):
    """The bytes use a form this decoder leaves to protobuf (not an error in the trace)."""


@dataclass(frozen=True)
class AttrColumn:
    """One attribute name over a file's nodes: -1 kind where absent, else its value field number."""

    kind: np.ndarray  # int8: value field number, 0 = present without a value, -1 = absent
    value: np.ndarray  # int64: integer / bool value (string: index into `strings`)
    strings: tuple[str, ...]
    # With decode_columns(spans=True): each node's whole attribute field (tag to end) in `buf`, -1 absent.
    field_start: np.ndarray | None = None
    field_end: np.ndarray | None = None


@dataclass(frozen=True)
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


def _varints(b: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decode one varint at each position; returns (values as uint64, positions after them)."""
    byte = b[pos]
    val = (byte & 0x7F).astype(np.uint64)
    end = pos + 1
    cont = byte >= 0x80
    if not cont.any():
        return val, end
    idx = np.nonzero(cont)[0]
    p = end[idx]
    for k in range(1, 10):
        byte = b[p]
        val[idx] |= (byte & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        end[idx] = p + 1
        cont = byte >= 0x80
        if not cont.any():
            return val, end
        idx = idx[cont]
        p = p[cont] + 1
    raise Unsupported("varint longer than 10 bytes")


def _words(b: np.ndarray) -> np.ndarray:
    """Every byte offset of `b` read as a little-endian uint64 (a strided view, no copy; b is padded)."""
    return np.ndarray(shape=(len(b) - 7,), dtype="<u8", buffer=b, offset=0, strides=(1,))


def _span_keys(b: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Per span (length, first 8 bytes, last 8 bytes) as 3 uint64 columns: exact for spans up to 16 bytes."""
    n = e - s
    w = _words(b)
    out = np.empty((len(s), 3), dtype=np.uint64)
    out[:, 0] = n
    short = n < 8
    sh = (np.minimum(n, 8) * 8).astype(np.uint64)
    mask = np.where(short, (np.uint64(1) << (sh & np.uint64(63))) - np.uint64(1), ~np.uint64(0))
    out[:, 1] = w[s] & mask
    out[:, 2] = np.where(short, np.uint64(0), w[np.maximum(e - 8, s)])
    return out


def _intern(buf: bytes, b: np.ndarray, s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """(code per span, distinct strings): spans with equal bytes get one code."""
    if len(s) == 0:
        return np.zeros(0, dtype=np.int64), []
    keys = _span_keys(b, s, e)
    h = keys[:, 0] * np.uint64(0x9E3779B97F4A7C15) ^ keys[:, 1] * np.uint64(1099511628211) ^ keys[:, 2]
    order = np.argsort(h, kind="stable")
    hs = h[order]
    brk = np.ones(len(hs), dtype=bool)
    brk[1:] = hs[1:] != hs[:-1]
    grp = np.cumsum(brk) - 1
    first = order[brk]
    inv = np.empty(len(s), dtype=np.int64)
    inv[order] = grp
    if not (keys == keys[first][inv]).all():
        raise Unsupported("distinct strings share a key")
    long_ = (e - s)[first] > 16
    try:
        strings = [buf[int(s[i]) : int(e[i])].decode("utf-8") for i in first.tolist()]
    except UnicodeDecodeError:
        raise Unsupported("string field is not UTF-8") from None
    if long_.any():  # longer strings: the key covers 16 of their bytes; compare the rest exactly
        for gi in np.nonzero(long_)[0].tolist():
            want = strings[gi].encode("utf-8")
            for i in np.nonzero(inv == gi)[0].tolist():
                if buf[int(s[i]) : int(e[i])] != want:
                    raise Unsupported("long strings differ beyond their key")
    return inv, strings


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
    vals, _ = _varints(b, byte_idx[start_pos])
    if (vals >= np.uint64(1 << 63)).any():
        raise Unsupported("dependency id >= 2**63")
    span_of = np.searchsorted(np.cumsum(body_len), end_pos, side="right")
    counts = np.bincount(owner[span_of], minlength=n)
    ptr[1:] = np.cumsum(counts)
    order = np.argsort(owner[span_of], kind="stable")
    return ptr, vals.astype(np.int64)[order]


def _validate(b: np.ndarray, hs: np.ndarray, end: np.ndarray) -> None:
    """Let protobuf's C parser accept the nodes first (UTF-8, nested messages this decoder skips): bytes it
    rejects go to the protobuf path, which reports them (TraceFormatError) exactly as before."""
    if len(hs) == 0:
        return
    # Each framed record as field 1 of NodeBatch (tag 0x0a before its varint length), as decode_stream does;
    # joined by slices (a per-byte index array would cost ~16 bytes of temporaries per byte of trace).
    mv = memoryview(b)
    joined = b"\n" + b"\n".join([mv[h:e] for h, e in zip(hs.tolist(), end.tolist(), strict=True)])
    try:
        NodeBatch().ParseFromString(joined)
    except DecodeError:
        raise Unsupported("protobuf rejects the bytes") from None


def decode_columns(
    bufs: list[bytes], paths: list[str], want: frozenset[str], spans: bool = False
) -> RankColumns:
    """Decode framed `.et` files (bytes each) into one set of columns; attributes outside `want` skipped.

    spans: also keep where each node's frame, name field and wanted attribute fields lie in `buf`.
    """
    hs_l, end_l, counts = [], [], []
    base = 0
    for buf, path in zip(bufs, paths, strict=True):
        if not buf:
            raise TraceFormatError("empty file: no GlobalMetadata", path=path, offset=0)
        frames = frame_offsets(buf, path)[1:]
        counts.append(len(frames))
        hs_l.append(np.fromiter((s for s, _ in frames), dtype=np.int64, count=len(frames)) + base)
        end_l.append(np.fromiter((e for _, e in frames), dtype=np.int64, count=len(frames)) + base)
        base += len(buf)
    buf = b"".join(bufs)
    file_ptr = np.zeros(len(bufs) + 1, dtype=np.int64)
    file_ptr[1:] = np.cumsum(counts)
    n = int(file_ptr[-1])
    b = np.frombuffer(buf + b"\x00" * 11, dtype=np.uint8)
    hs = np.concatenate(hs_l) if hs_l else np.zeros(0, dtype=np.int64)
    end = np.concatenate(end_l) if end_l else np.zeros(0, dtype=np.int64)
    _, cur = _varints(b, hs)  # skip each frame's length prefix
    _validate(b, hs, end)
    payload_start = cur.copy()

    nid = np.zeros(n, dtype=np.uint64)
    ntype = np.zeros(n, dtype=np.uint64)
    dur = np.zeros(n, dtype=np.uint64)
    name_s = np.zeros(n, dtype=np.int64)
    name_e = np.zeros(n, dtype=np.int64)
    name_tag = np.full(n, -1, dtype=np.int64)
    seen = np.zeros((n, 11), dtype=np.int16)  # occurrences per field number
    dep_own: dict[int, list] = {4: [], 5: []}
    dep_s: dict[int, list] = {4: [], 5: []}
    dep_e: dict[int, list] = {4: [], 5: []}
    at_own, at_s, at_e, at_tag = [], [], [], []
    act = np.arange(n)
    while len(act):
        tag, p = _varints(b, cur[act])
        if (tag >= np.uint64(512)).any():
            raise Unsupported("field number outside the Node schema")
        fi = (tag >> np.uint64(3)).astype(np.int64)
        wt = (tag & np.uint64(7)).astype(np.int64)
        if not _NODE_FIELD_OK[fi, np.minimum(wt, 3)].all():
            raise Unsupported("field kind outside the Node schema")
        v, p2 = _varints(b, p)
        is_len = wt == 2
        nxt = np.where(is_len, p2 + v.astype(np.int64), p2)
        if (nxt > end[act]).any() or (is_len & (v >= np.uint64(1 << 31))).any():
            raise Unsupported("field runs past its node")
        for fld, arr in ((1, nid), (3, ntype), (7, dur)):
            m = fi == fld
            if m.any():
                arr[act[m]] = v[m]
        m = fi <= 7
        seen[act[m], fi[m]] += 1
        m = fi == 2
        if m.any():
            name_s[act[m]] = p2[m]
            name_e[act[m]] = nxt[m]
            name_tag[act[m]] = cur[act[m]]
        for fld in (4, 5):
            m = fi == fld
            if m.any():
                dep_own[fld].append(act[m])
                dep_s[fld].append(p2[m])
                dep_e[fld].append(nxt[m])
        m = fi == 10
        if m.any():
            at_own.append(act[m])
            at_s.append(p2[m])
            at_e.append(nxt[m])
            at_tag.append(cur[act[m]])
        cur[act] = nxt
        act = act[nxt < end[act]]
    if (seen[:, 1:8] > 1).any():
        raise Unsupported("a singular Node field appears twice")
    if (nid >= np.uint64(1 << 63)).any() or (dur >= np.uint64(1 << 43)).any():
        raise Unsupported("id or duration out of the int64 range")
    if (ntype > np.uint64(1 << 31)).any():
        raise Unsupported("node type out of range")

    ptrs = {}
    for fld in (4, 5):
        if dep_own[fld]:
            own = np.concatenate(dep_own[fld])
            ptrs[fld] = _csr(own, np.concatenate(dep_s[fld]), np.concatenate(dep_e[fld]), b, n)
        else:
            ptrs[fld] = (np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64))

    try:
        mv = memoryview(buf)
        names = [str(mv[s:e], "utf-8") for s, e in zip(name_s.tolist(), name_e.tolist(), strict=True)]
    except UnicodeDecodeError:
        raise Unsupported("node name is not UTF-8") from None

    attrs = _decode_attrs(buf, b, n, at_own, at_s, at_e, want, at_tag if spans else None)
    return RankColumns(
        paths=tuple(paths),
        file_ptr=file_ptr,
        num_nodes=n,
        node_id=nid.astype(np.int64),
        node_type=ntype.astype(np.int64),
        duration_micros=dur.astype(np.int64),
        names=names,
        data_ptr=ptrs[5][0],
        data_idx=ptrs[5][1],
        ctrl_ptr=ptrs[4][0],
        ctrl_idx=ptrs[4][1],
        attrs=attrs,
        payload_start=payload_start,
        payload_end=end,
        buf=buf,
        frame_start=hs if spans else None,
        name_start=name_tag if spans else None,
        name_end=np.where(name_tag >= 0, name_e, -1) if spans else None,
    )


def _decode_attrs(buf, b, n, at_own, at_s, at_e, want, at_tag=None) -> dict[str, AttrColumn]:
    """Attribute columns for the names in `want` (each at most once per node); with at_tag (each field's
    tag position) also every wanted attribute's field span."""
    if not at_own:
        return {}
    own = np.concatenate(at_own)
    s0 = np.concatenate(at_s)
    e0 = np.concatenate(at_e)
    order = np.argsort(s0, kind="stable")
    own, s0, e0 = own[order], s0[order], e0[order]
    tag0 = np.concatenate(at_tag)[order] if at_tag is not None else None
    m = len(own)
    name_s = np.full(m, -1, dtype=np.int64)
    name_e = np.full(m, -1, dtype=np.int64)
    vkind = np.zeros(m, dtype=np.int64)  # value field number, 0 = none
    nvals = np.zeros(m, dtype=np.int64)
    vraw = np.zeros(m, dtype=np.uint64)
    vs = np.zeros(m, dtype=np.int64)
    ve = np.zeros(m, dtype=np.int64)
    cur = s0.copy()
    act = np.arange(m)
    while len(act):
        tag, p = _varints(b, cur[act])
        f = (tag >> np.uint64(3)).astype(np.int64)
        wt = tag & np.uint64(7)
        nxt = np.empty(len(act), dtype=np.int64)
        w0, w2 = wt == 0, wt == 2
        w1, w5 = wt == 1, wt == 5
        if not (w0 | w1 | w2 | w5).all():
            raise Unsupported("attribute wire type")
        v = np.zeros(len(act), dtype=np.uint64)
        p2 = p.copy()
        sel = w0 | w2
        if sel.any():
            vv, pp = _varints(b, p[sel])
            v[sel] = vv
            p2[sel] = pp
        nxt[w0] = p2[w0]
        if (w2 & (v >= np.uint64(1 << 31))).any():
            raise Unsupported("attribute length")
        nxt[w2] = p2[w2] + v[w2].astype(np.int64)
        nxt[w1] = p[w1] + 8
        nxt[w5] = p[w5] + 4
        if (nxt > e0[act]).any():
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
        act = a[nxt < e0[a]]
    if (name_s < 0).any():
        name_s = np.where(name_s < 0, 0, name_s)
        name_e = np.where(name_e < 0, 0, name_e)
    codes, names = _intern(buf, b, name_s, name_e)
    out: dict[str, AttrColumn] = {}
    for ci, nm in enumerate(names):
        if nm not in want:
            continue
        sel = np.nonzero(codes == ci)[0]
        owners = own[sel]
        if np.bincount(owners, minlength=n).max() > 1:
            raise Unsupported(f"attribute {nm!r} twice on one node")
        if (nvals[sel] > 1).any():
            raise Unsupported("attribute with two values")
        k = vkind[sel]
        if not _VALUE_OK[np.minimum(k, 63)].all():
            raise Unsupported(f"attribute {nm!r} of a kind left to protobuf")
        raw = vraw[sel]
        val = np.zeros(len(sel), dtype=np.int64)
        mk = k == F_INT64
        val[mk] = raw[mk].view(np.int64)
        mk = k == F_INT32
        val[mk] = (raw[mk] & _MASK32).astype(np.uint32).view(np.int32).astype(np.int64)
        mk = k == F_UINT32
        val[mk] = (raw[mk] & _MASK32).astype(np.int64)
        mk = k == F_UINT64
        if (raw[mk] >= np.uint64(1 << 63)).any():
            raise Unsupported("uint64 attribute beyond int64")
        val[mk] = raw[mk].astype(np.int64)
        mk = k == F_BOOL
        val[mk] = (raw[mk] != 0).astype(np.int64)
        mk = k == F_STRING
        strings: list[str] = []
        if mk.any():
            scodes, strings = _intern(buf, b, vs[sel][mk], ve[sel][mk])
            val[mk] = scodes
        kind = np.full(n, -1, dtype=np.int8)
        value = np.zeros(n, dtype=np.int64)
        kind[owners] = k
        value[owners] = val
        fs = fe = None
        if tag0 is not None:
            fs = np.full(n, -1, dtype=np.int64)
            fe = np.full(n, -1, dtype=np.int64)
            fs[owners] = tag0[sel]
            fe[owners] = e0[sel]
        out[nm] = AttrColumn(kind, value, tuple(strings), fs, fe)
    return out
