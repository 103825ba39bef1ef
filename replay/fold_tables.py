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

import numpy as np
from xsim.replay.engine import EngineOutput, canonical_ids
from xsim.replay.fold import Copies
from xsim.replay.program import ANNOTATION_COLUMNS, Program, strings_series
from xsim.replay.result import (
    OpsColumns,
    ReplayResult,
    collectives_frame,
    ops_frame,
    rank_columns,
    summary_row,
)
from xsim.traces.attrs import DEVICE_GROUP
from xsim.traces.groups import ProcessGroups

# Rows per ops chunk: big enough that polars' per-call costs vanish, small enough (~200 MB of columns)
# that the expansion of a 16,384-rank run stays far under the memory of a laptop.
CHUNK_ROWS = int(os.environ.get("XSIM_FOLD_CHUNK_ROWS", 1 << 20))


def _ramp(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenated ranges [s, s + l) for each (s, l)."""
    total = int(lens.sum())
    offs = np.repeat(starts - np.concatenate(([0], np.cumsum(lens)[:-1])), lens)
    return offs + np.arange(total, dtype=np.int64)


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
        prog = self.prog
        names = strings_series(prog.name)
        pgs = strings_series(prog.pg_name)
        cum = self.full_off
        n = len(self.lens)
        x0 = 0
        while x0 < n:
            x1 = int(np.searchsorted(cum, cum[x0] + CHUNK_ROWS, side="right")) - 1
            x1 = min(max(x1, x0 + 1), n)
            yield ops_frame(self._chunk(x0, x1, names, pgs))
            x0 = x1

    def _chunk(self, x0: int, x1: int, names, pgs) -> OpsColumns:
        """The ops columns of ranks x0..x1-1."""
        import polars as pl

        prog = self.prog
        ranks = np.arange(x0, x1, dtype=np.int64)
        sl, kk, ln = self.slot_of[ranks], self.k_of[ranks], self.lens[ranks]
        idx = _ramp(self.off[sl], ln)
        krow = np.repeat(kk, ln)
        base = self.full_off[ranks] - self.full_off[x0]  # each rank's first row in the chunk
        ci, cs = self.ci[idx], self.cs[idx]
        coll = np.full(len(idx), -1, dtype=np.int64)
        if self.id_in.size:
            coll = np.where(ci >= 0, self.id_in[krow, np.maximum(ci, 0)], coll)
        if self.id_sh.size:
            coll = np.where(cs >= 0, self.id_sh[krow, np.maximum(cs, 0)], coll)
        pp = self.pp[idx]
        has = pp >= 0
        p2p = np.where(has, self.id_p[krow, np.maximum(pp, 0)], -1) if self.id_p.size else pp
        peer = np.where(has, self.rep[krow, np.maximum(self.peer_slot[idx], 0)], -1)
        # Labels: names, process-group names, node ids, annotations, rank by rank where they differ.
        name_at, name_v, pg_at, pg_v = [], [], [], []
        ann = {}
        for k, typ in ANNOTATION_COLUMNS.items():
            col = prog.ann_cols.get(k)
            if typ == "int":
                ann[k] = (
                    (col[0][idx], col[1][idx])
                    if col is not None
                    else (
                        np.zeros(len(idx), np.int64),
                        np.zeros(len(idx), bool),
                    )
                )
            else:
                codes = col[0][idx] if col is not None else np.full(len(idx), -1, np.int64)
                ann[k] = (codes, col[1] if col is not None else [])
        dicts: dict[int, dict] = {}
        rep_dicts = self._rep_dicts()
        null_rows: list[int] = []
        for x, i, b in zip(ranks.tolist(), sl.tolist(), base.tolist(), strict=True):
            lo = int(self.off[i])
            for g, a in rep_dicts[i]:
                dicts[b + g - lo] = a
            lab = self.labels[x]
            if lab is None:
                continue
            if lab.names:
                name_at.append(np.fromiter(lab.names, np.int64, len(lab.names)) + b)
                name_v.extend(lab.names.values())
            if lab.pg_names:
                pg_at.append(np.fromiter(lab.pg_names, np.int64, len(lab.pg_names)) + b)
                pg_v.extend(lab.pg_names.values())
            if lab.device_group is not None and len(lab.dg_nodes):
                own = lab.device_group[1]
                rows = b + np.asarray(lab.dg_nodes, dtype=np.int64)
                for g in rows.tolist() if dicts else ():  # only the representatives' dicts hold these rows
                    if g in dicts:
                        a = dict(dicts[g])
                        a[DEVICE_GROUP] = own
                        dicts[g] = a
                if DEVICE_GROUP in ann and ANNOTATION_COLUMNS[DEVICE_GROUP] == "int":
                    vals, ok = ann[DEVICE_GROUP]
                    vals[rows] = np.where(ok[rows], own, 0)
            for j, v in lab.annotations.items():
                dicts[b + j] = v
                null_rows.append(b + j)
        out_ann: dict[str, object] = {}
        rows_n = np.asarray(null_rows, dtype=np.int64)
        for k, typ in ANNOTATION_COLUMNS.items():
            if typ == "int":
                vals, ok = ann[k]
                if len(rows_n):
                    vals[rows_n], ok[rows_n] = 0, False
                for g, a in dicts.items():
                    v = a.get(k)
                    if v is not None:
                        vals[g], ok[g] = v, True
                out_ann[k] = (vals, ok)
            else:
                codes, table = ann[k]
                if len(rows_n):
                    codes[rows_n] = -1
                over = [(g, a[k]) for g, a in dicts.items() if a.get(k) is not None]
                if over:
                    obj = np.asarray([*table, None], dtype=object)[codes]
                    for g, v in over:
                        obj[g] = v
                    out_ann[k] = obj
                else:  # the table's strings gathered by code (code -1: the trailing null)
                    lut = pl.Series([*table, None], dtype=pl.String)
                    out_ann[k] = lut.gather(np.where(codes < 0, len(table), codes))
        name = names.gather(idx)
        if name_at:
            name = name.scatter(np.concatenate(name_at), pl.Series(name_v, dtype=pl.String))
        pg = pgs.gather(idx)
        if pg_at:
            pg = pg.scatter(np.concatenate(pg_at), pl.Series(pg_v, dtype=pl.String))
        return OpsColumns(
            rank=np.repeat(ranks, ln).astype(np.int32),
            node_id=self.cols["node_id"][idx] + np.repeat(self.delta[ranks], ln),
            name=name,
            node_type=self.cols["node_type"][idx],
            kind=self.cols["kind"][idx],
            start=self.start[idx],
            end=self.end[idx],
            ready=self.ready[idx],
            wait=self.wait[idx],
            nbytes=self.cols["nbytes"][idx],
            comm_type=self.cols["comm_type"][idx],
            pg_name=pg,
            collective=coll,
            p2p=p2p,
            peer=peer,
            annotations=out_ann,
        )

    def _rep_dicts(self) -> list[list[tuple[int, dict]]]:
        """Per representative slot, its nodes built as dicts (node by node): (node, annotations)."""
        if not hasattr(self, "_dicts"):
            d: list[list[tuple[int, dict]]] = [[] for _ in range(len(self.off) - 1)]
            for g, a in sorted(self.prog.annotations.items()):
                d[int(np.searchsorted(self.off, g, side="right")) - 1].append((g, a))
            self._dicts = d
        return self._dicts

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
        )

    def _stages(self) -> set[int]:
        """Distinct `stage` values of every rank: the representatives' and any a folded rank's own labels set."""
        from xsim.replay.result import _annotation_ints

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
