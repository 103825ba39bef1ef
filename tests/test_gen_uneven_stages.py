"""`parallel:` with first_stage_layers / last_stage_layers (Megatron-Core's --decoder-first-pipeline-num-layers
and --decoder-last-pipeline-num-layers): layer ranges per stage, worked out by hand."""

from __future__ import annotations

import pytest
from xsim.tracegen.errors import SpecError
from xsim.tracegen.spec import load_spec, replicas

# Llama 3 405B (Llama 3 paper, arXiv:2407.21783, Table 3 and section 3.3.2): 126 layers, hidden 16,384,
# FFN 53,248, 128 heads, 8 KV heads, vocabulary 128,256; 16 pipeline stages with one layer fewer on the
# first and the last.
LLAMA3_405B = {"name": "llama3-405b", "layers": 126, "hidden": 16384, "ffn_hidden": 53248, "heads": 128,
               "kv_heads": 8, "vocab": 128256, "seq_len": 8192}  # fmt: skip


def _dep(parallel: dict, model=None, micro_batches: int = 1):
    return load_spec(
        {
            "name": "u",
            "model": model or LLAMA3_405B,
            "micro_batches": micro_batches,
            "parallel": {"gpu": "H100", **parallel},
        }
    )


def _stages(dep) -> list[list[tuple[int, int]]]:
    return [[(dg.layer_start, dg.layer_end) for dg in stages] for stages in replicas(dep).values()]


def test_llama3_405b_126_layers_over_16_stages() -> None:
    dep = _dep({"tp": 8, "pp": 16, "dp": 2, "first_stage_layers": 7, "last_stage_layers": 7})
    # 7 + 14 x 8 + 7 = 126: stage 0 layers 1-7, stage k (1..14) 8k .. 8k+7, stage 15 layers 120-126.
    want = [(1, 7)] + [(8 * k, 8 * k + 7) for k in range(1, 15)] + [(120, 126)]
    assert want[1] == (8, 15) and want[14] == (112, 119)
    assert _stages(dep) == [want, want]
    assert sum(e - s + 1 for s, e in want) == 126
    assert [len(dg.ranks) for dg in dep.device_groups] == [8] * 32


def test_only_one_side_given() -> None:
    # llama2-7b, 32 layers over 4 stages: first 2, the other three share 30 -> 10 each.
    dep = _dep({"pp": 4, "first_stage_layers": 2}, "llama2-7b")
    assert _stages(dep) == [[(1, 2), (3, 12), (13, 22), (23, 32)]]
    # last 5: the first three share 27 -> 9 each.
    dep = _dep({"pp": 4, "last_stage_layers": 5}, "llama2-7b")
    assert _stages(dep) == [[(1, 9), (10, 18), (19, 27), (28, 32)]]
    # pp 2, both given: they must hold every layer (20 + 12).
    dep = _dep({"pp": 2, "first_stage_layers": 20, "last_stage_layers": 12}, "llama2-7b")
    assert _stages(dep) == [[(1, 20), (21, 32)]]


@pytest.mark.parametrize(
    ("parallel", "match"),
    [
        ({"pp": 4, "first_stage_layers": 3, "last_stage_layers": 4}, "25 layers left for 2 other stage"),
        ({"pp": 4, "first_stage_layers": 3}, "29 layers left for 3 other stage"),
        ({"pp": 2, "first_stage_layers": 20, "last_stage_layers": 10}, "2 layers left for 0 other stage"),
        ({"pp": 3, "first_stage_layers": 20, "last_stage_layers": 20}, "more than the model has"),
        ({"pp": 1, "first_stage_layers": 4}, "need pp >= 2"),
        ({"pp": 4, "first_stage_layers": 4, "virtual_stages": 2}, "cannot be combined with virtual_stages"),
        ({"pp": 4, "first_stage_layers": 0}, "first_stage_layers must be >= 1"),
    ],
)
def test_refusals(parallel: dict, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        _dep(parallel, "llama2-7b")


# Qwen3-235B-A22B's shape (Megatron-MoE-ModelZoo Qwen3-235B-A22B.yaml): 94 layers; dense here (the split
# does not depend on the MLP), hidden and heads small so the spec stays cheap.
QWEN3_94 = {"name": "q94", "layers": 94, "hidden": 256, "ffn_hidden": 512, "heads": 4, "kv_heads": 4,
            "vocab": 1024, "seq_len": 256}  # fmt: skip
ACCOUNT = {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}


def _chunks(dep) -> list[list[tuple[int, int]]]:
    from xsim.tracegen.spec import chunk_ranges

    return [chunk_ranges(dg) for dg in replicas(dep)[0]]


def test_qwen3_235b_94_layers_plus_embedding_and_loss_over_8_stages_x_4_chunks() -> None:
    """Megatron-Bridge's Qwen3-235B recipe (account_for_embedding/loss_in_pipeline_split) at PP 8, VP 4:
    94 + 2 = 96 slots, 32 model chunks of 3; chunk j = 8 c + s (stage s, model chunk c). Chunk 0 holds the
    embedding and layers 1-2, chunk j in 1..30 layers 3j .. 3j+2, chunk 31 layers 93-94 and the loss."""
    dep = _dep({"pp": 8, "dp": 1, "virtual_stages": 4, **ACCOUNT}, QWEN3_94, 8)
    got = _chunks(dep)
    assert got[0] == [(1, 2), (24, 26), (48, 50), (72, 74)]  # chunks 0, 8, 16, 24
    assert got[1] == [(3, 5), (27, 29), (51, 53), (75, 77)]  # chunks 1, 9, 17, 25
    assert got[7] == [(21, 23), (45, 47), (69, 71), (93, 94)]  # chunks 7, 15, 23, 31
    flat = sorted(r for stage in got for r in stage)
    assert flat[0] == (1, 2) and flat[-1] == (93, 94) and sum(e - s + 1 for s, e in flat) == 94
    assert all(flat[i][1] + 1 == flat[i + 1][0] for i in range(31))  # contiguous, each layer once
    # without interleaving: 96 / 8 = 12 slots per stage, 11 layers on the first and on the last
    plain = _chunks(_dep({"pp": 8, **ACCOUNT}, QWEN3_94))
    assert plain[0] == [(1, 11)] and plain[1] == [(12, 23)] and plain[7] == [(84, 94)]
    # one flag: 94 + 1 = 95 does not split over 8 stages
    with pytest.raises(SpecError, match=r"94 layers \+ 1 \(embedding\) = 95 do not split into 8 stages"):
        _dep({"pp": 8, "account_for_embedding_in_pipeline_split": True}, QWEN3_94)


@pytest.mark.parametrize(
    ("parallel", "match"),
    [
        ({"pp": 2, "first_stage_layers": 15, **ACCOUNT}, "cannot be combined with first_stage_layers"),
        (
            {"pp": 2, "virtual_stages": 4, **ACCOUNT},
            "= 34 do not split into 2 stages x 4",
        ),
        (
            {"pp": 3, "virtual_stages": 11, "account_for_loss_in_pipeline_split": True},
            "leave a model chunk of 1 slots",
        ),
        ({"pp": 2, "account_for_loss_in_pipeline_split": "yes"}, "must be true or false"),
    ],
)
def test_accounted_split_refusals(parallel: dict, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        _dep(parallel, "llama2-7b", 2)
