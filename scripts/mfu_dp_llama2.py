"""Model-FLOPs utilisation of data-parallel Llama-2 7B on 8 A100-80GB (issue 22's sanity check).

BF16, flash attention, distributed optimizer, sequence 4096, DGX A100 cluster, 4 micro-batches per rank;
generated and replayed with scripts/validate_published.py's `replay_spec`. MFU = model FLOPs per iteration
/ (iteration time x 8 x 312 TFLOP/s), model FLOPs = 6 N T + 12 L s h T (Narayanan et al. 2021 and
Korthikanti et al. 2022 count the full s^2 attention) and, in the second column, 6 N T + 6 L s h T (the
causal half a flash kernel executes).

    python scripts/mfu_dp_llama2.py                    # megatron-core (the default profile)
    python scripts/mfu_dp_llama2.py megatron-2021 --micro-batches 1 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from validate_published import replay_spec  # noqa: E402

from tracegen.models import preset  # noqa: E402

A100_BF16_PEAK = 312e12  # NVIDIA A100 datasheet, dense BF16 tensor core
GPUS, SEQ, GRAD_ACC = 8, 4096, 4


def main(argv: list[str] | None = None) -> int:
    """Print iteration time, tokens/s/GPU and MFU per framework and micro-batch size."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("frameworks", nargs="*", default=["megatron-core"])
    ap.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4])
    args = ap.parse_args(argv)
    m = preset("llama2-7b")
    n, layers, h = m.total_params(), m.layers, m.hidden
    for fw in args.frameworks:
        for mb in args.micro_batches:
            spec = {
                "model": "llama2-7b",
                "seq_len": SEQ,
                "parallel": {
                    "gpu": "A100-80GB",
                    "dp": GPUS,
                    "micro_batch": mb,
                    "global_batch": GPUS * mb * GRAD_ACC,
                },
                "distributed_optimizer": True,
                "precision": "bf16",
                "attention": "flash",
                "framework": fw,
                "cluster": "dgx-a100",
            }
            seconds = replay_spec(spec).iteration_ns / 1e9
            tokens = GPUS * mb * GRAD_ACC * SEQ
            full = 6 * n * tokens + 12 * layers * SEQ * h * tokens
            causal = 6 * n * tokens + 6 * layers * SEQ * h * tokens
            peak = GPUS * A100_BF16_PEAK
            print(
                f"{fw} micro_batch {mb}: {seconds:.3f} s per iteration, {tokens / seconds / GPUS:,.0f} tokens/s/GPU, "
                f"MFU {full / seconds / peak:.1%} (6NT + 12Lsh T), {causal / seconds / peak:.1%} (causal half)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
