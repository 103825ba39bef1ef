"""Record a small transformer training step on CPU with PyTorch: execution trace + Kineto + un-profiled times.

Usage:
    .venv/bin/python scripts/record_pytorch.py --out traces/examples/pytorch [--ranks 1 2] [--pipeline]

For each configuration (1 process; 2-rank gloo DDP over 127.0.0.1; with --pipeline a 2-stage pipeline whose
stages exchange activations and gradients by gloo send/recv) it writes, per rank r:
    <name>_et.<r>.json.gz       PyTorch ExecutionTraceObserver host trace (schema 1.1.x)
    <name>_kineto.<r>.json.gz   torch.profiler (Kineto) trace of the same steps, with ProfilerStep#N
    <name>_times.json           un-profiled wall-clock step times of every rank (seconds)

torch is optional for xsim: `make torch` installs the CPU wheel (torch==2.13.0+cpu).
The model is deliberately tiny (2 layers, hidden 64) so the gzipped bundle stays well under 1 MB.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, record_function, schedule

# Model size: small enough that a step is a few tens of milliseconds on one CPU core and the traces of one
# profiled step compress to ~100 kB, large enough that GEMMs dominate the compute time of each layer.
VOCAB, HIDDEN, HEADS, FFN, LAYERS, SEQ, BATCH = 512, 64, 4, 256, 2, 32, 8
WARMUP_STEPS, PROFILED_STEPS, TIMED_STEPS = 2, 2, 10


class Attention(nn.Module):
    """Multi-head self-attention with a fused QKV projection."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, HEADS, h // HEADS).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, h))


class Mlp(nn.Module):
    """Two-layer GELU feed-forward block."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(HIDDEN, FFN)
        self.fc2 = nn.Linear(FFN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(HIDDEN)
        self.attn = Attention()
        self.ln2 = nn.LayerNorm(HIDDEN)
        self.mlp = Mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGpt(nn.Module):
    """Token embedding, LAYERS blocks, final norm and LM head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


class PipelineStage(nn.Module):
    """One half of TinyGpt for 2-stage pipeline parallelism; module names match the full model's."""

    def __init__(self, stage: int) -> None:
        super().__init__()
        half = LAYERS // 2
        first, last = (0, half) if stage == 0 else (half, LAYERS)
        if stage == 0:
            self.embed = nn.Embedding(VOCAB, HIDDEN)
        # A ModuleDict keyed by the global index keeps the names `layers.<i>` of the full model.
        self.layers = nn.ModuleDict({str(i): Block() for i in range(first, last)})
        if stage == 1:
            self.norm = nn.LayerNorm(HIDDEN)
            self.head = nn.Linear(HIDDEN, VOCAB)
        self.stage = stage

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stage == 0:
            x = self.embed(x)
        for layer in self.layers.values():
            x = layer(x)
        return self.head(self.norm(x)) if self.stage == 1 else x


def _label_modules(model: nn.Module) -> None:
    """Wrap every named submodule's forward in a record_function scope `nn.Module: <qualified name>`.

    The importer reads these scopes (the same spelling the profiler uses for its python_function events)
    to label ops with their module and layer.
    """
    for name, module in model.named_modules():
        if not name or isinstance(module, nn.ModuleList | nn.ModuleDict):
            continue
        scope = f"nn.Module: {name}"

        def pre(_m, _inp, scope=scope):
            _m._xsim_rf = record_function(scope)
            _m._xsim_rf.__enter__()

        def post(_m, _inp, _out):
            _m._xsim_rf.__exit__(None, None, None)

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def _step(model: nn.Module, opt: torch.optim.Optimizer, step: int, rank: int) -> None:
    inputs, targets = _batch(step, rank)
    opt.zero_grad(set_to_none=True)
    with record_function("## forward ##"):
        logits = model(inputs)
    with record_function("## loss ##"):
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    with record_function("## backward ##"):
        loss.backward()
    with record_function("## optimizer ##"):
        opt.step()


def _pp_step(model: nn.Module, opt: torch.optim.Optimizer, step: int, rank: int) -> None:
    """One GPipe step with one micro-batch: activations 0 -> 1 (tag 1), their gradient 1 -> 0 (tag 2)."""
    inputs, targets = _batch(step, 0)
    opt.zero_grad(set_to_none=True)
    if rank == 0:
        with record_function("## forward ##"):
            h = model(inputs)
        dist.send(h.detach(), dst=1, tag=1)
        grad = torch.empty_like(h)
        dist.recv(grad, src=1, tag=2)
        with record_function("## backward ##"):
            h.backward(grad)
    else:
        h = torch.empty(BATCH, SEQ, HIDDEN)
        dist.recv(h, src=0, tag=1)
        h.requires_grad_(True)
        with record_function("## forward ##"):
            logits = model(h)
        with record_function("## loss ##"):
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        with record_function("## backward ##"):
            loss.backward()
        dist.send(h.grad, dst=0, tag=2)
    with record_function("## optimizer ##"):
        opt.step()


def _run(rank: int, world: int, port: int, out: str, name: str, pipeline: bool = False) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one intra-op thread per process: the recording machine has 2 cores
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model: nn.Module = PipelineStage(rank) if pipeline else TinyGpt()
    _label_modules(model)
    step_fn = _pp_step if pipeline else _step
    if world > 1 and not pipeline:
        # Small buckets so the step holds several gradient all-reduces, as a real DDP run does.
        model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)

    # Un-profiled step times first (what the replay of the profiled run is ultimately compared with).
    for s in range(WARMUP_STEPS):
        step_fn(model, opt, s, rank)
    times = []
    for s in range(TIMED_STEPS):
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        step_fn(model, opt, s, rank)
        times.append(time.perf_counter() - t0)

    tmp = tempfile.mkdtemp(prefix="xsim_rec_")
    et_path = os.path.join(tmp, f"et.{rank}.json")
    et = ExecutionTraceObserver().register_callback(et_path)
    kineto_path = os.path.join(tmp, f"kineto.{rank}.json")
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=PROFILED_STEPS, repeat=1),
        record_shapes=True,
        execution_trace_observer=et,
        on_trace_ready=lambda p: p.export_chrome_trace(kineto_path),
    ) as prof:
        for s in range(1 + PROFILED_STEPS):
            if world > 1:
                dist.barrier()
            step_fn(model, opt, 100 + s, rank)
            prof.step()
    et.unregister_callback()
    for src, kind in ((et_path, "et"), (kineto_path, "kineto")):
        dst = os.path.join(out, f"{name}_{kind}.{rank}.json.gz")
        with open(src, "rb") as fh, open(dst, "wb") as raw:
            # mtime 0 keeps the gzip bytes reproducible for the same JSON.
            with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as gz:
                gz.write(fh.read())
    shutil.rmtree(tmp, ignore_errors=True)
    with open(os.path.join(out, f"{name}_times.{rank}.json"), "w", encoding="utf-8") as fh:
        json.dump({"rank": rank, "world_size": world, "step_s": times}, fh)
    if world > 1:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def record(out: Path, world: int, pipeline: bool = False) -> str:
    """Record one configuration (data parallel, or a 2-stage pipeline); returns its bundle name."""
    name = "tinygpt_pp2" if pipeline else f"tinygpt_{world}rank"
    world = 2 if pipeline else world
    out.mkdir(parents=True, exist_ok=True)
    if world == 1:
        _run(0, 1, 0, str(out), name)
    else:
        mp.spawn(_run, args=(world, _free_port(), str(out), name, pipeline), nprocs=world, join=True)
    merged = {
        "model": "TinyGpt",
        "world_size": world,
        "parallelism": "pp2" if pipeline else "dp",
        "ranks": [],
    }
    for r in range(world):
        part = out / f"{name}_times.{r}.json"
        data = json.loads(part.read_text())
        part.unlink()
        merged["ranks"].append(
            {"rank": r, "step_s": data["step_s"], "median_step_s": statistics.median(data["step_s"])}
        )
    merged["torch"] = torch.__version__
    merged["config"] = {
        "vocab": VOCAB,
        "hidden": HIDDEN,
        "heads": HEADS,
        "ffn": FFN,
        "layers": LAYERS,
        "seq": SEQ,
        "batch": BATCH,
        "profiled_steps": PROFILED_STEPS,
        "timed_steps": TIMED_STEPS,
    }
    (out / f"{name}_times.json").write_text(json.dumps(merged, indent=1) + "\n")
    return name


def main() -> None:
    """Parse arguments and record every requested configuration."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("traces/examples/pytorch"))
    ap.add_argument("--ranks", type=int, nargs="*", default=[1, 2], help="data-parallel runs to record")
    ap.add_argument("--pipeline", action="store_true", help="also record the 2-stage pipeline (P2P) run")
    args = ap.parse_args()
    for world in args.ranks:
        name = record(args.out, world)
        print(f"recorded {name} -> {args.out}")
    if args.pipeline:
        print(f"recorded {record(args.out, 2, pipeline=True)} -> {args.out}")


if __name__ == "__main__":
    main()
