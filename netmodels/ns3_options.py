"""The `ns3` model's options as one frozen dataclass (choices and defaults: netmodels/ns3_defaults.py): stdlib only.

The command line (`--ns3-*` flags of `xsim replay` and `xsim net`) and the library (`NetworkOptions.ns3`)
build an `Ns3Options`; netmodels/ns3.py takes its fields as keyword arguments. Kept apart from ns3.py so
that parsing and validating them never loads numpy, the flow model or ns-3 itself (start-up, and core
xsim never imports ns-3).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from xsim.netmodels.errors import NetworkModelError
from xsim.netmodels.ns3_defaults import (  # noqa: F401 (re-exported: the option names and defaults)
    DEFAULT_MAX_PACKETS,
    DEFAULT_MIN_RTO_NS,
    DEFAULT_QUEUE,
    DEFAULT_QUEUE_PACKETS,
    DEFAULT_TCP,
    QUEUE_DISCS,
    TCP_VARIANTS,
)


@dataclass(frozen=True)
class Ns3Options:
    """How ns-3 runs the packets (docs/netmodels.md, "`ns3`"); every default stated here."""

    tcp: str = DEFAULT_TCP  # congestion control: newreno, cubic, dctcp (dctcp needs queue "red")
    queue: str = DEFAULT_QUEUE  # queue discipline of every device: fifo, red, fq_codel
    queue_packets: int = DEFAULT_QUEUE_PACKETS  # each queue disc's capacity in packets
    max_packets: int = DEFAULT_MAX_PACKETS  # per-run limit on data segments (the guard)
    min_rto_ns: int = DEFAULT_MIN_RTO_NS  # TCP's minimum retransmission timeout
    ecmp: bool = True  # spread packets over equal-cost paths (ns-3's per-packet random ECMP)

    def __post_init__(self) -> None:
        check_ns3_options(self)

    def kwargs(self) -> dict:
        """The options as Ns3Model's keyword arguments."""
        return asdict(self)

    def is_default(self) -> bool:
        """True when every option keeps its default (then no other model contradicts them)."""
        return self == Ns3Options()


def check_ns3_options(o: Ns3Options) -> None:
    """One error line for an unknown name, a bad combination or a non-positive count."""
    if o.tcp not in TCP_VARIANTS:
        raise NetworkModelError(f"ns3: unknown tcp {o.tcp!r} (known: {', '.join(TCP_VARIANTS)})")
    if o.queue not in QUEUE_DISCS:
        raise NetworkModelError(f"ns3: unknown queue {o.queue!r} (known: {', '.join(QUEUE_DISCS)})")
    if o.tcp == "dctcp" and o.queue != "red":
        raise NetworkModelError("ns3: tcp dctcp needs ECN marking: use queue red")
    for f in fields(o):
        v = getattr(o, f.name)
        if f.name in ("tcp", "queue"):
            continue
        if f.name == "ecmp":
            if not isinstance(v, bool):
                raise NetworkModelError(f"ns3: ecmp must be true or false, got {v!r}")
        elif not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise NetworkModelError(f"ns3: {f.name} must be a positive integer, got {v!r}")
