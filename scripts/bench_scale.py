"""Benchmark xsim at scale: Llama-2 7B on H100, TP 8 x PP 4 x DP growing, generate -> write -> read -> replay.

Usage: .venv/bin/python scripts/bench_scale.py [--ranks 128 512 1024 2048] [--micro-batches 4]
           [--models analytical flow] [--root DIR] [--profile FILE.html] [--summary-dir DIR] [--fold]
       .venv/bin/python scripts/bench_scale.py --scenario hetero1024 [--models flow flow-hybrid] [--profile FILE.html]
       .venv/bin/python scripts/bench_scale.py --ranks 4096 --models analytical --split

`--scenario hetero1024` replaces the DP-growing sizes by the bundled examples/hetero1024.yaml (1,024 GPUs,
half H100 half A100, non-uniform TP and layers, resharding and the rewriter's multi-ring sync). With
`--split`, generation (generate + rewrite + write) and each replay (read + build + run + tables, as
`simulate` does) run in separate child processes, and each reports its wall and CPU seconds and its own
peak RSS (columns `gen+write wall / CPU s`, `replay wall / CPU s`, `peak RSS gen / replay MiB`); with
`--profile`, `FILE.gen.html` profiles generation and `FILE.html` the replays.

Each size runs in its own child process so that peak RSS (getrusage ru_maxrss, monotonic per process) is
that size's alone. The replay uses what `xsim replay DIR` uses for a folder holding deployment.json: the
API's `xsim.api.build_network` / `build_compute` (what the CLI uses) (derived cluster, roofline devices from the GPU catalog).
Prints one Markdown row per (size, network model); the numbers in docs/performance.md come from here.
`--profile` runs pyinstrument around the replays of the (single) given size and writes an HTML report
plus a text one beside it. `--summary-dir` writes each replay's summary.json (to compare runs byte for byte).
`--fold` also replays each model with symmetric-replica folding (`simulate(fold=True)`, one DP replica
simulated; model shown as `<model>+fold`) and checks its summary, ranks, ops and collectives tables equal the
unfolded ones.
`--comm-streams shared` replays with the one-slot communication rule of the runs before 2026-11-30 (their
summaries are byte-identical); the default is the replay's own default (communication streams).
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TP, PP = 8, 4  # Llama-2 7B: 32 layers -> 8 per stage (model card: 32 layers)
LAYERS = 32


def spec(num_ranks: int, micro_batches: int) -> dict:
    """`num_ranks / 32` replicas x 4 stages of 8 layers x TP 8 on H100, one 2048-token sequence each."""
    if num_ranks % (TP * PP):
        raise SystemExit(f"--ranks {num_ranks}: must be a multiple of {TP * PP} (TP {TP} x PP {PP})")
    groups = []
    per = LAYERS // PP
    for r in range(num_ranks // (TP * PP)):
        for k in range(PP):
            first = TP * PP * r + TP * k
            groups.append(
                {
                    "id": PP * r + k, "gpu": "H100", "ranks": f"{first}-{first + TP - 1}", "tp": TP,
                    "layers": [per * k + 1, per * k + per], "micro_batch": 1, "pp_stage": k, "dp_replica": r,
                }
            )  # fmt: skip
    return {
        "name": f"llama2_7b_{num_ranks}",
        "model": "llama2-7b",
        "seq_len": 2048,
        "micro_batches": micro_batches,
        "schedule": "1f1b",
        "device_groups": groups,
    }


def rss_mib() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one_size(args: argparse.Namespace, n: int) -> list[dict]:
    """Generate, write, read and replay one size in this process; one dict per network model."""
    from xsim.replay import ReplayConfig, simulate
    from xsim.tracegen import generate, load_spec
    from xsim.tracegen.spec import save_deployment
    from xsim.traces.io import DEPLOYMENT_FILE
    from xsim.traces.traceset import discover

    from xsim import api

    out = Path(args.root) / f"r{n}"
    dep = load_spec(spec(n, args.micro_batches))
    t = time.perf_counter()
    bundle = generate(dep)
    t_gen = time.perf_counter() - t
    nodes = bundle.node_count()
    t = time.perf_counter()
    bundle.write(out, dep.name)
    save_deployment(dep, out / DEPLOYMENT_FILE)
    t_write = time.perf_counter() - t
    rss_gen = rss_mib()
    del bundle
    gc.collect()

    t = time.perf_counter()
    ts = discover(out)
    read_nodes = sum(len(ts.load(r).nodes) for r in range(ts.num_ranks))
    t_read = time.perf_counter() - t
    assert read_nodes == nodes, (read_nodes, nodes)
    gc.collect()

    profiler = None
    if args.profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.005)
    rows = []
    runs = [(m, False) for m in args.models] + ([(m, True) for m in args.models] if args.fold else [])
    plain: dict[str, object] = {}
    for model, fold in runs:
        opts = api.ReplayOptions(network=api.NetworkOptions(model=model))
        ts = discover(out)
        deployment = api.load_deployment(ts)
        t = time.perf_counter()
        if profiler:
            profiler.start()
        network = api.build_network(opts.network, deployment)
        compute = api.build_compute(opts.compute, ts.num_ranks)
        config = ReplayConfig(comm_streams=args.comm_streams)
        res = simulate(ts, network=network, compute=compute, config=config, fold=fold or None)
        if profiler:
            profiler.stop()
        t_replay = time.perf_counter() - t
        s, perf = res.summary_dict(), res.perf_dict()
        if fold:
            from polars.testing import assert_frame_equal

            ref = plain[model]
            assert ref.summary_dict() == s, "folded summary differs"
            assert_frame_equal(ref.ranks, res.ranks)
            assert_frame_equal(ref.ops, res.ops)
            assert_frame_equal(ref.collectives, res.collectives)
        elif args.fold:
            plain[model] = res
        model_name = f"{model}+fold" if fold else model
        if args.summary_dir:
            d = Path(args.summary_dir) / f"r{n}_{model_name}"
            d.mkdir(parents=True, exist_ok=True)
            with open(d / "summary.json", "w", encoding="utf-8") as fh:
                json.dump(s, fh, indent=2)
                fh.write("\n")
        rows.append(
            {
                "ranks": n, "model": model_name, "nodes": nodes, "gen_s": t_gen, "write_s": t_write,
                "read_s": t_read, "replay_s": t_replay, "engine_s": perf["engine_wall_s"],
                "events": s["events"], "events_per_s": s["events"] / t_replay,
                "rss_gen_mib": rss_gen, "rss_mib": rss_mib(), "iteration_ns": s["iteration_time_ns"],
                "collectives": s["num_collectives"], "p2p": s["num_p2p"],
            }
        )  # fmt: skip
        del res, network, compute
        gc.collect()
    if profiler:
        html = Path(args.profile)
        html.write_text(profiler.output_html())
        html.with_suffix(".txt").write_text(profiler.output_text(unicode=False, show_all=False))
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    return rows


HETERO_SPEC = REPO / "examples" / "hetero1024.yaml"


def scenario_spec(args: argparse.Namespace, n: int):
    """The Deployment of one benchmark size: the DP-growing Llama-2 spec or the bundled hetero1024 example."""
    from xsim.tracegen import load_spec

    if args.scenario == "hetero1024":
        return load_spec(str(HETERO_SPEC))
    return load_spec(spec(n, args.micro_batches))


def cpu_s() -> float:
    """User + system CPU seconds of this process so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _profiler(path: str | None):
    if not path:
        return None
    from pyinstrument import Profiler

    return Profiler(interval=0.005)


def _save_profile(profiler, path: str) -> None:
    html = Path(path)
    html.write_text(profiler.output_html())
    html.with_suffix(".txt").write_text(profiler.output_text(unicode=False, show_all=False))


def gen_child(args: argparse.Namespace, n: int) -> dict:
    """Generate (with the rewrite) and write one size in this process: wall, CPU and peak RSS of that alone."""
    from xsim.tracegen import generate
    from xsim.tracegen.spec import save_deployment
    from xsim.traces.io import DEPLOYMENT_FILE

    out = Path(args.root) / f"r{n}"
    dep = scenario_spec(args, n)
    profiler = _profiler(args.profile and str(Path(args.profile).with_suffix(".gen.html")))
    w0, c0 = time.perf_counter(), cpu_s()
    if profiler:
        profiler.start()
    bundle = generate(dep)
    t_gen, c_gen = time.perf_counter() - w0, cpu_s() - c0
    bundle.write(out, dep.name)
    save_deployment(dep, out / DEPLOYMENT_FILE)
    if profiler:
        profiler.stop()
        _save_profile(profiler, str(Path(args.profile).with_suffix(".gen.html")))
    wall, cpu = time.perf_counter() - w0, cpu_s() - c0
    nodes = bundle.node_count()
    return {
        "ranks": len(bundle.nodes), "nodes": nodes, "gen_s": t_gen, "gen_cpu_s": c_gen,
        "write_s": wall - t_gen, "gen_write_s": wall, "gen_write_cpu_s": cpu, "rss_gen_mib": rss_mib(),
    }  # fmt: skip


def replay_child(args: argparse.Namespace, n: int, model: str) -> dict:
    """Replay one written size with one network model in this process (read + build + run + tables)."""
    from xsim.replay import ReplayConfig, simulate
    from xsim.traces.traceset import discover

    from xsim import api

    out = Path(args.root) / f"r{n}"
    profiler = _profiler(args.profile)
    w0, c0 = time.perf_counter(), cpu_s()
    if profiler:
        profiler.start()
    ts = discover(out)
    opts = api.ReplayOptions(network=api.NetworkOptions(model=model))
    deployment = api.load_deployment(ts)
    network = api.build_network(opts.network, deployment)
    compute = api.build_compute(opts.compute, ts.num_ranks)
    res = simulate(ts, network=network, compute=compute, config=ReplayConfig(comm_streams=args.comm_streams))
    if profiler:
        profiler.stop()
        _save_profile(profiler, args.profile)
    wall, cpu = time.perf_counter() - w0, cpu_s() - c0
    s, perf = res.summary_dict(), res.perf_dict()
    if args.summary_dir:
        d = Path(args.summary_dir) / f"{args.scenario}_r{n}_{model}"
        d.mkdir(parents=True, exist_ok=True)
        with open(d / "summary.json", "w", encoding="utf-8") as fh:
            json.dump(s, fh, indent=2)
            fh.write("\n")
    return {
        "model": model, "replay_s": wall, "replay_cpu_s": cpu, "engine_s": perf["engine_wall_s"],
        "events": s["events"], "rss_mib": rss_mib(), "iteration_ns": s["iteration_time_ns"],
        "collectives": s["num_collectives"], "p2p": s["num_p2p"],
    }  # fmt: skip


def _run_child(args: argparse.Namespace, extra: list[str]) -> dict | str:
    cmd = [sys.executable, __file__, "--root", str(args.root), "--scenario", args.scenario]
    cmd += ["--micro-batches", str(args.micro_batches), "--comm-streams", args.comm_streams, *extra]
    for flag, val in (("--profile", args.profile), ("--summary-dir", args.summary_dir)):
        if val:
            cmd += [flag, val]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        return f"failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def split_main(args: argparse.Namespace) -> None:
    """Generation and each replay in their own child process: wall, CPU and peak RSS of each step."""
    print(
        "| scenario | ranks | nodes | gen+write wall / CPU s | model | replay wall / CPU s | engine s | events "
        "| peak RSS gen / replay MiB | total wall s | iteration ns |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in args.ranks:
        g = _run_child(args, ["--child-gen", "--ranks", str(n)])
        if isinstance(g, str):
            print(f"| {args.scenario} | {n} | gen {g} |", flush=True)
            continue
        for model in args.models:
            r = _run_child(args, ["--child-replay", model, "--ranks", str(n)])
            if isinstance(r, str):
                print(f"| {args.scenario} | {n} | | | {model} {r} |", flush=True)
                continue
            print(
                f"| {args.scenario} | {g['ranks']:,} | {g['nodes']:,} | {g['gen_write_s']:.1f} / "
                f"{g['gen_write_cpu_s']:.1f} | {model} | {r['replay_s']:.1f} / {r['replay_cpu_s']:.1f} | "
                f"{r['engine_s']:.1f} | {r['events']:,} | {g['rss_gen_mib']:,.0f} / {r['rss_mib']:,.0f} | "
                f"{g['gen_write_s'] + r['replay_s']:.1f} | {r['iteration_ns']:,} |",
                flush=True,
            )
        if not args.keep:
            shutil.rmtree(Path(args.root) / f"r{n}", ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[128, 512, 1024, 2048])
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument(
        "--models", nargs="+", choices=("analytical", "flow", "flow-hybrid"), default=["analytical", "flow"]
    )
    ap.add_argument("--root", default=None, help="where traces are written (default: a temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the generated traces")
    ap.add_argument("--profile", metavar="FILE.html", help="pyinstrument report of the replays (one size)")
    ap.add_argument("--summary-dir", metavar="DIR", help="write each replay's summary.json here")
    ap.add_argument("--fold", action="store_true", help="also replay with symmetric-replica folding")
    ap.add_argument(
        "--comm-streams",
        choices=("auto", "group", "shared"),
        default="auto",
        help="communication streams (docs/replay.md); 'shared' reproduces the rule of runs before 2026-11-30",
    )
    ap.add_argument(
        "--scenario",
        choices=("llama-dp", "hetero1024"),
        default="llama-dp",
        help="llama-dp: TP 8 x PP 4 x DP growing (--ranks); hetero1024: examples/hetero1024.yaml (split)",
    )
    ap.add_argument(
        "--split", action="store_true", help="generation and each replay in separate processes (CPU, RSS)"
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-gen", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-replay", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.scenario == "hetero1024":
        args.ranks, args.split = [1024], True
    if args.child:
        print(json.dumps(one_size(args, args.ranks[0])))
        return
    if args.child_gen:
        print(json.dumps(gen_child(args, args.ranks[0])))
        return
    if args.child_replay:
        print(json.dumps(replay_child(args, args.ranks[0], args.child_replay)))
        return
    root = Path(args.root or tempfile.mkdtemp(prefix="bench_scale_"))
    root.mkdir(parents=True, exist_ok=True)
    args.root = str(root)
    if args.split:
        split_main(args)
        return
    print(
        "| ranks | model | nodes | gen s | write s | read s | replay s | engine s | events | events/s "
        "| peak RSS gen / total MiB | iteration ns |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in args.ranks:
        cmd = [sys.executable, __file__, "--child", "--ranks", str(n), "--root", str(root)]
        cmd += ["--micro-batches", str(args.micro_batches), "--models", *args.models]
        for flag, val in (("--profile", args.profile), ("--summary-dir", args.summary_dir)):
            if val:
                cmd += [flag, val]
        if args.keep:
            cmd.append("--keep")
        if args.fold:
            cmd.append("--fold")
        cmd += ["--comm-streams", args.comm_streams]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            print(f"| {n} | failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]} |")
            continue
        for r in json.loads(proc.stdout.strip().splitlines()[-1]):
            print(
                f"| {r['ranks']} | {r['model']} | {r['nodes']:,} | {r['gen_s']:.1f} | {r['write_s']:.1f} | "
                f"{r['read_s']:.1f} | {r['replay_s']:.1f} | {r['engine_s']:.1f} | {r['events']:,} | "
                f"{r['events_per_s']:,.0f} | {r['rss_gen_mib']:,.0f} / {r['rss_mib']:,.0f} | "
                f"{r['iteration_ns']:,} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
