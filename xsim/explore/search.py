"""Plan search for a heterogeneous cluster: enumerate non-uniform plans, prune by memory and an analytical
estimate, verify the best K by full replay on the sweep engine, write them as ready-to-run specs.

Candidates (docs/decide.md), for a cluster given as GPU pools (`4xA100-40GB+4xH100`, ranks in that order,
each pool packed into its own nodes as a derived cluster):
- `pipeline`: R identical replicas, each a pipeline crossing the pools: per pool k_g stages of TP t_g
  (R * k_g * t_g = the pool's GPUs), pools in either order, layers cut in proportion to each stage's speed;
- `split`: each pool trains its own replicas (R_g replicas of k_g stages of TP t_g), the global batch split
  between replicas in proportion to their speed (micro-batch per replica), one heterogeneous DP group.
Every candidate runs 1F1B (same bubble as GPipe, p - k micro-batches in flight instead of m) with micro-batch
sizes 1, 2, 4 and each reshard strategy where adjacent stages differ in TP.

Speed of a stage = the generator's own op times (tracegen.ops, the catalog's roofline) of one layer's
forward and backward on that GPU and TP degree, plus its TP collectives at the pool's scale-up bandwidth.
The estimate: (m + p - 1) x the slowest stage's micro-batch time, + stage-boundary transfers, + the data-
parallel gradient AllReduce (ring, 2(R-1)/R of the bytes at the slowest link), + the optimizer step.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from xsim.explore import sweep as sw
from xsim.netmodels.presets import defined_interconnect, interconnect
from xsim.tracegen import catalog
from xsim.tracegen.errors import SpecError
from xsim.tracegen.memory import OutOfMemory, check_fits, deployment_memory
from xsim.tracegen.models import ModelArch, preset, with_seq_len
from xsim.tracegen.ops import (
    Comm,
    Ctx,
    embedding_steps,
    head_steps,
    layer_steps,
    optimizer_op,
    rank_params,
    shard_of,
)
from xsim.tracegen.ops import duration_micros as op_micros
from xsim.tracegen.spec import NODE_SIZE, RESHARDS, gpu_file_specs, gpu_type_entry, load_spec, read_gpu_file
from xsim.traces.errors import XsimError
from xsim.traces.io import read_json
from xsim.traces.limits import limit

MICRO_BATCH_SIZES = (1, 2, 4)
SPLIT_MICRO_BATCHES = (4, 8, 16)  # micro-batch counts the `split` family tries
# Bounds checked before enumerating (docs/decide.md, issue 31): 10^9 GPUs once spun in the enumeration and
# 2^20 grew to 3.8 GB. The memory check builds each candidate's spec, measured at 8 ms (8 GPUs), 36 ms (128)
# and 0.59 s (2,048) per plan on the shared 2-core machine, ~0.3 ms per GPU: 16,384 GPUs' ~1,000-2,000
# plans take hours already, and 20,000 plans of a small cluster take minutes before the first replay.
DEFAULT_MAX_SEARCH_GPUS = 1 << 14
DEFAULT_MAX_SEARCH_PLANS = 20_000
INTERCONNECT = "table5"  # the derived cluster's preset (tracegen.spec.CLUSTER_PRESET)


class SearchError(XsimError):
    """A search that cannot start (bad cluster text, batch that no plan divides)."""


@dataclass(frozen=True)
class Pool:
    """GPUs of one type; ranks are consecutive in the order pools are given."""

    gpu: str
    count: int


def parse_cluster(text: str) -> tuple[Pool, ...]:
    """`4xH100+4xA100-40GB` (or `H100x4,A100x4`) -> pools, in order."""
    pools = []
    for part in re.split(r"[+,]", text.strip()):
        m = re.fullmatch(r"\s*(\d+)\s*[x*]\s*([A-Za-z0-9-]+)\s*|\s*([A-Za-z0-9-]+?)\s*x\s*(\d+)\s*", part)
        if not m:
            raise SearchError(f"--search {text!r}: {part!r} is not COUNTxGPU (e.g. 4xH100+4xA100-40GB)")
        count, name = (m[1], m[2]) if m[1] else (m[4], m[3])
        try:
            pools.append(Pool(catalog.canonical_gpu_name(name), int(count)))
        except XsimError as exc:
            raise SearchError(f"--search {text!r}: {exc}") from None
    if any(p.count < 1 for p in pools):
        raise SearchError(f"--search {text!r}: every pool needs at least one GPU")
    return tuple(pools)


@dataclass(frozen=True)
class Stage:
    """One device group of a candidate."""

    pool: int
    gpu: str
    ranks: tuple[int, ...]
    layers: tuple[int, int]
    micro_batch: int
    stage: int
    replica: int


@dataclass(frozen=True)
class Candidate:
    """A proposed plan with its analytical estimate."""

    family: str
    stages: tuple[Stage, ...]
    micro_batches: int
    reshard: str
    estimate_ns: int = 0
    note: str = ""

    def spec(
        self, model: str | ModelArch, seq: int, name: str, gpus: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """The deployment spec mapping of this plan (`gpus`: definitions of hypothetical GPUs; those the
        plan uses are written into it)."""
        used = {s.gpu for s in self.stages}
        defs = {n: dict(d) for n, d in sorted((gpus or {}).items()) if n in used}
        return {
            **({"gpus": defs} if defs else {}),
            "name": name,
            "model": model if isinstance(model, str) else model.name,
            "seq_len": seq,
            "micro_batches": self.micro_batches,
            "schedule": "1f1b",
            "reshard": self.reshard,
            "device_groups": [
                {
                    "id": i,
                    "gpu": s.gpu,
                    "ranks": list(s.ranks),
                    "tp": len(s.ranks),
                    "layers": list(s.layers),
                    "micro_batch": s.micro_batch,
                    "pp_stage": s.stage,
                    "dp_replica": s.replica,
                }
                for i, s in enumerate(self.stages)
            ],
        }

    def describe(self) -> str:
        """One line: replicas, stages (GPU, TP, layers), micro-batches."""
        reps: dict[int, list[Stage]] = {}
        for s in self.stages:
            reps.setdefault(s.replica, []).append(s)
        parts = []
        for _, st in sorted(reps.items()):
            pipe = " -> ".join(f"{s.gpu} TP{len(s.ranks)} L{s.layers[0]}-{s.layers[1]}" for s in st)
            parts.append(f"[{pipe} mb{st[0].micro_batch}]")
        return (
            f"{self.family}: {' | '.join(parts)} x{self.micro_batches} micro-batches, reshard {self.reshard}"
        )


def _divisors(n: int) -> list[int]:
    """Divisors of n in increasing order, by trial division up to sqrt(n) (range(1, n + 1) spun at 10^9)."""
    low, high = [], []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            low.append(d)
            if d != n // d:
                high.append(n // d)
    return low + high[::-1]


def _tps(m: ModelArch, n: int) -> list[int]:
    """TP degrees a group of n GPUs may take: divisors within one node that divide the heads."""
    return [t for t in _divisors(n) if t <= NODE_SIZE and m.heads % t == 0 and m.kv_heads % t == 0]


def _pipeline_shapes(p: Pool, r: int, m: ModelArch) -> list[tuple[int, int]]:
    """(stages, TP) of pool p in each of r `pipeline` replicas: at most 4 stages."""
    return [(k, t) for t in _tps(m, p.count // r) for k in [p.count // r // t] if k <= 4]


def _split_shapes(p: Pool, m: ModelArch) -> list[tuple[int, int]]:
    """(TP, stages) of the replicas pool p trains on its own in the `split` family: at most 4 stages."""
    return [(t, k) for t in _tps(m, p.count) for k in _divisors(p.count // t) if k <= 4 and k <= m.layers]


def count_bound(pools: Sequence[Pool], m: ModelArch, global_batch: int, cap: int) -> int:
    """An upper bound on how many plans `enumerate_candidates` makes, without building any (stops counting
    past CAP): the loops' sizes multiplied (shapes x pool orders x micro-batch sizes x 3 layer cuts x reshard
    strategies), where the enumeration itself also drops plans with more stages than layers."""
    total = 0
    reshards = max(len([r for r in RESHARDS if r != "naive"]), 1)
    for r in _divisors(math.gcd(*(p.count for p in pools))):
        n = sum(1 for mb in MICRO_BATCH_SIZES if global_batch % (r * mb) == 0) * 3 * reshards
        for p in pools:
            n *= len(_pipeline_shapes(p, r, m))
            if n == 0 or n > cap:
                break
        for k in range(2, len(pools) + 1):  # pool orders: len(pools)!
            if n == 0 or n > cap:
                break
            n *= k
        total += n
        if total > cap:
            return total
    if len(pools) > 1:
        n = sum(1 for mc in SPLIT_MICRO_BATCHES if global_batch % mc == 0)
        for p in pools:
            n *= len(_split_shapes(p, m))
            if n == 0 or n > cap:
                break
        total += n
    return total


def check_search_size(cluster: str, pools: Sequence[Pool], m: ModelArch, global_batch: int) -> int:
    """The plan-count bound of a search, or a SearchError naming the limit and the variable raising it."""
    gpus = sum(p.count for p in pools)
    cap = limit("XSIM_MAX_SEARCH_GPUS", DEFAULT_MAX_SEARCH_GPUS)
    if gpus > cap:
        raise SearchError(
            f"--search {cluster}: {gpus:,} GPUs, more than the search's limit of {cap:,} "
            f"(XSIM_MAX_SEARCH_GPUS raises it)"
        )
    cap = limit("XSIM_MAX_SEARCH_PLANS", DEFAULT_MAX_SEARCH_PLANS)
    n = count_bound(pools, m, global_batch, cap)
    if n > cap:
        raise SearchError(
            f"--search {cluster}: an estimated {n:,} plans or more to enumerate, more than the search's "
            f"limit of {cap:,} (XSIM_MAX_SEARCH_PLANS raises it)"
        )
    return n


@dataclass
class _Speed:
    """Per (GPU, TP, micro-batch) times of one layer, the embedding and the head, in ns (cached)."""

    m: ModelArch
    seq: int
    dtype: int = 2
    cache: dict[tuple[str, int, int], tuple[float, float, float]] = field(default_factory=dict)

    def times(self, gpu: str, tp: int, mb: int) -> tuple[float, float, float]:
        key = (gpu, tp, mb)
        if key not in self.cache:
            spec = catalog.gpu(gpu)
            bw = _interconnect(gpu).scale_up_bandwidth
            c = Ctx(self.m, shard_of(self.m, tp, 0), mb, self.seq, self.dtype, False)

            def total(steps) -> float:
                ns = 0.0
                for st in steps:
                    if isinstance(st, Comm):
                        # Ring AllReduce moves 2(t-1)/t of the buffer per rank; AG / RS half of that.
                        f = 2 if st.kind == "all_reduce" else 1
                        ns += f * (tp - 1) / tp * st.size / bw * 1e9
                    else:
                        ns += op_micros(st, spec) * 1e3
                return ns

            layer = total(layer_steps(c, "fwd")) + total(layer_steps(c, "bwd"))
            emb = total(embedding_steps(c, "fwd")) + total(embedding_steps(c, "bwd"))
            head = total(head_steps(c, "fwd")) + total(head_steps(c, "bwd"))
            self.cache[key] = (layer, emb, head)
        return self.cache[key]


_SPEEDS: dict[ModelArch, _Speed] = {}


def _speed(m: ModelArch) -> _Speed:
    """One op-time cache per model (estimates of all candidates share it)."""
    if m not in _SPEEDS:
        _SPEEDS[m] = _Speed(m, m.seq_len)
    return _SPEEDS[m]


def proportional_cuts(layers: int, speeds: Sequence[float]) -> list[int]:
    """Layers per stage in proportion to speed (largest remainder), each stage at least one layer."""
    total = sum(speeds)
    raw = [layers * s / total for s in speeds]
    counts = [max(1, math.floor(x)) for x in raw]
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - math.floor(raw[i])), i))
    i = 0
    while sum(counts) < layers:
        counts[order[i % len(order)]] += 1
        i += 1
    while sum(counts) > layers:
        # Take from the stage furthest above its share that can spare a layer (never below one).
        j = max((k for k in range(len(counts)) if counts[k] > 1), key=lambda k: (counts[k] - raw[k], k))
        counts[j] -= 1
    return counts


def _layout(counts: Sequence[int]) -> list[tuple[int, int]]:
    out, start = [], 1
    for c in counts:
        out.append((start, start + c - 1))
        start += c
    return out


def enumerate_candidates(pools: Sequence[Pool], m: ModelArch, global_batch: int) -> list[Candidate]:
    """Every plan shape of both families (before memory and estimate pruning)."""
    offsets = [sum(p.count for p in pools[:i]) for i in range(len(pools))]
    speed = _speed(m)
    out: list[Candidate] = []

    # pipeline: R replicas, each crossing every pool (k_g stages of TP t_g per pool per replica).
    total = sum(p.count for p in pools)
    for r in _divisors(math.gcd(*(p.count for p in pools))):
        per_pool = [_pipeline_shapes(p, r, m) for p in pools]
        for shape in _product(per_pool):
            for order in _orders(len(pools)):
                for mb in MICRO_BATCH_SIZES:
                    if global_batch % (r * mb):
                        continue
                    mcount = global_batch // (r * mb)
                    stages_spec = []  # (pool, tp, rank offset within pool per replica)
                    for g in order:
                        k, t = shape[g]
                        for j in range(k):
                            stages_spec.append((g, t, j))
                    if len(stages_spec) > m.layers:
                        continue
                    sp = []
                    for g, t, _ in stages_spec:
                        layer_ns, _, _ = speed.times(pools[g].gpu, t, mb)
                        sp.append(1.0 / layer_ns)
                    for counts in _cut_variants(proportional_cuts(m.layers, sp)):
                        stages = []
                        for rep in range(r):
                            for k_idx, ((g, t, j), lay) in enumerate(
                                zip(stages_spec, _layout(counts), strict=True)
                            ):
                                k_g = shape[g][0]
                                base = offsets[g] + (rep * k_g + j) * t
                                stages.append(
                                    Stage(g, pools[g].gpu, tuple(range(base, base + t)), lay, mb, k_idx, rep)
                                )
                        for rs in _reshards(stages):
                            out.append(Candidate("pipeline", tuple(stages), mcount, rs))
    # split: every pool its own replicas; micro-batch per replica in proportion to replica speed.
    if len(pools) > 1:
        per_pool = [_split_shapes(p, m) for p in pools]
        for shape in _product(per_pool):
            reps = []  # (pool, tp, stages per replica, replicas)
            for g, (t, k) in enumerate(shape):
                reps.append((g, t, k, pools[g].count // (t * k)))
            for mcount in SPLIT_MICRO_BATCHES:
                if global_batch % mcount:
                    continue
                seqs = global_batch // mcount  # sequences per micro-batch step, all replicas together
                rate = []
                for g, t, k, n in reps:
                    layer_ns, _, _ = speed.times(pools[g].gpu, t, 1)
                    rate += [k / layer_ns] * n  # a k-stage pipeline of TP t: k times one stage's rate
                if seqs < len(rate):
                    continue
                mbs = proportional_cuts(seqs, rate)
                stages, rep_id = [], 0
                idx = 0
                for g, t, k, n in reps:
                    for i in range(n):
                        counts = proportional_cuts(m.layers, [1.0] * k)
                        for j, lay in enumerate(_layout(counts)):
                            base = offsets[g] + (i * k + j) * t
                            stages.append(
                                Stage(g, pools[g].gpu, tuple(range(base, base + t)), lay, mbs[idx], j, rep_id)
                            )
                        rep_id += 1
                        idx += 1
                out.append(Candidate("split", tuple(stages), mcount, "xsim"))
    assert all(sum(len(s.ranks) for s in c.stages) == total for c in out)
    return out


def _product(lists: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    import itertools

    return list(itertools.product(*lists))


def _orders(n: int) -> list[tuple[int, ...]]:
    import itertools

    return list(itertools.permutations(range(n)))


def _cut_variants(counts: list[int]) -> list[list[int]]:
    """The proportional cut and, for two stages or more, one layer moved across the first boundary each way."""
    out = [counts]
    if len(counts) >= 2:
        for d in (-1, 1):
            c = list(counts)
            c[0] += d
            c[1] -= d
            if min(c) >= 1:
                out.append(c)
    return out


def _reshards(stages: Sequence[Stage]) -> list[str]:
    by_rep: dict[int, list[Stage]] = {}
    for s in stages:
        by_rep.setdefault(s.replica, []).append(s)
    differ = any(
        len(a.ranks) != len(b.ranks) for st in by_rep.values() for a, b in zip(st, st[1:], strict=False)
    )
    return [r for r in RESHARDS if r != "naive"] if differ else ["xsim"]


def estimate_ns(c: Candidate, pools: Sequence[Pool], m: ModelArch) -> int:
    """The analytical iteration time of a candidate (module docstring), in ns."""
    speed = _speed(m)
    by_rep: dict[int, list[Stage]] = {}
    for s in c.stages:
        by_rep.setdefault(s.replica, []).append(s)
    node_of = {}
    off = 0
    for p in pools:
        for i in range(p.count):
            node_of[off + i] = (p.gpu, i // NODE_SIZE, off)
        off += p.count
    worst = 0.0
    for st in by_rep.values():
        p = len(st)
        per_mb = []
        for k, s in enumerate(st):
            layer, emb, head = speed.times(s.gpu, len(s.ranks), s.micro_batch)
            t = layer * (s.layers[1] - s.layers[0] + 1) + (emb if k == 0 else 0) + (head if k == p - 1 else 0)
            per_mb.append(t)
        xfers = []
        for a, b in zip(st, st[1:], strict=False):
            nbytes = a.micro_batch * m.seq_len * m.hidden * 2
            factor = 2.0 if c.reshard == "hetauto" else 1.0  # gather + scatter around the leaders' transfer
            xfers.append(factor * nbytes / _link_bw(a, b, node_of) * 1e9)
        # A transfer slower than every stage paces the pipeline; each also sits once on the fill and drain.
        step = max([*per_mb, *xfers])
        pipe = (c.micro_batches + p - 1) * step + 2 * sum(xfers)
        worst = max(worst, pipe)
    # Gradient AllReduce: every layer held by R device groups reduces its gradient over them.
    dp_ns = 0.0
    reps = len(by_rep)
    if reps > 1:
        grad = (
            max(
                rank_params(
                    m, shard_of(m, len(s.ranks), 0), s.layers[1] - s.layers[0] + 1, s.stage == 0, False
                )
                for s in c.stages
            )
            * 2
        )
        gpus = {s.gpu for s in c.stages}
        nodes = {node_of[r][1] + 1000 * node_of[r][2] for s in c.stages for r in s.ranks}
        bw = min(
            _interconnect(g).nic_bandwidth if len(nodes) > 1 else _interconnect(g).scale_up_bandwidth
            for g in gpus
        )
        dp_ns = 2 * (reps - 1) / reps * grad / bw * 1e9
    opt = max(
        op_micros(
            optimizer_op(
                rank_params(
                    m, shard_of(m, len(s.ranks), 0), s.layers[1] - s.layers[0] + 1, s.stage == 0, False
                ),
                2,
            ),
            catalog.gpu(s.gpu),
        )
        * 1e3
        for s in c.stages
    )
    return int(worst + dp_ns + opt)


def _interconnect(gpu: str):
    """The derived cluster's interconnect row of a GPU: the preset's, or a hypothetical GPU's own."""
    if catalog.is_catalog_gpu(gpu):
        return interconnect(INTERCONNECT, gpu)
    return defined_interconnect(INTERCONNECT, gpu, gpu_type_entry(catalog.gpu(gpu)))


def _link_bw(a: Stage, b: Stage, node_of: dict[int, tuple[str, int, int]]) -> float:
    na, nb = node_of[a.ranks[0]], node_of[b.ranks[0]]
    same = na[1:] == nb[1:]
    pa, pb = _interconnect(a.gpu), _interconnect(b.gpu)
    if same:
        return min(pa.scale_up_bandwidth, pb.scale_up_bandwidth)
    return min(pa.nic_bandwidth, pb.nic_bandwidth)


@dataclass(frozen=True)
class Verified:
    """One replayed plan of the search."""

    candidate: Candidate
    spec_path: str
    row: dict[str, Any]


@dataclass(frozen=True)
class SearchResult:
    """What the search tried, how long each phase took, and the replayed plans, best first."""

    cluster: str
    model: str
    global_batch: int
    seq: int
    enumerated: int
    refused_memory: int
    refused_spec: int
    estimated: int
    verified: tuple[Verified, ...]
    phase_s: dict[str, float]
    breakdown: tuple[dict[str, Any], ...]  # per rank of the winner: time accounting and memory
    why: tuple[str, ...]
    bound: int = 0  # the plan count estimated before enumerating (count_bound), at least `enumerated`


@dataclass(frozen=True)
class SearchRequest:
    """A plan search (`xsim plan --search`): the cluster, model and global batch (sequences per
    iteration), the sequence length (None: the model's), how many plans to verify, where to write them,
    the sweep's workers and Dask scheduler, whether to show progress, and a file of hypothetical GPUs the
    cluster may name (tracegen.spec.read_gpu_file)."""

    cluster: str
    model: str
    global_batch: int
    seq: int | None = None
    top: int = 3
    out: str = "out/search"
    workers: int = 2
    scheduler: str | None = None
    progress: bool = False
    gpu_file: str | None = None


def search(request: SearchRequest) -> SearchResult:
    """Propose, prune, estimate and verify plans; write the verified ones as spec files under `out`."""
    defs = read_gpu_file(request.gpu_file) if request.gpu_file else {}
    with catalog.defined_gpus(gpu_file_specs(defs)):
        return _search(request, defs)


def _search(req: SearchRequest, defs: Mapping[str, Any]) -> SearchResult:
    t0 = time.perf_counter()
    cluster, model, global_batch, seq = req.cluster, req.model, req.global_batch, req.seq
    pools = parse_cluster(cluster)
    try:
        base = preset(model)
    except XsimError as exc:
        raise SearchError(f"--model: {exc}") from None
    if base.moe is not None or base.mla is not None:
        raise SearchError(
            f"--model {model}: the plan search does not place experts (ep) or MLA yet: write the spec by hand "
            "with parallel: {ep: ...}"
        )
    m = with_seq_len(base, seq or base.seq_len)
    if global_batch < 1 or req.top < 1 or (seq is not None and seq < 1):
        raise SearchError("--global-batch, --seq and --top must be >= 1")
    bound = check_search_size(cluster, pools, m, global_batch)
    cands = enumerate_candidates(pools, m, global_batch)
    if not cands:
        raise SearchError(f"no plan of {cluster} divides a global batch of {global_batch} sequences")
    t_enum = time.perf_counter()
    fits, oom, bad = _fitting(cands, model, m.seq_len, defs)
    t_mem = time.perf_counter()
    scored = sorted(
        (Candidate(c.family, c.stages, c.micro_batches, c.reshard, estimate_ns(c, pools, m)) for c in fits),
        key=lambda c: (c.estimate_ns, c.describe()),
    )
    t_est = time.perf_counter()
    verified = _verify(req, _best_layouts(scored, req.top), m.seq_len, defs)
    t_rep = time.perf_counter()
    ok = [v for v in verified if v.row["status"] == "ok"]
    breakdown, why = _explain(ok) if ok else ((), ("no verified plan replayed",))
    return SearchResult(
        cluster, m.name, global_batch, m.seq_len, len(cands), oom, bad, len(scored), tuple(verified),
        {"enumerate": t_enum - t0, "memory": t_mem - t_enum, "estimate": t_est - t_mem, "replay": t_rep - t_est, "total": t_rep - t0},
        breakdown, why, bound,
    )  # fmt: skip


def _fitting(
    cands: list[Candidate], model: str, seq: int, defs: Mapping[str, Any]
) -> tuple[list[Candidate], int, int]:
    """The candidates whose memory fits, and how many did not fit and how many were not valid specs."""
    fits: list[Candidate] = []
    oom = bad = 0
    for c in cands:
        try:
            dep = load_spec(c.spec(model, seq, "candidate", defs))
            check_fits(deployment_memory(dep), "candidate")
        except OutOfMemory:
            oom += 1
            continue
        except SpecError:
            bad += 1
            continue
        fits.append(c)
    return fits, oom, bad


def _best_layouts(scored: list[Candidate], top: int) -> list[Candidate]:
    """The `top` best-estimated candidates of different layouts."""
    # Verify K different layouts: reshard variants of one layout share its estimate (the strategies differ
    # only at TP-changing boundaries), so only the first of them is replayed.
    best, layouts = [], set()
    for c in scored:
        if c.stages not in layouts:
            layouts.add(c.stages)
            best.append(c)
        if len(best) == top:
            break
    return best


def _verify(req: SearchRequest, best: list[Candidate], seq: int, defs: Mapping[str, Any]) -> list[Verified]:
    """Replay the chosen plans (a sweep) and write each as plan_NN.yaml, NN its rank by replayed time."""
    out = req.out
    os.makedirs(out, exist_ok=True)
    tasks = []
    for i, c in enumerate(best):
        spec = c.spec(req.model, seq, "plan", defs)
        spec_json = sw.resolve(spec, os.getcwd())
        key = sw.plan_key(spec_json, "analytical")
        tasks.append(
            sw.PlanTask(
                key,
                c.describe(),
                json.dumps({"rank": i + 1}),
                spec_json,
                "analytical",
                os.path.join(out, sw.PLANS_DIR, key),
            )
        )
    sw.run_sweep(tasks, out, workers=req.workers, scheduler=req.scheduler, progress=req.progress)
    rows = {r["key"]: r for r in sw.rows_for(tasks, out).iter_rows(named=True)}
    order = sorted(
        zip(best, tasks, strict=True),
        key=lambda ct: (
            rows[ct[1].key]["status"] != "ok",
            rows[ct[1].key]["iteration_time_ns"] or 0,
            ct[1].key,
        ),
    )
    # plan_01.yaml is the winner: files are named by replayed rank.
    verified = [
        Verified(c, os.path.join(out, f"plan_{i:02d}.yaml"), rows[t.key]) for i, (c, t) in enumerate(order, 1)
    ]
    for v in verified:
        _write_spec(v, req.model, seq, req.cluster, defs)
    return verified


def _write_spec(v: Verified, model: str, seq: int, cluster: str, defs: Mapping[str, Any]) -> None:
    r = v.row
    name = os.path.basename(v.spec_path).split(".")[0]
    head = [f"# xsim plan --search {cluster} --model {model}: {v.candidate.describe()}"]
    if r["status"] == "ok":
        usd = r["cost_usd_per_million_tokens"]
        head.append(
            f"# replayed: iteration {r['iteration_time_ns'] / 1e9:.4f} s, {r['tokens_per_s']:,.0f} tokens/s, "
            + ("no price" if usd is None else f"${usd:.4f} per M tokens")
            + f", memory headroom {r['min_headroom_bytes'] / 2**30:.1f} GiB (least of all ranks)"
        )
    else:
        head.append(f"# replay failed: {r['error']}")
    head.append(f"# analytical estimate {v.candidate.estimate_ns / 1e9:.4f} s")
    body = yaml.safe_dump(
        v.candidate.spec(model, seq, name, defs), sort_keys=False, default_flow_style=None, width=120
    )
    with open(v.spec_path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(head) + "\n" + body)


def _explain(ok: Sequence[Verified]) -> tuple[tuple[dict[str, Any], ...], tuple[str, ...]]:
    import polars as pl

    win = ok[0]
    ranks = pl.read_parquet(os.path.join(win.row["dir"], "result", "ranks.parquet")).sort("rank")
    mem = read_json(os.path.join(win.row["dir"], "traces", "memory.json"))["ranks"]
    rows = []
    for r, mm in zip(ranks.iter_rows(named=True), mem, strict=True):
        rows.append(
            {
                "rank": r["rank"], "gpu": mm["gpu"], "stage": mm["stage"], "layers": mm["layers"],
                "compute_ns": r["compute_ns"], "exposed_comm_ns": r["exposed_comm_ns"], "wait_ns": r["wait_ns"],
                "bubble_ns": r["bubble_ns"], "finish_ns": r["finish_ns"], "memory_bytes": mm["total"],
                "capacity_bytes": mm["capacity"],
            }
        )  # fmt: skip
    why = [
        f"fastest of {len(ok)} replayed: {win.row['iteration_time_ns'] / 1e9:.4f} s"
        + (
            f", {100 * (1 - win.row['iteration_time_ns'] / ok[1].row['iteration_time_ns']):.1f}% ahead of the next ({ok[1].row['iteration_time_ns'] / 1e9:.4f} s)"
            if len(ok) > 1
            else ""
        )
    ]
    busiest = max(rows, key=lambda x: x["compute_ns"])
    why.append(
        f"busiest rank {busiest['rank']} ({busiest['gpu']}) computes {busiest['compute_ns'] / 1e9:.3f} s of "
        f"{win.row['iteration_time_ns'] / 1e9:.3f} s; max bubble {max(x['bubble_ns'] for x in rows) / 1e9:.3f} s, "
        f"max exposed communication {max(x['exposed_comm_ns'] for x in rows) / 1e9:.3f} s, max straggler wait "
        f"{max(x['wait_ns'] for x in rows) / 1e9:.3f} s"
    )
    if len(ok) > 1:
        other = ok[1].row
        why.append(
            f"runner-up: max bubble {other['bubble_ns_max'] / 1e9:.3f} s vs {win.row['bubble_ns_max'] / 1e9:.3f} s, "
            f"exposed communication of all ranks {other['exposed_comm_ns'] / 1e9:.3f} s vs {win.row['exposed_comm_ns'] / 1e9:.3f} s, "
            f"max wait {other['wait_ns_max'] / 1e9:.3f} s vs {win.row['wait_ns_max'] / 1e9:.3f} s"
        )
    return tuple(rows), tuple(why)


def format_search(res: SearchResult) -> str:
    """The search report: what was tried, how long, the verified plans, and why the winner wins."""
    ph = res.phase_s
    lines = [
        f"search {res.cluster}, {res.model}, global batch {res.global_batch} x {res.seq} tokens",
        f"tried {res.enumerated} plans (estimated at most {res.bound} before enumerating): {res.refused_memory} do not fit in memory, {res.refused_spec} invalid, "
        f"{res.estimated} estimated, {len(res.verified)} replayed; {ph['total']:.1f} s (enumerate "
        f"{ph['enumerate']:.1f}, memory {ph['memory']:.1f}, estimate {ph['estimate']:.1f}, replay {ph['replay']:.1f})",
        f"{'#':>2} {'estimate s':>10} {'replay s':>9} {'tokens/s':>9} {'$/Mtok':>8} {'headroom GiB':>12}  spec / plan",
    ]
    for i, v in enumerate(res.verified, 1):
        r = v.row
        if r["status"] == "ok":
            usd = (
                "-" if r["cost_usd_per_million_tokens"] is None else f"{r['cost_usd_per_million_tokens']:.4f}"
            )
            lines.append(
                f"{i:>2} {v.candidate.estimate_ns / 1e9:>10.4f} {r['iteration_time_ns'] / 1e9:>9.4f} "
                f"{r['tokens_per_s']:>9,.0f} {usd:>8} {r['min_headroom_bytes'] / 2**30:>12.1f}  {v.spec_path}"
            )
        else:
            lines.append(
                f"{i:>2} {v.candidate.estimate_ns / 1e9:>10.4f} {'failed':>9}  {v.spec_path}: {r['error']}"
            )
        lines.append(f"{'':>3}{v.candidate.describe()}")
    lines.append("why the winner wins:")
    lines += [f"  {w}" for w in res.why]
    if res.breakdown:
        lines.append(
            f"  {'rank':>4} {'GPU':<10} {'stage':>5} {'layers':>6} {'compute s':>9} {'exp.comm s':>10} "
            f"{'wait s':>7} {'bubble s':>8} {'memory GiB':>10}"
        )
        for b in res.breakdown:
            lines.append(
                f"  {b['rank']:>4} {b['gpu']:<10} {b['stage']:>5} {b['layers']:>6} {b['compute_ns'] / 1e9:>9.3f} "
                f"{b['exposed_comm_ns'] / 1e9:>10.3f} {b['wait_ns'] / 1e9:>7.3f} {b['bubble_ns'] / 1e9:>8.3f} "
                f"{b['memory_bytes'] / 2**30:>5.1f}/{b['capacity_bytes'] / 2**30:.0f}"
            )
    return "\n".join(lines)
