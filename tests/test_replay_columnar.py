"""The one program builder over columns equals the node-by-node reference, field by field, on real inputs.

replay/build.py must build exactly the program that tests/program_reference.py (the node-by-node builder
from protobuf messages every release before the columnar representation used) builds, both from columns
decoded with numpy (traces/columnar.py) and from columns decoded from protobuf messages
(traces/node_columns.py, the path of JSON traces and of forms the numpy decoder declines). Checked on a generated heterogeneous set with the roofline compute of its
deployment (Figure 1 of the paper), the bundled tiny pipeline, ASTRA-sim's 32-rank MLP and T2D traces,
and a bundled PyTorch import (which the columnar decoder takes too, or leaves to protobuf).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from xsim.replay import ReplayConfig
from xsim.replay.program import Program, build_program
from xsim.replay.simulation import ColumnReader, load_groups
from xsim.tracegen import generate, load_spec
from xsim.tracegen.spec import save_deployment
from xsim.traces.columnar import Unsupported, decode_columns
from xsim.traces.traceset import TraceSet, discover

from tests.program_reference import reference_program
from tests.test_replay_support import SHARED

ROOT = Path(__file__).resolve().parents[1]
ET = SHARED / "peer_traces" / "chakra_et"


def _fields(p: Program) -> dict:
    out = {}
    for k in ("node_id", "node_type", "kind", "dur", "ndeps", "child_ptr", "child_idx", "queue"):
        out[k] = np.asarray(getattr(p, k), dtype=np.int64).tolist()
    for k in ("recorded_ns", "nbytes", "comm_type"):
        out[k] = np.asarray(getattr(p, k), dtype=np.int64).tolist()
    out["name"], out["pg_name"] = list(p.name), list(p.pg_name)
    out["queue_cap"], out["queue_label"] = p.queue_cap, p.queue_label
    out["coll"], out["p2p"] = p.coll, p.p2p
    out["rank_offset"] = list(p.rank_offset)
    out["ignored"] = (p.ignored_ctrl_deps, p.ctrl_deps_ignored_ranks)
    return out


def _annotations(p: Program) -> list[dict]:
    """Every node's annotation values, from the columns and the node-by-node dicts alike."""
    rows: list[dict] = [{} for _ in range(p.num_nodes)]
    for k, col in p.ann_cols.items():
        if len(col) == 2 and isinstance(col[1], np.ndarray):
            vals, ok = col
            for g in np.nonzero(ok)[0].tolist():
                rows[g][k] = int(vals[g])
        else:
            codes, table = col
            for g in np.nonzero(codes >= 0)[0].tolist():
                rows[g][k] = table[codes[g]]
    for g, a in p.annotations.items():
        rows[g].update({k: v for k, v in a.items() if v is not None})
    return rows


def _compare(ts: TraceSet, compute=None, config: ReplayConfig | None = None, groups_file=None) -> int:
    """Build from numpy-decoded columns, from protobuf-decoded columns and node by node (the reference);
    assert all equal; return how many ranks the numpy decoder took."""
    config = config or ReplayConfig(comm_streams="group")
    groups = load_groups(ts, groups_file, scan=True)
    assert groups == load_groups(ts, groups_file)
    reader = ColumnReader(ts)
    fast = build_program(ts, groups, compute, config, columns=reader.get)
    from_pb = build_program(ts, groups, compute, config)
    ref = reference_program(ts, groups, compute, config)
    assert _fields(fast) == _fields(ref) == _fields(from_pb)
    assert _annotations(fast) == _annotations(ref) == _annotations(from_pb)
    return sum(1 for r in range(ts.num_ranks) if reader.get(r) is not None)


def test_generated_figure1_with_roofline_and_recorded_durations(tmp_path: Path) -> None:
    from xsim.replay.compute import DurationModel, RooflineModel

    from xsim.api import catalog_device

    dep = load_spec(str(ROOT / "examples" / "figure1_paper.yaml"))
    generate(dep).write(tmp_path / "f1", dep.name)
    save_deployment(dep, tmp_path / "f1" / "deployment.json")
    ts = discover(str(tmp_path / "f1"))
    # The catalog roofline of each rank's GPU, and the generator's recorded exact durations (the default).
    roofline = RooflineModel(
        profiles={r: catalog_device(dg.gpu) for dg in dep.device_groups for r in dg.ranks}
    )
    for compute in (roofline, DurationModel()):
        for streams in ("group", "shared"):
            assert _compare(ts, compute, ReplayConfig(comm_streams=streams)) == 10  # every rank columnar


def test_tiny_pipeline() -> None:
    assert _compare(discover(str(ROOT / "traces" / "examples" / "tiny_pipeline"))) == 4


@pytest.mark.skipif(not ET.is_dir(), reason="../shared peer traces absent")
@pytest.mark.parametrize("name", ["tutorials_micro2024_MLP_ModelParallel_32npus", "T2D"])
def test_astra_sim_traces(name: str) -> None:
    art = ET / "astra-sim-artifacts_T2D-analytical"
    d = art / "trace" if name == "T2D" else ET / name
    groups = str(art / "inputs" / "comm_group.json") if name == "T2D" else None
    assert _compare(discover(str(d)), config=ReplayConfig(comm_streams="shared"), groups_file=groups) > 0


def test_pytorch_import(tmp_path: Path) -> None:
    from xsim.tracegen.importers.pytorch import import_pytorch

    ex = ROOT / "traces" / "examples" / "pytorch"
    ets = [str(ex / f"tinygpt_pp2_et.{r}.json.gz") for r in range(2)]
    kin = [str(ex / f"tinygpt_pp2_kineto.{r}.json.gz") for r in range(2)]
    import_pytorch(ets, kin).write(tmp_path / "pp")
    _compare(discover(str(tmp_path / "pp")))


def test_left_to_protobuf_forms() -> None:
    # A float attribute value the replay reads, and an unknown Node field: the columnar decoder declines.
    from xsim.traces import pb
    from xsim.traces.attrs import make_node
    from xsim.traces.stream import encode_stream

    n = make_node(1, "c", pb.COMP_NODE)
    n.attr.add(name="num_ops", double_val=1.5)
    buf = encode_stream(pb.GlobalMetadata(version="1"), [n])
    with pytest.raises(Unsupported):
        decode_columns([buf], ["x"], frozenset({"num_ops"}))
    ok = decode_columns([buf], ["x"], frozenset({"layer"}))  # not read: no reason to decline
    assert ok.num_nodes == 1 and ok.names == ["c"]
    bad = buf + b"\x03\xf8\x01\x01"  # a node holding field 31 (not in the Node schema)
    with pytest.raises(Unsupported):
        decode_columns([bad], ["x"], frozenset())


def test_ranks_with_the_same_edges_share_them_and_still_count_their_own(tmp_path: Path) -> None:
    # Ranks 0, 1 and 3 hold the same ids and deps (names and durations differ): the builder works their
    # edges out once. Each drops 2 ctrl deps (one on an absent id, one on itself), so 3 x 2 + rank 2's 1.
    from xsim.replay.build import build_rank
    from xsim.replay.compute import DurationModel
    from xsim.replay.program import _Builder
    from xsim.traces import pb
    from xsim.traces.attrs import make_node
    from xsim.traces.traceset import write_trace_set

    def rank(tag: str, last_deps: list[int], ctrl: list[int]) -> list:
        return [
            make_node(1, f"{tag}a", pb.COMP_NODE, duration_micros=3),
            make_node(2, f"{tag}b", pb.COMP_NODE, data_deps=[1], duration_micros=5),
            make_node(3, f"{tag}c", pb.COMP_NODE, data_deps=[1], ctrl_deps=ctrl, duration_micros=7),
            make_node(4, f"{tag}d", pb.COMP_NODE, data_deps=last_deps, duration_micros=len(tag)),
        ]

    ranks = [
        rank("r0", [2, 3], [99, 3]),
        rank("r1x", [2, 3], [99, 3]),
        rank("r2", [3], [99]),
        rank("r", [2, 3], [99, 3]),
    ]
    write_trace_set(str(tmp_path / "e"), ranks)
    ts = discover(str(tmp_path / "e"))
    assert _compare(ts) == 4
    groups = load_groups(ts, None)
    b = _Builder(groups, DurationModel(), ReplayConfig(), ts.num_ranks)
    reader = ColumnReader(ts)
    for r in range(4):
        build_rank(b, r, *reader.get(r))
    assert len(b.deps_cache) == 2 and b.ignored_ctrl == 7
    p = build_program(ts, groups, None, ReplayConfig(), columns=ColumnReader(ts).get)
    assert p.ignored_ctrl_deps == 7
    # Node 4 waits for 2 and 3 on ranks 0, 1, 3 and for 3 only on rank 2; node 1 has two children.
    assert np.asarray(p.ndeps).tolist() == [0, 1, 1, 2] * 2 + [0, 1, 1, 1] + [0, 1, 1, 2]
    assert np.diff(p.child_ptr).tolist() == [2, 1, 1, 0] * 2 + [2, 0, 1, 0] + [2, 1, 1, 0]


def _json_copy(ts: TraceSet, out: Path) -> TraceSet:
    """The same set with every rank written as a JSON trace (decoded with protobuf, then into columns)."""
    import shutil

    from xsim.traces.jsonview import dump_json

    out.mkdir()
    for r in range(ts.num_ranks):
        dump_json(ts.load(r), out / f"j.{r}.json")
    for extra in ("comm_group.json",):
        if (Path(ts.directory) / extra).exists():
            shutil.copy(Path(ts.directory) / extra, out / extra)
    return discover(str(out / "j"))


def test_features_of_the_old_node_by_node_path_go_through_the_one_builder(tmp_path: Path) -> None:
    # --speed (SpeedScaled, vectorised over a vectorised base), --as-gpu (WhatIfModel: the default loop
    # of its scalar duration_ns), a model outside the registry, --honour-stream, and JSON traces: each
    # built by replay/build.py equals the node-by-node reference field by field.
    from xsim.replay.compute import DeviceProfile, DurationModel, RooflineModel, SpeedScaled, capabilities_of
    from xsim.replay.whatif import WhatIfModel

    from tests.test_replay_support import coll, comp, recv, send, write_set

    tiny = discover(str(ROOT / "traces" / "examples" / "tiny_pipeline"))
    speed = SpeedScaled(DurationModel(), {0: 2.0, 1: 0.3, 3: 1.0})
    roof = RooflineModel(profiles={1: DeviceProfile(1e12, 1e9)}, default=DeviceProfile(3e11, 2e9))
    whatif = WhatIfModel({"gemm": 2.5, "memory": 1.5})

    class Scalar:
        name = "scalar"

        def duration_ns(self, rank: int, node) -> int:
            return 7 * rank + len(node.name) + node.duration_micros

    assert capabilities_of(speed).vectorised and capabilities_of(SpeedScaled(roof, {0: 2.0})).vectorised
    assert not capabilities_of(whatif).vectorised and not capabilities_of(Scalar()).vectorised
    assert not capabilities_of(SpeedScaled(whatif, {0: 2.0})).vectorised
    for compute in (
        speed,
        SpeedScaled(roof, {0: 2.0, 2: 0.7}),
        whatif,
        SpeedScaled(whatif, {1: 3.0}),
        Scalar(),
    ):
        assert _compare(tiny, compute) == 4
    # SpeedScaled's rounding, by hand: rank 1 at factor 0.3 runs a 10 us op in int(10000 / 0.3 + 0.5) ns.
    p = build_program(tiny, load_groups(tiny, None), speed, ReplayConfig(), columns=ColumnReader(tiny).get)
    base = build_program(tiny, load_groups(tiny, None), None, ReplayConfig(), columns=ColumnReader(tiny).get)
    r1 = range(p.rank_offset[1], p.rank_offset[2])
    scaled = [(int(base.dur[g]), int(p.dur[g])) for g in r1 if p.kind[g] == 0 and base.dur[g]]
    assert scaled and all(d == max(1, int(b / 0.3 + 0.5)) for b, d in scaled)

    # --honour-stream: compute and comm nodes on `stream` queues, numbered in node order with the process
    # groups' comm streams.
    r0 = [comp(1, 10, stream=7), coll(2, 64, deps=[1], stream=3), comp(3, 5, stream=7), send(4, 1, 0, 8)]
    r1 = [comp(1, 10), coll(2, 64, deps=[1]), comp(3, 5, stream=1), recv(4, 0, 0, 8)]
    r1[0].attr.add(name="stream", bool_val=True)  # a bool stream: its queue is labelled as Python prints it
    ts = write_set(tmp_path, [r0, r1])
    for streams in ("group", "shared"):
        assert _compare(ts, config=ReplayConfig(honour_stream=True, comm_streams=streams)) == 2
    p = build_program(ts, load_groups(ts, None), None, ReplayConfig(honour_stream=True, comm_streams="group"))
    assert "rank 1 stream True" in p.queue_label and "rank 1 stream 1" not in p.queue_label

    # JSON traces: no numpy-decoded columns at all.
    assert _compare(_json_copy(tiny, tmp_path / "json"), speed) == 0


def test_errors_come_in_node_order_across_the_lint_and_the_builder(tmp_path: Path) -> None:
    # One file, several broken nodes: the error reported is the first node's (by id), whichever stage of
    # the builder finds it, and the reference's message, from numpy and protobuf columns alike.
    from xsim.replay.errors import ReplayError

    from tests.test_replay_support import coll, comp, write_set

    def bad(node, name: str, **value):
        node.attr.add(name=name, **value)
        return node

    cases = {
        "comm before lint": [comp(1, 1), coll(2, 8, pg="nope"), bad(comp(3, 1), "comm_size", int64_val=-4)],
        "lint before comm": [comp(1, 1), bad(comp(2, 1), "layer", string_val="x"), coll(3, 8, pg="nope")],
        "float": [comp(1, 1), bad(comp(2, 1), "num_ops", double_val=1.5), coll(3, 8, pg="nope")],
        "twice": [comp(1, 1), bad(comp(2, 1, stage=1), "stage", int64_val=2), coll(3, 8, pg="nope")],
        "dep after comm": [comp(1, 1), coll(2, 8, deps=[9], pg="nope"), comp(3, 1)],
        "dep before comm": [comp(1, 1, deps=[9]), coll(2, 8, pg="nope")],
        "self dep": [comp(1, 1), comp(2, 1, deps=[2, 1]), coll(3, 8, ctype=99)],
        "duplicate id": [comp(2, 1), coll(1, 8, ctype=99), comp(2, 1)],
        "cycle after nodes": [
            comp(1, 1, deps=[2]),
            comp(2, 1, deps=[1]),
            bad(comp(3, 1), "is_cpu_op", string_val="y"),
        ],
        "cycle": [comp(1, 1, deps=[3]), comp(2, 1, deps=[1]), comp(3, 1, deps=[2]), comp(4, 1)],
    }
    for i, (label, nodes) in enumerate(cases.items()):
        ts = write_set(tmp_path, [nodes], name=f"c{i}")
        groups = load_groups(ts, {"0": (0,)})
        got = []
        for way in ("numpy", "protobuf", "reference"):
            with pytest.raises(ReplayError) as exc:
                if way == "reference":
                    reference_program(ts, groups, None, ReplayConfig())
                else:
                    cols = ColumnReader(ts).get if way == "numpy" else None
                    build_program(ts, groups, None, ReplayConfig(), columns=cols)
            got.append(str(exc.value))
        assert got[0] == got[1] == got[2], (label, got)


def test_a_bad_compute_model_is_named_at_its_node(tmp_path: Path) -> None:
    from xsim.replay.errors import ReplayError

    from tests.test_replay_support import comp, write_set

    class Negative:
        name = "neg"

        def duration_ns(self, rank: int, node) -> int:
            return -1 if node.id == 3 else 5

    ts = write_set(tmp_path, [[comp(1, 1), comp(3, 1), comp(2, 1)]])
    groups = load_groups(ts, None)
    with pytest.raises(ReplayError, match="compute model 'neg' gave -1 ns for 'comp3': need int >= 0"):
        build_program(ts, groups, Negative(), ReplayConfig(), columns=ColumnReader(ts).get)
