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

    @property
    def num_nodes(self) -> int:
        """Nodes in the file (the GlobalMetadata frame is not one)."""
        return len(self.frame_start)


@dataclass(frozen=True)
class Prediction:
    """A predicted file: bytes, and each node's frame start and payload end in them."""

    buf: bytes
    frame_start: np.ndarray
    payload_end: np.ndarray


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
    t: Template, starts: np.ndarray, ends: np.ndarray, owners: np.ndarray, repl: list[bytes]
) -> Prediction:
    """The template's bytes with field [starts[i], ends[i]) of node owners[i] replaced by repl[i].

    The spans must be disjoint fields inside node payloads; node length prefixes are re-encoded where a
    node's payload length changes.
    """
    rb = t.buf
    n = t.num_nodes
    if len(starts) == 0:
        return Prediction(rb, t.frame_start, t.payload_end)
    rlen = np.fromiter((len(r) for r in repl), dtype=np.int64, count=len(repl))
    delta = rlen - (ends - starts)
    node_delta = np.zeros(n, dtype=np.int64)
    np.add.at(node_delta, owners, delta)
    pools = list(repl)
    s_all, e_all, ln_all = [starts], [ends], [rlen]
    ch = np.nonzero(node_delta)[0]
    if len(ch):  # re-encode those nodes' length prefixes
        plen = (t.payload_end - t.payload_start)[ch] + node_delta[ch]
        prefixes = [varint(v) for v in plen.tolist()]
        pools += prefixes
        s_all.append(t.frame_start[ch])
        e_all.append(t.payload_start[ch])
        ln_all.append(np.fromiter((len(p) for p in prefixes), dtype=np.int64, count=len(prefixes)))
    s = np.concatenate(s_all)
    e = np.concatenate(e_all)
    ln = np.concatenate(ln_all)
    order = np.argsort(s, kind="stable")
    s, e, ln = s[order], e[order], ln[order]
    pool_off_unsorted = np.concatenate(([0], np.cumsum(np.concatenate(ln_all))[:-1]))
    pool_off = pool_off_unsorted[order] + len(rb)
    src = np.frombuffer(rb + b"".join(pools), dtype=np.uint8)
    # Segments: kept [0, s0), replacement 0, kept [e0, s1), replacement 1, ..., kept [e_last, end).
    keep_s = np.concatenate(([0], e))
    keep_l = np.concatenate((s, [len(rb)])) - keep_s
    m = len(s)
    seg_s = np.empty(2 * m + 1, dtype=np.int64)
    seg_l = np.empty(2 * m + 1, dtype=np.int64)
    seg_s[0::2], seg_l[0::2] = keep_s, keep_l
    seg_s[1::2], seg_l[1::2] = pool_off, ln
    out = src[_ramp(seg_s, seg_l)].tobytes()
    # New offsets: a template offset q moves by the size changes of the spans ending at or before it.
    cum = np.concatenate(([0], np.cumsum(ln - (e - s))))

    def moved(q: np.ndarray) -> np.ndarray:
        return q + cum[np.searchsorted(e, q, side="right")]

    return Prediction(out, moved(t.frame_start), moved(t.payload_end))


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


def walk(xb: bytes, p: Prediction, check_node: Callable[[int, bytes], bool]) -> bool:
    """True when file bytes xb equal prediction p except in nodes that check_node(j, payload) accepts.

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
        checked += 1
        if checked > MAX_NODE_CHECKS:
            return False
        xs = px + int(fs[j]) - pp  # every byte before it matched, so node j starts here in xb too
        hdr = _read_varint(xb, xs)
        if hdr is None or hdr[1] + hdr[0] > len(xb):
            return False
        a = hdr[1]
        if not check_node(j, xb[a : a + hdr[0]]):
            return False
        px, pp = a + hdr[0], int(pe[j])
