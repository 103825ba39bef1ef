"""`--model ns3`: the real ns-3 simulator as the packet-level network (optional extra `ns3`).

The ns-3 tests skip, with the reason, where the `ns3` package does not import. Expected numbers are closed
forms of what a packet network adds to the flow model's fluid time: per-packet headers (IPv4 20 B, TCP with
timestamps 32 B, PPP 2 B: 1502 B on the wire per 1448 B segment), one store-and-forward packet time per hop
after the first, and TCP's handshake and slow start (bounded by a few round trips).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from xsim.netmodels.api import CollectiveSpec, simulate_collective, simulate_p2p
from xsim.netmodels.digraph import DiGraph
from xsim.netmodels.errors import NetworkModelError
from xsim.netmodels.flow import FlowModel
from xsim.netmodels.models import REGISTRY, build_model
from xsim.netmodels.ns3_options import Ns3Options
from xsim.netmodels.topology import Topology, add_duplex, switch_topology

ns3mod = pytest.importorskip("xsim.netmodels.ns3")
HAVE_NS3 = ns3mod.available()
needs_ns3 = pytest.mark.skipif(
    not HAVE_NS3, reason="the `ns3` package is not installed (pip install 'xsim-replay[ns3]')"
)

BW = 12.5e9  # 100 Gb/s in bytes/s
LAT = 500.0  # ns per link
WIRE = 1502 / 1448  # bytes on the wire per payload byte (full segments)


def test_registry_entry():
    info = REGISTRY["ns3"]
    assert info.factory == "xsim.netmodels.ns3:Ns3Model"
    assert not info.capabilities.contention_free and not info.capabilities.foldable


def test_missing_extra_is_one_line(monkeypatch):
    monkeypatch.setattr(ns3mod, "_ns", None)
    monkeypatch.setitem(sys.modules, "ns", None)  # `from ns import ns` raises ImportError
    with pytest.raises(NetworkModelError) as exc:
        build_model("ns3", switch_topology(2, BW, LAT))
    assert (
        str(exc.value)
        == "the ns3 model needs the optional extra: pip install 'xsim-replay[ns3]' (from a checkout: pip install -e '.[ns3]')"
    )


def test_core_never_imports_ns3():
    code = (
        "import sys, xsim.cli, netmodels.models, netmodels.flow, replay.engine\n"
        "bad = [m for m in ('ns', 'cppyy', 'xsim.netmodels.ns3') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bad_options_are_one_line():
    """Checked before ns-3 loads: runs without the extra too."""
    topo = switch_topology(2, BW, LAT)
    with pytest.raises(NetworkModelError, match="unknown tcp 'vegas'"):
        build_model("ns3", topo, tcp="vegas")
    with pytest.raises(NetworkModelError, match="dctcp needs ECN"):
        build_model("ns3", topo, tcp="dctcp")
    with pytest.raises(NetworkModelError, match="max_packets must be a positive integer, got 0"):
        build_model("ns3", topo, max_packets=0)


def test_options_dataclass_defaults():
    """The defaults the docs state: ns-3's own (NewReno, 1000-packet FIFO, 1 s MinRto), ECMP on."""
    o = Ns3Options()
    assert (o.tcp, o.queue, o.queue_packets, o.max_packets, o.min_rto_ns, o.ecmp) == (
        "newreno",
        "fifo",
        1000,
        2_000_000,
        1_000_000_000,
        True,
    )
    assert o.is_default() and Ns3Options(tcp="cubic").kwargs()["tcp"] == "cubic"
    with pytest.raises(NetworkModelError, match="unknown queue 'codel'"):
        Ns3Options(queue="codel")


def test_cli_flags_become_options():
    """`--ns3-*` flags of `xsim replay` and `xsim net collective` -> NetworkOptions.ns3 (None when absent)."""
    from xsim.cli import build_parser
    from xsim.verbs import network_options

    parser = build_parser()
    flags = [
        "--ns3-tcp", "dctcp", "--ns3-queue", "red", "--ns3-queue-packets", "20",
        "--ns3-max-packets", "5000", "--ns3-min-rto", "200us", "--ns3-no-ecmp",
    ]  # fmt: skip
    want = Ns3Options("dctcp", "red", 20, 5000, 200_000, False)
    net = ["net", "collective", "--collective", "all_reduce", "--size", "1MB", "--model", "ns3"]
    for argv in (["replay", "set", "--model", "ns3", *flags], [*net, *flags]):
        assert network_options(parser.parse_args(argv)).ns3 == want
    assert network_options(parser.parse_args(["replay", "set"])).ns3 is None


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["--model", "flow", "--ns3-tcp", "cubic"],
            "xsim: error: the --ns3-* options are options of --model ns3, not of --model flow",
        ),
        (
            ["--model", "ns3", "--ns3-tcp", "dctcp"],
            "xsim: error: ns3: tcp dctcp needs ECN marking: use queue red",
        ),
        (
            ["--model", "ns3", "--ns3-max-packets", "0"],
            "xsim: error: ns3: max_packets must be a positive integer, got 0",
        ),
        (
            ["--model", "ns3", "--ns3-min-rto", "1.5ns"],
            "xsim: error: --ns3-min-rto must be whole nanoseconds, got '1.5ns'",
        ),
    ],
)
def test_cli_bad_ns3_flags_are_one_line(argv, line, capsys):
    """Refused before any ns-3 work (and without the extra): exit 2, one line."""
    from xsim.cli import main

    rc = main(
        [
            "net",
            "p2p",
            "--topology",
            "switch:2:100Gbps:500ns",
            "--src",
            "0",
            "--dst",
            "1",
            "--size",
            "1MB",
            *argv,
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and err == line + "\n"


@needs_ns3
def test_one_transfer_agrees_with_flow():
    """10 MB across one switch: the fluid time x header overhead, plus handshake and slow start."""
    topo = switch_topology(2, BW, LAT)
    n = 10_000_000
    flow = simulate_p2p(FlowModel(topo), 0, 1, n).finish_ns
    assert flow == 1000 + 800_000  # two links of 500 ns + 10 MB at 12.5 B/ns
    t = simulate_p2p(build_model("ns3", topo), 0, 1, n).finish_ns
    lower = 1000 + n * WIRE / 12.5  # every payload byte carries its share of headers
    rtt = 4 * LAT + 2 * 1502 / 12.5  # data out and ACK back over two links each
    # handshake (1 RTT) + slow start from 10 segments to the 25 kB bandwidth-delay product (< 2 RTT)
    assert lower <= t <= lower + 3 * rtt + 2 * 1502 / 12.5
    assert 1.03 < t / flow < 1.045


@needs_ns3
def test_packet_guard():
    topo = switch_topology(2, BW, LAT)
    m = build_model("ns3", topo, max_packets=100)
    with pytest.raises(NetworkModelError, match="max_packets=100"):
        simulate_p2p(m, 0, 1, 1_000_000)  # 691 segments of 1448 B


@needs_ns3
def test_ring_all_reduce_agrees_with_flow():
    """A ring all-reduce on one non-blocking switch: 6 ring steps, each a new TCP flow per rank.

    Stated margin: above the header bound, within 15% of `flow` (measured 11.9%: headers 3.7%, the ACKs of
    the reverse ring sharing each uplink ~2.2%, and each step's handshake and slow start, docs/netmodels.md).
    """
    p, size = 4, 8_000_000
    topo = switch_topology(p, BW, LAT)
    spec = CollectiveSpec("all_reduce", size, tuple(range(p)), "ring")
    flow = simulate_collective(FlowModel(topo), spec).finish_ns
    steps = 2 * (p - 1)
    chunk = size / p
    assert flow == steps * (1000 + chunk / 12.5)  # 966,000 ns
    t = simulate_collective(build_model("ns3", topo), spec).finish_ns
    assert steps * (1000 + chunk * WIRE / 12.5) <= t <= 1.15 * flow


@needs_ns3
def test_incast_differs_from_flow_with_drops():
    """4 senders into one receiver port with small switch queues: TCP loses packets, the fluid model cannot."""
    p, n = 5, 2_000_000
    topo = switch_topology(p, BW, LAT)
    fm = FlowModel(topo)
    hs = [fm.start_p2p(0, s, 0, n) for s in range(1, p)]
    flow_end = max(c.finish_ns for c in _drain(fm) if c.handle in hs)
    # max-min: 4 flows share the receiver's downlink, 8 MB at 12.5 B/ns, plus the route latency
    assert flow_end == 1000 + 4 * n / 12.5
    m = build_model("ns3", topo, queue_packets=20)
    hs = [m.start_p2p(0, s, 0, n) for s in range(1, p)]
    end = max(c.finish_ns for c in _drain(m) if c.handle in hs)
    st = m.stats()
    # The reason, in ns-3's own counters: the port's queue full, packets dropped and sent again.
    assert st.dropped > 0 and st.max_queue_packets == 20 and st.retransmissions >= 1
    # Two senders lose their tail and wait out TCP's minimum retransmission timeout (ns-3's MinRto, 1 s,
    # RFC 6298): the classic incast collapse; the fluid model has no losses.
    assert flow_end < 1e6 and end > 1e9


def _leaf_spine() -> Topology:
    """4 hosts, 2 leaves, 2 spines, every link 100 Gb/s and 500 ns."""
    g = DiGraph()
    for i in range(4):
        g.add_node(f"h{i}", kind="npu")
    for s in ("leaf0", "leaf1", "spine0", "spine1"):
        g.add_node(s, kind="switch")
    for i in range(4):
        add_duplex(g, f"h{i}", f"leaf{i // 2}", BW, LAT, "nic")
    for leaf in ("leaf0", "leaf1"):
        for s in ("spine0", "spine1"):
            add_duplex(g, leaf, s, BW, LAT, "fabric")
    return Topology("leafspine", g, ("h0", "h1", "h2", "h3"))


@needs_ns3
def test_ecmp_collision_differs_from_flow():
    """Two 4 MB flows leaf0 -> leaf1: the flow model's CRC32 hash puts both on spine0 (they share it); ns-3's
    per-packet random ECMP spreads both over the two spines, so both finish earlier, with no drop."""
    topo = _leaf_spine()
    n = 4_000_000
    spines = {topo.links[topo.route(a, b).links[1]][1] for a, b in ((0, 2), (1, 3))}
    assert spines == {"spine0"}  # the collision
    fm = FlowModel(topo)
    fm.start_p2p(0, 0, 2, n), fm.start_p2p(0, 1, 3, n)
    assert [c.finish_ns for c in _drain(fm)] == [2000 + 2 * n / 12.5] * 2  # half rate each: 642,000 ns
    runs = []
    for _ in range(2):
        m = build_model("ns3", topo)
        m.start_p2p(0, 0, 2, n), m.start_p2p(0, 1, 3, n)
        runs.append(([c.finish_ns for c in _drain(m)], m.stats()))
    ends, st = runs[0]
    assert all(2000 + n * WIRE / 12.5 < t < 2000 + 2 * n / 12.5 for t in ends)  # between alone and shared
    # No queue builds and nothing is dropped, yet TCP retransmits: packets sprayed over two paths arrive out
    # of order, and three duplicate ACKs trigger fast retransmit (ns-3's own counters show it).
    assert st.dropped == 0 and st.max_queue_packets <= 2 and st.retransmissions > 0
    # Fixed random streams: the second model, built after the first in this process, draws the same paths.
    assert runs[1] == runs[0]


@needs_ns3
def test_cli_incast_shows_ns3_statistics(capsys):
    """`xsim net collective --model ns3` with the --ns3-* flags: a direct gather is an incast (4 x 2 MB into
    rank 0's port); the JSON carries ns-3's counters, and a 200 us minimum RTO shortens the tail."""
    import json

    from xsim.cli import main

    base = ["net", "collective", "--topology", "switch:5:100Gbps:500ns", "--collective", "gather"]
    base += ["--algorithm", "direct", "--size", "10MB", "--json"]
    assert main([*base, "--model", "flow"]) == 0
    flow = json.loads(capsys.readouterr().out)
    assert flow["finish_ns"] == 1000 + 8_000_000 / 12.5 and "ns3" not in flow  # max-min: 641,000 ns
    flags = ["--model", "ns3", "--ns3-queue-packets", "20", "--ns3-min-rto", "200us"]
    assert main([*base, *flags]) == 0
    out = json.loads(capsys.readouterr().out)
    st = out["ns3"]
    assert st["flows"] == 4 and st["segments"] == 4 * -(-2_000_000 // 1448)
    assert st["max_queue_packets"] == 20 and st["dropped"] > 0 and st["retransmissions"] > 0
    # A lost tail waits out at least one 200 us RTO; the 1 s default would make it > 1e9 (test above).
    assert flow["finish_ns"] + 200_000 < out["finish_ns"] < 1e7
    assert main([*base[:-1], *flags]) == 0  # the text form ends with the counters' line
    text = capsys.readouterr().out.splitlines()
    assert text[-1].startswith("ns-3: 4 TCP flows, 5,528 data segments,") and "retransmissions" in text[-1]


@needs_ns3
def test_cli_packet_guard_is_one_line(capsys):
    from xsim.cli import main

    argv = ["net", "p2p", "--topology", "switch:2:100Gbps:500ns", "--src", "0", "--dst", "1", "--size", "1MB"]
    assert main([*argv, "--model", "ns3", "--ns3-max-packets", "100"]) == 2
    err = capsys.readouterr().err
    # 1 MB needs ceil(1e6 / 1448) = 691 segments of 1448 B
    assert err == (
        "xsim: error: ns3: the run needs more than max_packets=100 data packets (691 so far); "
        "raise it (--ns3-max-packets N) or use --model flow\n"
    )


def _drain(model):
    out = []
    while (t := model.next_event_ns()) is not None:
        out += model.advance(t)
    return out


TINY_SPEC = """name: tiny
model: {name: tiny, layers: 4, hidden: 256, ffn_hidden: 688, heads: 8, vocab: 1000, seq_len: 128}
micro_batches: 2
device_groups:
  - {gpu: H100, ranks: [0, 1], tp: 2, layers: [1, 2], micro_batch: 1, pp_stage: 0, dp_replica: 0}
  - {gpu: A100, ranks: [2, 3], tp: 2, layers: [3, 4], micro_batch: 1, pp_stage: 1, dp_replica: 0}
  - {gpu: H100, ranks: [4, 5], tp: 2, layers: [1, 2], micro_batch: 1, pp_stage: 0, dp_replica: 1}
  - {gpu: A100, ranks: [6, 7], tp: 2, layers: [3, 4], micro_batch: 1, pp_stage: 1, dp_replica: 1}
"""


@needs_ns3
def test_generated_training_set_replays_end_to_end(tmp_path):
    """A tiny generated 2-replica, 2-stage, TP-2 set through the unchanged engine with --model ns3.

    Measured margin (2026-12-02): 4,213,867 ns against flow's 3,930,959 (+7.2%): 82 small collectives and
    16 P2P, each transfer a fresh TCP connection paying handshake and slow start on top of headers.
    """
    import json
    import os

    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY_SPEC)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = [sys.executable, "-m", "xsim"]
    subprocess.run([*run, "gen", str(spec), "--out", str(tmp_path / "set")], check=True, env=env)
    times = {}
    for model in ("flow", "ns3"):
        out = subprocess.run(
            [*run, "replay", str(tmp_path / "set"), "--model", model, "--json"],
            check=True,
            env=env,
            capture_output=True,
            text=True,
        ).stdout
        times[model] = json.loads(out)["iteration_time_ns"]
    assert times["flow"] < times["ns3"] < 1.15 * times["flow"]
