"""Build the compute model a replay runs with: recorded durations, ASTRA-sim's roofline, the deployment's
GPUs (catalog numbers with the spec's `gpus:` overrides, and its `profile:` rows), device profiles, speeds.

Building a compute model from a tracegen deployment sits above replay (replay may not import tracegen):
it lives here, in the API layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from replay.compute import (
    ComputeModel,
    DeviceProfile,
    DurationModel,
    RooflineModel,
    SpeedScaled,
    load_device_profile,
    parse_speed,
    replay_duration_ns,
)
from replay.errors import ReplayError
from traces import pb
from traces.io import JsonFileError, read_json
from xsim.api.options import ComputeOptions


def catalog_device(name: str, overrides: Mapping | None = None) -> DeviceProfile:
    """Roofline device of a catalog GPU: achieved rates (datasheet peak x the catalog's efficiency, after
    the spec's overrides), as the generator times ops."""
    from tracegen.catalog import gpu, with_overrides
    from tracegen.errors import CatalogError

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


def profiled_op(node: pb.Node) -> tuple[str, str] | None:
    """(op, phase) of a generated COMP node, from its name `[L<layer>.]<op>.<phase>[.mb<k>]`; else None."""
    parts = node.name.split(".")
    if parts[-1].startswith("mb") and parts[-1][2:].isdigit():
        parts.pop()
    return (parts[-2], parts[-1]) if len(parts) >= 2 else None


@dataclass(frozen=True)
class ProfiledOps:
    """Nodes the spec's `profile:` rows time (same GPU, op and phase) replay their recorded duration, which
    the generator took from the row; every other node asks the base model."""

    base: ComputeModel
    gpu_of_rank: Mapping[int, str]
    rows: frozenset[tuple[str, str, str]]  # (gpu, op, phase)

    @property
    def name(self) -> str:
        """Base model's name with the profile marker."""
        return f"{self.base.name}+profile"

    def duration_ns(self, rank: int, node: pb.Node) -> int:
        """The recorded time of a profiled op, else the base model's time."""
        if node.type == pb.COMP_NODE:
            key = profiled_op(node)
            if key is not None and (self.gpu_of_rank.get(rank, ""), *key) in self.rows:
                return replay_duration_ns(node)
        return self.base.duration_ns(rank, node)


def deployment_compute(deployment) -> ComputeModel:
    """Roofline on each rank's GPU from the deployment itself: catalog numbers with the spec's `gpus:`
    overrides, and its `profile:` rows for the ops they time."""
    from tracegen.errors import CatalogError
    from tracegen.spec import gpu_specs

    try:
        specs = gpu_specs(deployment)
    except (CatalogError, KeyError) as exc:
        raise ReplayError(f"GPU: {exc}") from None
    devices = {name: device_of(spec) for name, spec in specs.items()}
    profiles: dict[int, DeviceProfile] = {}
    gpu_of_rank: dict[int, str] = {}
    for dg in deployment.device_groups:
        for r in dg.ranks:
            profiles[int(r)] = devices[dg.gpu]
            gpu_of_rank[int(r)] = specs[dg.gpu].name  # the generator keys profile rows by this name
    model: ComputeModel = RooflineModel(profiles=profiles)
    if len(deployment.profile):
        rows = frozenset((p.gpu, p.op, p.phase) for p in deployment.profile)
        model = ProfiledOps(model, gpu_of_rank, rows)
    return model


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
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ReplayError(f"{path}: ASTRA-sim system config {key!r} must be a number, got {v!r}")
    return float(v)


def astra_roofline(path: str) -> ComputeModel | None:
    """ASTRA-sim's roofline from a system.json with `roofline-enabled`, else None (durations replayed)."""
    doc = _astra_system(path)
    if not _astra_number(doc, "roofline-enabled", path):
        return None
    # ASTRA-sim units: peak-perf in TFLOPS (1e12), local-mem-bw in GB/s (1e9 bytes).
    prof = DeviceProfile(
        _astra_number(doc, "peak-perf", path) * 1e12,
        _astra_number(doc, "local-mem-bw", path) * 1e9,
        "astra-sim",
    )
    return RooflineModel(profiles={}, default=prof)


def _check_ranks(ranks, num_ranks: int | None, what: str) -> None:
    if num_ranks is None:
        return
    outside = sorted(r for r in ranks if r >= num_ranks)
    if outside:
        raise ReplayError(f"{what} rank {outside[0]}, but the trace set has ranks 0..{num_ranks - 1}")


def build_compute(options: ComputeOptions, deployment=None, num_ranks: int | None = None) -> ComputeModel:
    """The compute model: recorded durations, else ASTRA-sim's roofline, the deployment's GPUs, a device
    profile file (each later one replacing the earlier), then what-if rescaling and speed factors."""
    model: ComputeModel = DurationModel()
    speed: dict[int, float] = {}
    if options.astra_system:
        model = astra_roofline(options.astra_system) or model
    if deployment is not None and len(deployment.device_groups):
        model = deployment_compute(deployment)
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
    from replay.whatif import whatif_model
    from tracegen.catalog import gpu
    from tracegen.errors import CatalogError

    if not (options.as_gpu and options.from_gpu):
        raise ReplayError("--as-gpu and --from-gpu go together (the target GPU and the measured one)")
    try:
        return whatif_model(gpu(options.from_gpu), gpu(options.as_gpu), base=base)
    except CatalogError as exc:
        raise ReplayError(f"what-if: {exc}") from None
