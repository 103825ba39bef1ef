"""Input size limits checked before work (inflated bytes, frames per file, JSON depth), raisable by env var."""

from __future__ import annotations

import os
import zlib

from xsim.traces.errors import XsimError

# Defaults: far above any trace we know of, far below what exhausts a workstation's memory. A decoded node
# costs ~0.3-0.5 KB in memory, so 2^23 nodes per file is a few GB; the largest per-rank files we have
# (docs/validation.md: 36M nodes over 3072 ranks) hold well under 1M nodes. Raise them with the env vars.
DEFAULT_MAX_INFLATE_BYTES = 4 << 30  # 4 GiB of decompressed bytes per file
DEFAULT_MAX_NODES = 1 << 23  # framed messages per `.et` file
DEFAULT_MAX_JSON_BYTES = 1 << 30  # 1 GiB of JSON text per file (parsed, it takes several times that)
DEFAULT_MAX_SPEC_BYTES = (
    512 << 10
)  # a deployment spec: 4,000+ hand-written device groups; `parallel:` for more
# A set's own deployment.json (written by `xsim gen`, read back by `xsim replay`): device groups listed in
# full, ~300 B per device group of one rank with indent 2 and ~15 B per further rank (measured: 895 KB for
# 16,384 ranks in 2,048 groups of 8, issue 24). 1 KiB per rank bounds every layout with room to spare, so
# the tool's own output is never refused while a hand-written spec keeps its 512 KiB.
SET_METADATA_BYTES_PER_RANK = 1 << 10
DEFAULT_MAX_JSON_DEPTH = 64  # nesting of JSON arrays/objects (Kineto, comm groups, specs use < 10)

_INFLATE_CHUNK = 16 << 20  # decompress in 16 MiB steps so the limit is checked before allocating more


class InputLimitError(XsimError):
    """An input exceeds a documented size limit; the message names the limit's env var."""


def limit(name: str, default: int, error: type[Exception] = InputLimitError) -> int:
    """The limit in env var NAME (a positive integer), else DEFAULT; a bad value is one clear error (of
    type `error`: netmodels reports its own inputs' limits as NetworkModelError)."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise error(f"{name}={raw!r}: not an integer") from None
    if value <= 0:
        raise error(f"{name}={raw!r}: must be positive")
    return value


def max_inflate_bytes() -> int:
    """Most bytes one gzip file may inflate to (XSIM_MAX_INFLATE_BYTES)."""
    return limit("XSIM_MAX_INFLATE_BYTES", DEFAULT_MAX_INFLATE_BYTES)


def max_nodes() -> int:
    """Most framed messages one `.et` file may hold (XSIM_MAX_NODES)."""
    return limit("XSIM_MAX_NODES", DEFAULT_MAX_NODES)


def max_json_bytes() -> int:
    """Most bytes of JSON text one file may hold, after inflating (XSIM_MAX_JSON_BYTES)."""
    return limit("XSIM_MAX_JSON_BYTES", DEFAULT_MAX_JSON_BYTES)


def max_spec_bytes() -> int:
    """Most bytes a deployment spec file may hold (XSIM_MAX_SPEC_BYTES): YAML parses at ~0.3 MB/CPU-s."""
    return limit("XSIM_MAX_SPEC_BYTES", DEFAULT_MAX_SPEC_BYTES)


def max_set_metadata_bytes(num_ranks: int) -> int:
    """Most bytes a trace set's own deployment.json may hold: the spec limit, or 1 KiB per rank of the set
    when that is more (XSIM_MAX_SPEC_BYTES raises the floor)."""
    return max(max_spec_bytes(), SET_METADATA_BYTES_PER_RANK * num_ranks)


def max_json_depth() -> int:
    """Deepest nesting of arrays/objects a JSON or YAML input may have (XSIM_MAX_JSON_DEPTH)."""
    return limit("XSIM_MAX_JSON_DEPTH", DEFAULT_MAX_JSON_DEPTH)


def inflate(raw: bytes, path: str, cap: int | None = None, env: str = "XSIM_MAX_INFLATE_BYTES") -> bytearray:
    """Decompress a gzip file's bytes in bounded steps; more than CAP (default max_inflate_bytes(), raised
    by the env var ENV) is InputLimitError.

    The output grows in place in one bytearray (a bytes-like object every reader here takes): a list of
    pieces joined at the end held the output twice, 1,039 MB peak RSS for 512 MiB inflated against 582 MB.
    Corrupt or truncated data raises zlib.error or EOFError (the callers turn those into their own errors).
    Concatenated gzip members (what `cat a.gz b.gz` makes) are inflated one after another, as gzip does.
    """
    cap = max_inflate_bytes() if cap is None else cap
    out = bytearray()
    data = raw
    while data:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        chunk = d.decompress(data, _INFLATE_CHUNK)
        while True:
            if len(out) + len(chunk) > cap:
                raise InputLimitError(f"{path}: gzip data inflates past {cap} bytes ({env} raises the limit)")
            out += chunk
            if d.eof or (not d.unconsumed_tail and len(chunk) < _INFLATE_CHUNK):
                break
            chunk = d.decompress(d.unconsumed_tail, _INFLATE_CHUNK)
        if not d.eof:
            raise EOFError("compressed file ended before the end-of-stream marker was reached")
        data = d.unused_data
        # gzip tolerates zero padding after the last member.
        if data and not data.lstrip(b"\x00"):
            break
    return out


def json_depth_error(doc: object, path: str) -> str | None:
    """A message when DOC (parsed JSON/YAML data) nests deeper than max_json_depth(), else None."""
    cap = max_json_depth()
    stack: list[tuple[object, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = list(node.values())
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > cap:
            return f"{path}: nesting deeper than {cap} levels (XSIM_MAX_JSON_DEPTH raises the limit)"
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return None


def short_repr(value: object, width: int = 60) -> str:
    """repr() cut to WIDTH characters for an error line; integers too long to print are described."""
    if isinstance(value, int) and value.bit_length() > 200:
        return f"<a {value.bit_length()}-bit integer>"
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # a nested int past 4,300 digits; a list nested past the stack
        text = f"<{type(value).__name__}>"
    return text if len(text) <= width else text[: width - 3] + "..."
