"""Build the compute model a replay runs with: recorded durations (for a generated set, the generator's
exact times, which hold the spec's GPUs, overrides, profile rows and compute model), ASTRA-sim's roofline,
device profiles, what-if rescaling and speed factors.

Building a compute model from a tracegen deployment sits above replay (replay may not import tracegen):
it lives here, in the API layer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from xsim.api.options import ComputeOptions
from xsim.replay.compute import (
    ComputeModel,
    DeviceProfile,
    DurationModel,
    RooflineModel,
    SpeedScaled,
    load_device_profile,
    parse_speed,
)
from xsim.replay.errors import ReplayError
from xsim.traces.io import JsonFileError, read_json


def catalog_device(name: str, overrides: Mapping | None = None) -> DeviceProfile:
    """Roofline device of a catalog GPU: achieved rates (datasheet peak x the catalog's efficiency, after
    the spec's overrides), as the generator times ops."""
    from xsim.tracegen.catalog import gpu, with_overrides
    from xsim.tracegen.errors import CatalogError

    try:
        spec = gpu(name)
        if overrides:
            spec = with_overrides(spec, overrides)
    except (CatalogError, KeyError) as exc:
        raise ReplayError(f"GPU {name!r}: {exc}") from None
    return device_of(spec)


def device_of(spec) -> DeviceProfile:
    """Roofline device of a tracegen GpuSpec: achieved FLOP/s and bytes/s."""
    return DeviceProfile(spec.peak_flops * spec.gemm_eff, spec.mem_bw * spec.mem_eff, spec.name)


def _astra_system(path: str) -> dict:
    try:
        doc = read_json(path)
    except JsonFileError as exc:
        raise ReplayError(f"{path}: ASTRA-sim system config: {exc.reason}") from None
    if not isinstance(doc, dict):
        raise ReplayError(f"{path}: ASTRA-sim system config must be a JSON object")
    return doc


def _astra_number(doc: dict, key: str, path: str) -> float:
    """A numeric key of an ASTRA-sim system config (absent = 0), or a clear error naming file and key."""
    v = doc.get(key, 0)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ReplayError(f"{path}: ASTRA-sim system config {key!r} must be a finite number, got {v!r}")
    return float(v)


def _astra_rate(doc: dict, key: str, path: str, unit: str) -> float:
    """A rate key of the roofline (TFLOPS or GB/s), at least MIN_GBPS of its unit."""
    from xsim.netmodels.astra import MIN_GBPS

    v = _astra_number(doc, key, path)
    if v < MIN_GBPS:
        raise ReplayError(
            f"{path}: ASTRA-sim system config {key!r} must be >= {MIN_GBPS:g} {unit}, got {v!r}"
        )
    return v


def astra_roofline(path: str) -> ComputeModel | None:
    """ASTRA-sim's roofline from a system.json with `roofline-enabled`, else None (durations replayed)."""
    doc = _astra_system(path)
    if not _astra_number(doc, "roofline-enabled", path):
        return None
    # ASTRA-sim units: peak-perf in TFLOPS (1e12), local-mem-bw in GB/s (1e9 bytes).
    prof = DeviceProfile(
        _astra_rate(doc, "peak-perf", path, "TFLOPS") * 1e12,
        _astra_rate(doc, "local-mem-bw", path, "GB/s") * 1e9,
        "astra-sim",
    )
    return RooflineModel(profiles={}, default=prof)


def _check_ranks(ranks, num_ranks: int | None, what: str) -> None:
    if num_ranks is None:
        return
    outside = sorted(r for r in ranks if r >= num_ranks)
    if outside:
        raise ReplayError(f"{what} rank {outside[0]}, but the trace set has ranks 0..{num_ranks - 1}")


def build_compute(options: ComputeOptions, num_ranks: int | None = None) -> ComputeModel:
    """The compute model: recorded durations, else ASTRA-sim's roofline, a device profile file (each later
    one replacing the earlier), then what-if rescaling and speed factors."""
    # Recorded durations by default. A set from `xsim gen` thus replays the times its generator recorded
    # (duration_ns, exact), which hold the spec's GPUs with their `gpus:` overrides, `profile:` rows,
    # compute model and precision (issue 10, bug 1: rebuilding them from the bare catalog ignored all four).
    model: ComputeModel = DurationModel()
    speed: dict[int, float] = {}
    if options.astra_system:
        model = astra_roofline(options.astra_system) or model
    if options.device_profile:
        f = load_device_profile(options.device_profile, catalog_device)
        _check_ranks(f.ranks, num_ranks, f"{options.device_profile}: device for")
        model = RooflineModel(profiles=dict(f.ranks), default=f.default)
        speed.update(f.speed)
    if options.as_gpu or options.from_gpu:
        model = _whatif(options, model)
    speed.update(parse_speed(list(options.speed)))
    _check_ranks(speed, num_ranks, "speed factor for")
    if speed:
        model = SpeedScaled(model, speed)
    return model


def _whatif(options: ComputeOptions, base: ComputeModel) -> ComputeModel:
    """Measured compute rescaled by op class from from_gpu to as_gpu (catalog numbers)."""
    from xsim.replay.whatif import whatif_model
    from xsim.tracegen.catalog import defined_gpus, gpu
    from xsim.tracegen.errors import CatalogError, SpecError
    from xsim.tracegen.spec import gpu_file_specs, read_gpu_file

    if not (options.as_gpu and options.from_gpu):
        raise ReplayError(
            "--as-gpu and --from-gpu go together (the target GPU and the measured one; --from-gpu may be left "
            "out when the trace's Kineto deviceProperties names the GPU)"
        )
    try:
        defs = gpu_file_specs(read_gpu_file(options.gpu_file)) if options.gpu_file else {}
        with defined_gpus(defs):
            return whatif_model(gpu(options.from_gpu), gpu(options.as_gpu), base=base)
    except (CatalogError, SpecError) as exc:
        raise ReplayError(f"what-if: {exc}") from None
