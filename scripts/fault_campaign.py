"""Fault-injection campaign (issue 27): kill, interrupt, fill or freeze xsim's writers and check the data.

For each verb (`gen`, `replay --out`, `sweep` of two specs) and fault, a trial runs the verb over the output of
an earlier run of *other* inputs (the old data), injects the fault, and classifies every output folder:
the old data byte for byte, the new data byte for byte (a clean run's), or a **mix** (the failure this
guards against). Then it reruns the verb: the rerun must exit 0, leave exactly the new data and no hidden
leftovers beside it. Any traceback on stderr counts as one too. The next trial goes back the other way, so
each rerun is the next trial's old data.

Faults: SIGKILL, SIGTERM, SIGINT sent at a random time of the run (uniform over a clean run's wall time)
or at a random write point (the k-th file, or the moment before the swap: XSIM_FAULT, traces/outputs.py);
ENOSPC and EROFS injected at a random file (the injectable writer: the OSError a full or read-only file
system raises); two writers of different inputs started together on one folder.

    python scripts/fault_campaign.py --trials 20 --seed 2027            # the longer campaign
    python scripts/fault_campaign.py --trials 1 --verbs gen --json      # one trial per cell

Each trial draws from random.Random(f"{seed}:{verb}:{fault}:{i}"), so a cell reruns alone.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = """name: {name}
model: {{name: tiny, layers: 4, hidden: 256, ffn_hidden: 688, heads: 8, vocab: 1000, seq_len: 128}}
micro_batches: {mb}
device_groups:
  - {{gpu: H100, ranks: [0, 1], tp: 2, layers: [1, 2], micro_batch: 1, pp_stage: 0}}
  - {{gpu: A100, ranks: [2, 3], tp: 2, layers: [3, 4], micro_batch: 1, pp_stage: 1}}
"""
SIGNALS = ("KILL", "TERM", "INT")
DISK = ("ENOSPC", "EROFS")
FAULTS = (*SIGNALS, *DISK, "concurrent")
VERBS = ("gen", "replay", "sweep")
VOLATILE = {"perf.json"}  # wall time: differs between identical runs (replay/result.py)
MEM = 2 << 30


@dataclass
class Cell:
    """Counts of one verb x fault."""

    trials: int = 0
    old: int = 0  # every folder as before
    new: int = 0  # every folder as a clean run writes it
    partial: int = 0  # some folders old, some new, each whole (a sweep stopped between plans)
    mixes: int = 0  # a folder that is neither: data lost or mixed
    tracebacks: int = 0
    rerun_failures: int = 0
    notes: list[str] = field(default_factory=list)


def _bound() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEM, MEM))


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (hidden too), but wall-time files -> SHA-256."""
    out = {}
    if folder.is_dir():
        for p in sorted(folder.rglob("*")):
            if p.is_file() and p.name not in VOLATILE:
                out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


class Verb:
    """One verb's old and new inputs, its command line, and the folders it writes."""

    def __init__(self, name: str, work: Path) -> None:
        self.name, self.work = name, work
        for mb in (2, 3):
            for s in ("a", "b"):
                (work / f"{s}{mb}.yaml").write_text(SPEC.format(name=s, mb=mb))
        if name == "replay":  # two sets to replay, made once
            for mb in (2, 3):
                self._xsim("gen", f"a{mb}.yaml", "--out", f"set{mb}")

    def argv(self, side: int) -> list[str]:
        mb = (2, 3)[side]
        if self.name == "gen":
            return ["gen", f"a{mb}.yaml", "--out", "out"]
        if self.name == "replay":
            return ["replay", f"set{mb}", "--no-progress", "--out", "out", "--timeline", "out/timeline.json"]
        return ["sweep", f"a{mb}.yaml", f"b{mb}.yaml", "--out", "out"]

    def folders(self) -> list[str]:
        if self.name == "sweep":
            return [f"out/{s}/{k}" for s in ("a", "b") for k in ("traces", "result")]
        return ["out"]

    def state(self) -> dict[str, dict[str, str]]:
        return {f: snapshot(self.work / f) for f in self.folders()}

    def popen(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        return subprocess.Popen(
            [sys.executable, "-m", "xsim", *argv], cwd=self.work, env=full, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, preexec_fn=_bound,
        )  # fmt: skip

    def _xsim(self, *argv: str, env: dict[str, str] | None = None) -> tuple[int, str]:
        p = self.popen(list(argv), env)
        _, err = p.communicate(timeout=300)
        return p.returncode, err


def leftovers(work: Path) -> list[str]:
    """Hidden entries an interrupted writer could leave (staging folders, temporary files, locks)."""
    return sorted(
        str(p.relative_to(work)) for p in work.rglob(".*") if "xsim" in p.name or p.name.endswith(".tmp")
    )


def run_campaign(
    work: Path, seed: int, trials: int, verbs=VERBS, faults=FAULTS
) -> dict[str, dict[str, Cell]]:
    """Run `trials` trials of every verb x fault under `work`; returns the counts per verb and fault."""
    out: dict[str, dict[str, Cell]] = {}
    for verb_name in verbs:
        vdir = work / verb_name
        vdir.mkdir(parents=True, exist_ok=True)
        verb = Verb(verb_name, vdir)
        # Clean runs: the expected folders of each side, and how long a run takes (for random kill times).
        clean: list[dict[str, dict[str, str]]] = []
        walls = []
        for side in (0, 1):
            t0 = time.monotonic()
            rc, err = verb._xsim(*verb.argv(side))
            walls.append(time.monotonic() - t0)
            assert rc == 0, err
            clean.append(verb.state())
        side = 1  # the folder now holds side 1: the first trial writes side 0 over it
        cells = out.setdefault(verb_name, {})
        for fault in faults:
            if fault == "concurrent" and verb_name == "sweep":
                continue  # a sweep's plans are gen + replay folders: covered by those verbs
            cell = cells.setdefault(fault, Cell())
            for i in range(trials):
                rng = random.Random(f"{seed}:{verb_name}:{fault}:{i}")
                new = 1 - side
                before = verb.state()
                errs = _trial(verb, fault, new, rng, max(walls))
                cell.trials += 1
                cell.tracebacks += sum("Traceback" in e for e in errs)
                now = verb.state()
                kinds = []
                for f in verb.folders():
                    if now[f] == before[f]:
                        kinds.append("old")
                    elif now[f] == clean[new][f]:
                        kinds.append("new")
                    elif fault == "concurrent" and now[f] == clean[side][f]:
                        kinds.append("new")  # the other writer's whole set, written last
                    elif not now[f] and verb_name == "sweep":
                        kinds.append("old")  # a plan folder not reached yet
                    else:
                        kinds.append("mix")
                        cell.notes.append(f"trial {i}: {f} is neither the old nor the new data")
                if "mix" in kinds:
                    cell.mixes += 1
                elif all(k == "old" for k in kinds):
                    cell.old += 1
                elif all(k == "new" for k in kinds):
                    cell.new += 1
                else:
                    cell.partial += 1
                rc, err = verb._xsim(*verb.argv(new))
                if rc != 0 or verb.state() != clean[new] or leftovers(vdir):
                    cell.rerun_failures += 1
                    cell.notes.append(f"trial {i}: rerun rc {rc}, leftovers {leftovers(vdir)}: {err[-300:]}")
                cell.tracebacks += "Traceback" in err
                side = new
    return out


def _trial(verb: Verb, fault: str, side: int, rng: random.Random, wall: float) -> list[str]:
    """Run the verb writing `side` with `fault`; returns the stderr of each process."""
    if fault == "concurrent":
        procs = [verb.popen(verb.argv(side)), verb.popen(verb.argv(1 - side))]
        return [p.communicate(timeout=300)[1] for p in procs]
    if fault in DISK:
        env = {"XSIM_FAULT": f"file@{rng.randint(1, 6)}:{fault}"}
        p = verb.popen(verb.argv(side), env)
        return [p.communicate(timeout=300)[1]]
    if rng.random() < 0.5:  # at a write point: the k-th file, or just before the swap
        point = "stage" if rng.random() < 0.25 else f"file@{rng.randint(1, 6)}"
        p = verb.popen(verb.argv(side), {"XSIM_FAULT": f"{point}:{fault}"})
        return [p.communicate(timeout=300)[1]]
    p = verb.popen(verb.argv(side))
    time.sleep(rng.uniform(0.2, 1.0) * wall)  # at a random time of the run
    if p.poll() is None:
        p.send_signal(getattr(signal, f"SIG{fault}"))
    return [p.communicate(timeout=300)[1]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10, help="trials per verb and fault (default 10)")
    ap.add_argument("--seed", type=int, default=2027)
    ap.add_argument("--verbs", nargs="+", choices=VERBS, default=list(VERBS))
    ap.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    ap.add_argument("--work", help="working folder (default: a temporary one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    import tempfile

    work = Path(args.work or tempfile.mkdtemp(prefix="xsim-faults."))
    t0 = time.monotonic()
    res = run_campaign(work, args.seed, args.trials, args.verbs, args.faults)
    if args.json:
        print(json.dumps({v: {f: asdict(c) for f, c in cs.items()} for v, cs in res.items()}, indent=1))
    else:
        print(
            "| verb | fault | trials | old kept | new whole | partial (whole folders) | mixes | tracebacks | rerun failures |"
        )
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for v, cs in res.items():
            for f, c in cs.items():
                print(
                    f"| {v} | {f} | {c.trials} | {c.old} | {c.new} | {c.partial} | {c.mixes} | {c.tracebacks} | {c.rerun_failures} |"
                )
        for v, cs in res.items():
            for f, c in cs.items():
                for n in c.notes:
                    print(f"{v} {f}: {n}")
        print(f"{time.monotonic() - t0:.0f} s wall, seed {args.seed}")
    bad = sum(c.mixes + c.tracebacks + c.rerun_failures for cs in res.values() for c in cs.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
