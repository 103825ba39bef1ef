"""Replay speed on a synthetic trace set: node events per second of the engine, and end-to-end time.

Usage: .venv/bin/python scripts/bench_replay.py [--ranks 64] [--nodes-per-rank 16384] [--profile out.html]

The set: every rank runs a chain of GPU compute nodes (1-20 us); every 32nd compute node starts an
AllReduce over the rank's 8-rank data-parallel group, hanging off the chain (overlapped, as gradient
buckets are), and every 256th node sends 1 MiB to the next pipeline rank which receives it before
going on. Timed on the analytical model over a switch. Results go to docs/replay.md by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time

from xsim.netmodels.cluster import topology_from_spec
from xsim.netmodels.models import build_model
from xsim.replay import simulate
from xsim.replay.engine import run_engine
from xsim.replay.program import build_program
from xsim.replay.simulation import load_groups
from xsim.traces import pb
from xsim.traces.attrs import make_attr
from xsim.traces.traceset import discover, write_trace_set

DP = 8  # data-parallel group size
COLL_EVERY = 32
P2P_EVERY = 256


def make_set(out: str, ranks: int, per_rank: int) -> str:
    """Write the synthetic set; returns its prefix."""
    groups = {str(g + 1): list(range(g * DP, (g + 1) * DP)) for g in range(ranks // DP)}
    per: list[list[pb.Node]] = []
    for r in range(ranks):
        nodes = []
        prev = None
        nid = 0
        stage, local = divmod(r, DP)
        n_stages = ranks // DP
        while nid < per_rank:
            k = nid
            dur = 1 + (k * 7 + r) % 20
            n = pb.Node(id=nid, name="gemm", type=pb.COMP_NODE, duration_micros=dur)
            if prev is not None:
                n.data_deps.append(prev)
            nodes.append(n)
            prev = nid
            nid += 1
            if nid < per_rank and k % COLL_EVERY == COLL_EVERY - 1:
                c = pb.Node(id=nid, name="grad_allreduce", type=pb.COMM_COLL_NODE)
                c.data_deps.append(prev)
                c.attr.extend(
                    [
                        make_attr("comm_type", pb.ALL_REDUCE),
                        make_attr("comm_size", 1 << 22),
                        make_attr("pg_name", str(stage + 1)),
                    ]
                )
                nodes.append(c)
                nid += 1
            if nid < per_rank and n_stages > 1 and k % P2P_EVERY == P2P_EVERY - 1:
                nxt, prv = (stage + 1) % n_stages, (stage - 1) % n_stages
                # Even stages send first then receive, odd ones the reverse: no cycle of waits.
                ops = [("send", nxt), ("recv", prv)] if stage % 2 == 0 else [("recv", prv), ("send", nxt)]
                for what, peer in ops:
                    if nid >= per_rank:
                        break
                    typ = pb.COMM_SEND_NODE if what == "send" else pb.COMM_RECV_NODE
                    m = pb.Node(id=nid, name=f"act_{what}", type=typ)
                    m.data_deps.append(prev)
                    peer_rank = peer * DP + local
                    key = "comm_dst" if what == "send" else "comm_src"
                    m.attr.extend(
                        [make_attr(key, peer_rank), make_attr("comm_tag", k), make_attr("comm_size", 1 << 20)]
                    )
                    nodes.append(m)
                    prev = nid
                    nid += 1
        per.append(nodes)
    prefix = os.path.join(out, "bench")
    write_trace_set(prefix, per)
    with open(os.path.join(out, "comm_group.json"), "w") as fh:
        json.dump(groups, fh)
    return prefix


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--nodes-per-rank", type=int, default=16384)
    ap.add_argument("--profile", metavar="HTML", help="profile the engine loop with pyinstrument")
    ap.add_argument("--keep", metavar="DIR", help="write the set here (reused when present)")
    args = ap.parse_args()
    if args.ranks % DP:
        ap.error(f"--ranks must be a multiple of {DP}")
    tmp = args.keep or tempfile.mkdtemp(prefix="xsim-bench-")
    prefix = os.path.join(tmp, "bench")
    t0 = time.perf_counter()
    if not os.path.exists(prefix + ".0.et"):
        make_set(tmp, args.ranks, args.nodes_per_rank)
    t_gen = time.perf_counter() - t0
    net = build_model("analytical", topology_from_spec(f"switch:{args.ranks}:50GBps:500ns"))
    ts = discover(prefix)
    t0 = time.perf_counter()
    for r in range(ts.num_ranks):
        ts.load(r)
    t_read = time.perf_counter() - t0
    if args.profile:
        from pyinstrument import Profiler
        from xsim.replay.config import ReplayConfig

        groups = load_groups(ts, None)
        prog = build_program(ts, groups, None, ReplayConfig(), release=False)
        import gc

        gc.disable()  # as simulate() does
        prof = Profiler()
        prof.start()
        run_engine(prog, net, ReplayConfig())
        prof.stop()
        with open(args.profile, "w") as fh:
            fh.write(prof.output_html())
        print(prof.output_text(unicode=False, color=False)[:6000])
        return 0
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(ts, network=net)
    t_all, c_all = time.perf_counter() - t0, time.process_time() - c0
    s = res.summary_dict()
    perf = res.perf_dict()
    report = {
        "ranks": s["num_ranks"],
        "nodes": s["num_nodes"],
        "collectives": s["num_collectives"],
        "p2p": s["num_p2p"],
        "iteration_time_ns": s["iteration_time_ns"],
        "generate_s": round(t_gen, 2),
        "read_s": round(t_read, 2),
        "simulate_s": round(t_all, 2),
        "engine_s": round(perf["engine_wall_s"], 2),
        "engine_node_events_per_s": round(perf["events_per_s"]),
        "simulate_cpu_s": round(c_all, 2),
        "engine_cpu_s": round(perf["engine_cpu_s"], 2),
        "engine_node_events_per_cpu_s": round(s["events"] / perf["engine_cpu_s"]),
        "end_to_end_nodes_per_s": round(s["num_nodes"] / (t_all + t_read)),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "load_average": round(os.getloadavg()[0], 2),
    }
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
