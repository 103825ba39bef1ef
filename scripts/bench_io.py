"""Read/write throughput of .et streams on a generated trace (default 1,000,000 nodes).

Usage: python scripts/bench_io.py [--nodes N] [--gz] [--repeat R]
Prints one JSON line with nodes/s for write (encode + file write of nodes already in memory) and read
(file read + decode into Node messages). Each read runs in a fresh process, as `xsim` reads a trace: a
process that already holds a million-node trace pays extra page faults for the second one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from xsim.traces import pb
from xsim.traces.attrs import make_node
from xsim.traces.stream import read_et, write_et


def synthetic_nodes(n: int) -> list[pb.Node]:
    """A chain-like trace resembling generated LLM traces: 7 of 8 nodes compute, 1 of 8 a collective."""
    nodes = []
    for i in range(n):
        deps = (i - 1,) if i else ()
        if i % 8 == 7:
            node = make_node(
                i,
                f"allreduce_{i}",
                pb.COMM_COLL_NODE,
                data_deps=deps,
                attrs={"is_cpu_op": False, "comm_type": pb.ALL_REDUCE, "comm_size": 1 << 20, "pg_name": "1"},
            )
        else:
            node = make_node(
                i,
                f"gemm_{i}",
                pb.COMP_NODE,
                data_deps=deps,
                duration_micros=100 + i % 13,
                attrs={
                    "is_cpu_op": False,
                    "num_ops": 2 * 4096**3,
                    "tensor_size": 3 * 4096 * 4096 * 2,
                    "layer": i % 32,
                },
            )
        nodes.append(node)
    return nodes


def main() -> None:
    """Run the benchmark and print the measured rates."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--gz", action="store_true", help="gzip-compressed file (.et.gz)")
    ap.add_argument("--repeat", type=int, default=3, help="best of R runs")
    ap.add_argument("--read-only", metavar="PATH", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.read_only:
        t0 = time.perf_counter()
        et = read_et(args.read_only)
        print(time.perf_counter() - t0)
        assert len(et.nodes) == args.nodes
        return
    nodes = synthetic_nodes(args.nodes)
    meta = pb.GlobalMetadata(version="1.0.0")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.0.et" + (".gz" if args.gz else ""))
        write_s = read_s = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            write_et(path, nodes, meta)
            write_s = min(write_s, time.perf_counter() - t0)
        del nodes
        for _ in range(args.repeat):
            out = subprocess.run(
                [sys.executable, __file__, "--read-only", path, "--nodes", str(args.nodes)],
                check=True,
                capture_output=True,
                text=True,
            )
            read_s = min(read_s, float(out.stdout))
        size = os.path.getsize(path)
    print(
        json.dumps(
            {
                "nodes": args.nodes,
                "gzip": args.gz,
                "file_bytes": size,
                "write_s": round(write_s, 3),
                "write_nodes_per_s": int(args.nodes / write_s),
                "read_s": round(read_s, 3),
                "read_nodes_per_s": int(args.nodes / read_s),
            }
        )
    )


if __name__ == "__main__":
    main()
