"""scripts/validate_moe_cp.py: the MoE / long-context validation rows (issue 28) — dataset integrity, the
throughput -> time conversions by hand, page and dataset agree on the row set, and the harness (compact
generation of EP blocks, replay) on a small MoE plan."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from xsim.tracegen import load_spec

REPO = Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location("validate_moe_cp", REPO / "scripts" / "validate_moe_cp.py")
vm = importlib.util.module_from_spec(_SPEC)
sys.modules["validate_moe_cp"] = vm  # dataclasses resolve their module by name
_SPEC.loader.exec_module(vm)
PAGE = REPO / "docs" / "validation.md"


@pytest.fixture(scope="module")
def data():
    return vm.load_dataset()


def test_every_run_cites_its_source_and_its_layout_counts_its_gpus(data):
    assert {r.id for r in data.runs} >= {
        "llama3-405b-longctx-16384xh100",
        "mbridge2511-qwen3-30b-a3b-16xh100",
    }
    for r in data.runs:
        cite, conversion = data.sources[r.source]
        assert cite and conversion and r.where
        p = r.parallel
        assert r.gpus == p["tp"] * p["pp"] * p["dp"] * p.get("cp", 1)


def test_page_and_dataset_agree_on_the_row_set(data):
    """docs/validation.md's moe_cp block lists exactly the dataset's runs, in order (written by the script)."""
    assert vm.page_run_ids(PAGE.read_text(encoding="utf-8")) == [r.id for r in data.runs]


def test_llama3_long_context_time_from_380_tflops_by_hand(data):
    run = next(r for r in data.runs if r.id == "llama3-405b-longctx-16384xh100")
    h, f, layers, v, s = 16384, 53248, 126, 128000, 131072
    per_layer = 2 * h * h + 2 * h * (h * 8 // 128) + 3 * h * f  # Q, O; K, V of 8 KV heads; SwiGLU
    assert per_layer == 3_187_671_040
    n = layers * per_layer + h * v  # + the LM head
    assert n == 403_743_703_040
    per_token = 6 * n + 12 * layers * h * s
    tokens = 8 * 16 * s  # DP 8 x 16 sequences per DP replica (Table 4: 16M tokens per batch)
    assert tokens == 16_777_216
    seconds = per_token * tokens / (16384 * 380e12)
    assert vm.measured_seconds(run) == pytest.approx(seconds, rel=1e-12)
    assert round(seconds, 3) == 15.278
    # the table's MFU: 380 TFLOP/s of the H100's 989 dense BF16 (H100 SXM datasheet) = 38%
    assert round(100 * 380 / 989) == 38


def test_tokens_per_second_to_time_by_hand(data):
    run = next(r for r in data.runs if r.id == "mbridge2511-qwen3-30b-a3b-16xh100")
    # GBS 512 x 4096 tokens over 16 GPUs at 5,275 tokens/s each
    assert vm.measured_seconds(run) == pytest.approx(512 * 4096 / (16 * 5275), rel=1e-12)


def test_a_run_tracegen_refuses_is_reported_in_one_line_not_rewritten(data):
    run = vm.MoeCpRun(
        "bad", "llama3-paper", "w", 2, "tokens_per_s_per_gpu", 1.0,
        {"model": {"name": "x", "layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "vocab": 256,
                   "seq_len": 16, "rotary": 1}, "parallel": {"gpu": "H100", "dp": 2, "micro_batch": 1,
                                                          "global_batch": 2}},
        "dgx-h100",
    )  # fmt: skip
    p = vm.predict(run)
    assert p.seconds is None and p.method.startswith("refused by xsim: ") and "rotary" in p.method
    assert "\n" not in p.method


def test_a_long_context_row_over_the_budget_is_listed_with_its_node_estimate(data):
    run = next(r for r in data.runs if r.id == "llama3-405b-longctx-16384xh100")
    p = vm.predict(run, max_nodes=1000)
    # rank classes (all-gather CP, issue 28): one rank per stage, 16 of the 16,384 ranks, are generated;
    # 126 layers x 16 micro-batches x (38 dense + 2 CP collectives) nodes a layer step = 80,640
    assert p.seconds is None and p.method.startswith("not replayed: ~80,640 nodes for the 16 ranks generated")


def test_the_harness_replays_a_small_moe_plan_compact_as_the_full_set():
    """A tiny MoE plan (not a published run): EP 2 over DP 4 under uniform routing (16 tokens x top-2 over
    4 experts: 8 copies each, 16 for each EP rank) has alike EP positions, so one rank per stage is
    generated (rank classes of EP block x EP position) and replayed folded; the time equals the replay of
    every rank unfolded."""
    spec = {
        "model": {"name": "tiny-moe", "layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "vocab": 256,
                  "seq_len": 16, "moe": {"experts": 4, "top_k": 2, "expert_ffn": 32}},
        "seq_len": 16, "distributed_optimizer": True,
        "parallel": {"gpu": "H100", "pp": 2, "dp": 4, "ep": 2, "micro_batch": 1, "global_batch": 8},
    }  # fmt: skip
    run = vm.MoeCpRun("tiny", "llama3-paper", "w", 8, "tokens_per_s_per_gpu", 1.0, spec, "dgx-h100")
    p = vm.predict(run)
    assert p.method == "replayed, 2 of 8 ranks simulated", p.method
    full = vm._validate_published().replay_spec(vm.spec_for(run), fold=False)
    assert p.seconds == full.iteration_ns / 1e9


def _tiny_all_gather_cp_run() -> vm.MoeCpRun:
    """A tiny all-gather CP plan (not a published run): DP 3 x CP 4 = 12 ranks on DGX H100 nodes of 8."""
    spec = {
        "model": {"name": "tiny", "layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "vocab": 256,
                  "seq_len": 32},
        "seq_len": 32, "attention": "flash", "cp_comm_type": "all_gather",
        "parallel": {"gpu": "H100", "tp": 1, "dp": 3, "cp": 4, "micro_batch": 1, "global_batch": 6},
    }  # fmt: skip
    return vm.MoeCpRun("tiny", "llama3-paper", "w", 12, "tokens_per_s_per_gpu", 1.0, spec, "dgx-h100")


def test_a_refused_rank_class_fold_over_the_budget_is_reported_not_run_unfolded():
    """A tiny all-gather CP plan (not a published run): DP 3 x CP 4 = 12 ranks on DGX H100 nodes of 8, so
    the DP gradient AllReduce over all 12 finishes rank 1 (CP position 1) apart from rank 0 and the
    network check refuses the rank classes. Within a budget that holds the one written rank but not the
    fallback's data replica (4 CP positions), the refusal is the row's one line; with room, the fallback
    replays."""
    run = _tiny_all_gather_cp_run()
    # one rank written: 2 layers x 2 micro-batches (6 / DP 3) x (38 + 2) nodes
    assert vm.estimate_nodes(load_spec(vm.spec_for(run))) == (160, 1)
    p = vm.predict(run, max_nodes=160)
    assert p.seconds is None and p.method.startswith("refused by xsim: cannot fold: network model"), p.method
    assert vm.predict(run, max_nodes=10_000).seconds is not None


def test_a_fold_fallback_runs_only_within_the_budget():
    """The replay's fallbacks after a refused rank-class fold are the set's data replicas, then every rank
    unfolded (replay.simulation.simulate, fold "auto"); each runs only where it fits the budget (round
    dgxccp: at --max-nodes 8,000,000 the 192-GPU Llama 3.1 405B row's estimate, 582,120 nodes x 8 TP
    positions = 4.66 M, let the fold fall through to all 192 ranks, ~19 M nodes, past 13 GB resident). The
    tiny all-gather CP plan above: 160 nodes for its one written rank, 4 rank-class positions (a data
    replica: 4 x 160 = 640), 12 ranks unfolded (12 x 160 = 1,920). Its data replicas are refused too
    (rank 4's AllReduce ends apart from rank 0's), so below 1,920 the row is the first refusal's line, and
    at 1,920 it replays unfolded (every rank simulated)."""
    run = _tiny_all_gather_cp_run()
    dep = load_spec(vm.spec_for(run))
    assert vm.estimate_nodes(dep) == (160, 1) and vm._positions(dep) == 4
    for budget in (640, 1_919):  # the data replica fits, the unfolded set does not
        p = vm.predict(run, max_nodes=budget)
        assert p.seconds is None and p.method.startswith("refused by xsim: cannot fold: network model")
        assert "finishes rank 1 " in p.method, p.method  # the rank-class fold's reason, the first
    p = vm.predict(run, max_nodes=1_920)
    assert p.seconds is not None and p.method == "replayed", p.method


def test_qwen3_30b_ep_groups_fill_one_dgx_and_the_dispatch_runs_at_nvlink_rate(data):
    """Megatron-Bridge initializes Megatron-Core with order tp-cp-ep-dp-pp (xsim's `order: tp-dp-pp`), so
    at TP 1, PP 2, DP 8, EP 8 stage 0's EP group is GPUs 0-7 (node 0) and stage 1's GPUs 8-15. One
    all-to-all of a micro-batch (2 x 4,096 tokens, top-8 of 128 experts, hidden 2,048, BF16: FP8 runs
    dispatch the BF16 hidden states, Megatron-Core token_dispatcher.py) sends every rank 8,192 x 8 / 8
    copies of 2,048 x 2 B per peer, 268,435,456 B per rank in all; on one DGX H100 the 7 peers share the
    GPU's NVLink at NCCL's 370.8 GB/s: T = 7/8 x S / 370.8 GB/s + 2 x 20.44 ns = 633,485 ns. (The
    default order tp-pp-dp put stage 0 on the even ranks of both nodes: 4 of 7 peers behind the 50 GB/s
    NIC, 4 x S/8 / 50 GB/s = 2.68 ms, the 2.69 ms the table's earlier rows paid.)"""
    from xsim.netmodels.api import CollectiveSpec
    from xsim.netmodels.cluster import topology_from_spec
    from xsim.netmodels.models import build_model
    from xsim.tracegen.moe_ops import even_bytes, moe_loads
    from xsim.tracegen.spec import model_arch

    run = next(r for r in data.runs if r.id == "mbridge2511-qwen3-30b-a3b-16xh100")
    dep = load_spec(vm.spec_for(run))
    stage_ranks = {
        s: sorted(r for dg in dep.device_groups if dg.pp_stage == s for r in dg.ranks) for s in (0, 1)
    }
    assert stage_ranks == {0: list(range(8)), 1: list(range(8, 16))}
    ep_group = sorted(dg.ranks[0] for dg in dep.device_groups if dg.pp_stage == 0 and dg.dp_replica // 8 == 0)
    assert ep_group == list(range(8))
    moe = model_arch(dep).moe
    per_peer = even_bytes(moe_loads(moe, 2 * 4096, 1, 8), moe, 8, 2048, dep.dtype_bytes)
    assert per_peer == 2 * 4096 * 8 // 8 * 2048 * 2 == 33_554_432
    size = 8 * per_peer
    assert size == 268_435_456
    net = build_model("analytical", topology_from_spec("dgx-h100:2"))
    t = net.fixed_collective_ns(CollectiveSpec("all_to_all", size, tuple(ep_group)))
    assert t == pytest.approx(7 / 8 * size / 370.8 + 2 * 20.44, abs=1)
    assert t == pytest.approx(633_485, abs=1)


def test_rows_not_replayed_keep_the_pages_line(data):
    """--only with --out: the rows not replayed keep the page's previous numbers, marked as kept."""
    page = PAGE.read_text(encoding="utf-8")
    kept = vm.kept_predictions(page, data.runs)
    assert set(kept) == {r.id for r in data.runs}
    llama = kept["llama3-405b-longctx-16384xh100"]
    assert llama.seconds is not None and llama.method.endswith("(kept from the page's previous run)")
    assert (
        vm.kept_predictions(page.replace(f"| {llama.seconds:.3f} |", "| x |"), data.runs)[
            "llama3-405b-longctx-16384xh100"
        ].seconds
        is None
    )


def test_the_table_says_dropless_or_padded_capacity(data):
    text = {r.id: vm.config_text(r) for r in data.runs}
    assert "128 experts top-8 ffn768 dropless uniform" in text["mbridge2511-qwen3-30b-a3b-16xh100"]
    assert "ffn768 capacity 1.0 padded" in text["mbridge2509-qwen3-30b-a3b-tokendrop-16xh100"]


def test_the_405b_ring_cp_rows_fold_tp_positions_and_estimate_the_counted_nodes():
    """Megatron-Bridge's Llama 3.1 405B (TP 8, PP 8, CP 2 ring, VP 8, DP 8; 1,024 ranks): the TP positions
    fold (tracegen.compact), so one CP block's TP-0 ranks are generated: 2 CP positions x 8 stages = 16.
    Their layer slots: 8 chunks x 2 layers x 16 ranks = 256, less the embedding's and the loss's slots in
    the split = 252; 512 / DP 8 = 64 micro-batches; per (rank, layer, micro-batch) 38 + ring (8 x 2 - 6 = 10)
    + FP8 14 + userbuffers at TP 8 (8 x 8 - 2 = 62) = 124 (the generator writes 2,002,800 at 64: within 0.2%)."""
    run = next(r for r in vm.load_dataset().runs if r.id == "mbridge2511-llama31-405b-1024xh100")
    dep = load_spec(vm.spec_for(run))
    assert vm.estimate_nodes(dep) == (252 * 64 * 124, 16) == (1_999_872, 16)
    assert vm._positions(dep) == 8


def test_dgxc_llama31_cp_rows_as_the_recipe_prints_them_by_hand(data):
    """NVIDIA/dgxc-benchmarking v25.03 llama3.1 (round dgxccp): the README tables print seconds per step,
    taken as printed (`iteration_s`, no conversion); each row's layout gives the table's GA and GPU count,
    and its model the yaml's sizes. By hand: 8B GBS 128 / (MBS 1 x DP 8/(1 x 1 x 2) = 4) = GA 32, and
    2,048 / 64 = 32 on 128 GPUs; 70B 128 / (64/(4 x 4 x 2) = 2) = 64, 2,048 / 32 = 64; 405B 252 /
    (576/(8 x 9 x 2) = 4) = 63. Vocabularies as the profile pads them (make_vocab_size_divisible_by 128 x TP):
    128,256 at TP 1 stays (1,002 x 128); at TP 4 ceil(128,256 / 512) x 512 = 251 x 512 = 128,512; the 405B
    run's GPT-2 tokenizer, 50,257 at TP 8: ceil(50,257 / 1,024) x 1,024 = 50 x 1,024 = 51,200."""
    from xsim.tracegen.spec import model_arch

    rows = {r.id: r for r in data.runs if r.source == "dgxc-llama31-2502"}
    expect = {  # id tail: (seconds per step printed, GA printed, padded vocabulary, layers per model chunk)
        "8b-bf16-8xh100": (12.78, 32, 128_256, 32),
        "8b-fp8-8xh100": (9.44, 32, 128_256, 32),
        "8b-bf16-128xh100": (13.16, 32, 128_256, 32),
        "8b-fp8-128xh100": (9.73, 32, 128_256, 32),
        "70b-bf16-64xh100": (14.61, 64, 128_512, 80 // (4 * 5)),
        "70b-fp8-64xh100": (10.46, 64, 128_512, 4),
        "70b-bf16-1024xh100": (14.86, 64, 128_512, 4),
        "70b-fp8-1024xh100": (10.83, 64, 128_512, 4),
        "405b-bf16-576xh100": (17.50, 63, 51_200, 126 // (9 * 7)),
        "405b-fp8-576xh100": (11.00, 63, 51_200, 2),
        # reduced depth (configure.sh): 42 layers on PP 3 x VP 7, 21 on PP 3 x VP 7, 7 on one stage;
        # GA 252 / (192/(8 x 3 x 2) = 4) = 63, 126 / (96/48 = 2) = 63, 126 / (32/16 = 2) = 63
        "405b-bf16-192xh100": (17.30, 63, 51_200, 42 // (3 * 7)),
        "405b-fp8-192xh100": (10.8, 63, 51_200, 2),
        "405b-bf16-96xh100": (8.87, 63, 51_200, 21 // (3 * 7)),
        "405b-fp8-96xh100": (5.63, 63, 51_200, 1),
        "405b-bf16-32xh100": (9.00, 63, 51_200, 7),
        "405b-fp8-32xh100": (5.75, 63, 51_200, 7),
    }
    assert set(rows) == {f"dgxc2502-llama31-{k}" for k in expect}
    for tail, (seconds, ga, vocab, per_chunk) in expect.items():
        run = rows[f"dgxc2502-llama31-{tail}"]
        p = run.parallel
        assert vm.measured_seconds(run) == seconds
        assert p["global_batch"] // (p["micro_batch"] * p["dp"]) == ga
        assert run.gpus == p["tp"] * p["pp"] * p["dp"] * p["cp"] == int(tail.split("-")[-1][: -len("xh100")])
        assert p["cp"] == 2 and run.spec["cp_comm_type"] == "p2p"
        dep = load_spec(vm.spec_for(run))
        assert model_arch(dep).vocab == vocab
        assert run.spec["model"]["layers"] // (p["pp"] * p.get("virtual_stages", 1)) == per_chunk
        assert ("fp8" in tail) == (run.spec["precision"] == "fp8") == bool(run.spec.get("fp8_params"))
    assert "(step time)" in vm.runs_table([vm.Prediction(rows["dgxc2502-llama31-8b-bf16-8xh100"], 1.0, "x")])


def test_a_printed_step_time_is_taken_as_it_is_and_grok1s_padded_capacity_by_hand(data):
    """NVIDIA dgxc-benchmarking's READMEs print seconds per step (`measured: {iteration_s: ...}`): Grok-1's
    8-GPU BF16 proxy 24.00 s, the README's 174,762 tokens/s = 1,024 x 4,096 / 24.00 (174,762.7, cut).
    Its routing (capacity factor 1.0, padded to capacity): each TP rank routes its 4,096 / 4 = 1,024
    sequence-parallel tokens, top-2 of 8 experts: capacity ceil(1,024 x 2 / 8) = 256 copies an expert and
    source. Rank 0 (EP 0 of 2, TP 0 of 4) sends its EP peer 4 experts x 256 copies x 6,144 x 2 B =
    12,582,912 B: one ALL_TO_ALL of 2 x that = 25,165,824 B; it receives 2 sources x 4 x 256 = 2,048 copies
    (25,165,824 B, the TP all-gather's share), and the 4 x 2,048 = 8,192 gathered copies run through a
    quarter of each expert's GeGLU up/gate (2 x 32,768 / 4 = 16,384 wide): 2 x 8,192 x 6,144 x 16,384 =
    1,649,267,441,664 FLOPs forward."""
    from xsim.tracegen import generate
    from xsim.traces import attrs as A

    run = next(r for r in data.runs if r.id == "dgxc2502-grok1-314b-proxy2l-8xh100-bf16")
    assert vm.measured_seconds(run) == 24.00
    assert int(1024 * 4096 / 24.00) == 174_762
    spec = vm.spec_for(run)
    spec["parallel"] = {**spec["parallel"], "global_batch": 2}  # one micro-batch a replica
    nodes = {n.name: n for n in generate(load_spec(spec), rewrite=False, only=[0]).nodes[0]}

    def attr(name, key):
        a = {x.name: x for x in nodes[name].attr}[key]
        return getattr(a, a.WhichOneof("value"))

    assert attr("L1.moe_dispatch.fwd.mb0", A.COMM_SIZE) == 2 * 4 * 256 * 6144 * 2 == 25_165_824
    assert attr("L1.moe_tp_gather.fwd.mb0", A.COMM_SIZE) == 2 * 4 * 256 * 6144 * 2
    assert attr("L1.moe_expert_up_gate.fwd.mb0", A.NUM_OPS) == 2 * 8192 * 6144 * 16384 == 1_649_267_441_664
