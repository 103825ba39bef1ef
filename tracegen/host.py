"""The host (CPU) thread of a rank: it launches every kernel in program order and waits at syncs.

A framework launches its kernels from one Python thread per rank, at a host cost per launch (framework
dispatch + cudaLaunchKernel); a kernel cannot start before the host has launched it. The host runs ahead
of the GPU except at a *sync*, where it reads a GPU result (`.item()`, `.cpu()`, `.tolist()`) and waits
until the kernel that produces it has finished; after a sync the GPU idles until the host has re-issued
work, so short kernels become host-bound.

The generator writes this as ordinary Chakra nodes (docs/tracegen.md, "Host dispatch"): CPU COMP nodes
(`is_cpu_op`, run on the rank's cpu queue) chained in program order, each a data dependency of the kernel
it launches, and an edge from a sync's kernel to the next host node. Node growth is bounded by gating only
the kernels the host can delay: with s the last sync before kernel i, the host launches i at exactly

    H_i = end(s) + SYNC + sum of the launch costs of the kernels after s up to and including i,

and the replay starts i no earlier than end(s) + rel_i, where rel_i is the longest path of generated
durations from s's end to i's start (a lower bound whatever else delays i: peers, queues, contention).
Where rel_i >= H_i - end(s) the host never binds and i needs no host node; elsewhere a host node ending
at H_i gates i (and rel_i becomes that). So the replay equals one in which every kernel waits for its own
launch, with host nodes only at the kernels that can be host-bound. The sync kernel itself is gated (its
host node ends where the host reaches the sync, so the host's wait starts at max of both, which is
end(s)). Before the first sync the host is taken to be ahead (the steady state: the previous step's last
sync, the gradient norm in the optimizer, leaves the GPU a queue of optimizer work while the host launches
the next forward), so nothing before it is gated. Durations are the generated ones: a replay that rescales
compute (what-if speed factors) keeps the gates computed for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

NEVER = -(1 << 62)  # "no lower bound" (a node not reachable from the current sync)


@dataclass(frozen=True)
class HostCosts:
    """Host time per kernel launch and of the read that ends a sync, in ns."""

    launch_ns: int
    sync_ns: int


@dataclass(frozen=True)
class HostGate:
    """One host node: it launches the kernels since the previous one (`dur_ns` of host time, a sync's read
    included) and gates kernel `kernel`; `after_sync` is the sync kernel it waits for (-1: none)."""

    kernel: int
    dur_ns: int
    after_sync: int


@dataclass(frozen=True)
class RankKernels:
    """A rank's nodes in program (launch) order, as the host pass sees them."""

    deps: Sequence[tuple[Sequence[int], Sequence[int]]]  # (data, ctrl) of every node
    launches: Sequence[int]  # kernel launches of every node (0: the host launches nothing for it)
    dur_lb: Sequence[int]  # a lower bound of every node's replayed duration, ns
    syncs: frozenset[int]  # nodes whose result the host reads right after launching them


def host_gates(rank: RankKernels, costs: HostCosts) -> list[HostGate]:
    """The host nodes of one rank, in host order (see the module docstring for the rule)."""
    n = len(rank.launches)
    rel = [NEVER] * n  # lower bound of a node's start relative to its epoch's sync end
    epoch_of = [-2] * n
    epoch = -1  # the current sync (-1: none yet, the host is ahead)
    host = 0  # host time since the epoch's sync end
    acc = 0  # host time not yet carried by a host node
    wait = -1  # the sync kernel the next host node waits for
    out: list[HostGate] = []
    for i in range(n):
        cost = rank.launches[i] * costs.launch_ns
        host += cost
        acc += cost
        if epoch < 0:
            if i in rank.syncs:
                epoch, host, acc, wait = i, costs.sync_ns, costs.sync_ns, i
                rel[i], epoch_of[i] = -rank.dur_lb[i], i
            continue
        r = NEVER
        data, ctrl = rank.deps[i]
        for d in (*data, *ctrl):
            if d < i and epoch_of[d] == epoch and rel[d] != NEVER:
                r = max(r, rel[d] + rank.dur_lb[d])
        if rank.launches[i] and (r < host or i in rank.syncs):
            out.append(HostGate(i, acc, wait))
            acc, wait = 0, -1
            r = max(r, host)
        rel[i], epoch_of[i] = r, epoch
        if i in rank.syncs:
            epoch, host, acc, wait = i, costs.sync_ns, acc + costs.sync_ns, i
            rel[i], epoch_of[i] = -rank.dur_lb[i], i
    return out


# Host cost of one kernel launch: torch.nn.Linear's forward (one cuBLAS GEMM launch through PyTorch's
# dispatcher) took 13.48 us of CPU per call on a DGX H100's host CPU (Intel Xeon Platinum 8480C), BF16,
# hidden 2048, 8192 tokens (NVIDIA/TransformerEngine issue #2053, "High CPU overhead on Grace systems",
# 2025-08-11, its benchmark table). The same order as the peer Kineto trace of an 8-rank DLRM step on V100
# (/work/shared/peer_traces/pytorch_host_plus_kineto/param_dlrm_8rank_1.0.1, rank 0, main thread): median
# 19 us between consecutive cudaLaunchKernel calls, 141 launches, profiler on (host CPU not recorded).
HOST_LAUNCH_NS = 13_480
# A sync's read: the device-to-host copy and the stream synchronize that returns once it is done, with the
# GPU idle: medians of that DLRM trace, cudaMemcpyAsync 8 us (16 calls) + cudaStreamSynchronize 7 us (10).
HOST_SYNC_NS = 15_000


def host_costs(dispatch: str, launch_us: float, compute_model: str, default_on: bool) -> HostCosts | None:
    """The host costs of a deployment's ranks, or None when no host timeline is generated.

    `dispatch` "on" | "off" | "" (the framework profile's `default_on`); `launch_us` > 0 overrides the
    per-launch cost. `compute_model: roofline` (the ASTRA-sim-style generation, GPU kernels only) has no
    host timeline unless `host_dispatch: on` asks for it.
    """
    on = dispatch == "on" or (dispatch == "" and default_on and compute_model != "roofline")
    if not on:
        return None
    launch = round(launch_us * 1000) if launch_us > 0 else HOST_LAUNCH_NS
    return HostCosts(launch, HOST_SYNC_NS)
