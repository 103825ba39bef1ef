"""The interface between the replay engine and every network model: specs, completions, the protocol."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from xsim.netmodels.errors import AlgorithmError, NetworkModelError, RankError

COLLECTIVE_KINDS: tuple[str, ...] = (
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "all_to_all",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "barrier",
)
ROOTED_KINDS: frozenset[str] = frozenset({"broadcast", "reduce", "gather", "scatter"})


@dataclass(frozen=True)
class CollectiveSpec:
    """One collective over a process group; `size_bytes` follows Chakra's comm_size semantics."""

    kind: str
    size_bytes: int
    ranks: tuple[int, ...]
    algorithm: str | None = None
    root: int | None = None


@dataclass(frozen=True)
class Completion:
    """A finished collective or P2P transfer: the handle start_* returned and its finish times (ns)."""

    handle: int
    finish_ns: int
    per_rank_finish_ns: tuple[int, ...]


@runtime_checkable
class NetworkModel(Protocol):
    """What the replay engine calls: start transfers at now_ns, ask for the next event, advance."""

    name: str
    num_ranks: int

    def start_collective(self, now_ns: int, spec: CollectiveSpec) -> int:
        """Start a collective whose members have all arrived at now_ns; returns its handle."""
        ...

    def start_p2p(self, now_ns: int, src: int, dst: int, size_bytes: int) -> int:
        """Start a point-to-point transfer of size_bytes from src to dst at now_ns; returns its handle."""
        ...

    def next_event_ns(self) -> int | None:
        """Earliest time at which something inside the model happens, None when idle."""
        ...

    def advance(self, until_ns: int) -> list[Completion]:
        """Process internal events with time <= until_ns; return completions in deterministic order."""
        ...


# Optional abilities: protocols a model may implement beside NetworkModel. The engine asks for them with
# isinstance (replay/network_port.py) and uses them when present; docs/netmodels.md says when each applies.


@runtime_checkable
class FixedDurations(Protocol):
    """A contention-free model: a transfer's time depends on the transfer alone, so the engine ends its
    nodes at start + that time itself and never starts the transfer on the model (`analytical`)."""

    def fixed_collective_ns(self, spec: CollectiveSpec) -> int:
        """Start to the last member's finish of `spec` on an otherwise idle network."""
        ...

    def fixed_p2p_ns(self, src: int, dst: int, size_bytes: int) -> int:
        """Start to finish of one point-to-point transfer on an otherwise idle network."""
        ...


@runtime_checkable
class TimingClasses(Protocol):
    """A contention-free model that names which collectives it times alike, and whose memo tables depend on
    the transfers alone (no clock, no pending transfer): folding (replay/fold.py) proves a replica's copy of
    a collective by its class instead of timing it, and a private copy of the model shares the tables."""

    def timing_key(self, spec: CollectiveSpec) -> object | None:
        """A hashable key, equal for collectives this model times alike position by position, or None."""
        ...

    def memo_tables(self) -> tuple[object, ...]:
        """The model's memo tables (shared by a copy of the model made for checking)."""
        ...


@runtime_checkable
class StaggeredStarts(Protocol):
    """A model with no barrier across a collective's members: each starts at its own issue time
    (ASTRA-sim's congestion-unaware mode)."""

    def start_collective_issued(self, now_ns: int, spec: CollectiveSpec, issue_ns: tuple[int, ...]) -> int:
        """Start a collective whose last member issues at now_ns, given every member's issue time."""
        ...


@runtime_checkable
class MemberFinishes(Protocol):
    """A model that learns a collective's member finishes one by one (ASTRA-sim's congestion-aware mode)."""

    def member_finishes(self) -> list[tuple[int, int, int]]:
        """(handle, position in spec.ranks, finish ns) of the members finished since the previous call."""
        ...


@runtime_checkable
class QuietLookahead(Protocol):
    """A model with internal events that complete nothing (ASTRA-sim's congestion-aware event loop): told when
    the replay's next node finishes, it runs those events ahead instead of being advanced to each one."""

    def next_event_quiet(self, horizon_ns: int | None) -> int | None:
        """next_event_ns(), after running internal events before horizon_ns (the replay's next node finish,
        None when no node is pending) until one completes something."""
        ...


@runtime_checkable
class MemberStarts(Protocol):
    """A model that must see each member of a collective as it issues (an event loop that cannot go back
    in time: ASTRA-sim's congestion-aware mode); used when `starts_members` is True."""

    @property
    def starts_members(self) -> bool:
        """True when members are to be started one by one (open_collective, issue_member)."""
        ...

    def open_collective(self, now_ns: int, spec: CollectiveSpec) -> int:
        """The first member issues at now_ns; returns the collective's handle."""
        ...

    def issue_member(self, now_ns: int, handle: int, pos: int) -> None:
        """Member `pos` (index in spec.ranks) of collective `handle` issues at now_ns."""
        ...


def ceil_ns(t: float) -> int:
    """Round a float time in ns up to an integer ns, forgiving float noise below 1e-6 ns."""
    return int(math.ceil(t - 1e-6))


def validate_spec(spec: CollectiveSpec, num_ranks: int) -> tuple[int, ...]:
    """Check a collective spec against a model's rank count; returns the group's ranks."""
    if spec.kind not in COLLECTIVE_KINDS:
        raise AlgorithmError(f"unknown collective kind {spec.kind!r} (known: {', '.join(COLLECTIVE_KINDS)})")
    check_size(spec.size_bytes)
    ranks = tuple(int(r) if is_int(r) else r for r in spec.ranks)
    if not ranks:
        raise RankError("collective has an empty process group")
    validate_ranks(ranks, num_ranks)
    if len(set(ranks)) != len(ranks):
        raise RankError(f"process group repeats a rank: {list(ranks)}")
    if spec.root is not None and spec.root not in ranks:
        raise RankError(f"root rank {spec.root} is not in the process group {list(ranks)}")
    return ranks


def validate_ranks(ranks: Sequence[int], num_ranks: int) -> None:
    """Raise RankError when any rank lies outside [0, num_ranks)."""
    for r in ranks:
        if not is_int(r) or r < 0 or r >= num_ranks:
            raise RankError(f"rank {r!r} is outside the topology (ranks 0..{num_ranks - 1})")


def is_int(x: object) -> bool:
    """True for Python and numpy integers (not bools)."""
    # A plain int first: the ABC check costs ~1 us (Integral.__instancecheck__), once per flow-model start.
    return type(x) is int or (isinstance(x, numbers.Integral) and not isinstance(x, bool))


def check_size(size_bytes: object) -> None:
    """Raise NetworkModelError unless size_bytes is a non-negative integer."""
    if not is_int(size_bytes) or size_bytes < 0:
        raise NetworkModelError(f"transfer size must be a non-negative integer, got {size_bytes!r}")


def root_index(spec: CollectiveSpec) -> int:
    """Index of the root within spec.ranks (ranks[0] when no root is given)."""
    return 0 if spec.root is None else spec.ranks.index(spec.root)


def _run_until(model: NetworkModel, handle: int, what: str) -> Completion:
    """Advance an otherwise idle model until `handle` completes."""
    while True:
        t = model.next_event_ns()
        if t is None:
            raise NetworkModelError(f"model {model.name!r} went idle before {what} {handle} completed")
        for c in model.advance(t):
            if c.handle == handle:
                return c


def simulate_collective(model: NetworkModel, spec: CollectiveSpec) -> Completion:
    """Start one collective at t=0 on an idle model and run it to completion."""
    return _run_until(model, model.start_collective(0, spec), "collective")


def simulate_p2p(model: NetworkModel, src: int, dst: int, size_bytes: int) -> Completion:
    """Start one point-to-point transfer at t=0 on an idle model and run it to completion."""
    return _run_until(model, model.start_p2p(0, src, dst, size_bytes), "transfer")
