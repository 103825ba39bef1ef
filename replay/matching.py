"""Cross-rank matching of communication nodes: collectives by (group, issue count), P2P by (src, dst, tag).

A rank's k-th collective on a process group joins that group's k-th instance; the instance is complete
when every simulated member has issued it (chakra-et.md: the same group key and order on every member).
A send and a recv pair first-in first-out on (src, dst, tag), in issue order.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass

from replay.errors import ReplayError
from replay.program import Program
from traces import pb


@dataclass
class CollectiveRecord:
    """One collective instance as it ran."""

    id: int
    group: str
    comm_type: int
    members: tuple[int, ...]
    nodes: tuple[int, ...]  # global node index per member, in member order
    size: int
    first_arrival_ns: int
    last_arrival_ns: int
    end_ns: int = -1
    positions: tuple[int, ...] | None = None  # folded replay: each node's index in `members`


class CollectiveInstance:
    """One instance of a group's collective while its members arrive."""

    __slots__ = ("key", "index", "members", "sim", "nsim", "arrivals", "first", "record")

    def __init__(self, key: str, index: int, members: tuple[int, ...], sim: tuple[int, ...]) -> None:
        self.key = key
        self.index = index  # k: the group's k-th collective
        self.members = members
        self.sim = sim  # the members this run simulates (all of them unless folded)
        self.nsim = len(sim)
        self.arrivals: dict[int, tuple[int, int]] = {}  # rank -> (g, issue time)
        self.first = -1
        self.record: CollectiveRecord | None = None

    def issue_times(self) -> tuple[int, ...]:
        """Each member's issue time, in member order (all members must have arrived)."""
        arr = self.arrivals
        return tuple([arr[r][1] for r in self.members])

    def missing(self) -> list[int]:
        """Simulated members that have not issued this instance."""
        return [r for r in self.sim if r not in self.arrivals]


class CollectiveMatcher:
    """Groups collective nodes into instances and checks that the members agree on type and size."""

    def __init__(self, prog: Program) -> None:
        self.prog = prog
        self.coll = prog.coll
        self._rank_of = prog.rank_of
        # Program.rank_of by one bisect on the ranks' first indices after rank 0 (an unfolded program).
        offs = getattr(prog, "rank_offset", None)
        self._offs = offs[1 : prog.num_ranks] if type(offs) is list and not prog.rank_ids else None
        self.simulated = frozenset(prog.rank_ids) if prog.rank_ids else None
        self.instances: dict[str, list[CollectiveInstance]] = {}
        self.records: list[CollectiveRecord] = []
        self.collective_of: dict[int, int] = {}  # g -> collective id
        # group key -> (its instances, collectives issued so far per rank): one dict look-up per arrival.
        self._groups: dict[str, tuple[list[CollectiveInstance], dict[int, int]]] = {}
        self._sim_of: dict[
            str, tuple[tuple[int, ...], tuple[int, ...]]
        ] = {}  # key -> (sim members, positions)

    def arrive(self, g: int, t: int) -> CollectiveInstance | None:
        """Node g issues at t; returns its instance once the last simulated member has issued it."""
        info = self.coll[g]
        key = info.group
        offs = self._offs
        rank = bisect_right(offs, g) if offs is not None else self._rank_of(g)
        grp = self._groups.get(key)
        if grp is None:
            grp = self._groups[key] = (self.instances.setdefault(key, []), {})
        lst, issued = grp
        k = issued.get(rank, 0)
        issued[rank] = k + 1
        if k == len(lst):
            members = info.members
            sim = members if self.simulated is None else self._simulated_members(key, members)
            lst.append(CollectiveInstance(key, k, members, sim))
        inst = lst[k]
        arrivals = inst.arrivals
        if not arrivals:
            inst.first = t
        arrivals[rank] = (g, t)
        if len(arrivals) < inst.nsim:
            return None
        inst.record = self._record(inst, t)
        return inst

    def _simulated_members(self, key: str, members: tuple[int, ...]) -> tuple[int, ...]:
        if key not in self._sim_of:
            pos = tuple(i for i, r in enumerate(members) if r in self.simulated)
            self._sim_of[key] = (tuple(members[i] for i in pos), pos)
        return self._sim_of[key][0]

    def _record(self, inst: CollectiveInstance, t: int) -> CollectiveRecord:
        """Check the members agree (type; size unless all-to-all, which takes the largest) and record it."""
        coll, describe = self.coll, self.prog.describe
        key, k = inst.key, inst.index
        arrivals = inst.arrivals
        nodes = tuple([arrivals[r][0] for r in inst.sim])
        g0 = nodes[0]
        c0 = coll[g0]
        size = c0.size
        for gm in nodes[1:]:
            cm = coll[gm]
            if cm is c0:
                continue
            if cm.comm_type != c0.comm_type:
                raise ReplayError(
                    f"collective #{k} of group {key or '(all ranks)'!r}: {describe(g0)} is "
                    f"{pb.comm_type_name(c0.comm_type)} but {describe(gm)} is {pb.comm_type_name(cm.comm_type)}"
                )
            if cm.size != c0.size:
                if c0.comm_type != pb.ALL_TO_ALL:
                    raise ReplayError(
                        f"collective #{k} of group {key or '(all ranks)'!r}: {describe(g0)} has "
                        f"comm_size {c0.size} but {describe(gm)} has {cm.size}"
                    )
                size = max(size, cm.size)
        rec = CollectiveRecord(
            id=len(self.records),
            group=key,
            comm_type=c0.comm_type,
            members=inst.members,
            nodes=nodes,
            size=size,
            first_arrival_ns=inst.first,
            last_arrival_ns=t,
            positions=None if self.simulated is None else self._sim_of[key][1],
        )
        self.records.append(rec)
        self.collective_of.update(dict.fromkeys(nodes, rec.id))
        return rec

    def waiting(self) -> dict[int, CollectiveInstance]:
        """g -> the instance it joined, for every collective node that has issued."""
        return {
            g: inst
            for insts in self.instances.values()
            for inst in insts
            for g, _ta in inst.arrivals.values()
        }


class P2PMatcher:
    """Pairs sends with recvs first-in first-out on (src, dst, tag); the two must agree on the size."""

    def __init__(self, prog: Program) -> None:
        self.prog = prog
        self.p2p = prog.p2p
        self.pend_send: dict[tuple[int, int, int], deque[int]] = {}
        self.pend_recv: dict[tuple[int, int, int], deque[int]] = {}
        self.pair_of: dict[int, int] = {}  # send g -> recv g once both issued
        self.pairs: list[tuple[int, int]] = []  # (send g, recv g) in match order

    def send(self, g: int) -> int:
        """Send g issues: the recv it pairs with now, or -1 (it waits for one)."""
        info = self.p2p[g]
        key = (info.src, info.dst, info.tag)
        q = self.pend_recv.get(key)
        if q:
            r = q.popleft()
            self._pair(g, r)
            return r
        self.pend_send.setdefault(key, deque()).append(g)
        return -1

    def recv(self, g: int) -> int:
        """Recv g issues: the send it pairs with now, or -1 (it waits for one)."""
        info = self.p2p[g]
        key = (info.src, info.dst, info.tag)
        q = self.pend_send.get(key)
        if q:
            s = q.popleft()
            self._pair(s, g)
            return s
        self.pend_recv.setdefault(key, deque()).append(g)
        return -1

    def _pair(self, s: int, r: int) -> None:
        si, ri = self.p2p[s], self.p2p[r]
        if si.size != ri.size:
            raise ReplayError(
                f"P2P size mismatch on (src {si.src}, dst {si.dst}, tag {si.tag}): send {self.prog.describe(s)} "
                f"has comm_size {si.size} but recv {self.prog.describe(r)} has {ri.size}"
            )
        self.pair_of[s] = r
        self.pairs.append((s, r))

    def check_all_received(self) -> None:
        """Raise ReplayError naming the first sends that no recv ever matched."""
        leftovers = sorted(g for dq in self.pend_send.values() for g in dq)
        if leftovers:
            p2p, describe = self.p2p, self.prog.describe
            shown = "; ".join(f"{describe(g)} to rank {p2p[g].dst} tag {p2p[g].tag}" for g in leftovers[:5])
            raise ReplayError(f"{len(leftovers)} send(s) never received: {shown}")

    def waiting_recvs(self) -> set[int]:
        """Recvs issued that no send has matched."""
        return {g for dq in self.pend_recv.values() for g in dq}
