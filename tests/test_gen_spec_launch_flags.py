"""Spec values as launch scripts spell them (Megatron's --attention-backend) and the GPipe memory hint."""

from __future__ import annotations

import pytest
from xsim.tracegen.catalog import GIB
from xsim.tracegen.errors import SpecError
from xsim.tracegen.memory import OutOfMemory, RankMemory, check_fits, deployment_memory, shortfall
from xsim.tracegen.spec import load_spec, spec_to_mapping

# Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh (d98e8a64dd) on one DGX H100, 16 micro-batches.
LLAMA3_8B = {
    "name": "llama3_8b",
    "model": {
        "base": "llama2-7b",
        "hidden": 4096,
        "ffn_hidden": 14336,
        "heads": 32,
        "kv_heads": 8,
        "vocab": 128256,
        "seq_len": 8192,
    },
    "parallel": {"gpu": "H100", "dp": 8, "micro_batch": 1, "global_batch": 128},
}


@pytest.mark.parametrize("value", ["fused", "Fused", "cudnn"])
def test_megatron_fused_backend_is_te_cudnn_attention(value):
    dep = load_spec({**LLAMA3_8B, "attention_kernel": value})
    assert dep.attention_kernel == "cudnn"
    assert spec_to_mapping(dep)["attention_kernel"] == "cudnn"


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("local", "attention-backend local, the unfused attention: write attention: unfused"),
        ("unfused", "attention-backend unfused, the unfused attention: write attention: unfused"),
        ("flash", "FlashAttention 2 or 3 by what Transformer Engine finds installed: write fa2 or fa3"),
        ("xformers", "attention_kernel must be one of auto, fa2, fa1, fa3, cudnn, triton, got 'xformers'"),
    ],
)
def test_other_backend_names_say_what_to_write(value, fragment):
    with pytest.raises(SpecError, match=fragment):
        load_spec({**LLAMA3_8B, "attention_kernel": value})


def test_gpipe_holds_every_micro_batch_and_the_oom_line_says_so():
    gpipe = load_spec(LLAMA3_8B)  # schedule defaults to gpipe
    one_f_one_b = load_spec({**LLAMA3_8B, "schedule": "1f1b"})
    [g], [f] = deployment_memory(gpipe)[:1], deployment_memory(one_f_one_b)[:1]
    # One stage: GPipe runs 128 / (1 x 8) = 16 forwards before the first backward, 1F1B (Megatron's
    # forward_backward_no_pipelining) one: GPipe holds 15 micro-batches' stored activations more (the
    # transient of the micro-batch in backward is common to both); everything else is the same.
    extra, rest = divmod(g.activations - f.activations, 15)
    assert rest == 0 and extra > 0.85 * f.activations
    assert (g.weights, g.gradients, g.optimizer) == (f.weights, f.gradients, f.optimizer)
    with pytest.raises(OutOfMemory, match="schedule: gpipe holds all 16 micro-batches' activations") as exc:
        check_fits(deployment_memory(gpipe), "llama3_8b", gpipe)
    assert "schedule: 1f1b; --allow-oom to go on)" in str(exc.value)
    # 1F1B still misses 80 GiB here (90.4 GiB), but the line carries no schedule hint.
    with pytest.raises(OutOfMemory) as exc:
        check_fits(deployment_memory(one_f_one_b), "llama3_8b", one_f_one_b)
    assert "gpipe" not in str(exc.value)


def _rank(activations: int, capacity: int = 80 * GIB) -> RankMemory:
    return RankMemory(0, 0, "H100", 0, 2, 0, 11 * GIB, 22 * GIB, GIB, activations, 8 * GIB, capacity)


def test_a_miss_that_rounds_to_the_capacity_says_by_how_much():
    # NeMo's Llama 3.1 405B recipe (TP 8, PP 9, VP 7, CP 2) missed 80 GiB by 17,878,747 B and read
    # "needs 80.0 GiB ... but has 80.0 GiB". 11 + 22 + 1 + 8 = 42 GiB besides activations.
    short = 17_878_747
    line = shortfall([_rank(38 * GIB + short)])
    assert line is not None and "needs 80.0 GiB" in line
    assert line.endswith(f"but has 80.0 GiB, {short / 2**20:.1f} MiB short (1 rank over")
    assert "17.1 MiB short" in line
    # A miss that shows in the GiB figures keeps the short line.
    line = shortfall([_rank(39 * GIB)])
    assert line is not None and line.endswith(
        "needs 81.0 GiB (weights 11.0, gradients 22.0, optimizer 1.0, "
        "activations 39.0, workspace 8.0) but has 80.0 GiB (1 rank over"
    )
    assert shortfall([_rank(38 * GIB)]) is None


def test_yaml_exponents_without_a_dot_or_sign_are_numbers(tmp_path):
    # torchtitan's Grand Teton H100 (96 GB HBM2e at 2.4 TB/s) as a user writes it: PyYAML alone loads
    # `2.4e12` as the string '2.4e12' (YAML 1.1), which the spec refused as "not a positive number".
    path = tmp_path / "gt.yaml"
    path.write_text(
        "model: llama2-7b\n"
        "parallel: {gpu: H100, dp: 2}\n"
        "gpus: {H100: {mem_bw: 2.4e12, peak_flops: 989.4E12, memory_bytes: 103079215104, gemm_eff: 7e-1}}\n"
    )
    [gpu] = load_spec(path).gpus
    assert (gpu.mem_bw, gpu.peak_flops, gpu.gemm_eff) == (2.4e12, 989.4e12, 0.7)
    # A quoted exponent stays a string (and is refused as one).
    path.write_text(path.read_text().replace("7e-1", '"7e-1"'))
    with pytest.raises(SpecError, match="gemm_eff must be a positive number, got '7e-1'"):
        load_spec(path)
