"""What a GPU computes: dense tensor-core peaks, memory, achieved-efficiency factors and prices.

What connects GPUs (NVLink, PCIe, NICs: the paper's Tables 5 and 6) lives in netmodels, keyed by the
same names. Peaks are datasheet dense BF16/FP16 tensor-core figures, never the paper's Table 2 column,
which mixes non-tensor-core A100/H100 numbers with tensor-core H200/B200 ones (DESIGN.md, pitfalls).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from tracegen.errors import CatalogError
from traces.wording import did_you_mean

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
}
ALIASES: dict[str, str] = {
    "A100": "A100-40GB",
    "A100-40G": "A100-40GB",
    "A100-80G": "A100-80GB",
    "H100-80GB": "H100",
    "H100-SXM": "H100",
    "H200-141GB": "H200",
    "B200-192GB": "B200",
    "V100-32GB": "V100",
}
GPU_NAMES: tuple[str, ...] = tuple(_CATALOG)


def canonical_gpu_name(name: str) -> str:
    """The catalog's spelling of `name` (case-insensitive, aliases resolved); raises for unknown GPUs."""
    key = name.strip().upper()
    for cand in (key, ALIASES.get(key, "")):
        if cand in _CATALOG:
            return cand
    for alias, target in ALIASES.items():
        if alias.upper() == key:
            return target
    raise CatalogError(
        f"unknown GPU {name!r}{did_you_mean(name, GPU_NAMES)} (known: {', '.join(GPU_NAMES)}; alias A100 = A100-40GB)"
    )


def gpu(name: str) -> GpuSpec:
    """The catalog entry of a GPU by name or alias."""
    return _CATALOG[canonical_gpu_name(name)]


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
_MIN_RATE = {"peak_flops": 1e9, "fp8_flops": 1e9, "mem_bw": 1e9}
# Highest GPU price accepted: $1M per GPU-hour, ~1e5x cloud list prices (H100 on-demand ~$2-12/h). Below it,
# price x ranks (<= 2^20) x hours (int64 ns) stays finite, so cost.json never holds Infinity (issue 16).
_MAX_PRICE_PER_HOUR = 1e6


def check_gpu(spec: GpuSpec) -> None:
    """Reject impossible numbers in a (possibly user-overridden) GPU entry."""
    for f in fields(spec):
        v = getattr(spec, f.name)
        if f.name in ("name", "overridden") or (f.name in ("price_per_hour", "fp8_flops") and v is None):
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
    if not isinstance(spec.sms, int):
        raise CatalogError(f"GPU {spec.name}: sms must be a whole number of SMs, got {spec.sms!r}")
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
