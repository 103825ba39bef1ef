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
