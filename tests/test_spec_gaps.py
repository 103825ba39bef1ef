"""Issue 22's spec gaps, pinned by hand: Megatron's vocabulary padding (`make_vocab_size_divisible_by`),
BLOOM's embedding LayerNorm (`embedding_norm`) and Transformer Engine's FP8 memory (tracegen/memory.py)."""

from __future__ import annotations

import pytest
from xsim.tracegen import load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.frameworks import FRAMEWORKS
from xsim.tracegen.memory import deployment_memory, layer_activation_bytes
from xsim.tracegen.models import model_from_mapping
from xsim.tracegen.ops import (
    Ctx,
    Op,
    embedding_rank_params,
    embedding_steps,
    head_steps,
    param_tensors,
    shard_of,
)
from xsim.tracegen.spec import model_arch, spec_to_mapping

# GPT-style tiny model (GELU MLP 4h, LayerNorm with bias, biases, learned positions, tied): h 64, 4 heads,
# s 16. Per layer 12 h^2 + 13 h = 49,984 parameters; final LayerNorm 2h = 128; position table 16 x 64 = 1,024.
GPT = {"name": "gpt-tiny", "layers": 2, "hidden": 64, "ffn_hidden": 256, "heads": 4, "vocab": 1000,
       "seq_len": 16, "activation": "gelu", "norm": "layernorm", "linear_bias": True}  # fmt: skip
LLAMA = {**GPT, "name": "llama-tiny", "activation": "swiglu", "norm": "rmsnorm", "linear_bias": False}


def _spec(model: object, tp: int = 1, gpu: str = "A100-80GB", **keys: object) -> dict:
    return {"model": model, "parallel": {"gpu": gpu, "tp": tp, "dp": 1}, **keys}


# -- make_vocab_size_divisible_by --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "tp", "keys", "vocab"),
    [
        # Megatron-Core (the default profile): 128 x TP 4 = 512; 32,000 / 512 = 62.5 -> 63 x 512 = 32,256.
        ("llama2-70b", 4, {}, 32_256),
        # torchtitan builds its embedding on the tokenizer's size: no padding.
        ("llama2-70b", 4, {"framework": "torchtitan"}, 32_000),
        # The key overrides the profile: 0 = as given; 1 x TP 4 = 4 divides 32,000; 128 under torchtitan pads.
        ("llama2-70b", 4, {"make_vocab_size_divisible_by": 0}, 32_000),
        ("llama2-70b", 4, {"make_vocab_size_divisible_by": 1}, 32_000),
        ("llama2-70b", 4, {"framework": "torchtitan", "make_vocab_size_divisible_by": 128}, 32_256),
        # GPT-2's 50,257: 128 x TP 1 -> 393 x 128 = 50,304 (megatron-2021); 128 x TP 8 = 1,024 -> 50 x 1,024
        # = 51,200 (Narayanan et al.'s V) under megatron-2021 and megatron-deepspeed alike.
        ("gpt3-175b", 1, {"framework": "megatron-2021"}, 50_304),
        ("gpt3-175b", 8, {"framework": "megatron-2021"}, 51_200),
        ("gpt3-175b", 8, {"framework": "megatron-deepspeed"}, 51_200),
        # An already padded vocabulary is not padded twice: 50,688 = 99 x 512 at TP 4; 51,200 = 50 x 1,024.
        ({**GPT, "vocab": 50_688}, 4, {}, 50_688),
        ({**GPT, "vocab": 51_200}, 4, {"framework": "megatron-2021"}, 51_200),
    ],
)
def test_vocabulary_padded_as_the_framework_pads_it_by_hand(model, tp, keys, vocab):
    dep = load_spec(_spec(model, tp, **keys))
    assert model_arch(dep).vocab == vocab
    # The spec keeps the vocabulary as given and the key only when set (deployment.json round trip).
    mapping = spec_to_mapping(dep)
    assert mapping.get("make_vocab_size_divisible_by") == keys.get("make_vocab_size_divisible_by")
    assert model_arch(load_spec(mapping)).vocab == vocab


def test_padded_vocabulary_reaches_embedding_head_loss_and_memory_by_hand():
    # GPT-tiny, vocabulary 1,000, TP 2, Megatron-Core: 128 x 2 = 256 -> 4 x 256 = 1,024 rows, 512 per rank.
    padded = load_spec(_spec(GPT, 2))
    given = load_spec(_spec(GPT, 2, make_vocab_size_divisible_by=0))
    m = model_arch(padded)
    sh = shard_of(m, 2, 0)
    assert (m.vocab, sh.vocab) == (1_024, 512)
    # Embedding shard 512 x 64 = 32,768 + the whole position table 1,024.
    assert embedding_rank_params(m, sh) == 33_792
    # LM head GEMM (tokens x h x vocab/TP) and the loss on the padded logits: micro-batch 2 x 16 = 32 tokens.
    c = Ctx(m, sh, 2, 16, 2, False)
    ops = {s.op: s for s in head_steps(c, "fwd") if isinstance(s, Op)}
    assert ops["lm_head"].shape == (32, 64, 512)
    assert ops["loss"].shape == (32, 512)
    # Memory: 24 more rows x 64 = 1,536 parameters over the 2 TP ranks, 768 each (tied: one matrix);
    # Megatron's loss, 4 + 2 B per logit (memory.LOSS_PEAK_BYTES) x 16 tokens x 24 rows / TP 2 = 1,152 B more
    # activations on the last (only) stage.
    a, b = deployment_memory(padded)[0], deployment_memory(given)[0]
    assert a.params - b.params == 768
    assert a.activations - b.activations == 1_152


@pytest.mark.parametrize("bad", [-1, "128", 1.5, True, 1 << 21])
def test_padding_key_is_checked(bad):
    with pytest.raises(SpecError, match="make_vocab_size_divisible_by"):
        load_spec(_spec(GPT, make_vocab_size_divisible_by=bad))


# -- embedding_norm (Megatron-DeepSpeed --embed-layernorm) ---------------------------------------------------


def test_embedding_layernorm_by_hand():
    # GPT-tiny with vocabulary 128 (a multiple of 128 x TP 1: no padding), megatron-deepspeed.
    model = {**GPT, "vocab": 128, "embedding_norm": True}
    dep = load_spec(_spec(model, framework="megatron-deepspeed"))
    m = model_arch(dep)
    assert m.embedding_norm and spec_to_mapping(dep)["model"]["embedding_norm"] is True
    assert dep.model.embedding_norm  # ModelSpec field 15
    sh = shard_of(m, 1, 0)
    # Parameters: embedding 128 x 64 = 8,192 + position table 1,024 + LayerNorm gain and bias 2 x 64 = 128;
    # two more tensors on the first stage (word table, position table, gain, bias: 4).
    assert embedding_rank_params(m, sh) == 9_344
    assert param_tensors(m, 0, True, False) == 4
    no_norm = model_from_mapping({**GPT, "vocab": 128})
    assert m.total_params() - no_norm.total_params() == 128
    # Micro-batch 2 x 16 tokens x h 64 = 2,048 elements, BF16. Forward after the embedding (its TP
    # collective) and before the position add and dropout: LayerNorm 7 FLOPs per element, read + write
    # 2 x 2,048 x 2 B = 8,192 B; backward 2 x 7 x 2,048 = 28,672 FLOPs, read gradient and input, write
    # the input gradient: 3 x 2,048 x 2 B = 12,288 B.
    c = Ctx(m, sh, 2, 16, 2, False, fw=FRAMEWORKS["megatron-deepspeed"])
    fwd = [s.op for s in embedding_steps(c, "fwd")]
    assert fwd == ["embedding", "embedding_norm", "position_embedding", "embedding_dropout"]
    bwd = [s.op for s in embedding_steps(c, "bwd")]
    assert bwd == ["embedding_dropout", "embedding_norm", "position_embedding", "embedding"]
    norm = {
        s.phase: s for s in embedding_steps(c, "fwd") + embedding_steps(c, "bwd") if s.op == "embedding_norm"
    }
    assert (norm["fwd"].flops, norm["fwd"].bytes, norm["fwd"].shape) == (14_336, 8_192, (2_048,))
    assert (norm["bwd"].flops, norm["bwd"].bytes) == (28_672, 12_288)
    # Memory: the LayerNorm's saved input (16 x 64 x 2 B = 2,048) and FP32 mean and rstd (16 x 8 = 128 B)
    # per micro-batch in flight (one here), 2,176 B; 128 more parameters.
    a = deployment_memory(dep)[0]
    b = deployment_memory(load_spec(_spec({**GPT, "vocab": 128}, framework="megatron-deepspeed")))[0]
    assert (a.params - b.params, a.activations - b.activations) == (128, 2_176)


def test_embedding_layernorm_runs_on_the_all_reduced_output_under_tp():
    # TP 2 without SP: Megatron-DeepSpeed norms the all-reduced output, all 32 tokens on every TP rank.
    m = model_from_mapping({**GPT, "vocab": 128, "embedding_norm": True})
    c = Ctx(m, shard_of(m, 2, 0), 2, 16, 2, False, fw=FRAMEWORKS["megatron-deepspeed"])
    steps = embedding_steps(c, "fwd")
    assert [s.op for s in steps][:3] == ["embedding", "embedding_tp_out", "embedding_norm"]
    assert next(s for s in steps if s.op == "embedding_norm").shape == (32 * 64,)


# -- Transformer Engine FP8 memory ------------------------------------------------------------------------


def test_te_fp8_layer_activations_by_hand():
    # One GPT layer, s 16, b 1, h 64, 4 heads (q width 64), FFN 256, TP 1, flash attention: sbh = 1,024.
    # BF16 (Korthikanti): replicated 10 sbh = 10,240 (two norm inputs 4, QKV input 2, MLP input 2, two
    # dropout masks 2); Q 2 sbh, K and V 4 sbh, projection input 2 sbh, GELU MLP 4 sbf = 16,384, LSE 4 B x
    # 4 heads x 16 = 256: 2,048 + 4,096 + 2,048 + 16,384 + 256 = 24,832; 35,072 in all.
    # TE FP8: the LayerNormLinears' ln_out (QKV and MLP inputs) in FP8 (-1,024 each), fc2's input in FP8
    # (-sbf = -4,096), the projection's FP8 copy of its input beside the BF16 attention output (+1,024):
    # 35,072 - 5,120 = 29,952.
    m = model_from_mapping(GPT)
    assert layer_activation_bytes(m, 16, 1, flash=True) == 35_072
    assert layer_activation_bytes(m, 16, 1, flash=True, fp8=True) == 29_952
    # SwiGLU: gate and up outputs and their product 6 sbf = 24,576; FP8 keeps the product in FP8 (5 sbf).
    s = model_from_mapping(LLAMA)
    assert (
        layer_activation_bytes(s, 16, 1, flash=True) - layer_activation_bytes(s, 16, 1, flash=True, fp8=True)
        == 5_120
    )
    # Full recompute keeps the BF16 layer input only, as before.
    assert layer_activation_bytes(s, 16, 1, recompute="full", fp8=True) == 2_048


@pytest.mark.parametrize(("recipe", "meta"), [("delayed", 164_160), ("current", 320)])
def test_te_fp8_memory_fit_by_hand(recipe, meta):
    # Llama-tiny (SwiGLU, no biases), 2 layers, TP 1, one micro-batch, H100, Megatron-Core + TE, vocabulary
    # 1,024 (no padding). FP8 linear weights per layer: QKV 64 x 192 = 12,288, projection 4,096, up/gate
    # 64 x 512 = 32,768, down 16,384 = 65,536; 2 layers 131,072, each cached as an FP8 copy and its FP8
    # transpose: 262,144 B. Scaling state: 4 modules x 2 layers x 5 FP8 tensors x 4 B x (amax history
    # 1,024 + scale + scale_inv) = 164,160 B delayed; current scaling keeps no history: 8 x 5 x 4 x 2 = 320.
    # Activations: 5,120 B less per layer (test above), 10,240 for the two.
    model = {**LLAMA, "vocab": 1024}
    keys = {"fp8_recipe": recipe} if recipe != "delayed" else {}
    fp8 = deployment_memory(load_spec(_spec(model, gpu="H100", precision="fp8", **keys)))[0]
    bf16 = deployment_memory(load_spec(_spec(model, gpu="H100", precision="bf16")))[0]
    assert fp8.params == bf16.params
    assert fp8.weights - bf16.weights == 262_144 + meta
    assert bf16.activations - fp8.activations == 10_240
    assert (fp8.gradients, fp8.optimizer) == (bf16.gradients, bf16.optimizer)


def test_vocabulary_padding_with_groups_of_different_tp_by_hand():
    # Two pipeline stages at TP 2 and TP 3 (12 heads): Megatron has one TP; xsim pads to a multiple of
    # 128 x lcm(2, 3) = 768 so both groups split the padded rows evenly: 1,000 -> 2 x 768 = 1,536
    # (768 rows a rank at TP 2, 512 at TP 3).
    model = {**GPT, "hidden": 96, "heads": 12}
    groups = [
        {"gpu": "A100-80GB", "ranks": [0, 1], "tp": 2, "layers": [1, 1], "pp_stage": 0},
        {"gpu": "A100-80GB", "ranks": [2, 3, 4], "tp": 3, "layers": [2, 2], "pp_stage": 1},
    ]
    dep = load_spec({"model": model, "micro_batches": 1, "device_groups": groups})
    m = model_arch(dep)
    assert (m.vocab, shard_of(m, 2, 0).vocab, shard_of(m, 3, 0).vocab) == (1_536, 768, 512)
