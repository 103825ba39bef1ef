"""The bundled example specs (the repository's examples/ folder), found in a checkout or an installed xsim.

An installed xsim carries examples/ as the data package `xsim_examples` (setup.py maps the folder), read
through importlib.resources; a source checkout run without installing reads the folder itself.
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

from tracegen.errors import SpecError

_CHECKOUT = Path(__file__).resolve().parents[1] / "examples"


def examples_dir() -> str:
    """Folder holding the bundled example specs."""
    try:
        root = importlib.resources.files("xsim_examples")
        if root.joinpath("figure1.yaml").is_file():
            return os.fspath(root)  # a regular install: a real folder in site-packages
    except ModuleNotFoundError:
        pass
    return os.fspath(_CHECKOUT)


def example_spec(name: str) -> str:
    """Path of a bundled spec by file name (e.g. "figure1.yaml"), or an error listing the bundled ones."""
    d = examples_dir()
    p = os.path.join(d, name)
    if not os.path.isfile(p):
        known = sorted(f for f in os.listdir(d) if f.endswith(".yaml")) if os.path.isdir(d) else []
        raise SpecError(f"no bundled example {name!r} in {d} (bundled: {', '.join(known) or 'none'})")
    return p
