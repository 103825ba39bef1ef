"""Per-rank time accounting from op intervals: busy-time unions, exposed communication, idle, bubble."""

from __future__ import annotations

import numpy as np


def union_length(rank: np.ndarray, s: np.ndarray, e: np.ndarray, num_ranks: int) -> np.ndarray:
    """Length of the union of [s, e) intervals per rank (int64, one entry per rank)."""
    out = np.zeros(num_ranks, dtype=np.int64)
    keep = e > s
    if not keep.any():
        return out
    rank, s, e = rank[keep].astype(np.int64), s[keep].astype(np.int64), e[keep].astype(np.int64)
    # Shift each rank onto its own stretch of the line so one running max merges all ranks at once; sorting
    # by that one key is sorting by (rank, start), and ops come nearly in that order (a stable sort's best case).
    span = int(e.max()) + 1
    ss, ee = s + rank * span, e + rank * span
    order = np.argsort(ss, kind="stable")
    rank, ss, ee = rank[order], ss[order], ee[order]
    run = np.maximum.accumulate(ee)
    new = np.ones(len(ss), dtype=bool)
    new[1:] = ss[1:] > run[:-1]
    seg_start = ss[new]
    idx = np.flatnonzero(new)
    seg_end = run[np.append(idx[1:] - 1, len(ss) - 1)]
    # Per-rank sums of the segments (sorted by rank): differences of one running sum at the ranks'
    # boundaries, exact in int64 (np.add.at is ~10x slower; bincount's float weights would round).
    seg_rank = rank[new]
    csum = np.concatenate(([0], np.cumsum(seg_end - seg_start)))
    bounds = np.searchsorted(seg_rank, np.arange(num_ranks + 1))
    return csum[bounds[1:]] - csum[bounds[:-1]]


def clip(s: np.ndarray, e: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Intervals clipped to [lo, hi) (per-interval bounds); empty ones come out with e <= s."""
    return np.maximum(s, lo), np.minimum(e, hi)


def rank_accounting(
    rank: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    wait: np.ndarray,
    resource: np.ndarray,
    num_ranks: int,
) -> dict[str, np.ndarray]:
    """compute / cpu / comm / exposed comm / idle / bubble / finish / work per rank (ns, int64).

    resource codes: 0 GPU compute, 1 CPU, 2 communication, 3 none (zero-time nodes).
    Communication counts from the moment its peers were there (start + wait) to its end.
    """
    comp = resource == 0
    cpu = resource == 1
    comm = resource == 2
    a_s = np.where(comm, start + wait, start)
    finish = np.zeros(num_ranks, dtype=np.int64)
    if len(rank):
        np.maximum.at(finish, rank, end)
    work = comp | cpu
    busy = work | comm
    compute_ns = union_length(rank[comp], a_s[comp], end[comp], num_ranks)
    cpu_ns = union_length(rank[cpu], a_s[cpu], end[cpu], num_ranks)
    comm_ns = union_length(rank[comm], a_s[comm], end[comm], num_ranks)
    work_ns = union_length(rank[work], a_s[work], end[work], num_ranks)
    busy_ns = union_length(rank[busy], a_s[busy], end[busy], num_ranks)
    # Bubble: inside [first GPU compute start, last GPU compute end], time with nothing running.
    big = np.iinfo(np.int64).max
    first = np.full(num_ranks, big, dtype=np.int64)
    last = np.zeros(num_ranks, dtype=np.int64)
    if comp.any():
        np.minimum.at(first, rank[comp], start[comp])
        np.maximum.at(last, rank[comp], end[comp])
    has = first < big
    span = np.where(has, last - np.where(has, first, 0), 0)
    rb = rank[busy]
    cs, ce = clip(a_s[busy], end[busy], first[rb], last[rb])
    inside = union_length(rb, cs, ce, num_ranks)
    return {
        "finish_ns": finish,
        "compute_ns": compute_ns,
        "cpu_ns": cpu_ns,
        "comm_ns": comm_ns,
        "exposed_comm_ns": busy_ns - work_ns,
        "idle_ns": finish - busy_ns,
        "bubble_ns": np.where(has, span - inside, 0),
        "work_ns": work_ns,  # GPU compute and CPU ops together (their intervals start at start)
    }
