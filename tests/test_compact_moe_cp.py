"""Compact sets of expert- and context-parallel plans (issue 28): the class unit is a block of lcm(ep, cp)
DP replicas (whole EP groups and CP rings), written once; the compact set's replay, folded by construction,
gives the tables of the set with every rank, table for table."""

from __future__ import annotations

from pathlib import Path

import pytest
from xsim.tracegen.compact import rank_classes, replica_block
from xsim.tracegen.spec import load_spec

from xsim import api

TABLES = ("ops.csv", "ranks.csv", "collectives.csv", "summary.csv")
# Tokens per expert routed by EP ranks 0..3 (8 tokens x top-2 = 16 a row): skewed, so the EP ranks of one
# group run different programs and replica 4 (EP rank 0 of the second group) matches only replica 0.
TABLE = [
    [4, 4, 2, 2, 1, 1, 1, 1],
    [2, 2, 2, 2, 2, 2, 2, 2],
    [0, 0, 0, 0, 8, 8, 0, 0],
    [1, 1, 1, 1, 1, 1, 5, 5],
]
MOE_MODEL = {
    "name": "tiny-moe", "layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "vocab": 256, "seq_len": 8,
    "moe": {"experts": 8, "top_k": 2, "expert_ffn": 32, "routing": {"tokens": TABLE}},
}  # fmt: skip
# hidden 64, 4 heads of 16, seq 32 over cp 4: 8 tokens per rank, causal chunks of 4
CP_MODEL = {
    "name": "tiny",
    "layers": 2,
    "hidden": 64,
    "ffn_hidden": 128,
    "heads": 4,
    "vocab": 256,
    "seq_len": 32,
}

SPECS = {
    # PP 2 x DP 8 = 16 ranks; EP 4 carved out of DP: EP groups = replicas {0..3} and {4..7}
    "ep": {"name": "ep", "model": MOE_MODEL, "schedule": "1f1b", "micro_batches": 2,
           "parallel": {"gpu": "H100", "pp": 2, "dp": 8, "ep": 4}},
    # DP 2 x CP 4 = 8 replicas of one rank: two rings of 4, the ring form (4 P2P exchanges a layer)
    "cp": {"name": "cp", "model": CP_MODEL, "attention": "flash", "micro_batches": 2,
           "parallel": {"gpu": "H100", "dp": 2, "cp": 4}},
    # the all-gather form (Llama 3), TP 2: CP groups of 4, two of them
    "cpag": {"name": "cpag", "model": CP_MODEL, "attention": "flash", "micro_batches": 2,
             "cp_comm_type": "all_gather", "parallel": {"gpu": "H100", "tp": 2, "dp": 2, "cp": 4}},
}  # fmt: skip


def test_the_class_unit_is_a_block_of_whole_ep_groups_and_cp_rings():
    ep = load_spec(SPECS["ep"])
    assert replica_block(ep) == 4
    c = rank_classes(ep, rewrite=True)
    # The parallel: block's default order: stage s of replica d is rank 2 d + s; block b = replicas 4b..4b+3.
    assert c.replicas == (tuple(range(8)), tuple(range(8, 16)))
    # device group ids d + 8 s (one rank each): block 1 holds replicas 4..7's
    assert c.device_groups == ((0, 8, 1, 9, 2, 10, 3, 11), (4, 12, 5, 13, 6, 14, 7, 15))
    cp = load_spec(SPECS["cp"])
    assert replica_block(cp) == 4 and rank_classes(cp, rewrite=True).replicas == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert replica_block(load_spec({**SPECS["ep"], "parallel": {**SPECS["ep"]["parallel"], "ep": 8}})) == 8
    # One EP group holding every replica (DP 8, EP 8): nothing to fold, every rank is written.
    one = load_spec({**SPECS["ep"], "parallel": {"gpu": "H100", "pp": 2, "dp": 8, "ep": 8}})
    assert rank_classes(one, rewrite=True) is None
    # EP 2 with CP 2 over DP 2 x CP 2 = 4 replicas: lcm 2, two blocks
    both = load_spec(
        {**SPECS["cp"], "model": {**MOE_MODEL, "seq_len": 32, "moe": {**MOE_MODEL["moe"], "routing": "uniform"}},
         "parallel": {"gpu": "H100", "dp": 2, "cp": 2, "ep": 2}}
    )  # fmt: skip
    assert replica_block(both) == 2 and len(rank_classes(both, rewrite=True).replicas) == 2


def _replay(path: Path, out: Path, fold: bool) -> dict:
    run = api.simulate(str(path), api.ReplayOptions(fold=fold, progress=False))
    api.write_outputs(run, api.OutputOptions(out=str(out)))
    return run.result.perf_dict()


@pytest.mark.parametrize("key", list(SPECS))
def test_compact_and_every_rank_replays_are_table_for_table_equal(tmp_path, key):
    spec = SPECS[key]
    compact = api.generate(spec, api.GenerateOptions(out=str(tmp_path / "c")))
    every = api.generate(spec, api.GenerateOptions(out=str(tmp_path / "a"), all_ranks=True))
    ranks = {"ep": 16, "cp": 8, "cpag": 16}[key]
    assert compact.classes is not None and len(compact.paths) == ranks // 2 and len(every.paths) == ranks
    perf = _replay(tmp_path / "c", tmp_path / "rc", fold=True)
    assert perf["fold"] == "folded", perf["fold_reason"]
    assert perf["fold_reason"] == "2 replicas alike by construction (classes.json)"
    assert perf["fold_factor"] == 2 and perf["ranks_simulated"] == ranks // 2
    _replay(tmp_path / "a", tmp_path / "ra", fold=False)
    _replay(tmp_path / "c", tmp_path / "rcn", fold=False)  # the unwritten ranks derived from block 0's
    for other in ("ra", "rcn"):
        for name in TABLES:
            assert (tmp_path / "rc" / name).read_bytes() == (tmp_path / other / name).read_bytes(), (
                other,
                name,
            )
    assert len((tmp_path / "rc" / "ranks.csv").read_text().splitlines()) == 1 + ranks
