#!/usr/bin/env python
"""Break one replayed training step into time per kernel kind on one rank (issue 22's fidelity check).

    python scripts/step_breakdown.py mfu                          # the Llama-2 7B DP8 A100 MFU case
    python scripts/step_breakdown.py nemo2407-llama2-7b-8xh100    # any run id of published_runs.yaml
    python scripts/step_breakdown.py torchtitan-llama2-70b-fsdp64 --no-contention   # compute at full SMs

Kinds: GEMMs (tracegen.ops.GEMM_OPS), attention (the fused or unfused attention core, ATTN_CORE_OPS
less its GEMMs), Transformer Engine FP8 casts and scale updates, the optimizer step (phase `opt`), every
other compute op (memory-bound element-wise kernels: norms, activations, dropout, residuals, RoPE, loss,
embedding), and the communication the compute stream waits for (the step minus the busy compute time
of the rank: exposed, not hidden, communication and pipeline bubbles).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import validate_published as vp  # noqa: E402

KINDS = ("GEMM", "attention", "FP8 casts/scales", "memory-bound", "optimizer", "exposed comm / idle")


@dataclass(frozen=True)
class KindTime:
    """Busy time of one kernel kind on the rank."""

    kind: str
    ops: int
    ms: float


def kind_of(op: str, phase: str) -> str:
    """The kind of a compute op named `op` (its name without layer, phase and micro-batch) in `phase`."""
    from xsim.tracegen.ops import ATTN_CORE_OPS, GEMM_OPS

    if phase == "opt":
        return "optimizer"
    if op in GEMM_OPS:
        return "GEMM"
    # context parallelism's ring steps are attention calls too (`attn_core_cp<i>`,
    # tracegen.context_parallel.ring_step_op; the all-gather form keeps `attn_core`)
    if op in ATTN_CORE_OPS or op.startswith("attn_core_cp"):
        return "attention"
    # the FP8 ops; `_fp8_amax` and `_fp8_scale`: GroupedLinear's per-expert quantize (tracegen.moe_ops);
    # `_fp8_swizzle`: MXFP8's scale swizzles before each GEMM (tracegen.ops._linear)
    fp8 = ("_fp8_cast", "_fp8_transpose", "_fp8_amax", "_fp8_scale", "_fp8_swizzle")
    if op.endswith(fp8) or op in ("fp8_scale_update", "fp8_amax_concat"):
        return "FP8 casts/scales"
    return "memory-bound"


def breakdown(
    run: vp.Run, rank: int = 0, contention: bool = True, host: bool = False
) -> tuple[float, list[KindTime]]:
    """Replay `run` at its real micro-batch count and return the step (s) and the busy time per kind
    (`contention` False: with `comm_sm_contention: false`, compute at full SMs under communication;
    `host`: with `host_dispatch: on`, whose host-bound GPU idle lands in the last kind)."""
    import polars as pl

    spec = dict(vp.spec_for(run))
    if not contention:
        spec["comm_sm_contention"] = False
    if host:
        spec["host_dispatch"] = "on"
    rep = vp.replay_spec(spec, keep_ops=True)
    ops = rep.ops.filter(pl.col("rank") == rank)
    comp = ops.filter((pl.col("type") == "COMP_NODE") & (pl.col("resource") != "cpu")).with_columns(
        pl.col("name").str.split(".").list.get(0).alias("head"), pl.col("name").str.split(".").alias("parts")
    )
    # Names are [L<n>.]<op>.<phase>[.mb<k>][...]: the op is the first part after an optional layer prefix.
    comp = comp.with_columns(
        pl.when(pl.col("head").str.contains(r"^L\d+$"))
        .then(pl.col("parts").list.get(1))
        .otherwise(pl.col("head"))
        .alias("op")
    )
    rows: dict[str, list[float]] = {k: [0, 0.0] for k in KINDS}
    for op, phase, dur in zip(comp["op"], comp["phase"], comp["duration_ns"], strict=True):
        k = kind_of(op, phase or "")
        rows[k][0] += 1
        rows[k][1] += dur / 1e6
    step_ms = rep.iteration_ns / 1e6
    rows["exposed comm / idle"][1] = step_ms - sum(
        v[1] for k, v in rows.items() if k != "exposed comm / idle"
    )
    return rep.iteration_ns / 1e9, [KindTime(k, int(v[0]), v[1]) for k, v in rows.items()]


def table(step_s: float, kinds: list[KindTime]) -> str:
    """Markdown table of the kinds with their share of the step."""
    out = ["| kind | ops | ms | share of step |", "| --- | ---: | ---: | ---: |"]
    for k in kinds:
        out.append(f"| {k.kind} | {k.ops:,} | {k.ms:,.1f} | {100 * k.ms / (step_s * 1e3):.1f}% |")
    out.append(f"| step | | {step_s * 1e3:,.1f} | 100% |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the breakdown of one run (or the MFU case)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a run id of the dataset, or 'mfu' for the Llama-2 7B DP8 A100 case")
    ap.add_argument("--rank", type=int, default=0, help="the rank to break down (default 0)")
    ap.add_argument(
        "--no-contention",
        action="store_true",
        help="replay with comm_sm_contention: false (compute keeps every SM under communication)",
    )
    ap.add_argument(
        "--host-dispatch",
        action="store_true",
        help="replay with host_dispatch: on (host launch costs and syncs, docs/tracegen.md)",
    )
    args = ap.parse_args(argv)
    if args.run == "mfu":
        run = vp.mfu_run()
    else:
        runs = {r.id: r for r in vp.load_dataset().runs}
        if args.run not in runs:
            print(f"step_breakdown: error: unknown run id {args.run}", file=sys.stderr)
            return 2
        run = runs[args.run]
    step_s, kinds = breakdown(run, args.rank, contention=not args.no_contention, host=args.host_dispatch)
    print(f"{run.id}: {step_s:.3f} s per iteration, rank {args.rank}\n")
    print(table(step_s, kinds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
