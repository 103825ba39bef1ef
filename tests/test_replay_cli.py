"""`xsim replay` end to end: JSON output, files, exit codes on bad input and deadlocks."""

from __future__ import annotations

import json
import math

import pytest
from xsim.traces import pb
from xsim.traces.attrs import make_node

import xsim.cli
from tests.test_replay_support import SHARED, coll, comp, recv, write_set

ET = SHARED / "peer_traces" / "chakra_et"
CFG = SHARED / "peer_configs" / "astra-sim"


@pytest.fixture(autouse=True)
def only_replay(monkeypatch):
    # Exercise the real entry point with only this verb registered, so other verbs cannot interfere.
    monkeypatch.setattr(xsim.cli, "COMMAND_MODULES", ("xsim.cmd_replay",))


def _run(capsys, *argv):
    rc = xsim.cli.main(["replay", *map(str, argv), "--no-progress"])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.skipif(not ET.is_dir(), reason="../shared peer traces absent")
def test_t2d_json_and_files(tmp_path, capsys) -> None:
    d = ET / "astra-sim-artifacts_T2D-analytical"
    rc, out, _ = _run(
        capsys,
        d / "trace",
        "--astra-network",
        d / "inputs/network.yml",
        "--astra-system",
        d / "inputs/sys.json",
        "--comm-groups",
        d / "inputs/comm_group.json",
        "--json",
        "--out",
        tmp_path / "res",
        "--timeline",
        tmp_path / "tl.json",
        "--annotate",
        tmp_path / "ann",
    )
    assert rc == 0
    obj = json.loads(out)
    # Row AllReduce (82540) + 100 us compute + column AllReduce (82540), see test_replay_astra.
    assert obj["iteration_time_ns"] == 265080 and obj["per_rank_finish_ns"] == [265080] * 16
    assert json.loads((tmp_path / "res/summary.json").read_text())["iteration_time_ns"] == 265080
    assert (tmp_path / "res/ops.parquet").is_file() and (tmp_path / "ann/trace.15.et").is_file()
    assert "traceEvents" in json.loads((tmp_path / "tl.json").read_text())


def test_human_summary_lists_waiting_ranks(tmp_path, capsys) -> None:
    per = [[comp(1, 100), coll(2, 1 << 20, deps=[1])] for _ in range(2)]
    per[1][0] = comp(1, 300)
    ts = write_set(tmp_path, per)
    rc, out, _ = _run(capsys, ts.prefix, "--topology", "ring:2:50GBps:500ns")
    assert rc == 0
    assert "iteration time" in out and "bytes moved        1,048,576 B" in out
    assert "top ranks by waiting" in out and "200,000" in out  # rank 0 waits 300 - 100 us


def test_deadlock_exit_2(tmp_path, capsys) -> None:
    ts = write_set(tmp_path, [[comp(1, 1)], [recv(1, src=0, tag=3, size=8)]])
    rc, _, err = _run(capsys, ts.prefix, "--topology", "ring:2:50GBps:500ns")
    assert rc == 2
    # The line names the trace set, then the stuck ranks and nodes (issue 16: file, rank and node).
    assert err.startswith(f"xsim: error: {ts.prefix}: deadlock at t=")
    assert "rank 1: node 1 'recv1' waits for a send" in err


def test_missing_member_exit_2(tmp_path, capsys) -> None:
    ts = write_set(tmp_path, [[coll(1, 8)], [coll(1, 8)], [comp(1, 1)]])
    rc, _, err = _run(capsys, ts.prefix, "--topology", "switch:3:50GBps:500ns")
    assert rc == 2 and "rank(s) [2] never issued it" in err


def test_bad_inputs_exit_2(tmp_path, capsys) -> None:
    ts = write_set(tmp_path, [[comp(1, 1)]])
    rc, _, err = _run(capsys, ts.prefix)
    assert rc == 2 and "no network" in err
    rc, _, err = _run(capsys, ts.prefix, "--comm", "measured", "--speed", "0=fast")
    assert rc == 2 and "is not a number" in err
    rc, _, err = _run(capsys, ts.prefix, "--topology", "ring:2:-5GBps:500ns")
    assert rc == 2 and err.startswith("xsim: error:")
    bad = tmp_path / "prof.json"
    bad.write_text('{"default": {"peak_flops": -1, "mem_bw": 1}}')
    rc, _, err = _run(capsys, ts.prefix, "--comm", "measured", "--device-profile", bad)
    assert rc == 2 and "peak_flops must be > 0" in err


def test_device_profile_and_speed(tmp_path, capsys) -> None:
    # Roofline: 1e12 FLOP over 1e9 B: rank 0 at 1e15 FLOP/s peak, 1e12 B/s -> min(1e15, 1e12 x 1000) = 1e15
    # -> 1e6 ns; rank 1 has 2e12 B/s and 2e14 FLOP/s -> 5e6 ns, then --speed 1=2 halves it to 2.5e6 ns.
    node = make_node(1, "gemm", pb.COMP_NODE, attrs={"num_ops": 10**12, "tensor_size": 10**9})
    ts = write_set(tmp_path, [[node], [node]])
    prof = {
        "default": {"peak_flops": 1e15, "mem_bw": 1e12},
        "ranks": {"1": {"peak_flops": 2e14, "mem_bw": 2e12, "label": "slow"}},
    }
    (tmp_path / "p.json").write_text(json.dumps(prof))
    rc, out, _ = _run(
        capsys,
        ts.prefix,
        "--comm",
        "measured",
        "--device-profile",
        tmp_path / "p.json",
        "--speed",
        "1=2",
        "--json",
    )
    assert rc == 0
    assert json.loads(out)["per_rank_finish_ns"] == [1_000_000, 2_500_000]


def test_deployment_json_gives_cluster_and_recorded_durations(tmp_path, capsys) -> None:
    # A folder written as `xsim gen` writes it: the cluster comes from deployment.json and every op replays
    # the exact time its generator recorded (duration_ns); with `compute_model: roofline` that is the
    # roofline of its device group's catalog GPU (achieved = peak x efficiency), rounded to the ns.
    from xsim.tracegen.catalog import gpu
    from xsim.tracegen.spec import load_spec, save_deployment
    from xsim.tracegen.workload import generate

    model = {"name": "toy", "layers": 4, "hidden": 1024, "ffn_hidden": 4096, "heads": 8, "kv_heads": 8}
    model |= {"vocab": 32000, "seq_len": 512}
    groups = [
        {"id": 0, "gpu": "H100", "ranks": [0, 1], "tp": 2, "layers": [1, 2], "micro_batch": 1},
        {"id": 1, "gpu": "A100-40GB", "ranks": [2, 3], "tp": 2, "layers": [3, 4], "micro_batch": 1},
    ]
    for i, g in enumerate(groups):
        g |= {"pp_stage": i, "dp_replica": 0}
    dep = load_spec(
        {
            "name": "toy",
            "model": model,
            "seq_len": 512,
            "micro_batches": 2,
            "compute_model": "roofline",
            # every node at its roofline time: the wgrad halves that run under the column-parallel linears'
            # overlapped TP collectives would lose NCCL's SMs (tests/test_gen_contention.py)
            "comm_sm_contention": False,
            "device_groups": groups,
        }
    )
    bundle = generate(dep)
    bundle.write(str(tmp_path), "toy")
    save_deployment(dep, tmp_path / "deployment.json")
    rc, out, _ = _run(capsys, tmp_path, "--json", "--out", tmp_path / "res")
    assert rc == 0
    s = json.loads(out)
    assert (s["network_model"], s["compute_model"], s["num_ranks"]) == ("analytical", "duration", 4)
    import polars as pl

    ops = pl.read_parquet(tmp_path / "res/ops.parquet")
    for rank, name in ((0, "H100"), (2, "A100-40GB")):
        spec = gpu(name)
        peak, bw = spec.peak_flops * spec.gemm_eff, spec.mem_bw * spec.mem_eff
        for node in bundle.nodes[rank]:
            if node.type != pb.COMP_NODE:
                continue
            a = {x.name: x for x in node.attr}
            n_ops, size = a["num_ops"].int64_val, a["tensor_size"].uint64_val
            if n_ops <= 0 or size <= 0:
                continue
            want = 1e9 * n_ops / min(peak, bw * n_ops / size)
            got = ops.filter(rank=rank, node_id=node.id)["duration_ns"][0]
            # rounded to the nearest ns (a backward GEMM's dgrad and wgrad halves split the rounded whole)
            assert abs(got - want) <= 1 + 1e-6 * want, (rank, node.name)


@pytest.mark.skipif(not ET.is_dir(), reason="../shared peer traces absent")
def test_astra_system_roofline(tmp_path, capsys) -> None:
    # T1D's sys.json: roofline-enabled 1, peak-perf 400 (TFLOPS), local-mem-bw 50 (GB/s = 5e10 B/s).
    # 1e9 FLOP over 1e9 B: min(4e14, 5e10 x 1) = 5e10 FLOP/s -> 1e18 / 5e10 = 2e7 ns. 4e12 FLOP over 1e6 B:
    # min(4e14, 5e10 x 4e6) = 4e14 -> 4e21 / 4e14 = 1e7 ns. A node without num_ops replays its 3 us.
    d = ET / "astra-sim-artifacts_T1D-analytical/inputs"
    a = make_node(1, "mem", pb.COMP_NODE, attrs={"num_ops": 10**9, "tensor_size": 10**9})
    b = make_node(2, "gemm", pb.COMP_NODE, data_deps=[1], attrs={"num_ops": 4 * 10**12, "tensor_size": 10**6})
    c = make_node(3, "plain", pb.COMP_NODE, data_deps=[2], duration_micros=3)
    ts = write_set(tmp_path, [[a, b, c]])
    rc, out, _ = _run(
        capsys, ts.prefix, "--astra-network", d / "network.yml", "--astra-system", d / "sys.json", "--json"
    )
    assert rc == 0
    assert json.loads(out)["per_rank_finish_ns"] == [20_000_000 + 10_000_000 + 3_000]


def test_device_profile_by_gpu_name(tmp_path, capsys) -> None:
    # Devices may be catalog GPU names (contract A): the CLI resolves them to achieved rates
    # (peak_flops x gemm_eff, mem_bw x mem_eff). 1e12 FLOP over 1e12 B is memory-bound on every GPU.
    from xsim.tracegen.catalog import gpu

    node = make_node(1, "copy", pb.COMP_NODE, attrs={"num_ops": 10**12, "tensor_size": 10**12})
    ts = write_set(tmp_path, [[node], [node]])
    (tmp_path / "p.json").write_text(json.dumps({"ranks": {"0": "H100", "1": "A100-40GB"}}))
    rc, out, _ = _run(
        capsys, ts.prefix, "--comm", "measured", "--device-profile", tmp_path / "p.json", "--json"
    )
    assert rc == 0
    want = []
    for name in ("H100", "A100-40GB"):
        g = gpu(name)
        perf = min(g.peak_flops * g.gemm_eff, g.mem_bw * g.mem_eff * 1.0)
        want.append(math.floor(1e9 * 10**12 / perf))
    assert json.loads(out)["per_rank_finish_ns"] == want
    (tmp_path / "bad.json").write_text(json.dumps({"default": "Z100"}))
    rc, _, err = _run(capsys, ts.prefix, "--comm", "measured", "--device-profile", tmp_path / "bad.json")
    assert rc == 2 and "unknown GPU 'Z100'" in err
