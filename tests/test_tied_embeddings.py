"""Tied input/output embeddings (`tie_embeddings`, ModelArch.tied) and a hand audit of the parameters,
gradient and optimizer-state bytes one rank holds, against the frameworks' own formulas."""

from __future__ import annotations

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.memory import deployment_memory
from xsim.tracegen.models import preset
from xsim.tracegen.planner import build_plan, layer_grad_bytes
from xsim.tracegen.spec import model_arch, spec_to_mapping
from xsim.traces import attrs as A

# A GPT-style layer (GeLU MLP 4h, LayerNorm with bias, biases on every linear): h 64, FFN 256, 4 heads,
# vocabulary 1,000. Per layer 12 h^2 + 13 h = 49,152 + 832 = 49,984 parameters (QKV 3h^2 + 3h, projection
# h^2 + h, MLP 8h^2 + 4h + h, two LayerNorms 2 x 2h); embedding V h = 64,000; final LayerNorm 2h = 128;
# learned positions (the GPT family's default) s h = 128 x 64 = 8,192, whole on every TP rank of stage 0.
GPT = {"name": "tiny-gpt", "layers": 2, "hidden": 64, "ffn_hidden": 256, "heads": 4, "vocab": 1000,
       "seq_len": 128, "activation": "gelu", "norm": "layernorm", "linear_bias": True}  # fmt: skip
LAYER, EMB, FINAL_LN, POS = 49_984, 64_000, 128, 8_192


def _spec(model: dict, groups: list[dict], **keys) -> dict:
    # The vocabulary as given (make_vocab_size_divisible_by 0): Megatron would pad 1,000 to 1,024.
    return {"model": model, "micro_batches": 1, "precision": "bf16", "device_groups": groups,
            "make_vocab_size_divisible_by": 0, **keys}  # fmt: skip


def _dp2(model: dict, **keys) -> dict:
    """One stage of both layers at TP 1 on each of two DP replicas."""
    g = [{"gpu": "A100-80GB", "ranks": [r], "tp": 1, "layers": [1, 2], "dp_replica": r} for r in (0, 1)]
    return _spec(model, g, **keys)


def _node(nodes, name):
    return next(n for n in nodes if n.name == name)


@pytest.mark.parametrize(
    ("tie", "params"),
    [
        # Tied (the GPT family's default): the output layer is the embedding's tensor, counted once:
        # 2 x 49,984 + 64,000 + 8,192 + 128 = 172,288.
        (None, 2 * LAYER + EMB + POS + FINAL_LN),
        (True, 2 * LAYER + EMB + POS + FINAL_LN),
        # Untied: a second V x h matrix, 236,288.
        (False, 2 * LAYER + 2 * EMB + POS + FINAL_LN),
    ],
)
def test_one_stage_holds_the_tied_matrix_once_by_hand(tie, params):
    model = GPT if tie is None else {**GPT, "tie_embeddings": tie}
    dep = load_spec(_dp2(model))
    mem = deployment_memory(dep)[0]
    # BF16 weights (2 B), FP32 gradients (grad_reduce_dtype fp32 for bf16, 4 B), Adam's FP32 master
    # weight and two moments (12 B) on every parameter without the distributed optimizer.
    assert (mem.params, mem.weights, mem.gradients, mem.optimizer) == (
        params,
        2 * params,
        4 * params,
        12 * params,
    )
    nodes = generate(dep, rewrite=False).nodes[0]
    # The DP gradient AllReduce moves every gradient once, FP32: 689,152 B tied, 945,152 B untied.
    dp = [A.comm_size(n) for n in nodes if n.name.startswith("dp_grad_allreduce")]
    assert dp == [4 * params]
    # Adam: 15 FLOPs and 4 + 24 B (FP32 gradient, master weight and moments read and written) per parameter.
    adam = _node(nodes, "optimizer.opt")
    assert (A.get_int(adam, A.NUM_OPS), A.get_int(adam, A.TENSOR_SIZE)) == (15 * params, 28 * params)
    # zero_grad writes the whole FP32 gradient buffer.
    assert A.get_int(_node(nodes, "zero_grad.opt"), A.TENSOR_SIZE) == 4 * params


def test_tied_fsdp_units_by_hand():
    # FSDP on one stage, DP 2: the embedding unit holds the tied matrix and the position table (72,192 ->
    # 36,096 per rank, 72,192 B gathered in BF16), the head unit only the final LayerNorm (128 -> 64 per
    # rank, 128 B); untied, the head unit is 64,128 parameters (64,128 B gathered).
    for tie, head in ((True, FINAL_LN), (False, FINAL_LN + EMB)):
        nodes = generate(
            load_spec(_dp2({**GPT, "tie_embeddings": tie}, sharding="fsdp")), rewrite=False
        ).nodes[0]
        ag = {n.name: A.comm_size(n) for n in nodes if n.name.startswith("fsdp_param_allgather")}
        rs = {n.name: A.comm_size(n) for n in nodes if n.name.startswith("fsdp_grad_reducescatter")}
        assert ag["fsdp_param_allgather.emb.mb0"] == (EMB + POS) // 2 * 2
        assert ag["fsdp_param_allgather.head.mb0"] == head // 2 * 2
        assert rs["fsdp_grad_reducescatter.head.mb0"] == head * 4


def test_tensor_parallel_split_by_hand():
    # TP 2 (Megatron's split: mpu/layers.py ColumnParallelLinear partitions its weight and bias by output,
    # RowParallelLinear its weight by input and keeps the whole bias; LayerNorms are whole on every rank;
    # VocabParallelEmbedding splits the vocabulary): per layer 12 h^2 / 2 = 24,576 weights, the column
    # biases (QKV 3h + fc1 4h) / 2 = 224, the row biases (projection, fc2) 2h = 128 and the LayerNorms
    # 4h = 256 whole: 25,184; embedding 1,000 / 2 x 64 = 32,000; the position table 8,192 and the final
    # LayerNorm 128, whole. Tied on one stage: 2 x 25,184 + 32,000 + 8,192 + 128 = 90,688 on each TP rank.
    g = [{"gpu": "A100-80GB", "ranks": [0, 1], "tp": 2, "layers": [1, 2]}]
    mem = deployment_memory(load_spec(_spec(GPT, g)))
    assert [m.params for m in mem] == [90_688, 90_688]
    # The two ranks together: the model (172,288) plus a second copy of what TP replicates,
    # 2 x (2h + 4h) + 2h = 896 and the position table 8,192.
    assert sum(m.params for m in mem) == 172_288 + 896 + 8_192


def test_two_stages_each_hold_a_copy_and_all_reduce_it_by_hand():
    # PP 2 under megatron-core (--untie-embeddings-and-output-weights not given: Megatron-Core's GPTModel
    # ties, megatron/core/models/gpt/gpt_model.py share_embeddings_and_output_weights): stage 0 holds layer
    # 1, the embedding and the position table (49,984 + 64,000 + 8,192 = 122,176), stage 1 layer 2, the
    # final LayerNorm and its copy of
    # the matrix (49,984 + 128 + 64,000 = 114,112); after the DP sync the two copies' FP32 gradients are
    # all-reduced between the stages (finalize_model_grads.py _allreduce_word_embedding_grads): 256,000 B.
    g = [
        {"gpu": "A100-80GB", "ranks": [0], "tp": 1, "pp_stage": 0, "layers": [1, 1]},
        {"gpu": "A100-80GB", "ranks": [1], "tp": 1, "pp_stage": 1, "layers": [2, 2]},
    ]
    dep = load_spec(_spec(GPT, g, schedule="1f1b"))
    assert [m.params for m in deployment_memory(dep)] == [122_176, 114_112]
    bundle = generate(dep, rewrite=False)
    for rank in (0, 1):
        ar = [n for n in bundle.nodes[rank] if n.name == "embedding_grad_allreduce"]
        assert [A.comm_size(n) for n in ar] == [EMB * 4]
        assert set(bundle.comm_groups[A.get_str(ar[0], A.PG_NAME)]) == {0, 1}
    # Untied (or a Llama-family model by default): no copy, no all-reduce; the last stage holds its own
    # output matrix, the same count.
    untied = generate(load_spec(_spec({**GPT, "tie_embeddings": False}, g, schedule="1f1b")), rewrite=False)
    assert not [n for n in untied.nodes[1] if n.name == "embedding_grad_allreduce"]


def test_defaults_and_the_key():
    # The family decides unless the spec says: GPT-style ties, the Llama family does not.
    assert preset("gpt3-175b").tied and not preset("llama2-7b").tied
    llama = {"base": "llama2-7b", "layers": 2}
    assert not model_arch(load_spec(_dp2(llama))).tied
    assert model_arch(load_spec(_dp2({**llama, "tie_embeddings": True}))).tied
    # Megatron-LM 2021/2022 always tie (GPTModel, no switch): even a SwiGLU/RMSNorm model, and never untied.
    assert model_arch(load_spec(_dp2(llama, framework="megatron-2022"))).tied
    with pytest.raises(SpecError, match="tie_embeddings false is not possible"):
        load_spec(_dp2({**GPT, "tie_embeddings": False}, framework="megatron-2021"))
    with pytest.raises(SpecError, match="tie_embeddings must be true or false"):
        load_spec(_dp2({**GPT, "tie_embeddings": "yes"}))
    # The resolved spec keeps a given key (and only a given one), in the model mapping.
    assert (
        spec_to_mapping(load_spec(_dp2({**GPT, "tie_embeddings": False})))["model"]["tie_embeddings"] is False
    )
    assert "tie_embeddings" not in spec_to_mapping(load_spec(_dp2(GPT)))["model"]
    again = spec_to_mapping(load_spec(_dp2({**llama, "tie_embeddings": True})))
    assert model_arch(load_spec(again)).tied


def test_planner_gradient_bytes_by_hand():
    # The heterogeneous planner's per-layer gradient bytes (BF16): tied on one stage, layer 2 carries only
    # the final LayerNorm (2 x (49,984 + 128) B); on two stages the last one's copy of the matrix too.
    # Layer 1 carries the embedding and the position table.
    m = model_arch(load_spec(_dp2(GPT)))
    emb = EMB + POS
    assert layer_grad_bytes(m, 2, ends_apart=False) == {1: 2 * (LAYER + emb), 2: 2 * (LAYER + FINAL_LN)}
    assert layer_grad_bytes(m, 2) == {1: 2 * (LAYER + emb), 2: 2 * (LAYER + FINAL_LN + EMB)}
    # build_plan resolves the spec's key: the one DP group of the two one-stage replicas reduces the
    # model once, 2 x 172,288 B tied, 2 x 236,288 B untied.
    for tie, params in ((True, 172_288), (False, 236_288)):
        [group] = build_plan(load_spec(_dp2({**GPT, "tie_embeddings": tie}))).dp_groups
        assert group.grad_bytes == 2 * params


# -- audit: one rank's parameters against the frameworks' own formulas -----------------------------------


def _uniform(model, tp: int, pp: int, **keys) -> list:
    spec = {"model": model, "precision": "bf16",
            "parallel": {"gpu": "A100-80GB", "tp": tp, "pp": pp, "dp": 1, "micro_batch": 1, "global_batch": 1},
            **keys}  # fmt: skip
    return deployment_memory(load_spec(spec))


def test_megatron_gpt_matches_narayanan_formula():
    # Narayanan et al. 2021 (SC'21, arXiv:2104.04473), section 5.1: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))
    # = 12 l h^2 + 13 l h + V h + s h, with V the padded vocabulary 51,200 and s 2,048 (Table 1's 1.7B:
    # l 24, h 2304): 1,528,823,808 + 718,848 + 117,964,800 + 4,718,592 = 1,652,226,048 (the table's "1.7B").
    n, h, v, s = 24, 2304, 51200, 2048  # l (layers) is n here
    formula = 12 * n * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * n * h))
    assert round(formula) == 1_652_226_048
    model = {"name": "gpt-1.7b", "layers": n, "hidden": h, "ffn_hidden": 4 * h, "heads": 24, "vocab": v,
             "seq_len": s, "activation": "gelu", "norm": "layernorm", "linear_bias": True}  # fmt: skip
    [one] = _uniform(model, 1, 1, framework="megatron-2021")
    # xsim holds the formula (the learned position table s h included: megatron-2021's Embedding always
    # has it) plus the final LayerNorm 2h the formula leaves out; the output layer is the embedding (tied).
    assert one.params == round(formula) + 2 * h == 1_652_230_656
    # TP 4 PP 2 (18B-class splits): each rank's count by hand, and the sum over ranks is the model plus
    # the replicated tensors' extra copies (per layer 2h row-parallel biases + 4h LayerNorm; final 2h)
    # and the last stage's copy of the tied matrix, once per TP rank (V/4 x h each); the position table s h
    # is whole on every first-stage TP rank.
    ranks = _uniform(model, 4, 2, framework="megatron-2021")
    layer = (
        12 * h * h // 4 + 7 * h // 4 + 2 * h + 4 * h
    )  # 15,925,248 + 4,032 + 13,824: column weights and biases split, the rest whole
    assert layer == 15_943_104
    first, last = 12 * layer + v // 4 * h + s * h, 12 * layer + 2 * h + v // 4 * h
    assert [r.params for r in ranks] == [first] * 4 + [last] * 4
    assert sum(r.params for r in ranks) == one.params + 3 * (n * 6 * h + 2 * h) + v * h + 3 * s * h


def test_llama2_7b_matches_the_model_card():
    # Meta's Llama 2 model card / meta-llama/Llama-2-7b-hf: 6,738,415,616 parameters (untied head,
    # tie_word_embeddings false). Per layer 4 h^2 attention + 3 h x 11,008 SwiGLU MLP + 2 h RMSNorm gains.
    h, f, v = 4096, 11008, 32000
    per_layer = 4 * h * h + 3 * h * f + 2 * h
    [one] = _uniform("llama2-7b", 1, 1)
    assert one.params == 32 * per_layer + 2 * v * h + h == 6_738_415_616
    # TP 2 PP 2: per rank 16 x (4h^2/2 + 3 h f/2 + 2h) = 1,619,132,416, plus the V/2 x h embedding
    # (stage 0) or final norm h and the V/2 x h output layer (stage 1).
    ranks = _uniform("llama2-7b", 2, 2)
    layers = 16 * (4 * h * h // 2 + 3 * h * f // 2 + 2 * h)
    assert layers == 1_619_132_416
    assert [r.params for r in ranks] == [layers + v // 2 * h] * 2 + [layers + h + v // 2 * h] * 2
    assert sum(r.params for r in ranks) == 6_738_415_616 + 32 * 2 * h + h  # the norms' second TP copy
    # Optimizer state (12 B) and FP32 gradients per parameter; the distributed optimizer shards the state
    # over DP (ceil), here DP 1.
    assert [(r.optimizer, r.gradients) for r in ranks] == [(12 * r.params, 4 * r.params) for r in ranks]


def test_mpt_7b_matches_llm_foundry_count():
    # llm-foundry's benchmark MPT-7B (scripts/train/yamls/pretrain/mpt-7b.yaml: d_model 4096, 32 layers,
    # expansion 4, vocab 50,368, max_seq_len 2048; biases, LayerNorm with bias, learned positions, tied):
    # NumParams = L (12 h^2 + 13 h) + V h + s h + 2 h = 6,658,859,008 (the README's "7b", MPT-7B's 6.7B).
    n, h, v, s = 32, 4096, 50368, 2048  # L (layers) is n here
    num_params = n * (12 * h * h + 13 * h) + v * h + s * h + 2 * h
    assert num_params == 6_658_859_008
    model = {"name": "mpt-7b", "layers": n, "hidden": h, "ffn_hidden": 4 * h, "heads": 32, "vocab": v,
             "seq_len": s, "activation": "gelu", "norm": "layernorm", "linear_bias": True}  # fmt: skip
    # llm-foundry builds its embedding on vocab_size as the yaml gives it (no Megatron padding: 50,368 is
    # not a multiple of 128): make_vocab_size_divisible_by 0.
    [one] = _uniform(model, 1, 1, make_vocab_size_divisible_by=0)
    # Tied and learned positions by the family's default (MPT's logits use wte.weight; wpe, s x h): the
    # count exactly.
    assert one.params == num_params
    # FSDP over 8 ranks: each holds a 1/8 shard (ceil) of everything, 12 B of Adam state per parameter.
    spec = {"model": model, "precision": "bf16", "sharding": "fsdp", "make_vocab_size_divisible_by": 0,
            "parallel": {"gpu": "A100-80GB", "tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 8}}  # fmt: skip
    fsdp = deployment_memory(load_spec(spec))[0]
    assert fsdp.optimizer == 12 * -(-one.params // 8)


def test_sequence_parallel_all_reduces_the_tp_replicated_gradients_by_hand():
    # Under sequence parallelism each TP rank computes the gradients of the weights it holds whole from its
    # sequence slice, and Megatron all-reduces every parameter marked `sequence_parallel` over TP: the
    # LayerNorms' (2 per layer x 2h, final 2h) and the row-parallel linears' biases (attention projection and
    # MLP down projection, 2 x h per layer; RowParallelLinear sets the mark on its bias), the FP32 main_grad:
    # (2 x 2 x 128 + 128 + 2 x 2 x 64) x 4 B = 896 x 4 = 3,584 B. A model without biases (RMSNorm gains
    # only, h each): (2 x 2 + 1) x 64 x 4 = 1,280 B.
    g = [{"gpu": "A100-80GB", "ranks": [0, 1], "tp": 2, "layers": [1, 2]}]
    llama = {**GPT, "activation": "swiglu", "norm": "rmsnorm", "linear_bias": False}
    for model, size in ((GPT, 3_584), (llama, 1_280)):
        nodes = generate(load_spec(_spec(model, g, sequence_parallel=True)), rewrite=False).nodes[0]
        assert [A.comm_size(n) for n in nodes if n.name == "sp_norm_grad_allreduce"] == [size]


def test_bytes_per_parameter_match_megatron_distributed_optimizer_table():
    # Megatron-LM docs/source/distrib_optimizer.md (the table of bytes per parameter): BF16 parameters with
    # FP32 gradients take 18 B without the distributed optimizer and 6 + 12/d with it (d = DP); FP16
    # parameters with FP16 gradients 16 and 4 + 12/d. Llama-2 7B at DP 8: 6 + 12/8 = 7.5 B per parameter.
    p = 6_738_415_616
    spec = {"model": "llama2-7b", "precision": "bf16", "distributed_optimizer": True,
            "parallel": {"gpu": "A100-80GB", "tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 8}}  # fmt: skip
    r = deployment_memory(load_spec(spec))[0]
    assert (r.params, r.weights + r.gradients, r.optimizer) == (p, 6 * p, 12 * p // 8)
    plain = deployment_memory(load_spec({**spec, "distributed_optimizer": False}))[0]
    assert plain.weights + plain.gradients + plain.optimizer == 18 * p
    fp16 = deployment_memory(load_spec({**spec, "precision": "fp16"}))[0]
    assert (fp16.weights + fp16.gradients, fp16.optimizer) == (4 * p, 12 * p // 8)
