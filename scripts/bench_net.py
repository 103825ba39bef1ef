"""Benchmark the network models: ASTRA-sim-compatible ring AllReduce at scale, flow-model rate recomputation.

Usage: python scripts/bench_net.py [--quick]. Prints one line per case (wall time, peak traced memory) and
the process's peak RSS at the end. Targets (issue 2): <= 0.3 s at 1024 ranks, <= 5 s and <= 0.5 GB at 4096.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np

# Run from a checkout: the repository root goes first so `netmodels` is this tree's package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xsim.netmodels import CollectiveSpec, FlowModel, simulate_collective, topology_from_spec
from xsim.netmodels.analytical import AnalyticalModel
from xsim.netmodels.astra import AstraDim, AstraModel, AstraNetwork, AstraSystem
from xsim.netmodels.flow import max_min_rates
from xsim.netmodels.topology import ring_topology

MIB = 1 << 20
# ASTRA-sim's Ring_4chunks.json profile ("ex" in the reference, section 2).
EX = AstraSystem(
    preferred_dataset_splits=4, active_chunks_per_dimension=1, endpoint_delay_ns=10, local_mem_bw_gbps=1600
)


def measure(fn: Callable[[], int]) -> tuple[int, float, float]:
    """Run fn twice: wall seconds untraced, then peak traced MiB (tracemalloc slows Python code down)."""
    t0 = time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1] / MIB
    tracemalloc.stop()
    return out, wall, peak


def bench_astra(sizes: list[int]) -> None:
    """ASTRA-sim-compatible ring AllReduce: closed form (uniform ring) and step by step (permuted group)."""
    print("ASTRA-sim-compatible ring AllReduce, 1 MiB, Ring topology 50 GB/s 500 ns, ex profile (splits 4)")
    for aware in (False, True):
        for n in sizes:

            def run(n=n, aware=aware):
                model = AstraModel(AstraNetwork((AstraDim("ring", n, 50, 500),)), EX, congestion_aware=aware)
                return simulate_collective(
                    model, CollectiveSpec("all_reduce", MIB, tuple(range(n)))
                ).finish_ns

            t, wall, peak = measure(run)
            mode = "aware  " if aware else "unaware"
            print(f"  {mode} n={n:5d}  finish {t:>12} ns  wall {wall:8.4f} s  peak {peak:7.1f} MiB")
    print("ASTRA-sim-compatible ring AllReduce over a permuted group (per-pair hops differ: no closed form)")
    for n in sizes:
        order = tuple(int(x) for x in np.random.default_rng(0).permutation(n))

        def run(n=n, order=order):
            model = AstraModel(AstraNetwork((AstraDim("ring", n, 50, 500),)), EX)
            return simulate_collective(model, CollectiveSpec("all_reduce", MIB, order)).finish_ns

        t, wall, peak = measure(run)
        print(f"  unaware n={n:5d}  finish {t:>12} ns  wall {wall:8.4f} s  peak {peak:7.1f} MiB")


def bench_analytical(sizes: list[int]) -> None:
    """Generic analytical model on a ring topology, routing included."""
    print("Generic analytical model, ring AllReduce 1 MiB on a ring topology (routes + numpy stage loop)")
    for n in sizes:

        def run(n=n):
            model = AnalyticalModel(ring_topology(n, 50e9, 500))
            return simulate_collective(model, CollectiveSpec("all_reduce", MIB, tuple(range(n)))).finish_ns

        t, wall, peak = measure(run)
        print(f"  n={n:5d}  finish {t:>12} ns  wall {wall:8.4f} s  peak {peak:7.1f} MiB")


def bench_cluster(nodes: int) -> None:
    """Generic analytical model on a Table 6 cluster of 8-GPU H100 nodes (built and routed inside the timing)."""
    n = nodes * 8
    print(
        f"Generic analytical model, 1 MiB AllReduce on {nodes} x 8 H100 (Table 6, one switch), routing included"
    )
    for algo in ("ring", "hierarchical"):

        def run(algo=algo):
            model = AnalyticalModel(topology_from_spec(f"nodes:{nodes}*H100x8:preset=table6"))
            return simulate_collective(
                model, CollectiveSpec("all_reduce", MIB, tuple(range(n)), algo)
            ).finish_ns

        t, wall, peak = measure(run)
        print(f"  {algo:12s} n={n:5d}  finish {t:>12} ns  wall {wall:8.4f} s  peak {peak:7.1f} MiB")


def bench_flow(num_flows: int, events: int) -> None:
    """Flow model: one max-min recomputation over num_flows flows, then the first `events` completions."""
    spec = "nodes:128*H100x8:preset=table6:fabric=fat_tree:k=16"
    t0 = time.perf_counter()
    topo = topology_from_spec(spec)
    build = time.perf_counter() - t0
    rng = np.random.default_rng(1)
    src = rng.integers(0, topo.num_ranks, num_flows)
    dst = (src + rng.integers(1, topo.num_ranks, num_flows)) % topo.num_ranks
    sizes = rng.integers(1 << 16, 1 << 24, num_flows)
    t0 = time.perf_counter()
    routes = [topo.route(int(a), int(b)) for a, b in zip(src, dst, strict=True)]
    route_s = time.perf_counter() - t0
    print(
        f"Flow model: {num_flows} concurrent flows on a k=16 fat-tree ({topo.num_ranks} GPUs, {len(topo.links)} links)"
    )
    print(f"  topology build {build:.2f} s, routing {route_s:.2f} s")
    ptr = np.zeros(num_flows + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(r.links) for r in routes])
    links = np.concatenate([np.array(r.links, dtype=np.int64) for r in routes])
    reps = 5
    t0 = time.perf_counter()
    for _ in range(reps):
        max_min_rates(ptr, links, topo.link_bandwidth)
    per = (time.perf_counter() - t0) / reps
    print(f"  max_min_rates over {num_flows} flows: {per * 1e3:.1f} ms per recomputation")
    model = FlowModel(topo)
    for a, b, s in zip(src, dst, sizes, strict=True):
        model.start_p2p(0, int(a), int(b), int(s))
    before = model.rate_recomputations
    t0 = time.perf_counter()
    done = 0
    while done < events and model.next_event_ns() is not None:
        done += len(model.advance(model.next_event_ns()))
    wall = time.perf_counter() - t0
    recomputes = model.rate_recomputations - before
    print(
        f"  FlowModel: {done} completions, {recomputes} rate recomputations in {wall:.2f} s "
        f"({wall / max(recomputes, 1) * 1e3:.1f} ms per event incl. recomputation)"
    )


def main() -> None:
    """Run every benchmark and print the numbers docs/netmodels.md records."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke test)")
    args = ap.parse_args()
    sizes = [64, 128] if args.quick else [512, 1024, 2048, 4096]
    bench_astra(sizes)
    bench_analytical(sizes)
    bench_cluster(8 if args.quick else 512)
    bench_flow(1000 if args.quick else 10_000, 20 if args.quick else 200)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process: {rss:.0f} MiB")


if __name__ == "__main__":
    main()
