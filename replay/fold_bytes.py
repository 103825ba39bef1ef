"""Byte-level fold proof: a folded rank's file against its representative's file with labels swapped in.

The representative's file was decoded as columns with field spans (traces/columnar.py, spans=True), so
its bytes are known field by field. For a folded rank, `predict` builds the file the representative's
would be after replacing whole label fields (an attribute field, tag to end, by another well-formed
attribute of the same name) and re-encoding the node length prefixes that change; `walk` compares the
folded rank's raw bytes with that prediction. Where they are equal the folded file *is* the prediction:
the same nodes, fields and order as the representative's (so protobuf accepts it as it accepted the
representative's), differing only in the replaced labels, whose values are known. A node where the bytes
differ is framed at the same offset and handed to an exact check (replay/fold.py), and the comparison
resumes after it; anything else (a header that differs, a frame that cannot be read, too many differing
nodes) answers False and the caller proves the rank the exact way. Nothing here decides that two ranks
differ: only the exact check refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

_CHUNK = 1 << 13  # bytes compared per memcmp while looking for the first difference
MAX_NODE_CHECKS = 64  # differing nodes checked one by one before the exact proof of the whole file is cheaper


@dataclass(frozen=True)
class Template:
    """One representative's file: its bytes and where its nodes and replaceable fields lie (file offsets)."""

    buf: bytes
    frame_start: np.ndarray  # node j's length prefix starts here
    payload_start: np.ndarray
    payload_end: np.ndarray
    name_start: np.ndarray  # node j's name field (tag to end), -1 when it has none
    name_end: np.ndarray

    @property
    def num_nodes(self) -> int:
        """Nodes in the file (the GlobalMetadata frame is not one)."""
        return len(self.frame_start)


@dataclass(frozen=True)
class Prediction:
    """A predicted file: bytes, and each node's frame start and payload end in them."""

    buf: bytes
    frame_start: np.ndarray
    payload_start: np.ndarray
    payload_end: np.ndarray
    name_start: np.ndarray
    name_end: np.ndarray


def varint(v: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int."""
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def predict(
    t: Template, starts: np.ndarray, ends: np.ndarray, owners: np.ndarray, ids: np.ndarray, pool: list[bytes]
) -> Prediction:
    """The template's bytes with field [starts[i], ends[i]) of node owners[i] replaced by pool[ids[i]].

    The spans must be disjoint fields inside node payloads; node length prefixes are re-encoded where a
    node's payload length changes. Replacements of the same length are written in place; the others
    (and the prefixes they change) are spliced in by one gather.
    """
    rb = t.buf
    if len(starts) == 0:
        return Prediction(rb, t.frame_start, t.payload_start, t.payload_end, t.name_start, t.name_end)
    pool_len = np.fromiter((len(p) for p in pool), dtype=np.int64, count=len(pool))
    pool_off = np.concatenate(([0], np.cumsum(pool_len)[:-1]))
    pool_b = np.frombuffer(b"".join(pool), dtype=np.uint8)
    rlen = pool_len[ids]
    delta = rlen - (ends - starts)
    same = delta == 0
    out = np.frombuffer(rb, dtype=np.uint8).copy()
    if same.any():
        out[_ramp(starts[same], rlen[same])] = pool_b[_ramp(pool_off[ids[same]], rlen[same])]
    if same.all():
        return Prediction(
            out.tobytes(), t.frame_start, t.payload_start, t.payload_end, t.name_start, t.name_end
        )
    ch = ~same
    node_delta = np.zeros(t.num_nodes, dtype=np.int64)
    np.add.at(node_delta, owners[ch], delta[ch])
    s_src = pool_off[ids[ch]] + len(rb)
    s, e, ln = starts[ch], ends[ch], rlen[ch]
    extra = b""
    nodes = np.nonzero(node_delta)[0]
    if len(nodes):  # re-encode those nodes' length prefixes
        plen = (t.payload_end - t.payload_start)[nodes] + node_delta[nodes]
        prefixes = [_varint_cached(v) for v in plen.tolist()]
        extra = b"".join(prefixes)
        p_len = np.fromiter((len(p) for p in prefixes), dtype=np.int64, count=len(prefixes))
        p_off = np.concatenate(([0], np.cumsum(p_len)[:-1])) + len(rb) + len(pool_b)
        s = np.concatenate((s, t.frame_start[nodes]))
        e = np.concatenate((e, t.payload_start[nodes]))
        ln = np.concatenate((ln, p_len))
        s_src = np.concatenate((s_src, p_off))
    order = np.argsort(s, kind="stable")
    s, e, ln, s_src = s[order], e[order], ln[order], s_src[order]
    # Kept [0, s0), replacement 0, kept [e0, s1), replacement 1, ..., kept [e_last, end), spliced by
    # slices (a few hundred) rather than a gather of every byte.
    kept = memoryview(out)
    repl = memoryview(pool_b.tobytes() + extra)
    base = len(rb)
    parts = []
    prev = 0
    for a, b_, c, ll in zip(s.tolist(), e.tolist(), (s_src - base).tolist(), ln.tolist(), strict=True):
        parts.append(kept[prev:a])
        parts.append(repl[c : c + ll])
        prev = b_
    parts.append(kept[prev:base])
    buf = b"".join(parts)
    # New offsets: a template offset q moves by the size changes of the spans ending at or before it.
    cum = np.concatenate(([0], np.cumsum(ln - (e - s))))

    q = np.concatenate((t.frame_start, t.payload_start, t.payload_end, t.name_start, t.name_end))
    q = np.where(q >= 0, q + cum[np.searchsorted(e, q, side="right")], q)
    fs, ps, pe, ns, ne = np.split(q, 5)
    return Prediction(buf, fs, ps, pe, ns, ne)


_VARINTS: dict[int, bytes] = {}


def _varint_cached(v: int) -> bytes:
    b = _VARINTS.get(v)
    if b is None:
        b = _VARINTS[v] = varint(v)
    return b


def predict_many(
    t: Template,
    starts: np.ndarray,
    ends: np.ndarray,
    owners: np.ndarray,
    ids: np.ndarray,
    pool: list[bytes],
    cache: dict,
) -> Prediction:
    """`predict`, for many folded ranks of one template and one set of spans: the layout of the predicted
    file (where each kept byte and each replacement byte goes) depends only on the replacements' lengths,
    so it is computed once per distinct lengths (kept in `cache`) and each prediction is one gather."""
    pool_len = np.fromiter((len(p) for p in pool), dtype=np.int64, count=len(pool))
    key = pool_len.tobytes()
    lay = cache.get(key)
    if lay is None:
        # The node offsets come from a prediction with stand-in replacements of the same lengths.
        pool_off = np.concatenate(([0], np.cumsum(pool_len)[:-1]))
        stand = [bytes(int(n)) for n in pool_len.tolist()]
        lay = (
            *_layout(t, starts, ends, owners, ids, pool_len, pool_off),
            predict(t, starts, ends, owners, ids, stand),
        )
        cache[key] = lay
    gidx, extra, shape = lay
    src = np.concatenate(
        (np.frombuffer(t.buf, dtype=np.uint8), np.frombuffer(b"".join(pool), dtype=np.uint8), extra)
    )
    return Prediction(
        src[gidx].tobytes(),
        shape.frame_start,
        shape.payload_start,
        shape.payload_end,
        shape.name_start,
        shape.name_end,
    )


def _layout(t: Template, starts, ends, owners, ids, pool_len, pool_off) -> tuple[np.ndarray, np.ndarray]:
    """(gather index into template bytes ++ pool bytes ++ prefix bytes, the re-encoded prefix bytes)."""
    base = len(t.buf)
    rlen = pool_len[ids]
    delta = rlen - (ends - starts)
    node_delta = np.zeros(t.num_nodes, dtype=np.int64)
    np.add.at(node_delta, owners, delta)
    s, e, ln, src = starts, ends, rlen, pool_off[ids] + base
    extra = b""
    nodes = np.nonzero(node_delta)[0]
    if len(nodes):
        plen = (t.payload_end - t.payload_start)[nodes] + node_delta[nodes]
        prefixes = [_varint_cached(v) for v in plen.tolist()]
        extra = b"".join(prefixes)
        p_len = np.fromiter((len(p) for p in prefixes), dtype=np.int64, count=len(prefixes))
        p_off = np.concatenate(([0], np.cumsum(p_len)[:-1])) + base + int(pool_len.sum())
        s = np.concatenate((s, t.frame_start[nodes]))
        e = np.concatenate((e, t.payload_start[nodes]))
        ln = np.concatenate((ln, p_len))
        src = np.concatenate((src, p_off))
    order = np.argsort(s, kind="stable")
    s, e, ln, src = s[order], e[order], ln[order], src[order]
    keep_s = np.concatenate(([0], e))
    keep_l = np.concatenate((s, [base])) - keep_s
    m = len(s)
    seg_s = np.empty(2 * m + 1, dtype=np.int64)
    seg_l = np.empty(2 * m + 1, dtype=np.int64)
    seg_s[0::2], seg_l[0::2] = keep_s, keep_l
    seg_s[1::2], seg_l[1::2] = src, ln
    return _ramp(seg_s, seg_l), np.frombuffer(extra, dtype=np.uint8)


def _ramp(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenated ranges [s, s + l) for each (s, l)."""
    total = int(lens.sum())
    offs = np.repeat(starts - np.concatenate(([0], np.cumsum(lens)[:-1])), lens)
    return offs + np.arange(total)


def first_diff(a: bytes, ai: int, b: bytes, bi: int) -> int | None:
    """Offset d of the first byte where a[ai:] and b[bi:] differ (or where the shorter ends); None if equal."""
    la, lb = len(a) - ai, len(b) - bi
    m = min(la, lb)
    off = 0
    while off < m:
        w = min(_CHUNK, m - off)
        if a[ai + off : ai + off + w] != b[bi + off : bi + off + w]:
            xa = np.frombuffer(a, dtype=np.uint8, count=w, offset=ai + off)
            xb = np.frombuffer(b, dtype=np.uint8, count=w, offset=bi + off)
            return off + int(np.flatnonzero(xa != xb)[0])
        off += w
    return None if la == lb else m


def _read_varint(b: bytes, pos: int) -> tuple[int, int] | None:
    """(value, position after) of a varint32 at pos, None when it is cut off or too long."""
    v = shift = 0
    for k in range(5):
        if pos + k >= len(b):
            return None
        c = b[pos + k]
        v |= (c & 0x7F) << shift
        if c < 0x80:
            return v, pos + k + 1
        shift += 7
    return None


def walk(
    xb: bytes,
    p: Prediction,
    check_node: Callable[[int, bytes], bool],
    renamed: Callable[[int, str], None],
) -> bool:
    """True when file bytes xb equal prediction p except in node names (reported to renamed(j, name)) and
    in nodes that check_node(j, payload) accepts.

    check_node raises on a node that differs for real; it answers False when it cannot decide (then so
    does walk, and the caller proves the file the exact way).
    """
    pb_ = p.buf
    if xb == pb_:
        return True
    fs, pe = p.frame_start, p.payload_end
    n = len(fs)
    px = pp = 0
    checked = 0
    while True:
        d = first_diff(xb, px, pb_, pp)
        if d is None:
            return True
        q = pp + d
        j = int(np.searchsorted(pe, q, side="right"))
        if j >= n or q < fs[j]:
            return False  # the header (GlobalMetadata), or past the last node
        xs = px + int(fs[j]) - pp  # every byte before it matched, so node j starts here in xb too
        hdr = _read_varint(xb, xs)
        if hdr is None or hdr[1] + hdr[0] > len(xb):
            return False
        a, end = hdr[1], hdr[1] + hdr[0]
        name = _other_name(xb, a, end, p, j)
        if name is not None:
            renamed(j, name)
        else:
            checked += 1
            if checked > MAX_NODE_CHECKS or not check_node(j, xb[a:end]):
                return False
        px, pp = end, int(pe[j])


def _other_name(xb: bytes, a: int, end: int, p: Prediction, j: int) -> str | None:
    """The name of node j of xb (payload [a, end)) when the node equals the prediction's but for its name
    field (a well-formed string field at the same place); else None."""
    ns, ne = int(p.name_start[j]), int(p.name_end[j])
    pa, pe = int(p.payload_start[j]), int(p.payload_end[j])
    pb_ = p.buf
    if ns < 0 or pb_[ns] != 0x12:  # field 2 (name), length-delimited, as protobuf writes it
        return None
    c = a + ns - pa  # the name field's place in xb
    if c >= end or xb[a:c] != pb_[pa:ns] or xb[c] != 0x12:
        return None
    hdr = _read_varint(xb, c + 1)
    if hdr is None or hdr[1] + hdr[0] > end or xb[hdr[1] + hdr[0] : end] != pb_[ne:pe]:
        return None
    try:
        return xb[hdr[1] : hdr[1] + hdr[0]].decode("utf-8")
    except UnicodeDecodeError:
        return None  # protobuf rejects it: the exact proof reports it
