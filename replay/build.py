"""The program builder: one rank's program arrays from its columns (traces/columnar.py's RankColumns).

Columns are the builder's only input: `.et` files are decoded into them with numpy (traces/columnar.py),
and the files that decoder leaves to protobuf (JSON traces, rare forms) are decoded into the same columns
from their messages (traces/node_columns.py). A rank is built in stages, each over whole columns:

1. rows: the rank's nodes in ascending id (a duplicate id is an error);
2. lint: the first node that breaks an attribute rule (traces/attrcheck.py), named from its message;
3. dependencies: edges in CSR form, shared by ranks with equal ids and deps; the first data dependency on
   a node outside the file (or on the node itself);
4. kinds and durations: the compute model's `durations(rank, columns, rows)` (replay/compute.py);
5. communication nodes: their checks and matching data, once per distinct input;
6. errors, in node order: of the problems stages 2-5 found, the one the first node holds (a node's own
   attribute rule first, then its duration, its communication attributes, its dependencies), as a
   node-by-node pass would meet them; then a dependency cycle (after the ctrl-deps fallback);
7. queues (per `stream` with --honour-stream, per process group with comm_streams "group"), annotations.

tests/program_reference.py keeps the node-by-node builder from protobuf messages that this replaced; the
differential tests build every test set both ways and compare the programs field by field.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from xsim.replay.compute import durations_of
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
    _Builder,
    resolve_group,
)
from xsim.replay.rank_view import IS_INT, IS_INT_OR_BOOL, RankView
from xsim.traces import pb
from xsim.traces.attrcheck import columns_first_problem, columns_problem, node_problem
from xsim.traces.attrs import COMM_DST, COMM_SIZE, COMM_SRC, COMM_TAG, COMM_TYPE, PG_NAME, STREAM
from xsim.traces.columnar import F_BOOL, F_STRING, RankColumns
from xsim.traces.graph import unready


def _py(kind: int, value: int, strings: tuple[str, ...]):
    """An attribute value as protobuf gives it (None when absent or empty), from its column entry."""
    if kind <= 0:
        return None
    return strings[value] if kind == F_STRING else (bool(value) if kind == F_BOOL else value)


def _pg(v):
    return v if isinstance(v, str) else (None if v is None else str(int(v)))


# Records of numpy arrays (this one and the others so marked): no generated eq, hash or repr (why:
# traces/columnar.py, AttrColumn).
@dataclass(eq=False, repr=False)
class _Edges:
    """One rank's dependency edges: per row its dependency count, per row its child count, the children
    (rows) parent after parent, and the ctrl deps dropped (on absent ids or on the node itself)."""

    ndeps: np.ndarray
    counts: np.ndarray
    kids: np.ndarray
    ignored: int
    check_cycle: bool  # some edge goes to an earlier row (a cycle is possible) and no check ran yet


@dataclass(eq=False, repr=False)
class _Deps:
    """One rank's dependency lists as rows: owner row and parent row of every data / ctrl dependency."""

    d_owner: np.ndarray
    d_pos: np.ndarray
    c_owner: np.ndarray
    c_pos: np.ndarray
    c_valid: np.ndarray
    bad_row: int | None  # the first row with a data dep outside the file or on itself
    key: tuple | None  # the builder's cache key (ids and deps as bytes), for sorted files


@dataclass(eq=False, repr=False)
class _Nodes:
    """The rank's per-row program columns as the stages fill them."""

    kind: np.ndarray
    dur: np.ndarray
    nbytes: np.ndarray
    ctype: np.ndarray
    pgs: np.ndarray  # int32 codes into the builder's pg_table (-1: None)
    comm_rows: np.ndarray  # GPU communication rows
    comm_code: np.ndarray  # per comm row: its distinct input
    comm_firsts: list  # per distinct input: its first comm row (an index into comm_rows)
    comm_streams: tuple  # per distinct input: its stream (process group, p2p) or None


def build_rank(b: _Builder, rank: int, cols: RankColumns, f: int) -> None:
    """Append rank `rank` (file f of `cols`) to the builder, or raise the error its first bad node holds."""
    view, pos_of, span = _rows(b, rank, cols, f)
    batch = _batch(b, cols)
    n = view.n
    lint = None
    if batch["problem"]:
        lint = columns_first_problem(
            cols.attrs, view.sel, cols.duration_micros[view.sel], IS_INT_OR_BOOL, F_STRING
        )
    deps = _deps(b, view, pos_of, span)
    a_row = n if lint is None else lint
    d_row = n if deps.bad_row is None else deps.bad_row
    nodes, b_row = _kinds(b, view, min(a_row, d_row + 1))
    first = min(a_row, b_row, d_row)
    # A node's communication checks come before its dependencies' (and after its attributes, duration).
    _comm(b, view, nodes, first + 1 if first == d_row < min(a_row, b_row) else first)
    if first < n:
        _raise_at(b, view, nodes, first, a_row, b_row)
    edges = _edges(b, view, deps)
    edges = _acyclic(b, view, deps, edges)
    queue = _queues(b, view, nodes)
    b.add_rank(
        {
            "node_id": view.ids,
            "node_type": view.node_type,
            "kind": nodes.kind,
            "dur": nodes.dur,
            "ndeps": edges.ndeps,
            "queue": queue,
            "recorded": view.recorded,
            "nbytes": nodes.nbytes,
            "ctype": nodes.ctype,
        },
        batch["names"][view.sel],
        nodes.pgs,
        edges.counts,
        edges.kids + b.n,
    )
    b.ignored_ctrl += edges.ignored
    _annotations(b, view, batch)


def _rows(b: _Builder, rank: int, cols: RankColumns, f: int) -> tuple[RankView, np.ndarray, tuple[int, int]]:
    """The rank's view (rows in ascending id), each file-order node's row, and the file's nodes in cols."""
    lo, hi = int(cols.file_ptr[f]), int(cols.file_ptr[f + 1])
    n = hi - lo
    path = cols.paths[f]
    raw_ids = cols.node_id[lo:hi]
    own = np.arange(n)
    if n > 1 and not (raw_ids[1:] > raw_ids[:-1]).all():
        perm = np.argsort(raw_ids, kind="stable")  # the node-by-node order: ascending id
        sel = perm + lo
        ids = raw_ids[perm]
        dup = np.flatnonzero(ids[1:] == ids[:-1])
        if len(dup):
            nid = int(ids[dup[0]])
            raise TraceGraphError(f"duplicate node id {nid}", path=path, rank=rank, node_id=nid)
        pos_of = np.empty(n, dtype=np.int64)
        pos_of[perm] = own
        names = [cols.names[i] for i in sel.tolist()]
    else:
        sel = slice(lo, hi)
        ids = raw_ids
        pos_of = own
        names = cols.names[lo:hi]
    view = RankView(rank, path, cols, sel, ids, names, cols.node_type[sel], b.exact, b.memo)
    return view, pos_of, (lo, hi)


def _deps(b: _Builder, view: RankView, pos_of: np.ndarray, span: tuple[int, int]) -> _Deps:
    """The rank's dependencies as rows. Data deps must name other nodes of the file; ctrl deps on absent
    ids or on the node itself are dropped and counted (old converters name the uncoverted caller)."""
    cols, n, ids = view.cols, view.n, view.ids
    lo, hi = span
    d_cnt = np.diff(cols.data_ptr[lo : hi + 1])
    dd = cols.data_idx[int(cols.data_ptr[lo]) : int(cols.data_ptr[hi])]
    c_cnt = np.diff(cols.ctrl_ptr[lo : hi + 1])
    cd = cols.ctrl_idx[int(cols.ctrl_ptr[lo]) : int(cols.ctrl_ptr[hi])]
    # The edges follow from the ids in file order (sorted ids and, when the file is not in id order, each
    # file row's position) and the deps: ranks with equal keys share them (a stage's ranks; a compact
    # set's derived ranks, whose files are not in id order, issue 24 flow round 4).
    order = b"" if isinstance(view.sel, slice) else pos_of.tobytes()
    key = (ids.tobytes(), order, d_cnt.tobytes(), dd.tobytes(), c_cnt.tobytes(), cd.tobytes())
    hit = b.deps_cache.get(key)
    if hit is not None and not hit.check_cycle:  # deps checked, edges known
        z = np.zeros(0, dtype=np.int64)
        return _Deps(z, z, z, z, np.zeros(0, dtype=bool), None, key)
    own = np.arange(n)
    d_owner = pos_of[np.repeat(own, d_cnt)]
    c_owner = pos_of[np.repeat(own, c_cnt)]
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return _Deps(z, z, z, z, np.zeros(0, dtype=bool), None, key)
    d_pos = np.searchsorted(ids, dd)
    d_ok = (d_pos < n) & (ids[np.minimum(d_pos, n - 1)] == dd) & (dd != ids[d_owner])
    bad = d_owner[~d_ok]
    c_pos = np.searchsorted(ids, cd)
    c_valid = (c_pos < n) & (ids[np.minimum(c_pos, n - 1)] == cd) & (cd != ids[c_owner])
    return _Deps(d_owner, d_pos, c_owner, c_pos, c_valid, int(bad.min()) if len(bad) else None, key)


def _edge_arrays(n: int, child: np.ndarray, parent: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ndeps, child counts, children) of (child, parent) row pairs, duplicates merged; each parent's
    children: later rows first, then earlier ones, each ascending (the node-by-node order)."""
    m = max(n, 1)
    key = np.sort(child * m + parent)
    # Distinct keys by hand: np.unique without return_* imports numpy.ma (~30 ms of every small replay).
    key = key[np.r_[True, key[1:] != key[:-1]]] if len(key) else key
    child, parent = key // m, key % m
    ndeps = np.bincount(child, minlength=n).astype(np.int64)
    order = np.lexsort((child, child < parent, parent))
    counts = np.bincount(parent, minlength=n).astype(np.int64)
    return ndeps, counts, child[order]


def _edges(b: _Builder, view: RankView, deps: _Deps) -> _Edges:
    """The rank's edges (data deps and the valid ctrl deps), from the builder's cache when ranks share them."""
    hit = b.deps_cache.get(deps.key) if deps.key is not None else None
    if hit is not None:
        return hit
    child = np.concatenate([deps.d_owner, deps.c_owner[deps.c_valid]])
    parent = np.concatenate([deps.d_pos, deps.c_pos[deps.c_valid]])
    ndeps, counts, kids = _edge_arrays(view.n, child, parent)
    edges = _Edges(ndeps, counts, kids, int((~deps.c_valid).sum()), bool((parent > child).any()))
    if deps.key is not None:
        if len(b.deps_cache) >= _MAX_DEPS_CACHED:
            b.deps_cache.clear()
        b.deps_cache[deps.key] = edges
    return edges


# Distinct (ids, deps) kept by the builder: ~30 KB of key per 800-node rank, so at most a few MB; the
# 512-rank Llama-2 set has a few per pipeline stage, a set whose ranks all differ only refills it.
_MAX_DEPS_CACHED = 64


def _unready_ids(view: RankView, e: _Edges) -> list[int]:
    """Ids of the rows that can never become ready (on or behind a cycle), ascending."""
    ptr = np.concatenate(([0], np.cumsum(e.counts))).tolist()
    kl = e.kids.tolist()
    stuck = unready(e.ndeps.tolist(), [kl[ptr[i] : ptr[i + 1]] for i in range(view.n)])
    return sorted(int(view.ids[i]) for i in stuck)


def _acyclic(b: _Builder, view: RankView, deps: _Deps, edges: _Edges) -> _Edges:
    """The edges when no cycle; when the ctrl deps close one (old converters write caller<->kernel pairs)
    and config.ctrl_deps is "auto", the data deps alone (the legacy Chakra ETFeeder's rule, counted in the
    summary); else the cycle error."""
    if not edges.check_cycle:
        return edges
    cyc = _unready_ids(view, edges)
    if not cyc:
        edges.check_cycle = False  # shared by the ranks with these edges (the builder's cache)
        return edges
    if b.config.ctrl_deps == "auto" and len(deps.c_owner):
        ndeps, counts, kids = _edge_arrays(view.n, deps.d_owner, deps.d_pos)
        edges = _Edges(ndeps, counts, kids, edges.ignored, True)
        b.ctrl_ignored_ranks += 1
        cyc = _unready_ids(view, edges)
    if cyc:
        if deps.key is not None:
            b.deps_cache.pop(deps.key, None)
        shown = ", ".join(map(str, cyc[:10])) + (" ..." if len(cyc) > 10 else "")
        raise TraceGraphError(
            f"dependency cycle: {len(cyc)} node(s) can never become ready (ids {shown})",
            path=view.path,
            rank=view.rank,
        )
    return edges


def _kinds(b: _Builder, view: RankView, until: int) -> tuple[_Nodes, int]:
    """Kinds and durations of the rank's rows (the compute model asked for rows before `until`), and the
    first row whose duration the model got wrong (n when none)."""
    n, nt = view.n, view.node_type
    cpu = view.is_cpu()
    rec = view.recorded
    comp = nt == pb.COMP_NODE
    is_comm = (nt == pb.COMM_COLL_NODE) | (nt == pb.COMM_SEND_NODE) | (nt == pb.COMM_RECV_NODE)
    mem = (nt == pb.MEM_LOAD_NODE) | (nt == pb.MEM_STORE_NODE)
    kind = np.full(n, K_ZERO, dtype=np.int8)
    kind[comp] = np.where(cpu[comp], K_CPU, K_COMP)
    # Old PyTorch converters label the host-side c10d:: call of a collective as a comm node with
    # is_cpu_op; its GPU kernel is the real collective. ASTRA-sim throws here; xsim replays the host call on
    # the CPU by its duration.
    kind[is_comm & cpu] = K_CPU
    kind[mem] = K_MEM
    dur = np.zeros(n, dtype=np.int64)
    host = is_comm & cpu
    dur[host] = rec[host]
    rows = np.flatnonzero(comp | mem)
    rows = rows[rows < until]
    bad = n
    if len(rows):
        got = durations_of(b.compute, view.rank, view, rows)
        if isinstance(got, np.ndarray):
            neg = np.flatnonzero(got < 0)
            if len(neg):
                bad = int(rows[neg[0]])
                b.bad_duration = int(got[neg[0]])
        else:
            for j, d in enumerate(got):
                if not isinstance(d, int) or d < 0:
                    bad, b.bad_duration = int(rows[j]), d
                    break
            got = _int64(got)
        if got.dtype == object:
            dur = dur.astype(object)
        dur[rows] = got
    nodes = _Nodes(
        kind,
        dur,
        np.zeros(n, dtype=np.int64),
        np.full(n, -1, dtype=np.int64),
        np.full(n, -1, dtype=np.int32),
        np.flatnonzero(is_comm & ~cpu),
        np.zeros(0, dtype=np.int64),
        [],
        (),
    )
    return nodes, bad


def _int64(values: list) -> np.ndarray:
    """int64 array of ns values; past int64 an object array, so the run still reports the overflow where
    it always did (simulation._check_int64)."""
    try:
        return np.asarray(values, dtype=np.int64)
    except (OverflowError, TypeError, ValueError):
        return np.asarray(values, dtype=object)


def _raise_at(b: _Builder, view: RankView, nodes: _Nodes, row: int, a_row: int, b_row: int) -> None:
    """Raise the error of row `row`: its attribute rule, its duration, or its dependencies (in that order,
    the node-by-node order; its communication checks ran before this)."""
    nid = int(view.ids[row])
    where = {"path": view.path, "rank": view.rank, "node_id": nid}
    if row == a_row:
        problem = node_problem(view.node(row))
        raise TraceGraphError(problem or "breaks an attribute rule (docs/trace-format.md)", **where)
    if row == b_row:
        raise ReplayError(
            f"compute model {b.compute.name!r} gave {b.bad_duration!r} ns for {view.names[row]!r}: "
            "need int >= 0"
        )
    node = view.node(row)
    # The dependencies as the node-by-node pass iterated them: a set of the data deps and valid ctrl deps.
    known = set(view.ids.tolist())
    deps = set(node.data_deps)
    for dep in node.ctrl_deps:
        if dep in known and dep != nid:
            deps.add(dep)
    for dep in deps if len(node.data_deps) > 1 or len(node.ctrl_deps) else node.data_deps:
        if dep not in known:
            raise TraceGraphError(f"data dependency on node {dep}, which is not in the file", **where)
        if dep == nid:
            raise TraceGraphError("node depends on itself", **where)
    raise ReplayError(f"{view.path}: rank {view.rank} node {nid}: lint and builder disagree (a bug)")


@dataclass(frozen=True)
class _CommAttrs:
    """A communication node's attributes as protobuf gives them (None when absent)."""

    comm_type: object
    size: object
    src: object
    dst: object
    tag: object
    pg: str | None


def _comm_one(b: _Builder, nt: int, rank: int, rec: int, where: dict, a: _CommAttrs) -> tuple:
    """(kind, duration, bytes, comm_type, pg_name, stream, matching info) of a GPU comm node.

    stream: the process group's stream for a collective, the pipeline stream for a send, None for a recv;
    info: CollInfo, P2PInfo, or None for a collective replayed by its duration.
    """
    if nt == pb.COMM_COLL_NODE:
        return _collective(b, rank, rec, where, a)
    return _p2p(b, nt == pb.COMM_SEND_NODE, rank, rec, where, a)


def _collective(b: _Builder, rank: int, rec: int, where: dict, a: _CommAttrs) -> tuple:
    """_comm_one of a collective: its type, bytes and process group checked and resolved."""
    ct = a.comm_type
    if ct is None or isinstance(ct, str) or isinstance(ct, float) and not ct.is_integer():
        raise TraceGraphError("collective without an integer comm_type", **where)
    ct = int(ct)
    if ct not in COLLECTIVE_KIND:
        raise TraceGraphError(f"unknown comm_type {ct}", **where)
    size = _size(a.size, where)
    pgn = a.pg if a.pg is not None else ""
    if ct in b.config.duration_comm_types:
        return K_TCOMM, rec, size, ct, pgn, f"group {pgn!r}", None
    res = resolve_group(b.groups, pgn)
    if res is None:
        known = ", ".join(sorted(b.groups.groups)) or "none"
        raise TraceGraphError(
            f"pg_name {pgn!r} is not a known process group (known: {known}; pass --comm-groups FILE)",
            **where,
        )
    key, members = res
    if rank not in members:
        raise TraceGraphError(f"pg_name {pgn!r} = ranks {list(members)} does not contain this rank", **where)
    info = CollInfo(ct, size, key, members)
    return K_COLL, rec if b.measured else 0, size, ct, pgn, f"group {key!r}", info


def _p2p(b: _Builder, send: bool, rank: int, rec: int, where: dict, a: _CommAttrs) -> tuple:
    """_comm_one of a send or recv: its peers (this rank on its own side), tag and bytes checked."""
    size = _size(a.size, where)
    src = rank if (send and a.src is None) else a.src
    dst = rank if (not send and a.dst is None) else a.dst
    if src is None or dst is None or a.tag is None:
        need = "comm_dst" if send else "comm_src"
        raise TraceGraphError(f"{'send' if send else 'recv'} needs {need} and comm_tag", **where)
    src, dst, tag = (_int(v, k, where) for v, k in ((src, "src"), (dst, "dst"), (a.tag, "tag")))
    if (send and src != rank) or (not send and dst != rank):
        raise TraceGraphError(
            f"{'send comm_src' if send else 'recv comm_dst'} is {src if send else dst}, not this rank",
            **where,
        )
    for peer in (src, dst):
        if not 0 <= peer < b.n_ranks:
            raise TraceGraphError(f"peer rank {peer} outside 0..{b.n_ranks - 1}", **where)
    info = P2PInfo(src, dst, tag, size)
    stream = "p2p" if send else None
    return (K_SEND if send else K_RECV), rec if b.measured else 0, size, -1, a.pg, stream, info


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


def _queues(b: _Builder, view: RankView, nodes: _Nodes) -> np.ndarray:
    """Each row's queue: the rank's cpu, compute and comm slots, a process group's stream (comm_streams
    "group"), a `stream` attribute's queue (--honour-stream); -1 for recvs and zero-time nodes."""
    rank, kind = view.rank, nodes.kind
    q_cpu, q_comp, q_comm = b.rank_queues(rank)
    if b.config.honour_stream and (view.kind(STREAM) >= 0).any():
        return _stream_queues(b, view, nodes, (q_cpu, q_comp, q_comm))
    queue = np.full(view.n, q_comm, dtype=np.int64)
    queue[kind == K_COMP] = q_comp
    queue[kind == K_CPU] = q_cpu
    queue[(kind == K_RECV) | (kind == K_ZERO)] = -1
    ci = nodes.comm_rows
    if len(ci) and b.group_streams:
        # Once per distinct comm input, in order of first row: streams get their queues in node order.
        q_d = [
            -1 if st is None else b.comm_queue(rank, k, st, q_comm)
            for k, st in zip(kind[ci[nodes.comm_firsts]].tolist(), nodes.comm_streams, strict=True)
        ]
        queue[ci] = np.asarray(q_d, dtype=np.int64)[nodes.comm_code]
    return queue


def _stream_queues(b: _Builder, view: RankView, nodes: _Nodes, slots: tuple[int, int, int]) -> np.ndarray:
    """Queues with --honour-stream: a node with a `stream` attribute (not a CPU op) runs on that stream's
    queue, one op at a time; queues are numbered in node order."""
    q_cpu, q_comp, q_comm = slots
    rank = view.rank
    k_st, v_st = view.kind(STREAM).tolist(), view.value(STREAM).tolist()
    comm_stream: list = [None] * view.n
    for i, d in zip(nodes.comm_rows.tolist(), nodes.comm_code.tolist(), strict=True):
        comm_stream[i] = nodes.comm_streams[d]
    stream_q: dict = {}
    out = []
    for i, k in enumerate(nodes.kind.tolist()):
        stream = _py(k_st[i], v_st[i], ())
        if k == K_RECV or k == K_ZERO:
            q = -1
        elif stream is not None and k != K_CPU:
            q = stream_q.get(stream)
            if q is None:
                q = stream_q[stream] = len(b.queue_cap)
                b.queue_cap.append(1)
                b.queue_label.append(f"rank {rank} stream {stream}")
        elif k == K_COMP:
            q = q_comp
        elif k == K_CPU:
            q = q_cpu
        else:
            q = b.comm_queue(rank, k, comm_stream[i], q_comm)
        out.append(q)
    return np.asarray(out, dtype=np.int64)


def _comm(b: _Builder, view: RankView, nodes: _Nodes, until: int) -> None:
    """The rank's GPU communication rows before `until` through `_comm_one`, once per distinct (type,
    recorded duration, comm attributes): a trace repeats a few collectives and transfers many times.
    Distinct inputs go in order of their first row, so the first error raised is the one the node-by-node
    order meets; the matching data are recorded in node order (the same frozen CollInfo / P2PInfo shared
    by rows with equal inputs)."""
    ci = nodes.comm_rows
    ci = nodes.comm_rows = ci[ci < until]
    if not len(ci):
        return
    code, firsts, inputs = _distinct_comm(b, view, ci)
    base = b.n
    res = []
    first_i = ci[firsts]
    rec = view.recorded[first_i].tolist()
    for j, (i, nid) in enumerate(zip(first_i.tolist(), view.ids[first_i].tolist(), strict=True)):
        where = {"path": view.path, "rank": view.rank, "node_id": nid}
        res.append(_comm_one(b, int(view.node_type[i]), view.rank, rec[j], where, inputs[j]))
    k_, d_, s_, c_, p_, st_, info_ = zip(*res, strict=True)
    nums = np.asarray([k_, d_, s_, c_], dtype=np.int64)
    nodes.kind[ci], nodes.dur[ci], nodes.nbytes[ci], nodes.ctype[ci] = nums[:, code]
    nodes.pgs[ci] = np.asarray([b.pg_table.code(p) for p in p_], dtype=np.int32)[code]
    code_l = code.tolist()
    nodes.comm_code, nodes.comm_firsts, nodes.comm_streams = code, firsts, st_
    for g, d in zip((ci + base).tolist(), code_l, strict=True):
        info = info_[d]
        if info is None:
            continue
        if type(info) is CollInfo:
            b.coll[g] = info
        else:
            b.p2p[g] = info


# The attributes that decide a communication node's matching data.
_COMM_ATTRS = (COMM_TYPE, COMM_SIZE, COMM_SRC, COMM_DST, COMM_TAG, PG_NAME, "comm_group")


def _distinct_comm(
    b: _Builder, view: RankView, ci: np.ndarray
) -> tuple[np.ndarray, list[int], list[_CommAttrs]]:
    """Each comm row's distinct-input code, the first row (index into ci) of each distinct input, and its
    attributes. One bytes key per row (type, recorded duration, kinds and values): cheaper to build and hash
    than a tuple; the kinds and values of every node of the batch are stacked once per batch."""
    cols = view.cols
    present = [cols.attrs.get(name) for name in _COMM_ATTRS]
    table = _comm_table(b, cols, present)
    rows = np.empty((len(ci), 2 + len(table)), dtype=np.int64)
    rows[:, 0] = view.node_type[ci]
    rows[:, 1] = view.recorded[ci]
    rows[:, 2:] = table[:, view.at(ci)].T
    index: dict[bytes, int] = {}
    firsts: list[int] = []
    code_l = []
    for j, key in enumerate(rows.view(f"V{8 * rows.shape[1]}").ravel().tolist()):
        d = index.get(key)
        if d is None:
            d = index[key] = len(firsts)
            firsts.append(j)
        code_l.append(d)
    # pg_name when the node has one, else comm_group: the column of its kind.
    pg_at = 2 + 2 * sum(c is not None for c in present[:5]) if present[5] is not None else None
    inputs = []
    for row in rows[firsts].tolist():
        v: list = [None] * len(_COMM_ATTRS)
        col = 2
        for a, c in enumerate(present):
            if c is None:
                continue
            v[a] = _py(row[col], row[col + 1], c.strings)
            col += 2
        pg = v[5] if pg_at is not None and row[pg_at] >= 0 else v[6]
        inputs.append(_CommAttrs(*v[:5], _pg(pg)))
    return np.asarray(code_l, dtype=np.int64), firsts, inputs


def _batch(b: _Builder, cols: RankColumns) -> dict:
    """What build_rank computes once per batch of decoded files (the builder keeps the last batch's):
    whether any node of it breaks traces.attrcheck's rule (when none does, no rank of it can), its nodes'
    names as codes into the builder's name table, and its annotation columns."""
    if b.batch is not None and b.batch[0] is cols:
        return b.batch[1]
    n = cols.num_nodes
    every = slice(0, n)
    out: dict = {
        "problem": columns_problem(cols.attrs, every, cols.duration_micros, IS_INT_OR_BOOL, F_STRING),
        "names": b.name_table.codes(cols.names),
    }
    for name, typ in ANNOTATION_COLUMNS.items():
        c = cols.attrs.get(name)
        if c is None:
            continue
        k, v = c.kind, c.value
        if typ == "int":
            ok = IS_INT_OR_BOOL[k + 1]
            out[name] = (np.where(ok, v, 0), ok)
            continue
        table = b.ann_strings[name]
        codes = np.full(n, -1, dtype=np.int32)
        m = k == F_STRING
        if m.any():
            lut = np.asarray([table.setdefault(s, len(table)) for s in c.strings], dtype=np.int32)
            codes[m] = lut[v[m]]
        # Integer and bool values of a string column take the rank-by-rank rule below (str() of each).
        out[name] = (codes, bool((IS_INT[k + 1] | (k == F_BOOL)).any()))
    b.batch = (cols, out)
    return out


def _comm_table(b: _Builder, cols: RankColumns, present: list) -> np.ndarray:
    """The kind and value of each present comm attribute (_COMM_ATTRS order) of every node of the batch,
    as the rows of one int64 array (computed once per batch, kept with _batch's)."""
    got = b.batch[1].get("comm_table") if b.batch is not None and b.batch[0] is cols else None
    if got is None:
        got = np.empty((2 * sum(c is not None for c in present), cols.num_nodes), dtype=np.int64)
        j = 0
        for c in present:
            if c is not None:
                got[j] = c.kind
                got[j + 1] = c.value
                j += 2
        if b.batch is not None and b.batch[0] is cols:
            b.batch[1]["comm_table"] = got
    return got


def _annotations(b: _Builder, view: RankView, batch: dict) -> None:
    """The rank's annotation columns (after the lint, integer names hold integers or bools and string
    names strings)."""
    n, sel = view.n, view.sel
    for name, typ in ANNOTATION_COLUMNS.items():
        cached = batch.get(name)
        if typ == "int":
            if cached is None:
                b.ann_chunks[name].append((np.zeros(n, np.int64), np.zeros(n, bool)))
            else:
                b.ann_chunks[name].append((cached[0][sel], cached[1][sel]))
        elif cached is None:
            b.ann_chunks[name].append((np.full(n, -1, dtype=np.int32),))
        else:
            b.ann_chunks[name].append((cached[0][sel],))
