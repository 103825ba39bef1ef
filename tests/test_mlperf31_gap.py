"""MLPerf v3.1 vs v4.0 GPT-3 175B (issue 22, round v31gap): what each submission's Transformer Engine ran.

v3.1 (NVIDIA eos_n64_ngc23.09_nemo) installs flash-attn 2.0.8 over Transformer Engine 09ba84278a, whose
DotProductAttention.forward returns FlashAttention whenever flash-attn is usable; v4.0 (TE v1.6rc1) selects
cuDNN's FusedAttention on sm90 (TE 32db39288, 2023-12-07). The v3.1 row says `attention_kernel: fa2`. TE
09ba84278a also updates amax and scales in every FP8 module each micro-batch (`fp8_amax_update: module`),
where v1.6 runs one fused update per fp8_autocast region.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

# Hopper's sustained / burst BF16 tensor rate (tracegen.gemm.SUSTAINED_RATIOS: the H200's MSMF / MAMF).
HOPPER_SUSTAINED = 708.5 / 841.9


def _spec(run_id: str) -> dict:
    import validate_published as vp

    run = {r.id: r for r in vp.load_dataset().runs}[run_id]
    return dict(vp.spec_for(run))


def test_mlperf_rows_name_the_attention_kernel_their_code_ran():
    v31, v40 = _spec("mlperf31-gpt3-175b-512xh100"), _spec("mlperf40-gpt3-175b-512xh100")
    assert v31["attention_kernel"] == "fa2"
    assert "attention_kernel" not in v40  # megatron-core's own: cuDNN on Hopper
    assert v31["framework"] == v40["framework"] == "megatron-core"


def test_one_v31_attention_core_by_hand():
    from xsim.tracegen import generate, load_spec
    from xsim.traces import attrs as A

    # One layer of MLPerf GPT-3 175B as one TP-4 rank holds it: 96 / 4 = 24 heads of 128, s 2048, micro-batch
    # 1 (a TP-1 model of hidden 24 x 128 = 3,072 has the same attention core), H100, no attention dropout.
    spec = {"model": {"layers": 1, "hidden": 3072, "heads": 24, "ffn_hidden": 12288, "vocab": 50688,
                      "seq_len": 2048}, "seq_len": 2048, "framework": "megatron-core", "attention_dropout": 0,
            "device_groups": [{"gpu": "H100", "ranks": [0]}]}  # fmt: skip

    def core_ns(extra: dict) -> tuple[int, int]:
        nodes = generate(load_spec({**spec, **extra}), rewrite=False).nodes[0]
        by = {n.name: A.get_int(n, A.DURATION_NS) for n in nodes}
        return by["L1.attn_core.fwd.mb0"], by["L1.attn_core.bwd.mb0"]

    # FlashAttention 2 (fraction-of-peak rows): causal tiles of 128 x 128, n = 2048 / 128 = 16, 16 x 17 / 2 = 136
    # tiles of 4 x 128^2 x 128 = 8,388,608 FLOPs: 24 x 136 x 8,388,608 = 27,380,416,512 forward, 2.5x backward
    # = 68,451,041,280. Forward at 0.35 x 989.4 TFLOP/s x 0.841549: 93,955.2 ns; backward at 0.3342: 245,992.8 ns.
    fwd, bwd = core_ns({"attention_kernel": "fa2"})
    assert fwd == pytest.approx(27_380_416_512 / (0.35 * 989.4e12 * HOPPER_SUSTAINED) * 1e9, abs=1)
    assert bwd == pytest.approx(68_451_041_280 / (0.3342 * 989.4e12 * HOPPER_SUSTAINED) * 1e9, abs=1)
    assert (fwd, bwd) == (pytest.approx(93_955, abs=1), pytest.approx(245_993, abs=1))
    # cuDNN (megatron-core's default on Hopper), by length: causal FLOPs 4 x 2048^2 x 128 x 24 / 2 =
    # 25,769,803,776 forward at 484 TFLOP/s (FlashAttention-3 Figure 5d, 2k) x 0.841549: 63,268.3 ns; backward
    # 2.5x at 364.765 TFLOP/s (the non-causal backward at 2k times the forward's causal / non-causal 484 / 617):
    # 209,874.0 ns.
    cfwd, cbwd = core_ns({})
    assert cfwd == pytest.approx(25_769_803_776 / (484e12 * HOPPER_SUSTAINED) * 1e9, abs=1)
    assert (cfwd, cbwd) == (pytest.approx(63_268, abs=1), pytest.approx(209_874, abs=1))
    # Per layer and micro-batch FA2 costs 339,948 - 273,142 = 66,806 ns more; the v3.1 stage runs 12 layers x
    # 128 micro-batches: +102.6 ms a step (the replay: attention 420.5 -> 523.4 ms on rank 0).
    assert (fwd + bwd) - (cfwd + cbwd) == pytest.approx(66_806, abs=2)


def test_per_module_amax_update_of_te_before_1_6_by_hand():
    from xsim.tracegen import generate, load_spec
    from xsim.tracegen.errors import SpecError
    from xsim.tracegen.spec import spec_to_mapping
    from xsim.traces import attrs as A

    # One FP8 layer on one H100 (TP 1: no amax all-reduce), delayed scaling.
    spec = {"model": {"layers": 1, "hidden": 3072, "heads": 24, "ffn_hidden": 12288, "vocab": 50688,
                      "seq_len": 2048}, "seq_len": 2048, "framework": "megatron-core", "precision": "fp8",
            "compute_model": "calibrated", "device_groups": [{"gpu": "H100", "ranks": [0]}]}  # fmt: skip

    def update(extra: dict) -> dict[str, tuple[int, int]]:
        nodes = generate(load_spec({**spec, **extra}), rewrite=False).nodes[0]
        return {
            n.name: (A.get_int(n, A.DURATION_NS), A.get_int(n, A.TENSOR_SIZE))
            for n in nodes
            if "fp8_scale_update" in n.name
        }

    region, module = update({}), update({"fp8_amax_update": "module"})
    assert sorted(region) == sorted(module) and len(region) == 2  # forward and backward, once per chunk
    fwd = next(k for k in module if ".fwd." in k)
    bwd = next(k for k in module if ".bwd." in k)
    # Region (TE >= 1.6): one fused kernel, launch-bound: 3,800 ns. Forward tensors 3 x 4 GEMMs = 12: bytes
    # 12 x 4 x (1 + 2 x 1024 + 2) = 98,448.
    assert region[fwd] == (3_800, 98_448)
    # Module (TE 09ba84278a): 2 kernels x 3 modules = 6 launch floors = 22,800 ns; the copy of each reduced
    # amax back into its history adds 2 x 4 B a tensor: 98,448 + 96 = 98,544 B forward; backward 2 x 4 = 8
    # tensors: 8 x 4 x 2,051 + 64 = 65,696 B, also 6 kernels.
    assert module[fwd] == (22_800, 98_544)
    assert module[bwd] == (22_800, 65_696)
    # Per layer and micro-batch: 2 x (22,800 - 3,800) = 38,000 ns; the v3.1 stage's 12 layers x 128
    # micro-batches: +58.4 ms a step.
    dep = load_spec({**spec, "fp8_amax_update": "module"})
    assert dep.fp8_amax_update == "module" and load_spec(spec_to_mapping(dep)) == dep
    assert load_spec(spec).fp8_amax_update == ""
    with pytest.raises(SpecError, match="fp8_amax_update: module needs precision: fp8"):
        load_spec({**spec, "precision": "bf16", "fp8_amax_update": "module"})
    with pytest.raises(SpecError, match="fp8_amax_update must be one of"):
        load_spec({**spec, "fp8_amax_update": "layer"})


def test_v31_row_sets_the_per_module_update():
    assert _spec("mlperf31-gpt3-175b-512xh100")["fp8_amax_update"] == "module"
    assert "fp8_amax_update" not in _spec("mlperf40-gpt3-175b-512xh100")  # TE v1.6rc1: per region
