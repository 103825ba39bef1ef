"""Attention-probability dropout inside fused attention kernels (tracegen.attention.dropout_ratio, the
`attention_dropout` spec key): the published dropout / no-dropout time ratio on the timed kernel."""

from __future__ import annotations

from dataclasses import replace

import pytest
from xsim.tracegen import catalog, generate, load_spec
from xsim.tracegen.attention import dropout_points, dropout_ratio
from xsim.tracegen.errors import SpecError
from xsim.tracegen.frameworks import FRAMEWORKS
from xsim.tracegen.models import model_from_mapping, preset
from xsim.tracegen.ops import Ctx, Op, attn_core_recompute, duration_ns, layer_steps, op_seconds, shard_of
from xsim.tracegen.spec import spec_to_mapping
from xsim.traces import attrs as A

A100, H100, H200 = catalog.gpu("A100-80GB"), catalog.gpu("H100"), catalog.gpu("H200")
HOPPER_SUSTAINED = 708.5 / 841.9  # as tests/test_gen_attention.py: H200 MSMF / MAMF BF16

# One layer, 8 heads of 64, s 1024, micro-batch 1, FlashAttention v1 on the A100 (as the tiny node of
# tests/test_gen_attention.py).
TINY = {
    "model": {"base": "llama2-7b", "layers": 1, "hidden": 512, "heads": 8, "kv_heads": 8, "ffn_hidden": 1408},
    "seq_len": 1024,
    "attention_kernel": "fa1",
    "device_groups": [{"gpu": "A100-80GB", "ranks": [0]}],
}


def _durations(spec: dict) -> dict[str, int]:
    nodes = generate(load_spec(spec), rewrite=False).nodes[0]
    return {n.name: A.get_int(n, A.DURATION_NS) for n in nodes}


def _core(framework: str, phase: str, rate: float | None = None, s: int = 4096) -> Op:
    m = preset("llama2-7b")
    fw = FRAMEWORKS[framework]
    fw = fw if rate is None else replace(fw, attention_dropout=rate)
    c = Ctx(m, shard_of(m, 1, 0), 1, s, 2, False, "bf16", "flash", fw)
    return next(o for o in layer_steps(c, phase) if isinstance(o, Op) and o.op == "attn_core")


def test_rows_name_their_sources():
    points = dropout_points()
    assert points and all(p.source and p.ms_dropout > p.ms_plain > 0 for p in points)
    assert {(p.gpu, p.kernel) for p in points} == {("A100-80GB", "fa1"), ("H100", "cudnn")}


def test_ratios_by_hand():
    # FlashAttention paper, appendix E.5, A100: Table 15 / Table 18 forward, Table 16 / Table 19 backward.
    assert dropout_ratio("A100-80GB", "fa1", "fwd", 1024, 64) == pytest.approx(0.83 / 0.68)  # 1.220588
    assert dropout_ratio("A100-80GB", "fa1", "bwd", 1024, 64) == pytest.approx(1.86 / 1.62)  # 1.148148
    assert dropout_ratio("A100-80GB", "fa1", "bwd", 4096, 64) == pytest.approx(26.21 / 21.57)  # 1.215114
    # Held below 1k and beyond 64k; the A100 40GB reads the 80GB's rows; head dim 128 -> the recorded 64.
    assert dropout_ratio("A100-40GB", "fa1", "fwd", 512, 128) == pytest.approx(0.83 / 0.68)
    assert dropout_ratio("A100-80GB", "fa1", "fwd", 131072, 64) == pytest.approx(
        2678.11 / 2147.05
    )  # 1.247344
    # Linear in log2 s: s = 2^11.5 ~ 2896 lies halfway between 2048 (1.170833) and 4096 (1.232779): 1.201806.
    assert dropout_ratio("A100-80GB", "fa1", "fwd", 2896, 64) == pytest.approx(1.201806, rel=2e-4)
    # cuDNN on Hopper: one forward + backward point (TE issue 3312, H200): 0.614 / 0.594 = 1.033670 for
    # each pass, at every length; the H200 reads the H100's rows.
    for gpu, phase, s in (("H100", "fwd", 2048), ("H100", "bwd", 8192), ("H200", "fwd", 4096)):
        assert dropout_ratio(gpu, "cudnn", phase, s, 128) == pytest.approx(0.614 / 0.594)
    # No published measurement: FlashAttention-2 on the A100, FA3 (no dropout at all), Triton: 1.0.
    assert dropout_ratio("A100-80GB", "fa2", "fwd", 8192, 128) == 1.0
    assert dropout_ratio("H100", "fa3", "bwd", 4096, 128) == 1.0
    assert dropout_ratio("A100-80GB", "triton", "fwd", 2048, 128) == 1.0


def test_tiny_fa1_layer_with_and_without_dropout_by_hand():
    # Without dropout (tests/test_gen_attention.py): forward 1,073,741,824 causal FLOPs at 77.937 TFLOP/s x
    # 1305/1410 = 14,885.6 ns; backward 2.5x the FLOPs at 67.260 TFLOP/s x 1305/1410 = 43,121.1 ns.
    off = _durations({**TINY, "attention_dropout": 0.0})
    assert off["L1.attn_core.fwd.mb0"] == pytest.approx(14_886, abs=1)
    assert off["L1.attn_core.bwd.mb0"] == pytest.approx(43_121, abs=1)
    # With p = 0.1: x 0.83 / 0.68 forward = 18,169.2 ns, x 1.86 / 1.62 backward = 49,509.4 ns.
    on = _durations({**TINY, "attention_dropout": 0.1})
    assert on["L1.attn_core.fwd.mb0"] == pytest.approx(18_169, abs=1)
    assert on["L1.attn_core.bwd.mb0"] == pytest.approx(49_509, abs=1)
    # The key absent: megatron-core's default rate, 0.1 (Megatron-Core TransformerConfig.attention_dropout).
    assert _durations(TINY)["L1.attn_core.fwd.mb0"] == on["L1.attn_core.fwd.mb0"]
    # Nothing but the attention kernel changes.
    assert {k: v for k, v in on.items() if "attn_core" not in k} == {
        k: v for k, v in off.items() if "attn_core" not in k
    }


def test_llama2_7b_layer_on_h100_cudnn_by_hand():
    # Without dropout (tests/test_gen_attention.py): 137,438,953,472 FLOPs at 518 TFLOP/s x the Hopper
    # sustained ratio = 315.28 us forward; with p = 0.1 x 1.033670 = 325.90 us.
    plain = 137_438_953_472 / (518e12 * HOPPER_SUSTAINED)
    assert op_seconds(_core("megatron-core", "fwd", 0.0), H100, "calibrated") == pytest.approx(plain)
    t = op_seconds(_core("megatron-core", "fwd"), H100, "calibrated")
    assert t == pytest.approx(plain * 0.614 / 0.594) == pytest.approx(325.90e-6, rel=1e-4)
    # FlashAttention-2 on the A100 has no published dropout ratio: the same time either way.
    a100 = [op_seconds(_core("megatron-core", "bwd", p), A100, "calibrated") for p in (0.0, 0.1)]
    assert a100[0] == a100[1]


def test_profiles_and_unfused_attention():
    assert FRAMEWORKS["megatron-core"].attention_dropout == 0.1
    assert FRAMEWORKS["megatron-2022"].attention_dropout == 0.1
    assert FRAMEWORKS["torchtitan"].attention_dropout == 0.0  # no dropout in the model
    assert FRAMEWORKS["internlm"].attention_dropout == 0.0  # drop rates 0
    assert not _core("torchtitan", "fwd").dropout and _core("megatron-core", "fwd").dropout


# Unfused attention (Megatron-LM's CoreAttention): one layer, micro-batch 1, s 2048, 8 heads of 64, fp16,
# megatron-2021 (as tests/test_unfused_attention.py's hand-timed layer). S = 8 x 2048^2 = 33,554,432 scores.
UNFUSED = ("attn_scores", "attn_softmax", "attn_dropout", "attn_context", "attn_context_permute")


def _unfused(rate: float, phase: str) -> list[Op]:
    m = model_from_mapping({"name": "attn", "layers": 1, "hidden": 512, "ffn_hidden": 2048, "heads": 8,
                            "kv_heads": 8, "vocab": 128, "seq_len": 2048})  # fmt: skip
    fw = replace(FRAMEWORKS["megatron-2021"], attention_dropout=rate)
    c = Ctx(m, shard_of(m, 1, 0), 1, 2048, 2, False, "fp16", "unfused", fw)
    steps = attn_core_recompute(c) if phase == "recompute" else layer_steps(c, phase)
    return [o for o in steps if isinstance(o, Op) and o.op in UNFUSED]


def test_unfused_attention_dropout_only_at_a_positive_rate_by_hand():
    s_ = 8 * 2048 * 2048  # 33,554,432 scores
    on = {ph: _unfused(0.1, ph) for ph in ("fwd", "bwd", "recompute")}
    off = {ph: _unfused(0.0, ph) for ph in ("fwd", "bwd", "recompute")}
    assert [o.op for o in on["fwd"]] == list(UNFUSED)
    assert [o.op for o in on["bwd"]] == ["attn_context", "attn_dropout", "attn_softmax", "attn_scores"]
    assert [o.op for o in on["recompute"]] == list(UNFUSED)  # selective recompute repeats the forward core
    # p = 0: F.dropout returns its input, no kernel forward, backward or recomputed.
    assert [o.op for o in off["fwd"]] == [n for n in UNFUSED if n != "attn_dropout"]
    assert [o.op for o in off["bwd"]] == ["attn_context", "attn_softmax", "attn_scores"]
    assert [o.op for o in off["recompute"]] == [o.op for o in off["fwd"]]
    # The dropout op at 0.1: forward 2 FLOPs a score (2S = 67,108,864), backward 4S = 134,217,728; bytes read
    # 2, write 2 and a 1-byte mask a score, 5S = 167,772,160 each way; on the A100 80GB (tests/
    # test_unfused_attention.py, by hand) 106,073 ns forward at 0.868892 x 1,820.33 GB/s, 92,166 ns backward.
    drop = {ph: next(o for o in on[ph] if o.op == "attn_dropout") for ph in ("fwd", "bwd")}
    assert (drop["fwd"].flops, drop["fwd"].bytes) == (2 * s_, 5 * s_) == (67_108_864, 167_772_160)
    assert (drop["bwd"].flops, drop["bwd"].bytes) == (4 * s_, 5 * s_)
    assert duration_ns(drop["fwd"], A100, None, "calibrated") == 106_073
    assert duration_ns(drop["bwd"], A100, None, "calibrated") == 92_166
    # Every other op is the same at both rates: the layer's attention bytes fall by exactly 5S a pass.
    for ph in ("fwd", "bwd", "recompute"):
        assert [o for o in on[ph] if o.op != "attn_dropout"] == off[ph]
    assert sum(o.bytes for o in on["fwd"]) - sum(o.bytes for o in off["fwd"]) == 167_772_160


def test_hidden_and_attention_dropout_are_independent_keys():
    # One megatron-2022 layer with unfused attention and selective recompute: `attention_dropout` alone
    # decides the attn_dropout nodes (forward, recompute, backward), `dropout` alone the hidden-dropout ones
    # (embedding dropout, bias-dropout-add's backward), as Megatron's --attention-dropout and --hidden-dropout.
    spec = {**TINY, "framework": "megatron-2022", "attention": "unfused", "recompute": "selective"}
    spec.pop("attention_kernel")
    names = {}
    for p in (0.1, 0.0):
        for d in (True, False):
            dep = load_spec({**spec, "attention_dropout": p, "dropout": d})
            nodes = generate(dep, rewrite=False).nodes[0]
            names[p, d] = {n.name: A.get_int(n, A.DURATION_NS) for n in nodes}
    attn = {"L1.attn_dropout.fwd.mb0", "L1.attn_dropout.recompute.mb0", "L1.attn_dropout.bwd.mb0"}
    hidden = {"embedding_dropout.fwd.mb0", "embedding_dropout.bwd.mb0", "L1.attn_bias_dropout_add.bwd.mb0",
              "L1.mlp_bias_dropout_add.bwd.mb0"}  # fmt: skip
    # (The host's dispatch nodes, `host:*`, shorten with the kernels they launch; the device nodes do not.)
    dev = {k: {n: t for n, t in v.items() if not n.startswith("host:")} for k, v in names.items()}
    for d in (True, False):
        assert set(names[0.1, d]) - set(names[0.0, d]) == attn
        assert {k: v for k, v in dev[0.1, d].items() if k not in attn} == dev[0.0, d]
        assert names[0.0, d]["host:read"] < names[0.1, d]["host:read"]
    for p in (0.1, 0.0):
        assert set(names[p, True]) - set(names[p, False]) == hidden
        assert not set(names[p, False]) - set(names[p, True])
        assert {k: names[p, True][k] for k in names[p, True] if "attn_dropout" in k} == {
            k: v for k, v in names[p, False].items() if "attn_dropout" in k
        }


def test_spec_key():
    dep = load_spec({**TINY, "attention_dropout": 0})
    assert dep.HasField("attention_dropout") and dep.attention_dropout == 0.0
    assert spec_to_mapping(dep)["attention_dropout"] == 0.0
    assert "attention_dropout" not in spec_to_mapping(load_spec(TINY))
    for bad in (1.0, -0.1, True, "0.1"):
        with pytest.raises(SpecError, match="attention_dropout must be a rate"):
            load_spec({**TINY, "attention_dropout": bad})
