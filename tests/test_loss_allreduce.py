"""Megatron-LM 2021/2022 average every micro-batch's loss over the data-parallel group on the last stage
(Framework.loss_dp_allreduce): one 4 B AllReduce the backward waits for, by hand."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from xsim.replay import simulate
from xsim.tracegen import generate, load_spec
from xsim.tracegen.frameworks import FRAMEWORKS
from xsim.traces import attrs as A
from xsim.traces import pb

from xsim import api

# Two data-parallel replicas of one rank, two micro-batches each.
DP2 = {
    "model": {"name": "tiny", "layers": 2, "hidden": 1024, "ffn_hidden": 4096, "heads": 8, "vocab": 1024,
              "seq_len": 1024},
    "schedule": "1f1b", "framework": "megatron-2021", "precision": "fp16", "host_dispatch": "off",
    "parallel": {"gpu": "A100-80GB", "tp": 1, "pp": 1, "dp": 2, "micro_batch": 1, "global_batch": 4},
}  # fmt: skip


def _replay(tmp_path: Path, name: str):
    out = str(tmp_path / name)
    api.generate(load_spec({**DP2, "name": name}), api.GenerateOptions(out=out, all_ranks=True))
    return simulate(out, network=api.build_network(api.NetworkOptions(topology="switch:2:50GBps:500ns")))


def test_profiles_average_the_loss() -> None:
    assert FRAMEWORKS["megatron-2021"].loss_dp_allreduce and FRAMEWORKS["megatron-2022"].loss_dp_allreduce
    assert not FRAMEWORKS["megatron-core"].loss_dp_allreduce


def test_each_micro_batch_all_reduces_its_loss_over_dp() -> None:
    # After the loss of micro-batch k: a 4 B (FP32) AllReduce over the DP group {0, 1}; the loss's backward
    # starts after it. Without DP (one replica) there is none.
    bundle = generate(load_spec(DP2))
    for rank in (0, 1):
        nodes = bundle.nodes[rank]
        for mb in (0, 1):
            k = [n.name for n in nodes].index(f"loss_dp_allreduce.fwd.mb{mb}")
            n = nodes[k]
            assert (n.type, A.get_int(n, A.COMM_TYPE), A.get_int(n, A.COMM_SIZE)) == (
                pb.COMM_COLL_NODE,
                pb.ALL_REDUCE,
                4,
            )
            assert set(bundle.comm_groups[A.get_str(n, A.PG_NAME)]) == {0, 1}
            assert [nodes[d].name for d in n.data_deps] == [f"loss.fwd.mb{mb}"]
            assert nodes[k + 1].name == f"loss.bwd.mb{mb}" and nodes[k + 1].data_deps == [k]
    one = {**DP2, "parallel": {**DP2["parallel"], "dp": 1, "global_batch": 2}}
    assert not any(n.name.startswith("loss_dp") for n in generate(load_spec(one)).nodes[0])


def test_loss_allreduce_time_by_hand(tmp_path: Path, monkeypatch) -> None:
    # A 4 B ring AllReduce of two ranks on a 50 GB/s switch with 500 ns hops: two steps of 2 B, each
    # 0.04 + 2 x 500 ns: 2,000.08 ns, 2,001 on the ns grid; both micro-batches' backward wait for theirs.
    on = _replay(tmp_path, "on")
    rows = {(r["rank"], r["name"]): r for r in on.ops.iter_rows(named=True)}
    for mb in (0, 1):
        ar = rows[(0, f"loss_dp_allreduce.fwd.mb{mb}")]
        assert ar["duration_ns"] == 2_001 and ar["start_ns"] == rows[(0, f"loss.fwd.mb{mb}")]["end_ns"]
        assert rows[(0, f"loss.bwd.mb{mb}")]["start_ns"] == ar["end_ns"]
    fw = FRAMEWORKS["megatron-2021"]
    monkeypatch.setitem(FRAMEWORKS, "megatron-2021", dataclasses.replace(fw, loss_dp_allreduce=False))
    off = _replay(tmp_path, "off")
    assert on.per_rank_finish_ns[0] == off.per_rank_finish_ns[0] + 2 * 2_001
