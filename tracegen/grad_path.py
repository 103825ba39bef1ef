"""Megatron-LM's gradient path before Megatron-Core (the 2021 and 2022 code): how each micro-batch's weight
gradients are accumulated, what runs around the data-parallel all-reduce, and how wide the gradients are
that the optimizer reads.

Sources (NVIDIA/Megatron-LM, read at the commits the two papers ran):
- 2021: commit de7dc40f88 (2021-08-10, "scripts for sc21"), the code of Narayanan et al. 2021's
  `examples/sc21/run_table_1.sh` (`--fp16 --loss-scale 8192`, `--DDP-impl local` from 39B on, no
  `--use-contiguous-buffers-in-ddp`, which defaults to off; arguments.py forces the contiguous FP32 buffer
  only for `--bf16`).
- 2022: commit d898a8991d (2022-05-25, the sequence-parallel / selective-recompute merge of Korthikanti
  et al. 2022): contiguous buffers on by default (`--no-contiguous-buffers-in-local-ddp`), and
  `--gradient-accumulation-fusion` on by default but switched off by arguments.py unless the gradients
  accumulate in FP32 (forced for `--bf16`).

What each code runs, per parameter of the rank (b = bytes of a 16-bit value):

| | 2021, fp16 (no buffer) | 2021, bf16 (FP32 buffer) | 2022, fp16 (fp16 buffer) | 2022, bf16 (FP32 buffer) |
| --- | --- | --- | --- | --- |
| each micro-batch | autograd `param.grad += g` from the 2nd micro-batch on: r2 r2 w2 | hook `main_grad.add_(grad)`: r4 r2 w4 | hook `main_grad.add_(grad)`: r2 r2 w2 | fused into the weight-gradient GEMM (`wgrad_gemm_accum_fp32`): none |
| before the all-reduce | `_flatten_dense_tensors` (r2 w2) and `coalesced /= dp` (r2 w2) | `buffer /= dp`: r4 w4 | `buffer /= dp`: r2 w2 | `buffer /= dp`: r4 w4 |
| after the all-reduce | unflatten, `buf.copy_(synced)` per tensor: r2 w2 | – | – | – |
| optimizer, first | `main_param.grad = main_grad.float()`: r2 w4 | no-op (already FP32) | r2 w4 | no-op |
| zeroing | `optimizer.zero_grad()` sets grads to None: no kernel | `zero_grad_buffer`: w4 | w2 | w4 |

In every case the optimizer (Float16OptimizerWithFloat16Params: unscale for fp16, norm, clip, Adam) works
on FP32 main gradients (4 bytes). The 2022 hook still accumulates the gradients of the parameters outside
the fused linear layers (biases, norms) under bf16; they are a few per mille of the parameters and left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from xsim.tracegen.ops import Op, OptimizerStep, Step

FP32 = 4
CODES = ("megatron-2021", "megatron-2022")


@dataclass(frozen=True)
class GradPath:
    """Per-parameter bytes of the gradient handling around the backward passes and the all-reduce."""

    accum_bytes: int  # each micro-batch's accumulation kernel (0: none)
    accum_first: bool  # the first micro-batch accumulates too (into a zeroed buffer) rather than assigning
    pre_reduce_bytes: int  # after the last backward, before the DP all-reduce (flatten, divide by DP)
    pre_reduce_kernels: int
    post_reduce_bytes: int  # after the all-reduce (copy back into each gradient: one kernel per tensor)
    main_grad_copy_bytes: int  # the optimizer's FP32 copy of 16-bit main gradients (0: already FP32)
    optimizer_grad_bytes: int  # width of the gradients unscale / norm / clip / Adam read
    zero_grad_bytes: int  # zeroing the gradient buffer for the next iteration (0: set to None)


def grad_path(code: str, precision: str, b: int) -> GradPath:
    """The gradient path of Megatron-LM `code` ("megatron-2021" or "megatron-2022") for `precision`, with
    b-byte model gradients (the table of this module's docstring)."""
    if code not in CODES:
        raise ValueError(f"no Megatron-LM gradient path for {code!r}")
    fp32_buffer = precision != "fp16"  # --bf16 forces accumulate_allreduce_grads_in_fp32 in both codes
    if code == "megatron-2021" and not fp32_buffer:
        return GradPath(3 * b, False, 4 * b, 2, 2 * b, b + FP32, FP32, 0)
    if fp32_buffer:
        accum = 0 if code == "megatron-2022" else 2 * FP32 + b
        return GradPath(accum, True, 2 * FP32, 1, 0, 0, FP32, FP32)
    return GradPath(3 * b, True, 2 * b, 1, 0, b + FP32, FP32, b)


def accumulation_op(gp: GradPath, params: int, tensors: int, first_micro_batch: bool) -> Op | None:
    """One micro-batch's gradient accumulation for a model chunk of `params` parameters in `tensors`
    tensors (one kernel each), after its backward; None where the code runs none."""
    if not gp.accum_bytes or (first_micro_batch and not gp.accum_first):
        return None
    return Op("grad_accum", "bwd", params, gp.accum_bytes * params, (params,), False, kernels=tensors)


def pre_reduce_op(gp: GradPath, params: int) -> Op:
    """What runs on the rank's gradients between the last backward and the DP all-reduce."""
    return Op(
        "dp_grad_coalesce", "opt", params, gp.pre_reduce_bytes * params, (params,), False,
        kernels=gp.pre_reduce_kernels,
    )  # fmt: skip


def legacy_optimizer(plan: OptimizerStep, gp: GradPath, params: int, tensors: int) -> OptimizerStep:
    """Megatron-LM's optimizer step `plan` (built with `gp.optimizer_grad_bytes`-wide gradients) with the
    copy back after the all-reduce and the FP32 main-gradient copy first, and its own zeroing."""
    first: list[Step] = []
    if gp.post_reduce_bytes:
        first.append(
            Op(
                "dp_grad_uncoalesce",
                "opt",
                0,
                gp.post_reduce_bytes * params,
                (params,),
                False,
                kernels=tensors,
            )
        )
    if gp.main_grad_copy_bytes:
        first.append(
            Op(
                "main_grad_fp32",
                "opt",
                0,
                gp.main_grad_copy_bytes * params,
                (params,),
                False,
                kernels=tensors,
            )
        )
    after = [s for s in plan.after if s.op != "zero_grad"]
    if gp.zero_grad_bytes:
        after.append(Op("zero_grad", "opt", 0, gp.zero_grad_bytes * params, (params,), False))
    return OptimizerStep((*first, *plan.before), tuple(after))
