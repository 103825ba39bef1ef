"""Validate xsim against published, measured Megatron-LM training runs (docs/validation.md).

Each run of scripts/data/published_runs.yaml (source, table, row, full configuration, measured time per
iteration) becomes an xsim deployment spec, is generated and replayed through the library (tracegen,
netmodels, replay: no CLI output is parsed), and is compared with the measured time. The script prints,
and with --out writes, a Markdown table: run, source, configuration, measured, predicted, error, and the
median |error|; then the per-layer forward/backward times of the 22B layer of Korthikanti et al. (Table 4).

    python scripts/validate_published.py                       # every run within the node budget
    python scripts/validate_published.py --only korthikanti22-t5-22b-full --no-layers
    python scripts/validate_published.py --out docs/validation_table.md --max-nodes 8000000

Speed: a run with data parallelism replays one DP replica (replay's fold: proven, the tables equal an
unfolded replay's). A run whose micro-batch count would exceed --max-nodes is replayed at two smaller
micro-batch counts m1 < m2 (multiples of the pipeline depth, where 1F1B is in steady state) and its time
extrapolated linearly to the real count m: T(m) = T(m1) + (m - m1) (T(m2) - T(m1)) / (m2 - m1); the
table says so on that row (tests/test_validate_published.py checks the extrapolation against a full replay).
A run too large even so is listed as not replayed, with its node estimate.

No calibration constant is read from or fitted to these runs: they are the validation set.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DATA = Path(__file__).resolve().parent / "data" / "published_runs.yaml"

RECOMPUTE = ("none", "selective", "full")
# The dataset's precision words: "fp16" and "bf16" as the source's launch flags say; "mixed16" where the
# paper says only "mixed precision" (16-bit). The A100's dense FP16 and BF16 tensor peaks are equal
# (312 TFLOP/s, NVIDIA A100 datasheet), so mapping "mixed16" to bf16 cannot change a prediction.
PRECISION_SPEC = {"fp16": "fp16", "bf16": "bf16", "mixed16": "bf16", "fp8": "fp8"}
ATTENTION = ("flash", "unfused")
MODEL_KEYS = ("layers", "hidden", "heads")
PARALLEL_KEYS = ("tp", "pp", "dp", "micro_batch", "global_batch", "virtual_stages")
RUN_KEYS = (
    "id", "source", "where", "config_source", "config_where", "model", "parallel", "recompute",
    "sequence_parallel", "precision", "measured", "notes",
)  # fmt: skip
DEFAULT_KEYS = ("seq_len", "vocab", "gpu", "cluster", "attention")
GPUS_PER_NODE = 8  # DGX A100 / DGX H100: eight GPUs per node (NVIDIA DGX datasheets)
# Trace nodes per (rank, layer, micro-batch), used only to decide whether a run fits the node budget (never
# in a result): counted on the generated 22B model of Korthikanti et al. (TP 8, 48 layers, one micro-batch),
# 30 / 34 / 45 without / selective / full recompute, +4 with sequence parallelism (AllGather /
# ReduceScatter pairs), rounded up.
NODES_PER_LAYER_STEP = {"none": 31, "selective": 35, "full": 46}
SP_EXTRA_NODES = 4
DEFAULT_MAX_NODES = 4_000_000  # generated nodes per replay: ~2 minutes of generation on the 2-core dev box


class ValidationDataError(Exception):
    """The dataset file is malformed: one line naming the file and the run."""


@dataclass(frozen=True)
class Source:
    """A publication or launch script the dataset cites."""

    key: str
    cite: str
    conversion: str = ""


@dataclass(frozen=True)
class Run:
    """One measured training run with its full configuration."""

    id: str
    source: str
    where: str
    config_source: str
    config_where: str
    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    gpu: str
    cluster: str
    attention: str
    tp: int
    pp: int
    dp: int
    micro_batch: int
    global_batch: int
    virtual_stages: int
    recompute: str
    sequence_parallel: bool
    precision: str
    measured_kind: str  # "iteration_s" or "tflops_per_gpu"
    measured_value: float
    notes: str = ""

    @property
    def gpus(self) -> int:
        """GPUs of the whole run."""
        return self.tp * self.pp * self.dp

    @property
    def micro_batches(self) -> int:
        """Micro-batches per pipeline per iteration."""
        return self.global_batch // (self.micro_batch * self.dp)


@dataclass(frozen=True)
class LayerRow:
    """One row of a published single-layer benchmark (forward and backward time of one layer)."""

    experiment: str
    recompute: str
    sequence_parallel: bool
    forward_ms: float
    backward_ms: float


@dataclass(frozen=True)
class LayerBenchmark:
    """A single-layer benchmark: the model and layout it ran, and its rows."""

    source: str
    where: str
    run: Run  # the layout (recompute / sequence_parallel are taken per row)
    rows: tuple[LayerRow, ...]


@dataclass(frozen=True)
class Dataset:
    """The validation set: sources, runs, the layer benchmark and the runs left out (with reasons)."""

    sources: Mapping[str, Source]
    runs: tuple[Run, ...]
    layers: LayerBenchmark | None
    excluded: tuple[tuple[str, str], ...]


def megatron_iteration_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """FLOPs of one iteration with full recomputation: Narayanan et al. 2021, equation (3).

    F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).
    """
    return 96.0 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def measured_seconds(run: Run) -> float:
    """The measured time per iteration: as printed, or converted from achieved TFLOP/s per GPU by eq. (3)."""
    if run.measured_kind == "iteration_s":
        return run.measured_value
    flops = megatron_iteration_flops(run.global_batch, run.seq_len, run.layers, run.hidden, run.vocab)
    return flops / (run.gpus * run.measured_value * 1e12)


# ---------------------------------------------------------------- dataset


def _fail(path: str, where: str, message: str) -> ValidationDataError:
    return ValidationDataError(f"{path}: {where}: {message}")


def _int(path: str, where: str, raw: Mapping, key: str) -> int:
    v = raw.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise _fail(path, where, f"{key} must be a positive integer, got {v!r}")
    return v


def _text(path: str, where: str, raw: Mapping, key: str, required: bool = True) -> str:
    v = raw.get(key, "" if not required else None)
    if not isinstance(v, str) or (required and not v.strip()):
        raise _fail(path, where, f"{key} must be a non-empty text, got {v!r}")
    return " ".join(v.split())


def _run(path: str, raw: Any, index: int, sources: Mapping[str, Mapping], defaults_of: Mapping) -> Run:
    where = f"runs[{index}]"
    if not isinstance(raw, Mapping):
        raise _fail(path, where, "must be a mapping")
    rid = _text(path, where, raw, "id")
    where = f"run {rid}"
    unknown = sorted(set(raw) - set(RUN_KEYS))
    if unknown:
        raise _fail(path, where, f"unknown key(s) {', '.join(unknown)}")
    src = _text(path, where, raw, "source")
    if src not in sources:
        raise _fail(path, where, f"source {src!r} is not in sources ({', '.join(sources)})")
    csrc = raw.get("config_source", "")
    if csrc and csrc not in sources:
        raise _fail(path, where, f"config_source {csrc!r} is not in sources")
    if csrc and not raw.get("config_where"):
        raise _fail(path, where, "config_source needs config_where (which script, which case)")
    defaults = defaults_of.get(src) or {}
    missing = [k for k in DEFAULT_KEYS if k not in defaults]
    if missing:
        raise _fail(path, where, f"source {src} gives no {', '.join(missing)} in its defaults")
    model = raw.get("model")
    par = raw.get("parallel")
    if not isinstance(model, Mapping) or not isinstance(par, Mapping):
        raise _fail(path, where, "model and parallel must be mappings")
    for block, keys in ((model, MODEL_KEYS), (par, PARALLEL_KEYS)):
        gone = [k for k in keys if k not in block]
        extra = sorted(set(block) - set(keys))
        if gone or extra:
            raise _fail(path, where, f"incomplete or unknown configuration: missing {gone}, unknown {extra}")
    rc = raw.get("recompute")
    if rc not in RECOMPUTE:
        raise _fail(path, where, f"recompute must be one of {', '.join(RECOMPUTE)}, got {rc!r}")
    sp = raw.get("sequence_parallel")
    if not isinstance(sp, bool):
        raise _fail(path, where, f"sequence_parallel must be true or false, got {sp!r}")
    prec = raw.get("precision")
    if prec not in PRECISION_SPEC:
        raise _fail(path, where, f"precision must be one of {', '.join(PRECISION_SPEC)}, got {prec!r}")
    if defaults["attention"] not in ATTENTION:
        raise _fail(path, where, f"attention must be one of {', '.join(ATTENTION)}")
    meas = raw.get("measured")
    if not isinstance(meas, Mapping) or len(meas) != 1:
        raise _fail(path, where, "measured must hold exactly one of iteration_s, tflops_per_gpu")
    ((kind, value),) = meas.items()
    if kind not in ("iteration_s", "tflops_per_gpu") or not isinstance(value, int | float) or value <= 0:
        raise _fail(
            path, where, f"measured {kind}: {value!r} is not a positive iteration_s or tflops_per_gpu"
        )
    if kind == "tflops_per_gpu" and not sources[src].get("conversion"):
        raise _fail(path, where, f"source {src} states no conversion from TFLOP/s to time")
    run = Run(
        id=rid, source=src, where=_text(path, where, raw, "where"), config_source=csrc,
        config_where=_text(path, where, raw, "config_where", required=bool(csrc)),
        layers=_int(path, where, model, "layers"), hidden=_int(path, where, model, "hidden"),
        heads=_int(path, where, model, "heads"), seq_len=_int(path, where, defaults, "seq_len"),
        vocab=_int(path, where, defaults, "vocab"), gpu=str(defaults["gpu"]), cluster=str(defaults["cluster"]),
        attention=str(defaults["attention"]),
        tp=_int(path, where, par, "tp"), pp=_int(path, where, par, "pp"), dp=_int(path, where, par, "dp"),
        micro_batch=_int(path, where, par, "micro_batch"), global_batch=_int(path, where, par, "global_batch"),
        virtual_stages=_int(path, where, par, "virtual_stages"), recompute=rc, sequence_parallel=sp,
        precision=prec, measured_kind=kind, measured_value=float(value),
        notes=_text(path, where, raw, "notes", required=False),
    )  # fmt: skip
    _check_layout(path, where, run)
    return run


def _check_layout(path: str, where: str, run: Run) -> None:
    if run.global_batch % (run.micro_batch * run.dp):
        raise _fail(path, where, f"global_batch {run.global_batch} not a multiple of micro_batch x dp")
    if run.layers % (run.pp * run.virtual_stages):
        raise _fail(path, where, f"{run.layers} layers do not split into pp x virtual_stages equal chunks")
    if run.virtual_stages > 1 and run.micro_batches % run.pp:
        # Megatron's interleaved schedule needs the micro-batch count to be a multiple of the pipeline size.
        raise _fail(
            path, where, f"interleaved: {run.micro_batches} micro-batches not a multiple of pp {run.pp}"
        )
    if run.heads % run.tp or run.hidden % run.heads:
        raise _fail(path, where, f"tp {run.tp} / heads {run.heads} / hidden {run.hidden} do not divide")


def load_dataset(path: str | os.PathLike[str] = DATA) -> Dataset:
    """Read and check the dataset: every run has a source and a complete configuration."""
    p = os.fspath(path)
    try:
        with open(p, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError) as exc:
        raise ValidationDataError(f"{p}: cannot read: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("sources"), Mapping):
        raise ValidationDataError(f"{p}: needs a sources mapping and a runs list")
    raw_sources = doc["sources"]
    sources = {}
    for key, s in raw_sources.items():
        if not isinstance(s, Mapping):
            raise _fail(p, f"source {key}", "must be a mapping")
        sources[str(key)] = Source(
            str(key), _text(p, f"source {key}", s, "cite"), str(s.get("conversion", ""))
        )
    defaults_of = {k: (s.get("defaults") or {}) for k, s in raw_sources.items()}
    raw_runs = doc.get("runs")
    if not isinstance(raw_runs, list) or not raw_runs:
        raise ValidationDataError(f"{p}: runs must be a non-empty list")
    runs = tuple(_run(p, r, i, raw_sources, defaults_of) for i, r in enumerate(raw_runs))
    seen: set[str] = set()
    for r in runs:
        if r.id in seen:
            raise _fail(p, f"run {r.id}", "id used twice")
        seen.add(r.id)
    layers = _layer_benchmark(p, doc.get("layer_benchmark"), raw_sources, defaults_of)
    excluded = []
    for i, e in enumerate(doc.get("excluded") or []):
        if not isinstance(e, Mapping):
            raise _fail(p, f"excluded[{i}]", "must be a mapping")
        excluded.append((_text(p, f"excluded[{i}]", e, "what"), _text(p, f"excluded[{i}]", e, "reason")))
    return Dataset(sources, runs, layers, tuple(excluded))


def _layer_benchmark(path: str, raw: Any, sources: Mapping, defaults_of: Mapping) -> LayerBenchmark | None:
    if raw is None:
        return None
    where = "layer_benchmark"
    if not isinstance(raw, Mapping) or not isinstance(raw.get("rows"), list) or not raw["rows"]:
        raise _fail(path, where, "must be a mapping with a non-empty rows list")
    base = {
        "id": "layer-benchmark", "source": raw.get("source"), "where": raw.get("where"),
        "model": raw.get("model"), "parallel": raw.get("parallel"), "recompute": "none",
        "sequence_parallel": False, "precision": raw.get("precision"), "measured": {"iteration_s": 1.0},
    }  # fmt: skip
    run = _run(path, base, 0, sources, defaults_of)
    rows = []
    for i, r in enumerate(raw["rows"]):
        w = f"{where}.rows[{i}]"
        if not isinstance(r, Mapping) or r.get("recompute") not in RECOMPUTE:
            raise _fail(path, w, "needs recompute none|selective|full")
        if not isinstance(r.get("sequence_parallel"), bool):
            raise _fail(path, w, "needs sequence_parallel true|false")
        ms = [r.get("forward_ms"), r.get("backward_ms")]
        if not all(isinstance(v, int | float) and v > 0 for v in ms):
            raise _fail(path, w, f"forward_ms and backward_ms must be positive numbers, got {ms}")
        rows.append(
            LayerRow(_text(path, w, r, "experiment"), r["recompute"], r["sequence_parallel"], *map(float, ms))
        )
    return LayerBenchmark(str(run.source), run.where, run, tuple(rows))


# ---------------------------------------------------------------- spec


def spec_features() -> frozenset[str]:
    """The spec keys this checkout of tracegen accepts, of those the validation needs."""
    from tracegen.spec import TOP_KEYS

    return frozenset(TOP_KEYS)


def _explicit_dgx_cluster(run: Run) -> dict[str, Any]:
    """A DGX-A100-like cluster in today's description keys, for checkouts without the dgx-a100 preset.

    Nodes of 8 GPUs; NVLink from the interconnect preset (A100 NVLink 3: 600 GB/s total, 300 GB/s per
    direction, NVIDIA A100 datasheet); one 200 Gb/s HDR NIC per GPU (DGX A100 datasheet: 8 single-port
    ConnectX-6); one non-blocking switch.
    """
    nodes = []
    ranks_per_replica = run.tp * run.pp
    total = ranks_per_replica * run.dp
    for i in range(math.ceil(total / GPUS_PER_NODE)):
        ranks = list(range(i * GPUS_PER_NODE, min(total, (i + 1) * GPUS_PER_NODE)))
        nodes.append({"name": f"node{i}", "gpu": run.gpu, "ranks": ranks, "nic_bandwidth": "200Gbps"})
    return {"preset": "table6", "nodes": nodes, "fabric": {"kind": "switch"}}


def spec_for(
    run: Run,
    *,
    micro_batches: int | None = None,
    recompute: str | None = None,
    sequence_parallel: bool | None = None,
    features: frozenset[str] | None = None,
) -> dict[str, Any]:
    """The xsim deployment spec (a mapping for tracegen.load_spec) of a run.

    With the agreed keys (`parallel:`, `recompute`, `precision`, `attention`, `cluster: dgx-a100`) when this
    checkout has them; otherwise today's explicit device groups, leaving out what cannot be said yet
    (the result of such a spec is a harness check, not a validation: `legacy_gaps` names what is missing).
    """
    feats = spec_features() if features is None else features
    m = run.micro_batches if micro_batches is None else micro_batches
    rc = run.recompute if recompute is None else recompute
    sp = run.sequence_parallel if sequence_parallel is None else sequence_parallel
    spec: dict[str, Any] = {
        "name": run.id,
        "model": {
            "name": run.id,
            "layers": run.layers,
            "hidden": run.hidden,
            "ffn_hidden": 4 * run.hidden,
            "heads": run.heads,
            "kv_heads": run.heads,
            "vocab": run.vocab,
            "seq_len": run.seq_len,
            "activation": "gelu",
            "norm": "layernorm",
            "linear_bias": True,
        },  # fmt: skip
        "seq_len": run.seq_len,
        "schedule": "1f1b",
        "sequence_parallel": sp,
    }
    if "parallel" in feats:
        spec["parallel"] = {
            "gpu": run.gpu, "tp": run.tp, "pp": run.pp, "dp": run.dp, "micro_batch": run.micro_batch,
            "global_batch": m * run.micro_batch * run.dp, "virtual_stages": run.virtual_stages,
        }  # fmt: skip
    else:
        spec["micro_batches"] = m
        spec["device_groups"] = _device_groups(run)
    if "recompute" in feats and rc != "none":
        spec["recompute"] = rc
    if "precision" in feats:
        spec["precision"] = PRECISION_SPEC[run.precision]
    if "attention" in feats:
        spec["attention"] = run.attention
    if "compute_model" in feats:
        # The shape-aware GEMM model calibrated on microbenchmarks (tracegen's default stays the flat
        # roofline for backward compatibility).
        spec["compute_model"] = "calibrated"
    spec["cluster"] = run.cluster if _has_cluster_preset(run.cluster) else _explicit_dgx_cluster(run)
    return spec


def legacy_gaps(run: Run, features: frozenset[str] | None = None, recompute: str | None = None) -> list[str]:
    """What the spec of `run` cannot say in this checkout (empty when every setting is expressed)."""
    feats = spec_features() if features is None else features
    rc = run.recompute if recompute is None else recompute
    gaps = []
    if rc != "none" and "recompute" not in feats:
        gaps.append(f"recompute {rc}")
    if run.virtual_stages > 1 and "parallel" not in feats and "virtual_stages" not in feats:
        gaps.append(f"virtual_stages {run.virtual_stages}")
    if "precision" not in feats:
        gaps.append("precision")
    if "attention" not in feats:
        gaps.append(f"attention {run.attention}")
    if "compute_model" not in feats:
        gaps.append("calibrated compute model")
    if not _has_cluster_preset(run.cluster):
        gaps.append(f"cluster {run.cluster} (explicit nodes used)")
    return gaps


def _has_cluster_preset(name: str) -> bool:
    """Whether netmodels knows the cluster preset `name` (dgx-a100 / dgx-h100 arrive with issue 10)."""
    from netmodels import presets
    from tracegen import spec

    return name in getattr(spec, "CLUSTER_SYSTEMS", ()) and name in getattr(presets, "SYSTEM_PRESETS", {})


def _device_groups(run: Run) -> list[dict[str, Any]]:
    """Explicit device groups in Megatron's rank order (tp fastest, then dp, then pp), no interleaving."""
    per = run.layers // run.pp
    out = []
    for s in range(run.pp):
        for d in range(run.dp):
            base = run.tp * (d + run.dp * s)
            out.append(
                {
                    "id": len(out), "gpu": run.gpu, "ranks": list(range(base, base + run.tp)), "tp": run.tp,
                    "layers": [s * per + 1, (s + 1) * per], "micro_batch": run.micro_batch, "pp_stage": s,
                    "dp_replica": d,
                }
            )  # fmt: skip
    return out


# ---------------------------------------------------------------- replay


@dataclass(frozen=True)
class Replay:
    """One generated and replayed spec."""

    iteration_ns: int
    nodes: int  # nodes generated (all ranks)
    replayed_ranks: int  # ranks simulated (one replica when folded)
    wall_s: float
    ops: Any = None  # polars DataFrame of the replayed ops when asked for
    phases_s: tuple[float, float, float] = (0.0, 0.0, 0.0)  # generate, write, replay (wall seconds)


def replay_spec(spec: Mapping[str, Any], *, keep_ops: bool = False, fold: bool = True) -> Replay:
    """Generate a spec's traces and replay them on the analytical network model (folding DP replicas
    when `fold`)."""
    from netmodels.cluster import build_cluster
    from netmodels.models import build_model
    from replay import DurationModel, ReplayError, simulate
    from tracegen import generate, load_spec
    from tracegen.spec import save_deployment
    from traces.traceset import discover

    t0 = time.perf_counter()
    dep = load_spec(spec)
    # Homogeneous deployments: the generator emits the DP gradient sync itself and the planner's rewrite
    # adds nothing (docs/tracegen.md), so it is skipped.
    bundle = generate(dep, rewrite=False)
    t_gen = time.perf_counter()
    nodes = sum(len(v) for v in bundle.nodes.values())
    nodes_ranks = len(bundle.nodes)
    replicas: dict[int, list[tuple[int, list[int]]]] = {}
    for dg in dep.device_groups:
        replicas.setdefault(dg.dp_replica, []).append((dg.pp_stage, list(dg.ranks)))
    reps = [[r for _s, ranks in sorted(stages) for r in ranks] for _d, stages in sorted(replicas.items())]
    with tempfile.TemporaryDirectory(prefix="xsim-valid-") as tmp:
        bundle.write(tmp, dep.name)
        save_deployment(dep, os.path.join(tmp, "deployment.json"))
        del bundle
        t_write = time.perf_counter()
        network = build_model("analytical", build_cluster(json.loads(dep.cluster_json)))
        # The generator's own op times (duration_micros), which carry the spec's compute model.
        ts = discover(tmp)
        folded = fold and len(reps) > 1
        try:
            result = simulate(ts, network=network, compute=DurationModel(), fold=reps if folded else None)
        except ReplayError:
            if not folded:
                raise
            # Folding is proven, never assumed: when the proof fails (a collective timing differently for
            # another replica, e.g. a DP ring crossing nodes unevenly), the whole set is replayed; an
            # error that is not about folding comes back from that replay.
            folded = False
            network = build_model("analytical", build_cluster(json.loads(dep.cluster_json)))
            result = simulate(ts, network=network, compute=DurationModel())
    summary = result.summary_dict()
    t_end = time.perf_counter()
    return Replay(
        iteration_ns=int(summary["iteration_time_ns"]),
        nodes=nodes,
        replayed_ranks=len(reps[0]) if folded else nodes_ranks,
        wall_s=t_end - t0,
        ops=result.ops if keep_ops else None,
        phases_s=(t_gen - t0, t_write - t_gen, t_end - t_write),
    )


def estimate_nodes(run: Run, micro_batches: int) -> int:
    """Rough count of generated nodes (budget decision only)."""
    per = NODES_PER_LAYER_STEP[run.recompute] + (SP_EXTRA_NODES if run.sequence_parallel else 0)
    return run.gpus * micro_batches * (run.layers // run.pp) * per


def extrapolation_points(run: Run, max_nodes: int) -> tuple[int, int] | None:
    """Micro-batch counts (m1, m2) to replay instead of m when m does not fit the budget; None if m fits.

    m1 = pp (1F1B past its warm-up; Megatron's interleaving needs multiples of pp), m2 = 2 m1.
    """
    m = run.micro_batches
    if estimate_nodes(run, m) <= max_nodes:
        return None
    m1 = run.pp
    if 2 * m1 >= m:
        return None  # nothing to gain: too large either way
    return m1, 2 * m1


@dataclass(frozen=True)
class Prediction:
    """xsim's predicted time per iteration for a run and how it was obtained."""

    run: Run
    seconds: float | None  # None: not replayed (over budget)
    method: str
    nodes: int
    wall_s: float
    gaps: tuple[str, ...] = ()

    @property
    def error_pct(self) -> float | None:
        """(predicted - measured) / measured, in percent."""
        if self.seconds is None:
            return None
        meas = measured_seconds(self.run)
        return 100.0 * (self.seconds - meas) / meas


def predict(run: Run, max_nodes: int = DEFAULT_MAX_NODES, fold: bool = True) -> Prediction:
    """Replay a run (or two smaller micro-batch counts and extrapolate); honours the node budget."""
    gaps = tuple(legacy_gaps(run))
    points = extrapolation_points(run, max_nodes)
    m = run.micro_batches
    if points is None:
        if estimate_nodes(run, m) > max_nodes:
            return Prediction(run, None, f"not replayed (~{estimate_nodes(run, m):,} nodes)", 0, 0.0, gaps)
        rep = replay_spec(spec_for(run), fold=fold)
        folded = f", 1 of {run.dp} DP replicas" if rep.replayed_ranks < run.gpus else ""
        return Prediction(run, rep.iteration_ns / 1e9, f"replayed{folded}", rep.nodes, rep.wall_s, gaps)
    m1, m2 = points
    if estimate_nodes(run, m2) > max_nodes:
        return Prediction(
            run, None, f"not replayed (~{estimate_nodes(run, m2):,} nodes at m={m2})", 0, 0.0, gaps
        )
    r1 = replay_spec(spec_for(run, micro_batches=m1), fold=fold)
    r2 = replay_spec(spec_for(run, micro_batches=m2), fold=fold)
    seconds = extrapolate(m, (m1, r1.iteration_ns), (m2, r2.iteration_ns)) / 1e9
    return Prediction(
        run, seconds, f"m={m1},{m2} extrapolated to {m}", r1.nodes + r2.nodes, r1.wall_s + r2.wall_s, gaps
    )


def extrapolate(m: int, p1: tuple[int, int], p2: tuple[int, int]) -> float:
    """Linear extrapolation of iteration time (ns) in the micro-batch count from two replays."""
    (m1, t1), (m2, t2) = p1, p2
    return t1 + (m - m1) * (t2 - t1) / (m2 - m1)


# ---------------------------------------------------------------- per-layer benchmark


@dataclass(frozen=True)
class LayerResult:
    """Simulated forward/backward time of one layer beside the published one."""

    row: LayerRow
    forward_ms: float
    backward_ms: float


def layer_window_ms(ops: Any, rank: int, layer: int, phases: Sequence[str]) -> float:
    """Span of a layer's ops of the given phases on a rank (first start to last end), in ms."""
    import polars as pl

    sel = ops.filter((pl.col("rank") == rank) & (pl.col("layer") == layer) & pl.col("phase").is_in(phases))
    if sel.height == 0:
        raise ValueError(f"no ops of layer {layer}, phases {list(phases)} on rank {rank}")
    return (int(sel["end_ns"].max()) - int(sel["start_ns"].min())) / 1e6


def layer_results(bench: LayerBenchmark) -> list[LayerResult]:
    """Replay the benchmark's model once per row and time a middle layer's forward and backward on rank 0."""
    out = []
    layer = bench.run.layers // 2
    for row in bench.rows:
        spec = spec_for(bench.run, recompute=row.recompute, sequence_parallel=row.sequence_parallel)
        rep = replay_spec(spec, keep_ops=True)
        fwd = layer_window_ms(rep.ops, 0, layer, ("fwd",))
        bwd = layer_window_ms(rep.ops, 0, layer, ("bwd", "recompute"))
        out.append(LayerResult(row, fwd, bwd))
    return out


# ---------------------------------------------------------------- tables


def config_text(run: Run) -> str:
    """Compact configuration of a run for the table."""
    parts = [
        f"{run.gpus}x{run.gpu}", f"L{run.layers} h{run.hidden} a{run.heads} s{run.seq_len}",
        f"TP{run.tp} PP{run.pp} DP{run.dp}" + (f" v{run.virtual_stages}" if run.virtual_stages > 1 else ""),
        f"mb{run.micro_batch} gb{run.global_batch}", f"rc {run.recompute}" + (" +SP" if run.sequence_parallel else ""),
        run.precision, run.attention,
    ]  # fmt: skip
    return ", ".join(parts)


def source_label(run: Run) -> str:
    """Short citation of a run's measured number: source key and table/row (the dataset has the rest)."""
    where = re.split(r" \(|:", run.where, maxsplit=1)[0]
    return f"{run.source}, {where}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1f}%"


def runs_table(preds: Sequence[Prediction]) -> str:
    """The Markdown table of runs with the median |error| line (deterministic for the same inputs)."""
    lines = [
        "| run | source | configuration | measured s | predicted s | error | how |",
        "| --- | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for p in preds:
        pred = "-" if p.seconds is None else f"{p.seconds:.3f}"
        how = p.method + (f"; missing: {', '.join(p.gaps)}" if p.gaps else "")
        conv = " (from TFLOP/s, eq. 3)" if p.run.measured_kind == "tflops_per_gpu" else ""
        lines.append(
            f"| {p.run.id} | {source_label(p.run)} | {config_text(p.run)} | "
            f"{measured_seconds(p.run):.3f}{conv} | {pred} | {_pct(p.error_pct)} | {how} |"
        )
    lines.append("")
    lines.append(summary_line(preds))
    return "\n".join(lines) + "\n"


def summary_line(preds: Sequence[Prediction]) -> str:
    """Median |error|, rows within +-10%, and how many rows were replayed."""
    errs = [abs(p.error_pct) for p in preds if p.error_pct is not None]
    if not errs:
        return "No run was replayed."
    within = sum(1 for e in errs if e <= 10.0)
    return (
        f"Replayed {len(errs)} of {len(preds)} runs: median |error| {statistics.median(errs):.1f}%, "
        f"max |error| {max(errs):.1f}%, {within} of {len(errs)} within +-10%."
    )


def layers_table(results: Sequence[LayerResult]) -> str:
    """Markdown table of the per-layer benchmark."""
    lines = [
        "| experiment | fwd measured ms | fwd xsim ms | fwd error | bwd measured ms | bwd xsim ms | bwd error |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        fe = 100 * (r.forward_ms - r.row.forward_ms) / r.row.forward_ms
        be = 100 * (r.backward_ms - r.row.backward_ms) / r.row.backward_ms
        lines.append(
            f"| {r.row.experiment} | {r.row.forward_ms:.1f} | {r.forward_ms:.2f} | {fe:+.1f}% | "
            f"{r.row.backward_ms:.1f} | {r.backward_ms:.2f} | {be:+.1f}% |"
        )
    return "\n".join(lines) + "\n"


def excluded_table(data: Dataset) -> str:
    """Markdown list of the runs left out and why."""
    return "".join(f"- {what}: {why}\n" for what, why in data.excluded)


# ---------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """Run the validation and print (and optionally write) the Markdown tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data", default=str(DATA), help="dataset YAML (default: scripts/data/published_runs.yaml)"
    )
    ap.add_argument("--only", nargs="+", metavar="ID", help="replay only these run ids")
    ap.add_argument("--max-nodes", type=int, default=DEFAULT_MAX_NODES, help="generated nodes per replay")
    ap.add_argument(
        "--no-fold", action="store_true", help="replay every DP replica (default: fold identical replicas)"
    )
    ap.add_argument("--no-layers", action="store_true", help="skip the per-layer benchmark")
    ap.add_argument("--no-runs", action="store_true", help="only the per-layer benchmark")
    ap.add_argument("--out", metavar="FILE.md", help="also write the tables to this Markdown file")
    args = ap.parse_args(argv)
    try:
        data = load_dataset(args.data)
    except ValidationDataError as exc:
        print(f"validate_published: error: {exc}", file=sys.stderr)
        return 2
    runs = data.runs
    if args.only:
        unknown = sorted(set(args.only) - {r.id for r in runs})
        if unknown:
            print(f"validate_published: error: unknown run id(s) {', '.join(unknown)}", file=sys.stderr)
            return 2
        runs = tuple(r for r in runs if r.id in set(args.only))
    from traces.errors import XsimError

    try:
        return _run_all(args, data, runs)
    except XsimError as exc:  # a spec or replay problem: one line, as xsim's CLI reports it
        print(f"validate_published: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2


def _run_all(args: argparse.Namespace, data: Dataset, runs: Sequence[Run]) -> int:
    """Predict every run, then print and write the tables."""
    t0, c0 = time.perf_counter(), time.process_time()
    doc = []
    if not args.no_runs:
        preds = []
        for run in runs:
            c1 = time.process_time()
            p = predict(run, args.max_nodes, fold=not args.no_fold)
            print(
                f"{run.id}: {p.method}, measured {measured_seconds(run):.3f} s, predicted "
                f"{'-' if p.seconds is None else f'{p.seconds:.3f} s'} ({_pct(p.error_pct)}), "
                f"{p.nodes:,} nodes, {p.wall_s:.1f} s wall, {time.process_time() - c1:.1f} s CPU",
                file=sys.stderr,
            )
            preds.append(p)
        doc += ["## Runs\n", runs_table(preds)]
    if not args.no_layers and data.layers is not None:
        doc += [
            "\n## One layer of the 22B model (Korthikanti et al. 2022, Table 4)\n",
            layers_table(layer_results(data.layers)),
        ]
    if data.excluded and not args.only:
        doc += ["\n## Left out\n", excluded_table(data)]
    text = "".join(doc)
    print(text)
    # CPU time beside wall time: on a shared machine the wall time says more about the neighbours.
    print(
        f"wall time {time.perf_counter() - t0:.1f} s, CPU time {time.process_time() - c0:.1f} s",
        file=sys.stderr,
    )
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
