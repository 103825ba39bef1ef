"""What a GPU computes: dense tensor-core peaks, memory, achieved-efficiency factors and prices.

What connects GPUs (NVLink, PCIe, NICs: the paper's Tables 5 and 6) lives in netmodels, keyed by the
same names. Peaks are datasheet dense BF16/FP16 tensor-core figures, never the paper's Table 2 column,
which mixes non-tensor-core A100/H100 numbers with tensor-core H200/B200 ones (DESIGN.md, pitfalls).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import Any

from xsim.tracegen.errors import CatalogError
from xsim.traces.gpu_names import GPU_ALIASES, catalog_name
from xsim.traces.wording import did_you_mean

GIB = 1 << 30
TERA = 1e12

# Achieved-efficiency defaults. These are rules of thumb, not measurements: cuBLAS BF16 GEMMs of
# transformer sizes (thousands on each side) commonly run at 60-80% of the dense peak, and streaming
# kernels reach 80-90% of HBM bandwidth. They are kept apart from the peaks so a user can calibrate
# them (spec key `gpus:`) or bypass them with a profiled op-time table (tracegen.profile).
DEFAULT_GEMM_EFF = 0.70
DEFAULT_MEM_EFF = 0.80


@dataclass(frozen=True)
class GpuSpec:
    """Compute capability of one GPU model."""

    name: str
    peak_flops: float  # dense BF16/FP16 tensor-core FLOP/s
    mem_bw: float  # bytes/s
    memory_bytes: int
    gemm_eff: float  # achieved fraction of peak_flops on GEMM-like ops
    mem_eff: float  # achieved fraction of mem_bw on memory-bound ops
    price_per_hour: float | None  # USD per GPU-hour, None when no public list price is recorded
    fp8_flops: float | None = None  # dense FP8 tensor-core FLOP/s; None: no FP8 tensor cores
    sms: int = 0  # streaming multiprocessors (wave quantization of the calibrated GEMM model)
    overridden: frozenset[str] = frozenset()  # fields a spec's `gpus:` replaced (tracegen.gemm reads it)
    # Whose calibration ceilings (tracegen.gemm: GEMM plateaus, measured copy efficiency) this GPU uses:
    # "" = its own name. Datasheet entries without public microbenchmarks and user-defined GPUs borrow the
    # nearest known architecture's (nearest_calibrated), and say so (definition_note).
    calibrated_as: str = ""
    # A user-defined GPU's interconnect (bytes/s per direction; None: the calibrated_as GPU's Table 5 row).
    # Catalog GPUs keep theirs in netmodels/presets.py; a defined one reaches netmodels through the derived
    # cluster's "gpu_types" (tracegen.spec.derive_cluster).
    nvlink_bandwidth: float | None = None
    nic_bandwidth: float | None = None  # one NIC's line rate
    nics: int = 1  # NICs per GPU (modelled as one link of nics x nic_bandwidth)
    defaulted: tuple[str, ...] = ()  # fields of a user definition filled from calibrated_as
    # The power-limited tensor-core clock of the job's slowest GPU on fully loaded boards over the clock one
    # GPU holds alone (tracegen.gemm.board_clock); 1.0 outside a multi-GPU run (tracegen.spec.gpu_specs).
    board_clock: float = 1.0

    @property
    def calibration_key(self) -> str:
        """The catalog name whose calibration ceilings this GPU uses."""
        return self.calibrated_as or self.name


_CATALOG: dict[str, GpuSpec] = {
    # NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf, the paper's ref [41]):
    # BF16 tensor core 312 TFLOPS dense (624 with sparsity); A100 40GB SXM HBM2 1,555 GB/s.
    # Price: AWS p4d.24xlarge (8x A100 40GB) on-demand us-east-1 list price $32.7726/h / 8.
    # SMs: NVIDIA A100 Tensor Core GPU Architecture whitepaper, 108 SMs on the A100 product. No FP8 (Ampere).
    "A100-40GB": GpuSpec(
        "A100-40GB", 312 * TERA, 1555e9, 40 * GIB, DEFAULT_GEMM_EFF, DEFAULT_MEM_EFF, 4.0966, None, 108
    ),
    # Same datasheet: A100 80GB SXM HBM2e 2,039 GB/s. Price: AWS p4de.24xlarge $40.9657/h / 8.
    "A100-80GB": GpuSpec(
        "A100-80GB", 312 * TERA, 2039e9, 80 * GIB, DEFAULT_GEMM_EFF, DEFAULT_MEM_EFF, 5.1207, None, 108
    ),
    # NVIDIA H100 Tensor Core GPU datasheet (paper ref [42]), H100 SXM: BF16 1,979 TFLOPS with sparsity,
    # i.e. 989.4 dense; 80 GB HBM3 at 3.35 TB/s. Price: AWS p5.48xlarge $98.32/h / 8, the list price
    # published 2023-2025 (AWS announced reductions in June 2025; override with `gpus:`).
    # FP8 tensor core 3,958 TFLOPS with sparsity, i.e. 1,979 dense (same datasheet). 132 SMs on H100 SXM5
    # (NVIDIA H100 Tensor Core GPU Architecture whitepaper).
    "H100": GpuSpec(
        "H100", 989.4 * TERA, 3.35e12, 80 * GIB, DEFAULT_GEMM_EFF, DEFAULT_MEM_EFF, 12.29, 1979 * TERA, 132
    ),
    # NVIDIA H200 datasheet (paper ref [13]): same Hopper tensor cores as H100 SXM (BF16 1,979 sparse,
    # 989.4 dense), 141 GB HBM3e at 4.8 TB/s. No price recorded: pass one with `gpus:`.
    # FP8 3,958 TFLOPS sparse = 1,979 dense (H200 datasheet); the H100 SXM5 die, 132 SMs.
    "H200": GpuSpec(
        "H200", 989.4 * TERA, 4.8e12, 141 * GIB, DEFAULT_GEMM_EFF, DEFAULT_MEM_EFF, None, 1979 * TERA, 132
    ),
    # NVIDIA HGX B200 datasheet (paper ref [12]): FP16/BF16 tensor core 4.5 PFLOPS with sparsity per GPU,
    # 2.25 dense; HBM3e 8 TB/s; 192 GB as the paper's Table 5 lists it (DGX B200 exposes 180 GB).
    # FP8 9 PFLOPS sparse = 4.5 dense per GPU (HGX B200 datasheet); 148 SMs (NVIDIA Blackwell
    # architecture technical brief: two dies, 148 SMs enabled on B200).
    "B200": GpuSpec(
        "B200", 2250 * TERA, 8.0e12, 192 * GIB, DEFAULT_GEMM_EFF, DEFAULT_MEM_EFF, None, 4500 * TERA, 148
    ),
    # NVIDIA V100 datasheet, V100 SXM2 32GB: 125 TFLOPS FP16 tensor (no BF16), HBM2 900 GB/s.
    # Price: AWS p3dn.24xlarge (8x V100 32GB) $31.212/h / 8.
    # 80 SMs (NVIDIA Tesla V100 GPU Architecture whitepaper); no FP8 (Volta).
    "V100": GpuSpec("V100", 125 * TERA, 900e9, 32 * GIB, DEFAULT_GEMM_EFF, DEFAULT_MEM_EFF, 3.9015, None, 80),
    # Datasheet GPUs users ask for (issue 26). None has a public GEMM sweep in tracegen/data, so each borrows
    # the calibration ceilings of the nearest measured architecture (calibrated_as, an assumption said in
    # `xsim gen`'s output and docs/compute.md). No public list price is recorded for any: set one with `gpus:`.
    # NVIDIA GB200 NVL72 datasheet: per rack FP16/BF16 tensor core 360 PFLOPS and FP8 720 PFLOPS with
    # sparsity over 72 Blackwell GPUs, i.e. 2.5 PFLOPS BF16 and 5 PFLOPS FP8 dense per GPU; 13.4 TB HBM3e at
    # 576 TB/s per rack = 186 GB and 8 TB/s per GPU. The B200 die (148 SMs): B200's calibration.
    "GB200": GpuSpec(
        "GB200",
        2500 * TERA,
        8.0e12,
        186 * GIB,
        DEFAULT_GEMM_EFF,
        DEFAULT_MEM_EFF,
        None,
        5000 * TERA,
        148,
        calibrated_as="B200",
    ),  # fmt: skip
    # NVIDIA H20 (Hopper, export-compliant; NVIDIA H20 product brief as reported by its resellers): FP16/BF16
    # tensor 148 TFLOPS dense, FP8 296 dense, 96 GB HBM3 at 4.0 TB/s, 78 SMs enabled of GH100. Hopper tensor
    # cores: H100's calibration.
    "H20": GpuSpec(
        "H20",
        148 * TERA,
        4.0e12,
        96 * GIB,
        DEFAULT_GEMM_EFF,
        DEFAULT_MEM_EFF,
        None,
        296 * TERA,
        78,
        calibrated_as="H100",
    ),  # fmt: skip
    # NVIDIA L40S datasheet (Ada Lovelace): BF16 tensor core 362.05 TFLOPS dense (733 with sparsity), FP8 733
    # dense (1,466 sparse); 48 GB GDDR6 at 864 GB/s; 142 SMs (18,176 CUDA cores, 128 per SM; 142 RT cores,
    # one per SM). Nearest measured architecture by peak: A100 (312 TFLOPS).
    "L40S": GpuSpec(
        "L40S",
        362.05 * TERA,
        864e9,
        48 * GIB,
        DEFAULT_GEMM_EFF,
        DEFAULT_MEM_EFF,
        None,
        733 * TERA,
        142,
        calibrated_as="A100-40GB",
    ),  # fmt: skip
    # AMD Instinct MI300X datasheet (CDNA 3): peak BF16 matrix 1,307.4 TFLOPS dense (2,614.9 with sparsity),
    # FP8 2,614.9 dense; 192 GB HBM3 at 5.3 TB/s; 304 compute units (the "sms" of the wave model). Nearest
    # measured architecture by peak: H100 (989.4 TFLOPS); no AMD GEMM sweep is in tracegen/data.
    "MI300X": GpuSpec(
        "MI300X",
        1307.4 * TERA,
        5.3e12,
        192 * GIB,
        DEFAULT_GEMM_EFF,
        DEFAULT_MEM_EFF,
        None,
        2614.9 * TERA,
        304,
        calibrated_as="H100",
    ),  # fmt: skip
}
ALIASES: dict[str, str] = GPU_ALIASES  # the one table (traces/gpu_names.py), shared with netmodels
GPU_NAMES: tuple[str, ...] = tuple(_CATALOG)

# User-defined GPUs visible to name look-ups (`gpus:` definitions of the spec being built, `--gpu-file`).
# A context variable, set only inside `defined_gpus(...)`, so a definition never outlives its spec/command.
_DEFINED: ContextVar[Mapping[str, GpuSpec]] = ContextVar("xsim_defined_gpus", default=MappingProxyType({}))

# How to describe a GPU that is not in the catalog (every "unknown GPU" error ends with it).
HOW_TO_DEFINE = (
    "describe a new GPU in the spec (gpus: {NAME: {peak_flops: FLOP/s, mem_bw: B/s, memory_bytes: B}}) "
    "or in a file passed with --gpu-file (docs/tracegen.md, 'Hypothetical GPUs')"
)

# Export variants that keep a catalog GPU's compute and cut its NVLink: the catalog keeps one entry per die,
# the cut link lives in a system preset, so their names point there instead of aliasing silently (an alias
# would derive the full NVLink). A800: the A100 80GB's GA100 with 400 GB/s NVLink (netmodels/presets.py
# "dgx-a800": NVIDIA to Reuters, heise online 2022-11-08).
VARIANT_HINTS: dict[str, str] = {
    "A800": "the A800 is the A100-80GB's compute with a 400 GB/s NVLink: write gpu: A100-80GB with "
    "cluster: dgx-a800",
}


@contextmanager
def defined_gpus(defs: Mapping[str, GpuSpec]) -> Iterator[None]:
    """Make user-defined GPUs known to canonical_gpu_name and gpu inside the block."""
    token = _DEFINED.set({**_DEFINED.get(), **defs})
    try:
        yield
    finally:
        _DEFINED.reset(token)


def canonical_gpu_name(name: str) -> str:
    """The catalog's spelling of `name` (case-insensitive, aliases resolved) or a defined GPU's name;
    raises for unknown GPUs, saying how to describe one."""
    known = catalog_name(name)
    if known is not None:
        return known
    defined = _DEFINED.get()
    key = str(name).strip().upper()
    for n in defined:
        if n.upper() == key:
            return n
    names = ", ".join((*GPU_NAMES, *defined))
    variant = next((h for v, h in VARIANT_HINTS.items() if key.startswith(v)), None)
    if variant is not None:
        raise CatalogError(f"unknown GPU {name!r}: {variant}; or {HOW_TO_DEFINE}")
    hint = did_you_mean(name, (*GPU_NAMES, *defined))
    raise CatalogError(
        f"unknown GPU {name!r}{hint} (known: {names}; alias A100 = A100-40GB); {HOW_TO_DEFINE}"
    )


def gpu(name: str) -> GpuSpec:
    """The catalog entry (or user definition in scope) of a GPU by name or alias."""
    n = canonical_gpu_name(name)
    return _CATALOG[n] if n in _CATALOG else _DEFINED.get()[n]


def is_catalog_gpu(name: str) -> bool:
    """Whether `name` (or an alias) names a catalog GPU rather than a user-defined one."""
    return catalog_name(name) is not None


_OVERRIDABLE = (
    "peak_flops", "mem_bw", "memory_bytes", "gemm_eff", "mem_eff", "price_per_hour", "fp8_flops", "sms",
)  # fmt: skip


def with_overrides(spec: GpuSpec, overrides: Mapping[str, Any]) -> GpuSpec:
    """A copy of `spec` with some numbers replaced (checked: positive, efficiencies in (0, 1])."""
    unknown = sorted(set(overrides) - set(_OVERRIDABLE))
    if unknown:
        raise CatalogError(
            f"GPU {spec.name}: unknown override(s) {', '.join(unknown)} (allowed: {', '.join(_OVERRIDABLE)})"
        )
    out = replace(spec, **dict(overrides), overridden=spec.overridden | frozenset(overrides))
    check_gpu(out)
    return out


# Keys of a user-defined GPU (spec `gpus:` entry of a new name, or a --gpu-file entry). The first three are
# required; the rest default as DEFINITION_DEFAULTS says (docs/tracegen.md, "Hypothetical GPUs").
DEFINITION_REQUIRED = ("peak_flops", "mem_bw", "memory_bytes")
DEFINITION_KEYS = (*_OVERRIDABLE, "calibrated_as", "nvlink_bandwidth", "nic_bandwidth", "nics")
# The GPUs tracegen/gemm.py holds public GEMM microbenchmarks (and copy benchmarks) for: the architectures a
# definition may borrow calibration ceilings from.
MEASURED_ARCHITECTURES = ("A100-40GB", "A100-80GB", "H100", "H200", "B200")


def _yaml_number(v: Any) -> Any:
    """A number written as a string in exponent form ("1.9e15"), as a float; anything else unchanged."""
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return v
    return v


def nearest_calibrated(peak_flops: float, mem_bw: float, fp8: bool) -> str:
    """The measured architecture nearest to a GPU of these rates: least |log peak ratio| + |log bandwidth
    ratio|, among those with FP8 tensor cores when it has them (ties: catalog order)."""
    cands = [_CATALOG[n] for n in MEASURED_ARCHITECTURES if not fp8 or _CATALOG[n].fp8_flops is not None]
    return min(
        cands, key=lambda g: abs(math.log(peak_flops / g.peak_flops)) + abs(math.log(mem_bw / g.mem_bw))
    ).name


def define_gpu(name: str, fields_: Mapping[str, Any]) -> GpuSpec:
    """A user-defined GPU from its keys (DEFINITION_KEYS), checked, with defaults from the nearest known
    architecture (or `calibrated_as`)."""
    fields_ = _definition_fields(name, fields_)
    peak, bw = float(fields_["peak_flops"]), float(fields_["mem_bw"])
    arch, defaulted = _calibrated_as(name, fields_, peak, bw)
    base = _CATALOG[arch]
    if "sms" not in fields_:
        defaulted.append("sms")
    for k in ("nvlink_bandwidth", "nic_bandwidth"):
        if k not in fields_:
            defaulted.append(k)
    spec = GpuSpec(
        name=str(name),
        peak_flops=peak,
        mem_bw=bw,
        memory_bytes=int(fields_["memory_bytes"]),
        gemm_eff=float(fields_.get("gemm_eff", DEFAULT_GEMM_EFF)),
        mem_eff=float(fields_.get("mem_eff", DEFAULT_MEM_EFF)),
        price_per_hour=float(fields_["price_per_hour"]) if "price_per_hour" in fields_ else None,
        fp8_flops=float(fields_["fp8_flops"]) if "fp8_flops" in fields_ else None,
        sms=int(fields_.get("sms", base.sms)),
        overridden=frozenset(k for k in fields_ if k in _OVERRIDABLE),
        calibrated_as=arch,
        nvlink_bandwidth=float(fields_["nvlink_bandwidth"]) if "nvlink_bandwidth" in fields_ else None,
        nic_bandwidth=float(fields_["nic_bandwidth"]) if "nic_bandwidth" in fields_ else None,
        nics=int(fields_.get("nics", 1)),
        defaulted=tuple(defaulted),
    )
    check_gpu(spec)
    return spec


def _definition_fields(name: str, fields_: Mapping[str, Any]) -> dict[str, Any]:
    """A GPU definition's keys checked (known, the required ones given, positive numbers, whole counts)."""
    if catalog_name(name) is not None:
        raise CatalogError(f"GPU {name}: is a catalog GPU; a definition needs a new name")
    unknown = sorted(set(fields_) - set(DEFINITION_KEYS))
    if unknown:
        raise CatalogError(
            f"GPU {name}: unknown key(s) {', '.join(map(str, unknown))} (a GPU definition takes: "
            f"{', '.join(DEFINITION_KEYS)})"
        )
    missing = [k for k in DEFINITION_REQUIRED if k not in fields_]
    if missing:
        raise CatalogError(
            f"GPU {name!r} is not in the catalog (known: {', '.join(GPU_NAMES)}): to describe it, give "
            f"{', '.join(missing)} (and optionally fp8_flops, sms, nvlink_bandwidth, nic_bandwidth, nics, "
            "calibrated_as, price_per_hour; docs/tracegen.md, 'Hypothetical GPUs')"
        )
    # PyYAML reads 1.9e15 (no sign in the exponent) as a string, YAML 1.1's rule: take such numbers too.
    fields_ = {k: _yaml_number(v) if k != "calibrated_as" else v for k, v in fields_.items()}
    for k, v in fields_.items():
        if k == "calibrated_as":
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not v > 0:
            raise CatalogError(f"GPU {name}: {k} must be a positive number, got {v!r}")
    for k in ("sms", "nics", "memory_bytes"):
        if k in fields_ and fields_[k] != int(fields_[k]):
            raise CatalogError(f"GPU {name}: {k} must be a whole number, got {fields_[k]!r}")
    return fields_


def _calibrated_as(name: str, fields_: Mapping[str, Any], peak: float, bw: float) -> tuple[str, list[str]]:
    """The measured architecture a definition takes its defaults from: its `calibrated_as`, else the
    nearest by peak and bandwidth; and the defaulted keys so far."""
    arch = fields_.get("calibrated_as")
    if arch is None:
        return nearest_calibrated(peak, bw, "fp8_flops" in fields_), ["calibrated_as"]
    known = catalog_name(str(arch))
    if known not in MEASURED_ARCHITECTURES:
        raise CatalogError(
            f"GPU {name}: calibrated_as must be one of {', '.join(MEASURED_ARCHITECTURES)} (the GPUs with "
            f"measured GEMM ceilings), got {arch!r}"
        )
    return known, []


def definition_fields(spec: GpuSpec) -> dict[str, Any]:
    """The keys of a user-defined GPU as given (what deployment.json and the spec hold)."""
    out: dict[str, Any] = {k: getattr(spec, k) for k in DEFINITION_REQUIRED}
    for k in ("gemm_eff", "mem_eff", "price_per_hour", "fp8_flops"):
        if k in spec.overridden:
            out[k] = getattr(spec, k)
    if "sms" not in spec.defaulted:
        out["sms"] = spec.sms
    if "calibrated_as" not in spec.defaulted:
        out["calibrated_as"] = spec.calibrated_as
    for k in ("nvlink_bandwidth", "nic_bandwidth"):
        if getattr(spec, k) is not None:
            out[k] = getattr(spec, k)
    if spec.nics != 1:
        out["nics"] = spec.nics
    return out


def definition_note(spec: GpuSpec) -> str:
    """One line saying what a hypothetical (user-defined) GPU borrows from a known architecture."""
    why = "nearest known architecture" if "calibrated_as" in spec.defaulted else "calibrated_as"
    borrowed = ["calibration ceilings (GEMM plateau, copy efficiency)"]
    borrowed += [k for k in spec.defaulted if k != "calibrated_as"]
    return f"GPU {spec.name} is hypothetical: {', '.join(borrowed)} from {spec.calibrated_as} ({why})"


def tensor_peak(spec: GpuSpec, precision: str) -> float:
    """Dense tensor-core FLOP/s of GEMMs in `precision` ("bf16", "fp16" or "fp8"); raises without FP8 units."""
    if precision != "fp8":
        return spec.peak_flops
    if spec.fp8_flops is None:
        with_fp8 = ", ".join(n for n, g in _CATALOG.items() if g.fp8_flops is not None)
        raise CatalogError(
            f"GPU {spec.name} has no FP8 tensor cores (precision fp8 needs one of: {with_fp8})"
        )
    # A `gpus:` override of peak_flops scales the catalog FP8 peak with it (same tensor cores, other clocks)
    # unless fp8_flops is overridden too.
    if "fp8_flops" in spec.overridden or spec.name not in _CATALOG:
        return spec.fp8_flops
    return spec.fp8_flops * spec.peak_flops / _CATALOG[spec.name].peak_flops


# Lowest rates accepted in a GPU entry: 1 GFLOP/s and 1 GB/s, over a hundred times below every entry of
# this catalog (all datasheet peaks >= 1e11/s), so a smaller number is a unit slip (issue 16: peak_flops
# 1e-300); such rates would also push op durations past int64 nanoseconds.
_MIN_RATE = {
    "peak_flops": 1e9, "fp8_flops": 1e9, "mem_bw": 1e9, "nvlink_bandwidth": 1e9, "nic_bandwidth": 1e9
}  # fmt: skip
# Highest GPU price accepted: $1M per GPU-hour, ~1e5x cloud list prices (H100 on-demand ~$2-12/h). Below it,
# price x ranks (<= 2^20) x hours (int64 ns) stays finite, so cost.json never holds Infinity (issue 16).
_MAX_PRICE_PER_HOUR = 1e6


def check_gpu(spec: GpuSpec) -> None:
    """Reject impossible numbers in a (possibly user-overridden) GPU entry."""
    for f in fields(spec):
        v = getattr(spec, f.name)
        if f.name in ("name", "overridden", "calibrated_as", "defaulted") or (
            f.name in ("price_per_hour", "fp8_flops", "nvlink_bandwidth", "nic_bandwidth") and v is None
        ):
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
            raise CatalogError(f"GPU {spec.name}: {f.name} must be a positive number, got {v!r}")
        if v == math.inf:
            raise CatalogError(f"GPU {spec.name}: {f.name} must be a finite number, got {v!r}")
        if f.name in _MIN_RATE and v < _MIN_RATE[f.name]:
            raise CatalogError(
                f"GPU {spec.name}: {f.name} {v!r} is below {_MIN_RATE[f.name]:g} per second (a unit slip?)"
            )
    if spec.price_per_hour is not None and spec.price_per_hour > _MAX_PRICE_PER_HOUR:
        raise CatalogError(
            f"GPU {spec.name}: price_per_hour {spec.price_per_hour!r} is over {_MAX_PRICE_PER_HOUR:g} $ per hour"
        )
    if not isinstance(spec.sms, int) or not isinstance(spec.nics, int):
        raise CatalogError(
            f"GPU {spec.name}: sms and nics must be whole numbers, got {spec.sms!r}, {spec.nics!r}"
        )
    for f, peak in (("gemm_eff", "peak_flops"), ("mem_eff", "mem_bw")):
        eff = getattr(spec, f)
        if eff > 1:
            raise CatalogError(f"GPU {spec.name}: {f} is a fraction of the peak, got {eff}")
        # The achieved rate obeys the same floor as the peak (gemm_eff 1e-300 is the same unit slip).
        if eff * getattr(spec, peak) < _MIN_RATE[peak]:
            raise CatalogError(
                f"GPU {spec.name}: {f} {eff!r} x {peak} {getattr(spec, peak):g} is below "
                f"{_MIN_RATE[peak]:g} per second (a unit slip?)"
            )
