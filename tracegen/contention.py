"""Compute slowed by concurrent communication: the SMs a communication kernel holds are lost to compute.

NCCL runs a collective as one thread block (CTA) per channel, each resident on one SM for the whole
collective; Transformer Engine's userbuffers run their copy kernels on a fixed number of SMs and launch
the overlapped GEMM on the rest (`set_sm_margin`). A compute kernel that runs meanwhile gets the SMs
left: the calibrated GEMM model re-quantizes its tiles into waves of (SMs - CTAs) blocks at (SMs - CTAs)
SMs' worth of tensor throughput (so a GEMM of exactly one wave becomes two, the tail effect NVIDIA's
developer forum reports: a 132-block GEMM on an H100 next to a 24-block ncclAllGather "nearly doubles",
MFU ~80% -> ~47%, thread "Compute-Communication Overlap Causes Severe GEMM Performance Degradation
because of Tail Effect", 2025); fused attention and the roofline model lose the same share of the peak.
Memory-bound kernels keep their time: their HBM bandwidth is not divided by SM count in this model.

The generator decides which nodes run under which communication (tracegen.workload): it is a fact of the
emitted program, not of the replay, so the engine stays a plain dependency-driven replayer. The spec key
`comm_sm_contention: false` turns it off.
"""

from __future__ import annotations

from dataclasses import replace

from xsim.tracegen.catalog import GpuSpec, tensor_peak

# Transformer Engine userbuffers defaults (transformer_engine/pytorch/module/base.py, initialize_ub's
# get_default_config): "num_sm": 1 if method == "ring_exchange" else 16, "set_sm_margin": not
# ring_exchange. The pipeline and bulk overlaps (ReduceScatter after a GEMM) run their communication on
# 16 SMs and launch the GEMM on the others; ring_exchange moves data with copy engines ("use_ce": True)
# and takes no SM margin.
TE_UB_SMS = 16
TE_SM_MARGIN_METHODS = ("pipeline", "bulk")

# NCCL's CTAs of a DP collective across DGX nodes: one ring graph channel per NIC (8 per DGX A100/H100
# node; netmodels/nccl.py graph_channels, NCCL src/graph/search.cc), which ncclTopoPostset duplicates
# ("Duplication should be complete now": nChannels * 2, src/graph/connect.cc) into 16 runtime channels,
# one CTA each. Hopper's further doubling applies only under 16 channels (same file), so 16 on both.
NCCL_DP_CTAS = 16


def with_free_sms(gpu: GpuSpec, busy: int) -> GpuSpec:
    """`gpu` as a compute kernel sees it while `busy` SMs run communication: fewer SMs, the tensor peaks
    scaled by the SMs left (each SM contributes peak / SMs)."""
    if busy <= 0 or gpu.sms <= 0:
        return gpu
    left = max(1, gpu.sms - busy)
    share = left / gpu.sms
    if gpu.fp8_flops is None:
        return replace(gpu, sms=left, peak_flops=gpu.peak_flops * share)
    # The FP8 peak as tensor_peak resolves it, then marked overridden so it is not rescaled by peak_flops.
    fp8 = tensor_peak(gpu, "fp8") * share
    return replace(
        gpu,
        sms=left,
        peak_flops=gpu.peak_flops * share,
        fp8_flops=fp8,
        overridden=gpu.overridden | {"fp8_flops"},
    )


def covered(n_nodes: int, windows: list[tuple[int, int]]) -> list[bool]:
    """For node ids 0..n_nodes-1: whether a window (start, end) holds it, start < id < end (the nodes the
    compute stream runs after a collective is issued and before the first node that waits for it)."""
    diff = [0] * (n_nodes + 1)
    for start, end in windows:
        lo, hi = start + 1, min(end, n_nodes)
        if lo < hi:
            diff[lo] += 1
            diff[hi] -= 1
    out, run = [], 0
    for i in range(n_nodes):
        run += diff[i]
        out.append(run > 0)
    return out
