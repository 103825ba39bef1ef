"""`xsim net collective|p2p`: JSON output and one-line errors with exit status 2."""

from __future__ import annotations

import json

import pytest

from xsim.cli import main


def run(capsys, *argv):
    rc = main(["net", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_collective_json(capsys):
    rc, out, _ = run(
        capsys,
        "collective",
        "--topology",
        "ring:8:50GBps:500ns",
        "--collective",
        "all_reduce",
        "--size",
        "8000000",
        "--algorithm",
        "ring",
        "--json",
    )
    assert rc == 0
    doc = json.loads(out)
    assert doc["finish_ns"] == 14 * 500 + 14 * 1_000_000 // 50
    assert doc["per_rank_finish_ns"] == [doc["finish_ns"]] * 8


def test_collective_astra_configs(capsys, tmp_path):
    net = tmp_path / "net.yml"
    net.write_text("topology: [ Switch ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n")
    rc, out, _ = run(
        capsys,
        "collective",
        "--astra-network",
        str(net),
        "--collective",
        "all_reduce",
        "--size",
        "1MiB",
        "--algorithm",
        "halvingDoubling",
        "--json",
    )
    assert rc == 0 and json.loads(out)["finish_ns"] == 40183
    rc, out, _ = run(
        capsys,
        "p2p",
        "--astra-network",
        str(net),
        "--src",
        "0",
        "--dst",
        "3",
        "--size",
        "1MiB",
        "--congestion-aware",
        "--json",
    )
    assert rc == 0 and json.loads(out)["finish_ns"] == 40062


def test_collective_text_output(capsys):
    rc, out, _ = run(
        capsys,
        "collective",
        "--topology",
        "nodes:H100x2,A100x2",
        "--collective",
        "broadcast",
        "--size",
        "1MiB",
        "--model",
        "flow",
        "--ranks",
        "0-3",
        "--root",
        "2",
    )
    assert rc == 0 and "finish" in out and "rank     3" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["--topology", "bogus:4", "--collective", "all_reduce", "--size", "1MiB"],
        ["--topology", "ring:4:0GBps:1ns", "--collective", "all_reduce", "--size", "1MiB"],
        ["--topology", "ring:4:-1GBps:1ns", "--collective", "all_reduce", "--size", "1MiB"],
        [
            "--topology",
            "ring:4:1GBps:1ns",
            "--collective",
            "all_reduce",
            "--size",
            "1MiB",
            "--algorithm",
            "magic",
        ],
        ["--topology", "ring:4:1GBps:1ns", "--collective", "all_reduce", "--size", "1MiB", "--ranks", "0,4"],
        ["--topology", "ring:4:1GBps:1ns", "--collective", "all_reduce", "--size", "lots"],
        ["--collective", "all_reduce", "--size", "1MiB"],
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, argv):
    rc, out, err = run(capsys, "collective", *argv)
    assert rc == 2
    assert err.startswith("xsim: error: ") and err.count("\n") == 1


def test_malformed_astra_yaml_exits_2(capsys, tmp_path):
    net = tmp_path / "net.yml"
    net.write_text("topology: [ Ring, Ring, Ring ]\nnpus_count: [ 2, 2, 2 ]\nbandwidth: [ tbd, tbd, tbd ]\n")
    rc, _, err = run(
        capsys, "collective", "--astra-network", str(net), "--collective", "all_reduce", "--size", "1MiB"
    )
    assert rc == 2 and "tbd" in err


def test_collective_on_two_dgx_h100_as_nccl_runs_it(capsys):
    # Issue 23's case: 1 GiB AllReduce on dgx-h100:2 took 42.8 ms (one ring through one NIC). NCCL's
    # choice is NVLS_TREE: 66.8 us + S / (8 x 57.7 x 16/30 GB/s) x 68/64 (its chunk pipeline: 64 loops of
    # 128 KiB per CTA, 5 stages) = 4.70 ms (tests/test_net_nvls.py);
    # published 430 GB/s busBw with NVLS on 2 such nodes (NVIDIA/nccl#1221) gives 4.68 ms.
    args = [
        "collective",
        "--topology",
        "dgx-h100:2",
        "--collective",
        "all_reduce",
        "--size",
        "1GiB",
        "--json",
    ]
    rc, out, _ = run(capsys, *args)
    assert rc == 0
    doc = json.loads(out)
    assert doc["nccl"] == "nvls_tree/Simple"
    assert doc["finish_ns"] == pytest.approx(66.8e3 + (1 << 30) / (8 * 57.7 * 16 / 30) * 68 / 64, rel=1e-3)
    assert abs(doc["finish_ns"] / (2 * 15 / 16 * (1 << 30) / 430) - 1) < 0.10
    # The ring forced: 8 rail-aligned channels, 30 steps of S/128 at 50 GB/s per NIC (5.03 ms) plus
    # latencies; published ~376 GB/s busBw (8 x 47 GB/s, nccl-tests#290) gives 5.35 ms.
    rc, out, _ = run(capsys, *args, "--algorithm", "ring")
    assert rc == 0
    doc = json.loads(out)
    assert doc["nccl"] == "ring/Simple"
    assert doc["finish_ns"] == pytest.approx(30 * (1 << 30) / 128 / 50, rel=0.01)
    assert abs(doc["finish_ns"] / (2 * 15 / 16 * (1 << 30) / 376) - 1) < 0.10
    rc, out, _ = run(
        capsys, "collective", "--topology", "dgx-h100:1", "--collective", "all_reduce", "--size", "8KiB"
    )
    assert rc == 0 and "NCCL ran " in out
