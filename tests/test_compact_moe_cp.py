"""Compact sets of expert- and context-parallel plans (issue 28): the class unit is a block of lcm(ep, cp)
DP replicas (whole EP groups and CP rings), written once, or rank classes (CP positions of the all-gather
form; EP positions under a routing that loads every EP rank alike); the compact set's replay, folded by
construction, gives the tables of the set with every rank, table for table."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from xsim.tracegen.compact import ep_alike, rank_classes, replica_block
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
UNIFORM_MODEL = {**MOE_MODEL, "moe": {**MOE_MODEL["moe"], "routing": "uniform"}}
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
    # the all-gather form with pipeline stages: TP 2 x CP 4 x PP 2 x DP 2 = 32 ranks, rank classes of
    # (data replica, CP position, TP position): one rank per stage written
    "cpag_pp": {"name": "cpagpp", "model": CP_MODEL, "attention": "flash", "micro_batches": 2, "schedule": "1f1b",
                "cp_comm_type": "all_gather", "parallel": {"gpu": "H100", "tp": 2, "pp": 2, "dp": 2, "cp": 4}},
    # The ring form with TP (Megatron-Bridge's Llama 3.1 405B rows scaled down: FP8 current scaling, FP8
    # parameters, sequence parallelism, userbuffers overlap, the distributed optimizer, interleaving):
    # TP 2 x CP 2 x PP 2 (VP 2) x DP 2 = 16 ranks, order tp-dp-pp (the CP index fastest among the DP
    # replicas), 6 + 2 layers (embedding and loss in the split) = 2 stages x 2 chunks x 2. The CP positions
    # stay whole (ring), the TP positions fold: 2 CP blocks x 2 TP positions = 4 rank classes, entry 0 the
    # CP block's TP-0 ranks of both stages (2 x 2 = 4 files written)
    "cp_ring_tp": {
        "name": "cpring", "cluster": "dgx-h100", "seq_len": 4096,
        "model": {"name": "tiny", "layers": 6, "hidden": 256, "ffn_hidden": 512, "heads": 4, "kv_heads": 2,
                  "vocab": 512, "seq_len": 4096, "tie_embeddings": False, "position_embedding": "rope"},
        "precision": "fp8", "fp8_recipe": "current", "fp8_params": True, "attention": "flash",
        "framework": "megatron-core", "sequence_parallel": True, "cp_comm_type": "p2p", "loss_impl": "te",
        "dropout": False, "attention_dropout": 0.0, "check_for_nan_in_grad": False, "grad_reduce_dtype": "bf16",
        "distributed_optimizer": True, "overlap_grad_reduce": True, "overlap_param_gather": True,
        "overlap_param_gather_with_optimizer_step": True, "tp_comm_overlap": True,
        "tp_overlap_sms": {"proj_fprop": 1, "fc2_fprop": 1, "qkv_wgrad": 24, "fc1_wgrad": 2},
        "parallel": {"gpu": "H100", "tp": 2, "pp": 2, "dp": 2, "cp": 2, "micro_batch": 1, "global_batch": 8,
                     "virtual_stages": 2, "order": "tp-dp-pp", "account_for_embedding_in_pipeline_split": True,
                     "account_for_loss_in_pipeline_split": True},
    },
    # PP 2 x DP 8, EP 4 under uniform routing (8 tokens x top-2 / 8 experts = 2 copies each): every EP rank
    # alike, rank classes of (EP block, EP position); Megatron-Bridge's order tp-dp-pp puts each stage on
    # one node, so the DP gradient AllReduce finishes its members together and the fold holds
    "ep_uniform": {"name": "epu", "model": UNIFORM_MODEL, "schedule": "1f1b", "micro_batches": 2,
                   "parallel": {"gpu": "H100", "pp": 2, "dp": 8, "ep": 4, "order": "tp-dp-pp"}},
    # The same in the parallel: block's default order (stage s of replica d is rank 2 d + s): each stage's DP
    # group spans both nodes, its AllReduce finishes rank 3 (EP position 1) apart from rank 1, the network
    # check refuses the rank classes and the replay folds the set's two EP blocks instead
    "ep_uniform_spread": {"name": "epu", "model": UNIFORM_MODEL, "schedule": "1f1b", "micro_batches": 2,
                          "parallel": {"gpu": "H100", "pp": 2, "dp": 8, "ep": 4}},
    # TP 2 x PP 2 x DP 4, EP 4 with expert TP 1 (the Qwen3-235B row's form): an EP group spans 2 replicas
    # x 2 TP positions; rank classes of (EP block, EP position, TP position)
    "ep_etp1": {"name": "epe", "model": {**UNIFORM_MODEL, "seq_len": 16}, "schedule": "1f1b", "micro_batches": 2,
                "sequence_parallel": True,
                "parallel": {"gpu": "H100", "tp": 2, "pp": 2, "dp": 4, "ep": 4, "etp": 1, "order": "tp-dp-pp"}},
    # TP 2 = EP 2 under expert TP 1, skewed table: the TP ranks are EP ranks 0 and 1 of different loads,
    # so they are not TP classes; the two DP replicas are (the block is one replica)
    "ep_tp_skew": {"name": "eps", "model": {**MOE_MODEL, "seq_len": 16}, "micro_batches": 2,
                   "sequence_parallel": True, "parallel": {"gpu": "H100", "tp": 2, "dp": 2, "ep": 2, "etp": 1}},
}  # fmt: skip
# Per spec: (ranks, files written, fold factor, what the fold reason counts, ranks simulated). The
# all-gather form folds CP positions as rank classes (data replica x CP position x TP position, one rank
# per stage written); the ring and EP plans keep blocks of lcm(ep, cp) replicas (two blocks). cpag's rank
# classes are refused by the network check (the analytical model finishes the DP gradient AllReduce over
# ranks 0, 2, .., 14 at different instants per member: rank 2, CP position 1, before rank 0), so it folds
# by its two data replicas (8 ranks simulated), still table for table equal.
EXPECT = {
    "ep": (16, 8, 2, "2 replicas", 8),
    "cp": (8, 4, 2, "2 replicas", 4),
    "cpag": (16, 1, 2, "2 replicas", 8),
    "cpag_pp": (32, 2, 16, "16 rank classes", 2),
    "cp_ring_tp": (16, 4, 4, "4 rank classes", 4),
    "ep_uniform": (16, 2, 8, "8 rank classes", 2),
    "ep_uniform_spread": (16, 2, 2, "2 replicas", 8),
    "ep_etp1": (16, 2, 8, "8 rank classes", 2),
    "ep_tp_skew": (4, 2, 2, "2 replicas", 2),
}


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
    ranks, written, factor, what, simulated = EXPECT[key]
    assert compact.classes is not None and len(compact.paths) == written and len(every.paths) == ranks
    perf = _replay(tmp_path / "c", tmp_path / "rc", fold=True)
    assert perf["fold"] == "folded", perf["fold_reason"]
    assert perf["fold_reason"] == f"{what} alike by construction (classes.json)"
    assert perf["fold_factor"] == factor and perf["ranks_simulated"] == simulated
    _replay(tmp_path / "a", tmp_path / "ra", fold=False)
    _replay(tmp_path / "c", tmp_path / "rcn", fold=False)  # the unwritten ranks derived from block 0's
    for other in ("ra", "rcn"):
        for name in TABLES:
            assert (tmp_path / "rc" / name).read_bytes() == (tmp_path / other / name).read_bytes(), (
                other,
                name,
            )
    assert len((tmp_path / "rc" / "ranks.csv").read_text().splitlines()) == 1 + ranks


def test_all_gather_cp_positions_are_rank_classes_and_the_ring_keeps_blocks(tmp_path):
    from xsim.replay.fold import _Ctx, make_fold
    from xsim.traces.classes import read_classes, write_classes
    from xsim.traces.groups import ProcessGroups

    dep = load_spec(SPECS["cpag_pp"])
    c = rank_classes(dep, rewrite=True)
    # The parallel: block's default order: stage s of DP replica d (= data replica d // 4, CP position
    # d % 4) is TP group [4 d + 2 s, 4 d + 2 s + 1]; entry k = 2 d + t holds TP position t of both stages.
    assert (c.tp, c.cp, len(c.replicas)) == (2, 4, 16)
    assert c.replicas[:3] == ((0, 2), (1, 3), (4, 6)) and c.replicas[15] == (29, 31)
    write_classes(str(tmp_path), c)
    assert read_classes(str(tmp_path), str(tmp_path / "cpagpp")) == c
    assert '"cp_positions":4' in (tmp_path / "classes.json").read_text()
    # The ring form's neighbours map onto each other only under rotations: its CP positions stay whole,
    # its TP positions fold (2 CP blocks of 4 replicas x 2 TP positions, 8 ranks an entry: 4 CP x 2 stages).
    ring = load_spec({**SPECS["cpag_pp"], "cp_comm_type": "p2p"})
    rc = rank_classes(ring, rewrite=True)
    assert (rc.tp, rc.cp, len(rc.replicas), len(rc.replicas[0])) == (2, 1, 4, 8)
    # Without TP the ring form keeps whole blocks of cp replicas.
    assert rank_classes(load_spec(SPECS["cp"]), rewrite=True).tp == 1
    # pi_13 (data replica 1, CP position 2, TP position 1) swaps each coordinate with 0 on its own:
    # rank 0 (0, 0, 0, stage 0) -> (1, 2, 1) = DP replica 6: 4*6 + 1 = 25; rank 26 (1, 2, 0, stage 1) ->
    # (0, 0, 1, stage 1) = 3; rank 13 (0, 3, 1, stage 0) -> (1, 3, 0) = DP replica 7: 28.
    fold = replace(make_fold(c.replicas, 32, "test"), tp=2, cp=4)
    cp_group, dp_group = (0, 4, 8, 12), tuple(range(0, 32, 4))
    ctx = _Ctx(fold, ProcessGroups(32, {"cp": cp_group, "dp": dp_group}))
    assert [ctx.perm(13, r) for r in (0, 26, 13)] == [25, 3, 28]
    # Rank 0's CP group: onto itself under a CP swap, onto data replica 1's under pi_8: copies.
    assert ctx.image(2, cp_group) == frozenset(cp_group) and ctx.image(8, cp_group) == {16, 20, 24, 28}
    # The DP gradient group (CP folded into it, every DP replica's stage-0 TP-0 rank): onto itself under
    # a CP or data-replica swap, onto TP position 1's group under pi_1.
    assert ctx.image(2, dp_group) == ctx.image(8, dp_group) == frozenset(dp_group)
    assert ctx.image(1, dp_group) == frozenset(range(1, 32, 4))
    assert ctx.group_class("cp", cp_group) == "partial" and ctx.group_class("dp", dp_group) == "partial"


def _routed(routing, seq: int = 8, ep: int = 4) -> object:
    """A PP 2 x DP 8 plan of the tiny MoE model with `routing`, EP `ep` (8 tokens a micro-batch at seq 8)."""
    model = {**MOE_MODEL, "seq_len": seq, "moe": {**MOE_MODEL["moe"], "routing": routing}}
    return load_spec(
        {**SPECS["ep_uniform"], "model": model, "parallel": {**SPECS["ep_uniform"]["parallel"], "ep": ep}}
    )


def test_ep_positions_are_alike_when_every_ep_rank_gets_the_same_share():
    # Uniform: 8 tokens x top-2 = 16 copies over 8 experts, 2 each; EP 4 ranks hold 2 experts: 4 each.
    assert ep_alike(_routed("uniform"))
    # Uniform with 6 tokens: 12 copies, 1.5 an expert; largest remainders give experts 0-3 two copies and
    # 4-7 one, so EP ranks 0, 1 receive 4 a source and ranks 2, 3 receive 2 (EP 2: 8 vs 4): not alike.
    assert not ep_alike(_routed("uniform", seq=6)) and not ep_alike(_routed("uniform", seq=6, ep=2))
    # One table row for every source, each pair of experts summing to 4: alike though not uniform.
    assert ep_alike(_routed({"tokens": [[4, 0, 2, 2, 1, 3, 3, 1]]}))
    # Experts 0-3 get 8 copies, 4-7 get 8: alike at EP 2 (4 experts a rank); at EP 4, 8/0/4/4: not.
    row = [[8, 0, 0, 0, 2, 2, 2, 2]]
    assert ep_alike(_routed({"tokens": row}, ep=2)) and not ep_alike(_routed({"tokens": row}))
    # Two rows, each giving every EP rank 4 copies: the sources route differently, so the generator sends
    # P2P pairs (tracegen.moe_ops.even_bytes), which only rotations of EP positions map onto each other.
    assert not ep_alike(_routed({"tokens": [[4, 0, 2, 2, 1, 3, 3, 1], [0, 4, 2, 2, 3, 1, 1, 3]]}))
    # A seeded Zipf draw is skewed; padded to capacity ceil(16 / 8 x 1.0) = 2 copies an expert it is not.
    zipf = {"distribution": "zipf", "skew": 1.2, "seed": 3}
    assert not ep_alike(_routed(zipf))
    model = {
        **MOE_MODEL,
        "moe": {**MOE_MODEL["moe"], "routing": zipf, "capacity_factor": 1.0, "pad_to_capacity": True},
    }
    assert ep_alike(load_spec({**SPECS["ep_uniform"], "model": model}))
    # Skewed plans keep blocks (the module's first test); uniform ones are rank classes.
    assert rank_classes(_routed({"tokens": row}), rewrite=True).ep == 1
    assert rank_classes(_routed("uniform"), rewrite=True).ep == 4


def test_ep_positions_are_rank_classes_of_block_position_and_tp_position(tmp_path):
    from xsim.replay.fold import _Ctx, make_fold
    from xsim.traces.classes import read_classes, write_classes
    from xsim.traces.errors import TraceSetError
    from xsim.traces.groups import ProcessGroups

    c = rank_classes(load_spec(SPECS["ep_etp1"]), rewrite=True)
    # Order tp-dp-pp: stage s of DP replica d is TP group [2 d + 8 s, 2 d + 8 s + 1]; entry k = 2 d + t
    # holds TP position t of both stages; EP positions E = ep / tp = 2 replicas an EP group spans.
    assert (c.tp, c.cp, c.ep, len(c.replicas)) == (2, 1, 2, 8)
    assert c.replicas[:3] == ((0, 8), (1, 9), (2, 10)) and c.replicas[7] == (7, 15)
    write_classes(str(tmp_path), c)
    assert read_classes(str(tmp_path), str(tmp_path / "epe")) == c
    doc = (tmp_path / "classes.json").read_text()
    assert '"ep_positions":2' in doc and '"TP and EP position 0 of EP block 0"' in doc
    # pi_7 = (EP block 1, EP position 1, TP position 1): rank 0 (0, 0, 0, stage 0) -> DP replica 3's TP
    # rank 1 = 7; rank 10 (0, 1, 0, stage 1) -> (1, 0, 1) = DP replica 2's = 13.
    fold = replace(make_fold(c.replicas, 16, "test"), tp=2, ep=2)
    ep_group, edp_group = (0, 1, 2, 3), (0, 4)  # stage 0's first EP group; EP slot 0's expert-DP group
    ctx = _Ctx(fold, ProcessGroups(16, {"ep": ep_group, "edp": edp_group}))
    assert [ctx.perm(7, r) for r in (0, 10)] == [7, 13]
    # The EP group: onto itself under the EP and TP swaps (it spans both), onto block 1's under pi_4.
    assert ctx.image(1, ep_group) == ctx.image(2, ep_group) == frozenset(ep_group)
    assert ctx.image(4, ep_group) == {4, 5, 6, 7}
    # The expert-DP group (EP slot 0 of both blocks): onto itself under the block swap, copied per slot.
    assert ctx.image(4, edp_group) == frozenset(edp_group) and ctx.image(3, edp_group) == {3, 7}
    assert ctx.group_class("ep", ep_group) == "partial" and ctx.group_class("edp", edp_group) == "partial"
    # A record with both CP and EP positions is named, not read.
    (tmp_path / "classes.json").write_text(
        doc.replace('"ep_positions":2', '"ep_positions":2,"cp_positions":2')
    )
    with pytest.raises(TraceSetError, match=r"cp_positions 2 with ep_positions 2"):
        read_classes(str(tmp_path), str(tmp_path / "epe"))


def test_ring_cp_folds_tp_positions_keeping_every_ring_whole():
    from xsim.replay.fold import _Ctx, make_fold
    from xsim.traces.groups import ProcessGroups

    c = rank_classes(load_spec(SPECS["cp_ring_tp"]), rewrite=True)
    # Order tp-dp-pp: stage s of DP replica d (data replica d // 2, CP position d % 2) is TP group
    # [2 d + 8 s, 2 d + 8 s + 1]. Entry k = 2 b + t holds TP position t of CP block b (DP replicas 2b, 2b+1)
    # for both CP positions and both stages, in the order (replica 2b: stage 0, 1; replica 2b + 1: 0, 1):
    # entry 0 = (0, 8, 2, 10), entry 3 (block 1, TP 1) = (2*2 + 1, 4 + 1 + 8, 6 + 1, 6 + 1 + 8).
    assert (c.tp, c.cp, c.ep) == (2, 1, 1)
    assert c.replicas == ((0, 8, 2, 10), (1, 9, 3, 11), (4, 12, 6, 14), (5, 13, 7, 15))
    assert c.written == (0, 8, 2, 10)
    # Device groups of the parallel: block (id = replica + 4 stage): entry 0's ranks sit in 0, 4, 1, 5.
    assert c.device_groups[0] == c.device_groups[1] == (0, 4, 1, 5)
    fold = replace(make_fold(c.replicas, 16, "test"), tp=2)
    ring0, tp0, dp0 = (0, 2), (0, 1), (0, 2, 4, 6)  # stage 0: TP 0's CP ring, a TP group, the DP-CP group
    ctx = _Ctx(fold, ProcessGroups(16, {"cp": ring0, "tp": tp0, "dp": dp0}))
    # pi_1 (TP swap) sends rank 0 -> 1 and its ring peer 2 -> 3: TP position 1's ring, peers kept; pi_2
    # (block swap) sends the ring onto block 1's (4, 6); pi_3 onto (5, 7).
    assert [ctx.perm(k, 2) for k in (1, 2, 3)] == [3, 6, 7]
    assert [ctx.image(k, ring0) for k in (1, 2, 3)] == [{1, 3}, {4, 6}, {5, 7}]
    # The ring lies inside entry 0 (copied per entry); the TP group and the DP group have folded members.
    assert ctx.group_class("cp", ring0) == "inside"
    assert ctx.group_class("tp", tp0) == ctx.group_class("dp", dp0) == "partial"
