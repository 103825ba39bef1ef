"""Set-up installs no torch; torch is an opt-in Makefile target naming the CPU wheel (issue 13, item 9)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CPU_WHEEL = "torch==2.13.0+cpu"


def _recipes(makefile: str) -> dict[str, str]:
    """target -> its recipe lines (joined), for the Makefile's simple rules."""
    out: dict[str, str] = {}
    target = None
    for line in makefile.splitlines():
        m = re.match(r"^([\w$()./-]+):", line)
        if m and not line.startswith("\t"):
            target = m.group(1)
            out[target] = line.split(":", 1)[1]
        elif line.startswith("\t") and target:
            out[target] += "\n" + line
    return out


def test_default_setup_installs_no_torch() -> None:
    make = (REPO / "Makefile").read_text(encoding="utf-8")
    rules = _recipes(make)
    for target in ("$(BIN)/xsim", "venv", "demo", "test"):
        assert "torch" not in rules[target].lower(), target
    dev = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert not any(d.startswith("torch") for d in dev["optional-dependencies"]["dev"])
    assert not any(d.startswith("torch") for d in dev["dependencies"])


def test_torch_is_an_opt_in_target_naming_the_cpu_wheel() -> None:
    make = (REPO / "Makefile").read_text(encoding="utf-8")
    assert f"TORCH := {CPU_WHEEL}" in make
    assert "$(TORCH)" in _recipes(make)["torch"]
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "make torch" in readme and CPU_WHEEL in readme


def test_torch_comes_from_the_cpu_wheel_index() -> None:
    # `+cpu` builds are on PyTorch's own index, not PyPI (issue 26 item 8: `make torch` failed without it).
    make = (REPO / "Makefile").read_text(encoding="utf-8")
    assert "TORCH_INDEX := https://download.pytorch.org/whl/cpu" in make
    assert "--extra-index-url $(TORCH_INDEX)" in _recipes(make)["torch"]


def test_distribution_name_is_free_and_the_command_is_xsim() -> None:
    # `xsim` on PyPI is an unrelated project (a command line for MTN/MCI accounts); ours is xsim-replay.
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["name"] == "xsim-replay" and project["scripts"] == {"xsim": "xsim.cli:entry"}


def test_fast_target_lists_existing_files_and_explains_skips() -> None:
    make = (REPO / "Makefile").read_text(encoding="utf-8")
    rules = _recipes(make)
    assert (
        "pytest -rs" in rules["test"]
        and "pytest -rs" in rules["test-fast"]
        and "tests/fast.txt" in rules["test-fast"]
    )
    listed = [
        ln for ln in (REPO / "tests" / "fast.txt").read_text().splitlines() if ln and not ln.startswith("#")
    ]
    assert listed and all((REPO / f).is_file() for f in listed)
    assert "tests/test_readme_tour.py" not in listed  # minutes: the full suite runs it
