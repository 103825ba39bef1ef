"""The `ns3` model's choices and defaults: constants only, for the command line's `--ns3-*` flags.

Apart from the options class (netmodels/ns3_options.py, which re-exports them) so that building a verb's
parser defines no dataclass (a dataclass is several compiles when its module loads, paid by every `xsim
replay`: docs/performance.md, issue 30 round 6).
"""

from __future__ import annotations

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
