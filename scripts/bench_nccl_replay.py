"""Issue 23's speed check: a generated 1,024-GPU replay in NCCL mode, a base commit and this tree alternating.

Usage: .venv/bin/python scripts/bench_nccl_replay.py --base COMMIT [--spec examples/hetero1024.yaml]
           [--topology dgx-h100:128] [--rounds 2] [--root DIR]

Generates the spec's trace set once (with this tree), extracts the base commit's tree with `git archive`,
then runs `python -m xsim replay SET --topology TOPOLOGY --json` from a neutral folder (so `python -m` does
not put either tree first on the path by accident), base then this tree, `--rounds` times, and prints one
line per run: round, tree, wall seconds, the machine's 1-minute load, iteration time. Alternating in one run
keeps both sides under the same machine load; the ratio per round is what issue 23's <= 1.5x criterion reads.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def replay(tree: Path, root: Path, topology: str) -> tuple[float, int]:
    """Wall seconds and iteration time (ns) of one replay run with `tree` on the path."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "xsim", "replay", str(root / "set"), "--topology", topology, "--json"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return time.perf_counter() - t0, int(json.loads(out)["iteration_time_ns"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit to compare with (e.g. the branch's base)")
    ap.add_argument("--spec", default=str(HERE / "examples" / "hetero1024.yaml"))
    ap.add_argument("--topology", default="dgx-h100:128")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--root", default=None, help="working folder (default: a temp folder)")
    args = ap.parse_args()
    root = Path(args.root or tempfile.mkdtemp(prefix="bench_nccl_"))
    base = root / "base"
    if not base.exists():
        base.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-C", str(HERE), "archive", args.base], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
    if not (root / "set").exists():
        env = dict(os.environ, PYTHONPATH=str(HERE))
        gen = [sys.executable, "-m", "xsim", "gen", args.spec, "--out", str(root / "set")]
        subprocess.run(gen, cwd=root, env=env, check=True, capture_output=True)
    for r in range(1, args.rounds + 1):
        walls = {}
        for name, tree in (("base", base), ("this", HERE)):
            wall, it = replay(tree, root, args.topology)
            walls[name] = wall
            load = os.getloadavg()[0]
            print(
                f"round {r} {name}: {wall:.1f} s wall, load {load:.1f}, iteration {it / 1e6:.2f} ms",
                flush=True,
            )
        print(f"round {r}: x{walls['this'] / walls['base']:.2f}", flush=True)


if __name__ == "__main__":
    main()
