"""Megatron-LM 2021/2022's tied word embeddings under pipeline parallelism (Framework.always_tied):
the first and the last stage all-reduce the embedding's gradient after the DP all-reduce, by hand."""

from __future__ import annotations

from pathlib import Path

from xsim.replay import simulate
from xsim.tracegen import generate, load_spec
from xsim.tracegen.frameworks import FRAMEWORKS
from xsim.traces import attrs as A
from xsim.traces import pb

from xsim import api

# Two stages of one layer at TP 2 (stage 0 on ranks 0-1, stage 1 on ranks 2-3), vocabulary 1024, hidden 1024.
PP2_TP2 = {
    "model": {"name": "tiny", "layers": 2, "hidden": 1024, "ffn_hidden": 4096, "heads": 8, "vocab": 1024,
              "seq_len": 1024},
    "micro_batches": 2, "schedule": "1f1b", "framework": "megatron-2021", "precision": "fp16",
    "host_dispatch": "off",
    "device_groups": [
        {"gpu": "A100-80GB", "ranks": [0, 1], "tp": 2, "pp_stage": 0, "layers": [1, 1]},
        {"gpu": "A100-80GB", "ranks": [2, 3], "tp": 2, "pp_stage": 1, "layers": [2, 2]},
    ],
}  # fmt: skip


def _emb(bundle, rank: int) -> list[tuple[int, set[int], list[str]]]:
    """(COMM_SIZE, group members, data-dep names) of the rank's embedding-gradient AllReduces."""
    nodes = bundle.nodes[rank]
    return [
        (A.get_int(n, A.COMM_SIZE), set(bundle.comm_groups[A.get_str(n, A.PG_NAME)]), [nodes[d].name for d in n.data_deps])
        for n in nodes
        if n.name == "embedding_grad_allreduce"
    ]  # fmt: skip


def test_profiles_that_always_tie_the_embedding() -> None:
    assert FRAMEWORKS["megatron-2021"].always_tied
    assert FRAMEWORKS["megatron-2022"].always_tied
    assert not FRAMEWORKS["megatron-core"].always_tied
    assert not FRAMEWORKS["megatron-deepspeed"].always_tied


def test_end_stages_all_reduce_the_embedding_gradient_by_hand() -> None:
    # The V/TP x h shard: 1024 / 2 x 1024 = 524,288 parameters; FP16 gradients in 2021 (2 B: 1,048,576 B),
    # the FP32 contiguous buffer under bf16 in 2022 (4 B: 2,097,152 B). Groups: each first-stage rank with
    # the last-stage rank of its TP position, after the gradients' pre-all-reduce coalesce (no DP here).
    for spec, size in ((PP2_TP2, 1_048_576), ({**PP2_TP2, "framework": "megatron-2022", "precision": "bf16"}, 2_097_152)):  # fmt: skip
        bundle = generate(load_spec(spec))
        for rank, peer in ((0, 2), (1, 3), (2, 0), (3, 1)):
            assert _emb(bundle, rank) == [(size, {rank, peer}, ["dp_grad_coalesce.opt"])]
        nodes = bundle.nodes[0]
        k = [n.name for n in nodes].index("embedding_grad_allreduce")
        assert A.get_int(nodes[k], A.COMM_TYPE) == pb.ALL_REDUCE
        # the optimizer step's first op (2021: the copy back after the DP all-reduce) starts after it
        assert A.get_str(nodes[k + 1], A.PHASE) == "opt" and k in nodes[k + 1].data_deps
    # Megatron-Core on this SwiGLU/RMSNorm (Llama-family) model: untied by default, as the Llama launch
    # scripts pass --untie-embeddings-and-output-weights; tied by the spec's key, the same all-reduce.
    # One stage (the weight is one tensor): none.
    assert not _emb(generate(load_spec({**PP2_TP2, "framework": "megatron-core"})), 0)
    tied = {**PP2_TP2, "framework": "megatron-core", "precision": "bf16"}
    tied["model"] = {**PP2_TP2["model"], "tie_embeddings": True}
    assert _emb(generate(load_spec(tied)), 0)[0][:2] == (2_097_152, {0, 2})
    one = {**PP2_TP2, "device_groups": [{"gpu": "A100-80GB", "ranks": [0, 1], "tp": 2, "layers": [1, 2]}]}
    assert not _emb(generate(load_spec(one)), 0)


def test_embedding_allreduce_time_by_hand(tmp_path: Path) -> None:
    # On a 50 GB/s switch with 500 ns hops, a ring AllReduce of 1,048,576 B over two ranks is a
    # reduce-scatter and an all-gather step of 524,288 B each: 2 x (10,485.76 + 2 x 500) = 22,971.52 ns,
    # 22,972 on the ns grid. It starts when the later of its two ranks reaches it, and stage 0's optimizer
    # step (its copy back after the all-reduce first) starts at its end.
    out = str(tmp_path / "emb")
    api.generate(load_spec({**PP2_TP2, "name": "emb"}), api.GenerateOptions(out=out, all_ranks=True))
    res = simulate(out, network=api.build_network(api.NetworkOptions(topology="switch:4:50GBps:500ns")))
    rows = {(r["rank"], r["name"]): r for r in res.ops.iter_rows(named=True)}
    for rank, peer in ((0, 2), (1, 3)):
        ar = rows[(rank, "embedding_grad_allreduce")]
        last = max(rows[(r, "dp_grad_coalesce.opt")]["end_ns"] for r in (rank, peer))
        assert ar["end_ns"] == rows[(peer, "embedding_grad_allreduce")]["end_ns"] == last + 22_972
        assert rows[(rank, "dp_grad_uncoalesce.opt")]["start_ns"] == ar["end_ns"]
