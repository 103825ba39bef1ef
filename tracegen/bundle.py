"""TraceBundle: the generated per-rank graphs and their process groups, before they go to disk."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from xsim.tracegen.errors import GeneratorError
from xsim.tracegen.rank_nodes import RankNodes
from xsim.traces import pb
from xsim.traces.outputs import atomic_write_text
from xsim.traces.setid import SetIdentity, stamp
from xsim.traces.stream import write_et, write_et_records
from xsim.traces.traceset import write_trace_set

# Files written at once by TraceBundle.write: enough to overlap the fsync waits of a few thousand files
# (measured in docs/performance.md, generation round 3), few enough to keep memory flat.
WRITE_THREADS = 8
METADATA_VERSION = "0.0.4"  # what ASTRA-sim's examples write (chakra-et.md section 4)


@dataclass(frozen=True)
class RankTwins:
    """The generator's record of which ranks it made as copies of which (the rewriter's shortcut).

    `of[r]` is the rank whose program rank r copies (r itself when built): both have the same node ids,
    dependencies, types and (phase, layer, micro_batch) tags, and every attribute alike but device_group,
    pg_name, comm_src and comm_dst (and the P2P nodes' names); `tags[s]` holds those tags, one per node in
    order, for every built rank s. Valid only for the bundle as the generator returned it, whose nodes
    name no process group but those in its `comm_groups`.
    """

    of: dict[int, int]
    tags: dict[int, list[tuple[str, int, int]]]


@dataclass
class TraceBundle:
    """Per-rank node lists plus the process groups their collectives name."""

    # rank -> nodes; the generator's RankNodes holds copied ranks as bytes until they are read
    nodes: MutableMapping[int, list[pb.Node]]
    comm_groups: dict[str, tuple[int, ...]] = field(default_factory=dict)  # pg_name -> ranks
    next_id: dict[int, int] = field(default_factory=dict)  # rank -> next free node id
    _index: dict[tuple[int, ...], str] = field(default_factory=dict, repr=False, compare=False)

    def new_group(self, ranks: Iterable[int]) -> str:
        """The pg_name of the group holding exactly `ranks` (in this order), registering it if new.

        Names are decimal strings from "1": "0" is never used, so it keeps ASTRA-sim's "all ranks" meaning.
        """
        members = tuple(ranks)
        hit = self._index.get(members)
        if hit is not None and self.comm_groups.get(hit) == members:
            return hit
        for name, existing in self.comm_groups.items():  # groups added to the dict directly
            if existing == members:
                self._index[members] = name
                return name
        name = str(len(self.comm_groups) + 1)
        while name in self.comm_groups:
            name = str(int(name) + 1)
        self.comm_groups[name] = members
        self._index[members] = name
        return name

    def node_count(self) -> int:
        """Nodes over all ranks (copied ranks are counted, not parsed)."""
        if isinstance(self.nodes, RankNodes):
            return self.nodes.total()
        return sum(len(v) for v in self.nodes.values())

    def write(
        self, out_dir: str | os.PathLike[str], name: str, identity: SetIdentity | None = None
    ) -> list[str]:
        """Write `<out>/<name>.<rank>.et` for every rank and `<out>/comm_group.json`; returns the .et paths.
        With `identity`, every file's metadata carries the set's id (traces.setid)."""
        out = os.fspath(out_dir)
        meta = pb.GlobalMetadata(version=METADATA_VERSION)
        if identity is not None:
            meta = stamp(meta, identity)
        order = sorted(self.comm_groups, key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else 0, k))
        groups = {k: list(self.comm_groups[k]) for k in order}
        try:
            os.makedirs(out, exist_ok=True)
            prefix = os.path.join(out, name)
            if isinstance(self.nodes, RankNodes):
                nodes = self.nodes

                def write_rank(rank: int) -> str:
                    path = f"{prefix}.{rank}.et"
                    records = nodes.framed(rank)
                    if records is None:
                        write_et(path, nodes[rank], meta)
                    else:  # a copied rank nobody read: its bytes as they are
                        write_et_records(path, records, meta)
                    return path

                # Each file is flushed to disk (fsync) before it is renamed into place: that waits on the
                # disk, not the CPU, so a few files in flight at once overlap the waits (pool.map: the
                # first error in rank order is raised).
                with ThreadPoolExecutor(max_workers=WRITE_THREADS) as pool:
                    paths = list(pool.map(write_rank, sorted(nodes)))
            else:
                paths = write_trace_set(prefix, self.nodes, meta)
            text = json.dumps(groups, indent=None, separators=(", ", ": ")) + "\n"
            atomic_write_text(os.path.join(out, "comm_group.json"), text)
        except OSError as exc:
            raise GeneratorError(f"{out}: cannot write traces: {exc.strerror or exc}") from None
        return paths
