"""The README as a new user runs it (issue 26 item 1): its first block is the two fresh-machine commands, and
every command of "A tour" runs, in order, in a fresh folder, and exits 0."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def _blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.M | re.S)


def tour_commands(readme: str) -> list[str]:
    """The tour block's commands: continuation lines joined, comments and blank lines dropped."""
    body = readme.split("## A tour", 1)[1]
    block = _blocks(body)[0]
    joined = block.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        # A comment starts a line or follows two spaces (the tour aligns its comments).
        code = re.split(r"(?:^|\s{2,})#", line, maxsplit=1)[0].strip()
        if code:
            out.append(" ".join(code.split()))
    return out


def test_first_block_is_the_two_fresh_machine_commands() -> None:
    first = _blocks((REPO / "README.md").read_text(encoding="utf-8"))[0]
    assert first.split("\n")[:-1] == ["make demo", "make test"]
    make = (REPO / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^demo:", make, re.M) and re.search(r"^test:", make, re.M)


def test_tour_commands_parse() -> None:
    cmds = tour_commands((REPO / "README.md").read_text(encoding="utf-8"))
    assert cmds[0] == "xsim plan examples/figure1.yaml"
    assert all(c.startswith(("xsim ", "python ", "P=")) for c in cmds), cmds


def test_every_tour_command_exits_0(tmp_path: Path) -> None:
    cmds = tour_commands((REPO / "README.md").read_text(encoding="utf-8"))
    work = tmp_path / "work"
    work.mkdir()
    for name in ("examples", "traces", "scripts", "tracegen", "replay", "netmodels", "xsim", "docs", "tests"):
        (work / name).symlink_to(REPO / name)
    shared = REPO.parent / "shared" / "peer_traces"
    if shared.is_dir():
        (tmp_path / "shared").symlink_to(shared.parent)
    skipped = [c for c in cmds if "../shared/" in c and not shared.is_dir()]
    run = [c for c in cmds if c not in skipped]
    # `xsim` is this checkout's command line; `python` this interpreter. One shell, so P=... carries over.
    script = "\n".join(
        [
            "set -e",
            f'xsim() {{ "{sys.executable}" -m xsim "$@"; }}',
            f'python() {{ "{sys.executable}" "$@"; }}',
            "trap 'echo \"TOUR COMMAND FAILED: $BASH_COMMAND\" >&2' ERR",
            *run,
        ]
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "XSIM_NO_PROGRESS": "1"}
    r = subprocess.run(
        ["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=1500
    )
    assert r.returncode == 0, r.stderr[-3000:]
    if skipped:
        pytest.skip(f"ran {len(run)} tour commands; {len(skipped)} need ../shared/peer_traces (absent)")
