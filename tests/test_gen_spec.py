"""Deployment specs: loading from YAML/TOML/JSON, the derived cluster, and one clear line per bad spec."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from xsim.tracegen.errors import SpecError
from xsim.tracegen.spec import derive_cluster, load_spec, spec_to_mapping

from xsim.cli import main

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"

GOOD = {
    "name": "two_stage",
    "model": "llama2-7b",
    "seq_len": 2048,
    "micro_batches": 4,
    "schedule": "1f1b",
    "device_groups": [
        {
            "id": 0,
            "gpu": "H100",
            "ranks": [0, 1],
            "tp": 2,
            "layers": [1, 16],
            "micro_batch": 2,
            "pp_stage": 0,
        },
        {
            "id": 1,
            "gpu": "A100",
            "ranks": [2, 3],
            "tp": 2,
            "layers": [17, 32],
            "micro_batch": 2,
            "pp_stage": 1,
        },
    ],
}


def _with(**changes):
    spec = copy.deepcopy(GOOD)
    for key, value in changes.items():
        if key.startswith("dg"):
            idx, field = key[2], key[4:]
            spec["device_groups"][int(idx)][field] = value
        else:
            spec[key] = value
    return spec


def test_good_spec_resolves():
    d = load_spec(GOOD)
    assert (d.name, d.model.name, d.seq_len, d.micro_batches, d.schedule, d.reshard) == (
        "two_stage", "llama2-7b", 2048, 4, "1f1b", "xsim"
    )  # fmt: skip
    assert d.device_groups[1].gpu == "A100-40GB"  # alias resolved
    assert (d.device_groups[1].layer_start, d.device_groups[1].layer_end) == (17, 32)
    assert d.model.seq_len == 4096 and d.dtype_bytes == 2


def test_yaml_toml_json_load_the_same(tmp_path):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(GOOD))
    (tmp_path / "s.json").write_text(json.dumps(GOOD))
    toml = [
        'name = "two_stage"', 'model = "llama2-7b"', "seq_len = 2048", "micro_batches = 4", 'schedule = "1f1b"',
        "[[device_groups]]", 'id = 0', 'gpu = "H100"', "ranks = [0, 1]", "tp = 2", "layers = [1, 16]",
        "micro_batch = 2", "pp_stage = 0",
        "[[device_groups]]", 'id = 1', 'gpu = "A100"', "ranks = [2, 3]", "tp = 2", "layers = [17, 32]",
        "micro_batch = 2", "pp_stage = 1",
    ]  # fmt: skip
    (tmp_path / "s.toml").write_text("\n".join(toml) + "\n")
    loaded = [load_spec(tmp_path / f"s.{ext}") for ext in ("yaml", "json", "toml")]
    assert loaded[0] == loaded[1] == loaded[2] == load_spec(GOOD)


def test_derived_cluster_packs_consecutive_ranks_of_one_gpu_into_nodes_of_eight():
    groups = [{"id": i, "gpu": "H100", "ranks": [i], "dp_replica": i} for i in range(10)]
    groups += [{"id": 10 + i, "gpu": "A100", "ranks": [10 + i], "dp_replica": 10 + i} for i in range(3)]
    d = load_spec({"model": "llama2-7b", "device_groups": groups})
    assert d.cluster_derived
    assert (
        json.loads(d.cluster_json)
        == derive_cluster(d)
        == {
            "preset": "table5",
            "fabric": {"kind": "switch"},
            "nodes": [
                {"name": "node0", "gpu": "H100", "ranks": list(range(8))},
                {"name": "node1", "gpu": "H100", "ranks": [8, 9]},
                {"name": "node2", "gpu": "A100-40GB", "ranks": [10, 11, 12]},
            ],
        }
    )


def test_given_cluster_is_kept_and_resolved_spec_round_trips(tmp_path):
    cluster = {"preset": "table6", "nodes": [{"name": "a", "gpu": "H100", "ranks": [0, 1, 2, 3]}]}
    d = load_spec(_with(cluster=cluster))
    assert json.loads(d.cluster_json) == cluster and not d.cluster_derived
    (tmp_path / "c.json").write_text(json.dumps({"cluster": cluster}))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(_with(cluster="c.json")))
    assert json.loads(load_spec(tmp_path / "s.yaml").cluster_json) == cluster
    for dep in (d, load_spec(EXAMPLES / "figure1.yaml")):
        assert load_spec(spec_to_mapping(dep)) == dep


def test_every_bundled_example_loads():
    names = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
    assert names == [
        "figure1.yaml",
        "figure1_paper.yaml",
        "hetero1024.yaml",
        "hetero192.yaml",
        "mixtral_8x7b_ep8.yaml",
    ] + [f"table4_c{i:02d}.yaml" for i in range(1, 17)]
    assert len(load_spec(EXAMPLES / "hetero1024.yaml").device_groups) > 0
    fig = load_spec(EXAMPLES / "figure1.yaml")
    got = [(g.id, g.gpu, list(g.ranks), g.tp, g.layer_start, g.layer_end) for g in fig.device_groups]
    assert got == [
        (0, "H100", [0, 1, 2], 3, 1, 20),
        (1, "A100-40GB", [5, 6], 2, 21, 32),
        (2, "H100", [3, 4], 2, 1, 15),
        (3, "A100-40GB", [7, 8, 9], 3, 16, 32),
    ]
    for name in names:
        load_spec(EXAMPLES / name)


# Each bad spec and a fragment its single error line must contain.
BAD = [
    ("rank reused", _with(dg1_ranks=[1, 2]), "rank 1 is in device groups 0 and 1"),
    ("rank twice in a group", _with(dg0_ranks=[0, 0], dg1_ranks=[1, 2]), "rank 0 is twice in device group 0"),
    ("rank missing", _with(dg1_ranks=[3, 4]), "rank(s) 2 in no device group"),
    ("tp != ranks", _with(dg0_tp=3), "tp 3 but 2 ranks"),
    (
        "tp not dividing heads",
        _with(dg0_ranks=[0, 1, 2], dg0_tp=3, dg1_ranks=[3, 4]),
        "does not divide the 32 attention heads",
    ),
    ("layer gap", _with(dg1_layers=[18, 32]), "stage 1 (device group 1) starts at layer 18, expected 17"),
    ("layer overlap", _with(dg1_layers=[16, 32]), "starts at layer 16, expected 17"),
    ("layers short", _with(dg1_layers=[17, 31]), "stages end at layer 31, model has 32 layers"),
    (
        "stages out of order",
        _with(dg0_layers=[17, 32], dg1_layers=[1, 16]),
        "stage 0 (device group 0) starts at layer 17",
    ),
    ("stage missing", _with(dg1_pp_stage=2), "stage 1 is missing"),
    ("stage twice", _with(dg1_pp_stage=0), "device groups 0 and 1 are both stage 0"),
    ("layers outside model", _with(dg1_layers=[17, 40]), "outside 1..32"),
    # MI300X joined the catalog in issue 26: an unknown GPU is now MI400 (the error says how to describe one).
    ("unknown gpu", _with(dg1_gpu="MI400"), "unknown GPU 'MI400'"),
    ("unknown model", _with(model="llama9-1t"), "unknown model 'llama9-1t'"),
    ("micro_batch zero", _with(dg0_micro_batch=0), "micro_batch must be a positive integer, got 0"),
    ("micro_batch negative", _with(dg1_micro_batch=-2), "micro_batch must be a positive integer, got -2"),
    ("micro_batches zero", _with(micro_batches=0), "micro_batches must be >= 1, got 0"),
    ("micro_batch differs in a pipeline", _with(dg1_micro_batch=4), "has micro_batch 4 but stage 0 has 2"),
    ("unknown key", _with(shedule="gpipe"), "unknown key(s) shedule"),
    ("bad schedule", _with(schedule="zb-v"), "schedule must be one of gpipe, 1f1b"),
    ("no groups", _with(device_groups=[]), "device_groups must be a non-empty list"),
    ("id twice", _with(dg1_id=0), "device group 0: id used twice"),
]


@pytest.mark.parametrize("label,spec,fragment", BAD, ids=[b[0] for b in BAD])
def test_bad_spec_gives_one_clear_line_and_exit_2(tmp_path, capsys, label, spec, fragment):
    with pytest.raises(SpecError) as err:
        load_spec(spec)
    assert fragment in str(err.value) and "\n" not in str(err.value)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["gen", str(path), "--out", str(tmp_path / "out"), "--no-rewrite"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"xsim: error: {path}: ") and fragment in lines[0]
    assert not (tmp_path / "out").exists()


def test_unparsable_files_are_one_line_errors(tmp_path, capsys):
    bad_yaml = tmp_path / "x.yaml"
    bad_yaml.write_text("model: [unclosed\n")
    bad_ext = tmp_path / "x.ini"
    bad_ext.write_text("a=1")
    for path, fragment in (
        (bad_yaml, "not valid YAML"),
        (bad_ext, "unknown spec format"),
        (tmp_path / "nope.yaml", "cannot read spec"),
    ):
        assert main(["gen", str(path), "--out", str(tmp_path / "o"), "--no-rewrite"]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and fragment in lines[0], lines


def test_huge_or_malformed_numbers_fail_fast_with_one_line(tmp_path, capsys):
    # A rank of 10^9 must not make the "missing ranks" check walk a billion ranks, nor overflow int32.
    for spec, fragment in (
        (_with(dg1_ranks=[2, 1_000_000_000]), "rank(s) 3, 4, 5"),
        (_with(dg1_ranks=[2, 2**40]), "ranks must be a non-empty list"),
        (_with(micro_batches=2**40), "micro_batches must be <= 2147483647"),
        (_with(gpus={"H100": {"price_per_hour": "cheap"}}), "price_per_hour must be a positive number"),
        (_with(model={"base": "llama2-7b", "layers": 2**33}), "layers must be a positive 32-bit integer"),
    ):
        with pytest.raises(SpecError) as err:
            load_spec(spec)
        assert fragment in str(err.value), str(err.value)
    assert main(["gen", str(EXAMPLES / "table4_c01.yaml"), "--out", str(tmp_path), "--name", "../x"]) == 2
    assert "--name '../x'" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert (
        main(["gen", str(EXAMPLES / "table4_c01.yaml"), "--out", str(tmp_path / "file"), "--no-rewrite"]) == 2
    )
    assert "cannot write traces" in capsys.readouterr().err
