"""Symmetric-replica folding (`simulate(fold=...)`, `xsim replay --fold`): equal to the unfolded replay, or refused.

The acceptance rule is exact equality: a folded replay's summary, ranks, ops and collectives tables equal
the unfolded replay's, so the unfolded replay of the same inputs is the independent reference. Each
equality test also checks that folding happened (the engine ran 1/m of the nodes, through `progress`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal
from xsim.replay import ReplayConfig, ReplayError, simulate
from xsim.replay.fold import fold_from_deployment, resolve_fold
from xsim.tracegen import generate, load_spec
from xsim.tracegen.spec import save_deployment
from xsim.traces import pb
from xsim.traces.attrs import COMM_DST, COMM_SIZE, PG_NAME, get_int, get_str, set_attr
from xsim.traces.stream import write_et
from xsim.traces.traceset import discover

from xsim import api
from xsim.cli import build_parser
from xsim.cmd_replay import options

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
ET = SHARED / "peer_traces" / "chakra_et"
CFG = SHARED / "peer_configs" / "astra-sim"


def _spec(name: str, schedule: str, dp: int = 4, tp: int = 2, pp: int = 2) -> dict:
    """Llama-2 7B (32 layers, model card), TP x PP x DP homogeneous H100, short sequences (fast)."""
    groups = []
    per = 32 // pp
    for r in range(dp):
        for k in range(pp):
            first = tp * pp * r + tp * k
            groups.append(
                {"id": pp * r + k, "gpu": "H100", "ranks": list(range(first, first + tp)), "tp": tp,
                 "layers": [per * k + 1, per * k + per], "micro_batch": 1, "pp_stage": k, "dp_replica": r}
            )  # fmt: skip
    return {"name": name, "model": "llama2-7b", "seq_len": 128, "micro_batches": 2, "schedule": schedule,
            "device_groups": groups}  # fmt: skip


@pytest.fixture(scope="module")
def gen_sets(tmp_path_factory) -> dict[str, Path]:
    """Two homogeneous generated sets (1F1B and GPipe), TP 2 x PP 2 x DP 4 = 16 ranks."""
    root = tmp_path_factory.mktemp("fold")
    out = {}
    for sched in ("1f1b", "gpipe"):
        dep = load_spec(_spec(f"fold_{sched}", sched))
        d = root / sched
        generate(dep).write(d, dep.name)
        save_deployment(dep, d / "deployment.json")
        out[sched] = d
    return out


def _replay(path, *cli_args: str, fold=None, groups=None):
    """Replay as `xsim replay PATH ARGS` does; returns (result, nodes the engine ran)."""
    args = build_parser().parse_args(["replay", str(path), "--no-progress", *cli_args])
    opts = options(args)
    ts = discover(args.path)
    dep = api.load_deployment(ts)
    seen = []
    res = simulate(
        ts,
        network=api.build_network(opts.network, dep),
        compute=api.build_compute(opts.compute, ts.num_ranks),
        groups=groups if groups is not None else args.comm_groups,
        config=ReplayConfig(comm_mode=args.comm),
        fold=fold,
        progress=lambda done, n: seen.append(n),
    )
    return res, seen[-1]


def _assert_same(a, b, tmp_path: Path) -> None:
    # Saved first: a folded result streams its ops table to the files (replay/fold_tables.py) unless a
    # caller has read `ops` (then it is written whole).
    a.save(tmp_path / "a")
    b.save(tmp_path / "b")
    for name in ("summary.json", "summary.csv", "ops.csv", "ranks.csv", "collectives.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    for name in ("ops.parquet", "ranks.parquet", "collectives.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert a.summary_dict() == b.summary_dict()
    assert_frame_equal(a.ranks, b.ranks)
    assert_frame_equal(a.ops, b.ops)
    assert_frame_equal(a.collectives, b.collectives)


@pytest.mark.parametrize("sched", ["1f1b", "gpipe"])
def test_generated_fold_equals_unfolded(gen_sets, sched: str, tmp_path: Path) -> None:
    a, n_a = _replay(gen_sets[sched])
    b, n_b = _replay(gen_sets[sched], fold=True)
    # DP 4: the engine ran one replica's nodes (a quarter), the tables hold all 16 ranks.
    assert n_a == a.summary_dict()["num_nodes"] and n_b * 4 == n_a
    assert a.ops["rank"].n_unique() == 16 and a.summary_dict()["num_p2p"] > 0
    _assert_same(a, b, tmp_path)


def test_streamed_chunks_of_any_size(gen_sets, tmp_path: Path, monkeypatch) -> None:
    # The expansion streams the ops table in chunks of whole ranks; rows per chunk from 1 (every rank its
    # own chunk) to more than the table: the same bytes as the unfolded replay's table written whole.
    import xsim.replay.fold_tables as ft

    a, _ = _replay(gen_sets["1f1b"])
    for rows in (1, 1000, 10**9):
        monkeypatch.setattr(ft, "CHUNK_ROWS", rows)
        b, _ = _replay(gen_sets["1f1b"], fold=True)
        _assert_same(a, b, tmp_path / str(rows))


def test_deployment_candidate(gen_sets) -> None:
    fold = resolve_fold(True, discover(gen_sets["1f1b"]))
    # Replica r holds device groups 2r (stage 0, ranks 4r, 4r+1) and 2r+1 (stage 1, ranks 4r+2, 4r+3).
    assert fold.replicas == tuple(tuple(range(4 * r, 4 * r + 4)) for r in range(4))


def test_measured_mode_fold(gen_sets, tmp_path: Path) -> None:
    # The generator records no comm durations; give every comm node 5 us (all ranks alike), then time
    # communication by duration_micros, with no network model at all.
    d = tmp_path / "set"
    shutil.copytree(gen_sets["1f1b"], d)
    (d / "deployment.json").unlink()  # no cluster: --comm measured needs no network
    ts = discover(d)
    for r in range(ts.num_ranks):
        ef = ts.load(r)
        nodes = list(ef.nodes)
        for nd in nodes:
            if nd.type in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                nd.duration_micros = 5
        write_et(ef.path, nodes, ef.metadata)
    a, _ = _replay(d, "--comm", "measured")
    b, n = _replay(d, "--comm", "measured", fold=[list(range(4 * q, 4 * q + 4)) for q in range(4)])
    assert n * 4 == a.summary_dict()["num_nodes"] and a.summary_dict()["network_model"] == "none"
    _assert_same(a, b, tmp_path)


def test_cli_fold_json(gen_sets, capsys) -> None:
    from xsim.cli import main

    assert main(["replay", str(gen_sets["gpipe"]), "--no-progress", "--json", "--no-fold"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["replay", str(gen_sets["gpipe"]), "--no-progress", "--json", "--fold"]) == 0
    folded = json.loads(capsys.readouterr().out)
    assert plain["perf"]["fold"] == "unfolded" and plain["perf"]["fold_reason"] == "folding off (--no-fold)"
    assert folded["perf"]["fold"] == "folded" and folded["perf"]["fold_factor"] == 4
    assert main(["replay", str(gen_sets["gpipe"]), "--no-progress", "--json"]) == 0  # folds by default
    default = json.loads(capsys.readouterr().out)
    assert default["perf"]["fold"] == "folded" and default["perf"]["fold_factor"] == 4
    plain.pop("perf"), folded.pop("perf"), default.pop("perf")
    assert plain == folded == default


needs_astra = pytest.mark.skipif(not ET.is_dir() or not CFG.is_dir(), reason="../shared peer traces absent")


@needs_astra
@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
def test_astra_microbenchmarks_fold(kind: str, tmp_path: Path) -> None:
    # Every rank alike (node ids are offset by the rank there: a constant shift, same graph).
    args = (
        "--astra-network",
        str(CFG / "network/repo_examples_Ring_8npus.yml"),
        "--astra-system",
        str(CFG / "system/repo_examples_Ring_4chunks.json"),
    )
    path = ET / f"astra-sim_microbenchmarks/{kind}/8npus_1MB"
    a, _ = _replay(path, *args)
    b, n = _replay(path, *args, fold=True)
    assert n == 1
    _assert_same(a, b, tmp_path)


@needs_astra
def test_astra_t2d_explicit_replicas(tmp_path: Path) -> None:
    # 16 NPUs, groups "0".."3" = [4q..4q+3] and the cross groups [q, q+4, q+8, q+12]: ranks 4q..4q+3 as
    # replica q is a valid fold (the first groups stay inside a replica, the cross groups are shared).
    t = ET / "astra-sim-artifacts_T2D-analytical"
    args = ("--astra-network", str(t / "inputs/network.yml"), "--astra-system", str(t / "inputs/sys.json"))
    groups = str(t / "inputs/comm_group.json")
    a, _ = _replay(t / "trace", *args, groups=groups)
    reps = [list(range(4 * q, 4 * q + 4)) for q in range(4)]
    b, n = _replay(t / "trace", *args, groups=groups, fold=reps)
    assert n * 4 == a.summary_dict()["num_nodes"]
    _assert_same(a, b, tmp_path)
    # The automatic candidate (every rank alike) does not hold there: refused, naming the group.
    with pytest.raises(ReplayError, match="spans the replicas unevenly"):
        _replay(t / "trace", *args, groups=groups, fold=True)


def test_refuses_flow_model(gen_sets) -> None:
    with pytest.raises(ReplayError, match="cannot fold on network model 'flow'.*contention-free"):
        _replay(gen_sets["1f1b"], "--model", "flow", fold=True)


def test_refuses_heterogeneous_deployment(tmp_path: Path) -> None:
    # Figure 1: replica 0 is cut TP 3 / TP 2, replica 1 TP 2 / TP 3 (the paper's example).
    dep = load_spec(REPO / "examples" / "figure1_paper.yaml")
    save_deployment(dep, tmp_path / "deployment.json")
    doc = json.loads((tmp_path / "deployment.json").read_text())
    with pytest.raises(
        ReplayError, match=r"heterogeneous replicas: device group 2 of replica 1 .*\(tp 2 vs 3"
    ):
        fold_from_deployment(doc, "deployment.json", 10)


def test_refuses_differing_replica(gen_sets, tmp_path: Path) -> None:
    # Rank 6 (replica 1, stage 1) gets one collective's size doubled: not a copy of rank 2 any more.
    d = tmp_path / "set"
    shutil.copytree(gen_sets["1f1b"], d)
    ts = discover(d)
    ef = ts.load(6)
    nodes = list(ef.nodes)
    target = next(n for n in nodes if get_int(n, COMM_SIZE, 0) > 0)
    set_attr(target, COMM_SIZE, 2 * get_int(target, COMM_SIZE, 0))
    write_et(ef.path, nodes, ef.metadata)
    with pytest.raises(
        ReplayError, match=rf"fold_1f1b\.6\.et: cannot fold rank 6 onto rank 2: node {target.id} "
    ):
        _replay(d, fold=True)


def test_refuses_wrong_group_or_peer(gen_sets, tmp_path: Path) -> None:
    # comm_group.json: "1" = [0, 1] is replica 0's stage-0 TP group, "3" = [4, 5] replica 1's. Rank 4's
    # TP collectives name "3"; renamed to "1" they name a group of replica 0 (rank 4 is not even in it).
    d = tmp_path / "set"
    shutil.copytree(gen_sets["1f1b"], d)
    groups = json.loads((d / "comm_group.json").read_text())
    assert groups["1"] == [0, 1] and groups["3"] == [4, 5]
    ts = discover(d)
    ef = ts.load(4)
    nodes = list(ef.nodes)
    target = next(n for n in nodes if get_str(n, PG_NAME, "") == "3")
    set_attr(target, PG_NAME, "1")
    write_et(ef.path, nodes, ef.metadata)
    with pytest.raises(
        ReplayError, match=rf"rank 4 onto rank 0: node {target.id} .*group '1' = \[0, 1\] is not"
    ):
        _replay(d, fold=True)
    # Rank 4's first send goes to rank 2 (replica 0) instead of rank 6: not a copy of rank 0's send to 2.
    shutil.rmtree(d)
    shutil.copytree(gen_sets["1f1b"], d)
    ts = discover(d)
    ef = ts.load(4)
    nodes = list(ef.nodes)
    send = next(n for n in nodes if n.type == pb.COMM_SEND_NODE)
    assert get_int(send, COMM_DST, -1) == 6
    set_attr(send, COMM_DST, 2)
    write_et(ef.path, nodes, ef.metadata)
    with pytest.raises(ReplayError, match=rf"rank 4 onto rank 0: node {send.id} .*comm_dst 2, expected 6"):
        _replay(d, fold=True)


def test_refuses_asymmetric_compute_and_network(gen_sets) -> None:
    with pytest.raises(ReplayError, match="gives rank 5 .* than its representative rank 1"):
        _replay(gen_sets["1f1b"], "--speed", "5=2", fold=True)
    # 6 + 10 GPUs per node: replica 1 (ranks 4-7) straddles the nodes, so its stage-boundary sends cross
    # the inter-node link while replica 0's stay inside node 0.
    with pytest.raises(ReplayError, match=r"cannot fold: network model 'analytical' times .* send 4->6"):
        _replay(gen_sets["1f1b"], "--topology", "nodes:H100x6,H100x10", fold=True)


def test_a_compute_model_folds_by_its_timing_key(gen_sets, tmp_path: Path) -> None:
    """A folded replay asks the compute model how it times a rank (`timing_key`, the RankTimed ability)
    instead of checking its type: a user model that declares a key folds, one that does not is refused."""
    from xsim.replay.compute import DurationModel

    class Plain:
        name = "plain"

        def duration_ns(self, rank: int, node) -> int:
            return DurationModel().duration_ns(rank, node)

    class Keyed(Plain):
        name = "keyed"

        def timing_key(self, rank: int) -> tuple:
            return ()

    ts = discover(gen_sets["1f1b"])
    kw = {"network": api.build_network(options(build_parser().parse_args(["replay", str(gen_sets["1f1b"])])).network,
                                       api.load_deployment(ts)), "config": ReplayConfig()}  # fmt: skip
    with pytest.raises(ReplayError, match="cannot fold with compute model 'plain'"):
        simulate(ts, compute=Plain(), fold=True, **kw)
    folded = simulate(ts, compute=Keyed(), fold=True, **kw)
    assert folded.fold_factor == 4
    _assert_same(folded, simulate(ts, compute=Keyed(), fold=False, **kw), tmp_path)


def test_refuses_bad_replicas(gen_sets) -> None:
    with pytest.raises(ReplayError, match="same number of ranks"):
        _replay(gen_sets["1f1b"], fold=[[0, 1, 2], list(range(3, 16))])
    with pytest.raises(ReplayError, match="every rank 0..15 exactly once"):
        _replay(gen_sets["1f1b"], fold=[[0, 1], [1, 2]])


def _edit_byte(path: Path, marker: bytes, nth: int) -> int:
    """Flip the low bit of the byte after the nth occurrence of marker in the file (a varint's first byte
    keeps its continuation bit, so the file stays well-formed); returns the changed offset."""
    b = bytearray(path.read_bytes())
    pos = -1
    for _ in range(nth + 1):
        pos = b.index(marker, pos + 1)
    at = pos + len(marker)
    b[at] ^= 0x01
    path.write_bytes(bytes(b))
    return at


def _node_at(path: Path, offset: int) -> pb.Node:
    """The node whose frame holds byte `offset` of a framed .et file."""
    from xsim.traces.stream import frame_offsets

    buf = path.read_bytes()
    s, e = next((s, e) for s, e in frame_offsets(buf) if s <= offset < e)
    p = next(i + 1 for i, v in enumerate(buf[s : s + 5]) if v < 0x80)  # after the length prefix
    return pb.Node.FromString(buf[s + p : e])


@pytest.mark.parametrize(
    ("marker", "nth"),
    [
        (b"\n\x0bduration_nsH", 40),  # a compute node's duration, one byte
        (b"\n\x07num_opsH", 7),  # a roofline input
        (b"\n\tcomm_sizeH", 3),  # a collective's size
    ],
)
def test_one_byte_in_one_node_refuses(gen_sets, tmp_path: Path, marker: bytes, nth: int) -> None:
    # Rank 6 (replica 1, stage 1) mirrors rank 2; one byte of one of its nodes changed is not a copy any
    # more, and the raw-bytes proof must send that node to the exact check, which refuses naming it.
    d = tmp_path / "set"
    shutil.copytree(gen_sets["1f1b"], d)
    path = d / "fold_1f1b.6.et"
    node = _node_at(path, _edit_byte(path, marker, nth))
    with pytest.raises(
        ReplayError, match=rf"fold_1f1b\.6\.et: cannot fold rank 6 onto rank 2: node {node.id} "
    ):
        _replay(d, fold=True)


def test_one_byte_in_a_label_folds_with_the_ranks_own_label(gen_sets, tmp_path: Path) -> None:
    # A device_group annotation is a label: rank 6's node keeps its own value in the ops table, exactly as
    # the unfolded replay reads it (device group 3 -> 2 on one node).
    d = tmp_path / "set"
    shutil.copytree(gen_sets["1f1b"], d)
    path = d / "fold_1f1b.6.et"
    node = _node_at(path, _edit_byte(path, b"\n\x0cdevice_groupH", 25))
    assert get_int(node, "device_group", -1) == 2
    a, _ = _replay(d)
    b, n = _replay(d, fold=True)
    assert n * 4 == a.summary_dict()["num_nodes"]
    row = b.ops.filter((b.ops["rank"] == 6) & (b.ops["node_id"] == node.id))
    assert row["device_group"].to_list() == [2]
    _assert_same(a, b, tmp_path)


def test_generated_set_is_proven_by_bytes_alone(gen_sets, monkeypatch) -> None:
    # On a generated set every folded rank is shown equal by the byte comparison (device groups, TP
    # groups, P2P peers and P2P node names swapped in), never by decoding its file.
    import xsim.replay.fold as fold_mod

    def no_exact(*_a, **_k):
        raise AssertionError("exact proof used")

    monkeypatch.setattr(fold_mod, "_verify_rank", no_exact)
    res, n = _replay(gen_sets["gpipe"], fold=True)
    assert n * 4 == res.summary_dict()["num_nodes"]
    assert res.fold_factor == 4 and res.ranks_simulated == 4
    assert res.perf_dict()["fold_factor"] == 4 and res.perf_dict()["ranks_simulated"] == 4
    plain, _ = _replay(gen_sets["gpipe"])
    assert plain.fold_factor == 1 and "fold_factor" not in plain.perf_dict()


def test_cli_prints_fold_factor(gen_sets, capsys) -> None:
    from xsim.cli import main

    assert main(["replay", str(gen_sets["1f1b"]), "--no-progress", "--fold"]) == 0
    assert "folded             4 of 16 ranks simulated (fold factor 4)" in capsys.readouterr().out


def test_tp_fold_equals_unfolded(tmp_path: Path) -> None:
    # TP 4 x PP 2 x DP 2: replica t = TP position t of every device group. The TP groups are closed under
    # swapping two positions (shared), the DP groups of position 0 lie inside replica 0, P2P stays within
    # a position: a valid fold of factor 4 (one rank per stage and DP replica simulated).
    dep = load_spec(_spec("fold_tp", "1f1b", dp=2, tp=4, pp=2))
    d = tmp_path / "set"
    generate(dep).write(d, dep.name)
    save_deployment(dep, d / "deployment.json")
    fold = resolve_fold("tp", discover(d))
    assert fold.replicas == tuple(tuple(r for r in range(16) if r % 4 == t) for t in range(4))
    a, n_a = _replay(d)
    b, n_b = _replay(d, fold="tp")
    assert n_b * 4 == n_a and b.fold_factor == 4 and b.ranks_simulated == 4
    _assert_same(a, b, tmp_path)


def test_labels_of_other_lengths_are_proven_by_bytes(tmp_path: Path, monkeypatch) -> None:
    # DP 6: replica 5's TP groups are "11" and "12" where replica 0's are "1" and "2", and its P2P names
    # say "to22" where rank 2's say "to2": node lengths change, and the byte proof still covers them.
    import xsim.replay.fold as fold_mod

    dep = load_spec(_spec("fold_dp6", "1f1b", dp=6))
    d = tmp_path / "set"
    generate(dep).write(d, dep.name)
    save_deployment(dep, d / "deployment.json")
    assert json.loads((d / "comm_group.json").read_text())["11"] == [20, 21]
    a, n_a = _replay(d)

    def no_exact(*_a, **_k):
        raise AssertionError("exact proof used")

    monkeypatch.setattr(fold_mod, "_verify_rank", no_exact)
    b, n_b = _replay(d, fold=True)
    assert n_b * 6 == n_a and b.fold_factor == 6
    _assert_same(a, b, tmp_path)


def _one_byte_edit(path: Path, pick, edit) -> pb.Node:
    """Rewrite file `path` with one node changed by edit(node) (protobuf encodes the rest as the generator
    did); checks exactly one byte of the file changed. Returns the node as it was."""
    ts = discover(path.parent)
    rank = next(r for r, p in enumerate(ts.paths) if Path(p) == path)
    ef = ts.load(rank)
    nodes = list(ef.nodes)
    before = path.read_bytes()
    target = next(n for n in nodes if pick(n))
    orig = pb.Node()
    orig.CopyFrom(target)
    edit(target)
    write_et(ef.path, nodes, ef.metadata)
    after = path.read_bytes()
    assert len(after) == len(before) and sum(a != b for a, b in zip(after, before, strict=True)) == 1
    return orig


def _int_attr(node: pb.Node, name: str):
    return next((a for a in node.attr if a.name == name and a.WhichOneof("value") == "int64_val"), None)


def _flip_attr(name: str):
    def edit(node: pb.Node) -> None:
        _int_attr(node, name).int64_val ^= 1  # the low bit: a varint of the same length

    return (lambda n: (a := _int_attr(n, name)) is not None and a.int64_val >= 2), edit


def _flip_dep():
    def edit(node: pb.Node) -> None:
        node.data_deps[0] ^= 1

    return (lambda n: len(n.data_deps) > 0 and n.data_deps[0] >= 2), edit


@pytest.mark.parametrize(
    "change",
    [_flip_attr("duration_ns"), _flip_attr("comm_size"), _flip_attr("num_ops"), _flip_dep()],
    ids=["duration", "comm_size", "num_ops", "dep"],
)
def test_one_byte_in_the_last_replica_refuses(gen_sets, tmp_path: Path, change) -> None:
    # Rank 14 is in the LAST replica (3 of 0..3, stage 1) and mirrors rank 2. Its file is compared with a
    # prediction built from the same template as ranks 6 and 10 (equal to theirs): one byte of one node
    # changed (a duration, a collective's size, a roofline input, a dependency) must still be refused,
    # naming that node.
    d = tmp_path / "set"
    shutil.copytree(gen_sets["1f1b"], d)
    node = _one_byte_edit(d / "fold_1f1b.14.et", *change)
    with pytest.raises(
        ReplayError, match=rf"fold_1f1b\.14\.et: cannot fold rank 14 onto rank 2: node {node.id} "
    ):
        _replay(d, fold=True)


def test_labels_in_the_last_replica_fold_with_its_own_values(gen_sets, tmp_path: Path) -> None:
    # Labels differ in rank 14 (last replica) beyond what the prediction swaps in: one device_group byte
    # (7 -> 6), a P2P name that does not carry its peer, and a P2P name equal to the representative's
    # (not the predicted "...to12"). It folds, each row keeping rank 14's own label, equal to the unfolded
    # replay.
    d = tmp_path / "set"
    shutil.copytree(gen_sets["1f1b"], d)
    path = d / "fold_1f1b.14.et"
    dg = _one_byte_edit(path, *_flip_attr("device_group"))
    assert _int_attr(dg, "device_group").int64_val == 7
    ts = discover(d)
    ef = ts.load(14)
    nodes = list(ef.nodes)
    sends = [n for n in nodes if n.type == pb.COMM_SEND_NODE]
    assert sends[0].name == "send_grad.bwd.mb0.to12" and sends[1].name == "send_grad.bwd.mb1.to12"
    sends[0].name = "custom-p2p-label"
    sends[1].name = "send_grad.bwd.mb1.to0"  # rank 2's own name for it
    write_et(ef.path, nodes, ef.metadata)
    a, _ = _replay(d)
    b, n = _replay(d, fold=True)
    assert n * 4 == a.summary_dict()["num_nodes"]
    ops14 = b.ops.filter(b.ops["rank"] == 14)
    assert ops14.filter(ops14["node_id"] == dg.id)["device_group"].to_list() == [6]
    assert ops14.filter(ops14["node_id"] == sends[0].id)["name"].to_list() == ["custom-p2p-label"]
    assert ops14.filter(ops14["node_id"] == sends[1].id)["name"].to_list() == ["send_grad.bwd.mb1.to0"]
    _assert_same(a, b, tmp_path)


def test_generated_files_equal_their_predictions(gen_sets, monkeypatch) -> None:
    # P2P names are predicted from the peer (pi_k of "to2" is "to6", "to10", "to14"), so every folded file
    # of a generated set equals its prediction byte for byte: no difference is ever looked for.
    import xsim.replay.fold_bytes as fold_bytes

    def no_diff(*_a, **_k):
        raise AssertionError("a file differs from its prediction")

    monkeypatch.setattr(fold_bytes, "first_diff", no_diff)
    for sched in ("1f1b", "gpipe"):
        res, n = _replay(gen_sets[sched], fold=True)
        assert n * 4 == res.summary_dict()["num_nodes"]


def test_canonical_order_numbers_records_and_pairs_by_its_keys() -> None:
    # The one numbering (replay/engine.py:canonical_order), used by the engine (updating its node ->
    # collective map) and by a folded run's expansion (a fresh map, pairs as an array): on records and
    # pairs with many ties in time both calls give what sorting by the documented keys gives.
    import random

    import numpy as np
    from xsim.replay.engine import CollectiveRecord, canonical_order

    rng = random.Random(7)
    nodes = rng.sample(range(5000), 2000)  # distinct rows: a row is in one record or one pair
    recs = [
        CollectiveRecord(
            -1, "g", 0, (0, 1, 2, 3), tuple(nodes[4 * i : 4 * i + 4]), 8, 0, rng.choice([1, 2, 3])
        )
        for i in range(300)
    ]
    copies = [CollectiveRecord(**vars(r)) for r in recs]
    start = [rng.choice([0, 5, 9]) for _ in range(5000)]
    pairs = [(nodes[1200 + 2 * i], nodes[1201 + 2 * i]) for i in range(400)]
    ordered = sorted(recs, key=lambda r: (r.last_arrival_ns, r.nodes[0]))
    want_of = {g: i for i, r in enumerate(ordered) for g in r.nodes}
    want_pairs = sorted(pairs, key=lambda p: (max(start[p[0]], start[p[1]]), p[0]))
    engine_of: dict[int, int] = {}
    engine_pairs = canonical_order(recs, pairs, start, engine_of)[1]
    got_of, got_pairs = canonical_order(copies, np.asarray(pairs, dtype=np.int64), np.asarray(start))
    assert [r.nodes for r in recs] == [r.nodes for r in ordered] and [r.id for r in recs] == list(range(300))
    assert [(r.id, r.nodes) for r in copies] == [(r.id, r.nodes) for r in recs]
    assert engine_of == got_of == want_of and engine_pairs == got_pairs == want_pairs


def _perturbed(gen_sets, tmp_path: Path) -> tuple[Path, int]:
    """The 1F1B set with one of rank 6's compute nodes twice as long: not a copy of its representative
    rank 2 any more, but a valid set (a changed collective or P2P size would not match its peers)."""
    d = tmp_path / "set"
    shutil.copytree(gen_sets["1f1b"], d)
    ts = discover(d)
    ef = ts.load(6)
    nodes = list(ef.nodes)
    target = next(n for n in nodes if n.type == pb.COMP_NODE and n.duration_micros > 0)
    target.duration_micros *= 2
    write_et(ef.path, nodes, ef.metadata)
    return d, target.id


def test_auto_replays_unfolded_when_the_proof_fails(gen_sets, tmp_path: Path) -> None:
    # fold="auto" (the CLI's and the API's default): a set whose ranks are not symmetric is replayed
    # unfolded, every node through the engine, with the proof's refusal as the reason; not refused.
    d, node_id = _perturbed(gen_sets, tmp_path)
    a, n_a = _replay(d)
    b, n_b = _replay(d, fold="auto")
    assert n_b == n_a == a.summary_dict()["num_nodes"]
    assert b.fold_status == "unfolded" and b.fold_factor == 1
    assert b.fold_reason.startswith(
        f"{d / 'fold_1f1b.6.et'}: cannot fold rank 6 onto rank 2: node {node_id} "
    )
    assert b.perf_dict()["fold"] == "unfolded" and b.perf_dict()["fold_reason"] == b.fold_reason
    _assert_same(a, b, tmp_path)
    # The symmetric set folds under "auto" (a quarter of the nodes run) and says so.
    c, n_c = _replay(gen_sets["1f1b"], fold="auto")
    assert c.fold_status == "folded" and n_c * 4 == c.summary_dict()["num_nodes"]
    assert c.perf_dict()["fold_reason"].startswith("4 replicas proven alike")


def test_auto_after_a_network_refusal_inside_the_event_loop(gen_sets, tmp_path: Path) -> None:
    # 6 + 10 GPUs per node: the fold's network check refuses during the event loop (a send of replica 1
    # crosses nodes). The unfolded replay that follows runs on a model the attempt left untouched, so its
    # tables equal a plain unfolded replay's.
    args = ("--topology", "nodes:H100x6,H100x10")
    a, _ = _replay(gen_sets["1f1b"], *args)
    b, n = _replay(gen_sets["1f1b"], *args, fold="auto")
    assert n == a.summary_dict()["num_nodes"] and b.fold_status == "unfolded"
    assert "cannot fold: network model 'analytical' times" in b.fold_reason
    _assert_same(a, b, tmp_path)


def test_auto_on_a_model_with_contention(gen_sets) -> None:
    b, n = _replay(gen_sets["1f1b"], "--model", "flow", fold="auto")
    assert n == b.summary_dict()["num_nodes"] and b.fold_status == "unfolded"
    assert b.fold_reason.startswith("cannot fold on network model 'flow'")


def test_cli_says_when_it_does_not_fold(gen_sets, tmp_path: Path, capsys) -> None:
    from xsim.cli import main

    d, node_id = _perturbed(gen_sets, tmp_path)
    out = tmp_path / "out"
    assert main(["replay", str(d), "--no-progress", "--out", str(out)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "fold" in ln]
    assert lines == [
        f"not folded         {d / 'fold_1f1b.6.et'}: cannot fold rank 6 onto rank 2: node {node_id} "
        f"'{_node_name(d / 'fold_1f1b.6.et', node_id)}' differs beyond labels and rank numbers"
    ]
    perf = json.loads((out / "perf.json").read_text())
    assert perf["fold"] == "unfolded" and "cannot fold rank 6 onto rank 2" in perf["fold_reason"]


def _node_name(path: Path, node_id: int) -> str:
    ts = discover(path.parent)
    return next(n.name for n in ts.load(int(path.name.split(".")[-2])).nodes if n.id == node_id)


def test_default_fold_writes_the_same_annotated_traces_and_timeline(gen_sets, tmp_path: Path) -> None:
    # The CLI folds by default: the files written from a folded result (the traces with simulated times
    # written back, the Chrome timeline) are byte for byte the unfolded run's.
    from xsim.cli import main

    for name, extra in (("folded", []), ("plain", ["--no-fold"])):
        args = ["replay", str(gen_sets["1f1b"]), "--no-progress", *extra]
        assert (
            main([*args, "--annotate", str(tmp_path / name), "--timeline", str(tmp_path / f"{name}.json")])
            == 0
        )
    files = sorted(p.name for p in (tmp_path / "plain").iterdir())
    # 16 rank files, comm_group.json and the set's deployment.json (issue 27: --annotate keeps the metadata)
    assert len([f for f in files if f.endswith(".et")]) == 16, files
    assert {"comm_group.json", "deployment.json"} <= set(files), files
    assert files == sorted(p.name for p in (tmp_path / "folded").iterdir())
    for f in files:
        assert (tmp_path / "folded" / f).read_bytes() == (tmp_path / "plain" / f).read_bytes(), f
    assert (tmp_path / "folded.json").read_bytes() == (tmp_path / "plain.json").read_bytes()
