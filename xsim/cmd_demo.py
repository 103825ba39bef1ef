"""`xsim demo`: the README's first command; runs xsim's main job on a bundled example."""

from __future__ import annotations

import argparse
from importlib import resources

from xsim import cmd_trace


def bundled_example(name: str) -> str:
    """Path of a trace set bundled in traces/examples/."""
    return str(resources.files("traces") / "examples" / name)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `demo` verb."""
    p = sub.add_parser("demo", help="run xsim on a bundled example (validate, summarize)")
    p.add_argument("--out", default="out/demo", help="folder for the demo's outputs (default: out/demo)")
    p.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    path = bundled_example("tiny_pipeline")
    print(f"== validating the bundled trace set {path}")
    rc = cmd_trace._validate(argparse.Namespace(path=path, comm_groups=None, json=False))
    if rc:
        return rc
    print("== summary")
    return cmd_trace._info(argparse.Namespace(path=path, comm_groups=None, json=False))
