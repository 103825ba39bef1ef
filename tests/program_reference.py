"""The node-by-node program builder from protobuf messages: the reference the one builder over columns
(replay/build.py) is compared with, field by field (tests/test_replay_columnar.py and the differential
tests). It is the builder every release before the columnar representation used, kept simple rather than
fast: it reads each node's attributes in one loop, raises each error at the node that holds it, and
asks the compute model's scalar `duration_ns` (or the roofline's `comp_duration_ns`) per node.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from xsim.replay.compute import ComputeModel, DurationModel, RooflineModel
from xsim.replay.config import ReplayConfig
from xsim.replay.errors import ReplayError, TraceGraphError
from xsim.replay.program import (
    ANNOTATION_COLUMNS,
    COLLECTIVE_KIND,
    K_COLL,
    K_COMP,
    K_CPU,
    K_MEM,
    K_RECV,
    K_SEND,
    K_TCOMM,
    K_ZERO,
    CollInfo,
    P2PInfo,
    Program,
    _Builder,
    resolve_group,
)
from xsim.traces import pb
from xsim.traces.attrcheck import node_problem
from xsim.traces.attrs import (
    COMM_DST,
    COMM_SIZE,
    COMM_SRC,
    COMM_TAG,
    COMM_TYPE,
    DURATION_NS,
    FLOAT_KINDS,
    INT_KINDS,
    IS_CPU_OP,
    NUM_OPS,
    PG_NAME,
    STREAM,
    TENSOR_SIZE,
    duplicate_attr_error,
)
from xsim.traces.graph import unready
from xsim.traces.groups import ProcessGroups
from xsim.traces.traceset import TraceSet

_SCANNED = frozenset(
    {
        IS_CPU_OP,
        STREAM,
        COMM_TYPE,
        COMM_SIZE,
        COMM_SRC,
        COMM_DST,
        COMM_TAG,
        PG_NAME,
        "comm_group",
        DURATION_NS,
    }
)
_SCAN_BIT = {name: 1 << i for i, name in enumerate(sorted(_SCANNED))}
# Read for RooflineModel.comp_duration_ns (the roofline model's inputs, read in the same pass).
_ROOFLINE = frozenset({NUM_OPS, TENSOR_SIZE})
# Oneof kinds whose value _attr_scalar returns (anything else: None).
_SCALAR_KINDS = frozenset(INT_KINDS | FLOAT_KINDS | {"bool_val", "string_val"})


def _attr_scalar(a: pb.AttributeProto):
    kind = a.WhichOneof("value")
    return getattr(a, kind) if kind in _SCALAR_KINDS else None


def _attach(children: list[list[int]], fwd: dict[int, list[int]], empty: list[int]) -> None:
    """Attach edges whose parent comes after the child in id order."""
    for pg_, kids in fwd.items():
        ch = children[pg_]
        children[pg_] = (ch if ch is not empty else []) + kids


def _cycle_ids(ids: Sequence[int], children: list[list[int]], ndeps: list[int]) -> list[int]:
    """Ids of nodes that can never become ready (on or behind a cycle) on one rank."""
    return sorted(ids[i] for i in unready(ndeps, children))


def _data_only_edges(nodes, id_to_l: dict[int, int], children, ndeps, empty) -> None:
    """Rebuild one rank's edges from data deps alone (they were checked when first built)."""
    for i in range(len(nodes)):
        children[i] = empty
    fwd: dict[int, list[int]] = {}
    for i, node in enumerate(nodes):
        deps = set(node.data_deps)
        ndeps[i] = len(deps)
        for dep in deps:
            p = id_to_l[dep]
            if p > i:
                fwd.setdefault(p, []).append(i)
            elif children[p] is empty:
                children[p] = [i]
            else:
                children[p].append(i)
    _attach(children, fwd, empty)


def comm(b, nt, rank, g, rec, where, a_ct, a_size, a_src, a_dst, a_tag, a_pg) -> tuple:
    """(kind, duration, bytes, comm_type, pg_name, stream) of a GPU comm node; records its matching data.

    stream: the process group's stream for a collective, the pipeline stream for a send, None for a recv.
    """
    groups, n_ranks, measured = b.groups, b.n_ranks, b.measured
    if nt == pb.COMM_COLL_NODE:
        if a_ct is None or isinstance(a_ct, str) or isinstance(a_ct, float) and not a_ct.is_integer():
            raise TraceGraphError("collective without an integer comm_type", **where)
        ct = int(a_ct)
        if ct not in COLLECTIVE_KIND:
            raise TraceGraphError(f"unknown comm_type {ct}", **where)
        size = _size(a_size, where)
        pgn = a_pg if a_pg is not None else ""
        if ct in b.tcomm_types:
            return K_TCOMM, rec, size, ct, pgn, f"group {pgn!r}"
        res = resolve_group(groups, pgn)
        if res is None:
            known = ", ".join(sorted(groups.groups)) or "none"
            raise TraceGraphError(
                f"pg_name {pgn!r} is not a known process group (known: {known}; pass --comm-groups FILE)",
                **where,
            )
        key, members = res
        if rank not in members:
            raise TraceGraphError(
                f"pg_name {pgn!r} = ranks {list(members)} does not contain this rank", **where
            )
        b.coll[g] = CollInfo(ct, size, key, members)
        return K_COLL, rec if measured else 0, size, ct, pgn, f"group {key!r}"
    send = nt == pb.COMM_SEND_NODE
    size = _size(a_size, where)
    src = rank if (send and a_src is None) else a_src
    dst = rank if (not send and a_dst is None) else a_dst
    if src is None or dst is None or a_tag is None:
        need = "comm_dst" if send else "comm_src"
        raise TraceGraphError(f"{'send' if send else 'recv'} needs {need} and comm_tag", **where)
    src, dst, tag = (_int(v, k, where) for v, k in ((src, "src"), (dst, "dst"), (a_tag, "tag")))
    if (send and src != rank) or (not send and dst != rank):
        raise TraceGraphError(
            f"{'send comm_src' if send else 'recv comm_dst'} is {src if send else dst}, not this rank",
            **where,
        )
    for peer in (src, dst):
        if not 0 <= peer < n_ranks:
            raise TraceGraphError(f"peer rank {peer} outside 0..{n_ranks - 1}", **where)
    b.p2p[g] = P2PInfo(src, dst, tag, size)
    return (K_SEND if send else K_RECV), rec if measured else 0, size, -1, a_pg, "p2p" if send else None


def null_annotations(b, count: int) -> None:
    """Annotation columns of a rank built one node at a time (its values live in `ann`)."""
    for k, kind in ANNOTATION_COLUMNS.items():
        if kind == "int":
            b.ann_chunks[k].append((np.zeros(count, np.int64), np.zeros(count, bool)))
        else:
            b.ann_chunks[k].append((np.full(count, -1, np.int32),))


def _slow_rank(b: _Builder, trace_set: TraceSet, rank: int) -> None:
    """One rank built node by node from its protobuf messages."""
    compute, config = b.compute, b.config
    exact = b.exact
    fast_duration = type(compute) is DurationModel
    fast_roofline = type(compute) is RooflineModel
    ef = trace_set.load(rank)
    path = ef.path
    nodes = ef.nodes
    ids = [n.id for n in nodes]
    if any(a >= c for a, c in zip(ids, ids[1:], strict=False)):  # usually already ascending
        nodes = sorted(nodes, key=lambda n: n.id)
        ids = [n.id for n in nodes]
    base = b.n
    id_to_l: dict[int, int] = {}
    for i, nid in enumerate(ids):
        if nid in id_to_l:
            raise TraceGraphError(f"duplicate node id {nid}", path=path, rank=rank, node_id=nid)
        id_to_l[nid] = i
    q_cpu, q_comp, q_comm = b.rank_queues(rank)
    stream_q: dict[int, int] = {}
    fwd: dict[int, list[int]] = {}
    forward = False
    names: list[str] = []
    kinds: list[int] = []
    durs: list[int] = []
    ndeps: list[int] = []
    children: list[list[int]] = []
    queue: list[int] = []
    recorded: list[int] = []
    nbytes: list[int] = []
    ctypes: list[int] = []
    pgs: list[str | None] = []
    empty: list[int] = []
    for i, node in enumerate(nodes):
        g = base + i
        nid = ids[i]
        nt = node.type
        problem = node_problem(node)  # the one attribute rule of info, validate and replay
        if problem is not None:
            raise TraceGraphError(problem, path=path, rank=rank, node_id=nid)
        names.append(node.name)
        # One pass over the attributes.
        cpu = r_cpu = r_slow = False
        stream = r_ops = r_size = r_dur = None
        a_ct = a_size = a_src = a_dst = a_tag = a_pg = None
        vals = None
        attrs = node.attr
        # Slicing a upb repeated field is ~5x faster than iterating it (measured, scripts/bench_replay.py).
        seen = 0  # bits of _SCAN_BIT: a scanned name given twice is an error, as in traces.attrs readers
        for a in attrs[:] if len(attrs) else ():
            an = a.name
            if an in _SCANNED:
                bit = _SCAN_BIT[an]
                if seen & bit:
                    raise duplicate_attr_error(an, path=path, rank=rank, node_id=nid)
                seen |= bit
                kind = a.WhichOneof("value")
                v = getattr(a, kind) if kind in _SCALAR_KINDS else None
                if an == IS_CPU_OP:
                    cpu = bool(v) if not isinstance(v, str) else False
                    # RooflineModel's own reading (_roofline_attrs): bool and integer kinds only.
                    r_cpu = bool(v) if kind == "bool_val" or kind in INT_KINDS else False
                elif an == STREAM:
                    stream = v
                elif an == COMM_TYPE:
                    a_ct = v
                elif an == COMM_SIZE:
                    a_size = v
                elif an == COMM_SRC:
                    a_src = v
                elif an == COMM_DST:
                    a_dst = v
                elif an == COMM_TAG:
                    a_tag = v
                elif an == PG_NAME or (an == "comm_group" and a_pg is None):
                    a_pg = v if isinstance(v, str) else (None if v is None else str(int(v)))
                elif an == DURATION_NS and r_dur is None and kind in INT_KINDS and exact:
                    r_dur = v
            elif an in ANNOTATION_COLUMNS:
                if vals is None:
                    vals = {}
                if an not in vals:  # the first occurrence wins, even when it holds no scalar
                    kind = a.WhichOneof("value")
                    vals[an] = getattr(a, kind) if kind in _SCALAR_KINDS else None
            elif an in _ROOFLINE and fast_roofline:
                kind = a.WhichOneof("value")
                if kind in INT_KINDS:
                    if an == NUM_OPS:
                        r_ops = getattr(a, kind)
                    else:
                        r_size = getattr(a, kind)
                elif kind in FLOAT_KINDS:
                    r_slow = True  # int(float) may raise: let duration_ns do it, at the same point
        if vals is not None:
            b.ann[g] = {
                k: (str(v) if ANNOTATION_COLUMNS[k] == "str" else _ann_int(v, k, path, rank, nid))
                for k, v in vals.items()
                if v is not None
            }
        # replay_duration_ns, inlined: xsim's exact duration_ns when present (and read), else duration_micros.
        rec = (r_dur if r_dur is not None and r_dur >= 0 else node.duration_micros * 1000) or 1
        recorded.append(rec)
        size = 0
        ct = -1
        pgn = comm_stream = None
        where = {"path": path, "rank": rank, "node_id": nid}
        # Kind, duration and slot.
        if nt == pb.COMP_NODE:
            kind = K_CPU if cpu else K_COMP
            if fast_duration:
                d = rec
            elif fast_roofline and not r_slow:
                d = compute.comp_duration_ns(rank, r_cpu, r_ops, r_size, rec)
            else:
                d = compute.duration_ns(rank, node)
            if not isinstance(d, int) or d < 0:
                raise ReplayError(
                    f"compute model {compute.name!r} gave {d!r} ns for {node.name!r}: need int >= 0"
                )
        elif cpu and nt in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
            # Old PyTorch converters label the host-side c10d:: call of a collective as a comm node with
            # is_cpu_op; its GPU kernel is the real collective. ASTRA-sim throws here; xsim replays the
            # host call on the CPU by its duration.
            kind, d = K_CPU, rec
        elif nt in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
            kind, d, size, ct, pgn, comm_stream = comm(
                b, nt, rank, g, rec, where, a_ct, a_size, a_src, a_dst, a_tag, a_pg
            )
        elif nt == pb.MEM_LOAD_NODE or nt == pb.MEM_STORE_NODE:
            kind = K_MEM
            d = rec if fast_duration else compute.duration_ns(rank, node)
        else:  # METADATA, INVALID and values outside the enum complete in 0 ns, as in ASTRA-sim
            kind, d = K_ZERO, 0
        kinds.append(kind)
        durs.append(d)
        nbytes.append(size)
        ctypes.append(ct)
        pgs.append(pgn)
        # Queue.
        if kind == K_RECV or kind == K_ZERO:
            q = -1
        elif config.honour_stream and stream is not None and kind != K_CPU:
            q = stream_q.get(stream)
            if q is None:
                q = stream_q[stream] = len(b.queue_cap)
                b.queue_cap.append(1)
                b.queue_label.append(f"rank {rank} stream {stream}")
        elif kind == K_COMP:
            q = q_comp
        elif kind == K_CPU:
            q = q_cpu
        else:
            q = b.comm_queue(rank, kind, comm_stream, q_comm)
        queue.append(q)
        # Dependencies (data and ctrl, as FeederV3).
        dd = node.data_deps[:]
        cd = node.ctrl_deps[:] if len(node.ctrl_deps) else None
        if cd:
            deps = set(dd)
            for dep in cd:
                # A ctrl dep names the calling op; old converters keep it when the caller was not
                # converted, or name the node itself. Such a dep can never finish: it is dropped and
                # counted (summary key ignored_ctrl_deps), not fatal. Data deps get no such leniency.
                if dep in id_to_l and dep != nid:
                    deps.add(dep)
                elif dep not in deps:
                    b.ignored_ctrl += 1
        elif len(dd) > 1:
            deps = set(dd)
        else:
            deps = dd
        ndeps.append(len(deps))
        children.append(empty)
        for dep in deps:
            p = id_to_l.get(dep)
            if p is None:
                raise TraceGraphError(f"data dependency on node {dep}, which is not in the file", **where)
            if dep >= nid:
                if dep == nid:
                    raise TraceGraphError("node depends on itself", **where)
                forward = True
            if p > i:
                # Forward edge: the parent's entry does not exist yet; attach it after the rank.
                fwd.setdefault(p, []).append(i)
                continue
            ch = children[p]
            if ch is empty:
                children[p] = [i]
            else:
                ch.append(i)
    _attach(children, fwd, empty)
    if forward:
        cyc = _cycle_ids(ids, children, ndeps)
        if cyc and config.ctrl_deps == "auto" and any(n.ctrl_deps for n in nodes):
            # The ctrl deps close a cycle (old converters write caller<->kernel pairs): fall back, for
            # this rank, to data deps alone, the legacy Chakra ETFeeder's rule. Counted in the summary.
            _data_only_edges(nodes, id_to_l, children, ndeps, empty)
            b.ctrl_ignored_ranks += 1
            cyc = _cycle_ids(ids, children, ndeps)
        if cyc:
            shown = ", ".join(map(str, cyc[:10])) + (" ..." if len(cyc) > 10 else "")
            raise TraceGraphError(
                f"dependency cycle: {len(cyc)} node(s) can never become ready (ids {shown})",
                path=path,
                rank=rank,
            )
    counts = np.fromiter((len(c) for c in children), dtype=np.int64, count=len(children))
    cidx = np.fromiter((base + c for ch in children for c in ch), dtype=np.int64, count=int(counts.sum()))
    b.add_rank(
        {
            "node_id": np.asarray(ids, dtype=np.int64) if ids else np.zeros(0, np.int64),
            "node_type": np.fromiter((n.type for n in nodes), dtype=np.int64, count=len(nodes)),
            "kind": np.asarray(kinds, dtype=np.int8),
            "dur": _int64(durs, rank, path),
            "ndeps": np.asarray(ndeps, dtype=np.int64),
            "queue": np.asarray(queue, dtype=np.int64),
            "recorded": _int64(recorded, rank, path),
            "nbytes": _int64(nbytes, rank, path),
            "ctype": np.asarray(ctypes, dtype=np.int64),
        },
        names,
        pgs,
        counts,
        cidx,
    )
    null_annotations(b, len(nodes))


INT64_MAX = 2**63 - 1


def _int64(values: list[int], rank: int, path: str) -> np.ndarray:
    """int64 array of ns / byte values; past int64 (a corrupt duration) an object array, so the run
    still reports the overflow where it always did (simulation._check_int64)."""
    try:
        return np.asarray(values, dtype=np.int64) if values else np.zeros(0, np.int64)
    except OverflowError:
        return np.asarray(values, dtype=object)


def _ann_int(v, name: str, path: str, rank: int, nid: int) -> int | None:
    """An integer annotation (layer, stage, ...): None for a string; NaN, inf or past int64 is an error."""
    if isinstance(v, str):
        return None
    if isinstance(v, float) and not math.isfinite(v) or not -INT64_MAX - 1 <= v <= INT64_MAX:
        raise TraceGraphError(f"{name} {v!r} is not an int64 integer", path=path, rank=rank, node_id=nid)
    return int(v)


def _int(v, what: str, where: dict) -> int:
    if isinstance(v, str) or isinstance(v, float) and not v.is_integer():  # NaN and inf included
        raise TraceGraphError(f"comm_{what} {v!r} is not an integer", **where)
    return int(v)


def _size(v, where: dict) -> int:
    if v is None:
        raise TraceGraphError("communication node without comm_size", **where)
    if isinstance(v, str) or isinstance(v, float) and not v.is_integer():  # NaN and inf included
        raise TraceGraphError(f"comm_size {v!r} is not an integer number of bytes", **where)
    v = int(v)
    if v < 0:
        raise TraceGraphError(f"comm_size {v} is negative", **where)
    return v


def reference_program(
    trace_set: TraceSet,
    groups: ProcessGroups,
    compute: ComputeModel | None,
    config: ReplayConfig,
    *,
    ranks: Sequence[int] | None = None,
) -> Program:
    """Every rank (or `ranks`) built node by node from its protobuf messages."""
    compute = compute or DurationModel(exact=config.durations != "micros")
    b = _Builder(groups, compute, config, trace_set.num_ranks)
    for rank in range(trace_set.num_ranks) if ranks is None else ranks:
        _slow_rank(b, trace_set, rank)
    return b.program(trace_set, ranks, compute.name)
