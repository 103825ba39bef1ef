"""`xsim replay PATH`: replay a trace set on a network and compute model, print and write the results."""

from __future__ import annotations

import argparse
import gc
import json
import sys

from xsim.malloc import keep_freed_memory
from xsim.traces.wording import plural
from xsim.verbs import add_gpu_file_argument, add_network_arguments, add_verb, network_options


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `replay` verb."""
    p = add_verb(
        subparsers,
        "replay",
        help="replay a Chakra trace set on a network and compute model",
        description="Replay every node of a trace set (dependency-driven, ASTRA-sim scheduling rules) and "
        "report iteration time, per-rank accounting, straggler waiting and pipeline bubbles.",
        examples=(
            "xsim replay out/fig1                      # a folder from `xsim gen`: its deployment.json",
            "xsim replay out/fig1 --model flow --out out/r --timeline out/r/timeline.json",
            "xsim replay TRACE --topology switch:8:50GBps:500ns --json",
            "xsim replay TRACE --astra-network network.yml --astra-system sys.json",
        ),
    )
    p.add_argument(
        "path", help="trace set: a folder, a <prefix> of <prefix>.<rank>.et files, or one .et file"
    )
    _add_network_options(p)
    _add_compute_options(p)
    _add_output_options(p)
    # Every file it writes is closed before `run` returns, and it starts no thread: no teardown (cli.py).
    p.set_defaults(func=run, fast_exit=True)


def _add_network_options(p: argparse.ArgumentParser) -> None:
    """The network model, how communication is timed, the process groups, and folding."""
    net = p.add_argument_group("network (one of; a deployment.json beside the traces gives the cluster)")
    add_network_arguments(net)
    net.add_argument(
        "--comm",
        choices=("network", "measured"),
        default="network",
        help="time communication on the network model, or by the recorded duration_micros (default: network)",
    )
    p.add_argument(
        "--comm-groups", metavar="FILE", help='process groups {"<id>": [ranks...]} (ASTRA-sim format)'
    )
    fold = p.add_mutually_exclusive_group()
    fold.add_argument(
        "--fold",
        dest="fold",
        action="store_const",
        const=True,
        default=True,
        help="(the default) simulate one of identical replicas (deployment.json DP replicas, else every rank "
        "alike) and copy its times to the others when that is proven (contention-free model, replicas equal "
        "up to labels); else replay unfolded; one line and perf.json say which (docs/replay.md)",
    )
    fold.add_argument(
        "--no-fold", dest="fold", action="store_const", const=False, help="replay every rank, never fold"
    )


def _add_compute_options(p: argparse.ArgumentParser) -> None:
    """The compute model (devices, speeds, what-if GPU) and the resources in flight per rank."""
    cmp = p.add_argument_group("compute")
    cmp.add_argument(
        "--device-profile", metavar="FILE.json", help="roofline devices per rank (format: docs/replay.md)"
    )
    cmp.add_argument(
        "--speed",
        action="append",
        default=[],
        metavar="RANK=FACTOR",
        help="GPU compute speed factor of a rank or range (2 = twice as fast); repeatable",
    )
    # What-if of a measured (imported) trace on another GPU: replay/whatif.py, docs/pytorch-import.md.
    cmp.add_argument("--as-gpu", metavar="NAME", help="what-if: replay measured compute as if on this GPU")
    cmp.add_argument(
        "--from-gpu",
        metavar="NAME",
        help="what-if: the GPU the trace was measured on (default: the one Kineto's deviceProperties names)",
    )
    add_gpu_file_argument(cmp)
    res = p.add_argument_group("resources")
    res.add_argument(
        "--compute-streams", type=int, default=1, help="GPU compute ops in flight per rank (default: 1)"
    )
    res.add_argument(
        "--comm-channels", type=int, default=1, help="GPU communication ops in flight per rank (default: 1)"
    )
    res.add_argument("--honour-stream", action="store_true", help="one in-order queue per `stream` attribute")


def _add_output_options(p: argparse.ArgumentParser) -> None:
    """What the replay writes and prints."""
    out = p.add_argument_group("output")
    out.add_argument(
        "--out", metavar="DIR", help="write ops/ranks/collectives (.parquet, .csv) and summary.json"
    )
    out.add_argument("--timeline", metavar="FILE", help="write a Chrome-trace JSON timeline (Perfetto)")
    out.add_argument(
        "--annotate", metavar="DIR", help="write the trace set with simulated times written back"
    )
    out.add_argument(
        "--force",
        action="store_true",
        help="replace an --out/--annotate folder holding files xsim did not write, as a whole",
    )
    out.add_argument("--json", action="store_true", help="print one JSON object instead of the text summary")
    out.add_argument("--no-progress", action="store_true", help="never show a progress bar")


def fmt_ns(ns: int) -> str:
    """A duration as the summary prints it: exact ns, and in the largest unit (s, ms, us) it reaches."""
    for unit, scale in (("s", 10**9), ("ms", 10**6), ("us", 10**3)):
        if ns >= scale:
            return f"{ns:,} ns ({ns / scale:.3f} {unit})"
    return f"{ns:,} ns"


def _fmt_bytes(b: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= scale:
            return f"{b:,} B ({b / scale:.2f} {unit})"
    return f"{b:,} B"


CONTENTION_FREE = ", contention-free"


def _contention(model: str) -> str:
    """What the summary says of a model's contention: ", contention-free", ", links shared" or nothing
    (no network model, or one the registry does not know)."""
    from xsim.netmodels.models import REGISTRY

    info = REGISTRY.get(model)
    if info is None:
        return ""
    return CONTENTION_FREE if info.capabilities.contention_free else ", links shared"


def _print_summary(result, path: str) -> None:
    # From the result's summary and per-rank columns: printing the summary needs no polars (start-up).
    s = result.summary_dict()
    perf = result.perf_dict()
    print(
        f"replayed {plural(s['num_nodes'], 'node')} on {plural(s['num_ranks'], 'rank')} of {path} "
        f"(network {s['network_model']}{_contention(s['network_model'])}, compute {s['compute_model']}) "
        f"in {perf['sim_wall_s']:.2f} s"
    )
    if _contention(s["network_model"]) == CONTENTION_FREE and s["num_collectives"] + s["num_p2p"] > 0:
        # Issue 31: an all-to-all of 64 MiB on ring:8 takes 0.170 ms here and 1.680 ms under flow
        # (`xsim net collective`, docs/netmodels.md); say so whenever the trace communicates.
        print(
            "note               the network model is contention-free: concurrent transfers do not share "
            "links (--model flow does)"
        )
    if "fold_factor" in perf:
        print(
            f"folded             {perf['ranks_simulated']} of {s['num_ranks']} ranks simulated "
            f"(fold factor {perf['fold_factor']}); the tables hold every rank"
        )
    elif perf.get("fold") == "unfolded":
        print(f"not folded         {perf['fold_reason']}")
    print(f"iteration time     {fmt_ns(s['iteration_time_ns'])}")
    print(
        f"bytes moved        {_fmt_bytes(s['bytes_moved'])} in {s['num_collectives']:,} collectives "
        f"and {s['num_p2p']:,} P2P transfers"
    )
    n = s["num_ranks"]
    print(
        f"straggler waiting  {fmt_ns(s['wait_ns_total'])} summed over {n} ranks, "
        f"max per rank {fmt_ns(s['wait_ns_max'])}"
    )
    # Idle time inside a rank's compute span is a pipeline bubble only when there is a pipeline (the rule
    # of replay.export.breakdown.is_pipelined: several stages or any P2P transfer).
    pipelined = result.num_stages > 1 or s["num_p2p"] > 0
    label = "pipeline bubble   " if pipelined else "idle in compute   "
    print(
        f"{label} {fmt_ns(s['bubble_ns_total'])} summed over {n} ranks, max per rank {fmt_ns(s['bubble_ns_max'])}"
    )
    cols = result.rank_arrays
    _print_time_split(cols)
    wait = cols["wait_ns"].tolist()
    rank = cols["rank"].tolist()
    top = sorted(range(len(rank)), key=lambda i: (-wait[i], rank[i]))[:5]
    if top and wait[top[0]] > 0:
        print("top ranks by waiting:")
        print(f"  {'rank':>6} {'wait_ns':>14} {'finish_ns':>14} {'exposed_comm_ns':>16}")
        finish, exposed = cols["finish_ns"].tolist(), cols["exposed_comm_ns"].tolist()
        for i in top:
            if wait[i] == 0:
                break
            print(f"  {rank[i]:>6} {wait[i]:>14,} {finish[i]:>14,} {exposed[i]:>16,}")


def _ms(ns: int) -> str:
    return f"{ns / 1e6:,.3f} ms"


def _print_time_split(cols) -> None:
    """Where the last rank to finish spent the iteration: GPU compute, CPU ops, exposed communication, idle
    (so a what-if that rescales GPU compute and changes nothing shows why, issue 26 item 7)."""
    finish = cols["finish_ns"].tolist()
    if not finish:
        return
    i = max(range(len(finish)), key=lambda j: (finish[j], -j))
    comp, cpu = int(cols["compute_ns"][i]), int(cols["cpu_ns"][i])
    exposed, idle = int(cols["exposed_comm_ns"][i]), int(cols["idle_ns"][i])
    print(
        f"time split         rank {int(cols['rank'][i])} (last to finish): GPU compute {_ms(comp)}, CPU ops "
        f"{_ms(cpu)}, exposed communication {_ms(exposed)}, idle {_ms(idle)}"
    )


def options(args: argparse.Namespace):
    """The API's replay options from the parsed command line."""
    from xsim.api import ComputeOptions, ReplayOptions

    return ReplayOptions(
        network=network_options(args, comm=args.comm),
        compute=ComputeOptions(
            astra_system=args.astra_system,
            device_profile=args.device_profile,
            speed=tuple(args.speed),
            as_gpu=args.as_gpu,
            from_gpu=args.from_gpu,
            gpu_file=args.gpu_file,
        ),
        comm_groups=args.comm_groups,
        compute_streams=args.compute_streams,
        comm_channels=args.comm_channels,
        honour_stream=args.honour_stream,
        fold=args.fold,
        progress=not args.no_progress,
    )


def run(args: argparse.Namespace) -> int:
    """Replay, write the requested files and print the summary."""
    # Importing the replay stack (numpy, protobuf descriptors, ~60 dataclasses) leaves ~25k tracked objects
    # and no garbage, but starts the collector ~50 times on the way: ~20 ms of an 8-rank replay
    # (docs/performance.md, round 3c). The replay itself runs with the collector paused too.
    gc_was_enabled = gc.isenabled()
    keep_freed_memory()
    # Those objects live as long as the modules do. Frozen (gc.freeze: out of the collector's generations),
    # the first collection after the import need not walk all of them: ~10-20 ms (docs/performance.md,
    # round 4). Thawed on the way out; a caller that froze objects itself is left alone (nothing frozen).
    freeze = gc.get_freeze_count() == 0
    gc.disable()
    try:
        from xsim import api
        from xsim.api import replaying  # noqa: F401  (the names of xsim.api load on first use: load them here)
    finally:
        if freeze:
            gc.freeze()
        if gc_was_enabled:
            gc.enable()
    try:
        return _replay(api, args)
    finally:
        if freeze:
            gc.unfreeze()


def _replay(api, args: argparse.Namespace) -> int:
    from xsim.api import replaying

    outputs = api.OutputOptions(
        out=args.out,
        timeline=args.timeline,
        annotate=args.annotate,
        force=args.force,
        comm_groups=args.comm_groups,
    )
    ts = api.load_trace_set(args.path)
    replaying.check_outputs(ts, outputs)
    run = api.simulate(ts, options(args))
    written = api.write_outputs(run, outputs)
    if args.json:
        json.dump(run.summary(), sys.stdout)
        sys.stdout.write("\n")
    else:
        _print_summary(run.result, args.path)
        if run.cost is not None:
            _print_cost(run.cost)
        if run.memory is not None:
            _print_memory(run.memory)
    # Where the files went (issue 26 item 9); on stderr under --json, whose stdout is one JSON document.
    for line in written_lines(written):
        print(line, file=sys.stderr if args.json else sys.stdout)
    for line in run.warnings:  # the network replayed on is not what the user may think (NICs, GPUs)
        print(f"xsim: warning: {line}", file=sys.stderr)
    return 0


def written_lines(paths: list[str]) -> list[str]:
    """One "wrote ..." line per folder written into: how many files and their names, in written order."""
    import os

    by_dir: dict[str, list[str]] = {}
    for p in paths:
        if os.path.isdir(p):  # --annotate: a folder of annotated traces
            by_dir.setdefault(p, []).extend(sorted(os.listdir(p)))
        else:
            by_dir.setdefault(os.path.dirname(p) or ".", []).append(os.path.basename(p))
    return [f"wrote {plural(len(names), 'file')} in {d}: {', '.join(names)}" for d, names in by_dir.items()]


def per_rank_gib(peaks: list[int]) -> str:
    """Each rank's peak in GiB (one decimal), consecutive ranks of the same value as one "a-b: v" run, so a
    256-rank plan of 8 stages prints 8 entries, not 256."""
    runs: list[tuple[int, int, str]] = []
    for r, b in enumerate(peaks):
        v = f"{b / 2**30:.1f}"
        if runs and runs[-1][2] == v and runs[-1][1] == r - 1:
            runs[-1] = (runs[-1][0], r, v)
        else:
            runs.append((r, r, v))
    return ", ".join(f"{a}: {v}" if a == e else f"{a}-{e}: {v}" for a, e, v in runs)


def _print_memory(mem: dict) -> None:
    per = per_rank_gib(mem["per_rank_peak_bytes"])
    fits = "fits" if mem["fits"] else "DOES NOT FIT (memory.json)"
    print(
        f"peak memory        {mem['peak_bytes'] / 2**30:.2f} GiB on rank {mem['peak_rank']}, {fits}; GiB per rank {per}"
    )


def _print_cost(cost: dict) -> None:
    usd = cost["cost_usd_per_iteration"]
    price = (
        f"${usd:,.4f} per iteration, ${cost['cost_usd_per_million_tokens']:,.4f} per million tokens"
        if usd is not None
        else f"no price for {', '.join(cost['unpriced_gpus'])} (set gpus: {{NAME: {{price_per_hour: ...}}}})"
    )
    print(
        f"throughput         {cost['tokens_per_iteration']:,} tokens per iteration, "
        f"{cost['tokens_per_s']:,.0f} tokens/s; {cost['gpu_hours_per_iteration']:.4f} GPU-hours: {price}"
    )
