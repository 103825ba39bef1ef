"""Replay speed in ASTRA-sim-compatible mode: a generated 64-rank Llama-2 7B trace on ASTRA-sim configs.

Usage: .venv/bin/python scripts/bench_astra.py [--ranks 64] [--repeat 3] [--root DIR]
       .venv/bin/python scripts/bench_astra.py --set DIR [--congestion-aware] [--repeat 1]

With --set, DIR is a trace set holding its own `network.yml` and `sys.json` (the case folders of
`scripts/astra_compare.py`, docs/performance.md "ASTRA-sim congestion-aware speed"): it is replayed with
them, congestion-aware when asked, and each run prints its CPU time and a hash of every rank's finish (equal
hashes: equal per-rank times), for alternating runs of two checkouts against ASTRA-sim's binary. The
imports of the replay stack are timed apart, first ("imports cpu"); add them to compare with a whole
ASTRA-sim process.

With --root, a set already generated there (r<ranks>/ with deployment.json) is reused, so alternating runs
of two checkouts replay the very same files.

The set: Llama-2 7B, TP 8 x PP 4 x DP (ranks / 32) on H100, 1F1B, 4 micro-batches (scripts/bench_scale.py's
spec), generated with `tracegen.generate` and written as `xsim gen` does. The network: a 2-D switch
network derived from ASTRA-sim's `inputs/hgx_h100_32gpu.yml` (8 NPUs per node at 400 GB/s, 936.25 ns;
the second dimension widened to ranks / 8 nodes at 50 GB/s, 1000 ns) with its system file
`inputs/hgx_h100_32gpu.json` (ring, 4 splits, roofline at 700 TFLOP/s), read from ../shared/peer_configs.
The replay is `xsim replay DIR --astra-network NET.yml --astra-system SYS.json`, in process, timed end to
end (read + build + run + tables). Prints, per run, nodes per second of the whole replay (wall and process
CPU time; the first run also pays the imports of the replay and the models) and of the event loop alone
(its CPU time, network model included); ASTRA-sim's own analytical backend measured ~11k nodes/s on this
machine class (issue 11).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CFG = REPO.parent / "shared" / "peer_configs" / "astra-sim"


def write_network(path: Path, nodes: int) -> Path:
    """hgx_h100_32gpu.yml with `nodes` nodes in its second dimension (switch, as the issue's 2-D network).

    A file already there with this text is reused unwritten (a shared --root may be read-only); one with
    other text is left alone and the config goes to a fresh temporary folder. Returns the file to use.
    """
    text = (
        "topology: [ Switch, Switch ]\n"
        f"npus_count: [ 8, {nodes} ]\n"
        "bandwidth: [ 400, 50 ]\n"
        "latency: [ 936.25, 1000 ]\n"
    )
    if path.is_file() and path.read_text() == text:
        return path
    if path.exists():
        path = Path(tempfile.mkdtemp(prefix="bench_astra_net_")) / path.name
    path.write_text(text)
    return path


def replay_set(folder: Path, aware: bool, repeat: int) -> None:
    """Replay a set with its own ASTRA-sim configs `repeat` times; print CPU time and per-rank finish hash."""
    import hashlib

    c = time.process_time()
    from xsim import api
    from xsim.api import replaying  # noqa: F401  (xsim.api loads its names on first use: the replay stack)

    # The imports are the process's start-up, not the replay's: timed apart (before round 4 of issue 30
    # the first replay's CPU time included them, ~0.3 s of it).
    print(f"imports cpu {time.process_time() - c:.2f} s", flush=True)
    net, system = folder / "network.yml", folder / "sys.json"
    options = api.ReplayOptions(
        network=api.NetworkOptions(astra_network=str(net), astra_system=str(system), congestion_aware=aware),
        compute=api.ComputeOptions(astra_system=str(system)),
    )
    for _ in range(repeat):
        c = time.process_time()
        res = api.simulate(str(folder), options).result  # read, build, run and tables, as `xsim replay`
        cpu = time.process_time() - c
        finish = ",".join(str(int(x)) for x in res.per_rank_finish_ns)
        digest = hashlib.sha256(finish.encode()).hexdigest()[:16]
        it = res.summary_dict()["iteration_time_ns"]
        print(f"cpu {cpu:.2f} s iteration {it:,} ns per-rank finish sha256 {digest}", flush=True)


def main() -> None:
    """Generate once, replay `--repeat` times, print one line per replay."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--root", default=None)
    ap.add_argument("--set", default=None, help="replay this set with its own network.yml and sys.json")
    ap.add_argument(
        "--congestion-aware", action="store_true", help="with --set: the congestion-aware backend"
    )
    args = ap.parse_args()
    if args.set is not None:
        replay_set(Path(args.set), args.congestion_aware, args.repeat)
        return
    system = CFG / "system" / "repo_inputs_hgx_h100_32gpu.json"
    if not system.is_file():
        raise SystemExit(f"{system}: ASTRA-sim configs not found (../shared/peer_configs)")
    from bench_scale import spec  # noqa: E402  (scripts/ sibling)
    from xsim.tracegen import generate, load_spec
    from xsim.tracegen.spec import save_deployment

    from xsim import api

    root = Path(args.root or tempfile.mkdtemp(prefix="bench_astra_"))
    out = root / f"r{args.ranks}"
    if not (out / "deployment.json").is_file():
        dep = load_spec(spec(args.ranks, 4))
        bundle = generate(dep)
        bundle.write(out, dep.name)
        save_deployment(dep, out / "deployment.json")
        del bundle
    net = write_network(root / "network.yml", args.ranks // 8)
    options = api.ReplayOptions(
        network=api.NetworkOptions(astra_network=str(net), astra_system=str(system)),
        compute=api.ComputeOptions(astra_system=str(system)),
    )
    for _ in range(args.repeat):
        t = time.perf_counter()
        c = time.process_time()
        res = api.simulate(str(out), options).result  # read, build, run and tables, as `xsim replay`
        wall = time.perf_counter() - t
        cpu = time.process_time() - c
        s, perf = res.summary_dict(), res.perf_dict()
        n, eng = s["num_nodes"], perf["engine_cpu_s"]
        print(
            f"ranks {args.ranks} nodes {n:,} collectives {s['num_collectives']:,} "
            f"wall {wall:.2f} s cpu {cpu:.2f} s: {n / wall:,.0f} nodes/s wall, "
            f"{n / cpu:,.0f} nodes/s cpu; engine cpu {eng:.3f} s: {n / eng:,.0f} nodes/s; "
            f"iteration {s['iteration_time_ns']:,} ns",
            flush=True,
        )


if __name__ == "__main__":
    main()
