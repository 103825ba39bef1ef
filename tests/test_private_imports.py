"""No module imports another package's private names (`_x`), and scripts/tests import nothing private
from xsim/: what crosses a package boundary is public API (issue 12)."""

# ns-codemod: skip (names packages by folder on purpose)
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("traces", "tracegen", "replay", "netmodels", "xsim")
LIBRARIES = PACKAGES[:4]  # installed as xsim.traces, ... (issue 25 item 5); named here by folder


def _folder(module: str) -> str:
    """`xsim.replay.fold` -> `replay.fold`."""
    head, _, rest = module.partition(".")
    return rest if head == "xsim" and rest.split(".")[0] in LIBRARIES else module


def _private(name: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in name.split("."))


def _violations(path: Path) -> list[str]:
    rel = path.relative_to(REPO)
    home = rel.parts[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(rel))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "xsim" and all(a.name in LIBRARIES for a in node.names):
                continue  # `from xsim import replay`: the library itself, public
            target = _folder(node.module).split(".")[0]
            names = [a.name for a in node.names]
            modules = [_folder(node.module)]
        elif isinstance(node, ast.Import):
            names, modules = [], [_folder(a.name) for a in node.names]
            target = modules[0].split(".")[0]
        else:
            continue
        if target not in PACKAGES:
            continue
        crossing = target != home if home in PACKAGES else target == "xsim" or home in ("scripts", "tests")
        if not crossing:
            continue
        if home in ("scripts", "tests") and target != "xsim":
            # scripts and tests may reach into a package's internals to test them, but never the CLI's.
            continue
        bad = [n for n in names if _private(n)] + [m for m in modules if _private(m)]
        out += [f"{rel}:{node.lineno}: imports {b} from {target}" for b in bad]
    return out


def test_no_private_name_crosses_a_package() -> None:
    found = []
    for folder in (*PACKAGES, "scripts", "tests"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if not path.name.endswith("_pb2.py"):
                found += _violations(path)
    assert found == []


def test_the_scanner_sees_a_private_import(tmp_path: Path) -> None:
    # The scan must be able to fail: a synthetic module importing a private name across packages.
    fake = REPO / "replay" / "_scan_probe_tmp.py"
    fake.write_text("from netmodels.cluster import _nodes_topology\nfrom traces.attrs import get_int\n")
    try:
        assert _violations(fake) == [f"{fake.relative_to(REPO)}:1: imports _nodes_topology from netmodels"]
    finally:
        fake.unlink()
