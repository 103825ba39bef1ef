"""Replay results as polars DataFrames with fixed, documented schemas, and their on-disk form.

Column meanings are in docs/replay.md; the schemas below are the public interface.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from replay.engine import EngineOutput
from replay.metrics import rank_accounting, union_length
from replay.program import ANNOTATION_COLUMNS, K_COLL, K_RECV, K_SEND, KIND_RESOURCE, Program
from traces import pb
from traces.groups import ProcessGroups

OPS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32,
    "node_id": pl.UInt64,
    "name": pl.String,
    "type": pl.String,
    "resource": pl.String,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "duration_ns": pl.Int64,
    "ready_ns": pl.Int64,
    "wait_ns": pl.Int64,
    "bytes": pl.Int64,
    "comm_type": pl.String,
    "pg_name": pl.String,
    "collective": pl.Int64,
    "p2p": pl.Int64,
    "peer": pl.Int32,
    "layer": pl.Int64,
    "phase": pl.String,
    "micro_batch": pl.Int64,
    "stage": pl.Int64,
    "device_group": pl.Int64,
    "ring": pl.Int64,
    "chunk": pl.Int64,
    "reshard": pl.String,
}
RANKS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32,
    "finish_ns": pl.Int64,
    "compute_ns": pl.Int64,
    "cpu_ns": pl.Int64,
    "comm_ns": pl.Int64,
    "exposed_comm_ns": pl.Int64,
    "idle_ns": pl.Int64,
    "wait_ns": pl.Int64,
    "bubble_ns": pl.Int64,
    "ops": pl.Int64,
    "comm_bytes": pl.Int64,
}
COLLECTIVES_SCHEMA: dict[str, pl.DataType] = {
    "collective": pl.Int64,
    "pg_name": pl.String,
    "comm_type": pl.String,
    "ranks": pl.Int32,
    "bytes": pl.Int64,
    "first_arrival_ns": pl.Int64,
    "last_arrival_ns": pl.Int64,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "duration_ns": pl.Int64,
    "wait_sum_ns": pl.Int64,
}
# Summary keys that depend only on the inputs (written to summary.json / summary.csv).
SUMMARY_SCHEMA: dict[str, pl.DataType] = {
    "iteration_time_ns": pl.Int64,
    "num_ranks": pl.Int64,
    "num_nodes": pl.Int64,
    "num_collectives": pl.Int64,
    "num_p2p": pl.Int64,
    "bytes_moved": pl.Int64,
    "compute_ns": pl.Int64,
    "comm_ns": pl.Int64,
    "exposed_comm_ns": pl.Int64,
    # The three above are sums over ranks, kept under their first names for existing readers; the
    # `_total` names say so, like wait_ns_total and bubble_ns_total (issue 13 item 10).
    "compute_ns_total": pl.Int64,
    "comm_ns_total": pl.Int64,
    "exposed_comm_ns_total": pl.Int64,
    "wait_ns_total": pl.Int64,
    "wait_ns_max": pl.Int64,
    "bubble_ns_total": pl.Int64,
    "bubble_ns_max": pl.Int64,
    "events": pl.Int64,
    "ignored_ctrl_deps": pl.Int64,
    "ctrl_deps_ignored_ranks": pl.Int64,
    "network_model": pl.String,
    "compute_model": pl.String,
    "comm_mode": pl.String,
}
# Wall-clock keys: in the in-memory summary and perf.json only, never in the files that must be identical.
PERF_SCHEMA: dict[str, pl.DataType] = {
    "sim_wall_s": pl.Float64,
    "engine_wall_s": pl.Float64,
    "engine_cpu_s": pl.Float64,
    "events_per_s": pl.Float64,
}
_RESOURCE_CODE = {"compute": 0, "cpu": 1, "comm": 2, "none": 3}


@dataclass
class ReplayResult:
    """What a replay produced: ops, ranks, collectives and summary tables."""

    ops: pl.DataFrame
    ranks: pl.DataFrame
    collectives: pl.DataFrame
    summary: pl.DataFrame
    per_rank_finish_ns: list[int]
    paths: tuple[str, ...] = ()
    groups: ProcessGroups | None = field(default=None, repr=False)
    # Symmetric-replica folding (replay/fold.py): ranks whose nodes the event loop ran, and ranks in all /
    # ranks simulated (1 when not folded). The tables cover every rank either way.
    ranks_simulated: int = 0
    fold_factor: int = 1

    @property
    def iteration_time_ns(self) -> int:
        """Max finish time over ranks."""
        return int(self.summary["iteration_time_ns"][0])

    def summary_dict(self) -> dict:
        """The deterministic summary as a dict, with `per_rank_finish_ns` (list indexed by rank)."""
        row = self.summary.row(0, named=True)
        out = {k: row[k] for k in SUMMARY_SCHEMA}
        out["per_rank_finish_ns"] = list(self.per_rank_finish_ns)
        return out

    def perf_dict(self) -> dict:
        """Simulator wall time and speed (differs run to run); a folded run adds `fold_factor` and
        `ranks_simulated` (the outputs equal the unfolded run's, so they are reported here only)."""
        row = self.summary.row(0, named=True)
        out = {k: row[k] for k in PERF_SCHEMA}
        if self.fold_factor > 1:
            out["fold_factor"] = self.fold_factor
            out["ranks_simulated"] = self.ranks_simulated
        return out

    def save(self, out_dir: str | os.PathLike[str]) -> list[str]:
        """Write ops/ranks/collectives as .parquet and .csv, summary.json/.csv, and perf.json (wall time).

        Everything but perf.json is byte-identical for identical inputs.
        """
        d = os.fspath(out_dir)
        os.makedirs(d, exist_ok=True)
        written = []
        for name, df in (("ops", self.ops), ("ranks", self.ranks), ("collectives", self.collectives)):
            p = os.path.join(d, f"{name}.parquet")
            df.write_parquet(p, compression="zstd", statistics=True)
            c = os.path.join(d, f"{name}.csv")
            df.write_csv(c)
            written += [p, c]
        s = self.summary_dict()
        p = os.path.join(d, "summary.json")
        with open(p, "w", encoding="utf-8") as fh:
            json.dump(s, fh, indent=2)
            fh.write("\n")
        c = os.path.join(d, "summary.csv")
        self.summary.select(list(SUMMARY_SCHEMA)).write_csv(c)
        perf = os.path.join(d, "perf.json")
        with open(perf, "w", encoding="utf-8") as fh:
            json.dump(self.perf_dict(), fh, indent=2)
            fh.write("\n")
        return [*written, p, c, perf]


def _nullable(values: np.ndarray, valid: np.ndarray, dtype: pl.DataType) -> pl.Series:
    """A column from numpy values, null where not valid."""
    col = pl.Series(values, dtype=dtype) if dtype != pl.Int32 else pl.Series(values.astype(np.int32))
    bad = np.nonzero(~valid)[0]
    return col.scatter(bad, None) if len(bad) else col


def _labels(codes: np.ndarray, label) -> pl.Series:
    """A string column from integer codes: label(code) once per distinct code."""
    if len(codes) == 0:
        return pl.Series([], dtype=pl.String)
    lo, hi = int(codes.min()), int(codes.max())
    if hi - lo < 1 << 16:  # small codes (types, kinds): a lookup table instead of a sort
        present = np.flatnonzero(np.bincount(codes - lo))
        lut = np.zeros(hi - lo + 1, dtype=np.int64)
        lut[present] = np.arange(len(present))
        uniq, inv = present + lo, lut[codes - lo]
    else:
        uniq, inv = np.unique(codes, return_inverse=True)
    table = pl.Series([label(int(u)) for u in uniq.tolist()], dtype=pl.String)
    return table.gather(inv.reshape(-1))


def _annotation_column(prog: Program, k: str, typ: str, n: int) -> pl.Series:
    """One annotation column from the program's columns, with node-by-node ranks' values laid over."""
    col = prog.ann_cols.get(k)
    if typ == "int":
        vals, ok = col if col is not None else (np.zeros(n, np.int64), np.zeros(n, bool))
        if prog.annotations:
            vals, ok = vals.copy(), ok.copy()
            for g, a in prog.annotations.items():
                v = a.get(k)
                if v is not None:
                    vals[g] = v
                    ok[g] = True
        return _nullable(vals, ok, pl.Int64)
    if col is not None:
        codes, table = col
        obj = np.asarray([*table, None], dtype=object)[codes]  # code -1 = the trailing None
    else:
        obj = np.full(n, None, dtype=object)
    for g, a in prog.annotations.items():
        v = a.get(k)
        if v is not None:
            obj[g] = v
    return pl.Series(obj.tolist(), dtype=pl.String)


def build_result(
    prog: Program,
    out: EngineOutput,
    *,
    network_name: str,
    comm_mode: str,
    sim_wall_s: float,
    rank_source: np.ndarray | None = None,
) -> ReplayResult:
    """Assemble the four tables from a finished run.

    rank_source (a folded run): per rank, a rank whose rows have the same times, kinds and bytes in the
    same order (its representative), so its per-rank accounting is computed once per source and copied.
    """
    n = prog.num_nodes
    nr = prog.num_ranks
    rank = np.repeat(np.arange(nr, dtype=np.int32), np.diff(np.asarray(prog.rank_offset, dtype=np.int64)))
    start = np.asarray(out.start, dtype=np.int64)
    end = np.asarray(out.end, dtype=np.int64)
    wait = np.asarray(out.wait, dtype=np.int64)
    kind = np.asarray(prog.kind, dtype=np.int8) if n else np.zeros(0, dtype=np.int8)
    res_names = [KIND_RESOURCE[k] for k in range(len(KIND_RESOURCE))]
    res_code = np.asarray([_RESOURCE_CODE[r] for r in res_names], dtype=np.int8)[kind] if n else kind

    collective = np.full(n, -1, dtype=np.int64)
    if out.collective_of:
        collective[np.fromiter(out.collective_of.keys(), np.int64)] = np.fromiter(
            out.collective_of.values(), np.int64
        )
    p2p = np.full(n, -1, dtype=np.int64)
    peer = np.full(n, -1, dtype=np.int64)
    if out.p2p_pairs:
        pr = np.asarray(out.p2p_pairs, dtype=np.int64)
        ids = np.arange(len(pr), dtype=np.int64)
        p2p[pr[:, 0]] = ids
        p2p[pr[:, 1]] = ids
        peer[pr[:, 0]] = [prog.p2p[s].dst for s in pr[:, 0].tolist()]
        peer[pr[:, 1]] = [prog.p2p[r].src for r in pr[:, 1].tolist()]
    node_type = np.asarray(prog.node_type, dtype=np.int64)
    comm_type = np.asarray(prog.comm_type, dtype=np.int64)
    cols = {
        "rank": pl.Series(rank, dtype=pl.Int32),
        "node_id": pl.Series(np.asarray(prog.node_id, dtype=np.int64).astype(np.uint64), dtype=pl.UInt64),
        "name": pl.Series(prog.name, dtype=pl.String),
        "type": _labels(node_type, pb.node_type_name),
        "resource": _labels(kind.astype(np.int64), lambda k: res_names[k]),
        "start_ns": start,
        "end_ns": end,
        "duration_ns": end - start,
        "ready_ns": np.asarray(out.ready, dtype=np.int64),
        "wait_ns": wait,
        "bytes": np.asarray(prog.nbytes, dtype=np.int64),
        "comm_type": _labels(comm_type, lambda v: pb.comm_type_name(v) if v >= 0 else None),
        "pg_name": pl.Series(prog.pg_name, dtype=pl.String),
        "collective": _nullable(collective, collective >= 0, pl.Int64),
        "p2p": _nullable(p2p, p2p >= 0, pl.Int64),
        "peer": _nullable(peer, peer >= 0, pl.Int32),
    }
    for k, typ in ANNOTATION_COLUMNS.items():
        cols[k] = _annotation_column(prog, k, typ, n)
    ops = pl.DataFrame({k: pl.Series(k, v, dtype=OPS_SCHEMA[k]) for k, v in cols.items()}, schema=OPS_SCHEMA)

    if rank_source is not None:  # account the source ranks' rows only, then copy to every rank
        src = np.asarray(rank_source, dtype=np.int64)
        uniq = np.unique(src)
        lut = np.full(nr, -1, dtype=np.int64)
        lut[uniq] = np.arange(len(uniq))
        rows = lut[rank] >= 0
        sub = _accounting(lut[rank[rows]], start[rows], end[rows], wait[rows], res_code[rows], len(uniq))
        acc = {k: v[lut[src]] for k, v in sub.items()}
    else:
        acc = _accounting(rank, start, end, wait, res_code, nr)
    wait_r = acc.pop("wait_ns")
    ops_r = np.bincount(rank, minlength=nr).astype(np.int64)
    comm_mask = (kind == K_COLL) | (kind == K_SEND) | (kind == K_RECV)
    bytes_r = np.zeros(nr, dtype=np.int64)
    np.add.at(bytes_r, rank[comm_mask], np.asarray(prog.nbytes, dtype=np.int64)[comm_mask])
    ranks = pl.DataFrame(
        {
            "rank": np.arange(nr, dtype=np.int32),
            "finish_ns": acc["finish_ns"],
            "compute_ns": acc["compute_ns"],
            "cpu_ns": acc["cpu_ns"],
            "comm_ns": acc["comm_ns"],
            "exposed_comm_ns": acc["exposed_comm_ns"],
            "idle_ns": acc["idle_ns"],
            "wait_ns": wait_r,
            "bubble_ns": acc["bubble_ns"],
            "ops": ops_r,
            "comm_bytes": bytes_r,
        },
        schema=RANKS_SCHEMA,
    )
    return _tables_rest(prog, out, ops, ranks, acc, wait_r, network_name, comm_mode, sim_wall_s)


def _accounting(rank, start, end, wait, res_code, nr) -> dict[str, np.ndarray]:
    """rank_accounting plus straggler waiting (`wait_ns`) per rank."""
    acc = rank_accounting(rank, start, end, wait, res_code, nr)
    # Straggler waiting of a rank = time its processors sit idle because a peer is late (the paper's "GPU
    # idle time"): the union of its ops' waiting intervals (recvs take no slot, so several can wait at once)
    # minus the time GPU compute or a CPU op runs meanwhile. A recv posted long before it is needed is
    # still waiting in the `ops` table, but costs the rank nothing while it computes.
    work = (res_code == 0) | (res_code == 1)
    waits = wait > 0
    work_r = union_length(rank[work], start[work], end[work], nr)
    both_r = union_length(
        np.concatenate([rank[work], rank[waits]]),
        np.concatenate([start[work], start[waits]]),
        np.concatenate([end[work], (start + wait)[waits]]),
        nr,
    )
    acc["wait_ns"] = both_r - work_r
    return acc


def _wait_sums(recs, wait) -> list[int]:
    """Each collective's members' waiting, summed (one gather and segment sum, no per-node Python)."""
    if not recs:
        return []
    counts = np.fromiter((len(r.nodes) for r in recs), dtype=np.int64, count=len(recs))
    flat = np.fromiter((g for r in recs for g in r.nodes), dtype=np.int64, count=int(counts.sum()))
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return np.add.reduceat(np.asarray(wait, dtype=np.int64)[flat], starts).tolist()


def _tables_rest(prog, out, ops, ranks, acc, wait_r, network_name, comm_mode, sim_wall_s) -> ReplayResult:
    """The collectives and summary tables, and the result."""
    nr = prog.num_ranks
    n = prog.num_nodes
    recs = out.collectives
    collectives = pl.DataFrame(
        {
            "collective": [r.id for r in recs],
            "pg_name": [r.group for r in recs],
            "comm_type": [pb.comm_type_name(r.comm_type) for r in recs],
            "ranks": [len(r.members) for r in recs],
            "bytes": [r.size for r in recs],
            "first_arrival_ns": [r.first_arrival_ns for r in recs],
            "last_arrival_ns": [r.last_arrival_ns for r in recs],
            "start_ns": [r.last_arrival_ns for r in recs],
            "end_ns": [r.end_ns for r in recs],
            "duration_ns": [r.end_ns - r.last_arrival_ns for r in recs],
            "wait_sum_ns": _wait_sums(recs, out.wait),
        },
        schema=COLLECTIVES_SCHEMA,
    )

    finish = [int(x) for x in acc["finish_ns"]]
    bytes_moved = sum(r.size for r in recs) + sum(prog.p2p[s].size for s, _r in out.p2p_pairs)
    engine_wall = out.wall_s
    summary = {
        "iteration_time_ns": max(finish) if finish else 0,
        "num_ranks": nr,
        "num_nodes": n,
        "num_collectives": len(recs),
        "num_p2p": len(out.p2p_pairs),
        "bytes_moved": bytes_moved,
        "compute_ns": int(acc["compute_ns"].sum()),
        "comm_ns": int(acc["comm_ns"].sum()),
        "exposed_comm_ns": int(acc["exposed_comm_ns"].sum()),
        "compute_ns_total": int(acc["compute_ns"].sum()),
        "comm_ns_total": int(acc["comm_ns"].sum()),
        "exposed_comm_ns_total": int(acc["exposed_comm_ns"].sum()),
        "wait_ns_total": int(wait_r.sum()),
        "wait_ns_max": int(wait_r.max()) if nr else 0,
        "bubble_ns_total": int(acc["bubble_ns"].sum()),
        "bubble_ns_max": int(acc["bubble_ns"].max()) if nr else 0,
        "events": out.events,
        "ignored_ctrl_deps": prog.ignored_ctrl_deps,
        "ctrl_deps_ignored_ranks": prog.ctrl_deps_ignored_ranks,
        "network_model": network_name,
        "compute_model": prog.compute_name,
        "comm_mode": comm_mode,
        "sim_wall_s": sim_wall_s,
        "engine_wall_s": engine_wall,
        "engine_cpu_s": out.cpu_s,
        "events_per_s": out.events / engine_wall if engine_wall > 0 else 0.0,
    }
    summary_df = pl.DataFrame([summary], schema={**SUMMARY_SCHEMA, **PERF_SCHEMA})
    return ReplayResult(
        ops=ops,
        ranks=ranks,
        collectives=collectives,
        summary=summary_df,
        per_rank_finish_ns=finish,
        paths=prog.paths,
        groups=prog.groups,
    )


__all__ = [
    "COLLECTIVES_SCHEMA",
    "OPS_SCHEMA",
    "PERF_SCHEMA",
    "RANKS_SCHEMA",
    "SUMMARY_SCHEMA",
    "ReplayResult",
    "build_result",
]
