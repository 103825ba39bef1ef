"""The expansion stage of a folded replay: every rank's rows derived from its representative's, streamed.

A folded run (replay/fold.py) simulates replica 0; rank x of replica k mirrors rank replicas[0][i]. Its ops
rows are the representative's (same times, kinds, bytes) under its own rank number, node ids, labels
(`RankLabels`) and the numbers of its copies of the collectives and P2P pairs. The numbering is
`replay.engine.canonical_order`'s rule (collectives by last arrival then first member's node, pairs by
match time then send node), computed here on arrays over (copy, record) without making the records, so the
tables equal an unfolded replay's byte for byte. The ops table is produced a chunk of ranks at a time
(`ReplayResult.save` streams it to Parquet and CSV); nothing holds every rank's rows.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
from xsim.replay.engine import EngineOutput, canonical_ids
from xsim.replay.fold import Copies
from xsim.replay.program import ANNOTATION_COLUMNS, Program, strings_series
from xsim.replay.result import (
    OpsColumns,
    ReplayResult,
    _annotation_ints,
    _annotation_strings,
    _nullable,
    collectives_frame,
    ops_frame,
    rank_columns,
    summary_row,
)
from xsim.traces.attrs import DEVICE_GROUP
from xsim.traces.groups import ProcessGroups

if TYPE_CHECKING:  # the CSV text writer loads with the tables' first frame, not with a replay
    from xsim.replay.ops_text import ChunkRows, OpsText

# Rows per ops chunk: big enough that polars' per-call costs vanish, small enough (~200 MB of columns)
# that the expansion of a 16,384-rank run stays far under the memory of a laptop.
CHUNK_ROWS = int(os.environ.get("XSIM_FOLD_CHUNK_ROWS", 1 << 20))


def _ramp(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenated ranges [s, s + l) for each (s, l)."""
    total = int(lens.sum())
    offs = np.repeat(starts - np.concatenate(([0], np.cumsum(lens)[:-1])), lens)
    return offs + np.arange(total, dtype=np.int64)


def _write_csv(text: OpsText, frame, df, rows: ChunkRows, fh) -> None:
    """A chunk's CSV rows (no header) to fh: from the representatives' text, else by polars' writer."""
    if not (text.ok and text.write(fh, frame, rows)):
        df.write_csv(fh, include_header=False)


@dataclass(frozen=True)
class _Labels:
    """A chunk's rows whose labels are the rank's own: names, process-group names (row positions and
    values), device-group ids (rows, one value per rank) and whole annotations (row, dict)."""

    name_at: list
    name_v: list
    pg_at: list
    pg_v: list
    dg_at: list
    dg_own: list
    ann_at: list
    ann_v: list


class FoldedTables:
    """Every rank's tables from a folded run: numbering on arrays, ops rows by chunks of ranks."""

    def __init__(
        self, fold, groups: ProcessGroups, prog: Program, out: EngineOutput, labels: Sequence, paths
    ) -> None:
        self.prog, self.out, self.labels, self.paths, self.groups = prog, out, labels, tuple(paths), groups
        rep = np.asarray(fold.replicas, dtype=np.int64)  # (copies, slots)
        self.rep = rep
        m, s = rep.shape
        self.m = m
        n = m * s
        self.k_of = np.empty(n, dtype=np.int64)
        self.slot_of = np.empty(n, dtype=np.int64)
        self.k_of[rep] = np.arange(m, dtype=np.int64)[:, None]
        self.slot_of[rep] = np.arange(s, dtype=np.int64)[None, :]
        self.off = np.asarray(prog.rank_offset, dtype=np.int64)
        self.lens = self.off[self.slot_of + 1] - self.off[self.slot_of]
        self.full_off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(self.lens, out=self.full_off[1:])
        self.start = np.asarray(out.start, dtype=np.int64)
        self.end = np.asarray(out.end, dtype=np.int64)
        self.wait = np.asarray(out.wait, dtype=np.int64)
        # The representatives' columns as numpy arrays, once (the program may hold lists).
        self.cols = {
            k: np.asarray(getattr(prog, k), dtype=t)
            for k, t in (
                ("node_id", np.int64), ("node_type", np.int64), ("kind", np.int8), ("nbytes", np.int64),
                ("comm_type", np.int64),
            )
        }  # fmt: skip
        self.ready = np.asarray(out.ready, dtype=np.int64)
        self.delta = np.asarray([lab.id_delta if lab is not None else 0 for lab in labels], dtype=np.int64)
        self._collectives(fold, groups)
        self._pairs()

    def _full(self, ranks: np.ndarray, g: np.ndarray) -> np.ndarray:
        """The full (unfolded) node index of representative node g on rank(s) `ranks` of the same slot."""
        return self.full_off[ranks] + g - self.off[self.slot_of[ranks]]

    def _collectives(self, fold, groups: ProcessGroups) -> None:
        """Records inside replica 0 (one copy per replica) and shared ones (one record), numbered."""
        prog, out, m = self.prog, self.out, self.m
        inside, shared = [], []
        for rec in out.collectives:
            (inside if rec.positions is None or len(rec.positions) == len(rec.members) else shared).append(
                rec
            )
        nn = prog.num_nodes
        self.ci = np.full(nn, -1, dtype=np.int64)  # representative node -> inside record
        self.cs = np.full(nn, -1, dtype=np.int64)  # representative node -> shared record
        for r, rec in enumerate(inside):
            self.ci[list(rec.nodes)] = r
        for r, rec in enumerate(shared):
            self.cs[list(rec.nodes)] = r
        la_in = np.asarray([r.last_arrival_ns for r in inside], dtype=np.int64)
        m0 = np.asarray([r.members[0] for r in inside], dtype=np.int64)
        g0 = np.asarray([r.nodes[0] for r in inside], dtype=np.int64)
        # Copy k of an inside record: members pi_k(members), first node on rep[k][slot of member 0].
        f0_in = self._full(self.rep[:, self.slot_of[m0]], g0[None, :]) if len(inside) else np.zeros((m, 0))
        sh = _SharedEntries(self, shared, Copies(fold, groups) if fold.positions else None)
        la_sh, f0_sh = sh.la, sh.f0
        ids = canonical_ids(
            np.concatenate([np.tile(la_in, m), np.asarray(la_sh, dtype=np.int64)]),
            np.concatenate([f0_in.reshape(-1).astype(np.int64), np.asarray(f0_sh, dtype=np.int64)]),
        )
        n_in = len(inside)
        self.id_in = ids[: m * n_in].reshape(m, n_in)
        self.id_sh = ids[m * n_in :][sh.at]
        self.num_collectives = len(ids)
        # The collectives table, rows in id order.
        total = len(ids)
        cols = {
            k: np.zeros(total, dtype=np.int64) for k in ("ct", "ranks", "bytes", "first", "last", "end", "w")
        }
        names: list[str | None] = [None] * total

        def put(at: np.ndarray, rec, wait_sum: int) -> None:
            cols["ct"][at] = rec.comm_type
            cols["ranks"][at] = len(rec.members)
            cols["bytes"][at] = rec.size
            cols["first"][at] = rec.first_arrival_ns
            cols["last"][at] = rec.last_arrival_ns
            cols["end"][at] = int(self.end[list(rec.nodes)].max())
            cols["w"][at] = wait_sum

        for r, rec in enumerate(inside):
            at = self.id_in[:, r]
            put(at, rec, int(self.wait[list(rec.nodes)].sum()))
            names[int(at[0])] = rec.group
            j0 = rec.nodes[0] - int(self.off[self.slot_of[rec.members[0]]])
            for k in range(1, m):
                first = int(self.rep[k, self.slot_of[rec.members[0]]])
                names[int(at[k])] = self.labels[first].keys.get(j0, rec.group)
        sh_ids = ids[m * n_in :]
        for key, vals in sh.table().items():
            cols[key][sh_ids] = vals
        for e, name in zip(sh_ids.tolist(), sh.names, strict=True):
            names[e] = name
        self.coll_cols = {
            "collective": np.arange(total, dtype=np.int64),
            "pg_name": names,
            "comm_type": cols["ct"],
            "ranks": cols["ranks"],
            "bytes": cols["bytes"],
            "first_arrival_ns": cols["first"],
            "last_arrival_ns": cols["last"],
            "end_ns": cols["end"],
            "wait_sum_ns": cols["w"],
        }
        self.coll_bytes = int(cols["bytes"].sum())

    def _pairs(self) -> None:
        """P2P pairs: copy k pairs pi_k of the representatives' ranks at the same rows, numbered."""
        prog, m = self.prog, self.m
        pr = np.asarray(self.out.p2p_pairs, dtype=np.int64).reshape(-1, 2)
        self.pp = np.full(prog.num_nodes, -1, dtype=np.int64)  # representative node -> pair
        self.peer_slot = np.full(prog.num_nodes, -1, dtype=np.int64)
        n_p = len(pr)
        self.num_p2p = m * n_p
        self.p2p_bytes = m * sum(prog.p2p[sg].size for sg in pr[:, 0].tolist())
        if not n_p:
            self.id_p = np.zeros((m, 0), dtype=np.int64)
            return
        self.pp[pr[:, 0]] = np.arange(n_p)
        self.pp[pr[:, 1]] = np.arange(n_p)
        self.peer_slot[pr[:, 0]] = self.slot_of[[prog.p2p[g].dst for g in pr[:, 0].tolist()]]
        self.peer_slot[pr[:, 1]] = self.slot_of[[prog.p2p[g].src for g in pr[:, 1].tolist()]]
        s_slot = np.searchsorted(self.off, pr[:, 0], side="right") - 1
        t = np.maximum(self.start[pr[:, 0]], self.start[pr[:, 1]])
        f = self._full(self.rep[:, s_slot], pr[:, 0][None, :])  # (copies, pairs)
        self.id_p = canonical_ids(np.tile(t, m), f.reshape(-1)).reshape(m, n_p)

    def ops_chunks(self) -> Iterator:
        """The ops table, a chunk of whole ranks at a time (rank order)."""
        for frame, _rows in self._derived():
            yield frame.select(self._ops_columns)

    def ops_parts(self) -> Iterator[tuple]:
        """The ops table's chunks, each with a function writing its CSV rows (no header) to a binary file,
        equal to the frame's `write_csv`: the rows assembled from the representatives' text
        (replay/ops_text.py), or polars' writer where that text cannot be split apart."""
        for frame, rows in self._derived():
            df = frame.select(self._ops_columns)
            yield df, partial(_write_csv, self._text, frame, df, rows)

    def _rep_frame(self):
        """The representatives' ops rows (prog order) and their CSV text blocks, as every folded rank's
        rows start from them (no communication ids: a row of a copy gets its own)."""
        prog, n = self.prog, self.prog.num_nodes
        none = np.full(n, -1, dtype=np.int64)
        ann = {
            k: _annotation_ints(prog, k, n) if typ == "int" else _annotation_strings(prog, k, n)
            for k, typ in ANNOTATION_COLUMNS.items()
        }
        rep = ops_frame(
            OpsColumns(
                rank=np.repeat(self.rep[0], np.diff(self.off)),
                node_id=self.cols["node_id"],
                name=strings_series(prog.name),
                node_type=self.cols["node_type"],
                kind=self.cols["kind"],
                start=self.start,
                end=self.end,
                ready=self.ready,
                wait=self.wait,
                nbytes=self.cols["nbytes"],
                comm_type=self.cols["comm_type"],
                pg_name=strings_series(prog.pg_name),
                collective=none,
                p2p=none,
                peer=none,
                annotations=ann,
            )
        )
        self._ops_columns = rep.columns
        from xsim.replay.ops_text import OpsText

        self._text = OpsText(rep)
        self._dg = ann.get(DEVICE_GROUP) if ANNOTATION_COLUMNS.get(DEVICE_GROUP) == "int" else None
        self._dict_row = np.zeros(n, dtype=bool)
        self._dict_row[list(prog.annotations)] = True
        self._comm_row = (self.ci >= 0) | (self.cs >= 0) | (self.pp >= 0)
        return rep.with_columns(self._text.columns()) if self._text.ok else rep

    def _derived(self) -> Iterator[tuple]:
        """Each chunk's frame (ops columns and text blocks) and ChunkRows, whole ranks at a time, about
        CHUNK_ROWS rows each."""
        rep = self._rep_frame()
        # Each slot's rows as a slice of the representatives' frame: a chunk is these slices in rank
        # order, concatenated without copying (a gather by row copied every column: ~0.2 us a row).
        slices = [rep.slice(int(a), int(b - a)) for a, b in zip(self.off[:-1], self.off[1:], strict=True)]
        cum = self.full_off
        n = len(self.lens)
        x0 = 0
        while x0 < n:
            x1 = int(np.searchsorted(cum, cum[x0] + CHUNK_ROWS, side="right")) - 1
            x1 = min(max(x1, x0 + 1), n)
            yield self._chunk(slices, x0, x1)
            x0 = x1

    def _chunk(self, slices: list, x0: int, x1: int) -> tuple:
        """Ranks x0..x1-1: their representatives' rows, then what is each rank's own replaced."""
        import polars as pl

        ranks = np.arange(x0, x1, dtype=np.int64)
        sl, kk, ln = self.slot_of[ranks], self.k_of[ranks], self.lens[ranks]
        idx = _ramp(self.off[sl], ln)
        base = self.full_off[ranks] - self.full_off[x0]  # each rank's first row in the chunk
        frame = pl.concat([slices[i] for i in sl.tolist()], rechunk=False)
        coll, p2p, peer = self._ids(idx, np.repeat(kk, ln))
        own = {
            "rank": pl.Series(np.repeat(ranks, ln).astype(np.int32), dtype=pl.Int32),
            "collective": _nullable(coll, coll >= 0, pl.Int64),
            "p2p": _nullable(p2p, p2p >= 0, pl.Int64),
            "peer": _nullable(peer, peer >= 0, pl.Int32),
        }
        delta = np.repeat(self.delta[ranks], ln)
        if delta.any():
            own["node_id"] = pl.Series((self.cols["node_id"][idx] + delta).astype(np.uint64), dtype=pl.UInt64)
        lab = self._rank_labels(ranks, base)
        for k, at, vals in (("name", lab.name_at, lab.name_v), ("pg_name", lab.pg_at, lab.pg_v)):
            if at:
                own[k] = frame[k].scatter(np.concatenate(at), pl.Series(vals, dtype=pl.String))
        own.update(self._own_annotations(frame, idx, lab))
        frame = frame.with_columns(**own)
        own_ids = np.concatenate([*lab.name_at, np.flatnonzero(delta)])
        from xsim.replay.ops_text import ChunkRows

        return frame, ChunkRows(own_ids, np.asarray(lab.ann_at, np.int64), lab.pg_v)

    def _ids(self, idx: np.ndarray, krow: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each row's collective, P2P pair and peer (-1: none) in its own copy (worked out on the rows
        of communication nodes only)."""
        out = [np.full(len(idx), -1, dtype=np.int64) for _ in range(3)]
        r = np.flatnonzero(self._comm_row[idx])
        if not len(r):
            return out[0], out[1], out[2]
        g, k = idx[r], krow[r]
        ci, cs, pp = self.ci[g], self.cs[g], self.pp[g]
        coll = np.full(len(r), -1, dtype=np.int64)
        if self.id_in.size:
            coll = np.where(ci >= 0, self.id_in[k, np.maximum(ci, 0)], coll)
        if self.id_sh.size:
            coll = np.where(cs >= 0, self.id_sh[k, np.maximum(cs, 0)], coll)
        has = pp >= 0
        out[0][r] = coll
        if self.id_p.size:
            out[1][r] = np.where(has, self.id_p[k, np.maximum(pp, 0)], -1)
        out[2][r] = np.where(has, self.rep[k, np.maximum(self.peer_slot[g], 0)], -1)
        return out[0], out[1], out[2]

    def _rank_labels(self, ranks: np.ndarray, base: np.ndarray) -> _Labels:
        """Labels: names, process-group names, device-group ids and annotations where a rank's own
        differ from its representative's (row positions in the chunk)."""
        lab_rows = _Labels([], [], [], [], [], [], [], [])
        for x, b in zip(ranks.tolist(), base.tolist(), strict=True):
            lab = self.labels[x]
            if lab is None:
                continue
            if lab.names:
                lab_rows.name_at.append(np.fromiter(lab.names, np.int64, len(lab.names)) + b)
                lab_rows.name_v.extend(lab.names.values())
            if lab.pg_names:
                lab_rows.pg_at.append(np.fromiter(lab.pg_names, np.int64, len(lab.pg_names)) + b)
                lab_rows.pg_v.extend(lab.pg_names.values())
            if lab.device_group is not None and len(lab.dg_nodes):
                lab_rows.dg_at.append(b + np.asarray(lab.dg_nodes, dtype=np.int64))
                lab_rows.dg_own.append(lab.device_group[1])
            for j, v in lab.annotations.items():
                lab_rows.ann_at.append(b + j)
                lab_rows.ann_v.append(v)
        return lab_rows

    def _own_annotations(self, frame, idx: np.ndarray, lab: _Labels) -> dict:
        """The annotation columns a chunk's labels change: a rank's own device group on its nodes that
        differ only in it (valid where the representative's is, or the node's annotations are its own
        dict), and the nodes whose annotations are all the rank's own."""
        import polars as pl

        out: dict = {}
        at = np.asarray(lab.ann_at, dtype=np.int64)
        if lab.dg_at and self._dg is not None:
            vals, ok = self._dg[0][idx], self._dg[1][idx]
            for rows, v in zip(lab.dg_at, lab.dg_own, strict=True):
                ok[rows] |= self._dict_row[idx[rows]]
                vals[rows] = np.where(ok[rows], v, 0)
            if len(at):
                got = [a.get(DEVICE_GROUP) for a in lab.ann_v]
                vals[at] = [0 if v is None else v for v in got]
                ok[at] = [v is not None for v in got]
            out[DEVICE_GROUP] = _nullable(vals, ok, pl.Int64)
        if not len(at):
            return out
        schema = frame.schema
        for k in ANNOTATION_COLUMNS:
            if k not in out:
                vals = pl.Series([a.get(k) for a in lab.ann_v], dtype=schema[k])
                out[k] = frame[k].scatter(at, vals)
        return out

    def result(self, *, network_name: str, comm_mode: str, sim_wall_s: float) -> ReplayResult:
        """The replay's result: ranks, collectives and summary now, the ops table streamed on demand."""
        prog, out = self.prog, self.out
        rep_cols = rank_columns(prog, self.start, self.end, self.wait)
        rank_cols = {k: v[self.slot_of] for k, v in rep_cols.items()}
        rank_cols["rank"] = np.arange(len(self.slot_of), dtype=np.int32)
        n = int(self.full_off[-1])
        summary = summary_row(
            rank_cols,
            out,
            num_nodes=n,
            num_collectives=self.num_collectives,
            num_p2p=self.num_p2p,
            bytes_moved=self.coll_bytes + self.p2p_bytes,
            events=n,
            ignored_ctrl_deps=prog.ignored_ctrl_deps * self.m,
            ctrl_deps_ignored_ranks=prog.ctrl_deps_ignored_ranks * self.m,
            names=(network_name, prog.compute_name, comm_mode),
            sim_wall_s=sim_wall_s,
        )
        stages = self._stages()

        def tables():
            import polars as pl
            from xsim.replay.result import _schema

            ranks = pl.DataFrame(rank_cols, schema=_schema("RANKS_SCHEMA"))
            summary_df = pl.DataFrame(
                [summary], schema={**_schema("SUMMARY_SCHEMA"), **_schema("PERF_SCHEMA")}
            )
            return None, ranks, collectives_frame(self.coll_cols), summary_df

        return ReplayResult(
            None,
            None,
            None,
            None,
            per_rank_finish_ns=[int(x) for x in rank_cols["finish_ns"]],
            paths=self.paths,
            groups=prog.groups,
            tables=tables,
            summary_row=summary,
            rank_arrays=rank_cols,
            num_stages=len(stages),
            ops_chunks=self.ops_chunks,
            ops_parts=self.ops_parts,
        )

    def _stages(self) -> set[int]:
        """Distinct `stage` values of every rank: the representatives' and any a folded rank's own labels set."""
        stage, ok = _annotation_ints(self.prog, "stage", self.prog.num_nodes)
        out = set(stage[ok].tolist())
        for lab in self.labels:
            if lab is not None:
                out.update(v["stage"] for v in lab.annotations.values() if v.get("stage") is not None)
        return out


__all__ = ["CHUNK_ROWS", "FoldedTables"]


class _SharedEntries:
    """The copies of the records on groups with folded members (one each, or in a rank-class fold one
    per distinct image of the group: replay/fold.py Copies), worked out on arrays a group at a time."""

    def __init__(self, ft: FoldedTables, shared: list, copies) -> None:
        m = ft.m
        self.at = np.zeros((m, len(shared)), dtype=np.int64)  # replica k's copy of record r: its entry
        by: dict[tuple, list[int]] = {}
        for r, rec in enumerate(shared):
            by.setdefault((rec.group, rec.members, tuple(sorted(rec.positions))), []).append(r)
        la, f0, rec_of, names = [], [], [], []
        self.end = np.zeros(len(shared), dtype=np.int64)
        self.wait = np.zeros(len(shared), dtype=np.int64)
        e0 = 0
        for (group, members, pos), rs in by.items():
            recs = [shared[r] for r in rs]
            mem = np.asarray(members, dtype=np.int64)
            # nodes[i, j]: record i's node of its j-th simulated member (in member order).
            pp = np.asarray([rec.positions for rec in recs], dtype=np.int64)
            nodes = np.take_along_axis(
                np.asarray([rec.nodes for rec in recs], dtype=np.int64), np.argsort(pp, axis=1), axis=1
            )
            col_of = {sl: j for j, sl in enumerate(ft.slot_of[mem[list(pos)]].tolist())}
            cp = copies(members) if copies is not None else np.zeros(m, dtype=np.int64)
            kc = np.zeros(int(cp.max()) + 1, dtype=np.int64)
            kc[cp[::-1]] = np.arange(m - 1, -1, -1)  # the first replica of each copy
            fm = np.asarray([copies.first(k, members) if k else members[0] for k in kc.tolist()], np.int64)
            fsl = ft.slot_of[fm]
            g0 = nodes[:, [col_of[sl] for sl in fsl.tolist()]]  # (records, copies)
            f0.append((ft.full_off[fm][None, :] + g0 - ft.off[fsl][None, :]).reshape(-1))
            la.append(np.repeat(np.asarray([rec.last_arrival_ns for rec in recs], dtype=np.int64), len(kc)))
            rec_of.append(np.repeat(np.asarray(rs, dtype=np.int64), len(kc)))
            self.at[:, rs] = e0 + np.arange(len(rs), dtype=np.int64)[None, :] * len(kc) + cp[:, None]
            e0 += len(rs) * len(kc)
            # Every member waits as long as the simulated one of its slot.
            cnt = np.bincount([col_of[sl] for sl in ft.slot_of[mem].tolist()], minlength=nodes.shape[1])
            self.end[rs] = ft.end[nodes].max(axis=1)
            self.wait[rs] = ft.wait[nodes] @ cnt
            own = [group] + [copies.name(k, members, group) for k in kc.tolist()[1:]]
            names.extend(own * len(rs))
        empty = np.zeros(0, dtype=np.int64)
        self.la = np.concatenate(la) if la else empty
        self.f0 = np.concatenate(f0) if f0 else empty
        self.rec_of = np.concatenate(rec_of) if rec_of else empty
        self.names = names
        self.shared = shared

    def table(self) -> dict[str, np.ndarray]:
        """The collectives-table columns of every entry, in entry order."""
        shared = self.shared
        per = {
            "ct": [rec.comm_type for rec in shared],
            "ranks": [len(rec.members) for rec in shared],
            "bytes": [rec.size for rec in shared],
            "first": [rec.first_arrival_ns for rec in shared],
            "last": [rec.last_arrival_ns for rec in shared],
        }
        out = {k: np.asarray(v, dtype=np.int64)[self.rec_of] for k, v in per.items()}
        out["end"], out["w"] = self.end[self.rec_of], self.wait[self.rec_of]
        return out
