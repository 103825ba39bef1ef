"""Unfused attention on the A100 at FlashAttention's published Megatron timings (issue 22, round a100attn).

Every expected number is worked out by hand in the comments from the published tables
(tracegen/data/unfused_attention.csv: Dao et al. 2022, appendix E.6, A100 40GB, 8 heads of 64, batch 16, FP16)
and the A100s' measured copy rates (docs/compute.md), not read back from the code.
"""

from __future__ import annotations

import pytest
from xsim.tracegen import catalog
from xsim.tracegen.frameworks import FRAMEWORKS
from xsim.tracegen.models import model_from_mapping
from xsim.tracegen.ops import Ctx, Op, duration_ns, layer_steps, op_seconds, shard_of
from xsim.tracegen.unfused_attention import bandwidth_fraction, chain_bytes, dropout_bytes, fractions, points

A100_40 = catalog.gpu("A100-40GB")
A100_80 = catalog.gpu("A100-80GB")
ATTN = ("attn_scores", "attn_softmax", "attn_dropout", "attn_context")


def _attention(
    gpu: catalog.GpuSpec, batch: int, heads: int, d: int, s: int, fw: str
) -> dict[tuple[str, str], Op]:
    m = model_from_mapping({"name": "attn", "layers": 1, "hidden": heads * d, "ffn_hidden": 4 * heads * d,
                            "heads": heads, "kv_heads": heads, "vocab": 128, "seq_len": s})  # fmt: skip
    c = Ctx(m, shard_of(m, 1, 0), batch, s, 2, False, "fp16", "unfused", FRAMEWORKS[fw])
    return {
        (o.op, ph): o
        for ph in ("fwd", "bwd")
        for o in layer_steps(c, ph)
        if isinstance(o, Op) and o.op in ATTN
    }


def test_fractions_follow_from_the_published_megatron_rows_by_hand():
    # S = 16 x 8 x 2048^2 = 536,870,912 scores; q = kv = 16 x 2048 x 8 x 64 = 16,777,216; FP16.
    # Chain forward (Q K^T, softmax, P V): 2 x (2 x 33,554,432 + 4 S) = 4,429,185,024 B in 4.28 ms (Table 18)
    #   over 1,355 GB/s (the A100 40GB's measured copy) = 4,429,185,024 / 5,799,400,000 = 0.76373.
    # Chain backward: 2 x (4 x 33,554,432 + 7 S) = 7,784,628,224 B in 8.86 ms (Table 19): / 12,005,300,000 = 0.64843.
    # Dropout forward: 5 S = 2,684,354,560 B in 6.56 - 4.28 = 2.28 ms (Table 15 - 18): / 3,089,400,000 = 0.86889.
    # Dropout backward: 10.80 - 8.86 = 1.94 ms (Table 16 - 19): 1.0212 of the copy rate, held at 1.
    fr = fractions("A100-40GB")
    assert fr is not None
    assert fr.chain_fwd == pytest.approx(0.76373, abs=1e-5)
    assert fr.chain_bwd == pytest.approx(0.64843, abs=1e-5)
    assert fr.dropout_fwd == pytest.approx(0.86889, abs=1e-5)
    assert fr.dropout_bwd == 1.0
    # The A100 80GB borrows the 40GB's fractions; GPUs without a table (H100) keep the copy rate.
    assert fractions("A100-80GB") == fr
    assert fractions("H100") is None
    assert bandwidth_fraction(catalog.gpu("H100"), "attn_softmax", "fwd") == 1.0
    assert bandwidth_fraction(A100_80, "mlp_act", "fwd") == 1.0  # only the attention chain and its dropout


def test_calibration_bytes_are_the_bytes_the_ops_charge():
    # The fractions divide the ops' own byte counts: the closed forms must be what tracegen.ops generates for
    # the benchmark's shape (a full-row softmax: the benchmark has no causal mask, so megatron-core's unfused
    # layer, without Megatron-LM's triangle kernel or layout copies).
    rows = {
        p.phase: p for p in points() if p.implementation == "megatron" and p.seq_len == 2048 and not p.dropout
    }
    ops = _attention(A100_40, 16, 8, 64, 2048, "megatron-core")
    for ph, want in (("fwd", 4_429_185_024), ("bwd", 7_784_628_224)):
        got = sum(ops[n, ph].bytes for n in ("attn_scores", "attn_softmax", "attn_context"))
        assert got == chain_bytes(rows[ph]) == want
        assert ops["attn_dropout", ph].bytes == dropout_bytes(rows[ph]) == 2_684_354_560
    # and the model then reproduces its calibration rows: 4.28 / 8.86 ms, 6.56 / 10.80 ms with dropout (the
    # backward's dropout at the copy rate: 2,684,354,560 / 1,355 GB/s = 1.981 ms, so 10.841)
    ms = {ph: sum(op_seconds(o, A100_40, "calibrated") for (n, q), o in ops.items() if q == ph) * 1e3
          for ph in ("fwd", "bwd")}  # fmt: skip
    assert ms["fwd"] == pytest.approx(6.56, rel=1e-4)
    assert ms["bwd"] == pytest.approx(8.86 + 2_684_354_560 / 1355e9 * 1e3, rel=1e-4)


def test_the_pytorch_rows_at_4096_are_predicted_not_fitted():
    # Out of sample: PyTorch's standard attention at s 4096 (Tables 15, 16, 18, 19; the calibration used only
    # Megatron's s 2048). Bytes grow 4x with s^2 (the q, k terms 2x): forward chain 2 x (2 x 67,108,864 +
    # 4 x 2,147,483,648) = 17,448,304,640 B at 0.76373 x 1,355 GB/s = 16.861 ms against 16.47 (+2.4%);
    # backward 2 x (4 x 67,108,864 + 7 x 2,147,483,648) = 30,601,641,984 B at 0.64843 x 1,355 = 34.83 ms
    # against 33.87 (+2.8%); dropout forward 10,737,418,240 B at 0.86889 x 1,355 = 9.120 ms against 25.34 -
    # 16.47 = 8.87 (+2.8%). Within 3% each, where the copy rate alone was 22-33% fast.
    ops = _attention(A100_40, 16, 8, 64, 4096, "megatron-core")
    chain = {ph: sum(op_seconds(ops[n, ph], A100_40, "calibrated") for n in ("attn_scores", "attn_softmax",
             "attn_context")) * 1e3 for ph in ("fwd", "bwd")}  # fmt: skip
    assert chain["fwd"] == pytest.approx(16.861, abs=1e-3)
    assert chain["bwd"] == pytest.approx(34.829, abs=1e-3)
    assert abs(chain["fwd"] / 16.47 - 1) < 0.03 and abs(chain["bwd"] / 33.87 - 1) < 0.03
    drop = op_seconds(ops["attn_dropout", "fwd"], A100_40, "calibrated") * 1e3
    assert drop == pytest.approx(9.120, abs=1e-3) and abs(drop / (25.34 - 16.47) - 1) < 0.03


def test_one_megatron_2021_layer_on_a100_80gb_by_hand():
    # One layer, micro-batch 1, s 2048, 8 heads of 64, fp16, megatron-2021 (Megatron's causal softmax reads the
    # lower triangle). A100 80GB copy rate 2,039 x 1,727.486 / 1,935 = 1,820.33 GB/s.
    # S = 8 x 2048^2 = 33,554,432; triangle 8 x 2048 x 2049 / 2 = 16,785,408; q = kv = 2048 x 8 x 64 = 1,048,576.
    #   softmax fwd: 2 x (16,785,408 + S) = 100,679,680 B at 0.763732 x 1,820.33 GB/s = 72,419 ns (was 55,308)
    #   softmax bwd: 2 x (2 x 16,785,408 + S) = 134,250,496 B at 0.648433 x 1,820.33 = 113,737 ns
    #   dropout fwd: 5 S = 167,772,160 B at 0.868892 x 1,820.33 = 106,073 ns; bwd at the copy rate 92,166 ns
    #   QK^T fwd: 2 x (2 q + S) = 71,303,168 B at 0.763732 x 1,820.33 = 51,288 ns (its compute, 10 waves of
    #   256 x 128 tiles at 248 TFLOP/s, is 18 us: memory-bound); bwd (two GEMMs) 142,606,336 B = 120,816 ns.
    #   P V fwd: the same 71,303,168 B; its N = 64 fills half a 256 x 128 tile (8 x 8 tiles, one wave of
    #   2 x 256 x 128 x 2048 FLOPs at 267.9 TFLOP/s x 1305 / 1410 / 108 SMs = 58,461 ns). On the A100 a
    #   128 x 64 tile keeps 2/3 of the plateau (tracegen.gemm.PLATEAU_TILE, 128 x 128 at full rate): 16 x 8 =
    #   128 tiles, 2 waves of 2 x 128 x 64 x 2048 FLOPs at 2/3 of that rate = 43,846 ns, below the memory roof:
    #   memory-bound at 51,288 ns like QK^T; bwd 120,816 ns (memory, as QK^T).
    ops = _attention(A100_80, 1, 8, 64, 2048, "megatron-2021")
    ns = {k: duration_ns(o, A100_80, None, "calibrated") for k, o in ops.items()}
    assert ns["attn_softmax", "fwd"] == 72_419
    assert ns["attn_softmax", "bwd"] == 113_737
    assert ns["attn_dropout", "fwd"] == 106_073
    assert ns["attn_dropout", "bwd"] == 92_166
    assert ns["attn_scores", "fwd"] == 51_288
    assert ns["attn_context", "fwd"] == 51_288
    assert ns["attn_scores", "bwd"] == ns["attn_context", "bwd"] == 120_816
    # The roofline model does not use the calibration: 100,679,680 B / (2,039 GB/s x 0.80) = 61,721 ns.
    assert duration_ns(ops["attn_softmax", "fwd"], A100_80, None, "roofline") == 61_721
