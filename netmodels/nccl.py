"""NCCL's view of a cluster: what its Simple protocol gets out of each link, and its rail-aligned rings.

Facts come from NVIDIA/nccl's source (read, not copied; our own model of them):

* `src/graph/topo.h` (NCCL master as stored, the version with `SM100_NVLINK_BW`): the bandwidth NCCL's topology
  search assumes per NVLink, `SM80_NVLINK_BW 20.0`, `SM90_NVLINK_BW 20.6`, `SM100_NVLINK_BW 40.1` (GB/s).
  A link's line rate per direction is 25 GB/s (NVLink3, NVLink4) or 50 GB/s (NVLink5) (A100/H100/B200
  datasheets: 12 x 25 = 300, 18 x 25 = 450, 18 x 50 = 900 GB/s per direction). The ratio is the share of
  the line rate the Simple protocol moves as payload: 0.8 on A100 (12 x 20 = 240 GB/s, "the total
  effective bandwidth should be 240GB/s on A100", S. Jeaugey, NVIDIA/nccl-tests#149), 0.824 on H100
  (18 x 20.6 = 370.8 GB/s, "NCCL can get an effective NVLink bandwidth of 370GB/s", NVIDIA/nccl-tests#212).
* NICs: NCCL takes a NIC's port speed as its bandwidth (`net_ib.cc`: speed in Mb/s / 8000 = GB/s) and its
  tuning model applies no factor to Simple on the network, so a NIC link keeps its line rate.

A topology built with `collectives: nccl` (the DGX presets, or any cluster description that says so) keeps
its hardware rates; the models read the rates NCCL gets from `effective_link_bandwidth`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from xsim.netmodels.topology import GPU, Topology

# Per-NVLink bandwidth NCCL assumes (GB/s, NVIDIA/nccl src/graph/topo.h) / line rate per link and
# direction (GB/s, NVIDIA A100/H100/B200 datasheets).
NVLINK_SIMPLE_EFFICIENCY: dict[str, float] = {
    "A100-40GB": 20.0 / 25.0,
    "A100-80GB": 20.0 / 25.0,
    "H100": 20.6 / 25.0,
    "H200": 20.6 / 25.0,
    "B200": 40.1 / 50.0,
    "GB200": 40.1 / 50.0,  # the B200 GPU (sm_100) on the same NVLink 5 (GB200 NVL72 datasheet)
}


def link_efficiency(topology: Topology) -> np.ndarray:
    """Share of each link's rate NCCL's Simple protocol moves as payload (1 off NVLink or outside NCCL mode)."""
    c = topology._cache
    eff = c.get("nccl_eff")
    if eff is None:
        eff = np.ones(len(topology.links))
        if topology.collectives == "nccl":
            nodes = topology.graph.nodes
            for i, (u, v) in enumerate(topology.links):
                if topology.graph[u][v].get("kind") != "scaleup":
                    continue
                gpu, hub = (u, v) if nodes[u].get("kind") == GPU else (v, u)
                # NVLink only: a PCIe scale-up switch carries no NVLink protocol overhead figure.
                if nodes[gpu].get("kind") == GPU and str(hub).endswith("nvswitch"):
                    eff[i] = NVLINK_SIMPLE_EFFICIENCY.get(str(nodes[gpu].get("gpu")), 1.0)
        c["nccl_eff"] = eff
    return eff


def effective_link_bandwidth(topology: Topology) -> np.ndarray:
    """Per-link bandwidth (bytes/ns) collectives reach: the line rate times `link_efficiency`."""
    c = topology._cache
    bw = c.get("nccl_bw")
    if bw is None:
        bw = c["nccl_bw"] = topology.link_bandwidth * link_efficiency(topology)
    return bw


def rail_rings(hosts: list[str]) -> list[list[int]] | None:
    """NCCL's rail-aligned rings over group positions: one per local GPU of a host, or None.

    Channel c visits every host's positions in group order rotated by c, so it leaves each host from its
    (c-1)-th GPU through that GPU's NIC and enters the next host at its c-th GPU: with one NIC per GPU, the
    C channels cross every node boundary through C different NICs at once (NCCL's rail-aligned graphs,
    `src/graph/search.cc`). None when the group sits on one host or hosts hold different counts.
    """
    by_host: dict[str, list[int]] = {}
    for i, h in enumerate(hosts):
        by_host.setdefault(h, []).append(i)
    members = list(by_host.values())
    local = len(members[0])
    if len(members) < 2 or local < 2 or any(len(m) != local for m in members):
        return None
    return [[m[(c + j) % local] for m in members for j in range(local)] for c in range(local)]


# A NIC slower than this is worth one line at replay time: 100 Gb/s (EDR InfiniBand / 100GbE) is the
# slowest NIC of any GPU training cluster the project's sources describe; the paper's Table 5 testbed has
# 10 Gb/s (A100, H100 rows), the default of a `nodes:` cluster.
SLOW_NIC_BYTES_PER_S = 100e9 / 8


def topology_warnings(topology: Topology, rank_gpus: dict[int, str] | None = None) -> tuple[str, ...]:
    """One line per surprise in replaying on this topology: NICs under 100 Gb/s, GPUs unlike the traces'.

    `rank_gpus` maps a rank to the GPU type the traces were generated for (deployment device groups).
    """
    from xsim.netmodels.errors import TopologyError
    from xsim.netmodels.presets import canonical_gpu

    out: list[str] = []
    graph = topology.graph
    nic_bw = [
        float(d["bandwidth"])
        for u, v, d in graph.edges(data=True)
        if graph.nodes[u].get("kind") == "nic" and d.get("kind") == "nic"
    ]
    if nic_bw and min(nic_bw) < SLOW_NIC_BYTES_PER_S:
        slow = sum(1 for b in nic_bw if b < SLOW_NIC_BYTES_PER_S)
        out.append(
            f"network: {slow} of {len(nic_bw)} NICs run at {min(nic_bw) * 8 / 1e9:g} Gb/s, under 100 Gb/s "
            "(the paper's Table 5 default of nodes: clusters); set nic_bandwidth or use dgx-a100/dgx-h100"
        )
    if rank_gpus:
        differ = []
        for r, want in sorted(rank_gpus.items()):
            if r >= topology.num_ranks:
                continue
            have = graph.nodes[topology.rank_nodes[r]].get("gpu")
            try:
                want_c = canonical_gpu(want)
            except TopologyError:
                want_c = want
            if have is not None and have != want_c:
                differ.append((r, have, want_c))
        if differ:
            r, have, want = differ[0]
            out.append(
                f"network: {len(differ)} ranks sit on GPUs unlike the traces' device groups "
                f"(rank {r}: topology {have}, traces {want})"
            )
    return tuple(out)


# ---------------------------------------------------------------------------------------------------------
# Protocols and NCCL's choice among them (NVIDIA/nccl src/graph/tuning.cc at master 5067397c, NCCL 2.30.7:
# the defaults of `ncclTunerConstantsDefaults`, the "model refinements" of ncclTopoTuneModel and
# ncclTopoGetAlgoTime). Facts, our own code. NCCL 2.30.7 is the version the validation's H200 curve ran.


@dataclass(frozen=True)
class Protocol:
    """One NCCL protocol on an algorithm: latencies in us."""

    name: str
    base_us: float  # once per collective (baseLatencies)
    nvlink_step_us: float  # per step over NVLink (hwLatencies NVLINK)
    net_step_us: float  # per step over the network (hwLatencies NET)
    net_overhead_us: float  # floor of an intra-node ring step once the ring spans nodes (getNetOverhead)


# Ring rows. getNetOverhead: 1 us on an x86 Intel host (DGX H100: Xeon 8480C), x3 for Simple; AMD hosts
# (DGX A100: EPYC 7742) would take 2 us, not distinguished here.
PROTOCOLS: dict[str, Protocol] = {
    "LL": Protocol("LL", 6.6, 0.6, 2.7, 1.0),
    "LL128": Protocol("LL128", 14.0, 1.9, 4.0, 1.0),
    "Simple": Protocol("Simple", 8.4, 3.4, 14.0, 3.0),
}
# Tree rows (AllReduce): baseLatencies Tree, hwLatencies NVLINK / NET Tree.
TREE_PROTOCOLS: dict[str, Protocol] = {
    "LL": Protocol("LL", 6.8, 0.6, 5.0, 0.0),
    "LL128": Protocol("LL128", 14.0, 1.25, 8.5, 0.0),
    "Simple": Protocol("Simple", 8.4, 4.0, 14.0, 0.0),
}
PROTOCOL_NAMES = tuple(PROTOCOLS)
# llMaxBws (GB/s): on one node by GPU generation, across nodes by CPU vendor (Intel row), by node count
# (1, 2, more). GPU generation per catalog GPU.
LL_MAX_ONE_NODE: dict[str, float] = {"ampere": 87.7, "hopper": 141.0, "blackwell": 2 * 141.0}
LL_MAX_INTEL: tuple[float, float] = (39.0, 20.4)  # 2 nodes, more than 2
GPU_ARCH: dict[str, str] = {
    "A100-40GB": "ampere", "A100-80GB": "ampere", "H100": "hopper", "H200": "hopper", "B200": "blackwell",
    "GB200": "blackwell",
}  # fmt: skip


def ll_max_gbps(nodes: int, arch: str | None) -> float:
    """NCCL's cap on an LL collective's bus bandwidth (GB/s), or inf when the GPU generation is unknown."""
    if nodes == 1:
        return LL_MAX_ONE_NODE.get(arch or "", float("inf"))
    return LL_MAX_INTEL[0 if nodes == 2 else 1]


# Per-channel bandwidth caps (GB/s per channel) by GPU generation for 1, 2 and more nodes
# (perChMaxRingLL128Bws, perChMaxTreeBws, perChMaxTreeLL128Bws); times NCCL's channel count of the graph.
PER_CH_MAX_RING_LL128: dict[str, tuple[float, float, float]] = {
    "ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 36.7), "blackwell": (40.0, 40.0, 40.0),
}  # fmt: skip
PER_CH_MAX_TREE: dict[str, tuple[float, float, float]] = {
    "ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0), "blackwell": (70.0, 42.8, 24.0),
}  # fmt: skip
PER_CH_MAX_TREE_LL128: dict[str, tuple[float, float, float]] = {
    "ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 29.0), "blackwell": (55.6, 31.67, 20.0),
}  # fmt: skip


@dataclass(frozen=True)
class ChannelCaps:
    """NCCL's bus-bandwidth caps of a group (GB/s, inf where none applies): channels x per-channel cap."""

    ring_ll128: float = float("inf")
    tree: float = float("inf")
    tree_ll128: float = float("inf")


NO_CAPS = ChannelCaps()


def channel_caps(arch: str | None, nodes: int, channels: int | None) -> ChannelCaps:
    """The caps NCCL's tuning model puts on ring LL128, tree and tree LL128 with `channels` graph channels
    (None: the channel count is not known here, no caps)."""
    if channels is None or arch not in PER_CH_MAX_TREE:
        return NO_CAPS
    i = 0 if nodes == 1 else 1 if nodes == 2 else 2
    return ChannelCaps(
        channels * PER_CH_MAX_RING_LL128[arch][i],
        channels * PER_CH_MAX_TREE[arch][i],
        channels * PER_CH_MAX_TREE_LL128[arch][i],
    )


def bandwidth_factor(
    protocol: str, simple_busbw_gbps: float, ll_max: float, caps: ChannelCaps = NO_CAPS
) -> float:
    """Share of the Simple ring's bus bandwidth a protocol reaches: LL half of it (8 data bytes per 16-byte
    line) up to llMaxBw, LL128 0.92 (120 of 128 bytes) up to the LL128 per-channel cap."""
    if protocol == "LL":
        return min(0.5, ll_max / simple_busbw_gbps) if simple_busbw_gbps > 0 else 0.5
    if protocol == "LL128":
        return min(0.92, caps.ring_ll128 / simple_busbw_gbps) if simple_busbw_gbps > 0 else 0.92
    return 1.0


def tree_bandwidth_factor(
    protocol: str, nodes: int, simple_busbw_gbps: float, ll_max: float, caps: ChannelCaps = NO_CAPS
) -> float:
    """Share of the tree schedule's bandwidth a protocol reaches: 0.92 up to the tree's per-channel cap
    (every protocol), then LL /3.8 up to llMaxBw, LL128 x 7/9 (one node) or 120/128 up to its cap."""
    bus = simple_busbw_gbps
    base = min(0.92, caps.tree / bus) if bus > 0 else 0.92
    if protocol == "LL":
        return base * min(1 / 3.8, ll_max / (bus * base)) if bus > 0 else base / 3.8
    if protocol == "LL128":
        share = 7.0 / 9.0 if nodes == 1 else 120.0 / 128.0
        return base * min(share, caps.tree_ll128 / (bus * base)) if bus > 0 else base * share
    return base


def ring_steps(kind: str, p: int, nodes: int) -> tuple[int, int]:
    """(ring steps, of which over the network) as NCCL's tuning model counts them."""
    if kind == "all_reduce":
        return 2 * (p - 1), 2 * (nodes - 1)
    return p - 1, nodes - 1


def step_latencies_us(protocol: str, nodes: int, ppn: float, tree: bool = False) -> tuple[float, float]:
    """(intra-node, network) latency of one step in us. One GPU per node exposes the tree's network
    latency for either algorithm ("With ppn=1 latencies are fully exposed")."""
    pr = (TREE_PROTOCOLS if tree else PROTOCOLS)[protocol]
    net = TREE_PROTOCOLS[protocol].net_step_us if ppn == 1 else pr.net_step_us
    intra = max(pr.nvlink_step_us, pr.net_overhead_us) if nodes > 1 and not tree else pr.nvlink_step_us
    return intra, net


def ring_latency_us(protocol: str, kind: str, p: int, nodes: int) -> float:
    """NCCL's latency of a ring collective (us)."""
    steps, inter = ring_steps(kind, p, nodes)
    intra_us, net_us = step_latencies_us(protocol, nodes, p / nodes)
    return PROTOCOLS[protocol].base_us + (steps - inter) * intra_us + inter * net_us


def ring_busbw_gbps(kind: str, p: int, size: float, simple_bw_ns: float) -> float:
    """The Simple ring's bus bandwidth in NCCL's sense (algorithm bandwidth x steps / ranks), GB/s."""
    steps, _ = ring_steps(kind, p, 1)
    total = size * p if kind == "all_gather" else size  # Chakra's AllGather size is the per-rank input
    return total / simple_bw_ns * steps / p if simple_bw_ns > 0 else 0.0


@dataclass(frozen=True)
class RingCase:
    """A ring collective as NCCL's tuning model sees it: its kind, ranks, nodes and bytes (0: none given)."""

    kind: str
    p: int
    nodes: int
    size: float = 0


def predicted_ns(
    protocol: str,
    case: RingCase,
    simple_bw_ns: float,
    ll_max: float = float("inf"),
    caps: ChannelCaps = NO_CAPS,
) -> float:
    """NCCL's predicted time of a ring collective: latency + Simple's bandwidth time / the protocol's share."""
    kind, p, size = case.kind, case.p, case.size
    busbw = ring_busbw_gbps(kind, p, size, simple_bw_ns) if size else 0.0
    factor = bandwidth_factor(protocol, busbw, ll_max, caps)
    return ring_latency_us(protocol, kind, p, case.nodes) * 1e3 + simple_bw_ns / factor


def nccl_protocol_applies(kind: str, algorithm: str) -> bool:
    """Whether NCCL's protocols time this collective here: ring and NVLS AR/RS/AG, tree and NVLS_TREE
    AllReduce."""
    if algorithm in ("double_binary_tree", "nvls_tree"):
        return kind == "all_reduce"
    if algorithm == "nvls":
        return kind in ("all_reduce", "reduce_scatter", "all_gather")
    return algorithm == "ring" and kind in ("all_reduce", "reduce_scatter", "all_gather")


def choose_protocol(
    kind: str, p: int, nodes: int, simple_bw_ns: float, ll_max: float = float("inf"), size: float = 0
) -> str:
    """The ring protocol NCCL picks: the fastest predicted (ties to the earlier of LL, LL128, Simple)."""
    case = RingCase(kind, p, nodes, size)
    return min(PROTOCOL_NAMES, key=lambda pr: predicted_ns(pr, case, simple_bw_ns, ll_max))


def split_protocol(algorithm: str | None) -> tuple[str | None, str | None]:
    """`ring/LL128` -> ("ring", "LL128"); a name without a protocol -> (name, None)."""
    if algorithm is None or "/" not in str(algorithm):
        return algorithm, None
    base, _, proto = str(algorithm).partition("/")
    names = {n.lower(): n for n in PROTOCOL_NAMES}
    if proto.lower() not in names:
        from xsim.netmodels.errors import AlgorithmError

        raise AlgorithmError(
            f"unknown NCCL protocol {proto!r} in {algorithm!r} (known: {', '.join(PROTOCOL_NAMES)})"
        )
    return base, names[proto.lower()]


# ncclTopoGetAlgoTime's treeCorrectionFactor: tree bandwidth x this, by protocol and log2(bytes / 64) for
# 64 B .. 256 MiB ("Trees are not perfectly sticking to the model for medium sizes").
TREE_CORRECTION: dict[str, tuple[float, ...]] = {
    "LL": (1, 1, 1, 1, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1, 1, 1, 1),
    "LL128": (1, 1, 1, 1, 1, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1, 1),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}  # fmt: skip


def tree_latency_us(protocol: str, p: int, nodes: int) -> float:
    """NCCL's latency of a tree AllReduce (us): base + 2 ((ranks per node - 1) intra + log2(nodes) net)."""
    intra_us, net_us = step_latencies_us(protocol, nodes, p / nodes, tree=True)
    log2n = max(int(nodes).bit_length() - 1, 0)
    return TREE_PROTOCOLS[protocol].base_us + 2 * ((p // nodes - 1) * intra_us + log2n * net_us)


def predicted_tree_ns(
    protocol: str,
    p: int,
    nodes: int,
    size: float,
    tree_bw_ns: float,
    ll_max: float = float("inf"),
    caps: ChannelCaps = NO_CAPS,
) -> float:
    """NCCL's predicted time of a tree AllReduce: latency + the tree's bandwidth time / share / correction."""
    busbw = 2 * size / tree_bw_ns if tree_bw_ns > 0 else 0.0  # a tree's algorithm bandwidth is busBw / 2
    log_size = max(int(size) >> 6, 1).bit_length() - 1
    corr = TREE_CORRECTION[protocol][log_size] if log_size < 23 else 1.0
    factor = tree_bandwidth_factor(protocol, nodes, busbw, ll_max, caps)
    return tree_latency_us(protocol, p, nodes) * 1e3 + tree_bw_ns / (factor * corr)


def predicted_ring_ns(
    protocol: str,
    kind: str,
    p: int,
    nodes: int,
    size: float,
    channels: int,
    ring_bw_ns: float,
    ll_max: float = float("inf"),
    caps: ChannelCaps = NO_CAPS,
) -> float:
    """NCCL's predicted ring time, with ncclTopoGetAlgoTime's "plateau effect" (Simple AllReduce across
    nodes, at least 64 bytes per channel and rank: latency x 1.4 on Ampere and later)."""
    t = predicted_ns(protocol, RingCase(kind, p, nodes, size), ring_bw_ns, ll_max, caps)
    if protocol == "Simple" and kind == "all_reduce" and nodes > 1 and size / (channels * p) >= 64:
        t += 0.4 * ring_latency_us(protocol, kind, p, nodes) * 1e3
    return t


def protocol_factor(
    sched, protocol: str, nodes: int, size: float, bw_ns: float, ll_max: float, caps: ChannelCaps = NO_CAPS
) -> float:
    """The bandwidth share `with_protocol` applies: the ring's or the tree's, from its Simple time."""
    if sched.algorithm == "double_binary_tree":
        busbw = 2 * size / bw_ns if bw_ns > 0 else 0.0
        return tree_bandwidth_factor(protocol, nodes, busbw, ll_max, caps)
    return bandwidth_factor(protocol, ring_busbw_gbps(sched.kind, sched.p, size, bw_ns), ll_max, caps)


def graph_channels(topology: Topology, ranks: tuple[int, ...]) -> int | None:
    """NCCL's channel count of the ring/tree graphs of a group spanning nodes with a NIC per GPU: one per
    NIC, i.e. the GPUs per node (search.cc: each channel enters and leaves a node through a NIC at the
    NIC's speed, and at 50 GB/s or less it is not duplicated). None elsewhere: on one node NCCL's graphs
    hold enough channels on DGX A100/H100 (12, six at the fastest speed duplicated) that no cap binds
    (12 x 36.7 > 0.92 x 370.8; 12 x 20 > 0.92 x 240), and other shapes (one GPU per node, shared NICs)
    are not derived here."""
    hosts = topology.hosts_of(ranks)
    by_host: dict[str, list[int]] = {}
    for r, h in zip(ranks, hosts, strict=True):
        by_host.setdefault(h, []).append(r)
    counts = {len(m) for m in by_host.values()}
    if len(by_host) < 2 or len(counts) != 1 or min(counts) < 2:
        return None
    graph = topology.graph
    for members in by_host.values():
        nics = {v for r in members for v in graph.successors(topology.rank_nodes[r])
                if graph.nodes[v].get("kind") == "nic"}  # fmt: skip
        if len(nics) != len(members):
            return None
    return counts.pop()


def with_protocol(sched, protocol: str, hosts: list[str], factor: float | None = None):
    """The schedule as `protocol` runs it: bytes on the wire / bandwidth share (`factor`, default the
    protocol's share without llMaxBw), each transfer plus its step latency (network where it crosses
    hosts), each channel's first stage plus the base latency."""
    from xsim.netmodels.algorithms import Schedule, Stage

    nodes = len(set(hosts))
    ppn = sched.p / nodes
    tree = sched.algorithm == "double_binary_tree"
    if factor is None:
        factor = protocol_factor(sched, protocol, nodes, 0.0, 0.0, float("inf"))
    intra_us, net_us = step_latencies_us(protocol, nodes, ppn, tree=tree)
    base = (TREE_PROTOCOLS if tree else PROTOCOLS)[protocol].base_us * 1e3
    ids: dict[str, int] = {}
    h = np.array([ids.setdefault(x, len(ids)) for x in hosts])
    channels = []
    for channel in sched.channels:
        stages = []
        for k, st in enumerate(channel):
            extra = np.where(h[st.src] != h[st.dst], net_us * 1e3, intra_us * 1e3)
            if st.first is not None:
                extra = np.where(st.first, extra, 0.0)
            wire = st.nbytes / factor
            if k == 0 and st.repeat > 1:
                # The base latency once: a repeated first stage is split so only its first step pays it.
                stages.append(
                    Stage(st.src, st.dst, wire, st.reduce, 1, st.perm, st.local, extra + base, st.first)
                )
                stages.append(
                    Stage(st.src, st.dst, wire, st.reduce, st.repeat - 1, st.perm, st.local, extra, st.first)
                )
            elif k == 0:
                stages.append(
                    Stage(st.src, st.dst, wire, st.reduce, 1, st.perm, st.local, extra + base, st.first)
                )
            else:
                stages.append(
                    Stage(st.src, st.dst, wire, st.reduce, st.repeat, st.perm, st.local, extra, st.first)
                )
        channels.append(tuple(stages))
    return Schedule(sched.kind, sched.algorithm, sched.p, tuple(channels), sched.shared)


def group_arch(topology: Topology, ranks: tuple[int, ...]) -> str | None:
    """The GPU generation of a group (for llMaxBw), None when mixed or unknown."""
    nodes = topology.graph.nodes
    archs = {GPU_ARCH.get(str(nodes[topology.rank_nodes[r]].get("gpu"))) for r in ranks}
    return archs.pop() if len(archs) == 1 else None


def pxn_relay(topology: Topology, src: int, dst: int) -> int | None:
    """The rank a cross-node P2P relays through under PXN, or None (same host, no such GPU, or itself).

    PXN (NCCL 2.12+, "PXN: PCI x NVLink", NVIDIA/nccl src/graph/paths.cc, PATH_PXN in topo.h): a GPU sends
    to a remote GPU through the NIC of the local GPU on the destination's rail, reaching it over NVLink, so
    inter-node traffic stays rail-aligned (on a rail-optimized fabric: on one rail switch).
    """
    c = topology._cache
    where = c.get("pxn")
    if where is None:
        nodes = topology.graph.nodes
        where = c["pxn"] = {
            (topology.rank_hosts[r], nodes[topology.rank_nodes[r]].get("local_index")): r
            for r in range(topology.num_ranks)
        }
    hosts, rank_nodes = topology.rank_hosts, topology.rank_nodes
    if hosts[src] == hosts[dst]:
        return None
    relay = where.get((hosts[src], topology.graph.nodes[rank_nodes[dst]].get("local_index")))
    return None if relay is None or relay == src else relay


def p2p_links(topology: Topology, src: int, dst: int) -> tuple[tuple[int, ...], float]:
    """Links and summed latency of a P2P in NCCL mode: via the PXN relay where there is one."""
    relay = pxn_relay(topology, src, dst) if topology.collectives == "nccl" else None
    if relay is None:
        r = topology.route(src, dst)
        return r.links, r.latency_ns
    a, b = topology.route(src, relay), topology.route(relay, dst)
    return a.links + b.links, a.latency_ns + b.latency_ns


# ---------------------------------------------------------------------------------------------------------
# NVLink SHARP (NVLS): the NVSwitch reduces (multimem ld_reduce) and multicasts (multimem st) inside a node;
# NVLS_TREE adds a tree across nodes between each channel's head GPUs (one NIC per head). Facts from
# NVIDIA/nccl at master 5067397c (NCCL 2.30.7), read, not copied:
#   src/graph/tuning.cc  nvlsEfficiency, hwLatencies NVLS/NVLSTree, perChMaxNVLSTreeBws, the NVLS busBw model
#   src/graph/search.cc  the NVLS graph: channels, speed arrays, bandwidth per channel
#   src/enqueue.cc       which algorithms are candidates (NVLS multi-node needs CollNet)
#   src/transport/nvls.cc NCCL_NVLS_ENABLE (default 2: on where the GPU supports multicast, at least 2 GPUs)

# nvlsEfficiency by GPU generation (0 before Hopper: no NVLS).
NVLS_EFFICIENCY: dict[str, float] = {"hopper": 0.85, "blackwell": 0.74}
# hwLatencies (us), Simple only (NVLS runs no other protocol); baseLatencies of both are 0.
NVLS_NVLINK_US = 25.0  # NVLINK row, NVLS and NVLSTree
NVLS_TREE_NET_US = 20.9  # NET row, NVLSTree (NVLS across nodes, 18, needs CollNet: not modelled)
# perChMaxNVLSTreeBws (GB/s per channel) by generation for 2 nodes and for more.
NVLS_TREE_PER_CH_MAX: dict[str, tuple[float, float]] = {"hopper": (57.7, 45.5), "blackwell": (96.0, 80.0)}
# NCCL_MAX_NVLS_ARITY (src/include/device.h): the most GPUs of a node an NVLS graph spans.
NVLS_MAX_ARITY = 32
# Speeds (GB/s per channel) the graph search tries, by generation: intra-node (one node) and inter-node.
NVLS_SPEEDS_INTRA: dict[str, tuple[float, ...]] = {
    "hopper": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    "blackwell": (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
}
NVLS_SPEEDS_INTER: dict[str, tuple[float, ...]] = {
    "hopper": (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12),
    "blackwell": (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0,
                  2.4, 1.2, 0.24, 0.12),
}  # fmt: skip
NVLS_ALGORITHMS = ("nvls", "nvls_tree")


@dataclass(frozen=True)
class NvlsGraph:
    """NCCL's NVLS graph of a group: channels (one head GPU each) and bandwidth per channel (GB/s)."""

    algorithm: str  # "nvls" (one node) or "nvls_tree" (several)
    arch: str
    local: int  # the group's GPUs per node
    nodes: int
    channels: int
    bw_intra: float
    bw_inter: float
    # The slowest NIC path of the heads (GB/s; inf on one node): NCCL's minNetBw, which its Blackwell
    # multi-node NVLS tuning reads (ncclNvlsTreeSm100Tuning). Not part of the graph's identity.
    nic_gbps: float = field(default=float("inf"), compare=False)


def nvls_graph(arch: str, local: int, nodes: int, nvlink_gbps: float, nic_gbps: float, heads: int):
    """NCCL's NVLS graph search (search.cc), our reading of it, or None where it finds under 2 channels.

    Each channel takes `s` GB/s on every GPU's NVSwitch link in each direction, twice that on its head's, so
    with `k` channels whose heads are distinct GPUs the busiest link carries (k + 1) s. On one node the
    search must use every GPU as a head (k = local) and takes the fastest intra-node speed that fits; across
    nodes the heads are GPUs with their own NIC (k <= heads) and the search keeps the most channels, then
    the most k x s, among the inter-node speeds up to the NIC's, stopping once k reaches its maximum. It
    then raises the inter-node bandwidth step by step while it is under twice the intra-node one (and, across
    nodes, within the NIC's).
    """
    if arch not in NVLS_EFFICIENCY or local < 2 or local > NVLS_MAX_ARITY or nodes < 1:
        return None
    if nodes == 1:
        speeds = NVLS_SPEEDS_INTRA[arch]
        fit = [s for s in speeds if (local + 1) * s <= nvlink_gbps]
        if not fit:
            return None
        k, bw = local, fit[0]
        cap = float("inf")
    else:
        speeds = NVLS_SPEEDS_INTER[arch]
        kmax = min(local, heads)
        best: tuple[int, float] | None = None
        for s in speeds:
            if s > nic_gbps:
                continue
            if best is not None and s / best[1] <= 0.49:
                break
            k = min(kmax, int(nvlink_gbps // s) - 1)
            if k < 1:
                continue
            if best is None or k > best[0] or k * s > best[0] * best[1]:
                best = (k, s)
            if best[0] == kmax:
                break
        if best is None:
            return None
        k, bw = best
        cap = nic_gbps
    if k < 2:
        return None
    inter = bw
    faster = [s for s in sorted(speeds) if s > inter and s <= cap]
    while faster and inter < 2 * bw:
        inter = faster.pop(0)
    return NvlsGraph("nvls" if nodes == 1 else "nvls_tree", arch, local, nodes, k, bw, inter, nic_gbps)


def nvls_parts_gbps(g: NvlsGraph, kind: str, p: int) -> tuple[float, float]:
    """NCCL's NVLS bandwidth (GB/s, per the bytes NCCL's model divides) of the intra-node and the
    inter-node part (inf on one node): ncclTopoTuneModel's per-channel min() split in two, times channels,
    bus to algorithm bandwidth (x ranks / 2(ranks - 1) for AllReduce; AllGather/ReduceScatter unconverted)."""
    eff = NVLS_EFFICIENCY[g.arch]
    intra = g.bw_intra * eff * (g.channels - 1) / g.channels
    intra *= 2.0 if kind == "all_reduce" else (g.local - 1) / g.local
    inter = float("inf")
    if g.algorithm == "nvls_tree":
        two, more = NVLS_TREE_PER_CH_MAX[g.arch]
        inter = min(g.bw_inter * (2 if g.nodes <= 2 else 1), two if g.nodes <= 2 else more)
    ratio = p / (2 * (p - 1)) if kind == "all_reduce" else 1.0
    return g.channels * intra * ratio, g.channels * inter * ratio


def nvls_latency_us(g: NvlsGraph, ppn: float) -> float:
    """NCCL's NVLS latency (us): the NVLink hop, plus 2 log2(nodes) network hops for NVLS_TREE (the tree's
    Simple network latency when ppn is 1, as for every algorithm)."""
    if g.algorithm == "nvls":
        return NVLS_NVLINK_US
    net = TREE_PROTOCOLS["Simple"].net_step_us if ppn == 1 else NVLS_TREE_NET_US
    return NVLS_NVLINK_US + 2 * (int(g.nodes).bit_length() - 1) * net


def nvls_bytes(kind: str, size: float, p: int) -> float:
    """The bytes NCCL's model divides by the bandwidth: the whole buffer (Chakra's AllGather size is the
    per-rank input)."""
    return size * p if kind == "all_gather" else float(size)


# ---------------------------------------------------------------------------------------------------------
# How NVLS's kernel pipelines a collective in chunks (NVIDIA/nccl at NCCL 2.30.7, read, not copied):
#   src/transport/nvls.cc  ncclNvlsTuning: the CTAs (runtime channels) NVLS runs, 16 on Hopper
#                          (NVLS_NCHANNELS_SM90), 24 on one Blackwell node (NVLS_NCHANNELS_SM100_NVL), 32
#                          across Blackwell nodes (NVLS_NCHANNELS_SM100) unless ncclNvlsTreeSm100Tuning
#                          changes it; NCCL_NVLS_CHUNKSIZE 128 KiB; NVLS_TREE's chunk at most 64 KiB from 4
#                          nodes (treeMaxChunkSize's fallback).
#   src/enqueue.cc         scheduleCollTasksToPlan: one collective's bytes split evenly over the CTAs
#                          (contiguous blocks); calcCollChunking, called per CTA: the chunk shrinks when a
#                          CTA's bytes are few per head (64/8/2 x heads x chunk for NVLS, 32/16/4/1 for
#                          NVLS_TREE); the chunk starts at the Simple step, DEFAULT_BUFFSIZE 4 MiB / NCCL_STEPS 8.
#   src/device/all_reduce.h, reduce_scatter.h, all_gather.h  the NVLS kernels: per CTA, warp groups a
#                          chunk passes through in turn (AllReduce: scatter into the NVLS buffer, the head's
#                          multimem reduce + multicast store, gather out; ReduceScatter: scatter, reduce;
#                          AllGather: multicast store, gather); each loop gives every head one chunk; the
#                          last, partial loop gives each head ceil(rest / heads) aligned up to 16 KiB (one
#                          node; 16 bytes for NVLS_TREE), so the first heads carry it.
#   src/graph/connect.cc   NVLS_TREE: CTA c runs tree c % 2 of NCCL's double binary tree over the nodes
#                          (trees.cc), whose reduce warps send a chunk up and bcast warps bring it down.
NVLS_CTAS: dict[str, int] = {"hopper": 16, "blackwell": 24}  # one node
NVLS_CTAS_MULTI_NODE: dict[str, int] = {"hopper": 16, "blackwell": 32}
NVLS_CHUNK_BYTES = 128 * 1024  # NCCL_NVLS_CHUNKSIZE's default
SIMPLE_STEP_BYTES = (1 << 22) // 8  # DEFAULT_BUFFSIZE / NCCL_STEPS: where calcCollChunking's chunk starts
NVLS_LAST_ALIGN: dict[str, int] = {"nvls": 16384, "nvls_tree": 16}  # bytes, the partial loop's chunk
NVLS_STAGES: dict[str, int] = {"all_reduce": 3, "reduce_scatter": 2, "all_gather": 2}  # one node
# scheduleCollTasksToPlan's cell, the least a CTA is given: MinTrafficPerChannel 32 KiB over the traffic per
# byte (AllReduce 2; ReduceScatter/AllGather the ranks, per rank's bytes: 32 KiB of the whole buffer).
NVLS_MIN_CTA_BYTES: dict[str, int] = {"all_reduce": 16384, "reduce_scatter": 32768, "all_gather": 32768}


@dataclass(frozen=True)
class NvlsRuntime:
    """How NCCL runs an NVLS collective: CTAs, chunk bytes per head and step, and warp-group stages a chunk
    passes through on its way (fill and drain of the pipeline)."""

    ctas: int
    chunk: int
    stages: int


def nvls_cta_bytes(kind: str, nbytes: float, ctas: int) -> float:
    """The bytes of the fullest CTA: an even share, but at least one cell (or the whole buffer)."""
    return max(nbytes / ctas, min(float(nbytes), NVLS_MIN_CTA_BYTES[kind]))


def nvls_tree_depth(nodes: int) -> int:
    """Levels below the root of NCCL's double binary tree over `nodes` (the deeper of its two trees)."""
    from xsim.netmodels.algorithms import in_order_tree, tree_levels

    if nodes < 2:
        return 0
    return max(max(tree_levels(in_order_tree(nodes, r))[1]) for r in (True, False))


def nvls_runtime(g: NvlsGraph, kind: str, nbytes: float) -> NvlsRuntime:
    """The CTAs, chunk and pipeline stages NCCL runs an NVLS collective of `nbytes` (the whole buffer) with.

    NVLS_TREE's stages: scatter, the leaf head's reduce and send up, one reduce per tree level above it to
    the root, the root's reduce and multicast, one receive-and-multicast per level back down, gather:
    3 + 2 x depth. Blackwell across nodes follows ncclNvlsTreeSm100Tuning with the GPUs and NICs behind one
    PCIe switch (PATH_PXB, as on DGX systems).
    """
    tree = g.algorithm == "nvls_tree"
    ctas = (NVLS_CTAS_MULTI_NODE if tree else NVLS_CTAS)[g.arch]
    chunk = NVLS_CHUNK_BYTES
    tree_max = 65536 if g.nodes >= 4 else chunk
    if tree and g.arch == "blackwell":
        nic, ppn = g.nic_gbps, g.local
        if g.nodes == 2 and nic >= 48.0:
            ctas, tree_max = 32, 128 * 1024
            if ppn <= 4:
                chunk = tree_max = 256 * 1024
            elif ppn >= 16 or (ppn <= 8 and nic < 96.0):
                tree_max = 65536
        elif nic >= 96.0:
            if ppn <= 8:
                ctas, chunk, tree_max = 24, 256 * 1024, 256 * 1024
            else:
                ctas, tree_max = 32, (128 * 1024 if ppn < 32 else 65536)
        elif nic >= 48.0:
            ctas, tree_max = 24, 65536
    per_cta = nvls_cta_bytes(kind, nbytes, ctas)
    heads = g.channels
    if tree:
        c = min(chunk, tree_max)
        for times, floor in ((32, 262144), (16, 131072), (4, 65536), (1, 32768)):
            if per_cta < times * heads * c and c > floor:
                c = floor
        stages = 3 + 2 * nvls_tree_depth(g.nodes)
    else:
        c = min(SIMPLE_STEP_BYTES, chunk)
        for times, floor in ((64, 65536), (8, 32768), (2, 16384)):
            if per_cta < times * heads * c and c > floor:
                c = floor
        stages = NVLS_STAGES[kind]
    return NvlsRuntime(ctas, c, stages)


def nvls_pipeline_factor(g: NvlsGraph, kind: str, nbytes: float) -> float:
    """How much longer than its bandwidth time an NVLS collective takes as its chunks pipeline: >= 1.

    Per CTA, each head's chunks stream through the kernel's warp groups one after another; in the steady
    state every group keeps the bottleneck's pace, c / r for a chunk of c bytes at the per-head rate r.
    With n full loops and a partial one whose largest per-head chunk is m, a CTA's heads need
    (n c + m) / r, plus (stages - 1) x c1 / r for the first chunk (c1) to reach the last group and the
    last to leave the first: the pipeline's fill and drain. Perfectly balanced, without fill, the CTA's
    bytes / heads would take (bytes / heads) / r, NCCL's bandwidth time; the factor is the ratio. A CTA
    holds at least one cell (NVLS_MIN_CTA_BYTES), so tiny collectives run on fewer, fuller CTAs.
    """
    rt = nvls_runtime(g, kind, nbytes)
    heads = g.channels
    balanced = nbytes / rt.ctas
    if balanced <= 0:
        return 1.0
    per_cta = nvls_cta_bytes(kind, nbytes, rt.ctas)
    loop = heads * rt.chunk
    full = int(per_cta // loop)
    rest = per_cta - full * loop
    align = NVLS_LAST_ALIGN[g.algorithm]
    last = min(math.ceil(math.ceil(rest / heads) / align) * align, rest) if rest > 0 else 0.0
    first = rt.chunk if full else last
    return (full * rt.chunk + last + (rt.stages - 1) * first) / (balanced / heads)


def predicted_nvls_ns(g: NvlsGraph, kind: str, p: int, size: float, bw_ns: float | None = None) -> float:
    """NCCL's predicted time of an NVLS / NVLS_TREE collective (ns): latency + bytes / bandwidth, with the
    tree correction factor NCCL applies to NVLS_TREE on Blackwell x86 hosts. `bw_ns`: the bandwidth time
    to use instead of NCCL's (the schedule's on this fabric, as the ring's and tree's are)."""
    intra, inter = nvls_parts_gbps(g, kind, p)
    bw = min(intra, inter)
    if bw_ns is not None and bw_ns > 0:
        bw = nvls_bytes(kind, size, p) / bw_ns
    if g.algorithm == "nvls_tree" and g.arch == "blackwell":
        log_size = max(int(size) >> 6, 1).bit_length() - 1
        if log_size < 23:
            bw *= TREE_CORRECTION["Simple"][log_size]
        elif log_size == 23:
            bw *= 0.9  # the 24th entry of NCCL's Simple row, which only NVLS_TREE reads
    return nvls_latency_us(g, p / g.nodes) * 1e3 + nvls_bytes(kind, size, p) / bw


def nvls_group_graph(topology: Topology, ranks: tuple[int, ...]) -> NvlsGraph | None:
    """The NVLS graph NCCL builds for a group, or None where NVLS does not run: GPUs before Hopper or mixed,
    a GPU not on an NVSwitch, under 2 or unequal GPUs per node, or a graph of under 2 channels."""
    c = topology._cache.setdefault("nvls", {})
    if ranks in c:
        return c[ranks]
    g = None
    arch = group_arch(topology, ranks)
    hosts = topology.hosts_of(ranks)
    by_host: dict[str, list[int]] = {}
    for r, h in zip(ranks, hosts, strict=True):
        by_host.setdefault(h, []).append(r)
    counts = {len(m) for m in by_host.values()}
    if arch in NVLS_EFFICIENCY and len(counts) == 1:
        graph, index = topology.graph, topology._cache["index"]
        bw = effective_link_bandwidth(topology)  # bytes/ns, i.e. GB/s
        nvlink, nic, heads = float("inf"), float("inf"), len(ranks)
        for members in by_host.values():
            nics: set = set()
            for r in members:
                dev = topology.rank_nodes[r]
                hubs = [v for v in graph.successors(dev) if str(v).endswith("nvswitch")]
                if not hubs:
                    nvlink = 0.0
                    break
                nvlink = min(nvlink, float(bw[index[(dev, hubs[0])]]), float(bw[index[(hubs[0], dev)]]))
                for v in graph.successors(dev):
                    if graph.nodes[v].get("kind") == "nic":
                        nics.add(v)
                        up = [
                            float(bw[index[(v, w)]])
                            for w in graph.successors(v)
                            if graph.nodes[w].get("kind") == "switch"
                        ]
                        nic = min(nic, float(bw[index[(dev, v)]]), *up)
            heads = min(heads, len(nics))
        if nvlink > 0:
            g = nvls_graph(arch, counts.pop(), len(by_host), nvlink, nic, heads)
    c[ranks] = g
    return g


def nvls_schedule(topology: Topology, ranks: tuple[int, ...], kind: str, size: float, g: NvlsGraph):
    """An NVLS collective as one stage of transfers that load the links as NCCL's model says it runs.

    In-switch reduction and multicast end in the NVSwitch, which transfers between group positions cannot
    express; so each GPU sends to every other GPU of its node (its NVSwitch links) and, for NVLS_TREE, to its
    rail peer on the next node (its NIC), sized so that each part alone takes NCCL's bandwidth time of
    that part (`nvls_parts_gbps`) on the links it shares, and every transfer pays NCCL's NVLS latency. In the
    analytical model the collective then takes NCCL's predicted time (plus route latency); in the flow model
    the same transfers share NVLink and NICs with other traffic.
    """
    from xsim.netmodels.algorithms import Schedule, Stage

    p = len(ranks)
    hosts = topology.hosts_of(ranks)
    # A GPU's channel across nodes: its place among the group's GPUs on its node (the c-th head of every
    # node serves channel c), whichever GPUs of the node the group holds.
    seen: dict[str, int] = {}
    rail = []
    for h in hosts:
        rail.append(seen.get(h, 0))
        seen[h] = rail[-1] + 1
    pairs = [(a, b) for a in range(p) for b in range(p) if a != b and hosts[a] == hosts[b]]
    # Across nodes each channel's head passes to the same channel's head on the next node (nodes in group
    # order): one transfer per NIC and direction, as a tree's neighbours are few, not every node.
    order = list(dict.fromkeys(hosts))
    where = {(hosts[a], rail[a]): a for a in range(p)}
    inter = []
    if len(order) > 1:
        nxt = {h: order[(i + 1) % len(order)] for i, h in enumerate(order)}
        inter = [(a, where[(nxt[hosts[a]], rail[a])]) for a in range(p) if (nxt[hosts[a]], rail[a]) in where]
    intra_gbps, inter_gbps = nvls_parts_gbps(g, kind, p)
    nbytes = nvls_bytes(kind, size, p)
    bw = effective_link_bandwidth(topology)
    routes = [topology.route(ranks[a], ranks[b]).links for a, b in pairs + inter]
    used = np.bincount([li for links in routes for li in links], minlength=len(topology.links))
    # Sized on the GPUs' own links (NVSwitch ports, PCIe, NIC ports), not on links between switches: NCCL's
    # figure is the endpoints', and a fabric slower than its NICs (oversubscribed uplinks) must slow NVLS
    # down, as it does every other schedule, rather than shrink its bytes.
    kinds = topology.graph.nodes
    own = np.array(
        [kinds[u].get("kind") != "switch" or kinds[v].get("kind") != "switch" for u, v in topology.links]
    )
    sizes = []
    for k, links in enumerate(routes):
        x = nbytes / (intra_gbps if k < len(pairs) else inter_gbps)
        idx = np.array([li for li in links if own[li]], dtype=np.int64)
        sizes.append(x * float((bw[idx] / used[idx]).min()) if len(idx) else 0.0)
    src = np.array([a for a, _ in pairs + inter], dtype=np.int64)
    dst = np.array([b for _, b in pairs + inter], dtype=np.int64)
    # NCCL's latency, plus the chunk pipeline's fill and drain and its last loop's imbalance
    # (nvls_pipeline_factor) at NCCL's bandwidth: time in which the links wait, not bytes they carry.
    fill = (nvls_pipeline_factor(g, kind, nbytes) - 1.0) * nbytes / min(intra_gbps, inter_gbps)
    lat = np.full(len(src), nvls_latency_us(g, p / g.nodes) * 1e3 + fill)
    # reduce=False: the NVSwitch reduces (and, across nodes, the heads reduce what the tree brings in at
    # the pace of the network), so the GPUs' reduction bandwidth option does not apply.
    stage = Stage(src, dst, np.array(sizes), False, 1, False, False, lat)
    return Schedule(kind, g.algorithm, p, ((stage,),), shared=True)


# ---------------------------------------------------------------------------------------------------------
# PAT ("Parallel Aggregated Trees", NCCL 2.23+) for ReduceScatter and AllGather with one GPU per node. Facts
# from NVIDIA/nccl at NCCL 2.30.7 (read, not copied): src/graph/tuning.cc ncclPatEnable (default on where
# every rank is on its own node, with host networking), its model (the tree graph's bus bandwidth x 0.75,
# not converted to algorithm bandwidth for ReduceScatter/AllGather; latency baseLatencies PAT 8.0 us +
# log2(nodes) x the network latency / 3.5 + 2.8 us per rank, the network latency being the tree's Simple
# 14 us with one GPU per node), Simple protocol only; src/init.cc: PAT's graph is the tree graph.
PAT_BASE_US = 8.0
PAT_PER_RANK_US = 2.8
PAT_LOG_DIVISOR = 3.5
PAT_BW_SHARE = 0.75
PAT_KINDS = ("reduce_scatter", "all_gather")


def pat_applies(kind: str, p: int, nodes: int) -> bool:
    """Whether NCCL's PAT is a candidate: ReduceScatter/AllGather of 2 or more ranks, one per node."""
    return kind in PAT_KINDS and p > 1 and nodes == p


def pat_latency_us(p: int) -> float:
    """NCCL's PAT latency (us) for p ranks on p nodes."""
    log2n = int(p).bit_length() - 1
    return PAT_BASE_US + log2n * TREE_PROTOCOLS["Simple"].net_step_us / PAT_LOG_DIVISOR + PAT_PER_RANK_US * p


def pat_wire_factor(p: int) -> float:
    """PAT's bandwidth time over the ring's: NCCL divides the whole buffer by 0.75 x the bus bandwidth, where
    the ring moves (p - 1)/p of it at the bus bandwidth. With one GPU per node the tree graph and the ring
    graph both run at the node's NIC, so the ring's schedule gives the bus bandwidth."""
    return p / ((p - 1) * PAT_BW_SHARE)


def predicted_pat_ns(p: int, ring_bw_ns: float) -> float:
    """NCCL's predicted PAT time (ns) from the Simple ring's bandwidth time on this fabric."""
    return pat_latency_us(p) * 1e3 + ring_bw_ns * pat_wire_factor(p)


def pat_schedule(ring):
    """PAT timed as NCCL's model says on the ring's transfers: each rank's bytes x `pat_wire_factor` (PAT
    moves the ring's bytes per NIC; its aggregated trees are not expressed), NCCL's PAT latency once, on
    each channel's first step."""
    from xsim.netmodels.algorithms import Schedule, Stage

    factor = pat_wire_factor(ring.p)
    lat = pat_latency_us(ring.p) * 1e3
    channels = []
    for channel in ring.channels:
        stages = []
        for k, st in enumerate(channel):
            wire = st.nbytes * factor
            if k == 0:
                first = np.full(len(st.src), lat)
                stages.append(Stage(st.src, st.dst, wire, st.reduce, 1, st.perm, st.local, first, st.first))
                if st.repeat > 1:
                    stages.append(
                        Stage(
                            st.src, st.dst, wire, st.reduce, st.repeat - 1, st.perm, st.local, None, st.first
                        )
                    )
            else:
                stages.append(
                    Stage(st.src, st.dst, wire, st.reduce, st.repeat, st.perm, st.local, None, st.first)
                )
        channels.append(tuple(stages))
    return Schedule(ring.kind, "pat", ring.p, tuple(channels), ring.shared)
