"""Compute slowed by concurrent communication (tracegen/contention.py, docs/compute.md "Communication
holds SMs"): hand-computed wave counts and the generator's choice of which nodes run under a collective."""

from __future__ import annotations

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.catalog import gpu as gpu_spec
from xsim.tracegen.contention import (
    NCCL_DP_CTAS,
    SYSTEM_LINKS,
    TE_UB_SMS,
    CommWindow,
    busy_fractions,
    comm_ctas,
    dp_comm_ctas,
    nccl_node_channels,
    with_free_sms,
)
from xsim.tracegen.errors import SpecError
from xsim.tracegen.gemm import gemm_compute
from xsim.tracegen.spec import spec_to_mapping
from xsim.traces import attrs as A
from xsim.traces import pb


def test_one_wave_gemm_next_to_a_24_block_allgather_takes_twice_as_long():
    # NVIDIA developer forum ("Compute-Communication Overlap Causes Severe GEMM Performance Degradation
    # because of Tail Effect"): a GEMM of exactly 132 blocks on an H100 nearly doubles next to a 24-block
    # ncclAllGather. 3072 x 1408 outputs = 12 x 11 = 132 tiles of 256 x 128: one wave on 132 SMs, two on
    # the 108 left; each SM keeps its own rate (peak / 132 per SM either way), so exactly 2x.
    h100 = gpu_spec("H100")
    alone = gemm_compute(3072, 4096, 1408, h100)
    shared = gemm_compute(3072, 4096, 1408, with_free_sms(h100, 24))
    assert (alone.waves, alone.tile) == (1, (256, 128))
    assert shared.waves == 2 and shared.seconds == pytest.approx(2 * alone.seconds, rel=1e-12)


def test_free_sms_scale_the_peaks_per_sm():
    a100 = gpu_spec("A100-80GB")
    left = with_free_sms(a100, NCCL_DP_CTAS)
    assert left.sms == 92 and left.peak_flops == pytest.approx(312e12 * 92 / 108)
    h100 = with_free_sms(gpu_spec("H100"), TE_UB_SMS)
    assert h100.sms == 116 and h100.fp8_flops == pytest.approx(1979e12 * 116 / 132, rel=1e-3)
    # A 6912 x 16384 GEMM is 54 x 128 = 6,912 tiles of 256 x 128: 64 waves on 108 SMs, 76 on 92 (75.1 of
    # work), each wave at the same per-SM rate: 76 / 64 of the time.
    r = gemm_compute(6912, 2048, 16384, left).seconds / gemm_compute(6912, 2048, 16384, a100).seconds
    assert r == pytest.approx(76 / 64, rel=1e-12)


def test_busy_fractions_hand_computed():
    # Compute nodes 0, 1, 3, 4 of 100 ns each: on the compute-time axis [0,100], [100,200], [200,300],
    # [300,400]. Collective A (node 2, issued after node 1: t = 200) would last 150 ns, but node 4 waits
    # for it at t = 300: in flight over [200, 300], and done at 300 on the axis (the wait is not on it).
    # Collective B, issued at node 2 too, starts when A is done (t = 300) and lasts 50 ns: [300, 350],
    # half of node 4.
    comp = [(0, 100), (1, 100), (3, 100), (4, 100)]
    windows = [CommWindow(2, 4, 150e-9), CommWindow(2, 10, 50e-9)]
    assert busy_fractions(comp, windows) == {3: 1.0, 4: 0.5}


def test_busy_fractions_count_one_cta_class():
    # The example above with A held by a 24-CTA communicator and B by a 16-CTA one (an intra-node shard
    # group and an inter-node replicate group on one DP stream): B still starts when A is done (t = 300),
    # but each class counts only its own windows: A covers node 3 whole, B half of node 4.
    comp = [(0, 100), (1, 100), (3, 100), (4, 100)]
    windows = [CommWindow(2, 4, 150e-9, 24), CommWindow(2, 10, 50e-9, 16)]
    assert busy_fractions(comp, windows, 24) == {3: 1.0}
    assert busy_fractions(comp, windows, 16) == {4: 0.5}
    assert busy_fractions(comp, windows) == {3: 1.0, 4: 0.5}


def test_a_dp_group_inside_one_node_holds_the_nodes_nccl_channels():
    # NCCL builds a communicator's channels from its own topology: 8 GPUs of one DGX A100 get the
    # intra-node ring search's 24 (12 NVLinks x 20 GB/s: 6 at 40 -> 12 -> 24, as for a TP group), not the
    # inter-node ring graph's 2 x 8 NICs = 16; a group over 2 nodes keeps 16; the A800's 8 NVLinks give 16
    # either way; without a system preset the DP default 16 stays.
    a100, a800 = SYSTEM_LINKS["dgx-a100"], SYSTEM_LINKS["dgx-a800"]
    assert dp_comm_ctas(range(8), a100) == 24
    assert dp_comm_ctas(range(0, 16, 2), a100) == NCCL_DP_CTAS == 16
    assert dp_comm_ctas(range(8), a800) == 16
    assert dp_comm_ctas(range(8), None) == NCCL_DP_CTAS


def test_generated_dp_collectives_hold_their_communicators_ctas():
    # The DP AllReduces of DP 8 on one DGX A100 hold 24 SMs: the same durations as `dp_comm_ctas: 24`
    # and longer than under 16; DP 16 over two nodes holds 16 (the same as `dp_comm_ctas: 16`).
    def durations(dp: int, **extra) -> dict[str, int]:
        spec = _spec(cluster="dgx-a100", **extra)
        spec["parallel"] = {"gpu": "A100-80GB", "dp": dp, "global_batch": 2 * dp}
        return {n.name: _ns(n) for n in generate(load_spec(spec), rewrite=False).nodes[0]}

    node = durations(8)
    assert node == durations(8, dp_comm_ctas=24)
    assert sum(node.values()) > sum(durations(8, dp_comm_ctas=16).values())
    assert durations(16) == durations(16, dp_comm_ctas=16)


def _timed(spec: dict) -> tuple[list, dict]:
    """Rank 0's nodes generated with the collectives timed by the replay's default network model on the
    spec's cluster (xsim.api.network.deployment_collective_seconds), and each (kind, size, ranks) it timed,
    in ns."""
    from xsim.api.network import deployment_collective_seconds

    dep = load_spec(spec)
    timer = deployment_collective_seconds(dep)
    assert timer is not None
    calls: dict = {}

    def rec(kind: str, size: int, ranks: tuple[int, ...]) -> float:
        calls[(kind, size, ranks)] = timer(kind, size, ranks) * 1e9
        return calls[(kind, size, ranks)] / 1e9

    return generate(dep, rewrite=False, comm_time=rec).nodes[0], calls


def test_a_dp_window_across_two_nodes_is_the_nccl_models_time():
    # TP 8 x DP 2 on two DGX H100 nodes: rank 0's DP group is (0, 8), one GPU per node. A layer's gradient
    # bucket: 4 x 2,048^2 + 3 x 2,048 x 8,192 = 67,108,864 weights / TP 8 x 4 B = 33,554,432 B, + the two
    # norms' 2 x 2,048 x 4 B (whole on every TP rank) = 33,570,816 B. The analytical model (NCCL mode) runs
    # it as ring/Simple: 2 steps (reduce-scatter, all-gather), each S/2 = 16,785,408 B over the 400 Gb/s NIC
    # (50 B/ns; PCIe 64 B/ns is faster) = 335,708.16 ns; NCCL's latencies: base 8.4 us + 2 network steps x
    # 14.0 us (Simple, one GPU a node: the tree's network latency, netmodels/nccl.py) = 36,400 ns; the route
    # GPU -> PCIe (287.5) -> NIC (368) -> NIC (368) -> PCIe (287.5) = 1,311 ns a step. 671,416.32 + 36,400 +
    # 2,622 = 710,438.32 -> 710,439 ns (ceil): the window, not the line rate's 2 x 16,785,408 / 50e9 s.
    spec = {
        "model": MODEL, "parallel": {"gpu": "H100", "tp": 8, "dp": 2, "global_batch": 4},
        "compute_model": "roofline", "overlap_grad_reduce": True, "dp_bucket_bytes": 1, "cluster": "dgx-h100",
    }  # fmt: skip
    nodes, calls = _timed(spec)
    assert calls[("all_reduce", 33_570_816, (0, 8))] == 710_439
    # Every collective the rank places on its DP or overlapped-TP stream was timed by the model.
    dp = {A.comm_size(n) for n in nodes if n.name.startswith("dp_grad_allreduce")}
    assert dp and dp <= {size for (_, size, ranks) in calls if ranks == (0, 8)}


def test_a_tp_window_inside_one_node_is_the_nccl_models_time():
    # TP 2 SP on one DGX H100: fc1's backward re-gathers its input (AllGather of 1,024 tokens x 2,048 x 2 B =
    # 4,194,304 B per rank) and reduce-scatters the dgrad (2,048 x 2,048 x 2 B = 8,388,608 B). Ring/Simple
    # over ranks (0, 1): one step of 4,194,304 B at NVLink's 450 GB/s x NCCL's 20.6/25 = 370.8 B/ns =
    # 11,311.5 ns, + base 8.4 us + one NVLink step 3.4 us + GPU -> NVSwitch -> GPU 2 x 20.44 ns =
    # 23,152.4 -> 23,153 ns for both.
    spec = {
        "model": MODEL, "parallel": {"gpu": "H100", "tp": 2}, "compute_model": "roofline",
        "sequence_parallel": True, "cluster": "dgx-h100",
    }  # fmt: skip
    _, calls = _timed(spec)
    assert calls == {("all_gather", 4_194_304, (0, 1)): 23_153, ("reduce_scatter", 8_388_608, (0, 1)): 23_153}


def test_system_links_agree_with_netmodels_presets():
    from xsim.netmodels.nccl import NVLINK_SIMPLE_EFFICIENCY
    from xsim.netmodels.presets import system_preset

    for name, links in SYSTEM_LINKS.items():
        p = system_preset(name)
        assert links.gpus_per_node == p.gpus_per_node
        # NVLinks x the link's line rate = the preset's (25 GB/s links; NVLink 5 on the Blackwell presets:
        # 50 GB/s links); NVLinks x NCCL's figure per link = the line rate x netmodels' NCCL share.
        assert p.nvlink_bandwidth == pytest.approx(links.nvlinks * (50e9 if links.sm100 else 25e9))
        eff = NVLINK_SIMPLE_EFFICIENCY[p.gpus[0]]
        assert links.nvlinks * links.nccl_link_gbps * 1e9 == pytest.approx(p.nvlink_bandwidth * eff)


# Big enough that the GEMMs are compute-bound in the roofline model (time = FLOPs / (peak x gemm_eff)).
MODEL = {"layers": 2, "hidden": 2048, "ffn_hidden": 8192, "heads": 16, "vocab": 1024, "seq_len": 2048}


def _spec(**extra) -> dict:
    return {
        "model": MODEL,
        "parallel": {"gpu": "H100", "dp": 2, "global_batch": 4},
        "compute_model": "roofline",
        "overlap_grad_reduce": True,
        "dp_bucket_bytes": 1,  # a bucket per layer: the first is issued after layer 2's last backward
        **extra,
    }


def _ns(n: pb.Node) -> int:
    return A.get_int(n, A.DURATION_NS, 0)


def test_compute_under_a_gradient_bucket_runs_on_the_sms_nccl_leaves():
    on = generate(load_spec(_spec()), rewrite=False).nodes[0]
    off = generate(load_spec(_spec(comm_sm_contention=False)), rewrite=False).nodes[0]
    assert [n.name for n in on] == [n.name for n in off]
    first_bucket = next(n.id for n in on if n.name.startswith("dp_grad_allreduce.bucket0"))
    grad_norm = next(n.id for n in on if n.name == "grad_norm.opt")
    changed = {n.name for n, m in zip(on, off, strict=True) if _ns(n) != _ns(m)}
    # Only compute between the first bucket's issue (the head's, after final_norm's backward of the last
    # micro-batch) and the optimizer step (which waits for the last bucket): the layers' backward of
    # micro-batch 1; its memory-bound kernels keep their time, its GEMMs and attention take 132/116 of it
    # (roofline: FLOPs over the peak the 116 free SMs give).
    under = [n for n in on if first_bucket < n.id < grad_norm and n.type == pb.COMP_NODE]
    assert changed and changed <= {n.name for n in under}
    assert {n.split(".")[0] for n in changed} == {"L1", "L2"}
    assert all(n.endswith(".bwd.mb1") for n in changed)
    by = {m.name: m for m in off}
    for n in under:
        if n.name.startswith(("L1.mlp_up_gate", "L2.mlp_down", "L1.attn_core")):
            assert _ns(n) == pytest.approx(_ns(by[n.name]) * 132 / 116, abs=2)
        if n.name.startswith(("L1.mlp_act", "L2.rope", "L1.attn_norm")):
            assert _ns(n) == _ns(by[n.name])
    # The same GEMM of micro-batch 0 ran before any collective: untouched.
    assert "L1.mlp_up_gate.bwd.mb0" in by and "L1.mlp_up_gate.bwd.mb0" not in changed


def test_the_network_models_time_narrows_the_window():
    # On a DGX H100 the DP2 AllReduce of a layer's ~67 M gradients takes ~0.6 ms in the network model, less
    # than the layer's backward: only the compute right after each issue is charged, part of it. Without a
    # timer each collective is held up to its first consumer.
    plain = {
        n.name: _ns(n) for n in generate(load_spec(_spec(comm_sm_contention=False)), rewrite=False).nodes[0]
    }
    bound = generate(load_spec(_spec()), rewrite=False).nodes[0]
    timed = _timed(_spec(cluster="dgx-h100"))[0]
    changed_bound = {n.name for n in bound if _ns(n) != plain[n.name]}
    changed_timed = {n.name for n in timed if _ns(n) != plain[n.name]}
    assert changed_timed and changed_timed < changed_bound
    assert sum(_ns(n) for n in timed) < sum(_ns(n) for n in bound)


def test_te_pipeline_and_bulk_gemm_chunks_run_on_the_sms_userbuffers_leave():
    spec = {
        "model": MODEL, "device_groups": [{"gpu": "H100", "ranks": [0, 1]}], "compute_model": "roofline",
        "sequence_parallel": True, "tp_comm_overlap": True,
    }  # fmt: skip
    on = generate(load_spec(spec), rewrite=False).nodes[0]
    off = {
        n.name: n for n in generate(load_spec({**spec, "comm_sm_contention": False}), rewrite=False).nodes[0]
    }
    # pipeline (forward GEMM then its ReduceScatter): every chunk on 132 - 16 SMs; bulk (backward): the
    # wgrad half only; ring_exchange (AllGather then GEMM, copy engines): none.
    for n in on:
        # (the LM head is Megatron's ColumnParallelLinear, not TE's: its NCCL collectives, tested below)
        if ".chunk" not in n.name or n.type != pb.COMP_NODE or "lm_head" in n.name:
            continue
        ratio = _ns(n) / _ns(off[n.name])
        pipeline = "attn_out_proj.fwd" in n.name or "mlp_down.fwd" in n.name
        bulk_wgrad = (
            ".bwd." in n.name and n.name.endswith("chunk1") and ("qkv_proj" in n.name or "mlp_up" in n.name)
        )
        want = 132 / 116 if pipeline or bulk_wgrad else 1.0
        assert ratio == pytest.approx(want, abs=1e-3), n.name  # chunk parts round to ns


def test_comm_sm_contention_key():
    dep = load_spec(_spec(comm_sm_contention=False))
    assert dep.comm_sm_contention == "off" and spec_to_mapping(dep)["comm_sm_contention"] is False
    assert "comm_sm_contention" not in spec_to_mapping(load_spec(_spec()))
    with pytest.raises(SpecError, match="comm_sm_contention must be true or false"):
        load_spec(_spec(comm_sm_contention="yes"))


def test_launch_script_sm_counts_reach_the_durations():
    # MLPerf's NVIDIA GPT-3 configs set them: DP communicator max_ctas 8, TE proj_fprop num_sm 24,
    # fc2_fprop 1 (conf/nccl/custom_communicator_cta.yaml, conf/tp_overlap/h100tp4mbs2.yaml).
    spec = {
        "model": MODEL, "device_groups": [{"gpu": "H100", "ranks": [0, 1]}], "compute_model": "roofline",
        "sequence_parallel": True, "tp_comm_overlap": True, "tp_overlap_sms": {"proj_fprop": 24, "fc2_fprop": 1},
    }  # fmt: skip
    on = generate(load_spec(spec), rewrite=False).nodes[0]
    off = {
        n.name: n for n in generate(load_spec({**spec, "comm_sm_contention": False}), rewrite=False).nodes[0]
    }
    ratio = {n.name: _ns(n) / _ns(off[n.name]) for n in on if ".chunk" in n.name and n.type == pb.COMP_NODE}
    assert ratio["L1.attn_out_proj.fwd.mb0.chunk0"] == pytest.approx(132 / 108, abs=1e-3)
    assert ratio["L1.mlp_down.fwd.mb0.chunk0"] == pytest.approx(132 / 131, abs=1e-3)
    assert ratio["L1.qkv_proj.bwd.mb0.chunk1"] == pytest.approx(132 / 116, abs=1e-3)  # default 16
    dp = generate(load_spec(_spec(dp_comm_ctas=8)), rewrite=False).nodes[0]
    plain = {
        n.name: _ns(n) for n in generate(load_spec(_spec(comm_sm_contention=False)), rewrite=False).nodes[0]
    }
    n = next(n for n in dp if n.name == "L1.mlp_up_gate.bwd.mb1")
    assert _ns(n) / plain[n.name] == pytest.approx(132 / 124, abs=1e-4)
    mapping = spec_to_mapping(load_spec({**spec, "dp_comm_ctas": 8}))
    assert mapping["tp_overlap_sms"] == {"fc2_fprop": 1, "proj_fprop": 24} and mapping["dp_comm_ctas"] == 8


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"dp_comm_ctas": 0}, "dp_comm_ctas must be >= 1"),
        ({"tp_overlap_sms": {"qkv_fprop": 2}}, "tp_overlap_sms: unknown layer 'qkv_fprop'"),
        ({"tp_overlap_sms": {"proj_fprop": -1}}, "tp_overlap_sms: proj_fprop must be >= 0"),
        ({"tp_overlap_sms": 16}, "tp_overlap_sms must be a mapping"),
    ],
)
def test_bad_sm_counts_are_one_line(extra, message):
    with pytest.raises(SpecError, match=message):
        load_spec(_spec(**extra))


def test_overlapped_tp_collectives_of_the_backward_hold_nccl_ctas():
    # TP 2 SP on a DGX H100, Megatron-Core without userbuffers: fc1's backward re-gathers its input under
    # the dgrad half and reduce-scatters the dgrad under the wgrad half, both 23,153 ns in the network model
    # (test_a_tp_window_inside_one_node_is_the_nccl_models_time). A half under it for that share of its time
    # runs on 132 - 24 SMs (NCCL's 24 channels on a DGX H100 node, nccl_node_channels): roofline time x
    # 132/108 for that share.
    spec = {
        "model": MODEL, "parallel": {"gpu": "H100", "tp": 2}, "compute_model": "roofline",
        "sequence_parallel": True, "cluster": "dgx-h100",
    }  # fmt: skip
    on = {n.name: n for n in _timed(spec)[0]}
    off = {
        n.name: n for n in generate(load_spec({**spec, "comm_sm_contention": False}), rewrite=False).nodes[0]
    }
    wire = 23_153
    for half in ("chunk0", "chunk1"):
        plain = _ns(off[f"L1.mlp_up_gate.bwd.mb0.{half}"])
        frac = min(1.0, wire / plain)
        assert 0 < frac < 1
        want = plain + (plain * 132 / 108 - plain) * frac
        assert _ns(on[f"L1.mlp_up_gate.bwd.mb0.{half}"]) == pytest.approx(want, abs=2)
    # The rest of the layer's backward is not under a collective: unchanged.
    assert _ns(on["L1.mlp_down.bwd.mb0"]) == _ns(off["L1.mlp_down.bwd.mb0"])


def test_nccl_intra_node_channels_follow_its_ring_search():
    # DGX A100: 12 NVLinks x 20 GB/s = 240 GB/s. The search starts at 40 GB/s a channel: 6 channels reach
    # 240, so it stops; 40 >= 25 doubles them to 12 at 20 (ncclTopoDupChannels), and ncclTopoPostset doubles
    # them again: 24 CTAs. (A 4 x A100 node's NCCL log, same 240 GB/s per GPU, prints "nChannels 12, bw
    # 20.000000/20.000000" and "24 coll channels".)
    assert nccl_node_channels(12, 20.0, False) == 24
    # DGX A800: 8 NVLinks, 160 GB/s: 4 channels at 40, doubled to 8 at 20, then 16.
    assert nccl_node_channels(8, 20.0, False) == 16
    # DGX H100: 18 x 20.6 = 370.8 GB/s, SM90 speeds: 6 at 60 = 360 < 370.8, so slower speeds are tried (50:
    # 7 x 50 = 350; 40: 9 x 40 = 360; 30: 12 x 30 = 360; 24 is 0.4 of 60, the search stops): 6 at 60 stays;
    # 60 >= 50 doubles to 12 at 30; the second pass finds no 12 channels at 40 (9 fit): 24.
    assert nccl_node_channels(18, 20.6, True) == 24
    # H800 (8 NVLink4 links, 164.8 GB/s): 60 -> 2 x 60 = 120, 50 -> 3 x 50 = 150, 40 -> 4 x 40 = 160 (best),
    # 30 -> 150, 24 -> 144, 20 -> 8 x 20 = 160 (not larger), 15 is under 0.49 of 40: 4 at 40; SM90 under 50
    # keeps its channels only above 4, so 4 doubles to 8, then 16: NCCL's log on an 8 x H800 node says
    # "16 coll channels" (NVIDIA/nccl issue #892).
    assert nccl_node_channels(8, 20.6, True) == 16


def test_tp_collectives_hold_the_systems_nccl_channels():
    a800, a100 = SYSTEM_LINKS["dgx-a800"], SYSTEM_LINKS["dgx-a100"]
    assert comm_ctas(range(8), a800) == 16 and comm_ctas(range(4), a100) == 24
    # Across nodes a TP group holds a DP collective's CTAs; without a system preset, the DGX A100's 24.
    assert comm_ctas(range(4, 12), a800) == NCCL_DP_CTAS
    assert comm_ctas(range(8), None) == 24
