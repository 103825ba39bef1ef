"""The one-way package rule (issue 25 item 5): every import inside the five top-level packages, module level
or inside a function, goes down the layers and never back up.

    floor:     traces.errors, traces.limits, traces.lazy, traces.outputs, traces.gpu_names (error root, limits,
               lazy exports, atomic outputs, hardware names): import nothing else of xsim; every package may import them
    traces, netmodels:  independent of each other (netmodels uses only the floor of traces)
    tracegen:  traces
    replay:    traces, netmodels
    xsim:      the application layer, may import everything
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("traces", "netmodels", "tracegen", "replay", "xsim")
FLOOR = frozenset(
    {"traces", "traces.errors", "traces.limits", "traces.lazy", "traces.outputs", "traces.gpu_names"}
)
MAY_IMPORT = {
    "traces": {"traces"},
    "netmodels": {"netmodels"},
    "tracegen": {"tracegen", "traces"},
    "replay": {"replay", "traces", "netmodels"},
    "xsim": set(PACKAGES),
}


def _imports(path: Path) -> list[str]:
    """Every absolute module name imported by the file, anywhere in it."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append(node.module)
    return out


def _modules():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path.name.endswith("_pb2.py"):
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            yield pkg, name, path


def test_imports_go_down_the_layers() -> None:
    bad = []
    for pkg, name, path in _modules():
        for imp in _imports(path):
            top = imp.split(".")[0]
            if top not in PACKAGES or top in MAY_IMPORT[pkg] or imp in FLOOR:
                continue
            bad.append(f"{name} imports {imp}")
    assert bad == []


def test_the_floor_imports_only_the_floor() -> None:
    bad = []
    for _pkg, name, path in _modules():
        if name not in FLOOR:
            continue
        bad += [
            f"{name} imports {imp}"
            for imp in _imports(path)
            if imp.split(".")[0] in PACKAGES and imp not in FLOOR
        ]
    assert bad == []
    assert {n for _p, n, _f in _modules()} >= FLOOR  # the floor's modules exist (a rename fails here)


def test_the_rule_sees_an_upward_import(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from replay.engine import Engine\n    import xsim.cli\n")
    assert _imports(f) == ["replay.engine", "xsim.cli"]
