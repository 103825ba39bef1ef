"""Hypothetical GPUs, datasheet GPUs, one GPU name table and honest what-ifs (issue 26 items 4 and 7,
issue 27 item 6). Every expected number is worked out by hand in the comments."""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from xsim.tracegen import catalog
from xsim.tracegen.errors import CatalogError
from xsim.traces.stream import read_et

from tests.conftest import REPO

EX = REPO / "traces" / "examples" / "pytorch"
H100_PEAK = 989.4e12

SPEC = """name: {name}
model: llama2-7b
seq_len: 2048
micro_batches: 2
board_load: alone
{gpus}parallel: {{gpu: {gpu}, tp: 2, pp: 1, dp: 1, micro_batch: 1}}
"""
# Twice H100's dense BF16/FP8 peaks, H100's HBM, SMs and calibration ceilings.
H2X = (
    "gpus:\n  H2X: {peak_flops: 1.9788e+15, mem_bw: 3.35e+12, memory_bytes: 85899345920, fp8_flops: 3.958e+15, "
    "sms: 132, calibrated_as: H100}\n"
)


def _xsim(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "xsim", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )


def _gemm_ns(folder: Path, op: str = "L1.mlp_up_gate.fwd.mb0") -> int:
    (path,) = folder.glob("*.0.et")
    for n in read_et(path).nodes:
        if n.name == op:
            return next(a.int64_val or a.uint64_val for a in n.attr if a.name == "duration_ns")
    raise AssertionError(op)


def test_gemm_on_twice_the_peak_takes_half_the_compute_bound_time(tmp_path: Path) -> None:
    # Llama-2 7B MLP up+gate GEMM at TP 2: M = 2048 tokens, K = 4096, N = 2 x 11008 / 2 = 11008. Calibrated
    # model on H100 (tracegen/gemm.py): plateau 792.1/989.4 x 708.5/841.9 (the GH100's measured
    # sustained/burst ratio) = 0.673732; tile 256x128: 8 x 86 = 688 tiles on 132 SMs = 6 waves; each tile
    # 4096 + 240 columns of K (the BF16 per-tile cost) at the plateau x (17920 + 240) / 17920:
    # 6 x 2 x 256 x 128 x 4336 / (989.4e12 x 0.673732 / 132) / 1.013393 = 333,163.33 ns; operand bytes
    # 2 x (2048x4096 + 4096x11008 + 2048x11008) at 2,903 GB/s = 52,375 ns, so it is compute-bound. Twice the
    # peak, same SMs and ceilings (a definition borrowing H100's calibration borrows its ratio and per-tile
    # cost): 166,581.66 ns.
    for name, gpus, gpu in (("h1x", "", "H100"), ("h2x", H2X, "H2X")):
        (tmp_path / f"{name}.yaml").write_text(SPEC.format(name=name, gpus=gpus, gpu=gpu))
        r = _xsim("gen", str(tmp_path / f"{name}.yaml"), "--out", str(tmp_path / name))
        assert r.returncode == 0, r.stderr
    plateau = 792.1 / 989.4 * 708.5 / 841.9
    scale = (17920 + 240) / 17920
    h100 = 6 * 2 * 256 * 128 * (4096 + 240) / (H100_PEAK * plateau / 132) / scale * 1e9
    assert h100 == pytest.approx(333_163.33, abs=0.01)
    assert _gemm_ns(tmp_path / "h1x") == round(h100)
    assert _gemm_ns(tmp_path / "h2x") == round(h100 / 2) == 166_582
    # The definition is recorded in deployment.json and the set replays (its interconnect: H100's row).
    dep = json.loads((tmp_path / "h2x" / "deployment.json").read_text())
    assert dep["gpus"]["H2X"]["peak_flops"] == 1.9788e15
    assert dep["cluster"]["gpu_types"] == {"H2X": {"like": "H100"}}
    r = _xsim("replay", str(tmp_path / "h2x"), "--no-progress", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["memory"]["per_rank_capacity_bytes"] == [85899345920] * 2


def test_gpu_file_defines_gpus_for_gen_with_defaults_said(tmp_path: Path) -> None:
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text(
        "X1: {peak_flops: 2.0e+15, mem_bw: 5.0e+12, memory_bytes: 137438953472, nvlink_bandwidth: 9.0e+11,"
        " nic_bandwidth: 5.0e+10, nics: 2}\nX2: {peak_flops: 5.0e+14, mem_bw: 2.0e+12, memory_bytes: 1}\n"
    )
    spec = tmp_path / "x1.yaml"
    spec.write_text(SPEC.format(name="x1", gpus="", gpu="X1"))
    r = _xsim("gen", str(spec), "--out", str(tmp_path / "o"), "--gpu-file", str(gpus))
    assert r.returncode == 0, r.stderr
    # Nearest measured architecture to 2.0 PFLOP/s and 5 TB/s: |ln(2000/2250)| + |ln(5/8)| = 0.588 (B200)
    # against |ln(2000/989.4)| + |ln(5/4.8)| = 0.745 (H200) and 0.763 (H100).
    assert "note: GPU X1 is hypothetical: calibration ceilings (GEMM plateau, copy efficiency), sms from B200 " \
        "(nearest known architecture)" in r.stdout  # fmt: skip
    dep = json.loads((tmp_path / "o" / "deployment.json").read_text())
    assert set(dep["gpus"]) == {"X1"}  # X2 of the file is not used: not recorded
    # NIC: 2 x 50 GB/s per GPU; NVLink 900 GB/s per direction; the rest of B200's Table 5 row.
    assert dep["cluster"]["gpu_types"] == {
        "X1": {"like": "B200", "scale_up_bandwidth": 9e11, "nic_bandwidth": 1e11}
    }
    # Without the file the name is unknown, and the error says how to describe a GPU.
    r = _xsim("gen", str(spec), "--out", str(tmp_path / "o2"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "unknown GPU 'X1'" in r.stderr and "--gpu-file" in r.stderr and "peak_flops" in r.stderr
    # A missing GPU file, and one that redefines a catalog GPU, are one line each.
    r = _xsim("gen", str(spec), "--out", str(tmp_path / "o2"), "--gpu-file", str(tmp_path / "none.yaml"))
    assert r.returncode == 2 and r.stderr.strip().endswith(
        "none.yaml: cannot read GPU file: No such file or directory"
    )
    gpus.write_text("H100: {peak_flops: 1.0e+15, mem_bw: 1.0e+12, memory_bytes: 1}\n")
    r = _xsim("gen", str(spec), "--out", str(tmp_path / "o2"), "--gpu-file", str(gpus))
    assert r.returncode == 2 and "GPU H100 is a catalog GPU: a GPU file defines new GPUs" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_definition_errors_are_one_line() -> None:
    with pytest.raises(CatalogError, match="to describe it, give mem_bw, memory_bytes"):
        catalog.define_gpu("X", {"peak_flops": 1e15})
    with pytest.raises(CatalogError, match="is a catalog GPU"):
        catalog.define_gpu("h100", {"peak_flops": 1e15, "mem_bw": 1e12, "memory_bytes": 1})
    with pytest.raises(CatalogError, match="calibrated_as must be one of"):
        catalog.define_gpu(
            "X", {"peak_flops": 1e15, "mem_bw": 1e12, "memory_bytes": 1, "calibrated_as": "V100"}
        )
    with pytest.raises(CatalogError, match="unknown key"):
        catalog.define_gpu("X", {"peak_flops": 1e15, "mem_bw": 1e12, "memory_bytes": 1, "tflops": 3})


def test_datasheet_gpus_and_one_name_table() -> None:
    from xsim.netmodels.presets import GBIT, canonical_gpu, interconnect
    from xsim.traces.gpu_names import GPU_ALIASES, GPU_NAMES, from_device_name

    # Dense figures = the datasheets' sparse ones / 2 (GB200 NVL72: 360 PFLOPS BF16 sparse / 72 GPUs / 2).
    assert catalog.gpu("GB200").peak_flops == pytest.approx(360e15 / 72 / 2)
    assert catalog.gpu("MI300X").peak_flops == pytest.approx(2614.9e12 / 2, rel=1e-4)
    assert catalog.gpu("L40S").peak_flops == 362.05e12  # L40S datasheet: 362.05 dense (733 sparse, rounded)
    assert catalog.gpu("h20-96gb").memory_bytes == 96 * 2**30
    assert catalog.gpu("MI300X").calibration_key == "H100"
    # MI300X Infinity Fabric: 7 links x 128 GB/s bidirectional / 2 = 448 GB/s per direction = 3584 Gb/s.
    assert interconnect("table5", "MI300X").scale_up_bandwidth == pytest.approx(7 * 128e9 / 2)
    assert interconnect("table6", "L40S").scale_up_bandwidth == 256 * GBIT
    # One table: both catalogs resolve every name and alias alike.
    assert catalog.ALIASES is GPU_ALIASES
    assert tuple(catalog.GPU_NAMES) == GPU_NAMES
    for name in (*GPU_NAMES, *GPU_ALIASES):
        if catalog.canonical_gpu_name(name) != "V100":
            assert canonical_gpu(name) == catalog.canonical_gpu_name(name)
    assert from_device_name("NVIDIA A100-SXM4-40GB") == "A100-40GB"
    assert from_device_name("NVIDIA A100-SXM4-80GB") == "A100-80GB"
    assert from_device_name("NVIDIA H100 80GB HBM3") == "H100"
    assert from_device_name("AMD Instinct MI300X") == "MI300X"
    assert from_device_name("Intel Gaudi") is None


def test_search_takes_a_defined_gpu() -> None:
    from xsim.explore.search import parse_cluster

    with catalog.defined_gpus(
        {"X9": catalog.define_gpu("X9", {"peak_flops": 1e15, "mem_bw": 3e12, "memory_bytes": 2**36})}
    ):
        assert parse_cluster("4xX9+2xMI300X")[0].gpu == "X9"


# --- what-if honesty -------------------------------------------------------------------------------------


def _import(tmp_path: Path, device: str | None) -> Path:
    """The bundled 2-rank run imported, its Kineto files given `deviceProperties` naming `device`."""
    kin = []
    for r in (0, 1):
        doc = json.loads(gzip.open(EX / f"tinygpt_2rank_kineto.{r}.json.gz").read())
        if device:
            doc["deviceProperties"] = [{"id": 0, "name": device}]
        p = tmp_path / f"k{r}.json"
        p.write_text(json.dumps(doc))
        kin.append(str(p))
    et = [str(EX / f"tinygpt_2rank_et.{r}.json.gz") for r in (0, 1)]
    # The set's prefix in a folder of its own: an import never writes into the folder of its inputs (issue 27).
    r = _xsim("import", "pytorch", "--et", *et, "--kineto", *kin, "--out", str(tmp_path / "run" / "run"))
    assert r.returncode == 0, r.stderr
    return tmp_path / "run" / "run"


def test_whatif_reads_the_recorded_gpu_and_flags_contradictions(tmp_path: Path) -> None:
    run = _import(tmp_path, "NVIDIA H100 80GB HBM3")
    r = _xsim("replay", str(run), "--as-gpu", "B200", "--topology", "nodes:B200x2", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "what-if: recorded GPU H100 (Kineto deviceProperties 'NVIDIA H100 80GB HBM3')" in r.stderr
    # GEMM factor B200/H100 = 2250 / 989.4 = 2.274 (both at the catalog's 0.70 gemm_eff).
    assert f"gemm={2250 / 989.4:.4g}" in r.stdout
    r = _xsim("replay", str(run), "--as-gpu", "B200", "--from-gpu", "V100", "--topology", "nodes:B200x2",
              "--no-progress")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "--from-gpu V100 contradicts the recorded device 'NVIDIA H100 80GB HBM3' (H100)" in r.stderr
    # The bundled run ran on CPU: said so, whatever --from-gpu claims.
    assert "recorded on CPU" in r.stderr


def test_whatif_without_a_recorded_gpu_needs_from_gpu(tmp_path: Path) -> None:
    run = _import(tmp_path, None)
    r = _xsim("replay", str(run), "--as-gpu", "H100", "--topology", "nodes:H100x2", "--no-progress")
    assert r.returncode == 2 and "the trace names no recorded GPU (Kineto deviceProperties)" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_whatif_time_split_explains_a_null_result(tmp_path: Path) -> None:
    # On the imported CPU run every op is CPU-side and runs as recorded; the time split of the last rank
    # adds up with its idle and exposed time to at least the iteration (ops may overlap).
    run = _import(tmp_path, None)
    r = _xsim("replay", str(run), "--comm", "measured", "--no-progress")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("time split"))
    assert "GPU compute" in line and "CPU ops" in line and "exposed communication" in line


def test_whatif_on_a_generated_set_prices_and_checks_memory_on_the_target(tmp_path: Path) -> None:
    # 7B at TP 2 on H100 needs 69.32 GiB per rank (memory.json); a what-if as L40S (48 GiB) must not fit,
    # as B200 (192 GiB) it fits and is unpriced (no list price recorded).
    (tmp_path / "s.yaml").write_text(SPEC.format(name="s", gpus="", gpu="H100"))
    assert _xsim("gen", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o")).returncode == 0
    r = _xsim("replay", str(tmp_path / "o"), "--as-gpu", "L40S", "--no-progress", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["memory"]["fits"] is False and s["memory"]["per_rank_capacity_bytes"] == [48 * 2**30] * 2
    assert s["cost"]["unpriced_gpus"] == ["L40S"]
    assert "cost and memory lines are for the target GPU L40S (48 GiB, no list price)" in r.stderr
    assert "recorded GPU H100 (deployment.json device groups 'H100')" in r.stderr
    r = _xsim("replay", str(tmp_path / "o"), "--as-gpu", "B200", "--no-progress", "--json")
    s = json.loads(r.stdout)
    assert s["memory"]["fits"] is True and s["cost"]["unpriced_gpus"] == ["B200"]
    assert math.isclose(s["memory"]["peak_bytes"] / 2**30, 69.32, abs_tol=0.01)
    # A hypothetical target from a --gpu-file, on a `nodes:` topology of it: GEMM factor 2 (twice H100's
    # peak at the same efficiency), 128 GiB capacity, no topology-mismatch warning.
    (tmp_path / "gpus.yaml").write_text(
        "X1: {peak_flops: 1.9788e+15, mem_bw: 3.35e+12, memory_bytes: 137438953472}\n"
    )
    r = _xsim("replay", str(tmp_path / "o"), "--as-gpu", "X1", "--gpu-file", str(tmp_path / "gpus.yaml"),
              "--topology", "nodes:X1x2", "--no-progress", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert "gemm=2," in s["compute_model"] and s["memory"]["per_rank_capacity_bytes"] == [128 * 2**30] * 2
    assert "unlike the traces" not in r.stderr


# --- searched and swept ----------------------------------------------------------------------------------

SWEEP = """name: hypo
base:
  model: llama2-7b
  seq_len: 2048
  micro_batches: 2
  gpus:
    H2X: {peak_flops: 1.9788e+15, mem_bw: 3.35e+12, memory_bytes: 85899345920, sms: 132, calibrated_as: H100,
          price_per_hour: 24.58}
  device_groups:
    - {gpu: H100, ranks: [0, 1], tp: 2, layers: [1, 32], micro_batch: 1, pp_stage: 0}
axes:
  gpus: [H100, H2X, X1]
"""


def test_sweep_over_catalog_spec_defined_and_file_defined_gpus(tmp_path: Path) -> None:
    (tmp_path / "sweep.yaml").write_text(SWEEP)
    (tmp_path / "gpus.yaml").write_text(
        "X1: {peak_flops: 1.9788e+15, mem_bw: 3.35e+12, memory_bytes: 85899345920, sms: 132, calibrated_as: H100}\n"
    )
    r = _xsim("sweep", str(tmp_path / "sweep.yaml"), "--out", str(tmp_path / "o"), "--gpu-file",
              str(tmp_path / "gpus.yaml"), "--workers", "1", "--no-progress", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = {row["gpus"]: row for row in json.loads(r.stdout)}
    assert set(rows) == {"2xH100", "2xH2X", "2xX1"} and all(v["status"] == "ok" for v in rows.values())
    # H2X and X1 are the same hypothetical GPU (one in the spec, one in the file): identical iterations.
    assert rows["2xH2X"]["iteration_time_ns"] == rows["2xX1"]["iteration_time_ns"]
    # Twice H100's peak: faster, not twice (memory-bound ops, communication and launch floors keep their time).
    assert rows["2xH2X"]["iteration_time_ns"] < rows["2xH100"]["iteration_time_ns"]
    # H2X priced at twice H100's $12.29/h: $/Mtok = 2 x 24.58 $/h x iteration / tokens, by hand from its row.
    t = rows["2xH2X"]["iteration_time_ns"] / 3.6e12
    assert rows["2xH2X"]["cost_usd_per_million_tokens"] == pytest.approx(2 * 24.58 * t / 4096 * 1e6, rel=1e-5)


def test_plan_search_on_a_file_defined_gpu(tmp_path: Path) -> None:
    (tmp_path / "gpus.yaml").write_text(
        "X1: {peak_flops: 1.9788e+15, mem_bw: 3.35e+12, memory_bytes: 85899345920, sms: 132, calibrated_as: H100}\n"
    )
    out = tmp_path / "search"
    r = _xsim("plan", "--search", "2xX1", "--model", "llama2-7b", "--global-batch", "4", "--seq", "2048",
              "--top", "1", "--out", str(out), "--workers", "1", "--gpu-file", str(tmp_path / "gpus.yaml"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    plan = (out / "plan_01.yaml").read_text()
    assert "X1: {peak_flops: 1978800000000000.0" in plan  # the written plan carries the definition
    # The written plan generates on its own, without the file.
    r = _xsim("gen", str(out / "plan_01.yaml"), "--out", str(tmp_path / "g"))
    assert r.returncode == 0, r.stderr
