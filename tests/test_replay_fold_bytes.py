"""The byte-level fold proof (replay/fold_bytes.py): predictions equal protobuf's own encoding, and the
walk finds every difference.

The independent reference is protobuf's serializer: a file predicted from a template by swapping label
fields must be byte-identical to the file protobuf writes for the nodes with those labels.
"""

from __future__ import annotations

import numpy as np
from xsim.replay.fold_bytes import Template, first_diff, predict, predict_many, walk
from xsim.replay.program import WANT_ATTRS
from xsim.traces import pb
from xsim.traces.attrs import make_attr
from xsim.traces.columnar import decode_columns
from xsim.traces.stream import encode_stream
from xsim.traces.wire import name_field, read_varint32, varint

META = pb.GlobalMetadata(version="0.0.4")


def _nodes(pg: str, dg: int, name_pad: int) -> list[pb.Node]:
    """Three nodes; node 1's payload is 127 bytes with pg '1' and dg 0 (name_pad tunes it)."""
    out = []
    for i in range(3):
        nd = pb.Node(id=i, name=f"n{i}" + "x" * (name_pad if i == 1 else 0), type=pb.COMM_COLL_NODE)
        if i:
            nd.data_deps.append(i - 1)
        nd.attr.append(make_attr("device_group", dg, "int64_val"))
        nd.attr.append(make_attr("comm_type", pb.ALL_REDUCE, "int64_val"))
        nd.attr.append(make_attr("comm_size", 1 << 20, "int64_val"))
        nd.attr.append(make_attr("pg_name", pg, "string_val"))
        out.append(nd)
    return out


def _template(buf: bytes) -> tuple[Template, object]:
    cols = decode_columns([buf], ["t.et"], WANT_ATTRS, spans=True)
    t = Template(buf, cols.frame_start, cols.payload_start, cols.payload_end, cols.name_start, cols.name_end)
    return t, cols


def _field(name: str, value, kind: str) -> bytes:
    return pb.Node(attr=[make_attr(name, value, kind)]).SerializeToString()


def _pad_for_127() -> int:
    for pad in range(200):
        if len(_nodes("1", 0, pad)[1].SerializeToString()) == 127:
            return pad
    raise AssertionError("no padding gives a 127-byte node")


def test_prediction_equals_protobufs_bytes_across_a_length_prefix_change() -> None:
    pad = _pad_for_127()
    rep = encode_stream(META, _nodes("1", 0, pad))
    t, cols = _template(rep)
    assert (cols.payload_end - cols.payload_start)[1] == 127  # its prefix is 1 byte; 128 needs 2
    pg, dg = cols.attrs["pg_name"], cols.attrs["device_group"]
    # device_group 0 -> 300 (1 -> 2 value bytes) and pg_name "1" -> "13" on every node.
    starts = np.concatenate([dg.field_start, pg.field_start])
    ends = np.concatenate([dg.field_end, pg.field_end])
    owners = np.concatenate([np.arange(3), np.arange(3)])
    pool = [_field("device_group", 300, "int64_val"), _field("pg_name", "13", "string_val")]
    ids = np.asarray([0, 0, 0, 1, 1, 1])
    p = predict(t, starts, ends, owners, ids, pool)
    want = encode_stream(META, _nodes("13", 300, pad))
    assert p.buf == want
    assert len(want) == len(rep) + 3 * 2 + 1  # two more bytes per node, one more prefix byte on node 1
    got = _template(want)[0]
    assert np.array_equal(p.frame_start, got.frame_start) and np.array_equal(p.payload_end, got.payload_end)
    # Same-length swaps only (written in place): "1" -> "7".
    p7 = predict(
        t,
        pg.field_start,
        pg.field_end,
        np.arange(3),
        np.zeros(3, np.int64),
        [_field("pg_name", "7", "string_val")],
    )
    assert p7.buf == encode_stream(META, _nodes("7", 0, pad))


def test_walk_accepts_other_names_and_reports_every_differing_node() -> None:
    rep = encode_stream(META, _nodes("1", 0, 5))
    t, _cols = _template(rep)
    p = predict(
        t, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), []
    )
    other = _nodes("1", 0, 5)
    other[0].name = "renamed.to104"  # a longer name: node 0's length prefix and every later offset move
    other[2].attr[2].int64_val = (1 << 20) + 1  # comm_size: not a label
    xb = encode_stream(META, other)
    names, checked = {}, []

    def check(j: int, payload: bytes) -> bool:
        checked.append((j, pb.Node.FromString(payload)))
        return True

    assert walk(xb, p, check, names.__setitem__)
    assert names == {0: "renamed.to104"}
    assert [(j, nd.attr[2].int64_val) for j, nd in checked] == [(2, (1 << 20) + 1)]
    # A node the check cannot decide, or a header that differs, ends the walk with False.
    assert not walk(xb, p, lambda _j, _b: False, names.__setitem__)
    assert not walk(
        encode_stream(pb.GlobalMetadata(version="9.9.9"), _nodes("1", 0, 5)), p, check, names.__setitem__
    )
    # Identical bytes need no callback at all.
    assert walk(rep, p, lambda _j, _b: 1 / 0, lambda _j, _n: 1 / 0)


def test_first_diff_and_varint() -> None:
    a = bytes(range(256)) * 100
    b = bytearray(a)
    b[20_000] ^= 1
    assert first_diff(a, 0, bytes(b), 0) == 20_000
    assert first_diff(a, 5, a, 5) is None and first_diff(a, 0, a[:-3], 0) == len(a) - 3
    for v in (0, 1, 127, 128, 300, 16383, 16384, 2**31 - 1):
        assert pb.Node(id=v).SerializeToString() == (b"\x08" + varint(v) if v else b"")


def _label_sites() -> tuple:
    """The 3-node template's device_group and pg_name fields as predict's (template, starts, ends, owners,
    pool ids): device_group from pool entry 0, pg_name from entry 1."""
    rep = encode_stream(META, _nodes("1", 0, _pad_for_127()))
    t, cols = _template(rep)
    pg, dg = cols.attrs["pg_name"], cols.attrs["device_group"]
    starts = np.concatenate([dg.field_start, pg.field_start])
    ends = np.concatenate([dg.field_end, pg.field_end])
    owners = np.concatenate([np.arange(3), np.arange(3)])
    return t, starts, ends, owners, np.asarray([0, 0, 0, 1, 1, 1])


def test_cached_layouts_give_the_same_predictions() -> None:
    # predict_many reuses one layout for replacements of equal lengths ("13" and "14"; 300 and 301).
    t, starts, ends, owners, ids = _label_sites()
    cache: dict = {}
    for dgv, name in ((300, "13"), (301, "14"), (5, "7")):
        pool = [_field("device_group", dgv, "int64_val"), _field("pg_name", name, "string_val")]
        a = predict_many(t, starts, ends, owners, ids, pool, cache)
        b = predict(t, starts, ends, owners, ids, pool)
        assert a.buf == b.buf == encode_stream(META, _nodes(name, dgv, _pad_for_127()))
        assert np.array_equal(a.frame_start, b.frame_start) and np.array_equal(a.name_end, b.name_end)
    assert len(cache) == 2  # (2-byte value, 2-char name) once, (1-byte value, 1-char name) once


def test_layouts_mix_in_place_and_moving_replacements() -> None:
    # device_group 0 -> 7 keeps its length (written in place), pg_name "1" -> "13" grows (moves every later
    # byte): the cached layout's prediction is protobuf's own encoding.
    t, starts, ends, owners, ids = _label_sites()
    cache: dict = {}
    for dgv, name in ((7, "13"), (9, "14"), (0, "1")):
        pool = [_field("device_group", dgv, "int64_val"), _field("pg_name", name, "string_val")]
        a = predict_many(t, starts, ends, owners, ids, pool, cache)
        want = encode_stream(META, _nodes(name, dgv, _pad_for_127()))
        assert a.buf == want
        got = _template(want)[0]
        assert np.array_equal(a.frame_start, got.frame_start) and np.array_equal(a.name_start, got.name_start)
    assert len(cache) == 2


def test_peer_in_name() -> None:
    from xsim.replay.fold import _peer_in_name

    assert _peer_in_name("send_act.fwd.mb0.to8", 8) == ("send_act.fwd.mb0.to", "")
    assert _peer_in_name("recv.mb8.from8.x", 8) == ("recv.mb8.from", ".x")  # the last run equal to it
    assert _peer_in_name("send.to18", 8) is None and _peer_in_name("send", 8) is None


def test_name_field_is_protobufs() -> None:
    for name in ("send_act.fwd.mb0.to40", "x" * 200, "ünïcode.to7"):
        assert name_field(name) == pb.Node(name=name).SerializeToString()


def test_read_varint32_reads_what_varint_writes() -> None:
    for v in (0, 1, 127, 128, 300, 16383, 16384, 2**28, 2**32 - 1):
        enc = varint(v)
        assert read_varint32(b"\xff" + enc + b"\x00", 1) == (v, 1 + len(enc))
        assert read_varint32(enc[:-1], 0) is None  # cut off
    assert read_varint32(b"\x80" * 5 + b"\x01", 0) is None  # six bytes: not a varint32
