"""The .et stream: byte-exact framing, gzip, zero-length messages, reading every peer trace."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from xsim.traces import pb
from xsim.traces.attrs import make_node
from xsim.traces.stream import decode_stream, encode_stream, read_bytes, read_et, write_et

from tests.conftest import PEER, need_shared


def independent_count(buf: bytes) -> int:
    """Count varint32-framed messages with a parser written separately from traces.stream."""
    count, pos = 0, 0
    while pos < len(buf):
        length, shift = 0, 0
        while True:
            byte = buf[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        pos += length
        count += 1
    assert pos == len(buf)
    return count


def peer_et_files() -> list[Path]:
    return sorted(PEER.glob("chakra_et/**/*.et")) if PEER.exists() else []


def test_worked_example_bytes() -> None:
    # chakra-et.md 2.1: ASTRA-sim's all_reduce.0.et is 81 bytes; metadata "0.0.4", one COMM_COLL node with
    # is_cpu_op=false (bool_val), comm_type=0 and comm_size=1048576 (int64_val), id omitted because 0.
    node = make_node(
        0,
        "all_reduce_4npus_1MB",
        pb.COMM_COLL_NODE,
        attrs={"is_cpu_op": False, "comm_type": 0, "comm_size": 1048576},
    )
    data = encode_stream(pb.GlobalMetadata(version="0.0.4"), [node])
    assert len(data) == 81
    assert data[:9] == bytes([0x07, 0x0A, 0x05]) + b"0.0.4" + bytes([0x48])
    assert data[9:31] == bytes([0x12, 0x14]) + b"all_reduce_4npus_1MB"
    assert data[31:33] == bytes([0x18, 0x07])
    assert data[33:35] == bytes([0x52, 0x0E]) and data[46:49] == bytes([0xD8, 0x01, 0x00])
    assert data[-4:] == bytes([0x48, 0x80, 0x80, 0x40])


def test_packed_deps_encoding() -> None:
    # chakra-et.md 1: data_deps=[0] is encoded packed as 2a 01 00.
    node = pb.Node(id=1, type=pb.COMP_NODE)
    node.data_deps.append(0)
    assert bytes([0x2A, 0x01, 0x00]) in node.SerializeToString()


def test_zero_length_message_is_a_default_node(tmp_path: Path) -> None:
    # A Node with every field at its default serializes to 0 bytes; it is a node, not the end of file.
    nodes = [make_node(5, "a", pb.COMP_NODE), pb.Node(), make_node(7, "b", pb.COMP_NODE, data_deps=[5])]
    data = encode_stream(pb.GlobalMetadata(), nodes)
    assert b"\x00" in data
    meta, decoded, offsets = decode_stream(data)
    assert [n.id for n in decoded] == [5, 0, 7]
    assert decoded[1] == pb.Node()
    assert len(offsets) == 3


def test_forward_dependencies_and_any_order(tmp_path: Path) -> None:
    nodes = [make_node(3, "late", pb.COMP_NODE, data_deps=[9]), make_node(9, "early", pb.COMP_NODE)]
    path = tmp_path / "t.0.et"
    write_et(path, nodes)
    et = read_et(path)
    assert [n.id for n in et.nodes] == [3, 9]
    assert list(et.nodes[0].data_deps) == [9]


def test_gzip_chosen_by_name_and_detected_by_magic(tmp_path: Path) -> None:
    nodes = [make_node(i, f"n{i}", pb.COMP_NODE, duration_micros=i) for i in range(50)]
    gz = tmp_path / "t.0.et.gz"
    write_et(gz, nodes)
    raw = gz.read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    # Detection is by content, not by name: a gzip stream named .et still reads.
    plain_named = tmp_path / "u.0.et"
    plain_named.write_bytes(raw)
    for p in (gz, plain_named):
        et = read_et(p)
        assert et.gzipped and [n.duration_micros for n in et.nodes] == list(range(50))
    assert gzip.decompress(raw) == encode_stream(pb.GlobalMetadata(version="1.0.0"), nodes)
    # Deterministic: same nodes, same bytes.
    write_et(tmp_path / "v.0.et.gz", nodes)
    assert (tmp_path / "v.0.et.gz").read_bytes() == raw


@pytest.mark.parametrize("path", peer_et_files(), ids=lambda p: str(p.relative_to(PEER)))
def test_peer_et_round_trip_is_byte_identical(path: Path) -> None:
    raw, _ = read_bytes(path)
    et = read_et(path)
    assert 1 + len(et.nodes) == independent_count(raw)
    assert encode_stream(et.metadata, et.nodes) == raw


def test_peer_files_present_or_skipped() -> None:
    need_shared("peer_traces", "chakra_et")
    assert len(peer_et_files()) >= 100


@pytest.mark.parametrize(
    "rel",
    [
        "chakra_et/chakra_feeder_test_real_trace/chakra.0.et",
        "chakra_et/astra-sim-artifacts_T2D-analytical/trace",
        "chakra_et/tutorials_micro2024_MLP_ModelParallel_32npus",
        "chakra_et/astra-sim_microbenchmarks/all_to_all/16npus_1MB/all_to_all",
        "chakra_json_feeder/chakra.0.json.gz",
        "chakra_json_feeder/small_chakra.0.json",
    ],
)
def test_info_counts_match_independent_count(rel: str) -> None:
    parts = rel.split("/")
    path = need_shared("peer_traces", *parts[:-1]) / parts[-1]  # the last part may be a set's prefix
    out = subprocess.run(
        [sys.executable, "-m", "xsim", "trace", "info", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    info = json.loads(out.stdout)
    if rel.startswith("chakra_json_feeder"):
        raw = path.read_bytes()
        doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        expected = [len(doc["workload_graph"])]
        by_type: dict[str, int] = {}
        for n in doc["workload_graph"]:
            name = pb.node_type_name(n["NodeType"])
            by_type[name] = by_type.get(name, 0) + 1
    else:
        files = (
            [path]
            if path.is_file()
            else sorted(path.parent.glob(path.name + ".*.et")) or sorted(path.glob("*.et"))
        )
        expected = [independent_count(f.read_bytes()) - 1 for f in files]
        by_type = {}
        for f in files:
            for n in read_et(f).nodes:
                name = pb.node_type_name(n.type)
                by_type[name] = by_type.get(name, 0) + 1
    assert info["ranks"] == len(expected)
    assert info["nodes"] == sum(expected)
    assert sorted(info["nodes_per_rank"]) == sorted(expected)
    assert info["nodes_by_type"] == dict(sorted(by_type.items()))


def test_real_trace_counts() -> None:
    # peer_traces/README.md: 3664 nodes, 3643 COMP and 21 COMM_COLL.
    path = need_shared("peer_traces", "chakra_et", "chakra_feeder_test_real_trace", "chakra.0.et")
    et = read_et(path)
    kinds = [n.type for n in et.nodes]
    assert len(kinds) == 3664
    assert kinds.count(pb.COMP_NODE) == 3643 and kinds.count(pb.COMM_COLL_NODE) == 21
