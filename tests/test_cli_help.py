"""What a newcomer sees of the command line (issue 13, item 8) and how fast it starts (issue 12)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from xsim.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]


def _leaf_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) of every verb and sub-verb."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    if path:
        yield path, parser
    for name, p in subs[0].choices.items():
        yield from _leaf_parsers(p, (*path, name))


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as ex:
        main([*argv, "--help"])
    assert ex.value.code == 0
    return capsys.readouterr().out


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as ex:
        main(["--version"])
    assert ex.value.code == 0
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    version = next(line.split('"')[1] for line in text.splitlines() if line.startswith("version ="))
    assert capsys.readouterr().out == f"xsim {version}\n"


def test_every_help_has_examples(capsys) -> None:
    verbs = list(_leaf_parsers(build_parser()))
    assert len(verbs) >= 15
    for path, _ in verbs:
        out = _help(list(path), capsys)
        assert "examples:\n  xsim " in out or "examples:\n  d=" in out, path


def test_demo_help_is_whole_sentences(capsys) -> None:
    out = _help(["demo"], capsys)
    body = " ".join(out.split("\n\n")[1].split())
    assert body.startswith(
        "Plan, generate, validate and replay the paper's Figure 1 deployment"
    ) and body.endswith("what the paper's plan as drawn would need.")


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["replay"], "default: analytical, or astra-unaware with --astra-network"),
        (["net", "collective"], "default: analytical, or astra-unaware with --astra-network"),
        (["sweep"], "(default: out/sweep)"),
        (["sweep"], "order of the table (default: throughput, tokens/s then $/Mtok"),
        (["sweep"], "network model (default: analytical)"),
        (["demo"], "network model (default: flow)"),
    ],
)
def test_defaults_are_shown(capsys, argv: list[str], shown: str) -> None:
    assert shown in " ".join(_help(argv, capsys).split())


def test_unknown_option_names_the_verb_in_one_line(capsys) -> None:
    with pytest.raises(SystemExit) as ex:
        main(["replay", "traces/examples/tiny_pipeline", "--modle", "flow"])
    err = capsys.readouterr().err
    assert ex.value.code == 2
    # One line (issue 26 item 9): the error, a "did you mean", where the usage is.
    assert err.count("\n") == 1 and err.startswith("xsim replay: error: unrecognized arguments: --modle")
    assert "(did you mean --model?)" in err and "see `xsim replay --help`" in err
    with pytest.raises(SystemExit):
        main(["net", "p2p", "--sizes", "1"])
    assert capsys.readouterr().err.startswith("xsim net p2p: error: ")


def test_import_pytorch_usage_shows_kineto_required(capsys) -> None:
    usage = _help(["import", "pytorch"], capsys).split("\n\n")[0]
    assert "--kineto KINETO.json[.gz]" in usage and "[--kineto" not in usage


def test_model_choices_come_from_the_registry(capsys) -> None:
    from xsim.netmodels.models import model_choices, model_names

    for argv in (["replay"], ["net", "p2p"]):
        assert "{" + ",".join(model_choices()) + "}" in _help(argv, capsys)
    for argv in (["sweep"], ["demo"]):
        assert "{" + ",".join(model_names("topology")) + "}" in _help(argv, capsys)


HEAVY = ("polars", "networkx", "numpy", "google.protobuf", "rich", "matplotlib", "yaml")


def test_help_imports_nothing_heavy() -> None:
    # `xsim --help` must start fast (<= 0.2 s): the verbs import their libraries only when they run.
    code = (
        "import sys, contextlib, io\n"
        "from xsim.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "import json; print(json.dumps(sorted(m for m in sys.modules)))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert res.returncode == 0, res.stderr
    loaded = set(json.loads(res.stdout))
    assert [m for m in HEAVY if m in loaded] == []
