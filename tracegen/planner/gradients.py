"""Gradient bytes per model layer, from the architecture's parameter counts (tracegen.models)."""

from __future__ import annotations

from xsim.tracegen.models import ModelArch


def layer_grad_bytes(arch: ModelArch, dtype_bytes: int, ends_apart: bool = True) -> dict[int, int]:
    """Gradient bytes of each layer 1..N (full, unsharded), embedding folded into layer 1, head into N.

    The token embedding lives on the stage holding layer 1 and the output head (final norm + projection)
    on the stage holding layer N, so the DP groups covering those layers are the ones that must reduce them.
    A tied model (ModelArch.tied) keeps a copy of the embedding as its projection where the two ends sit on
    different stages (`ends_apart`, Megatron's last-stage copy); where every stage holds both, one tensor.
    """
    # layer_params_at: a MoE layer holds its router and all its experts (the whole layer; with ep > 1 the
    # generator syncs the experts over the expert-DP group instead), a dense layer the dense MLP.
    out = {i: arch.layer_params_at(i) * dtype_bytes for i in range(1, arch.layers + 1)}
    out[1] += arch.embedding_params() * dtype_bytes
    copy = arch.hidden * arch.vocab if arch.tied and ends_apart else 0
    out[arch.layers] += (arch.head_params() + copy) * dtype_bytes
    return out
