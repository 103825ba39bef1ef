"""What a file is when it is not a Chakra trace: a deployment spec, a Kineto or PyTorch trace, an ASTRA-sim
config or 1.0 text workload. Read from the first bytes only, so a wrong file gets a line saying what it is and
what to do with it, instead of a decoder's "truncated file?".
"""

from __future__ import annotations

import os
import re
import zlib

HEAD_BYTES = 65536
_TEXT_WORKLOAD = re.compile(r"^(DATA|MODEL|HYBRID\w*|MICRO\w*)\b")
_SPEC_KEYS = ("device_groups", "parallel", "model")


def _head(path: str) -> bytes:
    with open(path, "rb") as fh:
        raw = fh.read(HEAD_BYTES)
    if raw[:2] == b"\x1f\x8b":
        try:
            return zlib.decompressobj(wbits=31).decompress(raw, HEAD_BYTES)
        except zlib.error:
            return b""
    return raw


def _is_text(raw: bytes) -> bool:
    if not raw:
        return False
    if any(b < 9 or 13 < b < 32 for b in raw[:4096]):
        return False
    try:
        raw[:4096].decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start > 4090  # a multi-byte character cut at the end of the window
    return True


def _has_key(text: str, key: str) -> bool:
    return re.search(rf'(^|[\s{{,"]){re.escape(key)}"?\s*[:=]', text, re.MULTILINE) is not None


def non_trace_kind(path: str | os.PathLike[str]) -> str | None:
    """A one-line description (what the file is, what to do) when `path` is a known non-trace kind, else None."""
    p = os.fspath(path)
    try:
        raw = _head(p)
    except (OSError, EOFError):  # gzip's BadGzipFile is an OSError
        return None
    if not _is_text(raw):
        return None  # binary: a framed protobuf .et (or garbage the decoder will name)
    text = raw.decode("utf-8", errors="replace")
    stripped = text.lstrip()
    first = stripped.splitlines()[0] if stripped else ""
    if _TEXT_WORKLOAD.match(first):
        return (
            "an ASTRA-sim 1.0 text workload (layer-wise, not Chakra ET); xsim replays Chakra traces: convert "
            "it with Chakra's text2chakra converter first"
        )
    if stripped.startswith(("{", "[")):
        if '"traceEvents"' in text:
            return "a Kineto (PyTorch profiler) trace: import it with `xsim import pytorch --et HOST_ET --kineto THIS`"
        if '"schema"' in text and '"nodes"' in text and ('"pid"' in text or '"finish_ts"' in text):
            return "a PyTorch host execution trace: import it with `xsim import pytorch --et THIS --kineto KINETO`"
        if '"scheduling-policy"' in text or '"all-reduce-implementation"' in text:
            return "an ASTRA-sim system config: pass it as --astra-system with --astra-network"
        if any(_has_key(text, k) for k in ("device_groups", "parallel")):
            return "a deployment spec (JSON): run `xsim gen SPEC --out DIR` first, then replay DIR"
        if re.fullmatch(
            r'\s*\{\s*"[^"]*"\s*:\s*\[[\d,\s]*\](\s*,\s*"[^"]*"\s*:\s*\[[\d,\s]*\])*\s*\}\s*', text
        ):
            return "a process-groups file: pass it with --comm-groups beside the trace set"
        return None  # xsim's JSON view or Chakra's feeder JSON: the JSON reader decides
    if _has_key(text, "npus_count") or _has_key(text, "topology") and _has_key(text, "bandwidth"):
        return "an ASTRA-sim network config: pass it as --astra-network (with --astra-system)"
    if any(_has_key(text, k) for k in _SPEC_KEYS):
        return "a deployment spec (YAML/TOML): run `xsim gen SPEC --out DIR` first, then replay DIR"
    return "a text file, not a Chakra trace (framed protobuf .et, or its JSON view)"
