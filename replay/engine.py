"""The discrete-event loop: integer ns, one heap of node-finish events, per-rank resource queues.

Every event is "node g finishes at t", stored as the single int (t << SHIFT) | g so the heap compares
ints (no tuples); ties at one t resolve by ascending g = (rank, node id). Each instant runs four phases,
as a SimPy-style loop would: issue ready nodes (every queue with a freed slot or a new ready node issues
its ready nodes in ascending node id while slots remain), pick the next instant, advance the network model
to it, then complete every node finishing at that instant and release its children. All finishes at one
t are applied before any rank issues. Collectives and P2P are matched across ranks in replay/matching.py
and handed to the network model (contract E) by replay/network_port.py; they come back as ordinary
finish events.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from heapq import heapify, heappop, heappush
from itertools import chain

import numpy as np
from xsim.netmodels.api import NetworkModel
from xsim.replay.config import ReplayConfig
from xsim.replay.errors import ReplayError
from xsim.replay.matching import CollectiveInstance, CollectiveMatcher, CollectiveRecord, P2PMatcher
from xsim.replay.network_port import NetworkPort
from xsim.replay.program import K_COLL, K_SEND, K_ZERO, Program

__all__ = ["CollectiveRecord", "EngineOutput", "Engine", "canonical_order", "run_engine"]


@dataclass
class EngineOutput:
    """Raw per-node timings and matchings of one run."""

    # Per node, in ns: int64 arrays, or lists of ints (a run whose loop visited every node, or with a
    # time past int64, which the replay then refuses).
    start: Sequence[int]
    end: Sequence[int]
    ready: Sequence[int]
    wait: np.ndarray | list[int]  # int64; a list when a wait is past int64 (a corrupt trace, refused)
    collectives: list[CollectiveRecord]
    collective_of: dict[int, int]  # g -> collective id
    p2p_pairs: list[tuple[int, int]]  # (send g, recv g) in match order
    events: int
    wall_s: float
    cpu_s: float = 0.0  # process CPU time of the loop (steadier than wall time on a shared machine)


class Engine:
    """One replay of a program: the run's state and the phases of its loop."""

    def __init__(
        self,
        prog: Program,
        network: NetworkModel | None,
        config: ReplayConfig,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.prog = prog
        n = self.n = prog.num_nodes
        # The loop reads plain lists (a numpy scalar read costs several list reads).
        self.kind = _as_list(prog.kind)
        # Issue-time durations: -1 marks the nodes the network times (collectives, sends), so the common
        # case, a timed node, costs one comparison in issue_ready. Kept as an array for the set-up below.
        dur_a = _issue_durations(prog)
        self.dur = _shared_ints(dur_a) if isinstance(dur_a, np.ndarray) else dur_a
        # Most nodes have exactly one child (a chain per queue): the loop reads it without slicing the CSR;
        # the few with several read their children from `many`.
        child1 = _single_child(prog.child_ptr, prog.child_idx, n)
        self.many = _many_children(prog.child_ptr, prog.child_idx, child1)
        self.cap = list(prog.queue_cap)
        # Queue per node; FAST for a timed node (duration > 0) on a chain queue, issued the moment it is ready.
        queue = _fast_queues(prog, dur_a, len(self.cap), child1)
        self.shift = max(n.bit_length(), 1)
        # Runs of FAST nodes that follow each other alone finish as one event (see Runs).
        self.runs = Runs(queue == FAST, child1, prog.ndeps, dur_a, self.shift)
        # What the loop reads of a node when it finishes or becomes ready, in one tuple (one list read
        # instead of four; measured ~20% of complete() on the 512-rank set): its queue, its only child
        # (or _NONE / _MANY), for a FAST node the nodes of its run before it (else whether it is a send,
        # whose data a waiting recv gets when it finishes), its run key (see Runs). Only for the nodes the
        # loop visits: a node inside a run (neither its first nor its last) is never released nor
        # finished by the loop, and holds None (~45% of the 512-rank set's nodes).
        extra = np.where(queue == FAST, self.runs.before, np.asarray(prog.kind) == K_SEND)
        visit = np.flatnonzero(~self.runs.inside)
        fields = [queue[visit].tolist(), child1[visit].tolist(), extra[visit].tolist(), self.runs.keys(visit)]
        node = np.full(n, None, dtype=object)
        node[visit] = np.fromiter(zip(*fields, strict=True), dtype=object, count=len(visit))
        self.node = node.tolist()
        self.remaining = _as_list(prog.ndeps)  # unfinished parents per node
        nq = len(self.cap)
        self.busy = [0] * nq  # slots in use per queue
        self.qheap: list[list[int]] = [[] for _ in range(nq)]  # ready nodes per queue, a heap of g
        # Queues that gained a ready node or freed a slot since the last issue, in the order they first did
        # (a dict as an insertion-ordered set: adding a queue already there keeps its place).
        self.dirty: dict[int, None] = {}
        self.start = [-1] * n
        self.end = [-1] * n
        self.ready = [-1] * n
        self.wait = [0] * n
        self.mask = (1 << self.shift) - 1
        self.heap: list[int] = []  # node finishes as (t << shift) | g
        self.now = 0
        self.done = 0
        self.progress = progress
        self.colls = CollectiveMatcher(prog)
        self.p2ps = P2PMatcher(prog)
        self.port = NetworkPort(prog, network, config.comm_mode == "measured", self.heap, self.shift)

    def run(self) -> EngineOutput:
        """Run the program to completion; raises ReplayDeadlock when nodes remain that can never run."""
        t_wall = time.perf_counter()
        t_cpu = time.process_time()
        n, port, progress = self.n, self.port, self.progress
        step = max(1, n // 200)
        next_report = step
        # Zero-time nodes ready at t = 0 (METADATA, ...) finish, and release their children, before anything
        # issues at t = 0: all finishes at one ns are applied before any rank issues, so ready nodes go in
        # ascending id (chakra-et.md 3.2). Later instants get this from the order of the phases.
        hold = self.release_roots()
        while True:
            if self.dirty and not hold:
                self.issue_ready()
            hold = False
            t = self.next_instant()
            if t is None:
                break
            if port.due(t):
                port.advance(t)
            self.complete(t)
            if progress is not None and self.done >= next_report:
                progress(self.done, n)
                next_report = self.done + step
        return self.output(time.perf_counter() - t_wall, time.process_time() - t_cpu)

    def release_roots(self) -> bool:
        """Nodes without dependencies are ready at t = 0; True when zero-time ones finish at t = 0."""
        remaining, ready, node, kind = self.remaining, self.ready, self.node, self.kind
        qheap, dirty, heap, start = self.qheap, self.dirty, self.heap, self.start
        roots = np.flatnonzero(np.asarray(remaining) == 0).tolist()  # ascending g
        zero = False
        for g in roots:
            ready[g] = 0
            q, _c, _x, key = node[g]
            if q == FAST:
                start[g] = 0
                heap.append(key)  # its run's last node finishes at the run's length
            elif q >= 0:
                qheap[q].append(g)  # ascending g: already a heap
                dirty[q] = None
            elif kind[g] == K_ZERO:
                start[g] = 0
                heap.append(g)  # time 0
                zero = True
            else:
                self.recv_issued(g, 0)
        heapify(heap)
        return zero

    def issue_ready(self) -> None:
        """Phase 1: every dirty queue starts its smallest ready node ids while it has free slots."""
        t = self.now
        qheap, busy, cap, dirty = self.qheap, self.busy, self.cap, self.dirty
        start, kind, dur, heap, shift = self.start, self.kind, self.dur, self.heap, self.shift
        arrive = self.colls.arrive
        early = self.port.starts_members
        for q in dirty:
            h = qheap[q]
            if not h:
                continue  # a freed slot and nothing ready
            b = busy[q]
            c_ = cap[q]
            while h and b < c_:
                g = heappop(h)
                b += 1
                start[g] = t
                d = dur[g]
                if d >= 0:
                    heappush(heap, ((t + d) << shift) | g)
                elif kind[g] == K_COLL:
                    busy[q] = b
                    inst = arrive(g, t)
                    if inst is not None:
                        self.collective_started(inst, t)
                    elif early:  # ASTRA-sim's aware mode: this member starts its part now (no barrier)
                        self.port.member_issued(*self.colls.joined(g), t)
                elif kind[g] == K_SEND:
                    busy[q] = b
                    self.send_issued(g, t)
                else:
                    heappush(heap, ((t + d) << shift) | g)
            busy[q] = b
        dirty.clear()

    def next_instant(self) -> int | None:
        """Phase 2: move now to the earliest node finish or network event; None when nothing is left."""
        heap = self.heap
        tn = self.port.next_event(heap[0] >> self.shift if heap else None)
        if heap:
            te = heap[0] >> self.shift
            if tn is not None and tn <= te:
                te = tn
        elif tn is not None:
            te = tn
        else:
            return None
        if te < self.now:
            raise ReplayError(
                f"network model {self.port.network.name!r} reported an event at {te} ns, before now ({self.now} ns)"
            )
        self.now = te
        return te

    def complete(self, t: int) -> None:
        """Phase 4: finish every node due at t, free its slot, deliver a send's data, release its children."""
        heap, mask, shift = self.heap, self.mask, self.shift
        end, busy, dirty, node = self.end, self.busy, self.dirty, self.node
        kind, many, remaining, ready = self.kind, self.many, self.remaining, self.ready
        qheap, start, pair_of = self.qheap, self.start, self.p2ps.pair_of
        bound = (t + 1) << shift
        done = 0
        while heap and heap[0] < bound:
            g = heappop(heap) & mask
            end[g] = t
            done += 1
            q, c, x, _key = node[g]
            if q >= 0:
                busy[q] -= 1
                dirty[q] = None
                if x:  # a send
                    r = pair_of.get(g)
                    if r is not None:
                        heappush(heap, (t << shift) | r)  # the data reaches a recv that is already waiting
            elif q == FAST:
                done += x  # the nodes of its run before it finished too
            if c >= 0:
                # The one child (the common case; the loop below does the same for each of several).
                rem = remaining[c] - 1
                remaining[c] = rem
                if rem == 0:
                    ready[c] = t
                    qc, _c, _x, key = node[c]
                    if qc == FAST:
                        start[c] = t
                        heappush(heap, (t << shift) + key)  # (t + run length) << shift | its last
                    elif qc >= 0:
                        heappush(qheap[qc], c)
                        dirty[qc] = None
                    elif kind[c] == K_ZERO:
                        start[c] = t
                        heappush(heap, (t << shift) | c)
                    else:
                        self.recv_issued(c, t)
            elif c == _MANY:
                for c in many[g]:
                    rem = remaining[c] - 1
                    remaining[c] = rem
                    if rem == 0:
                        ready[c] = t
                        qc, _c, _x, key = node[c]
                        if qc == FAST:
                            start[c] = t
                            heappush(heap, (t << shift) + key)
                        elif qc >= 0:
                            heappush(qheap[qc], c)
                            dirty[qc] = None
                        elif kind[c] == K_ZERO:
                            start[c] = t
                            heappush(heap, (t << shift) | c)
                        else:
                            self.recv_issued(c, t)
        self.done += done

    def collective_started(self, inst: CollectiveInstance, t: int) -> None:
        """The last member of a collective instance issued it at t: the members' waits, and it starts."""
        if inst.first != t:  # else every member issued at t and waited 0 (wait's initial value)
            wait = self.wait
            for gm, ta in zip(inst.nodes, inst.times, strict=True):
                wait[gm] = t - ta
        self.port.start_collective(inst, t)

    def send_issued(self, g: int, t: int) -> None:
        """Send g issues at t: it pairs with a waiting recv, if any, and its transfer starts."""
        r = self.p2ps.send(g)
        if r >= 0:
            self.wait[r] = max(0, t - self.start[r])
        self.port.start_send(g, t)

    def recv_issued(self, g: int, t: int) -> None:
        """Recv g (which takes no slot) issues at t; it finishes once its send's data has arrived."""
        self.start[g] = t
        s = self.p2ps.recv(g)
        if s >= 0:
            self.wait[g] = max(0, self.start[s] - t)
            if self.end[s] >= 0:  # the data already arrived
                heappush(self.heap, (t << self.shift) | g)

    def output(self, wall_s: float, cpu_s: float) -> EngineOutput:
        """Check that everything ran and number the matchings; the run's EngineOutput."""
        n, prog = self.n, self.prog
        arrays = self.runs.fill(self.start, self.end, self.ready)
        if self.done < n:
            from xsim.replay.deadlock import StoppedRun, explain_deadlock  # a stuck run only (start-up)

            if arrays is not None:
                self.start, self.end, self.ready = (a.tolist() for a in arrays)
            self.runs.fill_remaining(self.start, self.remaining)
            raise explain_deadlock(
                StoppedRun(
                    prog,
                    self.now,
                    n - self.done,
                    self.start,
                    self.end,
                    self.ready,
                    self.remaining,
                    self.colls,
                    self.p2ps,
                    self.port.in_flight(),
                )
            )
        self.p2ps.check_all_received()
        if self.progress is not None:
            self.progress(n, n)
        # The times as the int64 arrays the fill made (no list round trip), else the loop's lists.
        start, end, ready = arrays if arrays is not None else (self.start, self.end, self.ready)
        # The loop writes waits into a list (a list store is ~4x cheaper than an array item's); the result
        # keeps them as int64 (8 bytes a node, no int objects), a list only past int64 (refused later).
        wait = _int64_or_list(self.wait)
        records = self.colls.records
        if arrays is not None and records:  # each record's last member's end, in one reduction
            nodes = np.fromiter(chain.from_iterable(r.nodes for r in records), np.int64)
            sizes = np.fromiter(map(len, (r.nodes for r in records)), np.int64, len(records))
            ends = np.maximum.reduceat(end[nodes], np.cumsum(sizes) - sizes).tolist()
            for rec, e in zip(records, ends, strict=True):
                rec.end_ns = e
        else:
            for rec in records:
                rec.end_ns = max(map(end.__getitem__, rec.nodes))
        if self.colls.simulated is None:
            pairs = canonical_order(records, self.p2ps.pairs, start, self.colls.collective_of)[1]
            self.p2ps.pairs[:] = pairs  # the list EngineOutput holds
        return EngineOutput(
            start=start,
            end=end,
            ready=ready,
            wait=wait,
            collectives=records,
            collective_of=self.colls.collective_of,
            p2p_pairs=self.p2ps.pairs,
            events=self.done,
            wall_s=wall_s,
            cpu_s=cpu_s,
        )


def run_engine(
    prog: Program,
    network: NetworkModel | None,
    config: ReplayConfig,
    progress: Callable[[int, int], None] | None = None,
) -> EngineOutput:
    """Run the program to completion; raises ReplayDeadlock when nodes remain that can never run.

    A folded program (prog.rank_ids set) simulates only representative ranks: a collective completes when
    its simulated members have issued it (the folded ones issue at the same instants, by symmetry), the
    network still gets every member (a folded run's model is wrapped by replay.fold.fold_checked, which
    proves each distinct transfer symmetric first).
    """
    return Engine(prog, network, config, progress).run()


def _issue_durations(prog: Program) -> np.ndarray | list[int]:
    """prog.dur with -1 on collective and send nodes (their time comes from the network); an int64 array,
    or a list when some duration is past int64 (refused after the run, _check_int64)."""
    kind, dur = prog.kind, prog.dur
    try:
        d = np.asarray(dur, dtype=np.int64)
    except OverflowError:
        return [-1 if k == K_COLL or k == K_SEND else d for k, d in zip(kind, dur, strict=True)]
    k = np.asarray(kind)
    return np.where((k == K_COLL) | (k == K_SEND), -1, d)


# Engine queue of a node issued the moment it is ready: a timed node (duration > 0: it cannot finish in the
# instant it starts) on a chain queue, where each node depends directly on the one before it. There at most
# one node is ready or running at a time, so the node would find its slot free and start in this instant's
# issue phase anyway, and starting a timed node has no other effect (unlike a collective or a send, whose
# order across queues the issue phase fixes): only its finish event, the same one, enters the heap earlier.
FAST = -2


def _fast_queues(
    prog: Program, dur: np.ndarray | list[int], nq: int, child1: np.ndarray | None = None
) -> np.ndarray:
    """prog.queue, FAST on the timed nodes (duration > 0) of the queues that are chains (child1: the
    nodes' _single_child, when the caller has it)."""
    queue = np.asarray(prog.queue, dtype=np.int64)
    n = len(queue)
    if n == 0 or nq == 0:
        return queue
    ptr = np.asarray(prog.child_ptr, dtype=np.int64)
    idx = np.asarray(prog.child_idx, dtype=np.int64)
    order = np.argsort(queue, kind="stable")  # by queue, ascending g within one
    qs = queue[order]
    pair = (qs[:-1] == qs[1:]) & (qs[:-1] >= 0)  # consecutive nodes of one queue
    a, b = order[:-1][pair], order[1:][pair]
    # Most pairs are a node and its only child (a compute chain): only the others need the search.
    linked = (_single_child(ptr, idx, n) if child1 is None else child1)[a] == b
    rest = np.flatnonzero(~linked)
    linked[rest] = _reaches(ptr, idx, a[rest], b[rest])
    chain = np.ones(nq, dtype=bool)
    chain[qs[:-1][pair][~linked]] = False
    try:
        timed = np.asarray(dur, dtype=np.int64) > 0
    except OverflowError:  # a duration past int64 (refused after the run, _check_int64): compare as ints
        timed = np.array(dur, dtype=object) > 0
    fast = (queue >= 0) & chain[np.maximum(queue, 0)] & timed
    return np.where(fast, FAST, queue)


# How far _reaches looks: a queue's consecutive nodes are usually linked directly or through one
# collective or send of another queue (compute -> TP all-reduce -> compute); a queue whose links it does not
# find in time is simply not a chain (slower, same result).
_REACH_DEPTH = 4
_REACH_FRONTIER = 8  # frontier entries per pair at most


def _reaches(ptr: np.ndarray, idx: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per pair i: True when b[i] is a descendant of a[i] within _REACH_DEPTH edges (False: not found)."""
    ok = np.zeros(len(a), dtype=bool)
    pid = np.arange(len(a), dtype=np.int64)
    node = a.astype(np.int64)
    for _ in range(_REACH_DEPTH):
        cnt = ptr[node + 1] - ptr[node]
        pid = np.repeat(pid, cnt)
        first = np.repeat(ptr[node] - (np.cumsum(cnt) - cnt), cnt)  # child k of a frontier node: first + k
        node = idx[first + np.arange(len(pid), dtype=np.int64)]
        ok[pid[node == b[pid]]] = True
        keep = ~ok[pid]
        pid, node = pid[keep], node[keep]
        if not len(pid) or len(pid) > _REACH_FRONTIER * len(a):
            break
    return ok


_NONE, _MANY = -1, -2  # child1 entries of a node without children and of one with several


def _single_child(child_ptr, child_idx, n: int) -> np.ndarray:
    """Per node: its only child, _NONE (no children) or _MANY (several: read the CSR)."""
    ptr = np.asarray(child_ptr, dtype=np.int64)
    idx = np.asarray(child_idx, dtype=np.int64)
    count = ptr[1 : n + 1] - ptr[:n]
    first = idx[np.minimum(ptr[:n], max(len(idx) - 1, 0))] if len(idx) else np.zeros(n, dtype=np.int64)
    return np.where(count == 1, first, np.where(count == 0, _NONE, _MANY))


def _many_children(child_ptr, child_idx, child1: np.ndarray) -> dict[int, list[int]]:
    """The children of each node with several (child1 == _MANY), in CSR order."""
    g = np.flatnonzero(child1 == _MANY)
    if not len(g):
        return {}
    ptr = np.asarray(child_ptr, dtype=np.int64)
    lo, hi = ptr[g], ptr[g + 1]
    counts = hi - lo
    # All their children in one gather: child k of node i sits at lo[i] + k.
    at = np.repeat(lo - np.concatenate(([0], np.cumsum(counts)[:-1])), counts) + np.arange(int(counts.sum()))
    kids = np.asarray(child_idx, dtype=np.int64)[at].tolist()
    ends = np.cumsum(counts).tolist()
    out = {}
    begin = 0
    for node, end in zip(g.tolist(), ends, strict=True):
        out[node] = kids[begin:end]
        begin = end
    return out


class Runs:
    """Runs of FAST nodes that follow each other alone: each node's only child is the next one, whose only
    parent it is. Such a child becomes ready exactly when its parent finishes and starts at once (FAST), and
    nothing else happens at those instants (no slot, no queue, no side effect), so the engine schedules a
    run as one event: its last node finishing at (run start + the run's durations). Every other node's
    start, end and ready time is its run's start plus the durations before it, filled in after the loop.
    """

    def __init__(
        self, fast: np.ndarray, child1: np.ndarray, ndeps, dur: np.ndarray | list[int], shift: int
    ) -> None:
        n = len(fast)
        nd = np.asarray(ndeps, dtype=np.int64)
        try:
            d = np.asarray(dur, dtype=np.int64)
        except OverflowError:  # a duration past int64 (refused after the run): every run one node long
            d = None
        link = fast & (child1 >= 0)
        nxt = np.where(link, child1, 0)
        link &= fast[nxt] & (nd[nxt] == 1)
        wide = d is None  # durations as Python ints only
        if wide or (n and int(np.abs(d).max()) >= (1 << 62) // n):
            link[:] = False  # sums of durations could overflow int64: no run longer than one node
            d = np.zeros(n, dtype=np.int64) if wide else d
        prv = np.full(n, -1, dtype=np.int64)
        prv[nxt[link]] = np.flatnonzero(link)
        has = prv >= 0
        # Pointer jumping towards each run's first node: p = an earlier node of the run, w = the durations
        # from p up to the node (p included), k = nodes from p up to the node; log2(longest run) passes.
        p = np.where(has, prv, np.arange(n, dtype=np.int64))
        w = np.where(has, d[np.maximum(prv, 0)], 0)
        k = has.astype(np.int64)
        while n:
            pp = p[p]
            if (pp == p).all():
                break
            w, k, p = w + w[p], k + k[p], pp
        last = np.flatnonzero(fast & ~link)  # every run's last node (a run of one node included)
        first = p[last]
        span = w[last] + d[last]
        # key[first node] = (run length << shift) | last node: the run's event is (start << shift) + key.
        self.key: np.ndarray | dict[int, int]  # per run's first node (0 elsewhere); see keys()
        if not wide and (not len(span) or int(span.max()) < 1 << (62 - shift)):
            key_a = np.zeros(n, dtype=np.int64)
            key_a[first] = (span << shift) | last
            self.key = key_a
        else:  # the same keys on Python ints
            spans = [dur[g] for g in last.tolist()] if wide else span.tolist()
            self.key = {
                f: (s << shift) | g for f, s, g in zip(first.tolist(), spans, last.tolist(), strict=True)
            }
        before = np.zeros(n, dtype=np.int64)
        before[last] = k[last]
        self.before = before  # per run's last node: the nodes of its run before it
        inner = np.flatnonzero(has)  # nodes after their run's first
        self.inner, self.inner_first, self.inner_off = inner, p[inner], w[inner]
        early = np.flatnonzero(link)  # nodes before their run's last: each ends when the next starts
        self.early, self.early_first, self.early_end = early, p[early], w[early] + d[early]
        self.inside = has & link  # neither first nor last of their run: the loop never sees them

    def keys(self, g: np.ndarray) -> list[int]:
        """The run keys of nodes g (0 for a node that does not start a run), as Python ints."""
        if isinstance(self.key, np.ndarray):
            return self.key[g].tolist()
        key = self.key
        return [key.get(x, 0) for x in g.tolist()]

    def fill(self, start: list[int], end: list[int], ready: list[int]) -> tuple | None:
        """start, end and ready of the nodes the loop did not visit, from their runs' starts: as new int64
        arrays, or None when there is nothing to fill or a time is past int64 (then the lists are filled
        in place)."""
        if not len(self.inner):
            return None
        try:
            st = np.array(start, dtype=np.int64)
            en = np.array(end, dtype=np.int64)
            rd = np.array(ready, dtype=np.int64)
        except OverflowError:  # times past int64 (refused after the run): the same sums on Python ints
            self._fill_ints(start, end, ready)
            return None
        # A run that started has finished (the loop drains every event), and its last node's end, the
        # largest of its times, fits in int64 here: none of these sums overflows.
        s = st[self.inner_first]
        ok = s >= 0
        vals = s[ok] + self.inner_off[ok]
        st[self.inner[ok]] = vals
        rd[self.inner[ok]] = vals
        s = st[self.early_first]
        ok = s >= 0
        en[self.early[ok]] = s[ok] + self.early_end[ok]
        return st, en, rd

    def _fill_ints(self, start: list[int], end: list[int], ready: list[int]):
        inner = zip(self.inner.tolist(), self.inner_first.tolist(), self.inner_off.tolist(), strict=True)
        for g, f, o in inner:
            if start[f] >= 0:
                start[g] = ready[g] = start[f] + o
        early = zip(self.early.tolist(), self.early_first.tolist(), self.early_end.tolist(), strict=True)
        for g, f, e in early:
            if start[f] >= 0:
                end[g] = start[f] + e
        return start, end, ready

    def fill_remaining(self, start: list[int], remaining: list[int]) -> None:
        """Unfinished parents of the nodes after a run's first: none once the run started."""
        for g, f in zip(self.inner.tolist(), self.inner_first.tolist(), strict=True):
            if start[f] >= 0:
                remaining[g] = 0


def _shared_ints(a: np.ndarray) -> list[int]:
    """a.tolist() with one int object per distinct value: tolist makes one per element (~32 bytes a node
    besides the slot), while a trace repeats a few durations many times."""
    if not len(a):
        return []
    s = np.sort(a)
    u = s[np.r_[True, s[1:] != s[:-1]]]
    return np.asarray(u.tolist(), dtype=object)[np.searchsorted(u, a)].tolist()


def _int64_or_list(values: list[int]) -> np.ndarray | list[int]:
    """values as an int64 array, or the list itself when one is past int64."""
    try:
        return np.asarray(values, dtype=np.int64)
    except OverflowError:
        return values


def _as_list(a) -> list:
    """A fresh list of Python ints from a list or a numpy array."""
    return a.tolist() if hasattr(a, "tolist") else list(a)


def canonical_ids(time: np.ndarray, node: np.ndarray) -> np.ndarray:
    """The canonical number of each entry: its place in the order by (time, node), both int64 arrays.

    The one numbering of collectives (last arrival, first member's node) and P2P pairs (match time, send
    node), for the engine's records (`canonical_order`) and a folded run's copies (replay/fold_tables.py).
    """
    order = np.lexsort((node, time))
    ids = np.empty(len(order), dtype=np.int64)
    ids[order] = np.arange(len(order), dtype=np.int64)
    return ids


def canonical_order(
    records: list[CollectiveRecord],
    pairs: Sequence[tuple[int, int]] | np.ndarray,
    start: Sequence[int] | np.ndarray,
    collective_of: dict[int, int] | None = None,
) -> tuple[dict[int, int], list[tuple[int, int]]]:
    """Number collectives by (last arrival, first member's node) and P2P pairs by (match time, send node):
    the one numbering of a replay, unfolded (the engine) or expanded from a folded run (replay/fold.py).

    The loop appends them in time order already; only ties at one instant depend on the order events were
    processed, which a folded replay cannot reproduce, so both replays number them by this rule instead.
    Both keys are unique (a node is in one record or one pair). Sorts `records` in place and numbers them;
    returns (node -> collective: `collective_of` updated, or a new dict, the pairs in order).
    """
    try:
        ids = canonical_ids(
            np.fromiter((r.last_arrival_ns for r in records), np.int64, len(records)),
            np.fromiter((r.nodes[0] for r in records), np.int64, len(records)),
        )
        records[:] = [records[j] for j in np.argsort(ids).tolist()]
    except OverflowError:  # times past int64 (a corrupt trace; refused after the run): the same order
        records.sort(key=lambda r: (r.last_arrival_ns, r.nodes[0]))
    if collective_of is None:
        collective_of = {}
    for i, rec in enumerate(records):
        if rec.id != i or rec.nodes[0] not in collective_of:  # most keep the id they were recorded with
            rec.id = i
            collective_of.update(dict.fromkeys(rec.nodes, i))
    if not len(pairs):
        return collective_of, []
    p = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    st = np.asarray(start, dtype=np.int64)
    p = p[np.argsort(canonical_ids(np.maximum(st[p[:, 0]], st[p[:, 1]]), p[:, 0]))]
    return collective_of, list(zip(p[:, 0].tolist(), p[:, 1].tolist(), strict=True))
