"""Build cluster topologies from a plain description (deployment.json's "cluster") or a compact spec string."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xsim.netmodels.digraph import DiGraph  # networkx.DiGraph's layout and order, without its import time
from xsim.netmodels.errors import NetworkModelError, TopologyError
from xsim.netmodels.inputs import read_text
from xsim.netmodels.presets import (
    SYSTEM_PRESETS,
    InterconnectPreset,
    canonical_gpu,
    interconnect,
    system_preset,
)
from xsim.netmodels.topology import (
    COLLECTIVE_MODES,
    GPU,
    MAX_LINKS,
    Topology,
    add_duplex,
    fully_connected_topology,
    multi_dim_topology,
    ring_topology,
    switch_topology,
)
from xsim.netmodels.units import parse_bandwidth, parse_time_ns
from xsim.traces.limits import limit

if TYPE_CHECKING:
    from pathlib import Path

FABRICS = ("switch", "leaf_spine", "fat_tree", "rail")
# The keys each part of a cluster description may hold (docs/netmodels.md); anything else is a typo that
# would otherwise fall back to a default silently.
CLUSTER_KEYS = ("name", "preset", "nodes", "fabric", "links", "collectives", "gpu_types")
MULTI_CLUSTER_KEYS = ("name", "clusters", "inter_cluster", "links", "collectives")
NODE_KEYS = (
    "name", "gpu", "ranks", "count", "scale_up", "nic", "scale_up_bandwidth", "scale_up_latency",
    "pcie_bandwidth", "pcie_latency", "nic_bandwidth", "nic_latency",
)  # fmt: skip
FABRIC_KEYS = ("kind", "link_latency", "oversubscription", "link_bandwidth", "nics_per_leaf", "spines", "k")
LINK_KEYS = ("src", "dst", "bandwidth", "latency", "directed")


# A cluster GPU has at least 6 directed links (to its NVSwitch/PCIe switch, to its NIC, NIC to fabric);
# netmodels.topology.MAX_LINKS bounds the graph.
MAX_CLUSTER_RANKS = MAX_LINKS // 6


def _known_keys(obj: Mapping, allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(str(k) for k in obj if k not in allowed)
    if unknown:
        raise TopologyError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(allowed)})")


def _bw(value: Any, what: str) -> float:
    try:
        return parse_bandwidth(value)
    except NetworkModelError as exc:
        raise TopologyError(f"{what}: {exc}") from None


def _lat(value: Any, what: str) -> float:
    try:
        return parse_time_ns(value)
    except NetworkModelError as exc:
        raise TopologyError(f"{what}: {exc}") from None


# A topology may hold more GPUs than the run uses (a job on part of a cluster), but the unused part is
# built and routed for nothing: `switch:1000000` for 2 ranks took 39 s to build. Up to this many ranks, or
# 8x the run's ranks when that is more, a topology is accepted; XSIM_MAX_TOPOLOGY_RANKS sets the cap.
SPARE_RANKS_FLOOR = 4096
SPARE_RANKS_FACTOR = 8


def check_topology_size(have: int, need: int, what: str) -> None:
    """Refuse, before building, a topology of HAVE ranks far larger than the NEED ranks of the run."""
    if have * 2 > MAX_LINKS:
        return  # past what xsim builds at all: the builder refuses it at once, naming its links
    cap = limit(
        "XSIM_MAX_TOPOLOGY_RANKS", max(SPARE_RANKS_FLOOR, SPARE_RANKS_FACTOR * need), NetworkModelError
    )
    if have > cap and have > need:
        raise TopologyError(
            f"{what}: {have:,} ranks for a run of {need:,}: over the {cap:,} built "
            f"(max of {SPARE_RANKS_FLOOR:,} and {SPARE_RANKS_FACTOR}x the run; XSIM_MAX_TOPOLOGY_RANKS raises it)"
        )


def cluster_ranks(desc: Any) -> int | None:
    """Ranks a cluster description (or its {"topology": spec}) holds, counted without building; None when
    the description is malformed (building it then gives the error)."""
    try:
        if not isinstance(desc, Mapping):
            return None
        if set(desc) == {"topology"}:
            return topology_ranks(desc["topology"])
        if "system" in desc:
            return len(desc["gpus"]) if isinstance(desc.get("gpus"), list) else None
        subs = desc["clusters"] if "clusters" in desc else [desc]
        total = 0
        for sub in subs:
            for node in sub["nodes"]:
                ranks = node.get("ranks")
                total += len(ranks) if isinstance(ranks, list) else int(node["count"])
        return total
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def topology_ranks(spec: Any) -> int | None:
    """Ranks a compact topology spec names, counted without building; None when it does not parse."""
    if not isinstance(spec, str) or ":" not in spec:
        return None
    kind, _, rest = spec.partition(":")
    kind = kind.strip().lower()
    try:
        if kind in ("ring", "switch", "fc", "fully_connected"):
            return int(rest.split(":")[0])
        if kind == "nodes":
            return cluster_ranks(_nodes_desc(rest))
        if kind in SYSTEM_PRESETS:
            return int(rest.split(":")[0]) * system_preset(kind).gpus_per_node
        if kind == "cluster":
            return cluster_ranks(load_cluster_json(rest))
    except (ValueError, NetworkModelError):
        return None
    return None


def build_cluster(desc: Mapping, need: int | None = None) -> Topology:
    """Build a cluster Topology from a description with "preset", "nodes", "fabric" and optional "links".

    With NEED (the ranks of the run), a description far larger than the run is refused before building.
    """
    if not isinstance(desc, Mapping):
        raise TopologyError(f"cluster description must be a mapping, got {type(desc).__name__}")
    if need is not None:
        have = cluster_ranks(desc)
        if have is not None:
            shown = desc["topology"] if set(desc) == {"topology"} else "cluster description"
            check_topology_size(have, need, str(shown))
    if set(desc) == {"topology"}:
        # A deployment spec's `cluster: "<topology spec>"` (tracegen keeps it as {"topology": ...}).
        return topology_from_spec(desc["topology"])
    if "system" in desc:
        # A deployment spec's `cluster: dgx-a100`, kept as {"system": ..., "gpus": [one type per rank]}.
        _known_keys(desc, ("system", "gpus"), "cluster description")
        gpus = desc.get("gpus")
        if not isinstance(gpus, list) or not gpus:
            raise TopologyError('a "system" cluster needs "gpus": one GPU type per rank')
        return build_cluster(system_cluster(str(desc["system"]), len(gpus), gpus))
    if "clusters" in desc:
        _known_keys(desc, MULTI_CLUSTER_KEYS, "cluster description")
        return _build_multi_cluster(desc)
    _known_keys(desc, CLUSTER_KEYS, "cluster description")
    g = DiGraph()
    placed: dict[int, tuple[str, str]] = {}
    nics = _add_nodes(g, desc, "", placed)
    _add_fabric(g, desc.get("fabric") or {"kind": "switch"}, nics, prefix="")
    _apply_overrides(g, desc.get("links") or [])
    return _finish(str(desc.get("name", "cluster")), g, placed, desc.get("collectives", "ring"))


def _finish(name: str, g: DiGraph, placed: dict[int, tuple[str, str]], collectives: Any = "ring") -> Topology:
    n = len(placed)
    if sorted(placed) != list(range(n)):
        missing = sorted(set(range(max(placed) + 1)) - set(placed))
        raise TopologyError(f"ranks must be 0..{n - 1} with none missing; missing {missing[:5]}")
    if collectives not in COLLECTIVE_MODES:
        raise TopologyError(
            f'cluster "collectives" must be one of {", ".join(COLLECTIVE_MODES)}, got {collectives!r}'
        )
    hosts = tuple(placed[r][1] for r in range(n))
    return Topology(name, g, tuple(placed[r][0] for r in range(n)), hosts, collectives)


Nic = tuple[str, int, float, float]  # (NIC device, local index, bandwidth, latency)


@dataclass(frozen=True)
class _NodeHardware:
    """One node of a cluster description: its name, its mapping and the interconnect of each local GPU."""

    name: str
    node: Mapping
    hws: list[InterconnectPreset]

    def param(self, key: str, attr: str, j: int, parse: Callable[[Any, str], float], what: str) -> float:
        """The node's `key` when given, else local GPU j's preset `attr`, parsed."""
        return parse(self.node.get(key, getattr(self.hws[j], attr)), f"node {self.name} {what}")

    def nic(self, dev: str, j: int) -> Nic:
        """NIC device dev with local GPU j's NIC bandwidth and latency."""
        bw = self.param("nic_bandwidth", "nic_bandwidth", j, _bw, "nic_bandwidth")
        return (dev, j, bw, self.param("nic_latency", "nic_latency_ns", j, _lat, "nic_latency"))


def _add_nodes(g: DiGraph, desc: Mapping, prefix: str, placed: dict[int, tuple[str, str]]) -> list[Nic]:
    preset = str(desc.get("preset", "table5"))
    nodes = desc.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise TopologyError('cluster description needs a non-empty "nodes" list')
    nics: list[Nic] = []
    next_rank = max(placed) + 1 if placed else 0
    for i, node in enumerate(nodes):
        if not isinstance(node, Mapping):
            raise TopologyError(f"node #{i} must be a mapping")
        name = prefix + str(node.get("name", f"node{i}"))
        _known_keys(node, NODE_KEYS, f"node {name!r}")
        if g.has_node(f"{name}/gpu0"):
            raise TopologyError(f"node name {name!r} is used twice")
        if "gpu" not in node:
            raise TopologyError(f'node {name!r} has no "gpu" type')
        ranks = _node_ranks(node, name, next_rank)
        next_rank = max(next_rank, max(ranks) + 1)
        hw = _NodeHardware(name, node, _node_gpus(desc, node, name, len(ranks), preset))
        nics += _add_node(g, hw, ranks, placed)
    return nics


def _node_ranks(node: Mapping, name: str, next_rank: int) -> list[int]:
    """The node's ranks: its "ranks" list, or "count" ranks from next_rank on."""
    ranks = node.get("ranks")
    if ranks is None:
        count = node.get("count")
        if not isinstance(count, int) or count < 1:
            raise TopologyError(f'node {name!r} needs "ranks" (list) or "count" (positive integer)')
        if next_rank + count > MAX_CLUSTER_RANKS:
            raise TopologyError(
                f'node {name!r}: "count" {count:,} is over the {MAX_CLUSTER_RANKS:,} GPUs xsim builds'
            )
        ranks = list(range(next_rank, next_rank + count))
    if not isinstance(ranks, list) or not ranks or not all(isinstance(r, int) and r >= 0 for r in ranks):
        raise TopologyError(f'node {name!r}: "ranks" must be a non-empty list of non-negative integers')
    return ranks


def _node_gpus(desc: Mapping, node: Mapping, name: str, n: int, preset: str) -> list[InterconnectPreset]:
    """The interconnect of each of the node's n GPUs, under the preset or the description's gpu_types."""
    # "gpu" is one type for the whole node, or a list with one type per rank (mixed nodes such as the
    # paper's 2xA100 + 4xH100 testbed servers).
    gpus = node["gpu"] if isinstance(node["gpu"], list) else [node["gpu"]] * n
    if len(gpus) != n:
        raise TopologyError(f'node {name!r}: "gpu" lists {len(gpus)} types for {n} ranks')
    types = desc.get("gpu_types") or {}  # user-defined GPUs (netmodels.presets.defined_interconnect)
    if not isinstance(types, Mapping):
        raise TopologyError('cluster "gpu_types" must map a GPU name to its interconnect')
    return [interconnect(preset, g if str(g) in types else canonical_gpu(g), types) for g in gpus]


def _add_node(
    g: DiGraph, hw: _NodeHardware, ranks: list[int], placed: dict[int, tuple[str, str]]
) -> list[Nic]:
    """The node's GPUs, scale-up hub and NICs into g (ranks placed on its GPUs); its NICs."""
    name, node = hw.name, hw.node
    scale_up = node.get("scale_up", "nvlink")
    nic_mode = node.get("nic", "per_gpu")
    if scale_up not in ("nvlink", "pcie"):
        raise TopologyError(f"node {name!r}: scale_up must be nvlink or pcie, got {scale_up!r}")
    if nic_mode not in ("per_gpu", "per_node"):
        raise TopologyError(f"node {name!r}: nic must be per_gpu or per_node, got {nic_mode!r}")
    nics: list[Nic] = []
    hub = f"{name}/nvswitch" if scale_up == "nvlink" else f"{name}/pcie"
    if len(ranks) > 1:
        g.add_node(hub, kind="switch")
    if nic_mode == "per_node":
        g.add_node(f"{name}/nic", kind="nic")
        nics.append(hw.nic(f"{name}/nic", 0))
    for j, r in enumerate(ranks):
        su_bw = hw.param("scale_up_bandwidth", "scale_up_bandwidth", j, _bw, "scale_up_bandwidth")
        su_lat = hw.param("scale_up_latency", "scale_up_latency_ns", j, _lat, "scale_up_latency")
        pcie_bw = hw.param("pcie_bandwidth", "pcie_bandwidth", j, _bw, "pcie_bandwidth")
        pcie_lat = hw.param("pcie_latency", "pcie_latency_ns", j, _lat, "pcie_latency")
        if r in placed:
            raise TopologyError(f"rank {r} is placed on both {placed[r][1]} and {name}")
        dev = f"{name}/gpu{j}"
        g.add_node(dev, kind=GPU, gpu=hw.hws[j].gpu, host=name, local_index=j)
        placed[r] = (dev, name)
        if len(ranks) > 1:
            # NVLink: one hop GPU->NVSwitch at the table's delay; PCIe: each crossing is half of the 2x delay.
            lat = su_lat if scale_up == "nvlink" else pcie_lat / 2
            bw = su_bw if scale_up == "nvlink" else pcie_bw
            add_duplex(g, dev, hub, bw, lat, "scaleup")
        if nic_mode == "per_gpu":
            nic = f"{name}/nic{j}"
            g.add_node(nic, kind="nic")
            nics.append(hw.nic(nic, j))
        else:
            nic = f"{name}/nic"
        add_duplex(g, dev, nic, pcie_bw, pcie_lat, "pcie")
    return nics


@dataclass(frozen=True)
class _Fabric:
    """What a fabric kind is built from: the graph, the NICs to attach, the switch names' prefix, and the
    fabric's switch-to-switch link bandwidth, latency and oversubscription."""

    g: DiGraph
    nics: list[Nic]
    prefix: str
    link_bw: float
    link_lat: float
    over: float


def _add_fabric(g: DiGraph, fabric: Mapping, nics: list[Nic], prefix: str) -> list[str]:
    if not isinstance(fabric, Mapping):
        raise TopologyError('"fabric" must be a mapping such as {"kind": "switch"}')
    _known_keys(fabric, FABRIC_KEYS, "fabric")
    kind = fabric.get("kind", "switch")
    # The paper's tables give no switch-to-switch latency; 0 unless the description sets one.
    link_lat = _lat(fabric.get("link_latency", 0), "fabric link_latency")
    over = fabric.get("oversubscription", 1)
    if not isinstance(over, int | float) or not over >= 1:
        raise TopologyError(f"fabric oversubscription must be a number >= 1, got {over!r}")
    # Switch-to-switch links default to the fastest NIC's speed: a non-blocking fabric unless oversubscribed.
    max_nic = max(bw for _, _, bw, _ in nics)
    link_bw = _bw(fabric.get("link_bandwidth", max_nic), "fabric link_bandwidth")
    build = _FABRIC_BUILDERS.get(kind)
    if build is None:
        raise TopologyError(f"unknown fabric kind {kind!r} (known: {', '.join(FABRICS)})")
    return build(_Fabric(g, nics, prefix, link_bw, link_lat, over), fabric)


def _switch_fabric(f: _Fabric, fabric: Mapping) -> list[str]:
    """One switch holding every NIC."""
    sw = f.prefix + "switch"
    f.g.add_node(sw, kind="switch")
    for nic, _, bw, lat in f.nics:
        add_duplex(f.g, nic, sw, bw, lat, "nic")
    return [sw]


def _rail_fabric(f: _Fabric, fabric: Mapping) -> list[str]:
    """A switch per local NIC index (rail), the rails joined by one spine."""
    g, prefix = f.g, f.prefix
    spine = prefix + "spine"
    g.add_node(spine, kind="switch")
    rails: dict[int, float] = {}
    for nic, j, bw, lat in f.nics:
        rail = f"{prefix}rail{j}"
        g.add_node(rail, kind="switch")
        add_duplex(g, nic, rail, bw, lat, "nic")
        rails[j] = rails.get(j, 0.0) + bw
    # Cross-rail traffic climbs to one spine; its links carry a whole rail's NIC bandwidth / oversubscription.
    for j, total in sorted(rails.items()):
        add_duplex(g, f"{prefix}rail{j}", spine, total / f.over, f.link_lat, "fabric")
    return [spine]


def _leaf_spine_fabric(f: _Fabric, fabric: Mapping) -> list[str]:
    """Leaves of nics_per_leaf NICs, each linked to every one of `spines` spines."""
    g, prefix = f.g, f.prefix
    # The shape has no natural default: both numbers must be given.
    per_leaf, spines = fabric.get("nics_per_leaf"), fabric.get("spines")
    for key, v in (("nics_per_leaf", per_leaf), ("spines", spines)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise TopologyError(f"leaf_spine {key} must be a positive integer, got {v!r}")
    spine_names = [f"{prefix}spine{j}" for j in range(spines)]
    for sp in spine_names:
        g.add_node(sp, kind="switch")
    # A leaf's uplinks together carry its NICs' bandwidth divided by the oversubscription ratio.
    up_bw = per_leaf * f.link_bw / spines / f.over
    for i, (nic, _, bw, lat) in enumerate(f.nics):
        leaf = f"{prefix}leaf{i // per_leaf}"
        if leaf not in g:
            g.add_node(leaf, kind="switch")
            for sp in spine_names:
                add_duplex(g, leaf, sp, up_bw, f.link_lat, "fabric")
        add_duplex(g, nic, leaf, bw, lat, "nic")
    return spine_names


def _fat_tree_fabric(f: _Fabric, fabric: Mapping) -> list[str]:
    """A k-ary fat tree: pods of k/2 edge and k/2 aggregation switches, (k/2)^2 cores."""
    g, prefix, nics = f.g, f.prefix, f.nics
    k = fabric.get("k")
    if not isinstance(k, int) or k < 2 or k % 2:
        raise TopologyError(f"fat_tree needs an even integer k >= 2, got {k!r}")
    half = k // 2
    if len(nics) > k**3 // 4:
        raise TopologyError(f"fat_tree k={k} holds {k**3 // 4} NICs, the cluster has {len(nics)}")
    pods = math.ceil(len(nics) / (half * half))
    up_bw = f.link_bw / f.over
    cores = [f"{prefix}core{c}" for c in range(half * half)]
    for c in cores:
        g.add_node(c, kind="switch")
    for p in range(pods):
        aggs = [f"{prefix}pod{p}/agg{a}" for a in range(half)]
        for a, agg in enumerate(aggs):
            g.add_node(agg, kind="switch")
            for c in range(half):
                add_duplex(g, agg, cores[a * half + c], up_bw, f.link_lat, "fabric")
        for e in range(half):
            edge = f"{prefix}pod{p}/edge{e}"
            g.add_node(edge, kind="switch")
            for agg in aggs:
                add_duplex(g, edge, agg, up_bw, f.link_lat, "fabric")
    for i, (nic, _, bw, lat) in enumerate(nics):
        p, e = divmod(i // half, half)
        add_duplex(g, nic, f"{prefix}pod{p}/edge{e}", bw, lat, "nic")
    return cores


_FABRIC_BUILDERS: dict[str, Callable[[_Fabric, Mapping], list[str]]] = {
    "switch": _switch_fabric,
    "rail": _rail_fabric,
    "leaf_spine": _leaf_spine_fabric,
    "fat_tree": _fat_tree_fabric,
}


def _apply_overrides(g: DiGraph, links: list) -> None:
    if not isinstance(links, list):
        raise TopologyError('"links" must be a list of {"src", "dst", "bandwidth"?, "latency"?}')
    for i, o in enumerate(links):
        if not isinstance(o, Mapping) or "src" not in o or "dst" not in o:
            raise TopologyError(f'link override #{i} needs "src" and "dst"')
        _known_keys(o, LINK_KEYS, f"link override #{i}")
        pairs = [(o["src"], o["dst"])] if o.get("directed") else [(o["src"], o["dst"]), (o["dst"], o["src"])]
        for u, v in pairs:
            if not g.has_edge(u, v):
                raise TopologyError(f"link override #{i}: no link {u} -> {v} in the cluster")
            if "bandwidth" in o:
                g[u][v]["bandwidth"] = _bw(o["bandwidth"], f"link override {u}->{v}")
            if "latency" in o:
                g[u][v]["latency_ns"] = _lat(o["latency"], f"link override {u}->{v}")


def _build_multi_cluster(desc: Mapping) -> Topology:
    clusters = desc["clusters"]
    if not isinstance(clusters, list) or len(clusters) < 2:
        raise TopologyError('"clusters" must list at least two cluster descriptions')
    inter = desc.get("inter_cluster")
    if not isinstance(inter, Mapping) or "bandwidth" not in inter or "latency" not in inter:
        raise TopologyError('"inter_cluster" needs "bandwidth" and "latency" for the links between clusters')
    _known_keys(inter, ("bandwidth", "latency"), "inter_cluster")
    bw = _bw(inter["bandwidth"], "inter_cluster bandwidth")
    lat = _lat(inter["latency"], "inter_cluster latency")
    g = DiGraph()
    g.add_node("wan", kind="switch")
    placed: dict[int, tuple[str, str]] = {}
    for c, sub in enumerate(clusters):
        if not isinstance(sub, Mapping):
            raise TopologyError(f"cluster #{c} must be a mapping")
        _known_keys(sub, CLUSTER_KEYS, f"cluster #{c}")
        prefix = f"{sub.get('name', f'c{c}')}/"
        if any(str(x).startswith(prefix) for x in g.nodes):
            raise TopologyError(f"cluster name {prefix[:-1]!r} is used twice")
        nics = _add_nodes(g, sub, prefix, placed)
        for t in _add_fabric(g, sub.get("fabric") or {"kind": "switch"}, nics, prefix):
            add_duplex(g, t, "wan", bw, lat, "inter_cluster")
    _apply_overrides(g, desc.get("links") or [])
    return _finish(str(desc.get("name", "clusters")), g, placed, desc.get("collectives", "ring"))


# ---------------------------------------------------------------------------------------------------------
# Compact spec strings for the command line.

SPEC_HELP = (
    "ring:N:BW:LAT | switch:N:BW:LAT | fc:N:BW:LAT | "
    "nodes:[K*]GPUxN[+GPUxM],...[:preset=table5|table6][:fabric=switch|leaf_spine|rail|fat_tree][:k=K][:scale_up=nvlink|pcie] | "
    "dgx-a100:NODES | dgx-h100:NODES[:fabric=rail|leaf_spine|fat_tree][:oversubscription=X]"
    "[:nics_per_leaf=N:spines=M][:k=K] | cluster:FILE.json | astra:NETWORK.yml"
)


def topology_from_spec(
    spec: str, need: int | None = None, gpu_types: Mapping[str, Any] | None = None
) -> Topology:
    """Build a Topology from a compact spec string (see SPEC_HELP and docs/netmodels.md); with NEED (the
    run's ranks), one far larger than the run is refused before building (check_topology_size).
    gpu_types: hypothetical GPUs a `nodes:` spec may name (netmodels.presets.defined_interconnect)."""
    if not isinstance(spec, str) or ":" not in spec:
        raise TopologyError(f"cannot parse topology {spec!r}; expected {SPEC_HELP}")
    if need is not None:
        have = topology_ranks(spec)
        if have is not None:
            check_topology_size(have, need, spec)
    kind, _, rest = spec.partition(":")
    kind = kind.strip().lower()
    if kind in ("ring", "switch", "fc", "fully_connected"):
        parts = rest.split(":")
        if len(parts) != 3:
            raise TopologyError(f"{kind} topology needs N:BW:LAT, e.g. {kind}:8:50GBps:500ns; got {spec!r}")
        try:
            n = int(parts[0])
        except ValueError:
            raise TopologyError(f"{kind}: rank count must be an integer, got {parts[0]!r}") from None
        bw = _bw(parts[1], f"{kind} bandwidth")
        lat = _lat(parts[2], f"{kind} latency")
        build = {"ring": ring_topology, "switch": switch_topology}.get(kind, fully_connected_topology)
        return build(n, bw, lat)
    if kind == "nodes":
        desc = _nodes_desc(rest)
        if gpu_types:
            desc["gpu_types"] = dict(gpu_types)
        return build_cluster(desc)
    if kind in SYSTEM_PRESETS:
        count, *opts = rest.split(":")
        try:
            nodes = int(count)
        except ValueError:
            raise TopologyError(f"{kind} needs a node count, e.g. {kind}:4; got {spec!r}") from None
        if nodes < 1 or nodes * system_preset(kind).gpus_per_node > MAX_CLUSTER_RANKS:
            raise TopologyError(f"{kind}: node count must be 1..{MAX_CLUSTER_RANKS // 8:,}, got {nodes}")
        fabric = _fabric_options(opts, kind)
        return build_cluster(system_cluster(kind, nodes * system_preset(kind).gpus_per_node, fabric=fabric))
    if kind == "cluster":
        return build_cluster(load_cluster_json(rest))
    if kind == "astra":
        from xsim.netmodels.astra import load_network_yml

        net = load_network_yml(rest)
        return multi_dim_topology(
            (d.topology_kind, d.npus, d.bytes_per_ns * 1e9, d.latency_ns) for d in net.dims
        )
    raise TopologyError(f"unknown topology kind {kind!r}; expected {SPEC_HELP}")


def _fabric_options(opts: list[str], what: str) -> dict:
    """`fabric=rail`, `oversubscription=2`, ... of a system preset's spec string as a fabric mapping."""
    fabric: dict[str, Any] = {"kind": "switch"}
    for opt in opts:
        key, eq, value = opt.partition("=")
        if not eq or key not in ("fabric", "k", "oversubscription", "nics_per_leaf", "spines"):
            raise TopologyError(
                f"{what} option {opt!r}: expected fabric=, k=, oversubscription=, nics_per_leaf= or spines="
            )
        if key == "fabric":
            fabric["kind"] = value
            continue
        try:
            fabric[key] = float(value) if key == "oversubscription" else int(value)
        except ValueError:
            raise TopologyError(f"{what} option {key} must be a number, got {value!r}") from None
    return fabric


def _nodes_desc(rest: str) -> dict:
    items, *opts = rest.split(":")
    desc: dict[str, Any] = {"preset": "table5", "nodes": [], "fabric": {"kind": "switch"}}
    node_opts: dict[str, str] = {}
    for opt in opts:
        key, eq, value = opt.partition("=")
        if not eq:
            raise TopologyError(f"nodes option {opt!r} must be key=value")
        if key == "preset":
            desc["preset"] = value
        elif key == "fabric":
            desc["fabric"]["kind"] = value
        elif key in ("k", "oversubscription", "nics_per_leaf", "spines"):
            try:
                desc["fabric"][key] = float(value) if key == "oversubscription" else int(value)
            except ValueError:
                raise TopologyError(f"nodes option {key} must be a number, got {value!r}") from None
        elif key in ("scale_up", "nic"):
            node_opts[key] = value
        else:
            raise TopologyError(
                f"unknown nodes option {key!r} "
                "(preset, fabric, k, oversubscription, nics_per_leaf, spines, scale_up, nic)"
            )
    rank = 0
    for item in items.split(","):
        m = re.fullmatch(r"\s*(?:(\d+)\*)?([A-Za-z0-9-]+x\d+(?:\+[A-Za-z0-9-]+x\d+)*)\s*", item)
        if not m:
            raise TopologyError(
                f"cannot parse node group {item!r}; expected [K*]GPUxN[+GPUxM] such as 2*H100x4"
            )
        reps = int(m.group(1) or 1)
        parts = [part.rpartition("x") for part in m.group(2).split("+")]
        if rank + reps * sum(int(count) for _, _, count in parts) > MAX_CLUSTER_RANKS:
            raise TopologyError(f"node group {item!r}: over the {MAX_CLUSTER_RANKS:,} GPUs xsim builds")
        gpus: list[str] = []
        for gpu, _, count in parts:
            gpus.extend([gpu] * int(count))
        if reps < 1 or not gpus:
            raise TopologyError(f"node group {item!r} must have positive counts")
        for _ in range(reps):
            i = len(desc["nodes"])
            ranks = list(range(rank, rank + len(gpus)))
            gpu: str | list[str] = gpus[0] if len(set(gpus)) == 1 else list(gpus)
            desc["nodes"].append({"name": f"node{i}", "gpu": gpu, "ranks": ranks, **node_opts})
            rank += len(gpus)
    return desc


def load_cluster_json(path: str | Path) -> dict:
    """Read a cluster description from a JSON file (the file itself, or its "cluster" key)."""
    from pathlib import Path  # here only: a replay of a deployment's cluster never loads pathlib (start-up)

    p = Path(path)
    text = read_text(p, "cluster file", TopologyError)
    try:
        data = json.loads(text)
    except RecursionError:
        raise TopologyError(f"{p}: not valid JSON (nesting too deep to parse)") from None
    except json.JSONDecodeError as exc:
        raise TopologyError(f"{p}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except ValueError as exc:  # an integer of 4,300+ digits
        raise TopologyError(f"{p}: not valid JSON ({str(exc).split(':')[0]})") from None
    if isinstance(data, dict) and "cluster" in data and "nodes" not in data:
        data = data["cluster"]
    if not isinstance(data, dict):
        raise TopologyError(f"{p}: a cluster description must be a JSON object")
    return data


def system_cluster(
    name: str, num_ranks: int, gpus: list[str] | None = None, fabric: Mapping | None = None
) -> dict:
    """A cluster description of `num_ranks` GPUs on DGX-class nodes (netmodels.presets.SYSTEM_PRESETS).

    Ranks fill nodes of 8 in order (the last node may be partial); `gpus` gives each rank's GPU type
    (default: the system's first), each of which the system must hold. Links carry line rates; collectives
    run as NCCL runs them (`"collectives": "nccl"`, netmodels/nccl.py).
    """
    p = system_preset(name)
    if not isinstance(num_ranks, int) or num_ranks < 1:
        raise TopologyError(f"{p.name}: rank count must be a positive integer, got {num_ranks!r}")
    gpus = list(gpus) if gpus is not None else [p.gpus[0]] * num_ranks
    if len(gpus) != num_ranks:
        raise TopologyError(f"{p.name}: {len(gpus)} GPU types for {num_ranks} ranks")
    for r, g in enumerate(gpus):
        if canonical_gpu(g) not in p.gpus:
            raise TopologyError(f"{p.name} holds {' or '.join(p.gpus)} GPUs; rank {r} has {g}")
    row = interconnect("table5", p.interconnect_row)
    nodes = []
    for i, start in enumerate(range(0, num_ranks, p.gpus_per_node)):
        ranks = list(range(start, min(start + p.gpus_per_node, num_ranks)))
        types = [canonical_gpu(gpus[r]) for r in ranks]
        nodes.append(
            {
                "name": f"node{i}",
                "gpu": types[0] if len(set(types)) == 1 else types,
                "ranks": ranks,
                "scale_up_bandwidth": p.nvlink_bandwidth,
                "scale_up_latency": row.scale_up_latency_ns,
                "pcie_bandwidth": row.pcie_bandwidth,
                "pcie_latency": row.pcie_latency_ns,
                "nic_bandwidth": p.nic_bandwidth,
                "nic_latency": p.nic_latency_ns,
            }
        )
    return {
        "name": p.name,
        "preset": "table5",
        "nodes": nodes,
        "fabric": dict(fabric) if fabric else {"kind": "switch"},
        "collectives": "nccl",
    }
