"""Reading (optionally gzipped) JSON trace files with errors that name the file."""

from __future__ import annotations

import gzip
import json
import os
import zlib
from typing import Any

from tracegen.pytorch.errors import PyTorchImportError


def load_json(path: str | os.PathLike[str]) -> Any:
    """Parse a `.json` or `.json.gz` file; truncated or corrupt input raises PyTorchImportError."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise PyTorchImportError(f"cannot read: {exc.strerror or exc}", path=p) from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as exc:
            raise PyTorchImportError(f"gzip stream is truncated or corrupt ({exc})", path=p) from None
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        raise PyTorchImportError("not a UTF-8 JSON file", path=p) from None
    except json.JSONDecodeError as exc:
        what = "truncated JSON" if exc.pos >= len(raw.rstrip()) - 1 else "invalid JSON"
        raise PyTorchImportError(
            f"{what} at line {exc.lineno} column {exc.colno}: {exc.msg}", path=p
        ) from None
