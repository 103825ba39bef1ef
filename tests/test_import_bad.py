"""Unusable PyTorch inputs give one clear error naming the file (exit 2), never a traceback."""

from __future__ import annotations

import gzip
import json
import re

import pytest
from xsim.tracegen.importers.pytorch import PyTorchImportError, import_pytorch

from tests.conftest import REPO, need_shared
from xsim.cli import main

EX = REPO / "traces" / "examples" / "pytorch"
ET0, ET1 = EX / "tinygpt_2rank_et.0.json.gz", EX / "tinygpt_2rank_et.1.json.gz"
K0, K1 = EX / "tinygpt_2rank_kineto.0.json.gz", EX / "tinygpt_2rank_kineto.1.json.gz"


def _cli(capsys, *args: str) -> tuple[int, str]:
    rc = main(["import", "pytorch", *args])
    err = capsys.readouterr().err
    return rc, err


def test_kineto_of_another_run_has_no_matches(tmp_path, capsys) -> None:
    dlrm_k = next(
        need_shared("peer_traces/pytorch_host_plus_kineto/param_dlrm_8rank_1.0.1/kineto").glob("worker0*")
    )
    rc, err = _cli(
        capsys,
        "--et",
        str(EX / "tinygpt_1rank_et.0.json.gz"),
        "--kineto",
        str(dlrm_k),
        "--out",
        str(tmp_path / "x"),
    )
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("xsim: error: ") and str(dlrm_k) in err
    # A few generic ops (aten::empty, aten::view, ...) align by name and order even across programs.
    assert re.search(r"only \d\.\d% of the host trace's ops match this Kineto trace", err)


def test_kineto_of_another_rank_is_rejected(tmp_path, capsys) -> None:
    # Rank 0's host trace with rank 1's Kineto: same program, so names and record-function ids agree,
    # but the Kineto events come from another process.
    rc, err = _cli(capsys, "--et", str(ET0), "--kineto", str(K1), "--out", str(tmp_path / "x"))
    assert rc == 2 and str(K1) in err and "not the same process" in err


def test_dlrm_rank_mixup_is_rejected() -> None:
    base = need_shared("peer_traces/pytorch_host_plus_kineto/param_dlrm_8rank_1.0.1")
    k1 = next((base / "kineto").glob("worker1_*"))
    with pytest.raises(PyTorchImportError, match="not the same process"):
        import_pytorch([str(base / "host_et" / "dlrm_eg_0.json.gz")], [str(k1)])


@pytest.mark.parametrize("which", ["et", "kineto"])
@pytest.mark.parametrize("gz", [True, False])
def test_truncated_json(tmp_path, capsys, which: str, gz: bool) -> None:
    src = ET0 if which == "et" else K0
    text = gzip.decompress(src.read_bytes())[:5000]
    bad = tmp_path / ("bad.json.gz" if gz else "bad.json")
    bad.write_bytes(gzip.compress(text) if gz else text)
    if gz:  # a gzip stream cut short as well
        bad.write_bytes(bad.read_bytes()[:-20])
    et, k = (bad, K0) if which == "et" else (ET0, bad)
    rc, err = _cli(capsys, "--et", str(et), "--kineto", str(k), "--out", str(tmp_path / "x"))
    assert rc == 2 and f"xsim: error: {bad}: " in err
    assert "truncated" in err


@pytest.mark.parametrize("schema", ["2.0.0", "1.0.0", "1.1.1-foo", 3])
def test_unknown_schema(tmp_path, capsys, schema) -> None:
    doc = json.loads(gzip.decompress(ET0.read_bytes()))
    doc["schema"] = schema
    et = tmp_path / "et.json"
    et.write_text(json.dumps(doc))
    rc, err = _cli(capsys, "--et", str(et), "--kineto", str(K0), "--out", str(tmp_path / "x"))
    assert rc == 2 and str(et) in err
    assert "schema" in err


def test_swapped_files(tmp_path, capsys) -> None:
    rc, err = _cli(capsys, "--et", str(K0), "--kineto", str(ET0), "--out", str(tmp_path / "x"))
    assert rc == 2 and "this is a Kineto trace; pass it with --kineto" in err and str(K0) in err


def test_pair_count_mismatch(tmp_path, capsys) -> None:
    rc, err = _cli(capsys, "--et", str(ET0), str(ET1), "--kineto", str(K0), "--out", str(tmp_path / "x"))
    assert rc == 2 and "2 host traces but 1 Kineto traces" in err


HOST_ONLY = [
    "chakra_tests_1.0.2-chakra.0.0.4_allgather_2rank_rank0.json",
    "tutorials_hoti2024_2rank_1.0.2-chakra.0.0.4/pytorch_et_0.json.gz",
    "tutorials_hoti2024_2rank_1.0.2-chakra.0.0.4/pytorch_et_1.json.gz",
    "param_resnet_2gpu_1.1.0-chakra.0.0.4/resnet_2gpu_et.json.gz",
    "param_resnet_1gpu_1.0.3-chakra.0.0.4/resnet_1gpu_et.json.gz",
    "param_hf_GPT2_1gpu/hf_GPT2_et.json.gz",
]


@pytest.mark.parametrize("name", HOST_ONLY)
def test_host_only_traces_are_rejected_with_the_reason(tmp_path, capsys, name: str) -> None:
    et = need_shared("peer_traces/pytorch_host_et", name)
    rc, err = _cli(capsys, "--et", str(et), "--out", str(tmp_path / "x"))
    # The trace itself parses (its schema is supported); it is refused because it has no durations.
    assert rc == 2 and str(et) in err and "carry no op durations" in err and "schema 1." in err


def _pair() -> tuple[dict, dict]:
    from tests.test_import_synthetic import GPU_EVENTS, GPU_OPS, _host

    return _host("1.1.1", GPU_OPS), {"traceEvents": json.loads(json.dumps(GPU_EVENTS))}


def _mut_et(f):
    def run(et, k):
        f(et)

    return run


def _mut_k(f):
    def run(et, k):
        f(k)

    return run


MUTATIONS = {
    "nodes not a list": _mut_et(lambda et: et.update(nodes={"a": 1})),
    "node not an object": _mut_et(lambda et: et["nodes"].append("x")),
    "id not a number": _mut_et(lambda et: et["nodes"][0].update(id="x")),
    "duplicate id": _mut_et(lambda et: et["nodes"].append(dict(et["nodes"][0]))),
    "inputs a list": _mut_et(lambda et: et["nodes"][0].update(inputs=[1, 2])),
    "attrs an object": _mut_et(lambda et: et["nodes"][0].update(attrs={"rf_id": 3})),
    "rf_id a word": _mut_et(lambda et: et["nodes"][0]["attrs"][0].update(value="x")),
    "missing parent": _mut_et(lambda et: et["nodes"][0].update(ctrl_deps=999)),
    "parent cycle": _mut_et(
        lambda et: [n.update(ctrl_deps=6 if n["id"] == 3 else n["ctrl_deps"]) for n in et["nodes"]]
    ),
    "name a number": _mut_et(lambda et: et["nodes"][0].update(name=5)),
    "events an object": _mut_k(lambda k: k.update(traceEvents={"a": 1})),
    "event a string": _mut_k(lambda k: k["traceEvents"].append("x")),
    "args a list": _mut_k(lambda k: k["traceEvents"][1].update(args=[1])),
    "ts a word": _mut_k(lambda k: k["traceEvents"][1].update(ts="abc")),
    "no ts": _mut_k(lambda k: k["traceEvents"][1].pop("ts")),
    "distributedInfo a list": _mut_k(lambda k: k.update(distributedInfo=[1])),
    "pg_config an object": _mut_k(lambda k: k.update(distributedInfo={"rank": 0, "pg_config": {"a": 1}})),
    "pg ranks words": _mut_k(
        lambda k: k.update(distributedInfo={"pg_config": [{"pg_name": "0", "ranks": ["a"]}]})
    ),
    "correlation a word": _mut_k(
        lambda k: [
            e["args"].update(correlation="x") for e in k["traceEvents"] if "correlation" in e.get("args", {})
        ]
    ),
    "rf id a word": _mut_k(lambda k: k["traceEvents"][1]["args"].update({"Record function id": "x"})),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_hostile_inputs_never_traceback(tmp_path, capsys, name: str) -> None:
    et, k = _pair()
    MUTATIONS[name](et, k)
    (tmp_path / "et.json").write_text(json.dumps(et))
    (tmp_path / "k.json").write_text(json.dumps(k))
    rc, err = _cli(
        capsys,
        "--et",
        str(tmp_path / "et.json"),
        "--kineto",
        str(tmp_path / "k.json"),
        "--out",
        str(tmp_path / "o" / "x"),
    )
    # Either a usable import or one clear line naming one of the two files.
    assert rc in (0, 2)
    if rc == 2:
        assert err.count("\n") == 1 and (str(tmp_path / "et.json") in err or str(tmp_path / "k.json") in err)
