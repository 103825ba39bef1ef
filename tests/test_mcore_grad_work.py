"""Megatron-Core's gradient work outside the GEMMs (tracegen.frameworks: embedding_bwd, main_grad_hook,
bucket_scale, check_for_nan_in_grad): the word table's gradient and its main_grad add every micro-batch,
and each DP bucket's NaN-check norm and 1/DP scaling before its collective, bytes by hand."""

from __future__ import annotations

from xsim.tracegen import load_spec
from xsim.tracegen.frameworks import FRAMEWORKS
from xsim.tracegen.models import model_from_mapping
from xsim.tracegen.ops import Ctx, Op, embedding_steps, layer_steps, shard_of
from xsim.tracegen.workload import generate
from xsim.traces import attrs as A

# vocab 100, hidden 64, 16 tokens a micro-batch, RoPE (no position table).
LLAMA = {"name": "llama-tiny", "layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 4,
         "vocab": 100, "seq_len": 16, "activation": "swiglu", "norm": "rmsnorm", "linear_bias": False}  # fmt: skip


def _bwd(
    fw: str, tp: int = 1, grad_bytes: int = 4, tied_here: bool = False, seq: int = 4096, **model: object
) -> dict:
    m = model_from_mapping({**LLAMA, **model})
    c = Ctx(m, shard_of(m, tp, 0), 1, seq, 2, False, fw=FRAMEWORKS[fw], grad_bytes=grad_bytes)
    steps = embedding_steps(c, "bwd", tied_here)
    return {s.op: (s.bytes, s.kernels) for s in steps if isinstance(s, Op) and s.op.startswith("embedding")}


def test_core_r08_embedding_grad_by_hand() -> None:
    # megatron-core (F.embedding's dense backward), 4,096 tokens (> 3,072: the sorted path): zero fill of
    # the 100 x 64 table in bf16 (12,800 B); the 4,096 x 64 = 262,144 token-gradient elements: read 2, FP32
    # partials written 4 and read 4, rows written 2 = 12 B each (3,145,728 B, 2 kernels); main_grad add over
    # 6,400 parameters: read 4 + read 2 + write 4 = 10 B each (64,000 B); dropout of the embedding output:
    # read, write, mask = 5 B x 262,144 = 1,310,720 B.
    assert _bwd("megatron-core") == {
        "embedding_dropout": (1_310_720, 1), "embedding_grad_zero": (12_800, 1),
        "embedding": (3_145_728, 2), "embedding_main_grad_add": (64_000, 1),
    }  # fmt: skip
    # 16 tokens (<= 3,072): one feature kernel, read the gradient, read and write the row: 6 B x 1,024.
    assert _bwd("megatron-core", seq=16)["embedding"] == (6_144, 1)
    # A bf16 gradient buffer (grad_reduce_dtype bf16): the add reads 2 + 2, writes 2 (6 x 6,400 = 38,400 B).
    assert _bwd("megatron-core", grad_bytes=2)["embedding_main_grad_add"] == (38_400, 1)
    # TP 2: the rank's 50 x 64 shard: zero fill 6,400 B, add 10 x 3,200 = 32,000 B; the rows unchanged.
    tp2 = _bwd("megatron-core", tp=2)
    assert tp2["embedding_grad_zero"] == (6_400, 1) and tp2["embedding_main_grad_add"] == (32_000, 1)


def test_core_v06_embedding_grad_by_hand() -> None:
    # megatron-core-0.7 (`weight[masked_input]`: zeros_like + index_put_ accumulate): zero fill 12,800 B,
    # the scatter-add reads the gradient, reads and writes the row: 6 B x 262,144 = 1,572,864 B.
    bwd = _bwd("megatron-core-0.7")
    assert bwd["embedding_grad_zero"] == (12_800, 1) and bwd["embedding"] == (1_572_864, 1)
    assert bwd["embedding_main_grad_add"] == (64_000, 1)


def test_tied_output_layer_on_the_same_rank_by_hand() -> None:
    # zero_out_wgrad: the output layer's zeroed weight gradient (write 2 B) and autograd's sum with the
    # embedding's (read 2 + 2, write 2): 8 B x 6,400 = 51,200 B in 2 kernels, before the hook's add.
    bwd = _bwd("megatron-core", tied_here=True)
    assert bwd["embedding_tied_grad_sum"] == (51_200, 2) and bwd["embedding_main_grad_add"] == (64_000, 1)
    # A learned position table (16 x 64 = 1,024 parameters) is added by the hook too: 10 x 7,424 = 74,240 B.
    learned = _bwd("megatron-core", position_embedding="learned")
    assert learned["embedding_main_grad_add"] == (74_240, 1)


def test_other_profiles_keep_the_scatter_add_alone() -> None:
    assert _bwd("megatron-deepspeed", seq=16) == {"embedding_dropout": (5_120, 1), "embedding": (6_144, 1)}


DP2 = {
    "model": LLAMA,
    "parallel": {"gpu": "A100-80GB", "dp": 2},
    "precision": "bf16",
    "overlap_grad_reduce": False,
    "make_vocab_size_divisible_by": 0,  # the toy vocabulary of 100 as given (the counts below)
}


def _prep(spec: dict) -> dict[str, int]:
    nodes = generate(load_spec(spec)).nodes[0]
    return {
        n.name: A.get_int(n, A.TENSOR_SIZE)
        for n in nodes
        if n.name.startswith(("dp_grad_nan", "dp_grad_scale"))
    }


def test_bucket_nan_check_and_scaling_by_hand() -> None:
    # Parameters of the rank: per layer q, k, v, o 4 x 64 x 64 = 16,384, gate/up 64 x 256 = 16,384, down
    # 128 x 64 = 8,192, two norms 128: 41,088; two layers 82,176; embedding 6,400, output layer 6,400,
    # final norm 64: 95,040 in one bucket (overlap_grad_reduce off). FP32 buffer (bf16 training): the norm
    # reads 4 B each (380,160 B), the scaling reads and writes (760,320 B).
    assert _prep({**DP2, "framework": "megatron-core"}) == {
        "dp_grad_nan_check.bucket0": 380_160, "dp_grad_scale.bucket0": 760_320,
    }  # fmt: skip
    # NeMo's default: no NaN check; the scaling alone.
    assert _prep({**DP2, "framework": "megatron-core", "check_for_nan_in_grad": False}) == {
        "dp_grad_scale.bucket0": 760_320
    }
    # The distributed optimizer pads the bucket to a multiple of lcm(2, 128) = 128: 95,104 elements.
    assert _prep({**DP2, "framework": "megatron-core", "distributed_optimizer": True}) == {
        "dp_grad_nan_check.bucket0": 95_104 * 4, "dp_grad_scale.bucket0": 95_104 * 8,
    }  # fmt: skip


def test_bucket_scaling_at_dp1() -> None:
    one = {**DP2, "parallel": {"gpu": "A100-80GB", "dp": 1}}
    # core_r0.8.0 skips a factor of 1.0 but checks the norm; core_v0.6.0 scales by 1.0 too.
    assert _prep({**one, "framework": "megatron-core"}) == {"dp_grad_nan_check.bucket0": 380_160}
    assert _prep({**one, "framework": "megatron-core", "check_for_nan_in_grad": False}) == {}
    assert _prep({**one, "framework": "megatron-core-0.7"}) == {
        "dp_grad_nan_check.bucket0": 380_160, "dp_grad_scale.bucket0": 760_320,
    }  # fmt: skip


def test_qkv_split_cat_under_rope_by_hand() -> None:
    # GQA: 4 query heads, 2 KV heads of 16 (hidden 64), 16 tokens: q = 16 x 4 x 16 = 1,024 elements, kv =
    # 16 x 2 x 16 = 512; the cat reads and writes q + 2 kv = 2,048 elements of 2 B: 8,192 B, after RoPE's
    # backward, before the QKV projection's.
    m = model_from_mapping({**LLAMA, "kv_heads": 2})
    c = Ctx(m, shard_of(m, 1, 0), 1, 16, 2, False, fw=FRAMEWORKS["megatron-core"])
    ops = [s.op for s in layer_steps(c, "bwd") if isinstance(s, Op)]
    cat = next(s for s in layer_steps(c, "bwd") if isinstance(s, Op) and s.op == "qkv_grad_cat")
    assert (cat.bytes, cat.kernels) == (8_192, 1)
    assert ops.index("rope") + 1 == ops.index("qkv_grad_cat") < ops.index("qkv_proj")
    # A learned position table (no RoPE): no cat (backend-dependent, not modelled); other profiles: none.
    learned = model_from_mapping({**LLAMA, "position_embedding": "learned"})
    c = Ctx(learned, shard_of(learned, 1, 0), 1, 16, 2, False, fw=FRAMEWORKS["megatron-core"])
    assert "qkv_grad_cat" not in {s.op for s in layer_steps(c, "bwd") if isinstance(s, Op)}
    c = Ctx(m, shard_of(m, 1, 0), 1, 16, 2, False, fw=FRAMEWORKS["megatron-deepspeed"])
    assert "qkv_grad_cat" not in {s.op for s in layer_steps(c, "bwd") if isinstance(s, Op)}
