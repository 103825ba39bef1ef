"""Exception types of the replay engine; every message names the rank and node (id and name) involved."""

from __future__ import annotations

from dataclasses import dataclass

from xsim.traces.errors import TraceError, XsimError


class ReplayError(XsimError):
    """A trace set cannot be replayed as given (mismatched P2P sizes, unknown group, bad config, ...)."""


class TraceGraphError(TraceError, ReplayError):
    """A rank's graph cannot run: duplicate ids, a data dependency on a missing node, a cycle, bad comm attrs."""


class FoldRefused(ReplayError):
    """A fold could not be proven (replicas differ, a model times them apart): `simulate(fold="auto")`
    then replays unfolded and reports this message as the reason."""


class DeviceProfileError(ReplayError):
    """A device-profile file or a speed factor is malformed."""


@dataclass(frozen=True)
class StuckNode:
    """The first blocked node of one rank when a replay deadlocks, and what it waits for."""

    rank: int
    node_id: int
    name: str
    waits_for: str

    def render(self) -> str:
        """One line: rank, node and the reason."""
        return f"rank {self.rank}: node {self.node_id} {self.name!r} waits for {self.waits_for}"


class ReplayDeadlock(ReplayError):
    """Nothing can progress but nodes remain; `stuck` lists each stuck rank's first blocked node."""

    MAX_LISTED = 16

    def __init__(
        self, time_ns: int, remaining: int, stuck: list[StuckNode], where: str | None = None
    ) -> None:
        self.time_ns = time_ns
        self.remaining = remaining
        self.stuck = stuck
        self.where = where  # the trace set, when the caller knows it
        shown = stuck[: self.MAX_LISTED]
        # One line (the CLI prints one `xsim: error:` line per failure): the stuck ranks follow the count.
        parts = [s.render() for s in shown]
        if len(stuck) > len(shown):
            parts.append(f"... and {len(stuck) - len(shown)} more rank(s)")
        head = f"deadlock at t={time_ns} ns: {remaining} node(s) on {len(stuck)} rank(s) can never run"
        if where is not None:
            head = f"{where}: {head}"
        super().__init__(f"{head}: {'; '.join(parts)}" if parts else head)
