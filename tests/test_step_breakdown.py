"""scripts/step_breakdown.py: the kinds a replayed step is broken into (issue 22's per-kind check)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import step_breakdown as sb  # noqa: E402


@pytest.mark.parametrize(
    ("op", "phase", "kind"),
    [
        ("qkv_proj", "fwd", "GEMM"),
        ("mlp_down", "bwd", "GEMM"),
        ("lm_head", "fwd", "GEMM"),
        ("attn_scores", "fwd", "GEMM"),  # unfused QK^T is a batched GEMM
        ("attn_core", "bwd", "attention"),
        ("attn_softmax", "fwd", "attention"),
        ("attn_core_cp0", "fwd", "attention"),  # context parallelism's ring steps
        ("attn_core_cp1", "bwd", "attention"),
        ("mlp_up_gate_fp8_cast", "bwd", "FP8 casts/scales"),
        ("qkv_proj_fp8_transpose", "bwd", "FP8 casts/scales"),
        ("fp8_scale_update", "fwd", "FP8 casts/scales"),
        ("moe_expert_down_fp8_amax", "fwd", "FP8 casts/scales"),  # GroupedLinear's per-expert quantize
        ("moe_expert_down_fp8_scale", "bwd", "FP8 casts/scales"),
        ("fp8_weight_cast", "opt", "optimizer"),  # the optimizer step's phase wins
        ("optimizer", "opt", "optimizer"),
        ("attn_norm", "fwd", "memory-bound"),
        ("rope", "bwd", "memory-bound"),
        ("loss", "fwd", "memory-bound"),
    ],
)
def test_kind_of_each_op(op, phase, kind):
    assert sb.kind_of(op, phase) == kind


def test_table_shares_add_up_to_the_step():
    kinds = [sb.KindTime("GEMM", 3, 750.0), sb.KindTime("exposed comm / idle", 0, 250.0)]
    text = sb.table(1.0, kinds)
    assert "| GEMM | 3 | 750.0 | 75.0% |" in text
    assert "| exposed comm / idle | 0 | 250.0 | 25.0% |" in text
    assert text.rstrip().endswith("| step | | 1,000.0 | 100% |")


def test_unknown_run_is_one_line_exit_2(capsys):
    assert sb.main(["no-such-run"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "step_breakdown: error: unknown run id no-such-run"


def test_no_contention_replays_with_the_key_off(monkeypatch):
    seen = []

    class Stop(Exception):
        pass

    def fake_replay(spec, keep_ops=False):
        seen.append(spec)
        raise Stop

    monkeypatch.setattr(sb.vp, "replay_spec", fake_replay)
    run = sb.vp.mfu_run()
    for contention in (True, False):
        with pytest.raises(Stop):
            sb.breakdown(run, contention=contention)
    assert "comm_sm_contention" not in seen[0] and seen[1]["comm_sm_contention"] is False
