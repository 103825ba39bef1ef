"""The Python API (xsim.api): replay of a generated set uses the spec's own GPUs (issue 10, bug 1), the
network-model registry and its contradictions, and the docs/api.md example."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from xsim.netmodels.models import REGISTRY, capabilities_of, model_choices
from xsim.replay.errors import ReplayError

from xsim import api

REPO = Path(__file__).resolve().parents[1]

# One H100 rank, one layer: every op runs in one chain on one stream, so the iteration is the sum of the
# ops and a change to one op shows up one for one.
ONE_RANK = """
name: one
model: {name: tiny, layers: 1, hidden: 1024, ffn_hidden: 4096, heads: 8, vocab: 1024, seq_len: 1024}
micro_batches: 1
compute_model: roofline
device_groups:
  - {gpu: H100, ranks: [0], tp: 1, micro_batch: 1}
"""
T, K, N = 1024, 1024, 3 * 1024  # qkv_proj: [tokens, hidden] x [hidden, 3 hidden] (heads = kv_heads)
QKV_FLOPS = 2 * T * K * N  # 2MKN (Narayanan et al. 2021, section 5.1)
H100_PEAK = 989.4e12  # H100 SXM dense BF16 (datasheet: 1,979 TFLOPS with sparsity)


def _replay(tmp_path: Path, name: str, extra: str = ""):
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(ONE_RANK + extra)
    api.generate(str(spec), api.GenerateOptions(out=str(tmp_path / name)))
    run = api.simulate(str(tmp_path / name))
    ops = {r["name"]: r for r in run.result.ops.iter_rows(named=True)}
    return run.result.summary_dict()["iteration_time_ns"], ops


def test_gpus_override_reaches_the_replay(tmp_path: Path) -> None:
    base_t, base = _replay(tmp_path, "base")
    slow_t, slow = _replay(tmp_path, "slow", "gpus: {H100: {gemm_eff: 0.35}}\n")
    # The qkv GEMM is compute-bound (ops/bytes ~ 440 FLOP/B above the ridge): floor(1e9 FLOPs / rate).
    assert base["L1.qkv_proj.fwd.mb0"]["duration_ns"] == math.floor(1e9 * QKV_FLOPS / (H100_PEAK * 0.70))
    assert base["L1.qkv_proj.fwd.mb0"]["duration_ns"] == 9302
    assert slow["L1.qkv_proj.fwd.mb0"]["duration_ns"] == math.floor(1e9 * QKV_FLOPS / (H100_PEAK * 0.35))
    assert slow["L1.qkv_proj.fwd.mb0"]["duration_ns"] == 18604
    assert slow_t > base_t


def test_profile_rows_reach_the_replay(tmp_path: Path) -> None:
    base_t, base = _replay(tmp_path, "base")
    row = f"profile:\n  - {{gpu: H100, op: qkv_proj, phase: fwd, shape: {T}x{K}x{N}, micros: 5000}}\n"
    prof_t, prof = _replay(tmp_path, "prof", row)
    assert prof["L1.qkv_proj.fwd.mb0"]["duration_ns"] == 5_000_000
    # Only that op changed, and it sits on the single chain: the iteration moves by exactly the difference.
    assert prof_t - base_t == 5_000_000 - base["L1.qkv_proj.fwd.mb0"]["duration_ns"]
    assert prof["L1.qkv_proj.bwd.mb0"]["duration_ns"] == base["L1.qkv_proj.bwd.mb0"]["duration_ns"]


def test_registry_lists_each_model_once_with_capabilities() -> None:
    assert set(REGISTRY) == {"analytical", "flow", "flow-hybrid", "ns3", "astra-unaware", "astra-aware"}
    assert model_choices() == (*REGISTRY, "astra")
    assert [n for n, m in REGISTRY.items() if m.capabilities.foldable] == ["analytical", "astra-unaware"]
    for m in REGISTRY.values():
        assert not m.capabilities.foldable or m.capabilities.contention_free


def test_capabilities_of_built_models() -> None:
    net = api.build_network(api.NetworkOptions(model="flow", topology="switch:4:50GBps:500ns"))
    assert net.name == "flow" and not capabilities_of(net).foldable
    net = api.build_network(api.NetworkOptions(topology="switch:4:50GBps:500ns"))
    assert net.name == "analytical" and capabilities_of(net).contention_free
    assert not capabilities_of(object()).foldable


ASTRA_NET = "topology: [ Switch ]\nnpus_count: [ 4 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n"


@pytest.mark.parametrize(
    ("opts", "words"),
    [
        ({"model": "analytical", "astra_network": "N"}, ("--model analytical", "--astra-network")),
        ({"model": "flow", "astra_network": "N"}, ("--model flow", "--astra-network")),
        ({"model": "astra-aware"}, ("needs --astra-network",)),
        ({"model": "astra"}, ("needs --astra-network",)),
        ({"congestion_aware": True, "topology": "ring:2:1GBps:1us"}, ("--congestion-aware",)),
        ({"model": "astra-unaware", "astra_network": "N", "congestion_aware": True}, ("contradicts",)),
        ({"astra_network": "N", "topology": "ring:2:1GBps:1us"}, ("--topology", "--astra-network")),
        ({"astra_system": "S"}, ("--astra-system needs --astra-network",)),
    ],
)
def test_contradictory_network_options_are_one_error(opts: dict, words: tuple[str, ...]) -> None:
    with pytest.raises(ReplayError) as err:
        api.resolve_model(api.NetworkOptions(**opts))
    assert all(w in str(err.value) for w in words) and "\n" not in str(err.value)


def test_astra_mode_is_chosen_by_the_files(tmp_path: Path) -> None:
    net = tmp_path / "net.yml"
    net.write_text(ASTRA_NET)
    assert api.build_network(api.NetworkOptions(astra_network=str(net))).name == "astra-unaware"
    aware = api.NetworkOptions(astra_network=str(net), congestion_aware=True)
    assert api.build_network(aware).name == "astra-aware"
    assert (
        api.build_network(api.NetworkOptions(model="astra-aware", astra_network=str(net))).name
        == "astra-aware"
    )


@pytest.mark.parametrize("verb", ["replay", "net"])
def test_analytical_with_astra_files_is_one_error_line_in_every_verb(
    tmp_path: Path, capsys, verb: str
) -> None:
    from xsim.cli import main

    net = tmp_path / "net.yml"
    net.write_text(ASTRA_NET)
    argv = {
        "replay": ["replay", str(REPO / "traces/examples/tiny_pipeline"), "--no-progress"],
        "net": ["net", "collective", "--collective", "all_reduce", "--size", "1MiB"],
    }[verb]
    rc = main([*argv, "--model", "analytical", "--astra-network", str(net)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--model analytical contradicts --astra-network" in err[0]


def _doc_example() -> str:
    text = (REPO / "docs/api.md").read_text(encoding="utf-8")
    m = re.search(r"```python\n(.*?)```", text, re.S)
    assert m, "docs/api.md has no python example"
    return m.group(1)


def test_docs_api_example_runs(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(REPO)
    code = _doc_example().replace("out/api-example", str(tmp_path / "api-example"))
    exec(compile(code, "docs/api.md", "exec"), {})
    out = capsys.readouterr().out
    assert "iteration" in out and (tmp_path / "api-example" / "result" / "summary.json").is_file()
