"""Mixture of experts and multi-head latent attention in the model: their spec, routing and parameter counts.

A MoE layer is Megatron-Core's MoELayer (megatron/core/transformer/moe/moe_layer.py): a router (a linear
layer hidden -> experts, no bias), top-k selection, `experts` routed SwiGLU/GELU experts of width
`expert_ffn`, optionally `shared_experts` always-active experts (DeepSeekMoE, arXiv:2401.06066) of total
width `shared_ffn`. The attention half of a MoE layer is the dense layer's.

Routing decides how many tokens each expert receives: the op sizes (tracegen/moe_ops.py) follow these
counts, not the average. The counts of one source rank's micro-batch at one layer come from
`expert_tokens`: `uniform` (T*k/E each), `zipf` (a seeded order of the experts, expert j of it weighted
1/(j + 1)^skew), `weights` (given relative popularity) or `tokens` (a table, one row per source: TP
rank j of EP rank q is row q * tp + j, mod the rows).
Each expert receives at most T tokens (a token picks k distinct experts); with a capacity factor, tokens
past Megatron-Core's capacity ceil(T*k/E * factor) are dropped (moe_utils.get_capacity, called with
num_tokens * topk by topk_softmax_with_capacity, drop policy "probs"). With `pad_to_capacity` as well
(Megatron-Core's moe_pad_expert_input_to_capacity) every expert takes exactly `capacity` tokens of every
source whatever the routing: apply_router_token_dropping keeps the capacity mask itself (the top-capacity
tokens by probability, zero-probability ones included) and the all-to-all dispatcher's preprocess sets
every expert's count to the capacity (token_dispatcher.py, drop_and_pad), so shapes are fixed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from fractions import Fraction
from typing import Any

from xsim.tracegen.choices import GATED_ACTIVATIONS
from xsim.tracegen.errors import CatalogError

DISTRIBUTIONS = ("uniform", "zipf", "weights", "tokens")


@dataclass(frozen=True)
class Routing:
    """How one micro-batch's T*k routed tokens spread over the experts."""

    distribution: str = "uniform"
    skew: float = 0.0  # zipf exponent
    seed: int = 0  # zipf: seed of the expert order drawn per (layer, EP rank)
    weights: tuple[float, ...] = ()  # weights: relative popularity per expert
    tokens: tuple[
        tuple[int, ...], ...
    ] = ()  # tokens: rows of tokens per expert, row i for EP rank i mod rows


@dataclass(frozen=True)
class MoeSpec:
    """The mixture-of-experts MLP of a model."""

    experts: int
    top_k: int
    expert_ffn: int
    shared_experts: int = 0
    shared_ffn: int = 0  # FFN width of all shared experts together (0 = shared_experts * expert_ffn)
    layers: tuple[int, ...] = ()  # 1-based MoE layers; () = every layer
    capacity_factor: float = 0.0  # 0 = dropless
    routing: Routing = field(default_factory=Routing)
    pad_to_capacity: bool = False  # every expert gets exactly the capacity from every source (needs a factor)
    aux_loss_coeff: float = 0.0  # Megatron-Core's moe_aux_loss_coeff (load-balancing loss; 0 = none)

    @property
    def shared_width(self) -> int:
        """FFN width of the shared experts together (0 without them)."""
        return self.shared_ffn or self.shared_experts * self.expert_ffn

    def is_moe(self, layer: int) -> bool:
        """Whether 1-based `layer` is a MoE layer."""
        return not self.layers or layer in self.layers

    def count(self, num_layers: int) -> int:
        """MoE layers among `num_layers` layers."""
        return sum(1 for x in range(1, num_layers + 1) if self.is_moe(x))


@dataclass(frozen=True)
class MlaSpec:
    """Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, section 2.1; DeepSeek-V3 config.json)."""

    q_lora_rank: int  # 0: Q projected directly from the hidden state
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    def params(self, hidden: int, heads: int) -> int:
        """Weights of one layer's attention: Q down/up (or one Q projection), the joint KV down projection
        with the decoupled RoPE key, the two latent RMSNorm gains, KV up projection, output projection."""
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        if self.q_lora_rank:
            q = hidden * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * heads * qk
        else:
            q = hidden * heads * qk
        kv = hidden * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        kv += self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv + heads * self.v_head_dim * hidden


def expert_mlp_params(width: int, hidden: int, activation: str, bias: bool = False) -> int:
    """Weights of one expert MLP of FFN `width` (gated, SwiGLU or GeGLU: gate, up and down; otherwise up and
    down), with `bias` its linears' biases too (the up projection's `width`, twice when gated, and the down
    projection's `hidden`: a model with `linear_bias`, as DeepSpeed-MoE's experts, copies of Megatron's
    ParallelMLP, and GPT-OSS's have them)."""
    up = (2 if activation in GATED_ACTIVATIONS else 1) * width
    return (up + width) * hidden + ((up + hidden) if bias else 0)


def moe_mlp_params(moe: MoeSpec, hidden: int, activation: str, bias: bool = False) -> int:
    """Weights of one MoE layer's MLP: router (no bias), routed experts and shared experts."""
    routed = moe.experts * expert_mlp_params(moe.expert_ffn, hidden, activation, bias)
    shared = expert_mlp_params(moe.shared_width, hidden, activation, bias) if moe.shared_width else 0
    return hidden * moe.experts + routed + shared


# -- routing ------------------------------------------------------------------------------------------------
def _apportion(weights: Sequence[Fraction], total: int, cap: int) -> list[int]:
    """`total` split in proportion to `weights`, no part over `cap`: capped parts fixed at `cap` and the rest
    re-split (water filling), then largest remainders (ties to the lower expert index)."""
    n = len(weights)
    fixed: dict[int, int] = {}
    while True:
        free = [i for i in range(n) if i not in fixed]
        left = total - sum(fixed.values())
        wsum = sum(weights[i] for i in free)
        if not free or wsum == 0:
            break
        share = {i: weights[i] * left / wsum for i in free}
        over = [i for i in free if share[i] > cap]
        if not over:
            break
        for i in over:
            fixed[i] = cap
    out = [0] * n
    for i, v in fixed.items():
        out[i] = v
    if free and wsum:
        floors = {i: math.floor(share[i]) for i in free}
        for i in free:
            out[i] = floors[i]
        rest = left - sum(floors.values())
        order = sorted(free, key=lambda i: (-(share[i] - floors[i]), i))
        for i in order[:rest]:
            out[i] += 1
    return out


def expert_tokens(moe: MoeSpec, tokens: int, layer: int, source: int) -> tuple[int, ...]:
    """Tokens each expert receives from the micro-batch of `tokens` tokens of EP rank `source` at `layer`,
    after the capacity drop (dropless without a capacity factor)."""
    r, e, k = moe.routing, moe.experts, moe.top_k
    total = tokens * k
    if r.distribution == "tokens":
        loads = list(r.tokens[source % len(r.tokens)])
    else:
        if r.distribution == "zipf":
            order = list(range(e))
            random.Random(f"xsim-moe:{r.seed}:{layer}:{source}").shuffle(order)
            w = [Fraction(0)] * e
            for j, expert in enumerate(order):
                w[expert] = Fraction(1) / Fraction(j + 1) ** Fraction(r.skew)
        elif r.distribution == "weights":
            w = [Fraction(x) for x in r.weights]
        else:
            w = [Fraction(1)] * e
        loads = _apportion(w, total, tokens)
    if moe.capacity_factor:
        cap = capacity(moe, tokens)
        loads = [cap] * e if moe.pad_to_capacity else [min(x, cap) for x in loads]
    return tuple(loads)


def capacity(moe: MoeSpec, tokens: int) -> int:
    """Megatron-Core's expert capacity for a micro-batch of `tokens` tokens: ceil(T*k/E * factor)."""
    return math.ceil(Fraction(tokens * moe.top_k, moe.experts) * Fraction(moe.capacity_factor))


def check_routing(moe: MoeSpec, tokens: int) -> str:
    """ "" when the routing fits micro-batches of `tokens` tokens, else what is wrong (a table row whose sum
    is not T*k or an expert over T tokens)."""
    r = moe.routing
    if moe.pad_to_capacity and capacity(moe, tokens) > tokens:
        # apply_router_token_dropping takes the top-capacity tokens of each expert: at most the T it has
        return (
            f"pad_to_capacity: capacity {capacity(moe, tokens)} exceeds the {tokens} tokens a source routes "
            "(Megatron-Core pads each expert to the capacity from its own tokens)"
        )
    if r.distribution != "tokens":
        return ""
    for i, row in enumerate(r.tokens):
        if sum(row) != tokens * moe.top_k:
            return (
                f"routing tokens row {i} sums to {sum(row)}, but a micro-batch of {tokens} tokens routes "
                f"{tokens} x top_k {moe.top_k} = {tokens * moe.top_k}"
            )
        if max(row) > tokens:
            return f"routing tokens row {i} gives an expert {max(row)} tokens, more than the {tokens} of a micro-batch"
    return ""


# -- spec parsing -------------------------------------------------------------------------------------------
MOE_KEYS = tuple(f.name for f in fields(MoeSpec))
MLA_KEYS = tuple(f.name for f in fields(MlaSpec))


def _pos_int(v: Any, what: str, minimum: int = 1) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not minimum <= v < 2**31:
        raise CatalogError(f"model: {what} must be an integer >= {minimum}, got {v!r:.60}")
    return v


def _layers(v: Any) -> tuple[int, ...]:
    """`all`, a list of 1-based layers, or a range string "a-b"."""
    if v in ("all", None) or v == ():
        return ()
    if isinstance(v, str):
        parts = v.split("-")
        if len(parts) == 2 and all(p.strip().isdigit() for p in parts):
            a, b = (int(p) for p in parts)
            if 1 <= a <= b < 2**31:
                return tuple(range(a, b + 1))
    elif isinstance(v, list | tuple) and v:
        return tuple(sorted({_pos_int(x, "moe layers entry") for x in v}))
    elif isinstance(v, range) and len(v):
        return tuple(v)
    raise CatalogError(f"model: moe layers must be 'all', a list of layers or a range 'a-b', got {v!r:.60}")


def routing_from_mapping(raw: Any, experts: int) -> Routing:
    """`uniform`, or {distribution: zipf, skew, seed} / {weights: [...]} / {tokens: [[...], ...]}."""
    if isinstance(raw, Routing):
        return raw
    if isinstance(raw, str):
        raw = {"distribution": raw}
    if not isinstance(raw, Mapping):
        raise CatalogError(f"model: moe routing must be a name or a mapping, got {raw!r:.60}")
    known = ("distribution", "skew", "seed", "weights", "tokens")
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise CatalogError(
            f"model: moe routing: unknown key(s) {', '.join(map(str, unknown))} (known: {', '.join(known)})"
        )
    dist = raw.get("distribution") or (
        "tokens" if "tokens" in raw else "weights" if "weights" in raw else "uniform"
    )
    if dist not in DISTRIBUTIONS:
        raise CatalogError(
            f"model: moe routing distribution must be one of {', '.join(DISTRIBUTIONS)}, got {dist!r:.60}"
        )
    skew, seed = raw.get("skew", 1.0 if dist == "zipf" else 0.0), raw.get("seed", 0)
    if not isinstance(skew, int | float) or isinstance(skew, bool) or not 0 <= skew <= 16:
        raise CatalogError(f"model: moe routing skew must be a number in [0, 16], got {skew!r:.60}")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        raise CatalogError(f"model: moe routing seed must be a non-negative integer, got {seed!r:.60}")
    weights: tuple[float, ...] = ()
    tokens: tuple[tuple[int, ...], ...] = ()
    if dist == "weights":
        w = raw.get("weights")
        ok = isinstance(w, list) and len(w) == experts
        if (
            not ok
            or not all(isinstance(x, int | float) and not isinstance(x, bool) and 0 <= x < 1e300 for x in w)
            or not sum(w)
        ):
            raise CatalogError(
                f"model: moe routing weights must be {experts} non-negative numbers, not all 0"
            )
        weights = tuple(float(x) for x in w)
    if dist == "tokens":
        t = raw.get("tokens")
        rows = t if isinstance(t, list) and t and isinstance(t[0], list) else [t]
        if not all(isinstance(r, list) and len(r) == experts for r in rows) or not all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**40 for r in rows for x in r
        ):
            raise CatalogError(
                f"model: moe routing tokens must be a row of {experts} token counts per expert, or a list of such rows (one per EP rank)"
            )
        tokens = tuple(tuple(r) for r in rows)
    return Routing(dist, float(skew), seed, weights, tokens)


def moe_from_mapping(raw: Any, layers: int, base: MoeSpec | None = None) -> MoeSpec:
    """A MoeSpec from a `moe:` mapping (keys of MoeSpec), over `base`'s values when a preset gives one."""
    if isinstance(raw, MoeSpec):
        return raw
    if not isinstance(raw, Mapping):
        raise CatalogError(f"model: moe must be a mapping ({', '.join(MOE_KEYS)}), got {raw!r:.60}")
    unknown = sorted(set(raw) - set(MOE_KEYS))
    if unknown:
        raise CatalogError(
            f"model: moe: unknown key(s) {', '.join(map(str, unknown))} (known: {', '.join(MOE_KEYS)})"
        )
    v: dict[str, Any] = {f.name: getattr(base, f.name) for f in fields(MoeSpec)} if base else {}
    v.update(raw)
    missing = [k for k in ("experts", "top_k", "expert_ffn") if k not in v]
    if missing:
        raise CatalogError(f"model: moe: missing {', '.join(missing)}")
    experts = _pos_int(v["experts"], "moe experts")
    top_k = _pos_int(v["top_k"], "moe top_k")
    if top_k > experts:
        raise CatalogError(f"model: moe top_k {top_k} exceeds its {experts} experts")
    cf = v.get("capacity_factor", 0.0)
    if cf in (None, "dropless"):
        cf = 0.0
    if not isinstance(cf, int | float) or isinstance(cf, bool) or not 0 <= cf <= 1e6:
        raise CatalogError(
            f"model: moe capacity_factor must be a number > 0 (or 0 / dropless), got {cf!r:.60}"
        )
    pad = v.get("pad_to_capacity", False)
    if not isinstance(pad, bool) or (pad and not cf):
        raise CatalogError(
            f"model: moe pad_to_capacity must be true or false and needs a capacity_factor, got {pad!r:.60}"
        )
    aux = v.get("aux_loss_coeff", 0.0)
    if not isinstance(aux, int | float) or isinstance(aux, bool) or not 0 <= aux <= 1e6:
        raise CatalogError(f"model: moe aux_loss_coeff must be a number >= 0, got {aux!r:.60}")
    moe_layers = _layers(v.get("layers"))
    if moe_layers and moe_layers[-1] > layers:
        raise CatalogError(f"model: moe layer {moe_layers[-1]} is past the model's {layers} layers")
    return MoeSpec(
        experts=experts,
        top_k=top_k,
        expert_ffn=_pos_int(v["expert_ffn"], "moe expert_ffn"),
        shared_experts=_pos_int(v.get("shared_experts", 0), "moe shared_experts", 0),
        shared_ffn=_pos_int(v.get("shared_ffn", 0), "moe shared_ffn", 0),
        layers=moe_layers,
        capacity_factor=float(cf),
        routing=routing_from_mapping(v.get("routing", "uniform"), experts),
        pad_to_capacity=pad,
        aux_loss_coeff=float(aux),
    )


def mla_from_mapping(raw: Any) -> MlaSpec:
    """An MlaSpec from an `mla:` mapping of its five sizes."""
    if isinstance(raw, MlaSpec):
        return raw
    if not isinstance(raw, Mapping) or set(raw) != set(MLA_KEYS):
        raise CatalogError(f"model: mla must be a mapping of {', '.join(MLA_KEYS)}, got {raw!r:.80}")
    vals = {k: _pos_int(raw[k], f"mla {k}", 0 if k == "q_lora_rank" else 1) for k in MLA_KEYS}
    return MlaSpec(**vals)


# -- protobuf ------------------------------------------------------------------------------------------------
def fill_moe(msg: Any, moe: MoeSpec) -> None:
    """Write `moe` into a ModelSpec.moe message."""
    msg.experts, msg.top_k, msg.expert_ffn = moe.experts, moe.top_k, moe.expert_ffn
    msg.shared_experts, msg.shared_ffn, msg.capacity_factor = (
        moe.shared_experts,
        moe.shared_ffn,
        moe.capacity_factor,
    )
    msg.layers[:] = list(moe.layers)
    msg.pad_to_capacity = moe.pad_to_capacity
    msg.aux_loss_coeff = moe.aux_loss_coeff
    r = moe.routing
    msg.routing.distribution, msg.routing.skew, msg.routing.seed = r.distribution, r.skew, r.seed
    msg.routing.weights[:] = list(r.weights)
    msg.routing.tokens[:] = [x for row in r.tokens for x in row]


def moe_from_message(msg: Any) -> MoeSpec:
    """The MoeSpec of a ModelSpec.moe message."""
    r = msg.routing
    e = int(msg.experts)
    flat = list(r.tokens)
    rows = tuple(tuple(flat[i : i + e]) for i in range(0, len(flat), e)) if flat else ()
    routing = Routing(r.distribution or "uniform", float(r.skew), int(r.seed), tuple(r.weights), rows)
    return MoeSpec(
        e, int(msg.top_k), int(msg.expert_ffn), int(msg.shared_experts), int(msg.shared_ffn),
        tuple(msg.layers), float(msg.capacity_factor), routing, bool(msg.pad_to_capacity),
        float(msg.aux_loss_coeff),
    )  # fmt: skip


def fill_mla(msg: Any, mla: MlaSpec) -> None:
    """Write `mla` into a ModelSpec.mla message."""
    for k in MLA_KEYS:
        setattr(msg, k, getattr(mla, k))


def mla_from_message(msg: Any) -> MlaSpec:
    """The MlaSpec of a ModelSpec.mla message."""
    return MlaSpec(*(int(getattr(msg, k)) for k in MLA_KEYS))


def moe_to_mapping(moe: MoeSpec) -> dict[str, Any]:
    """The spec keys of `moe` (deployment.json)."""
    r = moe.routing
    routing: dict[str, Any] = {"distribution": r.distribution}
    if r.distribution == "zipf":
        routing.update(skew=r.skew, seed=r.seed)
    elif r.distribution == "weights":
        routing["weights"] = list(r.weights)
    elif r.distribution == "tokens":
        routing["tokens"] = [list(row) for row in r.tokens]
    out = {
        "experts": moe.experts, "top_k": moe.top_k, "expert_ffn": moe.expert_ffn,
        "shared_experts": moe.shared_experts, "shared_ffn": moe.shared_ffn,
        "layers": list(moe.layers) or "all", "capacity_factor": moe.capacity_factor, "routing": routing,
    }  # fmt: skip
    if moe.pad_to_capacity:  # written only when set, so earlier deployment.json files stay byte-identical
        out["pad_to_capacity"] = True
    if moe.aux_loss_coeff:  # likewise
        out["aux_loss_coeff"] = moe.aux_loss_coeff
    return out


def mla_to_mapping(mla: MlaSpec) -> dict[str, int]:
    """The spec keys of `mla` (deployment.json)."""
    return {k: getattr(mla, k) for k in MLA_KEYS}
