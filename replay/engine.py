"""The discrete-event loop: integer ns, one heap of node-finish events, per-rank resource queues.

Every event is "node g finishes at t", stored as the single int (t << SHIFT) | g so the heap compares
ints (no tuples); ties at one t resolve by ascending g = (rank, node id). All finishes at one t are
applied before any rank issues, then every queue with a freed slot or a new ready node issues its ready
nodes in ascending node id while slots remain. Collectives and P2P hand their timing to the network model
(contract E) and come back as ordinary finish events.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from heapq import heapify, heappop, heappush
from typing import Protocol

from netmodels.api import CollectiveSpec, NetworkModel
from netmodels.errors import NetworkModelError
from replay.config import ReplayConfig
from replay.errors import ReplayDeadlock, ReplayError, StuckNode
from replay.program import COLLECTIVE_KIND, K_COLL, K_SEND, K_ZERO, Program
from traces import pb


class FoldNetCheck(Protocol):
    """Proves, once per distinct transfer, that the network times it the same on every replica."""

    def collective(self, spec: CollectiveSpec, where: str) -> None: ...

    def p2p(self, src: int, dst: int, size: int, where: str) -> None: ...


_STALL_LIMIT = 10_000  # polls at one instant without a completion before the model is declared stalled


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


class _Inst:
    __slots__ = ("key", "members", "sim", "arrivals", "first", "record")

    def __init__(self, key: str, members: tuple[int, ...], sim: tuple[int, ...]) -> None:
        self.key = key
        self.members = members
        self.sim = sim  # the members this run simulates (all of them unless folded)
        self.arrivals: dict[int, tuple[int, int]] = {}  # rank -> (g, time)
        self.first = -1
        self.record: CollectiveRecord | None = None


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
    t_wall = time.perf_counter()
    t_cpu = time.process_time()
    n = prog.num_nodes
    # The loop reads plain lists (a numpy scalar read costs several list reads).
    kind = _as_list(prog.kind)
    dur = _as_list(prog.dur)
    cptr = _as_list(prog.child_ptr)
    cidx = _as_list(prog.child_idx)
    queue = _as_list(prog.queue)
    cap = prog.queue_cap
    coll_info = prog.coll
    p2p_info = prog.p2p
    recorded = _as_list(prog.recorded_ns)
    measured = config.comm_mode == "measured"
    simulated = frozenset(prog.rank_ids) if prog.rank_ids else None
    sim_of: dict[str, tuple[tuple[int, ...], tuple[int, ...] | None]] = {}  # key -> (sim members, positions)
    remaining = _as_list(prog.ndeps)
    nq = len(cap)
    busy = [0] * nq
    qheap: list[list[int]] = [[] for _ in range(nq)]
    qdirty = [False] * nq
    dirty: list[int] = []
    start = [-1] * n
    end = [-1] * n
    ready = [-1] * n
    wait = [0] * n
    shift = max(n.bit_length(), 1)
    mask = (1 << shift) - 1
    heap: list[int] = []

    # Collective matching: per group key, instances in issue order; per (key, rank) the next index.
    instances: dict[str, list[_Inst]] = {}
    issued: dict[tuple[str, int], int] = {}
    records: list[CollectiveRecord] = []
    collective_of: dict[int, int] = {}
    handles: dict[int, object] = {}  # network handle -> CollectiveRecord | send g
    # P2P matching on (src, dst, tag), FIFO in issue order.
    pend_send: dict[tuple[int, int, int], deque[int]] = {}
    pend_recv: dict[tuple[int, int, int], deque[int]] = {}
    pair_of: dict[int, int] = {}  # send g -> recv g once both issued
    pairs: list[tuple[int, int]] = []
    net_state = [False, None]  # [dirty, next_event_ns]

    def need_network(what: str, g: int) -> NetworkModel:
        if network is None:
            raise ReplayError(f"{prog.describe(g)}: {what} needs a network model (or comm mode 'measured')")
        return network

    def net_error(exc: Exception, g: int) -> ReplayError:
        return ReplayError(f"{prog.describe(g)}: network model: {exc}")

    def coll_arrive(g: int, t: int) -> None:
        info = coll_info[g]
        key = info.group
        rank = prog.rank_of(g)
        ck = (key, rank)
        k = issued.get(ck, 0)
        issued[ck] = k + 1
        lst = instances.setdefault(key, [])
        if k == len(lst):
            if simulated is None:
                lst.append(_Inst(key, info.members, info.members))
            else:
                if key not in sim_of:
                    pos = tuple(i for i, r in enumerate(info.members) if r in simulated)
                    sim_of[key] = (tuple(info.members[i] for i in pos), pos)
                lst.append(_Inst(key, info.members, sim_of[key][0]))
        inst = lst[k]
        if not inst.arrivals:
            inst.first = t
        inst.arrivals[rank] = (g, t)
        if len(inst.arrivals) < len(inst.sim):
            return
        nodes = tuple(inst.arrivals[r][0] for r in inst.sim)
        g0 = nodes[0]
        c0 = coll_info[g0]
        size = c0.size
        for gm in nodes[1:]:
            cm = coll_info[gm]
            if cm.comm_type != c0.comm_type:
                raise ReplayError(
                    f"collective #{k} of group {key or '(all ranks)'!r}: {prog.describe(g0)} is "
                    f"{pb.comm_type_name(c0.comm_type)} but {prog.describe(gm)} is {pb.comm_type_name(cm.comm_type)}"
                )
            if cm.size != c0.size:
                if c0.comm_type != pb.ALL_TO_ALL:
                    raise ReplayError(
                        f"collective #{k} of group {key or '(all ranks)'!r}: {prog.describe(g0)} has "
                        f"comm_size {c0.size} but {prog.describe(gm)} has {cm.size}"
                    )
                size = max(size, cm.size)
        rec = CollectiveRecord(
            id=len(records),
            group=key,
            comm_type=c0.comm_type,
            members=inst.members,
            nodes=nodes,
            size=size,
            first_arrival_ns=inst.first,
            last_arrival_ns=t,
            positions=None if simulated is None else sim_of[key][1],
        )
        records.append(rec)
        inst.record = rec
        for gm, ta in inst.arrivals.values():
            wait[gm] = t - ta
            collective_of[gm] = rec.id
        if measured:
            d = min(recorded[gm] for gm in nodes)
            for gm in nodes:
                heappush(heap, ((t + d) << shift) | gm)
        elif len(inst.members) == 1:
            heappush(heap, (t << shift) | nodes[0])  # a one-rank group moves no data
        else:
            net = need_network("a collective", g0)
            spec = CollectiveSpec(kind=COLLECTIVE_KIND[c0.comm_type], size_bytes=size, ranks=inst.members)
            if fold_check is not None:
                fold_check.collective(spec, prog.describe(g0))
            try:
                # ASTRA-sim mode: each member starts its part when it issues the node (no barrier).
                staggered = getattr(net, "start_collective_issued", None)
                if staggered is not None and len(inst.sim) == len(inst.members):
                    h = staggered(t, spec, tuple(inst.arrivals[r][1] for r in inst.members))
                else:
                    h = net.start_collective(t, spec)
            except NetworkModelError as exc:
                raise net_error(exc, g0) from None
            handles[h] = rec
            net_state[0] = True

    def send_issue(g: int, t: int) -> None:
        info = p2p_info[g]
        key = (info.src, info.dst, info.tag)
        q = pend_recv.get(key)
        if q:
            r = q.popleft()
            _pair(g, r, t)
        else:
            pend_send.setdefault(key, deque()).append(g)
        if info.src == info.dst:
            heappush(heap, (t << shift) | g)
        elif measured:
            heappush(heap, ((t + recorded[g]) << shift) | g)
        else:
            net = need_network("a send", g)
            if fold_check is not None:
                fold_check.p2p(info.src, info.dst, info.size, prog.describe(g))
            try:
                h = net.start_p2p(t, info.src, info.dst, info.size)
            except NetworkModelError as exc:
                raise net_error(exc, g) from None
            handles[h] = g
            net_state[0] = True

    def recv_issue(g: int, t: int) -> None:
        start[g] = t
        info = p2p_info[g]
        key = (info.src, info.dst, info.tag)
        q = pend_send.get(key)
        if q:
            s = q.popleft()
            _pair(s, g, t)
            if end[s] >= 0:  # the data already arrived
                heappush(heap, (t << shift) | g)
        else:
            pend_recv.setdefault(key, deque()).append(g)

    def _pair(s: int, r: int, t: int) -> None:
        si, ri = p2p_info[s], p2p_info[r]
        if si.size != ri.size:
            raise ReplayError(
                f"P2P size mismatch on (src {si.src}, dst {si.dst}, tag {si.tag}): send {prog.describe(s)} "
                f"has comm_size {si.size} but recv {prog.describe(r)} has {ri.size}"
            )
        pair_of[s] = r
        pairs.append((s, r))
        wait[r] = max(0, start[s] - start[r])

    # Nodes without dependencies are ready at t = 0.
    t = 0
    for g in range(n):
        if remaining[g] == 0:
            ready[g] = 0
            q = queue[g]
            if q >= 0:
                qheap[q].append(g)  # ascending g: already a heap
                if not qdirty[q]:
                    qdirty[q] = True
                    dirty.append(q)
            elif kind[g] == K_ZERO:
                start[g] = 0
                heap.append(g)  # time 0
            else:
                recv_issue(g, 0)
    heapify(heap)

    done = 0
    step = max(1, n // 200)
    next_report = step
    stalls = 0
    stall_t = -1
    last_t = 0
    # Zero-time nodes ready at t = 0 (METADATA, ...) finish, and release their children, before anything
    # issues at t = 0: all finishes at one ns are applied before any rank issues, so ready nodes go in
    # ascending id (chakra-et.md 3.2). Later instants get this from the drain loop below.
    hold_issue = bool(heap)
    while True:
        # Issue on every queue that gained a ready node or lost a busy one.
        if dirty and not hold_issue:
            for q in dirty:
                qdirty[q] = False
                h = qheap[q]
                b = busy[q]
                c_ = cap[q]
                while h and b < c_:
                    g = heappop(h)
                    b += 1
                    start[g] = t
                    k = kind[g]
                    if k == K_COLL:
                        busy[q] = b
                        coll_arrive(g, t)
                    elif k == K_SEND:
                        busy[q] = b
                        send_issue(g, t)
                    else:
                        heappush(heap, ((t + dur[g]) << shift) | g)
                busy[q] = b
            dirty.clear()
        hold_issue = False
        if net_state[0]:
            net_state[1] = network.next_event_ns() if network is not None else None
            net_state[0] = False
        tn = net_state[1]
        if heap:
            te = heap[0] >> shift
            if tn is not None and tn <= te:
                te = tn
        elif tn is not None:
            te = tn
        else:
            break
        if te < last_t:
            raise ReplayError(
                f"network model {network.name!r} reported an event at {te} ns, before now ({last_t} ns)"
            )
        t = last_t = te
        if tn is not None and tn <= t:
            try:
                comps = network.advance(t)
            except NetworkModelError as exc:
                raise ReplayError(f"network model at t={t} ns: {exc}") from None
            net_state[0] = True
            # A model may report internal events without completions (flow rate changes); it only hangs
            # when it keeps reporting the same instant without completing anything.
            if comps or t != stall_t:
                stalls, stall_t = 0, t
            else:
                stalls += 1
                if stalls > _STALL_LIMIT:
                    raise ReplayError(f"network model {network.name!r} makes no progress at t={t} ns")
            for c in comps:
                obj = handles.pop(c.handle, None)
                if obj is None:
                    raise ReplayError(f"network model {network.name!r} completed unknown handle {c.handle!r}")
                if isinstance(obj, CollectiveRecord):
                    prf = c.per_rank_finish_ns
                    use = len(prf) == len(obj.members)
                    pos = obj.positions
                    for i, gm in enumerate(obj.nodes):
                        f = (prf[i] if pos is None else prf[pos[i]]) if use else c.finish_ns
                        heappush(heap, ((f if f > t else t) << shift) | gm)
                else:
                    heappush(heap, (t << shift) | obj)
        bound = (t + 1) << shift
        while heap and heap[0] < bound:
            g = heappop(heap) & mask
            end[g] = t
            done += 1
            q = queue[g]
            if q >= 0:
                busy[q] -= 1
                if not qdirty[q]:
                    qdirty[q] = True
                    dirty.append(q)
            if kind[g] == K_SEND:
                r = pair_of.get(g)
                if r is not None:
                    heappush(heap, (t << shift) | r)
            for c in cidx[cptr[g] : cptr[g + 1]]:
                rem = remaining[c] - 1
                remaining[c] = rem
                if rem == 0:
                    ready[c] = t
                    qc = queue[c]
                    if qc >= 0:
                        heappush(qheap[qc], c)
                        if not qdirty[qc]:
                            qdirty[qc] = True
                            dirty.append(qc)
                    elif kind[c] == K_ZERO:
                        start[c] = t
                        heappush(heap, (t << shift) | c)
                    else:
                        recv_issue(c, t)
        if progress is not None and done >= next_report:
            progress(done, n)
            next_report = done + step

    if done < n:
        raise _deadlock(prog, t, n - done, start, end, ready, remaining, instances, pend_recv, handles)
    leftovers = [g for dq in pend_send.values() for g in dq]
    if leftovers:
        leftovers.sort()
        shown = "; ".join(
            f"{prog.describe(g)} to rank {p2p_info[g].dst} tag {p2p_info[g].tag}" for g in leftovers[:5]
        )
        raise ReplayError(f"{len(leftovers)} send(s) never received: {shown}")
    if progress is not None:
        progress(n, n)
    for rec in records:
        rec.end_ns = max(end[g] for g in rec.nodes)
    if simulated is None:
        canonical_order(records, collective_of, pairs, start)
    return EngineOutput(
        start=start,
        end=end,
        ready=ready,
        wait=wait,
        collectives=records,
        collective_of=collective_of,
        p2p_pairs=pairs,
        events=done,
        wall_s=time.perf_counter() - t_wall,
        cpu_s=time.process_time() - t_cpu,
    )


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
        for g in rec.nodes:
            collective_of[g] = i
    pairs.sort(key=lambda p: (max(start[p[0]], start[p[1]]), p[0]))


def _deadlock(prog, t, left, start, end, ready, remaining, instances, pend_recv, handles) -> ReplayDeadlock:
    """Explain, per stuck rank, the first blocked node and what it waits for."""
    waiting_recv = {g for dq in pend_recv.values() for g in dq}
    inst_of: dict[int, tuple[int, _Inst]] = {}
    for insts in instances.values():
        for k, inst in enumerate(insts):
            for g, _ta in inst.arrivals.values():
                inst_of[g] = (k, inst)
    in_network = {
        rec_g for obj in handles.values() for rec_g in (obj.nodes if hasattr(obj, "nodes") else (obj,))
    }
    stuck: list[StuckNode] = []
    for rank in range(prog.num_ranks):
        lo, hi = prog.rank_offset[rank], prog.rank_offset[rank + 1]
        unfinished = [g for g in range(lo, hi) if end[g] < 0]
        if not unfinished:
            continue
        reason = None
        chosen = None
        for g in unfinished:
            if start[g] < 0:
                continue
            if g in inst_of:
                k, inst = inst_of[g]
                missing = [r for r in inst.sim if r not in inst.arrivals]
                info = prog.coll[g]
                reason = (
                    f"collective #{k} of group {inst.key or '(all ranks)'!r} "
                    f"({pb.comm_type_name(info.comm_type)}, {info.size} B): rank(s) {missing} never issued it"
                )
            elif g in waiting_recv:
                info = prog.p2p[g]
                reason = f"a send from rank {info.src} with tag {info.tag} (unmatched recv, {info.size} B)"
            elif g in in_network:
                reason = "the network model to complete its transfer (it never did)"
            else:
                continue
            chosen = g
            break
        if chosen is None:
            for g in unfinished:
                if ready[g] >= 0 and start[g] < 0:
                    q = prog.queue[g]
                    holders = [h for h in unfinished if start[h] >= 0 and prog.queue[h] == q]
                    what = prog.describe(holders[0]) if holders else "nothing"
                    chosen, reason = g, f"a free slot on {prog.queue_label[q]} (held by {what})"
                    break
        if chosen is None:
            parents: dict[int, int] = {}
            for p in unfinished:
                for c in prog.children(p):
                    parents.setdefault(c, p)
            for g in unfinished:
                if remaining[g] > 0 and g in parents:
                    p = parents[g]
                    chosen = g
                    reason = f"dependency on node {int(prog.node_id[p])} {prog.name[p]!r} (unfinished)"
                    break
        if chosen is None:
            chosen, reason = unfinished[0], "an unknown condition"
        stuck.append(StuckNode(prog.rank_of(chosen), int(prog.node_id[chosen]), prog.name[chosen], reason))
    return ReplayDeadlock(t, left, stuck)
