"""What-if replays told honestly: which GPU the trace was recorded on (Kineto deviceProperties, kept by the
importer as the set's `recorded_device`), warnings when it contradicts --from-gpu or when the trace ran on
CPU, and cost and memory lines for the target GPU rather than the recorded one (issues 26 item 7, 27 item 6).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from xsim.api.options import ComputeOptions
from xsim.replay.errors import ReplayError
from xsim.traces.gpu_names import catalog_name, from_device_name

RECORDED_DEVICE = "recorded_device"  # GlobalMetadata attribute written by `xsim import pytorch`
PYTORCH_DEVICE = "pytorch_device"  # "cuda" | "cpu", written by `xsim import pytorch`


@dataclass(frozen=True)
class Recorded:
    """What a trace set says of the hardware it was recorded on (both "" when it says nothing)."""

    device: str  # Kineto's device name, e.g. "NVIDIA H100 80GB HBM3"
    runtime: str  # "cuda" or "cpu" (the importer's pytorch_device)
    source: str = "Kineto deviceProperties"  # where `device` was read


def recorded_hardware(trace_set) -> Recorded:
    """The recorded device and runtime of a set, from rank 0's metadata."""
    from xsim.traces.attrs import attr_dict

    meta = attr_dict(trace_set.load(0).metadata)
    trace_set.release(0)
    return Recorded(str(meta.get(RECORDED_DEVICE, "")), str(meta.get(PYTORCH_DEVICE, "")))


def resolve_whatif(options: ComputeOptions, recorded: Recorded) -> tuple[ComputeOptions, tuple[str, ...]]:
    """The what-if options with --from-gpu filled from the recorded device when absent, and the lines that
    say where the source GPU came from or what contradicts it."""
    if not options.as_gpu:
        return options, ()
    lines: list[str] = []
    found = (catalog_name(recorded.device) or from_device_name(recorded.device)) if recorded.device else None
    if recorded.runtime == "cpu":
        lines.append(
            "what-if: the trace was recorded on CPU (no GPU kernels in Kineto): its op times are CPU times, "
            f"and --from-gpu {options.from_gpu or '?'} only labels them; the result is not a GPU comparison"
        )
    if options.from_gpu is None:
        if found is None:
            why = (
                f"its recorded device {recorded.device!r} is no catalog GPU"
                if recorded.device
                else f"the trace names no recorded GPU ({recorded.source})"
            )
            raise ReplayError(
                f"--as-gpu and --from-gpu go together (the target GPU and the measured one): {why}"
            )
        lines.append(f"what-if: recorded GPU {found} ({recorded.source} {recorded.device!r})")
        return replace(options, from_gpu=found), tuple(lines)
    if found is not None and _canonical(options.from_gpu) != found:
        lines.append(
            f"what-if: --from-gpu {options.from_gpu} contradicts the recorded device {recorded.device!r} "
            f"({found}); the speed-ups assume {options.from_gpu}"
        )
    return options, tuple(lines)


def _canonical(name: str) -> str:
    from xsim.tracegen.catalog import canonical_gpu_name
    from xsim.tracegen.errors import CatalogError

    try:
        return canonical_gpu_name(name)
    except CatalogError:
        return name


def target_deployment(deployment, as_gpu: str, gpu_file: str | None = None):
    """A copy of a generated set's deployment with every device group on the what-if's target GPU (so cost
    uses its price and memory its capacity), its definition recorded when it is a hypothetical GPU."""
    from xsim.tracegen import catalog
    from xsim.tracegen.deployment_pb2 import Deployment
    from xsim.tracegen.spec import gpu_file_specs, read_gpu_file

    defs = gpu_file_specs(read_gpu_file(gpu_file)) if gpu_file else {}
    with catalog.defined_gpus(defs):
        target = catalog.gpu(as_gpu)
    dep = Deployment()
    dep.CopyFrom(deployment)
    for dg in dep.device_groups:
        dg.gpu = target.name
    kept = [g for g in dep.gpus if g.name == target.name]
    del dep.gpus[:]
    dep.gpus.extend(kept)
    if not catalog.is_catalog_gpu(target.name) and not kept:
        entry = dep.gpus.add(name=target.name)
        for k, v in sorted(catalog.definition_fields(target).items()):
            setattr(entry, k, v)
    return dep, target


def target_memory(memory: dict | None, capacity_bytes: int) -> dict | None:
    """The replay summary's memory with every rank's capacity the target GPU's."""
    if memory is None:
        return None
    peaks = memory["per_rank_peak_bytes"]
    return {
        **memory,
        "fits": all(p <= capacity_bytes for p in peaks),
        "per_rank_capacity_bytes": [capacity_bytes] * len(peaks),
    }


def defined_gpu_types(deployment, gpu_file: str | None) -> dict | None:
    """Interconnect entries of the hypothetical GPUs a replay knows (the set's deployment.json and a
    --gpu-file), for a `--topology nodes:` spec that names them; None when there are none."""
    if deployment is None and not gpu_file:
        return None
    from xsim.tracegen.spec import gpu_file_specs, gpu_type_entry, gpu_types, read_gpu_file

    out = dict(gpu_types(deployment)) if deployment is not None and len(deployment.device_groups) else {}
    if gpu_file:
        out.update({n: gpu_type_entry(g) for n, g in gpu_file_specs(read_gpu_file(gpu_file)).items()})
    return out or None
