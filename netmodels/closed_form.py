"""Bookkeeping shared by the models that know a transfer's finish time the moment it starts.

Its own module so that ASTRA-sim mode (netmodels/astra.py) does not import the topology layer and networkx.
"""

from __future__ import annotations

import heapq

from xsim.netmodels.api import Completion, is_int
from xsim.netmodels.errors import NetworkModelError


class ClosedFormModel:
    """Shared bookkeeping of models that know a transfer's finish time the moment it starts."""

    name = "closed-form"
    num_ranks = 0

    def __init__(self) -> None:
        self._pending: list[tuple[int, int, Completion]] = []
        self._next_handle = 0
        self._last_now = 0

    def _check_now(self, now_ns: int) -> int:
        if type(now_ns) is int and now_ns >= self._last_now:  # the engine's case, without the ABC check
            self._last_now = now_ns
            return now_ns
        if not is_int(now_ns) or now_ns < self._last_now:
            raise NetworkModelError(
                f"start times must be non-decreasing integers (got {now_ns} after {self._last_now})"
            )
        self._last_now = int(now_ns)
        return self._last_now

    def _register(self, per_rank: tuple[int, ...]) -> int:
        handle = self._next_handle
        self._next_handle += 1
        finish = max(per_rank)
        heapq.heappush(self._pending, (finish, handle, Completion(handle, finish, per_rank)))
        return handle

    def next_event_ns(self) -> int | None:
        """Earliest pending completion time, None when idle."""
        return self._pending[0][0] if self._pending else None

    def advance(self, until_ns: int) -> list[Completion]:
        """Return the completions with finish_ns <= until_ns, ordered by (finish_ns, handle)."""
        out = []
        while self._pending and self._pending[0][0] <= until_ns:
            out.append(heapq.heappop(self._pending)[2])
        return out
