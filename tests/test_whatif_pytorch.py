"""What-if compute model: op classes, class factors from GPU numbers, and a what-if of the bundled 2-rank run."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from xsim.netmodels.cluster import topology_from_spec
from xsim.netmodels.models import build_model
from xsim.replay import ReplayConfig, simulate
from xsim.replay.whatif import WhatIfModel, class_factors, classify, whatif_model
from xsim.tracegen.catalog import gpu
from xsim.tracegen.importers.pytorch import import_pytorch
from xsim.traces import attrs as A
from xsim.traces import pb
from xsim.traces.traceset import discover

from tests.conftest import REPO
from xsim.cli import main

EX = REPO / "traces" / "examples" / "pytorch"


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("aten::addmm", "gemm"),
        ("aten::mm", "gemm"),
        ("aten::bmm", "gemm"),
        ("aten::linear", "gemm"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "gemm"),
        ("AddmmBackward0", "gemm"),
        ("aten::cudnn_convolution", "gemm"),
        ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm>(Params)", "gemm"),
        ("sm80_xmma_gemm_f16f16_f16f32", "gemm"),
        ("aten::layer_norm", "memory"),
        ("aten::gelu", "memory"),
        ("aten::add_", "memory"),
        ("aten::embedding_dense_backward", "memory"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "memory"),
        ("Memcpy HtoD (Pageable -> Device)", "memory"),
        ("aten::view", "host"),
        ("aten::as_strided", "host"),
        ("aten::empty_strided", "host"),
        ("## forward ##", "host"),
        ("nn.Module: layers.0.attn", "host"),
        ("ProfilerStep#3", "host"),
        ("Optimizer.step#AdamW.step", "host"),
        ("autograd::engine::evaluate_function: AddmmBackward0", "host"),
        ("xsim::start_offset", "host"),
    ],
)
def test_classifier(name: str, cls: str) -> None:
    assert classify(name) == cls


def test_factors_from_catalog_numbers() -> None:
    # Datasheet numbers in tracegen/catalog.py: V100 125 TFLOP/s, 900 GB/s; H100 SXM 989.4 TFLOP/s,
    # 3.35 TB/s; both with the default efficiencies (0.70 GEMM, 0.80 memory), which cancel.
    f = class_factors(gpu("V100"), gpu("H100"))
    assert f["gemm"] == pytest.approx(989.4 / 125, rel=1e-12)  # 7.9152
    assert f["memory"] == pytest.approx(3350 / 900, rel=1e-12)  # 3.7222
    assert f["host"] == 1.0


def test_node_durations() -> None:
    m = WhatIfModel({"gemm": 4.0, "memory": 2.0})
    node = A.make_node(1, "aten::addmm", pb.COMP_NODE, duration_micros=10, attrs={"duration_ns": 10_001})
    assert m.duration_ns(0, node) == 2_500  # 10001 / 4 = 2500.25 -> 2500
    node.name = "aten::gelu"
    assert m.duration_ns(0, node) == 5_001  # 10001 / 2 = 5000.5 -> 5001 (half up)
    node.name = "aten::view"
    assert m.duration_ns(0, node) == 10_001
    cpu = A.make_node(2, "aten::addmm", pb.COMP_NODE, duration_micros=7, attrs={A.IS_CPU_OP: True})
    assert m.duration_ns(0, cpu) == 7_000  # host side of a GPU run: unchanged, no exact ns -> µs x 1000
    coll = A.make_node(3, "all_reduce", pb.COMM_COLL_NODE, duration_micros=5, attrs={A.COMM_TYPE: 0})
    assert m.duration_ns(0, coll) == 5_000


@pytest.fixture(scope="module")
def two_rank(tmp_path_factory) -> tuple:
    tmp = tmp_path_factory.mktemp("whatif")
    res = import_pytorch(
        [str(EX / f"tinygpt_2rank_et.{r}.json.gz") for r in range(2)],
        [str(EX / f"tinygpt_2rank_kineto.{r}.json.gz") for r in range(2)],
    )
    res.write(tmp / "run")
    return discover(str(tmp / "run")), tmp


def _classes(ts) -> pl.DataFrame:
    rows = []
    for r in range(ts.num_ranks):
        for n in ts.load(r).nodes:
            rows.append((r, n.id, classify(n.name), A.get_int(n, A.LAYER, 0), n.type))
    return pl.DataFrame(rows, schema=["rank", "node_id", "cls", "layer", "ntype"], orient="row").with_columns(
        pl.col("node_id").cast(pl.UInt64), pl.col("rank").cast(pl.Int32)
    )


def test_faster_device_and_slower_network(two_rank) -> None:
    ts, _ = two_rank
    base = simulate(ts, network=None, compute=WhatIfModel({}), config=ReplayConfig(comm_mode="measured"))
    # A slower network than the loopback TCP the run used: 10 MB/s per link, 10 µs latency.
    slow = build_model("analytical", topology_from_spec("switch:2:10MBps:10us"))
    what = simulate(ts, network=slow, compute=whatif_model(gpu("V100"), gpu("H100")), config=ReplayConfig())
    cls = _classes(ts)

    def per(result, layer_filter):
        ops = result.ops.join(cls, on=["rank", "node_id"])
        return ops.filter(layer_filter).group_by("cls").agg(pl.col("duration_ns").sum())

    in_layers = pl.col("layer").is_between(1, 2) & (pl.col("ntype") == pb.COMP_NODE)
    b = dict(per(base, in_layers).iter_rows())
    w = dict(per(what, in_layers).iter_rows())
    # Compute-bound (GEMM) work of the transformer layers runs 989.4/125 = 7.9152x faster; memory-bound
    # work 3350/900 = 3.7222x; framework overhead keeps its time.
    assert b["gemm"] / w["gemm"] == pytest.approx(989.4 / 125, rel=1e-3)
    assert b["memory"] / w["memory"] == pytest.approx(3350 / 900, rel=1e-3)
    assert w["host"] == b["host"]
    # The slower network: every gradient all-reduce now takes at least bytes / 10 MB/s (2 ranks: a ring
    # all-reduce moves 2(n-1)/n = 1 x the buffer per rank), far above what loopback gloo took.
    coll_b = base.collectives.filter(pl.col("comm_type") == "ALL_REDUCE").sort("collective")
    coll_w = what.collectives.filter(pl.col("comm_type") == "ALL_REDUCE").sort("collective")
    assert coll_w["bytes"].to_list() == coll_b["bytes"].to_list() == [265984, 267008, 131584] * 2
    for nbytes, dur_b, dur_w in zip(
        coll_w["bytes"], coll_b["duration_ns"], coll_w["duration_ns"], strict=True
    ):
        assert dur_w >= nbytes / 10e6 * 1e9 > dur_b
    assert what.summary_dict()["comm_ns"] > base.summary_dict()["comm_ns"]
    assert what.summary_dict()["compute_ns"] < base.summary_dict()["compute_ns"]


def test_cli_as_gpu(two_rank, capsys) -> None:
    ts, tmp = two_rank
    args = ["replay", ts.prefix, "--comm", "measured", "--no-progress", "--json"]
    assert main(args) == 0
    base = capsys.readouterr().out
    assert main([*args, "--from-gpu", "V100", "--as-gpu", "H100", "--out", str(tmp / "res")]) == 0
    fast = capsys.readouterr().out
    b, f = json.loads(base), json.loads(fast)
    assert f["compute_model"].startswith("whatif(V100->H100)")
    assert f["iteration_time_ns"] < b["iteration_time_ns"]
    assert json.loads((tmp / "res" / "source.json").read_text())["trace"] == str(Path(ts.prefix).resolve())
    assert main([*args, "--as-gpu", "H100"]) == 2
    assert "--as-gpu and --from-gpu go together" in capsys.readouterr().err
    assert main([*args, "--as-gpu", "H100", "--from-gpu", "Z80"]) == 2
    assert "unknown GPU 'Z80'" in capsys.readouterr().err
