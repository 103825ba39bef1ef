"""The install and the demo pull no torch (issue 13, item 9); `make test` installs the pinned CPU build for the
one test that records a PyTorch profile."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TORCH_PIN = "torch==2.13.0"  # the CPU build the project's registry serves (2.13.0+cpu)


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


def test_install_and_demo_pull_no_torch() -> None:
    make = (REPO / "Makefile").read_text(encoding="utf-8")
    rules = _recipes(make)
    for target in ("$(BIN)/xsim", "venv", "demo"):
        assert "torch" not in rules[target].lower(), target
    dev = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert not any(d.startswith("torch") for d in dev["optional-dependencies"]["dev"])
    assert not any(d.startswith("torch") for d in dev["dependencies"])


def test_make_test_installs_the_pinned_torch_before_the_suite() -> None:
    # The recording test (tests/test_import_bundled.py::test_record_script) needs torch: `make test`, which CI
    # runs, installs it first, so on a fresh machine it runs instead of skipping.
    make = (REPO / "Makefile").read_text(encoding="utf-8")
    assert f"TORCH := {TORCH_PIN}" in make
    assert "$(TORCH)" in _recipes(make)["torch"]
    assert re.search(r"^test: venv torch$", make, re.M)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "make torch" in readme and TORCH_PIN in readme


def test_torch_comes_from_the_registry_alone() -> None:
    # No second index: the pin resolves on the package registry (an unreachable extra index stalls pip).
    make = (REPO / "Makefile").read_text(encoding="utf-8")
    assert "extra-index-url" not in _recipes(make)["torch"] and "TORCH_INDEX" not in make


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
