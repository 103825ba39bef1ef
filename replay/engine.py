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
from collections.abc import Callable
from dataclasses import dataclass
from heapq import heapify, heappop, heappush

import numpy as np

from netmodels.api import NetworkModel
from replay.config import ReplayConfig
from replay.deadlock import explain_deadlock
from replay.errors import ReplayError
from replay.matching import CollectiveInstance, CollectiveMatcher, CollectiveRecord, P2PMatcher
from replay.network_port import FoldNetCheck, NetworkPort
from replay.program import K_COLL, K_SEND, K_ZERO, Program

__all__ = ["CollectiveRecord", "EngineOutput", "Engine", "FoldNetCheck", "canonical_order", "run_engine"]


@dataclass
class EngineOutput:
    """Raw per-node timings and matchings of one run."""

    start: list[int]
    end: list[int]
    ready: list[int]
    wait: list[int]
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
        fold_check: FoldNetCheck | None = None,
    ) -> None:
        self.prog = prog
        n = self.n = prog.num_nodes
        # The loop reads plain lists (a numpy scalar read costs several list reads).
        self.kind = _as_list(prog.kind)
        # Issue-time durations: -1 marks the nodes the network times (collectives, sends), so the common
        # case, a timed node, costs one comparison in issue_ready.
        self.dur = _issue_durations(prog)
        self.cptr = _as_list(prog.child_ptr)
        self.cidx = _as_list(prog.child_idx)
        # Most nodes have exactly one child (a chain per queue): the loop reads it without slicing the CSR.
        self.child1 = _single_child(prog.child_ptr, prog.child_idx, n)
        self.cap = list(prog.queue_cap)
        # Queue per node; FAST for a timed node (duration > 0) on a chain queue, issued the moment it is ready.
        self.queue = _fast_queues(prog, self.dur, len(self.cap))
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
        self.shift = max(n.bit_length(), 1)
        self.mask = (1 << self.shift) - 1
        self.heap: list[int] = []  # node finishes as (t << shift) | g
        self.now = 0
        self.done = 0
        self.progress = progress
        self.colls = CollectiveMatcher(prog)
        self.p2ps = P2PMatcher(prog)
        self.port = NetworkPort(
            prog, network, config.comm_mode == "measured", self.heap, self.shift, fold_check
        )

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
        remaining, ready, queue, kind = self.remaining, self.ready, self.queue, self.kind
        qheap, dirty, heap, start, dur, shift = (
            self.qheap,
            self.dirty,
            self.heap,
            self.start,
            self.dur,
            self.shift,
        )
        roots = np.flatnonzero(np.asarray(remaining) == 0).tolist()  # ascending g
        zero = False
        for g in roots:
            ready[g] = 0
            q = queue[g]
            if q == FAST:
                start[g] = 0
                heap.append((dur[g] << shift) | g)
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
                elif kind[g] == K_SEND:
                    busy[q] = b
                    self.send_issued(g, t)
                else:
                    heappush(heap, ((t + d) << shift) | g)
            busy[q] = b
        dirty.clear()

    def next_instant(self) -> int | None:
        """Phase 2: move now to the earliest node finish or network event; None when nothing is left."""
        tn = self.port.next_event()
        heap = self.heap
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
        end, queue, busy, dirty = self.end, self.queue, self.busy, self.dirty
        kind, cptr, cidx, remaining, ready = self.kind, self.cptr, self.cidx, self.remaining, self.ready
        qheap, start, pair_of, child1, dur = self.qheap, self.start, self.p2ps.pair_of, self.child1, self.dur
        bound = (t + 1) << shift
        done = 0
        while heap and heap[0] < bound:
            g = heappop(heap) & mask
            end[g] = t
            done += 1
            q = queue[g]
            if q >= 0:
                busy[q] -= 1
                dirty[q] = None
                if kind[g] == K_SEND:
                    r = pair_of.get(g)
                    if r is not None:
                        heappush(heap, (t << shift) | r)  # the data reaches a recv that is already waiting
            c = child1[g]
            if c >= 0:
                # The one child (the common case; the loop below does the same for each of several).
                rem = remaining[c] - 1
                remaining[c] = rem
                if rem == 0:
                    ready[c] = t
                    qc = queue[c]
                    if qc == FAST:
                        start[c] = t
                        heappush(heap, ((t + dur[c]) << shift) | c)
                    elif qc >= 0:
                        heappush(qheap[qc], c)
                        dirty[qc] = None
                    elif kind[c] == K_ZERO:
                        start[c] = t
                        heappush(heap, (t << shift) | c)
                    else:
                        self.recv_issued(c, t)
            elif c == _MANY:
                for c in cidx[cptr[g] : cptr[g + 1]]:
                    rem = remaining[c] - 1
                    remaining[c] = rem
                    if rem == 0:
                        ready[c] = t
                        qc = queue[c]
                        if qc == FAST:
                            start[c] = t
                            heappush(heap, ((t + dur[c]) << shift) | c)
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
            for gm, ta in inst.arrivals.values():
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
        if self.done < n:
            raise explain_deadlock(
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
        self.p2ps.check_all_received()
        if self.progress is not None:
            self.progress(n, n)
        records, end = self.colls.records, self.end
        for rec in records:
            rec.end_ns = max(map(end.__getitem__, rec.nodes))
        if self.colls.simulated is None:
            canonical_order(records, self.colls.collective_of, self.p2ps.pairs, self.start)
        return EngineOutput(
            start=self.start,
            end=end,
            ready=self.ready,
            wait=self.wait,
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
    fold_check: FoldNetCheck | None = None,
) -> EngineOutput:
    """Run the program to completion; raises ReplayDeadlock when nodes remain that can never run.

    A folded program (prog.rank_ids set) simulates only representative ranks: a collective completes when
    its simulated members have issued it (the folded ones issue at the same instants, by symmetry), the
    network still gets every member, and `fold_check` proves each distinct transfer symmetric first.
    """
    return Engine(prog, network, config, progress, fold_check).run()


def _issue_durations(prog: Program) -> list[int]:
    """prog.dur as a list, with -1 on collective and send nodes (their time comes from the network)."""
    kind, dur = prog.kind, prog.dur
    if isinstance(kind, np.ndarray) and isinstance(dur, np.ndarray):
        return np.where((kind == K_COLL) | (kind == K_SEND), -1, dur).tolist()
    return [-1 if k == K_COLL or k == K_SEND else d for k, d in zip(kind, dur, strict=True)]


# Engine queue of a node issued the moment it is ready: a timed node (duration > 0: it cannot finish in the
# instant it starts) on a chain queue, where each node depends directly on the one before it. There at most
# one node is ready or running at a time, so the node would find its slot free and start in this instant's
# issue phase anyway, and starting a timed node has no other effect (unlike a collective or a send, whose
# order across queues the issue phase fixes): only its finish event, the same one, enters the heap earlier.
FAST = -2


def _fast_queues(prog: Program, dur: list[int], nq: int) -> list[int]:
    """prog.queue as a list, FAST on the timed nodes (duration > 0) of the queues that are chains."""
    queue = np.asarray(prog.queue, dtype=np.int64)
    n = len(queue)
    if n == 0 or nq == 0:
        return queue.tolist()
    ptr = np.asarray(prog.child_ptr, dtype=np.int64)
    idx = np.asarray(prog.child_idx, dtype=np.int64)
    order = np.argsort(queue, kind="stable")  # by queue, ascending g within one
    qs = queue[order]
    pair = (qs[:-1] == qs[1:]) & (qs[:-1] >= 0)  # consecutive nodes of one queue
    linked = _reaches(ptr, idx, order[:-1][pair], order[1:][pair])
    chain = np.ones(nq, dtype=bool)
    chain[qs[:-1][pair][~linked]] = False
    try:
        timed = np.asarray(dur, dtype=np.int64) > 0
    except OverflowError:  # a duration past int64 (refused after the run, _check_int64): compare as ints
        timed = np.array(dur, dtype=object) > 0
    fast = (queue >= 0) & chain[np.maximum(queue, 0)] & timed
    return np.where(fast, FAST, queue).tolist()


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


def _single_child(child_ptr, child_idx, n: int) -> list[int]:
    """Per node: its only child, _NONE (no children) or _MANY (several: read the CSR)."""
    ptr = np.asarray(child_ptr, dtype=np.int64)
    idx = np.asarray(child_idx, dtype=np.int64)
    count = ptr[1 : n + 1] - ptr[:n]
    first = idx[np.minimum(ptr[:n], max(len(idx) - 1, 0))] if len(idx) else np.zeros(n, dtype=np.int64)
    return np.where(count == 1, first, np.where(count == 0, _NONE, _MANY)).tolist()


def _as_list(a) -> list:
    """A fresh list of Python ints from a list or a numpy array."""
    return a.tolist() if hasattr(a, "tolist") else list(a)


def canonical_order(
    records: list[CollectiveRecord],
    collective_of: dict[int, int],
    pairs: list[tuple[int, int]],
    start: list[int],
) -> None:
    """Number collectives by (last arrival, first member's node) and P2P pairs by (match time, send node).

    The loop appends them in time order already; only ties at one instant depend on the order events were
    processed, which a folded replay cannot reproduce, so both replays number them by this rule instead.
    """
    records.sort(key=lambda r: (r.last_arrival_ns, r.nodes[0]))
    for i, rec in enumerate(records):
        rec.id = i
        collective_of.update(dict.fromkeys(rec.nodes, i))
    pairs.sort(key=lambda p: (max(start[p[0]], start[p[1]]), p[0]))
