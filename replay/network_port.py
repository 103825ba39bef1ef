"""The engine's side of contract E: hands collectives and transfers to the network model (or times them by
their recorded durations) and turns the model's completions back into node finishes."""

from __future__ import annotations

from heapq import heappush

from xsim.netmodels.api import (
    CollectiveSpec,
    FixedDurations,
    MemberFinishes,
    MemberStarts,
    NetworkModel,
    QuietLookahead,
    StaggeredStarts,
)
from xsim.netmodels.errors import NetworkModelError
from xsim.replay.errors import ReplayError
from xsim.replay.matching import CollectiveInstance, CollectiveRecord
from xsim.replay.program import COLLECTIVE_KIND, Program

_STALL_LIMIT = 10_000  # polls at one instant without a completion before the model is declared stalled


class NetworkPort:
    """Starts transfers at the engine's now and reports node finishes on the engine's event heap.

    A finish of node g at t is the int (t << shift) | g pushed on `heap` (replay/engine.py).
    """

    def __init__(
        self,
        prog: Program,
        network: NetworkModel | None,
        measured: bool,
        heap: list[int],
        shift: int,
    ) -> None:
        self.prog = prog
        self.network = network
        self.measured = measured
        self.recorded = prog.recorded_ns
        self.heap = heap
        self.shift = shift
        self.handles: dict[int, object] = {}  # network handle -> CollectiveRecord | send g
        self._dirty = False  # a transfer started or the model advanced: its next event may have moved
        self._next: int | None = None
        self._stalls = 0
        self._stall_t = -1
        # ASTRA-sim mode: each member starts its part when it issues the node (no barrier).
        self._staggered = network.start_collective_issued if isinstance(network, StaggeredStarts) else None
        # (comm type, size, group key) -> (spec, its fixed duration or None), reused.
        self._specs: dict[tuple, tuple[CollectiveSpec, int | None]] = {}
        # A contention-free model (netmodels/analytical.py) knows a transfer's duration from the transfer
        # alone: its nodes' finishes go straight on the engine's heap, at the instants a completion would
        # report them, without a handle, a completion or an advance of the model.
        fixed = isinstance(network, FixedDurations)
        self._fixed_coll = network.fixed_collective_ns if fixed else None
        self._fixed_p2p = network.fixed_p2p_ns if fixed else None
        # ASTRA-sim's congestion-aware mode: members finished ahead of their collective's last member, each
        # released at its own finish (docs/netmodels.md, the optional member_finishes); handle -> positions.
        self._member_finishes = network.member_finishes if isinstance(network, MemberFinishes) else None
        self._ended: dict[int, set[int]] = {}
        # ... and each member started as it issues (no barrier): instance -> the model's handle.
        self.starts_members = not measured and isinstance(network, MemberStarts) and network.starts_members
        self._opened: dict[CollectiveInstance, int] = {}
        # A model whose events before the next node finish need no advance each (netmodels/api.py).
        self._quiet = network.next_event_quiet if isinstance(network, QuietLookahead) else None

    def next_event(self, horizon: int | None) -> int | None:
        """The model's next event time (asked again only after something changed), None when idle; horizon:
        the replay's next node finish (None: no node pending), before which a QuietLookahead model may run
        events that complete nothing."""
        if self._dirty:
            if self._quiet is not None:
                self._next = self._quiet(horizon)
            else:
                self._next = self.network.next_event_ns() if self.network is not None else None
            self._dirty = False
        return self._next

    def due(self, t: int) -> bool:
        """True when the model has an event at or before t (after next_event was asked)."""
        return self._next is not None and self._next <= t

    def finish(self, t: int, g: int) -> None:
        """Node g finishes at t."""
        heappush(self.heap, (t << self.shift) | g)

    def _need(self, what: str, g: int) -> NetworkModel:
        if self.network is None:
            raise ReplayError(
                f"{self.prog.describe(g)}: {what} needs a network model (or comm mode 'measured')"
            )
        return self.network

    def member_issued(self, inst: CollectiveInstance, pos: int, t: int) -> None:
        """A member (not the last) of a collective issued it at t: started at once on a model that starts
        members as they issue (ASTRA-sim's congestion-aware mode); the first one opens the collective."""
        opened = self._opened.get(inst)
        g = inst.nodes[pos]
        try:
            if opened is None:
                c = self.prog.coll[g]
                spec = CollectiveSpec(
                    kind=COLLECTIVE_KIND[c.comm_type], size_bytes=c.size, ranks=inst.members
                )
                opened = self._opened[inst] = (self.network.open_collective(t, spec), set())
            opened[1].add(pos)
            self.network.issue_member(t, opened[0], pos)
        except NetworkModelError as exc:
            raise ReplayError(f"{self.prog.describe(g)}: network model: {exc}") from None
        self._dirty = True

    def start_collective(self, inst: CollectiveInstance, t: int) -> None:
        """Time a complete collective instance whose last member issued at t."""
        rec = inst.record
        nodes = rec.nodes
        opened = self._opened.pop(inst, None) if self._opened else None
        if opened is not None:  # opened by its first member: the last one starts its own part now
            h, issued = opened
            last = next(i for i in range(len(inst.members)) if i not in issued)
            try:
                self.network.issue_member(t, h, last)
            except NetworkModelError as exc:
                raise ReplayError(f"{self.prog.describe(nodes[0])}: network model: {exc}") from None
            self.handles[h] = rec
            self._dirty = True
            return
        if self.measured:
            rec_ns = self.recorded
            d = min(rec_ns[gm] for gm in nodes)
            for gm in nodes:
                self.finish(t + d, gm)
            return
        if len(inst.members) == 1:
            self.finish(t, nodes[0])  # a one-rank group moves no data
            return
        g0 = nodes[0]
        net = self._need("a collective", g0)
        # A group key names its members, so (type, size, key) finds the spec without hashing the members.
        skey = (rec.comm_type, rec.size, rec.group)
        hit = self._specs.get(skey)
        if hit is None or (hit[0].ranks is not inst.members and hit[0].ranks != inst.members):
            spec = CollectiveSpec(
                kind=COLLECTIVE_KIND[rec.comm_type], size_bytes=rec.size, ranks=inst.members
            )
            d = None
        else:
            spec, d = hit
        try:
            # Members that all issued at t (the first arrival is the last) start together: no stagger.
            if self._staggered is not None and len(inst.sim) == len(inst.members) and inst.first != t:
                h = self._staggered(t, spec, inst.issue_times())
            elif self._fixed_coll is not None:
                if d is None:
                    d = self._fixed_coll(spec)
                self._specs[skey] = (spec, d)
                # Every member finishes at the last rank's finish, as a completion reported at that
                # instant would finish them (advance).
                f = (t + d) << self.shift
                heap = self.heap
                for gm in nodes:
                    heappush(heap, f | gm)
                return
            else:
                h = net.start_collective(t, spec)
        except NetworkModelError as exc:
            raise ReplayError(f"{self.prog.describe(g0)}: network model: {exc}") from None
        self._specs[skey] = (spec, None)
        self.handles[h] = rec
        self._dirty = True

    def start_send(self, g: int, t: int) -> None:
        """Time send g issued at t (its data then waits for, or meets, the matching recv)."""
        info = self.prog.p2p[g]
        if info.src == info.dst:
            self.finish(t, g)
            return
        if self.measured:
            self.finish(t + self.recorded[g], g)
            return
        net = self._need("a send", g)
        try:
            if self._fixed_p2p is not None:
                self.finish(t + self._fixed_p2p(info.src, info.dst, info.size), g)
                return
            h = net.start_p2p(t, info.src, info.dst, info.size)
        except NetworkModelError as exc:
            raise ReplayError(f"{self.prog.describe(g)}: network model: {exc}") from None
        self.handles[h] = g
        self._dirty = True

    def advance(self, t: int) -> None:
        """Run the model to t; every completion finishes its nodes (each member at its own finish, >= t)."""
        network = self.network
        try:
            comps = network.advance(t)
        except NetworkModelError as exc:
            raise ReplayError(f"network model at t={t} ns: {exc}") from None
        self._dirty = True
        # A model may report internal events without completions (flow rate changes); it only hangs when
        # it keeps reporting the same instant without completing anything.
        if comps or t != self._stall_t:
            self._stalls, self._stall_t = 0, t
        else:
            self._stalls += 1
            if self._stalls > _STALL_LIMIT:
                raise ReplayError(f"network model {network.name!r} makes no progress at t={t} ns")
        heap, shift, handles = self.heap, self.shift, self.handles
        if self._member_finishes is not None:
            for h, i, f in self._member_finishes():
                obj = handles.get(h)
                if isinstance(obj, CollectiveRecord):
                    self._ended.setdefault(h, set()).add(i)
                    pos = obj.positions
                    for j, gm in enumerate(obj.nodes):
                        if (j if pos is None else pos[j]) == i:
                            heappush(heap, ((f if f > t else t) << shift) | gm)
        for c in comps:
            obj = handles.pop(c.handle, None)
            if obj is None:
                raise ReplayError(f"network model {network.name!r} completed unknown handle {c.handle!r}")
            if isinstance(obj, CollectiveRecord):
                prf = c.per_rank_finish_ns
                pos = obj.positions
                ended = self._ended.pop(c.handle, ()) if self._ended else ()
                if len(prf) != len(obj.members):
                    prf, pos = (c.finish_ns,) * len(obj.nodes), None  # one finish for every member
                if pos is None:
                    for j, (gm, f) in enumerate(zip(obj.nodes, prf, strict=True)):
                        if j not in ended:
                            heappush(heap, ((f if f > t else t) << shift) | gm)
                else:
                    for gm, i in zip(obj.nodes, pos, strict=True):
                        if i not in ended:
                            f = prf[i]
                            heappush(heap, ((f if f > t else t) << shift) | gm)
            else:
                heappush(heap, (t << shift) | obj)

    def in_flight(self) -> set[int]:
        """Nodes whose transfer the model has not completed."""
        return {g for obj in self.handles.values() for g in (obj.nodes if hasattr(obj, "nodes") else (obj,))}
