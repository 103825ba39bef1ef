"""A new user's stumbles of issue 26 (items 1 and 9): one test each, each failing before its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from xsim.traces.wording import did_you_mean, plural

from tests.conftest import REPO
from tests.test_replay_support import coll, comp, write_set
from xsim.cli import main

EXAMPLES = REPO / "examples"


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# --- item 1: the tour's first command plans a deployment that fits -------------------------------------


def test_figure1_plan_fits_and_the_paper_plan_as_drawn_does_not(capsys) -> None:
    assert main(["plan", str(EXAMPLES / "figure1.yaml")]) == 0
    out = capsys.readouterr().out
    assert "OOM" not in out
    assert main(["plan", str(EXAMPLES / "figure1_paper.yaml")]) == 2
    assert "rank 7 (A100-40GB, device group 3, stage 1) needs 184.9 GiB" in _one_line_error(capsys)


def test_figure1_is_the_paper_plan_with_1f1b_and_full_recompute() -> None:
    from xsim.tracegen.spec import load_spec

    fit, paper = load_spec(EXAMPLES / "figure1.yaml"), load_spec(EXAMPLES / "figure1_paper.yaml")
    assert (fit.schedule, fit.recompute, paper.schedule, paper.recompute) == ("1f1b", "full", "gpipe", "none")
    # Everything else is the figure's: cuts, TP degrees, micro-batch sizes and counts, sequence length.
    fit.schedule, fit.recompute = paper.schedule, paper.recompute
    fit.ClearField("recompute_layers")  # full recompute's unit (1 layer, the default), unset without it
    assert fit == paper


def test_figure1_rank7_activations_by_hand() -> None:
    # Korthikanti et al. 2022 section 4: with full recompute a layer keeps only its input, 2*s*b*h bytes; under
    # 1F1B the last of 2 stages holds 1 micro-batch. Rank 7: 17 layers, b = 16, s = 2048, h = 4096.
    from xsim.tracegen.memory import deployment_memory
    from xsim.tracegen.spec import load_spec

    fit = {r.rank: r for r in deployment_memory(load_spec(EXAMPLES / "figure1.yaml"))}
    paper = {r.rank: r for r in deployment_memory(load_spec(EXAMPLES / "figure1_paper.yaml"))}
    stored = 17 * 2 * 2048 * 16 * 4096
    # What a recomputed unit holds while its backward runs (one layer's full activations) is the rest.
    assert fit[7].activations >= stored and fit[7].activations < paper[7].activations / 10
    assert all(r.headroom >= 0 for r in fit.values())
    assert weights_equal(fit[7], paper[7])


def weights_equal(a, b) -> bool:
    """Same weights, gradients and optimizer state: the plan changes only what activations are kept."""
    return (a.weights, a.gradients, a.optimizer) == (b.weights, b.gradients, b.optimizer)


def test_demo_says_what_the_paper_plan_would_need() -> None:
    from xsim.cmd_demo import paper_plan_line

    line = paper_plan_line()
    assert "\n" not in line
    assert "figure1_paper.yaml" in line and "needs 184.9 GiB" in line and "has 40.0 GiB" in line
    assert "1F1B and full recompute" in line


# --- item 9: small stumbles --------------------------------------------------------------------------


def test_plurals() -> None:
    assert [plural(n, "file") for n in (0, 1, 2, 1024)] == ["0 files", "1 file", "2 files", "1,024 files"]


def test_report_help_example_names_a_replay_folder(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    out = capsys.readouterr().out
    # Every example's RESULTDIR is a replay folder (`--out` of `xsim replay`), never the validate folder.
    examples = [ln.strip() for ln in out.split("examples:")[1].splitlines() if ln.strip()]
    assert examples and all("xsim report out/ddp/val " not in e for e in examples)
    assert any("--validation out/ddp/val" in e for e in examples)


def test_plan_spec_with_search_is_refused(capsys) -> None:
    argv = ["plan", str(EXAMPLES / "figure1.yaml"), "--search", "2xH100", "--model", "llama2-7b"]
    assert main([*argv, "--global-batch", "4"]) == 2
    line = _one_line_error(capsys)
    assert "not both" in line and "figure1.yaml" in line


def test_replay_prints_what_it_wrote(tmp_path: Path, capsys) -> None:
    write_set(tmp_path / "t", [[comp(1, 5), coll(2, 1024, deps=[1])], [coll(2, 1024)]])
    out = tmp_path / "res"
    argv = ["replay", str(tmp_path / "t"), "--topology", "switch:2:50GBps:1us", "--no-progress"]
    assert main([*argv, "--out", str(out), "--timeline", str(tmp_path / "tl.json")]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("wrote ")]
    assert lines[0].startswith(f"wrote 10 files in {out}: ") and "summary.json" in lines[0]
    assert lines[1] == f"wrote 1 file in {tmp_path}: tl.json"
    # Under --json, stdout stays one JSON document and the lines go to stderr.
    assert main([*argv, "--out", str(out), "--json"]) == 0
    cap = capsys.readouterr()
    json.loads(cap.out)
    assert cap.err.startswith(f"wrote 10 files in {out}")
    # One rank: "1 rank", not "1 ranks".
    write_set(tmp_path / "one", [[comp(1, 5)]])
    assert main(["replay", str(tmp_path / "one"), "--topology", "switch:1:50GBps:1us", "--no-progress"]) == 0
    assert " on 1 rank of " in capsys.readouterr().out


def test_trace_info_counts_collectives_as_the_replay_does(tmp_path: Path, capsys) -> None:
    # 3 ranks issue 2 AllReduces each over all ranks: 6 nodes, 2 collectives (what the replay reports).
    write_set(tmp_path / "t", [[coll(1, 64), coll(2, 64, deps=[1])] for _ in range(3)])
    assert main(["trace", "info", str(tmp_path / "t"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["collectives"]["ALL_REDUCE"] == {"count": 6, "instances": 2, "bytes": 384}
    assert main(["replay", str(tmp_path / "t"), "--topology", "switch:3:50GBps:1us", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_collectives"] == info["num_collectives"] == 2


def test_trace_validate_counts_findings_by_kind(tmp_path: Path, capsys) -> None:
    # 8 control dependencies on nodes that do not exist: warnings; 5 listed, then a count by kind.
    nodes = [comp(i, 1) for i in range(1, 9)]
    for n in nodes:
        n.ctrl_deps.append(1000 + n.id)
    write_set(tmp_path / "t", [nodes])
    assert main(["trace", "validate", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert sum("[dangling-ctrl-dep]" in ln for ln in out) == 5
    summary = ": 8 findings by kind: 8 dangling-ctrl-dep (3 not listed: --all lists them)"
    assert any(ln.startswith(str(tmp_path / "t")) and ln.endswith(summary) for ln in out), out
    assert out[-1].endswith("1 rank, 8 nodes: OK (8 warnings)")
    assert main(["trace", "validate", str(tmp_path / "t"), "--all"]) == 0
    assert sum("[dangling-ctrl-dep]" in ln for ln in capsys.readouterr().out.splitlines()) == 8


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["replay", "x", "--model", "flo"], "(did you mean flow?)"),
        (["sweep", "x", "--sort", "cots"], "(did you mean cost?)"),
        (["replay", "x", "--modle", "flow"], "(did you mean --model?)"),
    ],
)
def test_argparse_errors_are_one_line_with_did_you_mean(capsys, argv: list[str], hint: str) -> None:
    with pytest.raises(SystemExit) as ex:
        main(argv)
    assert ex.value.code == 2
    line = _one_line_error(capsys)
    assert line.startswith(f"xsim {argv[0]}: error: ") and hint in line


def test_spec_key_and_gpu_name_did_you_mean(tmp_path: Path, capsys) -> None:
    text = (EXAMPLES / "figure1.yaml").read_text()
    cases = [
        (text.replace("micro_batches: 4", "micro_batchs: 4"), "(did you mean micro_batches?)"),
        (text.replace("micro_batch: 8,", "micro_batchs: 8,", 1), "(did you mean micro_batch?)"),
        (
            text.replace("gpu: H100,", "gpu: A100 80GB,", 1),
            "unknown GPU 'A100 80GB' (did you mean A100-80GB?)",
        ),
    ]
    for i, (spec, hint) in enumerate(cases):
        path = tmp_path / f"s{i}.yaml"
        path.write_text(spec)
        assert main(["plan", str(path)]) == 2
        assert hint in _one_line_error(capsys)
    assert did_you_mean("zzz", ["micro_batch"]) == ""


def test_replay_on_other_gpus_says_so(tmp_path: Path, capsys) -> None:
    # Figure 1's ranks 5-9 are A100s; a topology of ten H100s replays them on H100 links: one warning line.
    from xsim.tracegen.spec import load_spec, save_deployment
    from xsim.tracegen.workload import generate

    dep = load_spec(EXAMPLES / "figure1.yaml")
    dep.micro_batches = 1
    generate(dep).write(tmp_path / "fig1", dep.name)
    save_deployment(dep, tmp_path / "fig1" / "deployment.json")
    argv = ["replay", str(tmp_path / "fig1"), "--topology", "nodes:H100x10", "--no-progress"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert (
        "5 ranks sit on GPUs unlike the traces' device groups (rank 5: topology H100, traces A100-40GB)"
        in err
    )
