"""Replay memory per node (issue 24): node and process-group names held once per distinct string, as int32
codes, and the engine's waits as an int64 array, with the same values as the strings and waits they replace.

The bundled tiny pipeline (4 ranks) repeats its op names on every rank: names are counted here by hand from
the decoded nodes, independently of the builder, and the codes must decode to them node for node.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
from xsim.replay import ReplayConfig
from xsim.replay.engine import _int64_or_list, _shared_ints, run_engine
from xsim.replay.program import NodeStrings, build_program, strings_series
from xsim.replay.simulation import ColumnReader, load_groups
from xsim.traces.traceset import discover

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "traces" / "examples" / "tiny_pipeline"


def _program():
    ts = discover(TINY)
    groups = load_groups(ts, None, scan=True)
    prog = build_program(ts, groups, None, ReplayConfig(), columns=ColumnReader(ts).get, release=False)
    return ts, prog


def test_names_are_codes_into_distinct_strings() -> None:
    ts, prog = _program()
    # The names node by node as protobuf decodes them: ranks in order, nodes in ascending id.
    expect = [n.name for r in range(ts.num_ranks) for n in sorted(ts.load(r).nodes, key=lambda n: n.id)]
    assert isinstance(prog.name, NodeStrings) and prog.name.codes.dtype == np.int32
    assert list(prog.name) == expect
    assert sorted(prog.name.table) == sorted(set(expect))  # each distinct name held once
    assert [prog.name[g] for g in range(len(expect))] == expect
    assert strings_series(prog.name).to_list() == expect
    # pg_name: None (code -1) off communication nodes, the trace's string on collectives.
    pg = list(prog.pg_name)
    assert prog.pg_name.codes.dtype == np.int32 and len(set(prog.pg_name.table)) == len(prog.pg_name.table)
    assert [g for g, v in enumerate(pg) if v is not None] == sorted(
        set(prog.coll) | {g for g in prog.p2p if pg[g] is not None}
    )
    assert strings_series(prog.pg_name).to_list() == pg
    assert strings_series(["a", None]).equals(pl.Series(["a", None], dtype=pl.String))


def test_engine_waits_are_int64() -> None:
    _ts, prog = _program()
    out = run_engine(prog, None, ReplayConfig(comm_mode="measured"))  # collectives by recorded time
    assert isinstance(out.wait, np.ndarray) and out.wait.dtype == np.int64
    assert len(out.wait) == prog.num_nodes and (out.wait >= 0).all()


def test_a_wait_past_int64_stays_a_list_of_ints() -> None:
    """A wait past int64 (a corrupt duration, refused after the run) is kept exact, as Python ints."""
    fits = _int64_or_list([0, 5, (1 << 63) - 1])
    assert isinstance(fits, np.ndarray) and fits.dtype == np.int64 and fits.tolist() == [0, 5, (1 << 63) - 1]
    past = [0, 5, 1 << 63]
    assert _int64_or_list(past) is past


def test_engine_durations_share_one_int_per_value() -> None:
    """The loop's duration list: the same values as tolist(), one int object per distinct value."""
    a = np.asarray([1000, -1, 7_000_000, 1000, 7_000_000, 1000, 0], dtype=np.int64)
    got = _shared_ints(a)
    assert got == a.tolist()
    assert len({id(x) for x in got}) == 4
    assert _shared_ints(np.zeros(0, dtype=np.int64)) == []
