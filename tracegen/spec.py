"""Deployment specs: YAML/TOML/JSON (or a mapping) -> a validated `deployment_pb2.Deployment`.

Every problem raises SpecError with one line naming the file and the offending device group or key.
`spec_to_mapping` writes the resolved form back (deployment.json); `load_spec` reads it unchanged.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import cache
from typing import Any

from xsim.tracegen import catalog
from xsim.tracegen import deployment_pb2 as dpb
from xsim.tracegen.choices import (
    ATTENTION_KERNELS,
    ATTENTIONS,
    BATCH_INPUTS,
    BOARD_LOADS,
    COMPUTE_MODELS,
    DEFAULT_RECOMPUTE_MODULES,
    DIST_OPTIMIZER_IMPLS,
    FP8_AMAX_UPDATES,
    FP8_RECIPES,
    FRAMEWORKS,
    FSDP_BACKWARD_PREFETCH,
    GEMM_RATES,
    GRAD_REDUCE_BYTES,
    GRAD_REDUCE_DTYPES,
    LOSS_IMPLS,
    MFSDP_STRATEGIES,
    PRECISIONS,
    RECOMPUTE_MODULES,
    RESHARD_STRATEGIES,
    RMSNORM_IMPLS,
    SHARDINGS,
)
from xsim.tracegen.errors import CatalogError, ProfileError, SpecError
from xsim.tracegen.frameworks import DEFAULT_FRAMEWORK, framework
from xsim.tracegen.gemm import board_clock
from xsim.tracegen.models import ModelArch, model_from_mapping, model_from_message, preset
from xsim.tracegen.moe import (
    fill_mla,
    fill_moe,
    mla_from_message,
    mla_to_mapping,
    moe_from_message,
    moe_to_mapping,
)
from xsim.traces.io import JsonFileError, read_json
from xsim.traces.limits import InputLimitError, json_depth_error, max_json_depth, max_nodes, max_spec_bytes
from xsim.traces.outputs import atomic_write_text
from xsim.traces.wording import did_you_mean

Deployment = dpb.Deployment
DeviceGroup = dpb.DeviceGroup

SCHEDULES = ("gpipe", "1f1b")
# Megatron's --recompute-method (megatron/core/transformer/transformer_block.py _checkpointed_forward):
# `uniform` checkpoints units of recompute_num_layers layers, `block` only the first recompute_num_layers
# layers of each model chunk, one at a time (NeMo's scripts/performance/helpers.py set_recompute_configs).
# `every` is torchtitan's selective layer checkpointing (`[activation_checkpoint] mode = 'selective'`,
# `selective_ac_option` = an integer k; pytorch/torchtitan 157a12c56 torchtitan/parallelisms/
# parallelize_llama.py checkpoint_wrapper): a counter over the model's blocks in order (1, 2, ...) wraps
# block i in the full non-reentrant checkpoint when i % k == 0, the others keep their activations.
RECOMPUTE_METHODS = ("uniform", "block", "every")
# Megatron-Core's `--attention-backend` values that name one kernel (megatron/core/transformer/enums.py
# AttnBackend; language_module.py of NVIDIA/Megatron-LM d98e8a64dd sets NVTE_FUSED_ATTN=1 and NVTE_FLASH_ATTN=0
# for `fused`: Transformer Engine's FusedAttention, the cuDNN kernel). `flash` is left out: TE picks
# FlashAttention 2 or 3 by what is installed, so the spec must say which (`fa2` / `fa3`).
ATTENTION_BACKEND_ALIASES = {"fused": "cudnn"}
RESHARDS = RESHARD_STRATEGIES  # the reshard registry's names (tracegen/choices.py)
DTYPE_BYTES = (1, 2, 4)
# PyTorch DDP's default gradient bucket (bucket_cap_mb=25, torch.nn.parallel.DistributedDataParallel).
DEFAULT_BUCKET_BYTES = 25 * (1 << 20)
NODE_SIZE = 8  # GPUs per derived node: the usual HGX/DGX baseboard
CLUSTER_PRESET = "table5"  # the paper's real-testbed interconnect values (Table 5)
# `cluster:` names of whole-system presets: netmodels.presets.SYSTEM_PRESETS (a test keeps them equal;
# tracegen does not import netmodels).
CLUSTER_SYSTEMS = ("dgx-a100", "dgx-a800", "dgx-h100", "dgx-b200", "gb200-nvl72")


# Transformer Engine's userbuffers layer names whose overlap holds SMs in xsim (tracegen.contention): the
# forward GEMMs before a ReduceScatter ("pipeline") and the wgrad GEMMs under the dgrad ReduceScatter ("bulk").
TP_OVERLAP_LAYERS = ("proj_fprop", "fc2_fprop", "qkv_wgrad", "fc1_wgrad")


def default_grad_reduce_dtype(precision: str) -> str:
    """Megatron-LM's gradient-reduction width for a precision: FP32 for BF16 (and FP8, which trains with
    --bf16) runs, FP16 for FP16 runs.

    megatron/training/arguments.py sets accumulate_allreduce_grads_in_fp32 ("bfloat16 requires gradient
    accumulation and all-reduce to be done in fp32") for --bf16 unless --grad-reduce-in-bf16; for --fp16 the
    flag keeps its default, False.
    """
    return "fp16" if precision == "fp16" else "fp32"


def grad_reduce_bytes(dep: dpb.Deployment) -> int:
    """Bytes per element of the deployment's gradient buffer and its DP reduction (`grad_reduce_dtype`, else
    Megatron-LM's default for its precision)."""
    return GRAD_REDUCE_BYTES[dep.grad_reduce_dtype or default_grad_reduce_dtype(dep.precision)]


TOP_KEYS = (
    "name",
    "model",
    "seq_len",
    "micro_batches",
    "schedule",
    "reshard",
    "dtype_bytes",
    "cluster",
    "cluster_derived",
    "sequence_parallel",
    "allow_uneven_tp",
    "dp_bucket_bytes",
    "precision",
    "attention",
    "compute_model",
    "framework",
    "rmsnorm_impl",
    "loss_impl",
    "gemm_rates",
    "board_load",
    "gpus",
    "profile",
    "recompute",
    "recompute_layers",
    "recompute_early_stop",
    "recompute_method",
    "recompute_modules",
    "synchronize_each_layer",
    "virtual_stages",
    "distributed_optimizer",
    "overlap_grad_reduce",
    "overlap_param_gather",
    "tp_comm_overlap",
    "defer_embedding_wgrad_compute",
    "wgrad_deferral_limit",
    "overlap_param_gather_with_optimizer_step",
    "dist_optimizer_impl",
    "grad_reduce_dtype",
    "sharding",
    "fsdp_backward_prefetch",
    "dp_shard",
    "data_parallel_sharding_strategy",
    "fsdp_double_buffer",
    "cp_comm_type",
    "moe_token_dispatcher_type",
    "comm_sm_contention",
    "attention_kernel",
    "fp8_recipe",
    "fp8_amax_update",
    "fp8_params",
    "dropout",
    "attention_dropout",
    "memory_fragmentation",
    "check_for_nan_in_grad",
    "batch_input",
    "dp_comm_ctas",
    "tp_overlap_sms",
    "host_dispatch",
    "host_launch_us",
    "cuda_launch_blocking",
    "make_vocab_size_divisible_by",
    "parallel",
    "device_groups",
)
DG_KEYS = ("id", "gpu", "ranks", "tp", "layers", "micro_batch", "pp_stage", "dp_replica", "ep", "cp", "etp")
PARALLEL_KEYS = (
    "gpu",
    "tp",
    "pp",
    "dp",
    "micro_batch",
    "global_batch",
    "virtual_stages",
    "order",
    "first_stage_layers",
    "last_stage_layers",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
    "ep",
    "etp",
    "cp",
)
# `parallel:` flags of Megatron-Core's TransformerConfig that count the embedding / the loss as one layer
# of the first / last model chunk when the layers are cut (transformer_block.get_num_layers_to_build).
ACCOUNT_KEYS = ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
# Rank orders of `parallel:` (fastest first). The default, "tp-pp-dp" (tp fastest, then pp, then dp: the
# order issue 10 names as the public interface), is what Megatron-LM's --use-tp-pp-dp-mapping selects;
# "tp-dp-pp" is initialize_model_parallel's own default `order` (pipeline stages furthest apart).
RANK_ORDERS = ("tp-pp-dp", "tp-dp-pp")
RECOMPUTE = ("none", "selective", "full", "selective-op")
INT32_MAX = 2**31 - 1  # the proto's int32 fields
# A (rank, layer, micro-batch) step yields at least a forward and a backward compute node, and generation
# runs ~37k nodes/s (scripts/bench_gen.py: 203,712 nodes in 5.3-5.9 s, docs/tracegen.md). Past this many
# steps (>= 100M nodes, hours and tens of GB) a spec is almost surely a typo (micro_batches: 2000000000),
# so it is refused up front instead of looking like a hang.
MAX_LAYER_STEPS = 50_000_000
# Nodes of one (layer, micro-batch) step, a lower estimate: llama2-7b on one rank, 32 layers x 4
# micro-batches at tp 1 (examples/table4_c01.yaml cut to its rank 0), is 2,593 nodes (20.3 per step, measured
# with `xsim gen`); half of that, so a set that fits the file limit is never refused.
MIN_NODES_PER_STEP = 10
# `parallel:` blocks larger than this are refused before expansion (each rank is a device-group entry and
# a trace file; 1M ranks would already take hours to generate).
MAX_PARALLEL_RANKS = 1 << 20
# \Z, not $: `$` also matches before a trailing newline, which let a name "abc\n" through into file names.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")


class _DuplicateKey(ValueError):
    """A key given twice in one mapping of a JSON spec."""


@cache
def _unique_key_loader() -> type:
    """The YAML loader class below, made on first use: PyYAML loads only for a YAML spec (start-up of
    `xsim replay`, which reads deployment.json; issue 11 item 4)."""
    import yaml

    # libyaml's parser (CSafeLoader) where the wheel has it: PyYAML's pure-Python scanner reads ~65-200 kB/s,
    # so a 1 MB spec took 13-17 CPU s (docs/robustness.md); the constructor below stays Python either way.
    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class _UniqueKeyLoader(base):
        """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML silently keeps the last).

        Aliases and nesting are refused before it runs, by `_check_yaml_events`.
        """

        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            self.flatten_mapping(node)
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                try:
                    dup = key in seen
                except TypeError:
                    continue  # an unhashable key: the base constructor reports it
                if dup:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} given twice (line {key_node.start_mark.line + 1})"
                    )
                seen.add(key)
            return super().construct_mapping(node, deep)

    # YAML 1.2's floats: PyYAML resolves YAML 1.1's, whose exponent needs a dot and a sign, so `2.4e12` and
    # `1e9` (as GPU rates are written) load as strings (yaml/pyyaml#173). The 1.2 core schema's pattern,
    # tried after PyYAML's own resolvers (int, bool, 1.1 float), so what they matched is unchanged.
    _UniqueKeyLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)$"),
        list("-+0123456789."),
    )
    return _UniqueKeyLoader


def _check_yaml_events(data: bytes) -> None:
    """Refuse aliases (`*name`: a few lines of nested aliases expand to billions of nodes, the "billion
    laughs") and nesting deeper than traces.limits.max_json_depth(), from the parser's event stream, before
    any node is composed or built (ValueError)."""
    import yaml

    limit = max_json_depth()
    depth = 0
    events = yaml.parse(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    while True:
        try:
            event = next(events, None)
        except yaml.YAMLError as exc:
            # libyaml stops at its own nesting bound (1,000) while scanning ahead: the same refusal as ours.
            if "maximum nesting depth" in str(getattr(exc, "problem", "")):
                raise ValueError(
                    f"nesting deeper than {limit} levels (XSIM_MAX_JSON_DEPTH raises the limit)"
                ) from None
            raise
        if event is None:
            return
        if isinstance(event, yaml.AliasEvent):
            raise ValueError(
                f"YAML aliases (*{event.anchor}) are not accepted in a spec{_line(event)}: write the value out "
                "(PyYAML's dump anchors an object it meets twice: copy it, or write the spec as JSON)"
            )
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > limit:
                raise ValueError(
                    f"nesting deeper than {limit} levels (XSIM_MAX_JSON_DEPTH raises the limit){_line(event)}"
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _line(event: Any) -> str:
    mark = getattr(event, "start_mark", None)
    return f" (line {mark.line + 1})" if mark is not None else ""


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(f"key {k!r} given twice")
        out[k] = v
    return out


def read_spec_file(path: str | os.PathLike[str], max_bytes: int | None = None) -> dict[str, Any]:
    """Parse a spec file by extension (.yaml/.yml, .toml, .json) into a mapping.

    max_bytes: the size limit (default traces.limits.max_spec_bytes(); a trace set's own deployment.json
    is read with max_set_metadata_bytes, which grows with the set).
    """
    p = os.fspath(path)
    ext = os.path.splitext(p)[1].lower()
    cap = max_spec_bytes() if max_bytes is None else max_bytes
    try:
        with open(p, "rb") as fh:
            data = fh.read(cap + 1)  # bounded: /dev/zero or a pipe stops at the limit
    except OSError as exc:
        raise SpecError(f"cannot read spec: {exc.strerror or exc}", path=p) from None
    if len(data) > cap:
        raise SpecError(
            f"spec is larger than {cap:,} bytes (XSIM_MAX_SPEC_BYTES raises the limit; "
            "`parallel:` writes a large regular plan in a few lines)",
            path=p,
        )
    try:
        if ext in (".yaml", ".yml"):
            import yaml

            try:
                _check_yaml_events(data)
                raw = yaml.load(data, Loader=_unique_key_loader())  # noqa: S506 - a SafeLoader subclass
            except yaml.YAMLError as exc:
                raise ValueError(str(exc)) from None  # reported below like the other formats' errors
        elif ext == ".toml":
            import tomllib  # only for a TOML spec: `xsim replay` reads deployment.json

            raw = tomllib.loads(data.decode("utf-8"))
        elif ext == ".json":
            raw = json.loads(data, object_pairs_hook=_unique_pairs)
            deep = json_depth_error(raw, p)
            if deep is not None:
                raise SpecError(deep.removeprefix(f"{p}: "), path=p)
        else:
            raise SpecError(
                f"unknown spec format {ext or '(none)'!r}: use .yaml, .yml, .toml or .json", path=p
            )
    except RecursionError:
        raise SpecError(
            f"not valid {ext[1:].upper()}: nesting too deep (XSIM_MAX_JSON_DEPTH bounds spec nesting)", path=p
        ) from None
    except ValueError as exc:
        # tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError, _DuplicateKey and YAMLError
        # (above) are all ValueErrors.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError(f"not valid {ext[1:].upper()}: {first}", path=p) from None
    if not isinstance(raw, dict):
        raise SpecError("a spec must be a mapping of keys (model, device_groups, ...)", path=p)
    return raw


def load_spec(
    source: str | os.PathLike[str] | Mapping[str, Any],
    max_bytes: int | None = None,
    gpu_file: Mapping[str, Mapping[str, Any]] | None = None,
) -> dpb.Deployment:
    """Load and validate a deployment from a spec file path or an already-parsed mapping (max_bytes: as
    read_spec_file; gpu_file: GPU definitions of a --gpu-file, read_gpu_file, recorded when used)."""
    if isinstance(source, Mapping):
        return _SpecBuilder(source, None, os.getcwd(), gpu_file=gpu_file).build()
    p = os.fspath(source)
    raw = read_spec_file(p, max_bytes)
    stem = os.path.basename(p).split(".")[0]
    return _SpecBuilder(
        raw, p, os.path.dirname(os.path.abspath(p)), default_name=stem, gpu_file=gpu_file
    ).build()


def read_gpu_file(path: str | os.PathLike[str]) -> dict[str, Mapping[str, Any]]:
    """The GPU definitions of a --gpu-file (YAML/TOML/JSON: NAME: {peak_flops, ...}, or the same under a
    `gpus:` key), each checked (catalog.define_gpu)."""
    p = os.fspath(path)
    try:
        raw = read_spec_file(p)
    except SpecError as exc:
        raise SpecError(exc.message.replace("cannot read spec", "cannot read GPU file"), path=p) from None
    defs = raw.get("gpus", raw)  # a spec file serves too: its `gpus:` definitions
    if not isinstance(defs, Mapping) or not defs:
        raise SpecError(
            "a GPU file maps GPU names to definitions {peak_flops, mem_bw, memory_bytes, ...}", path=p
        )
    out: dict[str, Mapping[str, Any]] = {}
    for name in sorted(defs, key=str):
        body = defs[name]
        try:
            if not isinstance(body, Mapping):
                raise CatalogError(f"GPU {name}: a definition must be a mapping")
            if catalog.is_catalog_gpu(str(name)):
                raise CatalogError(
                    f"GPU {name} is a catalog GPU: a GPU file defines new GPUs (override catalog numbers with "
                    "a spec's gpus:)"
                )
            catalog.define_gpu(str(name), body)
        except CatalogError as exc:
            raise SpecError(str(exc), path=p) from None
        out[str(name)] = dict(body)
    return out


def gpu_file_specs(defs: Mapping[str, Mapping[str, Any]] | None) -> dict[str, catalog.GpuSpec]:
    """The GpuSpecs of read_gpu_file's definitions (for catalog.defined_gpus)."""
    return {n: catalog.define_gpu(n, body) for n, body in (defs or {}).items()}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class _SpecBuilder:
    """Turns one raw mapping into a Deployment, raising at the first problem."""

    def __init__(
        self,
        raw: Mapping[str, Any],
        path: str | None,
        base_dir: str,
        default_name: str = "xsim",
        gpu_file: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.raw = raw
        self.path = path
        self.base_dir = base_dir
        self.default_name = default_name
        self.gpu_file = dict(gpu_file or {})
        self.defined: dict[str, catalog.GpuSpec] = {}

    def gpu_entries(self) -> Mapping[str, Any]:
        """The spec's `gpus:` mapping with the --gpu-file definitions it does not itself give."""
        gpus = self.raw.get("gpus", {}) or {}
        if not isinstance(gpus, Mapping):
            raise self.fail("gpus must map a GPU name to overrides, e.g. {H100: {gemm_eff: 0.6}}")
        return {**{n: d for n, d in self.gpu_file.items() if n not in gpus}, **gpus}

    def define_gpus(self) -> dict[str, catalog.GpuSpec]:
        """User-defined GPUs of `gpus:` (names no catalog GPU has) and the --gpu-file, checked."""
        out: dict[str, catalog.GpuSpec] = {}
        for name, body in self.gpu_entries().items():
            if catalog.is_catalog_gpu(str(name)):
                continue
            try:
                if not isinstance(body, Mapping):
                    raise CatalogError(f"GPU {name}: a definition must be a mapping")
                out[str(name)] = catalog.define_gpu(str(name), body)
            except CatalogError as exc:
                raise self.fail(f"gpus: {exc}") from None
        return out

    def fail(self, message: str) -> SpecError:
        return SpecError(message, path=self.path)

    def int_key(
        self,
        raw: Mapping[str, Any],
        key: str,
        where: str,
        default: Any = None,
        minimum: int = 1,
        maximum: int = INT32_MAX,
    ) -> int:
        v = raw.get(key, default)
        if v is None:
            raise self.fail(f"{where}missing {key}")
        if not _is_int(v):
            raise self.fail(f"{where}{key} must be an integer, got {v!r}")
        if v < minimum:
            raise self.fail(f"{where}{key} must be >= {minimum}, got {v}")
        if v > maximum:
            raise self.fail(f"{where}{key} must be <= {maximum}, got {v}")
        return v

    def bool_key(self, key: str) -> bool:
        v = self.raw.get(key, False)
        if not isinstance(v, bool):
            raise self.fail(f"{key} must be true or false, got {v!r}")
        return v

    def attention_kernel(self) -> str:
        """`attention_kernel`, also by Megatron-Core's `--attention-backend` names where they name one kernel."""
        v = self.raw.get("attention_kernel", "auto")
        name = v.lower() if isinstance(v, str) else v
        if name in ATTENTION_BACKEND_ALIASES:
            return ATTENTION_BACKEND_ALIASES[name]
        if name in ("unfused", "local"):
            raise self.fail(
                f"attention_kernel: {name} is Megatron's --attention-backend {name}, the unfused attention: "
                "write attention: unfused"
            )
        if name == "flash":
            raise self.fail(
                "attention_kernel: flash is Megatron's --attention-backend flash, FlashAttention 2 or 3 by what "
                "Transformer Engine finds installed: write fa2 or fa3"
            )
        return self.choice("attention_kernel", ("auto", *ATTENTION_KERNELS), "auto")

    def choice(self, key: str, options: Sequence[str], default: str) -> str:
        v = self.raw.get(key, default)
        if not isinstance(v, str) or v.lower() not in options:
            raise self.fail(f"{key} must be one of {', '.join(options)}, got {v!r}")
        return v.lower()

    def comm_sms(self, dep: dpb.Deployment) -> None:
        """SMs communication holds (tracegen.contention): the DP communicator's NCCL CTAs and TE userbuffers'
        num_sm per layer name, as a launch script sets them."""
        if "dp_comm_ctas" in self.raw:
            dep.dp_comm_ctas = self.int_key(self.raw, "dp_comm_ctas", "", maximum=1024)
        sms = self.raw.get("tp_overlap_sms", {})
        if not isinstance(sms, Mapping):
            raise self.fail(f"tp_overlap_sms must be a mapping of TE layer names to SM counts, got {sms!r}")
        for name in sms:
            if name not in TP_OVERLAP_LAYERS:
                raise self.fail(
                    f"tp_overlap_sms: unknown layer {name!r} (known: {', '.join(TP_OVERLAP_LAYERS)})"
                )
            dep.tp_overlap_sms[name] = self.int_key(sms, name, "tp_overlap_sms: ", minimum=0, maximum=1024)

    def tie_embeddings(self, model: ModelArch, framework_name: str) -> str:
        """The model's `tie_embeddings` as stored (field 68): "on" | "off" when given, "" for the default
        (model_arch). Megatron-LM 2021/2022's GPTModel has no switch to untie (Framework.always_tied)."""
        if model.tie_embeddings is None:
            return ""
        if not model.tie_embeddings and framework(framework_name).always_tied:
            raise self.fail(
                f"model: tie_embeddings false is not possible with framework: {framework_name} (its GPTModel "
                "always shares the word embeddings with the output layer: no switch in that code)"
            )
        return "on" if model.tie_embeddings else "off"

    def host(self, dep: dpb.Deployment) -> None:
        """The host thread's keys (tracegen.host): `host_dispatch` on | off (absent: the framework
        profile's default) and `host_launch_us`, the host cost of one kernel launch."""
        v = self.raw.get("host_dispatch")
        if v is not None:
            if isinstance(v, bool):
                v = "on" if v else "off"
            if v not in ("on", "off"):
                raise self.fail(f"host_dispatch must be on or off, got {v!r}")
            dep.host_dispatch = v
        us = self.raw.get("host_launch_us")
        if us is not None:
            if isinstance(us, bool) or not isinstance(us, int | float) or not 0 < us <= 1e6:
                raise self.fail(f"host_launch_us must be a number of microseconds > 0, got {us!r}")
            dep.host_launch_us = float(us)
        # CUDA_LAUNCH_BLOCKING=1 in the run's environment (field 121): every launch waits for its kernel.
        if self.bool_key("cuda_launch_blocking"):
            if dep.host_dispatch == "off":
                raise self.fail("cuda_launch_blocking: true needs the host thread (host_dispatch is off)")
            dep.cuda_launch_blocking = True

    def fp8_params(self, dep: dpb.Deployment, model: ModelArch) -> bool:
        """`fp8_params` (field 75): the FP8 linears' weights held in FP8 only (TE fp8_model_init)."""
        if not self.bool_key("fp8_params"):
            return False
        name = dep.framework or DEFAULT_FRAMEWORK
        if dep.precision != "fp8" or not framework(name).transformer_engine:
            raise self.fail(
                "fp8_params: true needs precision: fp8 under a Transformer Engine framework profile "
                f"(got precision: {dep.precision}, framework: {name})"
            )
        if model.mla is not None or dep.sharding not in ("", "none"):
            raise self.fail("fp8_params: true is modelled without MLA and without sharding only")
        if model.moe is not None and self.bool_key("overlap_param_gather_with_optimizer_step"):
            # its chained optimizer's first chunk (workload._chained_steps) counts a dense chunk's FP8 weights
            raise self.fail(
                "fp8_params: true with a MoE model is not modelled under overlap_param_gather_with_optimizer_step"
            )
        # Delayed scaling (TE 1.x Float8Tensor parameters) or current scaling (TE 2.x
        # Float8CurrentScalingQuantizer parameters, cast by cast_master_weights_to_fp8: ops.optimizer_steps);
        # MXFP8 (Megatron-Bridge bf16_with_mxfp8_mixed: reuse_grad_buf_for_mxfp8_param_ag): the parameters are
        # all-gathered in the model dtype through the gradient buffer and quantized to MXFP8 after the gather
        # (Megatron-Core distributed_data_parallel.py start_param_sync / finish_param_sync, "The paramaters are
        # cast from bf16 to MXFP8 during copy"): the gather stays in dtype_bytes (workload.py layer_fp8)
        return True

    def overlap(self, dep: dpb.Deployment) -> None:
        """The overlap keys, gradient-reduction width and sharding, with Megatron-LM's own checks."""
        dep.overlap_grad_reduce = self.bool_key("overlap_grad_reduce")
        dep.overlap_param_gather = self.bool_key("overlap_param_gather")
        dep.tp_comm_overlap = self.bool_key("tp_comm_overlap")
        dep.grad_reduce_dtype = self.choice(
            "grad_reduce_dtype", GRAD_REDUCE_DTYPES, default_grad_reduce_dtype(dep.precision)
        )
        dep.sharding = self.choice("sharding", SHARDINGS, "none")
        mfsdp = dep.sharding == "megatron-fsdp"
        # Megatron-FSDP v1 runs on the distributed optimizer: Megatron-LM's launch scripts pass
        # --use-distributed-optimizer beside --use-megatron-fsdp, and arguments.py sets it when absent
        # (d98e8a64dd validate_args: "Megatron-FSDP v1 is only compatible with --use-distributed-optimizer").
        # Its optimizer shard is the sharding's own: the key is taken as that, not as ZeRO-1 on top.
        if mfsdp and dep.distributed_optimizer:
            dep.distributed_optimizer = False
        # Megatron-FSDP's keys (stored as set: "" / false when absent, the strategy's default
        # optim_grads_params being Megatron-Bridge's set_megatron_fsdp_overrides).
        for key in ("data_parallel_sharding_strategy", "fsdp_double_buffer"):
            if key in self.raw and not mfsdp:
                raise self.fail(f"{key} needs sharding: megatron-fsdp (a Megatron-FSDP setting)")
        if "data_parallel_sharding_strategy" in self.raw:
            dep.data_parallel_sharding_strategy = self.choice(
                "data_parallel_sharding_strategy", MFSDP_STRATEGIES, "optim_grads_params"
            )
        dep.fsdp_double_buffer = self.bool_key("fsdp_double_buffer")
        if mfsdp and "fsdp_backward_prefetch" in self.raw:
            raise self.fail(
                "sharding: megatron-fsdp always prefetches in its pre-backward hook: drop fsdp_backward_prefetch"
            )
        # Megatron-FSDP's HSDP (--num-distributed-optimizer-instances N with --use-megatron-fsdp, the default
        # outer_dp_sharding_strategy no_shard) is dp_shard = DP / N: built for optim_grads_params, whose
        # per-bucket reduce-scatters the outer all-reduce follows (docs/tracegen.md "Overlap and sharding").
        if (
            mfsdp
            and "dp_shard" in self.raw
            and dep.data_parallel_sharding_strategy not in ("", "optim_grads_params")
        ):
            raise self.fail(
                "dp_shard with sharding: megatron-fsdp (its HSDP, outer_dp_sharding_strategy no_shard) is built "
                "for data_parallel_sharding_strategy optim_grads_params only; its HFSDP (outer optim) is not"
            )
        # Stored as set ("" when absent: PyTorch's default, "pre"); meaningful only with per-layer gathers.
        if "fsdp_backward_prefetch" in self.raw:
            if dep.sharding == "none":
                raise self.fail(
                    "fsdp_backward_prefetch needs sharding: fsdp or zero3 (it times their gathers)"
                )
            dep.fsdp_backward_prefetch = self.choice("fsdp_backward_prefetch", FSDP_BACKWARD_PREFETCH, "pre")
        # Hybrid sharding: a shard group of dp_shard consecutive replicas (checked against DP in _build); with
        # the distributed optimizer, its instances (Megatron-Core's num_distributed_optimizer_instances,
        # InternLM's zero1).
        if "dp_shard" in self.raw:
            if dep.sharding == "none" and not dep.distributed_optimizer:
                raise self.fail(
                    "dp_shard needs sharding: fsdp or zero3 or distributed_optimizer: true (it sizes their "
                    "shard groups)"
                )
            dep.dp_shard = self.int_key(self.raw, "dp_shard", "", minimum=2)
        # Default on (tracegen.contention): stored as "off" only when a spec turns it off.
        v = self.raw.get("comm_sm_contention", True)
        if not isinstance(v, bool):
            raise self.fail(f"comm_sm_contention must be true or false, got {v!r}")
        dep.comm_sm_contention = "" if v else "off"
        self.comm_sms(dep)
        # megatron/training/arguments.py (validate_args) refuses these combinations with the same reasons.
        if dep.overlap_param_gather and not dep.distributed_optimizer and not mfsdp:
            raise self.fail(
                "overlap_param_gather needs distributed_optimizer: true (Megatron-LM asserts it; "
                "sharding: zero3 always prefetches its per-layer gathers)"
            )
        if dep.overlap_param_gather and not dep.overlap_grad_reduce:
            raise self.fail("overlap_param_gather needs overlap_grad_reduce: true (Megatron-LM asserts it)")
        if dep.tp_comm_overlap and not dep.sequence_parallel:
            raise self.fail(
                "tp_comm_overlap needs sequence_parallel: true (Megatron-LM: TP communication/GEMM overlap "
                "happens only with sequence parallelism)"
            )
        if dep.tp_comm_overlap:
            name = dep.framework or DEFAULT_FRAMEWORK
            if not framework(name).transformer_engine:
                # What tp_comm_overlap builds is Transformer Engine's userbuffers (chunked GEMMs on TE's
                # num_sm SMs); torchtitan's async TP (enable_async_tensor_parallel: PyTorch's symmetric-memory
                # micro-pipelined collective matmul) and the pre-TE Megatron trees run no such thing.
                raise self.fail(
                    f"tp_comm_overlap is Transformer Engine's userbuffers overlap (megatron-core frameworks); "
                    f"framework {name} has none (torchtitan's enable_async_tensor_parallel is not built): "
                    "drop it, which leaves the TP collectives exposed"
                )
        if dep.sharding != "none" and dep.distributed_optimizer:
            raise self.fail(
                f"sharding: {dep.sharding} already shards the optimizer state: drop distributed_optimizer "
                "(ZeRO-1)"
            )

    def pipeline_flush(self, dep: dpb.Deployment) -> None:
        """Megatron-Core's `defer_embedding_wgrad_compute` with `wgrad_deferral_limit` (field 88, present when
        on) and the distributed optimizer's `overlap_param_gather_with_optimizer_step` (field 89), with the
        checks of megatron/core/model_parallel_config.py and megatron/training/arguments.py (core_r0.11.0
        791b70e031)."""
        defer = self.bool_key("defer_embedding_wgrad_compute")
        stages = len({dg.pp_stage for dg in dep.device_groups})
        if "wgrad_deferral_limit" in self.raw and not defer:
            raise self.fail(
                "wgrad_deferral_limit needs defer_embedding_wgrad_compute: true (Megatron ignores it)"
            )
        if defer:
            if stages < 2:
                raise self.fail(
                    "defer_embedding_wgrad_compute needs a pipeline of 2 or more stages (Megatron-Core: "
                    '"Cannot defer embedding wgrad compute when pipeline model parallel is not used")'
                )
            if not dep.framework.startswith("megatron-core"):
                raise self.fail(
                    "defer_embedding_wgrad_compute applies to the megatron-core frameworks only (it needs "
                    f"Megatron-Core's gradient accumulation fusion; framework is {dep.framework})"
                )
            dep.wgrad_deferral_limit = self.int_key(
                self.raw, "wgrad_deferral_limit", "", default=0, minimum=0
            )
        if self.bool_key("overlap_param_gather_with_optimizer_step"):
            if not (dep.distributed_optimizer and dep.overlap_param_gather):
                raise self.fail(
                    "overlap_param_gather_with_optimizer_step needs distributed_optimizer and "
                    "overlap_param_gather: true (Megatron-LM asserts both)"
                )
            if dep.virtual_stages < 2 or stages < 2:
                raise self.fail(
                    "overlap_param_gather_with_optimizer_step needs interleaved pipeline parallelism "
                    "(virtual_stages > 1; Megatron-LM asserts it)"
                )
            dep.overlap_param_gather_with_optimizer_step = True

    def dist_optimizer_impl(self, dep: dpb.Deployment) -> None:
        """`dist_optimizer_impl` (field 101, "" for megatron-core): `apex` is Apex's DistributedFusedAdam in
        place of Megatron-Core's DDP (NeMo 1's optim.name distributed_fused_adam, megatron_gpt_model.py of
        NVIDIA/NeMo v1.23.0 and v2.0.0rc0: the model is wrapped in Megatron-Core's DDP only under
        mcore_distributed_optim), so no chunk or stage is kept in one bucket (Framework.first_chunk_buckets)."""
        if "dist_optimizer_impl" not in self.raw:
            return
        impl = self.choice("dist_optimizer_impl", DIST_OPTIMIZER_IMPLS, "megatron-core")
        if not dep.distributed_optimizer:
            raise self.fail("dist_optimizer_impl needs distributed_optimizer: true")
        if not dep.framework.startswith("megatron-core"):
            raise self.fail(
                f"dist_optimizer_impl applies to the megatron-core frameworks only (framework is {dep.framework})"
            )
        dep.dist_optimizer_impl = "" if impl == "megatron-core" else impl

    def build(self) -> dpb.Deployment:
        self.defined = self.define_gpus()
        # The spec's own GPU definitions are known by name while it is built (device groups, parallel:).
        with catalog.defined_gpus(self.defined):
            dep = self._build()
        # A --gpu-file may define more GPUs than this spec uses: deployment.json records the used ones.
        used = {dg.gpu for dg in dep.device_groups}
        spec_gpus = self.raw.get("gpus", {}) or {}
        keep = [g for g in dep.gpus if g.name in spec_gpus or g.name in used]
        if len(keep) != len(dep.gpus):
            kept = [dpb.GpuOverride() for _ in keep]
            for k, g in zip(kept, keep, strict=True):
                k.CopyFrom(g)
            del dep.gpus[:]
            dep.gpus.extend(kept)
            if dep.cluster_derived:
                dep.cluster_json = json.dumps(derive_cluster(dep), sort_keys=True)
        return dep

    def _build(self) -> dpb.Deployment:
        raw = self.raw
        unknown = sorted(set(raw) - set(TOP_KEYS))
        if unknown:
            raise self.fail(
                f"unknown key(s) {', '.join(map(str, unknown))}{did_you_mean(unknown[0], TOP_KEYS)} "
                f"(known: {', '.join(TOP_KEYS)})"
            )
        dep = dpb.Deployment()
        dep.name = self.name()
        model = self.model()
        _fill_model(dep.model, model)
        dep.seq_len = self.int_key(raw, "seq_len", "", default=model.seq_len)
        dep.schedule = self.choice("schedule", SCHEDULES, "gpipe")
        dep.reshard = self.choice("reshard", RESHARDS, "xsim")
        dep.dtype_bytes = self.int_key(raw, "dtype_bytes", "", default=2)
        if dep.dtype_bytes not in DTYPE_BYTES:
            raise self.fail(f"dtype_bytes must be 1, 2 or 4, got {dep.dtype_bytes}")
        dep.sequence_parallel = self.bool_key("sequence_parallel")
        if model.parallel_residual and dep.sequence_parallel:
            # GPT-NeoX, the code with gpt_j_residual, has no sequence parallelism (c560814b), and
            # Megatron-Core's TransformerLayer no parallel residual: no layer to model.
            raise self.fail("model.parallel_residual with sequence_parallel: true is not modelled")
        dep.allow_uneven_tp = self.bool_key("allow_uneven_tp")
        dep.dp_bucket_bytes = self.int_key(
            raw, "dp_bucket_bytes", "", default=DEFAULT_BUCKET_BYTES, maximum=2**62
        )
        dep.precision = self.choice("precision", PRECISIONS, "bf16")
        recipe = self.choice("fp8_recipe", FP8_RECIPES, FP8_RECIPES[0])
        if recipe != FP8_RECIPES[0] and dep.precision != "fp8":
            raise self.fail(f"fp8_recipe: {recipe} needs precision: fp8, got precision: {dep.precision}")
        dep.fp8_recipe = "" if recipe == FP8_RECIPES[0] else recipe
        if recipe == "mxfp8" and (model.moe is not None or model.mla is not None):
            # the grouped expert GEMMs' and MLA's MXFP8 quantizes are not modelled (dense layers only)
            raise self.fail("fp8_recipe: mxfp8 is modelled for dense models only")
        update = self.choice("fp8_amax_update", FP8_AMAX_UPDATES, FP8_AMAX_UPDATES[0])
        if update != FP8_AMAX_UPDATES[0] and (dep.precision != "fp8" or recipe != FP8_RECIPES[0]):
            raise self.fail(
                f"fp8_amax_update: {update} needs precision: fp8 with fp8_recipe: delayed, got precision: "
                f"{dep.precision}, fp8_recipe: {recipe}"
            )
        dep.fp8_amax_update = "" if update == FP8_AMAX_UPDATES[0] else update
        dep.framework = self.choice("framework", FRAMEWORKS, FRAMEWORKS[0])
        if "rmsnorm_impl" in self.raw:
            # The RMSNorm an eager profile's code ran (tracegen.frameworks Framework.rmsnorm).
            if dep.framework != "torchtitan":
                raise self.fail(
                    f"rmsnorm_impl applies to framework: torchtitan only (framework is {dep.framework})"
                )
            dep.rmsnorm_impl = self.choice("rmsnorm_impl", RMSNORM_IMPLS, RMSNORM_IMPLS[0])
        if "loss_impl" in self.raw:
            # Megatron-Core's cross-entropy (tracegen.frameworks Framework.loss, field 86).
            if not dep.framework.startswith("megatron-core"):
                raise self.fail(
                    f"loss_impl applies to the megatron-core frameworks only (framework is {dep.framework})"
                )
            dep.loss_impl = self.choice("loss_impl", LOSS_IMPLS, LOSS_IMPLS[0])
        dep.tie_embeddings = self.tie_embeddings(model, dep.framework)
        dep.position_embedding = model.position_embedding or ""  # field 69; "" = the default (model_arch)
        if "make_vocab_size_divisible_by" in raw:  # field 74; unset: the framework's (model_arch)
            dep.make_vocab_size_divisible_by = self.int_key(
                raw, "make_vocab_size_divisible_by", "", minimum=0, maximum=1 << 20
            )
        # The framework's attention kernel unless `attention:` names one (explicit keys override the profile).
        dep.attention = self.choice("attention", ATTENTIONS, _framework_attention(dep.framework))
        dep.compute_model = self.choice("compute_model", COMPUTE_MODELS, "calibrated")
        dep.gemm_rates = self.choice("gemm_rates", GEMM_RATES, GEMM_RATES[0])
        # field 122; "" = the default ("job"), so specs that do not name it keep their bytes.
        load = self.choice("board_load", BOARD_LOADS, BOARD_LOADS[0])
        dep.board_load = "" if load == BOARD_LOADS[0] else load
        # The fused attention kernel on Hopper (tracegen.attention): the framework's unless named.
        kernel = self.attention_kernel()
        dep.attention_kernel = "" if kernel == "auto" else kernel
        # Hidden dropout as the run sets it (field 78): absent, the framework profile's.
        if "dropout" in self.raw:
            dep.dropout = "on" if self.bool_key("dropout") else "off"
        # Attention-probability dropout rate as the run sets it (field 81): absent, the framework profile's.
        p = self.raw.get("attention_dropout")
        if p is not None:
            if isinstance(p, bool) or not isinstance(p, int | float) or not 0 <= p < 1:
                raise self.fail(f"attention_dropout must be a rate 0 <= p < 1, got {p!r}")
            dep.attention_dropout = float(p)
        # The memory fit's allocator allowance (field 97): absent, tracegen.memory.FRAGMENTATION.
        f = self.raw.get("memory_fragmentation")
        if f is not None:
            if isinstance(f, bool) or not isinstance(f, int | float) or not 0 <= f < 1:
                raise self.fail(f"memory_fragmentation must be a fraction 0 <= f < 1, got {f!r}")
            dep.memory_fragmentation = float(f)
        # The gradient buckets' NaN check as the run sets it (field 80): absent, the framework profile's.
        if "check_for_nan_in_grad" in self.raw:
            dep.check_for_nan_in_grad = "on" if self.bool_key("check_for_nan_in_grad") else "off"
        # The batch's host-to-device copy and TP broadcast (field 84): absent, the framework profile's.
        if "batch_input" in self.raw:
            dep.batch_input = self.choice("batch_input", BATCH_INPUTS, "")
        self.gpus(dep)
        self.profile(dep)
        self.recompute(dep)
        dep.distributed_optimizer = self.bool_key("distributed_optimizer")
        self.overlap(dep)
        dep.fp8_params = self.fp8_params(dep, model)
        self.host(dep)
        blocks = self.parallel_blocks()
        dep.virtual_stages = self.virtual_stages(blocks)
        dep.micro_batches = self.micro_batches(blocks)
        if dep.virtual_stages > 1:
            given = self.raw.get("schedule", "1f1b")
            if not isinstance(given, str) or given.lower() != "1f1b":
                raise self.fail(
                    f"virtual_stages {dep.virtual_stages} needs schedule: 1f1b (interleaved 1F1B), got {given!r}"
                )
            dep.schedule = "1f1b"
        self.device_groups(dep, model, blocks)
        self.pipeline_flush(dep)
        self.dist_optimizer_impl(dep)
        if dep.precision == "fp8":
            for dg in dep.device_groups:
                try:
                    catalog.tensor_peak(catalog.gpu(dg.gpu), "fp8")
                except CatalogError as exc:
                    raise self.fail(f"device group {dg.id}: {exc}") from None
                if dep.fp8_recipe == "mxfp8" and dep.sequence_parallel and dg.tp > 1:
                    # TE's MXFP8 all-gather of sequence-parallel inputs and output gradients is not modelled
                    raise self.fail(
                        f"device group {dg.id}: fp8_recipe: mxfp8 with sequence_parallel and TP > 1 is not "
                        "modelled"
                    )
        steps = dep.micro_batches * sum(
            len(dg.ranks) * sum(e - s + 1 for s, e in chunk_ranges(dg)) for dg in dep.device_groups
        )
        if steps > MAX_LAYER_STEPS:
            raise self.fail(
                f"{steps:,} (rank, layer, micro-batch) steps, over the {MAX_LAYER_STEPS:,} xsim generates "
                "(each is >= 2 trace nodes): lower micro_batches or the layers per device group"
            )
        # Per rank: one file must stay readable (traces.limits.max_nodes), and its nodes are held in memory
        # while generating; checked before any node is built (issue 16: one rank with 10^6 layers grew past
        # 19.8 GB although the set-wide step count above was small).
        per_rank = dep.micro_batches * max(
            sum(e - s + 1 for s, e in chunk_ranges(dg)) for dg in dep.device_groups
        )
        if per_rank * MIN_NODES_PER_STEP > max_nodes():
            raise self.fail(
                f"one rank would hold {per_rank:,} (layer, micro-batch) steps, at least "
                f"{per_rank * MIN_NODES_PER_STEP:,} nodes, over the {max_nodes():,} a trace file may hold "
                "(XSIM_MAX_NODES raises the limit): lower micro_batches or the layers per device group"
            )
        # The MoE and CP checks live beside their generators (which import the op builders): loaded only
        # where a deployment uses them, so reading a dense set's deployment.json stays light (replay start-up).
        uses_cp = any(dg.cp > 1 for dg in dep.device_groups)
        # Set only where it matters (given, or context parallelism in use): other deployments keep their bytes.
        if "cp_comm_type" in self.raw or uses_cp:
            from xsim.tracegen.context_parallel import CP_COMM_TYPES

            dep.cp_comm_type = self.choice("cp_comm_type", CP_COMM_TYPES, CP_COMM_TYPES[0])

        if "moe_token_dispatcher_type" in self.raw:
            from xsim.tracegen.moe_ops import MOE_DISPATCHERS

            kind = self.choice("moe_token_dispatcher_type", MOE_DISPATCHERS, MOE_DISPATCHERS[0])
            dep.moe_token_dispatcher_type = "" if kind == MOE_DISPATCHERS[0] else kind  # alltoall: unset
        arch = model_arch(dep)
        err = ""
        if (
            arch.moe is not None
            or arch.mla is not None
            or dep.moe_token_dispatcher_type
            or any(dg.ep > 1 for dg in dep.device_groups)
        ):
            from xsim.tracegen.moe_ops import moe_plan_error

            err = moe_plan_error(dep, arch)
        if not err and uses_cp:
            from xsim.tracegen.context_parallel import cp_plan_error

            err = cp_plan_error(dep)
        if err:
            raise self.fail(err)
        self.cluster(dep)
        return dep

    def recompute(self, dep: dpb.Deployment) -> None:
        dep.recompute = self.choice("recompute", RECOMPUTE, "none")
        if dep.recompute == "selective-op":
            # torchtitan's op-level selective AC (tracegen.ops.op_sac_recompute): its policy, its layer
            if dep.framework != "torchtitan":
                raise self.fail(
                    f"recompute: selective-op needs framework: torchtitan (framework is {dep.framework})"
                )
            if dep.model.HasField("moe") or dep.model.HasField("mla"):
                raise self.fail(
                    "recompute: selective-op is read for torchtitan's dense Llama layer only (no moe, mla)"
                )
        if "recompute_layers" in self.raw:
            if dep.recompute != "full":
                raise self.fail(
                    f"recompute_layers applies to recompute: full only (recompute is {dep.recompute!r})"
                )
            dep.recompute_layers = self.int_key(self.raw, "recompute_layers", "")
        elif dep.recompute == "full":
            dep.recompute_layers = 1  # Megatron's uniform method with one layer per recompute unit
        early = self.raw.get("recompute_early_stop", False)
        if not isinstance(early, bool):
            raise self.fail(f"recompute_early_stop must be true or false, got {early!r}")
        if early and dep.recompute != "full":
            raise self.fail(
                f"recompute_early_stop applies to recompute: full only (recompute is {dep.recompute!r})"
            )
        dep.recompute_early_stop = early
        if "recompute_method" in self.raw:
            method = self.choice("recompute_method", RECOMPUTE_METHODS, RECOMPUTE_METHODS[0])
            if dep.recompute != "full":
                raise self.fail(
                    f"recompute_method applies to recompute: full only (recompute is {dep.recompute!r})"
                )
            dep.recompute_method = "" if method == RECOMPUTE_METHODS[0] else method
        if "recompute_modules" in self.raw:
            self.recompute_modules(dep)
        # DeepSpeed's synchronize_checkpoint_boundary (GPT-NeoX's synchronize-each-layer): field 94.
        sync = self.raw.get("synchronize_each_layer", False)
        if not isinstance(sync, bool):
            raise self.fail(f"synchronize_each_layer must be true or false, got {sync!r}")
        if sync and dep.recompute != "full":
            raise self.fail(
                f"synchronize_each_layer applies to recompute: full only (recompute is {dep.recompute!r})"
            )
        dep.synchronize_each_layer = sync

    def recompute_modules(self, dep: dpb.Deployment) -> None:
        """Megatron-Core's --recompute-modules (field 92; tracegen.choices.RECOMPUTE_MODULES), stored in that
        order, nothing for the default ["core_attn"]. Refused where Megatron-Core refuses them
        (transformer_config.py __post_init__ at core_v0.14.0: unknown names, moe_act without the grouped
        MoE MLP, mla_up_proj without MLA, moe_act and layernorm under FP8 delayed scaling) and where xsim
        does not model them; those of model parts the model lacks (mlp on a MoE layer, moe and
        shared_experts on a dense one, layernorm where TE fuses the norm) Megatron-Core accepts and skips,
        and so does xsim (tracegen.ops.with_recompute)."""
        given = self.raw["recompute_modules"]
        if dep.recompute != "selective":
            raise self.fail(
                f"recompute_modules applies to recompute: selective only (recompute is {dep.recompute!r})"
            )
        if not isinstance(given, list) or not all(isinstance(x, str) for x in given):
            raise self.fail(f"recompute_modules must be a list of module names, got {given!r}")
        unknown = [x for x in given if x not in RECOMPUTE_MODULES]
        if unknown:
            raise self.fail(
                f"recompute_modules: unknown module {unknown[0]!r}{did_you_mean(unknown[0], RECOMPUTE_MODULES)} "
                f"(Megatron-Core's: {', '.join(RECOMPUTE_MODULES)})"
            )
        if not given:
            raise self.fail("recompute_modules is empty: recompute: none recomputes nothing")
        if dep.framework != "megatron-core":
            raise self.fail(
                "recompute_modules is Megatron-Core's (core_r0.12 and later): it needs framework: "
                f"megatron-core (framework is {dep.framework})"
            )
        mods = tuple(x for x in RECOMPUTE_MODULES if x in given)
        if "moe_act" in mods and not dep.model.HasField("moe"):
            raise self.fail(
                "recompute_modules: moe_act needs a MoE model (Megatron-Core: 'moe_act in recompute_modules "
                "is only supported with moe_grouped_gemm')"
            )
        if "mla_up_proj" in mods and not dep.model.HasField("mla"):
            raise self.fail(
                "recompute_modules: mla_up_proj needs an MLA model (Megatron-Core: 'mla_up_proj in "
                "recompute_modules is only supported with multi_latent_attention')"
            )
        fp8_outputs = [x for x in ("moe_act", "layernorm") if x in mods]
        if fp8_outputs and dep.precision == "fp8":
            raise self.fail(
                f"recompute_modules: {fp8_outputs[0]} with precision: fp8 is not modelled (Megatron-Core "
                "refuses it under delayed scaling; current scaling's saved BF16 inputs, TE >= 2.6, are not read)"
            )
        if mods != DEFAULT_RECOMPUTE_MODULES and dep.model.parallel_residual:
            raise self.fail("recompute_modules beyond core_attn are not modelled for model.parallel_residual")
        if mods != DEFAULT_RECOMPUTE_MODULES:
            dep.recompute_modules.extend(mods)

    def parallel_blocks(self) -> list[dict[str, int | str]]:
        """The `parallel:` blocks (a mapping or a list of them), validated, with defaults filled in."""
        raw = self.raw.get("parallel")
        if raw is None:
            return []
        items = [raw] if isinstance(raw, Mapping) else raw
        if not isinstance(items, list) or not items or not all(isinstance(b, Mapping) for b in items):
            raise self.fail(
                "parallel must be a mapping {gpu, tp, pp, dp, micro_batch, global_batch} or a list"
            )
        out = []
        for i, b in enumerate(items):
            where = "parallel: " if isinstance(raw, Mapping) else f"parallel[{i}]: "
            unknown = sorted(set(b) - set(PARALLEL_KEYS))
            if unknown:
                raise self.fail(
                    f"{where}unknown key(s) {', '.join(map(str, unknown))}{did_you_mean(unknown[0], PARALLEL_KEYS)} "
                    f"(known: {', '.join(PARALLEL_KEYS)})"
                )
            try:
                gpu_name = catalog.canonical_gpu_name(str(b.get("gpu", "")))
            except CatalogError as exc:
                raise self.fail(f"{where}{exc}") from None
            order = b.get("order", RANK_ORDERS[0])
            if order not in RANK_ORDERS:
                raise self.fail(f"{where}order must be one of {', '.join(RANK_ORDERS)}, got {order!r}")
            blk: dict[str, int | str] = {"gpu": gpu_name, "where": where, "order": order}
            for k in ("tp", "pp", "dp", "micro_batch", "ep", "cp"):
                blk[k] = self.int_key(b, k, where, default=1)
            self.expert_parallel(b, blk, where)
            if "virtual_stages" in b:
                blk["virtual_stages"] = self.int_key(b, "virtual_stages", where)
            for k in ("first_stage_layers", "last_stage_layers"):
                if k in b:
                    blk[k] = self.int_key(b, k, where)
            for k in ACCOUNT_KEYS:
                if not isinstance(b.get(k, False), bool):
                    raise self.fail(f"{where}{k} must be true or false, got {b[k]!r}")
                if b.get(k):
                    blk[k] = 1
            if "global_batch" in b:
                gb = self.int_key(b, "global_batch", where)
                per = int(blk["micro_batch"]) * int(blk["dp"])
                if gb % per:
                    raise self.fail(
                        f"{where}global_batch {gb} is not a multiple of micro_batch {blk['micro_batch']} x "
                        f"dp {blk['dp']} (micro-batches per pipeline = global_batch / (micro_batch * dp))"
                    )
                blk["micro_batches"] = gb // per
            out.append(blk)
        return out

    def expert_parallel(self, b: Mapping[str, Any], blk: dict[str, int | str], where: str) -> None:
        """A `parallel:` block's `etp` into `blk`, checked with its `ep` against TP, DP and CP."""
        # Megatron-Core's expert_tensor_parallel_size defaults to the TP size; etp 1 (whole experts,
        # the EP group spanning DP x TP) is the other form generated (tracegen.moe_ops).
        blk["etp"] = self.int_key(b, "etp", where, default=blk["tp"])
        if blk["etp"] not in (1, blk["tp"]):
            raise self.fail(f"{where}etp {blk['etp']}: only 1 or tp ({blk['tp']}) is supported yet")
        slots = int(blk["dp"]) * int(blk["cp"]) * int(blk["tp"]) // int(blk["etp"])
        if slots % int(blk["ep"]) or int(blk["ep"]) % (int(blk["tp"]) // int(blk["etp"])):
            raise self.fail(
                f"{where}ep {blk['ep']} does not divide dp x cp {slots} (EP is carved out of DP x CP)"
                if blk["etp"] == blk["tp"]
                else f"{where}ep {blk['ep']} does not divide dp x cp x tp {slots} or is not a multiple of "
                f"tp (etp 1: EP is carved out of DP x CP x TP)"
            )

    def agreed(self, key: str, blocks: list[dict[str, int | str]], block_key: str, what: str) -> int:
        """One value of `key` given at the top level and/or by `parallel:` blocks: all must agree."""
        sources = [(key, self.int_key(self.raw, key, ""))] if key in self.raw else []
        sources += [(f"{b['where']}{what}", int(b[block_key])) for b in blocks if block_key in b]
        for src, val in sources[1:]:
            if val != sources[0][1]:
                raise self.fail(
                    f"{src} gives {key} {val} but {sources[0][0]} gives {sources[0][1]} (one value per spec)"
                )
        return sources[0][1] if sources else 1

    def virtual_stages(self, blocks: list[dict[str, int | str]]) -> int:
        return self.agreed("virtual_stages", blocks, "virtual_stages", "virtual_stages")

    def micro_batches(self, blocks: list[dict[str, int | str]]) -> int:
        """Micro-batches per pipeline: `micro_batches`, or global_batch / (micro_batch * dp) of `parallel:`."""
        return self.agreed("micro_batches", blocks, "micro_batches", "global_batch")

    def name(self) -> str:
        name = self.raw.get("name", self.default_name)
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise self.fail(f"name must be a file-name-safe word (letters, digits, . _ -), got {name!r}")
        return name

    def model(self) -> ModelArch:
        m = self.raw.get("model")
        try:
            if isinstance(m, str):
                return preset(m)
            if isinstance(m, Mapping):
                if "seq_len" not in m and "base" not in m and "seq_len" in self.raw:
                    # A launch script gives one --seq-length: the top-level key stands for the model's too.
                    m = {**m, "seq_len": self.raw["seq_len"]}
                return model_from_mapping(m)
        except (CatalogError, TypeError) as exc:
            raise self.fail(str(exc)) from None
        raise self.fail("model must be a preset name (e.g. llama2-7b) or a mapping of architecture numbers")

    def gpus(self, dep: dpb.Deployment) -> None:
        gpus = self.gpu_entries()
        for name in sorted(gpus, key=str):
            over = gpus[name]
            if str(name) in self.defined:
                entry = dep.gpus.add(name=str(name))
                for k, v in sorted(catalog.definition_fields(self.defined[str(name)]).items()):
                    setattr(entry, k, v)
                continue
            try:
                spec = catalog.gpu(str(name))
                if not isinstance(over, Mapping):
                    raise CatalogError(f"GPU {name}: overrides must be a mapping")
                catalog.with_overrides(spec, over)
            except CatalogError as exc:
                raise self.fail(f"gpus: {exc}") from None
            entry = dep.gpus.add(name=spec.name)
            for k, v in sorted(over.items()):
                try:
                    setattr(entry, k, v)
                except (TypeError, ValueError):
                    raise self.fail(f"gpus: GPU {spec.name}: {k} must be a number, got {v!r}") from None

    def profile(self, dep: dpb.Deployment) -> None:
        prof = self.raw.get("profile")
        if prof is None:
            return
        from xsim.tracegen.profile import COLUMNS, make_row, read_profile_csv  # only a spec with profile rows

        sources = [prof] if isinstance(prof, str) else prof
        if not isinstance(sources, list):
            raise self.fail("profile must be a CSV path, a list of paths, or a list of rows")
        try:
            for i, item in enumerate(sources):
                if isinstance(item, str):
                    rows = read_profile_csv(os.path.join(self.base_dir, item))
                elif isinstance(item, Mapping):
                    rows = [make_row(item, f"profile[{i}]")]
                else:
                    raise ProfileError(f"profile[{i}]: a row must be a mapping of {', '.join(COLUMNS)}")
                for r in rows:
                    dep.profile.add(gpu=r.gpu, op=r.op, phase=r.phase, shape=r.shape, micros=r.micros)
        except ProfileError as exc:
            raise self.fail(str(exc)) from None

    def device_groups(
        self, dep: dpb.Deployment, model: ModelArch, blocks: list[dict[str, int | str]]
    ) -> None:
        groups = self.raw.get("device_groups")
        if blocks and (groups is None or groups == []):
            groups = []
        elif not isinstance(groups, list) or not groups:
            raise self.fail("device_groups must be a non-empty list (or give parallel:)")
        owner: dict[int, int] = {}
        auto: set[int] = set()  # groups whose layers are cut by Megatron's rule (no `layers` given)
        expanded = self.expand_parallel(blocks, model, dep.allow_uneven_tp)
        from_parallel = {d.id for d in expanded}
        parallel_replicas = {d.dp_replica for d in expanded}
        for i, g in enumerate(groups):
            if not isinstance(g, Mapping):
                raise self.fail(f"device_groups[{i}] must be a mapping")
        hand = [
            self.device_group(g, i, model, dep.allow_uneven_tp, len(expanded), dep.virtual_stages)
            for i, g in enumerate(groups)
        ]
        for i, dg in enumerate(hand):
            if "layers" not in groups[i] and "layer_start" not in groups[i] and "layer_end" not in groups[i]:
                auto.add(dg.id)
            if dg.dp_replica in parallel_replicas:
                raise self.fail(
                    f"device group {dg.id}: dp_replica {dg.dp_replica} is a replica of the parallel: block "
                    f"(it uses replicas 0..{max(parallel_replicas)}): number hand-written replicas after it"
                )
        auto |= from_parallel - self.parallel_layered
        ids = {d.id for d in dep.device_groups}  # a set: a scan per group was O(groups^2) (2,048 at 16k GPUs)
        for dg in [*expanded, *hand]:
            if dg.id in ids:
                raise self.fail(f"device group {dg.id}: id used twice")
            ids.add(dg.id)
            for r in dg.ranks:
                if r in owner:
                    other = owner[r]
                    if other in from_parallel:
                        raise self.fail(
                            f"rank {r} of device group {dg.id} is already in the parallel: block (its device "
                            f"group {other}); the block uses ranks 0..{_last(expanded)}"
                        )
                    where = "twice in device group" if other == dg.id else f"in device groups {other} and"
                    raise self.fail(f"rank {r} is {where} {dg.id} (each rank belongs to one device group)")
                owner[r] = dg.id
            dep.device_groups.append(dg)
        n = max(owner) + 1
        missing: list[int] = []
        r = 0
        while (
            r < n and len(owner) < n and len(missing) < 11
        ):  # at most len(owner) + 11 steps, however large n is
            if r not in owner:
                missing.append(r)
            r += 1
        if missing:
            shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
            raise self.fail(f"rank(s) {shown} in no device group (ranks must be exactly 0..{n - 1})")
        self.assign_layers(dep, model, auto)
        self.check_replicas(dep, model)
        if dep.virtual_stages > 1:
            self.check_interleaving(dep)
        reps = list(replicas(dep).values())
        sharded = "distributed_optimizer" if dep.distributed_optimizer else f"sharding: {dep.sharding}"
        if (dep.distributed_optimizer or dep.sharding not in ("", "none")) and len(reps) > 1:
            layout = [(chunk_ranges(d), d.tp) for d in reps[0]]
            if any([(chunk_ranges(d), d.tp) for d in r] != layout for r in reps[1:]):
                raise self.fail(
                    f"{sharded} needs replicas that cut the layers into the same stages and TP "
                    "(heterogeneous replicas are synchronized by the rewriter's all-reduce rings)"
                )
        if dep.dp_shard and dep.distributed_optimizer and model.moe is not None:
            raise self.fail(
                "dp_shard with distributed_optimizer: MoE models are not built (the expert-DP buckets' "
                "instances); drop dp_shard"
            )
        if dep.dp_shard and len(reps) % dep.dp_shard:
            raise self.fail(f"dp_shard {dep.dp_shard} must divide the DP degree {len(reps)}")
        if dep.dp_shard == len(reps):
            dep.dp_shard = 0  # one shard group over all of DP: plain sharding
        if dep.sharding == "megatron-fsdp" and dep.virtual_stages > 1:
            # Each virtual chunk is a Megatron-FSDP instance of its own (its own buckets and prefetch): not built.
            raise self.fail("sharding: megatron-fsdp is modelled with virtual_stages: 1 only")

    def expand_parallel(
        self, blocks: list[dict[str, int | str]], model: ModelArch, uneven: bool
    ) -> list[dpb.DeviceGroup]:
        """Device groups of the `parallel:` blocks, in Megatron's rank order (default: tp, then pp, then dp).

        Order "tp-pp-dp" (default; Megatron-LM's --use-tp-pp-dp-mapping): rank = t + TP*(s + PP*d) for TP
        index t, replica d and stage s; order "tp-dp-pp" (initialize_model_parallel's default): rank =
        t + TP*(d + DP*s). Blocks of a list follow each
        other in ranks and replica numbers.
        """
        out: list[dpb.DeviceGroup] = []
        self.parallel_layered: set[int] = set()  # groups cut by first/last_stage_layers, not assign_layers
        first_rank = first_replica = 0
        for b in blocks:
            # Context parallelism: each data replica's sequences split over cp replicas (CP index fastest,
            # Megatron's tp-cp-ep-dp-pp), so the block expands into dp x cp replicas.
            tp, pp, dp, cp = int(b["tp"]), int(b["pp"]), int(b["dp"]) * int(b["cp"]), int(b["cp"])
            if tp * pp * dp > MAX_PARALLEL_RANKS:
                raise self.fail(
                    f"{b['where']}tp x pp x dp = {tp * pp * dp:,} ranks, over {MAX_PARALLEL_RANKS:,}"
                )
            self.check_tp(model, tp, uneven, str(b["where"]))
            cut = self.uneven_stages(b, model.layers)
            v = self.virtual_stages(blocks)
            chunks = self.accounted_chunks(b, model.layers, v)
            for s in range(pp):
                start, end = cut[s] if cut is not None else (1, model.layers)
                for d in range(dp):
                    base = first_rank + tp * ((d + dp * s) if b["order"] == "tp-dp-pp" else (s + pp * d))
                    if cut is not None or chunks is not None:
                        self.parallel_layered.add(len(out))
                    out.append(
                        dpb.DeviceGroup(
                            id=len(out), gpu=str(b["gpu"]), ranks=range(base, base + tp), tp=tp,
                            layer_start=start, layer_end=end, micro_batch=int(b["micro_batch"]),
                            pp_stage=s, dp_replica=first_replica + d, ep=int(b["ep"]) if int(b["ep"]) > 1 else 0,
                            cp=cp if cp > 1 else 0, etp=1 if int(b["etp"]) < tp else 0,
                        )
                    )  # fmt: skip
                    if chunks is not None:
                        _set_chunks(out[-1], chunks[s], v)
            first_rank += tp * pp * dp
            first_replica += dp
        return out

    def accounted_chunks(
        self, b: Mapping[str, int | str], layers: int, v: int
    ) -> list[list[tuple[int, int]]] | None:
        """Layer ranges of each stage's V model chunks when a `parallel:` block counts the embedding and/or
        the loss as a layer (else None).

        Megatron-Core (transformer_block.get_num_layers_to_build, transformer_config.py's checks): N = L
        + 1 per flag must divide by PP and N / PP by V; every model chunk holds N / (PP V) slots, the first
        chunk (stage 0, model chunk 0) one layer fewer for the embedding, the last (stage PP-1, chunk V-1)
        one fewer for the loss; the chunks take the layers in order, chunk j on stage j mod PP. Qwen3-235B
        (Megatron-Bridge's recipe, both flags): 94 + 2 = 96 over PP 8 x V 4, chunks of 3, 2 at either end.
        """
        flags = [k for k in ACCOUNT_KEYS if b.get(k)]
        if not flags:
            return None
        where, pp = str(b["where"]), int(b["pp"])
        if "first_stage_layers" in b or "last_stage_layers" in b:
            raise self.fail(
                f"{where}{' and '.join(flags)} cannot be combined with first_stage_layers / last_stage_layers "
                "(Megatron-Core asserts it)"
            )
        n = layers + len(flags)
        if n % (pp * v):
            raise self.fail(
                f"{where}{layers} layers + {len(flags)} ({', '.join(f.split('_')[2] for f in flags)}) = {n} do "
                f"not split into {pp} stages x {v} virtual stages = {pp * v} equal chunks (Megatron-Core)"
            )
        size, last = n // (pp * v), pp * v - 1
        sizes = [size - (j == 0 and ACCOUNT_KEYS[0] in flags) - (j == last and ACCOUNT_KEYS[1] in flags)
                 for j in range(pp * v)]  # fmt: skip
        if min(sizes) < 1:
            raise self.fail(
                f"{where}{' and '.join(flags)} leave a model chunk of {n // (pp * v)} slots without layers "
                "(a chunk of only the embedding or the loss is not generated)"
            )
        ends = [sum(sizes[: j + 1]) for j in range(pp * v)]
        ranges = [(e - sz + 1, e) for e, sz in zip(ends, sizes, strict=True)]
        return [[ranges[c * pp + s] for c in range(v)] for s in range(pp)]

    def uneven_stages(self, b: Mapping[str, int | str], layers: int) -> list[tuple[int, int]] | None:
        """Layer ranges per stage of a `parallel:` block giving first_stage_layers / last_stage_layers,
        else None (equal stages, assign_layers).

        Megatron-Core's uneven pipeline (megatron/training/arguments.py --decoder-first-pipeline-num-layers /
        --decoder-last-pipeline-num-layers, TransformerConfig first_pipeline_num_layers /
        last_pipeline_num_layers, get_num_layers_to_build): the first and last stages take the given
        counts, the stages between share the rest equally (it must divide), and virtual stages are not
        combined with it. Llama 3 405B: 126 layers over 16 stages as 7, 8 x 14, 7 (Llama 3 paper, 3.3.2).
        """
        first, last = b.get("first_stage_layers"), b.get("last_stage_layers")
        if first is None and last is None:
            return None
        where, pp = str(b["where"]), int(b["pp"])
        given = [k for k, v in (("first_stage_layers", first), ("last_stage_layers", last)) if v is not None]
        if pp < 2:
            raise self.fail(f"{where}{' and '.join(given)} need pp >= 2 (one stage holds every layer)")
        # the block's virtual stages, else the top-level key's (a block without one takes it)
        v = b.get("virtual_stages", self.raw.get("virtual_stages", 1))
        if isinstance(v, int) and not isinstance(v, bool) and v > 1:
            raise self.fail(
                f"{where}{' and '.join(given)} cannot be combined with virtual_stages (Megatron-Core)"
            )
        rest = layers - int(first or 0) - int(last or 0)
        middle = pp - len(given)
        if rest < 0 or (middle == 0 and rest != 0) or (middle > 0 and (rest < middle or rest % middle)):
            split = (
                f"{rest} layers left for {middle} other stage(s)" if rest >= 0 else "more than the model has"
            )
            raise self.fail(
                f"{where}{', '.join(f'{k} {b[k]}' for k in given)} of {layers} layers over pp {pp}: {split} "
                "(the stages between share the rest equally, at least one layer each)"
            )
        sizes = [rest // middle if middle else 0] * pp
        if first is not None:
            sizes[0] = int(first)
        if last is not None:
            sizes[-1] = int(last)
        ranges, start = [], 1
        for n in sizes:
            ranges.append((start, start + n - 1))
            start += n
        return ranges

    def assign_layers(self, dep: dpb.Deployment, model: ModelArch, auto: set[int]) -> None:
        """Megatron's layer assignment for replicas whose groups omit `layers`: L layers in P*V equal
        chunks, chunk j on stage j mod P (model chunk j // P there)."""
        v = dep.virtual_stages
        for replica, stages in replicas(dep).items():
            if not all(dg.id in auto for dg in stages):
                if v > 1 and any(dg.id in auto for dg in stages):
                    bad = next(dg.id for dg in stages if dg.id in auto)
                    raise self.fail(
                        f"replica {replica}: device group {bad} omits layers but others of its replica give "
                        "them (give all or none)"
                    )
                continue
            if len(stages) == 1 and v == 1:
                continue  # one stage: all layers, as before
            p = len(stages)
            if model.layers % (p * v):
                raise self.fail(
                    f"replica {replica}: {model.layers} layers do not split into {p} stages x {v} virtual "
                    f"stages = {p * v} equal chunks (Megatron requires it): give layers per device group"
                )
            size = model.layers // (p * v)
            for dg in stages:
                k = dg.pp_stage
                ranges = [(1 + (c * p + k) * size, (c * p + k + 1) * size) for c in range(v)]
                _set_chunks(dg, ranges, v)

    def check_interleaving(self, dep: dpb.Deployment) -> None:
        """Interleaved 1F1B: P >= 2, M a multiple of P, one TP degree and identical replicas."""
        v = dep.virtual_stages
        reps = replicas(dep)
        layout = None
        for replica, stages in reps.items():
            p = len(stages)
            if p < 2:
                raise self.fail(
                    f"replica {replica}: virtual_stages {v} needs at least 2 pipeline stages, it has {p}"
                )
            if dep.micro_batches % p:
                raise self.fail(
                    f"replica {replica}: micro_batches {dep.micro_batches} is not a multiple of its {p} "
                    "pipeline stages (Megatron's interleaved schedule requires it)"
                )
            tps = {dg.tp for dg in stages}
            if len(tps) > 1:
                raise self.fail(
                    f"replica {replica}: virtual_stages with stages of different TP ({sorted(tps)}) is not "
                    "supported (interleaving plus resharding between stages); use virtual_stages: 1"
                )
            this = [(chunk_ranges(dg), dg.tp) for dg in stages]
            if layout is not None and this != layout:
                raise self.fail(
                    f"replica {replica}: virtual_stages needs every replica to cut the layers into the same "
                    "stages and TP (heterogeneous replicas need the rewriter, which does not interleave)"
                )
            layout = this

    def check_tp(self, model: ModelArch, tp: int, uneven: bool, where: str) -> None:
        """TP must divide the (KV) heads unless uneven TP is allowed, and never exceed the KV heads."""
        if not uneven and (model.heads % tp or model.kv_heads % tp):
            what = f"{model.heads} attention heads" + (
                f" / {model.kv_heads} KV heads" if model.kv_heads != model.heads else ""
            )
            raise self.fail(
                f"{where}tp {tp} does not divide the {what} of {model.name} "
                "(set allow_uneven_tp: true to split heads unevenly)"
            )
        if uneven and tp > model.kv_heads:
            raise self.fail(f"{where}tp {tp} exceeds the {model.kv_heads} KV heads of {model.name}")

    def device_group(
        self, g: Mapping[str, Any], i: int, model: ModelArch, uneven: bool, id_base: int, v: int
    ) -> dpb.DeviceGroup:
        known = (*DG_KEYS, "layer_start", "layer_end")
        unknown = sorted(set(g) - set(known))
        where0 = f"device_groups[{i}]: "
        if unknown:
            raise self.fail(
                f"{where0}unknown key(s) {', '.join(map(str, unknown))}{did_you_mean(unknown[0], DG_KEYS)} "
                f"(known: {', '.join(DG_KEYS)})"
            )
        gid = self.int_key(g, "id", where0, default=id_base + i, minimum=0)
        where = f"device group {gid}: "
        try:
            gpu_name = catalog.canonical_gpu_name(str(g.get("gpu", "")))
        except CatalogError as exc:
            raise self.fail(f"{where}{exc}") from None
        ranks = parse_ranks(g.get("ranks"))
        if ranks is None:
            raise self.fail(
                f"{where}ranks must be a non-empty list of ranks >= 0 (or a range 'a-b' of at most "
                f"{MAX_PARALLEL_RANKS:,} ranks)"
            )
        tp = self.int_key(g, "tp", where, default=len(ranks))
        if tp != len(ranks):
            raise self.fail(f"{where}tp {tp} but {len(ranks)} ranks (a device group is one TP group)")
        self.check_tp(model, tp, uneven, where)
        ranges: list[tuple[int, int]] | None = None
        if "layers" in g:
            lr = g["layers"]
            if isinstance(lr, list | tuple) and lr and all(isinstance(x, list | tuple) for x in lr):
                ranges = []
                for x in lr:
                    if not (len(x) == 2 and all(_is_int(y) for y in x)):
                        raise self.fail(f"{where}layers must be [first, last] ranges, got {x!r} in {lr!r}")
                    ranges.append((x[0], x[1]))
                if len(ranges) != v:
                    raise self.fail(
                        f"{where}{len(ranges)} layer ranges but virtual_stages is {v} (one range per model chunk)"
                    )
                start, end = ranges[0]
            elif isinstance(lr, list | tuple) and len(lr) == 2 and all(_is_int(x) for x in lr):
                start, end = lr
            else:
                raise self.fail(
                    f"{where}layers must be [first, last] (1-based, inclusive) or a list of such ranges, "
                    f"got {lr!r}"
                )
            if ranges is None and v > 1:
                raise self.fail(
                    f"{where}virtual_stages is {v}: layers must list {v} ranges [[first, last], ...], one per "
                    "model chunk (or be omitted: Megatron's equal split)"
                )
        else:
            start, end = g.get("layer_start", 1), g.get("layer_end", model.layers)
            if not (_is_int(start) and _is_int(end)):
                raise self.fail(f"{where}layer_start/layer_end must be integers")
        for s0, e0 in ranges or [(start, end)]:
            if not 1 <= s0 <= e0 <= model.layers:
                raise self.fail(f"{where}layers [{s0}, {e0}] outside 1..{model.layers} or reversed")
        mb = g.get("micro_batch", 1)
        if not _is_int(mb) or not 0 < mb <= INT32_MAX:
            raise self.fail(f"{where}micro_batch must be a positive integer, got {mb!r}")
        stage = self.int_key(g, "pp_stage", where, default=0, minimum=0)
        replica = self.int_key(g, "dp_replica", where, default=0, minimum=0)
        ep = self.int_key(g, "ep", where, default=1)
        cp = self.int_key(g, "cp", where, default=1)
        etp = self.int_key(g, "etp", where, default=tp)
        if etp not in (1, tp):
            raise self.fail(f"{where}etp {etp}: only 1 or tp ({tp}) is supported yet")
        dg = dpb.DeviceGroup(
            id=gid,
            gpu=gpu_name,
            ranks=ranks,
            tp=tp,
            layer_start=start,
            layer_end=end,
            micro_batch=mb,
            pp_stage=stage,
            dp_replica=replica,
            ep=ep if ep > 1 else 0,
            cp=cp if cp > 1 else 0,
            etp=1 if etp < tp else 0,
        )
        if ranges is not None:
            _set_chunks(dg, ranges, v)
        return dg

    def check_replicas(self, dep: dpb.Deployment, model: ModelArch) -> None:
        for replica, stages in replicas(dep).items():
            seen: dict[int, int] = {}
            for dg in stages:
                if dg.pp_stage in seen:
                    raise self.fail(
                        f"replica {replica}: device groups {seen[dg.pp_stage]} and {dg.id} are both stage {dg.pp_stage}"
                    )
                seen[dg.pp_stage] = dg.id
            expect_layer = 1
            for k, dg in enumerate(stages):
                if dg.pp_stage != k:
                    raise self.fail(
                        f"replica {replica}: stage {k} is missing (stages must be 0..{len(stages) - 1})"
                    )
                if dg.micro_batch != stages[0].micro_batch:
                    raise self.fail(
                        f"replica {replica}: device group {dg.id} has micro_batch {dg.micro_batch} but stage 0 "
                        f"has {stages[0].micro_batch} (one pipeline passes one micro-batch size)"
                    )
            # Virtual stage j = c*P + k is model chunk c of stage k (Megatron); with one chunk, stage k.
            chunks = {dg.pp_stage: chunk_ranges(dg) for dg in stages}
            for c in range(max(len(r) for r in chunks.values())):
                for k, dg in enumerate(stages):
                    start, end = chunks[k][c]
                    what = f"stage {k}" + (f" chunk {c}" if len(chunks[k]) > 1 else "")
                    if start != expect_layer:
                        raise self.fail(
                            f"replica {replica}: {what} (device group {dg.id}) starts at layer {start}, "
                            f"expected {expect_layer} (stages must cover layers 1..{model.layers} once, in order)"
                        )
                    expect_layer = end + 1
            if expect_layer != model.layers + 1:
                raise self.fail(
                    f"replica {replica}: stages end at layer {expect_layer - 1}, model has {model.layers} layers"
                )

    def cluster(self, dep: dpb.Deployment) -> None:
        c = self.raw.get("cluster")
        if c is None:
            dep.cluster_json = json.dumps(derive_cluster(dep), sort_keys=True)
            dep.cluster_derived = True
            return
        if isinstance(c, str) and c.strip().lower() in CLUSTER_SYSTEMS:
            # `cluster: dgx-a100`: DGX nodes of 8 for this deployment's ranks, each rank's GPU type listed;
            # netmodels.cluster.build_cluster expands {"system": ...} (and checks the GPU types).
            gpu_of = {r: dg.gpu for dg in dep.device_groups for r in dg.ranks}
            c = {"system": c.strip().lower(), "gpus": [gpu_of[r] for r in range(len(gpu_of))]}
        elif isinstance(c, str):
            c = self.cluster_from_string(c)
        if not isinstance(c, Mapping):
            raise self.fail("cluster must be a mapping ({preset: ..., nodes: [...]}) or a topology file path")
        if "nodes" in c and "gpu_types" not in c and gpu_types(dep):
            c = {**c, "gpu_types": gpu_types(dep)}  # the spec's own GPU definitions, for the cluster's nodes
        dep.cluster_json = json.dumps(c, sort_keys=True)
        dep.cluster_derived = self.bool_key("cluster_derived")

    def cluster_from_string(self, text: str) -> dict[str, Any]:
        """A cluster JSON file (relative to the spec; the file itself or its "cluster" key) is inlined; any
        other string is kept as a netmodels topology spec (`{"topology": "nodes:2*H100x4"}`)."""
        if not text.lower().endswith(".json"):
            return {"topology": text}
        path = os.path.normpath(os.path.join(self.base_dir, text))
        try:
            data = read_json(path)  # bounded in size and nesting (traces.limits)
        except JsonFileError as exc:
            if exc.reason.startswith("not a UTF-8"):
                raise self.fail(f"cluster file {path} is not UTF-8 JSON (a binary file?)") from None
            raise self.fail(f"cluster file {path}: {exc.reason}") from None
        except InputLimitError as exc:
            raise self.fail(f"cluster file {exc}") from None
        if isinstance(data, dict) and "cluster" in data and "nodes" not in data:
            data = data["cluster"]
        if not isinstance(data, dict):
            raise self.fail(f"cluster file {path} must hold a JSON object")
        return data


def parse_ranks(v: Any) -> list[int] | None:
    """A rank list, or `"a-b"` for the inclusive range; None when malformed."""
    if isinstance(v, str):
        m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", v)
        if not m or int(m[1]) > int(m[2]) or int(m[2]) > INT32_MAX:
            return None
        if int(m[2]) - int(m[1]) >= MAX_PARALLEL_RANKS:
            return None  # bounded before the list is built: '0-99999999' is a typo, not 10^8 ranks
        return list(range(int(m[1]), int(m[2]) + 1))
    if isinstance(v, list) and v and all(_is_int(r) and 0 <= r <= INT32_MAX for r in v):
        return list(v)
    return None


def recompute_modules(dep: dpb.Deployment) -> tuple[str, ...]:
    """The selective recompute modules of `dep` (tracegen.choices.RECOMPUTE_MODULES order): () unless
    `recompute: selective`, whose default is ("core_attn",)."""
    if dep.recompute != "selective":
        return ()
    return tuple(dep.recompute_modules) or DEFAULT_RECOMPUTE_MODULES


def recompute_units(method: str, k: int, start: int, end: int) -> dict[int, range]:
    """The full-recompute units of a model chunk holding layers start..end (1-based), keyed by the layer
    before whose backward the unit's forward runs again; the layers of no unit keep their activations.

    `uniform` (Megatron's default method): every layer, in units of K from the chunk's first layer (the last
    unit shorter when K does not divide them), each recomputed before the backward of its last layer;
    `block`: the chunk's first K layers, each its own unit; `every` (torchtitan's selective layer AC): the
    layers whose number in the model is a multiple of K, each its own unit (RECOMPUTE_METHODS)."""
    k = max(1, k)
    if method == "block":
        return {layer: range(layer, layer + 1) for layer in range(start, min(start + k, end + 1))}
    if method == "every":
        return {layer: range(layer, layer + 1) for layer in range(start, end + 1) if layer % k == 0}
    return {min(u + k - 1, end): range(u, min(u + k - 1, end) + 1) for u in range(start, end + 1, k)}


def chunk_ranges(dg: dpb.DeviceGroup) -> list[tuple[int, int]]:
    """The (first, last) layers of each model chunk of a device group (one chunk without interleaving)."""
    if dg.chunks:
        return [(c.start, c.end) for c in dg.chunks]
    return [(dg.layer_start, dg.layer_end)]


def _set_chunks(dg: dpb.DeviceGroup, ranges: list[tuple[int, int]], v: int) -> None:
    del dg.chunks[:]
    dg.layer_start, dg.layer_end = ranges[0][0], ranges[-1][1]
    if v > 1:
        for s, e in ranges:
            dg.chunks.add(start=s, end=e)


def _last(groups: Sequence[dpb.DeviceGroup]) -> int:
    return max(r for dg in groups for r in dg.ranks)


def replicas(dep: dpb.Deployment) -> dict[int, list[dpb.DeviceGroup]]:
    """Device groups per DP replica, each list sorted by pipeline stage."""
    out: dict[int, list[dpb.DeviceGroup]] = {}
    for dg in dep.device_groups:
        out.setdefault(dg.dp_replica, []).append(dg)
    return {r: sorted(v, key=lambda d: d.pp_stage) for r, v in sorted(out.items())}


def num_ranks(dep: dpb.Deployment) -> int:
    """Total ranks of the deployment."""
    return sum(len(dg.ranks) for dg in dep.device_groups)


def derive_cluster(dep: dpb.Deployment) -> dict[str, Any]:
    """Consecutive ranks of one GPU type packed into nodes of up to 8, every NIC on one switch (Table 5)."""
    gpu_of = {r: dg.gpu for dg in dep.device_groups for r in dg.ranks}
    nodes: list[dict[str, Any]] = []
    for r in range(len(gpu_of)):
        last = nodes[-1] if nodes else None
        if last is None or last["gpu"] != gpu_of[r] or len(last["ranks"]) == NODE_SIZE:
            last = {"name": f"node{len(nodes)}", "gpu": gpu_of[r], "ranks": []}
            nodes.append(last)
        last["ranks"].append(r)
    out: dict[str, Any] = {"preset": CLUSTER_PRESET, "nodes": nodes, "fabric": {"kind": "switch"}}
    types = gpu_types(dep)
    if types:
        out["gpu_types"] = types
    return out


def _framework_attention(name: str) -> str:
    """The attention kernel framework `name` runs by default (tracegen.frameworks)."""
    return framework(name).attention


def _fill_model(msg: dpb.ModelSpec, m: ModelArch) -> None:
    msg.name, msg.layers, msg.hidden, msg.ffn_hidden = m.name, m.layers, m.hidden, m.ffn_hidden
    msg.heads, msg.kv_heads, msg.vocab, msg.seq_len = m.heads, m.kv_heads, m.vocab, m.seq_len
    msg.activation, msg.norm, msg.linear_bias = m.activation, m.norm, m.linear_bias
    msg.kv_channels = m.kv_channels  # 0 (unset, not serialized): hidden / heads
    msg.embedding_norm = m.embedding_norm  # false (not serialized): no LayerNorm after the embedding
    msg.parallel_residual = m.parallel_residual  # false (not serialized): sequential residual
    msg.rotary_pct = 0.0 if m.rotary_pct == 1.0 else m.rotary_pct  # 0 (not serialized): all dimensions
    msg.qk_layernorm = m.qk_layernorm  # false (not serialized): no q and k norms
    if m.moe is not None:
        fill_moe(msg.moe, m.moe)
    if m.mla is not None:
        fill_mla(msg.mla, m.mla)


def model_arch(dep: dpb.Deployment) -> ModelArch:
    """The deployment's model as a ModelArch at its trained sequence length, tied or not: the spec's
    `tie_embeddings` (field 68), else always under a framework whose code has no switch
    (Framework.always_tied), else the family's default (ModelArch.tied); its position encoding likewise:
    the spec's `position_embedding` (field 69), else the framework's (Framework.position_embedding), else
    the family's (ModelArch.positions); its vocabulary padded as the framework pads it (vocab_padding)."""
    fw = framework(dep.framework or DEFAULT_FRAMEWORK)
    tie = {"on": True, "off": False}.get(dep.tie_embeddings)
    if tie is None and fw.always_tied:
        tie = True
    positions = dep.position_embedding or fw.position_embedding or None
    m = model_from_message(dep.model)
    return replace(
        m,
        seq_len=dep.seq_len or dep.model.seq_len,
        tie_embeddings=tie,
        position_embedding=positions,
        vocab=padded_vocab(m.vocab, vocab_padding(dep)),
    )


def vocab_padding(dep: dpb.Deployment) -> int:
    """The multiple the deployment's vocabulary is padded to (1: as given): Megatron's
    make_vocab_size_divisible_by x TP (`_vocab_size_with_padding`), the spec's value (field 74) or else the
    framework's (Framework.vocab_divisible_by); 0 pads nothing. TP is the device groups' (Megatron has one;
    groups of different TP: their least common multiple, so every group splits the padded rows evenly)."""
    if dep.HasField("make_vocab_size_divisible_by"):
        unit = dep.make_vocab_size_divisible_by
    else:
        unit = framework(dep.framework or DEFAULT_FRAMEWORK).vocab_divisible_by
    if unit <= 0:
        return 1
    return unit * math.lcm(1, *(max(1, dg.tp) for dg in dep.device_groups))


def padded_vocab(vocab: int, multiple: int) -> int:
    """`vocab` rounded up to a multiple of `multiple` (already a multiple: unchanged)."""
    return -(-vocab // multiple) * multiple


def gpu_specs(dep: dpb.Deployment) -> dict[str, catalog.GpuSpec]:
    """Catalog entries of the GPUs used, with the spec's overrides applied, and its user-defined GPUs."""
    over = {g.name: {f.name: v for f, v in g.ListFields() if f.name != "name"} for g in dep.gpus}
    names = sorted({dg.gpu for dg in dep.device_groups} | set(over))
    specs = {
        n: catalog.with_overrides(catalog.gpu(n), over.get(n, {}))
        if catalog.is_catalog_gpu(n)
        else catalog.define_gpu(n, over.get(n, {}))
        for n in names
    }
    # A run of one GPU has no siblings to wait for: its GPU keeps the rate it holds alone. Otherwise each GPU
    # model runs at the expected slowest of its own count (`board_load: job`).
    if num_ranks(dep) < 2:
        return specs
    load = dep.board_load or BOARD_LOADS[0]
    count = Counter(dg.gpu for dg in dep.device_groups for _ in dg.ranks)
    return {n: replace(g, board_clock=board_clock(g, load, count.get(n, 0))) for n, g in specs.items()}


def gpu_notes(dep: dpb.Deployment) -> list[str]:
    """One line per hypothetical GPU of the deployment: what it borrows from a known architecture."""
    return [catalog.definition_note(g) for g in gpu_specs(dep).values() if g.calibrated_as and g.defaulted]


def gpu_types(dep: dpb.Deployment) -> dict[str, dict[str, Any]]:
    """A derived cluster's "gpu_types": the interconnect of each user-defined GPU (netmodels.presets)."""
    return {g.name: gpu_type_entry(g) for g in gpu_specs(dep).values() if not catalog.is_catalog_gpu(g.name)}


def gpu_type_entry(g: catalog.GpuSpec) -> dict[str, Any]:
    """A user-defined GPU's interconnect as a cluster's "gpu_types" entry: the calibrated_as GPU's row with
    the given NVLink rate and NICs (netmodels.presets.defined_interconnect)."""
    entry: dict[str, Any] = {"like": g.calibrated_as}
    if g.nvlink_bandwidth is not None:
        entry["scale_up_bandwidth"] = g.nvlink_bandwidth
    if g.nic_bandwidth is not None:
        entry["nic_bandwidth"] = g.nic_bandwidth * g.nics
    return entry


def spec_to_mapping(dep: dpb.Deployment) -> dict[str, Any]:
    """The resolved spec as plain data in spec keys (what deployment.json holds; load_spec reads it)."""
    m = dep.model
    model = {
        "name": m.name, "layers": m.layers, "hidden": m.hidden, "ffn_hidden": m.ffn_hidden,
        "heads": m.heads, "kv_heads": m.kv_heads, "vocab": m.vocab, "seq_len": m.seq_len,
        "activation": m.activation, "norm": m.norm, "linear_bias": m.linear_bias,
    }  # fmt: skip
    if m.kv_channels:
        model["kv_channels"] = m.kv_channels
    if m.embedding_norm:
        model["embedding_norm"] = True
    if m.parallel_residual:
        model["parallel_residual"] = True
    if m.rotary_pct:
        model["rotary_pct"] = m.rotary_pct
    if m.qk_layernorm:
        model["qk_layernorm"] = True
    if dep.tie_embeddings:
        model["tie_embeddings"] = dep.tie_embeddings == "on"
    if dep.position_embedding:
        model["position_embedding"] = dep.position_embedding
    if m.HasField("moe"):
        model["moe"] = moe_to_mapping(moe_from_message(m.moe))
    if m.HasField("mla"):
        model["mla"] = mla_to_mapping(mla_from_message(m.mla))
    out: dict[str, Any] = {
        "name": dep.name,
        "model": model,
        "seq_len": dep.seq_len,
        "micro_batches": dep.micro_batches,
        "schedule": dep.schedule,
        "reshard": dep.reshard,
        "dtype_bytes": dep.dtype_bytes,
        "sequence_parallel": dep.sequence_parallel,
        "allow_uneven_tp": dep.allow_uneven_tp,
        "dp_bucket_bytes": dep.dp_bucket_bytes,
        "precision": dep.precision or "bf16",
        "attention": dep.attention or "flash",
        "compute_model": dep.compute_model or "roofline",
        "framework": dep.framework or FRAMEWORKS[0],
        **({"rmsnorm_impl": dep.rmsnorm_impl} if dep.rmsnorm_impl else {}),
        **({"loss_impl": dep.loss_impl} if dep.loss_impl else {}),
        "gemm_rates": dep.gemm_rates or GEMM_RATES[0],
        "board_load": dep.board_load or BOARD_LOADS[0],
        "recompute": dep.recompute or "none",
        **({"recompute_layers": dep.recompute_layers} if dep.recompute == "full" else {}),
        **({"recompute_early_stop": True} if dep.recompute_early_stop else {}),
        **({"recompute_method": dep.recompute_method} if dep.recompute_method else {}),
        **({"recompute_modules": list(dep.recompute_modules)} if dep.recompute_modules else {}),
        **({"synchronize_each_layer": True} if dep.synchronize_each_layer else {}),
        "virtual_stages": dep.virtual_stages or 1,
        "distributed_optimizer": dep.distributed_optimizer,
        "overlap_grad_reduce": dep.overlap_grad_reduce,
        "overlap_param_gather": dep.overlap_param_gather,
        "tp_comm_overlap": dep.tp_comm_overlap,
        **(
            {"defer_embedding_wgrad_compute": True, "wgrad_deferral_limit": dep.wgrad_deferral_limit}
            if dep.HasField("wgrad_deferral_limit")
            else {}
        ),
        **(
            {"overlap_param_gather_with_optimizer_step": True}
            if dep.overlap_param_gather_with_optimizer_step
            else {}
        ),
        **({"dist_optimizer_impl": dep.dist_optimizer_impl} if dep.dist_optimizer_impl else {}),
        "grad_reduce_dtype": dep.grad_reduce_dtype or default_grad_reduce_dtype(dep.precision),
        "sharding": dep.sharding or "none",
        **({"fsdp_backward_prefetch": dep.fsdp_backward_prefetch} if dep.fsdp_backward_prefetch else {}),
        **({"dp_shard": dep.dp_shard} if dep.dp_shard else {}),
        **(
            {"data_parallel_sharding_strategy": dep.data_parallel_sharding_strategy}
            if dep.data_parallel_sharding_strategy
            else {}
        ),
        **({"fsdp_double_buffer": True} if dep.fsdp_double_buffer else {}),
        **({"comm_sm_contention": False} if dep.comm_sm_contention == "off" else {}),
        **({"dp_comm_ctas": dep.dp_comm_ctas} if dep.dp_comm_ctas else {}),
        **({"tp_overlap_sms": dict(sorted(dep.tp_overlap_sms.items()))} if dep.tp_overlap_sms else {}),
        **({"host_dispatch": dep.host_dispatch} if dep.host_dispatch else {}),
        **({"host_launch_us": dep.host_launch_us} if dep.host_launch_us else {}),
        **({"cuda_launch_blocking": True} if dep.cuda_launch_blocking else {}),
        **(
            {"make_vocab_size_divisible_by": dep.make_vocab_size_divisible_by}
            if dep.HasField("make_vocab_size_divisible_by")
            else {}
        ),
        **({"cp_comm_type": dep.cp_comm_type} if dep.cp_comm_type else {}),
        **(
            {"moe_token_dispatcher_type": dep.moe_token_dispatcher_type}
            if dep.moe_token_dispatcher_type
            else {}
        ),
        **({"attention_kernel": dep.attention_kernel} if dep.attention_kernel else {}),
        **({"fp8_recipe": dep.fp8_recipe} if dep.fp8_recipe else {}),
        **({"fp8_amax_update": dep.fp8_amax_update} if dep.fp8_amax_update else {}),
        **({"fp8_params": True} if dep.fp8_params else {}),
        **({"dropout": dep.dropout == "on"} if dep.dropout else {}),
        **({"attention_dropout": dep.attention_dropout} if dep.HasField("attention_dropout") else {}),
        **(
            {"memory_fragmentation": dep.memory_fragmentation} if dep.HasField("memory_fragmentation") else {}
        ),
        **({"check_for_nan_in_grad": dep.check_for_nan_in_grad == "on"} if dep.check_for_nan_in_grad else {}),
        **({"batch_input": dep.batch_input} if dep.batch_input else {}),
        "cluster": json.loads(dep.cluster_json),
        "cluster_derived": dep.cluster_derived,
    }
    if dep.gpus:
        out["gpus"] = {g.name: {f.name: v for f, v in g.ListFields() if f.name != "name"} for g in dep.gpus}
    if dep.profile:
        out["profile"] = [
            {
                "gpu": p.gpu,
                "op": p.op,
                "phase": p.phase,
                "shape": "x".join(map(str, p.shape)),
                "micros": p.micros,
            }
            for p in dep.profile
        ]
    out["device_groups"] = [
        {
            "id": dg.id,
            "gpu": dg.gpu,
            "ranks": list(dg.ranks),
            "tp": dg.tp,
            "layers": [list(r) for r in chunk_ranges(dg)] if dg.chunks else [dg.layer_start, dg.layer_end],
            "micro_batch": dg.micro_batch,
            "pp_stage": dg.pp_stage,
            "dp_replica": dg.dp_replica,
            **({"ep": dg.ep} if dg.ep > 1 else {}),
            **({"cp": dg.cp} if dg.cp > 1 else {}),
            **({"etp": dg.etp} if dg.etp else {}),
        }  # fmt: skip
        for dg in dep.device_groups
    ]
    return out


def save_deployment(dep: dpb.Deployment, path: str | os.PathLike[str]) -> None:
    """Write the resolved spec as JSON (`cluster_derived: true` says the cluster was derived, not given)."""
    atomic_write_text(path, json.dumps(spec_to_mapping(dep), indent=2) + "\n")
