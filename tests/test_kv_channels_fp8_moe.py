"""Two model features the published MoE rows need (issue 28, docs/validation.md): `kv_channels` (a head
width other than hidden / heads, Megatron's --kv-channels, as Qwen3 uses) and MoE layers in
`precision: fp8` (Transformer Engine GroupedLinear experts), each against a hand count."""

from __future__ import annotations

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.models import model_from_mapping
from xsim.tracegen.spec import spec_to_mapping
from xsim.traces import attrs as A

# hidden 64, 4 heads, 2 KV heads, heads 32 wide (hidden / heads would be 16)
QK = {"name": "wide-heads", "layers": 1, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 2,
      "kv_channels": 32, "vocab": 256, "seq_len": 8}  # fmt: skip


def _attr(n, name):
    a = {x.name: x for x in n.attr}[name]
    return getattr(a, a.WhichOneof("value"))


def _node(bundle, rank, name):
    return next(n for n in bundle.nodes[rank] if n.name == name)


def test_kv_channels_sizes_the_attention_by_hand():
    m = model_from_mapping(QK)
    assert m.head_dim == 32
    # QKV out (4 + 2 x 2) x 32 = 256 wide; output projection 4 x 32 = 128 -> 64
    assert m.attention_params() == 64 * 256 + 128 * 64 == 24_576
    bundle = generate(
        load_spec({"model": QK, "parallel": {"gpu": "H100"}, "micro_batches": 1}), rewrite=False
    )
    t = 8  # tokens of the micro-batch
    assert _attr(_node(bundle, 0, "L1.qkv_proj.fwd.mb0"), A.NUM_OPS) == 2 * t * 64 * 256
    assert _attr(_node(bundle, 0, "L1.attn_out_proj.fwd.mb0"), A.NUM_OPS) == 2 * t * 128 * 64
    # the flash attention core: 4 heads x s^2 x 32 wide, causal half of 4 mb heads s^2 d
    assert _attr(_node(bundle, 0, "L1.attn_core.fwd.mb0"), A.NUM_OPS) == 2 * 4 * 8 * 8 * 32


def test_kv_channels_round_trips_and_stays_unset_by_default():
    dep = load_spec({"model": QK, "parallel": {"gpu": "H100"}})
    assert dep.model.kv_channels == 32 and spec_to_mapping(dep)["model"]["kv_channels"] == 32
    again = load_spec(spec_to_mapping(dep))
    assert again.model.SerializeToString() == dep.model.SerializeToString()
    plain = load_spec({"model": "llama2-7b", "parallel": {"gpu": "H100"}})
    assert plain.model.kv_channels == 0 and "kv_channels" not in spec_to_mapping(plain)["model"]


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({**QK, "kv_channels": -1}, "kv_channels must be a 32-bit integer >= 0"),
        ({**QK, "kv_channels": "wide"}, "kv_channels must be a 32-bit integer >= 0"),
        ({"base": "deepseek-v3", "kv_channels": 128}, "kv_channels does not apply to MLA attention"),
    ],
)
def test_bad_kv_channels_fail_in_one_line(model, message):
    with pytest.raises(SpecError) as exc:
        load_spec({"model": model, "parallel": {"gpu": "H100"}})
    assert message in str(exc.value) and "\n" not in str(exc.value)


MOE = {"name": "tiny-moe", "layers": 1, "hidden": 64, "ffn_hidden": 128, "heads": 4, "vocab": 256, "seq_len": 8,
       "moe": {"experts": 4, "top_k": 2, "expert_ffn": 32}}  # fmt: skip


def _moe(precision: str):
    spec = {
        "model": MOE,
        "precision": precision,
        "parallel": {"gpu": "H100", "dp": 2, "ep": 2},
        "micro_batches": 1,
    }
    return generate(load_spec(spec), rewrite=False)


def test_fp8_moe_layers_run_grouped_gemms_on_fp8_operands_by_hand():
    fp8, bf16 = _moe("fp8"), _moe("bf16")
    # 8 tokens x top-2 = 16 copies a rank, 4 per expert (uniform); EP rank 0 holds experts 0, 1 and runs its
    # own 8 copies for them and its peer's 8: R = 16. Up/gate (SwiGLU): K 64, N 64; two local experts.
    r, k, n = 16, 64, 64
    up8, up16 = (_node(b, 0, "L1.moe_expert_up_gate.fwd.mb0") for b in (fp8, bf16))
    assert _attr(up8, A.NUM_OPS) == _attr(up16, A.NUM_OPS) == 2 * r * k * n
    # bytes: FP8 inputs and weights (1 B), BF16 output (2 B)
    assert _attr(up8, A.TENSOR_SIZE) == 1 * (r * k + 2 * k * n) + 2 * r * n == 11_264
    assert _attr(up16, A.TENSOR_SIZE) == 2 * (r * k + 2 * k * n) + 2 * r * n == 20_480
    # at the FP8 tensor rate the grouped GEMM is no slower
    assert _attr(up8, A.DURATION_NS) <= _attr(up16, A.DURATION_NS)
    # Transformer Engine's cast of the received copies: read 2 B, write the FP8 copy and its transpose
    cast = _node(fp8, 0, "L1.moe_expert_up_gate_fp8_cast.fwd.mb0")
    assert _attr(cast, A.TENSOR_SIZE) == r * k * (2 + 2)
    assert not any("fp8_cast" in nd.name for nd in bf16.nodes[0])
    # the router stays a BF16 GEMM: 2 T hidden E
    router = _node(fp8, 0, "L1.moe_router.fwd.mb0")
    assert _attr(router, A.TENSOR_SIZE) == _attr(_node(bf16, 0, "L1.moe_router.fwd.mb0"), A.TENSOR_SIZE)


def test_fp8_weight_cast_of_a_moe_rank_counts_its_experts_by_hand():
    cast = next(nd for nd in _moe("fp8").nodes[0] if nd.name.startswith("fp8_weight_cast"))
    attn = 64 * 3 * 64 + 64 * 64  # QKV and output projection (4 heads of 16, no GQA)
    experts = 2 * 3 * 64 * 32  # two local experts, SwiGLU gate, up, down
    assert _attr(cast, A.TENSOR_SIZE) == (attn + experts) * (2 + 2)  # read BF16, write FP8 and transpose


def test_overlap_param_gather_gathers_expert_buckets_ahead_on_the_expert_dp_group_by_hand():
    """overlap_param_gather with experts: the routed experts' bucket is all-gathered over the expert-DP group
    ahead of its first forward use (its own chain, as Megatron-Core chains the expert bucket groups), not
    after the optimizer step; the dense bucket as before."""
    model = {**MOE, "layers": 2}
    spec = {"model": model, "parallel": {"gpu": "H100", "dp": 4, "ep": 2}, "micro_batches": 2,
            "distributed_optimizer": True, "overlap_grad_reduce": True, "overlap_param_gather": True}  # fmt: skip
    bundle = generate(load_spec(spec), rewrite=False)
    nodes = list(bundle.nodes[0])
    by_name = {nd.name: nd for nd in nodes}
    gather = by_name["expert_dp_param_allgather.bucket0"]
    # EP rank 0 holds experts 0 and 1 of both layers: 2 x 2 x 3 x 64 x 32 = 24,576 parameters, padded to a
    # multiple of lcm(expert-DP 2, 128) (unchanged), each rank's half in BF16: 12,288 x 2 B
    assert _attr(gather, A.COMM_SIZE) == 24_576 // 2 * 2
    members = bundle.comm_groups[_attr(gather, A.PG_NAME)]
    assert tuple(members) == (0, 2)  # replicas 0 and 2 hold the same experts (EP index 0)
    first = by_name["L1.attn_norm.fwd.mb0"]
    assert gather.id in first.data_deps  # the first MoE layer's first op waits for its experts
    dense = by_name["dp_param_allgather.bucket0"]  # one dense bucket (small model), waited by the embedding
    assert any(dense.id in nd.data_deps for nd in nodes if nd.name.startswith("embedding"))
    assert (
        sum(1 for nd in nodes if nd.name.startswith("expert_dp_param_allgather")) == 1
    )  # none after the step
    assert "expert_dp_grad_reducescatter.bucket0" in by_name


def test_one_fp8_moe_layer_has_no_dense_mlp_casts_node_list_by_hand():
    """One FP8 MoE layer on EP rank 0 of 2 (4 experts, top-2, 8 tokens): the attention's TE casts, then the
    expert GEMMs' own GroupedLinear casts (TE grouped_linear.py quantizes its inputs and output gradients),
    and none of the dense MLP's `mlp_up_gate` / `mlp_down` casts, whose GEMMs the MoE block replaces.
    Bytes of each cast: read 2 B, write the FP8 copy and its transpose (1 + 1 B) per element."""
    bundle = _moe("fp8")
    nodes = [nd for nd in bundle.nodes[0] if nd.name.startswith("L1.")]
    fwd = [
        "attn_norm", "qkv_proj", "rope", "attn_core", "attn_out_proj_fp8_cast", "attn_out_proj",
        "attn_bias_dropout_add", "mlp_norm", "moe_router", "moe_router_topk", "moe_permute_map", "moe_permute",
        "moe_dispatch", "moe_dispatch_probs",
        "moe_sort_chunks", "moe_expert_up_gate_fp8_cast", "moe_expert_up_gate", "moe_expert_act",
        "moe_expert_down_fp8_cast", "moe_expert_down", "moe_unsort_chunks", "moe_combine", "moe_unpermute",
        "mlp_bias_dropout_add", "fp8_amax_concat", "fp8_scale_update",
    ]  # fmt: skip
    bwd = [
        "mlp_bias_dropout_add", "moe_unpermute", "moe_combine", "moe_unsort_chunks", "moe_expert_down_fp8_cast",
        "moe_expert_down", "moe_expert_act", "moe_expert_up_gate_fp8_cast", "moe_expert_up_gate",
        "moe_sort_chunks", "moe_dispatch", "moe_dispatch_probs", "moe_permute", "moe_router_topk", "moe_router",
        "moe_router_main_grad_add", "mlp_norm",
        "mlp_residual", "attn_bias_dropout_add", "attn_out_proj_fp8_cast", "attn_out_proj", "attn_core", "rope",
        "qkv_grad_cat", "qkv_proj_fp8_cast", "qkv_proj_fp8_transpose", "qkv_proj", "attn_norm", "attn_residual",
        "layer_main_grad_add", "fp8_amax_concat", "fp8_scale_update",
    ]  # fmt: skip
    expect = [f"L1.{o}.fwd.mb0" for o in fwd] + [f"L1.{o}.bwd.mb0" for o in bwd]
    assert [nd.name for nd in nodes] == expect
    assert (len(fwd), len(bwd)) == (26, 32)  # the DDP hook's norm-gain adds included
    assert not any(nd.name.startswith(("L1.mlp_up_gate", "L1.mlp_down")) for nd in bundle.nodes[0])
    size = {
        nd.name: _attr(nd, A.TENSOR_SIZE)
        for nd in nodes
        if "moe_dispatch" not in nd.name and "moe_combine" not in nd.name
    }
    r, h, fl, t = 16, 64, 32, 8  # received copies, hidden, expert FFN, tokens
    assert size["L1.attn_out_proj_fp8_cast.fwd.mb0"] == t * h * 4 == 2048  # 4 heads x 16 = 64 columns
    assert size["L1.moe_expert_up_gate_fp8_cast.fwd.mb0"] == r * h * 4 == 4096
    assert size["L1.moe_expert_down_fp8_cast.fwd.mb0"] == r * fl * 4 == 2048
    assert size["L1.moe_expert_down_fp8_cast.bwd.mb0"] == r * h * 4 == 4096  # the output gradient
    assert size["L1.moe_expert_up_gate_fp8_cast.bwd.mb0"] == r * 2 * fl * 4 == 4096  # SwiGLU: gate and up
    # the pre-MLP norm of a MoE layer is a plain RMSNorm (no LayerNormLinear): BF16 in and out
    assert size["L1.mlp_norm.fwd.mb0"] == t * h * (2 + 2)
