"""The batch's way onto the GPU each micro-batch (tracegen.batch_input): the host-to-device copy and the TP
broadcast of Megatron-LM's get_batch_on_this_tp_rank, NeMo's per-rank copy, worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from xsim.netmodels.api import CollectiveSpec, simulate_collective
from xsim.netmodels.cluster import build_cluster
from xsim.netmodels.models import build_model
from xsim.netmodels.presets import PRESETS
from xsim.replay import ReplayConfig, simulate
from xsim.tracegen import generate, load_spec
from xsim.tracegen.batch_input import (
    H2D_EFFICIENCY,
    PCIE_BYTES_PER_S,
    batch_input,
    batch_tensors,
    h2d_ns,
)
from xsim.tracegen.catalog import gpu
from xsim.tracegen.choices import BATCH_INPUTS
from xsim.tracegen.errors import SpecError
from xsim.tracegen.frameworks import FRAMEWORKS
from xsim.tracegen.workload import _Generator
from xsim.traces import attrs as A
from xsim.traces import pb

from xsim import api

# Llama 3 8B at s 8192, micro-batch 1 (the FlagPerf rows): tokens, labels, position_ids int64 = 65,536 B
# each, loss_mask float32 32,768 B, the [1, 1, s, s] bool mask 8192^2 = 67,108,864 B; in all 67,338,240 B.
S8K = {"tokens": 65_536, "labels": 65_536, "loss_mask": 32_768, "attention_mask": 67_108_864,
       "position_ids": 65_536}  # fmt: skip
S8K_ALL = 67_338_240

TINY = {
    "model": {"name": "tiny", "layers": 2, "hidden": 256, "ffn_hidden": 1024, "heads": 8, "vocab": 1024,
              "seq_len": 512},
    "micro_batches": 2,
    "framework": "megatron-core-0.7",
    "parallel": {"gpu": "A100-80GB", "tp": 2, "pp": 1, "dp": 1, "micro_batch": 1},
}  # fmt: skip
# s 512, micro-batch 1: tokens, labels, position_ids 4,096 B, loss_mask 2,048 B, mask 512^2 = 262,144 B;
# 276,480 B in all, at 25.7 GB/s (A100) 276,480 / 25.7 = 10,757.98 -> 10,758 ns.
TINY_COPY, TINY_NS = 276_480, 10_758


def test_tensor_bytes_by_hand() -> None:
    assert batch_tensors(1, 8192, True) == S8K
    assert sum(S8K.values()) == S8K_ALL
    assert batch_tensors(2, 8192, False) == {k: 2 * v for k, v in S8K.items() if k != "attention_mask"}


def test_copy_time_by_hand() -> None:
    # 25.7 GB/s measured on a DGX A100 of PCIe 4.0 x16's 32 GB/s; PCIe 5.0 x16 (64 GB/s) at the same share,
    # 51.4 GB/s. 67,338,240 B: 2,620,164.98 ns on an A100, 1,310,082.49 on an H100.
    assert H2D_EFFICIENCY * 32e9 == pytest.approx(25.7e9)
    assert h2d_ns(S8K_ALL, gpu("A100-80GB")) == 2_620_165
    assert h2d_ns(S8K_ALL, gpu("H100")) == 1_310_082
    assert h2d_ns(TINY_COPY, gpu("A100-80GB")) == TINY_NS
    assert h2d_ns(0, gpu("H100")) == 0


def test_pcie_rates_are_the_netmodels_presets() -> None:
    """tracegen does not import netmodels: the PCIe rate per direction of each catalog GPU is repeated."""
    table5 = PRESETS["table5"]
    shared = [g for g in PCIE_BYTES_PER_S if g in table5]
    assert len(shared) >= 9
    for g in shared:
        assert PCIE_BYTES_PER_S[g] == table5[g].pcie_bandwidth, g


def test_megatron_by_pipeline_position() -> None:
    """get_batch_on_this_tp_rank: all five tensors copied on the first and last stages, broadcast at PP 1,
    the first stage's three or the last stage's three at PP > 1; middle stages nothing; TP 1 no broadcast."""
    b = S8K
    pp1 = batch_input("megatron", 1, 8192, 8, True, True)
    assert pp1.copy_bytes == S8K_ALL
    assert pp1.broadcasts == tuple((k, b[k]) for k in ("tokens", "labels", "loss_mask", "attention_mask",
                                                        "position_ids"))  # fmt: skip
    first = batch_input("megatron", 1, 8192, 2, True, False)
    assert first.copy_bytes == S8K_ALL
    assert first.broadcasts == (("tokens", 65_536), ("attention_mask", 67_108_864), ("position_ids", 65_536))
    last = batch_input("megatron", 1, 8192, 2, False, True)
    assert last.broadcasts == (("labels", 65_536), ("loss_mask", 32_768), ("attention_mask", 67_108_864))
    assert batch_input("megatron", 1, 8192, 2, False, False) == batch_input("none", 1, 8192, 2, True, True)
    assert batch_input("megatron", 1, 8192, 1, True, True).broadcasts == ()
    # --no-create-attention-mask-in-dataloader: 229,376 B copied, no mask broadcast
    nomask = batch_input("megatron-no-mask", 1, 8192, 2, False, True)
    assert nomask.copy_bytes == S8K_ALL - 67_108_864 == 229_376
    assert nomask.broadcasts == (("labels", 65_536), ("loss_mask", 32_768))


def test_nemo_copies_its_own_keys() -> None:
    # PP 1: tokens, labels, loss_mask, position_ids = 229,376 B; first stage tokens + position_ids 131,072;
    # last stage labels + loss_mask 98,304; never a broadcast or the mask.
    assert batch_input("nemo", 1, 8192, 8, True, True) == batch_input(
        "megatron-no-mask", 1, 8192, 1, True, True
    )
    assert batch_input("nemo", 1, 8192, 8, True, True).copy_bytes == 229_376
    assert batch_input("nemo", 1, 8192, 8, True, False).copy_bytes == 131_072
    assert batch_input("nemo", 1, 8192, 8, False, True).copy_bytes == 98_304
    assert batch_input("nemo", 1, 8192, 8, False, True).broadcasts == ()


def test_profiles_and_the_spec_key() -> None:
    assert BATCH_INPUTS == ("megatron", "megatron-no-mask", "nemo", "none")
    on = {n for n, f in FRAMEWORKS.items() if f.batch_input}
    # megatron-core runs the same code; off as the default profile until the tests pinning it are re-derived
    assert on == {"megatron-core-0.7"}
    assert FRAMEWORKS["megatron-core-0.7"].batch_input == "megatron"
    on_core = {**TINY, "framework": "megatron-core", "batch_input": "megatron"}
    assert _batch_nodes(generate(load_spec(on_core)).nodes[0])[0] == ("batch_h2d.fwd.mb0", TINY_NS)
    assert _batch_nodes(generate(load_spec({**TINY, "framework": "megatron-core"})).nodes[0]) == []
    assert load_spec({**TINY, "batch_input": "nemo"}).batch_input == "nemo"
    assert load_spec(TINY).batch_input == ""
    with pytest.raises(SpecError, match="batch_input must be one of"):
        load_spec({**TINY, "batch_input": "dali"})


def _batch_nodes(nodes: list) -> list[tuple[str, int]]:
    """(name, ns of the copy or bytes of the broadcast) of the batch nodes, in order."""
    out = []
    for n in nodes:
        if n.name.startswith("batch_h2d"):
            out.append((n.name, A.get_int(n, A.DURATION_NS)))
        elif n.name.startswith("batch_bcast"):
            assert A.get_int(n, A.COMM_TYPE) == pb.BROADCAST
            out.append((n.name, A.get_int(n, A.COMM_SIZE)))
    return out


def test_generated_nodes_by_hand() -> None:
    """TP 2, PP 1, two micro-batches: each forward starts with the 10,758 ns copy and five broadcasts over the
    TP group (4,096, 4,096, 2,048, 262,144, 4,096 B), one after another; the embedding follows the last."""
    b = generate(load_spec(TINY))
    for r in (0, 1):
        nodes = b.nodes[r]
        got = _batch_nodes(nodes)
        assert got == [
            (f"batch_{w}.fwd.mb{mb}", v)
            for mb in (0, 1)
            for w, v in (("h2d", TINY_NS), ("bcast_tokens", 4096), ("bcast_labels", 4096),
                         ("bcast_loss_mask", 2048), ("bcast_attention_mask", 262_144),
                         ("bcast_position_ids", 4096))
        ]  # fmt: skip
        by_name = {n.name: n for n in nodes}
        assert list(by_name["batch_bcast_tokens.fwd.mb0"].data_deps) == [by_name["batch_h2d.fwd.mb0"].id]
        emb = by_name["embedding.fwd.mb0"]
        assert list(emb.ctrl_deps) + list(emb.data_deps) == [by_name["batch_bcast_position_ids.fwd.mb0"].id]
        tp_coll = next(n for n in nodes if n.type == pb.COMM_COLL_NODE and n.name.startswith("L1."))
        assert A.get_str(by_name["batch_bcast_tokens.fwd.mb0"], A.PG_NAME) == A.get_str(tp_coll, A.PG_NAME)
    # PP 2: the first stage broadcasts tokens, mask, position ids; the last labels, loss mask, mask.
    pp2 = generate(load_spec({**TINY, "parallel": {**TINY["parallel"], "pp": 2}}))
    assert [n for n, _ in _batch_nodes(pp2.nodes[0])][:4] == [
        "batch_h2d.fwd.mb0", "batch_bcast_tokens.fwd.mb0", "batch_bcast_attention_mask.fwd.mb0",
        "batch_bcast_position_ids.fwd.mb0"]  # fmt: skip
    assert [n for n, _ in _batch_nodes(pp2.nodes[2])][:4] == [
        "batch_h2d.fwd.mb0", "batch_bcast_labels.fwd.mb0", "batch_bcast_loss_mask.fwd.mb0",
        "batch_bcast_attention_mask.fwd.mb0"]  # fmt: skip
    # Profiles without it, and the spec's none, generate nothing: Megatron-LM 2021/2022's get_batch keeps
    # its timers' host syncs only (tracegen.workload TIMER_SYNCS_FORWARD_START), nothing charged twice.
    for spec in ({**TINY, "batch_input": "none"}, {**TINY, "framework": "megatron-2021"},
                 {**TINY, "framework": "torchtitan"}):  # fmt: skip
        assert _batch_nodes(generate(load_spec(spec)).nodes[0]) == []
    nemo = generate(load_spec({**TINY, "batch_input": "nemo"}))
    # 4,096 x 3 + 2,048 = 14,336 B / 25.7 B/ns = 557.8 -> 558 ns, no broadcast
    assert _batch_nodes(nemo.nodes[1]) == [("batch_h2d.fwd.mb0", 558), ("batch_h2d.fwd.mb1", 558)]


def test_replayed_step_grows_by_the_copies(tmp_path: Path) -> None:
    """One rank (TP 1), two micro-batches: the step is 2 x 10,758 ns longer than without the batch input
    (the copy sits on the compute stream before each forward; no broadcast at TP 1)."""

    def step(extra: dict, name: str) -> int:
        spec = {**TINY, "parallel": {**TINY["parallel"], "tp": 1}, **extra, "name": name}
        out = str(tmp_path / name)
        api.generate(load_spec(spec), api.GenerateOptions(out=out, all_ranks=True))
        return simulate(out, network=None, config=ReplayConfig(comm_mode="measured")).per_rank_finish_ns[0]

    assert step({}, "on") - step({"batch_input": "none"}, "off") == 2 * TINY_NS


def test_nccl_broadcast_is_pipelined_on_the_dgx_a800() -> None:
    """The TP broadcast of the 64 MiB mask on one DGX A800 (NCCL's ring broadcast, pipelined: every link
    carries the message once): 2^26 B at NCCL's 160 GB/s ring rate = 419,430 ns plus the hop's latency,
    the same at TP 2, 4 and 8 (a store-and-forward chain took 7 x that at TP 8)."""
    dep = load_spec({**TINY, "cluster": "dgx-a800", "parallel": {**TINY["parallel"], "tp": 8}})
    times = []
    for p in (2, 4, 8):
        m = build_model("analytical", build_cluster(json.loads(dep.cluster_json)))
        times.append(simulate_collective(m, CollectiveSpec("broadcast", 1 << 26, tuple(range(p)))).finish_ns)
    assert times[0] == times[1] == times[2] == pytest.approx(2**26 / 160e9 * 1e9, abs=200)


def test_a_clone_keeps_the_nodes() -> None:
    """TP ranks are alike (the copy is charged on each): generating with and without cloning agrees."""
    dep = load_spec(TINY)
    a = _Generator(dep, clone=True).run()
    b = _Generator(dep, clone=False).run()
    for r in (0, 1):
        assert [n.name for n in a.nodes[r]] == [n.name for n in b.nodes[r]]


def test_interleaved_chunks_fetch_at_the_model_ends_only() -> None:
    """PP 2 x 2 model chunks, 4 micro-batches: Megatron's is_pipeline_first_stage / last_stage follow the
    virtual rank, so stage 0 copies before its chunk 0's forwards only and stage 1 before its chunk 1's:
    4 copies on each rank, not 8."""
    spec = {**TINY, "model": {**TINY["model"], "layers": 4}, "micro_batches": 4,
            "parallel": {**TINY["parallel"], "pp": 2, "virtual_stages": 2}}  # fmt: skip
    b = generate(load_spec(spec))
    for r in range(4):
        copies = [n.name for n in b.nodes[r] if n.name.startswith("batch_h2d")]
        assert copies == [f"batch_h2d.fwd.mb{mb}" for mb in range(4)]
