"""Set identity: which trace set a rank file, a deployment.json and a result folder belong to.

A set written by xsim carries an id, a hash of its plan (the resolved spec's graph-shaping keys, or what
an import joined), its rank count and how it was made (generated with or without the rewrite, rewritten,
imported). The id is in `set.json` beside the files and in every rank file's Chakra GlobalMetadata (attributes
`xsim_set_id` and `xsim_set_ranks`; the schema is unchanged, Chakra readers skip them). It depends on the
plan only, not on which files a run writes, so a compact set (one file per rank class) carries the same id.
Readers check each file that exists against `set.json` and refuse one that does not belong, naming it: a
stale rank of a bigger earlier set, a file of another plan, a deployment.json of another set.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xsim.traces import pb
from xsim.traces.errors import TraceSetError, XsimError

if TYPE_CHECKING:  # writers only (trace_set_kind): checking a set's ids never loads the output helpers
    from xsim.traces.outputs import FolderKind

SET_FILE = "set.json"
SET_ID_ATTR = "xsim_set_id"
SET_RANKS_ATTR = "xsim_set_ranks"
_HEAD_BYTES = 1 << 16  # a GlobalMetadata is a version string and a few attributes
_FIRST_READ = 512  # one small read per rank file: tens of thousands of ranks stay cheap


@dataclass(frozen=True)
class SetIdentity:
    """What set.json records: the id, the rank count, the file prefix and how the set was made."""

    set_id: str
    ranks: int
    prefix: str
    variant: str  # "gen", "gen-raw" (--no-rewrite), "rewrite:<strategy>[:no-barriers]", "import"


def make_set_id(plan: str, ranks: int, variant: str) -> str:
    """The id of a set: 16 hex digits of SHA-256 over its plan text, rank count and variant."""
    import hashlib  # here only: a replay of a set without ids never loads it (~10 ms of OpenSSL at start-up)

    h = hashlib.sha256(f"xsim-set/1\n{ranks}\n{variant}\n".encode())
    h.update(plan.encode("utf-8"))
    return h.hexdigest()[:16]


def stamp(meta: pb.GlobalMetadata | None, identity: SetIdentity) -> pb.GlobalMetadata:
    """A copy of `meta` carrying the set's id and rank count (replacing earlier ones)."""
    out = pb.GlobalMetadata()
    if meta is not None:
        out.CopyFrom(meta)
    keep = [a for a in out.attr if a.name not in (SET_ID_ATTR, SET_RANKS_ATTR)]
    del out.attr[:]
    out.attr.extend(keep)
    out.attr.add(name=SET_ID_ATTR, string_val=identity.set_id)
    out.attr.add(name=SET_RANKS_ATTR, int64_val=identity.ranks)
    if not out.version:
        out.version = "1.0.0"
    return out


def write_set_file(folder: str, identity: SetIdentity) -> str:
    """Write `<folder>/set.json` (the folder is a staging folder: no atomic rename needed)."""
    path = os.path.join(folder, SET_FILE)
    doc = {
        "set_id": identity.set_id,
        "ranks": identity.ranks,
        "prefix": identity.prefix,
        "variant": identity.variant,
    }
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(doc, indent=1) + "\n")
    return path


def read_set_file(folder: str) -> SetIdentity | None:
    """The folder's set.json, or None when it has none; a damaged one is refused in one line."""
    from xsim.traces.io import read_json

    path = os.path.join(folder, SET_FILE)
    if not os.path.isfile(path):
        return None
    doc = read_json(path)
    try:
        ident = SetIdentity(str(doc["set_id"]), int(doc["ranks"]), str(doc["prefix"]), str(doc["variant"]))
    except (KeyError, TypeError, ValueError):
        raise TraceSetError("not a set.json (set_id, ranks, prefix, variant)", path=path) from None
    if ident.ranks < 1 or isinstance(doc["ranks"], bool):
        raise TraceSetError("set.json: ranks must be a positive integer", path=path)
    return ident


def file_identity(path: str) -> tuple[str | None, int | None]:
    """(set id, rank count) from a rank file's GlobalMetadata, (None, None) without them (JSON views too)."""
    from google.protobuf.message import DecodeError
    from xsim.traces.wire import read_varint32

    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
            fh.seek(0)
            if head == b"\x1f\x8b":
                import gzip  # gzip files only: a replay of .et files never loads it

                src = gzip.open(fh)
            else:
                src = fh
            with src:
                buf = src.read(_FIRST_READ)
                if buf[:1] in (b"{", b"[", b" ", b"\n", b""):
                    return None, None  # xsim's JSON view or Chakra feeder JSON (or empty): no attributes
                frame = read_varint32(buf, 0)
                if frame is None:
                    return None, None  # the full reader names the damage
                n, pos = frame
                if pos + n > _HEAD_BYTES:
                    return None, None  # not xsim's small metadata: the full reader judges the file
                if pos + n > len(buf):
                    buf += src.read(pos + n - len(buf))
    except (OSError, EOFError) as exc:  # gzip's BadGzipFile is an OSError
        raise TraceSetError(f"cannot read: {getattr(exc, 'strerror', None) or exc}", path=path) from None
    if pos + n > len(buf):
        return None, None  # cut short: the full reader names the damage
    meta = pb.GlobalMetadata()
    try:
        meta.ParseFromString(buf[pos : pos + n])
    except DecodeError:
        return None, None  # the full reader names the damage
    sid = ranks = None
    for a in meta.attr:
        if a.name == SET_ID_ATTR and a.WhichOneof("value") == "string_val":
            sid = a.string_val
        elif a.name == SET_RANKS_ATTR and a.WhichOneof("value") == "int64_val":
            ranks = a.int64_val
    return sid, ranks


def check_identity(trace_set: Any, plan_id: Callable[[int, str], str] | None = None) -> SetIdentity | None:
    """Refuse a file of `trace_set` (a traces.traceset.TraceSet) that does not belong to it, naming it:
    each existing file's id against set.json (or, without one, against rank 0's), the rank count, and a
    deployment.json of another plan (`plan_id`: its id for (ranks, variant), tracegen.set_identity.plan_id_of). Returns the set's identity, None for a set
    written without ids (an older xsim, ASTRA-sim's examples)."""
    from xsim.traces.io import DEPLOYMENT_FILE

    folder = trace_set.directory
    ident = read_set_file(folder)
    whole = ident is not None and os.path.basename(trace_set.prefix) == ident.prefix
    ranks = getattr(trace_set, "written", range(len(trace_set.paths)))
    # A compact set (classes.json) has files for its written ranks only; the others are derived from them.
    paths = list(dict.fromkeys(trace_set.paths[r] for r in sorted(ranks)))
    ids = [(p, *file_identity(p)) for p in paths]
    if ident is None:
        ref = next(((p, s) for p, s, _ in ids if s is not None), None)
        if ref is None:
            return None  # no file carries an id: a set from before set ids
        for p, s, _ in ids:
            if s != ref[1]:
                raise TraceSetError(
                    f"does not belong to this trace set: set id {s or 'none'}, but {os.path.basename(ref[0])} "
                    f"has {ref[1]} (a file of another set or a stale rank?)",
                    path=p,
                )
        return None
    for p, s, r in ids:
        if s != ident.set_id:
            raise TraceSetError(
                f"does not belong to the trace set in {SET_FILE} (set id {s or 'none'}, the set's is "
                f"{ident.set_id}): a stale file or one of another plan; regenerate the set or remove the file",
                path=p,
            )
        if r is not None and r != ident.ranks:
            raise TraceSetError(f"belongs to a {r}-rank set, {SET_FILE} says {ident.ranks}", path=p)
    if whole and trace_set.num_ranks != ident.ranks:
        extra = trace_set.paths[ident.ranks] if trace_set.num_ranks > ident.ranks else trace_set.prefix
        raise TraceSetError(
            f"the set has {ident.ranks} ranks ({SET_FILE}) but {trace_set.num_ranks} rank files are here "
            f"(a stale rank of another set?)",
            path=extra,
        )
    if plan_id is not None and ident.variant != "import":
        want = plan_id(ident.ranks, ident.variant)
        if want != ident.set_id:
            raise TraceSetError(
                f"describes another plan than these traces (set id {want}, the traces' is {ident.set_id}): "
                f"a deployment.json copied from another set?",
                path=os.path.join(folder, DEPLOYMENT_FILE),
            )
    return ident


def trace_set_kind(out: str | os.PathLike[str], name: str, what: str = "traces") -> FolderKind:
    """What a folder written as trace set `name` may already hold and be replaced: the set's metadata,
    and its rank files (any `<name>.*`) when its set.json says xsim wrote a set of that name there. Rank
    files without a set.json (a hand-made set, an older xsim's) or of another name are another set's."""
    from xsim.traces.outputs import FolderKind

    # classes.json: a compact set's class map (traces/classes.py CLASSES_FILE), written by the same `xsim gen`.
    meta = {"comm_group.json", "deployment.json", "memory.json", "classes.json", SET_FILE}
    seen: list[bool] = []  # read once, when the folder is checked (under the writers' lock)

    def ours(n: str) -> bool:
        if not seen:
            try:
                prior = read_set_file(os.fspath(out)) if os.path.isdir(out) else None
            except XsimError:
                prior = None  # a damaged set.json: its rank files are nobody's, refused without --force
            seen.append(prior is not None and prior.prefix == name)
        return n in meta or (seen[0] and n.startswith(f"{name}."))

    return FolderKind(what, ours)
