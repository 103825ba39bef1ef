"""Context parallelism in the generated traces: ring exchanges (count, size, which attention steps they
overlap), the all-gather form, CP in the DP gradient group, tokens and memory, against hand counts."""

from __future__ import annotations

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.cost import iteration_cost
from xsim.tracegen.errors import SpecError
from xsim.tracegen.memory import deployment_memory
from xsim.traces import attrs as A
from xsim.traces import pb

# hidden 64, 4 heads of 16 (no GQA), seq 64 over cp 4: 16 tokens per rank, chunks of 8
MODEL = {
    "name": "tiny",
    "layers": 2,
    "hidden": 64,
    "ffn_hidden": 128,
    "heads": 4,
    "vocab": 256,
    "seq_len": 64,
}
KV = 16 * 2 * 4 * 16 * 2  # K and V of 16 tokens x 4 heads x 16 wide, BF16: 4096 B


def _gen(cp=4, dp=1, **top):
    return generate(load_spec({"model": MODEL, "parallel": {"gpu": "H100", "dp": dp, "cp": cp}, **top}))


def _at(n, name):
    a = {x.name: x for x in n.attr}[name]
    return getattr(a, a.WhichOneof("value"))


def _layer(bundle, rank, phase):
    return [n for n in bundle.nodes[rank] if n.name.startswith("L1.") and f".{phase}." in n.name]


def test_ring_exchanges_per_layer_count_size_and_overlap():
    bundle = _gen()
    for r in range(4):
        fwd, bwd = _layer(bundle, r, "fwd"), _layer(bundle, r, "bwd")
        sends = lambda ns, what: [n for n in ns if n.type == pb.COMM_SEND_NODE and f".cp_{what}" in n.name]  # noqa: E731
        # forward: cp - 1 = 3 K/V exchanges; backward: 3 K/V and cp = 4 K/V-gradient exchanges, 4096 B each
        assert [len(sends(fwd, "kv")), len(sends(bwd, "kv")), len(sends(bwd, "dkv"))] == [3, 3, 4]
        assert {_at(n, A.COMM_SIZE) for n in sends(fwd, "kv") + sends(bwd, "kv") + sends(bwd, "dkv")} == {KV}
        # the ring: send to rank r + 1, receive from r - 1
        assert {_at(n, A.COMM_DST) for n in sends(fwd, "kv")} == {(r + 1) % 4}
    by = {n.name: n for n in bundle.nodes[1]}
    step = [by[f"L1.attn_core_cp{i}.fwd.mb0"] for i in range(4)]
    send = [by[f"L1.cp_kv{i}.fwd.mb0.to2"] for i in range(3)]
    recv = [by[f"L1.cp_kv{i}.fwd.mb0.from0"] for i in range(3)]
    # exchange 0 sends the rank's own K/V once RoPE is done, under attention step 0; exchange i > 0 forwards
    # the block exchange i - 1 brought, under step i; step i + 1 waits for exchange i (send and receive)
    assert list(send[0].data_deps) == [by["L1.rope.fwd.mb0"].id] == list(step[0].data_deps)
    for i in range(1, 3):
        assert list(send[i].data_deps) == [recv[i - 1].id]
    for i in range(3):
        assert set(step[i + 1].data_deps) == {step[i].id, send[i].id, recv[i].id}
        assert send[i].id not in step[i].data_deps and recv[i].id not in step[i].data_deps
    # the QKV backward waits for the rank's own K/V gradient, back after 4 hops
    assert set(by["L1.rope.bwd.mb0"].data_deps) >= {
        by["L1.cp_dkv3.bwd.mb0.to2"].id,
        by["L1.cp_dkv3.bwd.mb0.from0"].id,
    }
    # tags pair up: rank 1's send of exchange 0 is rank 2's receive of it
    peer = {n.name: n for n in bundle.nodes[2]}
    assert _at(send[0], A.COMM_TAG) == _at(peer["L1.cp_kv0.fwd.mb0.from1"], A.COMM_TAG)


def test_ring_attention_flops_are_the_causal_total_over_cp():
    bundle = _gen()
    by = {n.name: n for n in bundle.nodes[0]}
    # each step: two 8 x 8 blocks of full attention, 4 b s^2 h d per block = 2 x 4 x 4 heads x 64 x 16
    steps = [_at(by[f"L1.attn_core_cp{i}.fwd.mb0"], A.NUM_OPS) for i in range(4)]
    assert steps == [2 * 4 * 4 * 8 * 8 * 16] * 4 == [32768] * 4
    # causal flash attention of the whole sequence: 4 b s^2 h d / 2 = 524,288; over 4 ranks 131,072
    assert sum(steps) == 4 * 64 * 64 * 64 // 2 // 4
    assert [_at(by[f"L1.attn_core_cp{i}.bwd.mb0"], A.NUM_OPS) for i in range(4)] == [65536] * 4
    # every other op runs on 16 tokens: QKV [16, 64] x [64, 192]
    assert _at(by["L1.qkv_proj.fwd.mb0"], A.NUM_OPS) == 2 * 16 * 64 * 192


def test_all_gather_form_as_llama3():
    bundle = _gen(cp_comm_type="all_gather")
    groups = {k: list(v) for k, v in bundle.comm_groups.items()}
    by = {n.name: n for n in bundle.nodes[3]}
    ag, rs = by["L1.cp_kv_allgather.fwd.mb0"], by["L1.cp_dkv_reducescatter.bwd.mb0"]
    assert (_at(ag, A.COMM_SIZE), _at(rs, A.COMM_SIZE)) == (KV, 4 * KV)  # per-rank input; whole buffer
    assert groups[{x.name: x for x in ag.attr}[A.PG_NAME].string_val] == [0, 1, 2, 3]
    assert _at(by["L1.attn_core.fwd.mb0"], A.NUM_OPS) == 131072
    assert list(by["L1.attn_core.fwd.mb0"].data_deps) == [ag.id]
    assert not [n for n in bundle.nodes[3] if n.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)]


def test_cp_is_folded_into_the_dp_gradient_group_and_tokens_count_once():
    bundle = _gen(cp=2, dp=2)
    groups = {k: list(v) for k, v in bundle.comm_groups.items()}
    ar = next(n for n in bundle.nodes[0] if n.name.startswith("dp_grad_allreduce"))
    # 2 replicas x 2 CP ranks: replicas 0 and 1 are CP ranks of data replica 0; gradients over all four
    assert groups[{x.name: x for x in ar.attr}[A.PG_NAME].string_val] == [0, 1, 2, 3]
    ring = next(n for n in bundle.nodes[0] if ".cp_kv0.fwd" in n.name and n.type == pb.COMM_SEND_NODE)
    assert _at(ring, A.COMM_DST) == 1
    dep = load_spec({"model": MODEL, "parallel": {"gpu": "H100", "dp": 2, "cp": 2}})
    assert iteration_cost(dep, 1).tokens == 2 * 64  # two data replicas of one 64-token sequence


def test_cp_memory_is_the_memory_of_the_shorter_sequence():
    cp4 = deployment_memory(load_spec({"model": MODEL, "parallel": {"gpu": "H100", "cp": 4}}))
    short = deployment_memory(
        load_spec({"model": MODEL, "seq_len": 16, "parallel": {"gpu": "H100", "dp": 4}})
    )
    assert [m.activations for m in cp4] == [m.activations for m in short]
    assert [m.params for m in cp4] == [m.params for m in short]


def test_a_cp_plan_validates_and_replays(tmp_path, capsys):
    from xsim.cli import main

    bundle = _gen(cp=2, dp=2)
    bundle.write(str(tmp_path), "cp")
    assert main(["trace", "validate", str(tmp_path)]) == 0
    assert main(["replay", str(tmp_path), "--topology", "switch:4:50GBps:500ns"]) == 0
    assert "replayed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("top", "message"),
    [
        ({"seq_len": 60}, "needs seq_len 60 to split into 2 x cp = 8 equal chunks"),
        ({"attention": "unfused"}, "context parallelism needs attention: flash"),
        ({"recompute": "selective"}, "recompute: selective is not supported yet"),
        ({"cp_comm_type": "a2a"}, "cp_comm_type must be one of p2p, all_gather"),
    ],
)
def test_unsupported_cp_plans_fail_in_one_line(top, message):
    with pytest.raises(SpecError) as exc:
        load_spec({"model": MODEL, "parallel": {"gpu": "H100", "cp": 4}, **top})
    assert message in str(exc.value) and "\n" not in str(exc.value)
