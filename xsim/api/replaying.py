"""Replay a trace set end to end: find it, read its deployment, build the models, simulate, write files."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xsim.api.compute import build_compute
from xsim.api.network import build_network, resolve_model
from xsim.api.options import OutputOptions, ReplayOptions
from xsim.netmodels.errors import NetworkModelError
from xsim.netmodels.models import capabilities_named
from xsim.replay import ReplayConfig, ReplayError, ReplayResult
from xsim.replay import simulate as replay_simulate
from xsim.replay.errors import ReplayDeadlock
from xsim.replay.progress import replay_progress
from xsim.traces import pb
from xsim.traces.io import DEPLOYMENT_FILE, MEMORY_FILE
from xsim.traces.traceset import TraceSet, discover

if TYPE_CHECKING:
    from xsim.api.options import ComputeOptions
    from xsim.api.whatif import Recorded  # loaded for a what-if or hypothetical GPUs only (start-up)
    from xsim.netmodels.api import NetworkModel


@dataclass(frozen=True)
class Replay:
    """What `simulate` returns: the trace set, its deployment (or None), the result and the iteration cost."""

    trace_set: TraceSet
    deployment: object | None  # tracegen Deployment read from deployment.json beside the traces
    result: ReplayResult
    cost: dict | None  # tracegen.cost.IterationCost as JSON, when the traces come with a deployment
    memory: dict | None = None  # peak memory per rank from memory.json beside the traces (`xsim gen`)
    # One line each about the network replayed on (netmodels.nccl.topology_warnings): NICs under 100 Gb/s,
    # GPUs unlike the traces' device groups. The CLI prints them; not part of the summary.
    warnings: tuple[str, ...] = ()

    def summary(self) -> dict:
        """The summary dict (`xsim replay --json`): summary, cost and memory when known, and perf."""
        obj = self.result.summary_dict()
        if self.cost is not None:
            obj["cost"] = self.cost
        if self.memory is not None:
            obj["memory"] = self.memory
        obj["perf"] = self.result.perf_dict()
        return obj


def load_trace_set(path: str | os.PathLike[str]) -> TraceSet:
    """The trace set at `path`: a folder, a <prefix> of <prefix>.<rank>.et files, or one .et file (a
    compact set too: the replay folds it by construction)."""
    return discover(os.fspath(path), compact=True)


def load_deployment(trace_set: TraceSet):
    """The deployment (tracegen Deployment) written beside the traces by `xsim gen`, or None."""
    path = os.path.join(trace_set.directory, DEPLOYMENT_FILE)
    if not os.path.isfile(path):
        return None
    from xsim.tracegen.spec import load_spec
    from xsim.traces.limits import max_set_metadata_bytes

    return load_spec(path, max_set_metadata_bytes(trace_set.num_ranks))


def replay_config(options: ReplayOptions) -> ReplayConfig:
    """The engine's resources and rules for these options."""
    caps = capabilities_named(resolve_model(options.network))
    return ReplayConfig(
        compute_streams=options.compute_streams,
        comm_channels=options.comm_channels,
        honour_stream=options.honour_stream,
        comm_mode=options.network.comm,
        # ASTRA-sim replays BROADCAST by its duration instead of simulating it (reference 3.2).
        duration_comm_types=frozenset({pb.BROADCAST}) if caps.broadcast_by_duration else frozenset(),
    )


def iteration_cost(deployment, iteration_ns: int) -> dict | None:
    """TCO of one iteration when the traces come with a deployment (GPU types and prices), else None."""
    if deployment is None or not len(deployment.device_groups):
        return None
    from xsim.tracegen.cost import iteration_cost as cost_of

    return cost_of(deployment, iteration_ns).to_json()


def simulate(trace_set: TraceSet | str | os.PathLike[str], options: ReplayOptions | None = None) -> Replay:
    """Build the network and compute models for `options` and replay the trace set."""
    options = options or ReplayOptions()
    ts = trace_set if isinstance(trace_set, TraceSet) else load_trace_set(trace_set)
    deployment = load_deployment(ts)
    from xsim.traces.setid import check_identity

    plan_id = None
    if deployment is not None:  # a set without deployment.json (ASTRA-sim's traces) skips the planner's ids
        from xsim.tracegen.set_identity import plan_id_of

        plan_id = plan_id_of(deployment)
    check_identity(ts, plan_id)  # a stale rank, another plan's file or deployment.json: refused, named
    ran = _run(ts, deployment, options)
    result = ran.result
    priced, memory, target_line = _priced_target(ts, deployment, ran.compute_options)
    return Replay(
        ts,
        deployment,
        result,
        iteration_cost(priced, result.summary_dict()["iteration_time_ns"]),
        memory,
        # A what-if's GPUs are the target's: the topology is checked against them, not the recorded ones.
        (*ran.whatif_lines, *target_line, *network_warnings(ran.network, priced)),
    )


@dataclass(frozen=True)
class _Ran:
    """A replay run: its result, the network model it ran on, the compute options it ran with (a
    what-if's resolved) and the what-if's lines."""

    result: ReplayResult
    network: NetworkModel
    compute_options: ComputeOptions
    whatif_lines: tuple[str, ...]


def _run(ts: TraceSet, deployment, options: ReplayOptions) -> _Ran:
    """Build the models and replay; an error names the trace set (file, rank and node) in one line."""
    config = replay_config(options)
    gpu_types = None
    if deployment is not None or options.compute.gpu_file:  # else no GPU type is defined (whatif.py)
        from xsim.api.whatif import defined_gpu_types

        gpu_types = defined_gpu_types(deployment, options.compute.gpu_file)
    try:
        network = build_network(
            options.network,
            deployment,
            where=os.path.join(ts.directory, DEPLOYMENT_FILE),
            ranks=ts.num_ranks,
            gpu_types=gpu_types,
        )
        compute_options, whatif_lines = options.compute, ()
        if compute_options.as_gpu:
            from xsim.api.whatif import resolve_whatif

            compute_options, whatif_lines = resolve_whatif(compute_options, _recorded(ts, deployment))
        compute = build_compute(compute_options, ts.num_ranks)
        with replay_progress(options.progress) as progress:
            result = replay_simulate(
                ts,
                network=network,
                compute=compute,
                groups=options.comm_groups,
                config=config,
                progress=progress,
                fold="auto" if options.fold else None,
            )
        if not options.fold:
            result.fold_status, result.fold_reason = "unfolded", "folding off (--no-fold)"
    except NetworkModelError as exc:
        raise ReplayError(f"network model: {exc}") from None
    except ReplayDeadlock as exc:
        if exc.where is not None:
            raise
        # The engine names ranks and nodes; the one line names the trace set too (file, rank and node).
        raise ReplayDeadlock(exc.time_ns, exc.remaining, exc.stuck, where=ts.prefix) from None
    except ReplayError as exc:
        # Matching errors of the engine name ranks and nodes ("rank 1 node 55 ..."): add the set.
        if type(exc) is not ReplayError or ts.prefix in str(exc):
            raise
        raise ReplayError(f"{ts.prefix}: {exc}") from None
    return _Ran(result, network, compute_options, tuple(whatif_lines))


def _priced_target(
    ts: TraceSet, deployment, compute_options: ComputeOptions
) -> tuple[Any, Any, tuple[str, ...]]:
    """The deployment to price, the peak memory to check and a note: a what-if's target GPU's, else the
    recorded run's."""
    priced, memory, target_line = deployment, peak_memory(ts), ()
    if compute_options.as_gpu and deployment is not None and len(deployment.device_groups):
        # The what-if's hardware is the target: price and memory-check with it (issue 27 item 6).
        from xsim.api.whatif import target_deployment, target_memory

        priced, target = target_deployment(deployment, compute_options.as_gpu, compute_options.gpu_file)
        memory = target_memory(memory, target.memory_bytes)
        target_line = (
            f"what-if: cost and memory lines are for the target GPU {target.name} "
            f"({target.memory_bytes / 2**30:g} GiB, "
            + ("no list price" if target.price_per_hour is None else f"${target.price_per_hour:g}/h")
            + ")",
        )
    return priced, memory, target_line


def _recorded(ts: TraceSet, deployment) -> Recorded:
    """The recorded hardware: an imported set's Kineto device, else a generated set's one GPU type."""
    from xsim.api.whatif import Recorded, recorded_hardware

    rec = recorded_hardware(ts)
    if not rec.device and deployment is not None:
        gpus = {dg.gpu for dg in deployment.device_groups}
        if len(gpus) == 1:
            return Recorded(gpus.pop(), rec.runtime, "deployment.json device groups")
        if gpus:
            return Recorded("", rec.runtime, f"deployment.json device groups hold {len(gpus)} GPU types")
    return rec


def network_warnings(network, deployment) -> tuple[str, ...]:
    """What is surprising about the topology a replay ran on (netmodels.nccl.topology_warnings)."""
    topology = getattr(network, "topology", None)
    if topology is None:
        return ()
    from xsim.netmodels.nccl import topology_warnings

    rank_gpus = None
    if deployment is not None and len(deployment.device_groups):
        rank_gpus = {int(r): g.gpu for g in deployment.device_groups for r in g.ranks}
    return topology_warnings(topology, rank_gpus)


def peak_memory(trace_set: TraceSet) -> dict | None:
    """Peak memory per rank from the memory.json `xsim gen` wrote beside the traces (tracegen/memory.py)."""
    path = os.path.join(trace_set.directory, MEMORY_FILE)
    if not os.path.isfile(path):
        return None  # not a generated set
    from xsim.tracegen.memory_summary import peak_summary  # not tracegen.memory: its model need not load

    return peak_summary(path)


def check_outputs(trace_set: TraceSet, outputs: OutputOptions) -> None:
    """Refuse, before any work, outputs a compact set cannot give (the annotated copy of every rank)."""
    if outputs.annotate and trace_set.classes is not None:
        from xsim.traces.classes import compact_refusal

        raise ReplayError(f"{trace_set.prefix}: {compact_refusal('--annotate', trace_set.classes)}")


def set_inputs(trace_set: TraceSet, comm_groups: str | None = None) -> tuple[str, ...]:
    """The files a replay of `trace_set` reads: its rank files and the metadata beside them."""
    from xsim.traces.setid import SET_FILE

    d = trace_set.directory
    meta = [os.path.join(d, n) for n in (DEPLOYMENT_FILE, MEMORY_FILE, "comm_group.json", SET_FILE)]
    extra = [comm_groups] if comm_groups else []
    return tuple(dict.fromkeys([*trace_set.paths, *(p for p in meta if os.path.exists(p)), *extra]))


def write_outputs(replay: Replay, outputs: OutputOptions) -> list[str]:
    """Write the tables (+ source.json, cost.json), the timeline and the annotated traces; returns paths.

    The result folder and the annotated set are written whole (traces.outputs.whole_folder): a fresh
    sibling swapped in by one rename, refused when it would land on an input, a symbolic link or a folder
    of files this command does not write. A timeline inside the result folder is written with it.
    """
    if not (outputs.out or outputs.timeline or outputs.annotate):
        return []  # nothing to write: the exports (and polars) are not even loaded
    check_outputs(replay.trace_set, outputs)
    from xsim.replay.export import write_annotated, write_timeline
    from xsim.replay.export.outputs import RESULT_KIND, stage_run
    from xsim.traces.outputs import check_path_text, whole_folder
    from xsim.traces.setid import read_set_file

    inputs = set_inputs(replay.trace_set, outputs.comm_groups)
    written: list[str] = []
    target = ""
    timeline, annotate = outputs.timeline, outputs.annotate
    try:
        for path in (outputs.out, outputs.timeline, outputs.annotate):
            if path:
                check_path_text(path)
        if outputs.out:
            target = outputs.out
            # Which trace set this is a replay of (read by `xsim validate --sim DIR`), and the cost.
            ident = read_set_file(replay.trace_set.directory)
            source = {"trace": os.path.abspath(replay.trace_set.prefix)}
            if ident is not None:
                source["set_id"] = ident.set_id
            extras = {"source.json": json.dumps(source) + "\n"}
            if replay.cost is not None:
                extras["cost.json"] = json.dumps(replay.cost, indent=1) + "\n"
            res = os.path.abspath(outputs.out)
            inside = timeline and os.path.dirname(os.path.abspath(timeline)) == res
            ann_inside = annotate and os.path.dirname(os.path.abspath(annotate)) == res
            with whole_folder(outputs.out, RESULT_KIND, inputs=inputs, force=outputs.force) as stage:
                names = stage_run(replay.result, stage, extras)
                # A timeline or annotated set inside the result folder is written with it, whole.
                if inside:
                    dst = os.path.join(stage, os.path.basename(timeline))
                    names.append(os.path.basename(write_timeline(replay.result, dst, inputs)))
                    timeline = None
                if ann_inside:
                    dst = os.path.join(stage, os.path.basename(annotate))
                    write_annotated(replay.result, dst, inputs=inputs, force=outputs.force)
                    names.append(os.path.basename(annotate))
                    annotate = None
            written += [os.path.join(outputs.out, n) for n in sorted(set(names))]
        if timeline:
            target = timeline
            written.append(write_timeline(replay.result, timeline, inputs))
        if annotate:
            target = annotate
            write_annotated(replay.result, annotate, inputs=inputs, force=outputs.force)
            written.append(annotate)
    except OSError as exc:
        raise ReplayError(f"{target}: cannot write: {exc.strerror or exc}") from None
    return written
