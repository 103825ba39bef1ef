"""Benchmark the issue-24 plan end to end: a Llama-3-405B-like model, TP 8 x PP 16 x DP, `xsim gen` then
`xsim replay --out` (every table for every rank), each its own process, timed with /usr/bin/time.

Usage: python scripts/bench_llama3_405b.py --dp 2 8 [--root DIR] [--mem-gib 8] [--timeout 600] [--no-fold]

The plan (issue 24): 126 layers, hidden 16,384, FFN 53,248, 128 heads, 8 KV heads, vocabulary 128,256
(Llama 3 paper, arXiv:2407.21783, Table 3), 126 layers over 16 stages as 7, 8 x 14, 7 (section 3.3.2:
one layer fewer on the first and last stage), sequence 8,192, micro-batch 1, 16 micro-batches per pipeline
(16M tokens per batch at DP 128: 2,048 sequences / 128 replicas), H100, `cluster: dgx-h100`. DP below 128
keeps the per-rank program (16 micro-batches) and shrinks the GPU count, so the rows show how the cost
grows with the GPU count. Each command runs under `ulimit -v` (--mem-gib) and `timeout`; a row reports
wall and CPU (user + sys) seconds, peak RSS, the bytes written, the fold line of the replay and the
1-minute load average before and after (wall times on shared cores mean something only at low load).
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

MODEL = {"name": "llama3-405b", "layers": 126, "hidden": 16384, "ffn_hidden": 53248, "heads": 128,
         "kv_heads": 8, "vocab": 128256, "seq_len": 8192}  # fmt: skip


def spec(dp: int) -> dict:
    """The plan at `dp` replicas (TP 8 x PP 16 x dp GPUs)."""
    return {
        "name": f"l405_dp{dp}",
        "model": MODEL,
        "micro_batches": 16,
        "schedule": "1f1b",
        "cluster": "dgx-h100",
        "parallel": {
            "gpu": "H100",
            "tp": 8,
            "pp": 16,
            "dp": dp,
            "first_stage_layers": 7,
            "last_stage_layers": 7,
        },
    }


def timed(cmd: list[str], mem_gib: float, timeout: int) -> dict:
    """Run `cmd` under ulimit -v and timeout; wall, CPU seconds, peak RSS (MiB), exit code, output tail."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    kib = int(mem_gib * 2**20)
    shell = f"ulimit -v {kib}; exec /usr/bin/time -f '@@ %e %U %S %M' timeout {timeout} " + " ".join(cmd)
    r = subprocess.run(["bash", "-c", shell], env=env, capture_output=True, text=True)
    line = next((ln for ln in r.stderr.splitlines() if ln.startswith("@@ ")), "@@ 0 0 0 0")
    wall, user, sys_, rss = line.split()[1:]
    return {
        "rc": r.returncode,
        "wall_s": float(wall),
        "cpu_s": float(user) + float(sys_),
        "rss_mib": int(rss) // 1024,
        "out": (r.stdout + "\n".join(ln for ln in r.stderr.splitlines() if not ln.startswith("@@ "))).strip(),
    }


def du(path: Path) -> int:
    """Bytes of the files under path."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    """One Markdown row per DP."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dp", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--root", type=Path, default=Path("/tmp/bench_l405"))
    ap.add_argument("--mem-gib", type=float, default=8.0)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--no-fold", action="store_true")
    a = ap.parse_args()
    py = sys.executable
    print(
        "| GPUs | gen wall / CPU s, peak MiB | set GB | replay wall / CPU s, peak MiB | tables GB | fold "
        "| load before / after |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for dp in a.dp:
        load0 = os.getloadavg()[0]  # other processes on the cores: wall times are only comparable at low load
        d = a.root / f"dp{dp}"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        (d / "spec.json").write_text(json.dumps(spec(dp)))
        g = timed(
            [py, "-m", "xsim", "gen", str(d / "spec.json"), "--out", str(d / "set")], a.mem_gib, a.timeout
        )
        if g["rc"] != 0:
            print(f"| {128 * dp:,} | failed rc {g['rc']}: {g['out'][-300:]} | | | | | |", flush=True)
            continue
        replay = [py, "-m", "xsim", "replay", str(d / "set"), "--out", str(d / "out"), "--no-progress"]
        r = timed(replay + (["--no-fold"] if a.no_fold else []), a.mem_gib, a.timeout)
        fold = next((ln for ln in r["out"].splitlines() if "fold" in ln), "").strip()
        rep = (
            f"{r['wall_s']:.1f} / {r['cpu_s']:.1f}, {r['rss_mib']:,}"
            if r["rc"] == 0
            else f"failed rc {r['rc']}: {r['out'][-200:]}"
        )
        tables = du(d / "out") / 1e9 if (d / "out").is_dir() else 0.0
        print(
            f"| {128 * dp:,} | {g['wall_s']:.1f} / {g['cpu_s']:.1f}, {g['rss_mib']:,} | {du(d / 'set') / 1e9:.2f} "
            f"| {rep} | {tables:.2f} | {' '.join(fold.split())} | {load0:.1f} / {os.getloadavg()[0]:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
