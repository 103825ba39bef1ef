"""`xsim validate` checks that --real is the replayed run before comparing (issue 26 item 3); no NaN."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import polars as pl
import pytest
from xsim.replay import ReplayError
from xsim.replay.validate import (
    MIN_MATCHED,
    Validation,
    Window,
    _identity,
    _match_rank,
    parse_window,
    validate,
)

from tests.test_validate_pytorch import EX, _run
from xsim.cli import main


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ident")
    ts, kin = _run(tmp, "tinygpt_2rank", 2)
    one_ts, one_kin = _run(tmp, "tinygpt_1rank", 1)
    return tmp, ts, kin, one_ts, one_kin


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _kineto_copy(src: str, dst: Path, edit) -> str:
    with gzip.open(src, "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    edit(doc)
    dst.write_text(json.dumps(doc))
    return str(dst)


def test_own_run_matches_every_op(ddp) -> None:
    tmp, ts, kin, *_ = ddp
    v = validate(kin, tmp / "tinygpt_2rank_res", ts)
    # Every imported op of each rank is found in its own Kineto trace at its recorded start.
    assert v.matched == ((0, 4172, 4172), (1, 4172, 4172))
    assert v.to_json()["matched_ops"][0] == {"rank": 0, "matched": 4172, "compared": 4172}


def test_another_runs_kineto_is_refused(ddp, capsys) -> None:
    tmp, ts, kin, *_ = ddp
    other = [str(EX / f"tinygpt_pp2_kineto.{r}.json.gz") for r in range(2)]
    argv = ["validate", "--real", *other, "--sim", str(tmp / "tinygpt_2rank_res"), "--trace", ts.prefix]
    assert main(argv) == 2
    line = _one_line(capsys)
    # The import recorded the processes of its Kineto traces: 6784 and 6785, not the pipeline run's.
    assert "tinygpt_pp2_kineto.0.json.gz: recorded by process 24313" in line and "process 6784" in line


def test_matched_op_fraction_refuses_a_stranger_without_recorded_pids(ddp) -> None:
    # An import older than the recorded pids and origins: the matched-op fraction alone tells the runs apart
    # (the pipeline run's rank 0 has 3 of the 4,172 ops at the same relative start).
    tmp, ts, kin, *_ = ddp
    from xsim.traces.kineto import load_kineto

    other = load_kineto(str(EX / "tinygpt_pp2_kineto.0.json.gz"))
    with pytest.raises(ReplayError, match=r"rank 0: only \d+ of 4172 ops .* at least 90% needed"):
        _match_rank(ts.load(0).nodes, other, None, other.path, 0, ts.prefix)
    own = load_kineto(kin[0])
    assert len(_match_rank(ts.load(0).nodes, own, None, own.path, 0, ts.prefix).found) == 4172
    assert MIN_MATCHED == 0.90


def test_ranks_must_be_one_file_each(ddp, capsys) -> None:
    tmp, ts, kin, *_ = ddp
    res = str(tmp / "tinygpt_2rank_res")
    assert main(["validate", "--real", kin[0], "--sim", res, "--trace", ts.prefix]) == 2
    assert "1 Kineto trace(s) for the 2-rank trace set" in _one_line(capsys)
    assert main(["validate", "--real", kin[0], kin[0], "--sim", res, "--trace", ts.prefix]) == 2
    assert "ranks [0, 0]" in _one_line(capsys)


def test_steps_must_be_the_traces(ddp, tmp_path, capsys) -> None:
    tmp, ts, kin, *_ = ddp

    def renumber(doc):
        for e in doc["traceEvents"]:
            if str(e.get("name", "")).startswith("ProfilerStep#"):
                e["name"] = "ProfilerStep#" + str(int(e["name"].split("#")[1]) + 6)

    k0 = _kineto_copy(kin[0], tmp_path / "k0.json", renumber)
    argv = ["validate", "--real", k0, kin[1], "--sim", str(tmp / "tinygpt_2rank_res"), "--trace", ts.prefix]
    assert main(argv) == 2
    line = _one_line(capsys)
    assert (
        "rank 0: the trace set's step(s) 1, 2 are not in this Kineto trace (its ProfilerStep#: 7, 8)" in line
    )


def test_no_nan_in_text_or_json(tmp_path, capsys) -> None:
    empty = pl.DataFrame(
        schema={"rank": pl.Int32, "step": pl.Int64, "measured_ns": pl.Int64, "simulated_ns": pl.Int64}
    ).with_columns(error_pct=pl.lit(None, pl.Float64))
    layers = pl.DataFrame(
        {"layer": [0], "measured_ns": [0], "simulated_ns": [5], "error_pct": [None]},
        schema={
            "layer": pl.Int64,
            "measured_ns": pl.Int64,
            "simulated_ns": pl.Int64,
            "error_pct": pl.Float64,
        },
    )
    classes = layers.rename({"layer": "op_class"}).with_columns(pl.col("op_class").cast(pl.String))
    v = Validation(layers, classes, empty)
    assert v.step_error_pct() is None
    v.save(tmp_path, plot=False)
    text = (tmp_path / "validation.json").read_text()
    assert "NaN" not in text and json.loads(text)["step_error_pct"] is None
    from xsim.cmd_validate import fmt_pct

    assert fmt_pct(None) == fmt_pct(math.nan) == "n/a"


def test_window_for_traces_without_profiler_steps(ddp, tmp_path, capsys) -> None:
    tmp, _, _, ts, kin = ddp

    def drop_steps(doc):
        doc["traceEvents"] = [
            e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("Profiler")
        ]

    k = _kineto_copy(kin[0], tmp_path / "k.json", drop_steps)
    res = str(tmp / "tinygpt_1rank_res")
    # The import's steps are in the trace set, but this Kineto copy has none: refused, naming --window.
    assert main(["validate", "--real", k, "--sim", res, "--trace", ts.prefix]) == 2
    assert "--window matched" in _one_line(capsys)
    v = validate([k], res, ts, parse_window("matched"))
    # One step, 0: from the first to the last matched op, measured on the Kineto clock.
    assert v.steps["step"].to_list() == [0]
    k0 = __import__("xsim.traces.kineto", fromlist=["load_kineto"]).load_kineto(kin[0])
    whole = min(e.ts for e in k0.steps.values()), max(e.end for e in k0.steps.values())
    measured = int(v.steps["measured_ns"][0])
    assert 0.95 * (whole[1] - whole[0]) < measured  # the window holds both profiled steps
    # A time range holds fewer ops than the whole run.
    part = validate([k], res, ts, parse_window("0ms:20ms"))
    assert part.steps["measured_ns"][0] < measured
    assert int(part.layers["measured_ns"].sum()) < int(v.layers["measured_ns"].sum())
    # An op range: the first 1,000 node ids hold fewer ops than the whole run, and more than the first 100.
    small, large = (validate([k], res, ts, parse_window(f"ops:0:{n}")) for n in (100, 1000))
    assert (
        0
        < small.layers["simulated_ns"].sum()
        < large.layers["simulated_ns"].sum()
        < v.layers["simulated_ns"].sum()
    )
    assert main(["validate", "--real", k, "--sim", res, "--trace", ts.prefix, "--window", "matched"]) == 0
    assert "step-time error " in capsys.readouterr().out


def test_window_parse() -> None:
    assert parse_window("matched") == Window(matched=True)
    assert parse_window("1ms:2ms") == Window(1_000_000, 2_000_000)
    assert parse_window(":5us") == Window(0, 5_000)
    assert parse_window("3s:") == Window(3_000_000_000, None)
    assert parse_window("ops:10:20") == Window(ops=(10, 20))
    for bad in ("5ms", "2ms:1ms", "x:y", "ops:5", "ops:9:3"):
        with pytest.raises(ReplayError, match="--window"):
            parse_window(bad)


def test_identity_order_follows_kineto_ranks(ddp) -> None:
    tmp, ts, kin, *_ = ddp
    kins, origins = _identity(ts, [kin[1], kin[0]])
    assert [k.rank for k in kins] == [0, 1] and origins[0] == origins[1] is not None
