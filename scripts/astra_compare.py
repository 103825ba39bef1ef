"""Run ASTRA-sim and xsim's ASTRA-sim mode on the same cases and print their times side by side.

Usage:
    python scripts/astra_compare.py CASES_DIR [--astra BIN] [--network NET.yml] [--system SYS.json]
                                    [--congestion-aware] [--timeout S]

A case is any folder under CASES_DIR that holds a Chakra trace set (`<prefix>.<rank>.et`), directly or in a
`trace/` subfolder. Its configs are taken from the folder or its `inputs/` subfolder: the network YAML
(`network.yml` or the only `*.yml`), the system JSON (`sys.json` or `system.json`), an optional
`comm_group.json` and an optional remote-memory JSON (`RemoteMemory.json`; NO_MEMORY_EXPANSION otherwise).
`--network`/`--system` supply the configs for cases without their own (e.g. ASTRA-sim's microbenchmarks
with `Ring_8npus.yml` and `Ring_4chunks.json`). Cases whose NPU count differs from the network's are skipped.

BIN is an ASTRA-sim analytical binary (`AstraSim_Analytical_Congestion_Unaware` or `..._Aware`); without
one (or when it is not executable) the script says so and exits 0 after listing the cases. xsim runs as
`python -m xsim replay ... --json` from this checkout. The table: NPUs, ASTRA-sim and xsim finish (max over
ranks, ns), difference, whether every rank's finish agrees, and both wall times (whole process each);
then every rank's finish under "per rank": ranks with the same pair of times on one line (rank lists
compressed to ranges), so a tree's positions or one stray rank show up without scanning 512 lines.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
# Workload.cc prints one line per NPU when it finishes: "sys[<id>] finished, <cycles> cycles, ...".
FINISHED = re.compile(r"sys\[(\d+)\] finished, (\d+) cycles")
ET_NAME = re.compile(r"^(.*)\.(\d+)\.et$")


@dataclass(frozen=True)
class Case:
    """One comparison: a trace prefix and the configs both simulators read."""

    name: str
    prefix: Path
    ranks: int
    network: Path
    system: Path
    groups: Path | None
    memory: Path | None


@dataclass(frozen=True)
class Run:
    """What one simulator produced: per-rank finish times (ns) and the wall time of its process."""

    finish: tuple[int, ...] | None
    wall_s: float
    error: str = ""


def trace_prefix(folder: Path) -> tuple[Path, int] | None:
    """The <prefix> of the .et set in folder (and its rank count), or None."""
    groups: dict[str, set[int]] = {}
    for f in folder.glob("*.et"):
        m = ET_NAME.match(f.name)
        if m:
            groups.setdefault(m.group(1), set()).add(int(m.group(2)))
    for name, ranks in sorted(groups.items()):
        if ranks == set(range(len(ranks))):
            return folder / name, len(ranks)
    return None


def _pick(folders: list[Path], names: tuple[str, ...], suffix: str) -> Path | None:
    for d in folders:
        for n in names:
            if (d / n).is_file():
                return d / n
        found = sorted(d.glob(f"*{suffix}"))
        if len(found) == 1:
            return found[0]
    return None


def npus_of(network: Path) -> int:
    """Product of npus_count in an ASTRA-sim network YAML."""
    doc = yaml.safe_load(network.read_text(encoding="utf-8"))
    n = 1
    for c in doc["npus_count"]:
        n *= int(c)
    return n


def find_cases(root: Path, network: Path | None, system: Path | None) -> list[Case]:
    """Every folder under root holding a trace set (directly or in trace/), with its configs."""
    cases = []
    for d in sorted({p.parent for p in root.rglob("*.et")}):
        found = trace_prefix(d)
        if found is None:
            continue
        prefix, ranks = found
        home = d.parent if d.name == "trace" else d
        where = [home / "inputs", home, d]
        net = _pick(where, ("network.yml",), ".yml") or network
        sysj = _pick(where, ("sys.json", "system.json"), "sys.json") or system
        if net is None or sysj is None or npus_of(net) != ranks:
            continue
        groups = _pick(where, ("comm_group.json",), "comm_group.json")
        memory = _pick(where, ("RemoteMemory.json", "remote_memory.json"), "RemoteMemory.json")
        cases.append(Case(str(d.relative_to(root)), prefix, ranks, net, sysj, groups, memory))
    return cases


def run_astra(binary: Path, case: Case, timeout: float, scratch: Path) -> Run:
    """Run ASTRA-sim on a case; parse every rank's finish line."""
    memory = case.memory
    if memory is None:
        memory = scratch / "no_memory_expansion.json"
        memory.write_text(json.dumps({"memory-type": "NO_MEMORY_EXPANSION"}))
    cmd = [
        str(binary),
        f"--workload-configuration={case.prefix}",
        f"--system-configuration={case.system}",
        f"--network-configuration={case.network}",
        f"--remote-memory-configuration={memory}",
        f"--logging-folder={scratch / 'log'}",
    ]
    if case.groups is not None:
        cmd.append(f"--comm-group-configuration={case.groups}")
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Run(None, time.perf_counter() - t0, f"timeout after {timeout:g} s")
    wall = time.perf_counter() - t0
    per = {int(r): int(c) for r, c in FINISHED.findall(out.stdout + out.stderr)}
    if len(per) != case.ranks:
        # ASTRA-sim can crash after every rank has finished (communicator groups); the finish lines count.
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or [f"exit {out.returncode}"]
        return Run(None, wall, f"{len(per)}/{case.ranks} ranks finished: {tail[0][:60]}")
    return Run(tuple(per[r] for r in range(case.ranks)), wall)


def run_xsim(case: Case, aware: bool, timeout: float) -> Run:
    """Replay the case with `python -m xsim replay --json` from this checkout."""
    cmd = [sys.executable, "-m", "xsim", "replay", str(case.prefix), "--astra-network", str(case.network)]
    cmd += ["--astra-system", str(case.system), "--json"]
    if case.groups is not None:
        cmd += ["--comm-groups", str(case.groups)]
    if aware:
        cmd.append("--congestion-aware")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        return Run(None, time.perf_counter() - t0, f"timeout after {timeout:g} s")
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        return Run(None, wall, (out.stderr.strip().splitlines() or ["failed"])[-1][:80])
    return Run(tuple(json.loads(out.stdout)["per_rank_finish_ns"]), wall)


def _ns(r: Run) -> str:
    return f"{max(r.finish):,}" if r.finish else r.error or "-"


def table(rows: list[tuple[Case, Run | None, Run]]) -> str:
    """The side-by-side table as aligned text."""
    head = ("case", "NPUs", "ASTRA-sim ns", "xsim ns", "diff ns", "ranks agree", "ASTRA-sim s", "xsim s")
    lines = [head]
    for case, a, x in rows:
        diff = agree = "-"
        if a is not None and a.finish and x.finish:
            diff = f"{max(x.finish) - max(a.finish):+,}"
            agree = "yes" if a.finish == x.finish else "no"
        lines.append(
            (
                case.name,
                str(case.ranks),
                _ns(a) if a is not None else "not run",
                _ns(x),
                diff,
                agree,
                f"{a.wall_s:.2f}" if a is not None else "-",
                f"{x.wall_s:.2f}",
            )
        )
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in lines)


def rank_list(ranks: list[int]) -> str:
    """Ascending ranks as "0-3,8,10-11"; three or more at a constant step as "1-63/2" (a tree's levels)."""
    parts, i = [], 0
    while i < len(ranks):
        j = i
        if i + 1 < len(ranks):
            step = ranks[i + 1] - ranks[i]
            while j + 1 < len(ranks) and ranks[j + 1] - ranks[j] == step:
                j += 1
            if j - i < 2 and step != 1:
                j = i  # two ranks at a step > 1: listed one by one
        if i == j:
            parts.append(str(ranks[i]))
        elif ranks[i + 1] - ranks[i] == 1:
            parts.append(f"{ranks[i]}-{ranks[j]}")
        else:
            parts.append(f"{ranks[i]}-{ranks[j]}/{ranks[i + 1] - ranks[i]}")
        i = j + 1
    return ",".join(parts)


def per_rank(rows: list[tuple[Case, Run | None, Run]]) -> str:
    """Every rank's finish of every case, ranks with equal (ASTRA-sim, xsim) times grouped on one line."""
    lines = [("case", "ranks", "ASTRA-sim ns", "xsim ns", "diff ns")]
    for case, a, x in rows:
        have_a = a is not None and a.finish is not None
        if not have_a and not x.finish:
            continue
        groups: dict[tuple, list[int]] = {}
        for r in range(case.ranks):
            key = (a.finish[r] if have_a else None, x.finish[r] if x.finish else None)
            groups.setdefault(key, []).append(r)
        for (at, xt), ranks in sorted(groups.items(), key=lambda kv: kv[1][0]):
            diff = f"{xt - at:+,}" if at is not None and xt is not None else "-"
            show = [f"{v:,}" if v is not None else "-" for v in (at, xt)]
            lines.append((case.name, rank_list(ranks), *show, diff))
    widths = [max(len(r[i]) for r in lines) for i in range(len(lines[0]))]
    body = ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in lines]
    return "per rank:\n" + "\n".join(body)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run both simulators on every case, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", type=Path, help="folder searched for trace sets")
    ap.add_argument("--astra", type=Path, help="ASTRA-sim analytical binary")
    ap.add_argument("--network", type=Path, help="network YAML for cases without their own")
    ap.add_argument("--system", type=Path, help="system JSON for cases without their own")
    ap.add_argument("--congestion-aware", action="store_true", help="xsim's congestion-aware mode")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run (default 600)")
    args = ap.parse_args(argv)
    if not args.cases.is_dir():
        print(f"astra_compare: {args.cases} is not a folder", file=sys.stderr)
        return 2
    cases = find_cases(args.cases, args.network, args.system)
    if not cases:
        print(f"astra_compare: no case (trace set with matching configs) under {args.cases}")
        return 0
    binary = args.astra
    have = binary is not None and binary.is_file() and os.access(binary, os.X_OK)
    if not have:
        print(f"astra_compare: no ASTRA-sim binary ({binary or 'none given'}): running xsim only")
    aware = args.congestion_aware or (have and "Aware" in binary.name and "Unaware" not in binary.name)
    rows = []
    with tempfile.TemporaryDirectory(prefix="astra_compare_") as tmp:
        for case in cases:
            a = run_astra(binary, case, args.timeout, Path(tmp)) if have else None
            rows.append((case, a, run_xsim(case, aware, args.timeout)))
    print(table(rows))
    print(per_rank(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
