"""Max-min fair rates by progressive filling over flows given as CSR link lists (the `flow` model's rates).

`max_min_rates` computes them (plain Python for small instances, numpy otherwise: the same floats bit for
bit, same operations in the same order per link). `max_min_rates_split` gives the same floats faster when
most flows share no link: those get their narrowest link at once, progressive filling runs on the rest.
Why that is exact: progressive filling never couples two flows that share no link, directly or through other
flows; each round's numbers for a link depend only on the flows crossing it (a link's frozen rates are
summed in flow order, which a subset keeps), and a flow alone on its links is frozen in round one at
min(capacity / 1). The flow model relies on the same argument to reuse the shared flows' rates while that
set of flows is unchanged.
"""

from __future__ import annotations

import numpy as np

# Up to this many (flow, link) entries the rates are computed in plain Python (_max_min_small): a ring
# step's handful of flows cost ~180 us in numpy calls, nearly all per-call overhead (docs/performance.md).
_SMALL_ENTRIES = 64


def _max_min_small(ptr: list[int], links: list[int], capacity: np.ndarray) -> np.ndarray:
    """max_min_rates's rounds, operation for operation, on Python floats: the same numbers, bit for bit."""
    nf = len(ptr) - 1
    inf = float("inf")
    rates = [inf] * nf
    used = sorted(set(links))
    pos = {link: i for i, link in enumerate(used)}
    nl = len(used)
    cap = [float(capacity[link]) for link in used]
    ent = [(f, pos[links[k]]) for f in range(nf) for k in range(ptr[f], ptr[f + 1])]
    while ent:
        n_on = [0] * nl
        for _, lk in ent:
            n_on[lk] += 1
        share = [cap[lk] / n_on[lk] if n_on[lk] > 0 else inf for lk in range(nl)]
        fmin = [inf] * nf
        for f, lk in ent:
            if share[lk] < fmin[f]:
                fmin[f] = share[lk]
        lmin = [inf] * nl
        for f, lk in ent:
            if fmin[f] < lmin[lk]:
                lmin[lk] = fmin[f]
        bott = [share[lk] <= lmin[lk] * (1 + 1e-12) for lk in range(nl)]
        hit = [False] * nf
        for f, lk in ent:
            if bott[lk]:
                hit[f] = True
        sub = [0.0] * nl
        for f, lk in ent:
            if hit[f]:
                rates[f] = fmin[f]
                sub[lk] += fmin[f]  # in entry order, as np.bincount(weights=...) sums
        cap = [c - d if c - d > 0.0 else 0.0 for c, d in zip(cap, sub, strict=True)]
        ent = [(f, lk) for f, lk in ent if not hit[f]]
    return np.array(rates, dtype=np.float64)


def max_min_rates(flow_ptr: np.ndarray, flow_links: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates by progressive filling; flow f crosses flow_links[flow_ptr[f]:flow_ptr[f+1]]."""
    if 0 < len(flow_links) <= _SMALL_ENTRIES:
        return _max_min_small(np.asarray(flow_ptr).tolist(), np.asarray(flow_links).tolist(), capacity)
    return _max_min_numpy(flow_ptr, flow_links, capacity)


def _max_min_numpy(flow_ptr: np.ndarray, flow_links: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """max_min_rates vectorized over the (flow, link) entries of the links in use."""
    nf = len(flow_ptr) - 1
    counts = np.diff(flow_ptr)
    rates = np.full(nf, np.inf)
    if nf == 0 or len(flow_links) == 0:
        return rates
    # The links in use, ascending, and each entry's index among them (np.unique's answer, without a sort).
    present = np.bincount(flow_links) > 0
    used = np.flatnonzero(present)
    lc = (np.cumsum(present) - 1)[flow_links]
    cap = capacity[used].astype(np.float64)
    nl = len(used)
    owner = np.repeat(np.arange(nf), counts)
    # Work on the entries (flow, link) of unfrozen flows only; they shrink every round.
    e_flow, e_link = owner, lc
    while len(e_flow):
        n_on = np.bincount(e_link, minlength=nl)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(n_on > 0, cap / np.maximum(n_on, 1), np.inf)
        # A link whose fair share is the smallest among all links of all its flows is saturated at that
        # share by progressive filling: shares only grow as other flows freeze (each freezes at most at
        # the share of every link it crosses). Freeze all such links' flows in one round.
        es = share[e_link]
        fmin = np.full(nf, np.inf)
        np.minimum.at(fmin, e_flow, es)
        lmin = np.full(nl, np.inf)
        np.minimum.at(lmin, e_link, fmin[e_flow])
        bott = share <= lmin * (1 + 1e-12)
        hit = np.zeros(nf, dtype=bool)
        hit[e_flow[bott[e_link]]] = True
        rates[hit] = fmin[hit]
        frozen = hit[e_flow]
        cap = np.maximum(cap - np.bincount(e_link[frozen], weights=rates[e_flow[frozen]], minlength=nl), 0.0)
        e_flow, e_link = e_flow[~frozen], e_link[~frozen]
    return rates


def shared_flows(counts: np.ndarray, flow_links: np.ndarray) -> np.ndarray | None:
    """Which flows share at least one of their links with another flow; None when no flow does."""
    shared_entry = np.bincount(flow_links)[flow_links] > 1
    if not shared_entry.any():
        return None
    return np.logical_or.reduceat(shared_entry, np.cumsum(counts) - counts)


def shared_flows_small(counts: list[int], flow_links: list[int]) -> list[int] | None:
    """shared_flows for a few flows on Python lists: the indices of the flows sharing a link, or None."""
    on: dict[int, int] = {}
    for link in flow_links:
        on[link] = on.get(link, 0) + 1
    if len(on) == len(flow_links):
        return None
    out = []
    k = 0
    for f, c in enumerate(counts):
        for link in flow_links[k : k + c]:
            if on[link] > 1:
                out.append(f)
                break
        k += c
    return out


def sub_csr(counts: np.ndarray, flow_links: np.ndarray, pick) -> tuple[np.ndarray, np.ndarray]:
    """The CSR (ptr, links) of the picked flows (a boolean mask or increasing indices), in their order."""
    if not isinstance(pick, np.ndarray) or pick.dtype != bool:
        mask = np.zeros(len(counts), dtype=bool)
        mask[pick] = True
        pick = mask
    sub = counts[pick]
    ptr = np.zeros(len(sub) + 1, dtype=np.int64)
    np.cumsum(sub, out=ptr[1:])
    return ptr, flow_links[np.repeat(pick, counts)]


def max_min_rates_split(flow_ptr: np.ndarray, flow_links: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """max_min_rates, answering flows alone on all their links first (module docstring: why it is exact).

    A flow alone on its links gets its narrowest link: capacity / 1 is the share it sees in progressive
    filling's first round, where the smallest of its links freezes it.
    """
    counts = np.diff(flow_ptr)
    if len(counts) == 0 or not counts.all():
        return max_min_rates(flow_ptr, flow_links, capacity)
    rates = np.minimum.reduceat(capacity[flow_links].astype(np.float64, copy=False), flow_ptr[:-1])
    shared = shared_flows(counts, flow_links)
    if shared is not None:
        rates[shared] = max_min_rates(*sub_csr(counts, flow_links, shared), capacity)
    return rates
