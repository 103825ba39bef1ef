"""The bundled PyTorch recordings (traces/examples/pytorch) import with labels, groups and gloo collectives."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest
from xsim.tracegen.importers.pytorch import import_pytorch
from xsim.tracegen.importers.pytorch.build import MODULE
from xsim.traces import attrs as A
from xsim.traces import checks, pb
from xsim.traces.groups import resolve_groups
from xsim.traces.traceset import discover

from tests.conftest import REPO
from xsim.cli import main

EX = REPO / "traces" / "examples" / "pytorch"


def test_bundle_sizes_stay_small() -> None:
    for name in ("tinygpt_1rank", "tinygpt_2rank", "tinygpt_pp2"):
        files = list(EX.glob(f"{name}_*"))
        assert files and sum(f.stat().st_size for f in files) < 600_000


def test_two_rank_import_cli(tmp_path, capsys) -> None:
    ets = [str(EX / f"tinygpt_2rank_et.{r}.json.gz") for r in range(2)]
    kin = [str(EX / f"tinygpt_2rank_kineto.{r}.json.gz") for r in range(2)]
    assert main(["import", "pytorch", "--et", *ets, "--kineto", *kin, "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    # Kineto of PyTorch 2.13 carries "Record function id": an exact join. 8 of the 4172 host ops per rank
    # lie outside the profiled window.
    assert "rf_id" in out and "4164/4172" in out and "99.81%" in out
    ts = discover(str(tmp_path / "run"))
    assert ts.num_ranks == 2
    nodes = ts.load(0).nodes
    groups = resolve_groups([(ts.paths[0], nodes)], 2, directory=ts.directory)
    # distributedInfo pg_config and `## process_group:init ##`: the default group "0" = ranks 0 and 1.
    assert groups.members("0") == (0, 1)
    assert json.loads((tmp_path / "comm_group.json").read_text()) == {"0": [0, 1]}
    colls = [n for n in nodes if n.type == pb.COMM_COLL_NODE]
    # Per step: a barrier, then DDP's three gradient buckets (bucket_cap_mb 0.25): 66496, 66752 and
    # 32896 float32 elements = 265984, 267008 and 131584 bytes.
    assert [(A.comm_type(n), A.comm_size(n)) for n in colls] == [
        (pb.BARRIER, 1),
        (pb.ALL_REDUCE, 265984),
        (pb.ALL_REDUCE, 267008),
        (pb.ALL_REDUCE, 131584),
    ] * 2
    assert {A.pg_name(n) for n in colls} == {"0"}
    assert all(A.get_str(n, A.PHASE) == "sync" for n in colls if A.comm_type(n) == pb.ALL_REDUCE)


def test_pipeline_run_has_matched_p2p(tmp_path) -> None:
    ets = [str(EX / f"tinygpt_pp2_et.{r}.json.gz") for r in range(2)]
    kin = [str(EX / f"tinygpt_pp2_kineto.{r}.json.gz") for r in range(2)]
    res = import_pytorch(ets, kin)
    p2p = [
        [
            (n.type, A.comm_src(n), A.comm_dst(n), A.comm_tag(n), A.comm_size(n))
            for n in res.nodes[r]
            if n.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)
        ]
        for r in (0, 1)
    ]
    # Per step: stage 0 sends its activations (batch 8 x 32 tokens x hidden 64 float32 = 65536 bytes, tag 1)
    # and receives their gradient (tag 2); stage 1 mirrors it.
    act, grad = (0, 1, 1, 65536), (1, 0, 2, 65536)
    assert p2p[0] == [(pb.COMM_SEND_NODE, *act), (pb.COMM_RECV_NODE, *grad)] * 2
    assert p2p[1] == [(pb.COMM_RECV_NODE, *act), (pb.COMM_SEND_NODE, *grad)] * 2
    # Stage 0 holds embed + layer 1, stage 1 layer 2 + norm + head (nn.Module names of the full model).
    layers = [{A.get_int(n, A.LAYER, 0) for n in res.nodes[r]} - {0} for r in (0, 1)]
    assert layers == [{1}, {2}]
    res.write(tmp_path / "pp")
    ts = discover(str(tmp_path / "pp"))
    files = [ts.load(r) for r in range(2)]
    findings = checks.check_all(
        files, resolve_groups(((f.path, f.nodes) for f in files), 2, directory=ts.directory)
    )
    assert findings == []


def test_labels_of_single_process_run(tmp_path) -> None:
    res = import_pytorch(
        [str(EX / "tinygpt_1rank_et.0.json.gz")], [str(EX / "tinygpt_1rank_kineto.0.json.gz")]
    )
    nodes = res.nodes[0]
    assert res.ranks[0].match_rate == 1.0
    by = Counter(
        (A.get_int(n, A.LAYER, 0), A.get_str(n, A.PHASE, ""), A.get_str(n, MODULE, "")) for n in nodes
    )
    # Two profiled steps of the 2-layer model: each block's qkv linear shows up forward and backward.
    assert by[(1, "fwd", "layers.0.attn.qkv")] > 0 and by[(2, "bwd", "layers.1.attn.qkv")] > 0
    assert {A.get_int(n, "profiler_step", -1) for n in nodes if n.type != pb.METADATA_NODE} == {1, 2}
    # CPU-only run: the host ops are the device work (not is_cpu_op), so what-if models rescale them.
    assert not any(A.is_cpu_op(n) for n in nodes if n.type == pb.COMP_NODE)
    assert A.attr_dict(res.metadata)["pytorch_device"] == "cpu"


def test_times_json() -> None:
    doc = json.loads((EX / "tinygpt_2rank_times.json").read_text())
    assert doc["world_size"] == 2 and len(doc["ranks"]) == 2
    assert all(len(r["step_s"]) == doc["config"]["timed_steps"] for r in doc["ranks"])
    k = json.loads(gzip.decompress((EX / "tinygpt_2rank_kineto.0.json.gz").read_bytes()))
    assert k["distributedInfo"]["backend"] == "gloo"


def test_record_script(tmp_path) -> None:
    pytest.importorskip("torch")
    import runpy
    import sys

    argv = sys.argv
    sys.argv = ["record_pytorch.py", "--out", str(tmp_path), "--ranks", "1"]
    try:
        runpy.run_path(str(REPO / "scripts" / "record_pytorch.py"), run_name="__main__")
    finally:
        sys.argv = argv
    res = import_pytorch(
        [str(tmp_path / "tinygpt_1rank_et.0.json.gz")], [str(tmp_path / "tinygpt_1rank_kineto.0.json.gz")]
    )
    assert res.ranks[0].method == "rf_id" and res.ranks[0].match_rate > 0.99
    assert json.loads((tmp_path / "tinygpt_1rank_times.json").read_text())["ranks"][0]["median_step_s"] > 0


def test_import_is_deterministic(tmp_path) -> None:
    ets = [str(EX / f"tinygpt_2rank_et.{r}.json.gz") for r in range(2)]
    kin = [str(EX / f"tinygpt_2rank_kineto.{r}.json.gz") for r in range(2)]
    a = import_pytorch(ets, kin).write(tmp_path / "a" / "run")
    b = import_pytorch(ets, kin).write(tmp_path / "b" / "run")
    assert [open(p, "rb").read() for p in a] == [open(p, "rb").read() for p in b]
