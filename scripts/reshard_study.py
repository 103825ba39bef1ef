"""Figure 12 study: training time, resharding traffic and pipeline bubble per reshard strategy.

For the Figure 1 deployment and the paper's three topology pairs (H100x6 -> A100x4, H100x8 -> A100x1,
H100x4 -> A100x4), under both interconnect presets, generate the traces with each strategy (`xsim gen`),
replay them (`xsim replay`, analytical network, roofline compute) and print one Markdown table.

    .venv/bin/python scripts/reshard_study.py [--presets table6,table5] [--models analytical,flow]
        [--micro-batches 4] [--out FILE]
    .venv/bin/python scripts/reshard_study.py --bench     # rewrite speed on a 56-rank heterogeneous spec
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

from xsim.tracegen.planner.reshard import STRATEGY_NAMES
from xsim.tracegen.spec import derive_cluster, load_spec, save_deployment
from xsim.tracegen.workload import generate
from xsim.traces import pb
from xsim.traces.attrs import PP_BOUNDARY, comm_size, get_int
from xsim.traces.io import DEPLOYMENT_FILE

from xsim import api

MODEL = "llama2-7b"  # the paper's Figure 12 model family (section 5 runs Llama 2 7B)


def figure1(mb: int) -> dict[str, Any]:
    """Figure 1 / section 4.3: 5 x H100 + 5 x A100, TP 3 / 2, layers cut 20|12 and 15|17."""
    return {
        "name": "figure1",
        "model": MODEL,
        "seq_len": 2048,
        "micro_batches": mb,
        "allow_uneven_tp": True,
        "device_groups": [
            {"id": 0, "gpu": "H100", "ranks": [0, 1, 2], "layers": [1, 20], "pp_stage": 0, "dp_replica": 0},
            {"id": 1, "gpu": "A100", "ranks": [5, 6], "layers": [21, 32], "pp_stage": 1, "dp_replica": 0},
            {"id": 2, "gpu": "H100", "ranks": [3, 4], "layers": [1, 15], "pp_stage": 0, "dp_replica": 1},
            {"id": 3, "gpu": "A100", "ranks": [7, 8, 9], "layers": [16, 32], "pp_stage": 1, "dp_replica": 1},
        ],
    }


def pair(a: int, b: int, mb: int) -> dict[str, Any]:
    """Figure 12's topology pair: stage 0 on H100 x a (TP a), stage 1 on A100 x b (TP b), layers 16 | 16."""
    return {
        "name": f"h100x{a}-a100x{b}",
        "model": MODEL,
        "seq_len": 2048,
        "micro_batches": mb,
        "allow_uneven_tp": True,
        "device_groups": [
            {"id": 0, "gpu": "H100", "ranks": list(range(a)), "layers": [1, 16], "pp_stage": 0},
            {"id": 1, "gpu": "A100", "ranks": list(range(a, a + b)), "layers": [17, 32], "pp_stage": 1},
        ],
    }


def with_preset(spec: dict[str, Any], preset: str) -> dict[str, Any]:
    """The spec with its derived cluster (8 GPUs per node, one switch) on the given interconnect preset."""
    desc = derive_cluster(load_spec(spec))
    desc["preset"] = preset
    return {**spec, "cluster": desc}


def boundary_traffic(bundle: Any) -> tuple[int, int]:
    """Bytes and messages of the stage-boundary sends of one iteration (all micro-batches, both ways)."""
    sizes = [
        comm_size(n)
        for nodes in bundle.nodes.values()
        for n in nodes
        if n.type == pb.COMM_SEND_NODE and get_int(n, PP_BOUNDARY, 0) == 1
    ]
    return sum(sizes), len(sizes)


def replay(folder: str, out: str, model: str) -> dict[str, Any]:
    """`xsim replay FOLDER --model M --out OUT` through the API the command uses; returns summary.json."""
    run = api.simulate(folder, api.ReplayOptions(network=api.NetworkOptions(model=model)))
    api.write_outputs(run, api.OutputOptions(out=out))
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as fh:
        return json.load(fh)


def run_one(spec: dict[str, Any], strategy: str, work: str, model: str) -> dict[str, Any]:
    """Generate with `strategy`, replay, and collect the table's numbers."""
    dep = load_spec({**spec, "reshard": strategy})
    bundle = generate(dep)
    folder = os.path.join(work, f"{dep.name}-{strategy}")
    bundle.write(folder, dep.name)
    save_deployment(dep, os.path.join(folder, DEPLOYMENT_FILE))
    nbytes, msgs = boundary_traffic(bundle)
    s = replay(folder, folder + "-out", model)
    return {
        "time_ms": s["iteration_time_ns"] / 1e6,
        "reshard_mb": nbytes / 1e6,
        "messages": msgs,
        "bubble_max_ms": s["bubble_ns_max"] / 1e6,
        "bubble_total_ms": s["bubble_ns_total"] / 1e6,
    }


def bench(mb: int = 8) -> None:
    """Time generate and rewrite_bundle on 4 replicas x 2 stages (TP 8/8 and 8/4, cuts 16|16 and 20|12)."""
    from xsim.tracegen.planner.rewrite import rewrite_bundle

    dgs, rank = [], 0
    for rep in range(4):
        cut = 16 + (rep % 2) * 4
        for st, (a, b, tp, gpu) in enumerate(
            [(1, cut, 8, "H100"), (cut + 1, 32, 4 if rep % 2 else 8, "A100")]
        ):
            dgs.append({"id": len(dgs), "gpu": gpu, "ranks": list(range(rank, rank + tp)), "layers": [a, b],
                        "pp_stage": st, "dp_replica": rep})  # fmt: skip
            rank += tp
    dep = load_spec(
        {"name": "bench", "model": MODEL, "seq_len": 2048, "micro_batches": mb, "device_groups": dgs}
    )
    t0 = time.perf_counter()
    bundle = generate(dep, rewrite=False)
    t1 = time.perf_counter()
    n0 = sum(len(v) for v in bundle.nodes.values())
    rewrite_bundle(bundle, dep, "xsim")
    t2 = time.perf_counter()
    n1 = sum(len(v) for v in bundle.nodes.values())
    print(
        f"{len(bundle.nodes)} ranks, {n0:,} -> {n1:,} nodes: generate {t1 - t0:.2f} s, rewrite {t2 - t1:.2f} s"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the study and print (or write) the Markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="table6,table5", help="interconnect presets, comma-separated")
    ap.add_argument("--micro-batches", type=int, default=4, help="micro-batches per iteration (GPipe)")
    ap.add_argument(
        "--models", default="analytical", help="network models, comma-separated (analytical, flow)"
    )
    ap.add_argument("--out", help="write the table here as well")
    ap.add_argument("--bench", action="store_true", help="only time generate + rewrite on a 56-rank spec")
    args = ap.parse_args(argv)
    if args.bench:
        bench()
        return 0
    mb = args.micro_batches
    configs = [figure1(mb), pair(6, 4, mb), pair(8, 1, mb), pair(4, 4, mb)]
    lines = [
        "| network | preset | deployment | strategy | iteration (ms) | boundary bytes (MB) | boundary messages "
        "| bubble max/rank (ms) | bubble total (ms) |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="reshard_study_") as work:
        for model in args.models.split(","):
            for preset in args.presets.split(","):
                for spec in configs:
                    for strategy in STRATEGY_NAMES:
                        r = run_one(with_preset(spec, preset), strategy, work, model)
                        lines.append(
                            f"| {model} | {preset} | {spec['name']} | {strategy} | {r['time_ms']:.2f} "
                            f"| {r['reshard_mb']:.1f} | {r['messages']} | {r['bubble_max_ms']:.2f} "
                            f"| {r['bubble_total_ms']:.2f} |"
                        )
                        print(lines[-1], file=sys.stderr)
    table = "\n".join(lines)
    print(table)
    print(f"\n({time.perf_counter() - t0:.1f} s, {mb} micro-batches, {MODEL}, seq 2048)", file=sys.stderr)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
