"""wire.node_bytes, the generator's node encoder, against protobuf's own serialization."""

from __future__ import annotations

import random

import pytest
from xsim.traces import attrs as A
from xsim.traces import pb
from xsim.traces.wire import attribute_field, node_bytes, varint, varint_table

ATTRS = [("layer", 3, "int64_val"), ("phase", "fwd", "string_val"), ("comm_size", 2**40, "uint64_val")]


def protobuf(nid, name, ntype, ctrl, data, dur, attrs) -> bytes:
    node = pb.Node(id=nid, name=name, type=ntype, ctrl_deps=ctrl, data_deps=data, duration_micros=dur)
    node.attr.extend(A.make_attr(n, v, k) for n, v, k in attrs)
    return node.SerializeToString()


@pytest.mark.parametrize(
    ("nid", "name", "ntype", "ctrl", "data", "dur"),
    [
        (0, "", 0, [], [], 0),  # every field at its default: nothing but the attributes
        (1, "L1.qkv.fwd.mb0", pb.COMP_NODE, [], [0], 12),
        (127, "x", pb.COMM_COLL_NODE, [126], [125], 0),  # one-byte varints at their edge
        (128, "é" * 70, pb.COMM_SEND_NODE, [127, 0], [1], 128),  # two bytes; a UTF-8 name past 127 bytes
        (16_384, "n" * 20_000, pb.COMM_RECV_NODE, [16_383], [16_382, 5], 2**35),  # past the 2^14 table
        (2**40, "big", pb.COMP_NODE, [2**40 - 1], [2**63], 2**64 - 1),  # ids and deps beyond any table
        (5, "deps", pb.COMP_NODE, [3] * 200, list(range(300)), 7),  # packed lists longer than 127 bytes
    ],
)
def test_node_bytes_equal_protobuf(nid, name, ntype, ctrl, data, dur):
    attrs = b"".join(attribute_field(n, v, k) for n, v, k in ATTRS)
    assert node_bytes(nid, name, ntype, ctrl, data, dur, attrs) == protobuf(
        nid, name, ntype, ctrl, data, dur, ATTRS
    )


def test_node_bytes_random_nodes_equal_protobuf():
    rng = random.Random(24)
    for _ in range(500):
        nid = rng.choice([0, rng.randrange(200), rng.randrange(100_000), rng.randrange(2**50)])
        ctrl = [rng.randrange(nid + 1) for _ in range(rng.choice([0, 1, 2, 5]))]
        data = [rng.randrange(nid + 1) for _ in range(rng.choice([0, 1, 3]))]
        dur = rng.choice([0, 1, rng.randrange(10**7)])
        name = rng.choice(["", "a", f"L{nid}.op.bwd.mb{rng.randrange(512)}"])
        ntype = rng.choice([0, pb.COMP_NODE, pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE])
        got = node_bytes(nid, name, ntype, ctrl, data, dur, b"")
        assert got == protobuf(nid, name, ntype, ctrl, data, dur, [])


def test_varint_table_grows_and_stays_exact():
    t = varint_table(70_000)
    assert len(t) >= 70_000
    assert all(t[i] == varint(i) for i in (0, 127, 128, 16_383, 16_384, 2**21 - 1, 69_999) if i < len(t))


def test_negative_dependency_is_an_error_not_wrong_bytes():
    with pytest.raises(ValueError):
        node_bytes(3, "n", pb.COMP_NODE, [], [-1], 0, b"")
