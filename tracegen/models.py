"""Model architectures: presets with their published numbers, user models, and parameter counts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from xsim.tracegen.choices import GATED_ACTIVATIONS
from xsim.tracegen.errors import CatalogError
from xsim.tracegen.moe import (
    MlaSpec,
    MoeSpec,
    mla_from_mapping,
    mla_from_message,
    moe_from_mapping,
    moe_from_message,
    moe_mlp_params,
)

# squared-relu: Megatron's --squared-relu (NeMo's `activation: squared-relu`, Nemotron-4): relu(x)^2 on the
# un-gated up projection, shaped as GeLU (NVIDIA/Megatron-LM 1296a81 megatron/core/activations.py).
# relu: OPT's `activation_function: relu` (HF transformers OPTDecoderLayer: fc1, ReLU, fc2), Megatron-Core's
# `activation_func=F.relu`: the same un-gated shape.
# geglu: Gemma's gated GeLU (choices.GATED_ACTIVATIONS): SwiGLU's shape with GeLU's gate.
ACTIVATIONS = ("swiglu", "gelu", "squared-relu", "relu", "geglu")
NORMS = ("rmsnorm", "layernorm")
# How a model encodes positions (the spec's `position_embedding`): rotary on q and k in every layer, a
# learned s x h table added to the embedding output (GPT-2/3, Megatron's learned_absolute, MPT's wpe), ALiBi's
# linear bias added to the attention scores (BLOOM), or nothing.
POSITION_EMBEDDINGS = ("rope", "learned", "alibi", "none")


@dataclass(frozen=True)
class ModelArch:
    """A decoder-only transformer, as Megatron-LM builds it (pre-norm, no dropout in the FLOPs)."""

    name: str
    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    kv_heads: int  # = heads without grouped-query attention
    vocab: int
    seq_len: int
    # swiglu, geglu: gate+up (2 x ffn) then down; gelu, squared-relu, relu: up then down
    activation: str = "swiglu"
    norm: str = "rmsnorm"  # rmsnorm: gain only; layernorm: gain and bias
    linear_bias: bool = False  # GPT-style biases on every linear layer
    moe: MoeSpec | None = None  # mixture of experts (tracegen/moe.py); None: a dense MLP in every layer
    mla: MlaSpec | None = None  # multi-head latent attention (DeepSeek); None: MHA / GQA
    # Width of one attention head when it is not hidden / heads (Megatron's --kv-channels; Qwen3: 128 with
    # hidden 2048 and 32 heads, Megatron-MoE-ModelZoo model_configs Qwen3-30B-A3B.yaml); 0: hidden / heads.
    kv_channels: int = 0
    # The output layer reuses the input embedding's vocab x hidden matrix (one tensor where one rank holds
    # both; a copy on the last pipeline stage otherwise). None: the family's default, `tied`.
    tie_embeddings: bool | None = None
    # POSITION_EMBEDDINGS; None: the family's default (`positions`).
    position_embedding: str | None = None
    # A LayerNorm (gain and bias, 2 x hidden parameters) on the word embedding's output: Megatron-DeepSpeed's
    # --embed-layernorm (bigscience-workshop/Megatron-DeepSpeed 119a0d2d45 megatron/mpu/layers.py
    # VocabParallelEmbedding: `self.norm = torch.nn.LayerNorm(embedding_dim)`, applied in forward to the
    # output of reduce_from_tensor_model_parallel_region: whole tokens, replicated on every TP rank of the
    # first stage), BLOOM's word_embeddings_layernorm (Hugging Face BloomModel).
    embedding_norm: bool = False
    # GPT-J's parallel residual, x + attn(ln1(x)) + mlp(ln2(x)): both branches read the layer's input, their
    # outputs are summed and reduced over TP once (GPT-NeoX's gpt_j_residual, EleutherAI/gpt-neox c560814b
    # megatron/model/transformer.py ParallelTransformerLayer.forward; tracegen.ops.layer_steps).
    parallel_residual: bool = False
    # Fraction of each head's dimensions RoPE rotates (GPT-NeoX's rotary_pct: the first
    # int(head_dim x rotary_pct) of each q and k head; 1.0: all of them). tracegen.ops._rope.
    rotary_pct: float = 1.0
    # A norm of the model's `norm` type on each query and key head before RoPE, its weight head_dim wide and
    # shared by the heads (Megatron-Core's --qk-layernorm: SelfAttention.get_query_key_value_tensors applies
    # q_layernorm / k_layernorm, built with hidden_size = hidden_size_per_attention_head, megatron/core/
    # transformer/attention.py of core_v0.14.0; Qwen3, OLMo 2, Gemma 3). tracegen.ops._qk_norms.
    qk_layernorm: bool = False

    @property
    def rotary_dims(self) -> int:
        """Dimensions of each q and k head that RoPE rotates (GPT-NeoX's `int(hidden_size_per_attention_head
        * rotary_pct)`, megatron/model/transformer.py ParallelSelfAttention.__init__ at c560814b)."""
        return int(self.head_dim * self.rotary_pct)

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.kv_channels or self.hidden // self.heads

    @property
    def gated(self) -> bool:
        """Whether the MLP is gated (choices.GATED_ACTIVATIONS: gate and up projections, act(gate) x up)."""
        return self.activation in GATED_ACTIVATIONS

    @property
    def llama_family(self) -> bool:
        """SwiGLU with RMSNorm (Llama 2/3, Mistral, DeepSeek): the family whose defaults are RoPE and an
        untied output layer; GELU / LayerNorm models are GPT-style."""
        return self.activation == "swiglu" and self.norm == "rmsnorm"

    @property
    def positions(self) -> str:
        """The position encoding (POSITION_EMBEDDINGS). Unset, the family decides as its released code does:
        the Llama family rotates q and k (RoPE; Megatron's Llama scripts pass --position-embedding-type
        rope), GPT-style models learn an absolute table (GPT-2/3; Megatron's --position-embedding-type
        default learned_absolute, megatron/training/arguments.py of core_v0.6.0; llm-foundry's MPTConfig
        learned_pos_emb True); Gemma's GeGLU models rotate too (HF GemmaModel: rotary_emb, no position
        table) and tie their output layer (`tied`'s GPT-style default). tracegen.spec.model_arch resolves the
        framework's default first."""
        if self.position_embedding is not None:
            return self.position_embedding
        return "rope" if self.llama_family or self.activation == "geglu" else "learned"

    @property
    def rope(self) -> bool:
        """Rotary position embeddings on q and k (the `rope` kernels of every layer)."""
        return self.positions == "rope"

    @property
    def position_params(self) -> int:
        """The learned position table, seq_len x hidden (Megatron's torch.nn.Embedding(max_sequence_length,
        hidden), the launch scripts setting --max-position-embeddings to --seq-length; MPT's wpe of
        max_seq_len rows), held whole by every TP rank of the first stage; 0 otherwise."""
        return self.seq_len * self.hidden if self.positions == "learned" else 0

    @property
    def tied(self) -> bool:
        """Whether the output layer is the input embedding's matrix. Unset, the family decides as its
        released code does: GPT-style models tie (GPT-2/GPT-3, Megatron's GPTModel share_embeddings_and_
        output_weights default, MPT's MPTModel logits on wte.weight, BLOOM), the Llama family does not
        (Llama 2/3 config.json tie_word_embeddings false; Megatron's Llama scripts pass
        --untie-embeddings-and-output-weights)."""
        return (not self.llama_family) if self.tie_embeddings is None else self.tie_embeddings

    @property
    def norm_params(self) -> int:
        """Parameters of one normalization layer."""
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    @property
    def qk_norm_params(self) -> int:
        """The q and k norms' weights (and LayerNorm biases), head_dim each, of one layer; 0 without them."""
        return 2 * self.head_dim * (2 if self.norm == "layernorm" else 1) if self.qk_layernorm else 0

    @property
    def layer_norm_params(self) -> int:
        """Every norm parameter of one layer: the two pre-norms and the q and k norms (`qk_layernorm`)."""
        return 2 * self.norm_params + self.qk_norm_params

    @property
    def layer_norm_tensors(self) -> int:
        """Norm parameter tensors of one layer: a gain (and a LayerNorm bias) per norm."""
        return (4 if self.qk_layernorm else 2) * (2 if self.norm == "layernorm" else 1)

    def attention_params(self) -> int:
        """Weights (and biases) of QKV and output projections of one layer."""
        if self.mla is not None:
            return self.mla.params(self.hidden, self.heads)
        qkv_out = (self.heads + 2 * self.kv_heads) * self.head_dim
        w = self.hidden * qkv_out + self.heads * self.head_dim * self.hidden
        return w + ((qkv_out + self.hidden) if self.linear_bias else 0)

    def mlp_params(self) -> int:
        """Weights (and biases) of the MLP of one layer."""
        up = (2 if self.gated else 1) * self.ffn_hidden
        w = self.hidden * up + self.ffn_hidden * self.hidden
        return w + ((up + self.hidden) if self.linear_bias else 0)

    def layer_params(self) -> int:
        """All parameters of one transformer layer (its norms included)."""
        return self.attention_params() + self.mlp_params() + self.layer_norm_params

    def layer_params_at(self, layer: int) -> int:
        """All parameters of 1-based `layer`: a dense layer, or a MoE layer's attention, norms, router and experts."""
        if self.moe is None or not self.moe.is_moe(layer):
            return self.layer_params()
        mlp = moe_mlp_params(self.moe, self.hidden, self.activation, self.linear_bias)
        return self.attention_params() + mlp + self.layer_norm_params

    def active_params(self) -> int:
        """Parameters one token passes through (top_k routed and the shared experts of each MoE layer)."""
        if self.moe is None:
            return self.total_params()
        active = replace(self.moe, experts=self.moe.top_k)
        dense = replace(self, moe=active)
        # the router still has `experts` outputs
        return dense.total_params() + self.moe.count(self.layers) * self.hidden * (
            self.moe.experts - self.moe.top_k
        )

    @property
    def embedding_norm_params(self) -> int:
        """The embedding LayerNorm's gain and bias (`embedding_norm`), 0 without it."""
        return 2 * self.hidden if self.embedding_norm else 0

    def embedding_params(self) -> int:
        """Input token embedding and, with learned positions, the position table (+ the embedding norm)."""
        return self.vocab * self.hidden + self.position_params + self.embedding_norm_params

    def head_params(self) -> int:
        """Final norm plus the output projection to the vocabulary (none of its own when `tied`)."""
        return self.norm_params + (0 if self.tied else self.hidden * self.vocab)

    def total_params(self) -> int:
        """Every parameter of the model."""
        layers = sum(self.layer_params_at(x) for x in range(1, self.layers + 1)) if self.moe else None
        if layers is None:
            layers = self.layers * self.layer_params()
        return layers + self.embedding_params() + self.head_params()


# Each number below names its source. Sequence lengths are the models' context windows; the paper's
# experiments use 2048 (appendix A), which specs set with `seq_len`.
PRESETS: dict[str, ModelArch] = {
    # Llama 2 (Touvron et al. 2023, arXiv:2307.09288, Table 1: 4k context, GQA only for 70B) and the
    # released config.json of meta-llama/Llama-2-7b-hf: hidden_size 4096, intermediate_size 11008,
    # num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 32, vocab_size 32000,
    # max_position_embeddings 4096, hidden_act silu (SwiGLU), RMSNorm, no biases. 6,738,415,616 parameters.
    "llama2-7b": ModelArch("llama2-7b", 32, 4096, 11008, 32, 32, 32000, 4096),
    # meta-llama/Llama-2-13b-hf config.json: 40 layers, hidden 5120, intermediate 13824, 40 heads, 40 KV heads.
    "llama2-13b": ModelArch("llama2-13b", 40, 5120, 13824, 40, 40, 32000, 4096),
    # meta-llama/Llama-2-70b-hf config.json: 80 layers, hidden 8192, intermediate 28672, 64 heads, 8 KV
    # heads (grouped-query attention, Llama 2 paper section 2.2).
    "llama2-70b": ModelArch("llama2-70b", 80, 8192, 28672, 64, 8, 32000, 4096),
    # Llama 3 (Llama Team 2024, arXiv:2407.21783, Table 3) and the released config.json of
    # meta-llama/Meta-Llama-3-8B / -70B: hidden_size 4096 / 8192, intermediate_size 14336 / 28672,
    # num_hidden_layers 32 / 80, num_attention_heads 32 / 64, num_key_value_heads 8, vocab_size 128256,
    # max_position_embeddings 8192, SwiGLU, RMSNorm, no biases, tie_word_embeddings false.
    # 8,030,261,248 and 70,553,706,496 parameters (the checkpoints' counts).
    "llama3-8b": ModelArch("llama3-8b", 32, 4096, 14336, 32, 8, 128256, 8192),
    "llama3-70b": ModelArch("llama3-70b", 80, 8192, 28672, 64, 8, 128256, 8192),
    # meta-llama/Llama-3.1-405B config.json: hidden 16384, intermediate 53248, 126 layers, 128 heads, 8 KV
    # heads, vocabulary 128256; 405,853,388,800 parameters. Context 8192: the paper's initial pre-training
    # length (section 3.4.1; the config's 131072 is the long-context stage's).
    "llama3-405b": ModelArch("llama3-405b", 126, 16384, 53248, 128, 8, 128256, 8192),
    # GPT-3 175B (Brown et al. 2020, arXiv:2005.14165, Table 2.1): 96 layers, d_model 12288, 96 heads of
    # 128, n_ctx 2048, d_ff = 4 d_model (section 2.1, "as in GPT-2"); GELU, LayerNorm and biases as
    # GPT-2; vocabulary 50257 (GPT-2 BPE, Radford et al. 2019).
    "gpt3-175b": ModelArch(
        "gpt3-175b", 96, 12288, 49152, 96, 96, 50257, 2048, "gelu", "layernorm", linear_bias=True
    ),
    # Mixtral 8x7B (Jiang et al. 2024, arXiv:2401.04088, Table 1) and mistralai/Mixtral-8x7B-v0.1 config.json:
    # hidden_size 4096, intermediate_size 14336, num_hidden_layers 32, num_attention_heads 32,
    # num_key_value_heads 8, vocab_size 32000, num_local_experts 8, num_experts_per_tok 2, every layer MoE,
    # router without bias, dropless (the paper trains without token dropping, as Megablocks does);
    # max_position_embeddings 32768. 46,702,792,704 parameters (the paper's "47B"; 12.9B active).
    "mixtral-8x7b": ModelArch(
        "mixtral-8x7b",
        32,
        4096,
        14336,
        32,
        8,
        32000,
        32768,
        moe=MoeSpec(experts=8, top_k=2, expert_ffn=14336),
    ),
    # DeepSeek-V3 (DeepSeek-AI 2024, arXiv:2412.19437, section 4.2) and deepseek-ai/DeepSeek-V3 config.json:
    # num_hidden_layers 61, hidden_size 7168, intermediate_size 18432 (the first_k_dense_replace = 3 dense
    # layers), moe_intermediate_size 2048, n_routed_experts 256, num_experts_per_tok 8, n_shared_experts 1,
    # num_attention_heads 128, vocab_size 129280, MLA with q_lora_rank 1536, kv_lora_rank 512,
    # qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128. "Like": the multi-token-prediction module
    # (14B) and the 256 expert-bias terms of the auxiliary-loss-free balancing per layer are left out;
    # 671,026,404,352 parameters (the paper's 671B) with 4096 context (its pre-training length).
    "deepseek-v3": ModelArch(
        "deepseek-v3",
        61,
        7168,
        18432,
        128,
        128,
        129280,
        4096,
        moe=MoeSpec(experts=256, top_k=8, expert_ffn=2048, shared_experts=1, layers=tuple(range(4, 62))),
        mla=MlaSpec(
            q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128
        ),
    ),  # fmt: skip
}
ALIASES = {
    "llama-2-7b": "llama2-7b",
    "llama-2-13b": "llama2-13b",
    "llama-2-70b": "llama2-70b",
    "llama-3-8b": "llama3-8b",
    "llama-3-70b": "llama3-70b",
    "meta-llama-3-8b": "llama3-8b",
    "meta-llama-3-70b": "llama3-70b",
    "llama3.1-405b": "llama3-405b",
    "llama-3.1-405b": "llama3-405b",
    "gpt-3-175b": "gpt3-175b",
    "gpt3": "gpt3-175b",
    "mixtral": "mixtral-8x7b",
    "mixtral-8x7b-v0.1": "mixtral-8x7b",
    "deepseek-v3-like": "deepseek-v3",
}
MODEL_NAMES: tuple[str, ...] = tuple(PRESETS)


def preset(name: str) -> ModelArch:
    """The preset called `name` (case-insensitive; `Llama-2-7B` and `llama2-7b` are the same)."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in PRESETS:
        raise CatalogError(f"unknown model {name!r} (known: {', '.join(MODEL_NAMES)})")
    return PRESETS[key]


_INT_FIELDS = ("layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "seq_len")


def _is_int(v: Any) -> bool:
    """Whether `v` is an int and not a bool (YAML's `true`)."""
    return isinstance(v, int) and not isinstance(v, bool)


def default_ffn_hidden(hidden: int, activation: Any) -> int:
    """Megatron-LM's FFN width when a launch script gives no --ffn-hidden-size: 4h, or with --swiglu
    int(4h * 2/3 / 64) * 64 (megatron/training/arguments.py of NVIDIA/Megatron-LM d98e8a64dd, the
    `ffn_hidden_size is None` check; the same rule since core_r0.4.0)."""
    if activation == "swiglu":
        return int((4 * hidden * 2 / 3) / 64) * 64
    return 4 * hidden


def model_from_mapping(raw: Mapping[str, Any]) -> ModelArch:
    """A user model: a mapping of architecture numbers, optionally `base: <preset>` to start from."""
    known = {f.name for f in fields(ModelArch)} | {"base"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise CatalogError(f"model: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    base = preset(str(raw["base"])) if "base" in raw else None
    values: dict[str, Any] = {} if base is None else {f.name: getattr(base, f.name) for f in fields(base)}
    values.update({k: v for k, v in raw.items() if k not in ("base", "moe", "mla")})
    if "mla" in raw:
        values["mla"] = None if raw["mla"] is None else mla_from_mapping(raw["mla"])
    if "moe" in raw:
        layers = values.get("layers")
        n = layers if isinstance(layers, int) and not isinstance(layers, bool) else 2**31 - 1
        values["moe"] = None if raw["moe"] is None else moe_from_mapping(raw["moe"], n, values.get("moe"))
    values.setdefault("name", "custom")
    if "kv_heads" not in values and "heads" in values:
        values["kv_heads"] = values["heads"]
    if "ffn_hidden" not in values and _is_int(values.get("hidden")):
        values["ffn_hidden"] = default_ffn_hidden(values["hidden"], values.get("activation", "swiglu"))
    missing = [k for k in _INT_FIELDS if k not in values]
    if missing:
        raise CatalogError(f"model: missing {', '.join(missing)}")
    return check_model(ModelArch(**values))


def model_from_message(model: Any) -> ModelArch:
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
        moe=moe_from_message(model.moe) if _has(model, "moe") else None,
        mla=mla_from_message(model.mla) if _has(model, "mla") else None,
        kv_channels=int(getattr(model, "kv_channels", 0) or 0),
        embedding_norm=bool(getattr(model, "embedding_norm", False)),
        parallel_residual=bool(getattr(model, "parallel_residual", False)),
        rotary_pct=float(getattr(model, "rotary_pct", 0.0) or 1.0),
        qk_layernorm=bool(getattr(model, "qk_layernorm", False)),
    )


def _has(msg: Any, name: str) -> bool:
    """Whether a ModelSpec message sets the sub-message `name` (objects without it: no)."""
    try:
        return bool(msg.HasField(name))
    except (AttributeError, ValueError):
        return False


def check_model(m: ModelArch) -> ModelArch:
    """Reject architectures no transformer has (zero sizes, heads not dividing hidden, ...)."""
    # Types first: a YAML `name: 5` is an int and `linear_bias: "yes"` a string; both once reached protobuf
    # as a TypeError traceback. (YAML's bare `yes` is already the bool true.)
    for k in ("name", "activation", "norm"):
        if not isinstance(getattr(m, k), str):
            raise CatalogError(f"model: {k} must be a string, got {getattr(m, k)!r:.60}")
    if not isinstance(m.linear_bias, bool):
        raise CatalogError(f"model {m.name!r}: linear_bias must be true or false, got {m.linear_bias!r:.60}")
    if m.tie_embeddings is not None and not isinstance(m.tie_embeddings, bool):
        raise CatalogError(
            f"model {m.name!r}: tie_embeddings must be true or false, got {m.tie_embeddings!r:.60}"
        )
    if not isinstance(m.embedding_norm, bool):
        raise CatalogError(
            f"model {m.name!r}: embedding_norm must be true or false, got {m.embedding_norm!r:.60}"
        )
    if not isinstance(m.parallel_residual, bool):
        raise CatalogError(
            f"model {m.name!r}: parallel_residual must be true or false, got {m.parallel_residual!r:.60}"
        )
    if not isinstance(m.qk_layernorm, bool):
        raise CatalogError(
            f"model {m.name!r}: qk_layernorm must be true or false, got {m.qk_layernorm!r:.60}"
        )
    if m.qk_layernorm and m.mla is not None:
        raise CatalogError(
            f"model {m.name!r}: qk_layernorm does not apply to MLA attention (its latent norms are modelled)"
        )
    pct = m.rotary_pct
    if isinstance(pct, bool) or not isinstance(pct, int | float) or not 0 < pct <= 1:
        raise CatalogError(f"model {m.name!r}: rotary_pct must be a number in (0, 1], got {pct!r:.60}")
    if m.moe is not None and m.parallel_residual:
        raise CatalogError(f"model {m.name!r}: moe with parallel_residual is not supported")
    if m.position_embedding is not None and m.position_embedding not in POSITION_EMBEDDINGS:
        raise CatalogError(
            f"model {m.name!r}: position_embedding must be one of {', '.join(POSITION_EMBEDDINGS)}, "
            f"got {m.position_embedding!r:.60}"
        )
    for k in _INT_FIELDS:
        v = getattr(m, k)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 < v < 2**31:
            raise CatalogError(f"model {m.name!r}: {k} must be a positive 32-bit integer, got {v!r}")
    if m.hidden % m.heads:
        raise CatalogError(f"model {m.name!r}: {m.heads} heads do not divide hidden {m.hidden}")
    kvc = m.kv_channels
    if not isinstance(kvc, int) or isinstance(kvc, bool) or not 0 <= kvc < 2**31:
        raise CatalogError(f"model {m.name!r}: kv_channels must be a 32-bit integer >= 0, got {kvc!r:.60}")
    if kvc and m.mla is not None:
        raise CatalogError(
            f"model {m.name!r}: kv_channels does not apply to MLA attention (its own head widths)"
        )
    if m.heads % m.kv_heads:
        raise CatalogError(f"model {m.name!r}: {m.kv_heads} KV heads do not divide {m.heads} heads")
    if m.activation not in ACTIVATIONS:
        raise CatalogError(f"model {m.name!r}: activation must be one of {', '.join(ACTIVATIONS)}")
    if m.norm not in NORMS:
        raise CatalogError(f"model {m.name!r}: norm must be one of {', '.join(NORMS)}")
    if m.moe is not None and m.moe.layers and m.moe.layers[-1] > m.layers:
        raise CatalogError(f"model {m.name!r}: moe layer {m.moe.layers[-1]} is past its {m.layers} layers")
    return m


def with_seq_len(m: ModelArch, seq_len: int) -> ModelArch:
    """The same model trained at another sequence length."""
    return replace(m, seq_len=seq_len)
