"""Time of a MoE layer's grouped expert GEMMs under the calibrated compute model (issue 28).

A grouped GEMM runs one [m_e, K] x [K, N] product per local expert e in one kernel (CUTLASS grouped GEMM,
Transformer Engine GroupedLinear, DeepGEMM's "contiguous layout"). Its time follows the tile and wave model
of tracegen.gemm with two grouped-specific terms:

- tile quantization per expert: each expert's rows are cut into tiles of their own (an expert segment is
  padded to the M tile: DeepGEMM's `get_m_alignment_for_contiguous_layout`), so E_local experts of m rows
  run E_local * ceil(m / mt) * ceil(N / nt) tiles, not ceil(E_local * m / mt) * ...;
- a fixed per-tile cost outside the K loop (prologue, epilogue: scaling and storing the output tile),
  written as K0 extra columns of K: a tile costs 2 mt nt (K + K0) at the plateau rate, so the achieved
  rate is plateau * K / (K + K0). Expert FFNs are narrow (Qwen3-30B-A3B: 768), so the down projection's
  K is small and this term dominates there.

Calibration (kept apart from validation; nothing here is fitted to an end-to-end run): DeepGEMM's README
performance tables as first published (deepseek-ai/DeepGEMM, February 2025, "Performance": H800, NVCC 12.8,
FP8 with fine-grained scaling, BF16 output). Its normal-GEMM rows at M = 4096 give the K dependence:
K 512: 590, K 1536: 990, K 2048: 1025, K 7168: 1304, K 16384: 1358 TFLOPS. P * K / (K + K0) through the
two ends (K 512 and 16384) gives K0 = 718 and P = 1417.5 TFLOPS (0.716 of the 1,979 dense FP8 peak, the
H100 FP8 MAMF plateau of tracegen.gemm being 0.709); the middle rows then come out at 966, 1049 and 1288
(2.4%, 2.3%, 1.2% off). Its grouped contiguous rows (4 groups x 8192 and 8 x 4096 rows, N 4096 K 7168:
1297 and 1288; N 7168 K 2048: 1099 and 1093 TFLOPS) match its normal GEMMs of the same per-group shape, so
grouping itself adds nothing at these sizes beyond the per-expert tiles (tests/test_grouped_gemm.py checks
the model against them). H800 has H100's SMs and FP8 tensor rate (132 SMs, 1,979 TFLOP/s dense).

The per-tile cost and its rescale are tracegen.gemm's one rule (`tile_cost`, `linear_compute_seconds`),
the same the dense linears follow: K0 = 718 where the plateau's calibration K is recorded (H100 FP8), the
per-column rate rescaled so MAMF's calibration shape keeps its measured rate, and in backward Transformer
Engine's GroupedLinear dgrad (reducing over N) and wgrad (reducing over each expert's rows) timed each.
"""

from __future__ import annotations

from xsim.tracegen.catalog import GpuSpec
from xsim.tracegen.gemm import (
    FP8_TILE_K0,
    LAUNCH_FLOOR_S,
    LinearGemm,
    achieved_bandwidth,
    linear_compute_seconds,
)

# Per-tile fixed cost in columns of K of an FP8 Hopper GEMM main loop (the DeepGEMM fit; see the docstring):
# tracegen.gemm.FP8_TILE_K0, kept under this name for the grouped-GEMM tests.
K0_FP8 = FP8_TILE_K0
# Ops timed as grouped GEMMs (one kernel over the local experts; shape (experts, rows, K, N)).
GROUPED_GEMM_OPS = frozenset({"moe_expert_up_gate", "moe_expert_down"})


def grouped_gemm_seconds(
    shape: tuple[int, ...], nbytes: int, gpu: GpuSpec, precision: str, phase: str, rates: str
) -> float:
    """Seconds of a grouped GEMM of shape (experts, rows, K, N) in `phase`: `rows` spread evenly over the
    experts, each expert's rows tiled on their own, timed by the one per-tile rule (backward: dgrad, wgrad)."""
    experts, rows, k, n = shape
    per_expert = -(-rows // experts)
    kernels = 2 if phase == "bwd" else 1
    floor = max(nbytes / achieved_bandwidth(gpu), kernels * LAUNCH_FLOOR_S)
    if per_expert == 0:  # no rows: the kernel still reads the experts' weights
        return floor
    lin = LinearGemm(per_expert, k, n, phase, kernels, experts)
    return max(linear_compute_seconds(lin, gpu, precision, rates), floor)
