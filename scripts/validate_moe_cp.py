"""Validate xsim against published, measured runs with experts (EP) or context parallelism (issue 28).

Each run of scripts/data/published_moe_cp_runs.yaml (source, table and row, the spec written from its
published launch configuration, the measured throughput) is generated compact (one block of lcm(ep, cp)
DP replicas, or one rank per stage where TP, all-gather CP or alike EP positions are rank classes,
tracegen/compact.py) and replayed through the library as scripts/validate_published.py does
(`replay_spec`, analytical network, the generator's op times), and its time per iteration compared with the
measured one. A run whose spec tracegen refuses is reported with tracegen's one-line reason; a run over the
node budget is listed as not replayed with its node estimate and the estimated cost. The table goes into
the generated block "moe_cp" of docs/validation.md (--out), which tests/test_validate_moe_cp.py checks
against the dataset's row set.

    python scripts/validate_moe_cp.py --out docs/validation.md
    python scripts/validate_moe_cp.py --only mbridge2511-qwen3-30b-a3b-16xh100 --out docs/validation.md
        (the rows not replayed keep the page's previous line, marked as kept)

No calibration constant is read from or fitted to these runs: they are validation data.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "published_moe_cp_runs.yaml"
BLOCK = "moe_cp"
SCRIPT = "validate_moe_cp.py"  # the name in its block markers
# iteration_s: a printed step time (seconds per iteration), taken as it is (NVIDIA dgxc-benchmarking READMEs).
MEASURED_KINDS = ("tokens_per_s_per_gpu", "tflops_per_gpu_palm", "iteration_s")
RUN_KEYS = ("id", "source", "where", "gpus", "measured", "spec", "cluster", "notes")
# Nodes of one replayed block per invocation: the budget of scripts/validate_published.py (~2 minutes of
# generation on the 2-core development machine).
DEFAULT_MAX_NODES = 4_000_000
# Generated nodes per (rank, layer, micro-batch) used only to decide the budget (never in a result):
# Megatron-Core's dense layer with sequence parallelism (validate_published.NODES_PER_LAYER_STEP, 32 + 6),
# the CP exchange (all-gather form: 2 collectives; ring: RING_NODES_PER_CP cp - RING_NODES_LESS), and per
# MoE layer 4 all-to-alls (one collective each under a routing that loads every EP rank alike,
# tracegen.compact.ep_alike, else (ep - 1) sends and as many receives) plus ~20 router / permute / sort /
# grouped GEMM ops. The ring, FP8 and userbuffers terms are counted from the generator (round cpfold:
# node_count of the compact set of Megatron-Bridge's Llama 3.1 405B spec at 8 and 16 micro-batches, the
# difference per layer and micro-batch, each feature switched off alone): 38 bf16 without CP or overlap;
# ring CP 2 / 4: +10 / +26 = 8 cp - 6; FP8 (current scaling, FP8 parameters): +14; tp_comm_overlap at TP 8 / 4:
# +62 / +30 = 8 TP - 2, as workload._Generator.overlapped cuts it (4 ring_exchange pairs of TP GEMM chunks and
# TP - 1 exchange steps for 2 nodes: 4 (2 TP - 3); 2 pipeline pairs of 4 + 4 for 2: 12; 2 bulk pairs, one node
# fewer each than the SP dgrad overlap: -2). The 405B form: 38 + 10 + 14 + 62 = 124 counted.
DENSE_STEP_NODES = 38
MOE_STEP_NODES = 20
RING_NODES_PER_CP, RING_NODES_LESS = 8, 6
FP8_STEP_NODES = 14


class MoeCpDataError(Exception):
    """The dataset file is malformed: one line naming the file and the run."""


@dataclass(frozen=True)
class MoeCpRun:
    """One measured run: where it is published, the spec written from its configuration, its throughput."""

    id: str
    source: str
    where: str
    gpus: int
    measured_kind: str
    measured_value: float
    spec: Mapping[str, Any]
    cluster: str
    notes: str = ""

    @property
    def parallel(self) -> Mapping[str, Any]:
        """The spec's `parallel:` block."""
        return self.spec["parallel"]

    @property
    def seq_len(self) -> int:
        """Trained sequence length."""
        return int(self.spec.get("seq_len") or self.spec["model"]["seq_len"])


@dataclass(frozen=True)
class Dataset:
    """Sources (key -> citation and conversion) and runs."""

    sources: Mapping[str, tuple[str, str]]
    runs: tuple[MoeCpRun, ...]


def _fail(path: str, where: str, msg: str) -> MoeCpDataError:
    return MoeCpDataError(f"{path}: {where}: {msg}")


def load_dataset(path: str | os.PathLike[str] = DATA) -> Dataset:
    """Read and check the dataset: every run cites a source, gives its GPU count, spec and measurement."""
    p = os.fspath(path)
    try:
        with open(p, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError) as exc:
        raise MoeCpDataError(f"{p}: cannot read: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("sources"), Mapping):
        raise MoeCpDataError(f"{p}: needs a sources mapping and a runs list")
    sources = {}
    for key, s in doc["sources"].items():
        if not isinstance(s, Mapping) or not isinstance(s.get("cite"), str):
            raise _fail(p, f"source {key}", "needs a cite text")
        sources[str(key)] = (" ".join(s["cite"].split()), " ".join(str(s.get("conversion", "")).split()))
    runs, seen = [], set()
    for i, raw in enumerate(doc.get("runs") or []):
        where = f"runs[{i}]"
        if not isinstance(raw, Mapping) or not isinstance(raw.get("id"), str):
            raise _fail(p, where, "must be a mapping with an id")
        where = f"run {raw['id']}"
        unknown = sorted(set(raw) - set(RUN_KEYS))
        if unknown:
            raise _fail(p, where, f"unknown key(s) {', '.join(unknown)}")
        if raw["id"] in seen:
            raise _fail(p, where, "id used twice")
        seen.add(raw["id"])
        if raw.get("source") not in sources:
            raise _fail(p, where, f"source {raw.get('source')!r} is not in sources")
        meas = raw.get("measured")
        if not isinstance(meas, Mapping) or len(meas) != 1:
            raise _fail(p, where, f"measured must hold exactly one of {', '.join(MEASURED_KINDS)}")
        ((kind, value),) = meas.items()
        if kind not in MEASURED_KINDS or not isinstance(value, int | float) or value <= 0:
            raise _fail(
                p, where, f"measured {kind}: {value!r} is not a positive {' or '.join(MEASURED_KINDS)}"
            )
        spec = raw.get("spec")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("parallel"), Mapping):
            raise _fail(p, where, "spec must be a mapping with a parallel block")
        if not isinstance(spec.get("model"), Mapping):
            raise _fail(p, where, "spec.model must be an inline model mapping (its numbers are cited)")
        gpus = raw.get("gpus")
        par = spec["parallel"]
        layout = math.prod(int(par.get(k, 1)) for k in ("tp", "pp", "dp", "cp"))
        if not isinstance(gpus, int) or gpus != layout:
            raise _fail(p, where, f"gpus {gpus!r} is not tp x pp x dp x cp = {layout}")
        if not isinstance(raw.get("where"), str) or not isinstance(raw.get("cluster"), str):
            raise _fail(p, where, "needs where (table, row) and cluster")
        runs.append(
            MoeCpRun(
                raw["id"],
                raw["source"],
                " ".join(raw["where"].split()),
                gpus,
                kind,
                float(value),
                spec,
                raw["cluster"],
                " ".join(str(raw.get("notes", "")).split()),
            )  # fmt: skip
        )
    if not runs:
        raise MoeCpDataError(f"{p}: runs must be a non-empty list")
    return Dataset(sources, tuple(runs))


# ---------------------------------------------------------------- measured time


def palm_flops_per_token(model: Mapping[str, Any], seq: int) -> float:
    """PaLM's model FLOPs per token (Chowdhery et al. 2022, Appendix B): 6 N + 12 L h s, N the matmul weights
    of a dense model (Q and output h x h each, K and V h x h kv/heads each, SwiGLU MLP 3 h ffn, LM head h V)."""
    h, heads, layers = int(model["hidden"]), int(model["heads"]), int(model["layers"])
    kv_dim = h * int(model.get("kv_heads") or heads) // heads
    per_layer = 2 * h * h + 2 * h * kv_dim + 3 * h * int(model["ffn_hidden"])
    n = layers * per_layer + h * int(model["vocab"])
    return 6.0 * n + 12.0 * layers * h * seq


def measured_seconds(run: MoeCpRun) -> float:
    """Seconds per iteration from the published throughput (the source's conversion), or the printed time."""
    if run.measured_kind == "iteration_s":
        return run.measured_value
    tokens = int(run.parallel["global_batch"]) * run.seq_len
    if run.measured_kind == "tokens_per_s_per_gpu":
        return tokens / (run.gpus * run.measured_value)
    flops = palm_flops_per_token(run.spec["model"], run.seq_len) * tokens
    return flops / (run.gpus * run.measured_value * 1e12)


# ---------------------------------------------------------------- spec, budget, replay


def spec_for(run: MoeCpRun) -> dict[str, Any]:
    """The tracegen spec of a run: its `spec` as written, plus name, 1F1B, the calibrated compute model and
    its cluster preset."""
    out = dict(run.spec)
    out.update(
        name=run.id.replace(".", "_"), schedule="1f1b", compute_model="calibrated", cluster=run.cluster
    )
    return out


def estimate_nodes(dep: Any) -> tuple[int, int]:
    """(nodes of the ranks that are generated, ranks generated): one block of a compact set, every rank
    otherwise; a budget decision only."""
    from xsim.tracegen.compact import ep_alike, rank_classes
    from xsim.tracegen.spec import chunk_ranges, model_arch

    classes = rank_classes(dep, rewrite=False)
    written = set(classes.written) if classes is not None else None
    moe = model_arch(dep).moe
    # a routing that loads every EP rank alike: each all-to-all is one collective, else P2P pairs
    balanced = moe is not None and ep_alike(dep)
    total = ranks = 0
    for dg in dep.device_groups:
        n = sum(1 for r in dg.ranks if written is None or r in written)
        if not n:
            continue
        layers = sum(e - s + 1 for s, e in chunk_ranges(dg))
        per = DENSE_STEP_NODES
        if dg.cp > 1:
            per += 2 if dep.cp_comm_type == "all_gather" else RING_NODES_PER_CP * dg.cp - RING_NODES_LESS
        if dep.precision == "fp8":
            per += FP8_STEP_NODES
        if dep.tp_comm_overlap and dep.sequence_parallel and dg.tp > 1:
            per += 8 * dg.tp - 2  # workload._Generator.overlapped's chunks (above)
        if moe is not None:
            per += MOE_STEP_NODES + (4 if balanced else 8 * (max(1, dg.ep) - 1))
        total += n * layers * dep.micro_batches * per
        ranks += n
    return total, ranks


def _positions(dep: Any) -> int:
    """Rank classes per data replica of the compact set (tp x cp x ep positions folded; 1 for whole blocks)."""
    from xsim.tracegen.compact import rank_classes

    c = rank_classes(dep, rewrite=False)
    return 1 if c is None else c.width


@dataclass(frozen=True)
class Prediction:
    """xsim's time per iteration for a run (None when not replayed) and how it was obtained."""

    run: MoeCpRun
    seconds: float | None
    method: str
    nodes: int = 0
    wall_s: float = 0.0

    @property
    def error_pct(self) -> float | None:
        """(predicted - measured) / measured, in percent."""
        if self.seconds is None:
            return None
        meas = measured_seconds(self.run)
        return 100.0 * (self.seconds - meas) / meas


def _validate_published() -> Any:
    """scripts/validate_published.py as a module (its replay harness is shared, not copied)."""
    mod = sys.modules.get("validate_published")
    if mod is None:
        spec = importlib.util.spec_from_file_location("validate_published", HERE / "validate_published.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["validate_published"] = mod  # dataclasses resolve their module by name
        spec.loader.exec_module(mod)
    return mod


def predict(run: MoeCpRun, max_nodes: int = DEFAULT_MAX_NODES) -> Prediction:
    """Generate (compact) and replay a run within the node budget, or say why not in one line."""
    from xsim.tracegen import load_spec
    from xsim.traces.errors import XsimError

    spec = spec_for(run)
    try:
        dep = load_spec(spec)
    except XsimError as exc:
        return Prediction(run, None, f"refused by xsim: {str(exc).splitlines()[0]}")
    nodes, ranks = estimate_nodes(dep)
    if nodes > max_nodes:
        return Prediction(
            run,
            None,
            f"not replayed: ~{nodes:,} nodes for the {ranks:,} ranks generated (budget {max_nodes:,})",
        )
    # A rank-class fold (one rank per stage) the network check refuses falls back to one data replica
    # (tp x cp entries): where that is over the budget, the refusal is reported instead of run.
    strict = nodes * _positions(dep) > max_nodes
    try:
        rep = _validate_published().replay_spec(spec, fold=True, strict=strict)
    except XsimError as exc:
        return Prediction(run, None, f"refused by xsim: {str(exc).splitlines()[0]}")
    folded = (
        f", {rep.replayed_ranks:,} of {run.gpus:,} ranks simulated" if rep.replayed_ranks < run.gpus else ""
    )
    return Prediction(run, rep.iteration_ns / 1e9, f"replayed{folded}", rep.nodes, rep.wall_s)


# ---------------------------------------------------------------- table and page


def config_text(run: MoeCpRun) -> str:
    """Compact configuration of a run for the table."""
    m, p = run.spec["model"], run.parallel
    moe = m.get("moe")
    arch = f"L{m['layers']} h{m['hidden']} a{m['heads']} kv{m.get('kv_heads', m['heads'])} s{run.seq_len}"
    if moe:
        arch += f", {moe['experts']} experts top-{moe['top_k']} ffn{moe['expert_ffn']}"
        # what the run's routing was: dropless (xsim's routing named) or capacity, padded or not
        cf = moe.get("capacity_factor") or 0
        routing = moe.get("routing", "uniform")
        routing = routing if isinstance(routing, str) else routing.get("distribution", "routing table")
        arch += (
            f" capacity {cf}{' padded' if moe.get('pad_to_capacity') else ''}"
            if cf
            else f" dropless {routing}"
        )
    lay = " ".join(
        f"{k.upper()}{p[k]}"
        for k in ("tp", "pp", "dp", "cp", "ep", "etp")
        if k in p and int(p[k]) > 1 or k in "tpdp"
    )
    if int(p.get("virtual_stages", 1)) > 1:
        lay += f" v{p['virtual_stages']}"
    extra = [str(run.spec.get("precision", "bf16"))]
    if int(p.get("cp", 1)) > 1:
        extra.append(f"cp {run.spec.get('cp_comm_type', 'p2p')}")
    return ", ".join(
        [f"{run.gpus}x{p['gpu']}", arch, lay, f"mb{p['micro_batch']} gb{p['global_batch']}", *extra]
    )


CONVERSION = {
    "tokens_per_s_per_gpu": "from tokens/s/GPU",
    "tflops_per_gpu_palm": "from TFLOP/s, PaLM FLOPs",
    "iteration_s": "step time",
}


def runs_table(preds: Sequence[Prediction]) -> str:
    """The Markdown table of the runs with a summary line (deterministic for the same inputs)."""
    lines = [
        "| run | source | configuration | measured s | predicted s | error | how |",
        "| --- | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for p in preds:
        pred = "-" if p.seconds is None else f"{p.seconds:.3f}"
        err = "-" if p.error_pct is None else f"{p.error_pct:+.1f}%"
        meas = f"{measured_seconds(p.run):.3f} ({CONVERSION[p.run.measured_kind]})"
        where = p.run.where.split(" (")[0]
        lines.append(
            f"| {p.run.id} | {p.run.source}, {where} | {config_text(p.run)} | {meas} | {pred} | {err} | "
            f"{p.method.replace('|', '/')} |"
        )
    errs = [abs(p.error_pct) for p in preds if p.error_pct is not None]
    lines.append("")
    lines.append(
        f"Replayed {len(errs)} of {len(preds)} runs"
        + (f": median |error| {statistics.median(errs):.1f}%, max {max(errs):.1f}%." if errs else ".")
    )
    return "\n".join(lines) + "\n"


def page_run_ids(page: str) -> list[str]:
    """The run ids of the page's block, in order (the block format is validate_published's)."""
    vp = _validate_published()
    return [cells[0] for cells in vp.table_rows(vp.page_block(page, BLOCK, SCRIPT) or "")]


def kept_predictions(page: str, runs: Sequence[MoeCpRun]) -> dict[str, Prediction]:
    """The page's previous predictions of `runs` (the rows an --only invocation does not replay keep their
    line, marked as kept, as scripts/validate_published.py does)."""
    vp = _validate_published()
    by_id = {r.id: r for r in runs}
    out = {}
    for cells in vp.table_rows(vp.page_block(page, BLOCK, SCRIPT) or ""):
        if len(cells) == 7 and cells[0] in by_id:
            try:
                seconds = None if cells[4] == "-" else float(cells[4])
            except ValueError:  # a hand-edited cell: nothing to keep but the row
                seconds = None
            how = cells[6] if cells[6].endswith(vp.KEPT) else cells[6] + vp.KEPT
            out[cells[0]] = Prediction(by_id[cells[0]], seconds, how)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Predict the runs, print the table, and with --out write it into the page's block."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data", default=str(DATA), help="dataset YAML (default: scripts/data/published_moe_cp_runs.yaml)"
    )
    ap.add_argument("--only", nargs="+", metavar="ID", help="replay only these run ids (the others: not run)")
    ap.add_argument("--max-nodes", type=int, default=DEFAULT_MAX_NODES, help="nodes generated per replay")
    ap.add_argument("--out", metavar="FILE.md", help="write the table into the page's moe_cp block")
    args = ap.parse_args(argv)
    try:
        data = load_dataset(args.data)
    except MoeCpDataError as exc:
        print(f"validate_moe_cp: error: {exc}", file=sys.stderr)
        return 2
    only = set(args.only or [r.id for r in data.runs])
    unknown = sorted(only - {r.id for r in data.runs})
    if unknown:
        print(f"validate_moe_cp: error: unknown run id(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    page = Path(args.out).read_text(encoding="utf-8") if args.out and Path(args.out).exists() else ""
    kept = kept_predictions(page, data.runs) if args.out else {}
    preds = []
    for run in data.runs:
        if run.id not in only:
            preds.append(kept.get(run.id) or Prediction(run, None, "not run in this invocation"))
            continue
        t0, c0 = time.perf_counter(), time.process_time()
        p = predict(run, args.max_nodes)
        print(
            f"{run.id}: {p.method}, measured {measured_seconds(run):.3f} s, predicted "
            f"{'-' if p.seconds is None else f'{p.seconds:.3f} s'}, {p.nodes:,} nodes, "
            f"{time.perf_counter() - t0:.1f} s wall, {time.process_time() - c0:.1f} s CPU",
            file=sys.stderr,
        )
        preds.append(p)
    table = runs_table(preds)
    print(table)
    if args.out:
        vp = _validate_published()
        try:
            Path(args.out).write_text(
                vp.splice_page(page, {BLOCK: table}, args.out, SCRIPT), encoding="utf-8"
            )
        except vp.PageError as exc:
            print(f"validate_moe_cp: error: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
