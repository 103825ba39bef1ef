"""The calibrated time of fused (flash) attention: its own published rates, not the GEMM plateau.

A fused attention kernel runs well below the matmul rate of the same GPU (FlashAttention-2: up to 73% of
the A100's peak forward and 63% backward; on H100 it reaches 35%, FlashAttention-3 about 67%), so the
calibrated model times `attn_core` from tracegen/data/attention_calibration.csv (public kernel benchmarks
only; validation runs are kept apart), by GPU, kernel family and pass:

    time = executed FLOPs / (peak_fraction x dense BF16 peak [x tracegen.gemm.sustained_ratio])

Executed FLOPs follow the kernels' work decomposition: the s x s score matrix of each (sequence, head) is
computed in BLOCK x BLOCK tiles, 4 * BLOCK^2 * d FLOPs each forward; a causal kernel skips the tiles wholly
above the diagonal and computes n(n+1)/2 of the n^2 tiles (n = ceil(s / BLOCK)), so the diagonal tiles'
masked halves are executed work too (FlashAttention-2, section 3.1.1 "Causal masking"). Backward executes
2.5 x the forward's FLOPs (5 matmuls against 2, recomputing the scores), the convention the published
backward rates are stated in (FlashAttention-2 and -3, section 4.1), so the rate and the work agree.
The published rates are measured on non-causal shapes, so the tile count is what carries causality.

Which kernel: `Op.kernel` ("fa2" or "fa3", from the framework profile); a GPU without a row for "fa3"
(Ampere) runs "fa2". GPUs without any row, or with a `gpus:` gemm_eff override, keep the previous rule
(FLOPs at the GEMM-like efficiency gemm_eff).
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from functools import lru_cache

from xsim.tracegen.catalog import GpuSpec, tensor_peak
from xsim.tracegen.errors import CatalogError

DATA_FILE = os.path.join(os.path.dirname(__file__), "data", "attention_calibration.csv")
# Square tile of query rows x key columns: FlashAttention-2 section 3.3 "we choose blocks of size
# {64,128} x {64,128}"; FlashAttention-3 uses 128-row tiles for head dimension 128 (section 3.1). 128 is
# the tile of the head dimensions these models use (64-256).
BLOCK = 128
# Backward FLOPs over forward FLOPs as the kernels execute them (and as the sources count them): 2 matmuls
# forward, 5 backward (FlashAttention-2 section 4.1).
BWD_OVER_FWD = 2.5
# GPUs whose rows are another's: the A100 40GB has the A100 80GB's GA100 SMs and clocks (A100 datasheet:
# the same 312 TFLOPS dense BF16); the H200 has the H100 SXM5's 132 SMs and clocks (H200 datasheet: the
# same 989 TFLOPS dense BF16), attention being compute-bound at these lengths.
CALIBRATED_AS = {"A100-40GB": "A100-80GB", "H200": "H100"}
KERNELS = ("fa2", "fa3")


@dataclass(frozen=True)
class AttentionPoint:
    """One published attention-kernel rate: GPU, kernel, pass and the fraction of the dense BF16 peak."""

    gpu: str
    kernel: str
    phase: str
    peak_fraction: float
    source: str


def attention_points(path: str = DATA_FILE) -> list[AttentionPoint]:
    """The attention calibration data set (tracegen/data/attention_calibration.csv)."""
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    return [
        AttentionPoint(r["gpu"], r["kernel"], r["pass"], float(r["peak_fraction"]), r["source"]) for r in rows
    ]


@lru_cache(maxsize=1)
def _table() -> dict[tuple[str, str, str], float]:
    return {(p.gpu, p.kernel, p.phase): p.peak_fraction for p in attention_points()}


def attention_fraction(gpu_name: str, kernel: str, phase: str) -> float | None:
    """Published fraction of the dense BF16 peak of `kernel` on `gpu_name` in `phase` (fwd | bwd), or
    None where no benchmark is recorded; "fa3" falls back to "fa2" on GPUs without a Hopper kernel."""
    if kernel not in KERNELS:
        raise CatalogError(f"attention kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    if phase not in ("fwd", "bwd"):
        raise CatalogError(f"attention pass must be fwd or bwd, got {phase!r}")
    name = CALIBRATED_AS.get(gpu_name, gpu_name)
    table = _table()
    for k in (kernel, "fa2") if kernel == "fa3" else (kernel,):
        if (name, k, phase) in table:
            return table[(name, k, phase)]
    return None


def executed_flops(batch: int, heads: int, s: int, d: int, phase: str, causal: bool = True) -> int:
    """FLOPs a tiled flash-attention kernel executes for `batch` sequences of `heads` heads: forward
    4 * BLOCK^2 * d per score tile over n(n+1)/2 tiles causal (n^2 otherwise), backward 2.5x that."""
    n = math.ceil(s / BLOCK)
    tiles = n * (n + 1) // 2 if causal else n * n
    fwd = batch * heads * tiles * 4 * BLOCK * BLOCK * d
    return fwd if phase == "fwd" else int(BWD_OVER_FWD * fwd)


def flash_compute_seconds(
    shape: tuple[int, ...], phase: str, gpu: GpuSpec, kernel: str, clock_ratio: float
) -> float | None:
    """Compute time of one `attn_core` op of shape (batch, heads, kv_heads, s, d) on `gpu`, or None where
    the calibration has no row for it (the caller keeps its previous rule)."""
    if "gemm_eff" in gpu.overridden:
        return None
    frac = attention_fraction(gpu.name, kernel or "fa2", phase)
    if frac is None:
        return None
    batch, heads, _kv, s, d = shape
    rate = frac * tensor_peak(gpu, "bf16") * clock_ratio
    return executed_flops(batch, heads, s, d, phase) / rate
