"""Gradient bytes per model layer, from the architecture's parameter counts (tracegen.models)."""

from __future__ import annotations

from typing import Any

from tracegen.errors import CatalogError
from tracegen.models import ModelArch, preset


def model_arch(model: Any) -> ModelArch:
    """A ModelArch from a deployment's ModelSpec message (or a ModelArch itself).

    Objects without a `linear_bias` field take the preset's value when they name one, else no biases.
    """
    if isinstance(model, ModelArch):
        return model
    bias = getattr(model, "linear_bias", None)
    if bias is None:
        try:
            bias = preset(str(model.name)).linear_bias
        except CatalogError:
            bias = False
    heads = int(model.heads)
    return ModelArch(
        name=str(model.name) or "custom",
        layers=int(model.layers),
        hidden=int(model.hidden),
        ffn_hidden=int(model.ffn_hidden),
        heads=heads,
        kv_heads=int(getattr(model, "kv_heads", 0) or heads),
        vocab=int(model.vocab),
        seq_len=int(getattr(model, "seq_len", 0) or 1),
        activation=str(getattr(model, "activation", "") or "swiglu"),
        norm=str(getattr(model, "norm", "") or "rmsnorm"),
        linear_bias=bool(bias),
    )


def layer_grad_bytes(arch: ModelArch, dtype_bytes: int) -> dict[int, int]:
    """Gradient bytes of each layer 1..N (full, unsharded), embedding folded into layer 1, head into N.

    The token embedding lives on the stage holding layer 1 and the output head (final norm + projection)
    on the stage holding layer N, so the DP groups covering those layers are the ones that must reduce them.
    """
    per_layer = arch.layer_params() * dtype_bytes
    out = dict.fromkeys(range(1, arch.layers + 1), per_layer)
    out[1] += arch.embedding_params() * dtype_bytes
    out[arch.layers] += arch.head_params() * dtype_bytes
    return out
