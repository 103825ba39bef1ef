"""Module, layer, phase and profiler-step labels of host ops, from record_function scopes."""

from __future__ import annotations

import re
from dataclasses import dataclass

from xsim.tracegen.importers.pytorch.comms import comm_kind
from xsim.tracegen.importers.pytorch.hostet import HostTrace

MODULE_PREFIX = "nn.Module: "  # the profiler's spelling of module scopes (python_function events)
# Transformer/ResNet container names whose index is the layer number: GPT-2 `h.3`, Llama `layers.3`,
# BERT `encoder.layer.3`, timm `blocks.3`.
LAYER_RE = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)(?:\.|$)")
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass(frozen=True, slots=True)
class Label:
    """What an op belongs to."""

    module: str  # dotted module path ("layers.0.attn"), a scope name ("loss"), or ""
    layer: int  # 1-based layer number; 0 = not a layer op
    phase: str  # "fwd" | "bwd" | "opt" | "sync" | ""


def layer_of(module: str) -> int:
    """1-based layer number of a module path (`layers.0.attn` -> 1), 0 when it names no layer."""
    m = LAYER_RE.search(module)
    return int(m.group(1)) + 1 if m else 0


def _scope_phase(name: str) -> str | None:
    low = name.lower()
    if name.startswith(BACKWARD_PREFIX) or "## backward ##" in low or low.endswith(".backward"):
        return "bwd"
    if name.startswith("Optimizer.") or "## optimizer ##" in low or "zero_grad" in low:
        return "opt"
    if (
        "## forward ##" in low
        or name.startswith(MODULE_PREFIX)
        or low.endswith(".forward")
        or "## loss ##" in low
    ):
        return "fwd"
    return None


def _scope_module(name: str) -> str | None:
    if name.startswith(MODULE_PREFIX):
        return name[len(MODULE_PREFIX) :]
    low = name.lower()
    if low.startswith("## ") and low.endswith(" ##") and "loss" in low:
        return "loss"
    return None


def label_ops(host: HostTrace) -> dict[int, Label]:
    """Label every host op from its ancestors' scopes; backward ops take the module of their forward op."""
    children = host.children()
    out: dict[int, Label] = {}
    fwd_module: dict[int, str] = {}  # sequence number -> module of the forward op
    roots = [o.id for o in host.ops.values() if o.parent == o.id or o.parent not in host.ops]
    stack = [(r, "", "") for r in sorted(roots, reverse=True)]
    order = []
    while stack:
        oid, module, phase = stack.pop()
        op = host.ops[oid]
        module = _scope_module(op.name) or module
        phase = _scope_phase(op.name) or phase
        if comm_kind(op.name) is not None and phase in ("bwd", ""):
            phase = "sync"  # gradient synchronization issued from the backward pass
        order.append((oid, module, phase))
        for c in reversed(children.get(oid, ())):
            stack.append((c, module, phase))
    # Forward ops carry a sequence number that their autograd backward node repeats.
    for oid, module, phase in order:
        op = host.ops[oid]
        if phase == "fwd" and op.seq_id >= 0 and module:
            fwd_module.setdefault(op.seq_id, module)
    inherited: dict[int, str] = {}
    for oid, module, phase in order:
        op = host.ops[oid]
        seq = op.seq_id
        if seq < 0 and op.name.startswith(BACKWARD_PREFIX):
            # The evaluate_function wrapper carries no sequence number; the autograd node under it does.
            seq = next((host.ops[c].seq_id for c in children.get(oid, ()) if host.ops[c].seq_id >= 0), -1)
        if phase == "bwd" and seq >= 0 and seq in fwd_module:
            module = fwd_module[seq]
        elif op.parent in inherited and not _scope_module(op.name):
            module = inherited[op.parent]
        if phase == "bwd":
            inherited[oid] = module
        out[oid] = Label(module=module, layer=layer_of(module), phase=phase)
    return out
