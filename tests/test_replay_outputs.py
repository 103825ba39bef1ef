"""Result tables, files, timeline and annotated traces: schemas, determinism, structure, round trips."""

from __future__ import annotations

import json

import polars as pl
import pytest
from xsim.replay import ReplayConfig, simulate
from xsim.replay.export import write_annotated, write_timeline
from xsim.replay.export.timeline import lane_spans
from xsim.replay.result import COLLECTIVES_SCHEMA, OPS_SCHEMA, RANKS_SCHEMA, SUMMARY_SCHEMA
from xsim.traces.attrs import SIM_END_NS, SIM_START_NS, SIM_WAIT_NS, get_int
from xsim.traces.checks import check_all
from xsim.traces.traceset import discover

from tests.test_replay_support import SHARED, FakeNet, two_rank_pipeline

REAL = SHARED / "peer_traces" / "chakra_et" / "chakra_feeder_test_real_trace"


def test_schemas_are_the_documented_ones(tmp_path) -> None:
    res = simulate(two_rank_pipeline(tmp_path), network=FakeNet(2))
    assert dict(res.ops.schema) == OPS_SCHEMA
    assert dict(res.ranks.schema) == RANKS_SCHEMA
    assert dict(res.collectives.schema) == COLLECTIVES_SCHEMA
    assert list(res.summary.columns)[: len(SUMMARY_SCHEMA)] == list(SUMMARY_SCHEMA)
    ops = res.ops.filter(rank=0, node_id=1).row(0, named=True)
    assert (ops["layer"], ops["phase"], ops["resource"], ops["type"]) == (1, "fwd", "compute", "COMP_NODE")
    assert res.ops.filter(rank=1, node_id=1)["peer"][0] == 0


def test_save_is_byte_identical(tmp_path) -> None:
    ts = two_rank_pipeline(tmp_path)
    a, b = tmp_path / "a", tmp_path / "b"
    simulate(ts, network=FakeNet(2)).save(a)
    simulate(ts, network=FakeNet(2)).save(b)
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(
        [f"{t}.{e}" for t in ("ops", "ranks", "collectives") for e in ("parquet", "csv")]
        + ["summary.json", "summary.csv", "perf.json"]
    )
    for name in names:
        if name != "perf.json":  # wall time lives there, and only there
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
    s = json.loads((a / "summary.json").read_text())
    assert s["iteration_time_ns"] == max(s["per_rank_finish_ns"]) and "sim_wall_s" not in s
    assert set(json.loads((a / "perf.json").read_text())) == {
        "sim_wall_s",
        "engine_wall_s",
        "engine_cpu_s",
        "events_per_s",
    }
    assert pl.read_parquet(a / "ops.parquet").equals(pl.read_csv(a / "ops.csv", schema=OPS_SCHEMA))
    r1, r2 = simulate(ts, network=FakeNet(2)), simulate(ts, network=FakeNet(2))
    t1, t2 = write_timeline(r1, tmp_path / "t1.json"), write_timeline(r2, tmp_path / "t2.json")
    assert open(t1, "rb").read() == open(t2, "rb").read()


def test_progress_callback(tmp_path) -> None:
    seen = []
    simulate(
        two_rank_pipeline(tmp_path),
        network=FakeNet(2),
        progress=lambda done, total: seen.append((done, total)),
    )
    assert seen and seen[-1] == (6, 6) and all(d <= t for d, t in seen)


def test_timeline_flows(tmp_path) -> None:
    res = simulate(two_rank_pipeline(tmp_path), network=FakeNet(2))
    path = write_timeline(res, tmp_path / "tl.json")
    ev = json.loads(open(path).read())["traceEvents"]
    # Flow arrows ride on the begin events (Perfetto's bind_id / flow_out / flow_in).
    outs = {e["bind_id"]: e for e in ev if e["ph"] == "B" and e.get("flow_out")}
    ins = {e["bind_id"]: e for e in ev if e["ph"] == "B" and e.get("flow_in")}
    assert set(outs) == set(ins) == {1, 2}  # one P2P pair, one 2-member collective
    assert (outs[1]["cat"], outs[1]["pid"], ins[1]["pid"], outs[1]["name"]) == ("comm", 0, 1, "send2")
    assert (outs[2]["args"]["type"], outs[2]["pid"], ins[2]["pid"]) == ("COMM_COLL_NODE", 0, 1)
    assert outs[1]["args"]["bytes"] == 4096


@pytest.mark.skipif(not REAL.is_dir(), reason="../shared peer traces absent")
def test_real_trace_replays_and_timeline_structure(tmp_path) -> None:
    res = simulate(REAL, network=None, config=ReplayConfig(comm_mode="measured"))
    assert res.summary["num_nodes"][0] == 3664
    # 21 COMM_COLL nodes: 14 host-side c10d:: calls (is_cpu_op) run on the CPU, 7 GPU kernels are collectives.
    assert res.summary["num_collectives"][0] == 7
    assert res.ops.filter(pl.col("end_ns") < pl.col("start_ns")).height == 0
    doc = json.loads(open(write_timeline(res, tmp_path / "real.json")).read())
    assert doc["displayTimeUnit"] == "ns"
    ev = doc["traceEvents"]
    meta = [e for e in ev if e["ph"] == "M"]
    assert {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "rank 0"}} in meta
    threads = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    x = [e for e in ev if e["ph"] == "B"]
    assert len(x) == 3664 == len([e for e in ev if e["ph"] == "E"])
    for e in x:
        assert {"name", "cat", "ph", "ts", "pid", "tid", "args"} <= set(e)
        assert e["tid"] in threads and e["cat"] in ("compute", "comm", "cpu")
        assert isinstance(e["args"]["node_id"], int)
    # Slices on one track never overlap (lanes split overlapping ops), compared exactly.
    for spans in lane_spans(doc).values():
        assert all(a[0] <= a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_annotated_trace_set_round_trip(tmp_path) -> None:
    ts = two_rank_pipeline(tmp_path)
    res = simulate(ts, network=FakeNet(2))
    out = tmp_path / "ann"
    write_annotated(res, out)
    ann = discover(out)
    assert ann.num_ranks == 2
    for rank in range(2):
        for node in ann.load(rank).nodes:
            row = res.ops.filter(rank=rank, node_id=node.id).row(0, named=True)
            assert get_int(node, SIM_START_NS) == row["start_ns"]
            assert get_int(node, SIM_END_NS) == row["end_ns"]
            assert get_int(node, SIM_WAIT_NS) == row["wait_ns"]
            assert node.duration_micros == (row["duration_ns"] + 500) // 1000
    # Still a valid Chakra trace set: the trace layer's checks find nothing, it replays, compute keeps
    # its durations.
    assert check_all([ann.load(r) for r in range(2)], res.groups) == []
    again = simulate(ann, network=FakeNet(2))
    assert again.ops.filter(resource="compute")["duration_ns"].to_list() == [10_000, 20_000]
