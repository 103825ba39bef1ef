"""xsim's calibrated GEMM model against published per-shape GEMM measurements on the A100 and H100 (docs/compute.md).

Reads tracegen/data/gemm_shapes_a100.csv (Anthony et al. 2024, arXiv:2401.14489, result files of
github.com/EleutherAI/cookbook commit 27dff48: FP16 torch.mm / F.linear sweeps on one A100) and times each
shape through tracegen.gemm.linear_seconds (tile and wave quantization, memory roof, launch floor) on the
A100 80GB, burst and sustained: the F.linear series (X.W^T) as forward linears, the torch.mm series (NN,
row-major A and B) without the forward layout's short-K rule (gemm.SHORT_K_FORWARD). Prints one Markdown row per class of shapes: the
measured TFLOP/s range and xsim's time over the measured time (below 1: xsim faster than measured).

    python scripts/gemm_shape_check.py            # the class table of docs/compute.md
    python scripts/gemm_shape_check.py --points   # every point
    python scripts/gemm_shape_check.py --tile-scan   # spread per series, smallest full-rate tile 256x128 / 128x128
    python scripts/gemm_shape_check.py --gpu H100            # the H100 table (tracegen/data/gemm_shapes_h100.csv)
    python scripts/gemm_shape_check.py --gpu H100 --k0-scan  # spread per series against the BF16 per-tile cost K0
    python scripts/gemm_shape_check.py --gpu B200 [--k0-scan]  # the B200 table (gemm_shapes_b200.csv), its K0 fit

H100: tracegen/data/gemm_shapes_h100.csv (XLA's sm_90 matmul table, row-major dots [b,n,k] @ [b,k,m], timed on
the device; float8_experimental's nn.Linear baselines of 2023, X.W^T) on the H100, every point as one GEMM of
its shape (the H100 has no layout rule).

B200: tracegen/data/gemm_shapes_b200.csv (XLA's sm_100 table, as sm_90's; its FP8 column shown, not fitted).

Calibration data only (never a training run). The tables compare; --k0-scan is the fit behind
tracegen.gemm.BF16_TILE_K0 (tests/test_gemm_shapes_h100.py re-derives it).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
from collections.abc import Callable, Iterator

from xsim.tracegen import catalog, gemm
from xsim.tracegen.gemm import (
    SHAPES_A100_FILE,
    SHAPES_B200_FILE,
    SHAPES_H100_FILE,
    LinearGemm,
    ShapePoint,
    linear_seconds,
    shape_points,
)

GPU = "A100-80GB"
# The per-shape data set and the GPU it is timed on, per --gpu.
DATA: dict[str, tuple[str, str]] = {
    "A100": (SHAPES_A100_FILE, "A100-80GB"),
    "H100": (SHAPES_H100_FILE, "H100"),
    "B200": (SHAPES_B200_FILE, "B200"),
}
# (label, membership) in the order of the table; a point belongs to the first class that takes it.
CLASSES: tuple[tuple[str, Callable[[ShapePoint], bool]], ...] = (
    (
        "linear fwd, m 8192, K 8192-32640 (qkv, fc1, fc2; h_sweep)",
        lambda p: p.series in ("qkv", "fc1", "fc2"),
    ),
    ("linear fwd, m 8192, K 4128-8160 (attention out-proj)", lambda p: p.series == "proj" and p.k > 4096),
    ("linear fwd, m 8192, K 2048-4096 (attention out-proj)", lambda p: p.series == "proj"),
    ("M 2304, K 4096, N 1536-6144 (nsweep_m2304)", lambda p: p.series == "nsweep_m2304"),
    ("M 27648, K 4096, N 64-128 (memory-bound)", lambda p: p.series == "nsweep_m27648" and p.n <= 128),
    ("M 27648, K 4096, N 144-496", lambda p: p.series == "nsweep_m27648"),
    ("square M = N 2048-8192, K 4096", lambda p: p.series == "square" and p.m >= 2048),
    ("square M = N 32-1024, K 4096 (launch and sync bound)", lambda p: p.series == "square"),
)

H100_CLASSES: tuple[tuple[str, Callable[[ShapePoint], bool]], ...] = (
    ("XLA sm_90, M 4096-16384, N 2048-4096, K 4096", lambda p: p.series.startswith("xla") and p.k == 4096),
    ("XLA sm_90, same, K 2048", lambda p: p.series.startswith("xla") and p.k == 2048),
    ("XLA sm_90, same, K 1024", lambda p: p.series.startswith("xla") and p.k == 1024),
    ("XLA sm_90, same, K 256-512", lambda p: p.series.startswith("xla")),
    ("nn.Linear fwd BF16, M 16384, K 1024-8192 (float8_experimental)", lambda p: p.dtype == "bf16"),
    ("nn.Linear fwd FP16, same shapes", lambda p: p.dtype == "fp16"),
)

B200_CLASSES: tuple[tuple[str, Callable[[ShapePoint], bool]], ...] = (
    ("XLA sm_100 BF16, M 4096-16384, N 2048-4096, K 4096", lambda p: p.dtype == "bf16" and p.k == 4096),
    ("XLA sm_100 BF16, same, K 2048", lambda p: p.dtype == "bf16" and p.k == 2048),
    ("XLA sm_100 BF16, same, K 1024", lambda p: p.dtype == "bf16" and p.k == 1024),
    ("XLA sm_100 BF16, same, K 256-512", lambda p: p.dtype == "bf16"),
    ("XLA sm_100 FP8 (not trusted), same, K 4096", lambda p: p.k == 4096),
    ("XLA sm_100 FP8 (not trusted), same, K 256-2048", lambda p: True),
)
CLASSES_BY_GPU = {"H100": H100_CLASSES, "B200": B200_CLASSES}

# The series measured with torch.mm of row-major A[m,k] and B[k,n] (NN), not F.linear's X.W^T.
NN_SERIES = ("square", "nsweep_m2304", "nsweep_m27648")


@contextlib.contextmanager
def short_k_rule(on: bool) -> Iterator[None]:
    """Run with gemm.SHORT_K_FORWARD as it is (on) or emptied (off), restoring it afterwards."""
    saved = dict(gemm.SHORT_K_FORWARD)
    if not on:
        gemm.SHORT_K_FORWARD.clear()
    try:
        yield
    finally:
        gemm.SHORT_K_FORWARD.clear()
        gemm.SHORT_K_FORWARD.update(saved)


def ratio(p: ShapePoint, rates: str, short_k: bool = True, gpu: str = GPU) -> float:
    """xsim's seconds for the point's shape on `gpu` over the measured seconds (2mkn / TFLOP/s); the forward
    layout's short-K rule applies to the F.linear series only, and not at all with `short_k` False."""
    nbytes = 2 * (p.m * p.k + p.k * p.n + p.m * p.n)  # 16-bit operands and result, read and written once
    with short_k_rule(short_k and p.series not in NN_SERIES):
        xsim = linear_seconds(LinearGemm(p.m, p.k, p.n), nbytes, catalog.gpu(gpu), p.dtype, rates)
    return xsim / (2.0 * p.m * p.k * p.n / (p.tflops * 1e12))


def classify(points: list[ShapePoint], gpu: str = GPU) -> list[tuple[str, list[ShapePoint]]]:
    """The points grouped by the GPU's classes (CLASSES, H100_CLASSES; first match), in table order."""
    classes = CLASSES_BY_GPU.get(gpu, CLASSES)
    groups: dict[str, list[ShapePoint]] = {label: [] for label, _ in classes}
    for p in points:
        label = next(lbl for lbl, member in classes if member(p))
        groups[label].append(p)
    return [(label, groups[label]) for label, _ in classes if groups[label]]


def table(points: list[ShapePoint], gpu: str = GPU) -> str:
    """The Markdown class table: points, measured range, xsim/measured time (burst: median, range; sustained)."""
    out = [
        "| shapes | points | measured TFLOP/s | xsim / measured time, burst: median (range) | sustained: median |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for label, pts in classify(points, gpu):
        burst = [ratio(p, "burst", gpu=gpu) for p in pts]
        sus = statistics.median(ratio(p, "sustained", gpu=gpu) for p in pts)
        lo, hi = min(p.tflops for p in pts), max(p.tflops for p in pts)
        out.append(
            f"| {label} | {len(pts)} | {lo:.1f}-{hi:.1f} | {statistics.median(burst):.3f} "
            f"({min(burst):.3f}-{max(burst):.3f}) | {sus:.3f} |"
        )
    return "\n".join(out)


def series_spread(points: list[ShapePoint], gpu: str = GPU) -> dict[str, float]:
    """Per series: the median absolute deviation of log(xsim / measured) about the series' median (burst).

    A series' level (its stack's plateau, the timing method's per-call cost) drops out; what is left is how
    well the model follows the shape-to-shape pattern (tile and wave quantization). The launch-bound small
    squares and the memory-bound N <= 128 points are left out (neither is set by the tile)."""
    logs: dict[str, list[float]] = {}
    for p in points:
        if (p.series == "square" and p.m < 2048) or (p.series == "nsweep_m27648" and p.n <= 128):
            continue
        logs.setdefault(p.series, []).append(math.log(ratio(p, "burst", gpu=gpu)))
    out = {}
    for series, vals in sorted(logs.items()):
        med = statistics.median(vals)
        out[series] = statistics.median(abs(v - med) for v in vals)
    return out


def tile_scan(points: list[ShapePoint]) -> str:
    """series_spread with the A100's smallest full-rate tile at 256x128 (before) and 128x128 (gemm.PLATEAU_TILE)."""
    rows = ["| smallest full-rate tile | " + " | ".join(series_spread(points)) + " | points-weighted |"]
    rows.append("| --- |" + " ---: |" * (len(series_spread(points)) + 1))
    saved = dict(gemm.PLATEAU_TILE)
    try:
        for tile in ((256, 128), (128, 128)):
            gemm.PLATEAU_TILE.update({"A100-40GB": tile, "A100-80GB": tile})
            spread = series_spread(points)
            n = {s: sum(1 for p in points if p.series == s) for s in spread}
            total = sum(spread[s] * n[s] for s in spread) / sum(n.values())
            cells = " | ".join(f"{v:.4f}" for v in spread.values())
            rows.append(f"| {tile[0]}x{tile[1]} | {cells} | {total:.4f} |")
    finally:
        gemm.PLATEAU_TILE.clear()
        gemm.PLATEAU_TILE.update(saved)
    return "\n".join(rows)


# The calibration K a scan gives a GPU whose model has none (B200: MAMF's best BF16 shape, 1792x16128x3072,
# ml-engineering 744d01e): the scan's K0 then keeps that shape at its measured rate, as gemm.CALIBRATION_K does.
SCAN_CALIBRATION_K = {"B200": 3072}


@contextlib.contextmanager
def bf16_tile_k0(k0: int, gpu: str = "H100") -> Iterator[None]:
    """Run with the BF16 per-tile cost gemm.TILE_K0["bf16"] set to `k0` (and, for a GPU without one, its
    SCAN_CALIBRATION_K as the BF16 calibration K), restoring both afterwards."""
    saved, saved_k = gemm.TILE_K0["bf16"], dict(gemm.CALIBRATION_K)
    gemm.TILE_K0["bf16"] = k0
    if gpu in SCAN_CALIBRATION_K:
        gemm.CALIBRATION_K.setdefault((gpu, "bf16"), SCAN_CALIBRATION_K[gpu])
    try:
        yield
    finally:
        gemm.TILE_K0["bf16"] = saved
        gemm.CALIBRATION_K.clear()
        gemm.CALIBRATION_K.update(saved_k)


def xla_spread(points: list[ShapePoint], k0: int, kmin: int = 256, gpu: str = "H100") -> float:
    """Mean |log(xsim / measured)| (burst) about each XLA BF16 K sweep's median, over its points with K >= kmin,
    with the BF16 per-tile cost set to `k0`: how well K / (K + K0) follows the sweeps, their levels dropped."""
    logs: dict[str, list[float]] = {}
    with bf16_tile_k0(k0, gpu):
        for p in points:
            if p.series.startswith("xla") and p.dtype == "bf16" and p.k >= kmin:
                logs.setdefault(p.series, []).append(math.log(ratio(p, "burst", gpu=gpu)))
    devs = [abs(v - statistics.median(vals)) for vals in logs.values() for v in vals]
    return sum(devs) / len(devs)


K0_GRID = {
    "H100": tuple(range(0, 417, 32)) + tuple(range(200, 281, 8)),
    "B200": tuple(range(0, 609, 32)) + tuple(range(200, 441, 8)),
}


def k0_scan(points: list[ShapePoint], k0s: tuple[int, ...] | None = None, gpu: str = "H100") -> str:
    """xla_spread over all K and over K >= 1024, and the XLA BF16 points' median xsim / measured, per BF16 K0."""
    xla = [p for p in points if p.series.startswith("xla") and p.dtype == "bf16"]
    rows = ["| BF16 K0 | mean dev., K 256-4096 | mean dev., K 1024-4096 | median xsim / measured |"]
    rows.append("| ---: | ---: | ---: | ---: |")
    for k0 in sorted(set(k0s or K0_GRID[gpu])):
        with bf16_tile_k0(k0, gpu):
            med = statistics.median(ratio(p, "burst", gpu=gpu) for p in xla)
        rows.append(
            f"| {k0} | {xla_spread(xla, k0, gpu=gpu):.4f} | {xla_spread(xla, k0, 1024, gpu):.4f} | {med:.3f} |"
        )
    return "\n".join(rows)


def main() -> None:
    """Print the class table (or every point with --points, the tile scan with --tile-scan)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", action="store_true", help="print every point instead of the class table")
    ap.add_argument(
        "--tile-scan", action="store_true", help="per-series spread under either smallest full-rate tile"
    )
    ap.add_argument(
        "--gpu", choices=sorted(DATA), default="A100", help="which per-shape data set (default A100)"
    )
    ap.add_argument(
        "--k0-scan", action="store_true", help="H100, B200: spread of the XLA K sweeps per BF16 K0"
    )
    args = ap.parse_args()
    path, gpu = DATA[args.gpu]
    points = shape_points(path)
    if args.k0_scan:
        print(k0_scan(points, gpu=gpu))
        return
    if args.tile_scan:
        print(tile_scan(points))
        return
    if not args.points:
        print(table(points, gpu))
        return
    for p in points:
        print(
            f"{p.series:20s} {p.m:6d} {p.k:6d} {p.n:6d} {p.tflops:8.3f} burst {ratio(p, 'burst', gpu=gpu):.3f}"
        )


if __name__ == "__main__":
    main()
