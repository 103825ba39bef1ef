"""What-if compute model: replay measured compute as if it ran on another device, rescaled by op class.

A measured op keeps its time when it is framework overhead, and is divided by

- the achieved FLOP/s ratio (target peak x gemm_eff / source peak x gemm_eff) when it is GEMM-like,
- the achieved memory-bandwidth ratio (mem_bw x mem_eff) when it is memory-bound,

so a GEMM that took 10 ms on a V100 (125 TFLOP/s) takes 10 / (989.4 / 125) = 1.263 ms as an H100 (the
efficiencies cancel when both devices use the catalog's defaults). Communication nodes are not touched
(the network model or `--comm measured` times them). The replay package never imports the catalog: pass
two objects with `name`, `peak_flops`, `mem_bw` and optional `gemm_eff`, `mem_eff` (tracegen's GpuSpec
fits), or per-class factors.

Classifier (op or kernel name, case-insensitive; the first rule that matches wins):
  host     framework overhead that no device speeds up: record_function scopes (`## x ##`, `nn.Module: x`,
           `ProfilerStep#N`, `Optimizer.step#...`, `*.forward`), autograd wrappers
           (`autograd::engine::evaluate_function: ...`), and shape/alias ops that move no data (view,
           reshape, as_strided, t, transpose, permute, expand, slice, select, squeeze, unsqueeze, narrow,
           split, chunk, unbind, detach, alias, empty*, set_, lift_fresh, resolve_*, size, stride,
           _unsafe_view, result_type, item/_local_scalar_dense), and xsim's own `xsim::*` nodes
           (the importer's per-rank start offsets)
  gemm     matrix products and convolutions: mm, bmm, addmm, addbmm, baddbmm, matmul, linear, einsum,
           conv*/convolution*, scaled_dot_product*/flash/attention kernels, their Backward0 nodes, and
           kernels named *gemm*, *cutlass*, *xmma*, sm80_/sm90_ tensor-core kernels, cudnn conv kernels
  memory   everything else (elementwise, reductions, norms, softmax, embedding/index, copies, memcpy/memset,
           optimizer updates): bandwidth-bound on current GPUs
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from xsim.replay.compute import ComputeModel, DurationModel
from xsim.replay.errors import DeviceProfileError
from xsim.traces import pb
from xsim.traces.attrs import INT_KINDS, IS_CPU_OP

CLASSES = ("host", "gemm", "memory")
DURATION_NS = "duration_ns"  # exact measured duration written by the PyTorch importer
SOURCE_OP = "source_op"

_HOST_SCOPE = re.compile(
    r"^(##.*##|nn\.Module: .*|ProfilerStep#\d+|Optimizer\..*|.*\.forward|.*\.backward|"
    r"autograd::engine::evaluate_function: .*|enumerate\(DataLoader\).*|\[.*\]|xsim::.*)$"
)
_ALIAS_OPS = frozenset(
    "view reshape as_strided t transpose permute expand expand_as slice select squeeze unsqueeze narrow "
    "split split_with_sizes chunk unbind detach detach_ alias empty empty_like empty_strided new_empty "
    "set_ lift_fresh resolve_conj resolve_neg size stride _unsafe_view _reshape_alias result_type item "
    "_local_scalar_dense numpy_t unflatten flatten view_as is_same_size to _has_compatible_shallow_copy_type "
    "record_param_comms".split()
)
_GEMM_OPS = re.compile(
    r"^(mm|bmm|addmm|addbmm|baddbmm|matmul|linear|einsum|_?conv.*|.*convolution.*|"
    r".*scaled_dot_product.*|.*flash_attention.*|.*efficient_attention.*|_?addmm_activation|"
    r"mkldnn_.*(conv|linear|matmul).*|cudnn_convolution.*)$"
)
_GEMM_BACKWARD = re.compile(
    r"^(Mm|Bmm|Addmm|Addbmm|Baddbmm|Matmul|Linear|Convolution|CudnnConvolution|MkldnnConvolution|"
    r"ScaledDotProduct\w*|\w*FlashAttention\w*|\w*EfficientAttention\w*)Backward\d*$"
)
_GEMM_KERNEL = re.compile(
    r"gemm|cutlass|xmma|^sm\d\d_|cudnn.*conv|implicit_convolve|flash_fwd|flash_bwd|fmha"
)


def _base_name(name: str) -> str:
    """`aten::addmm.out` -> `addmm`; kernel names stay as they are."""
    for prefix in ("aten::", "prim::", "c10d::"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return name.split(".", 1)[0]


def classify(name: str) -> str:
    """Op class of an op or kernel name: "host", "gemm" or "memory" (rules in the module docstring)."""
    if _HOST_SCOPE.match(name):
        return "host"
    base = _base_name(name)
    if base in _ALIAS_OPS:
        return "host"
    if _GEMM_OPS.match(base) or _GEMM_BACKWARD.match(base):
        return "gemm"
    if _GEMM_KERNEL.search(name.lower()):
        return "gemm"
    return "memory"


class DeviceLike(Protocol):
    """What the what-if model reads of a device (tracegen.catalog.GpuSpec has it)."""

    name: str
    peak_flops: float
    mem_bw: float


def _rate(dev: Any, attr: str, eff: str) -> float:
    value = getattr(dev, attr, None)
    e = getattr(dev, eff, 1.0)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
        or not isinstance(e, int | float)
        or not 0 < e <= 1
    ):
        raise DeviceProfileError(
            f"what-if device {getattr(dev, 'name', '?')}: {attr} must be > 0 and {eff} in (0, 1]"
        )
    return float(value) * float(e)


def class_factors(source: DeviceLike, target: DeviceLike) -> dict[str, float]:
    """Speed-up per op class when moving from `source` to `target` (2.0 = twice as fast)."""
    return {
        "host": 1.0,
        "gemm": _rate(target, "peak_flops", "gemm_eff") / _rate(source, "peak_flops", "gemm_eff"),
        "memory": _rate(target, "mem_bw", "mem_eff") / _rate(source, "mem_bw", "mem_eff"),
    }


def measured_ns(node: pb.Node, base: ComputeModel | None, rank: int) -> int:
    """Exact measured ns from the importer's `duration_ns`, else the base model's duration."""
    for a in node.attr:
        if a.name == DURATION_NS:
            kind = a.WhichOneof("value")
            if kind in INT_KINDS:
                v = int(getattr(a, kind))
                return v if v > 0 else 1
    return (base or DurationModel()).duration_ns(rank, node)


def _is_cpu(node: pb.Node) -> bool:
    for a in node.attr:
        if a.name == IS_CPU_OP:
            kind = a.WhichOneof("value")
            return bool(getattr(a, kind)) if kind == "bool_val" or kind in INT_KINDS else False
    return False


@dataclass(frozen=True)
class WhatIfModel:
    """Measured compute rescaled per op class (contract F's ComputeModel).

    `factors`: speed-up per class ("gemm", "memory", "host"); `ranks`: ranks it applies to (None = all).
    Host-side CPU ops of GPU runs (`is_cpu_op` true) keep their time: they launch the device work.
    """

    factors: Mapping[str, float]
    label: str = "whatif"
    ranks: frozenset[int] | None = None
    base: ComputeModel | None = None
    _cache: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for cls, f in self.factors.items():
            if cls not in CLASSES:
                raise DeviceProfileError(f"what-if: unknown op class {cls!r} (classes: {', '.join(CLASSES)})")
            if isinstance(f, bool) or not isinstance(f, int | float) or not math.isfinite(f) or f <= 0:
                raise DeviceProfileError(f"what-if: factor of class {cls} must be a number > 0, got {f!r}")

    @property
    def name(self) -> str:
        """Label with the class factors."""
        shown = ",".join(f"{c}={self.factors.get(c, 1.0):.4g}" for c in CLASSES)
        return f"{self.label}({shown})"

    def op_class(self, node: pb.Node) -> str:
        """Class of a node by its name (cached)."""
        c = self._cache.get(node.name)
        if c is None:
            c = classify(node.name)
            self._cache[node.name] = c
        return c

    def duration_ns(self, rank: int, node: pb.Node) -> int:
        """Measured time divided by the class speed-up (never rounds a non-zero time to 0)."""
        d = measured_ns(node, self.base, rank)
        if node.type != pb.COMP_NODE or _is_cpu(node):
            return d
        if self.ranks is not None and rank not in self.ranks:
            return d
        f = self.factors.get(self.op_class(node), 1.0)
        if f == 1.0:
            return d
        return max(1, int(d / f + 0.5))


def whatif_model(
    source: DeviceLike,
    target: DeviceLike,
    *,
    ranks: frozenset[int] | None = None,
    base: ComputeModel | None = None,
) -> WhatIfModel:
    """What-if model moving measured compute from device `source` to device `target`."""
    return WhatIfModel(
        class_factors(source, target),
        label=f"whatif({getattr(source, 'name', '?')}->{getattr(target, 'name', '?')})",
        ranks=ranks,
        base=base,
    )
