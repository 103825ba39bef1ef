"""TCO per iteration: tokens, GPU-hours and dollars of a deployment, worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
from xsim.tracegen import load_spec
from xsim.tracegen.cost import iteration_cost

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_figure1_cost_by_hand() -> None:
    dep = load_spec(EXAMPLES / "figure1_paper.yaml")
    # One hour of iteration: 5 H100 at $98.32/8 = $12.29/h and 5 A100-40GB at $32.7726/8 = $4.0966/h
    # (catalog prices, AWS p5.48xlarge and p4d.24xlarge on-demand).
    c = iteration_cost(dep, 3_600 * 10**9)
    assert c.usd == pytest.approx(5 * 12.29 + 5 * 4.0966)
    assert c.gpu_hours == pytest.approx(10.0)
    # Replica 0: 4 micro-batches of 8 sequences, replica 1: 4 of 16; 2048 tokens each.
    assert c.tokens == 4 * 8 * 2048 + 4 * 16 * 2048 == 196_608
    assert c.tokens_per_s == pytest.approx(196_608 / 3600)
    assert c.usd_per_million_tokens == pytest.approx((5 * 12.29 + 5 * 4.0966) / 196_608 * 1e6)
    assert c.unpriced_gpus == ()


def test_unpriced_gpu_gives_no_dollar_figure() -> None:
    spec = {
        "model": "llama2-7b",
        "micro_batches": 2,
        "device_groups": [
            {
                "id": 0,
                "gpu": "H200",
                "ranks": [0, 1],
                "tp": 2,
                "layers": [1, 32],
                "micro_batch": 1,
                "pp_stage": 0,
            },
        ],
    }
    c = iteration_cost(load_spec(spec), 10**9)
    assert c.usd is None and c.unpriced_gpus == ("H200",)
    assert c.tokens == 2 * 1 * 4096  # Llama-2's 4096-token context is the preset's sequence length
    spec["gpus"] = {"H200": {"price_per_hour": 3.6}}
    c = iteration_cost(load_spec(spec), 10**9)
    assert c.usd == pytest.approx(2 * 3.6 / 3600)
