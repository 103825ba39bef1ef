"""The host (CPU) thread of a rank: it launches every kernel in program order and waits at syncs.

A framework launches its kernels from one Python thread per rank, at a host cost per launch (framework
dispatch + cudaLaunchKernel); a kernel cannot start before the host has launched it. The host runs ahead
of the GPU except at a *sync*, where it reads a GPU result (`.item()`, `.cpu()`, `.tolist()`) and waits
until the kernel that produces it has finished; after a sync the GPU idles until the host has re-issued
work, so short kernels become host-bound.

The generator writes this as ordinary Chakra nodes (docs/tracegen.md, "Host dispatch"): CPU COMP nodes
(`is_cpu_op`, run on the rank's cpu queue) chained in program order, each a data dependency of the kernel
it launches, and an edge from a sync's kernel (each kernel, where the host waits for several: a pipeline
exchange) to the next host node. Node growth is bounded by gating only
the kernels the host can delay: with s the last sync before kernel i, the host launches i at exactly

    H_i = end(s) + SYNC + sum of the launch costs of the kernels after s up to and including i,

and the replay starts i no earlier than end(s) + rel_i, where rel_i is the longest path of generated
durations from s's end to i's start (a lower bound whatever else delays i: peers, queues, contention).
Where rel_i >= H_i - end(s) the host never binds and i needs no host node; elsewhere a host node ending
at H_i gates i (and rel_i becomes that). So the replay equals one in which every kernel waits for its own
launch, with host nodes only at the kernels that can be host-bound. At a sync a host node carries the
launches up to the read, so the host node after it starts at max(host reaching the read, end(s)). Host
nodes are emitted in place, right before the kernel they gate, so every dependency points to an earlier
node. Before the first sync the host is taken to be ahead (the steady state: the previous step's last
sync, the gradient norm in the optimizer, leaves the GPU a queue of optimizer work while the host launches
the next forward), so nothing before it is gated. Durations are the generated ones: a replay that rescales
compute (what-if speed factors) keeps the gates computed for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

NEVER = -(1 << 62)  # "no lower bound" (a node not reachable from the current sync)
# A host node to emit: (host ns it carries, the sync kernels it waits for, the previous host node or -1).
Gate = tuple[int, tuple[int, ...], int]


@dataclass(frozen=True)
class HostCosts:
    """Host time per kernel launch and of the read that ends a sync, in ns."""

    launch_ns: int
    sync_ns: int


@dataclass
class HostTimeline:
    """The host thread of one rank while its nodes are emitted in program order (launch order).

    `launch` accounts each kernel as it is emitted and says whether it needs a host node; `placed` records
    where it went; `sync` starts a new epoch after a kernel whose result the host reads. Nodes are only
    looked up in the current epoch (`end_rel`: lower bound of their end relative to the sync's end).
    """

    costs: HostCosts
    epoch: int = -1  # the current sync kernel (-1: none yet, the host is ahead)
    host: int = 0  # host time since the epoch's sync end
    acc: int = 0  # host time not yet carried by a host node
    wait: tuple[int, ...] = ()  # the sync kernels the next host node waits for
    prev: int = -1  # the last host node
    end_rel: dict[int, int] = field(default_factory=dict)
    _start: int = NEVER  # lower bound of the kernel being placed

    def launch(self, deps: Sequence[int], launches: int) -> Gate | None:
        """Account the next kernel's launches; (host ns, sync kernels or (), previous host node or -1) of
        the host node that must gate it, or None when the host cannot delay it."""
        cost = launches * self.costs.launch_ns
        self.host += cost
        self.acc += cost
        if self.epoch < 0:
            self._start = NEVER
            return None
        got = [self.end_rel[d] for d in deps if d in self.end_rel]
        r = max(got) if got else NEVER
        if launches and r < self.host:
            gate = (self.acc, self.wait, self.prev)
            self.acc, self.wait, self._start = 0, (), self.host
            return gate
        self._start = r
        return None

    def placed(self, nid: int, dur_lb: int, host_node: int = -1) -> None:
        """The kernel accounted by the last `launch` is node `nid` (gated by `host_node`, if any)."""
        if host_node >= 0:
            self.prev = host_node
        if self._start != NEVER:
            self.end_rel[nid] = self._start + dur_lb

    def sync(self, kernels: Sequence[int], syncs: int = 1) -> Gate | None:
        """The host waits for `kernels` (a result it reads, or a pipeline exchange it synchronizes on): a
        new epoch. (host ns, sync kernels, previous host node) of the host node that carries the launches up
        to the wait (the host reaches it at its end), or None before the first sync (the host is ahead).
        `syncs` > 1: that many synchronizations back to back with nothing launched between them (each
        costs the sync's host time; the GPU has nothing queued meanwhile); 0: a wait with no read of its own
        (CUDA_LAUNCH_BLOCKING's launch that returns when its kernel ends)."""
        out = None if self.epoch < 0 else (self.acc, self.wait, self.prev)
        self.epoch = kernels[0]
        # The epoch starts at the last of them to end. Only a lone kernel is known to end there: with several,
        # a node after one of them has no lower bound relative to the epoch (it is then gated, exactly).
        self.end_rel = {kernels[0]: 0} if len(kernels) == 1 else {}
        self.host = self.acc = syncs * self.costs.sync_ns
        self.wait = tuple(kernels)
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
