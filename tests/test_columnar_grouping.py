"""Cross-rank grouping in the columnar decoder (issue 11, round 4) against independent references.

decode_columns decodes each distinct node payload of a batch once (and, failing that, each distinct
attribute region once) and spreads the result over the nodes that hold the same bytes; frame_spans takes
another file's frame layout once it has checked it against the bytes. Pinned here:

- group_by_bytes numbers spans exactly as a Python dict of their bytes does, also when told (round 5,
  _same_as_previous_file) which spans repeat the one at their index in the previous file; that helper
  names every such span of files laid out alike, and no other (one byte apart, at either end, too);
- frame_spans with any `like` (the right layout, a same-size file's, a wrong one) gives what frame_offsets
  gives, spans or error;
- on generated replicated sets (identical ranks, ranks differing in one attribute, ids, a pg_name, nodes
  without attributes, an input after the attributes) and on the peer traces in ../shared/peer_traces:
  grouped decoding equals decoding every node's fields (group=False), equals each file decoded alone,
  and equals protobuf's own parse node by node (ids, types, durations, names, dependencies, attribute
  values, and with spans the bytes of every name and attribute field);
- a corrupted node in one rank of a replicated set still sends that file (only) to protobuf, which names
  the same file, rank and node as before.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import xsim.traces.columnar as columnar
from xsim.replay.program import WANT_ATTRS
from xsim.replay.simulation import ColumnReader, simulate
from xsim.traces import pb
from xsim.traces.attrs import make_node
from xsim.traces.columnar import _same_as_previous_file, decode_columns
from xsim.traces.errors import TraceFormatError
from xsim.traces.stream import decode_stream, encode_stream, frame_offsets, frame_spans
from xsim.traces.traceset import discover, write_trace_set
from xsim.traces.wire import group_by_bytes, padded

from tests.test_columnar_decode import _varint  # the hand-written encoder the decoder tests build bytes with

PEER = Path(__file__).resolve().parents[1] / ".." / "shared" / "peer_traces" / "chakra_et"
META = pb.GlobalMetadata(version="1")
WANT = frozenset({"layer", "phase", "pg_name", "comm_size", "device_group", "ok", "big"})


def test_group_by_bytes_numbers_spans_as_a_dict_of_their_bytes() -> None:
    rng = random.Random(3)
    vocab = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))) for _ in range(40)]
    vocab += [v[:-1] + bytes([v[-1] ^ 1]) for v in vocab[:10]]  # one byte apart, same length
    spans = [rng.choice(vocab) for _ in range(2000)]
    buf = b"".join(spans)
    e = np.cumsum([len(x) for x in spans])
    s = e - np.asarray([len(x) for x in spans])
    code, first = group_by_bytes(buf, padded(buf), s, e)
    seen: dict[bytes, int] = {}
    want = [seen.setdefault(x, len(seen)) for x in spans]
    assert code.tolist() == want
    assert first.tolist() == [want.index(c) for c in range(len(seen))]
    assert len(seen) > 40


def test_group_by_bytes_tells_trailing_zeros_apart_and_takes_hints_across_lengths() -> None:
    # Names are not protobuf fields (no length byte inside): "ab" and "ab\0" share their words, not their
    # bytes. Short and long spans mixed, with `like` naming earlier twins of the long ones only.
    spans = [b"ab", b"ab\x00", b"", b"\x00", b"ab", b"x" * 40, b"\x00", b"x" * 40, b"x" * 39 + b"\x00", b""]
    spans += [b"y" * 33, b"x" * 40, b"y" * 32, b"y" * 33]
    buf = b"".join(spans)
    e = np.cumsum([len(x) for x in spans])
    s = e - np.asarray([len(x) for x in spans])
    seen: dict[bytes, int] = {}
    want = [seen.setdefault(x, len(seen)) for x in spans]
    firsts = [want.index(c) for c in range(len(seen))]
    like = np.full(len(spans), -1, dtype=np.int64)
    like[7], like[11], like[13] = 5, 7, 10
    for hint in (None, like):
        code, first = group_by_bytes(buf, padded(buf), s, e, like=hint)
        assert code.tolist() == want and first.tolist() == firsts


def _framed(files: list[list[bytes]]) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
    """Files of length-prefixed payloads side by side: (bytes, payload starts, ends, file_ptr)."""
    buf, s, e, ptr = b"", [], [], [0]
    for spans in files:
        for x in spans:
            buf += _varint(len(x))
            s.append(len(buf))
            buf += x
            e.append(len(buf))
        ptr.append(len(s))
    return buf, np.asarray(s, dtype=np.int64), np.asarray(e, dtype=np.int64), np.asarray(ptr, dtype=np.int64)


def test_same_as_previous_file_names_exactly_the_equal_twins() -> None:
    rng = random.Random(11)
    base = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40))) for _ in range(60)]
    files = [base]
    for f in range(12):
        prev = files[-1]
        nxt = []
        for x in prev:
            r = rng.random()
            if x and r < 0.15:  # one byte flipped: its first, its last or one inside
                at = rng.choice([0, len(x) - 1, rng.randrange(len(x))])
                x = x[:at] + bytes([x[at] ^ (1 << rng.randrange(8))]) + x[at + 1 :]
            elif r < 0.2:  # another payload of the same length
                x = bytes(rng.randrange(256) for _ in range(len(x)))
            nxt.append(x)
        if f == 5:  # another layout: one payload a byte longer
            nxt[30] += b"\x00"
        if f == 8:  # another node count
            nxt = nxt[:-1]
        files.append(nxt)
    buf, s, e, ptr = _framed(files)
    b = np.frombuffer(buf + b"\x00" * 40, dtype=np.uint8)
    like = _same_as_previous_file(b, s, e, ptr).tolist()
    named = 0
    for g in range(1, len(files)):
        a, c = ptr[g - 1], ptr[g]
        laid_alike = [len(x) for x in files[g]] == [len(x) for x in files[g - 1]]
        for k, x in enumerate(files[g]):
            want = a + k if laid_alike and x == files[g - 1][k] else -1
            assert like[c + k] == want
            named += want >= 0
    assert like[: ptr[1]] == [-1] * ptr[1]
    assert named > 400  # most spans repeat; the flipped ones (about 90) and two files do not
    plain = group_by_bytes(buf, b, s, e)
    told = group_by_bytes(buf, b, s, e, like=np.asarray(like, dtype=np.int64))
    assert told[0].tolist() == plain[0].tolist() and told[1].tolist() == plain[1].tolist()
    seen: dict[bytes, int] = {}
    assert plain[0].tolist() == [seen.setdefault(buf[i:j], len(seen)) for i, j in zip(s, e, strict=True)]


def _spans_or_error(buf: bytes, like=None):
    fn = frame_offsets if like is False else (lambda b, p: frame_spans(b, p, like=like))
    try:
        got = fn(buf, "f.et")
    except TraceFormatError as exc:
        return ("error", str(exc))
    if like is False:
        return got
    hs, ends = got
    return list(zip(hs.tolist(), ends.tolist(), strict=True))


def test_frame_spans_with_a_layout_equals_frame_offsets() -> None:
    rng = random.Random(7)
    sizes = [0, 1, 5, 127, 128, 300, 16383, 16384]
    bufs = []
    for _ in range(30):
        nodes = [make_node(i, "x" * max(0, rng.choice(sizes) - 8), pb.COMP_NODE) for i in range(6)]
        bufs.append(encode_stream(META, nodes))
    bufs += [b[: rng.randrange(1, len(b))] for b in bufs[:10]]  # truncated
    bufs += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 80))) for _ in range(100)]
    layouts = []
    for b in bufs:
        try:
            layouts.append(frame_spans(b, "f.et")[0])
        except TraceFormatError:
            pass
    checked = 0
    for b in bufs:
        want = _spans_or_error(b, False)
        likes = [x for x in layouts if x[-1] < len(b)][:20]
        likes += [np.zeros(1, dtype=np.int64), np.array([0, 1, 2], dtype=np.int64)]
        if not isinstance(want, tuple):
            right = np.asarray([s for s, _ in want], dtype=np.int64)
            likes += [right, right[:-1], right + 1, np.concatenate((right, [len(b)]))]
        for like in likes:
            assert _spans_or_error(b, like) == want
            checked += 1
    assert checked > 1000


def _ranks(rng: random.Random, kind: str, n_ranks: int = 6, n: int = 40) -> list[list[pb.Node]]:
    """A replicated set: every rank the same ops; `kind` says what tells ranks apart."""
    out = []
    for r in range(n_ranks):
        nodes = []
        for i in range(n):
            # Phases whose first appearances differ in (round, node) order from node order: nodes carry
            # 2 to 6 fields before their attributes (the decoder's string tables follow that order)
            # (node 5's "s5", after 4 fields, comes before node 2's "s2", after 5).
            attrs: dict = {"phase": f"s{i % 6}", "layer": i % 5}
            if kind == "device_group":
                attrs["device_group"] = r
            if i % 7 == 3:
                attrs = {"comm_size": 1 << (i % 20), "pg_name": str(r // 2 if kind == "pg" else 0)}
            if i % 11 == 5:
                attrs = {}  # no attribute region at all
            if i % 13 == 6:
                attrs["ok"] = True
                attrs["big"] = (1 << 40) + i
            nid = i + (1000 * r if kind == "ids" else 0)
            deps = [nid - 1] if i else []
            node = make_node(
                nid,
                "" if i % 4 == 1 else f"op{i % 9}.mb{i % 3}",
                pb.COMP_NODE,
                data_deps=deps,
                ctrl_deps=deps if i % 4 == 0 else (),
                duration_micros=i % 4,
                attrs=attrs,
            )
            if kind == "io_after" and i % 5 == 1:
                raw = node.SerializeToString() + b"\x42\x00"  # inputs (field 8) after the attributes
                node = pb.Node.FromString(raw)
                nodes.append(raw)
                continue
            nodes.append(node)
        out.append(nodes)
    return out


def _files(tmp_path: Path, kind: str) -> tuple[list[bytes], list[str]]:
    ranks = _ranks(random.Random(kind), kind)
    bufs, paths = [], []
    for r, nodes in enumerate(ranks):
        recs = [n if isinstance(n, bytes) else n.SerializeToString() for n in nodes]
        head = META.SerializeToString()
        buf = _varint(len(head)) + head + b"".join(_varint(len(x)) + x for x in recs)
        p = tmp_path / f"{kind}.{r}.et"
        p.write_bytes(buf)
        bufs.append(buf)
        paths.append(str(p))
    return bufs, paths


def _columns_equal(a, b, offset: int = 0) -> None:
    """Every column of a equals b's (b decoded from files starting `offset` bytes later in its buffer)."""
    for f in ("node_id", "node_type", "duration_micros", "data_ptr", "data_idx", "ctrl_ptr", "ctrl_idx"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert a.names == b.names
    assert a.attrs.keys() == b.attrs.keys()
    for nm, x in a.attrs.items():
        y = b.attrs[nm]
        assert np.array_equal(x.kind, y.kind) and np.array_equal(x.value, y.value) and x.strings == y.strings
        if x.field_start is not None:
            assert np.array_equal(x.field_start, np.where(y.field_start >= 0, y.field_start + offset, -1))
            assert np.array_equal(x.field_end, np.where(y.field_end >= 0, y.field_end + offset, -1))


def _slice(cols, f: int):
    """File f's nodes of a batch's columns, as (ids, types, durations, names, data deps, attrs by name)."""
    lo, hi = int(cols.file_ptr[f]), int(cols.file_ptr[f + 1])
    out = []
    for i in range(lo, hi):
        attrs = {}
        for nm, c in cols.attrs.items():
            k = int(c.kind[i])
            if k >= 0:
                v = int(c.value[i])
                attrs[nm] = (
                    c.strings[v] if k == columnar.F_STRING else (bool(v) if k == columnar.F_BOOL else v)
                )
        deps = cols.data_idx[cols.data_ptr[i] : cols.data_ptr[i + 1]].tolist()
        out.append(
            (
                int(cols.node_id[i]),
                int(cols.node_type[i]),
                int(cols.duration_micros[i]),
                cols.names[i],
                deps,
                attrs,
            )
        )
    return out


def _protobuf_view(buf: bytes, want: frozenset[str]):
    _meta, nodes, _ = decode_stream(buf, "f.et")
    out = []
    for n in nodes:
        attrs = {}
        for a in n.attr:
            if a.name in want and a.WhichOneof("value") is not None:
                attrs[a.name] = getattr(a, a.WhichOneof("value"))
        out.append((n.id, n.type, n.duration_micros, n.name, list(n.data_deps), attrs))
    return out, nodes


def _check_batch(bufs: list[bytes], paths: list[str], want: frozenset[str]) -> None:
    for spans in (False, True):
        grouped = decode_columns(bufs, paths, want, spans=spans)
        _columns_equal(grouped, decode_columns(bufs, paths, want, spans=spans, group=False))
        base = 0
        for f, (buf, path) in enumerate(zip(bufs, paths, strict=True)):
            alone = decode_columns([buf], [path], want, spans=spans)
            view, nodes = _protobuf_view(buf, want)
            assert _slice(alone, 0) == view == _slice(grouped, f)
            if spans:
                lo = int(grouped.file_ptr[f])
                for j, node in enumerate(nodes):
                    i = lo + j
                    name_field = b"\x12" + _varint(len(node.name.encode())) + node.name.encode()
                    got = grouped.buf[grouped.name_start[i] : grouped.name_end[i]] if node.name else b""
                    assert got == (name_field if node.name else b"")
                    fields = {
                        a.name: b"\x52" + _varint(a.ByteSize()) + a.SerializeToString() for a in node.attr
                    }
                    for nm, c in grouped.attrs.items():
                        if nm in fields:
                            assert grouped.buf[c.field_start[i] : c.field_end[i]] == fields[nm]
                        else:
                            assert c.field_start[i] == -1
            base += len(buf)
    _check_span_subset(bufs, paths, want)


def _check_span_subset(bufs: list[bytes], paths: list[str], want: frozenset[str]) -> None:
    """spans naming some attributes: the columns of spans=True, only those attributes' field spans kept."""
    keep = frozenset(sorted(want)[::2])
    every = decode_columns(bufs, paths, want, spans=True)
    for group in (True, False):
        some = decode_columns(bufs, paths, want, spans=keep, group=group)
        _columns_equal(some, every)
        for f in ("frame_start", "name_start", "name_end"):
            assert np.array_equal(getattr(some, f), getattr(every, f)), f
        for nm, c in some.attrs.items():
            if nm in keep:
                assert np.array_equal(c.field_start, every.attrs[nm].field_start)
                assert np.array_equal(c.field_end, every.attrs[nm].field_end)
            else:
                assert c.field_start is None and c.field_end is None, nm


@pytest.mark.parametrize("kind", ["same", "device_group", "ids", "pg", "io_after"])
def test_grouped_decoding_equals_each_file_alone_and_protobuf(tmp_path: Path, kind: str, monkeypatch) -> None:
    bufs, paths = _files(tmp_path, kind)
    decoded = []
    inner = columnar._decode_nodes
    monkeypatch.setattr(
        columnar,
        "_decode_nodes",
        lambda src, units, *a: decoded.append(len(units.start)) or inner(src, units, *a),
    )
    _check_batch(bufs, paths, WANT)
    total = sum(len(frame_offsets(b)) - 1 for b in bufs)
    if kind in ("same", "pg"):  # replicas: only the distinct nodes were decoded
        assert decoded[0] <= total // 2
    if kind in ("device_group", "ids"):  # every rank's nodes differ: decoded as they are
        assert decoded[0] == total


def test_grouped_decoding_of_peer_traces() -> None:
    if not PEER.is_dir():
        pytest.skip("no peer traces beside the repository")
    checked = 0
    for d in sorted(p for p in PEER.rglob("*") if p.is_dir()):
        files = sorted(d.glob("*.et"))[:8]
        if not files:
            continue
        bufs = [f.read_bytes() for f in files]
        if any(b[:2] == b"\x1f\x8b" for b in bufs):
            continue
        try:
            decode_columns(bufs, [str(f) for f in files], WANT_ATTRS, group=False)
        except columnar.Unsupported:
            continue  # a form left to protobuf: nothing of this decoder's to compare
        _check_batch(bufs, [str(f) for f in files], WANT_ATTRS)
        checked += 1
    assert checked >= 3


def test_a_corrupted_replica_goes_to_protobuf_naming_its_file_and_node(tmp_path: Path) -> None:
    ranks = [[make_node(i, f"op{i}", pb.COMP_NODE, attrs={"layer": i, "tag": "x"}) for i in range(30)]] * 4
    write_trace_set(str(tmp_path / "t"), ranks)
    ts = discover(str(tmp_path / "t"))
    path = Path(ts.paths[2])
    raw = path.read_bytes()
    at = raw.index(b"op17") + len(b"op17")
    at = raw.index(b"\x01x", at) + 1  # the string value of node 17's "tag": not UTF-8 after this
    path.write_bytes(raw[:at] + b"\xff" + raw[at + 1 :])
    with pytest.raises(TraceFormatError) as ref:  # the node-by-node path's error, the reference
        decode_stream(path.read_bytes(), str(path))
    assert str(ref.value).startswith(f"{path}, node #17, ")
    reader = ColumnReader(ts)
    assert reader.get(2) is None  # left to protobuf, which reports it
    for r in (0, 1, 3):
        got = reader.get(r)
        assert got is not None
        cols, f = got
        view, _nodes = _protobuf_view(Path(ts.paths[r]).read_bytes(), WANT_ATTRS)
        assert _slice(cols, f) == view
    with pytest.raises(TraceFormatError) as exc:
        simulate(discover(str(tmp_path / "t")), network=None)  # the replay: the same one line
    assert str(exc.value) == str(ref.value)
