"""Trace sets: `<prefix>.<rank>.et` for ranks 0..N-1, discovered from a file, a prefix or a folder."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from xsim.traces import pb
from xsim.traces.classes import CLASSES_FILE, RankClasses, compact_refusal, read_classes
from xsim.traces.errors import TraceSetError
from xsim.traces.filekind import non_trace_kind
from xsim.traces.jsonview import is_json_file, load_json
from xsim.traces.stream import EtFile, decode_stream, read_bytes, read_et, write_et

# How far past the file count a rank may go and still be reported as gaps (listing them is cheap) rather
# than as a stray file.
_MAX_LISTED_GAP = 1024
# <prefix>.<rank>.et, optionally gzip-compressed (.et.gz), as ASTRA-sim and Chakra's converters name them.
# Chakra feeder JSON and xsim's JSON view use the same naming with .json.
_RANK_FILE = re.compile(r"^(?P<prefix>.+)\.(?P<rank>\d+)\.(?:et|json)(?:\.gz)?$")


def load_trace_file(path: str | os.PathLike[str]) -> EtFile:
    """Read one rank's file whatever its encoding: framed protobuf (.et, gzip or not) or JSON."""
    return load_json(path) if is_json_file(path) else read_et(path)


@dataclass(frozen=True)
class TraceSet:
    """The per-rank files of one trace set; files are decoded lazily and cached."""

    prefix: str
    paths: tuple[str, ...]  # indexed by rank (a compact set's unwritten ranks: the names they would have)
    _cache: dict[int, EtFile] = field(default_factory=dict, repr=False, compare=False)
    # A compact set's class record (traces/classes.py): only its `written` ranks have files.
    classes: RankClasses | None = field(default=None, compare=False)
    # A compact set's other ranks' file bytes (rank -> bytes; replay.simulation.compact_source), or None.
    source: Callable[[int], bytes] | None = field(default=None, compare=False, repr=False)

    @property
    def num_ranks(self) -> int:
        """Number of ranks in the set."""
        return len(self.paths)

    @property
    def directory(self) -> str:
        """Folder holding the files."""
        return os.path.dirname(self.paths[0]) or "."

    def load(self, rank: int) -> EtFile:
        """Decode (once) and return one rank's file."""
        if rank not in self._cache:
            if self.classes is not None and rank not in self.classes.written:
                if self.source is None:
                    raise TraceSetError(compact_refusal(f"rank {rank}", self.classes), path=self.prefix)
                path = self.paths[rank]
                meta, nodes, offsets = decode_stream(self.source(rank), path)
                self._cache[rank] = EtFile(path=path, metadata=meta, nodes=nodes, offsets=offsets)
            else:
                self._cache[rank] = load_trace_file(self.paths[rank])
        return self._cache[rank]

    def with_source(self, source: Callable[[int], bytes]) -> TraceSet:
        """This compact set with its unwritten ranks' files given by `source` (rank -> bytes)."""
        return TraceSet(self.prefix, self.paths, classes=self.classes, source=source)

    def read(self, rank: int) -> bytes:
        """One rank's file bytes (a compact set's unwritten rank: from `source`)."""
        if self.source is not None and self.classes is not None and rank not in self.classes.written:
            return self.source(rank)
        return read_bytes(self.paths[rank])[0]

    @property
    def written(self) -> frozenset[int] | range:
        """The ranks whose files exist (every rank but in a compact set)."""
        return range(len(self.paths)) if self.classes is None else frozenset(self.classes.written)

    def __iter__(self) -> Iterator[EtFile]:
        for r in range(self.num_ranks):
            yield self.load(r)

    def release(self, rank: int) -> None:
        """Drop a decoded file from the cache (to bound memory on big sets)."""
        self._cache.pop(rank, None)


def _collect(directory: str, want_prefix: str | None) -> dict[str, dict[int, str]]:
    found: dict[str, dict[int, str]] = {}
    try:
        names = sorted(os.listdir(directory or "."))
    except OSError as exc:
        raise TraceSetError(f"cannot list folder: {exc.strerror or exc}", path=directory) from None
    for name in names:
        m = _RANK_FILE.match(name)
        if not m:
            continue
        prefix = os.path.join(directory, m["prefix"]) if directory else m["prefix"]
        if want_prefix is not None and prefix != want_prefix:
            continue
        ranks = found.setdefault(prefix, {})
        rank = int(m["rank"])
        if rank in ranks:
            raise TraceSetError(
                f"rank {rank} present twice ({os.path.basename(ranks[rank])} and {name})", path=prefix
            )
        ranks[rank] = os.path.join(directory, name) if directory else name
    return found


def _as_set(prefix: str, ranks: Mapping[int, str]) -> TraceSet:
    # Rank numbers come from file names and are not trusted: N files must be ranks 0..N-1. A highest rank
    # far past N is named as a stray file before anything ranges over it (a `<prefix>.1000000000000.et`
    # beside a set once meant a loop to 10^12); a few missing ranks are listed as gaps.
    count = len(ranks)
    top = max(ranks)
    if top >= count + _MAX_LISTED_GAP:
        stray = sorted(r for r in ranks if r >= count)
        more = f" and {len(stray) - 1} more" if len(stray) > 1 else ""
        raise TraceSetError(
            f"{os.path.basename(ranks[top])}{more}: rank {top} out of range: the {count} files of a set "
            f"must be ranks 0..{count - 1} (a stray file beside the set?)",
            path=f"{prefix}.<rank>.et",
        )
    n = top + 1
    missing = [r for r in range(n) if r not in ranks]
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        raise TraceSetError(
            f"trace set has gaps: ranks {shown} missing of 0..{n - 1}", path=f"{prefix}.<rank>.et"
        )
    return TraceSet(prefix=prefix, paths=tuple(ranks[r] for r in range(n)))


def discover(path: str | os.PathLike[str], compact: bool = False) -> TraceSet:
    """Resolve PATH (a `.et` file, a `<prefix>` of `<prefix>.<rank>.et` files, or a folder) to a TraceSet.

    A single file that is not named `<prefix>.<rank>.et` is a one-rank set. A compact set (classes.json,
    `xsim gen` without `--all-ranks`) is refused in one line unless `compact`: then its TraceSet carries
    the class record (traces/classes.py) and only its written ranks can be loaded.
    """
    p = os.fspath(path).rstrip("/") or "/"
    if os.path.isdir(p):
        found = _collect(p, None)
        if not found:
            raise TraceSetError("no <prefix>.<rank>.et files in folder", path=p)
        if len(found) > 1:
            names = ", ".join(sorted(os.path.basename(k) for k in found))
            raise TraceSetError(f"folder holds several trace sets ({names}): pass a prefix", path=p)
        ((prefix, ranks),) = found.items()
        return _compact_or_whole(prefix, ranks, compact)
    if os.path.isfile(p):
        kind = non_trace_kind(p)
        if kind is not None:
            raise TraceSetError(f"not a Chakra trace: {kind}", path=p)
        return TraceSet(prefix=p, paths=(p,))
    directory, base = os.path.split(p)
    found = _collect(directory, p)
    if not found:
        raise TraceSetError("no such file, folder or trace-set prefix", path=p)
    return _compact_or_whole(p, found[p], compact)


def _compact_or_whole(prefix: str, ranks: Mapping[int, str], compact: bool) -> TraceSet:
    """The set of `ranks`' files, or the compact set they are the written ranks of (see discover)."""
    classes = read_classes(os.path.dirname(prefix), prefix)
    if classes is None:
        return _as_set(prefix, ranks)
    if not compact:
        raise TraceSetError(compact_refusal("this command", classes), path=prefix)
    if sorted(ranks) != sorted(classes.written):
        raise TraceSetError(
            f"a compact set must hold the files of ranks {_shown(sorted(classes.written))} ({CLASSES_FILE}), "
            f"found ranks {_shown(sorted(ranks))}: regenerate it",
            path=f"{prefix}.<rank>.et",
        )
    ext = os.path.basename(ranks[min(ranks)]).rsplit(".et", 1)
    suffix = ".et" + (ext[1] if len(ext) == 2 else "")
    paths = tuple(ranks.get(r, f"{prefix}.{r}{suffix}") for r in range(classes.num_ranks))
    return TraceSet(prefix=prefix, paths=paths, classes=classes)


def _shown(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks[:6])) + (" ..." if len(ranks) > 6 else "")


def write_trace_set(
    prefix: str | os.PathLike[str],
    per_rank: Sequence[Sequence[pb.Node]] | Mapping[int, Sequence[pb.Node]],
    metadata: pb.GlobalMetadata | Sequence[pb.GlobalMetadata] | None = None,
    *,
    gz: bool = False,
) -> list[str]:
    """Write `<prefix>.<rank>.et` (or `.et.gz`) for every rank; returns the paths in rank order."""
    items = per_rank.items() if isinstance(per_rank, Mapping) else enumerate(per_rank)
    paths = []
    for rank, nodes in sorted(items, key=lambda kv: kv[0]):
        meta = metadata[rank] if isinstance(metadata, Sequence) else metadata
        path = f"{os.fspath(prefix)}.{rank}.et" + (".gz" if gz else "")
        write_et(path, nodes, meta)
        paths.append(path)
    return paths
