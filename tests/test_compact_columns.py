"""A compact set's unwritten ranks as columns (issue 24 flow round 6): `PredictedRanks.columns(x)`, the
representative's decoded columns with the template's label fields set to rank x's values, equals
decoding x's predicted bytes (which tests/test_gen_compact.py pins to the `--all-ranks` files), column by
column (tests/test_gen_compact.py also pins the unfolded flow replay of such a set to the set with every
rank's, table by table)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from xsim.replay.compute import DurationModel
from xsim.replay.config import ReplayConfig
from xsim.replay.program import WANT_ATTRS
from xsim.replay.simulation import ColumnReader, compact_source, load_groups
from xsim.traces.attrs import COMM_DST, COMM_SRC, DEVICE_GROUP, PG_NAME
from xsim.traces.columnar import F_STRING, RankColumns, decode_columns
from xsim.traces.traceset import discover

from tests.test_gen_compact import _gen, _two_class_spec

_ARRAYS = ("file_ptr", "node_id", "node_type", "duration_micros", "data_ptr", "data_idx", "ctrl_ptr",
           "ctrl_idx")  # fmt: skip


def _values(cols: RankColumns, name: str) -> list:
    """An attribute column as (kind, value) per node, string values as their text."""
    c = cols.attrs[name]
    return [
        (k, c.strings[v] if k == F_STRING else v)
        for k, v in zip(c.kind.tolist(), c.value.tolist(), strict=True)
    ]


@pytest.fixture(scope="module")
def compact(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cols")
    _gen(_two_class_spec("cc"), root / "c", all_ranks=False)
    _gen(_two_class_spec("cc"), root / "a", all_ranks=True)
    return root


def test_derived_columns_are_the_decoded_predicted_files(compact):
    ts = discover(compact / "c", compact=True)
    pgs = load_groups(ts, None, scan=True)
    pred = compact_source(ts, pgs, DurationModel(), ReplayConfig(), columns=True)
    unwritten = [x for x in range(ts.num_ranks) if x not in ts.written]
    assert unwritten == [2, 3, 5, 8, 9, 11]  # replica 1 (2, 3, 8, 9) and replica 3 (5, 11)
    changed = {name: 0 for name in (DEVICE_GROUP, PG_NAME, COMM_SRC, COMM_DST, "names")}
    for x in unwritten:
        got = pred.columns(x, ts.paths[x])
        buf = pred(x)
        want = decode_columns([buf], [ts.paths[x]], WANT_ATTRS)
        assert got.paths == want.paths and got.num_nodes == want.num_nodes
        # Whole nodes (a rule's message, a scalar compute model) are the predicted file's, parsed on demand.
        assert got.buf == b"" and got.messages is not None
        for i in range(want.num_nodes):
            assert got.node(i).SerializeToString() == want.node(i).SerializeToString(), (x, i)
        for a in _ARRAYS:
            assert np.array_equal(getattr(got, a), getattr(want, a)), (x, a)
        assert got.names == want.names, x
        assert sorted(got.attrs) == sorted(want.attrs)
        for name in want.attrs:
            assert _values(got, name) == _values(want, name), (x, name)
        # The labels did change: the representative's columns alone would not pass.
        r = pred.fold.replicas[0][pred.ctx.where[x][1]]
        rep = pred.rep_columns[r]
        for name in changed:
            if name == "names":
                changed[name] += rep.names != want.names
            elif name in want.attrs:
                changed[name] += _values(rep, name) != _values(want, name)
    # Every derived rank has its own device group; the P2P peers, group names and node names change too.
    assert changed == {DEVICE_GROUP: 6, PG_NAME: 6, COMM_SRC: 6, COMM_DST: 6, "names": 6}


def test_the_reader_decodes_only_the_written_files(compact, monkeypatch):
    """ColumnReader with the derived ranks: written files decoded in batches, the others never read."""
    ts = discover(compact / "c", compact=True)
    pgs = load_groups(ts, None, scan=True)
    pred = compact_source(ts, pgs, DurationModel(), ReplayConfig(), columns=True)
    src = ts.with_source(pred)
    read: list[int] = []
    real = type(src).read
    monkeypatch.setattr(type(src), "read", lambda self, r: read.append(r) or real(self, r))
    reader = ColumnReader(src, pred)
    for r in range(ts.num_ranks):
        cols, f = reader.get(r)
        assert cols.paths[f] == ts.paths[r]
    assert sorted(read) == sorted(ts.written)
