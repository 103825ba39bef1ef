"""torchtitan's selective activation checkpointing, by op policy and by layer frequency.

pytorch/torchtitan 157a12c56 (2024-04-24, the commit of docs/performance.md's 64-A100 table),
torchtitan/parallelisms/parallelize_llama.py `checkpoint_wrapper`:
- `selective_ac_option = 'op'` (xsim `recompute: selective-op`): the policy saves the outputs of
  `no_recompute_list` (aten.mm, SDPA's flash / efficient kernels, reduce_scatter_tensor) "except every second
  mm" (a per-block counter `meta[f"{mode}_mm_count"]`, mm saved when the count is odd); all other ops rerun.
- `selective_ac_option = k` (xsim `recompute: full`, `recompute_method: every`, `recompute_layers: k`):
  `checkpoint_wrapper._count += 1` per block, the block is wrapped in the full non-reentrant checkpoint when
  `_count % k == 0`, the others keep everything.

Every expected number is worked out by hand in the comments (BF16: 2 bytes), not read back from the code.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.frameworks import FRAMEWORKS
from xsim.tracegen.memory import deployment_memory, layer_activation_bytes
from xsim.tracegen.models import model_from_mapping
from xsim.tracegen.ops import Ctx, layer_steps, op_sac_recompute, shard_of
from xsim.tracegen.spec import recompute_units, spec_to_mapping
from xsim.traces import attrs as A

# Tiny GQA Llama: h 64, 4 query heads and 2 KV heads of 16, SwiGLU FFN 128, 16 tokens (s 16, b 1).
TINY = {"name": "llama-gqa-tiny", "layers": 4, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 2,
        "vocab": 100, "seq_len": 16, "activation": "swiglu", "norm": "rmsnorm", "linear_bias": False}  # fmt: skip
# torchtitan 157a12c56 train_configs/llama3_8b.toml: norm_type = "fused_rmsnorm" (its Triton kernel).
BASE = {"model": TINY, "parallel": {"gpu": "A100"}, "framework": "torchtitan", "rmsnorm_impl": "fused"}


def test_the_mm_counter_saves_wq_wv_w1_w2():
    # The block's mms in forward order (model.py at 157a12c56: wq, wk, wv in Attention.forward;
    # `self.w2(F.silu(self.w1(x)) * self.w3(x))` runs w1, then w3, then w2). The policy increments the count
    # before deciding, so mm number n is saved when n is odd: 1 wq, 3 wv, 5 w1, 7 w2 saved; 2 wk, 4 wo and
    # 6 w3 recomputed.
    mms = ["wq", "wk", "wv", "wo", "w1", "w3", "w2"]
    saved = [mm for n, mm in enumerate(mms, 1) if n % 2 == 1]
    assert saved == ["wq", "wv", "w1", "w2"]


def test_op_policy_recomputes_the_unsaved_ops_by_hand():
    # rmsnorm_impl fused: one kernel reading and writing 16 x 64 = 1,024 BF16 elements = 4,096 B.
    # wk: [16 x 64] x [64 x 32] (2 KV heads x 16): 2 x 16 x 64 x 32 = 65,536 FLOPs, moving
    #   2 x (16 x 64 + 64 x 32) + 2 x 16 x 32 = 7,168 B (its share of the fused qkv_proj).
    # rope on q and k (the SDPA inputs autograd saved are rebuilt): 16 x (4 + 2) x 16 = 1,536 elements x 20 B
    #   (complex RoPE: .float() 6, complex multiply 8, type_as 6) = 30,720 B.
    # repeat_kv (torchtitan model.py): k and v copied to the 4 query heads, 2 x 2 B x (1,024 + 512) = 6,144 B.
    # wo: 2 x 16 x 64 x 64 = 131,072 FLOPs, 2 x (1,024 + 4,096) + 2 x 1,024 = 12,288 B.
    # residual add: read 2, write 1 = 6 B x 1,024 = 6,144 B; mlp_norm 4,096 B.
    # w3 (the up half of mlp_up_gate): 2 x 16 x 64 x 128 = 262,144 FLOPs, 2 x (1,024 + 8,192) + 2 x 2,048
    #   = 22,528 B; silu * mul on 16 x 128 = 2,048 elements x 10 B = 20,480 B.
    # Early stop: w2's input is the last tensor the block saved, so w2 and the last residual add do not rerun.
    f = replace(FRAMEWORKS["torchtitan"], rmsnorm="fused")
    m = model_from_mapping(TINY)
    c = Ctx(m, shard_of(m, 1, 0), 1, 16, 2, False, "bf16", f.attention, f)
    got = [(o.op, o.flops, o.bytes) if o.gemm else (o.op, o.bytes) for o in op_sac_recompute(c)]
    assert got == [
        ("attn_norm", 4_096), ("qkv_proj", 65_536, 7_168), ("rope", 30_720), ("attn_kv_repeat", 6_144),
        ("attn_out_proj", 131_072, 12_288),
        ("attn_residual", 6_144), ("mlp_norm", 4_096), ("mlp_up_gate", 262_144, 22_528), ("mlp_act", 20_480),
    ]  # fmt: skip
    # Not recomputed: wq and wv (the rest of qkv_proj's 2 x 16 x 64 x 128 = 262,144 FLOPs), the attention,
    # w1 and w2: recomputed GEMM FLOPs 458,752 of the layer's forward 262,144 + 131,072 + 524,288 + 262,144.
    linears = ("qkv_proj", "attn_out_proj", "mlp_up_gate", "mlp_down")
    assert sum(o.flops for o in layer_steps(c, "fwd") if getattr(o, "op", "") in linears) == 1_179_648
    assert sum(o.flops for o in op_sac_recompute(c) if o.gemm) == 458_752


def test_op_policy_nodes_open_each_layers_backward():
    nodes = generate(load_spec({**BASE, "recompute": "selective-op"}), rewrite=False).nodes[0]
    names = [n.name for n in nodes if n.name.startswith("L3.") and ".fwd." not in n.name]
    assert names[:10] == [
        "L3.attn_norm.recompute.mb0", "L3.qkv_proj.recompute.mb0", "L3.rope.recompute.mb0",
        "L3.attn_kv_repeat.recompute.mb0",
        "L3.attn_out_proj.recompute.mb0", "L3.attn_residual.recompute.mb0", "L3.mlp_norm.recompute.mb0",
        "L3.mlp_up_gate.recompute.mb0", "L3.mlp_act.recompute.mb0", "L3.mlp_down.bwd.mb0",
    ]  # fmt: skip
    by_name = {n.name: n for n in nodes}
    assert A.get_int(by_name["L3.qkv_proj.recompute.mb0"], A.NUM_OPS) == 65_536
    assert A.get_str(by_name["L3.qkv_proj.recompute.mb0"], A.PHASE) == "recompute"
    # 9 recomputed nodes in each of the 4 layers.
    assert sum(n.name.endswith(".recompute.mb0") for n in nodes) == 36


def test_op_policy_memory_per_layer_by_hand():
    # s 16, b 1, TP 1, flash. Without checkpointing (Korthikanti's accounting, GQA): 10sbh = 10,240 (norm,
    # QKV and MLP inputs, dropout-mask bytes); Q 2sbq = 2,048 (q = 4 x 16); K and V 4sbq x 2/4 = 2,048; the
    # attention output 2sbq = 2,048; SwiGLU 6sbf = 12,288; log-sum-exp 4 B x 4 heads x 16 = 256: 28,928 B.
    m = model_from_mapping(TINY)
    none = layer_activation_bytes(m, 16, 1, 1, False, "none", True)
    assert none == 28_928
    # Op policy: the block's input and w2's output 4sbh = 4,096; wq 2,048; wv 2sbq x 2/4 = 1,024; the
    # attention output 2,048 and its log-sum-exp 256; w1 2sbf = 4,096: 13,568 B, 15,360 B saved per layer.
    sac = layer_activation_bytes(m, 16, 1, 1, False, "selective-op", True)
    assert sac == 13_568
    assert none - sac == 15_360


def test_layer_frequency_units():
    # Layers are numbered from 1 in xsim, as torchtitan's counter (1 for the first block): k = 2 checkpoints
    # layers 2 and 4 of 1-4, k = 3 layer 3 only, k = 1 every layer (= full AC), each its own unit. On a
    # pipeline stage of layers 5-8 the count stays the model's: k = 3 -> layer 6.
    assert recompute_units("every", 2, 1, 4) == {2: range(2, 3), 4: range(4, 5)}
    assert recompute_units("every", 3, 1, 4) == {3: range(3, 4)}
    assert recompute_units("every", 1, 1, 4) == {n: range(n, n + 1) for n in range(1, 5)}
    assert recompute_units("every", 3, 5, 8) == {6: range(6, 7)}


def test_layer_frequency_recomputes_every_kth_block_alone():
    # selective_ac_option = 2 on 4 blocks: blocks 2 and 4 are full non-reentrant checkpoints (early stop:
    # their recompute ends before w2, i.e. 10 of the 12 forward ops, repeat_kv's copy included), blocks 1 and 3 recompute nothing.
    spec = {**BASE, "recompute": "full", "recompute_method": "every", "recompute_layers": 2,
            "recompute_early_stop": True}  # fmt: skip
    nodes = generate(load_spec(spec), rewrite=False).nodes[0]
    rec = [n.name for n in nodes if n.name.endswith(".recompute.mb0")]
    layer_ops = ["attn_norm", "qkv_proj", "rope", "attn_kv_repeat", "attn_core", "attn_out_proj", "attn_residual", "mlp_norm",
                 "mlp_up_gate", "mlp_act"]  # fmt: skip
    assert rec == [f"L{n}.{op}.recompute.mb0" for n in (4, 2) for op in layer_ops]
    # The recomputed GEMMs are the whole forward's: qkv 2 x 16 x 64 x (64 + 32 + 32) = 262,144, wo 131,072,
    # w1 and w3 2 x 16 x 64 x 256 = 524,288 FLOPs.
    by_name = {n.name: n for n in nodes}
    flops = [A.get_int(by_name[f"L2.{op}.recompute.mb0"], A.NUM_OPS) for op in
             ("qkv_proj", "attn_out_proj", "mlp_up_gate")]  # fmt: skip
    assert flops == [262_144, 131_072, 524_288]
    # The spec keeps the keys as written.
    got = spec_to_mapping(load_spec(spec))
    assert (got["recompute"], got["recompute_method"], got["recompute_layers"]) == ("full", "every", 2)


def test_layer_frequency_memory_by_hand():
    # One stage of 4 layers, 1 micro-batch. No checkpointing: 4 x 26,880 per layer (28,928 above less the
    # two hidden-dropout masks, 2sbh = 2,048: the torchtitan model has no dropout). k = 2: layers 2 and 4 keep
    # their input 2sbh = 2,048 each, layers 1 and 3 everything, plus one checkpointed layer rematerialized in
    # its backward: 2 x 2,048 + 3 x 26,880. Difference: 26,880 - 4,096 = 22,784 B.
    # (The embedding and head terms are the same in both.)
    def acts(**keys: object) -> int:
        return int(deployment_memory(load_spec({**BASE, **keys}))[0].activations)

    every2 = {"recompute": "full", "recompute_method": "every", "recompute_layers": 2}
    assert acts() - acts(**every2) == 22_784
    # k = 1 is full AC (the uniform method with units of 1); k = 5 > 4 layers checkpoints none.
    assert acts(**{**every2, "recompute_layers": 1}) == acts(recompute="full")
    assert acts(**{**every2, "recompute_layers": 5}) == acts()


def test_layer_frequency_is_a_full_recompute_method():
    with pytest.raises(SpecError, match="recompute_method applies to recompute: full only"):
        load_spec({**BASE, "recompute": "selective-op", "recompute_method": "every"})
