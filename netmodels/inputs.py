"""Bounded reading of the network-side input files (cluster JSON, ASTRA-sim configs) and their limits.

The limits are traces.limits' (the floor every package may import: tests/test_layers.py): one env var
raises a limit for every input; netmodels reports a bad value as its own NetworkModelError.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

from xsim.netmodels.errors import NetworkModelError
from xsim.traces.limits import DEFAULT_MAX_JSON_BYTES, limit

if TYPE_CHECKING:  # pathlib (with fnmatch and urllib.parse) is not needed to read a file: start-up
    from pathlib import Path


def read_text(path: str | Path, what: str, error: type[NetworkModelError] = NetworkModelError) -> str:
    """A UTF-8 file's text, at most XSIM_MAX_JSON_BYTES: a regular file's size is checked before reading,
    anything else (/dev/zero, a pipe) is read only up to the limit."""
    p = os.fspath(path)
    cap = limit("XSIM_MAX_JSON_BYTES", DEFAULT_MAX_JSON_BYTES, NetworkModelError)
    try:
        with open(p, "rb") as fh:
            st = os.fstat(fh.fileno())
            too_big = stat.S_ISREG(st.st_mode) and st.st_size > cap
            raw = b"" if too_big else fh.read(cap + 1)
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror or exc}") from None
    if too_big or len(raw) > cap:
        raise error(f"{p}: {what} larger than {cap} bytes (XSIM_MAX_JSON_BYTES raises the limit)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{p}: {what} is not UTF-8 text (a binary file?)") from None
