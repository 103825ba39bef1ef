"""Compact sets (issue 24 item 1): `xsim gen` writes each class of alike DP replicas once (replica 0 and
classes.json), the replay folds them by construction, and its tables equal those of the set with every
rank (folded or not); a verb that needs every rank's file refuses a compact set in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from xsim.tracegen.compact import rank_classes
from xsim.tracegen.spec import load_spec
from xsim.traces.errors import TraceSetError
from xsim.traces.traceset import discover

from xsim import api
from xsim.cli import main

TABLES = ("ops.csv", "ranks.csv", "collectives.csv", "summary.csv", "ops.parquet", "ranks.parquet")


def _spec(name: str, dp: int, gpus: tuple[str, ...] = ("H100", "H100"), tp: int = 2) -> dict:
    """Llama-2 7B (32 layers, model card) over len(gpus) stages of TP `tp` x DP `dp`, stage k on gpus[k]."""
    pp = len(gpus)
    groups = []
    for r in range(dp):
        for k in range(pp):
            first = tp * pp * r + tp * k
            groups.append(
                {"id": pp * r + k, "gpu": gpus[k], "ranks": list(range(first, first + tp)), "tp": tp,
                 "layers": [32 // pp * k + 1, 32 // pp * (k + 1)], "micro_batch": 1, "pp_stage": k,
                 "dp_replica": r}
            )  # fmt: skip
    return {"name": name, "model": "llama2-7b", "seq_len": 128, "micro_batches": 2, "schedule": "1f1b",
            "device_groups": groups}  # fmt: skip


def _gen(spec: dict, out: Path, all_ranks: bool) -> api.Generated:
    return api.generate(spec, api.GenerateOptions(out=str(out), all_ranks=all_ranks))


def _replay(path: Path, out: Path, fold: bool = True) -> dict:
    run = api.simulate(str(path), api.ReplayOptions(fold=fold, progress=False))
    api.write_outputs(run, api.OutputOptions(out=str(out)))
    return run.result.perf_dict()


@pytest.fixture(scope="module")
def sets(tmp_path_factory) -> dict[str, Path]:
    """The same plans written compact and with every rank: homogeneous, and H100 stages feeding A100 ones."""
    root = tmp_path_factory.mktemp("compact")
    out = {}
    for key, gpus in (("homo", ("H100", "H100")), ("mixed", ("H100", "A100-80GB"))):
        spec = _spec(f"c_{key}", dp=3, gpus=gpus)
        for every in (False, True):
            d = root / f"{key}_{'all' if every else 'compact'}"
            _gen(spec, d, every)
            out[d.name] = d
    return out


def test_compact_writes_replica_zero_and_its_classes(sets):
    d = sets["homo_compact"]
    # TP 2 x PP 2 = 4 ranks per replica, 3 replicas; device group ids 2r + k, rank 4r + 2k + t at TP
    # position t of stage k of replica r (the spec above). The TP ranks of a stage are alike, so the rank
    # classes are (replica r, position t): entry 2r + t holds ranks 4r + t and 4r + 2 + t; only entry 0
    # (one rank per stage) is written.
    assert sorted(p.name for p in d.glob("*.et")) == ["c_homo.0.et", "c_homo.2.et"]
    doc = json.loads((d / "classes.json").read_text())
    assert doc["num_ranks"] == 12 and doc["prefix"] == "c_homo" and doc["tp_positions"] == 2
    assert doc["replicas"] == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11]]
    assert doc["device_groups"] == [[0, 1], [0, 1], [2, 3], [2, 3], [4, 5], [4, 5]]
    assert not (sets["homo_all"] / "classes.json").exists()
    assert len(list(sets["homo_all"].glob("*.et"))) == 12
    # Built once per class: the written ranks are a sixth of the full set's nodes, rank for rank equal
    # to the full set's.
    full = discover(sets["homo_all"])
    for r in (0, 2):
        assert (d / f"c_homo.{r}.et").read_bytes() == Path(full.paths[r]).read_bytes()


def _same_tables(a: Path, b: Path) -> None:
    for name in TABLES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize("key", ["homo", "mixed"])
def test_compact_replay_tables_equal_every_rank_replays(sets, tmp_path, key):
    perf = _replay(sets[f"{key}_compact"], tmp_path / "c")
    if key == "homo":
        # The derived cluster packs 8 GPUs of a type per node: ranks 0-7 on node 0, 8-11 on node 1, so
        # the DP ring [2, 6, 10] is not alike for every replica and the analytical model's check refuses
        # the fold: the compact set is replayed unfolded, its unwritten ranks' files derived from their
        # representatives'.
        assert perf["fold"] == "unfolded" and "finishes rank 6" in perf["fold_reason"]
    else:  # H100 ranks 0, 1, 4, 5, 8, 9 on node 0, the A100 ones on node 1: alike
        assert perf["fold"] == "folded" and "by construction" in perf["fold_reason"]
        assert perf["fold_factor"] == 3 and perf["ranks_simulated"] == 4
    _replay(sets[f"{key}_all"], tmp_path / "a")
    _replay(sets[f"{key}_all"], tmp_path / "n", fold=False)
    _replay(sets[f"{key}_compact"], tmp_path / "cn", fold=False)
    for other in ("a", "n", "cn"):
        _same_tables(tmp_path / "c", tmp_path / other)
    ranks = (tmp_path / "c" / "ranks.csv").read_text().splitlines()
    assert len(ranks) == 1 + 12  # every rank's row, not only the written ones


def test_compact_set_folds_by_construction(tmp_path):
    # DP 2: 8 ranks on one node of the derived cluster, the replicas alike for the network too.
    spec = _spec("two", dp=2, gpus=("H100", "A100-80GB"))
    _gen(spec, tmp_path / "c", all_ranks=False)
    _gen(spec, tmp_path / "a", all_ranks=True)
    perf = _replay(tmp_path / "c", tmp_path / "rc")
    assert (
        perf["fold"] == "folded" and perf["fold_reason"] == "2 replicas alike by construction (classes.json)"
    )
    assert perf["fold_factor"] == 2 and perf["ranks_simulated"] == 4
    _replay(tmp_path / "a", tmp_path / "rn", fold=False)
    _same_tables(tmp_path / "rc", tmp_path / "rn")
    # A contention model cannot fold, nor a compute model that speeds up one rank of replica 1 (built
    # node by node from protobuf messages): the compact set is replayed unfolded, as the full set is.
    for how, opts in (
        ("flow", api.ReplayOptions(network=api.NetworkOptions(model="flow"), progress=False)),
        ("speed", api.ReplayOptions(compute=api.ComputeOptions(speed=("5=2",)), progress=False)),
    ):
        for d in ("c", "a"):
            run = api.simulate(str(tmp_path / d), opts)
            assert run.result.perf_dict()["fold"] == "unfolded"
            api.write_outputs(run, api.OutputOptions(out=str(tmp_path / f"{how}{d}")))
        _same_tables(tmp_path / f"{how}c", tmp_path / f"{how}a")


def test_derived_files_are_the_every_rank_files(sets, tmp_path, capsys):
    """A compact set's unwritten ranks, derived from their representatives, are byte for byte the files
    `--all-ranks` writes; `xsim trace` reads them so (validate, info, to-json)."""
    from xsim.cmd_trace import whole_set

    whole = whole_set(discover(sets["homo_compact"], compact=True), None)
    full = discover(sets["homo_all"])
    for r in range(12):
        assert whole.read(r) == Path(full.paths[r]).read_bytes(), r
    assert main(["trace", "validate", str(sets["homo_compact"])]) == 0
    assert "12 ranks," in capsys.readouterr().out
    for key in ("compact", "all"):
        assert main(["trace", "to-json", str(sets[f"homo_{key}"]), str(tmp_path / key)]) == 0
    for r in range(12):
        name = f"c_homo.{r}.json"
        assert (tmp_path / "compact" / name).read_bytes() == (tmp_path / "all" / name).read_bytes()


def test_verbs_that_need_every_rank_refuse_a_compact_set_in_one_line(sets, tmp_path, capsys):
    d = str(sets["homo_compact"])
    for argv in (
        ["rewrite", d, "--out", str(tmp_path / "rw")],
        ["replay", d, "--annotate", str(tmp_path / "ann")],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "xsim gen --all-ranks" in err[0] and "12 ranks" in err[0], (argv, err)
    with pytest.raises(TraceSetError, match="compact set"):
        discover(d)


def test_a_compact_set_missing_a_file_or_with_a_stray_one_is_named(sets, tmp_path):
    import shutil

    d = tmp_path / "c"
    shutil.copytree(sets["homo_compact"], d)
    (d / "c_homo.2.et").unlink()
    with pytest.raises(TraceSetError, match="must hold the files of ranks 0, 2"):
        discover(d, compact=True)
    shutil.copy(sets["homo_all"] / "c_homo.2.et", d / "c_homo.2.et")
    shutil.copy(sets["homo_all"] / "c_homo.7.et", d / "c_homo.7.et")
    with pytest.raises(TraceSetError, match="found ranks 0, 2, 7"):
        discover(d, compact=True)


def test_regenerating_switches_between_compact_and_every_rank(tmp_path):
    spec = _spec("sw", dp=2)
    _gen(spec, tmp_path, all_ranks=True)
    assert len(list(tmp_path.glob("sw.*.et"))) == 8
    _gen(spec, tmp_path, all_ranks=False)  # the other replica's files of the earlier run go
    assert sorted(p.name for p in tmp_path.glob("sw.*.et")) == ["sw.0.et", "sw.2.et"]
    assert discover(tmp_path, compact=True).num_ranks == 8
    _gen(spec, tmp_path, all_ranks=True)
    assert not (tmp_path / "classes.json").exists() and discover(tmp_path).num_ranks == 8


def test_which_plans_are_written_compact():
    # One replica of TP 1, replicas with other stages, or a TP change the rewrite reshards: every rank.
    assert rank_classes(load_spec(_spec("one", dp=1, tp=1)), rewrite=True) is None
    # One replica of TP 2: its TP positions are the classes (ranks 2k + t, stage k, position t).
    one = rank_classes(load_spec(_spec("one", dp=1)), rewrite=True)
    assert one is not None and one.tp == 2 and one.replicas == ((0, 2), (1, 3))
    hetero = _spec("h", dp=2)
    hetero["device_groups"][2]["gpu"] = "A100-80GB"  # replica 1's first stage on another GPU
    assert rank_classes(load_spec(hetero), rewrite=True) is None
    c = rank_classes(load_spec(_spec("ok", dp=2, gpus=("H100", "A100-80GB"))), rewrite=True)
    assert c is not None and c.tp == 2 and c.replicas == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert c.device_groups == ((0, 1), (0, 1), (2, 3), (2, 3))
    # TP 1: the DP replicas are the classes, as before rank classes.
    c1 = rank_classes(load_spec(_spec("ok1", dp=2, tp=1)), rewrite=True)
    assert c1 is not None and c1.tp == 1 and c1.replicas == ((0, 1), (2, 3))
    # TP 2 feeding TP 1 in every replica: alike, but the rewrite reshards the boundary (without it: alike).
    groups = [
        {"id": 2 * r + k, "gpu": "H100", "ranks": [3 * r, 3 * r + 1] if k == 0 else [3 * r + 2],
         "tp": 2 - k, "layers": [16 * k + 1, 16 * k + 16], "micro_batch": 1, "pp_stage": k, "dp_replica": r}
        for r in range(2) for k in range(2)
    ]  # fmt: skip
    tp_change = load_spec({**_spec("tpc", dp=1), "device_groups": groups})
    assert rank_classes(tp_change, rewrite=True) is None
    assert rank_classes(tp_change, rewrite=False).replicas == ((0, 1, 2), (3, 4, 5))


def _two_class_spec(name: str, tps: tuple[int, ...] = (2, 2, 1, 1)) -> dict:
    """Llama-2 7B on two classes of replica, two of each: H100 TP 2 feeding A100 TP 2 (ranks 0-1 / 6-7 and
    2-3 / 8-9), and H100 TP 1 feeding A100 TP 1 (4 / 10 and 5 / 11); layers 1-16 on the H100 stage."""
    groups, h, a = [], 0, sum(tps)
    for r, tp in enumerate(tps):
        for k, gpu in enumerate(("H100", "A100-80GB")):
            first = h if k == 0 else a
            groups.append(
                {"id": 2 * r + k, "gpu": gpu, "ranks": list(range(first, first + tp)), "tp": tp,
                 "layers": [16 * k + 1, 16 * k + 16], "micro_batch": 1, "pp_stage": k, "dp_replica": r}
            )  # fmt: skip
            h, a = (h + tp, a) if k == 0 else (h, a + tp)
    return {"name": name, "model": "llama2-7b", "seq_len": 128, "micro_batches": 2, "schedule": "1f1b",
            "device_groups": groups}  # fmt: skip


def test_a_heterogeneous_plan_is_written_once_per_class(tmp_path):
    spec = _two_class_spec("hc")
    c = rank_classes(load_spec(spec), rewrite=True)
    # gcd(2, 2) = 2 super-replicas, each one replica of each class in first-seen order: replica 0 (ranks
    # 0, 1, 6, 7) with replica 2 (4, 10), and replica 1 (2, 3, 8, 9) with replica 3 (5, 11).
    assert c is not None and c.replicas == ((0, 1, 6, 7, 4, 10), (2, 3, 8, 9, 5, 11))
    assert c.device_groups == ((0, 0, 1, 1, 4, 5), (2, 2, 3, 3, 6, 7))
    assert c.classes == ((0, 1), (2, 3)) and c.dp_replicas == ((0, 0, 0, 0, 2, 2), (1, 1, 1, 1, 3, 3))
    # Three of one class and two of the other: gcd 1, no super-replica to fold: written whole.
    odd = _two_class_spec("odd", (2, 2, 2, 1, 1))
    assert rank_classes(load_spec(odd), rewrite=True) is None
    _gen(spec, tmp_path / "c", all_ranks=False)
    _gen(spec, tmp_path / "a", all_ranks=True)
    assert sorted(int(p.name.split(".")[1]) for p in (tmp_path / "c").glob("*.et")) == [0, 1, 4, 6, 7, 10]
    doc = json.loads((tmp_path / "c" / "classes.json").read_text())
    assert doc["classes"] == [[0, 1], [2, 3]] and doc["replicas"][1] == [2, 3, 8, 9, 5, 11]
    from xsim.cmd_trace import whole_set

    # The unwritten ranks' files, derived (the rewriter's gradient sync and pipeline barriers, whose names
    # carry the replica number, included), are the --all-ranks files byte for byte.
    whole = whole_set(discover(tmp_path / "c", compact=True), None)
    full = discover(tmp_path / "a")
    for r in range(12):
        assert whole.read(r) == Path(full.paths[r]).read_bytes(), r
    assert b"pipeline_barrier[replica 3]" in whole.read(11)
    perf = _replay(tmp_path / "c", tmp_path / "rc")
    assert perf["fold"] == "folded" and "by construction" in perf["fold_reason"], perf["fold_reason"]
    assert perf["fold_factor"] == 2 and perf["ranks_simulated"] == 6
    _replay(tmp_path / "a", tmp_path / "ra", fold=False)
    _same_tables(tmp_path / "rc", tmp_path / "ra")
    flow = api.ReplayOptions(network=api.NetworkOptions(model="flow"), progress=False)
    for d in ("c", "a"):
        run = api.simulate(str(tmp_path / d), flow)
        api.write_outputs(run, api.OutputOptions(out=str(tmp_path / f"flow{d}")))
    _same_tables(tmp_path / "flowc", tmp_path / "flowa")


@pytest.mark.parametrize("how", ["1f1b", "interleaved-2021"])
def test_rank_classes_fold_tp_positions_and_replicas(tmp_path, how):
    """TP 4 x PP 2 x DP 2 (issue 24 item 4): one rank per stage written (ranks 0 and 4: TP position 0 of
    each stage of replica 0, rank 8r + 4k + t), 8 classes simulated as one; the tables equal an unfolded
    replay of every rank's files and of the derived ones. Also interleaved (2 chunks per stage) on the
    Megatron 2021 profile, as Narayanan et al.'s and Korthikanti et al.'s large rows run."""
    spec = _spec("tp4", dp=2, tp=4)
    if how != "1f1b":
        spec.update(virtual_stages=2, micro_batches=4, framework="megatron-2021")
        for g in spec["device_groups"]:
            g.pop("layers")  # Megatron's equal split into 2 chunks per stage
    _gen(spec, tmp_path / "c", all_ranks=False)
    _gen(spec, tmp_path / "a", all_ranks=True)
    assert sorted(p.name for p in (tmp_path / "c").glob("*.et")) == ["tp4.0.et", "tp4.4.et"]
    doc = json.loads((tmp_path / "c" / "classes.json").read_text())
    assert doc["tp_positions"] == 4 and doc["written"] == "TP position 0 of replica 0"
    assert doc["replicas"] == [[8 * r + t, 8 * r + 4 + t] for r in range(2) for t in range(4)]
    perf = _replay(tmp_path / "c", tmp_path / "rc")
    assert perf["fold"] == "folded" and perf["fold_factor"] == 8 and perf["ranks_simulated"] == 2
    assert perf["fold_reason"] == "8 rank classes alike by construction (classes.json)"
    _replay(tmp_path / "a", tmp_path / "rn", fold=False)
    _replay(tmp_path / "c", tmp_path / "rcn", fold=False)
    _same_tables(tmp_path / "rc", tmp_path / "rn")
    _same_tables(tmp_path / "rcn", tmp_path / "rn")
    # Every TP all-reduce of replica 1 is a collective of its own: as many rows as unfolded.
    coll = (tmp_path / "rc" / "collectives.csv").read_text().splitlines()
    assert len(coll) == len((tmp_path / "rn" / "collectives.csv").read_text().splitlines())


def test_rank_class_record_with_a_bad_tp_count_is_named(tmp_path):
    _gen(_spec("bad", dp=1), tmp_path, all_ranks=False)
    doc = json.loads((tmp_path / "classes.json").read_text())
    doc["tp_positions"] = 3  # 2 entries are not a whole number of replicas of 3 positions
    (tmp_path / "classes.json").write_text(json.dumps(doc))
    with pytest.raises(
        TraceSetError, match=r"malformed rank-class record \(tp_positions 3 does not divide 2"
    ):
        discover(tmp_path, compact=True)
