"""Unfused attention's kernels at the rate a published kernel benchmark measured on the A100 (issue 22).

Megatron-LM's non-flash attention (and PyTorch's standard attention) runs a batched GEMM Q K^T, a softmax, a
dropout and a batched GEMM with V over the b x heads x s x s scores (tracegen.ops.attention_steps). At head
dimensions up to 128 the two GEMMs are bound by the scores they write and read, so the calibrated model
timed the whole chain at the copy bandwidth (tracegen.gemm.MEASURED_MEM_EFF). The measured chain is slower:
Dao et al. 2022 (FlashAttention, arXiv:2205.14135), appendix E.6, time Megatron's attention on one A100 40GB
(8 heads of 64, batch 16, FP16, random Q, K, V, mean of 100 calls) with and without dropout, forward and
backward, by sequence length (tracegen/data/unfused_attention.csv). At s = 2048, the length of every
Megatron-LM row of docs/validation.md:

  chain (Q K^T, softmax, P V), bytes as tracegen.ops counts them for that shape (S = 16 x 8 x 2048^2 scores,
  q = kv = 16 x 2048 x 8 x 64, 2 bytes each): forward 2 (2 (q + kv) + 4 S) = 4,429,185,024 B in 4.28 ms
  (Table 18) = 1,034.9 GB/s, 0.7637 of the A100 40GB's measured copy rate 1,355 GB/s; backward
  2 (4 (q + kv) + 7 S) = 7,784,628,224 B in 8.86 ms (Table 19) = 0.6484 of it;
  dropout (read, write, 1-byte mask: 5 S = 2,684,354,560 B): forward the with-dropout minus the no-dropout
  time, 6.56 - 4.28 = 2.28 ms (Table 15 - Table 18) = 0.8689 of the copy rate (Philox random numbers:
  slower than a copy); backward 10.80 - 8.86 = 1.94 ms (Table 16 - Table 19), at the copy rate (1.02, held
  at 1).

These fractions of the copy rate replace it as the memory roof of those ops (a GEMM that is compute-bound
keeps its compute time). The A100 80GB has no such table and borrows the 40GB's fractions (same GA100 and
kernels, each at its own copy rate). The PyTorch rows of the same tables and the other lengths are checks,
not inputs (tests/test_unfused_attention.py). This is kernel-benchmark data, not a training run: nothing
here is read from the validation set (docs/validation.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache

from xsim.tracegen.calibration_csv import read_points
from xsim.tracegen.catalog import GpuSpec, gpu
from xsim.tracegen.gemm import achieved_bandwidth

DATA_FILE = os.path.join(os.path.dirname(__file__), "data", "unfused_attention.csv")
# The ops of the chain whose bytes move at the chain's measured rate; attn_dropout has its own.
CHAIN_OPS: frozenset[str] = frozenset({"attn_scores", "attn_softmax", "attn_context"})
DROPOUT_OP = "attn_dropout"
# The rows that define the fractions: Megatron's implementation at s = 2048 (the others are checks).
CALIBRATION_IMPL, CALIBRATION_SEQ = "megatron", 2048
# GPUs measured on another one's table: the A100 80GB (GA100, HBM2e) on the A100 40GB's.
BORROWED: dict[str, str] = {"A100-80GB": "A100-40GB"}
DTYPE_BYTES = 2  # the benchmark runs FP16
MASK_BYTES = 1  # torch dropout's bool mask


@dataclass(frozen=True)
class UnfusedPoint:
    """One published timing of unfused attention: GPU, implementation, pass, shape and ms, with its source."""

    gpu: str
    implementation: str
    phase: str
    dropout: bool
    seq_len: int
    batch: int
    heads: int
    head_dim: int
    ms: float
    source: str


@dataclass(frozen=True)
class UnfusedFractions:
    """Measured rates of unfused attention on one GPU as fractions of its copy bandwidth."""

    chain_fwd: float
    chain_bwd: float
    dropout_fwd: float
    dropout_bwd: float


def points(path: str = DATA_FILE) -> list[UnfusedPoint]:
    """The calibration data set (tracegen/data/unfused_attention.csv)."""
    return read_points(path, UnfusedPoint, {"phase": "pass"})


def chain_bytes(p: UnfusedPoint) -> int:
    """Bytes of Q K^T, a full-row softmax and P V for the point's shape and pass, as tracegen.ops counts them."""
    scores = p.batch * p.heads * p.seq_len**2
    q = kv = p.batch * p.seq_len * p.heads * p.head_dim
    if p.phase == "bwd":
        return DTYPE_BYTES * (4 * (q + kv) + 7 * scores)
    return DTYPE_BYTES * (2 * (q + kv) + 4 * scores)


def dropout_bytes(p: UnfusedPoint) -> int:
    """Bytes of the attention dropout for the point's shape (read, write, mask), either pass."""
    return p.batch * p.heads * p.seq_len**2 * (2 * DTYPE_BYTES + MASK_BYTES)


@cache
def fractions(key: str) -> UnfusedFractions | None:
    """The measured fractions of the copy rate for GPU calibration key `key` (None: no table for it)."""
    measured_on = BORROWED.get(key, key)
    rows = {
        (p.phase, p.dropout): p
        for p in points()
        if p.gpu == measured_on and p.implementation == CALIBRATION_IMPL and p.seq_len == CALIBRATION_SEQ
    }
    if len(rows) != 4:
        return None
    bw = achieved_bandwidth(gpu(measured_on))

    def rate(nbytes: int, ms: float) -> float:
        return min(1.0, nbytes / (ms * 1e-3 * bw))

    f, b = rows["fwd", False], rows["bwd", False]
    return UnfusedFractions(
        chain_fwd=rate(chain_bytes(f), f.ms),
        chain_bwd=rate(chain_bytes(b), b.ms),
        dropout_fwd=rate(dropout_bytes(f), rows["fwd", True].ms - f.ms),
        dropout_bwd=rate(dropout_bytes(b), rows["bwd", True].ms - b.ms),
    )


def bandwidth_fraction(g: GpuSpec, op: str, phase: str) -> float:
    """Fraction of the copy bandwidth at which unfused attention op `op` moves its bytes in `phase` on `g`
    (1.0 for other ops and for GPUs without a measurement)."""
    if op not in CHAIN_OPS and op != DROPOUT_OP:
        return 1.0
    fr = fractions(g.calibration_key)
    if fr is None:
        return 1.0
    bwd = phase == "bwd"
    if op == DROPOUT_OP:
        return fr.dropout_bwd if bwd else fr.dropout_fwd
    return fr.chain_bwd if bwd else fr.chain_fwd
