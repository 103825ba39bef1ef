"""The `ns3` model's options as one frozen dataclass, with their defaults: imports nothing but the stdlib.

The command line (`--ns3-*` flags of `xsim replay` and `xsim net`) and the library (`NetworkOptions.ns3`)
build an `Ns3Options`; netmodels/ns3.py takes its fields as keyword arguments. Kept apart from ns3.py so
that parsing and validating them never loads numpy, the flow model or ns-3 itself (start-up, and core
xsim never imports ns-3).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from xsim.netmodels.errors import NetworkModelError

# TCP variants by option name -> ns-3 TypeId (ns-3 model library, "TCP models in ns-3"). ns-3 3.44 has
# no DCQCN / RoCE module, so no DCQCN-like option (issue 29: only if an existing ns-3 module provides it);
# DCTCP is its ECN-based datacenter congestion control.
TCP_VARIANTS = {"newreno": "ns3::TcpNewReno", "cubic": "ns3::TcpCubic", "dctcp": "ns3::TcpDctcp"}
# Root queue discs by option name -> ns-3 TypeId (ns-3 traffic-control module).
QUEUE_DISCS = {"fifo": "ns3::FifoQueueDisc", "red": "ns3::RedQueueDisc", "fq_codel": "ns3::FqCoDelQueueDisc"}
DEFAULT_TCP = "newreno"  # ns-3's own default TCP (TcpL4Protocol::SocketType)
DEFAULT_QUEUE = "fifo"  # what ns-3's PointToPoint examples install: a drop-tail FIFO
# Queue disc capacity per device in packets: ns-3's own default for FifoQueueDisc (1000p, its MaxSize).
DEFAULT_QUEUE_PACKETS = 1000
# Per-run limit on data segments (the packet-count guard): ns-3 here costs ~100-500 us of CPU per data
# segment, its hops and ACK included (scripts/bench_ns3.py, docs/performance.md), so 2e6 segments bound a
# run to minutes of CPU.
DEFAULT_MAX_PACKETS = 2_000_000
# TCP's minimum retransmission timeout: ns-3's default (TcpSocketBase::MinRto, 1 s, RFC 6298's floor).
# Datacenter stacks lower it (e.g. Linux's 200 ms, or less); an incast tail waits this out.
DEFAULT_MIN_RTO_NS = 1_000_000_000


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
