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

Which kernel: `Op.kernel` ("fa2", "fa1", "fa3", "cudnn" or "triton", from the framework profile or the
`attention_kernel` key); a GPU without rows for "cudnn" falls back to "fa3", then to "fa2" (Ampere runs
"fa2"); "fa1" (FlashAttention v1) and "triton" (FlashAttention in Triton) have A100 rows of their own and
fall back to "fa2". The first kernel of that chain with rows on the GPU is timed, by length where it has
by-length rows, else at its fraction of peak. GPUs without any row, or with a `gpus:` gemm_eff override,
keep the previous rule (FLOPs at the GEMM-like efficiency gemm_eff).

cuDNN's fused attention (what Transformer Engine runs on Hopper) has published rates by sequence length,
head dimension and mask (tracegen/data/attention_by_length.csv: FlashAttention-3 paper, Figures 5 and 6,
cuDNN 9.1.1): there its time is the sources' own FLOP count, 4 s^2 d per (sequence, head), halved under a
causal mask, x 2.5 backward, over the rate at that length (interpolated in log2 s, held beyond the ends),
at the recorded head dimension nearest in log2. A call of q queries against kv != q keys (context
parallelism's, tracegen.context_parallel) is cut into the benchmarks' kinds (`call_parts`): its causal
q x q square at the causal rate at q, the scores it computes in full at the unmasked rate at the length
of the kernel's inner loop (keys forward, queries backward). A short causal kernel runs well below the long non-causal
rate (cuDNN forward, head dim 128: 484 TFLOP/s causal at 2k, 617 without the mask). The sources give no
causal backward: it is the non-causal backward times the forward's causal / non-causal ratio at the same
length and head dimension (an assumption: the mask costs the backward what it costs the forward).

On the B200 (and the GB200, calibrated as it) cuDNN's and FlashAttention-2's causal rates are measured per pass
by length at head dimension 128 (NVIDIA/cudnn-frontend's SDPA training benchmark, cuDNN 9.13, the version
NeMo 25.11 ships): the causal backward has rows of its own; no unmasked rows are published, so a call with an
unmasked part (context parallelism) keeps the previous rule there.

On the A100 the by-length rows are forward + backward rates (pass "fwd_bwd": FlashAttention-2 paper,
Figure 4, FlashAttention-2, FlashAttention v1 and FlashAttention in Triton, with and without the causal
mask, head dimension 64 and 128; FLOPs 3.5 x the forward's). A pass's rate there is the combined rate at
the condition split as the kernel's fraction-of-peak rows split it: rate(pass) = combined(s) x
fraction(pass) / combined(fractions), combined(f) = 3.5 / (1 / f_fwd + 2.5 / f_bwd), so a forward and a
backward together take the time the figure's bar says.

Attention-probability dropout (p > 0) runs inside the fused kernel (a Philox random number per score
element forward, regenerated backward) and costs time the rates above, all measured without dropout, do
not include. An `attn_core` op with `Op.dropout` is timed at its rate x the published time with dropout
over the time without, from tracegen/data/attention_dropout.csv, for the kernel that is timed, by pass
(a forward + backward row applies to each pass), linear in log2 s between recorded lengths and held beyond,
at the recorded head dimension nearest in log2. A kernel without rows on its GPU runs as without dropout
(no measurement: docs/compute.md, "Attention dropout").
"""

from __future__ import annotations

import heapq
import math
import os
from dataclasses import dataclass
from functools import lru_cache

from xsim.tracegen.calibration_csv import read_points
from xsim.tracegen.catalog import GpuSpec, tensor_peak
from xsim.tracegen.errors import CatalogError
from xsim.tracegen.gemm import BURST_PLATEAUS

DATA_FILE = os.path.join(os.path.dirname(__file__), "data", "attention_calibration.csv")
BY_LENGTH_FILE = os.path.join(os.path.dirname(__file__), "data", "attention_by_length.csv")
DROPOUT_FILE = os.path.join(os.path.dirname(__file__), "data", "attention_dropout.csv")
# Square tile of query rows x key columns: FlashAttention-2 section 3.3 "we choose blocks of size
# {64,128} x {64,128}"; FlashAttention-3 uses 128-row tiles for head dimension 128 (section 3.1). 128 is
# the tile of the head dimensions these models use (64-256).
BLOCK = 128
# Backward FLOPs over forward FLOPs as the kernels execute them (and as the sources count them): 2 matmuls
# forward, 5 backward (FlashAttention-2 section 4.1).
BWD_OVER_FWD = 2.5
# GPUs whose rows are another's: the A100 40GB has the A100 80GB's GA100 SMs and clocks (A100 datasheet:
# the same 312 TFLOPS dense BF16); the H200 has the H100 SXM5's 132 SMs and clocks (H200 datasheet: the
# same 989 TFLOPS dense BF16), attention being compute-bound at these lengths. The GB200 has the B200's
# 148-SM Blackwell die (catalog `calibrated_as`); its rows are the B200's, scaled by the ratio of the two GPUs'
# measured matmul ceilings where each has its own (`sibling_ratio`: the GB200's MAMF point over the B200's,
# 1822.0 / 1745.0 = 1.044 in BF16, both tensor-core bound on the same die at different power and clocks),
# not by the datasheet peaks (2500 / 2250 = 1.111, which the measured GEMMs do not reach). cudnn-frontend's
# own GB200 table (sdpa_bf16_benchmark_results_NVIDIA_GB200.csv at d48a60e) ran cuDNN 9.17 where the B200's
# and NeMo 25.11's ran 9.13, so the two tables differ in software as well as hardware and give no ratio.
CALIBRATED_AS = {"A100-40GB": "A100-80GB", "H200": "H100", "GB200": "B200"}
KERNELS = ("fa2", "fa1", "fa3", "cudnn", "triton")
# The kernels whose rows a kernel is timed at, in order: its own, then those it falls back to on a GPU
# without them. "triton" is FlashAttention in Triton (HazyResearch flash_attn_triton.py, what llm-foundry's
# `attn_impl: triton` runs) and "fa1" FlashAttention v1 (InternLM's flash-attention v1.0.5): both are
# published against FlashAttention-2 on the A100 only, so elsewhere they are timed at FA2's rows
# (assumption); FA1 has no per-pass rate, so its A100 split is FA2's (assumption).
FALLBACK = {
    "fa2": ("fa2",),
    "fa1": ("fa1", "fa2"),
    "fa3": ("fa3", "fa2"),
    "cudnn": ("cudnn", "fa3", "fa2"),
    "triton": ("triton", "fa2"),
}
# Dense BF16 (= FP16) peak of the GPU the by-length rates were measured on (catalog: H100 SXM5; A100 80GB
# SXM4, 312 TFLOPS, the peak the FlashAttention-2 paper's fractions are of; B200, 2,250 TFLOPS, HGX B200
# datasheet): a rate is kept as a fraction of it, so a `gpus:` peak_flops override scales it as it scales the
# GEMMs.
SOURCE_PEAK = {"H100": 989.4e12, "A100-80GB": 312e12, "B200": 2250e12}


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
    return read_points(path, AttentionPoint, {"phase": "pass"})


@lru_cache(maxsize=1)
def _table() -> dict[tuple[str, str, str], float]:
    return {(p.gpu, p.kernel, p.phase): p.peak_fraction for p in attention_points()}


def attention_fraction(gpu_name: str, kernel: str, phase: str) -> float | None:
    """Published fraction of the dense BF16 peak of `kernel` on `gpu_name` in `phase` (fwd | bwd), or
    None where no benchmark is recorded; "cudnn" and "fa3" fall back as FALLBACK says."""
    if kernel not in KERNELS:
        raise CatalogError(f"attention kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    if phase not in ("fwd", "bwd"):
        raise CatalogError(f"attention pass must be fwd or bwd, got {phase!r}")
    name = CALIBRATED_AS.get(gpu_name, gpu_name)
    table = _table()
    for k in FALLBACK[kernel]:
        if (name, k, phase) in table:
            return table[(name, k, phase)]
    return None


def executed_flops(
    batch: int, heads: int, s: int, d: int, phase: str, causal: bool = True, kv: int = 0
) -> int:
    """FLOPs a tiled flash-attention kernel executes for `batch` sequences of `heads` heads, `s` queries
    against `kv` keys (`s` when 0): forward 4 * BLOCK^2 * d per score tile over the nq x nk tiles, causal
    (bottom-right aligned, kv >= s: query block i sees key blocks up to nk - nq + i) nq (nk - nq) +
    nq (nq + 1) / 2 of them; backward 2.5x that."""
    nq, nk = math.ceil(s / BLOCK), math.ceil((kv or s) / BLOCK)
    tiles = nq * (nk - nq) + nq * (nq + 1) // 2 if causal else nq * nk
    fwd = batch * heads * tiles * 4 * BLOCK * BLOCK * d
    return fwd if phase == "fwd" else int(BWD_OVER_FWD * fwd)


@dataclass(frozen=True)
class LengthPoint:
    """One published attention-kernel rate at a sequence length: TFLOP/s as its source counts FLOPs."""

    gpu: str
    kernel: str
    phase: str
    causal: bool
    head_dim: int
    seq_len: int
    tflops: float
    source: str


def length_points(path: str = BY_LENGTH_FILE) -> list[LengthPoint]:
    """The by-length attention calibration data set (tracegen/data/attention_by_length.csv)."""
    return read_points(path, LengthPoint, {"phase": "pass"})


@lru_cache(maxsize=1)
def _curves() -> dict[tuple[str, str, str, bool, int], tuple[tuple[int, float], ...]]:
    curves: dict[tuple[str, str, str, bool, int], list[tuple[int, float]]] = {}
    for p in length_points():
        curves.setdefault((p.gpu, p.kernel, p.phase, p.causal, p.head_dim), []).append((p.seq_len, p.tflops))
    return {k: tuple(sorted(v)) for k, v in curves.items()}


def _along(curve: tuple[tuple[int, float], ...], s: int) -> float:
    """The curve's rate at length `s`: linear in log2(s) between recorded lengths, held beyond the ends."""
    if s <= curve[0][0]:
        return curve[0][1]
    for (s0, r0), (s1, r1) in zip(curve, curve[1:], strict=False):
        if s <= s1:
            w = (math.log2(s) - math.log2(s0)) / (math.log2(s1) - math.log2(s0))
            return r0 + w * (r1 - r0)
    return curve[-1][1]


def _nearest_dim(name: str, kernel: str, phase: str, d: int) -> int | None:
    """The recorded head dimension of (`name`, `kernel`, `phase`) nearest `d` in log2 (the smaller on a tie)."""
    dims = sorted({k[4] for k in _curves() if k[:3] == (name, kernel, phase)})
    if not dims:
        return None
    return min(dims, key=lambda x: (abs(math.log2(x) - math.log2(max(d, 1))), x))


def combined_fraction(fwd: float, bwd: float) -> float:
    """The forward + backward rate of a kernel running `fwd` forward and `bwd` backward, the backward
    executing 2.5x the forward's FLOPs: 3.5 / (1 / fwd + 2.5 / bwd), in the units of its arguments."""
    return (1 + BWD_OVER_FWD) / (1 / fwd + BWD_OVER_FWD / bwd)


def length_rate(gpu_name: str, kernel: str, phase: str, causal: bool, d: int, s: int) -> float | None:
    """Published TFLOP/s (the sources' FLOP count) of `kernel` on `gpu_name` at sequence length `s` and the
    recorded head dimension nearest `d`, or None without rows; a causal backward without rows of its own is
    the non-causal backward x the forward's causal / non-causal ratio at the same length; where only
    forward + backward rates are recorded, the pass's share of the combined rate by the kernel's fractions."""
    name = CALIBRATED_AS.get(gpu_name, gpu_name)
    curves = _curves()
    hd = _nearest_dim(name, kernel, phase, d)
    if hd is None:
        return _split_rate(gpu_name, kernel, phase, causal, d, s)
    if (name, kernel, phase, causal, hd) in curves:
        return _along(curves[(name, kernel, phase, causal, hd)], s)
    fwd = [curves.get((name, kernel, "fwd", c, hd)) for c in (True, False)]
    if phase != "bwd" or not causal or None in fwd or (name, kernel, phase, False, hd) not in curves:
        return None
    mask = _along(fwd[0], s) / _along(fwd[1], s)  # type: ignore[arg-type]
    return _along(curves[(name, kernel, phase, False, hd)], s) * mask


def _split_rate(gpu_name: str, kernel: str, phase: str, causal: bool, d: int, s: int) -> float | None:
    """`phase`'s TFLOP/s from a forward + backward rate: combined(s) x fraction(phase) / combined(fractions)
    (the published combined rate kept, its split the kernel's published forward / backward fractions)."""
    name = CALIBRATED_AS.get(gpu_name, gpu_name)
    hd = _nearest_dim(name, kernel, "fwd_bwd", d)
    curve = _curves().get((name, kernel, "fwd_bwd", causal, hd or 0))
    fwd, bwd = attention_fraction(gpu_name, kernel, "fwd"), attention_fraction(gpu_name, kernel, "bwd")
    if curve is None or fwd is None or bwd is None:
        return None
    return _along(curve, s) * (fwd if phase == "fwd" else bwd) / combined_fraction(fwd, bwd)


def source_flops(batch: int, heads: int, s: int, d: int, phase: str, causal: bool = True) -> float:
    """FLOPs as the attention benchmarks count them: 4 s^2 d per (sequence, head), halved under a causal
    mask, x 2.5 backward (FlashAttention-2/-3 section 4.1)."""
    fwd = 4.0 * batch * heads * s * s * d / (2 if causal else 1)
    return fwd if phase == "fwd" else BWD_OVER_FWD * fwd


@dataclass(frozen=True)
class DropoutPoint:
    """One published attention-kernel time with and without dropout at a sequence length (ms each)."""

    gpu: str
    kernel: str
    phase: str  # "fwd" | "bwd" | "fwd_bwd" (forward + backward together: applies to each pass)
    head_dim: int
    seq_len: int
    ms_dropout: float
    ms_plain: float
    source: str


def dropout_points(path: str = DROPOUT_FILE) -> list[DropoutPoint]:
    """The attention-dropout data set (tracegen/data/attention_dropout.csv)."""
    return read_points(path, DropoutPoint, {"phase": "pass"})


@lru_cache(maxsize=1)
def _dropout_curves() -> dict[tuple[str, str, str, int], tuple[tuple[int, float], ...]]:
    curves: dict[tuple[str, str, str, int], list[tuple[int, float]]] = {}
    for p in dropout_points():
        key = (p.gpu, p.kernel, p.phase, p.head_dim)
        curves.setdefault(key, []).append((p.seq_len, p.ms_dropout / p.ms_plain))
    return {k: tuple(sorted(v)) for k, v in curves.items()}


def dropout_ratio(gpu_name: str, kernel: str, phase: str, s: int, d: int) -> float:
    """Time with attention dropout over time without, of `kernel` on `gpu_name` in `phase` (fwd | bwd) at
    length `s` and the recorded head dimension nearest `d` in log2: the pass's own rows, else the kernel's
    forward + backward rows; 1.0 where none is published (no cost charged without a measurement)."""
    name = CALIBRATED_AS.get(gpu_name, gpu_name)
    curves = _dropout_curves()
    for ph in (phase, "fwd_bwd"):
        dims = sorted(k[3] for k in curves if k[:3] == (name, kernel, ph))
        if dims:
            hd = min(dims, key=lambda x: (abs(math.log2(x) - math.log2(max(d, 1))), x))
            return _along(curves[(name, kernel, ph, hd)], s)
    return 1.0


def sibling_ratio(gpu_name: str, source: str) -> float:
    """What a GPU timed at `source`'s attention rows runs at beyond the datasheet scaling: its measured BF16
    matmul ceiling over the source's, each a fraction of its own peak (gemm.BURST_PLATEAUS), where both are
    measured (the GB200 against the B200); 1 otherwise (the datasheet peaks' ratio alone)."""
    own, src = BURST_PLATEAUS.get((gpu_name, "bf16")), BURST_PLATEAUS.get((source, "bf16"))
    return own / src if gpu_name != source and own and src else 1.0


def flash_compute_seconds(
    shape: tuple[int, ...],
    phase: str,
    gpu: GpuSpec,
    kernel: str,
    clock_ratio: float,
    dropout: bool = False,
    kv: int = 0,
    causal: bool = True,
) -> float | None:
    """Compute time of one fused attention call of shape (batch, heads, kv_heads, s, d) on `gpu`: `s`
    queries against `kv` keys (`s` when 0), causal (bottom-right aligned: the last query sees every key) or
    not; None where the calibration has no row for it (the caller keeps its previous rule). With `dropout`
    (p > 0) the timed kernel's published dropout / no-dropout time ratio applies (`dropout_ratio`).

    By-length rates (`call_parts`): the call's causal s x s square at the causal rate at length s, the rest
    (s x (kv - s) causal, s x kv otherwise) at the non-causal rate at the length of the kernel's inner loop.
    """
    if "gemm_eff" in gpu.overridden:
        return None
    kernel = kernel or "fa2"
    if kernel not in KERNELS:
        raise CatalogError(f"attention kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    batch, heads, _kv, s, d = shape
    kv = kv or s
    name = CALIBRATED_AS.get(gpu.name, gpu.name)
    sibling = sibling_ratio(gpu.name, name)
    for k in FALLBACK[kernel]:
        parts = call_parts(batch, heads, s, kv, d, phase, causal)
        rates = [length_rate(gpu.name, k, phase, c, d, n) for c, n, _ in parts]
        if name in SOURCE_PEAK and all(r is not None for r in rates):
            total = 0.0
            for (_c, n, flops), tflops in zip(parts, rates, strict=True):
                peak = float(tflops or 0.0) * 1e12 / SOURCE_PEAK[name]
                rate = peak * tensor_peak(gpu, "bf16") * sibling * clock_ratio
                slow = dropout_ratio(gpu.name, k, phase, n, d) if dropout else 1.0
                total += flops / rate * slow
            return total
        frac = _table().get((name, k, phase))
        if frac is not None:
            rate = frac * tensor_peak(gpu, "bf16") * sibling * clock_ratio
            slow = dropout_ratio(gpu.name, k, phase, kv, d) if dropout else 1.0
            return executed_flops(batch, heads, s, d, phase, causal, kv) / rate * slow
    return None


def call_parts(
    batch: int, heads: int, s: int, kv: int, d: int, phase: str, causal: bool
) -> list[tuple[bool, int, float]]:
    """A fused attention call of `s` queries against `kv` keys as parts of the benchmarks' kinds: (causal,
    the length whose rate times it, its FLOPs as the sources count them).

    The published rates are of square s x s calls at a fixed 16k tokens per batch (FlashAttention-3 appendix
    C.1; FlashAttention-2 section 4.1), so their grid of CTAs is alike at every length and what the length
    changes is each CTA's inner loop: over the keys forward (a CTA per query block), over the queries
    backward (a CTA per key block; FlashAttention-2 section 3.2, Algorithms 1 and 2). A causal call
    (bottom-right aligned, kv >= s) is its s x s causal square, timed as the causal benchmark of length s,
    plus the s x (kv - s) keys every query sees in full; those, and a non-causal call, run at the non-causal
    rate at the loop length (kv forward, s backward). A square causal call is its one causal part, as before.
    """
    loop = kv if phase == "fwd" else s
    parts: list[tuple[bool, int, float]] = []
    if causal:
        parts.append((True, s, source_flops(batch, heads, s, d, phase, True)))
    full = kv - s if causal else kv
    if full > 0:
        per = 4.0 * batch * heads * s * full * d
        parts.append((False, loop, per if phase == "fwd" else BWD_OVER_FWD * per))
    return parts


# FlashAttention-2's launch for head dimension 128 on the A100 (Dao-AILab/flash-attention v2.4.2, what
# Transformer Engine 1.3 calls on Ampere through flash_attn_varlen_func; csrc/flash_attn/src/
# flash_fwd_launch_template.h run_mha_fwd_hdim128, flash_bwd_launch_template.h run_mha_bwd_hdim128 and
# run_flash_bwd_seqk_parallel): the forward is one CTA per (128-row query block, sequence, head),
# Flash_fwd_kernel_traits<128, 128, 64, 4>, each CTA sweeping 64-column key blocks (a causal query block i
# stops at the diagonal: 2(i + 1) of them, flash_fwd_kernel.h n_block_max); the backward is one CTA per
# (128-column key block, sequence, head), Flash_bwd_kernel_traits<128, 64, 128, 8> on GPUs with >= 144 KB
# of shared memory per block, each sweeping 64-row query blocks from the diagonal down (key block j: s/64 -
# 2j of them, flash_bwd_kernel.h m_block_min). Block index x is the query (forward) or key (backward)
# block: blockIdx.x = m_block / n_block.
FA2_FWD_TILE = (128, 64)  # query rows x key columns a forward CTA owns / steps by
FA2_BWD_TILE = (64, 128)  # query rows a backward CTA steps by x key columns it owns
# CTAs resident per SM on the A100 (CUDA C++ Programming Guide, compute capability 8.0: 164 KB of shared
# memory per SM, 1 KB reserved per block): the forward's Q tile and K/V tiles take 128 x 128 x 2 + 2 x 64 x
# 128 x 2 = 64 KB, two per SM; the backward's >= 144 KB, one.
FA2_CTAS_PER_SM = {"fwd": 2, "bwd": 1}
# The grid the published FlashAttention-2 rates were measured on (FlashAttention-2, section 4.1: batch size
# so that the total number of tokens is 16k; hidden 2048, head dimension 128, i.e. 16 heads).
FA2_BENCH_TOKENS, FA2_BENCH_HEADS = 16384, 16
FA2_ON_AMPERE = ("", "fa2", "fa3", "cudnn")


def _fa2_cta_tiles(s: int, phase: str, causal: bool) -> list[int]:
    """Tiles each CTA of one (sequence, head) sweeps, in block-index order (the FA2 launch above)."""
    if phase == "fwd":
        rows, cols = FA2_FWD_TILE
        nb, per = -(-s // rows), -(-s // cols)
        return [min(per, -(-(i + 1) * rows // cols)) if causal else per for i in range(nb)]
    rows, cols = FA2_BWD_TILE
    nb, per = -(-s // cols), -(-s // rows)
    return [per - (j * cols) // rows if causal else per for j in range(nb)]


@lru_cache(maxsize=4096)
def _tail_ratio(grids: int, s: int, phase: str, causal: bool, slots: int) -> float:
    """Makespan of `grids` (sequence, head) grids of CTAs, dispatched in block order onto `slots` CTA slots
    (each taking the next CTA when it frees: list scheduling), over the perfectly balanced time."""
    tiles = _fa2_cta_tiles(s, phase, causal)
    heap = [0] * slots
    for _ in range(grids):
        for t in tiles:
            heapq.heapreplace(heap, heap[0] + t)
    return max(heap) * slots / (grids * sum(tiles))


def fa2_grid_factor(
    shape: tuple[int, ...], phase: str, gpu: GpuSpec, kernel: str, causal: bool = True
) -> float:
    """How much longer FlashAttention-2 runs at this op's grid than at the grid its published rates were
    measured on: the tail of the last wave, which grows as tensor parallelism leaves fewer heads per rank.

    For a (batch, heads, kv_heads, s, d) op on an A100 with head dimension 97-128 (the FA2 launch above):
    the list-scheduling makespan over the balanced time at this grid, over the same ratio at the benchmark's
    grid (16384 / s sequences of 16 heads, at least one) with the same mask, so the published rate keeps its
    own tail. Assumptions: CTAs start in block-index order; each of an SM's FA2_CTAS_PER_SM slots runs at its
    share of the SM whether or not the other is busy. 1.0 for other kernels, GPUs and head dimensions (their
    launches are not read here).
    """
    batch, heads, _kv, s, d = shape
    # The A100 runs FlashAttention-2 for these kernel names (no fa3/cuDNN rows on Ampere: FALLBACK).
    if (
        kernel not in FA2_ON_AMPERE
        or CALIBRATED_AS.get(gpu.name, gpu.name) != "A100-80GB"
        or not 96 < d <= 128
    ):
        return 1.0
    if gpu.sms <= 0 or phase not in FA2_CTAS_PER_SM:
        return 1.0
    slots = gpu.sms * FA2_CTAS_PER_SM[phase]
    bench = max(1, FA2_BENCH_TOKENS // s) * FA2_BENCH_HEADS
    return _tail_ratio(batch * heads, s, phase, causal, slots) / _tail_ratio(bench, s, phase, causal, slots)
