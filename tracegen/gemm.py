"""The calibrated compute model: GEMM efficiency from the shape (tile and wave quantization), per GPU and dtype.

Physical model (NVIDIA "Matrix Multiplication Background User's Guide", sections on tile and wave
quantization): cuBLAS splits C = A x B ([M,K] x [K,N], `batch` times) into CTA tiles of mt x nt outputs;
each tile is one thread block on one SM; the tiles run in waves of (SM count) blocks, and a partial last
tile or a partial last wave costs as much as a full one. The time of a GEMM is therefore

    waves x (time of one tile),   waves = ceil(batch * ceil(M/mt) * ceil(N/nt) / SMs),
    tile time = 2 * mt * nt * K / (per-SM peak * plateau * reuse(mt, nt))

taking the candidate tile (the guide's cuBLAS sizes) that minimizes it, as cuBLAS' heuristics aim to.
`plateau` is the fraction of the dense peak that a large, perfectly quantized GEMM reaches, taken from
public microbenchmarks (BURST_PLATEAUS), by default scaled to the sustained, power-limited clock
(sustained_ratio; `gemm_rates: burst` keeps the burst rate). Where the plateau's calibration K is recorded
(H100 FP8 and BF16) every tile also pays a fixed cost of K0 columns of K (tile_cost). `reuse` charges smaller tiles for
their lower operand reuse: a tile loads (mt + nt) * k operands per 2 * mt * nt * k FLOPs, so its FLOPs per loaded byte scale with
mt * nt / (mt + nt); the largest tiles (256 x 128; on the A100 128 x 128, PLATEAU_TILE) are taken as just
compute-bound at the plateau and a smaller tile as bound by the same operand bandwidth (an assumption of
this model, docs/compute.md; the A100's is checked against per-shape measurements, gemm_shapes_a100.csv).
The GEMM also cannot beat reading and writing its operands at the achieved memory bandwidth of a published
copy benchmark (MEASURED_MEM_EFF), nor one kernel launch per kernel (LAUNCH_FLOOR_S). On the A100 a forward
(X x W^T) GEMM with a reduction K <= 4096 runs at 0.905 of that rate, a cuBLAS kernel step measured in
per-shape data (SHORT_K_FORWARD; dgrad and wgrad keep the rate).

Calibration data: tracegen/data/gemm_calibration.csv (public GEMM microbenchmarks only). Validation data
(end-to-end Megatron-LM / MLPerf / NeMo runs and per-layer times) is kept apart: nothing here is fitted to
it (docs/validation.md, helper `valid`).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import numpy as np
from xsim.tracegen.calibration_csv import read_points
from xsim.tracegen.catalog import GpuSpec, tensor_peak
from xsim.tracegen.errors import CatalogError

# CTA tile sizes (mt, nt) of cuBLAS tensor-core GEMMs listed by NVIDIA's Matrix Multiplication Background
# User's Guide ("cuBLAS ... 256x128, 128x256, 128x128, 64x128, 128x64, 64x64").
TILES: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
# The smallest tile that still runs at the plateau, per GPU: its operand reuse mt*nt/(mt+nt) is the bound
# `reuse` divides by (default: only the largest tiles, 256x128). A100: a 128x128-output tile runs at the
# plateau. Anthony et al. 2024 (arXiv:2401.14489) result file gemm_data/mm/ksweep_high/a100.out
# (github.com/EleutherAI/cookbook commit 27dff48; tracegen/data/gemm_shapes_a100.csv, series nsweep_m2304):
# M 2304, K 4096, N 1536..6144 in steps of 64: the throughput staircase steps every 768 columns (108 tiles
# of 128x128 per step on 108 SMs, not every 1536 as 256x128 tiles would), and at N 2304 (3 full waves of
# 128x128 tiles, 1.5 waves of 256x128 ones) it measures 229.0 TFLOP/s, 0.974 of N 3072's 235.0 (full waves
# of both), where 128x128 at a reuse of 0.75 priced it at 0.75 of N 3072's rate (either tile). Over the
# whole data set the spread of log(model / measured) about each series' median falls from 0.0236 to 0.0181
# (scripts/gemm_shape_check.py --tile-scan; N sweep 0.0856 -> 0.0310, the qkv linears 0.0185 -> 0.0151).
# 128x64 and 64x64 then keep 2/3 and 1/2 of the plateau (no point of the data set isolates them).
PLATEAU_TILE: dict[str, tuple[int, int]] = {"A100-40GB": (128, 128), "A100-80GB": (128, 128)}

# Per-kernel launch floor: a short kernel launched back to back on one stream costs 3.8 us per kernel
# (NVIDIA Technical Blog, A. Gray, "Getting Started with CUDA Graphs", 2019: a 2.9 us kernel, launch-bound at
# 3.8 us each without CUDA graphs), so no kernel of an eagerly launched training step takes less.
LAUNCH_FLOOR_S = 3.8e-6

# Achieved fraction of the dense tensor peak on a large, well-quantized GEMM in a short burst ("Maximum
# Achievable Matmul FLOPS", measured with mamf-finder.py by S. Bekman, github.com/stas00/ml-engineering):
#   compute/accelerator/README.md MAMF table (v1, August 2024): A100 SXM BF16 267.9 of 312 TFLOPS at
#   "6912x16384x2048" and H100 SXM BF16 792.1 at "6144x17920x2816" (CUDA 12.1). mamf-finder v1 multiplied
#   A[M,N] x B[N,K] and printed MxNxK with N the reduction (compute/accelerator/benchmarks/mamf-finder.py
#   at commit 249778b: torch.randn(m, n), torch.randn(n, k), torch.mm(A, B)), so the shapes are, as
#   M x K (reduction) x N: A100 6912 x 16384 x 2048, H100 6144 x 17920 x 2816. Their outputs are full
#   waves: A100 27 x 16 = 432 tiles of 256x128 = 4 waves on 108 SMs; H100 24 x 22 = 528 = 4 waves on 132,
#   so each point is the plateau itself.
#   compute/accelerator/nvidia "When Is It Worth Upgrading GPUs?": H100/H200 SXM BF16 794.5 of 989,
#   B200 SXM BF16 1745.0 of 2250, H200 SXM FP8 1453.4 of 1979, B200 SXM FP8 3432.5 of 4500 (best shape of
#   the sweep, so taken as fully quantized).
#   compute/accelerator/README.md MAMF FP8 table (commit 744d01e, 2026-08): H100 SXM FP8 (float8_e4m3fn)
#   1402.6 of 1979 at 1024x9216x14336, torch 2.7.0+cu126 (best shape of the sweep: fully quantized).
#   The same commit's BF16 and FP8 tables name the Blackwell points' shapes (MxNxK, K the reduction): B200 SXM
#   BF16 1745.0 at 1792x16128x3072 and FP8 3432.5 at 15360x4096x3072 (torch 2.7.1+cu128; 6 and 13 waves of
#   256x128 tiles on 148 SMs, 5.96 and 12.97 of work), and the GB200's own: BF16 1822.0 of 2500 at
#   4096x9728x2048, FP8 3615.6 of 5000 at 19456x5120x1536 (torch 2.10.0.dev20250916+cu130). The GB200 (the
#   B200's 148-SM die) has its own points, so it takes them instead of the B200's fraction x its datasheet
#   peak: 1822.0 / 1745.0 = 1.044 and 3615.6 / 3432.5 = 1.053 (two torch/CUDA stacks), against the datasheet
#   ratio 2500 / 2250 = 1.111 (the README's device-reported maximum SM clocks: 2062 against 1965 MHz, 1.049).
#   The GB200's BF16 shape is 9 waves of 256x128 tiles for 8.2 of work in this model; its point is taken as
#   the plateau like the other best shapes (a Blackwell cuBLAS kernel's 2-SM tiles and persistent schedule
#   are not modelled).
# (Before round kdep the H100 point was read with N 17920 as an output width, 26 waves for 25.45 of work,
# and divided by 0.979; the A100's as K 2048.) FP16 runs at the BF16 rate on these tensor cores.
# These are burst rates: 50 warm-up and 100 timed iterations of one shape (a few seconds), an idle GPU at
# its boost clock. `gemm_rates: burst` selects them.
BURST_PLATEAUS: dict[tuple[str, str], float] = {
    ("A100-40GB", "bf16"): 267.9 / 312,
    ("A100-80GB", "bf16"): 267.9 / 312,
    ("H100", "bf16"): 792.1 / 989.4,
    ("H200", "bf16"): 794.5 / 989.4,
    ("B200", "bf16"): 1745.0 / 2250,
    ("H100", "fp8"): 1402.6 / 1979,
    ("H200", "fp8"): 1453.4 / 1979,
    ("B200", "fp8"): 3432.5 / 4500,
    ("GB200", "bf16"): 1822.0 / 2500,
    ("GB200", "fp8"): 3615.6 / 5000,
}
PLATEAUS = BURST_PLATEAUS  # the name tests and callers used before issue 22

# Sustained (power-saturated) rate over the burst rate. A100: the only published sustained figure is a clock
# ratio: NVIDIA computes the HPL Rpeak of its A100 systems at 1,305 MHz, "the clock that can be sustained at a
# GPU's power limit while running HPL", against the 1,410 MHz boost clock the 312 TFLOP/s peak (and a short
# MAMF burst) runs at (G. Lockwood, "Peak FLOPS", glennklockwood.com/garden/peak-FLOPS). Tensor-core
# throughput scales with the SM clock, so a long, power-saturated GEMM stream runs at 1305 / 1410 = 0.926 of
# the burst. Condition: the GPU at its default power limit (A100 SXM 400 W), all SMs busy with dense
# tensor-core work, thermally settled. GPUs without a measured ratio of their own (SUSTAINED_RATIOS) keep it.
SUSTAINED_CLOCK_RATIO = 1305 / 1410
# Hopper and Blackwell: the same benchmark measured both ways on one GPU, one run, siblings idle ("Maximum
# Sustainable Matmul FLOPS", MSMF: shapes that pin the board at its TDP after a thermal soak, against MAMF,
# the boost-clock burst): github.com/stas00/ml-engineering commit 082816f (branch fast-mamf, 2026-08-10),
# compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table", torch 2.13.0+cu130:
#   H200 SXM BF16 MAMF 841.9 (~176 W @ 1980 MHz), MSMF 708.5 (8192x8448x20480, ~693 W @ 1465 MHz);
#   H200 SXM FP8 MAMF 1491.9, MSMF 1288.7 (8448x8192x16384, ~693 W @ 1374 MHz);
#   B200 SXM BF16 MAMF 1770.9, MSMF 1456.3 (~994 W @ 1339 MHz); FP8 MAMF 3435.2, MSMF 2795.7 (~990 W).
# The H100 SXM has the H200's GH100 die, 132 SMs, clocks and 700 W TDP (H100 and H200 datasheets), so its
# burst plateau (measured with the CUDA 12.1-12.6 stacks of 2024 runs) is scaled by the H200's measured
# saturated/burst ratio rather than replaced by the H200's MSMF (a torch 2.13 stack, ~6% faster at burst
# too: 841.9 against 794.5 for the same GPU under torch 2.7). FP16 uses the BF16 ratio.
SUSTAINED_RATIOS: dict[tuple[str, str], float] = {
    ("H100", "bf16"): 708.5 / 841.9,
    ("H100", "fp8"): 1288.7 / 1491.9,
    ("H200", "bf16"): 708.5 / 841.9,
    ("H200", "fp8"): 1288.7 / 1491.9,
    ("B200", "bf16"): 1456.3 / 1770.9,
    ("B200", "fp8"): 2795.7 / 3435.2,
}
GEMM_RATES = ("sustained", "burst")
# A board of busy GPUs (`board_load: full`). The MSMF above is one GPU with its siblings idle. The same
# protocol run on all 8 GPUs of a board at once (github.com/stas00/ml-engineering, branch fast-mamf,
# compute/accelerator/benchmarks/README.md, "What we measured: alone vs all-8 concurrent": five `--search
# auto` rounds on each GPU, n = 40, BF16) gave a lower mean and a spread across the GPUs:
#   H200 SXM (700 W): GPU0 alone 702.9 TFLOP/s, all 8 busy: mean 698.6, range 4.5% (1,405-1,527 MHz);
#   B200 SXM (1000 W): GPU0 alone 1,455.7, all 8 busy: mean 1,426.4, range 10.4% (1,228-1,410 MHz).
# A synchronous step (every TP, PP and DP collective) waits for its slowest GPU, so the whole run goes at
# the rate of the slowest GPU of its boards: mean x (1 - range / 2), the range taken as symmetric about the
# mean (the source prints the range, not the minimum). MAMF (the burst) did not move under sibling load
# (the same table: 828.0 -> 823.9, 1,732.6 -> 1,751.2), so `gemm_rates: burst` is left alone. FP8 takes
# the BF16 figures (the source measured BF16 only). GPUs without a board measurement (the A100, V100, ...)
# take only the spread, and the mildest one measured (the H200's): their sustained clock (SUSTAINED_CLOCK_RATIO,
# NVIDIA's HPL clock) is already that of whole systems with every GPU busy, so the mean's drop is in it, but
# not the slowest GPU. That power management spreads equal GPUs under load on those generations too is
# measured (Sinha et al., "Not All GPUs Are Created Equal", SC22: 8% average performance variation across the
# V100 GPUs of the clusters studied, max 22%); its size on an A100 board is not, so this is an assumption.
BOARD_MEANS: dict[str, float] = {  # all 8 busy, mean over alone
    "H100": 698.6 / 702.9,  # the H200's GH100 board (same die, clocks and 700 W TDP)
    "H200": 698.6 / 702.9,
    "B200": 1426.4 / 1455.7,
}
BOARD_RANGES: dict[str, float] = {
    "H100": 0.045,
    "H200": 0.045,
    "B200": 0.104,
}  # (max - min) / mean, all 8 busy
BORROWED_BOARD_RANGE = 0.045
BOARD_CLOCKS: dict[str, float] = {k: BOARD_MEANS[k] * (1 - BOARD_RANGES[k] / 2) for k in BOARD_MEANS}
BORROWED_BOARD_CLOCK = 1 - BORROWED_BOARD_RANGE / 2
# A job of more GPUs than a board (`board_load: job`, the default) waits for the slowest of all its GPUs,
# and the slowest of n draws lies further below the mean as n grows. Each GPU's loaded rate is taken as an
# independent draw from a normal distribution whose spread is the board's: the expected range of 8 normal
# draws is 2 E[max of 8] = 2 x 1.4236 standard deviations (the d2 constant of quality-control tables,
# 2.847), so sigma = range / (2 x 1.4236), and the expected slowest of n GPUs sits E[max of n] sigmas below
# the mean: mean x (1 - range / 2 x E[max of n] / E[max of 8]). At n = 8 that is the board's rule above
# exactly, so a job of one board is unchanged; at 1,024 H100s the slowest GPU is 2.9% slower than a board's.
# Assumptions (docs/compute.md, "The loaded board and the slowest GPU"): GPUs on different boards spread as
# much as the 8 measured on one board, independently and normally. Sinha et al. ("Not All GPUs Are Created
# Equal", SC22) measured the spread over whole clusters (over 90% of the V100s of Summit, Vortex, Longhorn,
# Frontera): 8% average performance variation, max 22%, outliers up to 1.5x slower than the median GPU; the
# normal model's expected range over 1,000-4,000 GPUs, 2 x 3.2-3.6 sigmas = 10-11% at the H200's spread, lies
# inside those. Jobs of 2-8 GPUs keep the board's rule (the board loaded as a whole, the measured case).
BOARD_LOADS = ("job", "full", "alone")
BOARD_GPUS = 8  # GPUs of the measured board (HGX H200 / B200)

# The per-tile cost K0, one rule for every GEMM the calibrated model times (dense linears and grouped expert
# GEMMs alike): a fixed cost per output tile outside the K loop (prologue, scaling and storing the tile),
# written as K0 extra columns of K, so the rate grows with K as K / (K + K0). A plateau measured at one
# K (MAMF's best shape) already contains K0 / K_cal of overhead, so per column of K the tile runs at
# plateau x (K_cal + K0) / K_cal and a GEMM of that K keeps its measured rate. The term applies only where
# the plateau's calibration K is recorded (CALIBRATION_K); elsewhere (H200/Blackwell: "best shape of the
# sweep", K not recorded; the A100, whose per-shape data show a kernel step instead, SHORT_K_FORWARD) the
# rate stays K-independent, grouped GEMMs included.
# FP8: K0 = 718, DeepGEMM's normal (dense) FP8 GEMMs at M 4096 on H800 (H100's SMs and FP8 rate), README
# performance table as first published (deepseek-ai/DeepGEMM, Feb 2025): K 512 590 TFLOPS, K 16384 1358;
# P K / (K + K0) through the two ends gives K0 = 718 (tests/test_grouped_gemm.py re-derives it). Calibration
# K: H100 FP8, MAMF's best shape 1024x9216x14336 (M x N x K).
FP8_TILE_K0 = 718
# BF16 (FP16 alike): K0 = 240, from XLA's measured matmul table for sm_90 (tensorflow/tensorflow commit
# 372d578, third_party/xla/xla/service/gpu/model/matmul_interpolator_data.h, kDefaultMatmulPTable: HLO dots
# compiled by XLA and timed on the device; tracegen/data/gemm_shapes_h100.csv, series xla_*): six K sweeps,
# K 256..4096 at 4,096-16,384 rows and output width 2048 or 4096 (27 GEMMs). With each sweep's level left
# free, K0 = 240 gives the smallest mean |log(model / measured)| about the sweeps' medians on a grid of 8
# columns (scripts/gemm_shape_check.py --gpu H100 --k0-scan: 0.1703 without the term, 0.0428 at 240, 224-248
# within 0.0001; over K >= 1024 alone 0.0500 -> 0.0125). Before it, the model's burst time over the measured
# time fell with K: median 1.026 at K 4096, 0.989 at 2048, 0.894 at 1024, 0.705 at 256-512; with it 1.072,
# 1.090, 1.089, 1.086 (the level, ~8% slower than this 2025 stack, is MAMF's; only the shape is taken).
# Calibration K: H100 BF16, MAMF's 6144 x 17920 x 2816 (M x K x N; gemm_calibration.csv). The table names
# no GPU model (sm_90 also keys H800 and H200); it is applied to the H100, whose plateau it is measured
# against, and GPUs calibrated as it. Not modelled: the sweep of most waves (4 x 4096 x 4096, 16 waves) fits
# a smaller K0 (131 and 159 from K 1024 and 2048 against K 4096), and H100 forward-layout data at 32 waves
# (float8_experimental, 2023) show none (docs/compute.md, "Per-shape check on the H100").
BF16_TILE_K0 = 240
TILE_K0: dict[str, int] = {"fp8": FP8_TILE_K0, "bf16": BF16_TILE_K0}
# Blackwell has no recorded calibration K, so its GEMMs keep the K-independent rate (round b200cal checked):
# XLA's sm_100 table (tensorflow/tensorflow commit a305421, third_party/xla/xla/backends/gpu/cost_model/
# matmul_interpolator_data.h; tracegen/data/gemm_shapes_b200.csv) fits a BF16 K0 of 400-456 columns about its
# sweeps' levels (scripts/gemm_shape_check.py --gpu B200 --k0-scan, calibration K 3072), but MAMF's best B200
# BF16 and FP8 shapes have K 3072 (ml-engineering 744d01e: 1792x16128x3072, 15360x4096x3072), so the rule's
# rescale (3072 + 400) / 3072 would run long-K GEMMs 13% above MAMF's maximum (1972 TFLOP/s, 88% of the BF16
# peak, above every published B200/B300 BF16 measurement); and the table's FP8 column is not trusted (its
# sm_90 FP8 entries exceed the H100's FP8 peak). docs/compute.md, "Blackwell (round b200cal)".
CALIBRATION_K: dict[tuple[str, str], int] = {("H100", "fp8"): 14336, ("H100", "bf16"): 17920}

# Forward linears with a short reduction dimension, per GPU (BF16/FP16): (largest K of the rule, rate factor).
# A100: Anthony et al. 2024 (arXiv:2401.14489), github.com/EleutherAI/cookbook commit 27dff48,
# sizing/results/transformer_data/h_sweep.out (tracegen/data/gemm_shapes_a100.csv, series proj): Megatron's
# attention out-projection forward, F.linear(X[8192, K], W[4K, K]), i.e. X.W^T as training runs it, for
# K = 2048..8160 in steps of 32, one file and one timing method. Against this model (burst), the 65 shapes with
# K <= 4096 read at a median 0.830 of the model's time, the 127 with K > 4096 at 0.917: 216.6 TFLOP/s at
# 8192x2048x8192 and 235.9 at K 4096 against 244.3 at K 4128 and 249.1 at 4160. The step lies between K 4096
# and 4128 (a cuBLAS kernel choice, not a per-tile cost K/(K+K0), which would rise smoothly), so the rule is a
# step: forward GEMMs with K <= 4096 run at 0.830 / 0.917 = 0.905 of the model's rate. The qkv series at
# the same output widths (N 8192..16384, K >= 11008; 85 shapes) reads 0.940, so the condition is on K, not
# N. Only the forward layout: on the same stack NN batched GEMMs (torch.bmm, sizing/results/gemm_data/bmm/bsweep/a100.out) run
# 2048^3 x 64 at 250.5 TFLOP/s against 4096^3 x 16 at 253.5 (-1.2%), and mamf-finder v2's NN torch.mm on an
# A100 PCIe (torch 2.5.1+cu124; github.com/stas00/ml-engineering commit 3542170, compute/accelerator/README.md
# "Median measured": 1024x3072x10240 printed MxNxK with N the reduction then) has its best median at K 3072
# (257.8 TFLOP/s): dgrad (NN, K = the layer's output width) and wgrad (K = the tokens) keep the
# model's rate. Shapes below K 2048 were not measured; the step is taken to hold there (an assumption). GPUs
# calibrated as an A100 (`calibrated_as`, e.g. L40S) borrow the rule with the plateau.
SHORT_K_FORWARD: dict[str, tuple[int, float]] = {
    "A100-40GB": (4096, 0.830 / 0.917),
    "A100-80GB": (4096, 0.830 / 0.917),
}

# Achieved HBM bandwidth of a stream-style copy (the calibrated model's memory roof), fraction of the
# datasheet bandwidth (tracegen/catalog.py):
#   A100-40GB: device-to-device copy 1,355 of 1,555 GB/s (PTsolvers/gpu-workshop-JuliaCon23 issue 7).
#   A100-80GB: PyTorch device copy 1,727.5 GB/s on A800 80GB PCIe (the A100 80GB's GA100 and HBM2e,
#     datasheet 1,935 GB/s) (mli/transformers-benchmarks issue 4, "Memory Bandwidth" table, 4M elements).
#   H100: device-to-device HBM3 copy 2,903 of 3,350 GB/s on H100 80GB SXM5 (github.com/aigatech/vpbenchmarking
#     README, "Memory Bandwidth - Single Node (8x H100)").
#   B200: CUB DeviceTransform `add` (STREAM's add: two FP16 arrays read, one written) of 2^28 elements,
#     3 x 2 x 2^28 = 1,610,612,736 B in 239.643 us GPU time = 6,720.9 GB/s of the datasheet's 8,000 (nvbench
#     reports 87.60% of the 7,672 GB/s it reads from the driver's 7,680-bit bus) (NVIDIA/cccl pull 7391,
#     "Add DeviceTransform benchmarks from pytorch", table "add", [0] NVIDIA B200). The GB200 (calibrated
#     as the B200, the same 8 TB/s of HBM3e per GPU) borrows it.
# GPUs without a published measurement keep the catalog's mem_eff (0.80, a rule of thumb).
MEASURED_MEM_EFF: dict[str, float] = {
    "A100-40GB": 1355 / 1555,
    "A100-80GB": 1727.486 / 1935,
    "H100": 2903 / 3350,
    "B200": 3 * 2 * 2**28 / 239.643e-6 / 8.0e12,
}

# Memory-bound kernels with a published per-kernel measurement on a GPU (keyed by Op.kernel and the GPU's
# calibration key): the fraction of the datasheet bandwidth at which that kernel moves its bytes there,
# which replaces the copy rate above as its memory roof (a GPU calibrated as it borrows it, as the GB200 the
# B200's). "te_mxfp8_quantize" (tracegen.ops.MX_QUANTIZE_KERNEL): Transformer Engine's MXFP8 quantize writing
# both FP8 copies and their E8M0 scales (ScalingType::BIDIMENSIONAL), BF16 input 8192 x 8192 on a B200:
# 52.34 us (ROCm/TransformerEngine pull 598, "Mxfp8 grouped and multi quantize", 2026-05-27, table
# "CAST_ONLY", column "B200 (us)"; upstream TE near v2.14, where the specialized cast-only kernel runs only
# under ENABLE_CAST_ONLY (common/cast/mxfp8/specialized/quantize_mxfp8.cuh at v2.14), so the generic TMA
# kernel, util/cast_kernels.cuh cast_mxfp8_2D_kernel at v2.9, moved by TE #2248). Bytes as tracegen.ops counts
# them: read 2 x 67,108,864, write 2 x 67,108,864 + 2 x 2,097,152 scales = 272,629,760 B, 5,208.8 GB/s,
# 0.6511 of the B200's 8 TB/s (its measured stream rate is 0.8401 of it, above). Checks, not inputs: the same
# column's row-wise-only quantize, 34.84 us for 2 + 1 + 1/32 bytes an element (203,423,744 B), is 5,838.8
# GB/s; its 8192 x 28672 entries (BF16 969.56 us both ways: 0.98 TB/s) are five times slower per byte than
# its 8192 x 8192 ones, while its FP32 16384 x 8192 row-wise entry (114.4 us) scales with the 8192 x 8192 one
# (60.57 us): read as a fault of that shape's measurement, not used.
_MX_Q_ELEMS = 8192 * 8192
_MX_Q_BYTES = 2 * _MX_Q_ELEMS + 2 * _MX_Q_ELEMS + 2 * (_MX_Q_ELEMS // 32)
MEASURED_KERNEL_MEM_EFF: dict[tuple[str, str], float] = {
    ("te_mxfp8_quantize", "B200"): _MX_Q_BYTES / 52.34e-6 / 8.0e12,
}

DATA_FILE = os.path.join(os.path.dirname(__file__), "data", "gemm_calibration.csv")


@dataclass(frozen=True)
class GemmTiming:
    """How the shape model timed one GEMM: seconds, chosen tile, waves and the achieved efficiency."""

    seconds: float
    tile: tuple[int, int]
    waves: int
    efficiency: float  # achieved FLOP/s over the dense peak of the dtype


def sustained_ratio(gpu: GpuSpec, precision: str) -> float:
    """Sustained over burst tensor-core rate of `gpu` in `precision`: the measured MSMF / MAMF ratio of its
    architecture (SUSTAINED_RATIOS), else the A100's power-limited clock ratio SUSTAINED_CLOCK_RATIO, times
    the GPU's board_clock (the job's slowest GPU on loaded boards)."""
    key = (gpu.calibration_key, "bf16" if precision == "fp16" else precision)
    return SUSTAINED_RATIOS.get(key, SUSTAINED_CLOCK_RATIO) * gpu.board_clock


def expected_slowest(n: int) -> float:
    """E[max of n independent standard normal draws] (the expected slowest of n, in standard deviations)."""
    return _expected_max_normal(max(int(n), 1))


@functools.lru_cache(maxsize=64)
def _expected_max_normal(n: int) -> float:
    # E[max] = integral of x n phi(x) Phi(x)^(n-1) dx, by the trapezoid rule on [-12, 12] (step 1e-3): the
    # integrand is smooth and below 1e-30 outside for any n up to 10^8; 1/sqrt(pi) at n = 2 to 1e-12.
    if n == 1:
        return 0.0
    x = np.linspace(-12.0, 12.0, 24001)
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in x]))
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    f = x * n * pdf * cdf ** (n - 1)
    return float(np.sum((f[1:] + f[:-1]) * 0.5 * np.diff(x)))


def board_clock(gpu: GpuSpec, board_load: str = "job", gpus: int = BOARD_GPUS) -> float:
    """The slowest GPU's power-limited clock over one GPU's alone: of a job of `gpus` GPUs on fully loaded
    boards ("job"), of one fully loaded board ("full"; BOARD_CLOCKS, else the H200's spread), 1.0 "alone"."""
    if board_load not in BOARD_LOADS:
        raise CatalogError(f"board_load must be one of {', '.join(BOARD_LOADS)}, got {board_load!r}")
    if board_load == "alone":
        return 1.0
    key = gpu.calibration_key
    mean = BOARD_MEANS.get(key, 1.0)  # elsewhere the mean's drop is in the HPL clock (above)
    spread = BOARD_RANGES.get(key, BORROWED_BOARD_RANGE)
    n = max(gpus, BOARD_GPUS) if board_load == "job" else BOARD_GPUS
    return mean * (1 - spread / 2 * expected_slowest(n) / expected_slowest(BOARD_GPUS))


def plateau(gpu: GpuSpec, precision: str, rates: str = "sustained") -> float:
    """Large-GEMM efficiency of `gpu` in `precision`: a `gpus:` gemm_eff override, else the measured plateau
    (`rates` "sustained": the burst plateau x sustained_ratio; "burst": the MAMF burst plateau)."""
    if "gemm_eff" in gpu.overridden:
        return gpu.gemm_eff
    dtype = "bf16" if precision == "fp16" else precision
    # The GPU's own measured point (GB200), else its calibration architecture's; GPUs without a public GEMM
    # sweep (V100) keep the catalog's rule-of-thumb gemm_eff.
    burst = BURST_PLATEAUS.get((gpu.name, dtype), BURST_PLATEAUS.get((gpu.calibration_key, dtype)))
    if burst is None:
        return gpu.gemm_eff
    if rates not in GEMM_RATES:
        raise CatalogError(f"gemm_rates must be one of {', '.join(GEMM_RATES)}, got {rates!r}")
    return burst if rates == "burst" else burst * sustained_ratio(gpu, precision)


def achieved_bandwidth(gpu: GpuSpec, kernel: str = "") -> float:
    """Bytes/s memory-bound kernels reach: a `gpus:` mem_eff override, else `kernel`'s own measured fraction
    on the GPU (MEASURED_KERNEL_MEM_EFF), else the measured copy fraction."""
    if "mem_eff" in gpu.overridden:
        return gpu.mem_bw * gpu.mem_eff
    own = MEASURED_KERNEL_MEM_EFF.get((kernel, gpu.calibration_key)) if kernel else None
    if own is not None:
        return gpu.mem_bw * own
    return gpu.mem_bw * MEASURED_MEM_EFF.get(gpu.calibration_key, gpu.mem_eff)


def tile_cost(gpu: GpuSpec, precision: str) -> tuple[int, float]:
    """(K0, plateau scale) of any GEMM in `precision` on `gpu`: (TILE_K0 of the dtype, (K_cal + K0) / K_cal)
    where the plateau's calibration K is recorded (CALIBRATION_K; FP16 as BF16), else (0, 1.0); a `gpus:`
    gemm_eff override: (0, 1.0)."""
    dtype = "bf16" if precision == "fp16" else precision
    kc = CALIBRATION_K.get((gpu.calibration_key, dtype))
    if kc is None or "gemm_eff" in gpu.overridden:
        return 0, 1.0
    k0 = TILE_K0[dtype]
    return k0, (kc + k0) / kc


def short_k_factor(gpu: GpuSpec, precision: str, k: int, phase: str) -> float:
    """Rate factor of a GEMM of reduction `k` in `phase`: SHORT_K_FORWARD's factor for a forward (X.W^T) GEMM
    with k at or below the GPU's bound in BF16/FP16, else 1.0 (also under a `gpus:` gemm_eff override)."""
    rule = SHORT_K_FORWARD.get(gpu.calibration_key)
    if rule is None or phase != "fwd" or precision not in ("bf16", "fp16") or "gemm_eff" in gpu.overridden:
        return 1.0
    return rule[1] if k <= rule[0] else 1.0


@dataclass(frozen=True)
class LinearGemm:
    """A linear layer's product [m,k] x [k,n] in one phase: `kernels` GEMMs (backward: 2), `batch`
    independent copies (a grouped GEMM's local experts, each of m rows)."""

    m: int
    k: int
    n: int
    phase: str = "fwd"
    kernels: int = 1
    batch: int = 1

    def shapes(self) -> list[tuple[int, int, int]]:
        """The GEMMs (M, K, N): forward `kernels` times the shape; backward Transformer Engine's dgrad
        [m,n] x [n,k] (reduces over n) and wgrad [k,m] x [m,n] (reduces over the m tokens)."""
        if self.phase == "bwd":
            return [(self.m, self.n, self.k), (self.k, self.m, self.n)]
        return [(self.m, self.k, self.n)] * self.kernels


def linear_compute_seconds(lin: LinearGemm, gpu: GpuSpec, precision: str, rates: str = "sustained") -> float:
    """Tensor-core seconds of a linear's GEMMs under the one per-tile rule (dense linears and grouped expert
    GEMMs both call it): with tile_cost's K0 > 0 each GEMM of `lin.shapes()` pays K0 on its own reduction
    dimension at the rescaled per-column rate; with K0 = 0, `kernels` times the forward shape. A forward GEMM
    with a short reduction runs at short_k_factor of the rate (SHORT_K_FORWARD)."""
    k0, scale = tile_cost(gpu, precision)
    shapes = lin.shapes() if k0 else [(lin.m, lin.k, lin.n)] * lin.kernels
    seconds = sum(gemm_compute(a, r + k0, c, gpu, precision, lin.batch, rates).seconds for a, r, c in shapes)
    return seconds / scale / short_k_factor(gpu, precision, lin.k, lin.phase)


def wave_count(tiles: int, sms: int) -> int:
    """Waves needed to run `tiles` thread blocks on `sms` SMs, one block per SM at a time."""
    return -(-tiles // sms)


def gemm_compute(
    m: int, k: int, n: int, gpu: GpuSpec, precision: str = "bf16", batch: int = 1, rates: str = "sustained"
) -> GemmTiming:
    """Tensor-core time of `batch` GEMMs [m,k] x [k,n] on `gpu` (tile and wave quantized, no memory bound)."""
    if min(m, k, n, batch) <= 0:
        raise CatalogError(f"GEMM shape {batch}x{m}x{k}x{n} must be positive")
    if gpu.sms <= 0:
        raise CatalogError(f"GPU {gpu.name}: no SM count recorded, the calibrated GEMM model needs one")
    peak = tensor_peak(gpu, precision)
    per_sm = peak * plateau(gpu, precision, rates) / gpu.sms
    pt, pn = PLATEAU_TILE.get(gpu.calibration_key, TILES[0])
    bound = pt * pn / (pt + pn)
    best: GemmTiming | None = None
    for mt, nt in TILES:
        reuse = min(1.0, mt * nt / (mt + nt) / bound)
        waves = wave_count(batch * math.ceil(m / mt) * math.ceil(n / nt), gpu.sms)
        seconds = waves * 2.0 * mt * nt * k / (per_sm * reuse)
        if best is None or seconds < best.seconds:
            best = GemmTiming(seconds, (mt, nt), waves, 2.0 * batch * m * n * k / seconds / peak)
    assert best is not None
    return best


def linear_seconds(
    lin: LinearGemm, nbytes: float, gpu: GpuSpec, precision: str, rates: str = "sustained"
) -> float:
    """Calibrated time of a GEMM op: max(its GEMMs under the per-tile rule, bytes at achieved bandwidth, launch floor)."""
    compute = linear_compute_seconds(lin, gpu, precision, rates)
    return max(compute, nbytes / achieved_bandwidth(gpu), lin.kernels * LAUNCH_FLOOR_S)


@dataclass(frozen=True)
class CalibrationPoint:
    """One public GEMM measurement: GPU, dtype, shape and achieved TFLOP/s, with its source."""

    gpu: str
    dtype: str
    m: int
    n: int
    k: int
    tflops: float
    source: str


def calibration_points(path: str = DATA_FILE) -> list[CalibrationPoint]:
    """The calibration data set (tracegen/data/gemm_calibration.csv)."""
    return read_points(path, CalibrationPoint)


@dataclass(frozen=True)
class ShapePoint:
    """One published per-shape GEMM measurement used as a check: series, shape [m,k] x [k,n], TFLOP/s, source."""

    gpu: str
    dtype: str
    series: str
    m: int
    k: int
    n: int
    tflops: float
    source: str


SHAPES_A100_FILE = os.path.join(os.path.dirname(__file__), "data", "gemm_shapes_a100.csv")
SHAPES_H100_FILE = os.path.join(os.path.dirname(__file__), "data", "gemm_shapes_h100.csv")
SHAPES_B200_FILE = os.path.join(os.path.dirname(__file__), "data", "gemm_shapes_b200.csv")


def shape_points(path: str = SHAPES_A100_FILE) -> list[ShapePoint]:
    """A per-shape check data set (gemm_shapes_a100.csv; gemm_shapes_h100.csv): comparison data, not plateaus."""
    return read_points(path, ShapePoint)
