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
from xsim.traces.wire import NAME_TAG, read_varint32, varint

_CHUNK = 1 << 13  # bytes compared per memcmp while looking for the first difference
MAX_NODE_CHECKS = 64  # differing nodes checked one by one before the exact proof of the whole file is cheaper


# Records of numpy arrays (this one and the others so marked): no generated eq, hash or repr (why:
# traces/columnar.py, AttrColumn).
@dataclass(frozen=True, eq=False, repr=False)
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


@dataclass(frozen=True, eq=False, repr=False)
class Prediction:
    """A predicted file: bytes, and each node's frame start and payload end in them."""

    buf: bytes
    frame_start: np.ndarray
    payload_start: np.ndarray
    payload_end: np.ndarray
    name_start: np.ndarray
    name_end: np.ndarray


def predict(
    t: Template, starts: np.ndarray, ends: np.ndarray, owners: np.ndarray, ids: np.ndarray, pool: list[bytes]
) -> Prediction:
    """The template's bytes with field [starts[i], ends[i]) of node owners[i] replaced by pool[ids[i]].

    The spans must be disjoint fields inside node payloads; node length prefixes are re-encoded where a
    node's payload length changes.
    """
    if len(starts) == 0:
        return Prediction(t.buf, t.frame_start, t.payload_start, t.payload_end, t.name_start, t.name_end)
    rlen = np.fromiter((len(p) for p in pool), dtype=np.int64, count=len(pool))[ids]
    s, e, ln, which, prefixes = _edits(t, starts, ends, owners, rlen)
    buf = _splice(t.buf, s, e, [pool[ids[w]] if w >= 0 else prefixes[-1 - w] for w in which.tolist()])
    return _moved(t, buf, s, e, ln)


def _edits(
    t: Template, starts: np.ndarray, ends: np.ndarray, owners: np.ndarray, rlen: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[bytes]]:
    """Every byte range a prediction rewrites, in file order: (start, end, new length, which) with which
    = i for field i of `starts`, -1 - p for re-encoded length prefix p; and those prefixes' bytes."""
    node_delta = np.zeros(t.num_nodes, dtype=np.int64)
    np.add.at(node_delta, owners, rlen - (ends - starts))
    nodes = np.nonzero(node_delta)[0]
    plen = (t.payload_end - t.payload_start)[nodes] + node_delta[nodes]
    prefixes = [_varint_cached(v) for v in plen.tolist()]
    p_len = np.fromiter((len(p) for p in prefixes), dtype=np.int64, count=len(prefixes))
    s = np.concatenate((starts, t.frame_start[nodes]))
    e = np.concatenate((ends, t.payload_start[nodes]))
    ln = np.concatenate((rlen, p_len))
    which = np.concatenate(
        (np.arange(len(starts), dtype=np.int64), -1 - np.arange(len(nodes), dtype=np.int64))
    )
    order = np.argsort(s, kind="stable")
    return s[order], e[order], ln[order], which[order], prefixes


def _splice(buf: bytes, s: np.ndarray, e: np.ndarray, pieces: list[bytes]) -> bytes:
    """buf with [s[m], e[m]) replaced by pieces[m] (sorted, disjoint ranges), joined by slices."""
    kept = memoryview(buf)
    parts: list = []
    prev = 0
    for a, b_, piece in zip(s.tolist(), e.tolist(), pieces, strict=True):
        parts.append(kept[prev:a])
        parts.append(piece)
        prev = b_
    parts.append(kept[prev:])
    return b"".join(parts)


def _moved(t: Template, buf: bytes, s: np.ndarray, e: np.ndarray, ln: np.ndarray) -> Prediction:
    """The prediction's node offsets: a template offset q moves by the size changes of the edits ending
    at or before it."""
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


@dataclass(frozen=True, eq=False, repr=False)
class _Layout:
    """Where a prediction's bytes come from, for one template, spans and replacement lengths."""

    base: np.ndarray  # the prediction for the pool `pool0` (re-encoded prefixes in place)
    pool0: np.ndarray  # that pool's bytes, joined
    pool_off: np.ndarray  # where each replacement starts in a joined pool
    new_s: np.ndarray  # where each replaced span starts in the prediction
    by_slot: np.ndarray  # the spans, grouped by their replacement (pool entry) ...
    slot_ptr: np.ndarray  # ... entry i's spans being by_slot[slot_ptr[i]:slot_ptr[i + 1]]
    shape: Prediction  # node offsets


def predict_many(
    t: Template,
    starts: np.ndarray,
    ends: np.ndarray,
    owners: np.ndarray,
    ids: np.ndarray,
    pool: list[bytes],
    cache: dict,
) -> Prediction:
    """`predict`, for many folded ranks of one template and one set of spans.

    Where each byte of a prediction comes from depends only on the replacements' lengths, so that layout is
    computed once per distinct lengths (kept in `cache`) with the first pool's bytes in place. A later
    prediction is a copy of that one with the pool bytes that differ from the first pool's written to
    every span they go to (a device group number: one byte per node; the file has ~10^5).
    """
    key = tuple(map(len, pool))
    pb_ = np.frombuffer(b"".join(pool), dtype=np.uint8)
    lay = cache.get(key)
    if lay is None:
        lay = cache[key] = _layout(t, starts, ends, owners, ids, np.asarray(key, dtype=np.int64), pb_)
    sh = lay.shape
    if not len(starts):
        return sh  # nothing replaced
    out = lay.base.copy()
    changed = np.flatnonzero(pb_ != lay.pool0)
    if len(changed):
        entry = np.searchsorted(lay.pool_off, changed, side="right") - 1
        lo, hi = lay.slot_ptr[entry], lay.slot_ptr[entry + 1]
        spans = lay.by_slot[_ramp(lo, hi - lo)]
        out[lay.new_s[spans] + np.repeat(changed - lay.pool_off[entry], hi - lo)] = np.repeat(
            pb_[changed], hi - lo
        )
    return Prediction(
        out.tobytes(), sh.frame_start, sh.payload_start, sh.payload_end, sh.name_start, sh.name_end
    )


def _layout(t: Template, starts, ends, owners, ids, pool_len: np.ndarray, pool_b: np.ndarray) -> _Layout:
    """The layout of `predict_many` for replacements of lengths pool_len, filled with pool bytes pool_b.

    Only replacements that change a length (and the length prefixes they change) move bytes: those are
    spliced (a few per node that changes); the others are written in place.
    """
    pool_off = np.concatenate(([0], np.cumsum(pool_len)[:-1]))
    rlen = pool_len[ids]
    mv = rlen != ends - starts
    s, e, ln, which, prefixes = _edits(t, starts[mv], ends[mv], owners[mv], rlen[mv])
    pieces = [
        bytes(int(n)) if w >= 0 else prefixes[-1 - w]
        for w, n in zip(which.tolist(), ln.tolist(), strict=True)
    ]
    shape = _moved(t, _splice(t.buf, s, e, pieces), s, e, ln)
    # Every replacement's place in the prediction: its start moved by the edits that end at or before it.
    cum = np.concatenate(([0], np.cumsum(ln - (e - s))))
    new_s = starts + cum[np.searchsorted(e, starts, side="right")]
    base = np.frombuffer(shape.buf, dtype=np.uint8).copy()
    base[_ramp(new_s, rlen)] = pool_b[_ramp(pool_off[ids], rlen)]
    by_slot = np.argsort(ids, kind="stable")
    slot_ptr = np.searchsorted(ids[by_slot], np.arange(len(pool_len) + 1))
    return _Layout(base, pool_b.copy(), pool_off, new_s, by_slot, slot_ptr, shape)


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
        hdr = read_varint32(xb, xs)
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
    if ns < 0 or pb_[ns] != NAME_TAG:  # as protobuf writes a name
        return None
    c = a + ns - pa  # the name field's place in xb
    if c >= end or xb[a:c] != pb_[pa:ns] or xb[c] != NAME_TAG:
        return None
    hdr = read_varint32(xb, c + 1)
    if hdr is None or hdr[1] + hdr[0] > end or xb[hdr[1] + hdr[0] : end] != pb_[ne:pe]:
        return None
    try:
        return xb[hdr[1] : hdr[1] + hdr[0]].decode("utf-8")
    except UnicodeDecodeError:
        return None  # protobuf rejects it: the exact proof reports it
