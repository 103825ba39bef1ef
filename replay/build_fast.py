"""The program builder's columnar path: one rank from decoded columns (traces/columnar.py) with numpy.

It computes exactly what `program._slow_rank` computes node by node, for the traces it can prove ordinary:
unique ids (sorted here when the file is not), every data dependency on another node of the file, no
dependency cycle, no `stream` queues, a duration or roofline compute model (tests/test_replay_columnar.py
compares the two paths field by field). Anything else returns False before touching the builder, and the rank is built
node by node (where every error message lives). Communication nodes (a few percent) go through the same
`_Builder.comm` as the node-by-node path, in node order, so their checks and errors are shared.
"""

from __future__ import annotations

import numpy as np

from replay.errors import ReplayError
from replay.program import (
    ANNOTATION_COLUMNS,
    K_COMP,
    K_CPU,
    K_MEM,
    K_RECV,
    K_ZERO,
    _Builder,
)
from traces import pb
from traces.attrcheck import columns_problem
from traces.attrs import (
    COMM_DST,
    COMM_SIZE,
    COMM_SRC,
    COMM_TAG,
    COMM_TYPE,
    DURATION_NS,
    IS_CPU_OP,
    NUM_OPS,
    PG_NAME,
    STREAM,
    TENSOR_SIZE,
)
from traces.columnar import F_BOOL, F_INT32, F_INT64, F_STRING, F_UINT32, F_UINT64, RankColumns
from traces.graph import unready

_INT_FIELDS = (F_INT32, F_INT64, F_UINT32, F_UINT64)
# Lookup by attribute kind + 1 (kind -1 = absent): integer value fields, and those plus bool.
_IS_INT = np.zeros(65, dtype=bool)
_IS_INT[[f + 1 for f in _INT_FIELDS]] = True
_IS_INT_OR_BOOL = _IS_INT.copy()
_IS_INT_OR_BOOL[F_BOOL + 1] = True


class _Attrs:
    """One rank's slice of the attribute columns."""

    def __init__(self, cols: RankColumns, sel) -> None:
        self.cols = cols
        self.sel = sel  # the rank's nodes in ascending id: a slice, or indices when the file is not sorted
        self.n = (sel.stop - sel.start) if isinstance(sel, slice) else len(sel)

    def kind(self, name: str) -> np.ndarray:
        c = self.cols.attrs.get(name)
        return np.full(self.n, -1, dtype=np.int8) if c is None else c.kind[self.sel]

    def value(self, name: str) -> np.ndarray:
        c = self.cols.attrs.get(name)
        return np.zeros(self.n, dtype=np.int64) if c is None else c.value[self.sel]

    def _at(self, idx):
        return (self.sel.start + idx) if isinstance(self.sel, slice) else self.sel[idx]


def _py(kind: int, value: int, strings: tuple[str, ...]):
    """An attribute value as protobuf gives it (None when absent or empty), from its column entry."""
    if kind <= 0:
        return None
    return strings[value] if kind == F_STRING else (bool(value) if kind == F_BOOL else value)


def _pg(v):
    return v if isinstance(v, str) else (None if v is None else str(int(v)))


def fast_rank(b: _Builder, rank: int, cols: RankColumns, f: int) -> bool:
    """Append rank `rank` (file f of `cols`) to the builder; False (builder untouched) when it cannot."""
    if not (b.fast_duration or b.fast_roofline):
        return False
    lo, hi = int(cols.file_ptr[f]), int(cols.file_ptr[f + 1])
    n = hi - lo
    path = cols.paths[f]
    raw_ids = cols.node_id[lo:hi]
    own = np.arange(n)
    if n > 1 and not (raw_ids[1:] > raw_ids[:-1]).all():
        perm = np.argsort(raw_ids, kind="stable")  # the node-by-node path sorts by id too
        sel = perm + lo
        ids = raw_ids[perm]
        if not (ids[1:] > ids[:-1]).all():
            return False  # duplicate ids: an error, reported node by node
        pos_of = np.empty(n, dtype=np.int64)
        pos_of[perm] = own
        names = [cols.names[i] for i in sel.tolist()]
    else:
        sel = slice(lo, hi)
        ids = raw_ids
        pos_of = own
        names = cols.names[lo:hi]
    at = _Attrs(cols, sel)
    batch = _batch(b, cols)
    if batch["problem"] and columns_problem(
        cols.attrs, sel, cols.duration_micros[sel], _IS_INT_OR_BOOL, F_STRING
    ):
        return False  # traces.attrcheck's rule: the node-by-node path names the node
    if b.config.honour_stream and (at.kind(STREAM) >= 0).any():
        return False
    pg_c, cg_c = cols.attrs.get(PG_NAME), cols.attrs.get("comm_group")
    if pg_c is not None and cg_c is not None and ((pg_c.kind[sel] >= 0) & (cg_c.kind[sel] >= 0)).any():
        return False

    # Dependencies: data deps must name nodes of the file (not the node itself); ctrl deps on absent ids or
    # on the node itself are dropped and counted. A file with edges to later ids is checked for cycles
    # here; one with a cycle (or any error) is built node by node, where the messages and the ctrl-deps
    # fallback live.
    d0, d1 = int(cols.data_ptr[lo]), int(cols.data_ptr[hi])
    dd = cols.data_idx[d0:d1]
    d_cnt = np.diff(cols.data_ptr[lo : hi + 1])
    c0, c1 = int(cols.ctrl_ptr[lo]), int(cols.ctrl_ptr[hi])
    cd = cols.ctrl_idx[c0:c1]
    c_cnt = np.diff(cols.ctrl_ptr[lo : hi + 1])
    # The edges follow from the sorted ids and the deps alone, and the ranks of a stage (TP peers, DP
    # replicas) hold the same ones: worked out once per distinct (ids, deps) of the builder.
    dkey = None
    if isinstance(sel, slice):
        dkey = (ids.tobytes(), d_cnt.tobytes(), dd.tobytes(), c_cnt.tobytes(), cd.tobytes())
        hit = b.deps_cache.get(dkey)
        if hit is not None:
            ndeps, counts, kids, ignored = hit
            return _finish(b, rank, cols, n, path, at, batch, sel, ids, names, ndeps, counts, kids, ignored)
    d_owner = pos_of[np.repeat(own, d_cnt)]
    c_owner = pos_of[np.repeat(own, c_cnt)]
    if n == 0:
        if len(dd) or len(cd):
            return False
        c_valid = np.zeros(0, dtype=bool)
        child = parent = np.zeros(0, dtype=np.int64)
    else:
        d_pos = np.searchsorted(ids, dd)
        if len(dd) and not ((d_pos < n) & (ids[np.minimum(d_pos, n - 1)] == dd)).all():
            return False
        if (dd == ids[d_owner]).any():
            return False
        c_pos = np.searchsorted(ids, cd)
        c_found = (c_pos < n) & (ids[np.minimum(c_pos, n - 1)] == cd)
        c_valid = c_found & (cd != ids[c_owner])
        child = np.concatenate([d_owner, c_owner[c_valid]])
        parent = np.concatenate([d_pos, c_pos[c_valid]])
    key = np.sort(child * max(n, 1) + parent)
    # Distinct keys by hand: np.unique without return_* imports numpy.ma (~30 ms of every small replay).
    key = key[np.r_[True, key[1:] != key[:-1]]] if len(key) else key
    child, parent = key // max(n, 1), key % max(n, 1)
    ndeps = np.bincount(child, minlength=n).astype(np.int64)
    # Each parent's children: later nodes first, then earlier ones, each ascending (the node-by-node order).
    order = np.lexsort((child, child < parent, parent))
    counts = np.bincount(parent, minlength=n).astype(np.int64)
    kids = child[order]
    if (parent > child).any() and _has_cycle(n, ndeps, counts, kids):
        return False
    ignored = int((~c_valid).sum())
    if dkey is not None:
        if len(b.deps_cache) >= _MAX_DEPS_CACHED:
            b.deps_cache.clear()
        b.deps_cache[dkey] = (ndeps, counts, kids, ignored)
    return _finish(b, rank, cols, n, path, at, batch, sel, ids, names, ndeps, counts, kids, ignored)


# Distinct (ids, deps) kept by the builder: ~30 KB of key per 800-node rank, so at most a few MB; the
# 512-rank Llama-2 set has a few per pipeline stage, a set whose ranks all differ only refills it.
_MAX_DEPS_CACHED = 64


def _finish(
    b: _Builder, rank, cols: RankColumns, n, path, at, batch, sel, ids, names, ndeps, counts, kids, ignored
) -> bool:
    """fast_rank past the edges (its rank's ndeps, child counts, children in order, dropped ctrl deps)."""
    nt = cols.node_type[sel]
    cidx = kids + b.n

    # Kinds and durations.
    k_cpu = at.kind(IS_CPU_OP)
    cpu = (k_cpu > 0) & (k_cpu != F_STRING) & (at.value(IS_CPU_OP) != 0)
    # The recorded duration: xsim's exact duration_ns (an integer kind) when present and read (not in the
    # "micros" rule of ReplayConfig.durations), else duration_micros.
    rec = cols.duration_micros[sel] * 1000
    if b.exact:
        k_dur = at.kind(DURATION_NS)
        has_dur = (k_dur > 0) & (k_dur != F_STRING) & (k_dur != F_BOOL) & (at.value(DURATION_NS) >= 0)
        rec = np.where(has_dur, at.value(DURATION_NS), rec)
    rec[rec == 0] = 1
    comp = nt == pb.COMP_NODE
    is_comm = (nt == pb.COMM_COLL_NODE) | (nt == pb.COMM_SEND_NODE) | (nt == pb.COMM_RECV_NODE)
    mem = (nt == pb.MEM_LOAD_NODE) | (nt == pb.MEM_STORE_NODE)
    kind = np.full(n, K_ZERO, dtype=np.int8)
    kind[comp] = np.where(cpu[comp], K_CPU, K_COMP)
    kind[is_comm & cpu] = K_CPU
    kind[mem] = K_MEM
    dur = np.zeros(n, dtype=np.int64)
    timed = (is_comm & cpu) | mem | comp
    dur[timed] = rec[timed]
    if b.fast_roofline and comp.any():
        _roofline(b, rank, at, comp, cpu, rec, dur, names)

    # Communication nodes, in node order, through the shared checks.
    q_cpu, q_comp, q_comm = b.rank_queues(rank)
    nbytes = np.zeros(n, dtype=np.int64)
    ctype = np.full(n, -1, dtype=np.int64)
    pgs: list[str | None] = [None] * n
    ci = np.nonzero(is_comm & ~cpu)[0]
    if len(ci):
        code, nums, pg_d, st_d = _comm_nodes(b, rank, path, cols, at, ci, ids, nt, rec)
        kind[ci], dur[ci], nbytes[ci], ctype[ci] = nums[:, code]
        code_l = code.tolist()
        for i, d in zip(ci.tolist(), code_l, strict=True):
            pgs[i] = pg_d[d]
    queue = np.full(n, q_comm, dtype=np.int64)
    queue[kind == K_COMP] = q_comp
    queue[kind == K_CPU] = q_cpu
    queue[(kind == K_RECV) | (kind == K_ZERO)] = -1
    if len(ci) and b.group_streams:
        # Once per distinct comm input, in order of first node: streams get their queues in node order.
        q_d = [
            -1 if st is None else b.comm_queue(rank, k, st, q_comm)
            for k, st in zip(nums[0].tolist(), st_d, strict=True)
        ]
        queue[ci] = np.asarray(q_d, dtype=np.int64)[code]
    b.add_rank(
        {
            "node_id": ids,
            "node_type": nt,
            "kind": kind,
            "dur": dur,
            "ndeps": ndeps,
            "queue": queue,
            "recorded": rec,
            "nbytes": nbytes,
            "ctype": ctype,
        },
        names,
        pgs,
        counts,
        cidx,
    )
    b.ignored_ctrl += ignored
    _annotations(b, at, batch)
    return True


def _batch(b: _Builder, cols: RankColumns) -> dict:
    """What fast_rank computes once per batch of decoded files (the builder keeps the last batch's):
    whether any node of it breaks traces.attrcheck's rule (when none does, no rank of it can), and its
    annotation columns."""
    if b.batch is not None and b.batch[0] is cols:
        return b.batch[1]
    n = cols.num_nodes
    every = slice(0, n)
    out: dict = {
        "problem": columns_problem(cols.attrs, every, cols.duration_micros, _IS_INT_OR_BOOL, F_STRING)
    }
    for name, typ in ANNOTATION_COLUMNS.items():
        c = cols.attrs.get(name)
        if c is None:
            continue
        k, v = c.kind, c.value
        if typ == "int":
            ok = _IS_INT_OR_BOOL[k + 1]
            out[name] = (np.where(ok, v, 0), ok)
            continue
        table = b.ann_strings[name]
        codes = np.full(n, -1, dtype=np.int32)
        m = k == F_STRING
        if m.any():
            lut = np.asarray([table.setdefault(s, len(table)) for s in c.strings], dtype=np.int32)
            codes[m] = lut[v[m]]
        # Integer and bool values of a string column take the rank-by-rank rule below (str() of each).
        out[name] = (codes, bool((_IS_INT[k + 1] | (k == F_BOOL)).any()))
    b.batch = (cols, out)
    return out


# The attributes that decide a communication node's matching data (the arguments of _Builder.comm).
_COMM_ATTRS = (COMM_TYPE, COMM_SIZE, COMM_SRC, COMM_DST, COMM_TAG, PG_NAME, "comm_group")


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


def _comm_nodes(b: _Builder, rank: int, path: str, cols: RankColumns, at: _Attrs, ci, ids, nt, rec) -> tuple:
    """The rank's GPU comm nodes `ci` as (each node's distinct-input code; per distinct input, in order of
    first node: a (4, distinct) array of kinds, durations, bytes and comm types, pg names, streams), through
    `_Builder.comm` once per distinct (type, recorded duration, comm attributes): a trace repeats a few
    collectives and transfers many times. Distinct inputs go in order of their first node, so the first
    error raised is the one the node-by-node order raises; the matching data are recorded in node order
    (the same frozen CollInfo / P2PInfo shared by nodes with equal inputs)."""
    present = [cols.attrs.get(name) for name in _COMM_ATTRS]
    # One bytes key per node (its row of type, recorded duration, kinds and values): cheaper to build and
    # hash than a tuple; the kinds and values of every node of the batch are stacked once per batch.
    table = _comm_table(b, cols, present)
    rows = np.empty((len(ci), 2 + len(table)), dtype=np.int64)
    rows[:, 0] = nt[ci]
    rows[:, 1] = rec[ci]
    rows[:, 2:] = table[:, at._at(ci)].T
    index: dict[bytes, int] = {}
    firsts: list[int] = []
    code_l = []
    for j, key in enumerate(rows.view(f"V{8 * rows.shape[1]}").ravel().tolist()):
        d = index.get(key)
        if d is None:
            d = index[key] = len(firsts)
            firsts.append(j)
        code_l.append(d)
    code = np.asarray(code_l, dtype=np.int64)
    base = b.n
    res, infos = [], []
    saved = b.coll, b.p2p
    b.coll, b.p2p = {}, {}  # catches the infos _Builder.comm records
    try:
        # pg_name when the node has one (even without a value), else comm_group: its kind's column.
        pg_at = 2 + 2 * sum(c is not None for c in present[:5]) if present[5] is not None else None
        first_i = ci[firsts]
        for row, i, nid in zip(rows[firsts].tolist(), first_i.tolist(), ids[first_i].tolist(), strict=True):
            v: list = [None] * len(_COMM_ATTRS)
            col = 2
            for a, c in enumerate(present):
                if c is None:
                    continue
                v[a] = _py(row[col], row[col + 1], c.strings)
                col += 2
            pg = v[5] if pg_at is not None and row[pg_at] >= 0 else v[6]
            g = base + i
            where = {"path": path, "rank": rank, "node_id": nid}
            res.append(b.comm(row[0], rank, g, row[1], where, *v[:5], _pg(pg)))
            infos.append(b.coll.get(g, b.p2p.get(g)))
    finally:
        coll, p2p = b.coll, b.p2p
        b.coll, b.p2p = saved
    # Every node gets its distinct input's record, in the dict _Builder.comm put that one in (none for a
    # comm node replayed by its duration), in node order.
    gs = (ci + base).tolist()
    dest = []
    for d, j in enumerate(firsts):
        g = gs[j]
        dest.append((b.coll, infos[d]) if g in coll else (b.p2p, infos[d]) if g in p2p else None)
    for g, d in zip(gs, code_l, strict=True):
        e = dest[d]
        if e is not None:
            e[0][g] = e[1]
    k_, d_, s_, c_, p_, st_ = zip(*res, strict=True)
    return code, np.asarray([k_, d_, s_, c_], dtype=np.int64), p_, st_


def _has_cycle(n: int, ndeps: np.ndarray, counts: np.ndarray, kids: np.ndarray) -> bool:
    """True when some node of one rank's CSR edges can never become ready (traces.graph.unready)."""
    ptr = np.concatenate(([0], np.cumsum(counts))).tolist()
    kl = kids.tolist()
    return bool(unready(ndeps.tolist(), [kl[ptr[i] : ptr[i + 1]] for i in range(n)]))


def _roofline(b: _Builder, rank, at: _Attrs, comp, cpu, rec, dur, names) -> None:
    """RooflineModel.comp_duration_ns once per distinct (device, cpu, num_ops, tensor_size, recorded)."""
    idx = np.nonzero(comp)[0]
    k_ops, k_size = at.kind(NUM_OPS)[idx], at.kind(TENSOR_SIZE)[idx]
    has_ops, has_size = _IS_INT[k_ops + 1], _IS_INT[k_size + 1]
    ops_a = np.where(has_ops, at.value(NUM_OPS)[idx], -1)
    size_a = np.where(has_size, at.value(TENSOR_SIZE)[idx], -1)
    compute = b.compute
    prof = compute.profile(rank)
    # Ranks of one stage (TP peers, DP replicas) run the same ops on the same device: one lookup per rank.
    rank_key = (prof, ops_a.tobytes(), size_a.tobytes(), cpu[idx].tobytes(), rec[idx].tobytes())
    hit = b.roofline_cache.get(rank_key)
    if hit is not None:
        dur[idx] = hit
        return
    ops, size = ops_a.tolist(), size_a.tolist()
    c_ = cpu[idx].tolist()
    r_ = rec[idx].tolist()
    ho, hs = has_ops.tolist(), has_size.tolist()
    cache = b.roofline_cache
    out = []
    for j in range(len(idx)):
        key = (prof, c_[j], ops[j] if ho[j] else None, size[j] if hs[j] else None, r_[j])
        d = cache.get(key)
        if d is None:
            d = compute.comp_duration_ns(rank, *key[1:])
            if not isinstance(d, int) or d < 0:
                raise ReplayError(
                    f"compute model {compute.name!r} gave {d!r} ns for {names[int(idx[j])]!r}: need int >= 0"
                )
            cache[key] = d
        out.append(d)
    dur[idx] = out
    b.roofline_cache[rank_key] = dur[idx]


def _annotations(b: _Builder, at: _Attrs, batch: dict) -> None:
    """The rank's annotation columns, read by the node-by-node path's rules (first value, str() / int())."""
    n = at.n
    sel = at.sel
    for name, typ in ANNOTATION_COLUMNS.items():
        cached = batch.get(name)
        if typ == "int":
            if cached is None:
                b.ann_chunks[name].append((np.zeros(n, np.int64), np.zeros(n, bool)))
            else:
                b.ann_chunks[name].append((cached[0][sel], cached[1][sel]))
            continue
        if cached is None:
            b.ann_chunks[name].append((np.full(n, -1, dtype=np.int32),))
            continue
        codes = cached[0][sel]
        if cached[1]:  # integer or bool values in the batch: str() of each, in this rank's order
            codes = codes.copy()
            table = b.ann_strings[name]
            k = at.kind(name)
            v = at.value(name)
            m = _IS_INT[k + 1]
            if m.any():
                u, inv = np.unique(v[m], return_inverse=True)
                lut = np.asarray([table.setdefault(str(x), len(table)) for x in u.tolist()], dtype=np.int32)
                codes[m] = lut[inv.reshape(-1)]
            m = k == F_BOOL
            if m.any():
                u, inv = np.unique(v[m], return_inverse=True)
                lut = np.asarray(
                    [table.setdefault(str(bool(x)), len(table)) for x in u.tolist()], dtype=np.int32
                )
                codes[m] = lut[inv.reshape(-1)]
        b.ann_chunks[name].append((codes,))
