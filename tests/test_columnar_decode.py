"""The columnar decoder's cheap paths (issue 11, round 3) against independent references.

- frame_spans (the short-prefix loop) equals frame_offsets, spans and errors, on streams with one-, two-
  and three-byte length prefixes, cut at every kind of point;
- group_by_bytes groups attribute fields exactly as a Python dict of their bytes does, across the lengths
  where its key changes form (8, 16, 24, 32 bytes, then the dict) and with fields that differ in one byte
  only;
- bytes protobuf rejects inside attributes the replay does not read still go to the protobuf path
  (Unsupported), as they did when every node was parsed by protobuf first;
- node names decode as protobuf decodes them, also when they hold the separator bytes;
- the replay's comm nodes built once per distinct input raise the node-by-node path's error, at its node.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from xsim.replay import ReplayConfig
from xsim.replay.errors import TraceGraphError
from xsim.replay.program import build_program
from xsim.replay.simulation import ColumnReader, load_groups
from xsim.traces import pb
from xsim.traces.attrs import make_node
from xsim.traces.columnar import Unsupported, decode_columns
from xsim.traces.errors import TraceFormatError
from xsim.traces.et_stream_pb2 import NodeBatch
from xsim.traces.stream import decode_stream, encode_stream, frame_offsets, frame_spans
from xsim.traces.traceset import discover, write_trace_set
from xsim.traces.wire import group_by_bytes

from tests.program_reference import reference_program

ALL = frozenset({"layer", "phase", "comm_size", "pg_name", "num_ops"})


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _frames_or_error(fn, buf: bytes):
    try:
        return fn(buf, "f.et")
    except TraceFormatError as exc:
        return ("error", str(exc))


def test_frame_spans_equals_frame_offsets() -> None:
    rng = random.Random(11)
    meta = pb.GlobalMetadata(version="1")
    # Payloads of 0..127 bytes (one-byte prefix), up to 16 KiB (two), and one past 16 KiB (three).
    sizes = [0, 1, 127, 128, 300, 16383, 16384, 20000]
    nodes = [make_node(i, "x" * max(0, s - 8), pb.COMP_NODE) for i, s in enumerate(sizes)]
    base = encode_stream(meta, nodes)
    bufs = [base, encode_stream(meta, nodes[:4]), b"\x00", b"\x05ab", b"\x80", b"\xff\xff\xff\xff\xff\x01"]
    bufs += [base[: rng.randrange(1, len(base))] for _ in range(40)]  # truncated anywhere
    bufs += [base[:e] for _s, e in frame_offsets(base)]  # cut between frames
    bufs += [b"".join(_varint(n) + b"\x08" * n for n in rng.choices(sizes, k=6)) for _ in range(20)]
    bufs += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 60))) for _ in range(200)]
    checked = 0
    for buf in bufs:
        want = _frames_or_error(frame_offsets, buf)
        got = _frames_or_error(frame_spans, buf)
        if isinstance(want, tuple):
            assert got == want
            continue
        hs, ends = got
        assert list(zip(hs.tolist(), ends.tolist(), strict=True)) == want
        checked += 1
    assert checked > 10


def _attr_field(payload: bytes) -> bytes:
    return b"\x52" + _varint(len(payload)) + payload


def test_group_by_bytes_groups_fields_as_a_dict_of_their_bytes() -> None:
    rng = random.Random(5)
    vocab = []
    for n in (0, 1, 5, 6, 7, 13, 14, 15, 21, 22, 23, 29, 30, 31, 40, 200):
        p = bytes(rng.randrange(256) for _ in range(n))
        vocab.append(p)
        for at in {0, n // 2, n - 1, 6, 7, 14, 15, 22, 23} - {-1}:
            if 0 <= at < n:  # the same length, one byte apart: only an exact key tells them apart
                q = bytearray(p)
                q[at] ^= 0x40
                vocab.append(bytes(q))
    fields = [_attr_field(rng.choice(vocab)) for _ in range(3000)]
    gap = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 5))) for _ in fields]
    buf = b"".join(g + f for g, f in zip(gap, fields, strict=True))
    s, pos = [], 0
    for g, f in zip(gap, fields, strict=True):
        pos += len(g)
        s.append(pos)
        pos += len(f)
    s = np.asarray(s, dtype=np.int64)
    e = s + np.asarray([len(f) for f in fields], dtype=np.int64)
    b = np.frombuffer(buf + b"\x00" * 40, dtype=np.uint8)
    code, first = group_by_bytes(buf, b, s, e)
    seen: dict = {}
    want_code = [seen.setdefault(f, len(seen)) for f in fields]
    assert code.tolist() == want_code
    assert first.tolist() == [want_code.index(c) for c in range(len(seen))]
    assert len(seen) > 100


def _node_with_raw_attr(raw: bytes) -> tuple[bytes, bytes]:
    """(a framed file: metadata, then node 1 holding one attribute given as raw AttributeProto bytes;
    that node's bytes)."""
    node = make_node(1, "c", pb.COMP_NODE).SerializeToString() + _attr_field(raw)
    return encode_stream(pb.GlobalMetadata(version="1"), []) + _varint(len(node)) + node, node


@pytest.mark.parametrize(
    "raw",
    [
        b"\x0a\x01\xff",  # name: not UTF-8
        b"\x0a\x01x" + b"\xea\x01\x02\xc3\x28",  # string_val: not UTF-8
        b"\x0a\x01x" + b"\x52\x02\x08\x80",  # int64_list: its packed varint runs past the list
        b"\x0a\x01x" + b"\x0b",  # a group that never ends
    ],
)
def test_bytes_protobuf_rejects_go_to_protobuf_even_when_not_read(raw: bytes) -> None:
    buf, node = _node_with_raw_attr(raw)
    with pytest.raises(DecodeError):  # the reference: protobuf's own parse of the node
        NodeBatch.FromString(b"\x0a" + _varint(len(node)) + node)
    with pytest.raises(Unsupported):
        decode_columns([buf], ["f.et"], frozenset())  # "x" is not read, yet its bytes are checked
    with pytest.raises(TraceFormatError, match="node does not decode"):
        decode_stream(buf, "f.et")


def test_attributes_not_read_but_valid_are_taken() -> None:
    raw = b"\x0a\x03odd" + b"\xea\x01\x03\xc3\xa9x" + b"\x52\x02\x08\x05"  # string_val and list both set
    buf, node = _node_with_raw_attr(raw)
    assert len(NodeBatch.FromString(b"\x0a" + _varint(len(node)) + node).nodes) == 1
    cols = decode_columns([buf], ["f.et"], frozenset({"layer"}))
    assert cols.num_nodes == 1 and cols.names == ["c"] and cols.attrs == {}


@pytest.mark.parametrize("last", [0x00, 0x01, 0x02, 0x7F])
def test_ten_byte_varints(last: int) -> None:
    # duration_micros 5 written in ten bytes: protobuf keeps the low 64 bits of any tenth byte below 0x80.
    # The columnar decoder takes the value when it fits (a tenth byte of 0); bit 63 is past its duration
    # bound, and bits past 64 it leaves to protobuf: either way the protobuf path decides.
    dur = b"\x38" + b"\x85" + b"\x80" * 8 + bytes([last])
    node = make_node(1, "c", pb.COMP_NODE).SerializeToString() + dur
    buf = encode_stream(pb.GlobalMetadata(version="1"), []) + _varint(len(node)) + node
    _meta, nodes, _ = decode_stream(buf, "f.et")
    assert nodes[0].duration_micros == 5 + ((last & 1) << 63)
    if last == 0:
        assert decode_columns([buf], ["f.et"], frozenset()).duration_micros.tolist() == [5]
    else:
        with pytest.raises(Unsupported):
            decode_columns([buf], ["f.et"], frozenset())


def test_names_as_protobuf_decodes_them() -> None:
    names = ["", "a", "é\n", "\x00x", "\x1f", "\x7fz", "L1.attn.fwd.mb0", "日本"]
    nodes = [make_node(i, nm, pb.COMP_NODE) for i, nm in enumerate(names)]
    for picked in (nodes, nodes[:3], nodes[6:]):  # with every separator in use, with few
        buf = encode_stream(pb.GlobalMetadata(version="1"), picked)
        _meta, ref, _ = decode_stream(buf, "f.et")
        assert decode_columns([buf], ["f.et"], ALL).names == [n.name for n in ref]
    bad = make_node(1, "ab", pb.COMP_NODE).SerializeToString().replace(b"ab", b"a\xff")
    buf = encode_stream(pb.GlobalMetadata(version="1"), []) + _varint(len(bad)) + bad
    with pytest.raises(Unsupported):
        decode_columns([buf], ["f.et"], ALL)


def _coll(i: int, pg: str, size: int = 64) -> pb.Node:
    return make_node(
        i,
        f"ar{i}",
        pb.COMM_COLL_NODE,
        attrs={"comm_type": pb.ALL_REDUCE, "comm_size": size, "pg_name": pg},
    )


@pytest.mark.parametrize(
    ("rank0", "bad_id"),
    [
        ([_coll(1, "0"), _coll(2, "0"), _coll(3, "7"), _coll(4, "7")], 3),
        ([_coll(1, "0"), _coll(2, "7"), _coll(3, "0"), _coll(4, "7")], 2),
        ([_coll(1, "0"), _coll(2, "0", 32), _coll(3, "0"), _coll(4, "9")], 4),
    ],
)
def test_comm_nodes_fail_at_the_node_by_node_paths_node(tmp_path: Path, rank0, bad_id: int) -> None:
    write_trace_set(str(tmp_path / "t"), [rank0, [_coll(i, "0") for i in range(1, 5)]])
    ts = discover(str(tmp_path / "t"))
    groups = load_groups(ts, None)
    errors = []
    for columns in (None, ColumnReader(ts).get):
        with pytest.raises(TraceGraphError) as exc:
            build_program(ts, groups, None, ReplayConfig(), columns=columns)
        errors.append(str(exc.value))
    with pytest.raises(TraceGraphError) as exc:
        reference_program(ts, groups, None, ReplayConfig())
    errors.append(str(exc.value))
    assert errors[0] == errors[1] == errors[2]
    assert f"id {bad_id}:" in errors[0] and "is not a known process group" in errors[0]


def test_comm_nodes_share_their_matching_data_in_node_order(tmp_path: Path) -> None:
    rank = [_coll(1, "0"), _coll(2, "0", 32), _coll(3, "0"), _coll(4, "0", 32)]
    write_trace_set(str(tmp_path / "t"), [rank, rank])
    ts = discover(str(tmp_path / "t"))
    groups = load_groups(ts, None)
    slow = reference_program(ts, groups, None, ReplayConfig())
    fast = build_program(ts, groups, None, ReplayConfig(), columns=ColumnReader(ts).get)
    assert list(fast.coll.items()) == list(slow.coll.items())
    assert list(fast.coll) == list(range(8))
    assert [fast.coll[g].size for g in range(4)] == [64, 32, 64, 32]
