"""PyTorch importer on hand-made host+Kineto pairs whose timings are worked out by hand in the comments."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from xsim.replay import ReplayConfig, simulate
from xsim.tracegen.importers.pytorch import PyTorchImportError, import_pytorch
from xsim.tracegen.importers.pytorch.build import DURATION_NS, MODULE
from xsim.traces import attrs as A
from xsim.traces import pb
from xsim.traces.traceset import discover

PID = 4242


def _tensor(tid: int, numel: int, itemsize: int = 4) -> list:
    return [tid, tid + 100, 0, numel, itemsize, "cpu"]


def _host(schema: str, ops: list[tuple[int, str, int, int, list, list]], pid: int = PID) -> dict:
    """ops: (id, name, parent, rf_id, input values, input types); roots 1 (process) and 2 (thread)."""
    roots = [
        (1, "[pytorch|profiler|execution_trace|process]", 1, 0, [], []),
        (2, "[pytorch|profiler|execution_trace|thread]", 1, 0, [], []),
    ]
    nodes = []
    for oid, name, parent, rf, values, types in roots + ops:
        if schema.startswith("1.0.1"):
            nodes.append(
                {
                    "id": oid,
                    "name": name,
                    "parent": parent,
                    "rf_id": rf,
                    "tid": 1,
                    "seq_id": -1,
                    "inputs": values,
                    "input_types": types,
                    "input_shapes": [],
                    "outputs": [],
                }
            )
        else:
            nodes.append(
                {
                    "id": oid,
                    "name": name,
                    "ctrl_deps": parent,
                    "inputs": {"values": values, "shapes": [], "types": types},
                    "outputs": {"values": [], "shapes": [], "types": []},
                    "attrs": [
                        {"name": "rf_id", "type": "uint64", "value": rf},
                        {"name": "tid", "type": "uint64", "value": 1},
                        {"name": "seq_id", "type": "int64", "value": -1},
                    ],
                }
            )
    nodes.reverse()  # recent PyTorch writes children before parents
    return {"schema": schema, "pid": pid, "nodes": nodes}


def _cpu(name: str, ts: float, dur: float, rf: int, tid: int = PID) -> dict:
    return {
        "ph": "X",
        "cat": "cpu_op",
        "name": name,
        "pid": PID,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": {"External id": rf + 1000, "Record function id": rf},
    }


def _write(tmp: Path, name: str, doc: dict) -> str:
    p = tmp / name
    p.write_text(json.dumps(doc))
    return str(p)


# The GPU pair: forward scope [0,140) µs; mm [10,60) launches a 100 µs kernel at 20 that runs [30,130);
# relu [60,135) blocks in cudaDeviceSynchronize [62,132); add [136,140).
GPU_OPS = [
    (3, "## forward ##", 2, 1, [], []),
    (4, "aten::mm", 3, 2, [_tensor(1, 64), _tensor(2, 64)], ["Tensor(float)", "Tensor(float)"]),
    (5, "aten::relu", 3, 3, [_tensor(3, 64)], ["Tensor(float)"]),
    (6, "aten::add", 3, 4, [], []),
]
GPU_EVENTS = [
    _cpu("## forward ##", 0, 140, 1) | {"cat": "user_annotation"},
    _cpu("aten::mm", 10, 50, 2),
    _cpu("aten::relu", 60, 75, 3),
    _cpu("aten::add", 136, 4, 4),
    {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": PID,
        "tid": PID,
        "ts": 20,
        "dur": 5,
        "args": {"correlation": 7},
    },
    {
        "ph": "X",
        "cat": "kernel",
        "name": "sgemm_128x64_nn",
        "pid": 0,
        "tid": 7,
        "ts": 30,
        "dur": 100,
        "args": {"correlation": 7, "stream": 7, "device": 0},
    },
    {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaDeviceSynchronize",
        "pid": PID,
        "tid": PID,
        "ts": 62,
        "dur": 70,
        "args": {"correlation": 8},
    },
]


@pytest.mark.parametrize(
    "schema",
    [
        "1.0.1",
        "1.0.2-chakra.0.0.4",
        "1.0.3-chakra.0.0.4",
        "1.1.0-chakra.0.0.4",
        "1.1.1-chakra.0.0.4",
        "1.1.1",
        "1.1.1-chakra.1.0.0",
    ],
)
def test_gpu_pair_durations_and_dependencies(tmp_path: Path, schema: str) -> None:
    et = _write(tmp_path, "et.json", _host(schema, GPU_OPS))
    kin = _write(tmp_path, "k.json", {"traceEvents": GPU_EVENTS})
    res = import_pytorch([et], [kin])
    assert res.ranks[0].method == "rf_id" and res.ranks[0].match_rate == 1.0
    nodes = {n.id: n for n in res.nodes[0] if n.type != pb.METADATA_NODE}
    # CPU ops are cut where a launch or synchronize call returns (mm at 25, relu at 132) so that edges
    # attach where they happened. Ids follow start times (1 is reserved for multi-rank start offsets):
    # forward 2, mm 3, mm after the launch 4, kernel 5, relu 6, relu after the sync 7, add 8.
    names = [
        "## forward ##",
        "aten::mm",
        "aten::mm",
        "sgemm_128x64_nn",
        "aten::relu",
        "aten::relu",
        "aten::add",
    ]
    assert [nodes[i].name for i in range(2, 9)] == names
    # Durations run from a start to the next start on the thread, minus synchronize time: forward
    # 10-0 = 10; mm 25-10 = 15 and 60-25 = 35; relu (132-60) - 70 in cudaDeviceSynchronize = 2, then
    # 136-132 = 4; add to the thread's last end 140: 4; the kernel its measured 100.
    got = [A.get_int(nodes[i], DURATION_NS) for i in range(2, 9)]
    assert got == [10_000, 15_000, 35_000, 100_000, 2_000, 4_000, 4_000]
    # Program order, the launch edge (first part of mm -> kernel) and the sync edge (kernel -> the part
    # of relu after the synchronize call).
    deps = {i: sorted(nodes[i].data_deps) for i in range(3, 9)}
    assert deps == {3: [2], 4: [3], 5: [3], 6: [4], 7: [5, 6], 8: [7]}
    assert A.is_cpu_op(nodes[3]) and not A.is_cpu_op(nodes[5])
    assert A.get_int(nodes[5], A.STREAM) == 7
    # Replay: forward 0-10, mm 10-25, kernel 25-125 while mm goes on 25-60, relu 60-62, relu waits for the
    # kernel 125-129, add 129-133 -> 133 µs. The real run took 140: the kernel started 5 µs after its
    # launch returned and the synchronize call returned 2 µs after it ended (launch and wake-up latency).
    res.write(tmp_path / "out" / "g")
    r = simulate(
        discover(str(tmp_path / "out" / "g")), network=None, config=ReplayConfig(comm_mode="measured")
    )
    assert r.summary_dict()["iteration_time_ns"] == 133_000


def test_schema_layouts_give_identical_graphs(tmp_path: Path) -> None:
    kin = _write(tmp_path, "k.json", {"traceEvents": GPU_EVENTS})
    out = []
    for schema in ("1.0.1", "1.1.0-chakra.0.0.4"):
        et = _write(tmp_path, f"{schema}.json", _host(schema, GPU_OPS))
        out.append([n.SerializeToString() for n in import_pytorch([et], [kin]).nodes[0]])
    assert out[0] == out[1]


def test_gloo_collective_wait_becomes_an_edge(tmp_path: Path) -> None:
    # c10d::allreduce_ [10,15) hands 1000 floats to the gloo runloop, whose work runs [16,66); the main
    # thread idles until mul at 70. The c10d op's wall 70-10 = 60 holds 66-15 = 51 of waiting: its node
    # lasts 9, and mul depends on the collective. comm_size = 1000 x 4 bytes.
    ops = [
        (
            3,
            "c10d::allreduce_",
            2,
            1,
            [[_tensor(1, 1000)], "<Object>", "<Object>", -1],
            ["GenericList[Tensor(float)]", "Object", "Object", "Int"],
        ),
        (4, "aten::mul", 2, 3, [], []),
    ]
    events = [
        _cpu("c10d::allreduce_", 10, 5, 1),
        _cpu("aten::mul", 70, 5, 3),
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "gloo:all_reduce",
            "pid": PID,
            "tid": 9,
            "ts": 16,
            "dur": 50,
            "args": {"Record function id": 2},
        },
        {
            "ph": "M",
            "name": "thread_name",
            "pid": PID,
            "tid": 9,
            "args": {"name": "thread 9 (pt_gloo_runloop)"},
        },
    ]
    res = import_pytorch(
        [_write(tmp_path, "et.json", _host("1.1.1-chakra.0.0.4", ops))],
        [_write(tmp_path, "k.json", {"traceEvents": events})],
    )
    nodes = {n.name: n for n in res.nodes[0]}
    coll = nodes["gloo:all_reduce"]
    assert coll.type == pb.COMM_COLL_NODE and A.comm_type(coll) == pb.ALL_REDUCE
    assert A.comm_size(coll) == 4000 and A.get_int(coll, DURATION_NS) == 50_000
    assert A.get_str(coll, "source_op") == "c10d::allreduce_"
    assert A.get_int(nodes["c10d::allreduce_"], DURATION_NS) == 9_000
    assert coll.id in nodes["aten::mul"].data_deps
    # Replay: c10d 0-9, all-reduce 9-59, mul 59-64.
    res.write(tmp_path / "o" / "g")
    r = simulate(discover(str(tmp_path / "o" / "g")), network=None, config=ReplayConfig(comm_mode="measured"))
    assert r.summary_dict()["iteration_time_ns"] == 64_000


def _p2p_rank(tmp: Path, rank: int, numel: int) -> tuple[str, str]:
    name, peer = ("c10d::send", 1) if rank == 0 else ("c10d::recv_", 0)
    ops = [
        (
            3,
            name,
            2,
            1,
            [[_tensor(1, numel)], "<Object>", peer, 7],
            ["GenericList[Tensor(float)]", "Object", "Int", "Int"],
        )
    ]
    events = [
        _cpu(name, 10, 5, 1),
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "gloo:send" if rank == 0 else "gloo:recv",
            "pid": PID,
            "tid": 9,
            "ts": 16,
            "dur": 30,
            "args": {"Record function id": 2},
        },
    ]
    doc = {"traceEvents": events, "distributedInfo": {"rank": rank, "world_size": 2, "backend": "gloo"}}
    return (_write(tmp, f"et{rank}.json", _host("1.1.1", ops)), _write(tmp, f"k{rank}.json", doc))


def test_p2p_send_recv_get_peers_and_tags(tmp_path: Path) -> None:
    (e0, k0), (e1, k1) = _p2p_rank(tmp_path, 0, 256), _p2p_rank(tmp_path, 1, 256)
    res = import_pytorch([e0, e1], [k0, k1])
    send = next(n for n in res.nodes[0] if n.type == pb.COMM_SEND_NODE)
    recv = next(n for n in res.nodes[1] if n.type == pb.COMM_RECV_NODE)
    for n in (send, recv):
        assert (A.comm_src(n), A.comm_dst(n), A.comm_tag(n), A.comm_size(n)) == (0, 1, 7, 1024)


def test_p2p_size_mismatch_is_rejected(tmp_path: Path) -> None:
    (e0, k0), (e1, k1) = _p2p_rank(tmp_path, 0, 256), _p2p_rank(tmp_path, 1, 128)
    with pytest.raises(PyTorchImportError, match="1024 bytes but the matching recv"):
        import_pytorch([e0, e1], [k0, k1])


def test_module_and_layer_labels(tmp_path: Path) -> None:
    ops = [
        (3, "nn.Module: layers.1.attn", 2, 1, [], []),
        (4, "aten::addmm", 3, 2, [], []),
        (5, "## optimizer ##", 2, 3, [], []),
        (6, "aten::add_", 5, 4, [], []),
    ]
    events = [
        _cpu("nn.Module: layers.1.attn", 0, 10, 1) | {"cat": "user_annotation"},
        _cpu("aten::addmm", 1, 5, 2),
        _cpu("## optimizer ##", 20, 10, 3) | {"cat": "user_annotation"},
        _cpu("aten::add_", 21, 5, 4),
    ]
    res = import_pytorch(
        [_write(tmp_path, "et.json", _host("1.1.0", ops))],
        [_write(tmp_path, "k.json", {"traceEvents": events})],
    )
    nodes = {n.name: n for n in res.nodes[0]}
    mm = nodes["aten::addmm"]
    assert (A.get_str(mm, MODULE), A.get_int(mm, A.LAYER), A.get_str(mm, A.PHASE)) == (
        "layers.1.attn",
        2,
        "fwd",
    )
    assert A.get_str(nodes["aten::add_"], A.PHASE) == "opt" and A.get_int(nodes["aten::add_"], A.LAYER) == 0


def test_gzipped_inputs(tmp_path: Path) -> None:
    et = tmp_path / "et.json.gz"
    et.write_bytes(gzip.compress(json.dumps(_host("1.1.1", GPU_OPS)).encode()))
    kin = tmp_path / "k.json.gz"
    kin.write_bytes(gzip.compress(json.dumps({"traceEvents": GPU_EVENTS}).encode()))
    assert import_pytorch([str(et)], [str(kin)]).ranks[0].matched == 4


def _gloo_rank(tmp: Path, rank: int, t0: float, work: tuple[float, float], mul: float) -> tuple[str, str]:
    ops = [
        (
            3,
            "c10d::allreduce_",
            2,
            1,
            [[_tensor(1, 1000)], "<Object>", "<Object>", -1],
            ["GenericList[Tensor(float)]", "Object", "Object", "Int"],
        ),
        (4, "aten::mul", 2, 3, [], []),
    ]
    events = [
        _cpu("c10d::allreduce_", t0, 5, 1),
        _cpu("aten::mul", mul, 5, 3),
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "gloo:all_reduce",
            "pid": PID,
            "tid": 9,
            "ts": work[0],
            "dur": work[1],
            "args": {"Record function id": 2},
        },
        {
            "ph": "M",
            "name": "thread_name",
            "pid": PID,
            "tid": 9,
            "args": {"name": "thread 9 (pt_gloo_runloop)"},
        },
    ]
    doc = {"traceEvents": events, "distributedInfo": {"rank": rank, "world_size": 2, "backend": "gloo"}}
    return (_write(tmp, f"et{rank}.json", _host("1.1.1", ops)), _write(tmp, f"k{rank}.json", doc))


def test_unequal_collective_completion_gets_tails(tmp_path: Path) -> None:
    # Rank 0 issues at 10 and its gloo work runs [16,66); rank 1 issues at 30, work [36,56): rank 1 was the
    # last to start (36) and the first to finish (56). Counted from the last start, the work lasts
    # 66-36 = 30 on rank 0 and 56-36 = 20 on rank 1, so the replayed collective (shortest member) ends
    # when rank 1 really finished, and rank 0 gets a tail of 66-56 = 10.
    (e0, k0) = _gloo_rank(tmp_path, 0, 10, (16, 50), 70)
    (e1, k1) = _gloo_rank(tmp_path, 1, 30, (36, 20), 60)
    res = import_pytorch([e0, e1], [k0, k1])
    colls = [next(n for n in res.nodes[r] if n.type == pb.COMM_COLL_NODE) for r in (0, 1)]
    assert [A.get_int(n, DURATION_NS) for n in colls] == [30_000, 20_000]
    assert [A.get_int(n, "kineto_dur_ns") for n in colls] == [50_000, 20_000]
    tails = [[n for n in res.nodes[r] if n.name == "xsim::comm_tail:all_reduce"] for r in (0, 1)]
    assert len(tails[0]) == 1 and tails[1] == []
    tail = tails[0][0]
    assert A.get_int(tail, DURATION_NS) == 10_000 and list(tail.data_deps) == [colls[0].id]
    mul0 = next(n for n in res.nodes[0] if n.name == "aten::mul")
    c10d0 = next(n for n in res.nodes[0] if n.name == "c10d::allreduce_")
    # mul follows the c10d op in program order and waits for the tail instead of the collective.
    assert sorted(mul0.data_deps) == [c10d0.id, tail.id]
    # Replay (origin = rank 0's first op at 10): rank 0's c10d op 0-9 (60 of wall minus 51 waiting);
    # rank 1 starts 20 late, c10d 20-29; the all-reduce runs 29-49 (shortest member, 20); rank 0's tail
    # 49-59 and mul 59-64; rank 1's mul 49-54 -> 64 µs.
    res.write(tmp_path / "o" / "g")
    r = simulate(discover(str(tmp_path / "o" / "g")), network=None, config=ReplayConfig(comm_mode="measured"))
    assert r.summary_dict()["iteration_time_ns"] == 64_000
