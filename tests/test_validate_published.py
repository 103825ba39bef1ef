"""scripts/validate_published.py: the validation dataset's integrity, the TFLOP/s -> time conversion, the
spec it writes, and its generate + replay harness on small runs (docs/validation.md)."""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

REPO = Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location(
    "validate_published", REPO / "scripts" / "validate_published.py"
)
vp = importlib.util.module_from_spec(_SPEC)
sys.modules["validate_published"] = vp  # dataclasses resolve their module by name
_SPEC.loader.exec_module(vp)

TODAY = frozenset({"name", "model", "seq_len", "micro_batches", "schedule", "sequence_parallel", "cluster"})
AGREED = TODAY | {
    "parallel",
    "recompute",
    "virtual_stages",
    "precision",
    "compute_model",
    "attention",
    "distributed_optimizer",
}


@pytest.fixture(scope="module")
def data():
    return vp.load_dataset()


def tiny_run(**kw) -> vp.Run:
    """A small Megatron-style GPT layout (not a published run) for harness tests."""
    base = dict(
        id="tiny", source="s", where="w", config_source="", config_where="", layers=8, hidden=1024, heads=16,
        seq_len=1024, vocab=8192, gpu="A100-80GB", cluster="dgx-a100", attention="unfused", tp=2, pp=4,
        dp=2, micro_batch=2, global_batch=64, virtual_stages=1, recompute="full", sequence_parallel=False,
        precision="bf16", measured_kind="iteration_s", measured_value=1.0,
    )  # fmt: skip
    base.update(kw)
    return vp.Run(**base)


# ---------------------------------------------------------------- dataset integrity


def test_dataset_has_at_least_ten_sourced_runs_with_full_configuration(data):
    assert len(data.runs) >= 10
    assert len({r.id for r in data.runs}) == len(data.runs)
    for r in data.runs:
        assert r.source in data.sources and data.sources[r.source].cite
        # names the table (or section) and row, or the log file the number comes from
        assert re.search(r"Table \d|Section \d|Table \"|Section|result_\d+\.txt", r.where), r.id
        assert r.tp * r.pp * r.dp == r.gpus and r.micro_batches >= 1
        assert r.recompute in vp.RECOMPUTE and r.precision in vp.PRECISION_SPEC
        assert r.measured_value > 0
        if r.measured_kind == "tflops_per_gpu":
            # Table 1 prints no micro-batch size or interleaving: those come from the authors' scripts.
            assert r.config_source and "MBS=" in r.config_where, r.id
    assert data.excluded and all(reason for _what, reason in data.excluded)


def test_gpu_counts_equal_the_published_ones(data):
    """tp x pp x dp of every run equals the GPU count printed in its source row."""
    for r in data.runs:
        m = re.search(r"(\d+) GPUs", r.where)
        assert m, f"{r.id}: its source row names no GPU count"
        assert r.gpus == int(m.group(1)), r.id


def test_sc21_scripts_node_counts_agree_with_table_1(data):
    """The authors' run_table_1.sh launches NNODES DGX nodes of 8 GPUs: 8 x NNODES = Table 1's GPU count."""
    seen = 0
    for r in data.runs:
        m = re.search(r"NNODES=(\d+)", r.config_where)
        if m:
            assert 8 * int(m.group(1)) == r.gpus, r.id
            seen += 1
    assert seen == 10


def test_korthikanti_iteration_times_reproduce_the_papers_mfu_column(data):
    """Table 5's MFU column (41.5, 51.4, 56.0, 56.3%) follows from its Present Work times by the paper's
    eq. (7): model FLOPs = 72 B L s h^2 (1 + s/(6h) + v/(12 h L)), peak 312 TFLOP/s: pins our reading of
    the times and of Table 3's configurations."""
    mfu = {"22b": 41.5, "175b": 51.4, "530b": 56.0, "1t": 56.3}
    seen = 0
    for r in data.runs:
        m = re.fullmatch(r"korthikanti22-t5-(\w+)-present", r.id)
        if not m:
            continue
        b, lay, s, h, v = r.global_batch, r.layers, r.seq_len, r.hidden, r.vocab
        flops = 72 * b * lay * s * h * h * (1 + s / (6 * h) + v / (12 * h * lay))
        got = 100 * flops / (r.measured_value * r.gpus * 312e12)
        # Times are printed to 0.01 s and MFU to 0.1 point: allow exactly that rounding.
        tol = got * 0.005 / r.measured_value + 0.05
        assert abs(got - mfu[m.group(1)]) <= tol, (r.id, got)
        seen += 1
    assert seen == 4


def test_bad_dataset_is_one_line_naming_file_and_run(tmp_path):
    text = (REPO / "scripts" / "data" / "published_runs.yaml").read_text(encoding="utf-8")
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        text.replace(
            "parallel: {tp: 2, pp: 1, dp: 32, micro_batch: 16,", "parallel: {tp: 2, pp: 1, dp: 32,", 1
        )
    )
    with pytest.raises(vp.ValidationDataError) as ei:
        vp.load_dataset(bad)
    msg = str(ei.value)
    assert "\n" not in msg and "bad.yaml" in msg and "narayanan21-t1-3.6b" in msg and "micro_batch" in msg
    # a judge's context-parallel row written here: the one line names the key and the dataset that takes it
    bad.write_text(
        text.replace("parallel: {tp: 2, pp: 1, dp: 32,", "parallel: {tp: 2, pp: 1, dp: 32, cp: 2,", 1)
    )
    with pytest.raises(vp.ValidationDataError) as ei:
        vp.load_dataset(bad)
    msg = str(ei.value)
    assert "\n" not in msg and "parallel: unknown cp" in msg and "published_moe_cp_runs.yaml" in msg


# ---------------------------------------------------------------- conversion


def test_throughput_to_time_conversion_hand_computed():
    """Narayanan 2021 Table 1 row 1 (1.7B, 32 GPUs, batch 512, 137 TFLOP/s/GPU), by hand:
    96*512*2048*24*2304^2 = 1.282470e16; bracket 1 + 2048/13824 + 51200/(16*24*2304) = 1.206019;
    F = 1.546683e16 FLOPs; F / (32 * 137e12) = 3.5280 s."""
    f = vp.megatron_iteration_flops(512, 2048, 24, 2304, 51200)
    assert f == pytest.approx(1.546683e16, rel=1e-6)
    run = tiny_run(
        layers=24, hidden=2304, heads=24, seq_len=2048, vocab=51200, tp=1, pp=1, dp=32, micro_batch=16,
        global_batch=512, measured_kind="tflops_per_gpu", measured_value=137.0,
    )  # fmt: skip
    assert vp.measured_seconds(run) == pytest.approx(3.5280, abs=5e-4)


def test_conversion_agrees_with_the_papers_training_time_estimate():
    """Narayanan 2021 eq. (4): training time ~ 8TP/(nX); for GPT-3 (P = 175e9, T = 300e9 tokens, n = 1024,
    X = 140 TFLOP/s) the paper gives 34 days. Our per-iteration time x iterations (T / (B s)) must agree
    to the precision of eq. (4)'s approximations (a few percent)."""
    b, s = 1536, 2048
    per_iter = vp.megatron_iteration_flops(b, s, 96, 12288, 51200) / (1024 * 140e12)
    days = per_iter * 300e9 / (b * s) / 86400
    assert days == pytest.approx(34, rel=0.03)


# ---------------------------------------------------------------- spec


def test_spec_with_agreed_keys():
    run = tiny_run(virtual_stages=2, sequence_parallel=True, recompute="selective")
    spec = vp.spec_for(run, micro_batches=8, features=AGREED)
    assert spec["parallel"] == {
        "gpu": "A100-80GB", "tp": 2, "pp": 4, "dp": 2, "micro_batch": 2, "global_batch": 32,
        "virtual_stages": 2, "order": "tp-dp-pp",
    }  # fmt: skip
    assert spec["recompute"] == "selective" and spec["sequence_parallel"] is True
    assert spec["precision"] == "bf16" and spec["attention"] == "unfused" and spec["schedule"] == "1f1b"
    assert spec["compute_model"] == "calibrated"
    assert "device_groups" not in spec and "micro_batches" not in spec
    assert vp.legacy_gaps(run, AGREED) in ([], ["cluster dgx-a100 (explicit nodes used)"])
    assert vp.PRECISION_SPEC["mixed16"] == "bf16"


def test_spec_with_todays_keys_uses_megatron_rank_order():
    run = tiny_run(tp=2, pp=2, dp=2, layers=8)
    spec = vp.spec_for(run, features=TODAY)
    assert spec["micro_batches"] == 16 and "recompute" not in spec
    got = [(g["ranks"], g["layers"], g["pp_stage"], g["dp_replica"]) for g in spec["device_groups"]]
    # rank = t + TP * (d + DP * s): tp fastest, then dp, then pp
    assert got == [
        ([0, 1], [1, 4], 0, 0),
        ([2, 3], [1, 4], 0, 1),
        ([4, 5], [5, 8], 1, 0),
        ([6, 7], [5, 8], 1, 1),
    ]
    assert "recompute full" in vp.legacy_gaps(run, TODAY)
    cluster = spec["cluster"]
    if isinstance(cluster, dict):  # explicit DGX-like nodes: 8 GPUs each, 200 Gb/s NIC per GPU
        assert [n["ranks"] for n in cluster["nodes"]] == [list(range(8))]
        assert cluster["nodes"][0]["nic_bandwidth"] == "200Gbps"


# ---------------------------------------------------------------- harness


def test_harness_replays_one_dp_replica_and_equals_the_unfolded_replay(tmp_path):
    from xsim.netmodels.cluster import build_cluster
    from xsim.netmodels.models import build_model
    from xsim.replay import DurationModel, simulate
    from xsim.tracegen import generate, load_spec

    run = tiny_run()
    spec = vp.spec_for(run, micro_batches=4)
    rep = vp.replay_spec(spec)
    # One rank per stage simulated: TP 2 x DP 2 rank classes (tracegen/compact.py), 16 ranks by 4.
    assert rep.replayed_ranks == run.pp
    assert vp.fold_factor(run) == run.tp * run.dp
    dep = load_spec(spec)
    import json

    from xsim.api.network import collective_seconds

    # The contention windows timed by the model the set is replayed on, as the harness times them.
    net = build_model("analytical", build_cluster(json.loads(dep.cluster_json)))
    generate(dep, rewrite=False, comm_time=collective_seconds(net)).write(tmp_path, dep.name)
    full = simulate(str(tmp_path), network=net, compute=DurationModel())
    assert rep.iteration_ns == full.summary_dict()["iteration_time_ns"] > 0


def test_micro_batch_extrapolation_equals_the_full_replay():
    """1F1B past warm-up adds one bottleneck-stage period per micro-batch: replays at m = 4 and 8 (pp = 4)
    extrapolate to m = 16 exactly as the replay at 16 gives it."""
    run = tiny_run()
    t = {m: vp.replay_spec(vp.spec_for(run, micro_batches=m)).iteration_ns for m in (4, 8, 16)}
    assert vp.extrapolate(16, (4, t[4]), (8, t[8])) == pytest.approx(t[16], rel=1e-6)
    assert vp.extrapolation_points(replace(run, global_batch=4 * 1024), max_nodes=10_000) == (4, 8)
    assert vp.extrapolation_points(run, max_nodes=10**9) is None


def test_micro_batch_extrapolation_is_exact_for_interleaved_1f1b_too():
    """Interleaved 1F1B (v = 2, pp = 4) with selective recompute and sequence parallelism: replays at m = 4
    and 8 extrapolate to the replay at 16. Needs the virtual_stages key (issue 10)."""
    if "parallel" not in vp.spec_features():
        pytest.skip("this checkout's spec has no parallel:/virtual_stages (issue 10 features)")
    run = tiny_run(layers=16, virtual_stages=2, recompute="selective", sequence_parallel=True)
    t = {m: vp.replay_spec(vp.spec_for(run, micro_batches=m)).iteration_ns for m in (4, 8, 16)}
    assert vp.extrapolate(16, (4, t[4]), (8, t[8])) == pytest.approx(t[16], rel=1e-6)


def test_prediction_over_budget_is_reported_not_guessed():
    p = vp.predict(tiny_run(), max_nodes=10)
    assert p.seconds is None and p.error_pct is None and p.method.startswith("not replayed")


def test_layer_window_spans_first_start_to_last_end():
    ops = pl.DataFrame(
        {
            "rank": [0, 0, 0, 0, 1],
            "layer": [3, 3, 3, 4, 3],
            "phase": ["fwd", "fwd", "bwd", "fwd", "fwd"],
            "start_ns": [1_000_000, 2_500_000, 9_000_000, 4_000_000, 0],
            "end_ns": [2_000_000, 3_500_000, 12_000_000, 5_000_000, 99_000_000],
        }
    )
    assert vp.layer_window_ms(ops, 0, 3, ("fwd",)) == 2.5
    assert vp.layer_window_ms(ops, 0, 3, ("bwd", "recompute")) == 3.0
    with pytest.raises(ValueError):
        vp.layer_window_ms(ops, 0, 5, ("fwd",))


def test_table_is_deterministic_and_median_is_right():
    runs = [tiny_run(id=f"r{i}", measured_value=10.0) for i in range(4)]
    preds = [
        vp.Prediction(runs[0], 10.2, "replayed", 1, 0.1),
        vp.Prediction(runs[1], 9.6, "replayed", 1, 0.2),
        vp.Prediction(runs[2], 11.0, "replayed", 1, 0.3),
        vp.Prediction(runs[3], None, "not replayed (~9 nodes)", 0, 0.0),
    ]
    text = vp.runs_table(preds)
    assert text == vp.runs_table(preds)
    assert "| r1 | s, w |" in text and "| -4.0% |" in text and "| +10.0% |" in text
    # |errors| 2, 4, 10 -> median 4; all 3 within +-10% (a 10.0% error counts as within)
    assert text.rstrip().endswith(
        "Replayed 3 of 4 runs: median |error| 4.0%, max |error| 10.0%, 3 of 3 within +-10%."
    )
    assert math.isclose(preds[1].error_pct, -4.0)


def test_22b_layer_times_within_10_percent_of_korthikanti_table_4(data):
    """Issue 10's per-layer target: forward and backward of one 22B layer (TP 8, micro-batch 4, s 2048) in
    the five experiments of Korthikanti et al. Table 4, each within 10% of the measured ms. Needs the
    recompute / attention / calibrated-compute keys (issue 10); a checkout without them skips."""
    missing = {"recompute", "attention", "compute_model"} - vp.spec_features()
    missing |= set(vp.needed_features(data.layers.run))
    if missing:
        pytest.skip(f"this checkout's spec lacks {sorted(missing)} (issue 10 features)")
    results = vp.layer_results(data.layers)
    assert len(results) == 5
    for r in results:
        assert r.forward_ms == pytest.approx(r.row.forward_ms, rel=0.10), r.row.experiment
        assert r.backward_ms == pytest.approx(r.row.backward_ms, rel=0.10), r.row.experiment


def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys):
    assert vp.main(["--only", "no-such-run"]) == 2
    assert capsys.readouterr().err.strip() == "validate_published: error: unknown run id(s) no-such-run"
    missing = tmp_path / "none.yaml"
    assert vp.main(["--data", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("validate_published: error: ") and "none.yaml" in err and "\n" not in err


# ---------------------------------------------------------------- issue 22: keys, conversions, page


PAGE = REPO / "docs" / "validation.md"


def test_page_and_dataset_agree_on_the_row_set(data):
    """docs/validation.md's generated runs table lists exactly the dataset's runs, in its order, and its
    left-out block one line per excluded entry: the page is written by the script, never by hand."""
    page = PAGE.read_text(encoding="utf-8")
    assert vp.page_run_ids(page) == [r.id for r in data.runs]
    excluded = vp.page_block(page, "excluded")
    assert excluded is not None and excluded == vp.excluded_table(data)
    for name in vp.BLOCKS:
        assert vp.page_block(page, name) is not None, name


def test_the_runs_issue_22_names_are_in_the_dataset_and_on_the_page(data):
    """Issue 22's validation set: MLPerf v4.0 GPT-3 175B on 512 H100 in FP8, NeMo's GPT-3 5B on 64 H100 and
    at least one FSDP run (torchtitan), each as configured by its source, and each a row of the page."""
    runs = {r.id: r for r in data.runs}
    mlperf = runs["mlperf40-gpt3-175b-512xh100"]
    assert (mlperf.gpus, mlperf.gpu, mlperf.precision, mlperf.layers, mlperf.hidden) == (
        512,
        "H100",
        "fp8",
        96,
        12288,
    )
    nemo = runs["nemo2407-gpt3-5b-64xh100"]
    assert (nemo.gpus, nemo.gpu, nemo.precision, nemo.hidden, nemo.layers) == (64, "H100", "fp8", 4096, 24)
    fsdp = [r for r in data.runs if dict(r.options).get("sharding") == "fsdp"]
    # FSDP: torchtitan's FSDP2 rows and llm-foundry's MPT rows (Composer's FSDP), nothing else.
    assert fsdp and {r.id.split("-")[0] for r in fsdp} == {"torchtitan", "mpt"}
    page_ids = vp.page_run_ids(PAGE.read_text(encoding="utf-8"))
    assert {mlperf.id, nemo.id, *(r.id for r in fsdp)} <= set(page_ids)


def test_spec_writes_issue_22_keys_only_when_the_run_sets_them():
    opts = (("framework", "megatron-core"), ("tp_comm_overlap", True), ("grad_reduce_dtype", "bf16"))
    spec = vp.spec_for(tiny_run(options=opts), features=AGREED)
    assert [spec[k] for k, _ in opts] == ["megatron-core", True, "bf16"]
    plain = vp.spec_for(tiny_run(), features=AGREED)
    assert not set(vp.OPTION_VALUES) & set(plain)
    run = tiny_run(ffn_hidden=2816, kv_heads=4, activation="swiglu", norm="rmsnorm", linear_bias=False)
    m = vp.spec_for(run, features=AGREED)["model"]
    assert (m["ffn_hidden"], m["kv_heads"], m["activation"], m["norm"], m["linear_bias"]) == (
        2816, 4, "swiglu", "rmsnorm", False
    )  # fmt: skip


def test_a_key_tracegen_lacks_is_reported_as_needs_feature(monkeypatch):
    monkeypatch.setattr(vp, "spec_features", lambda: AGREED)
    run = tiny_run(options=(("sharding", "fsdp"), ("framework", "megatron-core")))
    assert vp.needed_features(run) == ["sharding", "framework"]
    p = vp.predict(run)
    assert p.seconds is None and p.method == "needs feature sharding, framework" and p.error_pct is None
    line = [r for r in vp.runs_table([p]).splitlines() if r.startswith("| tiny ")][0]
    assert line.endswith("| - | - | needs feature sharding, framework |")


def test_a_value_tracegen_refuses_is_reported_in_one_line(monkeypatch):
    """A key the checkout's feature list claims but tracegen's spec parser refuses: the row says so."""
    if "gemm_rates" in vp.spec_features():
        pytest.skip("this checkout accepts gemm_rates")
    monkeypatch.setattr(vp, "spec_features", lambda: AGREED | {"gemm_rates"})
    p = vp.predict(tiny_run(options=(("gemm_rates", "sustained"),)))
    assert p.seconds is None and p.method.startswith("refused by xsim: ") and "gemm_rates" in p.method
    assert "\n" not in p.method


def test_tokens_per_second_conversion_hand_computed(data):
    """NeMo 24.07 GPT3-5B: 2048 x 2048 tokens / (64 GPUs x 23406 tokens/s) = 4,194,304 / 1,497,984
    = 2.79997 s per iteration."""
    run = {r.id: r for r in data.runs}["nemo2407-gpt3-5b-64xh100"]
    assert vp.measured_seconds(run) == pytest.approx(2.79997, abs=1e-5)


def test_mlperf_step_time_is_the_mllog_block_over_its_steps(data):
    """result_0.txt: blocks of epoch_count 51,904,512 tokens = 11 steps of 2304 x 2048; median block
    119,933 ms -> 10.903 s per step; the run's batch and sequence are the logged ones."""
    run = {r.id: r for r in data.runs}["mlperf40-gpt3-175b-512xh100"]
    assert 51_904_512 == 11 * run.global_batch * run.seq_len
    assert run.measured_value == round(119_933 / 11 / 1000, 3)
    assert run.global_batch == run.micro_batch * run.dp * 72  # gradient_accumulation_steps 72 (MLLOG)


def test_nemo_model_tflops_column_follows_from_our_configuration(data):
    """NeMo prints 765 model TFLOP/s/GPU beside 23406 tokens/s/GPU for GPT3-5B. Korthikanti eq. (7) per
    token, 72 L h^2 (1 + s/(6h) + V/(12 h L)), with our layers, hidden, s and padded vocabulary gives
    764.0: within 0.5% (pins the model we replay)."""
    r = {r.id: r for r in data.runs}["nemo2407-gpt3-5b-64xh100"]
    per_token = (
        72 * r.layers * r.hidden**2 * (1 + r.seq_len / (6 * r.hidden) + r.vocab / (12 * r.hidden * r.layers))
    )
    assert per_token * r.measured_value / 1e12 == pytest.approx(765, rel=0.005)


def test_megatron_bridge_tflops_column_follows_from_our_configuration(data):
    """Megatron-Bridge prints 719 (25.11) and 728 (26.02) model TFLOP/s/GPU beside 1602 and 1621 tokens/s/GPU
    for LLAMA3_70B on 64 H100. 6 N + 6 L h s per token (causal attention), N the matmul weights with our
    model: per layer QKV 8192 x (8192 + 2 x 8 x 128) = 83,886,080, projection 67,108,864, SwiGLU 3 x 8192 x
    28672 = 704,643,072, i.e. 855,638,016; x 80 + head 8192 x 128,256 = 69,501,714,432; 6 N = 417.0e9 and
    6 x 80 x 8192 x 8192 = 32.2e9: 449,222,541,312 FLOPs per token, x 1602 = 719.65 and x 1621 = 728.19
    TFLOP/s (pins the model and the measured column we replay)."""
    runs = {r.id: r for r in data.runs}
    for rid, printed in (("mbridge2511-llama3-70b-64xh100", 719), ("mbridge2602-llama3-70b-64xh100", 728)):
        r = runs[rid]
        d = r.hidden // r.heads
        layer = r.hidden * (r.hidden + 2 * r.kv_heads * d) + r.hidden**2 + 3 * r.hidden * r.ffn
        per_token = 6 * (r.layers * layer + r.hidden * r.vocab) + 6 * r.layers * r.hidden * r.seq_len
        assert per_token == 449_222_541_312
        assert per_token * r.measured_value / 1e12 == pytest.approx(printed, abs=1.0)


def test_torchtitan_mfu_column_follows_from_our_configuration(data):
    """torchtitan's MFU counts every parameter, embedding included: 6 (N + h V) + 12 L h s per token at
    312 TFLOP/s. Our Llama 3 70B (WPS 331), Llama 2 70B (WPS 353; 355 at batch 1, selective op) and Llama 3 8B
    (WPS 2973) give the printed 51.7%, 50.5%, 50.8% and 58.2%. Llama 2 13B (FFN 13824, vocabulary 32,000):
    per layer 4 x 5120^2 + 3 x 5120 x 13824 = 317,194,240 weights, x 40 + 2 x 5120 x 32000 = 13,015,449,600;
    6 N + 12 x 40 x 5120 x 4096 = 78,092,697,600 + 10,066,329,600 = 88,159,027,200 FLOPs per token; at WPS
    2162, 1904: 61.09%, 53.80% (printed 61.1%, 53.8%)."""
    runs = {r.id: r for r in data.runs}
    printed_mfu = (
        ("torchtitan-llama3-70b-fsdp64", 51.7),
        ("torchtitan-llama2-70b-fsdp64", 50.5),
        ("torchtitan-llama2-70b-sacop-fsdp64", 50.8),
        ("torchtitan-llama3-8b-sacop-fsdp64", 58.2),
        ("torchtitan-llama2-13b-fsdp64", 61.1),
        ("torchtitan-llama2-13b-sacop-fsdp64", 53.8),
    )
    for rid, printed in printed_mfu:
        r = runs[rid]
        per_token = vp.model_flops_per_token(r) + 6 * r.hidden * r.vocab
        assert 100 * per_token * r.measured_value / 312e12 == pytest.approx(printed, abs=0.06), rid


def test_mfu_formula_hand_computed():
    """Llama-2 7B: per layer 4 h^2 + 3 h ffn = 67,108,864 + 135,266,304 = 202,375,168 weights; x 32 layers
    + LM head 4096 x 32000 = 6,607,077,376 = N; 6 N + 12 L h s = 39,642,464,256 + 6,442,450,944
    = 46,084,915,200 FLOPs per token. At 10 s per iteration of 128 x 4096 tokens on 8 A100s (312 TFLOP/s):
    2.416e16 / (10 x 8 x 312e12) = 96.8%."""
    run = vp.mfu_run()
    assert vp.model_flops_per_token(run) == 46_084_915_200
    assert (run.gpus, run.tp, run.dp, run.precision, run.attention) == (8, 1, 8, "bf16", "flash")
    assert dict(run.options) == {"distributed_optimizer": True}
    assert "MFU 96.8%" in vp.mfu_line(10.0)


def test_splice_replaces_only_the_generated_blocks(tmp_path):
    begin, end = vp.block_markers("runs")
    page = f"# Title\nprose before\n\n{begin}\nold table\n{end}\n\nprose after\n"
    out = vp.splice_page(page, {"runs": "new table\n"})
    assert out == f"# Title\nprose before\n\n{begin}\nnew table\n{end}\n\nprose after\n"
    assert vp.splice_page(out, {"runs": "new table\n"}) == out  # idempotent
    with pytest.raises(vp.PageError) as ei:
        vp.splice_page(page, {"layers": "x\n"}, "docs/validation.md")
    assert "\n" not in str(ei.value) and "docs/validation.md" in str(ei.value) and "'layers'" in str(ei.value)


def test_rows_not_replayed_keep_the_pages_previous_line():
    runs = [tiny_run(id="a", measured_value=2.0), tiny_run(id="b", measured_value=4.0)]
    preds = [
        vp.Prediction(runs[0], 1.9, "replayed", 1, 0.1),
        vp.Prediction(runs[1], None, "needs feature x", 0, 0),
    ]
    begin, end = vp.block_markers("runs")
    page = f"{begin}\n{vp.runs_table(preds)}{end}\n"
    kept = vp.kept_predictions(page, runs)
    assert kept["a"].seconds == 1.9 and kept["a"].method == "replayed" + vp.KEPT
    assert kept["b"].seconds is None and kept["b"].method == "needs feature x" + vp.KEPT
    # kept twice: marked once
    again = vp.kept_predictions(f"{begin}\n{vp.runs_table(list(kept.values()))}{end}\n", runs)
    assert again["a"].method == "replayed" + vp.KEPT


def test_bloom_time_reproduces_the_logged_tflops(data):
    """The BLOOM log line prints 105.22 s and 149.02 TFLOPs; Megatron-DeepSpeed's TFLOPs is eq. (3) (with
    recomputation) over n GPUs: our 384 GPUs, 70 layers, h 14336, GBS 2048, s 2048, V 250880 give 149.02."""
    r = {r.id: r for r in data.runs}["bloom-176b-384xa100"]
    f = vp.megatron_iteration_flops(r.global_batch, r.seq_len, r.layers, r.hidden, r.vocab)
    assert f / (r.measured_value * r.gpus) / 1e12 == pytest.approx(149.02, abs=0.005)
    assert r.gpus == 384 and r.stage_layers == (5,) + (6,) * 10 + (5,) and r.micro_batches == 128


def test_uneven_stages_become_device_groups_with_their_layer_ranges():
    """stage_layers [2, 3, 3, 2] over pp 4: layers 1-2, 3-5, 6-8, 9-10 on stages 0..3 of every replica, in
    Megatron's rank order (tp fastest, then dp, then pp); the spec replays."""
    run = tiny_run(layers=10, pp=4, dp=2, micro_batch=1, global_batch=8, stage_layers=(2, 3, 3, 2))
    spec = vp.spec_for(run, features=AGREED)
    assert "parallel" not in spec and spec["micro_batches"] == 4
    got = [(g["ranks"], g["layers"], g["pp_stage"], g["dp_replica"]) for g in spec["device_groups"]]
    assert got[:4] == [
        ([0, 1], [1, 2], 0, 0),
        ([2, 3], [1, 2], 0, 1),
        ([4, 5], [3, 5], 1, 0),
        ([6, 7], [3, 5], 1, 1),
    ]
    assert got[-1] == ([14, 15], [9, 10], 3, 1)
    assert vp.replay_spec(spec).iteration_ns > 0


def test_parallel_block_places_ranks_as_the_frameworks_do():
    """Rows written as a `parallel:` block get Megatron's / DeepSpeed's / torchtitan's rank order, tp fastest
    then dp then pp (`order: tp-dp-pp`), as the uneven-stage device groups above do: at tp 2, pp 2, dp 2
    stage 0 holds ranks 0-3 (replicas 0 and 1), stage 1 ranks 4-7, so a pipeline exchange goes rank 0 -> 4
    (4 apart) and a DP all-reduce pairs ranks 0 and 2, where tracegen's default tp-pp-dp would give 0 -> 2
    and 0 with 4."""
    from xsim.tracegen import load_spec

    run = tiny_run(layers=4, tp=2, pp=2, dp=2, micro_batch=1, global_batch=4)
    spec = vp.spec_for(run, features=AGREED)
    assert spec["parallel"]["order"] == "tp-dp-pp"
    dep = load_spec(spec)
    got = sorted((g.pp_stage, g.dp_replica, tuple(g.ranks)) for g in dep.device_groups)
    assert got == [(0, 0, (0, 1)), (0, 1, (2, 3)), (1, 0, (4, 5)), (1, 1, (6, 7))]


def test_explicit_clusters_run_nccl_collectives():
    """A cluster without a preset (GPT-NeoX's 4-HCA HGX nodes, Jean Zay, p4d) is written as 8-GPU nodes at
    the run's per-GPU NIC rate, and its collectives run as NCCL runs them (rail rings through every GPU's
    NIC, netmodels/nccl.py) as the DGX presets' do: 96 ranks -> 12 nodes of 8, each NIC 100 Gb/s."""
    run = tiny_run(tp=2, pp=4, dp=12, cluster="hgx-a100-4hca", gpu="A100-40GB")
    spec = vp.spec_for(run, features=AGREED)
    cl = spec["cluster"]
    assert cl["collectives"] == "nccl" and cl["fabric"] == {"kind": "switch"}
    assert len(cl["nodes"]) == 12 and cl["nodes"][11]["ranks"] == list(range(88, 96))
    assert {n["nic_bandwidth"] for n in cl["nodes"]} == {"100Gbps"}


def test_mlperf_v31_step_time_is_the_mllog_block_over_its_steps(data):
    """v3.1 result_0.txt: blocks of 50,331,648 tokens = 12 steps of 2048 x 2048; median block 132,793.5 ms
    -> 11.066 s per step; gradient_accumulation_steps 128 = 2048 / (MBS 1 x DP 16)."""
    run = {r.id: r for r in data.runs}["mlperf31-gpt3-175b-512xh100"]
    assert 50_331_648 == 12 * run.global_batch * run.seq_len
    assert run.measured_value == round(132_793.5 / 12 / 1000, 3)
    assert run.global_batch == run.micro_batch * run.dp * 128


def test_mlperf_v41_step_times_are_the_mllog_blocks_over_their_steps(data):
    """v4.1 eos_n64 / eos_n32 result_0.txt: blocks of epoch_count 50,331,648 tokens = 12 steps of 2048 x 2048;
    median blocks 114,421 ms (512 GPUs) -> 9.535 s and 220,891 ms (256 GPUs) -> 18.408 s per step;
    gradient_accumulation_steps 64 = 2048 / (MBS 2 x DP 16) and 128 = 2048 / (MBS 2 x DP 8)."""
    runs = {r.id: r for r in data.runs}
    for rid, block_ms, accumulation in (
        ("mlperf41-gpt3-175b-512xh100", 114_421, 64),
        ("mlperf41-gpt3-175b-256xh100", 220_891, 128),
    ):
        run = runs[rid]
        assert 50_331_648 == 12 * run.global_batch * run.seq_len
        assert run.measured_value == round(block_ms / 12 / 1000, 3)
        assert run.global_batch == run.micro_batch * run.dp * accumulation
        assert run.gpus == run.tp * run.pp * run.dp


def test_mlperf_v51_llama31_8b_step_times_are_the_mllog_blocks_over_their_steps(data):
    """v5.1 University of Florida hpg.dgxb200x8.n1 / .n2 result_0.txt: each block is VAL_CHECK_INTERVAL 768
    steps (samples_count 12,288 = 768 x GBS 16 and 24,576 = 768 x GBS 32); median blocks 418,178 ms ->
    544.50 ms -> 0.5445 s and 439,518.5 ms -> 572.29 ms -> 0.5723 s per step; gradient_accumulation_steps 1
    (GBS = MBS 2 x DP)."""
    runs = {r.id: r for r in data.runs}
    for rid, block_ms, samples in (
        ("mlperf51-llama31-8b-8xb200", 418_178, 12_288),
        ("mlperf51-llama31-8b-16xb200", 439_518.5, 24_576),
    ):
        run = runs[rid]
        assert samples == 768 * run.global_batch
        assert run.measured_value == round(block_ms / 768 / 1000, 4)
        assert run.global_batch == run.micro_batch * run.dp
        assert (run.seq_len, run.gpu, run.cluster) == (8192, "B200", "dgx-b200")


def test_cli_only_with_out_refreshes_its_row_and_keeps_the_rest(tmp_path, capsys):
    """`--only ID --out page`: that row is replayed (on a copy of the dataset without the issue-22 keys, so
    that any checkout replays it), every other row keeps the page's previous line, the prose is untouched."""
    keys = "|".join(vp.OPTION_VALUES)
    text = (REPO / "scripts" / "data" / "published_runs.yaml").read_text(encoding="utf-8")
    stripped = tmp_path / "runs.yaml"
    stripped.write_text("".join(ln for ln in text.splitlines(True) if not re.match(rf"\s+({keys}): ", ln)))
    page = tmp_path / "validation.md"
    before = PAGE.read_text(encoding="utf-8")
    page.write_text(before, encoding="utf-8")
    rid = "korthikanti22-t5-22b-full"
    argv = ["--data", str(stripped), "--only", rid, "--no-layers", "--out", str(page)]
    assert vp.main(argv) == 0
    capsys.readouterr()
    after = page.read_text(encoding="utf-8")
    begin = vp.block_markers("runs")[0]
    assert after.split(begin)[0] == before.split(begin)[0]
    rows = {r[0]: r for r in vp.table_rows(vp.page_block(after, "runs"))}
    assert list(rows) == vp.page_run_ids(before)
    assert rows[rid][4] != "-" and rows[rid][6].startswith("replayed")
    assert all(r[6].endswith(vp.KEPT) for i, r in rows.items() if i != rid)
    assert vp.page_block(after, "mfu") == vp.page_block(before, "mfu")  # not run with --only: kept


# llm-foundry's README table: NumParams and MFU columns of the rows we took (cross-checks, not inputs).
MPT_TABLE = {
    "mpt-125m-s2048-8xa100-80gb": (125_311_488, 44.45),
    "mpt-1b-s2048-8xa100-80gb": (1_315_950_592, 59.86),
    "mpt-7b-s2048-8xa100-80gb": (6_658_859_008, 64.23),
    "mpt-7b-s4096-8xa100-80gb": (6_667_247_616, 54.84),
    "mpt-7b-s16384-8xa100-80gb": (6_717_579_264, 51.96),
    "mpt-13b-s2048-8xa100-80gb": (12_853_954_560, 59.57),
    "mpt-30b-s2048-8xa100-80gb": (29_975_214_080, 55.3),
    "mpt-70b-s2048-64xa100-80gb": (64_862_437_376, 53.33),
    "mpt-7b-s2048-8xa100-40gb": (6_658_859_008, 50.92),
    "mpt-13b-s2048-64xa100-40gb": (12_853_954_560, 52.04),
}


def test_llm_foundry_columns_follow_from_our_configuration(data):
    """MPT as we wrote it (biases on every linear and LayerNorm, a learned position embedding, tied
    vocabulary 50,368): N = L (12 h^2 + 13 h) + V h + s h + 2 h is the table's NumParams, and its MFU
    (collect_results.py: (6 N + 12 L h s) per token x T/s/GPU / 312 TFLOP/s) follows from the T/s/GPU we
    took, within the truncation of T/s/GPU to an integer (1 / X relative)."""
    runs = {r.id: r for r in data.runs}
    assert set(MPT_TABLE) == {rid for rid in runs if rid.startswith("mpt-")}
    for rid, (params, mfu) in MPT_TABLE.items():
        r = runs[rid]
        h, L, s = r.hidden, r.layers, r.seq_len
        assert L * (12 * h * h + 13 * h) + r.vocab * h + s * h + 2 * h == params, rid
        x = r.measured_value
        assert 100 * (6 * params + 12 * L * h * s) * x / 312e12 == pytest.approx(mfu, abs=mfu / x + 0.006), (
            rid
        )
    # 7B, s 2048 by hand: 6 x 6,658,859,008 + 12 x 32 x 4096 x 2048 = 43,174,379,520 FLOPs per token;
    # x 4641 tokens/s/GPU / 312e12 = 64.22% (the table: 64.23, from the untruncated 4641.25).
    assert 6 * 6_658_859_008 + 12 * 32 * 4096 * 2048 == 43_174_379_520
    assert 100 * 43_174_379_520 * 4641 / 312e12 == pytest.approx(64.22, abs=0.005)
    # Composer's FSDP mixed precision: DEFAULT reduces in fp32, PURE (the 70B and A100 40GB rows) in bf16.
    pure = {rid for rid in MPT_TABLE if dict(runs[rid].options)["grad_reduce_dtype"] == "bf16"}
    assert pure == {"mpt-70b-s2048-64xa100-80gb", "mpt-7b-s2048-8xa100-40gb", "mpt-13b-s2048-64xa100-40gb"}
    assert all(dict(runs[rid].options)["grad_reduce_dtype"] == "fp32" for rid in set(MPT_TABLE) - pure)
    assert all(dict(runs[rid].options)["attention_kernel"] == "triton" for rid in MPT_TABLE)


def test_internlm_tflops_column_follows_from_our_configuration(data):
    """InternLM prints TFLOPS beside TGS, by its get_megatron_flops (internlm/utils/common.py of 4a3d156):
    per token c (24 h^2 + 4 s h) L + 6 h V, c = 4 with checkpointing, 3 without (its mlp_ratio 8/3 x 3/2
    for SwiGLU gives the 24). With our layers, hidden, s 2048 and vocabulary 103,168: by hand
    (24 x 4096^2 + 4 x 2048 x 4096) = 436,207,616; x 32 = 13,958,643,712; + 6 x 4096 x 103,168 =
    2,535,456,768. Checkpointed: 4 x 13,958,643,712 + 2,535,456,768 = 58,370,031,616 x 3314 TGS = 193.4
    TFLOP/s (printed 193); without: 44,411,387,904 x 4103 = 182.2 (printed 183: the page averages TGS and
    TFLOPS over its log separately)."""
    runs = {r.id: r for r in data.runs}
    assert {rid for rid in runs if rid.startswith("internlm-")} == {
        "internlm-7b-s2048-8xa100-noac",
        "internlm-7b-s2048-8xa100-ac",
        *(f"internlm-7b-s2048-{n}xa100-noac" for n in (16, 32, 64)),
        "internlm-7b-s2048-16xa100-ac",
        "internlm-7b-s2048-64xa100-ac",
    }
    for rid, printed in (("internlm-7b-s2048-8xa100-ac", 193), ("internlm-7b-s2048-8xa100-noac", 183)):
        r = runs[rid]
        c = 4 if r.recompute == "full" else 3
        per_token = c * (24 * r.hidden**2 + 4 * r.seq_len * r.hidden) * r.layers + 6 * r.hidden * r.vocab
        assert per_token * r.measured_value / 1e12 == pytest.approx(printed, rel=0.005), rid
        # zero1=8 on 8 GPUs shards the optimizer over the whole DP group: the distributed optimizer, bf16
        # gradients reduced under the last backward, parameters sent after the step (not overlapped).
        assert dict(r.options) == {
            "overlap_grad_reduce": True,
            "overlap_param_gather": False,
            "grad_reduce_dtype": "bf16",
            "distributed_optimizer": True,
            # FlashAttention v1: install.md's v1.0.5, the .gitmodules submodule at d2f4324f (v1.0.8+3).
            "attention_kernel": "fa1",
            # The layer as InternLM's code runs it (tracegen/frameworks.py "internlm").
            "framework": "internlm",
        }, rid
        # Global Bsz 0.125M tokens = micro_bsz x micro_num x 8 GPUs x 2048.
        assert r.global_batch * r.seq_len == 131_072 and r.gpus == 8 and r.tp == 1, rid
    # The 16-64-GPU rows (round distinst): without checkpointing 44,411,387,904 FLOPs a token x TGS 3939 /
    # 3919 / 3944 = 174.9 / 174.1 / 175.2 against the printed 177 / 176 / 174 (within 1.2%); with it
    # 58,370,031,616 x 3268 / 3217 = 190.8 / 187.8 against 191 / 188. The 32-GPU checkpointed row, TGS 3323,
    # gives 194.0 against its printed 188 (3.2%): its columns disagree, so it is left out (`excluded`).
    for n, printed_noac, printed_ac in ((16, 177, 191), (32, 176, None), (64, 174, 188)):
        for kind, printed, per_token in (
            ("noac", printed_noac, 44_411_387_904),
            ("ac", printed_ac, 58_370_031_616),
        ):
            if printed is None:
                assert f"internlm-7b-s2048-{n}xa100-{kind}" not in runs
                continue
            r = runs[f"internlm-7b-s2048-{n}xa100-{kind}"]
            assert per_token * r.measured_value / 1e12 == pytest.approx(printed, rel=0.012), r.id
            # zero1=8 on n GPUs: the distributed optimizer over instances of one machine's 8 GPUs, n / 8
            # machines of 4 x 100 Gb RoCE (the page's hardware table).
            assert dict(r.options)["dp_shard"] == 8 and r.dp == n and r.cluster == "a100-4x100g-roce", r.id
    assert 58_370_031_616 * 3323 / 1e12 == pytest.approx(193.96, abs=0.005)
    assert 4 * 13_958_643_712 + 2_535_456_768 == 58_370_031_616
    assert 58_370_031_616 * 3314 / 1e12 == pytest.approx(193.4, abs=0.05)
    # By PaLM's formula (model_flops_per_token: 44,612,714,496 per token) the rows measure 58.7% and 47.4% MFU.
    r = runs["internlm-7b-s2048-8xa100-noac"]
    assert vp.model_flops_per_token(r) == 44_612_714_496
    assert 100 * 44_612_714_496 * 4103 / 312e12 == pytest.approx(58.67, abs=0.005)
    assert 100 * 44_612_714_496 * 3314 / 312e12 == pytest.approx(47.39, abs=0.005)


def test_flagperf_mfu_column_follows_from_our_rows(data):
    """FlagPerf's run_pretraining.py prints MFU = X x 8e9 x 6 / 312e12 (Llama 3 8B) and X x 7e9 x 6 / 312e12
    (Aquila2 7B) from the token/p/s X we take (every row on one DGX A800, the dgx-a800 preset): by hand
    3698.7 x 48e9 / 312e12 = 56.90% (printed 56.9),
    2690.3 x 48e9 / 312e12 = 41.39% (41.4), 3936.8 x 42e9 / 312e12 = 53.00% (53.0). The time per iteration
    is the script's 512 x 8192 (gbs x 2048 for Aquila, gbs = 1 x 8 x 9 / (TP x PP) = 72) over 8 X."""
    runs = {r.id: r for r in data.runs}
    rows = {
        "flagperf-llama3-8b-pp2-8xa800": (8e9, 56.9, 1, 2),
        "flagperf-llama3-8b-pp8-8xa800": (8e9, 41.4, 1, 8),
        "flagperf-llama3-8b-tp2-pp2-8xa800": (8e9, 52.4, 2, 2),
        "flagperf-llama3-8b-tp4-pp2-8xa800": (8e9, 46.2, 4, 2),
        "flagperf-llama3-8b-tp2-pp4-8xa800": (8e9, 46.8, 2, 4),
        "flagperf-llama3-8b-tp8-8xa800": (8e9, 37.7, 8, 1),
        "flagperf-aquila2-7b-dp8-8xa800": (7e9, 53.0, 1, 1),
    }
    assert {rid for rid in runs if rid.startswith("flagperf-") and rid.endswith("xa800")} == set(rows)
    for rid, (params, mfu, tp, pp) in rows.items():
        r = runs[rid]
        assert 100 * r.measured_value * params * 6 / 312e12 == pytest.approx(mfu, abs=0.05), rid
        assert (r.gpus, r.tp, r.pp, r.micro_batch, r.cluster) == (8, tp, pp, 1, "dgx-a800"), rid
        # the launch script's --sequence-parallel is in effect where TP > 1
        assert r.sequence_parallel == (tp > 1), rid
        # Megatron's defaults the launch scripts leave on: no overlap, fp32 reduction under bf16.
        opts = dict(r.options)
        assert opts["distributed_optimizer"] and not opts["overlap_grad_reduce"], rid
        assert opts["grad_reduce_dtype"] == "fp32", rid
    assert vp.measured_seconds(runs["flagperf-llama3-8b-pp2-8xa800"]) == pytest.approx(
        512 * 8192 / (8 * 3698.7)
    )
    assert runs["flagperf-aquila2-7b-dp8-8xa800"].global_batch == 1 * 8 * 9
    assert runs["flagperf-llama3-8b-pp2-8xa800"].global_batch == 512
    # Llama 3 8B by PaLM's formula: per layer 2 h^2 + 2 h (h/4) + 3 h 14336 = 33,554,432 + 8,388,608 +
    # 176,160,768 = 218,103,808; x 32 + 4096 x 128,256 = 6,979,321,856 + 525,336,576 = 7,504,658,432 = N;
    # 6 N + 12 x 32 x 4096 x 8192 = 45,027,950,592 + 12,884,901,888 = 57,912,852,480 FLOPs per token.
    assert vp.model_flops_per_token(runs["flagperf-llama3-8b-pp2-8xa800"]) == 57_912_852_480


def test_flagperf_h100_rows_follow_from_the_published_token_rates(data):
    """FlagPerf's H100 rows (source flagperf-h100): run_pretraining.py prints MFU = X x 8e9 x 6 / 989e12
    (Llama 3 8B) and X x 70e9 x 6 / 989e12 (Llama 3 70B) from the token/p/s X we take; by hand
    8103 x 48e9 / 989e12 = 39.33% (printed 39.3), 7914 x 48e9 / 989e12 = 38.41% (38.4), 851 x 420e9 /
    989e12 = 36.14% (36.1); the FP8 rows print the range at 989 and 1979 TFLOP/s: 10486 x 48e9 / 1979e12 =
    25.43% to / 989e12 = 50.89%, printed 25.4%-50.6% (the upper end 0.3 points off: 50.6% would be 10,426),
    and 10280: 24.93% to 49.89%, printed 24.9%-49.9%. Time per iteration = 512 x 8192 / (n X): 8 x 8103
    -> 64.703 s, 16 x 7914 -> 33.124 s, 64 x 851 -> 77.011 s."""
    runs = {r.id: r for r in data.runs}
    rows = {  # id: (params, printed MFU at 989 TFLOP/s, GPUs, TP, PP, precision)
        "flagperf-llama3-8b-tp2-dp4-8xh100": (8e9, 39.3, 8, 2, 1, "bf16"),
        "flagperf-llama3-8b-tp2-dp8-16xh100": (8e9, 38.4, 16, 2, 1, "bf16"),
        "flagperf-llama3-70b-tp8-pp4-64xh100": (70e9, 36.1, 64, 8, 4, "bf16"),
        "flagperf-llama3-8b-tp2-dp4-8xh100-fp8": (8e9, None, 8, 2, 1, "fp8"),
        "flagperf-llama3-8b-tp2-dp8-16xh100-fp8": (8e9, None, 16, 2, 1, "fp8"),
    }
    assert {rid for rid in runs if rid.startswith("flagperf-") and "xh100" in rid} == set(rows)
    for rid, (params, mfu, gpus, tp, pp, precision) in rows.items():
        r = runs[rid]
        if mfu is not None:
            assert 100 * r.measured_value * params * 6 / 989e12 == pytest.approx(mfu, abs=0.05), rid
        assert (r.gpus, r.tp, r.pp, r.micro_batch, r.global_batch) == (gpus, tp, pp, 1, 512), rid
        assert (r.gpu, r.cluster, r.precision) == ("H100", "dgx-h100", precision), rid
        assert r.sequence_parallel, rid  # --sequence-parallel at TP 2 and 8
        opts = dict(r.options)
        assert opts["distributed_optimizer"] and not opts["overlap_grad_reduce"], rid
        assert opts["grad_reduce_dtype"] == "fp32", rid
        assert vp.measured_seconds(r) == pytest.approx(512 * 8192 / (gpus * r.measured_value)), rid
    assert 100 * 10486 * 48e9 / 1979e12 == pytest.approx(25.4, abs=0.05)
    assert 100 * 10280 * 48e9 / 1979e12 == pytest.approx(24.9, abs=0.05)
    assert 100 * 10280 * 48e9 / 989e12 == pytest.approx(49.9, abs=0.05)
    assert 100 * 10486 * 48e9 / 989e12 == pytest.approx(50.89, abs=0.005)  # printed 50.6: see the docstring
    assert dict(runs["flagperf-llama3-8b-tp2-dp4-8xh100-fp8"].options)["fp8_amax_update"] == "module"
    assert vp.measured_seconds(runs["flagperf-llama3-8b-tp2-dp4-8xh100"]) == pytest.approx(64.703, abs=5e-4)
    assert vp.measured_seconds(runs["flagperf-llama3-8b-tp2-dp8-16xh100"]) == pytest.approx(33.124, abs=5e-4)
    assert vp.measured_seconds(runs["flagperf-llama3-70b-tp8-pp4-64xh100"]) == pytest.approx(77.011, abs=5e-4)
    # Llama 3 70B by PaLM's formula: per layer 2 h^2 + 2 h (h/8) + 3 h 28672 = 134,217,728 + 16,777,216 +
    # 704,643,072 = 855,638,016; x 80 + 8192 x 128,256 = 68,451,041,280 + 1,050,673,152 = 69,501,714,432 = N;
    # 6 N + 12 x 80 x 8192 x 8192 = 417,010,286,592 + 64,424,509,440 = 481,434,796,032 FLOPs per token
    # (measured MFU 481,434,796,032 x 851 / 989e12 = 41.4%, docs/validation.md round a100rows).
    assert vp.model_flops_per_token(runs["flagperf-llama3-70b-tp8-pp4-64xh100"]) == 481_434_796_032


def test_dgxc_rows_follow_from_the_readmes_other_columns(data):
    """The DGX Cloud recipe rows (round dgxc): each README prints, beside the step time t we take, the
    throughput s x GBS / t and the MFU GBS x F / t / n / peak (989 TFLOP/s BF16, 1979 FP8), with its own
    model FLOPs per sequence F = s (24 L h^2 + 12 L h s + 48 L h^2 + 6 V h), printed rounded: 434.5e12
    (15B), 1.01e16 (340B), 2.20E+15 (175B). Our rows' sizes give F = 434,478,891,663,360 (4096 x (28,991,029,248
    + 9,663,676,416 + 57,982,058,496 + 9,437,184,000); the README's own sum is 434,526,299,070,464, an
    arithmetic slip in its attention line), 10,090,733,604,175,872 and 2,204,412,785,197,056 (V 50,257; the
    README takes 51,200: 2,204,555,173,429,248), each the printed figure when rounded. By hand:
    4096 x 64 / 2.812 = 93,223.3 (printed 93223), 64 x 434.5e12 / 2.812 / 16 / 989e12 = 62.49%; 4096 x 32 /
    3.16 = 41,478.5 (41478), 32 x 1.01e16 / 3.16 / 128 / 1979e12 = 40.38%; 2048 x 2048 / 5.82 = 720,670.8
    (720671), 2048 x 2.20e15 / 5.82 / 1024 / 1979e12 = 38.20%."""
    runs = {r.id: r for r in data.runs}
    rows = {  # id: (GPUs, GBS, step s, printed tokens/s, printed MFU %)
        "dgxc-nemotron4-15b-bf16-16xh100": (16, 64, 2.812, 93223, 62.49),
        "dgxc-nemotron4-15b-bf16-1024xh100": (1024, 4096, 2.895, 5795239, 60.70),
        "dgxc-nemotron4-15b-fp8-16xh100": (16, 64, 2.039, 128565, 43.07),
        "dgxc-nemotron4-15b-fp8-1024xh100": (1024, 4096, 2.094, 8012042, 41.94),
        "dgxc-nemotron4-340b-bf16-128xh100": (128, 32, 4.61, 28432, 55.38),
        "dgxc-nemotron4-340b-bf16-1024xh100": (1024, 256, 4.73, 221686, 53.98),
        "dgxc-nemotron4-340b-fp8-128xh100": (128, 32, 3.16, 41478, 40.38),
        "dgxc-nemotron4-340b-fp8-1024xh100": (1024, 256, 3.34, 313945, 38.20),
        "dgxc-gpt3-175b-bf16-128xh100": (128, 256, 8.309, 63099, 53.54),
        "dgxc-gpt3-175b-bf16-1024xh100": (1024, 2048, 8.453, 496191, 52.63),
        "dgxc-gpt3-175b-fp8-128xh100": (128, 256, 5.626, 93190, 39.52),
        "dgxc-gpt3-175b-fp8-1024xh100": (1024, 2048, 5.82, 720671, 38.20),
    }
    assert {rid for rid in runs if rid.startswith("dgxc-")} == set(rows)
    printed_flops = {"15b": 434.5e12, "340b": 1.01e16, "175b": 2.20e15}
    half_digit = {"15b": 0.05e12, "340b": 0.005e16, "175b": 0.005e15}  # half the last printed digit
    for rid, (gpus, gbs, step, tokens, mfu) in rows.items():
        r = runs[rid]
        s, size = r.seq_len, rid.split("-")[2]
        flops = s * (24 * r.layers * r.hidden**2 + 12 * r.layers * r.hidden * s + 48 * r.layers * r.hidden**2)
        flops += s * 6 * r.vocab * r.hidden
        assert abs(flops - printed_flops[size]) <= half_digit[size], rid
        assert (r.gpus, r.global_batch, vp.measured_seconds(r)) == (gpus, gbs, step), rid
        assert s * gbs / step == pytest.approx(tokens, abs=1.0), rid
        peak = 1979e12 if r.precision == "fp8" else 989e12
        assert 100 * gbs * printed_flops[size] / step / gpus / peak == pytest.approx(mfu, abs=0.005), rid
        assert (r.gpu, r.cluster, r.sequence_parallel) == ("H100", "dgx-h100", True), rid
        # GA of the README headers: 15B 4 micro-batches of 4, 340B 16 of 1, 175B 64 of 1, at every scale
        assert r.micro_batches == {"15b": 4, "340b": 16, "175b": 64}[size], rid
    f15 = runs["dgxc-nemotron4-15b-bf16-16xh100"]
    assert 4096 * (24 * 32 * 6144**2 + 12 * 32 * 6144 * 4096 + 48 * 32 * 6144**2 + 6 * 256000 * 6144) == (
        434_478_891_663_360
    )
    assert (f15.layers, f15.hidden, f15.vocab, f15.seq_len) == (32, 6144, 256000, 4096)
    assert 2048 * (24 * 96 * 12288**2 + 12 * 96 * 12288 * 2048 + 48 * 96 * 12288**2 + 6 * 50257 * 12288) == (
        2_204_412_785_197_056
    )
