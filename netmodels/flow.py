"""The `flow` model: flow-level simulation with max-min fair sharing of every link (progressive filling).

Each transfer is a flow over its route. All flows crossing a link share its bandwidth max-min fairly; rates
are recomputed only when the set of flows changes. A flow occupies its links while its bytes drain and is
delivered one route latency after its last byte leaves (latency is added per path, not per byte). Internal
time is float ns; the engine-facing times are rounded up to integer ns.

How it is kept fast without changing a number (docs/performance.md, issue 11): the flows in flight hold
slots (flow_slots.py) whose bytes left and rates are numpy columns every event advances in one vectorized
step; a collective's transfers come from a plan built once per distinct collective (schedule, routes,
receive counts) and are plain tuples; the transfers that finish together land as one heap entry per landing
time; and progressive filling runs only on the components of flows sharing links that a flow joined or left
since the last computation, found along shared links, once per distinct sequence of routes (flows alone on
their links take their narrowest link; issue 24 flow rounds 2-4). Every
float is computed by the same operations in the same order as the one-object-per-transfer model before it,
so event times are identical to the last bit.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping

import numpy as np
from xsim.netmodels.algorithms import build_schedule, default_algorithm
from xsim.netmodels.analytical import resolve_options
from xsim.netmodels.api import (
    CollectiveSpec,
    Completion,
    ceil_ns,
    check_size,
    is_int,
    root_index,
    validate_ranks,
    validate_spec,
)
from xsim.netmodels.errors import AlgorithmError, NetworkModelError
from xsim.netmodels.flow_slots import FlowSlots
from xsim.netmodels.flow_tables import FlowTemplates
from xsim.netmodels.maxmin import _max_min_numpy, _max_min_small, max_min_rates
from xsim.netmodels.nccl import (
    NVLS_ALGORITHMS,
    effective_link_bandwidth,
    p2p_links,
    rail_rings,
    split_protocol,
    with_protocol,
)
from xsim.netmodels.topology import Topology

__all__ = ["FlowModel", "HybridFlowModel", "max_min_rates", "_max_min_numpy", "_max_min_small"]

# A flow is done when it would finish within this many ns at its current rate (float noise, not physics).
_DONE_NS = 1e-6
# A step at t < tf - (_CLEAR_NS + tf * _CLEAR_REL), tf the earliest projected finish, finishes no flow, so
# _step skips both tests. Why exact: float addition is monotone, so fl_t + q_i >= tf for every flow (no flow
# is due); and rem_i - rate_i * dt > rate_i * _DONE_NS holds in floats once t + _DONE_NS is below
# fl_t + q_i by more than the rounding of q_i, dt, tf and the two products (a few units of 2^-53 of tf,
# ~1.1e-15 tf): the margin is 10 x _DONE_NS plus 1e-12 tf, ~1,000 times that rounding.
_CLEAR_NS = 10 * _DONE_NS
_CLEAR_REL = 1e-12
# A step's finish tests run only on the flows with q = bytes left / rate <= (dt + _CAND_NS + t * _CLEAR_REL)
# * (1 + 2 _CLEAR_REL), dt = t - fl_t (all rates > 0). Why exact: for any other flow, with u = 2^-53 the
# rounding of one operation, q (1 - u) - dt (1 + u) > _CAND_NS (1 - u), so rem - rate dt stays above
# rate * _CAND_NS / 2 > rate * _DONE_NS in floats (not done), and fl_t + q rounds above t (not due): the
# margin _CAND_NS + 1e-12 t is ~10^4 times the rounding of t, dt and q (docs/netmodels.md).
_CAND_NS = 1e-3
# ndarray.min is this reduction behind a Python-level wrapper (~0.5 us a call, ~570k calls on hetero192).
_MIN = np.minimum.reduce

# Heap entries are (time, seq, kind, payload): a list of transfers landing at that time, or (run, position)
# whose reduction ends then. seq keeps equal times in push order; the payload is never compared.
_LAND = 0
_REDUCED = 1
# A list of times (latest first) at which a collective timed in closed form had an event: each is a step
# of the model, as the per-transfer landings it stands for were (the flows in flight advance there).
_TICKS = 2


def _candidate_limit(fl_t: float, t: float) -> float:
    """The largest bytes left / rate of a flow that a step from fl_t to t may find done or due (_CAND_NS)."""
    return (t - fl_t + _CAND_NS + t * _CLEAR_REL) * (1 + 2 * _CLEAR_REL)


class _StagePlan:
    """One stage of a collective's schedule with routes resolved, shared by every run of the collective.

    sends[i]: position i's transfers in schedule order, each (dst pos, lands at once, latency, flow) with
    flow = (bytes, links, link count, latency, narrowest link capacity); recv[i] / red[i]: transfers and
    bytes addressed to i (what it waits for and reduces); reduce: it reduces and reductions take time.
    instant: when every transfer lands at once (zero bytes or no links), the stage as arrays for the
    closed form (src, dst, latency per transfer, perm, positions that reduce, their reduction times).
    """

    __slots__ = ("sends", "recv", "red", "reduce", "instant")

    def __init__(self, sends: list, recv: list[int], red: list[float], reduce: bool, instant) -> None:
        self.sends, self.recv, self.red, self.reduce, self.instant = sends, recv, red, reduce, instant


class _Run:
    """One channel of one chunk of a collective: per-position progress through the flattened stages."""

    __slots__ = (
        "coll", "channel", "chunk", "stages", "nst", "ptr", "issued", "need", "out", "red_paid", "finished",
    )  # fmt: skip

    def __init__(self, coll: _Coll, channel: int, chunk: int, stages: tuple[_StagePlan, ...]) -> None:
        p = len(coll.finish)
        self.coll, self.channel, self.chunk, self.stages, self.nst = coll, channel, chunk, stages, len(stages)
        self.ptr = [0] * p
        self.issued = [0] * p
        # [stage][position]: receives still awaited, a stage's list copied from its plan when first read
        # (a data-parallel ring of 192 ranks has 382 stages, most runs read a few at a time).
        self.need: list[list[int] | None] = [None] * len(stages)
        self.out = [0] * p
        self.red_paid = [-1] * p
        self.finished = [False] * p


class _Coll:
    """A collective in flight: its plan (flattened stages per channel) and per-position completion."""

    __slots__ = ("handle", "channels", "runs_left", "finish", "positions_left", "runs")

    def __init__(self, handle: int, channels: tuple, p: int, runs: int, now: float) -> None:
        self.handle, self.channels = handle, channels
        self.runs_left = [runs] * p
        self.finish = [now] * p
        self.positions_left = p
        self.runs: dict[tuple[int, int], _Run] = {}


class FlowModel:
    """Flow-level network model with max-min fair link sharing; congestion-aware on any topology."""

    name = "flow"

    def __init__(
        self,
        topology: Topology,
        chunks: int = 1,
        chunks_in_flight: int = 1,
        endpoint_delay_ns: float | str = 0.0,
        reduction_bandwidth: float | str | None = None,
        algorithms: Mapping[str, str] | None = None,
    ) -> None:
        self.topology = topology
        self.num_ranks = topology.num_ranks
        self.chunks, self.in_flight, self.endpoint_delay_ns, self.reduction_bpns = resolve_options(
            chunks, chunks_in_flight, endpoint_delay_ns, reduction_bandwidth
        )
        self.algorithms = dict(algorithms or {})
        # NCCL mode (netmodels/nccl.py): links at the rate NCCL's protocol reaches, rail-aligned channels.
        self.nccl = topology.collectives == "nccl"
        self._cap = effective_link_bandwidth(topology) if self.nccl else topology.link_bandwidth
        self._t = 0.0
        self._heap: list = []
        self._seq = itertools.count()
        self._handles = itertools.count()
        self._last_now = 0
        # The batch of the newest heap entry while it is a landing not yet popped: a landing pushed next at
        # the same time joins it (their seqs would be adjacent, so nothing could pop between them).
        self._last_batch: list | None = None
        self._last_t = 0.0
        # Flows in flight (flow_slots.py): bytes left (valid at self._fl_t) and rate per slot, what each
        # delivers, (run, stage, src pos, dst pos) or (None, p2p handle, 0, 0), its template (flow_tables.py:
        # bytes, latency, route, narrowest link capacity) and start order; the flows on each link.
        self._tpl = FlowTemplates(self._cap)
        self._fs = FlowSlots(self._tpl, self._cap)
        self._fl_t = 0.0
        # The earliest finish that bytes left / rate gives (self._fs.q), kept until bytes, rates or flows
        # change.
        self._tf = 0.0
        self._q_ok = False
        # Whether every rate is > 0 (no division by zero to silence); links of no bandwidth would break it.
        # self._last_pos: whether every rate was > 0 after the last computation that solved flows.
        self._rate_pos = True
        self._cap_pos = bool((self._cap > 0).all())
        self._last_pos = True
        # Whether the flows that share links are the ones the rates were last computed for, because every
        # flow started or finished since was alone on all its links at that moment (it changed no other
        # flow's sharing); then the rates in self._fs.rate are already right (new flows got their narrowest
        # link), and _ensure_rates has nothing to compute.
        self._clean = True
        self._new_recs: list[tuple] = []
        self._new_flows: list[int] = []  # their templates
        self._done: list[tuple[int, int, Completion]] = []
        self.rate_recomputations = 0
        self._dirty = False
        # (src rank, dst rank) -> (route links as an int64 array, route latency, narrowest link capacity,
        # route number in self._tpl).
        self._paths: dict[tuple[int, int], tuple[np.ndarray, float, float, int]] = {}
        self._pxn_paths: dict[tuple[int, int], tuple[np.ndarray, float, float, int]] = {}  # NCCL mode P2P
        # (kind, algorithm, ranks, size, root index) -> flattened stage plans per channel.
        self._plans: dict[tuple, tuple[tuple[_StagePlan, ...], ...]] = {}
        # id(spec) -> (spec, its validated ranks, its plan's channels, instant): the engine passes the same
        # spec object for a repeated collective, and a frozen spec validated and planned once stays so
        # (no key of up to hundreds of ranks hashed per start).
        self._valid: dict[int, tuple[CollectiveSpec, tuple[int, ...], tuple, bool]] = {}

    # ----- engine-facing interface -------------------------------------------------------------------
    def start_collective(self, now_ns: int, spec: CollectiveSpec) -> int:
        """Start a collective at now_ns; its transfers share links with everything else in flight."""
        hit = self._valid.get(id(spec))
        if hit is None or hit[0] is not spec:
            ranks = validate_spec(spec, self.num_ranks)
            hit = None
        self._catch_up(now_ns)
        if hit is None:
            algo = spec.algorithm or self.algorithms.get(spec.kind) or default_algorithm(spec.kind)
            # NCCL mode: an unnamed algorithm is NCCL's choice (None), not the generic default.
            if self.nccl and spec.algorithm is None and spec.kind not in self.algorithms:
                algo = None
            plan = self._plan(spec.kind, algo, ranks, spec.size_bytes, root_index(spec))
            hit = self._valid[id(spec)] = (spec, ranks, *plan)
        _, ranks, channels, instant = hit
        handle = next(self._handles)
        p = len(ranks)
        nch = len(channels)
        coll = _Coll(handle, channels, p, nch * self.chunks, float(now_ns))
        if nch == 0:
            self._complete(coll, float(now_ns))
        elif instant:
            self._instant_collective(coll, float(now_ns))
        else:
            for ch in range(nch):
                for c in range(min(self.in_flight, self.chunks)):
                    self._start_run(coll, ch, c, range(p))
        return handle

    def start_p2p(self, now_ns: int, src: int, dst: int, size_bytes: int) -> int:
        """Start one flow from src to dst at now_ns."""
        validate_ranks((src, dst), self.num_ranks)
        check_size(size_bytes)
        self._catch_up(now_ns)
        handle = next(self._handles)
        links, lat, _, route = self._p2p_path(src, dst) if self.nccl else self._path(src, dst)
        nbytes = float(size_bytes)
        rec = (None, handle, 0, 0)
        if nbytes <= 0 or len(links) == 0:
            self._push_land(self._t + lat, rec)
        else:
            self._new_recs.append(rec)
            self._new_flows.append(self._tpl.p2p(nbytes, route, lat))
        return handle

    def next_event_ns(self) -> int | None:
        """Earliest time (ns, rounded up) at which a flow finishes, a transfer lands or a collective ends."""
        cands = [f for f, _, _ in self._done]
        t = self._next_time()
        if t is not None:
            cands.append(ceil_ns(t))
        return min(cands) if cands else None

    def next_event_quiet(self, horizon_ns: int | None) -> int | None:
        """next_event_ns(), after running the steps (rounded up) before horizon_ns (the replay's next node
        finish; None: no node pending) and before any pending completion, until one completes something.

        Most steps end a ring stage and start the next one inside the model (2 in 3 on hetero192): the
        engine would advance the model to each and find nothing to finish there. Those steps are the same
        `_step(t)` calls in the same order either way: starts come only at node finishes (>= horizon_ns)
        or at completions (where this stops), and a step rounded up to horizon_ns stays for `advance`.
        """
        done = self._done
        stop = min(f for f, _, _ in done) if done else horizon_ns
        if horizon_ns is not None and stop > horizon_ns:
            stop = horizon_ns
        n = len(done)
        step, next_time = self._step, self._next_time
        while len(done) == n:
            t = next_time()
            if t is None or (stop is not None and ceil_ns(t) >= stop):
                break
            step(t)
        return self.next_event_ns()

    def advance(self, until_ns: int) -> list[Completion]:
        """Process internal events up to until_ns; completions ordered by (finish_ns, handle)."""
        while True:
            t = self._next_time()
            if t is None or ceil_ns(t) > until_ns:
                break
            self._step(t)
        if not self._done:
            return []
        ready = sorted(d for d in self._done if d[0] <= until_ns)
        self._done = [d for d in self._done if d[0] > until_ns]
        return [c for _, _, c in ready]

    # ----- time and flows ------------------------------------------------------------------------------
    def _catch_up(self, now_ns: int) -> None:
        if not is_int(now_ns) or now_ns < self._last_now:
            raise NetworkModelError(
                f"start times must be non-decreasing integers (got {now_ns} after {self._last_now})"
            )
        self._last_now = now_ns = int(now_ns)
        if (self._dirty or self._new_recs) and now_ns == self._fl_t:
            # More starts at the instant flows were just added: no time passes, so no rates are needed;
            # only instantaneous deliveries (zero-byte or link-free transfers) may be due. Flows started
            # at one instant are admitted together (_settle) before time moves or rates are needed.
            while self._heap and self._heap[0][0] <= now_ns:
                self._step(float(now_ns))
            return
        while True:
            t = self._next_time()
            if t is None or t > now_ns:
                break
            self._step(t)
        self._progress(float(now_ns))
        self._t = float(now_ns)

    def _ratio(self) -> np.ndarray:
        """Bytes left / rate per slot (inf at rate 0 and in free slots), for the flows and rates as they are
        now, and the earliest finish it gives (self._tf)."""
        fs = self._fs
        if not self._q_ok:
            if self._rate_pos:
                np.divide(fs.rem, fs.rate, out=fs.q)
            else:
                with np.errstate(divide="ignore", invalid="ignore"):
                    np.divide(fs.rem, fs.rate, out=fs.q)
            self._tf = self._fl_t + float(_MIN(fs.q))  # q.min() without its Python wrapper
            self._q_ok = True
        return fs.q

    def _next_time(self) -> float | None:
        if self._new_recs:
            self._settle()
        if self._dirty:
            self._ensure_rates()
        t = self._heap[0][0] if self._heap else None
        if self._fs.n:
            if not self._q_ok:
                self._ratio()
            tf = self._tf
            t = tf if t is None else min(t, tf)
        return t

    def _progress(self, t: float) -> None:
        if self._new_recs:
            self._settle()
        fs = self._fs
        if fs.n and t > self._fl_t:
            if self._dirty:
                self._ensure_rates()
            np.multiply(fs.rate, t - self._fl_t, out=fs.buf)
            np.subtract(fs.rem, fs.buf, out=fs.rem)  # rem - rate * dt: the same floats as a new array
            self._q_ok = False
        self._fl_t = t

    def _step(self, t: float) -> None:
        if self._new_recs:
            self._settle()
        if self._fs.n:
            self._finish_due(t)
        else:
            self._fl_t = self._t = t
        heap = self._heap
        advance = self._advance_pos
        new_recs, new_flows = self._new_recs, self._new_flows  # replaced only by _settle, after the loop
        while heap and heap[0][0] <= t:
            _, _, kind, item = heapq.heappop(heap)
            if item is self._last_batch:
                self._last_batch = None
            if kind != _LAND:
                if kind == _REDUCED:
                    advance(item[0], item[1], t)
                elif item:
                    heapq.heappush(heap, (item.pop(), next(self._seq), _TICKS, item))
                    self._last_batch = None
                continue
            for run, s, a, b in item:
                if run is None:
                    fin = ceil_ns(t)
                    self._done.append((fin, s, Completion(s, fin, (fin,))))
                    continue
                need = run.need[s]
                if need is None:
                    need = run.need[s] = run.stages[s].recv[:]
                left = need[b] - 1
                need[b] = left
                out = run.out
                out[a] -= 1
                ptr = run.ptr
                if left == 0 and ptr[b] == s:
                    # What _advance_pos does in the common case, inline: b has all of stage s, takes no
                    # reduction time, enters s + 1 (not yet issued) and issues it; anything else goes there.
                    s1 = s + 1
                    sp = run.stages[s]
                    if (
                        s1 == run.nst
                        or run.issued[b] != s1
                        or (sp.reduce and sp.recv[b] > 0 and run.red_paid[b] != s)
                    ):
                        advance(run, b, t)
                    else:
                        ptr[b] = s1
                        run.issued[b] = s1 + 1
                        sends = run.stages[s1].sends[b]
                        if sends:
                            out[b] += len(sends)
                            for c, instant, lat, flow in sends:
                                if instant:
                                    self._push_land(t + lat, (run, s1, b, c))
                                else:
                                    new_recs.append((run, s1, b, c))
                                    new_flows.append(flow)
                        need = run.need[s1]
                        if need is None:
                            need = run.need[s1] = run.stages[s1].recv[:]
                        if need[b] <= 0:
                            advance(run, b, t)
                if out[a] == 0 and ptr[a] == run.nst:
                    advance(run, a, t)
        if self._new_recs:
            self._settle()

    def _finish_due(self, t: float) -> None:
        """Advance the flows in flight to t and take out those done by then."""
        # Each flow's own finish time, computed exactly as _next_time does (before progress): the flow
        # that set t is always among the finished, even where t is so large (~1e10 ns) that its float
        # spacing exceeds _DONE_NS and the leftover bytes stay above the noise threshold.
        q = self._ratio()
        tf = self._tf
        fs = self._fs
        fl_t = self._fl_t
        if t < tf - (_CLEAR_NS + tf * _CLEAR_REL):
            # No flow can be done (module note on _CLEAR_NS): skip the tests, not the progress.
            self._progress(t)
            self._t = t
            return
        if self._rate_pos and not self._dirty:
            # The tests on the candidates only (module note on _CAND_NS); no rate changes at this progress.
            cand = (q <= _candidate_limit(fl_t, t)).nonzero()[0].tolist()  # flatnonzero, 1-d, no wrapper
            self._progress(t)  # leaves fs.q as it was
            self._t = t
            qv, rem, rate = fs.q_v, fs.rem_v, fs.rate_v
            done = [i for i in cand if fl_t + qv[i] <= t or rem[i] <= rate[i] * _DONE_NS]
        else:
            due = fl_t + q <= t
            self._progress(t)
            self._t = t
            done = (due | (fs.rem <= fs.rate * _DONE_NS)).nonzero()[0].tolist()
        if done:
            self._finish(done, t)

    def _finish(self, done: list[int], t: float) -> None:
        """Take the done flows (slots) out and schedule their landings (t + latency), one heap entry per
        time, transfers in start order."""
        finished, lands, alone = self._fs.take_out(done, t)
        if not alone:
            self._clean = False
        self._q_ok = False
        self._dirty = True
        first = lands[0]
        if lands.count(first) == len(lands):
            self._push_batch(first, finished)
            return
        # Landings at different times: one entry per time, transfers in flow order within it. Equal times
        # pop in seq order, and these seqs are one block, so the order matches one push per transfer.
        by_time: dict[float, list] = {}
        for x, rec in zip(lands, finished, strict=True):
            batch = by_time.get(x)
            if batch is None:
                by_time[x] = [rec]
            else:
                batch.append(rec)
        for x, batch in by_time.items():
            self._push_batch(x, batch)

    def _push_batch(self, t: float, batch: list) -> None:
        if self._last_batch is not None and self._last_t == t:
            self._last_batch.extend(batch)
        else:
            heapq.heappush(self._heap, (t, next(self._seq), _LAND, batch))
            self._last_batch, self._last_t = batch, t

    def _push_land(self, t: float, rec: tuple) -> None:
        if self._last_batch is not None and self._last_t == t:
            self._last_batch.append(rec)
        else:
            batch = [rec]
            heapq.heappush(self._heap, (t, next(self._seq), _LAND, batch))
            self._last_batch, self._last_t = batch, t

    def _settle(self) -> None:
        """Admit the flows started at the current time; rates are recomputed lazily, once per change."""
        if self._new_recs:
            if not self._fs.admit(self._new_recs, self._new_flows, self._clean):
                self._clean = False
            self._new_recs = []
            self._new_flows = []
            self._q_ok = False
            self._rate_pos = False  # the new flows' rates are 0 until recomputed
            self._dirty = True

    def _ensure_rates(self) -> None:
        """Recompute max-min rates if the set of flows changed since the last computation."""
        if not self._dirty:
            return
        self._dirty = False
        fs = self._fs
        if fs.n and self._clean:
            # The flows sharing links are those of the last computation (self._clean): same rates. The
            # links touched since were alone's, in no component: as good as computed now.
            self._rate_pos = self._cap_pos and self._last_pos
            fs.touched = []
            self._q_ok = False
            self.rate_recomputations += 1
        elif fs.n:
            # Exact as max_min_rates on all flows (FlowSlots.solve_touched): only the components holding
            # a touched link get new rates; every other flow keeps the rate it has.
            self._clean = True
            pos = fs.solve_touched()
            self._last_pos = (pos and self._last_pos) or bool((fs.rate > 0).all())
            self._rate_pos = self._last_pos
            self._q_ok = False
            self.rate_recomputations += 1

    # ----- collectives -------------------------------------------------------------------------------
    def _flow_info(self, tid: int) -> tuple[float, np.ndarray, int, float, float]:
        """A flow template as (bytes, route links, link count, latency, narrowest link capacity)."""
        tpl = self._tpl
        links = tpl.links[tpl.route[tid]]
        links = links[links != tpl.pad]
        return float(tpl.nbytes[tid]), links, len(links), float(tpl.lat[tid]), float(tpl.mincap[tid])

    def _path(self, src: int, dst: int) -> tuple[np.ndarray, float, float, int]:
        pair = (src, dst)
        path = self._paths.get(pair)
        if path is None:
            r = self.topology.route(src, dst)
            links = np.array(r.links, dtype=np.int64)
            mincap = float(self._cap[links].min()) if len(links) else float("inf")
            path = self._paths[pair] = (links, r.latency_ns, mincap, self._tpl.add_route(links))
        return path

    def _p2p_path(self, src: int, dst: int) -> tuple[np.ndarray, float, float, int]:
        """NCCL mode: a P2P's links via its PXN relay (netmodels.nccl.p2p_links), cached per pair."""
        pair = (src, dst)
        path = self._pxn_paths.get(pair)
        if path is None:
            links, lat = p2p_links(self.topology, src, dst)
            arr = np.array(links, dtype=np.int64)
            mincap = float(self._cap[arr].min()) if len(arr) else float("inf")
            path = self._pxn_paths[pair] = (arr, lat, mincap, self._tpl.add_route(arr))
        return path

    def _plan(self, kind: str, algo: str, ranks: tuple[int, ...], size: int, root: int) -> tuple:
        """Flattened stage plans per channel of a collective, built once per distinct collective, and
        whether it can be timed in closed form (every transfer lands at once, one chunk)."""
        key = (kind, algo, ranks, size, root)
        plan = self._plans.get(key)
        if plan is None:
            hosts = self.topology.hosts_of(ranks)
            rings = rail_rings(hosts) if self.nccl else None
            base, proto = split_protocol(algo)
            factor = None
            if proto is not None and not self.nccl:
                raise AlgorithmError(
                    f"algorithm {algo!r}: NCCL protocols run on clusters with collectives: nccl "
                    "(dgx-a100, dgx-a800, dgx-h100)"
                )
            if self.nccl and len(ranks) > 1:
                # The algorithm and protocol NCCL's tuning model picks (the analytical model's closed
                # forms predict them, as NCCL's model does), or the ones forced.
                spec = CollectiveSpec(kind, size, ranks, algo, ranks[root])
                choice = self._chooser().nccl_plan(spec)
                if choice is not None:
                    base, proto, factor = choice
            base = base or default_algorithm(kind)
            if self.nccl and len(ranks) > 1 and base in NVLS_ALGORITHMS:
                # NVLink SHARP: the transfers that load NVLink and NICs as NCCL's model says it runs.
                spec = CollectiveSpec(kind, size, ranks, base, ranks[root])
                sched = self._chooser()._nvls(spec, ranks, base)
                proto = None
            else:
                sched = build_schedule(
                    kind, base, len(ranks), size / self.chunks, root, hosts, rings, nccl=self.nccl
                )
            if self.nccl and len(ranks) > 1 and proto is not None and base != "pat":
                sched = with_protocol(sched, proto, hosts, factor)
            by_stage: dict[int, _StagePlan] = {}
            chans = []
            for channel in sched.channels:
                flat: list[_StagePlan] = []
                for stage in channel:
                    sp = by_stage.get(id(stage))
                    if sp is None:
                        sp = by_stage[id(stage)] = self._stage_plan(stage, ranks)
                    flat += [sp] * stage.repeat
                chans.append(tuple(flat))
            instant = self.chunks == 1 and all(sp.instant is not None for sp in by_stage.values())
            plan = self._plans[key] = (tuple(chans), instant)
        return plan

    def nccl_choice(self, spec: CollectiveSpec) -> tuple[str, str] | None:
        """(algorithm, protocol) NCCL mode runs the collective with (the analytical model's prediction)."""
        return self._chooser().nccl_choice(spec) if self.nccl else None

    def _chooser(self):
        """An analytical model of the same topology: NCCL's protocol choice needs the Simple ring's time."""
        if getattr(self, "_choice_model", None) is None:
            from xsim.netmodels.analytical import AnalyticalModel

            self._choice_model = AnalyticalModel(
                self.topology, self.chunks, self.in_flight, self.endpoint_delay_ns, None, self.algorithms
            )
        return self._choice_model

    def _stage_plan(self, stage, ranks: tuple[int, ...]) -> _StagePlan:
        p = len(ranks)
        nbytes = stage.nbytes.astype(np.float64).tolist()
        sends: list[list] = [[] for _ in range(p)]
        delay = self.endpoint_delay_ns
        src, dst = stage.src.tolist(), stage.dst.tolist()
        extra = stage.extra_ns.tolist() if stage.extra_ns is not None else None
        for i, (a, b, nb) in enumerate(zip(src, dst, nbytes, strict=True)):
            links, lat, _, route = self._path(ranks[a], ranks[b])
            lat = lat + delay if extra is None else lat + delay + extra[i]
            instant = nb <= 0 or len(links) == 0
            sends[a].append((b, instant, lat, -1 if instant else self._tpl.add(nb, route, lat)))
        recv = np.bincount(stage.dst, minlength=p).tolist()
        red = np.bincount(stage.dst, weights=stage.nbytes, minlength=p).tolist()
        reduce = bool(stage.reduce) and bool(self.reduction_bpns)
        instant = None
        if all(x[1] for xs in sends for x in xs):
            lat = np.array([self._path(ranks[a], ranks[b])[1] for a, b in zip(src, dst, strict=True)])
            if stage.extra_ns is not None:
                lat = lat + stage.extra_ns
            reducing = np.array(recv) > 0 if reduce else np.zeros(p, dtype=bool)
            red_ns = np.array(red) / self.reduction_bpns if reduce else None
            instant = (stage.src, stage.dst, lat + delay, bool(stage.perm), reducing, red_ns)
        return _StagePlan([tuple(x) for x in sends], recv, red, reduce, instant)

    def _instant_collective(self, coll: _Coll, now: float) -> None:
        """Time a collective whose transfers all land at once (barriers) in closed form, per stage.

        The same floats as the per-transfer path: a position enters stage s + 1 at the latest of its entry
        into s and the landings addressed to it in s (entry + latency of the sender), plus its reduction
        time where it reduces; it finishes at the latest of its last entry and its own landings. Every
        landing and reduction end stays a step of the model (_TICKS): the flows in flight advance there.
        """
        p = len(coll.finish)
        finish = np.full(p, now)
        times = []
        for stages in coll.channels:
            entry = np.full(p, now)
            ends = np.full(p, -np.inf)
            for sp in stages:
                src, dst, lat, perm, reducing, red_ns = sp.instant
                ready = entry
                if len(src):
                    land = entry[src] + lat
                    times.append(land)
                    ready = entry.copy()
                    if perm:
                        ends[src] = np.maximum(ends[src], land)
                        ready[dst] = np.maximum(ready[dst], land)
                    else:
                        np.maximum.at(ends, src, land)
                        np.maximum.at(ready, dst, land)
                if red_ns is not None and reducing.any():
                    done = ready[reducing] + red_ns[reducing]
                    times.append(done)
                    ready = ready.copy()
                    ready[reducing] = done
                entry = ready
            finish = np.maximum(finish, np.maximum(entry, ends))
        coll.finish = finish.tolist()
        self._complete(coll, float(finish.max()))
        if times:
            ticks = np.unique(np.concatenate(times))[::-1].tolist()
            heapq.heappush(self._heap, (ticks.pop(), next(self._seq), _TICKS, ticks))
            self._last_batch = None

    def _start_run(self, coll: _Coll, ch: int, c: int, positions) -> None:
        run = coll.runs.get((ch, c))
        if run is None:
            run = coll.runs[(ch, c)] = _Run(coll, ch, c, coll.channels[ch])
        for i in positions:
            self._advance_pos(run, i, self._t)

    def _advance_pos(self, run: _Run, i: int, t: float) -> None:
        """Move position i of a run as far as its receives allow, issuing each stage's sends on entry."""
        nst, ptr, issued, need, stages = run.nst, run.ptr, run.issued, run.need, run.stages
        s = ptr[i]
        while s != nst:
            sp = stages[s]
            if issued[i] == s:
                issued[i] = s + 1
                sends = sp.sends[i]
                if sends:
                    run.out[i] += len(sends)
                    for b, instant, lat, flow in sends:
                        if instant:
                            self._push_land(self._t + lat, (run, s, i, b))
                        else:
                            self._new_recs.append((run, s, i, b))
                            self._new_flows.append(flow)
            left = need[s]
            if left is None:
                left = need[s] = sp.recv[:]
            if left[i] > 0:
                return
            if sp.reduce and sp.recv[i] > 0 and run.red_paid[i] != s:
                run.red_paid[i] = s
                heapq.heappush(
                    self._heap, (t + sp.red[i] / self.reduction_bpns, next(self._seq), _REDUCED, (run, i))
                )
                self._last_batch = None
                return
            s += 1
            ptr[i] = s
        if run.out[i] == 0 and not run.finished[i]:
            run.finished[i] = True
            self._pos_finished(run, i, t)

    def _pos_finished(self, run: _Run, i: int, t: float) -> None:
        coll = run.coll
        coll.finish[i] = max(coll.finish[i], t)
        coll.runs_left[i] -= 1
        nxt = run.chunk + self.in_flight
        if nxt < self.chunks:
            self._start_run(coll, run.channel, nxt, (i,))
        if coll.runs_left[i] == 0:
            coll.positions_left -= 1
            if coll.positions_left == 0:
                self._complete(coll, max(coll.finish))
                coll.runs.clear()

    def _complete(self, coll: _Coll, t: float) -> None:
        per = tuple(ceil_ns(x) for x in coll.finish)
        fin = max(per) if per else ceil_ns(t)
        self._done.append((fin, coll.handle, Completion(coll.handle, fin, per)))


class HybridFlowModel(FlowModel):
    """`flow-hybrid`: the flow model for everything but collectives inside one host, which take the
    contention-free closed form of the analytical model (an approximation: docs/netmodels.md).

    A training step's tensor-parallel collectives stay inside a node's scale-up fabric and make ~90% of
    the flow model's transfers at 1,024 GPUs (one ring step of p flows at a time); timing them in closed
    form leaves the flow model the traffic between hosts (pipeline P2P, data-parallel rings, barriers),
    where contention between jobs' flows is what the flow model is for. What is lost: contention between
    an intra-host collective and any other flow on the same scale-up links.
    """

    name = "flow-hybrid"

    def __init__(
        self,
        topology: Topology,
        chunks: int = 1,
        chunks_in_flight: int = 1,
        endpoint_delay_ns: float | str = 0.0,
        reduction_bandwidth: float | str | None = None,
        algorithms: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            topology, chunks, chunks_in_flight, endpoint_delay_ns, reduction_bandwidth, algorithms
        )
        from xsim.netmodels.analytical import AnalyticalModel

        self._local = AnalyticalModel(
            topology, chunks, chunks_in_flight, endpoint_delay_ns, reduction_bandwidth, algorithms
        )
        self._local_handle: dict[int, int] = {}  # the analytical model's handle -> ours
        self._one_host: dict[tuple[int, ...], bool] = {}

    def start_collective(self, now_ns: int, spec: CollectiveSpec) -> int:
        """Inside one host: closed form, no contention; otherwise flows as in `flow`."""
        ranks = validate_spec(spec, self.num_ranks)
        one = self._one_host.get(ranks)
        if one is None:
            one = self._one_host[ranks] = len(set(self.topology.hosts_of(ranks))) == 1
        if not one:
            return super().start_collective(now_ns, spec)
        if not is_int(now_ns) or now_ns < self._last_now:
            self._catch_up(now_ns)  # raises the one error for times going backwards
        self._last_now = int(now_ns)
        handle = next(self._handles)
        self._local_handle[self._local.start_collective(now_ns, spec)] = handle
        return handle

    def next_event_ns(self) -> int | None:
        """The earlier of the flows' next event and the next closed-form completion."""
        a, b = super().next_event_ns(), self._local.next_event_ns()
        return b if a is None else a if b is None else min(a, b)

    def next_event_quiet(self, horizon_ns: int | None) -> int | None:
        """The flows' quiet steps before the earlier of horizon_ns and the next closed-form completion
        (the engine would advance both models to each and find nothing to finish), then next_event_ns()."""
        b = self._local.next_event_ns()
        if b is not None and (horizon_ns is None or b < horizon_ns):
            horizon_ns = b
        return super().next_event_quiet(horizon_ns)  # ends in this class's next_event_ns: both models'

    def advance(self, until_ns: int) -> list[Completion]:
        """Both models' completions up to until_ns, ordered by (finish_ns, handle)."""
        out = super().advance(until_ns)
        local = self._local.advance(until_ns)
        if local:
            out += [
                Completion(self._local_handle.pop(c.handle), c.finish_ns, c.per_rank_finish_ns) for c in local
            ]
            out.sort(key=lambda c: (c.finish_ns, c.handle))
        return out
