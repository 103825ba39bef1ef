"""The ops table streamed in chunks under the Parquet settings (result.PARQUET_OPTIONS: zstd level 1, 16 MiB
data pages, round 24y of docs/performance.md) is byte for byte the table written whole, and reads back
equal: schema and values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
from xsim.replay.result import OPS_SCHEMA, PARQUET_OPTIONS, ROW_GROUP, ReplayResult


def _ops(n: int) -> pl.DataFrame:
    """n ops rows with every dtype of the schema, nulls and strings that need quoting in CSV."""
    rng = np.random.default_rng(7)
    cols = {}
    for k, t in OPS_SCHEMA.items():
        if t == pl.String:
            words = np.asarray(["fwd", "a,b", 'q"x', "", "gemm[7]", "line\nbreak"], dtype=object)
            vals = words[rng.integers(0, len(words), n)].tolist()
            cols[k] = pl.Series(k, vals, dtype=pl.String).set(pl.Series(rng.random(n) < 0.2), None)
        else:
            vals = rng.integers(0, 1 << 30, n)
            cols[k] = pl.Series(k, vals).cast(t).set(pl.Series(rng.random(n) < 0.1), None)
    return pl.DataFrame(cols, schema=OPS_SCHEMA)


def _result(chunks: list[pl.DataFrame]) -> ReplayResult:
    return ReplayResult(None, None, None, None, [], ops_chunks=lambda: iter(chunks))


def test_streamed_in_chunks_equals_the_table_written_whole(tmp_path: Path) -> None:
    """Chunks of uneven sizes crossing row-group bounds: the same Parquet and CSV bytes as one writer each
    on the whole frame, and the frame read back equal (schema and values)."""
    df = _ops(ROW_GROUP + 70_001)
    cuts = [0, 1, 5_000, ROW_GROUP - 3, ROW_GROUP + 9, df.height]
    chunks = [df.slice(a, b - a) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    _result(chunks)._stream_ops(str(tmp_path / "s.parquet"), str(tmp_path / "s.csv"))
    df.write_parquet(tmp_path / "w.parquet", **PARQUET_OPTIONS)
    df.write_csv(tmp_path / "w.csv")
    assert (tmp_path / "s.parquet").read_bytes() == (tmp_path / "w.parquet").read_bytes()
    assert (tmp_path / "s.csv").read_bytes() == (tmp_path / "w.csv").read_bytes()
    back = pl.read_parquet(tmp_path / "s.parquet")
    assert back.schema == df.schema and back.equals(df)
