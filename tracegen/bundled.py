"""The bundled example specs (the repository's examples/ folder), found in a checkout or an installed xsim.

An installed xsim carries examples/ as the data package `xsim.examples` (setup.py maps the folder), found
through importlib (find_spec); in a checkout `xsim.examples` is the folder itself (xsim/__init__.py).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from xsim.tracegen.errors import SpecError

_CHECKOUT = Path(__file__).resolve().parents[1] / "examples"


def examples_dir() -> str:
    """Folder holding the bundled example specs."""
    # importlib finds the installed data package (a plain folder without __init__.py, so a namespace
    # package: its search locations are real folders in site-packages).
    spec = importlib.util.find_spec("xsim.examples")
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        if os.path.isfile(os.path.join(loc, "figure1.yaml")):
            return os.fspath(loc)
    return os.fspath(_CHECKOUT)


def example_spec(name: str) -> str:
    """Path of a bundled spec by file name (e.g. "figure1.yaml"), or an error listing the bundled ones."""
    d = examples_dir()
    p = os.path.join(d, name)
    if not os.path.isfile(p):
        known = sorted(f for f in os.listdir(d) if f.endswith(".yaml")) if os.path.isdir(d) else []
        raise SpecError(f"no bundled example {name!r} in {d} (bundled: {', '.join(known) or 'none'})")
    return p
