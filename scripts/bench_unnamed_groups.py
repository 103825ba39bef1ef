"""Peak RSS of `xsim replay` on N ranks whose collectives name no group (pg_name absent) against the same
set whose collectives name a group of every rank (issue 31 item 1).

Usage: .venv/bin/python scripts/bench_unnamed_groups.py [--ranks 1024 8192 65536] [--colls 2] [--root DIR]

Each rank's trace is one compute node followed by `--colls` AllReduces of 1 MiB in a chain; the named set
adds `comm_group.json` = {"1": [0..N-1]} and sets pg_name "1" on every collective, the unnamed set has no
pg_name (ASTRA-sim: every rank). Each replay runs in its own child process (`xsim replay --no-progress
--topology ring:N:50GBps:500ns --out ...`) and reports wall seconds and that child's own peak RSS
(os.wait4's ru_maxrss). Prints one Markdown row per N; docs/performance.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from xsim.traces import pb  # noqa: E402
from xsim.traces.attrs import make_attr, make_node  # noqa: E402
from xsim.traces.stream import write_et  # noqa: E402


def rank_nodes(colls: int, named: bool) -> list[pb.Node]:
    """One compute node, then COLLS chained 1 MiB AllReduces (pg_name "1" when NAMED, none otherwise)."""
    nodes = [make_node(1, "k1", pb.COMP_NODE, duration_micros=10)]
    for i in range(colls):
        n = make_node(
            i + 2, f"ar{i}", pb.COMM_COLL_NODE, data_deps=[i + 1], attrs={"comm_type": pb.ALL_REDUCE}
        )
        n.attr.append(make_attr("comm_size", 1 << 20))
        if named:
            n.attr.append(make_attr("pg_name", "1"))
        nodes.append(n)
    return nodes


def write_set(folder: Path, ranks: int, colls: int, named: bool) -> None:
    """N identical rank files `t.<r>.et` (written once, copied), plus comm_group.json when NAMED."""
    folder.mkdir(parents=True)
    first = folder / "t.0.et"
    write_et(first, rank_nodes(colls, named))
    for r in range(1, ranks):
        shutil.copyfile(first, folder / f"t.{r}.et")
    if named:
        (folder / "comm_group.json").write_text(json.dumps({"1": list(range(ranks))}))


def replay(folder: Path, ranks: int) -> tuple[float, int, int]:
    """(wall s, peak RSS bytes, exit status) of one `xsim replay` child on FOLDER."""
    argv = [sys.executable, "-m", "xsim", "replay", str(folder), "--no-progress"]
    argv += ["--topology", f"ring:{ranks}:50GBps:500ns", "--out", str(folder / "out")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode() if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"replay of {folder} exited {code}: {err.strip()[-400:]}")
    return wall, usage.ru_maxrss * 1024, code  # Linux reports ru_maxrss in KiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024, 8192, 65536])
    ap.add_argument("--colls", type=int, default=2)
    ap.add_argument("--root", type=Path, default=None, help="where to write the sets (default: a temp dir)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="xsim-bench-groups-", dir=args.root))
    print(
        "| ranks | collectives/rank | named: wall s | named: peak RSS MiB | unnamed: wall s "
        "| unnamed: peak RSS MiB | unnamed / named |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    try:
        for n in args.ranks:
            res = {}
            for named in (True, False):
                folder = root / f"{n}-{'named' if named else 'unnamed'}"
                write_set(folder, n, args.colls, named)
                res[named] = replay(folder, n)
                shutil.rmtree(folder)
            (wn, rn, _), (wu, ru, _) = res[True], res[False]
            print(
                f"| {n:,} | {args.colls} | {wn:.1f} | {rn / 2**20:,.0f} | {wu:.1f} | {ru / 2**20:,.0f} "
                f"| {ru / rn:.2f} |",
                flush=True,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
