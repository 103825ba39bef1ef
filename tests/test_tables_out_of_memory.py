"""Running out of memory while the result tables are written is the one out-of-memory line, never a
traceback (issue 24 item 5): in the folded expansion (its rows are made inside polars' streaming Parquet
writer, replay/fold_tables.py) and in the writers themselves."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def small_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from xsim import api

    out = tmp_path_factory.mktemp("oom") / "set"
    spec = {"name": "oomw", "model": "llama2-7b", "seq_len": 128, "micro_batches": 1,
            "parallel": {"gpu": "H100", "tp": 2, "pp": 2, "dp": 2}}  # fmt: skip
    api.generate(spec, api.GenerateOptions(out=str(out)))
    return out


def _no_memory(*_a, **_k):
    raise MemoryError


@pytest.mark.parametrize(
    "where", ["expansion", "parquet", "csv"], ids=["fold-expansion", "parquet-writer", "csv-writer"]
)
def test_a_memory_error_while_writing_tables_is_one_line(
    where: str, small_set: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Exit 2, one stderr line naming the set and its size, and no result folder left behind."""
    import polars as pl
    import xsim.replay.fold_tables as fold_tables

    from xsim.cli import main

    target = {
        "expansion": (fold_tables.FoldedTables, "_chunk"),
        "parquet": (pl.LazyFrame, "sink_parquet"),
        "csv": (pl.DataFrame, "write_csv"),
    }[where]
    monkeypatch.setattr(*target, _no_memory)
    out = tmp_path / "res"
    assert main(["replay", str(small_set), "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1
    assert err.startswith(f"xsim: error: out of memory in `xsim replay` on {small_set} (8 ranks, ")
    assert not out.exists()
