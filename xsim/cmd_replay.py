"""`xsim replay PATH`: replay a trace set on a network and compute model, print and write the results."""

from __future__ import annotations

import argparse
import json
import os
import sys

from netmodels.errors import NetworkModelError
from replay import (
    ComputeModel,
    DeviceProfile,
    DurationModel,
    ReplayConfig,
    ReplayError,
    RooflineModel,
    SpeedScaled,
    load_device_profile,
    parse_speed,
    simulate,
)
from replay.export import write_annotated, write_timeline
from traces import pb
from traces.traceset import TraceSet, discover

DEPLOYMENT_FILE = "deployment.json"  # written by `xsim gen` beside the traces


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `replay` verb."""
    p = subparsers.add_parser(
        "replay",
        help="replay a Chakra trace set on a network and compute model",
        description="Replay every node of a trace set (dependency-driven, ASTRA-sim scheduling rules) and "
        "report iteration time, per-rank accounting, straggler waiting and pipeline bubbles.",
    )
    p.add_argument(
        "path", help="trace set: a folder, a <prefix> of <prefix>.<rank>.et files, or one .et file"
    )
    net = p.add_argument_group("network (one of; a deployment.json beside the traces gives the cluster)")
    net.add_argument("--model", choices=("analytical", "flow"), default="analytical", help="network model")
    net.add_argument(
        "--topology", metavar="SPEC", help="topology spec, e.g. ring:8:50GBps:500ns (see xsim net)"
    )
    net.add_argument("--astra-network", metavar="NET.yml", help="ASTRA-sim network config (compatible mode)")
    net.add_argument(
        "--astra-system", metavar="SYS.json", help="ASTRA-sim system config (with --astra-network)"
    )
    net.add_argument(
        "--congestion-aware", action="store_true", help="ASTRA-sim congestion_aware backend (1-D only)"
    )
    net.add_argument(
        "--comm",
        choices=("network", "measured"),
        default="network",
        help="time communication on the network model, or by the recorded duration_micros",
    )
    p.add_argument(
        "--comm-groups", metavar="FILE", help='process groups {"<id>": [ranks...]} (ASTRA-sim format)'
    )
    p.add_argument(
        "--fold",
        action="store_true",
        help="simulate one of identical replicas (deployment.json DP replicas, else every rank alike) and "
        "copy its times to the others; proven first, refused unless contention-free (docs/replay.md)",
    )
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
    cmp.add_argument("--from-gpu", metavar="NAME", help="what-if: the GPU the trace was measured on")
    res = p.add_argument_group("resources")
    res.add_argument("--compute-streams", type=int, default=1, help="GPU compute ops in flight per rank")
    res.add_argument("--comm-channels", type=int, default=1, help="GPU communication ops in flight per rank")
    res.add_argument("--honour-stream", action="store_true", help="one in-order queue per `stream` attribute")
    out = p.add_argument_group("output")
    out.add_argument(
        "--out", metavar="DIR", help="write ops/ranks/collectives (.parquet, .csv) and summary.json"
    )
    out.add_argument("--timeline", metavar="FILE", help="write a Chrome-trace JSON timeline (Perfetto)")
    out.add_argument(
        "--annotate", metavar="DIR", help="write the trace set with simulated times written back"
    )
    out.add_argument("--json", action="store_true", help="print one JSON object instead of the text summary")
    out.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    p.set_defaults(func=run)


def _deployment(ts: TraceSet):
    path = os.path.join(ts.directory, DEPLOYMENT_FILE)
    if not os.path.isfile(path):
        return None
    from tracegen.spec import load_spec

    return load_spec(path)


def _astra_system(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise ReplayError(f"{path}: cannot read ASTRA-sim system config: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReplayError(f"{path}: ASTRA-sim system config is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ReplayError(f"{path}: ASTRA-sim system config must be a JSON object")
    return doc


def _astra_number(doc: dict, key: str, path: str) -> float:
    """A numeric key of an ASTRA-sim system config (absent = 0), or a clear error naming file and key."""
    v = doc.get(key, 0)
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ReplayError(f"{path}: ASTRA-sim system config {key!r} must be a number, got {v!r}")
    return float(v)


def build_network(args: argparse.Namespace, ts: TraceSet, deployment):
    """The network model the options (or the deployment beside the traces) describe; None in measured mode."""
    from netmodels.astra import astra_model
    from netmodels.cluster import build_cluster, topology_from_spec
    from netmodels.models import build_model

    if args.astra_system and not args.astra_network:
        raise ReplayError("--astra-system needs --astra-network")
    if args.astra_network:
        return astra_model(args.astra_network, args.astra_system, args.congestion_aware or None)
    if args.topology:
        return build_model(args.model, topology_from_spec(args.topology))
    if deployment is not None and deployment.cluster_json:
        try:
            return build_model(args.model, build_cluster(json.loads(deployment.cluster_json)))
        except NetworkModelError as exc:
            where = os.path.join(ts.directory, DEPLOYMENT_FILE)
            raise ReplayError(f"{where}: cluster: {exc} (or pass --topology SPEC)") from None
    if args.comm == "measured":
        return None
    raise ReplayError(
        "no network: pass --topology SPEC (e.g. switch:8:50GBps:500ns), --astra-network NET.yml, "
        f"--comm measured, or replay a folder holding {DEPLOYMENT_FILE}"
    )


def catalog_device(name: str) -> DeviceProfile:
    """Roofline device of a catalog GPU: achieved rates (datasheet peak x the catalog's efficiency), as the
    generator times ops."""
    from tracegen.catalog import gpu
    from tracegen.errors import CatalogError

    try:
        spec = gpu(name)
    except (CatalogError, KeyError) as exc:
        raise ReplayError(f"GPU {name!r}: {exc}") from None
    return DeviceProfile(spec.peak_flops * spec.gemm_eff, spec.mem_bw * spec.mem_eff, spec.name)


def build_compute(args: argparse.Namespace, ts: TraceSet, deployment) -> ComputeModel:
    """The compute model: duration replay, roofline (ASTRA-sim system, deployment GPUs, device profile), speed."""
    model: ComputeModel = DurationModel()
    speed: dict[int, float] = {}
    if args.astra_system:
        doc = _astra_system(args.astra_system)
        if _astra_number(doc, "roofline-enabled", args.astra_system):
            # ASTRA-sim units: peak-perf in TFLOPS (1e12), local-mem-bw in GB/s (1e9 bytes).
            prof = DeviceProfile(
                _astra_number(doc, "peak-perf", args.astra_system) * 1e12,
                _astra_number(doc, "local-mem-bw", args.astra_system) * 1e9,
                "astra-sim",
            )
            model = RooflineModel(profiles={}, default=prof)
    if deployment is not None and len(deployment.device_groups):
        profiles: dict[int, DeviceProfile] = {}
        for dg in deployment.device_groups:
            prof = catalog_device(dg.gpu)
            for r in dg.ranks:
                profiles[int(r)] = prof
        model = RooflineModel(profiles=profiles)
    if args.device_profile:
        f = load_device_profile(args.device_profile, catalog_device)
        outside = sorted(r for r in f.ranks if r >= ts.num_ranks)
        if outside:
            raise ReplayError(
                f"{args.device_profile}: device for rank {outside[0]}, but the trace set has ranks "
                f"0..{ts.num_ranks - 1}"
            )
        model = RooflineModel(profiles=dict(f.ranks), default=f.default)
        speed.update(f.speed)
    if getattr(args, "as_gpu", None) or getattr(args, "from_gpu", None):
        model = _whatif(args, model)
    speed.update(parse_speed(args.speed))
    bad = [r for r in speed if r >= ts.num_ranks]
    if bad:
        raise ReplayError(
            f"speed factor for rank {bad[0]}, but the trace set has ranks 0..{ts.num_ranks - 1}"
        )
    if speed:
        model = SpeedScaled(model, speed)
    return model


def _whatif(args: argparse.Namespace, base: ComputeModel) -> ComputeModel:
    """Measured compute rescaled by op class from --from-gpu to --as-gpu (catalog numbers)."""
    from replay.whatif import whatif_model
    from tracegen.catalog import gpu
    from tracegen.errors import CatalogError

    if not (args.as_gpu and args.from_gpu):
        raise ReplayError("--as-gpu and --from-gpu go together (the target GPU and the measured one)")
    try:
        return whatif_model(gpu(args.from_gpu), gpu(args.as_gpu), base=base)
    except CatalogError as exc:
        raise ReplayError(f"what-if: {exc}") from None


def _fmt_ns(ns: int) -> str:
    for unit, scale in (("s", 10**9), ("ms", 10**6), ("us", 10**3)):
        if ns >= scale:
            return f"{ns:,} ns ({ns / scale:.3f} {unit})"
    return f"{ns:,} ns"


def _fmt_bytes(b: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= scale:
            return f"{b:,} B ({b / scale:.2f} {unit})"
    return f"{b:,} B"


def _print_summary(result, path: str) -> None:
    s = result.summary_dict()
    perf = result.perf_dict()
    print(
        f"replayed {s['num_nodes']:,} nodes on {s['num_ranks']} ranks of {path} "
        f"(network {s['network_model']}, compute {s['compute_model']}) in {perf['sim_wall_s']:.2f} s"
    )
    print(f"iteration time     {_fmt_ns(s['iteration_time_ns'])}")
    print(
        f"bytes moved        {_fmt_bytes(s['bytes_moved'])} in {s['num_collectives']:,} collectives "
        f"and {s['num_p2p']:,} P2P transfers"
    )
    print(f"straggler waiting  total {_fmt_ns(s['wait_ns_total'])}, max per rank {_fmt_ns(s['wait_ns_max'])}")
    print(
        f"pipeline bubble    total {_fmt_ns(s['bubble_ns_total'])}, max per rank {_fmt_ns(s['bubble_ns_max'])}"
    )
    top = result.ranks.sort(["wait_ns", "rank"], descending=[True, False]).head(5)
    if top["wait_ns"].max() and top["wait_ns"].max() > 0:
        print("top ranks by waiting:")
        print(f"  {'rank':>6} {'wait_ns':>14} {'finish_ns':>14} {'exposed_comm_ns':>16}")
        for row in top.iter_rows(named=True):
            if row["wait_ns"] == 0:
                break
            print(
                f"  {row['rank']:>6} {row['wait_ns']:>14,} {row['finish_ns']:>14,} {row['exposed_comm_ns']:>16,}"
            )


def _write_outputs(args: argparse.Namespace, result, ts: TraceSet) -> None:
    """Write --out, --timeline and --annotate; an unwritable path is one error naming it."""
    target = ""
    try:
        if args.out:
            target = args.out
            result.save(args.out)
            # Which trace set this is a replay of (read by `xsim validate --sim DIR`).
            with open(os.path.join(args.out, "source.json"), "w", encoding="utf-8") as fh:
                json.dump({"trace": os.path.abspath(ts.prefix)}, fh)
                fh.write("\n")
        if args.timeline:
            target = args.timeline
            write_timeline(result, args.timeline)
        if args.annotate:
            target = args.annotate
            write_annotated(result, args.annotate)
    except OSError as exc:
        raise ReplayError(f"{target}: cannot write: {exc.strerror or exc}") from None


def run(args: argparse.Namespace) -> int:
    """Build the models, replay, print the summary and write the requested files."""
    ts = discover(args.path)
    deployment = _deployment(ts)
    config = ReplayConfig(
        compute_streams=args.compute_streams,
        comm_channels=args.comm_channels,
        honour_stream=args.honour_stream,
        comm_mode=args.comm,
        # ASTRA-sim replays BROADCAST by its duration instead of simulating it (reference 3.2).
        duration_comm_types=frozenset({pb.BROADCAST}) if args.astra_network else frozenset(),
    )
    try:
        network = build_network(args, ts, deployment)
        compute = build_compute(args, ts, deployment)
        result = simulate(
            ts,
            network=network,
            compute=compute,
            groups=args.comm_groups,
            config=config,
            progress=not args.no_progress,
            fold=getattr(args, "fold", False),
        )
    except NetworkModelError as exc:
        raise ReplayError(f"network model: {exc}") from None
    _write_outputs(args, result, ts)
    cost = _cost(deployment, result.summary_dict()["iteration_time_ns"])
    if cost is not None and args.out:
        try:
            with open(os.path.join(args.out, "cost.json"), "w", encoding="utf-8") as fh:
                json.dump(cost, fh, indent=1)
                fh.write("\n")
        except OSError as exc:
            raise ReplayError(f"{args.out}: cannot write cost.json: {exc.strerror or exc}") from None
    memory = _peak_memory(ts)
    if args.json:
        obj = result.summary_dict()
        if cost is not None:
            obj["cost"] = cost
        if memory is not None:
            obj["memory"] = memory
        obj["perf"] = result.perf_dict()
        json.dump(obj, sys.stdout)
        sys.stdout.write("\n")
    else:
        _print_summary(result, args.path)
        if cost is not None:
            _print_cost(cost)
        if memory is not None:
            _print_memory(memory)
    return 0


def _peak_memory(ts: TraceSet) -> dict | None:
    """Peak memory per rank from the memory.json `xsim gen` wrote beside the traces (tracegen/memory.py)."""
    from tracegen.memory import MEMORY_FILE, peak_summary

    path = os.path.join(ts.directory, MEMORY_FILE)
    return peak_summary(path) if os.path.isfile(path) else None


def _print_memory(mem: dict) -> None:
    per = ", ".join(f"{r}: {b / 2**30:.1f}" for r, b in enumerate(mem["per_rank_peak_bytes"]))
    fits = "fits" if mem["fits"] else "DOES NOT FIT (memory.json)"
    print(
        f"peak memory        {mem['peak_bytes'] / 2**30:.2f} GiB on rank {mem['peak_rank']}, {fits}; GiB per rank {per}"
    )


def _cost(deployment, iteration_ns: int) -> dict | None:
    """TCO of one iteration when the traces come with a deployment (GPU types and prices), else None."""
    if deployment is None or not len(deployment.device_groups):
        return None
    from tracegen.cost import iteration_cost

    return iteration_cost(deployment, iteration_ns).to_json()


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
