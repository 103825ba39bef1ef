"""DeepSpeed's activation checkpointing with synchronize_checkpoint_boundary (the spec's
synchronize_each_layer, GPT-NeoX's synchronize-each-layer): torch.cuda.synchronize() at the start and end of
each checkpointed unit's forward and backward (deepspeed/runtime/activation_checkpointing/checkpointing.py
CheckpointFunction, EleutherAI/DeeperSpeed eb7f5cff36), worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
from xsim.replay import ReplayConfig, simulate
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.host import HOST_SYNC_NS
from xsim.tracegen.spec import spec_to_mapping
from xsim.traces import attrs as A

from xsim import api

SYNC = 15_000  # ns: HOST_SYNC_NS
# One rank, one micro-batch of two GPT-style layers, full recompute of each layer, a launch costs 1 ns.
ONE = {
    "model": {"name": "tiny", "layers": 2, "hidden": 1024, "ffn_hidden": 4096, "heads": 8, "vocab": 1024,
              "seq_len": 1024, "activation": "gelu", "norm": "layernorm", "linear_bias": True},
    "micro_batches": 1, "schedule": "1f1b", "framework": "gpt-neox", "precision": "fp16",
    "recompute": "full", "host_dispatch": "on", "host_launch_us": 0.001,
    "device_groups": [{"gpu": "A100-80GB", "ranks": [0], "tp": 1, "micro_batch": 1}],
}  # fmt: skip


def _host_syncs(nodes: list) -> list[tuple[int, list[str]]]:
    """(sync multiples, names of the kernels waited for) of each host node that waits for kernels, the
    optimizer's reads left out (launches cost 1 ns, so a host node's ns is syncs x SYNC + launches)."""
    out = []
    for n in nodes:
        if n.name.startswith("host:") and n.data_deps and not n.name.endswith(".opt"):
            out.append((A.get_int(n, A.DURATION_NS) // SYNC, [nodes[d].name for d in n.data_deps]))
    return out


def test_four_syncs_per_checkpointed_layer_by_hand() -> None:
    # Forward: L1's CheckpointFunction.forward syncs on the embedding's last kernel, ends with a sync on
    # L1's last; L2's begins with another on the same kernel (two back to back), ends on L2's last. Backward
    # (units recomputed before their backward): L2's syncs on the final norm's backward before its
    # recompute, ends on L2's last backward kernel, L1's begins there too, ends on L1's last. 2 layers x 4 =
    # 8 syncs, none without the key (the profile then has no host timeline at all).
    assert HOST_SYNC_NS == SYNC
    spec = {**ONE, "synchronize_each_layer": True}
    got = _host_syncs(generate(load_spec(spec)).nodes[0])
    assert got == [
        (1, ["embedding_dropout.fwd.mb0"]),
        (1, ["L1.mlp_residual.fwd.mb0"]), (1, ["L1.mlp_residual.fwd.mb0"]),
        (1, ["L2.mlp_residual.fwd.mb0"]),
        (1, ["final_norm.bwd.mb0"]),
        (1, ["L2.attn_residual.bwd.mb0"]), (1, ["L2.attn_residual.bwd.mb0"]),
        (1, ["L1.attn_residual.bwd.mb0"]),
    ]  # fmt: skip
    assert _host_syncs(generate(load_spec(ONE)).nodes[0]) == []


def test_syncs_step_time_by_hand(tmp_path: Path) -> None:
    # After each sync the GPU idles for the read (15,000 ns) and the next kernel's launch (1 ns); the host
    # then runs ahead of the long kernels. Single syncs: 15,001 ns each (4); the two back-to-back pairs
    # 30,001 ns each (2): 4 x 15,001 + 2 x 30,001 = 120,006 ns longer than the same run without the key.
    ends = []
    for on in (False, True):
        out = str(tmp_path / f"r{int(on)}")
        spec = {**ONE, "name": f"r{int(on)}", "synchronize_each_layer": on}
        api.generate(load_spec(spec), api.GenerateOptions(out=out, all_ranks=True))
        res = simulate(out, network=None, config=ReplayConfig(comm_mode="measured"))
        ends.append(max(r["end_ns"] for r in res.ops.iter_rows(named=True)))
    assert ends[1] - ends[0] == 120_006


def test_key_round_trips_and_needs_full_recompute() -> None:
    spec = {**ONE, "synchronize_each_layer": True}
    assert spec_to_mapping(load_spec(spec))["synchronize_each_layer"] is True
    assert "synchronize_each_layer" not in spec_to_mapping(load_spec(ONE))
    with pytest.raises(SpecError, match="synchronize_each_layer applies to recompute: full"):
        load_spec({**spec, "recompute": "selective"})
    with pytest.raises(SpecError, match="synchronize_each_layer must be true or false"):
        load_spec({**spec, "synchronize_each_layer": "yes"})
