"""Start-up benchmark: wall and CPU time of `xsim --help` and of small replays (issue 11 item 4).

Each case runs as a fresh `python -m xsim` process, N times; with --baseline (another source tree, e.g. a
`git archive` of main) the two trees alternate run by run (A B A B ...) so that machine load hits both
alike, and the table gives both medians and their ratio. Targets: `xsim --help` <= 0.2 s, a 2- to
8-rank replay <= 0.5 s wall.

    python scripts/bench_startup.py --runs 9
    python scripts/bench_startup.py --runs 9 --baseline /tmp/xsim-main --work /tmp/bench-startup
    python scripts/bench_startup.py --runs 15 --baseline /tmp/xsim-main --replay /tmp/c13 --only /tmp/c13
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
ET = SHARED / "peer_traces" / "chakra_et"
CFG = SHARED / "peer_configs" / "astra-sim"


BYTECODE = True  # --no-bytecode-cache sets False


def run_once(tree: Path, args: list[str]) -> tuple[float, float]:
    """(wall s, user+sys CPU s) of one `python -m xsim ARGS` with `tree` first on the path."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    if BYTECODE:
        # As an installed package runs: .pyc files cached (this environment sets PYTHONDONTWRITEBYTECODE,
        # which makes every run compile every module of the project again).
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    t0 = time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, "-m", "xsim", *args],
        env=env,
        cwd=tree,  # `python -m` puts the working folder first on sys.path, before PYTHONPATH
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _pid, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"xsim {' '.join(args)} (PYTHONPATH={tree}) failed: {p.stderr.read().decode()}")
    p.stderr.close()
    return wall, ru.ru_utime + ru.ru_stime


def cases(work: Path, extra: list[str]) -> list[tuple[str, list[str]]]:
    """(label, xsim arguments): --help, a 2-rank and an 8-rank generated set, 8-NPU peer traces and the
    replays of the `extra` trace sets."""
    out: list[tuple[str, list[str]]] = [("xsim --help", ["--help"])]
    out += [(f"replay {path}", ["replay", path, "--no-progress"]) for path in extra]
    for spec, label in (("table4_c01", "2-rank C01"), ("table4_c13", "8-rank C13")):
        d = work / spec
        if not (d / "deployment.json").is_file():
            run_once(ROOT, ["gen", str(ROOT / "examples" / f"{spec}.yaml"), "--out", str(d)])
        out.append((f"replay {label}", ["replay", str(d), "--no-progress"]))
        out.append((f"replay {label} --out", ["replay", str(d), "--no-progress", "--out", str(work / "out")]))
    # Peer 8-NPU traces (ASTRA-sim's own files, read from ../shared when present), in ASTRA-sim mode.
    ar8 = ET / "astra-sim_microbenchmarks/all_reduce/8npus_1MB"
    if ar8.is_dir() and CFG.is_dir():
        net, sys_ = (
            CFG / "network/repo_examples_Ring_8npus.yml",
            CFG / "system/repo_examples_Ring_4chunks.json",
        )
        args = ["replay", str(ar8), "--astra-network", str(net), "--astra-system", str(sys_), "--no-progress"]
        out.append(("replay peer 8-NPU all_reduce (ASTRA mode)", args))
    t3d = ET / "astra-sim-artifacts_T3D-analytical"
    if t3d.is_dir():
        inp = t3d / "inputs"
        args = ["replay", str(t3d / "trace"), "--astra-network", str(inp / "network.yml")]
        args += ["--astra-system", str(inp / "sys.json"), "--comm-groups", str(inp / "comm_group.json")]
        out.append(("replay peer 8-NPU T3D (ASTRA mode)", [*args, "--no-progress"]))
    return out


def main() -> None:
    """Measure every case and print a Markdown table of medians."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="runs per case and tree (default 7)")
    ap.add_argument("--baseline", type=Path, help="another source tree to compare with, alternating")
    ap.add_argument("--work", type=Path, help="folder for the generated inputs (default: a temp folder)")
    ap.add_argument(
        "--replay",
        action="append",
        default=[],
        metavar="PATH",
        help="also time `xsim replay PATH`; repeatable",
    )
    ap.add_argument("--only", metavar="TEXT", help="only the cases whose label contains TEXT")
    ap.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="compile every module on every run (PYTHONDONTWRITEBYTECODE=1, no __pycache__ written)",
    )
    a = ap.parse_args()
    global BYTECODE
    BYTECODE = not a.no_bytecode_cache
    work = a.work or Path(tempfile.mkdtemp(prefix="bench-startup-"))
    work.mkdir(parents=True, exist_ok=True)
    trees = [("this", ROOT)] + ([("baseline", a.baseline.resolve())] if a.baseline else [])
    rows = []
    for label, args in cases(work, a.replay):
        if a.only and a.only not in label:
            continue
        for _tree_label, tree in trees:
            run_once(tree, args)  # warm the file cache and the .pyc files
        walls: dict[str, list[float]] = {t: [] for t, _ in trees}
        cpus: dict[str, list[float]] = {t: [] for t, _ in trees}
        for _ in range(a.runs):
            for t, tree in trees:
                w, c = run_once(tree, args)
                walls[t].append(w)
                cpus[t].append(c)
        rows.append((label, {t: (statistics.median(walls[t]), statistics.median(cpus[t])) for t, _ in trees}))
        print(f"{label}: done", file=sys.stderr, flush=True)
    load = os.getloadavg()[0]
    cache = "cached .pyc" if BYTECODE else "no .pyc cache (every module compiled per run)"
    print(
        f"\nmedian of {a.runs} runs per case, fresh `python -m xsim` processes, {cache}; load average {load:.1f}\n"
    )
    if a.baseline:
        head = (
            "| case | baseline wall s | this wall s | wall ratio | baseline CPU s | this CPU s | CPU ratio |"
        )
        print(head)
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for label, m in rows:
            (bw, bc), (tw, tc) = m["baseline"], m["this"]
            print(
                f"| {label} | {bw:.3f} | {tw:.3f} | {bw / tw:.2f}x | {bc:.3f} | {tc:.3f} | {bc / tc:.2f}x |"
            )
    else:
        print("| case | wall s | CPU s |")
        print("| --- | --- | --- |")
        for label, m in rows:
            w, c = m["this"]
            print(f"| {label} | {w:.3f} | {c:.3f} |")


if __name__ == "__main__":
    main()
