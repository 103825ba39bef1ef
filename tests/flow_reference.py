"""The flow model as it was before issue 11's round 3 (netmodels/flow.py at 385030b): one object per
transfer, one heap entry per landing, progressive filling over every flow at each change. Kept as the
differential reference of tests/test_net_flow_exact.py: the fast model must give its completions exactly.
Its rates are netmodels.maxmin.max_min_rates on all flows (the function the old model had, moved there), so
the fast model's shortcuts (flows alone on their links, reused shared rates) are checked against full
progressive filling.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from xsim.netmodels.algorithms import Schedule, Stage, build_schedule, default_algorithm
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
from xsim.netmodels.errors import NetworkModelError
from xsim.netmodels.maxmin import max_min_rates
from xsim.netmodels.topology import Topology

# A flow is done when it would finish within this many ns at its current rate (float noise, not physics).
_DONE_NS = 1e-6


@dataclass(eq=False)
class _Transfer:
    run: _Run | None
    stage: int
    src: int
    dst: int
    nbytes: float
    links: np.ndarray
    latency: float
    handle: int = -1  # p2p transfers only


@dataclass(eq=False)
class _Run:
    """One channel of one chunk of a collective: per-position progress through the flattened stages.

    Plain lists, not numpy arrays: they are read and written one element at a time per transfer, where
    numpy scalar indexing cost ~3x more (docs/performance.md).
    """

    coll: _Coll
    channel: int
    chunk: int
    stages: list[Stage]
    ptr: list[int]
    issued: list[int]
    need: list[list[int]]  # [stage][position]: receives still awaited
    out: list[int]
    red_paid: list[int]
    finished: list[bool]


@dataclass(eq=False)
class _Coll:
    handle: int
    ranks: tuple[int, ...]
    schedule: Schedule
    runs_left: np.ndarray
    finish: np.ndarray
    positions_left: int
    runs: dict = field(default_factory=dict)
    # Per-stage send order and receive counts, keyed by id(stage); lives and dies with the collective.
    meta: dict = field(default_factory=dict)


class ReferenceFlowModel:
    """The pre-round-3 flow model, unchanged but for its name."""

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
        self._cap = topology.link_bandwidth
        self._t = 0.0
        self._heap: list = []
        self._seq = itertools.count()
        self._handles = itertools.count()
        self._last_now = 0
        # Active flows: parallel lists/arrays, valid at time self._fl_t.
        self._fl: list[_Transfer] = []
        self._rem = np.zeros(0)
        # The active flows' routes as CSR (link count per flow, links concatenated), kept in step with _fl.
        self._cnt = np.zeros(0, dtype=np.int64)
        self._flat = np.zeros(0, dtype=np.int64)
        self._rate = np.zeros(0)
        self._fl_t = 0.0
        self._new: list[_Transfer] = []
        self._done: list[tuple[int, int, Completion]] = []
        self.rate_recomputations = 0
        self._dirty = False
        # (src rank, dst rank) -> (route links as an int64 array, route latency); Topology caches the route,
        # this caches its array form, built once per pair instead of once per transfer.
        self._paths: dict[tuple[int, int], tuple[np.ndarray, float]] = {}

    # ----- engine-facing interface -------------------------------------------------------------------
    def start_collective(self, now_ns: int, spec: CollectiveSpec) -> int:
        """Start a collective at now_ns; its transfers share links with everything else in flight."""
        ranks = validate_spec(spec, self.num_ranks)
        self._catch_up(now_ns)
        algo = spec.algorithm or self.algorithms.get(spec.kind) or default_algorithm(spec.kind)
        hosts = self.topology.hosts_of(ranks)
        sched = build_schedule(
            spec.kind, algo, len(ranks), spec.size_bytes / self.chunks, root_index(spec), hosts
        )
        handle = next(self._handles)
        p = len(ranks)
        nch = len(sched.channels)
        coll = _Coll(handle, ranks, sched, np.full(p, nch * self.chunks), np.full(p, float(now_ns)), p)
        if nch == 0:
            self._complete(coll, float(now_ns))
        else:
            for ch in range(nch):
                for c in range(min(self.in_flight, self.chunks)):
                    self._start_run(coll, ch, c, range(p))
        self._settle()
        return handle

    def start_p2p(self, now_ns: int, src: int, dst: int, size_bytes: int) -> int:
        """Start one flow from src to dst at now_ns."""
        validate_ranks((src, dst), self.num_ranks)
        check_size(size_bytes)
        self._catch_up(now_ns)
        handle = next(self._handles)
        r = self.topology.route(src, dst)
        tr = _Transfer(
            None, 0, src, dst, float(size_bytes), np.array(r.links, dtype=np.int64), r.latency_ns, handle
        )
        self._launch(tr)
        self._settle()
        return handle

    def next_event_ns(self) -> int | None:
        """Earliest time (ns, rounded up) at which a flow finishes, a transfer lands or a collective ends."""
        cands = [f for f, _, _ in self._done]
        t = self._next_time()
        if t is not None:
            cands.append(ceil_ns(t))
        return min(cands) if cands else None

    def advance(self, until_ns: int) -> list[Completion]:
        """Process internal events up to until_ns; completions ordered by (finish_ns, handle)."""
        while True:
            t = self._next_time()
            if t is None or ceil_ns(t) > until_ns:
                break
            self._step(t)
        ready = sorted(d for d in self._done if d[0] <= until_ns)
        self._done = [d for d in self._done if d[0] > until_ns]
        return [c for _, _, c in ready]

    # ----- internals -----------------------------------------------------------------------------------
    def _catch_up(self, now_ns: int) -> None:
        if not is_int(now_ns) or now_ns < self._last_now:
            raise NetworkModelError(
                f"start times must be non-decreasing integers (got {now_ns} after {self._last_now})"
            )
        self._last_now = now_ns = int(now_ns)
        if self._dirty and now_ns == self._fl_t:
            # More starts at the instant flows were just added: no time passes, so no rates are needed;
            # only instantaneous deliveries (zero-byte or link-free transfers) may be due.
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

    def _next_time(self) -> float | None:
        self._ensure_rates()
        t = self._heap[0][0] if self._heap else None
        if len(self._fl):
            with np.errstate(divide="ignore"):
                tf = self._fl_t + float(np.min(self._rem / self._rate))
            t = tf if t is None else min(t, tf)
        return t

    def _progress(self, t: float) -> None:
        if len(self._fl) and t > self._fl_t:
            self._ensure_rates()
            self._rem = self._rem - self._rate * (t - self._fl_t)
        self._fl_t = t

    def _step(self, t: float) -> None:
        if len(self._fl):
            # Each flow's own finish time, computed exactly as _next_time does (before progress): the flow
            # that set t is always among the finished, even where t is so large (~1e10 ns) that its float
            # spacing exceeds _DONE_NS and the leftover bytes stay above the noise threshold.
            with np.errstate(divide="ignore", invalid="ignore"):
                due = self._fl_t + self._rem / self._rate <= t
        self._progress(t)
        self._t = t
        if len(self._fl):
            done = due | (self._rem <= self._rate * _DONE_NS)
            if done.any():
                idx = np.flatnonzero(done)
                finished = [self._fl[i] for i in idx]
                keep = ~done
                self._fl = [f for f, k in zip(self._fl, keep, strict=True) if k]
                self._rem, self._rate = self._rem[keep], self._rate[keep]
                self._flat = self._flat[np.repeat(keep, self._cnt)]
                self._cnt = self._cnt[keep]
                for tr in finished:
                    self._push(t + tr.latency, tr)
                self._dirty = True
        while self._heap and self._heap[0][0] <= t:
            _, _, item = heapq.heappop(self._heap)
            if isinstance(item, _Transfer):
                self._deliver(item, t)
            else:
                run, i = item
                self._advance_pos(run, i, t)
        self._settle()

    def _push(self, t: float, item: object) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), item))

    def _launch(self, tr: _Transfer) -> None:
        if tr.nbytes <= 0 or len(tr.links) == 0:
            self._push(self._t + tr.latency, tr)
        else:
            self._new.append(tr)

    def _settle(self) -> None:
        """Admit the flows started at the current time; rates are recomputed lazily, once per change."""
        if self._new:
            self._fl.extend(self._new)
            self._cnt = np.concatenate([self._cnt, [len(tr.links) for tr in self._new]]).astype(np.int64)
            self._flat = np.concatenate([self._flat, *[tr.links for tr in self._new]])
            self._rem = np.concatenate([self._rem, [tr.nbytes for tr in self._new]])
            self._rate = np.concatenate([self._rate, np.zeros(len(self._new))])
            self._new = []
            self._dirty = True

    def _ensure_rates(self) -> None:
        """Recompute max-min rates if the set of flows changed since the last computation."""
        if not self._dirty:
            return
        self._dirty = False
        if self._fl:
            ptr = np.zeros(len(self._fl) + 1, dtype=np.int64)
            np.cumsum(self._cnt, out=ptr[1:])
            self._rate = max_min_rates(ptr, self._flat, self._cap)
            self.rate_recomputations += 1

    def _stage_meta(self, coll: _Coll, stage: Stage) -> tuple:
        key = id(stage)
        meta = coll.meta.get(key)
        if meta is None:
            p = len(coll.ranks)
            order = np.argsort(stage.src, kind="stable")
            ptr = np.searchsorted(stage.src[order], np.arange(p + 1))
            recv = np.bincount(stage.dst, minlength=p)
            red = np.bincount(stage.dst, weights=stage.nbytes, minlength=p)
            # Lists for the per-transfer reads (same values: tolist() gives the exact Python int/float).
            meta = (
                order.tolist(), ptr.tolist(), recv.tolist(), red, stage,
                stage.src.tolist(), stage.dst.tolist(), stage.nbytes.astype(np.float64).tolist(),
            )  # fmt: skip
            coll.meta[key] = meta
        return meta

    def _start_run(self, coll: _Coll, ch: int, c: int, positions) -> None:
        run = coll.runs.get((ch, c))
        p = len(coll.ranks)
        if run is None:
            stages = [s for s in coll.schedule.channels[ch] for _ in range(s.repeat)]
            need = [list(self._stage_meta(coll, s)[2]) for s in stages]
            run = _Run(coll, ch, c, stages, [0] * p, [0] * p, need, [0] * p, [-1] * p, [False] * p)
            coll.runs[(ch, c)] = run
        for i in positions:
            self._advance_pos(run, i, self._t)

    def _advance_pos(self, run: _Run, i: int, t: float) -> None:
        nst = len(run.stages)
        ptr, issued, need = run.ptr, run.issued, run.need
        while True:
            s = ptr[i]
            if s == nst:
                if run.out[i] == 0 and not run.finished[i]:
                    run.finished[i] = True
                    self._pos_finished(run, i, t)
                return
            stage = run.stages[s]
            order, sptr, recv, red, _, src, dst, nbytes = self._stage_meta(run.coll, stage)
            if issued[i] == s:
                issued[i] = s + 1
                for k in order[sptr[i] : sptr[i + 1]]:
                    self._send(run, s, src[k], dst[k], nbytes[k])
            if need[s][i] > 0:
                return
            if stage.reduce and recv[i] > 0 and self.reduction_bpns and run.red_paid[i] != s:
                run.red_paid[i] = s
                self._push(t + red[i] / self.reduction_bpns, (run, i))
                return
            ptr[i] = s + 1

    def _send(self, run: _Run, s: int, a: int, b: int, nbytes: float) -> None:
        ranks = run.coll.ranks
        pair = (ranks[a], ranks[b])
        path = self._paths.get(pair)
        if path is None:
            r = self.topology.route(*pair)
            path = self._paths[pair] = (np.array(r.links, dtype=np.int64), r.latency_ns)
        run.out[a] += 1
        lat = path[1] + self.endpoint_delay_ns
        self._launch(_Transfer(run, s, a, b, nbytes, path[0], lat))

    def _deliver(self, tr: _Transfer, t: float) -> None:
        run = tr.run
        if run is None:
            self._done.append((ceil_ns(t), tr.handle, Completion(tr.handle, ceil_ns(t), (ceil_ns(t),))))
            return
        need = run.need[tr.stage]
        need[tr.dst] -= 1
        run.out[tr.src] -= 1
        if run.ptr[tr.dst] == tr.stage and need[tr.dst] == 0:
            self._advance_pos(run, tr.dst, t)
        if run.ptr[tr.src] == len(run.stages) and run.out[tr.src] == 0:
            self._advance_pos(run, tr.src, t)

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
                self._complete(coll, float(coll.finish.max()))
                coll.runs.clear()
                coll.meta.clear()

    def _complete(self, coll: _Coll, t: float) -> None:
        per = tuple(ceil_ns(x) for x in coll.finish)
        fin = max(per) if per else ceil_ns(t)
        self._done.append((fin, coll.handle, Completion(coll.handle, fin, per)))
