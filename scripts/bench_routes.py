"""Route-search micro benchmark: CPU seconds to route every ring neighbour (r -> r+1 and r -> r-1) once.

Each rank is the destination of two first-time routes, so this is the search cost a ring collective or a
pipeline's sends pay on a fresh topology. Run it under two checkouts and compare (docs/performance.md):
    PYTHONPATH=$PWD python scripts/bench_routes.py --ranks 512 2048
"""

from __future__ import annotations

import argparse
import hashlib
import time

from xsim.netmodels import topology_from_spec


def bench(ranks: int, repeats: int) -> tuple[float, str]:
    """Best CPU seconds over REPEATS fresh topologies of RANKS H100s, and a digest of the routes."""
    spec = f"nodes:{ranks // 8}*H100x8"
    best, digest = float("inf"), ""
    for _ in range(repeats):
        topo = topology_from_spec(spec)
        t0 = time.process_time()
        routes = [topo.route(r, (r + s) % ranks) for s in (1, -1) for r in range(ranks)]
        best = min(best, time.process_time() - t0)
        digest = hashlib.sha256(repr([(x.links, x.latency_ns) for x in routes]).encode()).hexdigest()[:16]
    return best, digest


def main() -> None:
    """Print one line per rank count: ranks, best CPU seconds, route digest."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    for n in args.ranks:
        sec, digest = bench(n, args.repeats)
        print(f"ranks={n} cpu_s={sec:.4f} routes_sha={digest}")


if __name__ == "__main__":
    main()
