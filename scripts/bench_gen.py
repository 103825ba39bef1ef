"""Benchmark `xsim gen`: Llama-2 7B on 128 ranks (TP 8, PP 4, DP 4, 8 micro-batches), both schedules.

Usage: .venv/bin/python scripts/bench_gen.py [--repeat 3] [--out-root DIR]
Prints one Markdown row per schedule (best of N wall times per phase, nodes, bytes, peak RSS); the
numbers in docs/tracegen.md come from this script.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from xsim.tracegen import generate, load_spec  # noqa: E402
from xsim.tracegen.spec import save_deployment  # noqa: E402


def spec(schedule: str) -> dict:
    """128 H100 ranks: 4 replicas x 4 stages of 8 layers x TP 8, one sequence of 2048 per micro-batch."""
    groups = []
    for r in range(4):
        for k in range(4):
            first = 32 * r + 8 * k
            groups.append(
                {
                    "id": 4 * r + k, "gpu": "H100", "ranks": f"{first}-{first + 7}", "tp": 8,
                    "layers": [8 * k + 1, 8 * k + 8], "micro_batch": 1, "pp_stage": k, "dp_replica": r,
                }
            )  # fmt: skip
    return {
        "name": f"llama2_7b_128_{schedule}",
        "model": "llama2-7b",
        "seq_len": 2048,
        "micro_batches": 8,
        "schedule": schedule,
        "device_groups": groups,
    }


def best(fn, repeat: int):
    times, result = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return min(times), result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out-root", default=None, help="where to write traces (default: a temp folder)")
    args = ap.parse_args()
    root = Path(args.out_root or tempfile.mkdtemp(prefix="bench_gen_"))
    root.mkdir(parents=True, exist_ok=True)
    print(
        "| schedule | load s | generate s | rewrite s | write s | `xsim gen` wall s | nodes | bytes on disk | peak RSS MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for schedule in ("gpipe", "1f1b"):
        spec_path = root / f"{schedule}.yaml"
        spec_path.write_text(yaml.safe_dump(spec(schedule)))
        t_load, dep = best(lambda p=spec_path: load_spec(p), args.repeat)
        t_gen, bundle = best(lambda d=dep: generate(d, rewrite=False), args.repeat)
        t_rw = float("nan")
        try:
            from xsim.tracegen.planner.rewrite import rewrite_bundle

            t_rw, bundle = best(lambda d=dep: rewrite_bundle(generate(d, rewrite=False), d, d.reshard), 1)
            t_rw -= t_gen  # the lambda regenerates: subtract the generate time measured above
        except ImportError:
            pass
        out = root / schedule
        t_write, _ = best(
            lambda b=bundle, o=out, d=dep: (b.write(o, d.name), save_deployment(d, o / "deployment.json")),
            args.repeat,
        )
        nodes = bundle.node_count()
        size = sum(f.stat().st_size for f in out.iterdir())
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        cli = [sys.executable, "-m", "xsim", "gen", str(spec_path), "--out", str(root / f"cli_{schedule}")]
        t_cli, _ = best(
            lambda c=cli, e=env: subprocess.run(c, check=True, env=e, capture_output=True), args.repeat
        )
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"| {schedule} | {t_load:.2f} | {t_gen:.2f} | {t_rw:.2f} | {t_write:.2f} | {t_cli:.2f} | {nodes} | "
            f"{size / 2**20:.1f} MiB | {rss:.0f} |"
        )


if __name__ == "__main__":
    main()
