"""Copied ranks held as bytes (tracegen.rank_nodes) and graph edits applied on stand-ins (GraphEdit.apply_refs).

The references are the per-node paths they replace: `encode_stream` (one SerializeToString per node),
`GraphEdit.apply` on messages, and the generator building every rank without copies.
"""

from __future__ import annotations

from pathlib import Path

from xsim.tracegen import generate, load_spec
from xsim.tracegen.bundle import TraceBundle
from xsim.tracegen.planner.rewrite import rewrite_bundle
from xsim.tracegen.rank_nodes import CopiedRank, RankNodes, Records
from xsim.tracegen.workload import _Generator
from xsim.traces import pb
from xsim.traces.attrs import make_node
from xsim.traces.et_stream_pb2 import NodeBatch
from xsim.traces.graph import DepGraph, GraphEdit
from xsim.traces.stream import encode_stream, read_et

from tests.test_scale_hetero import scaled

META = pb.GlobalMetadata(version="0.0.4")


def _n(nid: int, *data: int, name: str = "") -> pb.Node:
    return make_node(nid, name or f"n{nid}", pb.COMP_NODE, data_deps=data, attrs={"layer": nid})


def _body(nodes: list[pb.Node]) -> bytes:
    """The node frames of encode_stream's output (the per-node writer), without the metadata frame."""
    return encode_stream(META, nodes)[len(encode_stream(META, [])) :]


def _nodes() -> list[pb.Node]:
    # One node of 20,000 bytes: its length prefix takes 3 bytes (varint of a value >= 2^14).
    return [_n(0), _n(1, 0), _n(2, 1, name="x" * 20_000), _n(3, 2), _n(4, 3)]


def test_records_frame_every_node_like_the_per_node_writer() -> None:
    nodes = _nodes()
    rec = Records.of_batch(NodeBatch(nodes=nodes).SerializeToString())
    assert rec.framed == _body(nodes)
    assert len(rec) == 5 and rec.starts[-1] == len(rec.framed)
    # Frame i starts where the frames before it end: 1-byte prefixes, then the 3-byte one of node 2.
    sizes = [n.ByteSize() for n in nodes]
    assert rec.starts[:3] == [0, 1 + sizes[0], 2 + sizes[0] + sizes[1]]
    assert rec.bodies[2] - rec.starts[2] == 3
    assert [rec.node(i).name for i in range(5)] == ["n0", "n1", "x" * 20_000, "n3", "n4"]
    again = Records.of_nodes([n.SerializeToString() for n in nodes])
    assert (again.batch, again.framed, again.starts, again.bodies) == (
        rec.batch,
        rec.framed,
        rec.starts,
        rec.bodies,
    )


def test_a_copied_rank_splices_its_patched_nodes_into_the_records() -> None:
    nodes = _nodes()
    rec = Records.of_nodes([n.SerializeToString() for n in nodes])
    new3 = _n(3, 1, name="patched")
    copy = CopiedRank.patched(rec, {3: new3.SerializeToString()})
    want = [*nodes[:3], new3, nodes[4]]
    assert copy.layout[0] == (0, 3) and copy.layout[2] == (4, 5) and len(copy) == 5
    assert copy.framed() == _body(want)
    assert [n.SerializeToString() for n in copy.nodes()] == [n.SerializeToString() for n in want]
    assert copy.node(3).name == "patched" and list(copy.node(3).data_deps) == [1]
    assert copy.refs() == [0, 1, 2, new3.SerializeToString(), 4]
    assert CopiedRank.of_refs(rec, copy.refs()).layout == copy.layout
    # How each node is held (the rewriter's key for what it read from a node): a record position of the
    # template, or the patched node's own bytes.
    assert copy.held(range(5)) == [0, 1, 2, new3.SerializeToString(), 4]
    assert copy.held([4]) == [4] and copy.held([1, 3]) == [1, new3.SerializeToString()]
    held = RankNodes({0: nodes})
    held.set_copy(1, copy)
    records, where = held.held(1, [2, 3, 4])
    assert records is rec and where == [2, new3.SerializeToString(), 4]
    assert held.held(0, [4]) is None  # a list rank: read with peek


def test_rank_nodes_keep_a_copy_as_bytes_until_it_is_read(tmp_path: Path) -> None:
    nodes = _nodes()
    rec = Records.of_nodes([n.SerializeToString() for n in nodes])
    held = RankNodes({0: nodes})
    held.set_copy(1, CopiedRank.patched(rec, {}))
    assert held.count(1) == 5 and held.total() == 10 and held.framed(0) is None
    held.peek(1, 4).name = "lost"  # a peeked node is a copy
    assert held.framed(1) == _body(nodes)
    bundle = TraceBundle(nodes=held)
    assert bundle.node_count() == 10
    listed = held[1]  # now a list for good: changes through it are what gets written
    listed[4].name = "kept"
    assert held.copy_of(1) is None and held.framed(1) is None
    bundle.write(tmp_path, "t")
    assert [n.name for n in read_et(tmp_path / "t.1.et").nodes] == ["n0", "n1", "x" * 20_000, "n3", "kept"]
    assert (tmp_path / "t.0.et").read_bytes() == encode_stream(pb.GlobalMetadata(version="0.0.4"), nodes)


def test_graph_edits_on_byte_stand_ins_give_the_messages_result() -> None:
    # The hand case of test_rewrite_passes.py::test_graph_edit_by_hand: 0 <- 1 <- 2 <- 3, insert 10 after 0
    # and 11 before 3, remove 2 (3 then depends on 11), and 1 also depends on 10.
    def edit(nodes: list[pb.Node]) -> GraphEdit:
        e = GraphEdit(nodes, DepGraph(nodes))
        e.insert_after(_n(10, 0), 0)
        e.insert_before(_n(11, 1), 3)
        e.replace_all_uses(2, [11])
        e.add_deps(1, [10])
        return e

    nodes = [_n(0), _n(1, 0), _n(2, 1), _n(3, 2)]
    out = edit(nodes).apply()
    assert [n.id for n in out] == [0, 10, 1, 11, 3]
    assert {n.id: list(n.data_deps) for n in out} == {0: [], 10: [0], 1: [0, 10], 11: [1], 3: [11]}
    originals = [_n(0), _n(1, 0), _n(2, 1), _n(3, 2)]
    rec = Records.of_nodes([n.SerializeToString() for n in originals])
    refs = edit(originals).apply_refs(list(range(4)), rec.node, lambda n: n.SerializeToString())
    # Node 0 is not read (its record stays); 1 and 3 are edited copies, 10 and 11 inserted.
    assert refs[0] == 0 and all(isinstance(x, bytes) for x in refs[1:])
    assert CopiedRank.of_refs(rec, refs).framed() == _body(out)
    assert [list(n.data_deps) for n in originals] == [[], [0], [1], [2]]  # read copies only


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _homogeneous() -> dict:
    """Llama-2 7B, TP 2 x PP 2 x DP 2 on H100 (8 ranks): copies across replicas, nothing to reshard."""
    groups = [
        {"id": 2 * r + k, "gpu": "H100", "ranks": f"{4 * r + 2 * k}-{4 * r + 2 * k + 1}", "tp": 2,
         "layers": [16 * k + 1, 16 * k + 16], "micro_batch": 1, "pp_stage": k, "dp_replica": r}
        for r in range(2) for k in range(2)
    ]  # fmt: skip
    return {"name": "homog8", "model": "llama2-7b", "seq_len": 2048, "micro_batches": 2, "schedule": "1f1b",
            "device_groups": groups}  # fmt: skip


def test_files_written_from_bytes_equal_every_rank_built_and_serialized_node_by_node(tmp_path: Path) -> None:
    for spec in (scaled(2), _homogeneous()):
        dep = load_spec(spec)
        fast = generate(dep)
        assert isinstance(fast.nodes, RankNodes)
        as_bytes = [r for r in fast.nodes if fast.nodes.copy_of(r) is not None]
        assert len(as_bytes) > len(fast.nodes) // 2  # most ranks never became messages
        fast.write(tmp_path / "fast", dep.name)
        slow = _Generator(dep, clone=False).run()
        rewrite_bundle(slow, dep, dep.reshard or "xsim")
        assert fast.node_count() == slow.node_count()
        TraceBundle(nodes=dict(slow.nodes), comm_groups=slow.comm_groups).write(tmp_path / "slow", dep.name)
        assert _files(tmp_path / "fast") == _files(tmp_path / "slow"), spec["name"]


def test_the_general_patch_paths_write_the_same_files(tmp_path: Path, monkeypatch) -> None:
    # Group records by parsing every node (taken when an attribute's bytes are not found exactly once per
    # node: b"" is found len + 1 times) and P2P peers found by name (position 0 holds `layer`, not
    # comm_src) must give the bytes of the fast paths.
    import xsim.tracegen.workload as workload

    dep = load_spec(scaled(2))  # two replicas of each kind: device groups copied from another's template
    generate(dep).write(tmp_path / "fast", dep.name)
    monkeypatch.setattr(workload._Generator, "attr_bytes", lambda self, attr: b"")
    monkeypatch.setattr(workload, "_COMM_SRC_AT", 0)
    parsed = []
    general = workload._Generator._group_records_parsed
    monkeypatch.setattr(
        workload._Generator, "_group_records_parsed", lambda *a: parsed.append(1) or general(*a)
    )
    generate(dep).write(tmp_path / "general", dep.name)
    assert parsed  # the general path ran
    assert _files(tmp_path / "fast") == _files(tmp_path / "general")
