"""Chrome-trace JSON timeline (Perfetto, chrome://tracing, speedscope): a process per rank, a track per lane.

Why begin/end pairs and not complete ("X") events: Chrome-trace time is microseconds, and the engine's is
integer nanoseconds. An "X" event carries `dur`, and every viewer computes its end as `ts + dur` in binary
floating point: 12218.513 + 150.243 = 12368.756000000001 > 12368.756, so an op that abuts the next one
overlaps it by 1e-12 us and a strict viewer (speedscope) nests each op under the previous one, drawing a
false staircase. Here every op is a "B" event at its start and an "E" event at its end, each timestamp the
exact decimal ns/1000 (three fraction digits, no arithmetic left to the viewer), so an op ending at t and
the next starting at t carry the same literal and abut exactly in any viewer. (Perfetto's native protobuf
format has integer ns, but speedscope and chrome://tracing do not read it; one JSON file serves all three.)

Names aggregate (issue 26 item 6): an event is named for what the op is, its kind, layer and phase
(`L14.mlp_up_gate.fwd`, `pp_fwd/xsim/recv`), never for which instance (micro-batch, pipeline step, peer,
chunk, ring): those, and the op's own name (`op`), are args, which Perfetto and chrome://tracing show
beside the slice. speedscope makes a frame of name + args, so the Chrome-trace file gives it one frame per
op; `--timeline FILE.speedscope.json` writes speedscope's own format instead (replay.export.speedscope):
frames shared by name, one profile per rank and lane, and a first profile summing every rank's op time.

Layout: process "rank N" (with its device group and stage when the trace says), threads "compute", "comm",
"cpu" (extra lanes "comm #2" ... when ops of one resource overlap: several streams, a recv posted while a
send runs). Flow arrows (Perfetto's bind_id/flow_in/flow_out on the begin events) join each send to its recv
and chain the members of each collective in group order. A counter track per rank, "comm GB/s", is the
rank's achieved communication rate: the sum over its communication ops in flight of bytes / (end - (start +
wait)), in GB/s (1e9 B/s); it is what the ops table implies, whatever network model ran (the network models
do not report per-link utilization).
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict

import polars as pl
from xsim.replay.result import ReplayResult
from xsim.traces.outputs import atomic_write_text

SPEEDSCOPE_SUFFIX = ".speedscope.json"
# Thread ids: resource base + lane, so lanes of one resource sort together.
_TID_BASE = {"compute": 100, "comm": 200, "cpu": 300}
_ARG_COLUMNS = ("layer", "phase", "micro_batch", "stage", "device_group", "ring", "chunk", "reshard")


# What varies between instances of one op, removed from its event name (it stays in args): the generator's
# micro-batch suffixes (`.mb3`, `_mb3`), pipeline steps, peers (`_from5`, `_to5`), chunks (`/c1`) and rings.
_INSTANCE = re.compile(r"\.mb\d+$|_mb\d+(?=/|$)|/step\d+|_(?:from|to)\d+|/c\d+$|/ring\d+$")


def frame_name(name: str) -> str:
    """An op's name without what tells its instances apart: `L14.mlp_up_gate.fwd.mb2` -> `L14.mlp_up_gate.fwd`."""
    return _INSTANCE.sub("", name) or name


def us(ns: int) -> float:
    """ns as microseconds; the float's shortest repr is the exact decimal ns/1000 for |ns| < 2**53."""
    return ns / 1000.0


def _lanes(ops: pl.DataFrame) -> tuple[list[int], dict[tuple[int, str], int]]:
    """Lane of each op (ops sorted by rank, start): the first lane of its resource free at its start."""
    lanes: dict[tuple[int, str], list[int]] = {}
    out = []
    for rank, res, s, e in zip(ops["rank"], ops["resource"], ops["start_ns"], ops["end_ns"], strict=True):
        ends = lanes.setdefault((rank, res), [])
        for lane, last in enumerate(ends):
            if last <= s:
                ends[lane] = e
                break
        else:
            lane = len(ends)
            ends.append(e)
        out.append(lane)
    return out, {k: len(v) for k, v in lanes.items()}


def _flow_ids(ops: pl.DataFrame) -> dict[tuple[int, int], tuple[int, bool, bool]]:
    """(rank, node) -> (flow id, flow_in, flow_out): P2P send -> recv, collective members in group order."""
    out: dict[tuple[int, int], tuple[int, bool, bool]] = {}
    fid = 0
    pairs: dict[int, dict[str, tuple[int, int]]] = defaultdict(dict)
    for p, rank, nid, typ in (
        ops.filter(pl.col("p2p").is_not_null()).select("p2p", "rank", "node_id", "type").rows()
    ):
        pairs[p][typ] = (rank, nid)
    for p in sorted(pairs):
        snd, rcv = pairs[p].get("COMM_SEND_NODE"), pairs[p].get("COMM_RECV_NODE")
        if snd and rcv:
            fid += 1
            out[snd] = (fid, False, True)
            out[rcv] = (fid, True, False)
    members: dict[int, list[tuple[int, int]]] = defaultdict(list)
    coll = ops.filter(pl.col("collective").is_not_null()).sort(["collective", "rank"])
    for cid, rank, nid in coll.select("collective", "rank", "node_id").rows():
        members[cid].append((rank, nid))
    for cid in sorted(members):
        m = members[cid]
        if len(m) < 2:
            continue
        fid += 1
        for i, key in enumerate(m):
            out[key] = (fid, i > 0, i < len(m) - 1)
    return out


def _counters(ops: pl.DataFrame) -> list[dict]:
    """Per-rank "comm GB/s" counter: summed bytes/active-time of the communication ops in flight."""
    comm = ops.filter((pl.col("resource") == "comm") & (pl.col("bytes") > 0))
    steps: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for rank, s, e, w, b in comm.select("rank", "start_ns", "end_ns", "wait_ns", "bytes").rows():
        a = s + w
        if e <= a:
            continue
        rate = b / (e - a)  # bytes per ns = GB/s
        steps[rank][a] += rate
        steps[rank][e] -= rate
    out = []
    for rank in sorted(steps):
        level = 0.0
        for t in sorted(steps[rank]):
            level += steps[rank][t]
            v = round(level, 6) if abs(level) > 1e-9 else 0.0
            out.append({"name": "comm GB/s", "ph": "C", "pid": rank, "ts": us(t), "args": {"GB/s": v}})
    return out


def timeline_events(result: ReplayResult) -> dict:
    """The timeline as a Chrome-trace JSON object {"traceEvents": [...], "displayTimeUnit": "ns"}."""
    ops = result.ops.filter(pl.col("resource") != "none").sort(["rank", "start_ns", "end_ns", "node_id"])
    lane_of, lane_count = _lanes(ops)
    flows = _flow_ids(ops)
    base = ["rank", "resource", "start_ns", "end_ns", "node_id", "name", "type", "wait_ns", "bytes"]
    optional = ["comm_type", "pg_name", "peer", *_ARG_COLUMNS]
    cols = ops.select(base + optional).to_dict(as_series=False)
    opt_cols = [(k, cols[k]) for k in optional if any(v is not None for v in cols[k])]
    # Per lane, ops in start order never overlap (the lane rule), so B, E, B, E ... is a proper sequence.
    by_lane: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for i, (rank, res, s, e, nid, name, typ, wait, nbytes) in enumerate(
        zip(*(cols[k] for k in base), strict=True)
    ):
        tid = _TID_BASE[res] + lane_of[i]
        args = {"op": name, "node_id": nid, "type": typ, "wait_ns": wait, "start_ns": s, "end_ns": e}
        if nbytes:
            args["bytes"] = nbytes
        for k, col in opt_cols:
            v = col[i]
            if v is not None:
                args[k] = v
        frame = frame_name(name)
        begin = {"name": frame, "cat": res, "ph": "B", "ts": us(s), "pid": rank, "tid": tid, "args": args}
        flow = flows.get((rank, nid))
        if flow is not None:
            begin["bind_id"] = flow[0]
            if flow[1]:
                begin["flow_in"] = True
            if flow[2]:
                begin["flow_out"] = True
        lane = by_lane[(rank, tid)]
        lane.append(begin)
        lane.append({"name": frame, "cat": res, "ph": "E", "ts": us(e), "pid": rank, "tid": tid})
    meta: list[dict] = []
    label = _rank_labels(result.ops)
    for rank in range(len(result.per_rank_finish_ns)):
        meta.append(
            {
                "name": "process_name",
                "ph": "M",
                "pid": rank,
                "tid": 0,
                "args": {"name": label.get(rank, f"rank {rank}")},
            }
        )
        meta.append(
            {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}}
        )
    for (rank, res), n in sorted(lane_count.items()):
        for lane in range(n):
            name = res if lane == 0 else f"{res} #{lane + 1}"
            tid = _TID_BASE[res] + lane
            meta.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": name}})
            meta.append(
                {"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": tid, "args": {"sort_index": tid}}
            )
    events = [ev for key in sorted(by_lane) for ev in by_lane[key]]
    return {"traceEvents": meta + events + _counters(ops), "displayTimeUnit": "ns"}


def _rank_labels(ops: pl.DataFrame) -> dict[int, str]:
    """'rank N (device group G, stage S)' where the trace annotates them, else 'rank N'."""
    out: dict[int, str] = {}
    cols = [c for c in ("device_group", "stage") if ops[c].null_count() < ops.height]
    if not cols:
        return out
    first = ops.group_by("rank").agg([pl.col(c).drop_nulls().first() for c in cols]).sort("rank")
    for row in first.iter_rows(named=True):
        bits = [f"{c.replace('_', ' ')} {row[c]}" for c in cols if row[c] is not None]
        out[row["rank"]] = f"rank {row['rank']}" + (f" ({', '.join(bits)})" if bits else "")
    return out


def lane_spans(doc: dict) -> dict[tuple[int, int], list[tuple[float, float]]]:
    """(pid, tid) -> [(begin, end)] of a timeline's B/E slices in file order (for checks and tests)."""
    out: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    open_: dict[tuple[int, int], float] = {}
    for ev in doc["traceEvents"]:
        key = (ev.get("pid"), ev.get("tid"))
        if ev["ph"] == "B":
            if key in open_:
                raise ValueError(f"lane {key}: slice begins at {ev['ts']} inside another")
            open_[key] = ev["ts"]
        elif ev["ph"] == "E":
            out[key].append((open_.pop(key), ev["ts"]))
    return dict(out)


def write_timeline(result: ReplayResult, path: str | os.PathLike[str], inputs: tuple[str, ...] = ()) -> str:
    """Write the timeline (temporary name, then renamed into place): speedscope's own format when the path
    ends in `.speedscope.json`, else Chrome-trace JSON; returns the path."""
    if os.fspath(path).endswith(SPEEDSCOPE_SUFFIX):
        from xsim.replay.export.speedscope import speedscope_doc

        doc = speedscope_doc(result)
    else:
        doc = timeline_events(result)
    # dumps (one C-encoded string) is ~10x faster than dump, which encodes chunk by chunk in Python.
    text = json.dumps(doc, separators=(",", ":")) + "\n"
    return atomic_write_text(path, text, inputs=inputs or result.paths)
