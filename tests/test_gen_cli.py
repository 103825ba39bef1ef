"""`xsim gen`: files written, the resolved spec, rewrite on by default, and regenerating deployment_pb2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from xsim.tracegen import generate, load_spec
from xsim.traces.groups import load_comm_groups
from xsim.traces.traceset import discover

from xsim.api.network import deployment_collective_seconds
from xsim.cli import main

REPO = Path(__file__).resolve().parents[1]


def test_gen_writes_traces_groups_and_resolved_spec(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["gen", str(REPO / "examples" / "table4_c11.yaml"), "--out", str(out), "--no-rewrite"]) == 0
    assert "wrote 4 ranks" in capsys.readouterr().out
    ts = discover(out)
    assert ts.num_ranks == 4 and ts.prefix == str(out / "table4_c11")
    # C11: A100 pair TP 2 (replica 0), H100 pair TP 2 (replica 1): TP groups, then the DP group per TP index.
    assert load_comm_groups(out / "comm_group.json") == {"1": (0, 1), "2": (2, 3), "3": (0, 2), "4": (1, 3)}
    resolved = json.loads((out / "deployment.json").read_text())
    assert resolved["cluster_derived"] is True
    assert resolved["cluster"] == {
        "preset": "table5",
        "fabric": {"kind": "switch"},
        "nodes": [
            {"name": "node0", "gpu": "A100-40GB", "ranks": [0, 1]},
            {"name": "node1", "gpu": "H100", "ranks": [2, 3]},
        ],
    }
    # The resolved spec regenerates the same traces (the contention windows timed as `xsim gen` times them:
    # the replay's default network model on the spec's cluster).
    dep = load_spec(out / "deployment.json")
    assert dep == load_spec(REPO / "examples" / "table4_c11.yaml")
    again = generate(dep, rewrite=False, comm_time=deployment_collective_seconds(dep))
    assert [n.SerializeToString() for n in again.nodes[3]] == [
        n.SerializeToString() for n in ts.load(3).nodes
    ]


def test_gen_rewrites_by_default(tmp_path):
    pytest.importorskip("xsim.tracegen.planner.rewrite")
    spec = REPO / "examples" / "figure1.yaml"
    assert main(["gen", str(spec), "--out", str(tmp_path / "a")]) == 0
    assert main(["gen", str(spec), "--out", str(tmp_path / "b"), "--no-rewrite", "--name", "plain"]) == 0
    rewritten = sum(len(f.nodes) for f in discover(tmp_path / "a"))
    plain = sum(len(f.nodes) for f in discover(tmp_path / "b" / "plain"))
    assert rewritten > plain  # heterogeneous gradient sync was inserted


def test_committed_deployment_pb2_is_what_protoc_generates(tmp_path):
    pytest.importorskip("grpc_tools")
    subprocess.run([sys.executable, str(REPO / "scripts" / "protos.py"), "--out", str(tmp_path)], check=True)
    fresh = (tmp_path / "tracegen" / "deployment_pb2.py").read_bytes()
    assert fresh == (REPO / "tracegen" / "deployment_pb2.py").read_bytes()
