"""Per-rank node lists that may stay serialized: a copied rank is held as its template's bytes plus the few
nodes it changes, and becomes a list of pb.Node only when someone asks for it.

The generator copies most ranks from a template (`tracegen.workload`); a copy differs from its device
group's serialized nodes in a handful of P2P and gradient-sync nodes. Keeping it as bytes spares the parse
into messages and the per-node serialization when it is written untouched (its file is the group's framed
records with those nodes spliced in), which is most of a large homogeneous set's generation time.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate, chain, repeat
from operator import add

import numpy as np
from xsim.traces import pb
from xsim.traces.et_stream_pb2 import NodeBatch
from xsim.traces.stream import frame_length, frame_lengths
from xsim.traces.wire import BATCH_NODE_TAG, read_varint32


@dataclass(frozen=True)
class Records:
    """A node list serialized once, as a NodeBatch (to parse it whole) and as framed records (to write it)."""

    batch: bytes  # NodeBatch encoding: per node the field tag 0x0a, a varint length, the node
    framed: bytes  # Chakra's framing (chakra-et.md): per node a varint length, the node
    starts: list[int]  # offset in `framed` of every record, then len(framed)
    bodies: list[int]  # offset in `framed` of every record's node bytes (after its length)

    @classmethod
    def of_batch(cls, batch: bytes) -> Records:
        """Split a serialized NodeBatch into its records (its repeated field 1 is all it holds)."""
        tags, bodies = [], []
        pos, end = 0, len(batch)
        while pos < end:
            head = read_varint32(batch, pos + 1) if batch[pos] == BATCH_NODE_TAG else None
            if head is None:  # pragma: no cover - NodeBatch.SerializeToString writes only field 1
                raise ValueError(f"byte {pos}: not a NodeBatch record")
            tags.append(pos)
            length, pos = head
            bodies.append(pos - len(tags))  # the tags before it are gone in the framed form
            pos += length
        framed = np.delete(np.frombuffer(batch, dtype=np.uint8), tags).tobytes() if tags else b""
        starts = [t - k for k, t in enumerate(tags)] + [len(framed)]
        return cls(batch, framed, starts, bodies)

    @classmethod
    def of_nodes(cls, payloads: list[bytes]) -> Records:
        """Records of serialized nodes, in order."""
        lengths = list(map(len, payloads))
        prefixes = frame_lengths(lengths)
        framed = b"".join(chain.from_iterable(zip(prefixes, payloads, strict=True)))
        batch = b"".join(chain.from_iterable(zip(repeat(b"\x0a"), prefixes, payloads)))
        heads = list(map(len, prefixes))
        starts = [0, *accumulate(map(add, heads, lengths))]
        bodies = list(map(add, starts, heads))  # map stops at the last record
        return cls(batch, framed, starts, bodies)

    @cached_property
    def payloads(self) -> list[bytes]:
        """The serialized nodes, in order (read-only: copy before changing the list)."""
        framed = self.framed
        return [framed[b:e] for b, e in zip(self.bodies, self.starts[1:], strict=True)]

    def payload(self, i: int) -> bytes:
        """The serialized node at position i."""
        return self.framed[self.bodies[i] : self.starts[i + 1]]

    def __len__(self) -> int:
        return len(self.bodies)

    def node(self, i: int) -> pb.Node:
        """A new message parsed from record i (a copy: changing it changes nothing here)."""
        return pb.Node.FromString(self.payload(i))


class CopiedRank:
    """A rank held as bytes: runs of `records` and single serialized nodes, in node order.

    `layout` items are `(start, end)` (the records at positions start..end-1) or the bytes of one node.
    """

    def __init__(self, records: Records, layout: Sequence[tuple[int, int] | bytes]) -> None:
        self.records = records
        self.layout = tuple(layout)
        self._first: list[int] = []  # position of every layout item's first node
        count = 0
        for item in self.layout:
            self._first.append(count)
            count += item[1] - item[0] if isinstance(item, tuple) else 1
        self._count = count

    @classmethod
    def patched(cls, records: Records, patches: dict[int, bytes]) -> CopiedRank:
        """`records` with the nodes at the positions of `patches` replaced by those serialized nodes."""
        layout: list[tuple[int, int] | bytes] = []
        at = 0
        for i in sorted(patches):
            if i > at:
                layout.append((at, i))
            layout.append(patches[i])
            at = i + 1
        if at < len(records):
            layout.append((at, len(records)))
        return cls(records, layout)

    @classmethod
    def of_refs(cls, records: Records, refs: Sequence[int | bytes]) -> CopiedRank:
        """From one stand-in per node: a record position or a serialized node (inverse of `refs`)."""
        layout: list[tuple[int, int] | bytes] = []
        start = last = -2
        for x in refs:
            if x.__class__ is int:
                if x == last + 1:
                    last = x
                    continue
                if start >= 0:
                    layout.append((start, last + 1))
                start = last = x  # type: ignore[assignment]
            else:
                if start >= 0:
                    layout.append((start, last + 1))
                    start = last = -2
                layout.append(x)  # type: ignore[arg-type]
        if start >= 0:
            layout.append((start, last + 1))
        return cls(records, layout)

    def refs(self) -> list[int | bytes]:
        """One stand-in per node: its record position, or its bytes when it is not a record."""
        out: list[int | bytes] = []
        for item in self.layout:
            if isinstance(item, tuple):
                out.extend(range(*item))
            else:
                out.append(item)
        return out

    def __len__(self) -> int:
        return self._count

    def node(self, i: int) -> pb.Node:
        """A new message holding node i (a copy: changing it changes nothing here)."""
        if not 0 <= i < self._count:
            raise IndexError(i)
        k = bisect.bisect_right(self._first, i) - 1
        item = self.layout[k]
        if isinstance(item, tuple):
            return self.records.node(item[0] + i - self._first[k])
        return pb.Node.FromString(item)

    def held(self, positions: Sequence[int]) -> list[int | bytes]:
        """How the nodes at these ascending positions are held: each a position in `records`, or the node's
        bytes when it is not a record."""
        out: list[int | bytes] = []
        first, layout = self._first, self.layout
        k, nxt = -1, 0  # the layout item holding the current position, and where the next one starts
        for i in positions:
            if not 0 <= i < self._count:
                raise IndexError(i)
            if i >= nxt or i < first[k]:
                k = bisect.bisect_right(first, i) - 1
                nxt = first[k + 1] if k + 1 < len(first) else self._count
            item = layout[k]
            out.append(item[0] + i - first[k] if item.__class__ is tuple else item)
        return out

    def nodes(self) -> list[pb.Node]:
        """The nodes as messages: one C-level parse of the records, the others parsed alone."""
        parsed = list(NodeBatch.FromString(self.records.batch).nodes)
        if len(self.layout) == 1 and self.layout[0] == (0, len(parsed)):
            return parsed
        out: list[pb.Node] = []
        for item in self.layout:
            if isinstance(item, tuple):
                out.extend(parsed[item[0] : item[1]])
            else:
                out.append(pb.Node.FromString(item))
        return out

    def framed(self) -> bytes:
        """The framed records of the nodes in order (what follows the metadata in a `.et` file)."""
        framed, starts = self.records.framed, self.records.starts
        parts: list[bytes] = []
        for item in self.layout:
            if isinstance(item, tuple):
                parts.append(framed[starts[item[0]] : starts[item[1]]])
            else:
                parts += [frame_length(len(item)), item]
        return b"".join(parts)


class RankNodes(MutableMapping[int, list[pb.Node]]):
    """rank -> node list, where a rank may be a CopiedRank until its list is first asked for.

    Reading a rank (`[]`, `values`, `items`) turns it into its list for good, so every change made
    through the list is what gets written; `count`, `peek` and `framed` read a copied rank without that.
    """

    def __init__(self, lists: MutableMapping[int, list[pb.Node]] | None = None) -> None:
        self._lists: dict[int, list[pb.Node] | None] = dict(lists or {})
        self._copies: dict[int, CopiedRank] = {}

    def __getitem__(self, rank: int) -> list[pb.Node]:
        nodes = self._lists[rank]
        if nodes is None:
            nodes = self._lists[rank] = self._copies.pop(rank).nodes()
        return nodes

    def __setitem__(self, rank: int, nodes: list[pb.Node]) -> None:
        self._copies.pop(rank, None)
        self._lists[rank] = nodes

    def __delitem__(self, rank: int) -> None:
        del self._lists[rank]
        self._copies.pop(rank, None)

    def __iter__(self) -> Iterator[int]:
        return iter(self._lists)

    def __len__(self) -> int:
        return len(self._lists)

    def __repr__(self) -> str:
        return f"RankNodes({len(self._lists)} ranks, {len(self._copies)} held as bytes)"

    def set_copy(self, rank: int, copy: CopiedRank) -> None:
        """Hold `rank` as bytes until its list is asked for."""
        self._lists[rank] = None
        self._copies[rank] = copy

    def sort(self) -> None:
        """Order the ranks ascending (iteration order)."""
        self._lists = dict(sorted(self._lists.items(), key=lambda kv: kv[0]))

    def count(self, rank: int) -> int:
        """Number of nodes of `rank`, without turning a copied rank into messages."""
        nodes = self._lists[rank]
        return len(nodes) if nodes is not None else len(self._copies[rank])

    def peek(self, rank: int, i: int) -> pb.Node:
        """Node i of `rank` to read only (for a copied rank a parsed copy: changes to it are lost)."""
        nodes = self._lists[rank]
        return nodes[i] if nodes is not None else self._copies[rank].node(i)

    def held(self, rank: int, positions: Sequence[int]) -> tuple[Records, list[int | bytes]] | None:
        """How the nodes at these ascending positions of a rank still held as bytes are held (its records
        and CopiedRank.held; ranks copied from one template share its records); None once it is a list."""
        copy = self._copies.get(rank)
        return None if copy is None else (copy.records, copy.held(positions))

    def copy_of(self, rank: int) -> CopiedRank | None:
        """The bytes `rank` is held as, or None once it is a list."""
        return self._copies.get(rank)

    def framed(self, rank: int) -> bytes | None:
        """The framed node records of a rank still held as bytes, else None (write its list)."""
        copy = self._copies.get(rank)
        return copy.framed() if copy is not None else None

    def total(self) -> int:
        """Nodes over all ranks."""
        return sum(self.count(r) for r in self._lists)
