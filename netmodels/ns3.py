"""The `ns3` model: packet-level simulation by the real ns-3 simulator (PyPI package `ns3`, optional extra).

The collective schedules, chunking and stage progress are the flow model's (netmodels/flow.py): this model
subclasses it and replaces only what a transfer is. In `flow` a transfer is a fluid flow with a max-min fair
rate; here it is an ns-3 application flow of its bytes (BulkSend over TCP to a PacketSink) through the same
topology built as ns-3 nodes, point-to-point devices, channels and queue discs. ns-3 owns the clock while
flows are in flight: the engine asks `next_event_ns` (ns-3's next scheduled event, peeked through the
scheduler in netmodels/ns3_glue.h) and `advance` runs ns-3 to it; a flow whose sink has all its bytes stops
ns-3 at that instant so that the schedule's next sends start exactly then.

Everything in the topology runs as packets, NVLink/NVSwitch links included (ns-3 adds nothing physical
there, but one uniform fabric keeps every route's contention in one simulator; docs/netmodels.md).
ns-3 is a process-wide singleton: one model of this kind at a time per process (a new one destroys the old
simulation). Core xsim never imports this module; the registry builds it only for `--model ns3`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from xsim.netmodels import ns3_defaults as defaults
from xsim.netmodels.errors import NetworkModelError
from xsim.netmodels.flow import FlowModel
from xsim.netmodels.ns3_options import Ns3Options
from xsim.netmodels.topology import GPU, Topology

EXTRA_HINT = "the ns3 model needs the optional extra: pip install 'xsim-replay[ns3]' (from a checkout: pip install -e '.[ns3]')"

# MTU of ns-3's PointToPointNetDevice (1500 B, its Mtu attribute default); a TCP segment carries MTU minus
# the IPv4 header (20 B) and the TCP header with the timestamp option ns-3 sends by default (20 + 12 B).
MTU = 1500
SEGMENT = MTU - 20 - 32
# Interface metric added to a GPU's links: routes never transit a GPU, as in Topology.route.
_GPU_METRIC = 1000
# TCP send/receive buffers (bytes): far above any fabric's bandwidth-delay product here (400 Gb/s x 10 us =
# 500 kB), so the window never limits a flow; ns-3's default of 128 KiB would.
_SOCKET_BUFFER = 1 << 24

_ns = None


def _load():
    """Import ns-3 (and compile the glue once); one error line naming the extra when it is absent."""
    global _ns
    if _ns is None:
        try:
            from ns import ns  # the `ns3` wheel's cppyy binding
        except ImportError:
            raise NetworkModelError(EXTRA_HINT) from None
        import cppyy

        with open(os.path.join(os.path.dirname(__file__), "ns3_glue.h")) as fh:
            cppyy.cppdef(fh.read())
        _ns = ns
    return _ns


def available() -> bool:
    """True when the `ns3` package imports (tests skip otherwise)."""
    try:
        _load()
    except NetworkModelError:
        return False
    return True


@dataclass(frozen=True)
class Ns3Stats:
    """ns-3's own counters for a run: what the flow model cannot show."""

    flows: int  # ns-3 application flows started
    segments: int  # data segments those flows needed (bytes / SEGMENT, rounded up per flow)
    enqueued: int  # packets enqueued in all queue discs (data and ACKs, every hop)
    dropped: int  # packets the queue discs dropped
    max_queue_packets: int  # deepest any queue disc got, in packets
    retransmissions: int  # data segments TCP sent again (fast retransmit or timeout)

    def line(self) -> str:
        """The counters as the command line prints them."""
        return (
            f"ns-3: {self.flows:,} TCP flows, {self.segments:,} data segments, {self.enqueued:,} packets "
            f"queued, {self.dropped:,} dropped, deepest queue {self.max_queue_packets:,} packets, "
            f"{self.retransmissions:,} retransmissions"
        )


class Ns3Model(FlowModel):
    """Packet-level model: the flow model's schedules, each transfer an ns-3 TCP flow of its bytes."""

    name = "ns3"

    def __init__(
        self,
        topology: Topology,
        chunks: int = 1,
        chunks_in_flight: int = 1,
        endpoint_delay_ns: float | str = 0.0,
        reduction_bandwidth: float | str | None = None,
        algorithms: Mapping[str, str] | None = None,
        tcp: str = defaults.DEFAULT_TCP,
        queue: str = defaults.DEFAULT_QUEUE,
        queue_packets: int = defaults.DEFAULT_QUEUE_PACKETS,
        max_packets: int = defaults.DEFAULT_MAX_PACKETS,
        ecmp: bool = True,
        min_rto_ns: int = defaults.DEFAULT_MIN_RTO_NS,
    ) -> None:
        # Checked before ns-3 loads (a bad option is one line, ~90 s sooner).
        Ns3Options(
            tcp=tcp,
            queue=queue,
            queue_packets=queue_packets,
            max_packets=max_packets,
            min_rto_ns=min_rto_ns,
            ecmp=ecmp,
        )
        ns = _load()
        super().__init__(
            topology, chunks, chunks_in_flight, endpoint_delay_ns, reduction_bandwidth, algorithms
        )
        self.tcp, self.queue, self.queue_packets, self.max_packets = tcp, queue, queue_packets, max_packets
        self._ns = ns
        self._g = _glue()
        self._flows: dict[int, tuple[tuple, float]] = {}  # ns-3 flow id -> (record, delay after landing)
        self._segments = 0
        self._ports: dict[str, int] = {}  # destination device -> last port used
        self.min_rto_ns = min_rto_ns
        self._build(ecmp)

    # ----- building the fabric -------------------------------------------------------------------------
    def _build(self, ecmp: bool) -> None:
        ns, g, topo = self._ns, self._g, self.topology
        ns.Simulator.Destroy()
        g.Reset()
        g.PeekScheduler.GetTypeId()  # registers the TypeId (cling runs no static registration)
        sched = ns.ObjectFactory()
        sched.SetTypeId("xsim_ns3::PeekScheduler")
        ns.Simulator.SetScheduler(sched)
        cfg = ns.Config.SetDefault
        cfg(
            "ns3::TcpL4Protocol::SocketType",
            ns.TypeIdValue(ns.TypeId.LookupByName(defaults.TCP_VARIANTS[self.tcp])),
        )
        cfg("ns3::TcpSocket::SegmentSize", ns.UintegerValue(SEGMENT))
        cfg("ns3::TcpSocket::SndBufSize", ns.UintegerValue(_SOCKET_BUFFER))
        cfg("ns3::TcpSocket::RcvBufSize", ns.UintegerValue(_SOCKET_BUFFER))
        cfg("ns3::Ipv4GlobalRouting::RandomEcmpRouting", ns.BooleanValue(ecmp))
        cfg("ns3::TcpSocketBase::MinRto", ns.TimeValue(ns.NanoSeconds(self.min_rto_ns)))
        if self.tcp == "dctcp":
            cfg("ns3::TcpSocketBase::UseEcn", ns.StringValue("On"))
            cfg("ns3::RedQueueDisc::UseEcn", ns.BooleanValue(True))
            cfg("ns3::RedQueueDisc::UseHardDrop", ns.BooleanValue(False))
        graph = topo.graph
        names = list(graph.nodes)
        nodes = ns.NodeContainer()
        nodes.Create(len(names))
        self._node = {x: nodes.Get(i) for i, x in enumerate(names)}
        stack = ns.InternetStackHelper()
        stack.Install(nodes)
        # Fixed random streams (ECMP's path choice, RED's drops): ns-3 numbers streams process-wide in
        # creation order, so without this a model's results would depend on the models built before it.
        stream = int(stack.AssignStreams(nodes, 0))
        tch = ns.TrafficControlHelper()
        size = ns.QueueSizeValue(ns.QueueSize(f"{self.queue_packets}p"))
        tch.SetRootQueueDisc(defaults.QUEUE_DISCS[self.queue], "MaxSize", size)
        addr = ns.Ipv4AddressHelper()
        addr.SetBase(ns.Ipv4Address("10.0.0.0"), ns.Ipv4Mask("255.255.255.252"))
        p2p = ns.PointToPointHelper()
        self._qdiscs = []
        self._ip: dict[str, object] = {}
        done: set[tuple[str, str]] = set()
        for u, v, d in graph.edges(data=True):
            if (u, v) in done:
                continue
            back = graph[v][u] if graph.has_edge(v, u) else None
            if back is None:
                raise NetworkModelError(f"ns3: link {u}->{v} has no reverse link (ns-3 channels are duplex)")
            if float(back["latency_ns"]) != float(d["latency_ns"]):
                raise NetworkModelError(f"ns3: links {u}<->{v} differ in latency (one ns-3 channel each)")
            done.update(((u, v), (v, u)))
            p2p.SetChannelAttribute("Delay", ns.TimeValue(ns.NanoSeconds(round(float(d["latency_ns"])))))
            pair = ns.NodeContainer()
            pair.Add(self._node[u])
            pair.Add(self._node[v])
            devs = p2p.Install(pair)
            # Each direction at its own rate (bytes/s x 8 = bit/s).
            for i, attrs in ((0, d), (1, back)):
                devs.Get(i).SetAttribute(
                    "DataRate", ns.DataRateValue(ns.DataRate(int(attrs["bandwidth"] * 8)))
                )
            qd = tch.Install(devs)
            for i in range(2):
                q = qd.Get(i)
                g.WatchQueue(q)
                stream += int(g.AssignQueueStreams(q, stream))
                self._qdiscs.append(q)
            ifs = addr.Assign(devs)
            addr.NewNetwork()
            for i, (a, attrs) in enumerate(((u, d), (v, back))):
                ipv4 = self._node[a].GetObject[ns.Ipv4]()
                k = ifs.Get(i).second
                # Routing cost as Topology.route's: 1 on scale-up links, 2 elsewhere, never through a GPU.
                metric = 1 if attrs.get("kind") == "scaleup" else 2
                if graph.nodes[a].get("kind") == GPU:
                    metric += _GPU_METRIC
                ipv4.SetMetric(k, metric)
                self._ip.setdefault(a, ifs.GetAddress(i))
        ns.Ipv4GlobalRoutingHelper.PopulateRoutingTables()

    # ----- transfers as ns-3 flows -----------------------------------------------------------------------
    def _settle(self) -> None:
        """Start every transfer issued at the current time as an ns-3 flow of its bytes."""
        if not self._new_recs:
            return
        ns, g, links = self._ns, self._g, self.topology.links
        # ns-3 idles while no flow of ours is in flight (old connections' timers stay queued): bring its
        # clock to the start time first, so its next event is never before the engine's now.
        if not self._flows:
            g.RunUntil(math.floor(self._t + 1e-6))
        now = self._ns3_now()
        start = max(0, math.ceil(self._t - 1e-6) - now)
        for rec, flow in zip(self._new_recs, self._new_flows, strict=True):
            nbytes, path, _, lat, _ = self._flow_info(flow)
            route_lat = float(self.topology.link_latency[path].sum())
            src, dst = links[int(path[0])][0], links[int(path[-1])][1]
            n = int(nbytes)
            self._segments += -(-n // SEGMENT)
            if self._segments > self.max_packets:
                raise NetworkModelError(
                    f"ns3: the run needs more than max_packets={self.max_packets:,} data packets "
                    f"({self._segments:,} so far); raise it (--ns3-max-packets N) or use --model flow"
                )
            port = self._ports.get(dst, 0) + 1
            if port > 65535:
                raise NetworkModelError(f"ns3: more than 65,535 flows into {dst} (one port each)")
            self._ports[dst] = port
            sink = (
                ns.PacketSinkHelper(
                    "ns3::TcpSocketFactory", ns.InetSocketAddress(ns.Ipv4Address.GetAny(), port).ConvertTo()
                )
                .Install(self._node[dst])
                .Get(0)
            )
            bulk = ns.BulkSendHelper(
                "ns3::TcpSocketFactory", ns.InetSocketAddress(self._ip[dst], port).ConvertTo()
            )
            bulk.SetAttribute("MaxBytes", ns.UintegerValue(n))
            bulk.SetAttribute("SendSize", ns.UintegerValue(SEGMENT))
            app = bulk.Install(self._node[src]).Get(0)
            app.SetStartTime(ns.NanoSeconds(start))
            g.WatchSender(app, start)
            last = int(path[-1])
            rate = float(self.topology.link_bandwidth[last])  # bytes/ns
            # Payload that may already be past the last link's serializer: its propagation delay's worth
            # plus the packet being serialized, rounded up to whole segments (+1 for safety).
            pipe = (math.ceil(float(self.topology.link_latency[last]) * rate / MTU) + 2) * SEGMENT
            fid = g.AddFlow(sink, n, rate, pipe)
            # What the flow model adds to a landing beyond the route's latency (endpoint delay, protocol
            # extras); the route latency itself is in ns-3's channels.
            self._flows[fid] = (rec, max(0.0, lat - route_lat))
        self._new_recs = []
        self._new_flows = []

    def _ns3_now(self) -> int:
        return int(self._ns.Simulator.Now().GetNanoSeconds())

    def _next_time(self) -> float | None:
        t = self._heap[0][0] if self._heap else None
        if self._flows:
            nxt = int(self._g.NextEventNs())
            if nxt >= 0:
                nxt = max(nxt, math.ceil(self._t - 1e-6))
                # No flow completes before its byte bound: ns-3 runs to there without Python stepping.
                nxt = max(nxt, int(self._g.CompletionBoundNs()))
                t = float(nxt) if t is None else min(t, float(nxt))
        return t

    def _step(self, t: float) -> None:
        if self._flows:
            self._g.RunUntil(math.floor(t + 1e-6))
            finished = list(self._g.Take())
            if finished:
                t = float(self._ns3_now())
                for fid in finished:
                    rec, extra = self._flows.pop(int(fid))
                    self._push_land(float(self._g.DoneNs(int(fid))) + extra, rec)
        super()._step(t)

    # ----- ns-3's own statistics -------------------------------------------------------------------------
    def stats(self) -> Ns3Stats:
        """Counters from ns-3's queue discs for everything run so far."""
        enq = drop = 0
        for q in self._qdiscs:
            s = q.GetStats()
            enq += int(s.nTotalEnqueuedPackets)
            drop += int(s.nTotalDroppedPackets)
        g = self._g
        if int(g.Unwatched()):
            raise NetworkModelError(f"ns3: {int(g.Unwatched())} senders' retransmissions could not be traced")
        return Ns3Stats(
            int(g.FlowCount()), self._segments, enq, drop, int(g.MaxQueue()), int(g.Retransmissions())
        )


def _glue():
    import cppyy

    return cppyy.gbl.xsim_ns3
