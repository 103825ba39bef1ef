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

K0 is a time per tile in units of the FP8 main loop; a BF16 main loop is twice as slow per column of K
(half the tensor rate) while the epilogue stores the same BF16 tile, so K0 is halved for BF16 GEMMs.
"""

from __future__ import annotations

from xsim.tracegen.catalog import GpuSpec
from xsim.tracegen.gemm import LAUNCH_FLOOR_S, achieved_bandwidth, gemm_seconds

# Per-tile fixed cost in columns of K of an FP8 Hopper GEMM main loop: DeepGEMM README (Feb 2025), normal
# GEMMs at M 4096 on H800, fitted through K 512 (590 TFLOPS) and K 16384 (1358 TFLOPS); see the docstring.
K0_FP8 = 718
# Ops timed as grouped GEMMs (one kernel over the local experts; shape (experts, rows, K, N)).
GROUPED_GEMM_OPS = frozenset({"moe_expert_up_gate", "moe_expert_down"})


def tile_overhead_k(precision: str) -> int:
    """K0 of a GEMM in `precision`: the per-tile cost outside the K loop, in columns of K."""
    return K0_FP8 if precision == "fp8" else K0_FP8 // 2


def grouped_gemm_seconds(
    shape: tuple[int, ...], nbytes: int, gpu: GpuSpec, precision: str, kernels: int, rates: str
) -> float:
    """Seconds of a grouped GEMM of shape (experts, rows, K, N): `rows` spread evenly over the experts,
    each expert's rows tiled on their own, every tile paying K0 (`kernels` passes: 2 in backward)."""
    experts, rows, k, n = shape
    per_expert = -(-rows // experts)
    if per_expert == 0:  # no rows: the kernel still reads the experts' weights
        return max(nbytes / achieved_bandwidth(gpu), kernels * LAUNCH_FLOOR_S)
    k_eff = k + tile_overhead_k(precision)
    return gemm_seconds(per_expert, k_eff, n, nbytes, gpu, precision, experts, kernels, rates)
