"""Reading and building cost of a replay: decode every rank's `.et` as columns and build the program.

Usage: .venv/bin/python scripts/bench_decode.py DIR [--repeat 3] [--astra-system SYS.json]

Runs what `xsim replay DIR` runs before the event loop (process groups from the set, then
replay.simulation.ColumnReader feeding replay.program.build_program), `--repeat` times in one process,
and prints per run the CPU seconds of decoding (traces/columnar.py), of the whole read + build, and nodes
per CPU-second. With --astra-system the compute model is that system file's roofline and comm streams
are ASTRA-sim's ("shared"), as `scripts/bench_astra.py` replays; else recorded durations and "group".
Run it from two checkouts alternately to compare them (docs/performance.md).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    """Decode and build `--repeat` times; one line per run."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--astra-system", default=None)
    args = ap.parse_args()

    import xsim.replay.simulation as sim
    from xsim.replay.config import ReplayConfig, resolve_streams
    from xsim.replay.program import build_program
    from xsim.traces.traceset import discover

    from xsim.api import ComputeOptions
    from xsim.api.compute import build_compute

    spent = [0.0]
    decode = sim.decode_columns

    def timed(*a, **k):
        t = time.process_time()
        try:
            return decode(*a, **k)
        finally:
            spent[0] += time.process_time() - t

    sim.decode_columns = timed
    ts = discover(args.dir)
    compute = build_compute(ComputeOptions(astra_system=args.astra_system), ts.num_ranks)
    config = resolve_streams(ReplayConfig(), "astra-unaware" if args.astra_system else "analytical")
    gc.disable()  # as replay.simulation.simulate does while building
    for _ in range(args.repeat):
        ts = discover(args.dir)
        spent[0] = 0.0
        t = time.process_time()
        groups = sim.load_groups(ts, None, scan=True)
        prog = build_program(ts, groups, compute, config, columns=sim.ColumnReader(ts).get)
        cpu = time.process_time() - t
        print(
            f"nodes {prog.num_nodes:,} decode {spent[0]:.3f} s read+build {cpu:.3f} s cpu: "
            f"{prog.num_nodes / cpu:,.0f} nodes/s",
            flush=True,
        )


if __name__ == "__main__":
    main()
