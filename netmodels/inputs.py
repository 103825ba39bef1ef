"""Bounded reading of the network-side input files (cluster JSON, ASTRA-sim configs) and their limits.

netmodels imports nothing from traces (the layering), so these mirror traces.limits: the same env vars
and defaults, so one setting raises the limit for every input.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

from netmodels.errors import NetworkModelError

if TYPE_CHECKING:  # pathlib (with fnmatch and urllib.parse) is not needed to read a file: start-up
    from pathlib import Path

DEFAULT_MAX_JSON_BYTES = 1 << 30  # traces.limits.DEFAULT_MAX_JSON_BYTES: 1 GiB of text per file


def limit(name: str, default: int) -> int:
    """The positive integer in env var NAME, else DEFAULT; a bad value is one clear error."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise NetworkModelError(f"{name}={raw!r}: not an integer") from None
    if value <= 0:
        raise NetworkModelError(f"{name}={raw!r}: must be positive")
    return value


def read_text(path: str | Path, what: str, error: type[NetworkModelError] = NetworkModelError) -> str:
    """A UTF-8 file's text, at most XSIM_MAX_JSON_BYTES: a regular file's size is checked before reading,
    anything else (/dev/zero, a pipe) is read only up to the limit."""
    p = os.fspath(path)
    cap = limit("XSIM_MAX_JSON_BYTES", DEFAULT_MAX_JSON_BYTES)
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
