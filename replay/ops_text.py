"""ops.csv of a folded replay from pre-rendered text: the representatives' fields rendered once.

A folded rank's ops rows equal its representative's except `rank`, the communication ids (`collective`,
`p2p`, `peer`, and `pg_name` where the rank's group differs), `device_group`, and the rows a label of its
own changes (replay/fold_tables.py). polars' CSV writer pays per field of every row (~20 ns each here,
~0.8-1.1 us a row of 24 fields, docs/performance.md rounds 24w and 24x), so a chunk is written as nine
fields a row instead, with `quote_style="never"`:

    rank, [node_id..comm_type], pg_name, collective, p2p, peer, [layer..stage], device_group, [ring..reshard]

The three bracketed fields are the representative node's text, rendered once (rows a rank's own labels
change re-rendered for that chunk). All text is rendered by polars' own writer (rows written with a line
terminator that no field holds, then split), so each row equals what `write_csv` writes, quoting included;
`pg_name` is written as it is only where polars would not quote it, else rendered the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

if TYPE_CHECKING:
    import polars as pl

# Line terminators tried when polars renders rows for splitting: single characters (a longer one could
# overlap a field's last characters), control codes no trace name is expected to hold; one that occurs in
# a field is detected (more terminators than rows) and the next is tried.
TERMINATORS = ("\x1e", "\x1f", "\x1d", "\x1c", "\x00")
# Representative rows rendered per call when their text is made (bounds the Python strings held at once).
RENDER_ROWS = 1 << 16
# The ops columns written as they are (ints, null as empty, and pg_name where it needs no quotes).
_OWN = ("rank", "pg_name", "collective", "p2p", "peer", "device_group")


def render_rows(df: pl.DataFrame) -> list[str] | None:
    """Each row of `df` as polars' `write_csv` writes it (fields joined by ',', no line end), or None when
    every terminator in TERMINATORS occurs inside some field."""
    n = df.height
    if n == 0:
        return []
    for t in TERMINATORS:
        text = df.write_csv(include_header=False, line_terminator=t)
        if text.count(t) == n:
            return text.split(t)[:n]
    return None


def _render_series(df: pl.DataFrame) -> pl.Series | None:
    """render_rows as a String Series, RENDER_ROWS rows at a time (the text of a few million
    representative rows as one Python string and list would be ~0.3 KB a row at once)."""
    import polars as pl

    parts = []
    for a in range(0, max(df.height, 1), RENDER_ROWS):
        rows = render_rows(df.slice(a, RENDER_ROWS))
        if rows is None:
            return None
        parts.append(pl.Series(rows, dtype=pl.String))
    return pl.concat(parts)


def _blocks(columns: list[str]) -> list[list[str]]:
    """The ops columns between those written as they are (`_OWN`), in order."""
    at = [columns.index(c) for c in _OWN]
    if at != sorted(at) or at[0] != 0 or at[1:5] != list(range(at[1], at[1] + 4)):
        raise ValueError(f"ops columns in an order the text writer does not know: {columns}")
    return [columns[at[0] + 1 : at[1]], columns[at[4] + 1 : at[5]], columns[at[5] + 1 :]]


# A record of numpy arrays: no generated eq, hash or repr (why: traces/columnar.py, AttrColumn).
@dataclass(frozen=True, eq=False, repr=False)
class ChunkRows:
    """What a chunk's text needs besides its frame: the rows whose `node_id` or `name` are the rank's
    own, the rows whose annotations are, and the ranks' own `pg_name` values (one that polars quotes makes
    the chunk render that column)."""

    own_ids: np.ndarray
    own_annotations: np.ndarray
    pg_values: list


class OpsText:
    """The representatives' blocks of text (`columns`, gathered with their rows), and each chunk written
    from them."""

    def __init__(self, rep: pl.DataFrame) -> None:

        self.blocks = _blocks(rep.columns)
        self.text: list[pl.Series] = []
        for cols in self.blocks:
            block = _render_series(rep.select(cols))
            if block is None:
                break
            self.text.append(block)
        self.ok = len(self.text) == len(self.blocks)
        self._plain: set[str] = set()  # pg_name values polars writes unquoted
        self.pg_plain = self.ok and self._unquoted(rep["pg_name"].drop_nulls().unique().to_list())

    def columns(self) -> list[pl.Series]:
        """The text blocks as columns of the representatives' frame (names no ops column has)."""
        return [t.alias(f"\x00text{i}") for i, t in enumerate(self.text)]

    def _unquoted(self, values: list[str]) -> bool:
        """Whether polars writes every one of `values` as it is (no quotes, no doubling)."""
        import polars as pl

        new = [v for v in dict.fromkeys(values) if v not in self._plain]
        if not new:
            return True
        rows = render_rows(pl.DataFrame({"v": new}, schema={"v": pl.String}))
        if rows is None or rows != new:
            return False
        self._plain.update(new)
        return True

    def write(self, fh: BinaryIO, df: pl.DataFrame, rows: ChunkRows) -> bool:
        """Write the chunk's CSV rows (no header) to fh, byte for byte the ops columns' `write_csv(
        include_header=False)`; df: the chunk's rows with the text blocks gathered (`columns`). False
        (nothing written) when some field could not be rendered apart."""
        import polars as pl

        own = [rows.own_ids, rows.own_annotations, rows.own_annotations]
        parts = []
        for i, (cols, at) in enumerate(zip(self.blocks, own, strict=True)):
            block = df[f"\x00text{i}"]
            if len(at):
                mask = np.zeros(df.height, dtype=bool)
                mask[at] = True
                at = np.flatnonzero(mask)
                fresh = render_rows(df.select(cols)[at])
                if fresh is None:
                    return False
                block = block.scatter(at, pl.Series(fresh, dtype=pl.String))
            parts.append(block)
        pg = df["pg_name"]
        if not (self.pg_plain and self._unquoted(rows.pg_values)):
            fresh = render_rows(df.select("pg_name"))
            if fresh is None:
                return False
            pg = pl.Series(fresh, dtype=pl.String)
        fields = [df["rank"], parts[0], pg, df["collective"], df["p2p"], df["peer"], parts[1]]
        out = pl.DataFrame({str(i): f for i, f in enumerate([*fields, df["device_group"], parts[2]])})
        out.write_csv(fh, include_header=False, quote_style="never")
        return True


__all__ = ["TERMINATORS", "ChunkRows", "OpsText", "render_rows"]
