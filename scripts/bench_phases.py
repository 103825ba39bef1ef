"""CPU time of one replay's phases with the traces already decoded: building, the engine, the result.

Usage: .venv/bin/python scripts/bench_phases.py DIR [--repeat 2] [--warm]

Decodes every rank's file once (traces/columnar.py, not timed), then per repeat times `build_program`,
`run_engine` (its init, loop and output; `loop` is EngineOutput.cpu_s) and `build_result` in process CPU
seconds, on the network and compute models `xsim replay DIR` would use. Each repeat builds a fresh network
(first-time route searches included) unless --warm, which reuses the first one (route searches and the
model's per-spec caches then cost nothing after the first repeat: the engine's own share). The last column
hashes every node's times and every matching, so two checkouts run alternately can be compared exactly.
Used for docs/performance.md ("Event loop, matching and building on the unfolded 512-rank set").
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import sys
import time
from pathlib import Path

# Appended, not prepended: PYTHONPATH=<another checkout> times that checkout with this script.
sys.path.append(str(Path(__file__).resolve().parents[1]))

from xsim.replay.config import resolve_streams  # noqa: E402
from xsim.replay.engine import EngineOutput, run_engine  # noqa: E402
from xsim.replay.program import build_program  # noqa: E402
from xsim.replay.result import build_result  # noqa: E402
from xsim.replay.simulation import ColumnReader, load_groups  # noqa: E402

from xsim.api.replaying import (  # noqa: E402
    ReplayOptions,
    build_compute,
    build_network,
    load_deployment,
    load_trace_set,
    replay_config,
)


def output_hash(out: EngineOutput) -> str:
    """A short hash of every node's start / end / ready / wait, the collectives and the P2P pairs."""
    h = hashlib.sha1()
    for col in (out.start, out.end, out.ready, out.wait):
        h.update(repr([int(x) for x in col]).encode())
    recs = [
        (
            r.id,
            r.group,
            r.comm_type,
            r.members,
            r.nodes,
            r.size,
            r.first_arrival_ns,
            r.last_arrival_ns,
            r.end_ns,
        )
        for r in out.collectives
    ]
    h.update(repr(recs).encode())
    h.update(repr(sorted(out.collective_of.items())).encode())
    h.update(repr(out.p2p_pairs).encode())
    return h.hexdigest()[:12]


def main() -> None:
    """Time the phases and print one line per repeat."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--warm", action="store_true", help="reuse one network model across repeats")
    args = ap.parse_args()
    ts = load_trace_set(args.dir)
    opts = ReplayOptions()
    deployment = load_deployment(ts)
    config = replay_config(opts)
    gc.disable()  # as replay.simulation.simulate does
    reader = ColumnReader(ts)
    cols = {r: reader.get(r) for r in range(ts.num_ranks)}
    groups = load_groups(ts, None, scan=True)
    network = None
    for _ in range(args.repeat):
        if network is None or not args.warm:
            network = build_network(opts.network, deployment, where=args.dir, ranks=ts.num_ranks)
        elif hasattr(network, "_last_now"):
            network._last_now = 0  # a closed-form model refuses start times going back: a new run starts at 0
        cfg = resolve_streams(config, network.name)
        compute = build_compute(opts.compute, ts.num_ranks)
        t0 = time.process_time()
        prog = build_program(ts, groups, compute, cfg, columns=cols.get, release=False)
        t1 = time.process_time()
        out = run_engine(prog, network, cfg)
        t2 = time.process_time()
        build_result(prog, out, network_name=network.name, comm_mode=cfg.comm_mode, sim_wall_s=0.0)
        t3 = time.process_time()
        print(
            f"build {t1 - t0:.3f} engine {t2 - t1:.3f} (loop {out.cpu_s:.3f}) result {t3 - t2:.3f} "
            f"total {t3 - t0:.3f} events {out.events} hash {output_hash(out)}",
            flush=True,
        )


if __name__ == "__main__":
    main()
