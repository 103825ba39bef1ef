"""ASTRA-sim-compatible mode times nodes as ASTRA-sim reads them (issue 30, item 1): duration_micros x 1000,
not xsim's exact `duration_ns` attribute; the native models keep the exact nanoseconds.

ASTRA-sim's workload layer reads a node's `duration_micros` and multiplies by 1000 (reference
astrasim-analytical.md section 3.4, "replay"); the generator writes both the whole microseconds and the
exact ns (tracegen/ops.py: `duration_micros` = op time rounded to the nearest microsecond).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from xsim.netmodels.astra import astra_model
from xsim.netmodels.models import REGISTRY, capabilities_of
from xsim.replay import DurationModel, ReplayConfig, RooflineModel, simulate
from xsim.replay.compute import DeviceProfile, SpeedScaled, replay_duration_ns, with_exact
from xsim.replay.errors import ReplayError
from xsim.replay.program import build_program
from xsim.replay.simulation import ColumnReader, load_groups
from xsim.traces import pb
from xsim.traces.attrs import DURATION_NS, make_node
from xsim.traces.traceset import discover, write_trace_set

from tests.program_reference import reference_program
from xsim import api

# One layer of a tiny model; `{ranks}` and `{tp}` filled in per test.
SPEC = """
name: one
model: {{name: tiny, layers: 1, hidden: 1024, ffn_hidden: 4096, heads: 8, vocab: 1024, seq_len: 1024}}
micro_batches: 1
compute_model: roofline
device_groups:
  - {{gpu: H100, ranks: {ranks}, tp: {tp}, micro_batch: 1}}
"""
T, K, N = 1024, 1024, 3 * 1024  # qkv_proj: [tokens, hidden] x [hidden, 3 hidden] (heads = kv_heads)
QKV_FLOPS = 2 * T * K * N  # 2MKN (Narayanan et al. 2021, section 5.1)
H100_PEAK = 989.4e12  # H100 SXM dense BF16 (datasheet: 1,979 TFLOPS with sparsity)
GEMM_EFF = 0.70  # tracegen's catalog H100 gemm_eff (tests/test_api.py pins 9302 ns with it)
SWITCH = "topology: [ Switch ]\nnpus_count: [ {n} ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n"


def _generate(tmp_path: Path, ranks: list[int], tp: int) -> tuple[str, str]:
    spec = tmp_path / "one.yaml"
    spec.write_text(SPEC.format(ranks=ranks, tp=tp))
    out = str(tmp_path / "gen")
    api.generate(str(spec), api.GenerateOptions(out=out, all_ranks=True))  # every rank: what ASTRA-sim reads
    net = tmp_path / "net.yml"
    net.write_text(SWITCH.format(n=max(2, len(ranks))))
    return out, str(net)


def _ops(res, rank: int = 0) -> dict[str, int]:
    return {r["name"]: r["duration_ns"] for r in res.ops.iter_rows(named=True) if r["rank"] == rank}


def _strip_exact(src: str, dst: Path) -> str:
    """The set with every `duration_ns` attribute removed (what ASTRA-sim sees of it), configs copied."""
    import shutil

    ts = discover(src)
    dst.mkdir()
    for name in ("comm_group.json",):
        if (Path(ts.directory) / name).is_file():
            shutil.copy(Path(ts.directory) / name, dst / name)
    per_rank = []
    for ef in ts:
        nodes = []
        for node in ef.nodes:
            keep = [a for a in node.attr if a.name != DURATION_NS]
            del node.attr[:]
            node.attr.extend(keep)
            nodes.append(node)
        per_rank.append(nodes)
    write_trace_set(dst / "s", per_rank, ts.load(0).metadata)
    return str(dst)


def test_astra_models_declare_micros_durations_and_native_ones_do_not() -> None:
    assert [n for n, m in REGISTRY.items() if m.capabilities.micros_durations] == [
        "astra-unaware",
        "astra-aware",
    ]
    assert not capabilities_of(object()).micros_durations


def test_one_rank_set_replays_whole_microseconds_in_astra_mode(tmp_path: Path) -> None:
    out, net = _generate(tmp_path, [0], 1)
    exact = simulate(out, network=None, config=ReplayConfig(comm_mode="measured"))
    astra = simulate(out, network=astra_model(net))
    # The qkv GEMM is compute-bound: exact 1e9 FLOPs / (peak x eff) = 9302.1 ns, rounded to the nearest ns
    # (tracegen/ops.py duration_ns) 9302 ns; ASTRA-sim reads the rounded 9 us.
    want_exact = round(1e9 * QKV_FLOPS / (H100_PEAK * GEMM_EFF))
    assert want_exact == 9302
    assert _ops(exact)["L1.qkv_proj.fwd.mb0"] == want_exact
    assert _ops(astra)["L1.qkv_proj.fwd.mb0"] == round(want_exact / 1000) * 1000 == 9000
    # One rank, one chain on one stream: the iteration is the sum of ASTRA-sim's node times, read from the
    # file: duration_micros x 1000, a zero duration taking 1 ns (ASTRA-sim's event at t + 1), metadata 0.
    timed = (pb.COMP_NODE, pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE)
    nodes = discover(out).load(0).nodes
    assert all(n.type in (*timed, pb.METADATA_NODE) for n in nodes)
    want = sum((n.duration_micros * 1000 or 1) for n in nodes if n.type in timed)
    assert astra.per_rank_finish_ns == [want]
    assert exact.per_rank_finish_ns != [want]  # the exact ns differ from whole microseconds here


@pytest.mark.parametrize("aware", [False, True])
def test_generated_tp_set_equals_the_set_without_exact_durations_on_every_rank(
    tmp_path: Path, aware: bool
) -> None:
    out, net = _generate(tmp_path, [0, 1, 2, 3], 4)
    stripped = _strip_exact(out, tmp_path / "stripped")
    astra = simulate(out, network=astra_model(net, congestion_aware=aware))
    bare = simulate(stripped, network=astra_model(net, congestion_aware=aware))
    assert astra.per_rank_finish_ns == bare.per_rank_finish_ns
    assert astra.ops["duration_ns"].to_list() == bare.ops["duration_ns"].to_list()
    # TP 4 splits the qkv GEMM four ways: exact 9302.1 / 4 = 2325.5 ns -> 2326 ns, ASTRA-sim's 2 us.
    assert round(1e9 * QKV_FLOPS / 4 / (H100_PEAK * GEMM_EFF)) == 2326
    for r in range(4):
        assert _ops(astra, r)["L1.qkv_proj.fwd.mb0"] == 2000
    # The same set on the native model keeps the exact ns; asking for them explicitly does too.
    analytical = api.build_network(api.NetworkOptions(topology="switch:4:50GBps:500ns"))
    native = simulate(out, network=analytical)
    assert _ops(native, 3)["L1.qkv_proj.fwd.mb0"] == 2326
    forced = simulate(
        out, network=astra_model(net, congestion_aware=aware), config=ReplayConfig(durations="exact")
    )
    assert _ops(forced, 3)["L1.qkv_proj.fwd.mb0"] == 2326
    assert forced.per_rank_finish_ns != astra.per_rank_finish_ns  # so the rule is what made them equal


def test_micros_rule_is_the_same_on_the_columnar_and_protobuf_builders(tmp_path: Path) -> None:
    out, _ = _generate(tmp_path, [0, 1], 2)
    ts = discover(out)
    groups = load_groups(ts, None, scan=True)
    cfg = ReplayConfig(durations="micros", comm_streams="shared")
    for compute in (None, RooflineModel(profiles={}, default=DeviceProfile(1e15, 3e12), exact=False)):
        fast = build_program(ts, groups, compute, cfg, release=False, columns=ColumnReader(ts).get)
        slow = reference_program(discover(out), groups, compute, cfg)
        assert list(fast.dur) == list(slow.dur) and list(fast.recorded_ns) == list(slow.recorded_ns)
    assert all(r % 1000 == 0 or r == 1 for r in fast.recorded_ns)


def test_compute_models_follow_the_rule() -> None:
    node = make_node(1, "op", pb.COMP_NODE, duration_micros=9, attrs={DURATION_NS: 9302})
    cpu = make_node(2, "cpu", pb.COMP_NODE, duration_micros=3, attrs={DURATION_NS: 3141, "is_cpu_op": True})
    zero = make_node(3, "z", pb.COMP_NODE, duration_micros=0, attrs={DURATION_NS: 400})
    assert replay_duration_ns(node) == 9302 and replay_duration_ns(node, exact=False) == 9000
    assert replay_duration_ns(zero, exact=False) == 1  # 0 us -> 1 ns, as ASTRA-sim
    micros = with_exact(DurationModel(), False)
    assert micros.duration_ns(0, node) == 9000 and DurationModel().duration_ns(0, node) == 9302
    roof = with_exact(RooflineModel(profiles={}, default=DeviceProfile(1e12, 1e12)), False)
    assert roof.duration_ns(0, cpu) == 3000  # CPU ops replay their recorded time
    scaled = with_exact(SpeedScaled(DurationModel(), {0: 2.0}), False)
    assert scaled.duration_ns(0, node) == 4500
    assert with_exact(micros, False) is micros


def test_bad_durations_rule_is_one_error() -> None:
    with pytest.raises(ReplayError, match="durations must be one of auto, exact, micros"):
        ReplayConfig(durations="ns")


def test_zero_op_node_under_astra_roofline_takes_its_memory_time(tmp_path: Path) -> None:
    # ASTRA-sim's roofline (Workload::issue_comp) computes num_ops / min(peak, bw x num_ops / tensor_size):
    # with num_ops 0 that is 0/0, and its run never finishes the node (issue 30 item 5; docs/netmodels.md).
    # xsim takes the formula's value as num_ops -> 0, max(ops/peak, size/bw) = size/bw: 1e6 B at the
    # system's local-mem-bw 1600 GB/s = 625 ns. The GEMM after it: 1e9 FLOPs at min(900 TFLOPS, 1600 GB/s x
    # 1000 FLOP/B) = 900 TFLOPS -> floor(1111.1) = 1111 ns.
    import json

    from xsim.api.compute import astra_roofline

    copy = make_node(1, "copy", pb.COMP_NODE, duration_micros=7, attrs={"num_ops": 0, "tensor_size": 10**6})
    gemm = make_node(
        2,
        "gemm",
        pb.COMP_NODE,
        data_deps=[1],
        duration_micros=7,
        attrs={"num_ops": 10**9, "tensor_size": 10**6},
    )
    write_trace_set(tmp_path / "t", [[copy, gemm]] * 2)
    sysj = tmp_path / "sys.json"
    sysj.write_text(
        json.dumps({"roofline-enabled": 1, "peak-perf": 900, "local-mem-bw": 1600, "endpoint-delay": 10})
    )
    net = tmp_path / "net.yml"
    net.write_text(SWITCH.format(n=2))
    res = simulate(
        str(tmp_path / "t"), network=astra_model(str(net), str(sysj)), compute=astra_roofline(str(sysj))
    )
    assert _ops(res) == {"copy": 625, "gemm": 1111}
    assert res.per_rank_finish_ns == [1736, 1736]
