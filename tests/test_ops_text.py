"""ops.csv of a folded replay from pre-rendered text (replay/ops_text.py): byte for byte polars' writer.

The reference is polars' own `write_csv` (an unfolded replay writes its ops table through it, whole), so
every test here compares a folded replay's files with the unfolded replay's, on sets made to hold what
CSV quoting must get right: names with commas, quotes, CR and LF, empty names, non-ASCII text, process
group names and phase annotations that need quotes, and labels of one rank's own that need them too.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest
import xsim.replay.fold_tables as ft
import xsim.replay.ops_text as ops_text
from xsim.replay.ops_text import TERMINATORS, OpsText, render_rows
from xsim.tracegen import generate, load_spec
from xsim.tracegen.spec import save_deployment
from xsim.traces import pb
from xsim.traces.attrs import PG_NAME
from xsim.traces.stream import write_et
from xsim.traces.traceset import discover

from tests.test_replay_fold import _assert_same, _replay, _spec

ODD = ["", "a,b", 'q"q', "x\ny", "c\rd", " sp ", "é ü", "#", "'", '""', ",", "\t"]


def test_render_rows_is_polars_writer_split() -> None:
    # Rows joined with the line end polars writes are its write_csv text, quotes and nulls included; a
    # field holding the first terminator makes it try the next.
    vals = [*ODD, None, "has\x1eterminator"]
    df = pl.DataFrame({"s": vals, "i": list(range(len(vals))), "t": [None, *vals[:-1]]})
    rows = render_rows(df)
    assert rows is not None and len(rows) == df.height
    assert "".join(r + "\n" for r in rows) == df.write_csv(include_header=False)
    # By hand: an empty string is two quotes, a null nothing; quotes doubled inside quotes.
    assert rows[:3] == ['"",0,', '"a,b",1,""', '"q""q",2,"a,b"']
    assert rows[9] == '"""""",9,\'' and rows[12] == ",12,\t" and rows[13] == "has\x1eterminator,13,"
    every = pl.DataFrame({"s": ["".join(TERMINATORS)]})
    assert render_rows(every) is None
    assert render_rows(every.clear()) == []


def _rewrite(d: Path, edit) -> None:
    """Rewrite every rank's file of set d with edit(rank, nodes) applied."""
    ts = discover(d)
    for r in range(ts.num_ranks):
        ef = ts.load(r)
        nodes = list(ef.nodes)
        edit(r, nodes)
        write_et(ef.path, nodes, ef.metadata)


def _odd_names(rank: int, nodes: list) -> None:
    # Every rank alike (the fold holds): names needing quotes, an empty name, non-ASCII text; phase
    # annotations with a comma and a quote.
    for i, nd in enumerate(nodes):
        if nd.type == pb.COMP_NODE:
            nd.name = ODD[i % len(ODD)] + (nd.name if i % 3 else "")
        for a in nd.attr:
            if a.name == "phase" and i % 2:
                a.string_val = f'{a.string_val},"x"'


@pytest.fixture(scope="module")
def odd_set(tmp_path_factory) -> Path:
    """TP 2 x PP 2 x DP 4 (16 ranks, every file written), names and phases needing quotes."""
    dep = load_spec(_spec("odd", "1f1b"))
    d = tmp_path_factory.mktemp("odd") / "set"
    generate(dep).write(d, dep.name)
    save_deployment(dep, d / "deployment.json")
    _rewrite(d, _odd_names)
    return d


def _spy(monkeypatch) -> list[bool]:
    """Record what OpsText.write returned for each chunk (True: written from the text)."""
    seen: list[bool] = []
    real = OpsText.write

    def write(self, fh, df, rows):
        ok = real(self, fh, df, rows)
        seen.append(ok)
        return ok

    monkeypatch.setattr(OpsText, "write", write)
    return seen


def test_quoted_names_and_phases(odd_set, tmp_path: Path, monkeypatch) -> None:
    # The representatives' text made 7 rows at a time (a slice ends inside a rank): the same bytes.
    monkeypatch.setattr(ops_text, "RENDER_ROWS", 7)
    seen = _spy(monkeypatch)
    a, n_a = _replay(odd_set)
    b, n_b = _replay(odd_set, fold=True)
    assert n_b * 4 == n_a
    _assert_same(a, b, tmp_path)
    assert seen and all(seen)  # every chunk written from the text, none by the fallback
    text = (tmp_path / "b" / "ops.csv").read_text(encoding="utf-8")
    assert (
        '"x\ny' in text and '"q""q' in text and ',"",' in text and "é ü" in text and ',"fwd,""x""",' in text
    )


def test_own_labels_needing_quotes(odd_set, tmp_path: Path, monkeypatch) -> None:
    # Rank 14 (last replica) with labels of its own: names needing quotes, an empty name, a phase with a
    # comma; each row keeps rank 14's own text, in chunks of one rank, a few ranks and the whole table.
    d = tmp_path / "set"
    shutil.copytree(odd_set, d)
    ef = discover(d).load(14)
    nodes = list(ef.nodes)
    comp = [nd for nd in nodes if nd.type == pb.COMP_NODE]
    comp[1].name, comp[2].name, comp[4].name = 'own,"label"', "", "line\r\nend"
    phase = next(a for a in comp[5].attr if a.name == "phase")
    phase.string_val = "own,phase"
    write_et(ef.path, nodes, ef.metadata)
    seen = _spy(monkeypatch)
    a, _ = _replay(d)
    for rows in (1, 1000, 10**9):
        monkeypatch.setattr(ft, "CHUNK_ROWS", rows)
        b, n = _replay(d, fold=True)
        assert n * 4 == a.summary_dict()["num_nodes"]
        _assert_same(a, b, tmp_path / str(rows))
    assert seen and all(seen)
    ops14 = b.ops.filter(b.ops["rank"] == 14)
    assert ops14.filter(ops14["node_id"] == comp[1].id)["name"].to_list() == ['own,"label"']
    assert ops14.filter(ops14["node_id"] == comp[5].id)["phase"].to_list() == ["own,phase"]


def test_group_names_needing_quotes(tmp_path: Path, monkeypatch) -> None:
    # Process-group names with a comma and a quote (comm_group.json and every node alike): the pg_name
    # column is rendered by polars' writer for the chunk, still the same bytes.
    dep = load_spec(_spec("pgq", "1f1b"))
    d = tmp_path / "set"
    generate(dep).write(d, dep.name)
    save_deployment(dep, d / "deployment.json")
    groups = json.loads((d / "comm_group.json").read_text())
    rename = {k: f'g,"{k}"' for k in groups}
    (d / "comm_group.json").write_text(json.dumps({rename[k]: v for k, v in groups.items()}))

    def edit(_rank: int, nodes: list) -> None:
        for nd in nodes:
            for a in nd.attr:
                if a.name == PG_NAME and a.string_val in rename:
                    a.string_val = rename[a.string_val]

    _rewrite(d, edit)
    seen = _spy(monkeypatch)
    a, n_a = _replay(d)
    b, n_b = _replay(d, fold=True)
    assert n_b * 4 == n_a
    _assert_same(a, b, tmp_path)
    assert seen and all(seen)
    assert ',"g,""1""",' in (tmp_path / "b" / "ops.csv").read_text()


def test_terminator_in_a_name_falls_back_to_polars(odd_set, tmp_path: Path, monkeypatch) -> None:
    # With one terminator only, a name holding it cannot be split apart: the representatives' (every
    # chunk) or one rank's own label (its chunk) is written by polars' writer instead, same bytes.
    monkeypatch.setattr(ops_text, "TERMINATORS", ("\x1e",))
    seen = _spy(monkeypatch)
    d = tmp_path / "set"
    shutil.copytree(odd_set, d)
    ef = discover(d).load(14)
    nodes = list(ef.nodes)
    next(nd for nd in nodes if nd.type == pb.COMP_NODE).name = "own\x1elabel"
    write_et(ef.path, nodes, ef.metadata)
    monkeypatch.setattr(ft, "CHUNK_ROWS", 1)
    a, _ = _replay(d)
    b, _ = _replay(d, fold=True)
    _assert_same(a, b, tmp_path / "own")
    assert False in seen and True in seen  # rank 14's chunk fell back, the others did not
    seen.clear()

    def everywhere(_rank: int, nodes: list) -> None:
        next(nd for nd in nodes if nd.type == pb.COMP_NODE).name = "all\x1eranks"

    _rewrite(d, everywhere)
    a, _ = _replay(d)
    b, n = _replay(d, fold=True)
    assert n * 4 == a.summary_dict()["num_nodes"]
    _assert_same(a, b, tmp_path / "all")
    assert not seen  # the representatives' text could not be made: every chunk by polars' writer
