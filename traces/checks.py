"""Validation of Chakra traces: per-file graph checks and cross-rank consistency of a trace set."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from xsim.traces import attrs as A
from xsim.traces import pb
from xsim.traces.attrcheck import node_problem
from xsim.traces.errors import AttributeTypeError
from xsim.traces.graph import DepGraph
from xsim.traces.groups import ProcessGroups
from xsim.traces.stream import EtFile

# "invalid" findings make a file unusable as a trace (a replay must refuse it); "mismatch" findings are
# cross-rank inconsistencies of files that are each valid on their own.
INVALID = "invalid"
MISMATCH = "mismatch"
# Allowed by some producers and consumers but worth knowing: ctrl_deps of old PyTorch converters hold the
# call-tree parent (chakra-et.md 3.3), which may be absent from the file or even form a cycle with data_deps;
# the legacy ETFeeder ignores ctrl_deps, FeederV3 does not.
WARNING = "warning"

_P2P = (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)


@dataclass(frozen=True)
class Finding:
    """One problem found in a trace, located by file, rank and node."""

    kind: str  # INVALID | MISMATCH
    code: str  # short stable identifier, e.g. "cycle", "dangling-dep", "unmatched-send"
    message: str
    path: str | None = None
    rank: int | None = None
    node_index: int | None = None
    node_id: int | None = None

    def __str__(self) -> str:
        where = [self.path or "<trace>"]
        if self.rank is not None:
            where.append(f"rank {self.rank}")
        if self.node_index is not None:
            where.append(f"node #{self.node_index}")
        if self.node_id is not None:
            where.append(f"id {self.node_id}")
        return f"{', '.join(where)}: {self.message} [{self.code}]"


def find_cycle(nodes: Sequence[pb.Node], ctrl: bool = True) -> list[int] | None:
    """Node ids of one dependency cycle (in dependency order), or None if acyclic; ctrl=False: data deps only."""
    return DepGraph(nodes, ctrl=ctrl).cycle()


def check_file(et: EtFile, rank: int | None = None) -> list[Finding]:
    """Graph and attribute checks of one file: ids, deps, cycles, enums, comm attributes."""
    out: list[Finding] = []
    path = et.path

    def add(code: str, message: str, index: int | None = None, node_id: int | None = None) -> None:
        out.append(Finding(INVALID, code, message, path, rank, index, node_id))

    first_index: dict[int, int] = {}
    for index, n in enumerate(et.nodes):
        if n.id in first_index:
            add("duplicate-id", f"node id {n.id} already used by node #{first_index[n.id]}", index, n.id)
        else:
            first_index[n.id] = index
    for index, n in enumerate(et.nodes):
        for d in n.data_deps:
            if d not in first_index:
                add("dangling-dep", f"data dependency on missing node {d}", index, n.id)
        missing_ctrl = [d for d in n.ctrl_deps if d not in first_index]
        if missing_ctrl:
            msg = f"ctrl dependency on missing node {missing_ctrl[0]} (ignored by data-only replay)"
            out.append(Finding(WARNING, "dangling-ctrl-dep", msg, path, rank, index, n.id))
        if n.type not in pb.NODE_TYPE_NAMES:
            add("unknown-node-type", f"unknown node type {n.type}", index, n.id)
        out.extend(_check_attrs(n, index, path, rank))
    cycle = find_cycle(et.nodes, ctrl=False)
    if cycle is not None:
        shown = " -> ".join(map(str, cycle[:20])) + (" ..." if len(cycle) > 20 else "")
        add("cycle", f"dependency cycle: {shown} -> {cycle[0]}", first_index[cycle[0]], cycle[0])
    else:
        cycle = find_cycle(et.nodes, ctrl=True)
        if cycle is not None:
            shown = " -> ".join(map(str, cycle[:20])) + (" ..." if len(cycle) > 20 else "")
            msg = f"cycle through ctrl_deps: {shown} -> {cycle[0]} (data deps alone are acyclic)"
            out.append(Finding(WARNING, "ctrl-cycle", msg, path, rank, first_index[cycle[0]], cycle[0]))
    return out


def _check_attrs(n: pb.Node, index: int, path: str, rank: int | None) -> list[Finding]:
    out: list[Finding] = []

    def add(code: str, message: str) -> None:
        out.append(Finding(INVALID, code, message, path, rank, index, n.id))

    problem = node_problem(n)  # the rule info and replay apply too (traces.attrcheck)
    if problem is not None:
        add("attr-type", problem)
        return out
    if n.type == pb.COMM_COLL_NODE and A.is_cpu_op(n) and A.get_int(n, A.COMM_SIZE, None) is None:
        msg = "CPU-side collective (is_cpu_op) without comm_size: replayed by its duration as a CPU op"
        out.append(Finding(WARNING, "cpu-collective", msg, path, rank, index, n.id))
    elif n.type == pb.COMM_COLL_NODE:
        ct = A.get_int(n, A.COMM_TYPE, None)
        if ct is None:
            add("coll-no-type", "collective without comm_type (a strict reader would take ALL_REDUCE)")
        elif ct not in pb.COMM_TYPE_NAMES:
            add("unknown-comm-type", f"unknown comm_type {ct}")
        size = A.get_int(n, A.COMM_SIZE, None)
        if size is None:
            add("coll-no-size", "collective without comm_size")
        elif size < 0:
            add("negative-size", f"negative comm_size {size}")
    elif n.type in _P2P:
        peer = A.COMM_DST if n.type == pb.COMM_SEND_NODE else A.COMM_SRC
        if A.get_int(n, peer, None) is None:
            add("p2p-no-peer", f"{pb.node_type_name(n.type)} without {peer}")
        if A.get_int(n, A.COMM_TAG, None) is None:
            add("p2p-no-tag", f"{pb.node_type_name(n.type)} without comm_tag")
        if A.get_int(n, A.COMM_SIZE, None) is None:
            add("p2p-no-size", f"{pb.node_type_name(n.type)} without comm_size")
    return out


def issue_order(nodes: Sequence[pb.Node]) -> list[int]:
    """Indices of nodes in the order a one-at-a-time replayer issues them: topological, smallest id first."""
    return DepGraph(nodes).topological_order()


P2PKey = tuple[int, int, int, int]  # (src, dst, tag, size)


@dataclass(frozen=True)
class _At:
    """A node's place in the set, for a finding about it."""

    path: str
    rank: int
    index: int
    node_id: int

    def mismatch(self, code: str, message: str) -> Finding:
        """A MISMATCH finding located at this node."""
        return Finding(MISMATCH, code, message, self.path, self.rank, self.index, self.node_id)


@dataclass
class _Tally:
    """What the cross-rank checks gather over every rank's nodes in issue order: P2P keys counted per side
    (with the first node of each) and each group's collective sequence per rank; findings in node order."""

    n_ranks: int
    groups: ProcessGroups
    out: list[Finding] = field(default_factory=list)
    sends: Counter[P2PKey] = field(default_factory=Counter)
    recvs: Counter[P2PKey] = field(default_factory=Counter)
    where: dict[tuple[str, P2PKey], tuple[int, int, int]] = field(default_factory=dict)
    # Keyed by the resolved member list: "1" and "1.0" name the same communicator.
    seqs: dict[str, dict[int, list[tuple[int, int, int, int]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )

    def p2p(self, n: pb.Node, at: _At) -> None:
        """A send or receive: its own rank and its peer's range checked, its key counted."""
        send = n.type == pb.COMM_SEND_NODE
        try:
            src = A.get_int(n, A.COMM_SRC, at.rank if send else None)
            dst = A.get_int(n, A.COMM_DST, None if send else at.rank)
            tag = A.get_int(n, A.COMM_TAG, None)
            size = A.get_int(n, A.COMM_SIZE, None)
        except AttributeTypeError:
            return  # reported by check_file
        if None in (src, dst, tag, size):
            return
        if (src if send else dst) != at.rank:
            role = "sender comm_src" if send else "receiver comm_dst"
            self.out.append(at.mismatch("p2p-wrong-rank", f"{role} is {src if send else dst}, not this rank"))
            return
        for r in (src, dst):
            if not 0 <= r < self.n_ranks:
                self.out.append(at.mismatch("p2p-peer-range", f"peer rank {r} outside 0..{self.n_ranks - 1}"))
        key = (src, dst, tag, size)
        (self.sends if send else self.recvs)[key] += 1
        self.where.setdefault(("send" if send else "recv", key), (at.rank, at.index, at.node_id))

    def collective(self, n: pb.Node, at: _At) -> None:
        """A collective: its group known and holding this rank, appended to the group's sequence."""
        try:
            ct = A.get_int(n, A.COMM_TYPE, None)
            size = A.get_int(n, A.COMM_SIZE, None)
            pg = A.pg_name(n)
        except AttributeTypeError:
            return
        if ct is None or size is None:
            return
        members = self.groups.members(pg)
        if members is None:
            self.out.append(at.mismatch("unknown-group", f"pg_name {pg!r} is not a known process group"))
            return
        if at.rank not in members:
            msg = f"rank issues a collective on group {pg!r} it is not a member of"
            self.out.append(at.mismatch("not-a-member", msg))
            return
        self.seqs[",".join(map(str, members))][at.rank].append((ct, size, at.index, at.node_id))


def check_set(files: Sequence[EtFile], groups: ProcessGroups) -> list[Finding]:
    """Cross-rank checks: P2P pairs (src, dst, tag, size) and per-group collective sequences."""
    tally = _Tally(len(files), groups)
    for rank, et in enumerate(files):
        for index in issue_order(et.nodes):
            n = et.nodes[index]
            if n.type == pb.COMM_SEND_NODE or n.type == pb.COMM_RECV_NODE:
                tally.p2p(n, _At(et.path, rank, index, n.id))
            elif n.type == pb.COMM_COLL_NODE and not (
                A.is_cpu_op(n) and A.get_int(n, A.COMM_SIZE, None) is None
            ):
                tally.collective(n, _At(et.path, rank, index, n.id))
    return tally.out + _unmatched_p2p(tally, files) + _sequence_mismatches(tally.seqs, files)


def _unmatched_p2p(tally: _Tally, files: Sequence[EtFile]) -> list[Finding]:
    """Sends without as many matching receives, then receives without as many sends."""
    out: list[Finding] = []
    for kind, mine, other, code in (
        ("send", tally.sends, tally.recvs, "unmatched-send"),
        ("recv", tally.recvs, tally.sends, "unmatched-recv"),
    ):
        for key, count in sorted(mine.items()):
            missing = count - other.get(key, 0)
            if missing > 0:
                rank, index, node_id = tally.where[(kind, key)]
                src, dst, tag, size = key
                peer = "receive" if kind == "send" else "send"
                msg = (
                    f"{missing} {kind}(s) src={src} dst={dst} tag={tag} size={size} without a matching {peer}"
                )
                out.append(Finding(MISMATCH, code, msg, files[rank].path, rank, index, node_id))
    return out


def _sequence_mismatches(
    seqs: dict[str, dict[int, list[tuple[int, int, int, int]]]], files: Sequence[EtFile]
) -> list[Finding]:
    """Each group's members against its least rank: the count of collectives, then the first that differs."""
    out: list[Finding] = []
    n_ranks = len(files)
    for pg in sorted(seqs):
        members = tuple(int(r) for r in pg.split(","))
        per_rank = seqs[pg]
        ref_rank = min(per_rank)
        ref = per_rank[ref_rank]
        for r in members:
            seq = per_rank.get(r, [])
            path = files[r].path if 0 <= r < n_ranks else None
            if len(seq) != len(ref):
                msg = f"group [{pg}]: {len(seq)} collectives here, {len(ref)} on rank {ref_rank}"
                out.append(Finding(MISMATCH, "coll-count", msg, path, r))
            for k, (a, b) in enumerate(zip(seq, ref, strict=False)):
                if (a[0], a[1]) != (b[0], b[1]):
                    msg = (
                        f"group [{pg}] collective #{k}: {pb.comm_type_name(a[0])} {a[1]} B here, "
                        f"{pb.comm_type_name(b[0])} {b[1]} B on rank {ref_rank} (id {b[3]})"
                    )
                    out.append(Finding(MISMATCH, "coll-mismatch", msg, path, r, a[2], a[3]))
                    break
    return out


def check_all(files: Sequence[EtFile], groups: ProcessGroups) -> list[Finding]:
    """Every per-file check, then the cross-rank checks when every file is valid on its own."""
    out: list[Finding] = []
    for rank, et in enumerate(files):
        out.extend(check_file(et, rank if len(files) > 1 else None))
    if not has_invalid(out):
        out.extend(check_set(files, groups))
    return out


def has_invalid(findings: Iterable[Finding]) -> bool:
    """True when some finding makes a file unusable as a trace."""
    return any(f.kind == INVALID for f in findings)
