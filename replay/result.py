"""Replay results as polars DataFrames with fixed, documented schemas, and their on-disk form.

Column meanings are in docs/replay.md; the schemas below are the public interface.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
from xsim.replay.engine import EngineOutput
from xsim.replay.metrics import rank_accounting, union_length
from xsim.replay.program import (
    ANNOTATION_COLUMNS,
    K_COLL,
    K_RECV,
    K_SEND,
    KIND_RESOURCE,
    Program,
    strings_series,
)
from xsim.traces import pb
from xsim.traces.groups import ProcessGroups

if TYPE_CHECKING:
    import polars as pl

    # Public, built on first access by __getattr__ below (polars dtypes).
    OPS_SCHEMA: dict[str, pl.DataType]
    RANKS_SCHEMA: dict[str, pl.DataType]
    COLLECTIVES_SCHEMA: dict[str, pl.DataType]
    SUMMARY_SCHEMA: dict[str, pl.DataType]
    PERF_SCHEMA: dict[str, pl.DataType]

_OPS_TYPES: dict[str, str] = {
    "rank": "Int32",
    "node_id": "UInt64",
    "name": "String",
    "type": "String",
    "resource": "String",
    "start_ns": "Int64",
    "end_ns": "Int64",
    "duration_ns": "Int64",
    "ready_ns": "Int64",
    "wait_ns": "Int64",
    "bytes": "Int64",
    "comm_type": "String",
    "pg_name": "String",
    "collective": "Int64",
    "p2p": "Int64",
    "peer": "Int32",
    "layer": "Int64",
    "phase": "String",
    "micro_batch": "Int64",
    "stage": "Int64",
    "device_group": "Int64",
    "ring": "Int64",
    "chunk": "Int64",
    "reshard": "String",
}
_RANKS_TYPES: dict[str, str] = {
    "rank": "Int32",
    "finish_ns": "Int64",
    "compute_ns": "Int64",
    "cpu_ns": "Int64",
    "comm_ns": "Int64",
    "exposed_comm_ns": "Int64",
    "idle_ns": "Int64",
    "wait_ns": "Int64",
    "bubble_ns": "Int64",
    "ops": "Int64",
    "comm_bytes": "Int64",
}
_COLLECTIVES_TYPES: dict[str, str] = {
    "collective": "Int64",
    "pg_name": "String",
    "comm_type": "String",
    "ranks": "Int32",
    "bytes": "Int64",
    "first_arrival_ns": "Int64",
    "last_arrival_ns": "Int64",
    "start_ns": "Int64",
    "end_ns": "Int64",
    "duration_ns": "Int64",
    "wait_sum_ns": "Int64",
}
# Summary keys that depend only on the inputs (written to summary.json / summary.csv).
_SUMMARY_TYPES: dict[str, str] = {
    "iteration_time_ns": "Int64",
    "num_ranks": "Int64",
    "num_nodes": "Int64",
    "num_collectives": "Int64",
    "num_p2p": "Int64",
    "bytes_moved": "Int64",
    "compute_ns": "Int64",
    "comm_ns": "Int64",
    "exposed_comm_ns": "Int64",
    # The three above are sums over ranks, kept under their first names for existing readers; the
    # `_total` names say so, like wait_ns_total and bubble_ns_total (issue 13 item 10).
    "compute_ns_total": "Int64",
    "comm_ns_total": "Int64",
    "exposed_comm_ns_total": "Int64",
    "wait_ns_total": "Int64",
    "wait_ns_max": "Int64",
    "bubble_ns_total": "Int64",
    "bubble_ns_max": "Int64",
    "events": "Int64",
    "ignored_ctrl_deps": "Int64",
    "ctrl_deps_ignored_ranks": "Int64",
    "network_model": "String",
    "compute_model": "String",
    "comm_mode": "String",
}
# Wall-clock keys: in the in-memory summary and perf.json only, never in the files that must be identical.
_PERF_TYPES: dict[str, str] = {
    "sim_wall_s": "Float64",
    "engine_wall_s": "Float64",
    "engine_cpu_s": "Float64",
    "events_per_s": "Float64",
}
# Rows per Parquet row group, fixed so a table written whole and one streamed in chunks of ranks (a folded
# replay) are the same bytes; 512^2 is polars' documented default row-group size (DataFrame.write_parquet).
ROW_GROUP = 512**2
# Every Parquet table's writer settings, measured on 923,648 ops rows (docs/performance.md round 24y): zstd
# level 1 with 16 MiB data pages (one page per column chunk of a row group for all but the longest string
# columns) wrote 4.45 MB per million rows in ~10% less CPU than polars' defaults (zstd level 3, 1 MiB pages:
# 7.73 MB); statistics (min/max per row group) stay, so readers can skip row groups by rank.
PARQUET_OPTIONS = {
    "compression": "zstd",
    "compression_level": 1,
    "statistics": True,
    "row_group_size": ROW_GROUP,
    "data_page_size": 16 << 20,
}
_RESOURCE_CODE = {"compute": 0, "cpu": 1, "comm": 2, "none": 3}
_SCHEMA_TYPES = {
    "OPS_SCHEMA": _OPS_TYPES,
    "RANKS_SCHEMA": _RANKS_TYPES,
    "COLLECTIVES_SCHEMA": _COLLECTIVES_TYPES,
    "SUMMARY_SCHEMA": _SUMMARY_TYPES,
    "PERF_SCHEMA": _PERF_TYPES,
}


@cache
def _schema(name: str) -> dict[str, pl.DataType]:
    """A public schema (OPS_SCHEMA, ...) as polars dtypes; polars loads here, on first use, not on import
    (a replay that only prints its summary never needs it: `xsim replay` start-up, issue 11 item 4)."""
    import polars as pl

    return {k: getattr(pl, t) for k, t in _SCHEMA_TYPES[name].items()}


def __getattr__(name: str):
    """OPS_SCHEMA, RANKS_SCHEMA, COLLECTIVES_SCHEMA, SUMMARY_SCHEMA, PERF_SCHEMA, built on first access."""
    if name in _SCHEMA_TYPES:
        return _schema(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ReplayResult:
    """What a replay produced: ops, ranks, collectives and summary tables.

    The four polars tables may be given, or built on first access by `tables` (then polars loads only
    when a caller reads or writes a table); the summary dicts and `rank_arrays` need no polars.
    """

    def __init__(
        self,
        ops: pl.DataFrame | None,
        ranks: pl.DataFrame | None,
        collectives: pl.DataFrame | None,
        summary: pl.DataFrame | None,
        per_rank_finish_ns: list[int],
        paths: tuple[str, ...] = (),
        groups: ProcessGroups | None = None,
        *,
        tables: Callable[[], tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]] | None = None,
        summary_row: dict | None = None,
        rank_arrays: dict[str, np.ndarray] | None = None,
        num_stages: int | None = None,
        ops_chunks: Callable[[], Iterator[pl.DataFrame]] | None = None,
        ops_parts: Callable[[], Iterator[tuple[pl.DataFrame, Callable[[BinaryIO], None]]]] | None = None,
    ) -> None:
        self._tables = (ops, ranks, collectives, summary)
        # The ops table as chunks of ranks (a folded replay's expansion, replay/fold_tables.py): written
        # chunk by chunk, never held whole unless a caller reads `ops`.
        self._ops_chunks = ops_chunks
        # The same chunks, each with a function writing its CSV rows (no header) to a binary file, equal to
        # the chunk's `write_csv` (a folded replay's rows from pre-rendered text: replay/ops_text.py).
        self._ops_parts = ops_parts
        self._build = tables
        self.per_rank_finish_ns = per_rank_finish_ns
        self.paths = paths
        self.groups = groups
        self._summary_row = summary_row
        self._rank_arrays = rank_arrays
        self._num_stages = num_stages
        # Symmetric-replica folding (replay/fold.py): ranks whose nodes the event loop ran, and ranks in all /
        # ranks simulated (1 when not folded). The tables cover every rank either way.
        self.ranks_simulated = 0
        self.fold_factor = 1
        # Whether a replay that considered folding folded ("folded" / "unfolded") and why; None when folding
        # was not considered (simulate without fold).
        self.fold_status: str | None = None
        self.fold_reason: str | None = None

    def _table(self, i: int) -> pl.DataFrame:
        if self._build is not None:
            self._tables = self._build()
            self._build = None  # drops the program and engine output the builder held
        if self._tables[i] is None and i == 0 and self._ops_chunks is not None:
            import polars as pl

            # One contiguous frame: a folded chunk's columns are slices of its representatives' rows.
            self._tables = (pl.concat(list(self._ops_chunks()), rechunk=True), *self._tables[1:])
        return self._tables[i]

    @property
    def ops(self) -> pl.DataFrame:
        """One row per node (OPS_SCHEMA)."""
        return self._table(0)

    @property
    def ranks(self) -> pl.DataFrame:
        """One row per rank (RANKS_SCHEMA)."""
        return self._table(1)

    @property
    def collectives(self) -> pl.DataFrame:
        """One row per matched collective (COLLECTIVES_SCHEMA)."""
        return self._table(2)

    @property
    def summary(self) -> pl.DataFrame:
        """One row: SUMMARY_SCHEMA then PERF_SCHEMA."""
        return self._table(3)

    def __repr__(self) -> str:
        return (
            f"ReplayResult(ranks={len(self.per_rank_finish_ns)}, iteration_time_ns={self.iteration_time_ns})"
        )

    def _row(self) -> dict:
        if self._summary_row is None:
            self._summary_row = self.summary.row(0, named=True)
        return self._summary_row

    @property
    def rank_arrays(self) -> dict[str, np.ndarray]:
        """The `ranks` table's columns as numpy arrays (no polars needed when the result built them)."""
        if self._rank_arrays is None:
            self._rank_arrays = {k: self.ranks[k].to_numpy() for k in _RANKS_TYPES}
        return self._rank_arrays

    @property
    def num_stages(self) -> int:
        """Distinct non-null `stage` values in `ops` (pipeline stages the trace annotates)."""
        if self._num_stages is None:
            self._num_stages = int(self.ops["stage"].drop_nulls().n_unique())
        return self._num_stages

    @property
    def iteration_time_ns(self) -> int:
        """Max finish time over ranks."""
        return int(self._row()["iteration_time_ns"])

    def summary_dict(self) -> dict:
        """The deterministic summary as a dict, with `per_rank_finish_ns` (list indexed by rank)."""
        row = self._row()
        out = {k: row[k] for k in _SUMMARY_TYPES}
        out["per_rank_finish_ns"] = list(self.per_rank_finish_ns)
        return out

    def perf_dict(self) -> dict:
        """Simulator wall time and speed (differs run to run); a folded run adds `fold_factor` and
        `ranks_simulated` (the outputs equal the unfolded run's, so they are reported here only), and a run
        that considered folding `fold` ("folded" or "unfolded") and `fold_reason`."""
        row = self._row()
        out = {k: row[k] for k in _PERF_TYPES}
        if self.fold_factor > 1:
            out["fold_factor"] = self.fold_factor
            out["ranks_simulated"] = self.ranks_simulated
        if self.fold_status is not None:
            out["fold"] = self.fold_status
            out["fold_reason"] = self.fold_reason
        return out

    def _stream_ops(self, parquet: str, csv: str) -> None:
        """Write the ops table from its chunks in one pass: the Parquet writer pulls them, each chunk's CSV
        rows are appended as it passes. With a fixed row-group size the Parquet bytes do not depend on how
        the rows arrive, and CSV rows are written one by one: both equal the table written whole. polars'
        streaming writer already encodes earlier chunks on its own threads while this generator makes the
        next (a producer thread of our own was slower, docs/performance.md round 24y)."""
        import polars as pl

        with open(csv, "wb") as fh:
            fh.write(pl.DataFrame(schema=_schema("OPS_SCHEMA")).write_csv().encode())  # the header

            def chunks() -> Iterator[pl.DataFrame]:
                if self._ops_parts is not None:
                    for df, write in self._ops_parts():
                        write(fh)
                        yield df
                    return
                for df in self._ops_chunks():
                    df.write_csv(fh, include_header=False)
                    yield df

            _source(chunks, _schema("OPS_SCHEMA")).sink_parquet(parquet, **PARQUET_OPTIONS)

    def save(self, out_dir: str | os.PathLike[str]) -> list[str]:
        """Write ops/ranks/collectives as .parquet and .csv, summary.json/.csv, and perf.json (wall time).

        Everything but perf.json is byte-identical for identical inputs.
        """
        d = os.fspath(out_dir)
        os.makedirs(d, exist_ok=True)
        written = []
        for name in ("ops", "ranks", "collectives"):
            p = os.path.join(d, f"{name}.parquet")
            c = os.path.join(d, f"{name}.csv")
            if name == "ops" and self._ops_chunks is not None and self._tables[0] is None:
                self._stream_ops(p, c)
            else:
                df = self._table(("ops", "ranks", "collectives").index(name))
                df.write_parquet(p, **PARQUET_OPTIONS)
                df.write_csv(c)
            written += [p, c]
        s = self.summary_dict()
        p = os.path.join(d, "summary.json")
        with open(p, "w", encoding="utf-8") as fh:
            json.dump(s, fh, indent=2)
            fh.write("\n")
        c = os.path.join(d, "summary.csv")
        self.summary.select(list(_SUMMARY_TYPES)).write_csv(c)
        perf = os.path.join(d, "perf.json")
        with open(perf, "w", encoding="utf-8") as fh:
            json.dump(self.perf_dict(), fh, indent=2)
            fh.write("\n")
        return [*written, p, c, perf]


def _source(chunks: Callable[[], Iterator[pl.DataFrame]], schema: dict) -> pl.LazyFrame:
    """A lazy frame whose rows are `chunks()`' frames in order (a polars IO source: the writers stream it)."""
    from polars.io.plugins import register_io_source

    def gen(with_columns, predicate, n_rows, batch_size):
        for df in chunks():
            yield df if with_columns is None else df.select(with_columns)

    return register_io_source(gen, schema=schema)


def _nullable(values: np.ndarray, valid: np.ndarray, dtype: pl.DataType) -> pl.Series:
    """A column from numpy values, null where not valid."""
    import polars as pl

    col = pl.Series(values, dtype=dtype) if dtype != pl.Int32 else pl.Series(values.astype(np.int32))
    # A boolean mask, not scatter(indices): most rows are null (non-communication nodes), and scattering
    # 340k indices cost ~10-30 ms per column on the 512-rank set against <1 ms for the mask.
    return col.set(pl.Series(~valid), None) if not valid.all() else col


def _labels(codes: np.ndarray, label) -> pl.Series:
    """A string column from integer codes: label(code) once per distinct code."""
    import polars as pl

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


def _annotation_ints(prog: Program, k: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """An integer annotation's (values, valid) from the program's columns, node-by-node ranks' laid over."""
    col = prog.ann_cols.get(k)
    vals, ok = col if col is not None else (np.zeros(n, np.int64), np.zeros(n, bool))
    if prog.annotations:
        vals, ok = vals.copy(), ok.copy()
        for g, a in prog.annotations.items():
            v = a.get(k)
            if v is not None:
                vals[g] = v
                ok[g] = True
    return vals, ok


def _annotation_strings(prog: Program, k: str, n: int) -> np.ndarray:
    """A string annotation's values (object array, None for null) from the program's columns, node-by-node
    ranks' laid over."""
    col = prog.ann_cols.get(k)
    if col is not None:
        codes, table = col
        obj = np.asarray([*table, None], dtype=object)[codes]  # code -1 = the trailing None
    else:
        obj = np.full(n, None, dtype=object)
    for g, a in prog.annotations.items():
        v = a.get(k)
        if v is not None:
            obj[g] = v
    return obj


# A record of numpy arrays: no generated eq, hash or repr (why: traces/columnar.py, AttrColumn).
@dataclass(frozen=True, eq=False, repr=False)
class OpsColumns:
    """The ops table's rows as columns (numpy, or lists / polars Series for the strings): what `ops_frame`
    turns into the table, whole (an unfolded replay) or a chunk of ranks (replay/fold_tables.py)."""

    rank: np.ndarray
    node_id: np.ndarray
    name: object  # list[str] or a polars String Series
    node_type: np.ndarray
    kind: np.ndarray
    start: np.ndarray
    end: np.ndarray
    ready: np.ndarray
    wait: np.ndarray
    nbytes: np.ndarray
    comm_type: np.ndarray
    pg_name: object  # list[str | None] or a polars String Series
    collective: np.ndarray  # -1: null
    p2p: np.ndarray
    peer: np.ndarray
    annotations: dict  # int columns: (values, valid); string columns: object array (None: null)


def ops_frame(c: OpsColumns) -> pl.DataFrame:
    """The ops table (OPS_SCHEMA) of the rows in `c`; the one place its columns are made."""
    import polars as pl

    res_names = [KIND_RESOURCE[k] for k in range(len(KIND_RESOURCE))]
    cols = {
        "rank": pl.Series(np.asarray(c.rank, dtype=np.int32), dtype=pl.Int32),
        "node_id": pl.Series(np.asarray(c.node_id, dtype=np.int64).astype(np.uint64), dtype=pl.UInt64),
        "name": pl.Series(c.name, dtype=pl.String),
        "type": _labels(c.node_type, pb.node_type_name),
        "resource": _labels(c.kind.astype(np.int64), lambda k: res_names[k]),
        "start_ns": c.start,
        "end_ns": c.end,
        "duration_ns": c.end - c.start,
        "ready_ns": c.ready,
        "wait_ns": c.wait,
        "bytes": c.nbytes,
        "comm_type": _labels(c.comm_type, lambda v: pb.comm_type_name(v) if v >= 0 else None),
        "pg_name": pl.Series(c.pg_name, dtype=pl.String),
        "collective": _nullable(c.collective, c.collective >= 0, pl.Int64),
        "p2p": _nullable(c.p2p, c.p2p >= 0, pl.Int64),
        "peer": _nullable(c.peer, c.peer >= 0, pl.Int32),
    }
    for k, typ in ANNOTATION_COLUMNS.items():
        v = c.annotations[k]
        if typ == "int":
            cols[k] = _nullable(*v, pl.Int64)
        else:  # an object array (None: null) or a String Series already
            cols[k] = pl.Series(v.tolist(), dtype=pl.String) if isinstance(v, np.ndarray) else v
    schema = _schema("OPS_SCHEMA")
    return pl.DataFrame({k: pl.Series(k, v, dtype=schema[k]) for k, v in cols.items()}, schema=schema)


def collectives_frame(c: dict) -> pl.DataFrame:
    """The collectives table (COLLECTIVES_SCHEMA) from its columns (comm_type as codes; start is the last
    arrival, duration end minus it)."""
    import polars as pl

    last = np.asarray(c["last_arrival_ns"], dtype=np.int64)
    end = np.asarray(c["end_ns"], dtype=np.int64)
    codes = np.asarray(c["comm_type"], dtype=np.int64)
    cols = {
        "collective": c["collective"],
        "pg_name": pl.Series(c["pg_name"], dtype=pl.String),
        "comm_type": _labels(codes, pb.comm_type_name),
        "ranks": c["ranks"],
        "bytes": c["bytes"],
        "first_arrival_ns": c["first_arrival_ns"],
        "last_arrival_ns": last,
        "start_ns": last,
        "end_ns": end,
        "duration_ns": end - last,
        "wait_sum_ns": c["wait_sum_ns"],
    }
    schema = _schema("COLLECTIVES_SCHEMA")
    return pl.DataFrame({k: pl.Series(k, v, dtype=schema[k]) for k, v in cols.items()}, schema=schema)


def rank_columns(
    prog: Program, start: np.ndarray, end: np.ndarray, wait: np.ndarray
) -> dict[str, np.ndarray]:
    """The ranks table's columns (RANKS_SCHEMA) of a program's run, one entry per program rank."""
    n, nr = prog.num_nodes, prog.num_ranks
    rank = np.repeat(np.arange(nr, dtype=np.int32), np.diff(np.asarray(prog.rank_offset, dtype=np.int64)))
    kind = np.asarray(prog.kind, dtype=np.int8) if n else np.zeros(0, dtype=np.int8)
    res_names = [KIND_RESOURCE[k] for k in range(len(KIND_RESOURCE))]
    res_code = np.asarray([_RESOURCE_CODE[r] for r in res_names], dtype=np.int8)[kind] if n else kind
    acc = _accounting(rank, start, end, wait, res_code, nr)
    comm_mask = (kind == K_COLL) | (kind == K_SEND) | (kind == K_RECV)
    bytes_r = np.zeros(nr, dtype=np.int64)
    np.add.at(bytes_r, rank[comm_mask], np.asarray(prog.nbytes, dtype=np.int64)[comm_mask])
    return {
        "rank": np.arange(nr, dtype=np.int32),
        "finish_ns": acc["finish_ns"],
        "compute_ns": acc["compute_ns"],
        "cpu_ns": acc["cpu_ns"],
        "comm_ns": acc["comm_ns"],
        "exposed_comm_ns": acc["exposed_comm_ns"],
        "idle_ns": acc["idle_ns"],
        "wait_ns": acc["wait_ns"],
        "bubble_ns": acc["bubble_ns"],
        "ops": np.bincount(rank, minlength=nr).astype(np.int64),
        "comm_bytes": bytes_r,
    }


def summary_row(
    rank_cols: dict[str, np.ndarray],
    out: EngineOutput,
    *,
    num_nodes: int,
    num_collectives: int,
    num_p2p: int,
    bytes_moved: int,
    events: int,
    ignored_ctrl_deps: int,
    ctrl_deps_ignored_ranks: int,
    names: tuple[str, str, str],
    sim_wall_s: float,
) -> dict:
    """The summary row (SUMMARY_SCHEMA then PERF_SCHEMA); names: (network model, compute model, comm mode)."""
    nr = len(rank_cols["rank"])
    finish = rank_cols["finish_ns"]
    wait_r, bubble = rank_cols["wait_ns"], rank_cols["bubble_ns"]
    compute, comm, exposed = (int(rank_cols[k].sum()) for k in ("compute_ns", "comm_ns", "exposed_comm_ns"))
    engine_wall = out.wall_s
    return {
        "iteration_time_ns": int(finish.max()) if nr else 0,
        "num_ranks": nr,
        "num_nodes": num_nodes,
        "num_collectives": num_collectives,
        "num_p2p": num_p2p,
        "bytes_moved": bytes_moved,
        "compute_ns": compute,
        "comm_ns": comm,
        "exposed_comm_ns": exposed,
        "compute_ns_total": compute,
        "comm_ns_total": comm,
        "exposed_comm_ns_total": exposed,
        "wait_ns_total": int(wait_r.sum()),
        "wait_ns_max": int(wait_r.max()) if nr else 0,
        "bubble_ns_total": int(bubble.sum()),
        "bubble_ns_max": int(bubble.max()) if nr else 0,
        "events": events,
        "ignored_ctrl_deps": ignored_ctrl_deps,
        "ctrl_deps_ignored_ranks": ctrl_deps_ignored_ranks,
        "network_model": names[0],
        "compute_model": names[1],
        "comm_mode": names[2],
        "sim_wall_s": sim_wall_s,
        "engine_wall_s": engine_wall,
        "engine_cpu_s": out.cpu_s,
        "events_per_s": events / engine_wall if engine_wall > 0 else 0.0,
    }


def build_result(
    prog: Program,
    out: EngineOutput,
    *,
    network_name: str,
    comm_mode: str,
    sim_wall_s: float,
) -> ReplayResult:
    """Assemble the summary and per-rank columns from a finished run; the four tables on first access."""
    n = prog.num_nodes
    nr = prog.num_ranks
    rank = np.repeat(np.arange(nr, dtype=np.int32), np.diff(np.asarray(prog.rank_offset, dtype=np.int64)))
    start = np.asarray(out.start, dtype=np.int64)
    end = np.asarray(out.end, dtype=np.int64)
    wait = np.asarray(out.wait, dtype=np.int64)
    kind = np.asarray(prog.kind, dtype=np.int8) if n else np.zeros(0, dtype=np.int8)
    rank_cols = rank_columns(prog, start, end, wait)
    recs = out.collectives
    finish = [int(x) for x in rank_cols["finish_ns"]]
    summary = summary_row(
        rank_cols,
        out,
        num_nodes=n,
        num_collectives=len(recs),
        num_p2p=len(out.p2p_pairs),
        bytes_moved=sum(r.size for r in recs) + sum(prog.p2p[s].size for s, _r in out.p2p_pairs),
        events=out.events,
        ignored_ctrl_deps=prog.ignored_ctrl_deps,
        ctrl_deps_ignored_ranks=prog.ctrl_deps_ignored_ranks,
        names=(network_name, prog.compute_name, comm_mode),
        sim_wall_s=sim_wall_s,
    )
    stage, stage_ok = _annotation_ints(prog, "stage", n)

    def tables() -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        """The ops, ranks, collectives and summary tables (the only part of a result that needs polars)."""
        import polars as pl

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
        ann: dict[str, object] = {}
        for k, typ in ANNOTATION_COLUMNS.items():
            ann[k] = _annotation_ints(prog, k, n) if typ == "int" else _annotation_strings(prog, k, n)
        ops = ops_frame(
            OpsColumns(
                rank=rank,
                node_id=np.asarray(prog.node_id, dtype=np.int64),
                name=strings_series(prog.name),
                node_type=np.asarray(prog.node_type, dtype=np.int64),
                kind=kind,
                start=start,
                end=end,
                ready=np.asarray(out.ready, dtype=np.int64),
                wait=wait,
                nbytes=np.asarray(prog.nbytes, dtype=np.int64),
                comm_type=np.asarray(prog.comm_type, dtype=np.int64),
                pg_name=strings_series(prog.pg_name),
                collective=collective,
                p2p=p2p,
                peer=peer,
                annotations=ann,
            )
        )
        ranks = pl.DataFrame(rank_cols, schema=_schema("RANKS_SCHEMA"))
        collectives = collectives_frame(
            {
                "collective": [r.id for r in recs],
                "pg_name": [r.group for r in recs],
                "comm_type": [r.comm_type for r in recs],
                "ranks": [len(r.members) for r in recs],
                "bytes": [r.size for r in recs],
                "first_arrival_ns": [r.first_arrival_ns for r in recs],
                "last_arrival_ns": [r.last_arrival_ns for r in recs],
                "end_ns": [r.end_ns for r in recs],
                "wait_sum_ns": _wait_sums(recs, out.wait),
            }
        )
        summary_df = pl.DataFrame([summary], schema={**_schema("SUMMARY_SCHEMA"), **_schema("PERF_SCHEMA")})
        return ops, ranks, collectives, summary_df

    return ReplayResult(
        None,
        None,
        None,
        None,
        per_rank_finish_ns=finish,
        paths=prog.paths,
        groups=prog.groups,
        tables=tables,
        summary_row=summary,
        rank_arrays=rank_cols,
        num_stages=len(set(stage[stage_ok].tolist())),  # not np.unique: it imports numpy.ma
    )


def _accounting(rank, start, end, wait, res_code, nr) -> dict[str, np.ndarray]:
    """rank_accounting plus straggler waiting (`wait_ns`) per rank."""
    acc = rank_accounting(rank, start, end, wait, res_code, nr)
    # Straggler waiting of a rank = time its processors sit idle because a peer is late (the paper's "GPU
    # idle time"): the union of its ops' waiting intervals (recvs take no slot, so several can wait at once)
    # minus the time GPU compute or a CPU op runs meanwhile. A recv posted long before it is needed is
    # still waiting in the `ops` table, but costs the rank nothing while it computes.
    work = (res_code == 0) | (res_code == 1)
    waits = wait > 0
    work_r = acc.pop("work_ns")  # the union of the same intervals: compute and CPU ops start at start
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


__all__ = [
    "COLLECTIVES_SCHEMA",
    "OPS_SCHEMA",
    "PERF_SCHEMA",
    "RANKS_SCHEMA",
    "SUMMARY_SCHEMA",
    "ReplayResult",
    "build_result",
]
