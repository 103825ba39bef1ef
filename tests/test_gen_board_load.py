"""`board_load`: the slowest GPU of a fully loaded board sets a multi-GPU run's tensor-core rate (round board)."""

from __future__ import annotations

import pytest
from xsim.tracegen import catalog, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.gemm import LinearGemm, board_clock, linear_compute_seconds, sustained_ratio
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
    assert board_clock(catalog.gpu("H100")) == pytest.approx(0.971520, abs=1e-6)
    assert board_clock(catalog.gpu("H200")) == pytest.approx(0.971520, abs=1e-6)
    assert board_clock(catalog.gpu("B200")) == pytest.approx(0.928919, abs=1e-6)
    assert board_clock(catalog.gpu("GB200")) == pytest.approx(0.928919, abs=1e-6)  # calibrated as B200
    # The A100's sustained clock is HPL's on whole systems already (the mean's drop is in it): it borrows
    # only the H200's spread, 1 - 0.045 / 2 = 0.9775. Alone, nothing changes.
    assert board_clock(catalog.gpu("A100-80GB")) == pytest.approx(0.9775, abs=1e-12)
    assert board_clock(catalog.gpu("V100")) == pytest.approx(0.9775, abs=1e-12)
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


def test_board_load_round_trips_and_is_checked():
    dep = load_spec(_spec("H100", 2, board_load="alone"))
    assert dep.board_load == "alone"
    assert spec_to_mapping(dep)["board_load"] == "alone"
    assert load_spec(_spec("H100", 2)).board_load == ""  # the default keeps older specs' bytes
    assert spec_to_mapping(load_spec(_spec("H100", 2)))["board_load"] == "full"
    with pytest.raises(SpecError, match="board_load must be one of full, alone, got 'half'"):
        load_spec(_spec("H100", 2, board_load="half"))
