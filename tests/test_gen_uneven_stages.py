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


def _dep(parallel: dict, model=None):
    return load_spec(
        {
            "name": "u",
            "model": model or LLAMA3_405B,
            "micro_batches": 1,
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
