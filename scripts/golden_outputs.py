"""Golden replay outputs: replay a fixed list of trace sets and keep every deterministic output file.

Run once before a change of the replay core and once after, then compare the two folders byte by byte
(`diff -r`); perf.json (wall time) is left out. Inputs are generated into `<out>/inputs` on the first run
and reused, so both runs replay the very same files.

    python scripts/golden_outputs.py --out /tmp/core-golden/before
    python scripts/golden_outputs.py --out /tmp/core-golden/after --inputs /tmp/core-golden/before/inputs
    diff -r /tmp/core-golden/before/results /tmp/core-golden/after/results
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
ET = SHARED / "peer_traces" / "chakra_et"
CFG = SHARED / "peer_configs" / "astra-sim"
PT = ROOT / "traces" / "examples" / "pytorch"


def _xsim(*args: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "xsim", *args], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"xsim {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}")


def make_inputs(inputs: Path) -> None:
    """Generate the spec traces and the PyTorch imports once."""
    for spec in ("figure1", "table4_c01", "table4_c13"):
        if not (inputs / spec).is_dir():
            _xsim("gen", str(ROOT / "examples" / f"{spec}.yaml"), "--out", str(inputs / spec))
    for name in ("tinygpt_2rank", "tinygpt_pp2"):
        if not (inputs / name).is_dir():
            ets = [str(PT / f"{name}_et.{r}.json.gz") for r in range(2)]
            kin = [str(PT / f"{name}_kineto.{r}.json.gz") for r in range(2)]
            _xsim("import", "pytorch", "--et", *ets, "--kineto", *kin, "--out", str(inputs / name / name))


def cases(inputs: Path) -> list[tuple[str, list[str]]]:
    """(case name, replay arguments)."""
    out: list[tuple[str, list[str]]] = []
    for spec in ("figure1", "table4_c01", "table4_c13"):
        out.append((f"{spec}_analytical", [str(inputs / spec), "--model", "analytical"]))
    for spec in ("figure1", "table4_c01", "table4_c13"):
        out.append((f"{spec}_flow", [str(inputs / spec), "--model", "flow"]))
    out.append(("table4_c01_fold", [str(inputs / "table4_c01"), "--model", "analytical", "--fold"]))
    out.append(("figure1_chan2", [str(inputs / "figure1"), "--model", "analytical", "--comm-channels", "2"]))
    for name in ("tinygpt_2rank", "tinygpt_pp2"):
        # The importer's --out is a prefix: each import gets its own folder (two in one folder collide).
        pre = str(inputs / name / name)
        out.append((f"{name}_measured", [pre, "--comm", "measured"]))
        out.append((f"{name}_ring", [pre, "--topology", "ring:2:50GBps:500ns"]))
    tiny = ROOT / "traces" / "examples" / "tiny_pipeline"
    out.append(("tiny_pipeline", [str(tiny), "--topology", "ring:4:50GBps:500ns"]))
    # The builder's compute models (issue 25): speed factors (vectorised), a what-if GPU (the scalar loop).
    out.append(("figure1_speed", [str(inputs / "figure1"), "--model", "analytical", "--speed", "0-3=1.7"]))
    pp2 = str(inputs / "tinygpt_pp2" / "tinygpt_pp2")
    out.append(
        (
            "tinygpt_pp2_as_h100",
            [pp2, "--comm", "measured", "--as-gpu", "H100", "--from-gpu", "A100", "--speed", "1=0.6"],
        )
    )
    if ET.is_dir() and CFG.is_dir():
        for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
            for n in (4, 8, 16):
                out.append(
                    (
                        f"astra_{kind}_{n}",
                        [
                            str(ET / f"astra-sim_microbenchmarks/{kind}/{n}npus_1MB"),
                            "--astra-network",
                            str(CFG / f"network/repo_examples_Ring_{n}npus.yml"),
                            "--astra-system",
                            str(CFG / "system/repo_examples_Ring_4chunks.json"),
                        ],
                    )
                )
        for t in ("T1D", "T2D", "T3D"):
            d = ET / f"astra-sim-artifacts_{t}-analytical"
            out.append(
                (
                    f"astra_{t}",
                    [
                        str(d / "trace"),
                        "--astra-network",
                        str(d / "inputs/network.yml"),
                        "--astra-system",
                        str(d / "inputs/sys.json"),
                        "--comm-groups",
                        str(d / "inputs/comm_group.json"),
                    ],
                )
            )
        out.append(
            (
                "astra_mlp32",
                [
                    str(ET / "tutorials_micro2024_MLP_ModelParallel_32npus"),
                    "--astra-network",
                    str(CFG / "network/repo_inputs_tpu_v3_32_ring.yml"),
                    "--astra-system",
                    str(CFG / "system/repo_inputs_tpu_v3_32_ring.json"),
                ],
            )
        )
        out.append(
            (
                "astra_tutorial_rt",
                [
                    str(ET / "tutorials_micro2024_allreduce_8npus_1MB"),
                    "--astra-network",
                    str(CFG / "network/repo_rt_template_network_cfg.yml"),
                    "--astra-system",
                    str(CFG / "system/repo_rt_template_system_cfg.json"),
                ],
            )
        )
    return out


def main() -> None:
    """Replay every case into <out>/results/<case>/ (tables, summary, timeline)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--inputs", type=Path, help="reuse these inputs (default <out>/inputs, made if missing)")
    ap.add_argument("--only", nargs="*", help="case names to run (default all)")
    a = ap.parse_args()
    inputs = a.inputs or a.out / "inputs"
    make_inputs(inputs)
    for name, args in cases(inputs):
        if a.only and name not in a.only:
            continue
        d = a.out / "results" / name
        d.mkdir(parents=True, exist_ok=True)
        _xsim("replay", *args, "--out", str(d), "--timeline", str(d / "timeline.json"), "--no-progress")
        perf = d / "perf.json"
        if perf.exists():
            perf.unlink()
        print(name, flush=True)


if __name__ == "__main__":
    main()
