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

The generator decides which nodes run under which communication (tracegen.workload): the DP collectives
on their NCCL stream, the TP collectives a column-parallel linear's backward overlaps on theirs, each
stream placed on the compute-time axis by `busy_fractions`: it is a fact of the
emitted program, not of the replay, so the engine stays a plain dependency-driven replayer. The spec key
`comm_sm_contention: false` turns it off.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

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
# ("Duplication should be complete now": nChannels * 2, NCCL 2.30.7 src/graph/connect.cc) into 16 runtime channels,
# one CTA each. Hopper's further doubling applies only under 16 channels (same file), so 16 on both.
NCCL_DP_CTAS = 16
# NCCL's CTAs of a TP collective inside one node (the overlapped backward collectives of the column-
# parallel linears, Framework.sp_dgrad_overlap / async_dgrad_allreduce): its runtime channels, one CTA each,
# from NCCL's intra-node ring search (`nccl_node_channels`). A TP group spanning nodes holds NCCL_DP_CTAS,
# as a DP collective does.
# NCCL's intra-node search speeds, GB/s per channel (src/graph/search.cc `speedArrayIntra`,
# `sm90SpeedArrayIntra`, NVIDIA/nccl v2.19.3-1 and master 5067397c; master adds 11.0 to the SM90 list, which
# no NVSwitch node here reaches).
NCCL_SPEEDS_SM80 = (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0)
NCCL_SPEEDS_SM90 = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0)
# Blackwell (sm_100): `sm100SpeedArrayIntra` as read in stored copies of search.cc, {90, 80, 70, 60, 50, 40,
# 30, 24, 20, 19, 18}; a later copy inserts 45.0, which changes no result for the NVLink-5 nodes here (18 x
# 40.1 GB/s: 8 channels at 90, as without it).
NCCL_SPEEDS_SM100 = (90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0)
NCCL_MAXCHANNELS = 32  # src/include/device.h MAXCHANNELS; a ring graph holds at most half (init.cc)


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


@dataclass(frozen=True)
class SystemLinks:
    """What NCCL's topology search sees on a DGX-like system: GPUs per NVLink node, the NVLinks of a GPU and
    the bandwidth NCCL assumes per link (GB/s), and the search-speed table (SM90 / SM100)."""

    gpus_per_node: int
    nvlinks: int
    nccl_link_gbps: float
    sm90: bool
    sm100: bool = False  # Blackwell: NCCL_SPEEDS_SM100


# The DGX presets (netmodels/presets.py SYSTEM_PRESETS; tracegen does not import netmodels,
# tests/test_gen_contention.py checks the two agree). A cluster without a system preset holds NCCL_TP_CTAS /
# NCCL_DP_CTAS. NVLinks per GPU: 12 on the A100 (datasheet: 12 x 25 GB/s = 300 GB/s per direction), 8 on the
# A800 (its 200 GB/s per direction at 25 GB/s a link; `nvidia-smi topo -m` shows NV8 between A800-SXM4
# pairs), 18 on the H100 SXM (datasheet). NCCL's per-link figure: SM80_NVLINK_BW 20.0, SM90_NVLINK_BW 20.6
# (src/graph/topo.h, master; netmodels/nccl.py NVLINK_SIMPLE_EFFICIENCY holds the same figures over 25 GB/s).
SYSTEM_LINKS: dict[str, SystemLinks] = {
    "dgx-a100": SystemLinks(8, 12, 20.0, False),
    "dgx-a800": SystemLinks(8, 8, 20.0, False),
    "dgx-h100": SystemLinks(8, 18, 20.6, True),
    # NVLink 5: 18 links of 50 GB/s per direction on the B200 (DGX B200 datasheet) and GB200 (NVL72
    # datasheet); SM100_NVLINK_BW 40.1 (topo.h). GB200 NVL72: the 72-GPU NVLink domain is the node.
    "dgx-b200": SystemLinks(8, 18, 40.1, False, True),
    "gb200-nvl72": SystemLinks(72, 18, 40.1, False, True),
}

# The seconds one collective takes as the replay's network model times it: (Chakra kind name as in
# tracegen.workload.COMM_KIND, comm_size in bytes, the group's ranks) -> seconds. The application layer
# builds it from the deployment's cluster (xsim.api.network.collective_seconds: netmodels' analytical model,
# the replay's default, with NCCL's algorithms, protocols and latencies on the DGX presets); tracegen does not
# import netmodels, so it is handed in. None: no estimate, a collective is taken in flight up to its first
# consumer.
CommTimer = Callable[[str, int, tuple[int, ...]], float]


def nccl_node_channels(nvlinks: int, link_gbps: float, sm90: bool, sm100: bool = False) -> int:
    """Runtime channels (CTAs) of a collective inside one NVSwitch node, as NCCL's init derives them.

    Our reading of NVIDIA/nccl (v2.19.3-1 and master agree): every GPU reaches the others through the
    switch at `nvlinks` x `link_gbps` GB/s (maxBw = totalBw). ncclTopoCompute (src/graph/search.cc) starts at
    the fastest search speed not above it; a ring channel at speed s takes s of each GPU's NVLink, so
    floor(total / s) channels fit (at most MAXCHANNELS / 2). It stops once channels x s reach the total,
    else tries slower speeds while the next is above 0.49 of the best graph's and keeps a strictly larger
    product. ncclTopoDupChannels then doubles the channels at half the speed when the speed is >= 25 (not
    on SM90 below 50 with more than 4 channels: `ccMin > 80`, so on SM100 too, which searches its own speeds,
    NCCL_SPEEDS_SM100); the second pass looks for the same channel count at a
    faster speed, which no NVSwitch node finds. ncclTopoPostset doubles them again ("Duplication should be
    complete now", src/graph/connect.cc), capped at MAXCHANNELS; a collective of the sizes here (over
    nChannels x 512 threads x 64 B) runs on all of them (enqueue.cc).
    """
    total = nvlinks * link_gbps
    speeds = NCCL_SPEEDS_SM100 if sm100 else NCCL_SPEEDS_SM90 if sm90 else NCCL_SPEEDS_SM80
    cap = NCCL_MAXCHANNELS // 2

    def fit(s: float) -> int:
        return min(int(total // s), cap)

    i = next((k for k, s in enumerate(speeds) if s <= total), len(speeds) - 1)
    n, bw = 0, 0.0
    while True:
        if fit(speeds[i]) * speeds[i] > n * bw:
            n, bw = fit(speeds[i]), speeds[i]
        if n * bw >= total or i + 1 >= len(speeds) or (n > 0 and speeds[i + 1] / bw <= 0.49):
            break
        i += 1
    if n == 0:
        return 1
    if bw >= 25.0 and not ((sm90 or sm100) and bw < 50.0 and n > 4):
        dup = min(2 * n, cap)
        n, bw = dup, bw / math.ceil(dup / n)
    for s in sorted(x for x in speeds if x > bw):
        if fit(s) < n:
            break
        n, bw = fit(s), s
    return min(2 * n, NCCL_MAXCHANNELS)


# A cluster without a system preset: the DGX A100's figure (24).
NCCL_TP_CTAS = nccl_node_channels(12, 20.0, False)


@dataclass(frozen=True)
class CommWindow:
    """One collective on one of the rank's NCCL streams: the node it is issued after, its first consumer, its
    seconds as the replay's network model times it (CommTimer; inf: unknown) and the SMs (NCCL CTAs) its
    communicator holds (0: the stream's)."""

    issue: int
    consumer: int
    seconds: float
    ctas: int = 0


def dp_comm_ctas(members: Sequence[int], links: SystemLinks | None) -> int:
    """CTAs a collective on the DP stream holds: NCCL's runtime channels of its communicator, as for a TP
    group (`comm_ctas`: the intra-node ring search's inside one node, NCCL_DP_CTAS across nodes), and
    NCCL_DP_CTAS on a cluster without a system preset. An 8-GPU DP group on one DGX A100 so holds 24, not
    the 16 of the inter-node ring graph."""
    return NCCL_DP_CTAS if links is None else comm_ctas(members, links)


def comm_ctas(members: Sequence[int], links: SystemLinks | None) -> int:
    """CTAs a TP-group collective holds: NCCL's runtime channels inside a node (`nccl_node_channels` of the
    system, NCCL_TP_CTAS without one), NCCL_DP_CTAS across nodes."""
    if links is None:
        return NCCL_TP_CTAS
    if len({r // links.gpus_per_node for r in members}) > 1:
        return NCCL_DP_CTAS
    return nccl_node_channels(links.nvlinks, links.nccl_link_gbps, links.sm90, links.sm100)


def busy_fractions(
    comp: Sequence[tuple[int, int]], windows: Sequence[CommWindow], ctas: int | None = None
) -> dict[int, float]:
    """For compute nodes `comp` ((id, ns) in stream order): the fraction of each node's time a DP collective
    is in flight. On the stream's compute-time axis (idle time not counted), a collective starts when it is
    issued and the previous one is done, and lasts its seconds, or until its first consumer, which waits
    for it (the axis stands still meanwhile). `ctas`: count only the windows holding that many SMs (every
    window still occupies the stream)."""
    ids = [n for n, _ in comp]
    t = [0]
    for _, ns in comp:
        t.append(t[-1] + ns)
    spans, prev_end = [], 0.0
    for w in windows:
        start = max(float(t[bisect.bisect_left(ids, w.issue)]), prev_end)
        end = start + w.seconds * 1e9
        # A consumer that waits stops the axis until the collective is done: it ends there on the axis.
        stop = prev_end = min(end, float(t[bisect.bisect_left(ids, w.consumer)]))
        if stop > start and (ctas is None or w.ctas == ctas):
            spans.append((start, stop))
    spans.sort()
    out: dict[int, float] = {}
    j = 0
    for k, (nid, ns) in enumerate(comp):
        lo, hi = t[k], t[k] + ns
        while j < len(spans) and spans[j][1] <= lo:
            j += 1
        busy, i = 0.0, j
        while i < len(spans) and spans[i][0] < hi:
            busy += min(hi, spans[i][1]) - max(lo, spans[i][0])
            i += 1
        if busy > 0 and ns > 0:
            out[nid] = min(1.0, busy / ns)
    return out
