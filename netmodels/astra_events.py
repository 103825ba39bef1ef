"""Event-level replica of ASTRA-sim's system layer and analytical networks (the ASTRA-sim mode's exact core).

Rules read in ASTRA-sim's source (astra-sim master 518bd51, astra-network-analytical 599a047); see
docs/netmodels.md "ASTRA-sim compatibility" for the list and shared/reference/astrasim-analytical.md:

* Streams (system/Sys.cc `generate_collective`, `insert_stream`, `SchedulerUnit`): a collective becomes one
  stream per chunk; each rank runs at most `active-chunks-per-dimension` streams of a queue at once and starts
  the next one the moment one exits *on that rank* (per-rank pipelining). Streams not yet started are kept in
  priority order: LIFO gives the order 0, n-1, n-2, ..., 1 (FIFO 0, 1, 2, ...).
* Memory bus (system/MemBus.cc): every packet bundle waits `endpoint-delay` ns, or a hard-coded 10 ns when the
  algorithm sends with `Transmition::Fast` (Ring, HalvingDoubling and direct on a `RingTopology::Local`, i.e.
  every communicator group smaller than the whole system: CommunicatorGroup.cc `get_collective_plan`).
* Reduction (system/PacketBundle.cc `call`): a bundle that needs processing waits 3 x floor(size / local-mem-bw)
  more, where size is the bundle's size: the algorithm's current message size when the bundle is released.
* Ring, HalvingDoubling and direct (astraccl/.../Ring.cc, HalvingDoubling.cc, AllToAll.cc): one packet state
  machine (packets inserted on start and on every receive, a send per freed bundle, exit when all sends are
  done and every bundle came back); DoubleBinaryTree (DoubleBinaryTreeAllReduce.cc): leaf/intermediate/root
  state machines whose streams alternate between the trees rooted at the highest and the lowest id.
* Message matching (network_frontend/analytical/common): a message completes a receive with the same
  (tag, src, dst, size, sequence number); an early arrival waits for its receive.
* Networks: congestion-unaware: each message takes T_msg at once; congestion-aware (astra-network-analytical
  congestion_aware/Link.cpp, Chunk.cpp): links are FIFO servers, a message holds a link for floor(m / B) and
  reaches the next device floor(latency + m / B) after it started on that link (store-and-forward per hop).

Time is integer ns; same-time events run in the order they were scheduled.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from xsim.netmodels.errors import NetworkModelError

_push = heapq.heappush
_pop = heapq.heappop
_NEVER = 1 << 126  # later than any event time (ns)

# MemBus.cc charges this for Transmition::Fast bundles instead of the configured endpoint-delay.
FAST_BUS_NS = 10

# Sequence numbers of scheduled events step by this much; a rank's tick list (SysEvents) numbers the events
# that join it after its first one with the numbers in between, so one tick holds up to SEQ_STEP - 1 joins
# (one rank's system-layer events of one nanosecond: a few per stream in flight on that rank).
SEQ_STEP = 1 << 24


def _call(cb: Callable) -> None:
    """Run a callback that takes no argument (events carry exactly one)."""
    cb()


class EventLoop:
    """Integer-time event queue; ties run in scheduling order (ASTRA-sim's EventQueue: a FIFO list per time).

    Every event has a time and a sequence number; `cur` is the sequence number of the event running now, so a
    caller can tell whether an event it reserved for this very time (AwareNet's link frees) has run. The
    events of one time are one list of (sequence number, fn, arg) in sequence order, and a heap holds the
    times: an event scheduled with a fresh number goes last in its time's list (no heap operation unless the
    time is new); one scheduled with a number taken earlier (`put`) is inserted at its place. Sequence
    numbers step by SEQ_STEP: the numbers between two steps belong to the events that join a rank's tick list
    (SysEvents), which run right after the list's first event, before anything scheduled later.
    """

    __slots__ = ("now", "cur", "_seq", "_times", "_at", "_it", "ticks")

    def __init__(self) -> None:
        self.now = 0
        self.cur = 0
        self._seq = 0
        self._times: list[int] = []  # heap of the times that have events
        self._at: dict[int, list[tuple[int, Callable, object]]] = {}  # time -> its events in sequence order
        self._it = None  # iterator over the first time's events when a run stopped inside them (run_quiet)
        # SysEvents' tick lists of a time (rank -> its list's last sequence number), dropped with the time's
        # events: a time that has run takes no more registrations (they are for now or later).
        self.ticks: dict[int, dict[int, int]] = {}

    def at(self, t: int, fn: Callable, arg: object = None) -> None:
        """Run fn(arg) at time t (>= now)."""
        self._seq = s = self._seq + SEQ_STEP
        b = self._at.get(t)
        if b is None:
            self._at[t] = [(s, fn, arg)]
            _push(self._times, t)
        else:
            b.append((s, fn, arg))

    def put(self, t: int, seq: int, fn: Callable, arg: object) -> None:
        """Run fn(arg) at time t at the place of sequence number seq (reserved earlier, or a tick list's)."""
        b = self._at.get(t)
        if b is None:
            self._at[t] = [(seq, fn, arg)]
            _push(self._times, t)
            return
        i = len(b)
        while i and b[i - 1][0] > seq:  # never before the event running now: seq > cur at time now
            i -= 1
        b.insert(i, (seq, fn, arg))

    def reserve(self) -> int:
        """A sequence number for an event that may be scheduled later, at the place it takes now."""
        self._seq += SEQ_STEP
        return self._seq

    def starting(self, t: int) -> None:
        """Move to time t with none of t's events run yet (callers inject work at t before the loop runs it)."""
        self.now = t
        self.cur = 0

    def next_time(self) -> int | None:
        """Time of the earliest pending event."""
        times = self._times
        if self._it is not None and not self._it.__length_hint__():
            # A stopped run ended on the last event of its time: that time has nothing left.
            self._it = None
            t = _pop(times)
            del self._at[t]
            self.ticks.pop(t, None)
        return times[0] if times else None

    def run_until(self, until: int | None) -> None:
        """Process every event with time <= until (all when None)."""
        times, at, ticks = self._times, self._at, self.ticks
        limit = _NEVER if until is None else until
        while times and times[0] <= limit:
            t = self.now = times[0]
            it = self._it
            if it is None:
                it = at[t]
            else:
                self._it = None
            for s, fn, arg in it:  # events scheduled for t while it runs join the list and run here
                self.cur = s
                fn(arg)
            _pop(times)
            del at[t]
            ticks.pop(t, None)
        if until is not None and until > self.now:
            self.now = until
        # Every event of this time, reserved ones included, counts as run.
        self.cur = self._seq

    def run_quiet(self, until: int, a: list, b: list) -> int | None:
        """Process the events with time <= until, stopping right after the one that leaves a or b non-empty
        (returns its time; the rest of that time stays for run_until); None when all ran."""
        times, at, ticks = self._times, self._at, self.ticks
        while times and times[0] <= until:
            t = self.now = times[0]
            it = self._it
            if it is None:
                it = iter(at[t])
            else:
                self._it = None
            for s, fn, arg in it:
                self.cur = s
                fn(arg)
                if a or b:
                    self._it = it
                    return t
            _pop(times)
            del at[t]
            ticks.pop(t, None)
        return None


class UnawareNet:
    """Congestion-unaware network: a message arrives T_msg after it is sent."""

    def __init__(self, loop: EventLoop, msg_ns: Callable[[int, int, int], int]) -> None:
        self.loop = loop
        self.msg_ns = msg_ns

    def send(self, src: int, dst: int, size: int, cb: Callable, arg: object = None) -> None:
        """Deliver a message of size bytes from src to dst; cb(arg) on arrival."""
        self.loop.at(self.loop.now + self.msg_ns(src, dst, size), cb, arg)

    def sender(self, src: int, dst: int, size: int) -> Callable[[Callable, object], None]:
        """send(src, dst, size, cb, arg) as f(cb, arg), for a caller that sends one message shape many times."""
        d = self.msg_ns(src, dst, size)
        loop = self.loop

        def send(cb: Callable, arg: object) -> None:
            loop.at(loop.now + d, cb, arg)

        return send


class _Link:
    """A directed link. Its free event (Link::link_become_free) is scheduled only when a message waits for it:
    its sequence number is reserved when the transmission starts, so it runs at the very place among the
    same-time events that an always-scheduled free would take; with nobody waiting it would only clear busy."""

    __slots__ = ("free_t", "free_seq", "queued", "pending")

    def __init__(self) -> None:
        self.free_t = -1  # when the current transmission frees the link (its reserved free event's time)
        self.free_seq = 0  # and that event's sequence number
        self.queued = False  # the free event is in the loop (messages wait in pending)
        self.pending: deque = deque()


class AwareNet:
    """Congestion-aware 1-D network: explicit directed links, FIFO, store-and-forward of whole messages.

    Every link has the dimension's bandwidth and latency, so a message's hold and hop times depend on its
    size alone (kept per size), and a route is kept as its links per (src, dst).
    """

    def __init__(self, loop: EventLoop, kind: str, n: int, bytes_per_ns: float, latency_ns: float) -> None:
        self.loop = loop
        self.kind = kind
        self.n = n
        self.bpns = bytes_per_ns
        self.lat = latency_ns
        self.links: dict[tuple[int, int], _Link] = {}
        self._paths: dict[tuple[int, int], tuple[_Link, ...]] = {}
        self._times: dict[int, tuple[int, int]] = {}  # size -> (link hold, arrival at the next device)

    def route(self, src: int, dst: int) -> list[int]:
        """Devices a message crosses: Ring shortest direction (clockwise on a tie), Switch via device n."""
        if self.kind == "switch":
            return [src, self.n, dst]
        if self.kind == "fc":
            return [src, dst]
        cw = (dst - src) % self.n
        step = -1 if self.n - cw < cw else 1
        path = [src]
        cur = src
        while cur != dst:
            cur = (cur + step) % self.n
            path.append(cur)
        return path

    def _link(self, u: int, v: int) -> _Link:
        link = self.links.get((u, v))
        if link is None:
            link = self.links[(u, v)] = _Link()
        return link

    def _shape(self, src: int, dst: int, size: int) -> tuple[tuple[_Link, ...], int, int]:
        """A message's links, link hold and time to the next device (kept per route and per size)."""
        links = self._paths.get((src, dst))
        if links is None:
            path = self.route(src, dst)
            links = self._paths[(src, dst)] = tuple(
                self._link(u, v) for u, v in zip(path, path[1:], strict=False)
            )
        t = self._times.get(size)
        if t is None:
            t = self._times[size] = (math.floor(size / self.bpns), math.floor(self.lat + size / self.bpns))
        return links, t[0], t[1]

    def send(self, src: int, dst: int, size: int, cb: Callable, arg: object = None) -> None:
        """Inject a message at src; cb(arg) when its last hop delivers it."""
        links, hold, hop = self._shape(src, dst, size)
        # In flight: [links, hop index, link hold, time to the next device, callback, its argument, last index].
        self._enter(links[0], [links, 0, hold, hop, cb, arg, len(links) - 1])

    def sender(self, src: int, dst: int, size: int) -> Callable[[Callable, object], None]:
        """send(src, dst, size, cb, arg) as f(cb, arg), for a caller that sends one message shape many times."""
        return self._make_sender(src, dst, size)

    def wire(self, src: int, dst: int, size: int) -> tuple:
        """What a sender of this message shape reads, for a caller that enters the first link inline:
        (first link, links, link hold, time to the next device, last hop index, the loop, _arrive, _free)."""
        links, hold, hop = self._shape(src, dst, size)
        return (links[0], links, hold, hop, len(links) - 1, self.loop, self._arrive, self._free)

    def _make_sender(self, src: int, dst: int, size: int) -> Callable[[Callable, object], None]:
        links, hold, hop = self._shape(src, dst, size)
        link, last, loop, arrive, free = links[0], len(links) - 1, self.loop, self._arrive, self._free
        at, times = loop._at, loop._times

        def send(cb: Callable, arg: object) -> None:
            # _enter of the first link, inlined (a ring sends every message here).
            now = loop.now
            ft = link.free_t
            if ft > now or (ft == now and link.free_seq > loop.cur):
                link.pending.append([links, 0, hold, hop, cb, arg, last])
                if not link.queued:
                    link.queued = True
                    loop.put(ft, link.free_seq, free, link)
                return
            s = loop._seq + SEQ_STEP  # EventLoop.at, inlined; the link's free takes the next number
            loop._seq = s + SEQ_STEP
            e = (s, arrive, [links, 0, hold, hop, cb, arg, last]) if last else (s, cb, arg)
            t = now + hop
            b = at.get(t)
            if b is None:
                at[t] = [e]
                _push(times, t)
            else:
                b.append(e)
            link.free_t = now + hold
            link.free_seq = s + SEQ_STEP

        return send

    def _enter(self, link: _Link, item: list) -> None:
        """A message reaches a link: sent at once when it is free, else queued behind the others (FIFO).

        The link is busy while its free event has not run: before its time, or at its time before its place.
        """
        loop = self.loop
        now = loop.now
        ft = link.free_t
        if ft > now or (ft == now and link.free_seq > loop.cur):
            # Its free event, put in the loop at its reserved place, will start the next waiting message.
            link.pending.append(item)
            if not link.queued:
                link.queued = True
                loop.put(ft, link.free_seq, self._free, link)
            return
        self._transmit(link, item)

    def _transmit(self, link: _Link, item: list) -> None:
        loop = self.loop
        now = loop.now
        # Link::schedule_chunk_transmission: the arrival at the next device first, then the link's free. The
        # last hop's arrival is the message's callback itself (the event _arrive would run it at that place).
        if item[1] == item[6]:
            loop.at(now + item[3], item[4], item[5])
        else:
            loop.at(now + item[3], self._arrive, item)
        loop._seq += SEQ_STEP
        link.free_t = now + item[2]
        link.free_seq = loop._seq

    def _free(self, link: _Link) -> None:
        # Scheduled only with messages waiting: the first goes now, and the next free is needed if more wait.
        pending = link.pending
        self._transmit(link, pending.popleft())
        if pending:
            self.loop.put(link.free_t, link.free_seq, self._free, link)
        else:
            link.queued = False

    def _arrive(self, item: list) -> None:
        # A hop before the last: the message enters its next link (_enter, inlined: half the hops pass here).
        i = item[1] + 1
        item[1] = i
        link = item[0][i]
        loop = self.loop
        now = loop.now
        ft = link.free_t
        if ft > now or (ft == now and link.free_seq > loop.cur):
            link.pending.append(item)
            if not link.queued:
                link.queued = True
                loop.put(ft, link.free_seq, self._free, link)
            return
        s = loop._seq + SEQ_STEP  # EventLoop.at, inlined; the link's free takes the next number (reserved)
        loop._seq = s + SEQ_STEP
        e = (s, item[4], item[5]) if i == item[6] else (s, self._arrive, item)
        t = now + item[3]
        b = loop._at.get(t)
        if b is None:
            loop._at[t] = [e]
            _push(loop._times, t)
        else:
            b.append(e)
        link.free_t = now + item[2]
        link.free_seq = s + SEQ_STEP


class Matcher:
    """Pairs sends and receives by (tag, src, dst, size, sequence number), as ASTRA-sim's CallbackTracker.

    Messages of one (tag, src, dst, size) take one route at one size, so they arrive in the order they were
    sent (FIFO links, equal times): the k-th arrival is the k-th send, and pairing arrivals and receives in
    order is pairing them by sequence number. Per key: [arrivals not yet received, receives still waiting].
    """

    def __init__(self, loop: EventLoop, net) -> None:
        self.loop = loop
        self.net = net
        self._state: dict[tuple, list] = {}

    def send(self, tag, src: int, dst: int, size: int) -> None:
        """Start a message; it completes the matching receive when it arrives."""
        self.net.send(src, dst, size, self._arrived, (tag, src, dst, size))

    def _arrived(self, key: tuple) -> None:
        st = self._state.get(key)
        if st is None:
            self._state[key] = [1, deque()]
            return
        waiting = st[1]
        if waiting:
            cb = waiting.popleft()
            if not waiting and st[0] == 0:
                del self._state[key]
            cb()
        else:
            st[0] += 1

    def recv(self, tag, src: int, dst: int, size: int, cb: Callable) -> None:
        """Post a receive; cb() when the matching message has arrived (at once, queued, if it already has)."""
        self.recv_key((tag, src, dst, size), cb)

    def recv_key(self, key: tuple, cb: Callable) -> None:
        """recv by its key (tag, src, dst, size), for a caller that keeps it."""
        st = self._state.get(key)
        if st is None:
            self._state[key] = [0, deque((cb,))]
        elif st[0] > 0:
            st[0] -= 1
            if st[0] == 0 and not st[1]:
                del self._state[key]
            self.loop.at(self.loop.now, _call, cb)
        else:
            st[1].append(cb)


def _cell_arrived(cell: list) -> None:
    """A message reaches a ring's receiver (its cell): the receiver's _insert_ring pairs it, or, while the
    receiver has not started (no receive posted), it is counted."""
    f = cell[2]
    if f is None:
        cell[0] += 1
    else:
        f(cell)


class SysEvents:
    """Sys::try_register_event: a rank's events of one tick form one list, run together where the tick's first
    event was registered; events added to a tick whose list is running join it.

    The list is no object: its first event goes into the loop with a fresh sequence number and each event
    that joins it with the next number after the list's last one (EventLoop numbers step by SEQ_STEP), so
    they run one after the other right after the first, as the list would. Per tick only the list's last
    number is kept, in the loop's `ticks` (time -> rank -> number; a time's entries go with its events): the
    list has not run out while the loop's current event is not past it.
    """

    def __init__(self, loop: EventLoop) -> None:
        self.loop = loop

    def at(self, rank: int, delay: int, fn: Callable, arg: object = None) -> None:
        """Run fn(arg) on rank's system layer delay ns from now."""
        loop = self.loop
        t = loop.now + delay
        tick = loop.ticks.get(t)
        if tick is None:
            tick = loop.ticks[t] = {}
        else:
            last = tick.get(rank)
            if last is not None and (
                delay or loop.cur <= last
            ):  # the tick's list is pending or running: join
                self.join(tick, rank, t, last, fn, arg)
                return
        loop._seq = s = loop._seq + SEQ_STEP  # EventLoop.at, inlined
        tick[rank] = s
        b = loop._at.get(t)
        if b is None:
            loop._at[t] = [(s, fn, arg)]
            _push(loop._times, t)
        else:
            b.append((s, fn, arg))

    def join(self, tick: dict, rank: int, t: int, last: int, fn: Callable, arg: object) -> None:
        """fn(arg) joins rank's tick list at time t (tick: that time's lists) whose last event is number last."""
        last += 1
        if not last % SEQ_STEP:
            raise NetworkModelError(f"rank {rank}: over {SEQ_STEP - 1:,} events in 1 ns")
        tick[rank] = last
        self.loop.put(t, last, fn, arg)


@dataclass(frozen=True)
class Ctx:
    """What an algorithm instance needs from its rank: bus delays, reduction cost, messaging."""

    loop: EventLoop
    matcher: Matcher
    sys: SysEvents
    ed: int
    mem_gbps: float

    def red_ns(self, size: int) -> int:
        """PacketBundle processing: three passes of size bytes at local-mem-bw (GB/s of 1e9 bytes)."""
        return 3 * math.floor(size / self.mem_gbps)


class Stream:
    """One chunk of one collective on one rank: a sequence of phases (algorithm factories)."""

    __slots__ = ("run", "rank", "phases", "priority", "started", "alg", "tag")

    def __init__(self, run: CollectiveRun, rank: int, phases: list, priority: int, tag) -> None:
        self.run = run
        self.rank = rank
        self.phases = phases
        self.priority = priority
        self.started = False
        self.alg = None
        self.tag = tag


class _Algo:
    """Shared plumbing: bundles through the memory bus, messages through the matcher."""

    def __init__(self, ctx: Ctx, stream: Stream, members: tuple[int, ...], idx: int, fast: bool) -> None:
        self.ctx = ctx
        self.stream = stream
        self.members = members
        self.idx = idx
        self.p = len(members)
        self.bus = FAST_BUS_NS if fast else ctx.ed
        self.rank = members[idx]
        # Bound methods kept once: the packet machine calls them for every message.
        self._sys_at = ctx.sys.at
        self._msend = ctx.matcher.send
        self._mrecv = ctx.matcher.recv
        self._nsend = ctx.matcher.net.send
        self._marrived = ctx.matcher._arrived
        self._general = self.general
        self._received = self.received
        self._after_bus = self._processed

    def bundle(self, size: int, processed: bool) -> None:
        """A packet bundle: memory-bus delay, then (if processed) the reduction, then a General event."""
        self._sys_at(self.rank, self.bus, self._after_bus if processed else self._general, size)

    def _processed(self, size: int) -> None:
        self._sys_at(self.rank, self.ctx.red_ns(size), self._general)

    def send(self, pos: int, size: int) -> None:
        self._msend(self.stream.tag, self.rank, self.members[pos], size)

    def recv(self, pos: int, size: int) -> None:
        self._mrecv(self.stream.tag, self.members[pos], self.rank, size, self._received)

    def exit(self) -> None:
        self.stream.run.phase_done(self.stream)


class PacketAlgo(_Algo):
    """Ring, HalvingDoubling and direct (AllToAll): ASTRA-sim's packet/bundle state machine. A ring is made as
    a RingAlgo (the same machine with its fixed neighbours and message size kept per instance)."""

    def __new__(cls, ctx, stream, members, idx, fast, kind: str, algo: str, data: int, window: int = -1):
        if algo == "ring":
            return RingAlgo(ctx, stream, members, idx, fast, kind, data)
        return super().__new__(cls)

    def __init__(self, ctx, stream, members, idx, fast, kind: str, algo: str, data: int, window: int = -1):
        super().__init__(ctx, stream, members, idx, fast)
        p = self.p
        self.kind = kind
        self.algo = algo
        self.packets: deque = deque()
        self.free = 0
        self.inserted = 0  # packets inserted: `parallel` at start, then one per received message
        self.zero = 0
        self.nonzero = 0
        self.toggle = False
        self.parallel = 1
        self.all_reduce = kind == "all_reduce"
        self.reduce_scatter = kind == "reduce_scatter"
        # AllToAll.cc's reduce window: direct AllReduce in its second half sends up to `parallel` at once.
        self.window_ar = algo == "direct" and kind == "all_reduce"
        self._received = self.insert  # a received message inserts the next packet (Ring::run)
        if algo == "halving_doubling":
            k = int(math.log2(p))
            self.streams_left = 2 * k if kind == "all_reduce" else k
            self.nonzero_count = k - 1
            if kind == "all_gather":
                self.msg, self.offset, self.mult = data, p // 2, 0.5
            else:
                self.msg, self.offset, self.mult = data // 2, 1, 2.0
            self.recv_pos = self.send_pos = self._hd_partner()
            return
        self.streams_left = {"all_reduce": 2 * (p - 1), "all_to_all": p * (p - 1) // 2}.get(kind, p - 1)
        self.msg = data if kind == "all_gather" else data // p
        self.send_pos = (idx + 1) % p
        self.recv_pos = (idx - 1) % p
        self.nonzero_count = p - 1
        if algo == "direct":
            self.parallel = p - 1 if window == -1 else min(window, p - 1)
            if kind == "all_to_all":
                self.streams_left = p - 1
            # AllToAll.cc get_non_zero_latency_packets: p-1 packets per window on a Local ring, one otherwise.
            self.nonzero_count = (p - 1) * self.parallel if fast else self.parallel

    def _hd_partner(self) -> int:
        off = self.offset
        if off == 0:
            return self.idx
        step = off if (self.idx // off) % 2 == 0 else -off
        return (self.idx + step) % self.p

    def start(self) -> None:
        for _ in range(self.parallel):
            self.insert()

    def insert(self) -> None:
        self.inserted += 1
        if self.zero == 0 and self.nonzero == 0:
            self.zero = self.parallel
            self.nonzero = self.nonzero_count
            self.toggle = not self.toggle
        if self.zero > 0:
            processed = False
            self.zero -= 1
        elif self.nonzero > 0:
            processed = self.reduce_scatter or (self.all_reduce and self.toggle)
            self.nonzero -= 1
        else:
            raise RuntimeError("ASTRA-sim packet machine injected nothing")
        msg = self.msg
        self.packets.append((msg, self.send_pos, self.recv_pos))
        # The bundle carries the current message size (the packet just inserted), then the machine advances.
        self._sys_at(self.rank, self.bus, self._after_bus if processed else self._general, msg)
        self._advance()

    def _advance(self) -> None:
        if self.algo == "halving_doubling":
            self.offset = int(self.offset * self.mult)
            self.msg = int(self.msg / self.mult)
            if self.offset == self.p and self.kind == "all_reduce":
                self.mult = 0.5
                self.offset = int(self.offset * self.mult)
                self.msg = int(self.msg / self.mult)
            self.recv_pos = self.send_pos = self._hd_partner()
        elif self.algo == "direct":
            p, i = self.p, self.idx
            self.send_pos = (self.send_pos + 1) % p
            if self.send_pos == i:
                self.send_pos = (self.send_pos + 1) % p
            self.recv_pos = (self.recv_pos - 1) % p
            if self.recv_pos == i:
                self.recv_pos = (self.recv_pos - 1) % p

    def general(self, _arg: object = None) -> None:
        self.free += 1
        if self.window_ar and self.streams_left <= self.p - 1:
            if self.inserted - self.parallel < self.p - 1:  # messages received so far
                return
            # AllToAll.cc tries parallel_reduce sends; each needs a packet and a free bundle token.
            for _ in range(self.parallel):
                if not self._ready():
                    break
        elif self.packets and self.streams_left:
            # _ready, inlined (every message of a ring passes here); free >= 1 after the increment.
            size, dst, src = self.packets.popleft()
            tag = self.stream.tag
            members = self.members
            rank = self.rank
            to = members[dst]
            self._nsend(rank, to, size, self._marrived, (tag, rank, to, size))  # Matcher.send, inlined
            self._mrecv(tag, members[src], rank, size, self._received)
            self.streams_left -= 1
            self.free -= 1
        if self.streams_left == 0 and self.free == self.parallel:
            self.exit()

    def _ready(self) -> bool:
        if not self.packets or self.streams_left == 0 or self.free == 0:
            return False
        size, dst, src = self.packets.popleft()
        self.send(dst, size)
        self.recv(src, size)
        self.streams_left -= 1
        self.free -= 1
        return True

    def received(self) -> None:
        self.insert()


class RingAlgo(_Algo):
    """Ring (Ring.cc): PacketAlgo's packet machine with what a ring keeps fixed kept per instance.

    Its neighbours and message size never change, so its waiting packets are a count, its reduction time and
    message route are computed once, and in a run of one phase per chunk its messages are matched through
    cells the two neighbours share. Made for every chunk of every member (a few messages each on small
    groups), so it sets only what the ring's steps read (no _Algo.__init__).
    """

    def __init__(
        self, ctx: Ctx, stream: Stream, members: tuple[int, ...], idx: int, fast: bool, kind: str, data: int
    ):
        p = len(members)
        self.stream = stream
        self.rank = members[idx]
        self.bus = FAST_BUS_NS if fast else ctx.ed
        self.free = 0
        self.ring_packets = 0
        self.p = p
        if kind == "all_reduce":
            self.streams_left = 2 * (p - 1)
        elif kind == "all_to_all":
            self.streams_left = p * (p - 1) // 2
        else:
            self.streams_left = p - 1
        self.msg = msg = data if kind == "all_gather" else data // p
        self._red = 3 * math.floor(msg / ctx.mem_gbps)  # Ctx.red_ns
        self._loop = loop = ctx.loop
        self._sysev = ctx.sys
        self._ticks = loop.ticks
        # Bound once: a ring schedules them for every message.
        self._gen = gen = self._general_ring
        proc = self._processed_ring
        # The packet machine's inserts cycle with period p (parallel 1, p - 1 non-zero-latency packets): the
        # first of each cycle refills and flips the toggle and is not processed, the others are processed
        # for reduce_scatter, and for all_reduce while the toggle is on (it starts off, so the first cycle's
        # are). k: the next insert's place in the cycle; _nz: what a non-first insert schedules this cycle.
        self.k = 0
        self._nz = proc if kind == "reduce_scatter" else gen  # toggle off
        self._nz_alt = proc if kind in ("reduce_scatter", "all_reduce") else gen  # toggle on
        self._connect(ctx, stream, members, idx)

    def _connect(self, ctx: Ctx, stream: Stream, members: tuple[int, ...], idx: int) -> None:
        """How the ring's messages go out and are paired: an inline first link and cells (aware, one phase
        per chunk), a sender and cells (unaware), or a sender and the Matcher (several phases per chunk)."""
        p, rank, msg, tag = self.p, self.rank, self.msg, stream.tag
        send_to = members[(idx + 1) % p]
        send_key = (tag, rank, send_to, msg)
        recv_key = (tag, members[(idx - 1) % p], rank, msg)
        cells = stream.run.cells
        net = ctx.matcher.net
        if cells is None or not isinstance(net, AwareNet):
            # Through the Matcher (a sender per shape); with cells on the unaware network.
            self._sender = net.sender(rank, send_to, msg)
            self._wire = None
            if cells is None:
                self._send_cell = None
                self._marrived = ctx.matcher._arrived
                self._mrecv_key = ctx.matcher.recv_key
                self._send_key = send_key
                self._recv_key = recv_key
                return
        else:
            # A congestion-aware ring with cells enters its first link inline (general_ring): no sender.
            self._wire = net.wire(rank, send_to, msg)
        # A cell is the Matcher's state for one key: [arrivals not yet received, receives waiting, the
        # receiver's callback]. Only this ring's neighbours use these keys (one algorithm per run, the tag
        # names run and chunk), so pairing by counts in the cell is the Matcher's pairing.
        send_cell = cells.get(send_key)
        if send_cell is None:
            send_cell = cells[send_key] = [0, 0, None]
        recv_cell = cells.get(recv_key)
        if recv_cell is None:
            recv_cell = cells[recv_key] = [0, 0, None]
        recv_cell[2] = self._insert_ring
        self._send_cell = send_cell
        self._recv_cell = recv_cell

    def start(self) -> None:
        """Ring::run at the start: one packet (a ring's `parallel` is 1)."""
        self._insert_ring()

    def general(self, _arg: object = None) -> None:
        """A General event (a freed bundle)."""
        self._general_ring()

    def received(self) -> None:
        """A received message inserts the next packet."""
        self._insert_ring()

    def _general_ring(self, _arg: object = None) -> None:
        """general() for Ring: the same steps with the packet count and the kept keys (or cells). A freed
        bundle token is spent at once on the send it makes, so `free` changes only when nothing is sent."""
        if self.ring_packets and self.streams_left:
            self.ring_packets -= 1
            self.streams_left -= 1
            wire = self._wire
            if wire is not None:
                # AwareNet's sender, inlined (every message of a congestion-aware ring passes here). The last
                # hop runs the receiver's _insert_ring on the cell directly when the receiver exists.
                cell = self._send_cell
                rcv = cell[2] or _cell_arrived
                link, links, hold, hop, last, loop, arrive, free = wire
                now = loop.now
                ft = link.free_t
                if ft > now or (ft == now and link.free_seq > loop.cur):
                    link.pending.append([links, 0, hold, hop, rcv, cell, last])
                    if not link.queued:
                        link.queued = True
                        loop.put(ft, link.free_seq, free, link)
                else:
                    s = loop._seq + SEQ_STEP
                    loop._seq = s + SEQ_STEP  # the link's free event takes the next number (reserved)
                    e = (s, arrive, [links, 0, hold, hop, rcv, cell, last]) if last else (s, rcv, cell)
                    t = now + hop
                    b = loop._at.get(t)
                    if b is None:
                        loop._at[t] = [e]
                        _push(loop._times, t)
                    else:
                        b.append(e)
                    link.free_t = now + hold
                    link.free_seq = s + SEQ_STEP
            else:
                cell = self._send_cell
                if cell is None:
                    self._sender(self._marrived, self._send_key)  # Matcher.send
                    self._mrecv_key(self._recv_key, self._insert_ring)
                else:
                    self._sender(_cell_arrived, cell)
            if cell is not None:
                cell = self._recv_cell
                if cell[0]:  # Matcher.recv_key on the cell: the message is here, received now (queued)
                    cell[0] -= 1
                    loop = self._loop
                    loop.at(loop.now, self._insert_ring, None)
                else:
                    cell[1] += 1
        else:
            self.free += 1
        if not self.streams_left and self.free == 1:  # `parallel` free bundles: all came back
            self.exit()
            # No event is left for a ring after its exit (its last receive's bundle came back first): drop
            # its references to itself (bound methods, the stream) so it is freed now, not by the cycle
            # collector after the replay (~9% of a congestion-aware replay's CPU on the 32-rank set).
            self.__dict__.clear()

    def _insert_ring(self, cell: list | None = None) -> None:
        """insert() for Ring: no positions to move, the waiting packet is a count. With cell, a message has
        arrived there: it completes a receive posted on it (Matcher.recv_key on the cell), else it waits."""
        if cell is not None:
            if not cell[1]:
                cell[0] += 1
                return
            cell[1] -= 1
        k = self.k
        if k:
            fn = self._nz
        else:  # refill: zero = parallel, nonzero = p - 1, the toggle flips
            self._nz, self._nz_alt = self._nz_alt, self._nz
            fn = self._gen
        k += 1
        self.k = k if k < self.p else 0
        self.ring_packets += 1
        # SysEvents.at(rank, bus, fn, msg), inlined (a ring registers one or two events per message).
        loop = self._loop
        delay = self.bus
        t = loop.now + delay
        tick = self._ticks.get(t)
        if tick is None:
            tick = self._ticks[t] = {}
        else:
            last = tick.get(self.rank)
            if last is not None and (delay or loop.cur <= last):
                self._sysev.join(tick, self.rank, t, last, fn, self.msg)
                return
        loop._seq = s = loop._seq + SEQ_STEP
        tick[self.rank] = s
        b = loop._at.get(t)
        if b is None:
            loop._at[t] = [(s, fn, self.msg)]
            _push(loop._times, t)
        else:
            b.append((s, fn, self.msg))

    def _processed_ring(self, _size: int) -> None:
        # SysEvents.at(rank, reduction time, general), inlined.
        loop = self._loop
        delay = self._red
        t = loop.now + delay
        tick = self._ticks.get(t)
        if tick is None:
            tick = self._ticks[t] = {}
        else:
            last = tick.get(self.rank)
            if last is not None and (delay or loop.cur <= last):
                self._sysev.join(tick, self.rank, t, last, self._gen, None)
                return
        loop._seq = s = loop._seq + SEQ_STEP
        tick[self.rank] = s
        b = loop._at.get(t)
        if b is None:
            loop._at[t] = [(s, self._gen, None)]
            _push(loop._times, t)
        else:
            b.append((s, self._gen, None))


class TreeAlgo(_Algo):
    """DoubleBinaryTree AllReduce: whole chunk up the tree with reductions, then down."""

    def __init__(self, ctx, stream, members, idx, parent: int, children: list[int], data: int):
        super().__init__(ctx, stream, members, idx, False)
        self.parent = parent
        self.children = children
        self.data = data
        self.state = "begin"
        self.reductions = 0
        if parent < 0:
            self.role = "root"
        elif not children:
            self.role = "leaf"
        else:
            self.role = "mid"

    def start(self) -> None:
        self._on("init")

    def general(self, _arg: object = None) -> None:
        self._on("general")

    def received(self) -> None:
        self._on("recv")

    def _on(self, ev: str) -> None:
        st, d = self.state, self.data
        if self.role == "leaf":
            if st == "begin":
                self.bundle(d, False)
                self.state = "to_parent"
            elif st == "to_parent":
                self.send(self.parent, d)
                self.recv(self.parent, d)
                self.state = "wait_parent"
            elif st == "wait_parent":
                self.bundle(d, False)
                self.state = "end"
            elif st == "end":
                self.exit()
            return
        if self.role == "root":
            if st == "begin":
                self.state = "wait_one"
                self.recv(self.children[0], d)
            elif st == "wait_one" and ev == "recv":
                self.bundle(d, True)
                self.state = "to_children"
            elif st == "to_children":
                self.send(self.children[0], d)
                self.exit()
            return
        # Intermediate node: the condition order of DoubleBinaryTreeAllReduce::run matters.
        if st == "begin":
            self.state = "wait_two"
            for c in self.children:
                self.recv(c, d)
        elif st == "wait_two" and ev == "recv":
            self.bundle(d, True)
            self.state = "wait_one"
        elif st == "wait_one" and ev == "recv":
            self.bundle(d, True)
            self.state = "to_parent"
        elif self.reductions < 1 and ev == "general":
            self.reductions += 1
        elif st == "to_parent":
            self.state = "wait_parent"
            self.send(self.parent, d)
            self.recv(self.parent, d)
        elif st == "wait_parent" and ev == "recv":
            self.bundle(d, True)
            self.state = "to_children"
        elif st == "to_children":
            for c in self.children:
                self.send(c, d)
            self.exit()


class RankQueues:
    """A rank's stream queues (one per dimension): running slots and the waiting order."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.queues: dict[int, list[Stream]] = {}
        self.running: dict[int, int] = {}

    def add(self, q: int, stream: Stream, lifo: bool, fill: bool = True) -> None:
        """Insert as Sys::insert_stream does (started streams first, then by priority), then fill slots."""
        lst = self.queues.setdefault(q, [])
        pos = 0
        while pos < len(lst) and (lst[pos].started or lst[pos].priority >= stream.priority):
            pos += 1
        lst.insert(pos, stream)
        if fill:
            self.fill(q)

    def fill(self, q: int) -> None:
        lst = self.queues.get(q, [])
        running = self.running.get(q, 0)
        for s in lst:
            if running >= self.threshold:
                break
            if not s.started:
                s.started = True
                running += 1
                self.running[q] = running
                s.run.start_phase(s)

    def remove(self, q: int, stream: Stream) -> None:
        self.queues[q].remove(stream)
        self.running[q] -= 1


class CollectiveRun:
    """One collective on the event loop: its streams on every member rank and their per-rank finish times."""

    def __init__(
        self, world: AstraWorld, handle: int, members: tuple[int, ...], chunks: list[list], done, member=None
    ):
        self.world = world
        self.handle = handle
        self.members = members
        self.pos = {r: i for i, r in enumerate(members)}
        self.chunks = chunks  # per chunk: list of phases (queue id, factory(ctx, stream, members, idx))
        self.left = [len(chunks)] * len(members)
        self.finish = [0] * len(members)
        self.remaining = len(members)
        self.done = done  # called with the run when its last member finishes
        # Rings' matching cells (RingAlgo), where every chunk has one phase (one algorithm).
        self.cells: dict | None = {} if all(len(phases) == 1 for phases in chunks) else None
        self.member = member  # called (handle, position, ns) as each earlier member finishes

    def start(self, issue_at: tuple[int, ...] | None = None) -> None:
        """Create every rank's streams in chunk order (their priorities decide the start order), now or, per
        member, at the loop time issue_at[i] when that rank issues the collective (ASTRA-sim starts each rank's
        part when the rank reaches the node: no barrier across members)."""
        loop = self.world.loop
        for i, r in enumerate(self.members):
            if issue_at is None or issue_at[i] <= loop.now:
                self._issue(r)
            else:
                loop.at(issue_at[i], self._issue, r)

    def issue(self, pos: int) -> None:
        """Member `pos` issues the collective now: its streams are created and queued on its rank."""
        self._issue(self.members[pos])

    def _issue(self, r: int) -> None:
        w = self.world
        if not self.chunks:
            self._rank_done(self.pos[r])
            return
        for c, phases in enumerate(self.chunks):
            s = Stream(self, r, list(phases), w.next_priority(r), (self.handle, c))
            w.queues_of(r).add(s.phases[0][0], s, w.lifo)

    def start_phase(self, stream: Stream) -> None:
        q, make = stream.phases[0]
        stream.alg = make(self.world.ctx, stream, self.members, self.pos[stream.rank])
        stream.alg.start()

    def phase_done(self, stream: Stream) -> None:
        rq = self.world.queues_of(stream.rank)
        q = stream.phases.pop(0)[0]
        rq.remove(q, stream)
        if stream.phases:
            stream.started = False
            nq = stream.phases[0][0]
            rq.add(nq, stream, self.world.lifo, fill=False)
            rq.fill(q)
            rq.fill(nq)
            return
        rq.fill(q)
        i = self.pos[stream.rank]
        self.left[i] -= 1
        if self.left[i] == 0:
            self._rank_done(i)

    def _rank_done(self, i: int) -> None:
        self.finish[i] = self.world.loop.now
        self.remaining -= 1
        if self.remaining == 0:
            self.done(self)
        elif self.member is not None:
            # ASTRA-sim releases a rank when its own streams exit (DataSet::notify_stream_finished): it
            # goes on with its next node while the others still run (a tree's root long before leaves).
            self.member(self.handle, i, self.finish[i])


class AstraWorld:
    """The event loop, network, matcher and per-rank queues shared by every collective in flight."""

    def __init__(self, net_factory, ed: int, mem_gbps: float, active: int, lifo: bool) -> None:
        self.loop = EventLoop()
        self.net = net_factory(self.loop)
        self.matcher = Matcher(self.loop, self.net)
        self.ctx = Ctx(self.loop, self.matcher, SysEvents(self.loop), ed, mem_gbps)
        self.active = active
        self.lifo = lifo
        self._queues: dict[int, RankQueues] = {}
        self._priority: dict[int, int] = {}

    def queues_of(self, rank: int) -> RankQueues:
        """The stream queues of a rank."""
        rq = self._queues.get(rank)
        if rq is None:
            rq = self._queues[rank] = RankQueues(self.active)
        return rq

    def next_priority(self, rank: int) -> int:
        """Sys::get_priority: LIFO counts up, FIFO counts down."""
        v = self._priority.get(rank, 0)
        self._priority[rank] = v + 1 if self.lifo else v - 1
        return v
