"""ASTRA-sim-compatible mode: the worked examples of shared/reference/astrasim-analytical.md, to the ns."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from xsim.netmodels import (
    AlgorithmError,
    AstraConfigError,
    CollectiveSpec,
    RankError,
    astra_model,
    simulate_collective,
    simulate_p2p,
)
from xsim.netmodels.astra import CLEAN_SYSTEM, AstraDim, AstraModel, AstraNetwork, AstraSystem

B50 = 50 * 2**30 / 1e9  # 50 GB/s in bytes/ns, GB = 2^30 (reference section 2)
MIB = 1 << 20


def write_configs(tmp_path, topo="Ring", npus=8, bw=50.0, lat=500.0, system=None):
    """Write an ASTRA-sim network.yml and sys.json pair; return their paths."""
    net = tmp_path / "network.yml"
    net.write_text(f"topology: [ {topo} ]\nnpus_count: [ {npus} ]\nbandwidth: [ {bw} ]\nlatency: [ {lat} ]\n")
    sysj = tmp_path / "sys.json"
    sysj.write_text(json.dumps(system or {}))
    return net, sysj


RT_TEMPLATE_SYS = {
    # repo_rt_template_system_cfg.json of ASTRA-sim (shared/peer_configs/astra-sim/system/)
    "scheduling-policy": "LIFO",
    "endpoint-delay": 10,
    "active-chunks-per-dimension": 1,
    "preferred-dataset-splits": 4,
    "all-reduce-implementation": ["ring"],
    "all-gather-implementation": ["ring"],
    "reduce-scatter-implementation": ["ring"],
    "all-to-all-implementation": ["ring"],
    "collective-optimization": "localBWAware",
    "local-mem-bw": 50,
    "boost-mode": 0,
}
CLEAN = {
    "endpoint-delay": 1,
    "preferred-dataset-splits": 1,
    "active-chunks-per-dimension": 1,
    "local-mem-bw": 1e9,
}


def all_reduce(n, size, algorithm=None):
    return CollectiveSpec("all_reduce", size, tuple(range(n)), algorithm)


def test_rt_template_117780(tmp_path):
    net, sysj = write_configs(tmp_path, system=RT_TEMPLATE_SYS)
    c = simulate_collective(astra_model(net, sysj), all_reduce(8, MIB))
    # Reference 3.3 item 5: 4 x (14 x 1110 + 7 x 1965 + 15 x 10)
    assert c.finish_ns == 4 * (14 * 1110 + 7 * 1965 + 15 * 10) == 117780
    assert c.per_rank_finish_ns == (117780,) * 8


def test_halving_doubling_switch8_clean_40183(tmp_path):
    net, sysj = write_configs(
        tmp_path, topo="Switch", system={**CLEAN, "all-reduce-implementation": ["halvingDoubling"]}
    )
    c = simulate_collective(astra_model(net, sysj), all_reduce(8, MIB))
    assert c.finish_ns == 2 * (10765 + 5882 + 3441) + 7 == 40183


def test_double_binary_tree_switch8_clean_123193_and_tree_positions(tmp_path):
    net, sysj = write_configs(
        tmp_path, topo="Switch", system={**CLEAN, "all-reduce-implementation": ["doubleBinaryTree"]}
    )
    c = simulate_collective(astra_model(net, sysj), all_reduce(8, MIB))
    t = math.floor(1000 + MIB / B50)  # one full-chunk message across the switch (2 hops x 500 ns)
    assert c.finish_ns == 6 * t + 7 == 123193
    # DBMAX tree of 8: root 7 -> 3 -> {1, 5} -> leaves {0, 2, 4, 6}; finish by tree position.
    assert c.per_rank_finish_ns[7] == 3 * t + 4
    assert c.per_rank_finish_ns[3] == 4 * t + 5
    assert c.per_rank_finish_ns[1] == c.per_rank_finish_ns[5] == 5 * t + 6
    assert {c.per_rank_finish_ns[i] for i in (0, 2, 4, 6)} == {6 * t + 7}


def test_send_recv_20031_20531_40062():
    clean = CLEAN_SYSTEM
    ring = AstraModel(AstraNetwork((AstraDim("ring", 8, 50, 500),)), clean)
    switch = AstraModel(AstraNetwork((AstraDim("switch", 8, 50, 500),)), clean)
    aware = AstraModel(AstraNetwork((AstraDim("switch", 8, 50, 500),)), clean, congestion_aware=True)
    assert simulate_p2p(ring, 0, 1, MIB).finish_ns == 20031
    assert simulate_p2p(switch, 0, 1, MIB).finish_ns == 20531
    assert simulate_p2p(aware, 0, 1, MIB).finish_ns == 40062


def test_16mib_all_reduce_553883_and_replay_chains():
    # Reference 3.4: 10 x (100 us compute -> 16 MiB AllReduce). The per-collective time 553883 ns comes from
    # Ring-8, 50 GB/s, 500 ns with the "clean" profile: 14 x floor(500 + 2 MiB / B) + 15 x 1.
    model = AstraModel(AstraNetwork((AstraDim("ring", 8, 50, 500),)), CLEAN_SYSTEM)
    spec = all_reduce(8, 16 * MIB)
    assert 14 * math.floor(500 + 2 * MIB / B50) + 15 == 553883
    assert simulate_collective(model, spec).finish_ns == 553883
    # Driven through the engine interface: serial chain, compute then collective, ten times.
    t = 0
    for _ in range(10):
        t += 100_000
        h = model.start_collective(t, spec)
        assert model.next_event_ns() == t + 553883
        (done,) = model.advance(model.next_event_ns())
        assert done.handle == h
        t = done.finish_ns
    assert t == 6538830
    # Collectives serialized after one compute (the overlap case): 100000 + 10 x 553883.
    model = AstraModel(AstraNetwork((AstraDim("ring", 8, 50, 500),)), CLEAN_SYSTEM)
    t = 100_000
    for _ in range(10):
        model.start_collective(t, spec)
        t = model.advance(model.next_event_ns())[0].finish_ns
    assert t == 5638830


@pytest.mark.parametrize("topo,hops", [("Ring", 1), ("FullyConnected", 1), ("Switch", 2)])
@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "all_gather", "all_to_all"])
@pytest.mark.parametrize("n", [4, 16, 64])
def test_ring_closed_form_ex_profile(tmp_path, topo, hops, kind, n):
    sysj = {**RT_TEMPLATE_SYS, "local-mem-bw": 1600}
    net, sysp = write_configs(tmp_path, topo=topo, npus=n, system=sysj)
    size = MIB
    chunk = size // 4
    m = chunk if kind == "all_gather" else chunk // n
    steps = {
        "all_reduce": 2 * (n - 1),
        "reduce_scatter": n - 1,
        "all_gather": n - 1,
        "all_to_all": n * (n - 1) // 2,
    }
    reds = {"all_reduce": n - 1, "reduce_scatter": n - 1, "all_gather": 0, "all_to_all": 0}
    t_msg = math.floor(hops * 500 + m / B50)
    t_chunk = steps[kind] * t_msg + reds[kind] * 3 * math.floor(m / 1600) + (steps[kind] + 1) * 10
    c = simulate_collective(astra_model(net, sysp), CollectiveSpec(kind, size, tuple(range(n))))
    assert c.finish_ns == 4 * t_chunk


def test_congestion_aware_ring_pays_serialization_per_hop(tmp_path):
    net, sysj = write_configs(tmp_path, topo="Switch", system=CLEAN)
    c = simulate_collective(astra_model(net, sysj, congestion_aware=True), all_reduce(8, MIB))
    assert c.finish_ns == 14 * 2 * math.floor(500 + (MIB // 8) / B50) + 15


def test_small_buffer_chunk_rule():
    # Reference 3.3 item 1: with n > chunk, chunk = n and S = splits x n.
    model = AstraModel(
        AstraNetwork((AstraDim("ring", 64, 50, 500),)), AstraSystem(preferred_dataset_splits=4)
    )
    assert model.chunk_sizes("all_reduce", 100, 64) == [64] * 4
    assert model.chunk_sizes("all_gather", 100, 64) == [25] * 4
    assert model.chunk_sizes("all_reduce", MIB + 3, 8) == [MIB // 4] * 4 + [3]


def test_multi_dim_charges_lowest_differing_dimension():
    net = AstraNetwork((AstraDim("switch", 8, 400, 936.25), AstraDim("ring", 2, 50, 1000)))
    model = AstraModel(net, CLEAN_SYSTEM)
    m = np.array([float(MIB)])
    assert model.msg_ns(np.array([0]), np.array([5]), m)[0] == math.floor(
        2 * 936.25 + MIB / (400 * 2**30 / 1e9)
    )
    assert model.msg_ns(np.array([0]), np.array([8]), m)[0] == math.floor(1000 + MIB / B50)
    # 0 -> 13 differs in both dims: charged to dim 0 only.
    assert (
        model.msg_ns(np.array([0]), np.array([13]), m)[0] == model.msg_ns(np.array([0]), np.array([5]), m)[0]
    )
    assert model.num_ranks == 16


def test_multi_dim_local_bw_aware_all_reduce_phases():
    # [Ring 4, Ring 4] clean: RS on dim 0 (m = S/4), AR on dim 1 (m = S/16), AG on dim 0 (m = S/4);
    # each phase pays its own (steps + 1) endpoint delays.
    net = AstraNetwork((AstraDim("ring", 4, 50, 1000), AstraDim("ring", 4, 50, 1000)))
    model = AstraModel(net, CLEAN_SYSTEM)
    s = MIB

    def tm(m):
        return math.floor(1000 + m / B50)

    expect = (3 * tm(s // 4) + 4) + (6 * tm(s // 16) + 7) + (3 * tm(s // 4) + 4)
    assert simulate_collective(model, all_reduce(16, s)).finish_ns == expect
    # A row group (one dimension) is a plain 1-D ring with that dimension's parameters; being smaller than
    # the system it runs on a Local ring whose bundles cost MemBus's fixed 10 ns, not endpoint-delay 1 (issue 14).
    row = CollectiveSpec("all_reduce", s, (0, 1, 2, 3))
    assert simulate_collective(model, row).finish_ns == 6 * tm(s // 4) + 7 * 10


def test_unaware_ring_4096_ranks_closed_form_fast():
    model = AstraModel(AstraNetwork((AstraDim("ring", 4096, 50, 500),)), CLEAN_SYSTEM)
    c = simulate_collective(model, all_reduce(4096, MIB))
    assert c.finish_ns == 2 * 4095 * math.floor(500 + 256 / B50) + 2 * 4095 + 1


def test_errors(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "topology: [ Ring, Ring ]\nnpus_count: [ 2, 2 ]\nbandwidth: [ tbd, tbd ]\nlatency: [ 1, 1 ]\n"
    )
    with pytest.raises(AstraConfigError, match="not a number"):
        astra_model(bad)
    bad.write_text("topology: [ Torus ]\nnpus_count: [ 2 ]\nbandwidth: [ 1 ]\nlatency: [ 1 ]\n")
    with pytest.raises(AstraConfigError, match="unknown topology"):
        astra_model(bad)
    bad.write_text("topology: [ Ring ]\nnpus_count: [ 2, 4 ]\nbandwidth: [ 1 ]\nlatency: [ 1 ]\n")
    with pytest.raises(AstraConfigError, match="2 entries"):
        astra_model(bad)
    bad.write_text("topology: [ Ring\n  npus: : :\n")
    with pytest.raises(AstraConfigError, match="not valid YAML"):
        astra_model(bad)
    bad.write_text("topology: [ Ring ]\nnpus_count: [ 4 ]\nbandwidth: [ 0 ]\nlatency: [ 1 ]\n")
    with pytest.raises(AstraConfigError, match="positive"):
        astra_model(bad)
    net, sysj = write_configs(tmp_path, system={"endpoint-delay": 0})
    with pytest.raises(AstraConfigError, match="endpoint-delay"):
        astra_model(net, sysj)
    net, sysj = write_configs(tmp_path, system={"all-reduce-implementation": ["magic"]})
    with pytest.raises(AstraConfigError, match="magic"):
        astra_model(net, sysj)
    with pytest.raises(AstraConfigError, match="cannot read"):
        astra_model(tmp_path / "missing.yml")
    model = AstraModel(AstraNetwork((AstraDim("ring", 8, 50, 500),)), CLEAN_SYSTEM)
    with pytest.raises(RankError, match="outside"):
        model.start_collective(0, CollectiveSpec("all_reduce", MIB, (0, 8)))
    with pytest.raises(AlgorithmError, match="does not simulate barrier"):
        model.start_collective(0, CollectiveSpec("barrier", 0, (0, 1)))
    two = AstraNetwork((AstraDim("ring", 2, 50, 500), AstraDim("ring", 2, 50, 500)))
    with pytest.raises(AstraConfigError, match="1-dim"):
        AstraModel(two, CLEAN_SYSTEM, congestion_aware=True)
    aware = AstraModel(AstraNetwork((AstraDim("ring", 6, 50, 500),)), CLEAN_SYSTEM, congestion_aware=True)
    with pytest.raises(AlgorithmError, match="power-of-two"):
        aware.start_collective(0, all_reduce(6, MIB, "doubleBinaryTree"))


def test_repeated_collective_reuses_the_closed_form_and_still_validates(tmp_path):
    # The congestion-unaware closed form is remembered per spec: a repeat started later keeps the reference's
    # 117,780 ns (3.3 item 5), and a spec whose ranks are bools (True == 1) is still refused, not matched.
    net, sysj = write_configs(tmp_path, system=RT_TEMPLATE_SYS)
    model = astra_model(net, sysj)
    spec = all_reduce(8, MIB)
    assert model.collective_ns(spec) == (117780,) * 8
    assert model.collective_ns(spec) == (117780,) * 8
    model.start_collective(0, spec)
    model.start_collective(1000, spec)
    done = model.advance(10**9)
    assert [c.finish_ns for c in done] == [117780, 118780]
    with pytest.raises(RankError):
        model.collective_ns(CollectiveSpec("all_reduce", MIB, (0, True, 2, 3, 4, 5, 6, 7)))


def test_astra_mode_does_not_import_the_graph_layer():
    # ASTRA-sim's models compute from network.yml alone; networkx (~0.5 s of imports) is not needed.
    import subprocess
    import sys
    from pathlib import Path

    code = "import sys, netmodels.astra; print('networkx' in sys.modules)"
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert out.stdout.strip() == "False"
