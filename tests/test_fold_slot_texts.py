"""A folded rank's labels by construction hold its P2P names per renamed peer and make them when read
(replay/fold.py, _SlotTexts; docs/performance.md, round 24t): each name equals the one predicted from the
representative's file the byte way, and `renamed` says exactly when it differs from the representative's."""

from __future__ import annotations

from pathlib import Path

from xsim.replay.compute import DurationModel
from xsim.replay.config import ReplayConfig
from xsim.replay.fold import RankLabels, _by_construction, _Ctx, _predict, _templates, resolve_fold, verify
from xsim.replay.program import build_program
from xsim.replay.simulation import RepColumns, load_groups
from xsim.traces.traceset import discover

from xsim import api

# Narayanan's 1T plan's shape (TP 8 x PP 64 x DP 6, Table 1) shrunk: TP 2 x PP 2 x DP 3, two micro-batches.
SPEC = {
    "name": "slots",
    "model": {"name": "m", "layers": 4, "hidden": 256, "ffn_hidden": 1024, "heads": 8, "kv_heads": 8,
              "vocab": 1024, "seq_len": 128},
    "seq_len": 128,
    "schedule": "1f1b",
    "parallel": {"gpu": "A100-80GB", "tp": 2, "pp": 2, "dp": 3, "micro_batch": 1, "global_batch": 6},
    "recompute": "full",
    "cluster": "dgx-a100",
}  # fmt: skip


def test_names_by_construction_equal_the_byte_predictions(tmp_path: Path) -> None:
    api.generate(SPEC, api.GenerateOptions(out=str(tmp_path / "set")))
    ts = discover(str(tmp_path / "set"), compact=True)
    plan = resolve_fold("auto", ts)
    assert plan is not None and plan.by_construction and plan.factor == 6  # DP replicas x TP positions
    pgs = load_groups(ts, None, scan=True)
    reps = RepColumns(ts, plan.replicas[0])
    config = ReplayConfig()
    prog = build_program(
        ts, pgs, DurationModel(), config, release=False, ranks=plan.replicas[0], columns=reps.get
    )
    files = reps.files()
    labels = verify(plan, ts, pgs, prog, files)
    ctx = _Ctx(plan, pgs)
    by_members, templates = _templates(ctx, prog, files)
    checked = renamed = 0
    for k in range(1, plan.factor):
        for i, (x, r) in enumerate(zip(plan.replicas[k], plan.replicas[0], strict=True)):
            rt, lo = templates[i], prog.rank_offset[i]
            want = RankLabels()
            assert _predict(ctx, k, x, r, i, rt, prog, by_members, want, {}, {}) is not False
            got = labels[x]
            assert dict(got.names) == dict(want.names)  # the strings the byte way makes, per node
            assert dict(got.pg_names) == dict(want.pg_names) and dict(got.keys) == dict(want.keys)
            again = RankLabels()
            assert _by_construction(ctx, k, x, r, rt, by_members, again, {})
            texts = again.names._names if rt.name_nodes else None
            for j, sl in zip(rt.name_nodes, rt.name_slots, strict=True):
                differs = texts[sl] != prog.name[lo + j]
                assert texts.renamed(sl, plan.dp_replicas.get(r)) == differs
                checked += 1
                renamed += differs
    assert checked > 20 and renamed == checked  # every folded rank's P2P peers are other ranks
