"""Cost of `--model ns3` per packet, and how it grows with bytes and with flows (docs/performance.md).

Usage: PYTHONPATH=.:<ns3 site> python scripts/bench_ns3.py [--quick]

Needs the optional extra (`pip install 'xsim-replay[ns3]'`). One process: ns-3 is imported once (its
import time printed apart), then each case builds `build_model("ns3", switch_topology(p, 100 Gb/s, 500 ns))`
and times the simulation alone in process CPU seconds (`time.process_time`, the machine being shared).
Cases, each varying one thing:
- bytes: one transfer across one switch, 1 / 4 / 16 MB (one flow; cost vs packets);
- flows: a ring all-reduce of 8 MB on 4 / 8 / 16 ranks (2 (p - 1) steps of p flows each);
- window: the 16 MB transfer with 100-packet instead of 1000-packet queues (fewer packets in flight);
- concurrent flows: a direct all-to-all of 16 MB on 4 / 8 ranks (p (p - 1) flows at once, one stage).
A first, untimed transfer compiles cppyy's calls (its CPU printed apart). Per case: data segments
(ceil(bytes / 1448) per flow, what `max_packets` counts), packets through queue discs (data and ACKs,
every hop: ns-3's QueueDisc stats), CPU s, us per segment and per queued packet.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BW = 12.5e9  # 100 Gb/s in bytes/s
LAT = 500.0  # ns per link


def cases(quick: bool) -> list[tuple[str, int, str, int, str, int]]:
    """(group, ranks, collective or "p2p", bytes, algorithm, queue packets) of every case."""
    q = 1000  # the default queue (Ns3Options.queue_packets)
    out = [("bytes", 2, "p2p", mb * 1_000_000, "", q) for mb in ((1, 4) if quick else (1, 4, 16))]
    # The same 16 MB with 100-packet queues: fewer packets in flight behind the sender's queue.
    out += [("window", 2, "p2p", 16_000_000, "", 100)]
    out += [("flows", p, "all_reduce", 8_000_000, "ring", q) for p in ((4, 8) if quick else (4, 8, 16))]
    out += [("concurrent", p, "all_to_all", 16_000_000, "direct", q) for p in ((4,) if quick else (4, 8))]
    return out


def main() -> int:
    """Print one markdown row per case."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer, smaller cases")
    args = ap.parse_args()

    from xsim.netmodels import ns3
    from xsim.netmodels.api import CollectiveSpec, simulate_collective, simulate_p2p
    from xsim.netmodels.models import build_model
    from xsim.netmodels.topology import switch_topology

    w, c = time.perf_counter(), time.process_time()
    if not ns3.available():
        print(ns3.EXTRA_HINT, file=sys.stderr)
        return 2
    print(
        f"import ns-3 + compile glue: {time.perf_counter() - w:.1f} s wall, {time.process_time() - c:.1f} s CPU"
    )
    # Warm-up, untimed: cppyy compiles each ns-3 template and overload on its first call.
    c = time.process_time()
    simulate_p2p(build_model("ns3", switch_topology(2, BW, LAT)), 0, 1, 100_000)
    print(f"warm-up (first flow: cppyy compiles the calls): {time.process_time() - c:.1f} s CPU")
    print(
        "| case | ranks | bytes | flows | data segments | queued packets | finish ns | CPU s | us/segment | us/queued |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for group, p, kind, size, algo, queue in cases(args.quick):
        model = build_model("ns3", switch_topology(p, BW, LAT), queue_packets=queue)
        c = time.process_time()
        if kind == "p2p":
            finish = simulate_p2p(model, 0, 1, size).finish_ns
        else:
            finish = simulate_collective(model, CollectiveSpec(kind, size, tuple(range(p)), algo)).finish_ns
        cpu = time.process_time() - c
        st = model.stats()
        name = (kind if kind == "p2p" else f"{kind} {algo}") + f", {queue}-packet queues"
        print(
            f"| {group}: {name} | {p} | {size:,} | {st.flows:,} | {st.segments:,} | {st.enqueued:,} | "
            f"{finish:,} | {cpu:.2f} | {1e6 * cpu / st.segments:.0f} | {1e6 * cpu / st.enqueued:.1f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
