"""Small shared readers: one maybe-gzipped JSON file with a one-line error, and the deployment file name."""

from __future__ import annotations

import json
import os
import stat
import zlib
from typing import Any

from xsim.traces.errors import XsimError
from xsim.traces.limits import (
    InputLimitError,
    inflate,
    json_depth_error,
    max_inflate_bytes,
    max_json_bytes,
)

# The resolved deployment spec that `xsim gen` (and `xsim rewrite`) write beside the traces; replay reads
# it for the cluster, the GPUs and the DP replicas.
DEPLOYMENT_FILE = "deployment.json"
# Peak memory per rank that `xsim gen` writes beside the traces (tracegen/memory.py); replay reports it.
MEMORY_FILE = "memory.json"
GZIP_MAGIC = b"\x1f\x8b"


class JsonFileError(XsimError):
    """A JSON file that cannot be read or parsed; `reason` is the message without the path."""

    def __init__(self, reason: str, *, path: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.reason = reason
        self.path = path


def read_bytes(path: str | os.PathLike[str]) -> bytes | bytearray:
    """A file's bytes, inflated when it starts with the gzip magic; errors name the file."""
    p = os.fspath(path)
    cap = min(max_json_bytes(), max_inflate_bytes())
    env = "XSIM_MAX_JSON_BYTES" if cap == max_json_bytes() else "XSIM_MAX_INFLATE_BYTES"
    try:
        with open(p, "rb") as fh:
            # A regular file's size is checked before reading; anything else (/dev/zero, a pipe) is read
            # up to the limit and no further.
            regular = stat.S_ISREG(os.fstat(fh.fileno()).st_mode)
            if regular and os.fstat(fh.fileno()).st_size > cap:
                raise InputLimitError(f"{p}: file larger than {cap} bytes ({env} raises the limit)")
            raw = fh.read() if regular else fh.read(cap + 1)
    except OSError as exc:
        raise JsonFileError(f"cannot read: {exc.strerror or exc}", path=p) from None
    if len(raw) > cap:
        raise InputLimitError(f"{p}: file larger than {cap} bytes ({env} raises the limit)")
    if raw[:2] == GZIP_MAGIC:
        try:
            raw = inflate(raw, p, cap, env)
        except InputLimitError:
            raise
        except (EOFError, OSError, zlib.error) as exc:
            raise JsonFileError(f"gzip stream is truncated or corrupt ({exc})", path=p) from None
    return raw


def read_json(path: str | os.PathLike[str]) -> Any:
    """Parse a `.json` or `.json.gz` file; unreadable, truncated or invalid input raises JsonFileError."""
    p = os.fspath(path)
    raw = read_bytes(p)
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise JsonFileError(
            "nesting too deep to parse (XSIM_MAX_JSON_DEPTH bounds JSON nesting)", path=p
        ) from None
    except UnicodeDecodeError:
        raise JsonFileError("not a UTF-8 JSON file", path=p) from None
    except json.JSONDecodeError as exc:
        what = "truncated JSON" if exc.pos >= len(raw.rstrip()) - 1 else "invalid JSON"
        raise JsonFileError(f"{what} at line {exc.lineno} column {exc.colno}: {exc.msg}", path=p) from None
    except ValueError as exc:  # an integer literal of 4,300+ digits (Python's int-string limit)
        raise JsonFileError(f"invalid JSON: {str(exc).split(':')[0]}", path=p) from None
    deep = json_depth_error(doc, p)
    if deep is not None:
        raise JsonFileError(deep.removeprefix(f"{p}: "), path=p)
    return doc
