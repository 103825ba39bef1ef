"""Attributes, JSON view, feeder JSON, trace-set discovery, process groups and cross-rank checks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from xsim.traces import attrs as A
from xsim.traces import pb
from xsim.traces.checks import MISMATCH, check_all, check_file, check_set, find_cycle
from xsim.traces.errors import AttributeTypeError, TraceSetError
from xsim.traces.groups import ProcessGroups, load_comm_groups, parse_metadata_node, resolve_groups
from xsim.traces.jsonview import dump_json, from_json_dict, load_json, to_json_dict
from xsim.traces.stream import EtFile, encode_stream, read_et
from xsim.traces.traceset import discover, write_trace_set

from tests.conftest import need_shared

INT_KINDS = sorted(A.INT_KINDS)


@pytest.mark.parametrize("kind", INT_KINDS)
def test_integer_attributes_read_from_any_integer_oneof(kind: str) -> None:
    node = pb.Node(id=3)
    node.attr.append(A.make_attr("comm_size", 4096, kind))
    assert A.comm_size(node) == 4096


def test_bool_from_int_and_int_from_bool() -> None:
    node = pb.Node(id=1)
    node.attr.append(A.make_attr("is_cpu_op", 1, "int32_val"))  # STG's spelling
    node.attr.append(A.make_attr("comm_tag", True, "bool_val"))
    assert A.is_cpu_op(node) is True
    assert A.comm_tag(node) == 1


def test_string_for_number_is_rejected_with_node_id() -> None:
    node = pb.Node(id=9)
    node.attr.append(A.make_attr("comm_size", "1MB", "string_val"))
    with pytest.raises(
        AttributeTypeError, match="id 9: attribute 'comm_size' holds string_val, expected an integer"
    ):
        A.comm_size(node)
    node2 = pb.Node(id=10)
    node2.attr.append(A.make_attr("num_ops", 2.5, "double_val"))
    with pytest.raises(AttributeTypeError, match="double_val"):
        A.num_ops(node2)
    assert A.get_float(node2, "num_ops") == 2.5


def test_missing_attribute_defaults() -> None:
    node = pb.Node(id=1)
    assert A.is_cpu_op(node) is False  # ASTRA-sim: missing = GPU op
    assert A.pg_name(node) == ""
    with pytest.raises(AttributeTypeError, match="missing attribute 'comm_size'"):
        A.comm_size(node)


def test_standard_attributes_get_the_reference_oneof() -> None:
    n = A.make_node(
        1,
        "x",
        pb.COMM_SEND_NODE,
        attrs={
            "comm_dst": 2,
            "comm_tag": 5,
            "comm_size": 10,
            "tensor_size": 7,
            "pg_name": "3",
            "is_cpu_op": False,
        },
    )
    kinds = {a.name: a.WhichOneof("value") for a in n.attr}
    assert kinds == {
        "comm_dst": "int32_val",
        "comm_tag": "int32_val",
        "comm_size": "int64_val",
        "tensor_size": "uint64_val",
        "pg_name": "string_val",
        "is_cpu_op": "bool_val",
    }


def test_json_view_is_lossless_for_64_bit_values(tmp_path: Path) -> None:
    big = (1 << 64) - 1
    node = A.make_node(big, "big", pb.COMP_NODE, data_deps=[big - 1], duration_micros=big)
    node.attr.append(A.make_attr("u", big, "uint64_val"))
    node.attr.append(A.make_attr("s", -(1 << 63), "sint64_val"))
    node.attr.append(A.make_attr("f", 0.1, "float_val"))
    node.attr.append(A.make_attr("l", [1 << 62, -5], "int64_list"))
    other = A.make_node(big - 1, "dep", 17)  # unknown enum value survives too
    et = EtFile("x", pb.GlobalMetadata(version="1.0.0"), [node, other])
    doc = to_json_dict(et)
    text = json.dumps(doc)
    assert str(big) in text  # 64-bit integers are strings in JSON, never rounded floats
    back = from_json_dict(json.loads(text))
    assert encode_stream(back.metadata, back.nodes) == encode_stream(et.metadata, et.nodes)
    dump_json(et, tmp_path / "x.0.json")
    assert isinstance(json.loads((tmp_path / "x.0.json").read_text()), dict)  # one document, not concatenated


def test_cli_json_round_trip_on_a_real_set(tmp_path: Path) -> None:
    src = need_shared("peer_traces", "chakra_et", "chakra_feeder_test_real_trace", "chakra.0.et")
    run = lambda *a: subprocess.run([sys.executable, "-m", "xsim", "trace", *a], check=True, timeout=120)  # noqa: E731
    run("to-json", str(src), str(tmp_path / "c.0.json"))
    run("from-json", str(tmp_path / "c.0.json"), str(tmp_path / "back.0.et"))
    assert (tmp_path / "back.0.et").read_bytes() == src.read_bytes()


def test_feeder_json_reads_same_graph_as_et() -> None:
    js = load_json(need_shared("peer_traces", "chakra_json_feeder", "chakra.0.json.gz"))
    et = read_et(need_shared("peer_traces", "chakra_et", "chakra_feeder_test_real_trace", "chakra.0.et"))
    assert [n.id for n in js.nodes] == [n.id for n in et.nodes]
    assert [list(n.data_deps) for n in js.nodes] == [list(n.data_deps) for n in et.nodes]
    assert [n.duration_micros for n in js.nodes] == [n.duration_micros for n in et.nodes]
    small = load_json(need_shared("peer_traces", "chakra_json_feeder", "small_chakra.0.json"))
    assert len(small.nodes) == 7
    assert list(small.nodes[0].ctrl_deps) == [3] and small.nodes[0].duration_micros == 318
    assert A.is_cpu_op(small.nodes[0]) is True


def _tiny(n: int) -> list[list[pb.Node]]:
    return [[A.make_node(0, "c", pb.COMP_NODE, duration_micros=1)] for _ in range(n)]


def test_trace_set_discovery(tmp_path: Path) -> None:
    write_trace_set(tmp_path / "a" / "w", _tiny(3))
    for p in (tmp_path / "a", tmp_path / "a" / "w", tmp_path / "a" / "w.1.et"):
        ts = discover(p)
        assert ts.num_ranks == (1 if str(p).endswith(".et") else 3)
    (tmp_path / "a" / "w.1.et").unlink()
    with pytest.raises(TraceSetError, match="ranks 1 missing of 0..2"):
        discover(tmp_path / "a")
    write_trace_set(tmp_path / "b" / "x", _tiny(2))
    write_trace_set(tmp_path / "b" / "y", _tiny(2))
    with pytest.raises(TraceSetError, match="several trace sets"):
        discover(tmp_path / "b")
    with pytest.raises(TraceSetError, match="no such file"):
        discover(tmp_path / "nothing")


def test_metadata_node_groups_and_stoi_names() -> None:
    # PyTorch converter: inputs.values is str() of a one-element list holding the JSON group list.
    node = pb.Node(id=3, name="## process_group:init ##", type=pb.METADATA_NODE)
    node.inputs.values = str(
        ['[{"pg_name": "0", "ranks": [], "group_size": 4}, {"pg_name": "7", "ranks": [1, 3]}]']
    )
    groups = parse_metadata_node(node, 4)
    assert groups == {"0": (0, 1, 2, 3), "7": (1, 3)}
    pg = ProcessGroups(num_ranks=4, groups={"1": (0, 1)})
    assert pg.members("1.0") == (0, 1)  # ASTRA-sim std::stoi
    assert pg.members("") == (0, 1, 2, 3) and pg.members("0") == (0, 1, 2, 3)
    assert pg.members("5") is None


def test_comm_group_file_errors(tmp_path: Path) -> None:
    f = tmp_path / "g.json"
    f.write_text('{"1": [0, 9]}')
    with pytest.raises(Exception, match="outside 0..3"):
        load_comm_groups(f, 4)
    f.write_text("[1, 2]")
    with pytest.raises(Exception, match="must be an object"):
        load_comm_groups(f, 4)


def _p2p_set(tag_recv: int) -> list[EtFile]:
    send = A.make_node(0, "s", pb.COMM_SEND_NODE, attrs={"comm_dst": 1, "comm_tag": 4, "comm_size": 64})
    recv = A.make_node(
        0, "r", pb.COMM_RECV_NODE, attrs={"comm_src": 0, "comm_tag": tag_recv, "comm_size": 64}
    )
    return [EtFile("r0", pb.GlobalMetadata(), [send]), EtFile("r1", pb.GlobalMetadata(), [recv])]


def test_unmatched_send_and_recv() -> None:
    groups = ProcessGroups(2, {})
    assert check_set(_p2p_set(4), groups) == []
    found = check_set(_p2p_set(5), groups)
    assert {f.code for f in found} == {"unmatched-send", "unmatched-recv"}
    assert all(f.kind == MISMATCH for f in found)
    assert "src=0 dst=1 tag=4 size=64" in str(found[0])


def _coll(i: int, ctype: int, size: int, pg: str) -> pb.Node:
    return A.make_node(
        i,
        f"c{i}",
        pb.COMM_COLL_NODE,
        data_deps=[i - 1] if i else [],
        attrs={"comm_type": ctype, "comm_size": size, "pg_name": pg},
    )


def test_collective_sequences_must_agree() -> None:
    groups = ProcessGroups(3, {"1": (0, 1)})
    ok = [
        EtFile("r0", pb.GlobalMetadata(), [_coll(0, pb.ALL_REDUCE, 8, "1"), _coll(1, pb.ALL_GATHER, 4, "")]),
        EtFile("r1", pb.GlobalMetadata(), [_coll(0, pb.ALL_REDUCE, 8, "1"), _coll(1, pb.ALL_GATHER, 4, "")]),
        EtFile("r2", pb.GlobalMetadata(), [_coll(0, pb.ALL_GATHER, 4, "")]),
    ]
    assert check_all(ok, groups) == []
    bad_size = [
        ok[0],
        EtFile("r1", pb.GlobalMetadata(), [_coll(0, pb.ALL_REDUCE, 16, "1"), _coll(1, pb.ALL_GATHER, 4, "")]),
        ok[2],
    ]
    (f,) = check_all(bad_size, groups)
    assert f.code == "coll-mismatch" and f.rank == 1 and "16 B here" in f.message
    missing = [ok[0], ok[1], EtFile("r2", pb.GlobalMetadata(), [])]
    (f,) = check_all(missing, groups)
    assert f.code == "coll-count" and f.rank == 2
    outsider = [
        ok[0],
        ok[1],
        EtFile("r2", pb.GlobalMetadata(), [_coll(0, pb.ALL_GATHER, 4, ""), _coll(1, pb.ALL_REDUCE, 8, "1")]),
    ]
    assert any(f.code == "not-a-member" for f in check_all(outsider, groups))


def test_cycle_report_and_ctrl_only_cycle_is_a_warning() -> None:
    nodes = [
        A.make_node(1, "a", 4, data_deps=[3]),
        A.make_node(2, "b", 4, data_deps=[1]),
        A.make_node(3, "c", 4, data_deps=[2]),
    ]
    assert find_cycle(nodes) == [1, 2, 3]
    ctrl = [A.make_node(1, "a", 4, ctrl_deps=[2]), A.make_node(2, "b", 4, data_deps=[1])]
    (f,) = check_file(EtFile("x", pb.GlobalMetadata(), ctrl))
    assert f.code == "ctrl-cycle" and f.kind == "warning"


@pytest.mark.parametrize("t", ["T1D", "T2D", "T3D"])
def test_astra_artifacts_validate_with_their_comm_groups(t: str) -> None:
    base = need_shared("peer_traces", "chakra_et", f"astra-sim-artifacts_{t}-analytical")
    ts = discover(base / "trace")
    files = list(ts)
    groups = resolve_groups(
        ((f.path, f.nodes) for f in files), ts.num_ranks, comm_groups=base / "inputs" / "comm_group.json"
    )
    assert check_all(files, groups) == []


def test_comm_group_json_beside_the_set_is_used(tmp_path: Path) -> None:
    base = need_shared("peer_traces", "chakra_et", "astra-sim-artifacts_T2D-analytical")
    shutil.copytree(base / "trace", tmp_path / "t")
    shutil.copy(base / "inputs" / "comm_group.json", tmp_path / "t" / "comm_group.json")
    res = subprocess.run(
        [sys.executable, "-m", "xsim", "trace", "validate", str(tmp_path / "t")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    res = subprocess.run(
        [sys.executable, "-m", "xsim", "trace", "validate", str(base / "trace")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and "coll-count" in res.stdout  # "0.0" = all ranks without the groups file


def test_generated_protobuf_modules_match_protoc(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools.protoc")
    repo = Path(__file__).resolve().parents[1]
    res = subprocess.run(
        [sys.executable, str(repo / "scripts" / "protos.py"), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    for name in ("traces/et_def_pb2.py", "traces/et_stream_pb2.py", "tracegen/deployment_pb2.py"):
        assert (tmp_path / name).read_text() == (repo / name).read_text(), (
            f"{name} is stale: run scripts/protos.py"
        )
    # The modules import each other under the installed package name (issue 25 item 5).
    assert "from xsim.traces import et_def_pb2" in (repo / "traces" / "et_stream_pb2.py").read_text()


def test_stg_style_set_groups_from_prefix_json(tmp_path: Path) -> None:
    # STG writes workload.<rank>.et plus workload.json {"<id>": [ranks]}, the group as the legacy int32
    # `comm_group` attribute and is_cpu_op as int32_val (chakra-et.md 3.1).
    per_rank = []
    for r in range(4):
        n = A.make_node(0, "ar", pb.COMM_COLL_NODE, attrs={"comm_type": pb.ALL_REDUCE, "comm_size": 64})
        n.attr.append(A.make_attr("comm_group", 1 if r < 2 else 2, "int32_val"))
        n.attr.append(A.make_attr("is_cpu_op", 0, "int32_val"))
        per_rank.append([n])
    write_trace_set(tmp_path / "workload", per_rank)
    (tmp_path / "workload.json").write_text('{"1": [0, 1], "2": [2, 3]}')
    ts = discover(tmp_path)
    files = list(ts)
    groups = resolve_groups(((f.path, f.nodes) for f in files), 4, directory=ts.directory, prefix=ts.prefix)
    assert groups.groups == {"1": (0, 1), "2": (2, 3)}
    assert check_all(files, groups) == []
    # Without the groups file "1" and "2" are unknown names: every rank is flagged.
    bare = resolve_groups(((f.path, f.nodes) for f in files), 4)
    assert {f.code for f in check_all(files, bare)} == {"unknown-group"}


def test_unready_is_kahns_leftover_by_hand() -> None:
    from xsim.traces.graph import unready

    # 0 -> 1 -> 2 -> 1 (a cycle of 1 and 2), 2 -> 3 (behind it), 4 alone, 0 -> 5.
    children = [[1, 5], [2], [1, 3], [], [], []]
    ndeps = [0, 2, 1, 1, 0, 1]
    assert unready(ndeps, children) == [1, 2, 3]
    assert unready([0, 1, 1], [[1], [2], []]) == []
    assert unready([], []) == []
