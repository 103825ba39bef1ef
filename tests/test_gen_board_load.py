"""`board_load`: the slowest GPU of fully loaded boards sets a multi-GPU run's tensor-core rate (rounds board,
slowest)."""

from __future__ import annotations

import math

import pytest
from xsim.tracegen import catalog, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.gemm import (
    LinearGemm,
    board_clock,
    expected_slowest,
    linear_compute_seconds,
    sustained_ratio,
)
from xsim.tracegen.spec import gpu_specs, spec_to_mapping


def _spec(gpu: str, n: int, **keys: object) -> dict[str, object]:
    groups = [
        {
            "id": i,
            "gpu": gpu,
            "ranks": [i],
            "tp": 1,
            "layers": [1, 4],
            "micro_batch": 1,
            "pp_stage": 0,
            "dp_replica": i,
        }
        for i in range(n)
    ]
    model = {"layers": 4, "hidden": 1024, "ffn_hidden": 4096, "heads": 8, "vocab": 32000}
    return {"model": model, "seq_len": 1024, "micro_batches": 2, "device_groups": groups, **keys}


def test_board_clocks_by_hand():
    # ml-engineering fast-mamf, compute/accelerator/benchmarks/README.md: H200 alone 702.9, all 8 busy mean
    # 698.6 with a 4.5% range; B200 1,455.7 and 1,426.4 with 10.4%. Slowest = mean x (1 - range / 2):
    # H200 698.6 / 702.9 = 0.993882; x 0.9775 = 0.971520. B200 1426.4 / 1455.7 = 0.979872; x 0.948 = 0.928919.
    # A job of one board: `job` and `full` agree.
    for load in ("job", "full"):
        assert board_clock(catalog.gpu("H100"), load) == pytest.approx(0.971520, abs=1e-6)
        assert board_clock(catalog.gpu("H200"), load) == pytest.approx(0.971520, abs=1e-6)
        assert board_clock(catalog.gpu("B200"), load) == pytest.approx(0.928919, abs=1e-6)
        assert board_clock(catalog.gpu("GB200"), load) == pytest.approx(
            0.928919, abs=1e-6
        )  # calibrated as B200
        # The A100's sustained clock is HPL's on whole systems already (the mean's drop is in it): it borrows
        # only the H200's spread, 1 - 0.045 / 2 = 0.9775. Alone, nothing changes.
        assert board_clock(catalog.gpu("A100-80GB"), load) == pytest.approx(0.9775, abs=1e-12)
        assert board_clock(catalog.gpu("V100"), load) == pytest.approx(0.9775, abs=1e-12)
    assert board_clock(catalog.gpu("H100"), "alone") == 1.0


def test_a_multi_gpu_run_takes_the_slowest_gpus_rate():
    one = gpu_specs(load_spec(_spec("H100", 1)))["H100"]
    eight = gpu_specs(load_spec(_spec("H100", 8)))["H100"]
    alone = gpu_specs(load_spec(_spec("H100", 8, board_load="alone")))["H100"]
    assert one.board_clock == 1.0 and alone.board_clock == 1.0
    assert eight.board_clock == pytest.approx(0.971520, abs=1e-6)
    assert sustained_ratio(eight, "bf16") == pytest.approx(708.5 / 841.9 * 0.971520, abs=1e-6)
    # A compute-bound GEMM (4 full waves of the H100's 132 SMs) is slower by exactly 1 / 0.971520 = 1.02932.
    g = LinearGemm(6144, 17920, 2816)
    t1 = linear_compute_seconds(g, one, "bf16", "sustained")
    t8 = linear_compute_seconds(g, eight, "bf16", "sustained")
    assert t8 / t1 == pytest.approx(702.9 / (698.6 * 0.9775), rel=1e-9)
    # The burst (MAMF) rate did not move under sibling load in the source, so `gemm_rates: burst` keeps it.
    assert linear_compute_seconds(g, eight, "bf16", "burst") == linear_compute_seconds(
        g, one, "bf16", "burst"
    )
    # A100: the borrowed spread on top of its HPL clock ratio 1305 / 1410.
    a = gpu_specs(load_spec(_spec("A100-80GB", 8)))["A100-80GB"]
    assert sustained_ratio(a, "bf16") == pytest.approx(1305 / 1410 * 0.9775, abs=1e-12)


def test_expected_slowest_of_n_normal_draws_by_the_tables():
    # E[max of n standard normals]: n = 2 is 1/sqrt(pi) and n = 3 is 3 / (2 sqrt(pi)) in closed form; n = 8,
    # 16, 100, 1000 as tabulated by Harter (1961, "Expected values of normal order statistics", Biometrika
    # 48): 1.42360, 1.76599, 2.50759, 3.24144.
    assert expected_slowest(1) == 0.0
    assert expected_slowest(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-12)
    assert expected_slowest(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), abs=1e-12)
    for n, table in ((8, 1.42360), (16, 1.76599), (100, 2.50759), (1000, 3.24144)):
        assert expected_slowest(n) == pytest.approx(table, abs=5e-6)


def test_a_job_beyond_one_board_waits_for_its_slowest_gpu():
    # sigma = range / (2 x 1.42360) and the slowest of n sits E[max of n] sigmas below the mean. H100, 1,000
    # GPUs: 0.993882 x (1 - 0.0225 x 3.24144 / 1.42360) = 0.993882 x (1 - 0.051231) = 0.942965; `full` keeps
    # one board's 0.971520. A100 at 100: 1 - 0.0225 x 2.50759 / 1.42360 = 0.960368. B200 at 16: 1426.4 /
    # 1455.7 x (1 - 0.052 x 1.76599 / 1.42360) = 0.916664. Jobs of 2-8 GPUs keep the board's rule.
    h100 = catalog.gpu("H100")
    assert board_clock(h100, "job", 1000) == pytest.approx(0.942965, abs=2e-6)
    assert board_clock(h100, "full", 1000) == pytest.approx(0.971520, abs=1e-6)
    assert board_clock(h100, "alone", 1000) == 1.0
    assert board_clock(catalog.gpu("A100-80GB"), "job", 100) == pytest.approx(0.960368, abs=2e-6)
    assert board_clock(catalog.gpu("B200"), "job", 16) == pytest.approx(0.916664, abs=2e-6)
    for n in (2, 5, 8):
        assert board_clock(h100, "job", n) == board_clock(h100, "full")
    # Through the spec: each GPU model at the slowest of its own count (10 H100 and 2 A100 ranks: the H100s
    # at n = 10, the A100s at a board's rule).
    mixed = _spec("H100", 12)
    for g in mixed["device_groups"][10:]:
        g["gpu"] = "A100-80GB"
    specs = gpu_specs(load_spec(mixed))
    assert specs["H100"].board_clock == pytest.approx(board_clock(h100, "job", 10), abs=1e-15)
    assert specs["H100"].board_clock < board_clock(h100, "full")
    assert specs["A100-80GB"].board_clock == pytest.approx(0.9775, abs=1e-12)
    full = gpu_specs(load_spec({**mixed, "board_load": "full"}))
    assert full["H100"].board_clock == pytest.approx(0.971520, abs=1e-6)


def test_board_load_round_trips_and_is_checked():
    dep = load_spec(_spec("H100", 2, board_load="alone"))
    assert dep.board_load == "alone"
    assert spec_to_mapping(dep)["board_load"] == "alone"
    assert load_spec(_spec("H100", 2, board_load="full")).board_load == "full"
    assert load_spec(_spec("H100", 2)).board_load == ""  # the default keeps older specs' bytes
    assert spec_to_mapping(load_spec(_spec("H100", 2)))["board_load"] == "job"
    with pytest.raises(SpecError, match="board_load must be one of job, full, alone, got 'half'"):
        load_spec(_spec("H100", 2, board_load="half"))
