"""The one-way package rule (issue 25 item 5): every import inside the five top-level packages, module level
or inside a function, goes down the layers and never back up.

The four library folders install as `xsim.traces`, `xsim.netmodels`, `xsim.tracegen` and `xsim.replay`; the rule
names them by folder (an import of `xsim.replay.engine` is the folder `replay`'s module `replay.engine`).

    floor:     traces.errors, traces.limits, traces.lazy, traces.outputs, traces.gpu_names (error root, limits,
               lazy exports, atomic outputs, hardware names): import nothing else of xsim; every package may import them
    traces, netmodels:  independent of each other (netmodels uses only the floor of traces)
    tracegen:  traces
    replay:    traces, netmodels
    xsim:      the application layer, may import everything
"""

# ns-codemod: skip (names modules by folder on purpose)
from __future__ import annotations

import ast
import subprocess
import sys
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


LIBRARIES = ("traces", "netmodels", "tracegen", "replay")


def _folder_name(module: str) -> str:
    """`xsim.replay.engine` -> `replay.engine`: the module named by its folder in the repository."""
    head, _, rest = module.partition(".")
    if head == "xsim" and rest.split(".")[0] in LIBRARIES:
        return rest
    return module


def _imports(path: Path) -> list[str]:
    """Every absolute module name imported by the file, anywhere in it, named by folder."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [_folder_name(a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "xsim":  # `from xsim import replay` imports the library itself
                out += [a.name if a.name in LIBRARIES else "xsim" for a in node.names]
            else:
                out.append(_folder_name(node.module))
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
    f.write_text(
        "def f():\n    from xsim.replay.engine import Engine\n    import xsim.cli\n    from xsim import tracegen\n"
    )
    assert _imports(f) == ["replay.engine", "xsim.cli", "tracegen"]


def test_libraries_are_imported_under_the_one_namespace() -> None:
    """Issue 25 item 5: `xsim.traces`, never `traces` (which an unrelated distribution may own)."""
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in (".venv", ".ci", ".git") or path.name.endswith("_pb2.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            bad += [f"{rel}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in LIBRARIES]
    assert bad == []


def test_a_replay_loads_no_top_level_library(tmp_path: Path) -> None:
    code = (
        "import sys; from xsim.cli import main\n"
        f"rc = main(['replay', {str(ROOT / 'traces' / 'examples' / 'tiny_pipeline')!r}, '--no-progress', '--topology', 'switch:8:50GBps:500ns'])\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {LIBRARIES!r})\n"
        "print('BAD', bad, file=sys.stderr); raise SystemExit(rc)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "BAD []" in r.stderr


def test_lazy_exports_load_under_the_namespace() -> None:
    """Every name a library exports lazily (PEP 562) resolves inside `xsim.*`, never a second copy of a
    module under its folder name (two copies mean two classes per error type: `except` stops matching)."""
    code = (
        "import importlib, sys\n"
        f"for lib in {LIBRARIES!r}:\n"
        "    m = importlib.import_module('xsim.' + lib)\n"
        "    for name in getattr(m, '__all__', ()):\n"
        "        getattr(m, name)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {LIBRARIES!r})\n"
        "print('BAD', bad)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "BAD []" in r.stdout
