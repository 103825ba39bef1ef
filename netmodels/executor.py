"""Evaluate a schedule without contention: per-position ready times propagated stage by stage with numpy."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from xsim.netmodels.algorithms import Schedule, Stage

# (stage) -> (duration of each transfer, reduction time the receiver of each transfer pays)
CostFn = Callable[[Stage], tuple[np.ndarray, np.ndarray]]
# (stage) -> how long each transfer keeps its sender's link busy (bytes / bottleneck bandwidth)
OccupancyFn = Callable[[Stage], np.ndarray]


def run_schedule(
    schedule: Schedule,
    start: np.ndarray,
    cost: CostFn,
    local_delay: float | int = 0,
    count_sends: bool = True,
    occupancy: OccupancyFn | None = None,
) -> np.ndarray:
    """Finish time of every position, given each position's start time; no link is shared by two flows.

    With `occupancy` (stage -> ns each transfer keeps its sender busy: bytes over the route's
    bottleneck), a position's sends of one stage start only once its previous sends' bytes have left: a
    ring neighbour's link carries the collective's steps one after another, so a ring whose slowest hop is
    a NIC is bound by that NIC for all 2(p-1) steps, as in the flow model (issue 10, bug 2). Without it
    (ASTRA-sim's analytical rule), a slow hop delays only the steps whose data crosses it.
    """
    finish = start.copy()
    for channel in schedule.channels:
        ready = start.copy()
        done = start.copy()
        sent = start.copy()  # when each position's previous sends have left it (occupancy)
        for stage in channel:
            if stage.local:
                ready = ready + local_delay * stage.repeat
                continue
            dur, red = cost(stage)
            if (
                stage.perm
                and len(stage.src) == schedule.p
                and dur.min() == dur.max()
                and red.min() == red.max()
                and ready.min() == ready.max()
                and (occupancy is None or sent.max() <= ready.min())
            ):
                # Uniform cycle: every position sends and receives once per step with equal costs, so
                # all repeats collapse to one multiplication (the closed form, exact in integers too).
                step = dur[0] + red[0]
                t0 = ready[0]
                ready = np.full_like(ready, t0 + stage.repeat * step)
                last_start = t0 + (stage.repeat - 1) * step
                if count_sends:
                    done = np.maximum(done, last_start + dur[0])
                if occupancy is not None:
                    sent = np.maximum(sent, last_start + occupancy(stage).max())
                continue
            occ = occupancy(stage) if occupancy is not None else None
            for _ in range(stage.repeat):
                begin = ready[stage.src] if occ is None else np.maximum(ready[stage.src], sent[stage.src])
                arrive = begin + dur
                if occ is not None and stage.perm:  # each position sends once: plain indexing
                    sent[stage.src] = np.maximum(sent[stage.src], begin + occ)
                elif occ is not None:
                    np.maximum.at(sent, stage.src, begin + occ)
                new = ready.copy()
                if stage.perm:
                    new[stage.dst] = np.maximum(new[stage.dst], arrive + red)
                    if count_sends:
                        done[stage.src] = np.maximum(done[stage.src], arrive)
                else:
                    np.maximum.at(new, stage.dst, arrive + red)
                    if count_sends:
                        np.maximum.at(done, stage.src, arrive)
                ready = new
        finish = np.maximum(finish, np.maximum(ready, done) if count_sends else ready)
    return finish


def run_chunked(
    schedule_of: Callable[[int], Schedule],
    chunks: int,
    in_flight: int,
    t0: np.ndarray,
    cost: CostFn,
    local_delay: float | int = 0,
    count_sends: bool = True,
    occupancy: OccupancyFn | None = None,
) -> np.ndarray:
    """Run `chunks` chunks (schedule_of(c)) with at most `in_flight` in flight per position; finish times."""
    finishes: list[np.ndarray] = []
    overall = t0.copy()
    for c in range(chunks):
        begin = t0 if c < in_flight else np.maximum(t0, finishes[c - in_flight])
        f = run_schedule(schedule_of(c), begin, cost, local_delay, count_sends, occupancy)
        finishes.append(f)
        overall = np.maximum(overall, f)
    return overall
