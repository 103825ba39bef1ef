"""The `flow` model's flows in flight: slots, the flows on each link, and max-min rates by component.

A flow in flight holds a slot. Bytes left and rate are numpy columns over the slots (every model step
advances them in one vectorized operation; a free slot holds inf bytes at rate 1, so it is never due and
never the earliest finish); everything else is per slot in Python lists (what the flow delivers, its
template, its serial number in start order, its links), so admitting or taking out k flows costs k, not the
flows in flight. Per link: how many flows are on it (`on`), the one flow on a link that carries one
(`holder`) and the set of flows on a link that carries more (`shared`). So the flows connected to a link
through shared links (its component) are found by following shared links only, in the size of the
component; and a component is solved by progressive filling once per distinct sequence of routes (issue
24 round 4; docs/netmodels.md says why each step is exact).
"""

from __future__ import annotations

import numpy as np
from xsim.netmodels.flow_tables import FlowTemplates
from xsim.netmodels.maxmin import max_min_rates

# Distinct components solved by progressive filling are kept by their routes in start order (the rates
# depend on nothing else); past this many the memo starts again (a memory bound, not a correctness one).
_MEMO_MAX = 1 << 16


class FlowSlots:
    """Flows in flight by slot, the flows on each link, and rates solved per touched component."""

    def __init__(self, tpl: FlowTemplates, capacity: np.ndarray) -> None:
        self.tpl = tpl
        self.cap = capacity
        self.n = 0  # flows in flight
        self.rem = np.zeros(0)  # bytes left per slot (inf when free)
        self.rate = np.ones(0)  # bytes/ns per slot (1 when free)
        self.q = np.zeros(0)  # scratch: bytes left / rate
        self.buf = np.zeros(0)  # scratch: rate * dt
        # The same columns as memoryviews: one slot's value read or written as a Python float, the same
        # bits, at a fraction of a numpy scalar's cost.
        self.rem_v = self.rate_v = self.q_v = memoryview(self.rem)
        self.rec: list = []  # what the flow in a slot delivers
        self.tid: list[int] = []  # its template
        self.ser: list[int] = []  # its serial number (start order)
        self.free: list[int] = []  # free slots, taken from the end
        self.next_ser = 0
        links = tpl.pad + 1
        self.on = [0] * links
        self.holder = [0] * links  # valid where on == 1
        self.shared: dict[int, set[int]] = {}  # link -> slots, exactly the links where on >= 2
        # Links of flows admitted since the last solve, and links that flows taken out shared with others.
        self.touched: list[int] = []
        self.memo: dict[tuple[int, ...], tuple[list[float], bool]] = {}  # routes -> rates, all > 0

    def admit(self, recs: list, flows: list[int], clean: bool) -> bool:
        """Admit flows (what each delivers, its template) at their full bytes; whether every one of their
        links now carries one flow. Their rate: the narrowest link when that holds and `clean` (no other
        flow's sharing changed since the last solve), else 0 until solved."""
        n = len(flows)
        free = self.free
        if len(free) < n:
            self._grow(n)
        slots = free[-n:]
        del free[-n:]
        tpl_links = self.tpl.tpl_links
        on, holder, touched, shared = self.on, self.holder, self.touched, self.shared
        s_rec, s_tid, s_ser = self.rec, self.tid, self.ser
        ser = self.next_ser
        alone = True
        for s, rec, f in zip(slots, recs, flows, strict=True):
            s_rec[s] = rec
            s_tid[s] = f
            s_ser[s] = ser
            ser += 1
            links = tpl_links[f]
            touched += links
            for link in links:
                c = on[link]
                if c:
                    # Joins a link that carries c >= 1 flows (inline: a call per shared link cost ~10% here).
                    alone = False
                    on[link] = c + 1
                    st = shared.get(link)
                    if st is None:
                        shared[link] = {holder[link], s}
                    else:
                        st.add(s)
                else:
                    on[link] = 1
                    holder[link] = s
        self.next_ser = ser
        self.n += n
        rem, rate, nbytes = self.rem_v, self.rate_v, self.tpl.nbytes_l
        if alone and clean:
            mincap = self.tpl.mincap_l
            for s, f in zip(slots, flows, strict=True):
                rem[s] = nbytes[f]
                rate[s] = mincap[f]
        else:
            for s, f in zip(slots, flows, strict=True):
                rem[s] = nbytes[f]
                rate[s] = 0.0
        return alone

    def take_out(self, done: list[int], t: float) -> tuple[list, list[float], bool]:
        """Take out the flows in these slots: what they deliver and their landing times (t + latency), in
        start order, and whether every one of their links carried that flow alone."""
        s_rec, s_tid = self.rec, self.tid
        if len(done) > 1:
            done.sort(key=self.ser.__getitem__)
        on, touched, holder, shared = self.on, self.touched, self.holder, self.shared
        rem, rate, lat, tpl_links = self.rem_v, self.rate_v, self.tpl.lat_l, self.tpl.tpl_links
        inf = float("inf")
        alone = True
        recs = list(map(s_rec.__getitem__, done))
        tids = list(map(s_tid.__getitem__, done))
        lands = [t + lat[f] for f in tids]
        for s, f in zip(done, tids, strict=True):
            rem[s] = inf
            rate[s] = 1.0
            for link in tpl_links[f]:
                c = on[link]
                if c == 1:
                    on[link] = 0  # now empty: no component to solve there (not touched)
                else:
                    # Leaves a link that carries c >= 2 flows (inline, as joining is).
                    alone = False
                    touched.append(link)
                    on[link] = c - 1
                    st = shared.get(link)  # None only for a route through one link twice (PXN relays)
                    if st is not None:
                        st.discard(s)
                        if c == 2:
                            if st:
                                (holder[link],) = st
                            del shared[link]
        self.free += done
        self.n -= len(done)
        return recs, lands, alone

    def _grow(self, need: int) -> None:
        """More slots, at least `need` free: inf bytes at rate 1 (never due)."""
        old = len(self.rem)
        size = max(2 * old, old + need, 64)
        extra = size - old
        self.rem = np.concatenate((self.rem, np.full(extra, np.inf)))
        self.rate = np.concatenate((self.rate, np.ones(extra)))
        self.q = np.zeros(size)
        self.buf = np.zeros(size)
        self.rem_v, self.rate_v, self.q_v = memoryview(self.rem), memoryview(self.rate), memoryview(self.q)
        self.rec += [None] * extra
        self.tid += [0] * extra
        self.ser += [0] * extra
        self.free[:0] = range(size - 1, old - 1, -1)  # taken from the end: the lowest new slot first

    def solve_touched(self) -> bool:
        """New rates for every component (flows connected through shared links) holding a link touched
        since the last solve; whether every new rate is > 0.

        Exact as max_min_rates on all flows (netmodels/maxmin.py: progressive filling never couples flows
        that share no link, directly or through other flows, and sums a link's frozen rates in flow order,
        which a component in start order keeps; a flow alone on its links gets its narrowest link, which
        progressive filling gives it in round one). A component with no touched link has the flows it had
        at the last solve (a flow that came or went would have touched a link of it), so its rates stand.
        A flow whose sharing changed is on a touched link, and when a flow's leaving splits a component,
        each part holds one of its links: every component that changed is solved.
        """
        on, holder, shared, rate = self.on, self.holder, self.shared, self.rate_v
        mincap, s_tid, tpl_links = self.tpl.mincap_l, self.tid, self.tpl.tpl_links
        seen: set[int] = set()
        pos = True
        for link in set(self.touched):
            c = on[link]
            if c == 0:
                continue
            s = holder[link] if c == 1 else next(iter(shared[link]))
            if s in seen:
                continue
            if c == 1:
                f = s_tid[s]
                for x in tpl_links[f]:
                    if on[x] != 1:
                        break
                else:  # alone on every link: its narrowest link
                    seen.add(s)
                    r = rate[s] = mincap[f]
                    pos = pos and r > 0
                    continue
            pos = self._solve_component(self.component(s, seen)) and pos
        self.touched = []
        return pos

    def component(self, start: int, seen: set[int]) -> list[int]:
        """The flows connected to the flow in slot `start` through shared links; each is added to seen."""
        on, shared, s_tid, tpl_links = self.on, self.shared, self.tid, self.tpl.tpl_links
        comp = [start]
        seen.add(start)
        walked: set[int] = set()
        for s in comp:  # comp grows while walked
            for link in tpl_links[s_tid[s]]:
                if on[link] > 1 and link not in walked:
                    walked.add(link)
                    for x in shared[link]:
                        if x not in seen:
                            seen.add(x)
                            comp.append(x)
        return comp

    def _solve_component(self, comp: list[int]) -> bool:
        """Progressive filling on one component, its flows in start order; the answer for its sequence
        of routes is kept. Whether every rate is > 0."""
        tpl_route, s_tid = self.tpl.tpl_route, self.tid
        if len(comp) == 2:  # most components (a tensor-parallel flow beside a data-parallel one): no sort
            a, b = comp
            if self.ser[b] < self.ser[a]:
                comp = [b, a]
                routes = (tpl_route[s_tid[b]], tpl_route[s_tid[a]])
            else:
                routes = (tpl_route[s_tid[a]], tpl_route[s_tid[b]])
        else:
            if len(comp) > 1:
                comp.sort(key=self.ser.__getitem__)
            routes = tuple(map(tpl_route.__getitem__, map(s_tid.__getitem__, comp)))
        got = self.memo.get(routes)
        if got is None:
            if len(self.memo) >= _MEMO_MAX:
                self.memo.clear()
            tpl = self.tpl
            rows = tpl.links[list(routes)]
            rates = max_min_rates(*tpl.csr(rows), self.cap).tolist()
            got = self.memo[routes] = (rates, min(rates) > 0)
        rate = self.rate_v
        for s, r in zip(comp, got[0], strict=True):
            rate[s] = r
        return got[1]
