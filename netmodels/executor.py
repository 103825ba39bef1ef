"""Evaluate a schedule without contention: per-position ready times propagated stage by stage with numpy."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from netmodels.algorithms import Schedule, Stage

# (stage) -> (duration of each transfer, reduction time the receiver of each transfer pays)
CostFn = Callable[[Stage], tuple[np.ndarray, np.ndarray]]


def run_schedule(
    schedule: Schedule,
    start: np.ndarray,
    cost: CostFn,
    local_delay: float | int = 0,
    count_sends: bool = True,
) -> np.ndarray:
    """Finish time of every position, given each position's start time; no link is ever shared."""
    finish = start.copy()
    for channel in schedule.channels:
        ready = start.copy()
        done = start.copy()
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
            ):
                # Uniform cycle: every position sends and receives once per step with equal costs, so
                # all repeats collapse to one multiplication (the closed form, exact in integers too).
                step = dur[0] + red[0]
                t0 = ready[0]
                ready = np.full_like(ready, t0 + stage.repeat * step)
                if count_sends:
                    done = np.maximum(done, t0 + (stage.repeat - 1) * step + dur[0])
                continue
            for _ in range(stage.repeat):
                arrive = ready[stage.src] + dur
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
) -> np.ndarray:
    """Run `chunks` chunks (schedule_of(c)) with at most `in_flight` in flight per position; finish times."""
    finishes: list[np.ndarray] = []
    overall = t0.copy()
    for c in range(chunks):
        begin = t0 if c < in_flight else np.maximum(t0, finishes[c - in_flight])
        f = run_schedule(schedule_of(c), begin, cost, local_delay, count_sends)
        finishes.append(f)
        overall = np.maximum(overall, f)
    return overall
