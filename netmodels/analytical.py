"""The `analytical` model: latency along the route plus bytes over its bottleneck bandwidth, no contention."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from netmodels.algorithms import Schedule, Stage, build_schedule, default_algorithm
from netmodels.api import (
    CollectiveSpec,
    ceil_ns,
    check_size,
    root_index,
    validate_ranks,
    validate_spec,
)
from netmodels.closed_form import ClosedFormModel
from netmodels.errors import AlgorithmError, NetworkModelError
from netmodels.executor import run_chunked
from netmodels.nccl import (
    choose_protocol,
    effective_link_bandwidth,
    nccl_protocol_applies,
    rail_rings,
    split_protocol,
    with_protocol,
)
from netmodels.topology import Topology
from netmodels.units import parse_bandwidth, parse_time_ns


def resolve_options(
    chunks: int,
    chunks_in_flight: int,
    endpoint_delay_ns: float | str,
    reduction_bandwidth: float | str | None,
) -> tuple[int, int, float, float | None]:
    """Validate the chunking and overhead options shared by the generic models."""
    if not isinstance(chunks, int) or chunks < 1:
        raise NetworkModelError(f"chunks must be a positive integer, got {chunks!r}")
    if not isinstance(chunks_in_flight, int) or chunks_in_flight < 1:
        raise NetworkModelError(f"chunks_in_flight must be a positive integer, got {chunks_in_flight!r}")
    ed = parse_time_ns(endpoint_delay_ns)
    # Reduction bandwidth in bytes/ns; None means reductions cost nothing.
    red = None if reduction_bandwidth is None else parse_bandwidth(reduction_bandwidth) / 1e9
    return chunks, chunks_in_flight, ed, red


class AnalyticalModel(ClosedFormModel):
    """No contention: each transfer costs route latency + bytes / bottleneck bandwidth (+ endpoint delay)."""

    name = "analytical"

    def __init__(
        self,
        topology: Topology,
        chunks: int = 1,
        chunks_in_flight: int = 1,
        endpoint_delay_ns: float | str = 0.0,
        reduction_bandwidth: float | str | None = None,
        algorithms: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.topology = topology
        self.num_ranks = topology.num_ranks
        self.chunks, self.in_flight, self.endpoint_delay_ns, self.reduction_bpns = resolve_options(
            chunks, chunks_in_flight, endpoint_delay_ns, reduction_bandwidth
        )
        self.algorithms = dict(algorithms or {})
        # NCCL mode (netmodels/nccl.py): rail-aligned channels and the link rates NCCL's protocol reaches.
        self.nccl = topology.collectives == "nccl"
        self._eff_bw = effective_link_bandwidth(topology) if self.nccl else None
        # CollectiveSpec -> per-rank finish offsets from the start (ns), see start_collective.
        self._offsets: dict[CollectiveSpec, tuple[int, ...]] = {}
        self._p2p_ns: dict[tuple[int, int, int], int] = {}
        self._protocols: dict[
            CollectiveSpec, str
        ] = {}  # NCCL mode: the protocol each collective ran  # (src, dst, size) -> duration, see start_p2p

    def schedule(self, spec: CollectiveSpec) -> tuple[tuple[int, ...], Schedule]:
        """Validate spec and build the schedule of one chunk (before any NCCL protocol is applied)."""
        ranks, sched, _ = self._schedule(spec)
        return ranks, sched

    def _schedule(self, spec: CollectiveSpec) -> tuple[tuple[int, ...], Schedule, str | None]:
        ranks = validate_spec(spec, self.num_ranks)
        algo, proto = split_protocol(spec.algorithm)
        if proto is not None and not self.nccl:
            raise AlgorithmError(
                f"algorithm {spec.algorithm!r}: NCCL protocols run on clusters with collectives: nccl "
                "(dgx-a100, dgx-h100)"
            )
        algo = algo or self.algorithms.get(spec.kind) or default_algorithm(spec.kind)
        hosts = self.topology.hosts_of(ranks)
        rings = rail_rings(hosts) if self.nccl else None
        sched = build_schedule(
            spec.kind, algo, len(ranks), spec.size_bytes / self.chunks, root_index(spec), hosts, rings
        )
        return ranks, sched, proto

    def _channel_share(self, ranks: tuple[int, ...], sched: Schedule) -> np.ndarray | None:
        """Channels of the schedule using each link, for channels that split the links they share."""
        if not sched.shared or len(sched.channels) < 2:
            return None
        topo = self.topology
        count = np.zeros(len(topo.links))
        for channel in sched.channels:
            used: set[int] = set()
            for stage in channel:
                for a, b in zip(stage.src.tolist(), stage.dst.tolist(), strict=True):
                    used.update(topo.route(ranks[a], ranks[b]).links)
            count[list(used)] += 1
        return np.maximum(count, 1.0)

    def _route_bw(self, route, share: np.ndarray | None) -> float:
        """Bandwidth of a route (bytes/ns): its narrowest link at the rate collectives reach, split by share."""
        if self._eff_bw is None and share is None:
            return route.bottleneck_bytes_per_ns
        if not route.links:
            return float("inf")
        idx = np.array(route.links, dtype=np.int64)
        bw = self.topology.link_bandwidth if self._eff_bw is None else self._eff_bw
        return float((bw[idx] / share[idx]).min() if share is not None else bw[idx].min())

    def _cost_fn(self, ranks: tuple[int, ...], share: np.ndarray | None = None):
        topo = self.topology
        cache: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

        def cost(stage: Stage) -> tuple[np.ndarray, np.ndarray]:
            key = id(stage)
            if key not in cache:
                routes = [topo.route(ranks[a], ranks[b]) for a, b in zip(stage.src, stage.dst, strict=True)]
                lat = np.array([r.latency_ns for r in routes])
                bw = np.array([self._route_bw(r, share) for r in routes])
                dur = lat + stage.nbytes / bw + self.endpoint_delay_ns
                if stage.extra_ns is not None:
                    dur = dur + stage.extra_ns
                red = (
                    stage.nbytes / self.reduction_bpns
                    if stage.reduce and self.reduction_bpns
                    else np.zeros(len(stage.src))
                )
                cache[key] = (dur, red, stage.nbytes / bw)
            return cache[key][:2]

        def occupancy(stage: Stage) -> np.ndarray:
            cost(stage)
            return cache[id(stage)][2]

        return cost, occupancy

    def start_collective(self, now_ns: int, spec: CollectiveSpec) -> int:
        """Compute the collective's per-rank finish times at start (closed form) and return its handle."""
        now_ns = self._check_now(now_ns)
        return self._register(tuple([now_ns + x for x in self._collective_offsets(spec)]))

    def fixed_collective_ns(self, spec: CollectiveSpec) -> int:
        """How long the collective takes, to its last rank's finish: the same for every start time (no
        contention), so the engine finishes its members without starting it (replay/network_port.py)."""
        return max(self._collective_offsets(spec))

    def _collective_offsets(self, spec: CollectiveSpec) -> tuple[int, ...]:
        # Contention-free: the per-rank durations depend on the spec alone, and a training iteration
        # repeats the same collective (layer x micro-batch) on the same group, so each distinct spec is
        # evaluated once. Only int sizes are cached: 1.0 == 1 would otherwise skip validate_spec's check.
        key = spec if type(spec.size_bytes) is int and type(spec.ranks) is tuple else None
        try:
            offsets = self._offsets.get(key) if key is not None else None
        except TypeError:  # an unhashable field: not cached, validate_spec below reports it
            key = offsets = None
        if offsets is None:
            ranks, sched, proto = self._schedule(spec)
            t0 = np.zeros(len(ranks))
            share = self._channel_share(ranks, sched)
            cost, occupancy = self._cost_fn(ranks, share)
            # A sender's link carries its steps one after another (issue 10 bug 2: without this a ring
            # with one NIC hop ran at NVLink speed except on the steps crossing the NIC).
            f = run_chunked(lambda _c: sched, self.chunks, self.in_flight, t0, cost, occupancy=occupancy)
            if self.nccl and len(ranks) > 1 and nccl_protocol_applies(sched.kind, sched.algorithm):
                # NCCL mode: the protocol NCCL's tuning model picks from the Simple ring's bandwidth time
                # (or the one forced, `ring/LL128`), then the collective as that protocol runs it.
                hosts = self.topology.hosts_of(ranks)
                if proto is None:
                    proto = choose_protocol(
                        sched.kind, len(ranks), len(set(hosts)), float(f.max()) * self.chunks
                    )
                self._protocols[spec] = proto
                psched = with_protocol(sched, proto, hosts)
                cost, occupancy = self._cost_fn(ranks, share)
                f = run_chunked(lambda _c: psched, self.chunks, self.in_flight, t0, cost, occupancy=occupancy)
            offsets = tuple(ceil_ns(x) for x in f)
            if key is not None:
                self._offsets[key] = offsets
        return offsets

    def nccl_protocol(self, spec: CollectiveSpec) -> str | None:
        """The NCCL protocol the collective runs with (NCCL mode, ring AR/RS/AG), else None."""
        self._collective_offsets(spec)
        return self._protocols.get(spec)

    def start_p2p(self, now_ns: int, src: int, dst: int, size_bytes: int) -> int:
        """Route latency + bytes / bottleneck bandwidth, at now_ns."""
        now_ns = self._check_now(now_ns)
        return self._register((now_ns + self.fixed_p2p_ns(src, dst, size_bytes),))

    def fixed_p2p_ns(self, src: int, dst: int, size_bytes: int) -> int:
        """How long a transfer takes: the same for every start time (no contention)."""
        # The time depends on (src, dst, size) alone; pipeline traces repeat each transfer per micro-batch.
        key = (src, dst, size_bytes) if type(src) is type(dst) is type(size_bytes) is int else None
        d = self._p2p_ns.get(key) if key is not None else None
        if d is None:
            validate_ranks((src, dst), self.num_ranks)
            check_size(size_bytes)
            r = self.topology.route(src, dst)
            t = r.latency_ns + (size_bytes / self._route_bw(r, None) if r.links else 0.0)
            t += self.endpoint_delay_ns if src != dst else 0.0
            d = ceil_ns(t)
            if key is not None:
                self._p2p_ns[key] = d
        return d
