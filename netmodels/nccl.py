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

from dataclasses import dataclass

import numpy as np

from netmodels.topology import GPU, Topology

# Per-NVLink bandwidth NCCL assumes (GB/s, NVIDIA/nccl src/graph/topo.h) / line rate per link and
# direction (GB/s, NVIDIA A100/H100/B200 datasheets).
NVLINK_SIMPLE_EFFICIENCY: dict[str, float] = {
    "A100-40GB": 20.0 / 25.0,
    "A100-80GB": 20.0 / 25.0,
    "H100": 20.6 / 25.0,
    "H200": 20.6 / 25.0,
    "B200": 40.1 / 50.0,
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
    from netmodels.errors import TopologyError
    from netmodels.presets import canonical_gpu

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
# Protocols and NCCL's choice among them, for rings (NVIDIA/nccl src/graph/tuning.cc at commit b6475625,
# NCCL 2.20.3: `baseLat`, `hwLat`, the "model refinements" of ncclTopoTuneModel). Facts, our own code.


@dataclass(frozen=True)
class Protocol:
    """One NCCL protocol on a ring: latencies (us) and the share of Simple's bandwidth it reaches."""

    name: str
    base_us: float  # once per collective (tuning.cc baseLat, Ring row)
    nvlink_step_us: float  # per ring step over NVLink (hwLat NVLINK, Ring)
    net_step_us: float  # per ring step over the network (hwLat NET, Ring)
    net_overhead_us: float  # floor of an intra-node step once the ring spans nodes (getNetOverhead x1/x3)


PROTOCOLS: dict[str, Protocol] = {
    "LL": Protocol("LL", 6.6, 0.6, 2.7, 1.0),
    "LL128": Protocol("LL128", 14.0, 1.9, 4.0, 1.0),
    # Simple's net overhead is 3x the 1 us of an x86 host (getNetOverhead, "if Simple netOverhead *= 3").
    "Simple": Protocol("Simple", 8.4, 3.4, 14.0, 3.0),
}
PROTOCOL_NAMES = tuple(PROTOCOLS)


def bandwidth_factor(protocol: str, kind: str, nodes: int, ppn: float) -> float:
    """Share of the Simple protocol's ring bandwidth a protocol reaches (tuning.cc's ring refinements).

    LL moves 8 bytes of data per 16-byte line: 1/4 of Simple's bus bandwidth on AllReduce or across nodes,
    1/3 otherwise; LL128 120 of 128 bytes, 0.92 (0.7 with one GPU per node).
    """
    if protocol == "LL":
        return 0.25 if nodes > 1 or kind == "all_reduce" else 1.0 / 3.0
    if protocol == "LL128":
        return 0.92 if ppn >= 2 else 0.7
    return 1.0


def ring_steps(kind: str, p: int, nodes: int) -> tuple[int, int]:
    """(ring steps, of which over the network) as NCCL's tuning model counts them."""
    if kind == "all_reduce":
        return 2 * (p - 1), (2 * nodes if nodes > 1 else 0)
    return p - 1, nodes - 1


def step_latencies_us(protocol: str, nodes: int) -> tuple[float, float]:
    """(intra-node, network) latency of one ring step in us."""
    pr = PROTOCOLS[protocol]
    intra = max(pr.nvlink_step_us, pr.net_overhead_us) if nodes > 1 else pr.nvlink_step_us
    return intra, pr.net_step_us


def predicted_ns(protocol: str, kind: str, p: int, nodes: int, simple_bw_ns: float) -> float:
    """NCCL's predicted time of a ring collective: latency + Simple's bandwidth time / the protocol's share."""
    steps, inter = ring_steps(kind, p, nodes)
    intra_us, net_us = step_latencies_us(protocol, nodes)
    lat_us = PROTOCOLS[protocol].base_us + (steps - inter) * intra_us + inter * net_us
    return lat_us * 1e3 + simple_bw_ns / bandwidth_factor(protocol, kind, nodes, p / nodes)


def nccl_protocol_applies(kind: str, algorithm: str) -> bool:
    """Whether NCCL's protocols time this collective here: ring AR/RS/AG, tree AllReduce."""
    if algorithm == "double_binary_tree":
        return kind == "all_reduce"
    return algorithm == "ring" and kind in ("all_reduce", "reduce_scatter", "all_gather")


def choose_protocol(kind: str, p: int, nodes: int, simple_bw_ns: float) -> str:
    """The protocol NCCL picks: the fastest predicted (ties to the earlier of LL, LL128, Simple)."""
    return min(PROTOCOL_NAMES, key=lambda pr: predicted_ns(pr, kind, p, nodes, simple_bw_ns))


def split_protocol(algorithm: str | None) -> tuple[str | None, str | None]:
    """`ring/LL128` -> ("ring", "LL128"); a name without a protocol -> (name, None)."""
    if algorithm is None or "/" not in str(algorithm):
        return algorithm, None
    base, _, proto = str(algorithm).partition("/")
    names = {n.lower(): n for n in PROTOCOL_NAMES}
    if proto.lower() not in names:
        from netmodels.errors import AlgorithmError

        raise AlgorithmError(
            f"unknown NCCL protocol {proto!r} in {algorithm!r} (known: {', '.join(PROTOCOL_NAMES)})"
        )
    return base, names[proto.lower()]


# NCCL's tree (AllReduce only), tuning.cc at b6475625 (NCCL 2.20.3): baseLat Tree row (LL, LL128, Simple),
# hwLat NVLINK and NET Tree rows; latency 2 x ((ranks per node - 1) intra + log2(nodes) net).
TREE_PROTOCOLS: dict[str, Protocol] = {
    "LL": Protocol("LL", 6.8, 0.6, 5.0, 0.0),
    "LL128": Protocol("LL128", 14.0, 1.25, 8.5, 0.0),
    "Simple": Protocol("Simple", 0.0, 28.0, 28.0, 0.0),
}
# ncclTopoGetAlgoTime's treeCorrectionFactor (same file): tree bandwidth x this, by protocol and
# log2(bytes / 64) for 64 B .. 256 MiB ("Trees are not perfectly sticking to the model for medium sizes").
TREE_CORRECTION: dict[str, tuple[float, ...]] = {
    "LL": (1, 1, 1, 1, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1, 1, 1, 1),
    "LL128": (1, 1, 1, 1, 1, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1, 1),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}  # fmt: skip


def tree_bandwidth_factor(protocol: str, nodes: int) -> float:
    """Share of the tree schedule's bandwidth a protocol reaches: 0.92 (Simple), LL /3.8, LL128 x 7/9 on one
    node or 120/128 across nodes (tuning.cc's tree refinements; its per-channel caps are not modelled)."""
    base = 0.92
    if protocol == "LL":
        return base / 3.8
    if protocol == "LL128":
        return base * (7.0 / 9.0 if nodes == 1 else 120.0 / 128.0)
    return base


def predicted_tree_ns(protocol: str, p: int, nodes: int, size: float, tree_bw_ns: float) -> float:
    """NCCL's predicted time of a tree AllReduce: latency + the tree's bandwidth time / share / correction."""
    pr = TREE_PROTOCOLS[protocol]
    log2n = max(int(nodes).bit_length() - 1, 0)
    lat_us = pr.base_us + 2 * ((p // nodes - 1) * pr.nvlink_step_us + log2n * pr.net_step_us)
    log_size = max(int(size) >> 6, 1).bit_length() - 1
    corr = TREE_CORRECTION[protocol][log_size] if log_size < 23 else 1.0
    return lat_us * 1e3 + tree_bw_ns / (tree_bandwidth_factor(protocol, nodes) * corr)


def predicted_ring_ns(
    protocol: str, kind: str, p: int, nodes: int, size: float, channels: int, ring_bw_ns: float
) -> float:
    """NCCL's predicted ring time, with ncclTopoGetAlgoTime's "plateau effect" (Simple AllReduce across
    nodes, at least 64 bytes per channel and rank: latency x 1.4 on Ampere and later)."""
    t = predicted_ns(protocol, kind, p, nodes, ring_bw_ns)
    if protocol == "Simple" and kind == "all_reduce" and nodes > 1 and size / (channels * p) >= 64:
        steps, inter = ring_steps(kind, p, nodes)
        intra_us, net_us = step_latencies_us(protocol, nodes)
        lat_us = PROTOCOLS[protocol].base_us + (steps - inter) * intra_us + inter * net_us
        t += 0.4 * lat_us * 1e3
    return t


def with_protocol(sched, protocol: str, hosts: list[str]):
    """The schedule as `protocol` runs it: bytes on the wire / bandwidth share, each transfer plus its step
    latency (network where it crosses hosts), each channel's first stage plus the base latency."""
    from netmodels.algorithms import Schedule, Stage

    nodes = len(set(hosts))
    if sched.algorithm == "double_binary_tree":
        factor = tree_bandwidth_factor(protocol, nodes)
        pr = TREE_PROTOCOLS[protocol]
        intra_us, net_us = pr.nvlink_step_us, pr.net_step_us
    else:
        factor = bandwidth_factor(protocol, sched.kind, nodes, sched.p / nodes)
        pr = PROTOCOLS[protocol]
        intra_us, net_us = step_latencies_us(protocol, nodes)
    ids: dict[str, int] = {}
    h = np.array([ids.setdefault(x, len(ids)) for x in hosts])
    base = pr.base_us * 1e3
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
