"""Benchmark issue 24's heterogeneous plans end to end: `xsim gen` then `xsim replay --model flow` (exact),
each its own process, timed with /usr/bin/time (CPU = user + sys).

Usage: python scripts/bench_hetero.py [--plans hetero1024 hetero192] [--all-ranks] [--models flow analytical]
                                      [--root DIR] [--timeout 900]

The plans: examples/hetero1024.yaml (32 replicas of two kinds, resharded A100 stages, written whole) and
examples/hetero192.yaml (192 replicas of two shapes, H100 TP 4/2 stages feeding A100 TP 4/2 stages,
written compact: one super-replica of both classes and classes.json). --all-ranks writes every rank's file
(the sets before compact heterogeneous sets). A row reports wall and CPU seconds, peak RSS, the files
written and the replay's iteration time and fold line, so two trees can be compared row by row
(PYTHONPATH decides which tree runs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], timeout: int) -> dict:
    """Run `cmd` under timeout; wall, CPU seconds, peak RSS (MiB), exit code, output."""
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", str(REPO)))
    shell = f"exec /usr/bin/time -f '@@ %e %U %S %M' timeout {timeout} " + " ".join(cmd)
    r = subprocess.run(["bash", "-c", shell], env=env, capture_output=True, text=True)
    line = next((ln for ln in r.stderr.splitlines() if ln.startswith("@@ ")), "@@ 0 0 0 0")
    wall, user, sys_, rss = line.split()[1:]
    return {
        "rc": r.returncode,
        "wall_s": float(wall),
        "cpu_s": float(user) + float(sys_),
        "rss_mib": int(rss) // 1024,
        "out": r.stdout.strip(),
        "err": "\n".join(ln for ln in r.stderr.splitlines() if not ln.startswith("@@ ")).strip(),
    }


def main() -> None:
    """One Markdown row per plan and model."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", nargs="+", default=["hetero1024", "hetero192"])
    ap.add_argument("--models", nargs="+", default=["flow"])
    ap.add_argument("--all-ranks", action="store_true")
    ap.add_argument("--root", type=Path, default=Path("/tmp/bench_hetero"))
    ap.add_argument("--timeout", type=int, default=900)
    a = ap.parse_args()
    py = sys.executable
    print(
        "| plan | gen wall / CPU s, peak MiB | files | model | replay wall / CPU s, peak MiB | iteration ns | fold |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for plan in a.plans:
        d = a.root / plan
        shutil.rmtree(d, ignore_errors=True)
        gen = [py, "-m", "xsim", "gen", str(REPO / "examples" / f"{plan}.yaml"), "--out", str(d / "set")]
        g = timed(gen + (["--all-ranks"] if a.all_ranks else []), a.timeout)
        if g["rc"] != 0:
            print(f"| {plan} | failed rc {g['rc']}: {g['err'][-300:]} | | | | | |", flush=True)
            continue
        files = len(list((d / "set").glob("*.et")))
        for model in a.models:
            replay = [py, "-m", "xsim", "replay", str(d / "set"), "--model", model, "--no-progress", "--json"]
            r = timed(replay, a.timeout)
            if r["rc"] != 0:
                print(f"| {plan} | | | {model} | failed rc {r['rc']}: {r['err'][-200:]} | | |", flush=True)
                continue
            doc = json.loads(r["out"])
            perf = doc.get("perf", {})
            print(
                f"| {plan} | {g['wall_s']:.1f} / {g['cpu_s']:.1f}, {g['rss_mib']:,} | {files:,} | {model} "
                f"| {r['wall_s']:.1f} / {r['cpu_s']:.1f}, {r['rss_mib']:,} | {doc.get('iteration_time_ns', '?')} "
                f"| {perf.get('fold', '?')} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
