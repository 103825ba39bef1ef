"""Memory per rank: Korthikanti et al. 2022's activation formulas, ZeRO's 16 bytes per parameter, refusal."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import yaml
from xsim.tracegen.errors import SpecError
from xsim.tracegen.memory import (
    MemoryOptions,
    _options_of,
    deployment_memory,
    in_flight,
    korthikanti_layer_bytes,
    layer_activation_bytes,
    optimizer_bytes,
)
from xsim.tracegen.models import model_from_mapping, preset, with_seq_len
from xsim.tracegen.spec import load_spec, spec_to_mapping

REPO = Path(__file__).resolve().parents[1]
DP8 = REPO / "examples" / "decide" / "llama2_7b_dp8_a100_80gb.yaml"

# GPT-3 175B as Korthikanti et al. train it (section 5, Table 3): s 2048, b 1, h 12288, a 96, t 8.
S, B, H, A, T = 2048, 1, 12288, 96, 8
SBH = S * B * H  # 25,165,824; 5as/h = 5*96*2048/12288 = 80


@pytest.mark.parametrize(
    ("t", "sp", "recompute", "expected"),
    [
        (1, False, "none", SBH * 114),  # sbh(34 + 5as/h), no parallelism
        (T, False, "none", SBH * 23),  # sbh(10 + 24/t + 5as/(ht)) = sbh(10 + 3 + 10)
        (T, True, "none", SBH * 114 // 8),  # sbh/t (34 + 5as/h)
        (T, False, "selective", SBH * 13),  # sbh(10 + 24/t)
        (T, True, "selective", SBH * 34 // 8),  # 34 sbh/t
        (T, False, "full", 2 * SBH),  # 2sbh
        (T, True, "full", 2 * SBH // 8),  # 2sbh/t
    ],
)
def test_korthikanti_table2(t, sp, recompute, expected):
    got = korthikanti_layer_bytes(S, B, H, A, t, sp, recompute)
    assert got == expected
    # The per-component accounting gives exactly the paper's numbers on a GPT layer (4h GELU MLP, MHA).
    gpt3 = with_seq_len(preset("gpt3-175b"), S)
    assert layer_activation_bytes(gpt3, S, B, t, sp, recompute, flash=False) == expected


def test_flash_attention_keeps_only_log_sum_exp():
    gpt3 = with_seq_len(preset("gpt3-175b"), S)
    flash = layer_activation_bytes(gpt3, S, B, T, False, "none", flash=True)
    # Selective recomputation's bytes (no a*s*s tensors) plus one fp32 per (head, query) of this rank.
    assert flash == SBH * 13 + Fraction(4 * A * S * B, T)


def test_pipeline_in_flight_micro_batches():
    assert [in_flight("1f1b", 8, 4, k) for k in range(4)] == [4, 3, 2, 1]  # p - k
    assert in_flight("1f1b", 2, 4, 0) == 2  # never more than m
    assert in_flight("gpipe", 8, 4, 3) == 8  # GPipe holds every micro-batch
    # Interleaved (v = 2, p = 4): the first stage holds L(1 + (p-1)/(pv)) layers' worth = 1.375 L, i.e.
    # 5.5 micro-batches of its L/p layers (Korthikanti section 4.2.3).
    assert in_flight("1f1b", 8, 4, 0, virtual=2) * Fraction(1, 4) == 1 + Fraction(3, 8)
    # M = P = 4, v = 2: the last stage holds (4-3-1)*2 + (2-1)*4 + 1 = 5 chunks = 5/2 micro-batches; under
    # Megatron-LM's rule before 2024-11 (every pass warm-up at M = P) all 8 chunks = 4 micro-batches.
    assert in_flight("1f1b", 4, 4, 3, virtual=2) == Fraction(5, 2)
    assert in_flight("1f1b", 4, 4, 3, virtual=2, all_warmup_at_m_eq_p=True) == 4


def test_zero_sixteen_bytes_per_parameter():
    # ZeRO section 3.1 / Figure 1: a 7.5B model needs 16 x 7.5B = 120 GB; with P_os over Nd = 64,
    # 4 x 7.5B + 12 x 7.5B / 64 = 31.4 GB.
    psi = 7_500_000_000
    assert 2 * psi + 2 * psi + optimizer_bytes(psi, 64, False) == 120_000_000_000
    assert 4 * psi + optimizer_bytes(psi, 64, True) == 31_406_250_000
    # Every rank of the Llama-2 7B DP plan holds 18 bytes per parameter of all 6,738,415,616: its BF16
    # gradients are kept and reduced in FP32 (Megatron's default; docs/user-guide/features/dist_optimizer.md
    # "bf16 parameters, fp32 gradients": 18). With grad_reduce_dtype: bf16, ZeRO's 16.
    dep = load_spec(DP8)
    rank0 = deployment_memory(dep)[0]
    assert rank0.params == 6_738_415_616
    assert rank0.weights + rank0.gradients + rank0.optimizer == 18 * 6_738_415_616
    dep.grad_reduce_dtype = "bf16"
    rank0 = deployment_memory(dep)[0]
    assert rank0.weights + rank0.gradients + rank0.optimizer == 16 * 6_738_415_616


def test_llama7b_dp8_refused_then_fits_with_distributed_optimizer(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "xsim", "plan", str(DP8)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert "rank 0 (A100-80GB" in line and "but has 80.0 GiB" in line and "--allow-oom" in line
    assert "optimizer 75.3" in line  # 12 x 6.74e9 B = 75.3 GiB of Adam state alone
    # The same plan with the distributed optimizer over DP 8: 12/8 bytes per parameter of state; fits.
    dep = load_spec(DP8)
    opts = dataclasses.replace(MemoryOptions(), distributed_optimizer=True, micro_batches=1)
    mem = deployment_memory(dep, opts)
    assert all(r.optimizer == -(-12 * 6_738_415_616 // 8) for r in mem)
    assert all(r.headroom > 0 for r in mem)
    ok = subprocess.run(
        [sys.executable, "-m", "xsim", "plan", str(DP8), "--allow-oom", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0 and json.loads(ok.stdout)["memory"]["fits"] is False


TINY = {
    "name": "tiny",
    "model": {
        "name": "tiny",
        "layers": 4,
        "hidden": 256,
        "ffn_hidden": 688,
        "heads": 8,
        "vocab": 1000,
        "seq_len": 128,
    },
    "seq_len": 128,
    "make_vocab_size_divisible_by": 0,  # the vocabulary as given: no Megatron padding
    "micro_batches": 4,
    "schedule": "1f1b",
    "device_groups": [
        {"gpu": "H100", "ranks": [0, 1], "layers": [1, 2], "pp_stage": 0},
        {"gpu": "A100", "ranks": [2], "layers": [3, 4], "pp_stage": 1},
    ],
}


def test_gen_writes_memory_json_and_replay_reports_peak_per_rank(tmp_path):
    spec = tmp_path / "tiny.json"
    spec.write_text(json.dumps(TINY))
    out = tmp_path / "t"
    gen = subprocess.run(
        [sys.executable, "-m", "xsim", "gen", str(spec), "--out", str(out)], capture_output=True, text=True
    )
    assert gen.returncode == 0, gen.stderr
    doc = json.loads((out / "memory.json").read_text())
    mem = deployment_memory(load_spec(spec))
    assert [r["total"] for r in doc["ranks"]] == [r.total for r in mem]
    # By hand (s 128, b 1, h 256, f 688, a 8, TP 2, FlashAttention, SwiGLU): replicated 10sbh = 327,680;
    # split: Q, K, V, out-proj input 8sbh = 262,144, SwiGLU 6sbf = 528,384, log-sum-exp 4as = 4,096, halved:
    # 397,312; one layer 724,992. Stage 0 of 2 under 1F1B holds 2 micro-batches of its 2 layers, plus the
    # embedding dropout mask sbh = 32,768 per micro-batch in flight: 4 x 724,992 + 2 x 32,768 = 2,965,504.
    assert mem[0].activations == 2_965_504
    rep = subprocess.run(
        [sys.executable, "-m", "xsim", "replay", str(out), "--json", "--no-progress"],
        capture_output=True,
        text=True,
    )
    assert rep.returncode == 0, rep.stderr
    got = json.loads(rep.stdout)["memory"]
    assert got["per_rank_peak_bytes"] == [r.total for r in mem] and got["fits"] is True


def _one_stage(**opts) -> int:
    spec = dict(TINY, micro_batches=2, schedule="gpipe")
    spec["device_groups"] = [{"gpu": "H100", "ranks": [0], "layers": [1, 4]}]
    o = dataclasses.replace(MemoryOptions(), micro_batches=2, **opts)
    return deployment_memory(load_spec(spec), o)[0].activations


def test_recompute_variants_on_a_stage():
    # Tiny model, one stage (embedding and head on it), TP 1, 4 layers, GPipe with 2 micro-batches in flight.
    # Per layer, by hand: 10sbh 327,680 + 8sbh 262,144 + SwiGLU 6sbf 528,384 (+ log-sum-exp 4as 4,096).
    # Ends: embedding mask sbh x 2 = 65,536; last stage 4sbh 131,072 + Megatron's loss on the logits, its
    # FP32 copy beside the BF16 logits or their BF16 gradient, (4 + 2)sv = 768,000 (LOSS_PEAK_BYTES).
    ends = 65_536 + 131_072 + 768_000
    assert _one_stage() == 4 * 2 * 1_122_304 + ends
    assert _one_stage(recompute="selective") == 4 * 2 * 1_118_208 + ends
    # Full, uniform method, units of K = 2: 2 unit inputs (2sbh = 65,536) per micro-batch, plus one unit's
    # 2 layers rematerialized during its backward.
    assert _one_stage(recompute="full", recompute_layers=2) == 2 * 2 * 65_536 + 2 * 1_122_304 + ends
    # K = 1 (Megatron's default): every layer's input kept, one layer rematerialized at a time.
    assert _one_stage(recompute="full") == 4 * 2 * 65_536 + 1_122_304 + ends
    # Block method, K = 1 (Megatron's --recompute-method block): layer 1 keeps its input, layers 2-4
    # everything, per micro-batch; layer 1 rematerialized during its backward.
    block = _one_stage(recompute="full", recompute_method="block")
    assert block == 2 * (65_536 + 3 * 1_122_304) + 1_122_304 + ends
    # K >= the stage's 4 layers: every layer recomputed alone, as the uniform method with K = 1.
    assert _one_stage(recompute="full", recompute_layers=6, recompute_method="block") == _one_stage(
        recompute="full"
    )


def test_zero3_memory_by_hand():
    # Tiny 2-layer model, DP 2, sharding: zero3. Per rank 2 x 41,088 (layers) + 6,400 (embedding) + 6,464
    # (final norm + head) = 95,040 parameters; shard 47,520. Largest unit: a layer, 41,088.
    # weights: shard x 2 B + two gathered layers (in use + prefetched) x 2 B = 95,040 + 164,352
    # gradients: shard x 4 B (FP32) + one layer's unsharded gradient x 4 B = 190,080 + 164,352
    # optimizer: 12 B x 95,040 / 2 = 570,240
    model = {
        "layers": 2,
        "hidden": 64,
        "ffn_hidden": 128,
        "heads": 4,
        "kv_heads": 4,
        "vocab": 100,
        "seq_len": 32,
    }
    dep = load_spec(
        {
            "model": model,
            "parallel": {"gpu": "H100", "dp": 2},
            "sharding": "zero3",
            "make_vocab_size_divisible_by": 0,
        }
    )
    for r in deployment_memory(dep):
        assert (r.params, r.weights, r.gradients, r.optimizer) == (95_040, 259_392, 354_432, 570_240)
    # Llama-2 7B over DP 8: 18 B per parameter / 8 plus a 202,383,360-parameter layer gathered twice
    # (2 B) and its gradient (4 B): well under the 18 B x 6.74e9 = 121 GB of plain data parallelism.
    dep = load_spec({**yaml.safe_load(DP8.read_text()), "sharding": "zero3"})
    n, layer = 6_738_415_616, 202_383_360
    r = deployment_memory(dep)[0]
    assert r.weights == -(-n // 8) * 2 + 2 * layer * 2
    assert r.gradients == -(-n // 8) * 4 + layer * 4
    assert r.optimizer == -(-12 * n // 8)


# A tiny GPT layer for the dropout variants: s 4, b 1, h 8, a 2 (as/h = 1), 4h GELU MLP, MHA; sbh = 32.
GPT_TINY = model_from_mapping(
    {"name": "g", "layers": 1, "hidden": 8, "ffn_hidden": 32, "heads": 2, "vocab": 16, "seq_len": 4,
     "activation": "gelu", "norm": "layernorm"}
)  # fmt: skip


@pytest.mark.parametrize(
    ("t", "sp", "recompute", "hidden", "attn", "expected"),
    [
        # Korthikanti section 4.1 by component at t 1: norm inputs 4sbh 128, QKV and MLP inputs 4sbh 128,
        # Q K V 6sbh 192, out-proj input 2sbh 64, GELU input and fc2 input 4sbf 512 = 1,024 (32sbh); hidden
        # dropout masks after attention and MLP 2sbh 64; softmax output 2as^2b 64, attention-dropout mask
        # as^2b 32 and output 2as^2b 64.
        (1, False, "none", True, True, 1_024 + 64 + 160),  # sbh(34 + 5as/h) = 32 x 39 = 1,248
        (1, False, "none", False, False, 1_024 + 64),  # sbh(32 + 2as/h) = 32 x 34 = 1,088
        (1, False, "none", True, False, 1_024 + 64 + 64),  # sbh(34 + 2as/h) = 1,152
        (1, False, "none", False, True, 1_024 + 160),  # sbh(32 + 5as/h) = 1,184
        (2, True, "none", False, False, 544),  # sbh/t (32 + 2as/h) = 16 x 34
        (2, False, "none", False, False, 672),  # sbh(8 + 24/t + 2as/(ht)) = 32 x (8 + 12 + 1)
        (2, False, "selective", False, False, 640),  # sbh(8 + 24/t) = 32 x 20
        (2, True, "full", False, False, 32),  # 2sbh/t: the layer input, no mask in it
    ],
)
def test_dropout_masks_only_at_a_rate_above_zero(t, sp, recompute, hidden, attn, expected):
    drop = {"hidden_dropout": hidden, "attention_dropout": attn}
    assert korthikanti_layer_bytes(4, 1, 8, 2, t, sp, recompute, **drop) == expected
    assert layer_activation_bytes(GPT_TINY, 4, 1, t, sp, recompute, flash=False, **drop) == expected


def test_spec_dropout_rates_reach_the_fit():
    # TINY (s 128, b 1, h 256, f 688, a 8, TP 2, FlashAttention, SwiGLU) under `dropout: false`: a layer loses
    # its two masks (2sbh = 65,536): 8sbh 262,144 + (8sbh 262,144 + 6sbf 528,384 + 4as 4,096) / 2 = 659,456;
    # stage 0 holds 2 micro-batches of 2 layers and no embedding mask: 4 x 659,456 = 2,637,824 (2,965,504
    # with dropout, test_gen_writes_memory_json_and_replay_reports_peak_per_rank).
    assert deployment_memory(load_spec({**TINY, "dropout": False}))[0].activations == 2_637_824
    # Unfused attention stores 5as^2b per layer at an attention-dropout rate above 0 (megatron-core's 0.1),
    # 2as^2b at 0: 3 x 8 x 128^2 / 2 (TP) = 196,608 less per layer, 4 layer-micro-batches on stage 0.
    unfused = {**TINY, "attention": "unfused"}
    with_p = deployment_memory(load_spec(unfused))[0].activations
    without = deployment_memory(load_spec({**unfused, "attention_dropout": 0.0}))[0].activations
    assert with_p - without == 4 * 196_608
    # FlashAttention regenerates its dropout mask from the RNG state: the rate changes nothing.
    assert deployment_memory(load_spec({**TINY, "attention_dropout": 0.0}))[0].activations == 2_965_504


def test_allocator_allowance_is_a_share_of_the_activations():
    # Default: 1 GiB workspace + 5% of the activations (Megatron-LM's theoretical_memory_usage.py factor):
    # rank 0 of TINY, 2,965,504 B of activations -> 1,073,741,824 + 148,275.
    r = deployment_memory(load_spec(TINY))[0]
    assert r.allowance == 1_073_741_824 + 148_275
    dep = load_spec({**TINY, "memory_fragmentation": 0.2})
    assert deployment_memory(dep)[0].allowance == 1_073_741_824 + 593_100  # int(0.2 x 2,965,504)
    assert spec_to_mapping(dep)["memory_fragmentation"] == 0.2  # round trip
    with pytest.raises(SpecError, match="memory_fragmentation must be a fraction 0 <= f < 1, got 1.5"):
        load_spec({**TINY, "memory_fragmentation": 1.5})


def test_megatron_llama3_8b_fp8_example_fits_80_gib():
    # examples/launch/megatron_llama3_8b_h100_fp8.yaml (Megatron-LM d98e8a64dd train_llama3_8b_h100_fp8.sh,
    # TP 1, no recompute, hidden and attention dropout 0, TE FP8 with FP8 parameters, DP 8). s 8192, h 4096,
    # q 4096, kv 1024, f 14336, a 32; sbh = 33,554,432. A layer: not split 6sbh (norm inputs 4sbh, the two
    # ln_out in FP8 2sbh; no dropout masks) 201,326,592 + Q 2sbh 67,108,864 + K, V sbh 33,554,432 + attention
    # output and its FP8 copy 3sbh 100,663,296 + SwiGLU gate/up 4sbf and FP8 product sbf 587,202,560 + LSE
    # 4as 1,048,576 = 990,904,320; x 32 layers, + last stage 4sbh 134,217,728 + Megatron's loss (the FP32
    # logits beside the BF16 logits or gradient) 6sv 6,304,038,912 = 38,147,194,880 B (35.53 GiB).
    # Allowance 1 GiB + 5% of that. Total 85,297,359,872 B = 79.44 GiB of the catalog's 80.
    dep = load_spec(REPO / "examples" / "launch" / "megatron_llama3_8b_h100_fp8.yaml")
    r = deployment_memory(dep)[0]
    assert r.activations == 32 * 990_904_320 + 134_217_728 + 6_304_038_912 == 38_147_194_880
    assert r.allowance == 1_073_741_824 + 1_907_359_744
    assert r.total == 85_297_359_872 and r.headroom > 0


def test_the_loss_peak_follows_the_framework_loss():
    # One stage of TINY (s 128, b 1, vocabulary 1,000, BF16), LOSS_PEAK_BYTES per logit: Megatron's 4 + 2 = 6
    # (the default), eager F.cross_entropy 12 (log_softmax's saved FP32 output, nll_loss's dense FP32 gradient
    # and log_softmax's FP32 input gradient live at once), TE's and apex's in-place 16-bit losses 2.
    sv = 128 * 1_000
    assert _one_stage(loss="eager") - _one_stage() == (12 - 6) * sv
    assert _one_stage(loss="te") - _one_stage() == _one_stage(loss="fused") - _one_stage() == (2 - 6) * sv
    # The spec's framework decides it: torchtitan's is eager, and its model has no dropout.
    o = _options_of(load_spec({**TINY, "framework": "torchtitan"}))
    assert (o.loss, o.hidden_dropout, o.attention_dropout) == ("eager", False, False)
    assert _options_of(load_spec({**TINY, "loss_impl": "te"})).loss == "te"
