"""Where each rank's time went, as exclusive shares that add up to its finish time, and what each collective
left exposed. Read from the public `ops` table (polars), so any engine that fills it gives the same numbers.

Each instant of a rank's [0, finish) belongs to exactly one category, the first that applies:
compute (a GPU compute op runs), cpu (a CPU op runs), exposed comm (a communication op is active, i.e.
between start + wait and end, while nothing computes), wait (a collective has been posted and waits for a
late peer: straggler waiting), bubble (nothing runs, inside the rank's compute span [first compute start,
last compute end]; waiting for a P2P recv counts here: that is the pipeline bubble of a pipelined run),
idle (before the first or after the last compute).
The `ranks` table's columns overlap (compute and comm, waiting and bubble); these do not, so they carry their
own names, `<category>_share_ns` (issue 26 item 2: the report reused `wait_ns`/`bubble_ns` for these).
"""

from __future__ import annotations

import numpy as np
import polars as pl

CATEGORIES = ("compute", "cpu", "exposed_comm", "wait", "bubble", "idle")


def share_column(category: str) -> str:
    """The breakdown's column of a category: `compute_share_ns`, ... (never a `ranks` table name)."""
    return f"{category}_share_ns"


def _cover(bounds: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """For each segment [bounds[i], bounds[i+1]): is it inside some [s, e)?"""
    d = np.zeros(len(bounds) + 1, dtype=np.int64)
    keep = e > s
    np.add.at(d, np.searchsorted(bounds, s[keep]), 1)
    np.add.at(d, np.searchsorted(bounds, e[keep]), -1)
    return np.cumsum(d)[: len(bounds) - 1] > 0


def rank_breakdown(ops: pl.DataFrame, num_ranks: int) -> pl.DataFrame:
    """rank, compute_share_ns, cpu_share_ns, ..., idle_share_ns, finish_ns (the shares sum to finish)."""
    rows = []
    parts = ops.select("rank", "resource", "start_ns", "end_ns", "wait_ns", "collective").partition_by(
        "rank", as_dict=True
    )
    for rank in range(num_ranks):
        df = parts.get((rank,))
        if df is None or df.is_empty():
            rows.append((rank, 0, 0, 0, 0, 0, 0, 0))
            continue
        res = df["resource"].to_numpy()
        s = df["start_ns"].to_numpy().astype(np.int64)
        e = df["end_ns"].to_numpy().astype(np.int64)
        w = df["wait_ns"].to_numpy().astype(np.int64)
        coll = ~df["collective"].is_null().to_numpy()
        finish = int(e.max())
        comp, cpu, comm = res == "compute", res == "cpu", res == "comm"
        active = np.where(comm, s + w, s)
        bounds = np.unique(np.concatenate([[0, finish], s, e, s + w]))
        seg = np.diff(bounds)
        c = _cover(bounds, s[comp], e[comp])
        p = _cover(bounds, s[cpu], e[cpu]) & ~c
        m = _cover(bounds, active[comm], e[comm]) & ~c & ~p
        busy = c | p | m
        late = coll & (w > 0)
        wt = _cover(bounds, s[late], (s + w)[late]) & ~busy
        if comp.any():
            span = _cover(bounds, np.array([s[comp].min()]), np.array([e[comp].max()]))
        else:
            span = np.zeros(len(seg), dtype=bool)
        free = ~busy & ~wt
        b = free & span
        idle = free & ~span
        rows.append(
            (rank, *(int(seg[x].sum()) for x in (c, p, m, wt, b, idle)), finish),
        )
    return pl.DataFrame(
        rows,
        schema={"rank": pl.Int32, **{share_column(k): pl.Int64 for k in CATEGORIES}, "finish_ns": pl.Int64},
        orient="row",
    )


def collective_exposure(ops: pl.DataFrame) -> pl.DataFrame:
    """Per collective: exposed_ns = summed over members, active time not hidden under compute or CPU work."""
    rows: dict[int, int] = {}
    parts = ops.select("rank", "resource", "start_ns", "end_ns", "wait_ns", "collective").partition_by(
        "rank", as_dict=True
    )
    for df in parts.values():
        res = df["resource"].to_numpy()
        s = df["start_ns"].to_numpy().astype(np.int64)
        e = df["end_ns"].to_numpy().astype(np.int64)
        w = df["wait_ns"].to_numpy().astype(np.int64)
        cid = df["collective"].to_numpy()
        isc = ~df["collective"].is_null().to_numpy()
        if not isc.any():
            continue
        work = (res == "compute") | (res == "cpu")
        a = s + w
        bounds = np.unique(np.concatenate([s[work], e[work], a[isc], e[isc]]))
        covered = _cover(bounds, s[work], e[work])
        seg = np.where(covered, 0, np.diff(bounds))
        cum = np.concatenate([[0], np.cumsum(seg)])
        for i in np.flatnonzero(isc):
            lo, hi = np.searchsorted(bounds, a[i]), np.searchsorted(bounds, e[i])
            rows[int(cid[i])] = rows.get(int(cid[i]), 0) + int(cum[hi] - cum[lo])
    return pl.DataFrame(
        {"collective": list(rows), "exposed_ns": list(rows.values())},
        schema={"collective": pl.Int64, "exposed_ns": pl.Int64},
    ).sort("collective")


def op_time_by(ops: pl.DataFrame, key: str) -> pl.DataFrame:
    """Op time summed over ranks per `key` value (layer or phase), split by resource: key, compute_ns, ...

    Communication counts its active time (end - (start + wait)); the waiting before it is `wait_sum_ns`, the
    ops' `wait_ns` summed (as the collectives table's `wait_sum_ns`; not the ranks table's `wait_ns`).
    """
    df = ops.filter(pl.col(key).is_not_null() & (pl.col("resource") != "none")).with_columns(
        (pl.col("duration_ns") - pl.col("wait_ns")).alias("active_ns")
    )
    out = df.group_by(key).agg(
        [
            pl.col("active_ns").filter(pl.col("resource") == r).sum().alias(f"{r}_ns")
            for r in ("compute", "comm", "cpu")
        ]
        + [pl.col("wait_ns").sum().alias("wait_sum_ns"), pl.len().alias("ops")]
    )
    return out.sort(key)


def is_pipelined(ops: pl.DataFrame, num_p2p: int) -> bool:
    """True when the run has pipeline stages (several `stage` values) or P2P transfers between ranks."""
    stages = ops["stage"].drop_nulls().n_unique() if "stage" in ops.columns else 0
    return stages > 1 or num_p2p > 0
