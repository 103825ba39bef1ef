"""Megatron-Core's fused cross-entropy through Transformer Engine (`loss_impl: te`), round pplast."""

from __future__ import annotations

from dataclasses import replace

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.frameworks import FRAMEWORKS
from xsim.tracegen.models import model_from_mapping
from xsim.tracegen.ops import Comm, Ctx, Op, head_steps, shard_of
from xsim.tracegen.spec import spec_to_mapping
from xsim.tracegen.workload import _framework_of
from xsim.traces import attrs as A

# Tiny Llama-style model: h 64, 4 heads, FFN 128, vocabulary 100, 16 tokens.
LLAMA = {"name": "llama-tiny", "layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 4,
         "vocab": 100, "seq_len": 16, "activation": "swiglu", "norm": "rmsnorm", "linear_bias": False}  # fmt: skip


def _head(loss: str, tp: int) -> dict[str, list]:
    m = model_from_mapping(LLAMA)
    fw = replace(FRAMEWORKS["megatron-core"], loss=loss)
    c = Ctx(m, shard_of(m, tp, 0), 1, 16, 2, False, "bf16", fw.attention, fw)
    return {p: head_steps(c, p) for p in ("fwd", "bwd")}


def test_te_cross_entropy_bytes_kernels_and_gather_by_hand():
    # TP 2: vocabulary 100 / 2 = 50 local columns x 16 tokens = 800 logits, BF16 (2 B).
    # TE v2.9 triton/cross_entropy.py forward: online_softmax_kernel reads a row (2), cross_entropy_kernel
    # reads it again and writes the gradient in place (2 + 2) = 6 B a logit = 4,800 B in 2 kernels;
    # backward: element_mul_kernel reads and writes it (2 + 2) = 4 B = 3,200 B in 1 kernel.
    # Between them TE all-gathers m, d and X_y: 3 FP32 x 16 tokens = 192 B per rank (AllGather's per-rank
    # input). Megatron's unfused one: (2 + 36) x 800 = 30,400 B in 6 kernels, (2 + 12) x 800 = 11,200 B in
    # 2, and three AllReduces of 64 B.
    te, mc = _head("te", 2), _head("megatron", 2)
    loss = {
        p: [(o.bytes, o.kernels) for o in s if isinstance(o, Op) and o.op == "loss"] for p, s in te.items()
    }
    assert loss == {"fwd": [(4_800, 2)], "bwd": [(3_200, 1)]}
    loss = {
        p: [(o.bytes, o.kernels) for o in s if isinstance(o, Op) and o.op == "loss"] for p, s in mc.items()
    }
    assert loss == {"fwd": [(30_400, 6)], "bwd": [(11_200, 2)]}
    assert [(o.kind, o.size) for o in te["fwd"] if isinstance(o, Comm) and o.op == "loss_tp"] == [
        ("all_gather", 192)
    ]
    # Megatron's: three all-reduces of 16 FP32 = 64 B each (max, target logit, sum of exponentials), one by
    # one as _VocabParallelCrossEntropy.forward issues them (tracegen.ops.XENT_TP).
    assert [(o.op, o.kind, o.size) for o in mc["fwd"] if isinstance(o, Comm)] == [
        ("loss_tp_max", "all_reduce", 64),
        ("loss_tp_target", "all_reduce", 64),
        ("loss_tp_sumexp", "all_reduce", 64),
    ]
    # One TP rank: no collective (TE's world_size 1 skips the gather).
    assert not [o for s in _head("te", 1).values() for o in s if isinstance(o, Comm) and o.op == "loss_tp"]


def test_loss_impl_is_a_megatron_core_key_and_round_trips():
    spec = {"model": LLAMA, "parallel": {"gpu": "H100", "tp": 2}, "framework": "megatron-core"}
    dep = load_spec({**spec, "loss_impl": "te"})
    assert (dep.loss_impl, _framework_of(dep).loss) == ("te", "te")
    assert spec_to_mapping(dep)["loss_impl"] == "te"
    dep = load_spec(spec)
    assert "loss_impl" not in spec_to_mapping(dep) and _framework_of(dep).loss == "megatron"
    with pytest.raises(SpecError, match="loss_impl applies to the megatron-core frameworks only"):
        load_spec({**spec, "framework": "torchtitan", "loss_impl": "te"})
    with pytest.raises(SpecError, match="loss_impl must be one of megatron, te"):
        load_spec({**spec, "loss_impl": "native"})


def test_megatron_loss_runs_three_tp_all_reduces_per_micro_batch():
    # TP 2, 2 micro-batches of 1 x 16 tokens: each micro-batch's forward all-reduces 16 FP32 = 64 B three
    # times over the TP group, one after the other, then runs the loss kernels.
    spec = {
        "model": LLAMA, "parallel": {"gpu": "H100", "tp": 2, "global_batch": 2}, "framework": "megatron-core",
    }  # fmt: skip
    nodes = generate(load_spec(spec), rewrite=False).nodes[0]
    by_id = {n.id: n for n in nodes}
    coll = [n for n in nodes if n.name.startswith("loss_tp")]
    assert [n.name for n in coll] == [
        f"loss_tp_{w}.fwd.mb{mb}" for mb in (0, 1) for w in ("max", "target", "sumexp")
    ]
    assert {A.comm_size(n) for n in coll} == {64}
    for a, b in zip(coll[:3], coll[1:3], strict=False):
        assert a.id in b.data_deps  # each waits for the one before
    loss = next(n for n in nodes if n.name == "loss.fwd.mb0")
    assert coll[2].id in loss.data_deps and by_id[coll[2].id].name.endswith("mb0")
