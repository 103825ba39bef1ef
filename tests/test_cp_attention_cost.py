"""Context-parallel attention as Transformer Engine runs it: the fused calls per rank and step (their query
and key lengths and mask), their FLOPs, and their times at the kernel's published rates by length, against
hand counts (tracegen.context_parallel, tracegen.attention.call_parts, tracegen.ops.cp_attention_seconds).

Rates: tracegen/data/attention_by_length.csv, cuDNN on the H100, head dim 128, TFLOP/s as the sources count
FLOPs (FlashAttention-3, Figures 5c/5d forward, 6b backward):
    forward non-causal 1024: 574, 2048: 617, 4096: 609, 8192: 600; causal 1024: 410, 2048: 484, 4096: 518
    backward non-causal 1024: 408, 2048: 465, 4096: 499; causal = non-causal x forward causal / non-causal.
A rate in TFLOP/s is FLOPs per microsecond / 1e6, so GFLOP / (TFLOP/s) = milliseconds. The H100's dense
BF16 peak is the sources' 989.4 TFLOPS, so at the burst clock the rates apply as they are; the generator's
sustained clock divides the times by tracegen.gemm.sustained_ratio(H100).
"""

from __future__ import annotations

import math

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.attention import flash_compute_seconds
from xsim.tracegen.catalog import gpu
from xsim.tracegen.context_parallel import gathered_calls, ring_calls
from xsim.tracegen.gemm import sustained_ratio
from xsim.traces import attrs as A

H100 = gpu("H100")
SUSTAINED = sustained_ratio(H100, "bf16")
# hidden 2048 = 16 heads of 128 (no GQA), seq 8192: CP 2 -> 4096 tokens a rank (chunks of 2048),
# CP 4 -> 2048 (chunks of 1024); no attention dropout (its ratio is tested elsewhere)
MODEL = {"name": "cpcost", "layers": 2, "hidden": 2048, "ffn_hidden": 4096, "heads": 16, "vocab": 256}
G = 1e9  # FLOPs per GFLOP


def _t(shape_s, kv, phase, causal):
    """Seconds of one call of 1 x 16 heads x d 128 at the burst clock."""
    return flash_compute_seconds((1, 16, 16, shape_s, 128), phase, H100, "cudnn", 1.0, False, kv, causal)


def test_te_ring_calls_per_rank_and_step():
    # TE's p2p sections (cp 4 table in AttnFuncWithCPAndKVP2P): step 0 diagonal (causal s x s), step
    # i <= rank lower-triangle (s x s/2, no mask), step i > rank upper-triangle (s/2 x s, no mask); s = 16
    assert [ring_calls(16, i, 0) for i in range(4)] == [(16, 16, 1)] + [(8, 16, 0)] * 3
    assert [ring_calls(16, i, 2) for i in range(4)] == [(16, 16, 1), (16, 8, 0), (16, 8, 0), (8, 16, 0)]
    assert [ring_calls(16, i, 3) for i in range(4)] == [(16, 16, 1)] + [(16, 8, 0)] * 3
    assert [ring_calls(32, i, r) for r in range(2) for i in range(2)] == [
        (32, 32, 1), (16, 32, 0), (32, 32, 1), (32, 16, 0),
    ]  # fmt: skip


def test_te_all_gather_calls_per_rank():
    # each local chunk j (rank, 2 cp - 1 - rank) against the gathered keys up to its end, causal
    # bottom-right: cp 4, s = 16, chunk 8; cp 2, s = 32, chunk 16
    assert gathered_calls(16, 4, 0) == ((8, 8, 1), (8, 64, 1))
    assert gathered_calls(16, 4, 1) == ((8, 16, 1), (8, 56, 1))
    assert gathered_calls(16, 4, 3) == ((8, 32, 1), (8, 40, 1))
    assert gathered_calls(32, 2, 1) == ((16, 32, 1), (16, 48, 1))
    # score elements per rank, the masked half of each call's q x q square left out, are the causal
    # total over cp: 8 x 8 - 32 + 8 x 64 - 32 = 512 = 64^2 / 2 / 4, on every rank
    for r in range(4):
        assert sum(q * kv - q * q // 2 for q, kv, _ in gathered_calls(16, 4, r)) == 64 * 64 // 2 // 4


def test_call_times_by_length_and_mask_by_hand():
    # causal square 2048: 4 x 16 x 2048^2 x 128 / 2 = 17.179869184 GFLOP at the causal rate at 2048 (484)
    sq = 4 * 16 * 2048**2 * 128 / 2 / G
    assert _t(2048, 2048, "fwd", True) == pytest.approx(sq / 484 * 1e-3)
    # non-causal 2048 queries x 1024 keys, 17.18 GFLOP: forward loops over the keys (574 at 1024),
    # backward over the queries (2.5 x the FLOPs at 465, the rate at 2048)
    assert _t(2048, 1024, "fwd", False) == pytest.approx(sq / 574 * 1e-3)
    assert _t(2048, 1024, "bwd", False) == pytest.approx(2.5 * sq / 465 * 1e-3)
    # causal bottom-right 1024 x 4096: the causal 1024 square (4 x 16 x 1024^2 x 128 / 2 = 4.294967296
    # GFLOP at 410) + 1024 x 3072 in full (4 x 16 x 1024 x 3072 x 128 = 25.769803776 GFLOP at 609, the
    # forward's loop 4096)
    tri, rect = 4 * 16 * 1024**2 * 128 / 2 / G, 4 * 16 * 1024 * 3072 * 128 / G
    assert _t(1024, 4096, "fwd", True) == pytest.approx((tri / 410 + rect / 609) * 1e-3)
    # backward: the square at the causal backward 408 x 410 / 574, the rest at 408 (loop: 1024 queries)
    assert _t(1024, 4096, "bwd", True) == pytest.approx(2.5 * (tri / (408 * 410 / 574) + rect / 408) * 1e-3)
    # a causal square is its causal part alone, as the layer's own attn_core has always been timed
    assert _t(2048, 0, "fwd", True) == _t(2048, 2048, "fwd", True)


def _layer_ops(cp, comm, rank):
    spec = {
        "model": MODEL, "seq_len": 8192, "cp_comm_type": comm, "attention_kernel": "cudnn",
        "attention_dropout": 0.0, "parallel": {"gpu": "H100", "cp": cp}, "board_load": "alone",
    }  # fmt: skip
    bundle = generate(load_spec(spec), rewrite=False)
    out = {}
    for n in bundle.nodes[rank]:
        if n.name.startswith("L1.attn_core"):
            a = {x.name: x for x in n.attr}
            out[n.name] = (a[A.NUM_OPS].int64_val, a[A.DURATION_NS].int64_val)
    return out


def _ns(ms):
    """Milliseconds at the burst clock -> the generator's ns at the sustained clock."""
    return ms * 1e6 / SUSTAINED


@pytest.mark.parametrize("rank", [0, 3])
def test_ring_cp4_steps_flops_and_times_by_hand(rank):
    ops = _layer_ops(4, "p2p", rank)
    # s = 2048: every step 2 x 16 x 2048^2 x 128 = 17,179,869,184 FLOPs forward (causal 2048 square, or
    # 2048 x 1024 / 1024 x 2048 in full), twice that backward
    f = 2 * 16 * 2048**2 * 128
    assert [ops[f"L1.attn_core_cp{i}.fwd.mb0"][0] for i in range(4)] == [f] * 4 == [17_179_869_184] * 4
    assert [ops[f"L1.attn_core_cp{i}.bwd.mb0"][0] for i in range(4)] == [2 * f] * 4
    g = f / G  # 17.179869184 GFLOP as the sources count it too
    # step 0: causal 2048 at 484 -> 35.4956 us; rank 0's steps 1-3 upper-triangle 1024 x 2048 (forward loop
    # 2048: 617 -> 27.8442 us); rank 3's lower-triangle 2048 x 1024 (loop 1024: 574 -> 29.9301 us)
    rest = 617 if rank == 0 else 574
    want = [g / 484] + [g / rest] * 3
    got = [ops[f"L1.attn_core_cp{i}.fwd.mb0"][1] for i in range(4)]
    assert got == pytest.approx([_ns(w) for w in want], abs=1)
    # backward (2.5 x the FLOPs): step 0 at 465 x 484 / 617 = 364.76; the rest loop over the queries:
    # rank 0's 1024 (408), rank 3's 2048 (465)
    rest_b = 408 if rank == 0 else 465
    want_b = [2.5 * g / (465 * 484 / 617)] + [2.5 * g / rest_b] * 3
    got_b = [ops[f"L1.attn_core_cp{i}.bwd.mb0"][1] for i in range(4)]
    assert got_b == pytest.approx([_ns(w) for w in want_b], abs=1)


def test_ring_cp2_steps_by_hand():
    # s = 4096: step 0 causal 4096 (4 x 16 x 4096^2 x 128 / 2 = 68.719476736 GFLOP at 518); step 1 on rank 0
    # upper-triangle 2048 x 4096 (loop 4096: 609), on rank 1 lower-triangle 4096 x 2048 (loop 2048: 617)
    g = 2 * 16 * 4096**2 * 128 / G
    for rank, rate in ((0, 609), (1, 617)):
        ops = _layer_ops(2, "p2p", rank)
        assert [ops[f"L1.attn_core_cp{i}.fwd.mb0"][0] for i in range(2)] == [68_719_476_736] * 2
        got = [ops[f"L1.attn_core_cp{i}.fwd.mb0"][1] for i in range(2)]
        assert got == pytest.approx([_ns(g / 518), _ns(g / rate)], abs=1)


def test_all_gather_cp2_op_is_the_slowest_ranks_two_calls_by_hand():
    ops0, ops1 = _layer_ops(2, "all_gather", 0), _layer_ops(2, "all_gather", 1)
    # FLOPs: the causal total over cp, 2 x 16 x 8192^2 x 128 / 2 = 137,438,953,472 on each rank
    assert ops0["L1.attn_core.fwd.mb0"][0] == ops1["L1.attn_core.fwd.mb0"][0] == 137_438_953_472
    # chunk 2048; rank 0: (2048, 2048) and (2048, 8192), rank 1: (2048, 4096) and (2048, 6144), causal.
    # Each: its causal 2048 square (17.179869184 GFLOP at 484), both ranks twice; the full rest, rank 0:
    # 2048 x 6144 (103.079215104 GFLOP at 600, loop 8192) = 0.070992 + 0.171799 = 0.242791 ms; rank 1:
    # 2048 x 2048 (34.359738368 at 609) + 2048 x 4096 (68.719476736 at 609 - 9 log2(1.5) = 603.7351, loop
    # 6144) = 0.070992 + 0.056420 + 0.113823 = 0.241235 ms. Every rank runs the slowest's, rank 0's.
    sq = 17.179869184
    r0 = 2 * sq / 484 + 103.079215104 / 600
    r1 = 2 * sq / 484 + 34.359738368 / 609 + 68.719476736 / (609 - 9 * math.log2(1.5))
    assert r0 > r1
    assert ops0["L1.attn_core.fwd.mb0"][1] == ops1["L1.attn_core.fwd.mb0"][1] == pytest.approx(_ns(r0), abs=1)
    # backward: both ranks loop over 2048 queries: squares at 465 x 484 / 617, the rest (6 x 2048^2 in
    # all: 103.079215104 GFLOP) at 465, x 2.5
    rb = 2.5 * (2 * sq / (465 * 484 / 617) + 103.079215104 / 465)
    assert ops0["L1.attn_core.bwd.mb0"][1] == pytest.approx(_ns(rb), abs=1)


def test_all_gather_cp4_op_by_hand():
    ops = _layer_ops(4, "all_gather", 2)
    # s = 2048, chunk 1024: causal total over cp 2 x 16 x 8192^2 x 128 / 2 / 2 = 68,719,476,736 FLOPs
    assert ops["L1.attn_core.fwd.mb0"][0] == 68_719_476_736
    # squares: 2 x 4.294967296 GFLOP at 410 (causal 1024) per rank; the rest 7 x 1024^2 x 4 x 16 x 128 =
    # 60.129542144 GFLOP. Rank 0: all of it in the call of 8192 keys (600) -> 0.020951 + 0.100216 =
    # 0.121167 ms; rank 1: 1 x at 2048 (617), 6 x at 7168 (600 + 9 (1 - log2(7168/4096)... = 602.2664);
    # rank 2: 2 x at 3072 (617 - 8 log2 1.5 = 612.3203), 5 x at 6144 (603.7351); rank 3: 3 x at 4096
    # (609), 4 x at 5120 (609 - 9 log2 1.25 = 606.1027). Rank 0 is the slowest: every rank runs its time.
    sq, unit = 4.294967296, 8.589934592  # GFLOP: a causal 1024 square, and a 1024 x 1024 block in full
    r = [
        2 * sq / 410 + 7 * unit / 600,
        2 * sq / 410 + unit / 617 + 6 * unit / (609 - 9 * math.log2(1.75)),
        2 * sq / 410 + 2 * unit / (617 - 8 * math.log2(1.5)) + 5 * unit / (609 - 9 * math.log2(1.5)),
        2 * sq / 410 + 3 * unit / 609 + 4 * unit / (609 - 9 * math.log2(1.25)),
    ]
    assert max(r) == r[0]
    assert ops["L1.attn_core.fwd.mb0"][1] == pytest.approx(_ns(r[0]), abs=1)
