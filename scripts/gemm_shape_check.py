"""xsim's calibrated GEMM model against published per-shape GEMM measurements on the A100 (docs/compute.md).

Reads tracegen/data/gemm_shapes_a100.csv (Anthony et al. 2024, arXiv:2401.14489, result files of
github.com/EleutherAI/cookbook commit 27dff48: FP16 torch.mm / F.linear sweeps on one A100) and times each
shape through tracegen.gemm.linear_seconds (tile and wave quantization, memory roof, launch floor) on the
A100 80GB, burst and sustained: the F.linear series (X.W^T) as forward linears, the torch.mm series (NN,
row-major A and B) without the forward layout's short-K rule (gemm.SHORT_K_FORWARD). Prints one Markdown row per class of shapes: the
measured TFLOP/s range and xsim's time over the measured time (below 1: xsim faster than measured).

    python scripts/gemm_shape_check.py            # the class table of docs/compute.md
    python scripts/gemm_shape_check.py --points   # every point
    python scripts/gemm_shape_check.py --tile-scan   # spread per series, smallest full-rate tile 256x128 / 128x128

Comparison only: nothing here sets a constant of the model.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
from collections.abc import Callable, Iterator

from xsim.tracegen import catalog, gemm
from xsim.tracegen.gemm import LinearGemm, ShapePoint, linear_seconds, shape_points

GPU = "A100-80GB"
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


def ratio(p: ShapePoint, rates: str, short_k: bool = True) -> float:
    """xsim's seconds for the point's shape over the measured seconds (2mkn / TFLOP/s); the forward layout's
    short-K rule applies to the F.linear series only, and not at all with `short_k` False."""
    nbytes = 2 * (p.m * p.k + p.k * p.n + p.m * p.n)  # fp16 operands and result, read and written once
    with short_k_rule(short_k and p.series not in NN_SERIES):
        xsim = linear_seconds(LinearGemm(p.m, p.k, p.n), nbytes, catalog.gpu(GPU), p.dtype, rates)
    return xsim / (2.0 * p.m * p.k * p.n / (p.tflops * 1e12))


def classify(points: list[ShapePoint]) -> list[tuple[str, list[ShapePoint]]]:
    """The points grouped by CLASSES (first match), in table order."""
    groups: dict[str, list[ShapePoint]] = {label: [] for label, _ in CLASSES}
    for p in points:
        label = next(lbl for lbl, member in CLASSES if member(p))
        groups[label].append(p)
    return [(label, groups[label]) for label, _ in CLASSES if groups[label]]


def table(points: list[ShapePoint]) -> str:
    """The Markdown class table: points, measured range, xsim/measured time (burst: median, range; sustained)."""
    out = [
        "| shapes | points | measured TFLOP/s | xsim / measured time, burst: median (range) | sustained: median |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for label, pts in classify(points):
        burst = [ratio(p, "burst") for p in pts]
        sus = statistics.median(ratio(p, "sustained") for p in pts)
        lo, hi = min(p.tflops for p in pts), max(p.tflops for p in pts)
        out.append(
            f"| {label} | {len(pts)} | {lo:.1f}-{hi:.1f} | {statistics.median(burst):.3f} "
            f"({min(burst):.3f}-{max(burst):.3f}) | {sus:.3f} |"
        )
    return "\n".join(out)


def series_spread(points: list[ShapePoint]) -> dict[str, float]:
    """Per series: the median absolute deviation of log(xsim / measured) about the series' median (burst).

    A series' level (its stack's plateau, the timing method's per-call cost) drops out; what is left is how
    well the model follows the shape-to-shape pattern (tile and wave quantization). The launch-bound small
    squares and the memory-bound N <= 128 points are left out (neither is set by the tile)."""
    logs: dict[str, list[float]] = {}
    for p in points:
        if (p.series == "square" and p.m < 2048) or (p.series == "nsweep_m27648" and p.n <= 128):
            continue
        logs.setdefault(p.series, []).append(math.log(ratio(p, "burst")))
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


def main() -> None:
    """Print the class table (or every point with --points, the tile scan with --tile-scan)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", action="store_true", help="print every point instead of the class table")
    ap.add_argument(
        "--tile-scan", action="store_true", help="per-series spread under either smallest full-rate tile"
    )
    args = ap.parse_args()
    points = shape_points()
    if args.tile_scan:
        print(tile_scan(points))
        return
    if not args.points:
        print(table(points))
        return
    for p in points:
        print(f"{p.series:14s} {p.m:6d} {p.k:6d} {p.n:6d} {p.tflops:8.3f} burst {ratio(p, 'burst'):.3f}")


if __name__ == "__main__":
    main()
