"""ASTRA-sim compatibility: the engine with the ASTRA-sim model gives the closed forms of astrasim-analytical.md.

Every expected number is computed here from the reference's formulas (section 3.3 ring closed form, 3.4
scheduling rules), independently of netmodels' code.
"""

from __future__ import annotations

import json
import math

import pytest
from xsim.netmodels.astra import astra_model
from xsim.replay import DeviceProfile, ReplayConfig, RooflineModel, simulate
from xsim.replay.compute import roofline_ns
from xsim.traces import pb
from xsim.traces.attrs import make_node

from tests.test_replay_support import SHARED, comp, write_set

ET = SHARED / "peer_traces" / "chakra_et"
CFG = SHARED / "peer_configs" / "astra-sim"

pytestmark = pytest.mark.skipif(not ET.is_dir() or not CFG.is_dir(), reason="../shared peer traces absent")


def ring_ns(
    kind: str, size: int, p: int, bw_gbs: float, lat: float, splits: int, ed: int, mem_gbs: float
) -> int:
    """Reference 3.3: n_chunks x (steps x T_msg + n_red x 3 floor(m/L) + (steps+1) x ed), 1 hop per message."""
    b = bw_gbs * 2**30 / 1e9  # bytes/ns, GB = 2^30 (reference section 2)
    chunk = size // splits
    if kind != "all_gather" and p > chunk:
        chunk, size = p, splits * p
    n_chunks = math.ceil(size / chunk)
    steps, m, n_red = {
        "all_reduce": (2 * (p - 1), chunk / p, p - 1),
        "reduce_scatter": (p - 1, chunk / p, p - 1),
        "all_gather": (p - 1, chunk, 0),
        "all_to_all": (p * (p - 1) // 2, chunk / p, 0),
    }[kind]
    t_msg = math.floor(lat + m / b)
    return n_chunks * (steps * t_msg + n_red * 3 * math.floor(m / mem_gbs) + (steps + 1) * ed)


# Ring_4chunks.json ("ex" profile): splits 4, endpoint-delay 10, local-mem-bw 1600; Ring_*npus.yml: 50 GB/s, 500 ns.
EX = dict(bw_gbs=50.0, lat=500.0, splits=4, ed=10, mem_gbs=1600.0)


@pytest.mark.parametrize("n", [4, 8, 16])
@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
def test_microbenchmarks(kind: str, n: int) -> None:
    net = astra_model(
        CFG / f"network/repo_examples_Ring_{n}npus.yml", CFG / "system/repo_examples_Ring_4chunks.json"
    )
    res = simulate(ET / f"astra-sim_microbenchmarks/{kind}/{n}npus_1MB", network=net)
    want = ring_ns(kind, 1 << 20, n, **EX)
    assert res.per_rank_finish_ns == [want] * n
    assert res.collectives.height == 1 and res.collectives["ranks"][0] == n


def test_microbenchmark_anchor_values() -> None:
    # Spot values worked by hand: AllReduce 4 NPUs: m = 65536, T_msg = floor(500 + 1220.70) = 1720,
    # reduction 3 x floor(65536/1600) = 120: 4 chunks x (6 x 1720 + 3 x 120 + 7 x 10) = 43000.
    assert ring_ns("all_reduce", 1 << 20, 4, **EX) == 43000
    # rt_template (reference 3.3): 4 x (14 x 1110 + 7 x 1965 + 15 x 10) = 117780.
    assert ring_ns("all_reduce", 1 << 20, 8, 50.0, 500.0, 4, 10, 50.0) == 117780


def test_tutorial_8npu_allreduce_rt_template() -> None:
    # The 8-NPU tutorial all-reduce with the rt_template configs: the reference's 117780 ns anchor.
    net = astra_model(
        CFG / "network/repo_rt_template_network_cfg.yml", CFG / "system/repo_rt_template_system_cfg.json"
    )
    res = simulate(ET / "tutorials_micro2024_allreduce_8npus_1MB", network=net)
    assert res.per_rank_finish_ns == [117780] * 8


def _artifact(name: str):
    d = ET / f"astra-sim-artifacts_{name}-analytical"
    net = astra_model(d / "inputs/network.yml", d / "inputs/sys.json")
    sysj = json.loads((d / "inputs/sys.json").read_text())
    prof = DeviceProfile(sysj["peak-perf"] * 1e12, sysj["local-mem-bw"] * 1e9)
    return d, net, RooflineModel(profiles={}, default=prof)


def test_t1d_t2d_t3d() -> None:
    # Artifacts: splits 1, endpoint-delay 10, local-mem-bw 50, every dim a 50 GB/s, 1000 ns ring; 1 MiB AllReduces.
    art = dict(bw_gbs=50.0, lat=1000.0, splits=1, ed=10, mem_gbs=50.0)
    # Their COMP nodes carry no num_ops/tensor_size, so roofline falls back to duration_micros (100 us).
    expected = {
        "T1D": ring_ns("all_reduce", 1 << 20, 8, **art),  # one AllReduce over 8 ranks = 103365
        "T2D": 2 * ring_ns("all_reduce", 1 << 20, 4, **art) + 100_000,  # row AR, compute, column AR
        "T3D": 3 * ring_ns("all_reduce", 1 << 20, 2, **art) + 2 * 100_000,  # X AR, comp, Y AR, comp, Z AR
    }
    assert expected["T1D"] == 103365
    for name, want in expected.items():
        d, net, compute = _artifact(name)
        res = simulate(d / "trace", network=net, compute=compute, groups=str(d / "inputs/comm_group.json"))
        assert res.per_rank_finish_ns == [want] * len(res.per_rank_finish_ns), name


def test_mlp_model_parallel_32() -> None:
    # 32-rank MLP (text-converter output) on the TPU v3 32-ring config: 80 GB/s, 2000 ns, splits 1, ed 1, L 50.
    net = astra_model(
        CFG / "network/repo_inputs_tpu_v3_32_ring.yml", CFG / "system/repo_inputs_tpu_v3_32_ring.json"
    )
    res = simulate(ET / "tutorials_micro2024_MLP_ModelParallel_32npus", network=net)
    cfg = dict(bw_gbs=80.0, lat=2000.0, splits=1, ed=1, mem_gbs=50.0)
    us = 1000
    # Forward (rank 0's trace): a strict chain compute -> AllGather over all 32 ranks, five layers + mlp5.
    fwd = [32291, 7488, 7488, 14144, 7488, 9984]
    ag = [37632, 65536, 65536, 147456, 65536, 65536]
    t = sum(f * us for f in fwd) + sum(ring_ns("all_gather", s, 32, **cfg) for s in ag)
    # Backward: IG_l, then WG_l (compute) and AllReduce_l (comm) in parallel; IG_{l-1} waits for both.
    bwd = [
        (9984, 3456, 65536),
        (7488, 3648, 65536),
        (14144, 10368, 147456),
        (7488, 3456, 65536),
        (7488, 3648, 65536),
    ]
    for ig, wg, ar in bwd:
        t += ig * us + max(wg * us, ring_ns("all_reduce", ar, 32, **cfg))
    t += 32291 * us + 12864 * us  # mlp0 IG and WG, no collective
    assert res.per_rank_finish_ns[0] == t
    assert res.summary["num_collectives"][0] == 11


def _clean_system(tmp_path, **over) -> str:
    doc = {
        "scheduling-policy": "LIFO",
        "endpoint-delay": 1,
        "active-chunks-per-dimension": 1,
        "preferred-dataset-splits": 1,
        "all-reduce-implementation": ["ring"],
        "all-gather-implementation": ["ring"],
        "reduce-scatter-implementation": ["ring"],
        "all-to-all-implementation": ["ring"],
        "collective-optimization": "localBWAware",
        "local-mem-bw": 1e9,
        "boost-mode": 0,
        **over,
    }
    p = tmp_path / "clean.json"
    p.write_text(json.dumps(doc))
    return str(p)


def _ar(nid, deps):
    a = {"comm_type": pb.ALL_REDUCE, "comm_size": 16 << 20}
    return make_node(nid, f"ar{nid}", pb.COMM_COLL_NODE, data_deps=deps, attrs=a)


@pytest.mark.parametrize("overlap", [False, True])
def test_compute_and_allreduce_chains(tmp_path, overlap: bool) -> None:
    # Reference 3.4, Ring-8 500 ns "clean" profile: one 16 MiB AllReduce = 553883 ns.
    one = ring_ns("all_reduce", 16 << 20, 8, 50.0, 500.0, 1, 1, 1e9)
    assert one == 553883
    nodes = []
    for i in range(10):
        c, a = 2 * i + 1, 2 * i + 2
        if overlap:  # compute i -> compute i+1; AllReduce i hangs off compute i
            nodes += [comp(c, 100, deps=[c - 2] if i else []), _ar(a, [c])]
        else:  # serial chain compute -> AllReduce -> compute ...
            nodes += [comp(c, 100, deps=[c - 1] if i else []), _ar(a, [c])]
    ts = write_set(tmp_path, [nodes] * 8)
    net = astra_model(CFG / "network/repo_examples_Ring_8npus.yml", _clean_system(tmp_path))
    res = simulate(ts, network=net)
    want = 100_000 + 10 * one if overlap else 10 * (100_000 + one)
    assert want == (5638830 if overlap else 6538830)
    assert res.per_rank_finish_ns == [want] * 8


def test_roofline_reference_values(tmp_path) -> None:
    # Reference 3.4: 2e12 ops / 1e9 B at 700 TFLOPS, 3350 GB/s -> 2857142 ns; 1e9 ops / 1e9 B -> 298507 ns.
    prof = DeviceProfile(700e12, 3350e9)
    assert roofline_ns(2 * 10**12, 10**9, prof) == 2857142
    assert roofline_ns(10**9, 10**9, prof) == 298507
    a = make_node(
        1, "gemm", pb.COMP_NODE, duration_micros=5, attrs={"num_ops": 2 * 10**12, "tensor_size": 10**9}
    )
    b = make_node(2, "ew", pb.COMP_NODE, data_deps=[1], attrs={"num_ops": 10**9, "tensor_size": 10**9})
    c = make_node(
        3, "skip", pb.COMP_NODE, data_deps=[2], duration_micros=7, attrs={"num_ops": 5, "tensor_size": 0}
    )
    d = make_node(
        4, "cpu", pb.COMP_NODE, data_deps=[3], duration_micros=3, attrs={"num_ops": 5, "is_cpu_op": True}
    )
    ts = write_set(tmp_path, [[a, b, c, d]])
    res = simulate(ts, network=None, compute=RooflineModel(profiles={0: prof}), config=ReplayConfig())
    assert res.ops["duration_ns"].to_list() == [2857142, 298507, 0, 3000]


def test_custom_ring_allreduce_as_p2p_workload() -> None:
    # The MSCCL ring all-reduce as send/recv nodes (8 ranks, 131072 B per step). Reference 3.3 item 9: a
    # send/recv costs T_msg only: floor(500 + 131072 / 53.687) = 2941 ns on Ring-8 50 GB/s 500 ns. Every
    # rank: 7 x (send -> recv -> 7 us reduce) then 7 x (send -> recv); a recv completes when its send's
    # data arrives (all ranks move in lockstep): 14 x 2941 + 7 x 7000 = 90174 ns.
    net = astra_model(CFG / "network/repo_examples_Ring_8npus.yml")
    res = simulate(ET / "astra-sim_custom_ring_allreduce_8npus_1MB", network=net)
    t_msg = math.floor(500 + 131072 / (50 * 2**30 / 1e9))
    assert t_msg == 2941
    assert res.per_rank_finish_ns == [14 * t_msg + 7 * 7000] * 8
    assert res.summary["num_p2p"][0] == 8 * 14
    assert res.ops.filter(type="COMM_RECV_NODE")["peer"].to_list() == [
        (r - 1) % 8 for r in range(8) for _ in range(14)
    ]
