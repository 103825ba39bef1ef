"""The rewriter on generated traces: Figure 1 under every strategy, homogeneous no-op, CLI round trip."""

from __future__ import annotations

import argparse
import json

import pytest
from xsim.tracegen.planner import build_plan
from xsim.tracegen.planner.rewrite import read_bundle, rewrite_bundle
from xsim.tracegen.spec import load_spec
from xsim.tracegen.workload import generate
from xsim.traces import pb
from xsim.traces.attrs import RESHARD, RING, get_int, get_str
from xsim.traces.checks import check_all
from xsim.traces.groups import ProcessGroups
from xsim.traces.stream import EtFile, encode_stream

from xsim import cmd_plan, cmd_rewrite

# Figure 1 / section 4.3: 5 x H100 (DG0 TP3 layers 1-20, DG2 TP2 layers 1-15) and 5 x A100 (DG1 TP2 layers
# 21-32, DG3 TP3 layers 16-32); replica 0 = DG0 -> DG1, replica 1 = DG2 -> DG3. TP 3 needs uneven heads.
FIG1 = {
    "name": "figure1",
    "model": "llama2-7b",
    "seq_len": 256,
    "micro_batches": 2,
    "allow_uneven_tp": True,
    "device_groups": [
        {"id": 0, "gpu": "H100", "ranks": [0, 1, 2], "layers": [1, 20], "pp_stage": 0, "dp_replica": 0},
        {"id": 1, "gpu": "A100", "ranks": [5, 6], "layers": [21, 32], "pp_stage": 1, "dp_replica": 0},
        {"id": 2, "gpu": "H100", "ranks": [3, 4], "layers": [1, 15], "pp_stage": 0, "dp_replica": 1},
        {"id": 3, "gpu": "A100", "ranks": [7, 8, 9], "layers": [16, 32], "pp_stage": 1, "dp_replica": 1},
    ],
}


def findings(bundle):
    n = len(bundle.nodes)
    files = [EtFile(f"rank{r}", pb.GlobalMetadata(), bundle.nodes[r], [], False) for r in range(n)]
    return [str(f) for f in check_all(files, ProcessGroups(n, bundle.comm_groups))]


@pytest.mark.parametrize("strategy", ["xsim", "hetauto", "alpacomm", "naive"])
def test_figure1_rewrites_are_valid_traces(strategy):
    dep = load_spec(FIG1)
    bundle = rewrite_bundle(generate(dep, rewrite=False), dep, strategy)
    assert findings(bundle) == []
    plan = build_plan(dep)
    rings = {
        r: [get_int(n, RING) for n in ns if n.name.startswith("grad_sync")] for r, ns in bundle.nodes.items()
    }
    if strategy == "naive":
        # One uniform AllReduce per DP group the rank is in: rank 0 in [1,15] and [16,20], rank 5 in [21,32].
        assert len(rings[0]) == 2 and len(rings[5]) == 1
    else:
        # Groups in backward order. Rank 0 (DG0, TP 3): 3/3 = 1 ring of [16,20], then L/t = 6/3 = 2 of [1,15]; rank 3 (DG2, TP 2): 6/2 = 3;
        # rank 9 (DG3 local 2): rings 2 and 5 of [21,32] (c mod 3 = 2), then ring 2 of [16,20] (2 mod 3).
        assert (
            rings[0] == [0, 0, 3]
            and rings[3] == [0, 2, 4]
            and rings[5] == [0, 2, 4]
            and rings[9] == [2, 5, 2]
        )
        assert [g.lcm for g in plan.dp_groups] == [6, 3, 6]
    inserted = [n for ns in bundle.nodes.values() for n in ns if get_str(n, RESHARD, None) is not None]
    assert inserted and all(get_str(n, RESHARD) == strategy for n in inserted)


def test_homogeneous_is_a_noop():
    spec = dict(FIG1, allow_uneven_tp=False)
    spec["device_groups"] = [
        {"id": 0, "gpu": "H100", "ranks": [0, 1], "layers": [1, 16], "pp_stage": 0, "dp_replica": 0},
        {"id": 1, "gpu": "H100", "ranks": [2, 3], "layers": [17, 32], "pp_stage": 1, "dp_replica": 0},
        {"id": 2, "gpu": "A100", "ranks": [4, 5], "layers": [1, 16], "pp_stage": 0, "dp_replica": 1},
        {"id": 3, "gpu": "A100", "ranks": [6, 7], "layers": [17, 32], "pp_stage": 1, "dp_replica": 1},
    ]
    dep = load_spec(spec)
    raw = generate(dep, rewrite=False)
    before = {r: encode_stream(pb.GlobalMetadata(), ns) for r, ns in raw.nodes.items()}
    out = rewrite_bundle(raw, dep, "xsim")
    assert {r: encode_stream(pb.GlobalMetadata(), ns) for r, ns in out.nodes.items()} == before
    assert not build_plan(dep).heterogeneous


def _cli(module, argv):
    parser = argparse.ArgumentParser()
    module.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_plan_cli_json_keys(tmp_path, capsys):
    spec = tmp_path / "fig1.json"
    spec.write_text(json.dumps(FIG1))
    assert _cli(cmd_plan, ["plan", str(spec), "--json", "--allow-oom"]) == 0  # Figure 1 needs > 40 GB
    out = json.loads(capsys.readouterr().out)
    assert {"dp_groups", "pipeline_barrier_groups", "dp_barrier_groups"} <= set(out)
    g = out["dp_groups"][0]
    assert {"layers", "ranks", "device_groups", "lcm", "rings", "chunk_bytes", "chunks_per_rank"} <= set(g)
    assert g["layers"] == [1, 15] and g["rings"] == [[0, 3], [1, 4], [2, 3], [0, 4], [1, 3], [2, 4]]
    assert g["chunks_per_rank"] == {"0": 2, "1": 2, "2": 2, "3": 3, "4": 3}
    # Llama 2 7B layer: 4*4096^2 (attention) + 3*4096*11008 (SwiGLU MLP) + 2*4096 (RMSNorm) = 202,383,360
    # parameters = 404,766,720 BF16 bytes, 6 | it: 67,461,120 per chunk. Layer 1 also holds the embedding,
    # the vocabulary padded as Megatron's (128 x TP, TP 3 and 2: a multiple of 128 x lcm = 768): 32000 ->
    # 32,256, x 4096 = 132,120,576 parameters: (404,766,720 + 264,241,152) / 6 = 111,501,312.
    assert g["chunk_bytes"] == 14 * 67_461_120 + 111_501_312
    assert out["pipeline_barrier_groups"] == [[0, 1, 2, 5, 6], [3, 4, 7, 8, 9]]
    assert out["dp_barrier_groups"] == [[0, 1, 2, 3, 4], [0, 1, 2, 7, 8, 9], [5, 6, 7, 8, 9]]


def test_rewrite_cli_round_trip(tmp_path, capsys):
    dep = load_spec(FIG1)
    generate(dep, rewrite=False).write(tmp_path / "raw", "figure1")
    spec = tmp_path / "fig1.json"
    spec.write_text(json.dumps(FIG1))
    rc = _cli(
        cmd_rewrite,
        [
            "rewrite",
            str(tmp_path / "raw"),
            "--spec",
            str(spec),
            "--reshard",
            "hetauto",
            "--out",
            str(tmp_path / "rw"),
        ],
    )
    assert rc == 0 and "rewrote 10 ranks (hetauto)" in capsys.readouterr().out
    bundle, name = read_bundle(str(tmp_path / "rw"))
    assert name == "figure1" and findings(bundle) == []
    # Byte-identical to rewriting in memory: reading back the set loses nothing the rewriter uses.
    mem = rewrite_bundle(generate(dep, rewrite=False), dep, "hetauto")
    assert {r: encode_stream(pb.GlobalMetadata(), ns) for r, ns in mem.nodes.items()} == {
        r: encode_stream(pb.GlobalMetadata(), ns) for r, ns in bundle.nodes.items()
    }


def test_plan_cli_text(tmp_path, capsys):
    spec = tmp_path / "fig1.json"
    spec.write_text(json.dumps(FIG1))
    assert _cli(cmd_plan, ["plan", str(spec), "--allow-oom"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "3 DP synchronization group(s); heterogeneous: True"
    assert lines[1] == "DP group 0: layers [1, 15]  device groups [0, 2]  TP [3, 2]  ranks [0, 1, 2, 3, 4]"
    assert "  ring 2: [2, 3]" in lines
    # Boundary tensor: seq 256 x micro-batch 1 x hidden 4096 x 2 bytes = 2,097,152 bytes.
    assert "replica 0 stage 0 -> 1: TP 3 -> 2  tensor 2.097 MB  (reshard)" in lines
