"""The `analytical` model: latency along the route plus bytes over its bottleneck bandwidth, no contention."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from xsim.netmodels.algorithms import Schedule, Stage, build_schedule, canonical_algorithm, default_algorithm
from xsim.netmodels.api import (
    CollectiveSpec,
    ceil_ns,
    check_size,
    root_index,
    validate_ranks,
    validate_spec,
)
from xsim.netmodels.closed_form import ClosedFormModel
from xsim.netmodels.errors import AlgorithmError, NetworkModelError
from xsim.netmodels.executor import run_chunked
from xsim.netmodels.nccl import (
    NVLS_ALGORITHMS,
    PROTOCOL_NAMES,
    channel_caps,
    effective_link_bandwidth,
    graph_channels,
    group_arch,
    ll_max_gbps,
    nccl_protocol_applies,
    nvls_group_graph,
    nvls_schedule,
    p2p_links,
    pat_applies,
    predicted_nvls_ns,
    predicted_pat_ns,
    predicted_ring_ns,
    predicted_tree_ns,
    protocol_factor,
    rail_rings,
    split_protocol,
    with_protocol,
)
from xsim.netmodels.topology import Topology
from xsim.netmodels.units import parse_bandwidth, parse_time_ns


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


# Chunks of the tree schedule NCCL's choice is predicted from (see _nccl_choice): enough for the middle
# slots to carry both directions, as the steady state of NCCL's pipeline does.
PREDICT_TREE_CHUNKS = 8
TREE_REFERENCE_BYTES = 1 << 30


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
        self._p2p_ns: dict[tuple[int, int, int], int] = {}  # (src, dst, size) -> duration, see start_p2p
        # NCCL mode: the (algorithm, protocol, bandwidth share) each collective ran with.
        self._choices: dict[CollectiveSpec, tuple[str, str, float]] = {}
        self._tree_rate: dict[tuple[int, ...], float] = {}  # group -> tree bandwidth ns per byte
        self._ring_rate: dict[tuple, float] = {}  # (kind, group) -> ring bandwidth ns per byte
        # NCCL mode: one-host groups of equal shape (_shape_key) -> (offsets, (algorithm, protocol)).
        self._by_shape: dict[tuple, tuple[tuple[int, ...], tuple[str, str, float] | None]] = {}
        self._sigs: dict[int, tuple] = {}  # rank -> its scale-up links' (rate, delay), see _scale_up_sig
        self._nsigs: dict[int, tuple] = {}  # rank -> its PCIe and NIC links' (rate, delay), see _nic_sig

    def schedule(self, spec: CollectiveSpec) -> tuple[tuple[int, ...], Schedule]:
        """Validate spec and build the schedule of one chunk (before any NCCL protocol is applied)."""
        ranks, sched, _ = self._schedule(spec)
        return ranks, sched

    def _schedule(self, spec: CollectiveSpec) -> tuple[tuple[int, ...], Schedule, str | None]:
        ranks, sched, proto, _ = self._schedule_forced(spec)
        return ranks, sched, proto

    def _schedule_forced(self, spec: CollectiveSpec) -> tuple[tuple[int, ...], Schedule, str | None, bool]:
        """Ranks, schedule, forced protocol and whether the algorithm was named (spec or options)."""
        ranks = validate_spec(spec, self.num_ranks)
        algo, proto = split_protocol(spec.algorithm)
        if proto is not None and not self.nccl:
            raise AlgorithmError(
                f"algorithm {spec.algorithm!r}: NCCL protocols run on clusters with collectives: nccl "
                "(dgx-a100, dgx-a800, dgx-h100)"
            )
        algo = algo or self.algorithms.get(spec.kind)
        forced = algo is not None
        algo = algo or default_algorithm(spec.kind)
        sched = self._build(spec, ranks, algo)
        return ranks, sched, proto, forced

    def _build(
        self, spec: CollectiveSpec, ranks: tuple[int, ...], algo: str, tree_chunks: int | None = None
    ) -> Schedule:
        hosts = self.topology.hosts_of(ranks)
        if self.nccl and canonical_algorithm(algo)[0] in NVLS_ALGORITHMS:
            return self._nvls(spec, ranks, canonical_algorithm(algo)[0])
        rings = rail_rings(hosts) if self.nccl else None
        return build_schedule(
            spec.kind,
            algo,
            len(ranks),
            spec.size_bytes / self.chunks,
            root_index(spec),
            hosts,
            rings,
            nccl=self.nccl,
            tree_chunks=tree_chunks,
        )

    def _nvls(self, spec: CollectiveSpec, ranks: tuple[int, ...], algo: str) -> Schedule:
        """The NVLS schedule of a collective (netmodels.nccl.nvls_schedule), or one error line where the
        group cannot run it."""
        g = nvls_group_graph(self.topology, ranks)
        if g is None or g.algorithm != algo or not nccl_protocol_applies(spec.kind, algo):
            raise AlgorithmError(
                f"algorithm {algo} cannot run {spec.kind} on ranks {ranks[0]}..{ranks[-1]}: NVLS needs Hopper or "
                "later GPUs on an NVSwitch, 2 or more per node alike on every node, a NIC per GPU across nodes; "
                "nvls runs AllReduce, ReduceScatter, AllGather on one node, nvls_tree AllReduce across nodes"
            )
        return nvls_schedule(self.topology, ranks, spec.kind, spec.size_bytes / self.chunks, g)

    def _run(self, ranks: tuple[int, ...], sched: Schedule) -> np.ndarray:
        """Per-position finish offsets of a schedule run in this model's chunks."""
        cost, occupancy = self._cost_fn(ranks, self._channel_share(ranks, sched))
        t0 = np.zeros(len(ranks))
        # A sender's link carries its steps one after another (issue 10 bug 2: without this a ring
        # with one NIC hop ran at NVLink speed except on the steps crossing the NIC).
        return run_chunked(lambda _c: sched, self.chunks, self.in_flight, t0, cost, occupancy=occupancy)

    def _ring_ns_per_byte(self, spec: CollectiveSpec, ranks: tuple[int, ...]) -> float:
        """The ring's Simple bandwidth time per byte, as NCCL's model sees it (no latencies): its time at
        1 GiB, where route latencies are negligible, per byte. Once per (kind, group)."""
        key = (spec.kind, ranks)
        rate = self._ring_rate.get(key)
        if rate is None:
            ref = CollectiveSpec(spec.kind, TREE_REFERENCE_BYTES * self.chunks, ranks)
            t = float(self._run(ranks, self._build(ref, ranks, "ring")).max()) * self.chunks
            rate = self._ring_rate[key] = t / (TREE_REFERENCE_BYTES * self.chunks)
        return rate

    def _nvls_ns_per_byte(self, spec: CollectiveSpec, ranks: tuple[int, ...], algo: str) -> float:
        """The NVLS schedule's bandwidth time per byte on this fabric (its time at 1 GiB less NCCL's
        latency): NCCL's figure on a fabric as fast as its NICs, more behind oversubscribed uplinks. Once
        per (kind, group)."""
        key = ("nvls", spec.kind, ranks)
        rate = self._ring_rate.get(key)
        if rate is None:
            ref = CollectiveSpec(spec.kind, TREE_REFERENCE_BYTES * self.chunks, ranks)
            sched = self._nvls(ref, ranks, algo)
            t = float(self._run(ranks, sched).max()) * self.chunks
            lat = float(sched.channels[0][0].extra_ns.max()) * self.chunks
            rate = self._ring_rate[key] = (t - lat) / (TREE_REFERENCE_BYTES * self.chunks)
        return rate

    def _tree_ns_per_byte(self, spec: CollectiveSpec, ranks: tuple[int, ...]) -> float:
        """The NCCL tree's bandwidth time per byte as NCCL's model sees it, a perfect pipeline.

        In K chunks the tree takes T(K) = x + c/K: fill and drain slots c/K, steady state x; so
        x = 2 T(2K) - T(K), taken at 1 GiB (where route latencies are negligible) and per byte, since
        the bandwidth time is linear in the size. Once per group (a group's trees are its hosts').
        """
        rate = self._tree_rate.get(ranks)
        if rate is None:
            ref = CollectiveSpec("all_reduce", TREE_REFERENCE_BYTES * self.chunks, ranks)
            k = PREDICT_TREE_CHUNKS
            t1 = float(self._run(ranks, self._build(ref, ranks, "double_binary_tree", k)).max())
            t2 = float(self._run(ranks, self._build(ref, ranks, "double_binary_tree", 2 * k)).max())
            rate = self._tree_rate[ranks] = (2 * t2 - t1) / TREE_REFERENCE_BYTES
        return rate

    def _nccl_choice(
        self, spec: CollectiveSpec, ranks: tuple[int, ...], sched: Schedule, proto: str | None, forced: bool
    ) -> tuple[Schedule, str, str] | None:
        """The (schedule, algorithm, protocol) NCCL's tuning model predicts fastest, or None where no NCCL
        protocol applies. Candidates: the forced algorithm, else ring and (AllReduce) tree; the forced
        protocol, else all three. Each is predicted from its schedule's Simple bandwidth time here."""
        hosts = self.topology.hosts_of(ranks)
        nodes = len(set(hosts))
        protos = PROTOCOL_NAMES if proto is None else (proto,)
        arch = group_arch(self.topology, ranks)
        ll_max = ll_max_gbps(nodes, arch)
        caps = channel_caps(arch, nodes, graph_channels(self.topology, ranks))
        cands: list[tuple[float, int, str, str, Schedule | None, float]] = []
        nvls = nvls_group_graph(self.topology, ranks)
        algos = [sched.algorithm] if forced else ["ring", "double_binary_tree"]
        if not forced and nvls is not None:
            algos.append(nvls.algorithm)
        if not forced and pat_applies(spec.kind, len(ranks), nodes):
            algos.append("pat")
        for i, algo in enumerate(algos):
            if algo == "pat":
                # PAT runs Simple only (tuning.cc skips its other protocols); timed from the ring's Simple
                # bandwidth time, as NVLS is from its own.
                if proto not in (None, "Simple"):
                    raise AlgorithmError(f"algorithm pat runs the Simple protocol only, not {proto}")
                x = self._ring_ns_per_byte(spec, ranks) * spec.size_bytes
                s = sched if algo == sched.algorithm else None
                cands.append((predicted_pat_ns(len(ranks), x), i * 3 + 2, algo, "Simple", s, 0.0))
                continue
            if not nccl_protocol_applies(spec.kind, algo):
                continue
            if algo in NVLS_ALGORITHMS:
                # NVLS runs Simple only (tuning.cc skips its other protocols).
                if proto not in (None, "Simple"):
                    raise AlgorithmError(f"algorithm {algo} runs the Simple protocol only, not {proto}")
                # The schedule is built only if NVLS wins (it holds a transfer per node peer).
                s = sched if algo == sched.algorithm else None
                x = self._nvls_ns_per_byte(spec, ranks, algo) * spec.size_bytes
                t = predicted_nvls_ns(nvls, spec.kind, len(ranks), spec.size_bytes, x)
                cands.append((t, i * 3 + 2, algo, "Simple", s, 0.0))
                continue
            s = sched if algo == sched.algorithm else self._build(spec, ranks, algo)
            if algo == "ring":
                x = self._ring_ns_per_byte(spec, ranks) * spec.size_bytes
            else:
                x = self._tree_ns_per_byte(spec, ranks) * spec.size_bytes
            for pr in protos:
                if algo == "ring":
                    t = predicted_ring_ns(
                        pr, spec.kind, len(ranks), nodes, spec.size_bytes, len(s.channels), x, ll_max, caps
                    )
                else:
                    t = predicted_tree_ns(pr, len(ranks), nodes, spec.size_bytes, x, ll_max, caps)
                cands.append((t, i * 3 + PROTOCOL_NAMES.index(pr), algo, pr, s, x))
        if not cands:
            return None
        _, _, algo, pr, s, x = min(cands, key=lambda c: (c[0], c[1]))
        if algo in NVLS_ALGORITHMS:
            s = s if s is not None else self._nvls(spec, ranks, algo)
            return s, algo, pr, 1.0  # the schedule carries NVLS's latency and bandwidth already
        if algo == "pat":
            s = s if s is not None else self._build(spec, ranks, "pat")
            return s, algo, pr, 1.0  # the schedule carries PAT's latency and bandwidth already
        factor = protocol_factor(s, pr, nodes, spec.size_bytes, x, ll_max, caps)
        return with_protocol(s, pr, hosts, factor), algo, pr, factor

    def _channel_share(self, ranks: tuple[int, ...], sched: Schedule) -> np.ndarray | None:
        """How many transfers of the collective use each link at once, for channels that split the links
        they share: per channel, the most transfers of one stage on the link, summed over channels."""
        if not sched.shared:
            return None
        topo = self.topology
        count = np.zeros(len(topo.links))
        for channel in sched.channels:
            most = np.zeros(len(topo.links))
            for stage in channel:
                used = [
                    li
                    for a, b in zip(stage.src.tolist(), stage.dst.tolist(), strict=True)
                    for li in topo.route(ranks[a], ranks[b]).links
                ]
                if used:
                    np.maximum(most, np.bincount(used, minlength=len(topo.links)), out=most)
            count += most
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
        skey = self._shape_key(spec) if offsets is None and self.nccl else None
        if skey is not None and skey in self._by_shape:
            offsets, choice = self._by_shape[skey]
            if key is not None:
                self._offsets[key] = offsets
                if choice is not None:
                    self._choices[key] = choice
            return offsets
        if offsets is None:
            ranks, sched, proto, forced = self._schedule_forced(spec)
            choice = (
                self._nccl_choice(spec, ranks, sched, proto, forced) if self.nccl and len(ranks) > 1 else None
            )
            if choice is None:
                f = self._run(ranks, sched)
            else:
                # NCCL mode: the algorithm and protocol NCCL's tuning model picks (or the ones forced,
                # `ring/LL128`, `tree`), then the collective as that protocol runs it.
                psched, algo, pr, factor = choice
                if key is not None:
                    self._choices[key] = (algo, pr, factor)
                f = self._run(ranks, psched)
            offsets = tuple(ceil_ns(x) for x in f)
            if key is not None:
                self._offsets[key] = offsets
            if skey is not None:
                self._by_shape[skey] = (offsets, None if choice is None else choice[1:])
        return offsets

    def _shape_key(self, spec: CollectiveSpec) -> tuple | None:
        """NCCL mode: a key equal for groups that time identically, or None.

        A collective's routes use only its ranks' own links when the group sits on one host (scale-up
        links) or when every NIC hangs off one switch (then also each rank's PCIe and NIC links): groups
        with the same kind, size, algorithm, root position and, per rank in group order, host (numbered
        by first appearance) and those links' rates NCCL reaches and delays time identically.
        """
        ranks = validate_spec(spec, self.num_ranks)
        hosts = self.topology.rank_hosts
        one_host = all(hosts[r] == hosts[ranks[0]] for r in ranks)
        if len(ranks) < 2 or not (one_host or self._single_switch()):
            return None
        ids: dict[str, int] = {}
        per_rank = tuple(
            (ids.setdefault(hosts[r], len(ids)), self._scale_up_sig(r), () if one_host else self._nic_sig(r))
            for r in ranks
        )
        return (spec.kind, spec.size_bytes, spec.algorithm, root_index(spec), per_rank)

    def timing_key(self, spec: CollectiveSpec) -> tuple | None:
        """netmodels.api.TimingClasses: the shape key (NCCL mode; None where groups cannot be shown alike)."""
        return self._shape_key(spec) if self.nccl else None

    def memo_tables(self) -> tuple[dict, ...]:
        """netmodels.api.TimingClasses: every cache here is keyed by a transfer or rank alone."""
        return (
            self._offsets, self._p2p_ns, self._choices, self._tree_rate, self._ring_rate, self._by_shape,
            self._sigs, self._nsigs,
        )  # fmt: skip

    def _single_switch(self) -> bool:
        """Whether every NIC of the cluster hangs off one switch (fabric kind "switch")."""
        c = self.topology._cache
        flag = c.get("single_switch")
        if flag is None:
            g = self.topology.graph
            hubs = {
                v
                for v, k in g.nodes(data="kind")
                if k == "switch" and not str(v).endswith(("/nvswitch", "/pcie"))
            }
            flag = c["single_switch"] = len(hubs) == 1
        return flag

    def _nic_sig(self, rank: int) -> tuple:
        """(rate, delay) of the links a rank's inter-host traffic takes: GPU <-> NIC <-> switch."""
        sig = self._nsigs.get(rank)
        if sig is None:
            topo = self.topology
            g = topo.graph
            index = topo._cache["index"]
            lat = topo.link_latency
            dev = topo.rank_nodes[rank]
            out: list[tuple[float, float]] = []
            for nic in sorted(v for v in g.successors(dev) if g.nodes[v].get("kind") == "nic"):
                hops = [(dev, nic), (nic, dev)]
                hops += [(nic, w) for w in sorted(g.successors(nic)) if g.nodes[w].get("kind") == "switch"]
                hops += [(w, nic) for w in sorted(g.predecessors(nic)) if g.nodes[w].get("kind") == "switch"]
                out += [(float(self._eff_bw[index[h]]), float(lat[index[h]])) for h in hops]
            sig = self._nsigs[rank] = tuple(out)
        return sig

    def _scale_up_sig(self, rank: int) -> tuple:
        sig = self._sigs.get(rank)
        if sig is None:
            topo = self.topology
            dev = topo.rank_nodes[rank]
            index = topo._cache["index"]
            lat = topo.link_latency
            g = topo.graph
            ups = [index[(dev, v)] for v in g.successors(dev) if g[dev][v].get("kind") == "scaleup"]
            downs = [index[(u, dev)] for u in g.predecessors(dev) if g[u][dev].get("kind") == "scaleup"]
            sig = self._sigs[rank] = (
                tuple((float(self._eff_bw[i]), float(lat[i])) for i in ups),
                tuple((float(self._eff_bw[i]), float(lat[i])) for i in downs),
            )
        return sig

    def nccl_choice(self, spec: CollectiveSpec) -> tuple[str, str] | None:
        """(algorithm, protocol) the collective runs with in NCCL mode (ring AR/RS/AG, tree AR), else None."""
        plan = self.nccl_plan(spec)
        return None if plan is None else plan[:2]

    def nccl_plan(self, spec: CollectiveSpec) -> tuple[str, str, float] | None:
        """(algorithm, protocol, bandwidth share) of the collective in NCCL mode, else None."""
        self._collective_offsets(spec)
        return self._choices.get(spec)

    def nccl_protocol(self, spec: CollectiveSpec) -> str | None:
        """The NCCL protocol the collective runs with (see nccl_choice)."""
        choice = self.nccl_choice(spec)
        return None if choice is None else choice[1]

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
            if self.nccl:
                # NCCL mode: a cross-node P2P relays over NVLink to the GPU on the destination's rail (PXN).
                links, lat = p2p_links(self.topology, src, dst)
                bw = float(self._eff_bw[list(links)].min()) if links else float("inf")
                t = lat + (size_bytes / bw if links else 0.0)
            else:
                r = self.topology.route(src, dst)
                t = r.latency_ns + (size_bytes / self._route_bw(r, None) if r.links else 0.0)
            t += self.endpoint_delay_ns if src != dst else 0.0
            d = ceil_ns(t)
            if key is not None:
                self._p2p_ns[key] = d
        return d
