"""ASTRA-sim-compatible analytical mode: reproduces ASTRA-sim's analytical backends to the nanosecond.

Conventions (shared/reference/astrasim-analytical.md, sections 2 and 3): integer ns with truncation;
network bandwidth in GB/s with GB = 2^30 bytes; latency per hop; hops: Ring min(d, n-d), FullyConnected 1,
Switch 2; congestion-unaware T_msg = floor(h*alpha + m/B), congestion-aware (1-D) T_msg = h*floor(alpha + m/B);
every step pays the endpoint delay and reducing steps 3*floor(m/L); chunks = preferred-dataset-splits run
active-chunks-per-dimension at a time. Rings (and one-chunk multi-dim rings) have closed forms here; every
other case runs on the event-level replica in netmodels/astra_events.py (docs/netmodels.md lists the rules).
"""

from __future__ import annotations

import heapq
import json
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from xsim.netmodels.algorithms import (
    Schedule,
    Stage,
    canonical_algorithm,
    in_order_tree,
    ring_stage,
    tree_stages,
)
from xsim.netmodels.api import (
    CollectiveSpec,
    Completion,
    check_size,
    root_index,
    validate_ranks,
    validate_spec,
)
from xsim.netmodels.astra_events import (
    FAST_BUS_NS,
    AstraWorld,
    AwareNet,
    CollectiveRun,
    PacketAlgo,
    RingAlgo,
    TreeAlgo,
    UnawareNet,
)
from xsim.netmodels.closed_form import ClosedFormModel
from xsim.netmodels.errors import AlgorithmError, AstraConfigError, NetworkModelError
from xsim.netmodels.executor import run_chunked
from xsim.netmodels.inputs import read_text

if TYPE_CHECKING:  # annotations only: an ASTRA-sim mode replay never loads pathlib for them
    from pathlib import Path

ASTRA_TOPOLOGIES = {"Ring": "ring", "Switch": "switch", "FullyConnected": "fc"}
# Hops a message crosses inside one dimension (reference section 3.1); Ring depends on the distance.
_HOPS = {"switch": 2, "fc": 1}
_IMPL_KEYS = {
    "all_reduce": "all-reduce-implementation",
    "reduce_scatter": "reduce-scatter-implementation",
    "all_gather": "all-gather-implementation",
    "all_to_all": "all-to-all-implementation",
}
# System-JSON implementation names -> ours.
_ASTRA_ALGOS = {
    "ring": "ring",
    "direct": "direct",
    "halvingDoubling": "halving_doubling",
    "doubleBinaryTree": "double_binary_tree",
}


@dataclass(frozen=True)
class AstraDim:
    """One dimension of an ASTRA-sim network: topology kind, NPUs, GB/s (2^30 B) per link, ns per hop."""

    topology_kind: str
    npus: int
    bandwidth_gbps: float
    latency_ns: float

    @property
    def bytes_per_ns(self) -> float:
        """Link bandwidth in bytes/ns (GB = 2^30 bytes, reference section 2)."""
        return self.bandwidth_gbps * 2**30 / 1e9


@dataclass(frozen=True)
class AstraNetwork:
    """An ASTRA-sim analytical network config (network.yml)."""

    dims: tuple[AstraDim, ...]

    @property
    def num_npus(self) -> int:
        """Total NPUs: the product of the per-dimension counts."""
        return math.prod(d.npus for d in self.dims)


@dataclass(frozen=True)
class AstraSystem:
    """The fields of an ASTRA-sim system JSON that shape collective timing."""

    preferred_dataset_splits: int = 1
    active_chunks_per_dimension: int = 1
    endpoint_delay_ns: int = 10
    local_mem_bw_gbps: float = 1e9
    collective_optimization: str = "localBWAware"
    scheduling_policy: str = "LIFO"
    implementations: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def implementation(self, kind: str, dim: int) -> str:
        """Our algorithm name for kind in dimension dim (ring when the JSON names none)."""
        impls = dict(self.implementations).get(kind, ())
        name = impls[min(dim, len(impls) - 1)] if impls else "ring"
        return _ASTRA_ALGOS[name]


# "clean" profile of the reference (section 2): splits 1, one active chunk, 1 ns endpoint delay and a
# local-mem-bw so large that reductions round to 0 ns.
CLEAN_SYSTEM = AstraSystem(1, 1, 1, 1e9, "localBWAware", "LIFO", ())


def _read(path: str | Path, what: str) -> str:
    return read_text(path, f"ASTRA-sim {what}", AstraConfigError)  # bounded: /dev/zero is one line


def _num_list(doc: Mapping, key: str, path: str | Path, n: int | None) -> list:
    val = doc.get(key)
    if not isinstance(val, list) or not val:
        raise AstraConfigError(f"{path}: {key!r} must be a non-empty list")
    if n is not None and len(val) != n:
        raise AstraConfigError(f"{path}: {key!r} has {len(val)} entries, topology has {n}")
    for v in val:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise AstraConfigError(f"{path}: {key!r} entry {v!r} is not a number")
    return val


# Distinct collectives whose event-level result is remembered per model (a few MB at most).
_MEMO_MAX = 4096
NETWORK_KEYS = ("topology", "npus_count", "bandwidth", "latency")
# Per-rank finish times are Python tuples built per collective: 2^20 NPUs is ~10x the largest GPU
# clusters built (~1e5 GPUs); more is a typo in npus_count that would otherwise exhaust memory.
MAX_NPUS = 1 << 20


# Ranges of ASTRA-sim config numbers (issue 16): outside them a value is a unit slip or garbage, and it
# would otherwise hang (one event per chunk: splits 1e9 is 1e9 chunks per collective) or give silently
# wrong times (NaN latency, bandwidth ~ 0). The bounds sit far outside every real config: the reference's
# configs (../shared/peer_configs/astra-sim) use splits 1-4, one or two active chunks, GB/s bandwidths
# and latencies of hundreds of ns.
MIN_GBPS = 1e-3  # bandwidth and local-mem-bw in GB/s: 1 MB/s, below any interconnect or memory
MAX_GBPS = 1e9  # 1 EB/s
MAX_LATENCY_NS = 1e12  # 1,000 s per hop
MAX_ENDPOINT_DELAY_NS = 10**12  # 1,000 s
# preferred-dataset-splits and active-chunks-per-dimension: 1,024 chunks, 256x the reference configs; the
# event machine's time grows linearly with the chunks, so this also bounds one collective's cost.
MAX_SPLITS = 1 << 10


def _in_range(v: object, lo: float, hi: float) -> bool:
    """True for a real number (not a bool, not NaN) in [lo, hi]."""
    return not isinstance(v, bool) and isinstance(v, int | float) and lo <= v <= hi


_MAX_YAML_DEPTH = 16  # a network config is a mapping of flat lists (depth 2); generous for hand edits


def _flow_depth(text: str) -> int:
    """Deepest run of open brackets/braces in the text (quotes ignored: an upper bound of YAML flow nesting)."""
    depth = deepest = 0
    for ch in re.findall(r"[\[\]{}]", text):
        depth = depth + 1 if ch in "[{" else max(0, depth - 1)
        deepest = max(deepest, depth)
    return deepest


# The network files' usual shape: top-level `key: [ item, ... ]` lines, comments, blank lines. Items: decimal
# ints, floats with digits on both sides of the dot, and bare words that YAML 1.1 reads as strings (not its
# booleans or null). Anything else goes to PyYAML.
_FLOW_ITEM = r"(?:0|[1-9][0-9]{0,99}|[0-9]{1,100}\.[0-9]{1,100}|[A-Za-z][A-Za-z0-9_]{0,99})"
_FLOW_LINE = re.compile(
    rf"([A-Za-z_][A-Za-z0-9_]*): +\[ *({_FLOW_ITEM}(?: *, *{_FLOW_ITEM})*)? *\](?: +#.*)? *|(?: *#.*)? *"
)
_YAML_WORDS = {"yes", "no", "true", "false", "on", "off", "null", "empty"}


def _simple_flow_yaml(text: str) -> dict | None:
    """yaml.safe_load's result for a file of the usual shape (no PyYAML import: ~30-90 ms of a small
    replay's start-up), or None for any other text."""
    doc: dict = {}
    for line in text.split("\n"):
        m = _FLOW_LINE.fullmatch(line)
        if m is None:
            return None
        key = m.group(1)
        if key is None:
            continue  # blank or comment
        if key.lower() in _YAML_WORDS:
            return None  # a boolean or null key
        items: list = []
        for it in m.group(2).split(",") if m.group(2) else ():
            it = it.strip()
            if it[0].isdigit():
                items.append(float(it) if "." in it else int(it))
            elif it.lower() in _YAML_WORDS:
                return None
            else:
                items.append(it)
        doc[key] = items  # a repeated key: the last one, as PyYAML
    return doc or None


def load_network_yml(path: str | Path) -> AstraNetwork:
    """Read an ASTRA-sim analytical network YAML (topology, npus_count, bandwidth GB/s, latency ns)."""
    text = _read(path, "network config")
    doc = _simple_flow_yaml(text)
    if doc is None:
        doc = _load_yaml(text, path)
    if not isinstance(doc, Mapping):
        raise AstraConfigError(f"{path}: expected a mapping with topology, npus_count, bandwidth, latency")
    return _network_from_doc(doc, path)


def _load_yaml(text: str, path: str | Path) -> object:
    """PyYAML's safe_load of a network file, its errors as one line."""
    import yaml  # only for files _simple_flow_yaml does not take

    if _flow_depth(text) > _MAX_YAML_DEPTH:
        # PyYAML's scanner is quadratic in flow nesting (20,000 '[' take seconds): refused before parsing.
        raise AstraConfigError(f"{path}: not valid YAML (nesting deeper than {_MAX_YAML_DEPTH} levels)")
    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise AstraConfigError(f"{path}: not valid YAML (nesting too deep)") from None
    except yaml.YAMLError as exc:
        raise AstraConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    except ValueError as exc:  # an integer past Python's int-string digit limit
        raise AstraConfigError(f"{path}: not valid YAML ({str(exc).split(';')[0]})") from None


def _network_from_doc(doc: Mapping, path: str | Path) -> AstraNetwork:
    """The checked AstraNetwork of a network file's mapping."""
    # ASTRA-sim's analytical backend reads these four keys and nothing else: another key is a typo
    # (`bandwith: [...]`) that would leave the intended value unused.
    unknown = sorted(str(k) for k in doc if k not in NETWORK_KEYS)
    if unknown:
        raise AstraConfigError(
            f"{path}: unknown key(s) {', '.join(unknown)} (known: {', '.join(NETWORK_KEYS)})"
        )
    topo = doc.get("topology")
    if not isinstance(topo, list) or not topo:
        raise AstraConfigError(f"{path}: 'topology' must be a non-empty list such as [Ring]")
    for t in topo:
        if not isinstance(t, str) or t not in ASTRA_TOPOLOGIES:
            raise AstraConfigError(f"{path}: unknown topology {t!r} (known: {', '.join(ASTRA_TOPOLOGIES)})")
    n = len(topo)
    npus = _num_list(doc, "npus_count", path, n)
    bw = _num_list(doc, "bandwidth", path, n)
    lat = _num_list(doc, "latency", path, n)
    dims = []
    for t, c, b, a in zip(topo, npus, bw, lat, strict=True):
        if not isinstance(c, int) or c < 1:
            raise AstraConfigError(f"{path}: npus_count entries must be positive integers, got {c!r}")
        if not b > 0:
            raise AstraConfigError(f"{path}: bandwidth must be positive, got {b!r}")
        if not _in_range(b, MIN_GBPS, MAX_GBPS):
            raise AstraConfigError(f"{path}: bandwidth must be {MIN_GBPS:g} to {MAX_GBPS:g} GB/s, got {b!r}")
        if a < 0:
            raise AstraConfigError(f"{path}: latency must not be negative, got {a!r}")
        if not _in_range(a, 0, MAX_LATENCY_NS):
            raise AstraConfigError(f"{path}: latency must be 0 to {MAX_LATENCY_NS:g} ns, got {a!r}")
        dims.append(AstraDim(ASTRA_TOPOLOGIES[t], c, float(b), float(a)))
    net = AstraNetwork(tuple(dims))
    if net.num_npus > MAX_NPUS:
        raise AstraConfigError(
            f"{path}: npus_count makes {net.num_npus:,} NPUs, over the {MAX_NPUS:,} xsim models"
        )
    return net


def load_system_json(path: str | Path) -> AstraSystem:
    """Read an ASTRA-sim system JSON: splits, active chunks, endpoint delay, local-mem-bw, implementations."""
    try:
        doc = json.loads(_read(path, "system config"))
    except RecursionError:
        raise AstraConfigError(f"{path}: not valid JSON (nesting too deep)") from None
    except json.JSONDecodeError as exc:
        raise AstraConfigError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except ValueError as exc:  # an integer literal past Python's int-string digit limit
        raise AstraConfigError(f"{path}: not valid JSON ({str(exc).split(';')[0]})") from None
    if not isinstance(doc, Mapping):
        raise AstraConfigError(f"{path}: expected a JSON object")
    return system_from_dict(doc, str(path))


def system_from_dict(doc: Mapping, where: str = "system config") -> AstraSystem:
    """Build an AstraSystem from the parsed system JSON."""

    def pos_int(key: str, default: int, maximum: int, minimum: int = 1) -> int:
        v = doc.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise AstraConfigError(f"{where}: {key!r} must be an integer >= {minimum}, got {v!r}")
        if v > maximum:
            raise AstraConfigError(f"{where}: {key!r} must be at most {maximum:,}, got {v!r}")
        return v

    # Keys the JSON omits take ASTRA-sim's Sys defaults (one split, one active chunk, communication_delay 10);
    # a missing local-mem-bw makes reductions free, as in the reference's "clean" profile.
    splits = pos_int("preferred-dataset-splits", 1, MAX_SPLITS)
    active = pos_int("active-chunks-per-dimension", 1, MAX_SPLITS)
    # Endpoint delay 0 trips ASTRA-sim's own event-queue assertion (reference section 2), so we refuse it too.
    ed = pos_int("endpoint-delay", 10, MAX_ENDPOINT_DELAY_NS)
    lmb = doc.get("local-mem-bw", 1e9)
    if isinstance(lmb, bool) or not isinstance(lmb, int | float) or not lmb > 0:
        raise AstraConfigError(f"{where}: 'local-mem-bw' must be a positive number (GB/s), got {lmb!r}")
    if not _in_range(lmb, MIN_GBPS, sys.float_info.max):
        raise AstraConfigError(
            f"{where}: 'local-mem-bw' must be a finite number >= {MIN_GBPS:g} (GB/s), got {lmb!r}"
        )
    if any(k.endswith("-implementation-custom") for k in doc):
        raise AstraConfigError(f"{where}: custom (MSCCL) collective implementations are not supported")
    impls = []
    for kind, key in _IMPL_KEYS.items():
        v = doc.get(key, ["ring"])
        if not isinstance(v, list) or not v:
            raise AstraConfigError(f"{where}: {key!r} must be a non-empty list of algorithm names")
        for a in v:
            if not isinstance(a, str) or a not in _ASTRA_ALGOS:
                raise AstraConfigError(f"{where}: {key!r} names {a!r}; supported: {', '.join(_ASTRA_ALGOS)}")
        impls.append((kind, tuple(v)))
    opt = doc.get("collective-optimization", "localBWAware")
    if not isinstance(opt, str) or opt not in ("localBWAware", "baseline"):
        raise AstraConfigError(
            f"{where}: 'collective-optimization' must be localBWAware or baseline, got {opt!r}"
        )
    return AstraSystem(
        splits, active, ed, float(lmb), opt, str(doc.get("scheduling-policy", "LIFO")), tuple(impls)
    )


class AstraModel(ClosedFormModel):
    """ASTRA-sim's analytical backend (congestion-unaware or congestion-aware), in closed form per collective."""

    def __init__(self, network: AstraNetwork, system: AstraSystem, congestion_aware: bool = False) -> None:
        super().__init__()
        if congestion_aware and len(network.dims) > 1:
            raise AstraConfigError("congestion-aware mode supports only 1-dim topologies (as ASTRA-sim)")
        if network.num_npus > MAX_NPUS:
            raise AstraConfigError(f"{network.num_npus:,} NPUs, over the {MAX_NPUS:,} xsim models")
        self.network = network
        self.system = system
        self.congestion_aware = bool(congestion_aware)
        self.name = "astra-aware" if congestion_aware else "astra-unaware"
        self.num_ranks = network.num_npus
        sizes = [d.npus for d in network.dims]
        self._strides = np.array([math.prod(sizes[:i]) for i in range(len(sizes))], dtype=np.int64)
        self._sizes = np.array(sizes, dtype=np.int64)
        self._msg_cache: dict[tuple[int, int, int], int] = {}
        self._stride_list = [int(x) for x in self._strides]
        # Streams handed out so far by each dimension's DoubleBinaryTreeTopology (it alternates its two trees).
        self._dbt_streams: dict[int, int] = {}
        self._world: AstraWorld | None = None
        self._tentative: tuple | None = None
        # Congestion-aware collectives release each member at its own finish (member_finishes): members
        # finished since the last drain, closed-form members still ahead, and what was reported per handle.
        self._members_out: list[tuple[int, int, int]] = []
        self._fresh: list[int] = []  # handles completed on the event loop (next_event_quiet's stop)
        self._members_due: list[tuple[int, int, int]] = []
        self._members_seen: dict[int, set[int]] = {}
        # Congestion-aware collectives opened by their first member, each member issued as it arrives.
        self._open: dict[int, tuple[CollectiveRun, list[bool], list[int]]] = {}
        self._memo: dict[tuple, tuple[int, ...]] = {}
        self._group_dims: dict[tuple[int, ...], int] = {}
        # Congestion-unaware closed forms (rings, one-chunk multi-dim rings) per exactly typed spec: they
        # depend on the spec and the configs alone, and a training iteration repeats the same collective
        # (layer x micro-batch) on the same group thousands of times.
        self._closed_memo: dict[CollectiveSpec, tuple[int, ...]] = {}
        # The same closed forms per group shape (_shape_key): the TP groups of every stage and replica, or the
        # DP groups of every TP position, run the same collective over differently numbered but alike ranks.
        self._shape_memo: dict[tuple, tuple[int, ...]] = {}
        self._last_spec: dict[int, tuple[CollectiveSpec, tuple[int, ...]]] = {}  # id(spec) -> (spec, closed)

    # ----- message cost ------------------------------------------------------------------------------
    def msg_ns(self, src: np.ndarray, dst: np.ndarray, m: np.ndarray) -> np.ndarray:
        """T_msg of each message (global ranks src -> dst, m bytes), integer ns (reference 3.1/3.2)."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        cs = (src[:, None] // self._strides) % self._sizes
        cd = (dst[:, None] // self._strides) % self._sizes
        differ = cs != cd
        # A message is charged entirely to the lowest dimension in which src and dst differ.
        dim = np.where(differ.any(axis=1), differ.argmax(axis=1), 0)
        out = np.zeros(len(src), dtype=np.int64)
        for d, spec in enumerate(self.network.dims):
            sel = dim == d
            if not sel.any():
                continue
            if spec.topology_kind == "ring":
                dist = np.abs(cs[sel, d] - cd[sel, d])
                hops = np.minimum(dist, spec.npus - dist)
            else:
                hops = np.full(int(sel.sum()), _HOPS[spec.topology_kind])
            ser = m[sel] / spec.bytes_per_ns
            if self.congestion_aware:
                # Store-and-forward: every hop pays latency plus serialization, truncated per hop.
                out[sel] = hops * np.floor(spec.latency_ns + ser).astype(np.int64)
            else:
                out[sel] = np.floor(hops * spec.latency_ns + ser).astype(np.int64)
        same = ~differ.any(axis=1)
        out[same] = 0
        return out

    def reduction_ns(self, m: np.ndarray) -> np.ndarray:
        """3 * floor(m / L): read, read, write at local-mem-bw (GB/s of 1e9 bytes), reference 3.3 item 4."""
        return 3 * np.floor(m / self.system.local_mem_bw_gbps).astype(np.int64)

    # ----- collectives -------------------------------------------------------------------------------
    def chunk_sizes(self, kind: str, size: int, p: int) -> list[int]:
        """Sizes of the chunks (streams) a collective is split into (reference 3.3 item 1)."""
        splits = self.system.preferred_dataset_splits
        chunk = size // splits
        if kind != "all_gather" and p > chunk:
            chunk, size = p, splits * p
        if chunk == 0:
            return [0]
        n = -(-size // chunk)
        return [min(chunk, size - c * chunk) for c in range(n)]

    def _algorithm(self, spec: CollectiveSpec, dim: int, subgroup: bool = False) -> str:
        if spec.algorithm is not None:
            return canonical_algorithm(spec.algorithm)[0]
        if spec.kind not in _IMPL_KEYS:
            raise AlgorithmError(
                f"ASTRA-sim does not simulate {spec.kind} collectives (reference 3.4); use model=analytical or flow"
            )
        impls = dict(self.system.implementations).get(spec.kind, ())
        if subgroup and len(impls) > 1:
            # CommunicatorGroup::get_collective_plan: a group smaller than the system runs on a 1-D Local ring;
            # a per-dimension implementation list is replaced by Ring there.
            return "ring"
        return self.system.implementation(spec.kind, dim)

    def _group_dim(self, ranks: tuple[int, ...]) -> int:
        """The lowest dimension in which the group's ranks differ (0 when none); kept per group, as the
        replay opens the same groups' collectives many times."""
        hit = self._group_dims.get(ranks)
        if hit is not None:
            return hit
        r = np.array(ranks, dtype=np.int64)
        coords = (r[:, None] // self._strides) % self._sizes
        varying = np.flatnonzero((coords != coords[0]).any(axis=0))
        dim = int(varying[0]) if len(varying) else 0
        if len(self._group_dims) < _MEMO_MAX:
            self._group_dims[ranks] = dim
        return dim

    def _schedule(self, kind: str, algo: str, p: int, chunk: int, root: int, stream: int = 0) -> Schedule:
        # Message sizes follow ASTRA-sim's integer division of the chunk (reference 3.3 items 5-8).
        pos = np.arange(p, dtype=np.int64)
        if algo == "ring":
            if kind == "all_reduce":
                st = [ring_stage(p, chunk // p, True, p - 1), ring_stage(p, chunk // p, False, p - 1)]
            elif kind == "reduce_scatter":
                st = [ring_stage(p, chunk // p, True, p - 1)]
            elif kind == "all_gather":
                st = [ring_stage(p, chunk, False, p - 1)]
            elif kind == "all_to_all":
                st = [ring_stage(p, chunk // p, False, p * (p - 1) // 2)]
            else:
                raise AlgorithmError(f"ASTRA-sim's ring does not implement {kind}")
        elif algo == "direct":
            i, j = np.meshgrid(pos, pos, indexing="ij")
            mask = i != j
            src, dst = i[mask], j[mask]
            m = np.full(len(src), float(chunk if kind == "all_gather" else chunk // p))
            if kind == "all_reduce":
                st = [Stage(src, dst, m, reduce=True), Stage(src, dst, m)]
            else:
                st = [Stage(src, dst, m, reduce=kind == "reduce_scatter")]
        elif algo == "halving_doubling":
            k = p.bit_length() - 1
            if 1 << k != p:
                raise AlgorithmError(f"halvingDoubling needs a power-of-two group, got {p}")
            if kind not in ("all_reduce", "reduce_scatter", "all_gather"):
                raise AlgorithmError(f"ASTRA-sim's halvingDoubling does not implement {kind}")
            # Reductions on the first log2(p)-1 reduce-scatter steps (reference 3.3 item 7).
            rs = [
                Stage(pos, pos ^ (1 << s), np.full(p, float(chunk >> (s + 1))), s < k - 1, perm=True)
                for s in range(k)
            ]
            ag = [
                Stage(pos, pos ^ (1 << s), np.full(p, float(chunk >> (s + 1))), perm=True)
                for s in reversed(range(k))
            ]
            if kind == "all_gather":
                ag = [Stage(pos, pos ^ (1 << s), np.full(p, float(chunk << s)), perm=True) for s in range(k)]
            st = {"all_reduce": rs + ag, "reduce_scatter": rs, "all_gather": ag}[kind]
        elif algo == "double_binary_tree":
            if kind != "all_reduce":
                raise AlgorithmError("ASTRA-sim's doubleBinaryTree implements all_reduce only")
            # Streams alternate between the tree rooted at the highest id (DBMAX, first) and the one rooted at
            # 0 (DBMIN), as DoubleBinaryTreeTopology::get_topology hands them out; whole chunk per edge.
            st = tree_stages(in_order_tree(p, root_max=stream % 2 == 0), float(chunk))
        else:
            raise AlgorithmError(f"ASTRA-sim has no {algo} implementation in this mode")
        return Schedule(kind, algo, p, (tuple(st),))

    def _phases(
        self, spec: CollectiveSpec, ranks: tuple[int, ...], chunk: int, stream: int = 0
    ) -> list[tuple[list, Schedule]]:
        """(groups, schedule) per phase: one phase for a 1-D group, one per dimension for a full multi-dim one."""
        dims = self.network.dims
        if len(dims) == 1 or tuple(ranks) != tuple(range(self.num_ranks)):
            algo = self._algorithm(spec, self._group_dim(ranks), len(ranks) < self.num_ranks)
            return [([ranks], self._schedule(spec.kind, algo, len(ranks), chunk, root_index(spec), stream))]
        n = self.num_ranks
        lines = []
        for d, dim in enumerate(dims):
            stride = int(self._strides[d])
            base = [r for r in range(n) if (r // stride) % dim.npus == 0]
            lines.append([tuple(b + k * stride for k in range(dim.npus)) for b in base])
        phases = self._dim_phases(spec.kind, chunk)
        return [
            (lines[d], self._schedule(kind, self._algorithm(spec, d), dims[d].npus, size, 0))
            for d, kind, size in phases
        ]

    def _dim_phases(
        self, kind: str, chunk: int, algos: list[str] | None = None
    ) -> list[tuple[int, str, int]]:
        """(dim, kind, data size) of each phase of a whole-system multi-dim collective (Sys::generate_collective).

        AllReduce with localBWAware: RS up the dims (data shrinks by each dim), AR on the last, AG back down
        with each rank's block as the per-rank input (reference 3.3 item 2). Otherwise one phase of the
        collective per dim, each taking the previous phase's output size (RS divides, AG multiplies); AllGather
        walks the dims in reverse. Dimensions of one NPU have no phase. A doubleBinaryTree dimension runs an
        AllReduce whatever the phase, so its output is its input (CollectivePhase's final_data_size).
        """
        dims = self.network.dims
        keep = {d for d, a in enumerate(algos or ()) if a == "double_binary_tree"}
        live = [d for d in range(len(dims)) if dims[d].npus > 1]
        phases: list[tuple[int, str, int]] = []
        data = chunk
        if kind == "all_reduce" and self.system.collective_optimization == "localBWAware":
            for d in live[:-1]:
                phases.append((d, "reduce_scatter", data))
                data = data if d in keep else data // dims[d].npus
            phases.append((live[-1], "all_reduce", data))
            for d in reversed(live[:-1]):
                phases.append((d, "all_gather", data))
                data = data if d in keep else data * dims[d].npus
            return phases
        for d in reversed(live) if kind == "all_gather" else live:
            phases.append((d, kind, data))
            if d in keep:
                continue
            if kind == "reduce_scatter":
                data //= dims[d].npus
            elif kind == "all_gather":
                data *= dims[d].npus
        return phases

    def collective_ns(self, spec: CollectiveSpec) -> tuple[int, ...]:
        """Per-rank duration (ns) of a collective started at 0 on an idle network, in spec.ranks order."""
        same = self._last_spec.get(id(spec))
        if same is not None and same[0] is spec:
            return same[1]  # this very spec object again (the engine reuses one per group and size)
        strict = _strict(spec)
        if strict:
            hit = self._closed_memo.get(spec)
            if hit is not None:
                self._remember(spec, hit)
                return hit
        ranks = validate_spec(spec, self.num_ranks)
        if len(ranks) == 1:
            return (0,)
        # The event run of a collective on an idle network depends only on these (and, for doubleBinaryTree,
        # on which tree the rank's next stream takes); traces repeat the same collectives many times.
        key = (
            spec.kind,
            spec.size_bytes,
            ranks,
            spec.algorithm,
            tuple(sorted((d, v % 2) for d, v in self._dbt_streams.items())),
        )
        skey = None
        if not self.congestion_aware:
            # Whether the closed form applies (_event_chunks returns None) depends on what the shape key
            # holds too, so a shape seen with a closed form has one again, without asking _event_chunks.
            skey = (spec.kind, spec.size_bytes, spec.algorithm, root_index(spec), self._shape_key(ranks))
            closed = self._shape_memo.get(skey)
            if closed is not None:
                if strict and len(self._closed_memo) < _MEMO_MAX:
                    self._closed_memo[spec] = closed
                    self._remember(spec, closed)
                return closed
        chunks = self._event_chunks(spec, ranks)
        if chunks is None or (self.congestion_aware and self._contention_free(spec, ranks)):
            closed = self._closed_ns(spec, ranks)
            # _event_chunks returns None before any side effect (the doubleBinaryTree stream counter), so
            # a repeat of this spec takes this same path: the closed form is a pure function of it.
            if chunks is None and skey is not None:
                if len(self._shape_memo) < _MEMO_MAX:
                    self._shape_memo[skey] = closed
                if strict and len(self._closed_memo) < _MEMO_MAX:
                    self._closed_memo[spec] = closed
                    self._remember(spec, closed)
            return closed
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        if self.congestion_aware:
            d = self.network.dims[0]

            def net(loop):
                return AwareNet(loop, d.topology_kind, d.npus, d.bytes_per_ns, d.latency_ns)

        else:

            def net(loop):
                return UnawareNet(loop, self._msg1)

        world = AstraWorld(net, *self._world_args())
        out: list[tuple[int, ...]] = []
        CollectiveRun(world, 0, ranks, chunks, lambda run: out.append(tuple(run.finish))).start()
        world.loop.run_until(None)
        if len(self._memo) < _MEMO_MAX:
            self._memo[key] = out[0]
        return out[0]

    def _remember(self, spec: CollectiveSpec, closed: tuple[int, ...]) -> None:
        """Keep a strict spec's closed form by the object's identity (the entry holds the spec, so its id is
        not reused while the entry lives); equal specs still find it through _closed_memo."""
        if len(self._last_spec) < _MEMO_MAX:
            self._last_spec[id(spec)] = (spec, closed)

    def _shape_key(self, ranks: tuple[int, ...]) -> tuple:
        """What the unaware closed form sees of a group: two groups with equal keys have equal T_msg between
        equal positions (msg_ns), equal varying dimensions and subgroup rules, so equal per-position results.

        Per dimension, each member's coordinate relabeled so that only what T_msg reads survives: on a ring,
        coordinates shifted by the first member's (ring distances are invariant under rotation); on a switch
        or fully-connected dimension, numbered by first appearance (only equality counts: constant hops).
        The whole system in rank order (the multi-dimensional path) is its own shape.
        """
        full = len(ranks) == self.num_ranks and ranks == tuple(range(self.num_ranks))
        cols = []
        for stride, dim in zip(self._stride_list, self.network.dims, strict=True):
            n = dim.npus
            c = [(r // stride) % n for r in ranks]
            if dim.topology_kind == "ring":
                c0 = c[0]
                cols.append(tuple([(x - c0) % n for x in c]))
            else:
                first: dict[int, int] = {}
                cols.append(tuple([first.setdefault(x, len(first)) for x in c]))
        return (full, len(ranks) < self.num_ranks, tuple(cols))

    def _contention_free(self, spec: CollectiveSpec, ranks: tuple[int, ...]) -> bool:
        """Aware mode: a ring, one active chunk, equal hop counts and no directed link shared by two ring edges:
        then every rank moves in lockstep, no message ever queues and the closed form is exact."""
        if len(self.network.dims) > 1 or self.system.active_chunks_per_dimension != 1:
            return False
        p = len(ranks)
        if self._algorithm(spec, 0, p < self.num_ranks) != "ring":
            return False
        d = self.network.dims[0]
        router = AwareNet(None, d.topology_kind, d.npus, d.bytes_per_ns, d.latency_ns)
        links: set[tuple[int, int]] = set()
        hops = None
        for i in range(p):
            path = router.route(ranks[i], ranks[(i + 1) % p])
            if hops is None:
                hops = len(path)
            if len(path) != hops:
                return False
            for e in zip(path, path[1:], strict=False):
                if e in links:
                    return False
                links.add(e)
        return True

    def _closed_ns(self, spec: CollectiveSpec, ranks: tuple[int, ...]) -> tuple[int, ...]:
        p = len(ranks)
        total = np.zeros(p, dtype=np.int64)
        sizes = self.chunk_sizes(spec.kind, spec.size_bytes, p)
        active = self.system.active_chunks_per_dimension
        # MemBus.cc: Ring and HalvingDoubling on a communicator group smaller than the system send with
        # Transmition::Fast, which costs a hard-coded 10 ns instead of the endpoint-delay.
        bus = FAST_BUS_NS if p < self.num_ranks else self.system.endpoint_delay_ns
        pos_of = {r: i for i, r in enumerate(ranks)}
        finishes: list[np.ndarray] = []
        for c, chunk in enumerate(sizes):
            begin = np.zeros(p, dtype=np.int64) if c < active else finishes[c - active]
            t = begin.copy()
            for groups, sched in self._phases(spec, ranks, chunk, c):
                t = self._run_phase(groups, sched, t, pos_of, bus)
            finishes.append(t)
            total = np.maximum(total, t)
        return tuple(int(x) for x in total)

    def staggered_ns(self, spec: CollectiveSpec, issue_ns: tuple[int, ...]) -> tuple[int, ...]:
        """Per-rank finish (ns) of a collective whose members issue it at issue_ns (spec.ranks order), idle
        congestion-unaware network. ASTRA-sim has no barrier across members: each rank starts its streams
        when it reaches the node, sends at once and waits only for the messages it needs."""
        ranks = validate_spec(spec, self.num_ranks)
        base = min(issue_ns)
        offsets = tuple(int(t) - base for t in issue_ns)
        if len(ranks) == 1 or not any(offsets):
            return tuple(base + d for d in self.collective_ns(spec))
        dims = self.network.dims
        one_dim = len(dims) == 1 or tuple(ranks) != tuple(range(self.num_ranks))
        if one_dim and self._algorithm(spec, self._group_dim(ranks), len(ranks) < self.num_ranks) == "ring":
            return tuple(base + int(x) for x in self._ring_staggered(spec, ranks, np.array(offsets)))
        chunks = self._event_chunks(spec, ranks, force=True)
        if (
            chunks is None
        ):  # doubleBinaryTree on a group that is not 2^k: the closed form, from the last issue
            return tuple(max(issue_ns) + d for d in self.collective_ns(spec))
        world = AstraWorld(lambda loop: UnawareNet(loop, self._msg1), *self._world_args())
        out: list[tuple[int, ...]] = []
        CollectiveRun(world, 0, ranks, chunks, lambda run: out.append(tuple(run.finish))).start(offsets)
        world.loop.run_until(None)
        return tuple(base + t for t in out[0])

    def _ring_staggered(self, spec: CollectiveSpec, ranks: tuple[int, ...], start: np.ndarray) -> np.ndarray:
        """The ring packet machine with per-rank start times, as a recurrence over steps (numpy per step).

        A rank sends packet k+1 one bus crossing (plus the reduction, on reducing inserts) after it receives
        message k, and it receives message k at max(arrival, its own k-th send) because it posts that receive
        when it sends; the stream exits one crossing after the last receive (Ring.cc). Chunks start on a rank
        in priority order when a slot of its queue frees (one queue, active-chunks-per-dimension slots).
        """
        p = len(ranks)
        sub = p < self.num_ranks
        kind = spec.kind
        bus = FAST_BUS_NS if sub else self.system.endpoint_delay_ns
        gr = np.array(ranks, dtype=np.int64)
        nxt = np.roll(gr, -1)
        pred = np.roll(np.arange(p), 1)
        steps = {"all_reduce": 2 * (p - 1), "all_to_all": p * (p - 1) // 2}.get(kind, p - 1)
        sizes = self.chunk_sizes(kind, spec.size_bytes, p)
        active = self.system.active_chunks_per_dimension
        n = len(sizes)
        # Streams start as created while slots are free; the rest wait in priority order (LIFO: newest first).
        order = list(range(n))
        if self.system.scheduling_policy != "FIFO":
            order = order[:active] + order[active:][::-1]
        slots = np.tile(start[:, None], (1, min(active, len(order)))).astype(np.int64)
        finish = start.copy()
        for c in order:
            chunk = sizes[c]
            m = chunk if kind == "all_gather" else chunk // p
            t_msg = self.msg_ns(gr, nxt, np.full(p, float(m)))[pred]  # message into each position
            red = int(self.reduction_ns(np.array([float(m)]))[0])
            j = slots.argmin(axis=1)
            s0 = slots[np.arange(p), j]
            g = s0 + bus
            for k in range(1, steps + 1):
                # Inserts 2..p reduce for ReduceScatter and the first half of AllReduce (Ring::insert_packet).
                reducing = kind == "reduce_scatter" or (kind == "all_reduce" and k <= p - 1)
                r = np.maximum(g[pred] + t_msg, g)
                g = r + bus + (red if reducing else 0)
            slots[np.arange(p), j] = g
            finish = np.maximum(finish, g)
        return finish

    def _msg1(self, src: int, dst: int, size: int) -> int:
        """T_msg of one message (the scalar form of msg_ns, for the event machine)."""
        key = (src, dst, size)
        t = self._msg_cache.get(key)
        if t is None:
            t = 0
            for stride, spec in zip(self._stride_list, self.network.dims, strict=True):
                a, b = (src // stride) % spec.npus, (dst // stride) % spec.npus
                if a == b:
                    continue
                # Charged to the lowest dimension in which src and dst differ (reference 3.1).
                if spec.topology_kind == "ring":
                    hops = min(abs(a - b), spec.npus - abs(a - b))
                else:
                    hops = _HOPS[spec.topology_kind]
                ser = size / spec.bytes_per_ns
                if self.congestion_aware:
                    t = hops * math.floor(spec.latency_ns + ser)
                else:
                    t = math.floor(hops * spec.latency_ns + ser)
                break
            self._msg_cache[key] = t
        return t

    def _world_args(self) -> tuple:
        sysc = self.system
        return (
            sysc.endpoint_delay_ns,
            sysc.local_mem_bw_gbps,
            sysc.active_chunks_per_dimension,
            sysc.scheduling_policy != "FIFO",
        )

    def _multidim_chunks(self, spec: CollectiveSpec, force: bool = False) -> list[list] | None:
        """Streams of a whole-system multi-dim collective: one phase per dimension, a queue per dimension.

        Sys::generate_collective: AllReduce with localBWAware = RS up the dims, AR on the last, AG back down;
        otherwise one phase of the collective per dim (AllGather walks the dims in reverse), each phase taking
        the previous phase's output size. A chunk moves to the next dim's queue when its phase exits on that
        rank, so chunks pipeline across dimensions. One chunk of rings runs its phases back to back: the closed
        form is exact (None).
        """
        dims = self.network.dims
        kind = spec.kind
        sizes = self.chunk_sizes(kind, spec.size_bytes, self.num_ranks)
        algos = [self._algorithm(spec, d) for d in range(len(dims))]
        if len(sizes) == 1 and set(algos) == {"ring"} and not force:
            return None
        live = [d for d in range(len(dims)) if dims[d].npus > 1]
        for d in live:
            pow2 = dims[d].npus & (dims[d].npus - 1) == 0
            if algos[d] in ("halving_doubling", "double_binary_tree") and not pow2:
                raise AlgorithmError(f"{algos[d]} needs a power-of-two dimension, got {dims[d].npus}")
            if algos[d] not in ("ring", "direct", "halving_doubling", "double_binary_tree"):
                raise AlgorithmError(f"ASTRA-sim has no {algos[d]} implementation in this mode")
        if kind not in _IMPL_KEYS:
            raise AlgorithmError(f"ASTRA-sim does not simulate {kind} collectives")
        strides = [int(x) for x in self._strides]

        def line(rank: int, d: int) -> tuple[tuple[int, ...], int]:
            stride, npus = strides[d], dims[d].npus
            base = rank - ((rank // stride) % npus) * stride
            return tuple(base + k * stride for k in range(npus)), (rank // stride) % npus

        def phase(d: int, pkind: str, data: int):
            if algos[d] == "double_binary_tree":
                # GeneralComplexTopology gives each dimension its own DoubleBinaryTreeTopology over the
                # rank's line; the tree algorithm runs an AllReduce whatever the phase.
                parent, children = self._next_tree(d, dims[d].npus)

                def make_tree(ctx, stream, members, idx, d=d, data=data, parent=parent, children=children):
                    mem, pos = line(members[idx], d)
                    return TreeAlgo(ctx, stream, mem, pos, parent[pos], children[pos], data)

                return (d, make_tree)

            def make(ctx, stream, members, idx, d=d, pkind=pkind, data=data):
                mem, pos = line(members[idx], d)
                return PacketAlgo(ctx, stream, mem, pos, False, pkind, algos[d], data)

            return (d, make)

        chunks = []
        for chunk in sizes:
            phases = [phase(d, pkind, data) for d, pkind, data in self._dim_phases(kind, chunk, algos)]
            chunks.append(phases)
        return chunks

    def _next_tree(self, dim: int, p: int) -> tuple[list[int], list[list[int]]]:
        """Parent and children of each position in the tree the dimension's next stream takes.

        DoubleBinaryTreeTopology::get_topology alternates DBMAX (root p-1) and DBMIN (root 0) per stream; the
        counter lives on the rank's topology object, so it carries over from one collective to the next.
        """
        k = self._dbt_streams.get(dim, 0)
        self._dbt_streams[dim] = k + 1
        parent = in_order_tree(p, root_max=k % 2 == 0)
        children: list[list[int]] = [[] for _ in range(p)]
        for v, u in enumerate(parent):
            if u >= 0:
                children[u].append(v)
        return parent, children

    def _event_chunks(
        self, spec: CollectiveSpec, ranks: tuple[int, ...], force: bool = False
    ) -> list[list] | None:
        """Phases per chunk for the event-level core; None where the closed form is exact (rings, multi-dim)
        unless force (then None only where ASTRA-sim has no machine: a doubleBinaryTree that is not 2^k)."""
        dims = self.network.dims
        p = len(ranks)
        subgroup = p < self.num_ranks
        if len(dims) > 1 and not subgroup and tuple(ranks) == tuple(range(self.num_ranks)):
            if self.congestion_aware:
                raise AstraConfigError("congestion-aware mode supports only 1-dim topologies (as ASTRA-sim)")
            return self._multidim_chunks(spec, force)
        algo = self._algorithm(spec, self._group_dim(ranks), subgroup)
        pow2 = p & (p - 1) == 0
        if not self.congestion_aware and algo == "double_binary_tree" and not pow2:
            return None
        if not self.congestion_aware and algo == "ring" and not force:
            return None
        kind = spec.kind
        if algo == "halving_doubling" and (
            not pow2 or kind not in ("all_reduce", "reduce_scatter", "all_gather")
        ):
            self._schedule(kind, algo, p, p, 0)  # raises the closed form's error
        if algo == "double_binary_tree":
            if kind != "all_reduce":
                raise AlgorithmError("ASTRA-sim's doubleBinaryTree implements all_reduce only")
            if not pow2:
                raise AlgorithmError(f"congestion-aware doubleBinaryTree needs a power-of-two group, got {p}")
        if algo == "ring" and kind not in _IMPL_KEYS:
            raise AlgorithmError(f"ASTRA-sim's ring does not implement {kind}")
        if algo == "direct" and kind not in _IMPL_KEYS:
            raise AlgorithmError(f"ASTRA-sim's direct does not implement {kind}")
        if algo not in ("ring", "direct", "halving_doubling", "double_binary_tree"):
            raise AlgorithmError(f"ASTRA-sim has no {algo} implementation in this mode")
        chunks = []
        for chunk in self.chunk_sizes(kind, spec.size_bytes, p):
            if algo == "double_binary_tree":
                # DoubleBinaryTreeTopology::get_topology: every new stream takes the other tree (the counter
                # lives on the rank's topology object, so it carries over from one collective to the next).
                parent, children = self._next_tree(0, p)

                def make(ctx, stream, members, idx, parent=parent, children=children, chunk=chunk):
                    return TreeAlgo(ctx, stream, members, idx, parent[idx], children[idx], chunk)

            elif algo == "ring":

                def make(ctx, stream, members, idx, chunk=chunk):
                    return RingAlgo(ctx, stream, members, idx, subgroup, kind, chunk)

            else:

                def make(ctx, stream, members, idx, chunk=chunk, algo=algo):
                    return PacketAlgo(ctx, stream, members, idx, subgroup, kind, algo, chunk)

            chunks.append([(0, make)])
        return chunks

    def _run_phase(self, groups, sched: Schedule, t: np.ndarray, pos_of: dict, ed: int) -> np.ndarray:
        t = t.copy()
        for g in groups:
            idx = np.array([pos_of[r] for r in g], dtype=np.int64)
            gr = np.array(g, dtype=np.int64)
            cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

            def cost(stage: Stage, gr=gr, cache=cache) -> tuple[np.ndarray, np.ndarray]:
                key = id(stage)
                if key not in cache:
                    m = stage.nbytes
                    dur = self.msg_ns(gr[stage.src], gr[stage.dst], m) + ed
                    red = self.reduction_ns(m) if stage.reduce else np.zeros(len(m), dtype=np.int64)
                    cache[key] = (dur, red)
                return cache[key]

            # Every phase starts with one memory-bus crossing (the "+1" of (steps+1) x ed).
            start = t[idx] + ed
            t[idx] = run_chunked(lambda _c: sched, 1, 1, start, cost, count_sends=False)
        return t

    # ----- engine-facing interface -------------------------------------------------------------------
    def _aware_world(self) -> AstraWorld:
        if self._world is None:
            d = self.network.dims[0]
            self._world = AstraWorld(
                lambda loop: AwareNet(loop, d.topology_kind, d.npus, d.bytes_per_ns, d.latency_ns),
                *self._world_args(),
            )
        return self._world

    def _sync(self, now_ns: int) -> AstraWorld:
        world = self._aware_world()
        if world.loop.now < now_ns:
            # Every event before now has run; a link free reserved for now counts as run too: the engine
            # advances the model to each event it reports (frees were reported when always scheduled)
            # before it starts work at that time.
            world.loop.run_until(now_ns - 1)
            world.loop.now = now_ns
        return world

    def _finish(self, handle: int, per_rank: tuple[int, ...]) -> None:
        finish = max(per_rank)
        heapq.heappush(self._pending, (finish, handle, Completion(handle, finish, per_rank)))
        self._fresh.append(handle)  # next_event_quiet stops at a completion

    def _new_handle(self) -> int:
        handle = self._next_handle
        self._next_handle += 1
        return handle

    def _register(self, per_rank: tuple[int, ...]) -> int:
        """Queue a closed-form result for delivery when its *first* member finishes.

        ASTRA-sim releases each rank when its own part of a collective ends (a tree's root long before its
        leaves); the engine schedules every member's end from per_rank_finish_ns, so the completion comes
        back as soon as one member is done (finish_ns stays the last member's finish). In congestion-aware
        mode a closed form may still be replayed on the event loop until its last finish: it is delivered then.
        """
        handle = self._next_handle
        self._next_handle += 1
        last = max(per_rank)
        due = last if self.congestion_aware else min(per_rank)
        heapq.heappush(self._pending, (due, handle, Completion(handle, last, per_rank)))
        if self.congestion_aware and min(per_rank) < last:
            for i, f in enumerate(per_rank):
                if f < last:
                    heapq.heappush(self._members_due, (f, handle, i))
        return handle

    def _member(self, handle: int, pos: int, finish_ns: int) -> None:
        """Member `pos` of collective `handle` finished before the last one: reported by member_finishes."""
        seen = self._members_seen.setdefault(handle, set())
        if pos not in seen:  # a closed form replayed on the loop reports its early members a second time
            seen.add(pos)
            self._members_out.append((handle, pos, finish_ns))

    def member_finishes(self) -> list[tuple[int, int, int]]:
        """(handle, position in spec.ranks, finish ns) of each congestion-aware collective member that
        finished, before the collective's last member, since the previous call (the engine calls it after
        every advance and ends those members' nodes then). The completion still comes at the last finish
        and carries every member's time."""
        out, self._members_out = self._members_out, []
        return out

    def _materialize(self, now_ns: int) -> None:
        """Replay the closed-form transfer in flight on the event loop once other traffic joins it."""
        tent, self._tentative = self._tentative, None
        if tent is None or now_ns >= tent[1]:
            return
        t0, _, handle, inject = tent
        # It was alone on an idle network since t0, so running it from t0 on the loop is exact.
        self._pending = [e for e in self._pending if e[1] != handle]
        heapq.heapify(self._pending)
        self._members_due = [e for e in self._members_due if e[1] != handle]  # the loop reports them now
        heapq.heapify(self._members_due)
        world = self._aware_world()
        world.loop.starting(t0)
        inject(world, handle)
        # Replayed up to now: its events at now (a link's free among them) run after the work started now.
        world.loop.run_until(now_ns - 1)
        world.loop.starting(now_ns)

    def _aware_start(self, now_ns: int, closed: tuple[int, ...] | None, inject) -> int:
        self._materialize(now_ns)
        world = self._sync(now_ns)
        if closed is not None and world.loop.next_time() is None:
            # Alone on an idle network, a contention-free pattern has its closed form; kept tentative.
            handle = self._register(closed)
            self._tentative = (now_ns, max(closed), handle, inject)
            return handle
        handle = self._new_handle()
        inject(world, handle)
        return handle

    def start_collective_issued(self, now_ns: int, spec: CollectiveSpec, issue_ns: tuple[int, ...]) -> int:
        """Start a collective whose last member issues it at now_ns; issue_ns: each member's issue time.

        ASTRA-sim has no barrier across members (the replay engine calls this in ASTRA-sim mode). The aware
        mode's shared event loop cannot go back before now: it starts every member at the last issue.
        """
        if self.congestion_aware or min(issue_ns) == now_ns == max(issue_ns):
            return self.start_collective(now_ns, spec)
        now_ns = self._check_now(now_ns)
        if len(issue_ns) != len(spec.ranks) or max(issue_ns) > now_ns:
            raise NetworkModelError("issue times must be one per member and none after the start")
        return self._register(tuple(max(now_ns, t) for t in self.staggered_ns(spec, issue_ns)))

    @property
    def starts_members(self) -> bool:
        """True when each member of a collective is started as it issues (open_collective, issue_member):
        the congestion-aware event loop cannot go back to an earlier member's issue time."""
        return self.congestion_aware

    def open_collective(self, now_ns: int, spec: CollectiveSpec) -> int:
        """Congestion-aware: the collective's first member issues it at now_ns; returns its handle. Every member
        (the first included) is then started by issue_member when it issues, as ASTRA-sim has no barrier:
        an early member's messages go out at once and queue on the links with everything else."""
        if not self.congestion_aware:
            raise NetworkModelError("open_collective is the congestion-aware mode's (unaware: staggered_ns)")
        now_ns = self._check_now(now_ns)
        ranks = validate_spec(spec, self.num_ranks)
        chunks = self._event_chunks(spec, ranks)
        self._materialize(now_ns)
        world = self._sync(now_ns)
        handle = self._new_handle()
        run = CollectiveRun(
            world, handle, ranks, chunks, lambda r: self._finish(r.handle, tuple(r.finish)), self._member
        )
        self._open[handle] = (run, [False] * len(ranks), [len(ranks)])
        return handle

    def issue_member(self, now_ns: int, handle: int, pos: int) -> None:
        """Member `pos` (index in spec.ranks) of the opened collective `handle` issues it at now_ns."""
        now_ns = self._check_now(now_ns)
        entry = self._open.get(handle)
        if entry is None or not 0 <= pos < len(entry[1]) or entry[1][pos]:
            raise NetworkModelError(f"collective {handle}: member {pos} is not waiting to issue it")
        self._materialize(now_ns)
        self._sync(now_ns)
        run, issued, left = entry
        issued[pos] = True
        left[0] -= 1
        if left[0] == 0:
            del self._open[handle]
        run.issue(pos)

    def start_collective(self, now_ns: int, spec: CollectiveSpec) -> int:
        """Start a collective at now_ns (closed form when unaware, on the shared event loop when aware)."""
        now_ns = self._check_now(now_ns)
        if not self.congestion_aware:
            return self._register(tuple([now_ns + d for d in self.collective_ns(spec)]))
        ranks = validate_spec(spec, self.num_ranks)
        if len(ranks) == 1:
            return self._register((now_ns,))
        chunks = self._event_chunks(spec, ranks)
        closed = None
        if self._contention_free(spec, ranks):
            closed = tuple(now_ns + d for d in self._closed_ns(spec, ranks))

        def inject(world: AstraWorld, handle: int) -> None:
            CollectiveRun(
                world, handle, ranks, chunks, lambda r: self._finish(r.handle, tuple(r.finish)), self._member
            ).start()

        return self._aware_start(now_ns, closed, inject)

    def p2p_ns(self, src: int, dst: int, size_bytes: int) -> int:
        """Send/recv time on an idle network: T_msg only, no bus delay or reduction (reference 3.3 item 9)."""
        if not (type(src) is type(dst) is type(size_bytes) is int and size_bytes >= 0):  # the engine's case
            validate_ranks((src, dst), self.num_ranks)
            check_size(size_bytes)
        elif not (0 <= src < self.num_ranks and 0 <= dst < self.num_ranks):
            validate_ranks((src, dst), self.num_ranks)  # raises
        return self._msg1(int(src), int(dst), int(size_bytes))  # msg_ns's rule for one message, cached

    def start_p2p(self, now_ns: int, src: int, dst: int, size_bytes: int) -> int:
        """Start a send/recv pair at now_ns; returns its handle."""
        now_ns = self._check_now(now_ns)
        if not self.congestion_aware or src == dst:
            return self._register((now_ns + self.p2p_ns(src, dst, size_bytes),))
        closed = (now_ns + self.p2p_ns(src, dst, size_bytes),)

        def inject(world: AstraWorld, handle: int) -> None:
            world.net.send(src, dst, int(size_bytes), lambda _: self._finish(handle, (world.loop.now,)))

        return self._aware_start(now_ns, closed, inject)

    def next_event_ns(self) -> int | None:
        """Earliest pending completion or internal event (aware mode runs an event loop)."""
        t = self._pending[0][0] if self._pending else None
        if self._members_due and (t is None or self._members_due[0][0] < t):
            t = self._members_due[0][0]
        if self._world is not None:
            w = self._world.loop.next_time()
            if w is not None and (t is None or w < t):
                t = w
        return t

    def next_event_quiet(self, horizon_ns: int | None) -> int | None:
        """next_event_ns(), after running the event loop's events before horizon_ns (the replay's next node
        finish; None: no node pending), and before any pending completion or member finish, until one of them
        completes something.

        The engine would advance the model to each of these events and find nothing to do at any of them
        (no node of its own before horizon_ns, no completion): running them here is the same run, with one
        engine step per completion instead of one per event time. Events at horizon_ns stay for the engine.
        """
        world = self._world
        if world is not None and not self._members_out:
            # No node pending (None): the model's own events are all the replay has left.
            until = horizon_ns - 1 if horizon_ns is not None else sys.maxsize
            pending = self._pending
            if pending and pending[0][0] <= until:
                until = pending[0][0] - 1
            due = self._members_due
            if due and due[0][0] <= until:
                until = due[0][0] - 1
            self._fresh.clear()
            # The engine takes it from a stop: advance(now) runs the rest of this time and hands over the
            # completion or the finished members (member_finishes).
            t = world.loop.run_quiet(until, self._members_out, self._fresh)
            if t is not None:
                return t
        return self.next_event_ns()

    def advance(self, until_ns: int) -> list[Completion]:
        """Process internal events up to until_ns; return the completions, ordered by (finish_ns, handle)."""
        if self._world is not None:
            self._world.loop.run_until(until_ns)
        due = self._members_due
        while due and due[0][0] <= until_ns:
            f, handle, pos = heapq.heappop(due)
            self._member(handle, pos, f)
        out = super().advance(until_ns)
        if self._members_seen:
            for c in out:
                self._members_seen.pop(c.handle, None)
        return out


def _strict(spec: CollectiveSpec) -> bool:
    """True when the spec's size and ranks are plain ints (so equal specs validate alike: True == 1)."""
    return (
        type(spec.size_bytes) is int
        and type(spec.ranks) is tuple
        and all(type(r) is int for r in spec.ranks)
        and (spec.root is None or type(spec.root) is int)
    )


def astra_model(
    network_yml_path: str | Path,
    system_json_path: str | Path | None = None,
    congestion_aware: bool | None = None,
) -> AstraModel:
    """ASTRA-sim-compatible model from a network YAML and a system JSON (default: congestion-unaware)."""
    net = load_network_yml(network_yml_path)
    sysc = load_system_json(system_json_path) if system_json_path is not None else CLEAN_SYSTEM
    return AstraModel(net, sysc, bool(congestion_aware))
