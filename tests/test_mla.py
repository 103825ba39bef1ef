"""Multi-head latent attention: the ops' FLOPs and bytes and the parameters per rank, by hand."""

from __future__ import annotations

from xsim.tracegen import generate, load_spec
from xsim.tracegen.spec import model_arch
from xsim.traces import attrs as A

# hidden 64, 4 heads; q latent 16, kv latent 8, nope 8 + rope 4 = qk 12, v 8; 16 tokens
MLA = {"q_lora_rank": 16, "kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8}
MODEL = {
    "name": "tiny-mla",
    "layers": 1,
    "hidden": 64,
    "ffn_hidden": 32,
    "heads": 4,
    "vocab": 100,
    "seq_len": 16,
    "mla": MLA,
}


def _val(n, name):
    a = {x.name: x for x in n.attr}[name]
    return getattr(a, a.WhichOneof("value"))


def _nodes(tp=1, dp=1):
    # The vocabulary as given (make_vocab_size_divisible_by 0): Megatron would pad 100 to 128 x TP.
    dep = load_spec(
        {"model": MODEL, "parallel": {"gpu": "H100", "tp": tp, "dp": dp}, "make_vocab_size_divisible_by": 0}
    )
    return dep, generate(dep, rewrite=False)


def test_mla_parameters_by_hand():
    q = 64 * 16 + 16 + 16 * 4 * 12  # q down, q latent norm, q up: 1,808
    kv = 64 * (8 + 4) + 8 + 8 * 4 * (8 + 8)  # kv down with the rope key, kv latent norm, kv up: 1,288
    out = 4 * 8 * 64  # output projection from 4 heads of v 8
    dep, _ = _nodes()
    m = model_arch(dep)
    assert m.attention_params() == q + kv + out == 5144
    layer = q + kv + out + 3 * 64 * 32 + 2 * 64
    assert m.total_params() == layer + 100 * 64 + 64 + 100 * 64 == 24280


def test_mla_ops_flops_and_bytes_by_hand():
    _, bundle = _nodes()
    by = {n.name: n for n in bundle.nodes[0]}
    fl = lambda op, ph="fwd": _val(by[f"L1.{op}.{ph}.mb0"], A.NUM_OPS)  # noqa: E731
    assert fl("mla_q_down") == 2 * 16 * 64 * 16
    assert fl("mla_q_up") == 2 * 16 * 16 * 4 * 12
    assert fl("mla_kv_down") == 2 * 16 * 64 * 12
    assert fl("mla_kv_up") == 2 * 16 * 8 * 4 * 16
    assert fl("attn_out_proj") == 2 * 16 * 32 * 64
    # causal flash: scores over qk 12 and values over v 8: 2 b s^2 h (qk + v) / 2
    assert fl("attn_core") == 2 * 1 * 4 * 16 * 16 * (12 + 8) // 2 == 20480
    assert fl("attn_core", "bwd") == 2 * 20480 and fl("mla_q_up", "bwd") == 2 * fl("mla_q_up")
    # Q and K 12 wide, V and O 8 wide per head and token, BF16
    assert _val(by["L1.attn_core.fwd.mb0"], A.TENSOR_SIZE) == 2 * 16 * 4 * (2 * 12 + 2 * 8)
    assert _val(by["L1.rope.fwd.mb0"], A.TENSOR_SIZE) == 16 * (4 + 1) * 4 * 2 * 2  # q rope dims + shared key
    order = [n.name.split(".")[1] for n in bundle.nodes[0] if n.name.startswith("L1.") and ".fwd." in n.name]
    assert order[:9] == [
        "attn_norm", "mla_q_down", "mla_q_norm", "mla_q_up", "mla_kv_down", "mla_kv_norm", "mla_kv_up", "rope",
        "attn_core",
    ]  # fmt: skip
    assert "qkv_proj" not in {n.name.split(".")[1] for n in bundle.nodes[0]}


def test_mla_under_tp_splits_the_up_projections_and_syncs_the_rank_params():
    _, bundle = _nodes(tp=2)
    by = {n.name: n for n in bundle.nodes[1]}
    assert _val(by["L1.mla_q_up.fwd.mb0"], A.NUM_OPS) == 2 * 16 * 16 * 2 * 12  # 2 heads per rank
    assert _val(by["L1.mla_q_down.fwd.mb0"], A.NUM_OPS) == 2 * 16 * 64 * 16  # down projections whole
    _, dp2 = _nodes(dp=2)
    ar = next(n for n in dp2.nodes[0] if n.name.startswith("dp_grad_allreduce"))
    assert _val(ar, A.COMM_SIZE) == 24280 * 4  # every parameter of the one-rank replica, FP32 gradients


def test_deepseek_v3_like_slice_generates():
    model = {"base": "deepseek-v3", "layers": 2, "moe": {"layers": [2]}}
    dep = load_spec({"model": model, "seq_len": 256, "parallel": {"gpu": "H100", "dp": 8, "ep": 8}})
    bundle = generate(dep, rewrite=False)
    by = {n.name: n for n in bundle.nodes[0]}
    # layer 1 dense (SwiGLU 18432), layer 2 MoE: 32 of 256 experts on each of 8 EP ranks, uniform routing:
    # each rank's 256 tokens x 8 routed = 2048 copies, 8 per expert; a rank's 32 experts receive 8 x 32
    # from each of the 8 sources: 2048 rows
    assert _val(by["L1.mlp_up_gate.fwd.mb0"], A.NUM_OPS) == 2 * 256 * 7168 * 2 * 18432
    assert _val(by["L2.moe_expert_up_gate.fwd.mb0"], A.NUM_OPS) == 2 * (8 * 32 * 8) * 7168 * 2 * 2048
    assert _val(by["L2.moe_shared_up_gate.fwd.mb0"], A.NUM_OPS) == 2 * 256 * 7168 * 2 * 2048
