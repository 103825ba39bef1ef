"""Mixture of experts in the model spec: presets' parameter counts, routing counts and spec errors, by hand."""

from __future__ import annotations

import json

import pytest
from xsim.tracegen import deployment_pb2 as dpb
from xsim.tracegen.errors import SpecError
from xsim.tracegen.models import preset
from xsim.tracegen.moe import (
    MoeSpec,
    Routing,
    capacity,
    check_routing,
    expert_tokens,
    fill_mla,
    fill_moe,
    mla_from_message,
    moe_from_message,
)
from xsim.tracegen.spec import load_spec, model_arch, spec_to_mapping


def test_mixtral_8x7b_parameters_by_hand():
    m = preset("mixtral-8x7b")
    h, f, layers, v = 4096, 14336, 32, 32000
    attn = h * (32 + 2 * 8) * 128 + 32 * 128 * h  # Q, K, V (8 KV heads of 128) and output: 41,943,040
    experts = 8 * 3 * h * f  # gate, up, down of 8 experts: 1,409,286,144
    router = h * 8
    layer = attn + experts + router + 2 * h  # two RMSNorm gains
    assert layer == 1_451_270_144
    total = layers * layer + v * h + (h + v * h)  # embedding, final norm and untied head
    assert m.total_params() == total == 46_702_792_704  # the released checkpoint's count ("47B")
    # active: 2 of 8 experts per token, the router's 8 outputs stay: the paper's "13B active" (12.9B)
    assert m.active_params() == total - layers * 6 * 3 * h * f == 12_879_925_248


def test_deepseek_v3_parameters_by_hand():
    m = preset("deepseek-v3")
    h, heads = 7168, 128
    # MLA: q down 7168x1536 + norm 1536 + q up 1536 x 128 x (128 + 64); kv down 7168 x (512 + 64) + norm 512
    # + kv up 512 x 128 x (128 + 128); output 128 x 128 x 7168
    attn = h * 1536 + 1536 + 1536 * heads * 192 + h * 576 + 512 + 512 * heads * 256 + heads * 128 * h
    assert m.attention_params() == attn == 187_107_328
    dense = attn + 3 * h * 18432 + 2 * h
    moe = attn + 256 * 3 * h * 2048 + 3 * h * 2048 + h * 256 + 2 * h  # 256 routed, 1 shared, router
    total = 3 * dense + 58 * moe + 129280 * h + h + 129280 * h
    assert m.total_params() == total == 671_026_404_352  # the paper's 671B
    assert m.layer_params_at(3) == dense and m.layer_params_at(4) == moe
    # 8 routed + 1 shared per token: the paper's 37B active
    assert round(m.active_params() / 1e9) == 38 and 37e9 < m.active_params() < 38e9


def test_uniform_routing_splits_tk_over_experts_largest_remainder_first():
    moe = MoeSpec(experts=8, top_k=2, expert_ffn=16)
    # 10 tokens x top-2 = 20 routed; 20 / 8 = 2.5: four experts get 3, four get 2 (ties to the lower index)
    assert expert_tokens(moe, 10, 1, 0) == (3, 3, 3, 3, 2, 2, 2, 2)


def test_weighted_routing_caps_an_expert_at_the_micro_batch_tokens():
    w = MoeSpec(8, 2, 16, routing=Routing("weights", weights=(4, 2, 1, 1, 0, 0, 0, 0)))
    # shares 10, 5, 2.5, 2.5: floors 10 + 5 + 2 + 2 = 19, the last token to expert 2 (tie, lower index)
    assert expert_tokens(w, 10, 1, 0) == (10, 5, 3, 2, 0, 0, 0, 0)
    hot = MoeSpec(8, 2, 16, routing=Routing("weights", weights=(8, 1, 1, 0, 0, 0, 0, 0)))
    # expert 0's share 16 exceeds the 10 tokens (a token picks distinct experts): 10, the other 10 split 5 / 5
    assert expert_tokens(hot, 10, 1, 0) == (10, 5, 5, 0, 0, 0, 0, 0)


def test_capacity_factor_drops_tokens_past_megatron_capacity():
    moe = MoeSpec(8, 2, 16, capacity_factor=1.0, routing=Routing("weights", weights=(4, 2, 1, 1, 0, 0, 0, 0)))
    assert capacity(moe, 10) == 3  # ceil(10 x 2 / 8 x 1.0)
    assert expert_tokens(moe, 10, 1, 0) == (3, 3, 3, 2, 0, 0, 0, 0)
    assert capacity(MoeSpec(8, 2, 16, capacity_factor=1.25), 4096) == 1280


def test_pad_to_capacity_gives_every_expert_the_capacity_whatever_the_routing():
    """Megatron-Bridge's token-drop recipe (apply_moe_token_drop: capacity factor 1.0, expert input padded to
    capacity) on Qwen3-30B-A3B's layer: a source routes 2 x 4,096 tokens x top-8 over 128 experts, capacity
    ceil(8,192 x 8 / 128 x 1.0) = 512 per expert; padded, every expert takes exactly 512 of them however
    skewed the routing (the dispatcher's drop_and_pad counts), so EP 8's 16 local experts get 8 x 16 x 512
    = 65,536 rows, the dropless uniform routing's count."""
    skew = Routing("zipf", skew=1.2, seed=7)
    padded = MoeSpec(128, 8, 768, capacity_factor=1.0, pad_to_capacity=True, routing=skew)
    assert capacity(padded, 8192) == 512
    assert expert_tokens(padded, 8192, 5, 3) == (512,) * 128
    cut = MoeSpec(128, 8, 768, capacity_factor=1.0, routing=skew)  # dropped, not padded: the cold experts
    loads = expert_tokens(cut, 8192, 5, 3)
    assert max(loads) == 512 and min(loads) < 512 and sum(loads) < 8192 * 8
    # the small case above, padded: capacity 3 for each of the 8 experts, the unrouted ones included
    w = MoeSpec(
        8,
        2,
        16,
        capacity_factor=1.0,
        pad_to_capacity=True,
        routing=Routing("weights", weights=(4, 2, 1, 1, 0, 0, 0, 0)),
    )
    assert expert_tokens(w, 10, 1, 0) == (3,) * 8


def test_pad_to_capacity_needs_a_capacity_and_one_within_the_tokens():
    from xsim.tracegen.errors import CatalogError
    from xsim.tracegen.moe import check_routing, moe_from_mapping

    with pytest.raises(CatalogError, match="pad_to_capacity .* needs a capacity_factor"):
        moe_from_mapping({"experts": 8, "top_k": 2, "expert_ffn": 16, "pad_to_capacity": True}, 2)
    m = moe_from_mapping(
        {"experts": 4, "top_k": 2, "expert_ffn": 16, "capacity_factor": 4.0, "pad_to_capacity": True}, 2
    )
    # ceil(4 x 2 / 4 x 4.0) = 8 > 4 tokens: Megatron-Core's top-capacity over the tokens cannot pad that far
    assert "capacity 8 exceeds the 4 tokens" in check_routing(m, 4)
    ok = moe_from_mapping(
        {"experts": 4, "top_k": 2, "expert_ffn": 16, "capacity_factor": 1.5, "pad_to_capacity": True}, 2
    )
    assert check_routing(ok, 4) == ""  # ceil(4 x 2 / 4 x 1.5) = 3 <= 4


def test_zipf_routing_is_seeded_and_follows_its_weights():
    moe = MoeSpec(4, 1, 16, routing=Routing("zipf", skew=1.0, seed=5))
    # weights 1, 1/2, 1/3, 1/4 of 25/12: 48, 24, 16, 12 of 100 tokens, in a seeded expert order
    loads = expert_tokens(moe, 100, 3, 1)
    assert sorted(loads, reverse=True) == [48, 24, 16, 12]
    assert expert_tokens(moe, 100, 3, 1) == loads
    orders = {expert_tokens(moe, 100, layer, src) for layer in range(1, 6) for src in range(4)}
    assert len(orders) > 1  # layers and EP ranks draw their own orders


def test_token_table_rows_must_route_t_times_k():
    moe = MoeSpec(4, 2, 16, routing=Routing("tokens", tokens=((4, 2, 1, 1), (2, 2, 2, 2))))
    assert expert_tokens(moe, 4, 1, 0) == (4, 2, 1, 1)
    assert expert_tokens(moe, 4, 1, 3) == (2, 2, 2, 2)  # EP rank 3 takes row 3 mod 2
    assert check_routing(moe, 4) == ""
    assert "sums to 8" in check_routing(moe, 5)


def _spec(model):
    return {"model": model, "seq_len": 64, "device_groups": [{"gpu": "H100", "ranks": [0]}]}


def test_moe_spec_round_trips_through_deployment_json():
    model = {
        "base": "mixtral-8x7b", "layers": 4,
        "moe": {"layers": "2-3", "capacity_factor": 1.25, "routing": {"distribution": "zipf", "skew": 1.2, "seed": 3}},
    }  # fmt: skip
    dep = load_spec(_spec(model))
    m = model_arch(dep)
    assert (
        m.moe is not None and m.moe.layers == (2, 3) and m.moe.experts == 8 and m.moe.capacity_factor == 1.25
    )
    again = load_spec(json.loads(json.dumps(spec_to_mapping(dep))))
    assert again == dep
    model["moe"] = dict(model["moe"], pad_to_capacity=True)
    padded = load_spec(_spec(model))
    assert model_arch(padded).moe.pad_to_capacity
    assert spec_to_mapping(padded)["model"]["moe"]["pad_to_capacity"] is True
    assert "pad_to_capacity" not in spec_to_mapping(dep)["model"]["moe"]  # unset: not written
    assert load_spec(json.loads(json.dumps(spec_to_mapping(padded)))) == padded
    # MLA models are refused by the generator (not yet generated) but their ModelSpec round-trips
    ds, msg = preset("deepseek-v3"), dpb.ModelSpec()
    fill_moe(msg.moe, ds.moe)
    fill_mla(msg.mla, ds.mla)
    assert (moe_from_message(msg.moe), mla_from_message(msg.mla)) == (ds.moe, ds.mla)


@pytest.mark.parametrize(
    ("moe", "message"),
    [
        ({"experts": 8, "top_k": 9, "expert_ffn": 8}, "top_k 9 exceeds its 8 experts"),
        ({"experts": 8, "top_k": 2}, "missing expert_ffn"),
        ({"experts": 8, "top_k": 2, "expert_ffn": 8, "routing": "pareto"}, "distribution must be one of"),
        (
            {"experts": 4, "top_k": 2, "expert_ffn": 8, "routing": {"tokens": [1, 2, 3]}},
            "a row of 4 token counts",
        ),
        ({"experts": 4, "top_k": 2, "expert_ffn": 8, "layers": [3]}, "past the model's 2 layers"),
        ({"experts": 4, "top_k": 2, "expert_ffn": 8, "topk": 2}, "unknown key(s) topk"),
    ],
)
def test_bad_moe_specs_fail_in_one_line(moe, message):
    model = {
        "layers": 2,
        "hidden": 64,
        "ffn_hidden": 128,
        "heads": 4,
        "vocab": 100,
        "seq_len": 64,
        "moe": moe,
    }
    with pytest.raises(SpecError) as exc:
        load_spec(_spec(model))
    assert message in str(exc.value) and "\n" not in str(exc.value)
