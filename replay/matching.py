"""Cross-rank matching of communication nodes: collectives by (group, issue count), P2P by (src, dst, tag).

A rank's k-th collective on a process group joins that group's k-th instance; the instance is complete
when every simulated member has issued it (chakra-et.md: the same group key and order on every member).
A send and a recv pair first-in first-out on (src, dst, tag), in issue order.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
from xsim.replay.errors import ReplayError
from xsim.replay.program import CollInfo, Program
from xsim.traces import pb


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

    __slots__ = (
        "key",
        "index",
        "members",
        "sim",
        "nsim",
        "nodes",
        "times",
        "count",
        "sig",
        "mixed",
        "first",
        "record",
    )

    def __init__(self, key: str, index: int, members: tuple[int, ...], sim: tuple[int, ...]) -> None:
        self.key = key
        self.index = index  # k: the group's k-th collective
        self.members = members
        self.sim = sim  # the members this run simulates (all of them unless folded)
        self.nsim = len(sim)
        self.nodes = [-1] * self.nsim  # per simulated member (in `sim` order): its node, -1 until it issues
        self.times = [-1] * self.nsim  # and its issue time
        self.count = 0  # members issued so far
        self.sig = -1  # the first arrival's (comm type, size) code
        self.mixed = False  # some member's (comm type, size) differs from the first's: check them all
        self.first = -1
        self.record: CollectiveRecord | None = None

    def issue_times(self) -> tuple[int, ...]:
        """Each member's issue time, in member order (every member simulated and arrived)."""
        return tuple(self.times)

    def missing(self) -> list[int]:
        """Simulated members that have not issued this instance."""
        return [r for r, g in zip(self.sim, self.nodes, strict=True) if g < 0]


class CollectiveMatcher:
    """Groups collective nodes into instances and checks that the members agree on type and size.

    Every collective node is looked up once, at construction, into its lane: the (group, rank) pair whose
    issue count picks the instance, with the rank's position among the simulated members. An arrival is
    then a few list reads; members are compared by a small code of (comm type, size), and only an
    instance where the codes differ goes through the full check (the one that names the nodes).
    """

    def __init__(self, prog: Program) -> None:
        self.prog = prog
        self.coll = prog.coll
        self.simulated = frozenset(prog.rank_ids) if prog.rank_ids else None
        self.instances: dict[str, list[CollectiveInstance]] = {}
        self.records: list[CollectiveRecord] = []
        self.collective_of: dict[int, int] = {}  # g -> collective id
        self._sim_of: dict[
            str, tuple[tuple[int, ...], tuple[int, ...]]
        ] = {}  # key -> (sim members, positions)
        # g -> (its lane, its (comm type, size) code); a lane is what _new_lane makes.
        self._at: dict[int, tuple[list, int]] = {}
        if self.coll:
            self._index()

    def _index(self) -> None:
        prog, coll = self.prog, self.coll
        gs = np.fromiter(coll, np.int64, len(coll))
        infos = list(coll.values())
        offs = getattr(prog, "rank_offset", None)
        if isinstance(offs, list) and len(offs) == prog.num_ranks + 1:
            ranks = np.searchsorted(np.asarray(offs[1 : prog.num_ranks]), gs, side="right")
            if prog.rank_ids:
                ranks = np.asarray(prog.rank_ids, dtype=np.int64)[ranks]
        else:
            ranks = np.asarray([prog.rank_of(g) for g in gs.tolist()], dtype=np.int64)
        # Nodes with equal matching data share one CollInfo: its distinct objects, then (key, rank) lanes.
        first, code = _distinct(np.fromiter(map(id, infos), np.int64, len(infos)))
        uniq = [infos[i] for i in first.tolist()]
        keys: dict[str, int] = {}
        sig_of: dict[tuple[int, int], int] = {}
        key_code = np.asarray([keys.setdefault(i.group, len(keys)) for i in uniq], dtype=np.int64)
        sig = np.asarray([sig_of.setdefault((i.comm_type, i.size), len(sig_of)) for i in uniq], np.int64)
        lane_first, lane = _distinct(key_code[code] * (int(ranks.max()) + 1) + ranks)
        lanes = [self._new_lane(infos[j], int(ranks[j])) for j in lane_first.tolist()]
        lane_of = map(lanes.__getitem__, lane.tolist())
        self._at = dict(zip(gs.tolist(), zip(lane_of, sig[code].tolist(), strict=True), strict=True))

    def _new_lane(self, info: CollInfo, rank: int) -> list:
        """A (group, rank) lane: [issue count, the group's instances, the rank's position in sim, group key,
        members, sim members], shared by the rank's nodes on the group (mutable: the count moves)."""
        key, members = info.group, info.members
        sim = members if self.simulated is None else self._simulated_members(key, members)
        # Instances keyed by group key alone, as before; members come from the node that opens one.
        return [0, self.instances.setdefault(key, []), sim.index(rank), key, members, sim]

    def arrive(self, g: int, t: int) -> CollectiveInstance | None:
        """Node g issues at t; returns its instance once the last simulated member has issued it."""
        lane, sig = self._at[g]
        k = lane[0]  # the lane's issue count: g joins the group's k-th instance
        lane[0] = k + 1
        lst = lane[1]
        if k == len(lst):  # the first member to issue it opens it
            inst = CollectiveInstance(lane[3], k, lane[4], lane[5])
            inst.first = t
            inst.sig = sig
            lst.append(inst)
        else:
            inst = lst[k]
            if sig != inst.sig:
                inst.mixed = True
        pos = lane[2]
        inst.nodes[pos] = g
        inst.times[pos] = t
        inst.count = n = inst.count + 1
        if n < inst.nsim:
            return None
        inst.record = self._record(inst, t)
        return inst

    def joined(self, g: int) -> tuple[CollectiveInstance, int]:
        """The instance node g joined at its arrival and g's position in its simulated members."""
        lane = self._at[g][0]
        return lane[1][lane[0] - 1], lane[2]

    def _simulated_members(self, key: str, members: tuple[int, ...]) -> tuple[int, ...]:
        if key not in self._sim_of:
            pos = tuple(i for i, r in enumerate(members) if r in self.simulated)
            self._sim_of[key] = (tuple(members[i] for i in pos), pos)
        return self._sim_of[key][0]

    def _record(self, inst: CollectiveInstance, t: int) -> CollectiveRecord:
        """Check the members agree (type; size unless all-to-all, which takes the largest) and record it."""
        coll, describe = self.coll, self.prog.describe
        key, k = inst.key, inst.index
        nodes = tuple(inst.nodes)
        g0 = nodes[0]
        c0 = coll[g0]
        size = c0.size
        for gm in nodes[1:] if inst.mixed else ():  # equal codes: every member has c0's type and size
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
        return {g: inst for insts in self.instances.values() for inst in insts for g in inst.nodes if g >= 0}


def _distinct(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index of each distinct value's first occurrence, in order of first occurrence; each element's
    distinct value as its position in that order)."""
    order = np.argsort(a, kind="stable")
    s = a[order]
    new = np.r_[True, s[1:] != s[:-1]] if len(s) else np.zeros(0, dtype=bool)
    grp = np.cumsum(new) - 1  # sorted position -> distinct value (in sorted-value order)
    firsts = order[new]  # first occurrence of each distinct value (stable sort)
    rank = np.empty(len(firsts), dtype=np.int64)
    by_first = np.argsort(firsts, kind="stable")
    rank[by_first] = np.arange(len(firsts))
    inv = np.empty(len(a), dtype=np.int64)
    inv[order] = rank[grp]
    return firsts[by_first], inv


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
