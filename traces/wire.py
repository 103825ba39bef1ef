"""The protobuf wire format as Chakra `.et` files use it, in one place: tags, varints, framing, field bytes,
and grouping spans of equal bytes.

Every module that reads or writes protobuf bytes without a message object (the columnar decoder, the
stream framing, the byte-level fold proof) takes them from here; nothing under replay/ encodes a tag or a
varint itself. The encoding is protobuf's (protobuf.dev/programming-guides/encoding: base-128 varints,
tag = field number << 3 | wire type); the framing is protoio's (gem5, as Chakra's writers use it: each
message preceded by its length as a varint32).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from xsim.traces import pb
from xsim.traces.errors import TraceFormatError
from xsim.traces.limits import max_nodes

# Wire types (protobuf encoding guide, "Message Structure").
WT_VARINT, WT_I64, WT_LEN, WT_I32 = 0, 1, 2, 5


def tag(field: int, wire_type: int) -> int:
    """A field's tag: its number shifted past the three wire-type bits."""
    return field << 3 | wire_type


# Node field numbers (traces/et_def.proto).
NODE_ID, NODE_NAME, NODE_TYPE, NODE_CTRL_DEPS, NODE_DATA_DEPS = 1, 2, 3, 4, 5
NODE_START, NODE_DURATION, NODE_INPUTS, NODE_OUTPUTS, NODE_ATTR = 6, 7, 8, 9, 10
NAME_TAG = tag(NODE_NAME, WT_LEN)  # 0x12
ATTR_TAG = tag(NODE_ATTR, WT_LEN)  # 0x52
# NodeBatch.nodes (traces/et_stream.proto): a node record with this tag in front is one batch entry.
BATCH_NODE_TAG = tag(1, WT_LEN)  # 0x0a

# AttributeProto fields (et_def.proto): its name, and the value fields the columnar decoder reads.
ATTR_NAME = 1
F_INT32, F_INT64, F_UINT32, F_UINT64, F_BOOL, F_STRING = 7, 9, 11, 13, 27, 29
VALUE_KIND = {
    F_INT32: "int32_val",
    F_INT64: "int64_val",
    F_UINT32: "uint32_val",
    F_UINT64: "uint64_val",
    F_BOOL: "bool_val",
    F_STRING: "string_val",
}

# protoio (gem5) frames every message with a varint32 length: at most 5 bytes.
MAX_VARINT32_BYTES = 5


class Unsupported(Exception):
    """The bytes use a form the columnar decoder leaves to protobuf (not an error in the trace)."""


# -- varints --------------------------------------------------------------------------------------------


def varint(n: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@functools.cache
def _small_varints() -> list[bytes]:
    """Varints below 2^14, built on first use (~40 ms: not on every replay's start-up)."""
    return [varint(i) for i in range(1 << 14)]


def frame_length(n: int) -> bytes:
    """The varint32 length prefix protoio writes before a message of n bytes."""
    return _small_varints()[n] if n < 16384 else varint(n)


def frame_lengths(lengths: list[int]) -> list[bytes]:
    """`frame_length` of each of `lengths` (one table lookup each when all are below 2^14)."""
    small = _small_varints()
    if not lengths or max(lengths) < 16384:
        return list(map(small.__getitem__, lengths))
    return [small[n] if n < 16384 else varint(n) for n in lengths]


def read_varint32(b: bytes, pos: int) -> tuple[int, int] | None:
    """(value, position after) of a varint32 at pos, None when it is cut off or longer than 5 bytes."""
    v = shift = 0
    for k in range(MAX_VARINT32_BYTES):
        if pos + k >= len(b):
            return None
        c = b[pos + k]
        v |= (c & 0x7F) << shift
        if c < 0x80:
            return v, pos + k + 1
        shift += 7
    return None


def varints(b: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decode one varint at each position of b (uint8, padded past its end); returns (values as uint64,
    positions after them). Raises Unsupported past 64 bits."""
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
        if k == 9 and (byte > 1).any():
            raise Unsupported("10-byte varint beyond 64 bits")
        val[idx] |= (byte & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        end[idx] = p + 1
        cont = byte >= 0x80
        if not cont.any():
            return val, end
        idx = idx[cont]
        p = p[cont] + 1
    raise Unsupported("varint longer than 10 bytes")


# -- field bytes ----------------------------------------------------------------------------------------


def length_field(field: int, payload: bytes) -> bytes:
    """A length-delimited field (tag, varint length, payload), as protobuf writes it."""
    return bytes((tag(field, WT_LEN),)) + varint(len(payload)) + payload


def name_field(name: str) -> bytes:
    """A Node's name field (0x12, length, UTF-8), as protobuf writes a non-empty name."""
    return length_field(NODE_NAME, name.encode("utf-8"))


@functools.lru_cache(maxsize=4096)
def attribute_field(name: str, value, kind: str) -> bytes:
    """One attribute as a whole Node field (tag, length, AttributeProto bytes), as protobuf writes it."""
    from xsim.traces.attrs import make_attr  # attrs imports the messages; wire stays importable without them

    return pb.Node(attr=[make_attr(name, value, kind)]).SerializeToString()


_TABLE: list[bytes] = []  # varints of 0..len-1, grown on demand (node ids of the largest rank so far)
_TABLE_MAX = 1 << 20  # node_bytes grows the table no further (~40 MB); larger ids are encoded one by one


def varint_table(upto: int) -> list[bytes]:
    """A list whose item i is `varint(i)`, for i < upto at least (shared, grown by doubling)."""
    t = _TABLE
    if len(t) < upto:
        if not t:
            t.extend(_small_varints())
        t.extend(map(varint, range(len(t), max(upto, 2 * len(t)))))
    return t


def _packed(t: list[bytes], values: Sequence[int]) -> bytes:
    """A packed repeated uint64 field's length and payload (the values' varints back to back)."""
    n = len(t)
    if len(values) == 1:
        v = values[0]
        b = t[v] if 0 <= v < n else varint(v)
    else:
        b = b"".join([t[v] if 0 <= v < n else varint(v) for v in values])
    return t[len(b)] + b if len(b) < n else varint(len(b)) + b


# Node field tags, varint and packed fields (et_def.proto: id 1, type 3, ctrl_deps 4, data_deps 5,
# duration_micros 7).
_ID_TAG, _TYPE_TAG = bytes((tag(NODE_ID, WT_VARINT),)), bytes((tag(NODE_TYPE, WT_VARINT),))
_CTRL_TAG, _DATA_TAG = bytes((tag(NODE_CTRL_DEPS, WT_LEN),)), bytes((tag(NODE_DATA_DEPS, WT_LEN),))
_DUR_TAG, _NAME_TAG = bytes((tag(NODE_DURATION, WT_VARINT),)), bytes((NAME_TAG,))


def node_bytes(
    nid: int, name: str, ntype: int, ctrl: Sequence[int], data: Sequence[int], dur: int, attrs: bytes
) -> bytes:
    """A Node as protobuf serializes it: fields in number order, proto3 defaults (0, empty) left out,
    deps packed, then `attrs`, the node's attribute fields already encoded (`attribute_field` bytes).

    The generator writes its nodes through this instead of building messages (a message with eight
    attributes costs ~10x its encoding here); tests/test_gen_node_bytes.py compares it with protobuf.
    """
    t = _TABLE if 0 <= nid < len(_TABLE) else varint_table(min(nid, _TABLE_MAX) + 1)
    out = [_ID_TAG, t[nid] if 0 <= nid < len(t) else varint(nid)] if nid else []
    if name:
        b = name.encode("utf-8")
        out += (_NAME_TAG, t[len(b)] if len(b) < len(t) else varint(len(b)), b)
    if ntype:
        out += (_TYPE_TAG, t[ntype] if 0 <= ntype < len(t) else varint(ntype))
    if ctrl:
        out += (_CTRL_TAG, _packed(t, ctrl))
    if data:
        out += (_DATA_TAG, _packed(t, data))
    if dur:
        out += (_DUR_TAG, t[dur] if 0 <= dur < len(t) else varint(dur))
    out.append(attrs)
    return b"".join(out)


# -- framing --------------------------------------------------------------------------------------------


def frame_offsets(buf: bytes, path: str = "<bytes>") -> list[tuple[int, int]]:
    """Split a framed stream into (header_start, payload_end) spans, one per message, checking every length."""
    spans: list[tuple[int, int]] = []
    append = spans.append
    pos = 0
    n = len(buf)
    cap = max_nodes() + 1  # the GlobalMetadata frame plus the nodes
    while pos < n:
        start = pos
        if len(spans) >= cap:
            raise TraceFormatError(
                f"more than {cap - 1} nodes in one file (XSIM_MAX_NODES raises the limit)",
                path=path,
                node_index=len(spans) - 1,
                offset=start,
            )
        b = buf[pos]
        pos += 1
        if b < 0x80:
            length = b
        else:
            length = b & 0x7F
            shift = 7
            while True:
                if pos >= n:
                    raise TraceFormatError(
                        "truncated length prefix at end of file",
                        path=path,
                        node_index=len(spans) - 1,
                        offset=start,
                    )
                b = buf[pos]
                pos += 1
                length |= (b & 0x7F) << shift
                if b < 0x80:
                    break
                shift += 7
                if pos - start >= MAX_VARINT32_BYTES:
                    raise TraceFormatError(
                        "length prefix longer than a varint32 (garbage bytes?)",
                        path=path,
                        node_index=len(spans) - 1,
                        offset=start,
                    )
            if length >= 1 << 32:
                raise TraceFormatError(
                    "length prefix exceeds 32 bits", path=path, node_index=len(spans) - 1, offset=start
                )
        end = pos + length
        if end > n:
            raise TraceFormatError(
                f"message of {length} bytes runs past end of file ({n - pos} bytes left): truncated file?",
                path=path,
                node_index=len(spans) - 1,
                offset=start,
            )
        append((start, end))
        pos = end
    return spans


def frame_spans(
    buf: bytes, path: str = "<bytes>", like: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """frame_offsets as two int64 arrays (header starts, payload ends), with the same checks and errors.

    Every frame with a one- or two-byte length prefix (messages below 16 KiB: all nodes of a Chakra
    trace) is walked by a loop of four operations per frame; a file with any other prefix, a truncated
    last frame or too many frames goes to frame_offsets, which accepts it or names what is wrong.
    like: the frame starts of another file (of the same size), checked against these bytes in one numpy
    pass and taken when they are what the loop would find (the ranks of a set share their layouts).
    """
    if like is not None and _same_layout(buf, like):
        ends = np.empty_like(like)
        ends[:-1] = like[1:]
        ends[-1:] = len(buf)
        return like, ends
    starts: list[int] = []
    append = starts.append
    pos = 0
    n = len(buf)
    cap = max_nodes() + 1
    try:
        while pos < n:
            append(pos)
            b = buf[pos]
            if b < 0x80:
                pos += 1 + b
            else:
                c = buf[pos + 1]  # IndexError: a prefix cut by the end of the file
                if c >= 0x80:
                    break  # a longer length prefix
                pos += 2 + (b & 0x7F) + (c << 7)
    except IndexError:
        pos = -1
    if pos != n or len(starts) > cap:
        spans = frame_offsets(buf, path)
        hs = np.fromiter((s for s, _ in spans), dtype=np.int64, count=len(spans))
        return hs, np.fromiter((e for _, e in spans), dtype=np.int64, count=len(spans))
    hs = np.array(starts, dtype=np.int64)
    ends = np.empty_like(hs)
    ends[:-1] = hs[1:]
    ends[-1:] = n
    return hs, ends


def _same_layout(buf: bytes, starts: np.ndarray) -> bool:
    """Whether frame_spans' loop, walking buf, meets exactly `starts`: the first at 0, each next one where
    the one- or two-byte length prefix at the last sends it, the last frame ending at the end of buf."""
    n = len(buf)
    if not 0 < len(starts) <= max_nodes() + 1 or starts[0] != 0 or starts[-1] >= n:
        return False
    b = np.frombuffer(buf, dtype=np.uint8)
    lo = b[starts].astype(np.int64)
    hi = b[np.minimum(starts + 1, n - 1)].astype(np.int64)
    two = lo >= 0x80
    if (two & (hi >= 0x80)).any() or (two[-1] and starts[-1] + 1 >= n):
        return False  # a longer prefix (or one cut by the end): the loop hands the file to frame_offsets
    nxt = np.where(two, 2 + (lo & 0x7F) + (hi << 7), 1 + lo) + starts
    return bool((nxt[:-1] == starts[1:]).all()) and int(nxt[-1]) == n


def payload_len(buf: bytes, start: int, end: int) -> int:
    """The payload length of the frame [start, end) (its length prefix skipped)."""
    pos = start
    while buf[pos] & 0x80:
        pos += 1
    return end - pos - 1


def batch_records(buf: bytes, starts: np.ndarray) -> bytes:
    """The framed records at `starts` (to the end of buf) with BATCH_NODE_TAG before each: the bytes of
    one NodeBatch holding them, in one vectorized numpy pass."""
    if not len(starts):
        return b""
    first = int(starts[0])
    body = np.frombuffer(buf, dtype=np.uint8, offset=first)
    return np.insert(body, starts - first, BATCH_NODE_TAG).tobytes()


# -- grouping spans of equal bytes ----------------------------------------------------------------------


def padded(buf: bytes) -> np.ndarray:
    """buf as uint8 with 40 zero bytes after it: what varints and group_by_bytes read past span ends."""
    return np.frombuffer(buf + b"\x00" * 40, dtype=np.uint8)


def group_by_bytes(
    buf: bytes,
    b: np.ndarray,
    s: np.ndarray,
    e: np.ndarray,
    *,
    like: np.ndarray | None = None,
    keys: tuple[np.ndarray, ...] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Group spans [s, e) of buf by their bytes, exactly: (group per span, first span of each group),
    groups numbered in the order of their first span (as a dict of the bytes would number them).

    b: buf padded (`padded`). Spans of at most 32 bytes (attribute fields, names: millions, a few hundred
    distinct) are grouped by a numpy hash table of their words (keys: their `field_keys`, when already
    read); longer ones (node payloads, attribute regions) by a dict of their bytes, where like (for each
    span an earlier span known to hold the same bytes, or -1) spares the dict the ones already known.
    """
    m = len(s)
    if m == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    long_ = (e - s) > 32
    if not long_.any():
        return _group_short(b, s, e, keys)
    if long_.all():
        return _group_long(buf, s, e, like)
    sh, lg = np.flatnonzero(~long_), np.flatnonzero(long_)
    ks = None if keys is None else tuple(k[sh] for k in keys)
    c_s, f_s = _group_short(b, s[sh], e[sh], ks)
    sub_like = None
    if like is not None:  # equal bytes have equal lengths: a long span's twin is long too
        at = np.full(m, -1, dtype=np.int64)
        at[lg] = np.arange(len(lg))
        sub_like = np.where(like[lg] >= 0, at[np.maximum(like[lg], 0)], -1)
    c_l, f_l = _group_long(buf, s[lg], e[lg], sub_like)
    firsts = np.concatenate((sh[f_s], lg[f_l]))
    order = np.argsort(firsts, kind="stable")
    rank = np.empty(len(firsts), dtype=np.int64)
    rank[order] = np.arange(len(firsts))
    code = np.empty(m, dtype=np.int64)
    code[sh] = rank[c_s]
    code[lg] = rank[len(f_s) + c_l]
    return code, firsts[order]


def _group_long(
    buf: bytes, s: np.ndarray, e: np.ndarray, like: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """group_by_bytes by a dict of the bytes (a slice, a hash and a look-up per span; measured ~2x cheaper
    than hashing long spans' words with numpy, whose arrays of words cost more in fresh pages)."""
    seen: dict[bytes, int] = {}
    add = seen.setdefault
    if like is None:
        code = np.fromiter(
            (add(buf[i:j], len(seen)) for i, j in zip(s.tolist(), e.tolist(), strict=True)),
            dtype=np.int64,
            count=len(s),
        )
    else:
        # A span equal to an earlier one cannot open a group: the dict numbers the others in span order
        # (so groups keep the order of their first span), and each span takes its chain's last span's code.
        root = np.flatnonzero(like < 0)
        code = np.empty(len(s), dtype=np.int64)
        code[root] = np.fromiter(
            (add(buf[i:j], len(seen)) for i, j in zip(s[root].tolist(), e[root].tolist(), strict=True)),
            dtype=np.int64,
            count=len(root),
        )
        up = np.where(like < 0, np.arange(len(s)), like)
        while True:  # pointer jumping: each step halves what is left of every chain (like[i] < i)
            nxt = up[up]
            if (nxt == up).all():
                break
            up = nxt
        code = code[up]
    top = np.maximum.accumulate(code)  # a group's first span raises the highest code seen so far
    new = np.ones(len(code), dtype=bool)
    new[1:] = top[1:] > top[:-1]
    return code, np.flatnonzero(new)


_LOW_BYTES = np.array([(1 << (8 * i)) - 1 for i in range(8)] + [(1 << 64) - 1], dtype=np.uint64)
# field_keys' masks by a span's length (0..24): the bytes of each of its three words that it holds.
_KEY_MASKS = np.array(
    [[_LOW_BYTES[min(max(nb - 8 * j, 0), 8)] for j in range(3)] for nb in range(25)], dtype=np.uint64
)


def words(b: np.ndarray) -> np.ndarray:
    """Every byte offset of `b` read as a little-endian uint64 (a strided view, no copy; b is padded)."""
    return np.ndarray(shape=(len(b) - 7,), dtype="<u8", buffer=b, offset=0, strides=(1,))


def field_keys(b: np.ndarray, s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, ...]:
    """Bytes 0-7, 8-15 and 16-23 of each span [s, e) of `b`, zero past its end, as uint64 words
    (read from the buffer's aligned 8-byte words, two shifted into one: ~2x faster than numpy's unaligned
    8-byte loads)."""
    al = np.frombuffer(b.data, dtype="<u8", count=len(b) // 8)
    q = s >> 3
    sh = ((s & 7) << 3).astype(np.uint64)
    rs = np.uint64(64) - sh
    masks = _KEY_MASKS[np.minimum(e - s, 24)]
    a_next = al[q]
    out = []
    for j in range(3):
        k = a_next >> sh
        a_next = al[q + (j + 1)]
        k |= a_next << rs
        k &= masks[:, j]
        out.append(k)
    return tuple(out)


_MAX_ROUNDS = 64
# One odd multiplier per round (multiples of the 64-bit golden ratio): a new slot for every span left.
_ROUND_MUL = [np.uint64((0x9E3779B97F4A7C15 * (2 * i + 1)) % (1 << 64) | 1) for i in range(_MAX_ROUNDS)]


# A record of numpy arrays: no generated eq, hash or repr (why: traces/columnar.py, AttrColumn).
@dataclass(frozen=True, eq=False, repr=False)
class _SpanKeys:
    """Spans' comparison keys: bytes 0-7, 8-15, 16-23 (zero past the end), bytes 24-31 of spans longer than
    24 (k3, None when none is), and the length: equal keys are equal bytes."""

    k0: np.ndarray
    k1: np.ndarray
    k2: np.ndarray
    k3: np.ndarray | None
    n: np.ndarray

    def equal(self, r: np.ndarray, at: np.ndarray | None = None) -> np.ndarray:
        """Whether span r[i] holds the same bytes as span at[i] (at None: span i)."""
        if at is None:
            same = self.k0[r] == self.k0
            same &= self.k1[r] == self.k1
            same &= self.k2[r] == self.k2
            same &= self.n[r] == self.n
            if self.k3 is not None:
                same &= self.k3[r] == self.k3
            return same
        k0, k1, k2, n = self.k0, self.k1, self.k2, self.n
        same = (k0[r] == k0[at]) & (k1[r] == k1[at]) & (k2[r] == k2[at]) & (n[r] == n[at])
        if self.k3 is not None:
            same &= self.k3[r] == self.k3[at]
        return same


def _group_short(
    b: np.ndarray, s: np.ndarray, e: np.ndarray, keys: tuple[np.ndarray, ...] | None
) -> tuple[np.ndarray, np.ndarray]:
    """group_by_bytes of spans of at most 32 bytes, by a numpy hash table of their words."""
    k = _span_keys(b, s, e, keys)
    rep = _representatives(k, _span_hash(k))
    ar = np.arange(len(s))
    if not (rep <= ar).all():  # the first of each group is its representative (numpy writes in order)
        raise Unsupported("span groups out of order")
    first = np.flatnonzero(rep == ar)
    lut = np.empty(len(s), dtype=np.int64)
    lut[first] = np.arange(len(first))
    return lut[rep], first


def _span_keys(b: np.ndarray, s: np.ndarray, e: np.ndarray, keys: tuple[np.ndarray, ...] | None) -> _SpanKeys:
    """The keys of spans [s, e) of b (keys: their field_keys, when already read)."""
    n = e - s
    k0, k1, k2 = keys if keys is not None else field_keys(b, s, e)
    rare = np.flatnonzero(n > 24)
    k3 = None
    if len(rare):
        k3 = np.zeros(len(s), dtype=np.uint64)
        k3[rare] = words(b)[s[rare] + 24] & _LOW_BYTES[n[rare] - 24]
    return _SpanKeys(k0, k1, k2, k3, n)


def _span_hash(k: _SpanKeys) -> np.ndarray:
    """A 64-bit hash of each span's keys."""
    h = k.k0 * np.uint64(0xC2B2AE3D27D4EB4F)
    h ^= k.k1 * np.uint64(0x165667B19E3779F9)
    h ^= k.k2 * np.uint64(0xD6E8FEB86659FD93)
    if k.k3 is not None:
        h ^= k.k3 * np.uint64(0xFF51AFD7ED558CCD)
    # Spans of equal words but other lengths (trailing zero bytes) differ in their length: hashed and
    # compared too (a protobuf field holds its length in byte 1 already; a name does not).
    h ^= k.n.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return h


def _representatives(k: _SpanKeys, h: np.ndarray) -> np.ndarray:
    """Each span's representative: the first span of its keys, found by rounds of a hash table."""
    # A round groups every span whose slot holds a span with its key; each round groups at least one key
    # per slot, so the rounds end. The first table is small (64 KB, in the caches: a trace has a few
    # hundred distinct fields); the spans left after it get a table of 2-4x their number (<= 32 MB).
    m = len(h)
    bits = max(10, min(14, (2 * m).bit_length()))
    table = np.empty(1 << bits, dtype=np.int32)
    rep = np.empty(m, dtype=np.int64)
    pend = np.arange(m)
    for rnd in range(_MAX_ROUNDS):
        if rnd == 1:
            bits = max(bits, min(22, (2 * len(pend)).bit_length()))
            table = np.empty(1 << bits, dtype=np.int64)
        # Each span's slot; of the spans sharing one, the first (written last) is compared with the
        # others: equal keys join its group, the rest (another key in the same slot) try a new slot.
        slot = ((h * _ROUND_MUL[rnd]) >> np.uint64(64 - bits)).astype(np.intp)
        table[slot[::-1]] = pend[::-1]
        r = table[slot]
        same = k.equal(r) if rnd == 0 else k.equal(r, pend)
        rep[pend[same]] = r[same]
        if same.all():
            return rep
        keep = ~same
        pend, h = pend[keep], h[keep]
    raise Unsupported("span hashes collide")
