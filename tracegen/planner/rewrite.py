"""Graph rewriting (contract D): heterogeneous gradient synchronization, barriers and stage-boundary resharding.

Inserted structure, per rank:
- gradient sync: for each DP group holding the rank, one ALL_REDUCE per ring it sits in, on that ring's own
  process group, of the ring's chunk bytes (d/L); groups in backward order (highest layers first), after the
  rank's local backward and its stage-boundary sends; the optimizer depends on them all;
- DP barrier group: a BARRIER collective on the DP group's ranks before its rings (a Chakra dependency names
  a node of the same rank's file, so "wait until every member has finished its backward" can only be a
  collective); it also puts the straggler wait on one node per DP group;
- pipeline barrier group: a BARRIER on the replica's ranks after its gradient sync and before the optimizer,
  the point where Megatron's model-parallel gradient-norm all-reduce holds every stage of a replica; stage
  order inside an iteration is already enforced by the activation and gradient P2P transfers;
- stage-boundary resharding: the generator's naive P2P nodes (attr pp_boundary) between stages of different
  TP are replaced by the strategy's messages (tracegen.planner.reshard), multi-step ones chained by dependencies.
Every dependency the rewriter adds is a data dependency: ASTRA-sim's legacy feeder ignores ctrl_deps.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import methodcaller
from typing import Any

from xsim.tracegen.bundle import RankTwins
from xsim.tracegen.planner import DpGroup, PipelineBoundary, Plan, PlanError, build_plan
from xsim.tracegen.planner.reshard import STRATEGY_NAMES, Message, reshard_plan
from xsim.tracegen.rank_nodes import CopiedRank, RankNodes
from xsim.traces import pb
from xsim.traces.attrs import (
    CHUNK,
    COMM_DST,
    COMM_SIZE,
    COMM_SRC,
    COMM_TAG,
    COMM_TYPE,
    DEVICE_GROUP,
    IS_CPU_OP,
    LAYER,
    MICRO_BATCH,
    PG_NAME,
    PHASE,
    PP_BOUNDARY,
    RESHARD,
    RING,
    STAGE,
    comm_dst,
    comm_src,
    comm_tag,
    get_int,
    make_attr,
    pg_name,
)
from xsim.traces.errors import XsimError
from xsim.traces.graph import DepGraph, GraphEdit, unique
from xsim.traces.io import DEPLOYMENT_FILE

SYNC = "sync"
P2P_TYPES = (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)


class RewriteError(XsimError):
    """A bundle the rewriter cannot rewrite consistently (missing anchors, already rewritten, ...)."""


# Called after each pass with its name and the edited node lists of the ranks it changed (copies).
PassCheck = Callable[[str, dict[int, list[pb.Node]]], None]


def passes(
    plan: Plan, strategy: str, *, barriers: bool = True
) -> list[tuple[str, Callable[[_Rewriter], None]]]:
    """The named passes a rewrite runs, in order: each reads the original graphs and queues its edits.

    - `reshard_boundaries`: the naive P2P nodes of TP-changing stage boundaries become the strategy's
      messages (all but `naive`);
    - `gradient_sync`: the heterogeneous gradient synchronization, with the DP and pipeline barrier groups
      when `barriers` (they sit between its anchors and its rings, so they are part of this pass).
    """
    out: list[tuple[str, Callable[[_Rewriter], None]]] = []
    if strategy != "naive":
        out.append(("reshard_boundaries", _Rewriter.reshard_boundaries))
    if plan.heterogeneous:
        sync_barriers = barriers and strategy != "naive"
        out.append(("gradient_sync", lambda rw: rw.gradient_sync(barriers=sync_barriers)))
    return out


def rewrite_bundle(
    bundle: Any,
    deployment: Any,
    strategy: str,
    *,
    plan: Plan | None = None,
    barriers: bool = True,
    check: PassCheck | None = None,
    twins: RankTwins | None = None,
) -> Any:
    """Insert gradient sync, barriers and resharding into `bundle` (in place) and return it.

    A no-op for homogeneous deployments (the generator already synchronizes them) whose adjacent stages
    share a TP degree. `naive` inserts one uniform AllReduce per DP group, no barrier and no resharding.
    `check`, when given, sees the graphs after each pass (tests run the trace checks there). `twins`, the
    generator's record of copied ranks for this very bundle, lets copies share their template's tags and
    dependency graph instead of reading them again (same result, faster).
    """
    if strategy not in STRATEGY_NAMES:
        raise RewriteError(f"unknown reshard strategy {strategy!r} (known: {', '.join(STRATEGY_NAMES)})")
    try:
        plan = plan or build_plan(deployment)
    except PlanError as exc:
        raise RewriteError(f"cannot plan the deployment: {exc}") from None
    rw = _Rewriter(bundle, plan, strategy, bool(getattr(deployment, "sequence_parallel", False)), twins)
    for name, run in passes(plan, strategy, barriers=barriers):
        run(rw)
        if check is not None:
            check(name, rw.edited(copy=True))
    rw.commit()
    return bundle


# Templates whose collectives' (pg_name, id) are kept at most (_Rewriter._same_pg_collectives): ranks are
# visited in order, so a template's copies (a device group's ranks) come together; a bound on memory only.
_MAX_COLL_RECORDS = 64


class _Rank:
    """One rank's graph (traces.graph.DepGraph, by node id) with its queued edits and attribute tags.

    A twin's node list is read from the bundle only when an edit is applied or a lambda of `structure`
    needs it (`nodes`); until then `peek` reads single nodes, so a copied rank the rewrite leaves alone
    stays bytes (tracegen.rank_nodes).
    """

    def __init__(
        self,
        rank: int,
        nodes: list[pb.Node] | None,
        pos: dict[int, int],
        tags: list[tuple[str, int, int | None]],
        twin: _Rank | None = None,
        source: Any = None,
    ) -> None:
        self.rank, self.pos = rank, pos
        self._nodes, self._source = nodes, source  # source: the bundle's rank -> nodes mapping
        self._tags = tags
        # A twin (same ids, dependencies, node types and tags) shares the graph, the ids and what is
        # derived from those alone (`structure`); DepGraph is read-only here.
        if twin is not None:
            self.graph, self.ids, self._structure = twin.graph, twin.ids, twin._structure
        else:
            assert nodes is not None
            self.graph, self.ids = DepGraph(nodes), [n.id for n in nodes]
            self._structure = {}
        self.edit = GraphEdit(nodes if nodes is not None else [], self.graph)  # ids are unique (_Rewriter)

    @property
    def nodes(self) -> list[pb.Node]:
        """The rank's node list (taken from the bundle on first use)."""
        if self._nodes is None:
            self._nodes = self.edit.nodes = self._source[self.rank]
        return self._nodes

    def peek(self, i: int) -> pb.Node:
        """The node at position i, to read only."""
        if self._nodes is not None:
            return self._nodes[i]
        if isinstance(self._source, RankNodes):
            return self._source.peek(self.rank, i)
        return self.nodes[i]

    def held(self, positions: Sequence[int]) -> tuple[Any, list[int | bytes]] | None:
        """How the nodes at these ascending positions are held while the rank is still bytes
        (RankNodes.held); None: read them with peek."""
        if self._nodes is None and isinstance(self._source, RankNodes):
            return self._source.held(self.rank, positions)
        return None

    def structure(self, key: str, make: Callable[[], Any]) -> Any:
        """`make()` for this rank, computed once per set of twins: only for values depending on node ids,
        dependencies, types and tags (never on attributes twins differ in, nor on queued edits)."""
        hit = self._structure.get(key)
        if hit is None:
            hit = self._structure[key] = make()
        return hit

    def deps(self, nid: int) -> list[int]:
        n = self.peek(self.pos[nid])
        return [*n.data_deps, *n.ctrl_deps]

    def tags(self, i: int) -> tuple[str, int, int | None]:
        """(phase, layer, micro_batch) of the node at position i (read once, when the rewriter starts)."""
        return self._tags[i]

    def children(self, nid: int) -> list[int]:
        """Nodes depending on `nid`."""
        return [self.ids[c] for c in self.graph.children(self.pos[nid])]

    def frontier(self, ids: Sequence[int]) -> list[int]:
        """The nodes of `ids` no other node of `ids` depends on (the last ones to finish)."""
        return [self.ids[i] for i in self.graph.frontier([self.pos[i] for i in ids])]

    def descendants(self, start: Sequence[int]) -> set[int]:
        """`start` and every node depending on it, transitively."""
        return {self.ids[i] for i in self.graph.descendants(self.pos[i] for i in start)}

    def apply(self, *, copy: bool = False) -> list[pb.Node]:
        """The edited node list (GraphEdit.apply)."""
        self.nodes  # noqa: B018 - the list the edits apply to
        return self.edit.apply(copy=copy)

    def apply_bytes(self) -> CopiedRank | None:
        """The edits applied to a rank still held as bytes, as bytes: the nodes they change or insert
        serialized, the others left as they are; None when the rank is a list (use `apply`)."""
        source = self._source
        held = source.copy_of(self.rank) if self._nodes is None and isinstance(source, RankNodes) else None
        if held is None:
            return None
        refs = self.edit.apply_refs(held.refs(), held.node, _serialize, self.graph)
        return CopiedRank.of_refs(held.records, refs)


@dataclass(frozen=True)
class _BoundaryPass:
    """One micro-batch crossing one pipeline boundary in one direction, as resharded: per involved rank,
    what its new transfers depend on, where they go (before its old transfers, or after those
    dependencies) and the old transfer whose layer they take (None: no old one on that side)."""

    b: PipelineBoundary
    direction: str
    mb: int
    base: dict[int, list[int]]
    pos: dict[int, tuple[str, int]]
    template: dict[int, pb.Node | None]


def _old_by_rank(
    old: list[tuple[int, pb.Node]], senders: Sequence[int], receivers: Sequence[int], where: str
) -> dict[int, list[pb.Node]]:
    """The pass's old transfers per rank, each a send on a sender or a receive on a receiver."""
    old_on: dict[int, list[pb.Node]] = defaultdict(list)
    for r, n in old:
        want = pb.COMM_SEND_NODE if r in senders else pb.COMM_RECV_NODE
        if n.type != want or r not in (*senders, *receivers):
            raise RewriteError(
                f"rank {r}: node {n.id} ({n.name}): unexpected {pb.node_type_name(n.type)} in {where}"
            )
        old_on[r].append(n)
    return old_on


def _templates(
    old_on: dict[int, list[pb.Node]], senders: Sequence[int], receivers: Sequence[int]
) -> dict[int, pb.Node | None]:
    """Per rank, its first old transfer, else the first of its side's."""
    template: dict[int, pb.Node | None] = {}
    for side in (senders, receivers):
        first = next((old_on[x][0] for x in side if old_on[x]), None)
        for r in side:
            template[r] = old_on[r][0] if old_on[r] else first
    return template


def _backward_and_sends(g: _Rank) -> tuple[list[tuple[int, int]], list[int]]:
    """A rank's backward compute and collectives as (node id, layer) in node order, and its stage-boundary
    sends (edited ones included)."""
    tags = g._tags
    bwd = g.structure(
        "bwd",
        lambda g=g, tags=tags: [
            (n.id, tags[i][1])
            for i, n in enumerate(g.nodes)
            if tags[i][0] == "bwd" and n.type not in P2P_TYPES
        ],
    )
    # The sync also waits for the rank's stage-boundary sends: a blocking collective holding the
    # rank's communication slot must not starve a send its peers need to finish their backward.
    # (pp_boundary is an attribute, yet the generator sets it alike on twins: same node, same value.)
    pp_sends = g.structure(
        "pp_sends",
        lambda g=g: [
            n.id for n in g.nodes if n.type == pb.COMM_SEND_NODE and get_int(n, PP_BOUNDARY, 0) == 1
        ],
    )
    sends = [i for i in pp_sends if not g.edit.replaced(i)] + [
        n.id for n in g.edit.inserted if n.type == pb.COMM_SEND_NODE
    ]
    return bwd, sends


def _twin_rank(r: int, first: _Rank | None, source: Any, tags: list) -> _Rank:
    """Rank r, which the generator built as a copy of another rank (`first`: that rank, when read already;
    tags: its tags): same ids, dependencies and tags, and no node carries `reshard` (the generator never
    writes it)."""
    if first is not None:
        return _Rank(r, None, first.pos, first._tags, first, source)
    nodes = source[r]
    pos = {n.id: i for i, n in enumerate(nodes)}
    if len(pos) != len(nodes):
        raise RewriteError(f"rank {r}: a node id appears twice")
    return _Rank(r, nodes, pos, tags, source=source)


def _read_rank(r: int, source: Any) -> _Rank:
    """Rank r read node by node: each node's position and (phase, layer, micro-batch) tags; a node id seen
    twice, or a node already rewritten, refused."""
    nodes = source[r]
    pos: dict[int, int] = {}
    tags = []
    for i, n in enumerate(nodes):
        if n.id in pos:
            raise RewriteError(f"rank {r}: node id {n.id} appears twice")
        phase, layer, mb, rewritten = _read_tags(n)
        if rewritten:
            raise RewriteError(
                f"rank {r}: node {n.id} ({n.name}) already carries {RESHARD!r}: trace is already rewritten"
            )
        pos[n.id] = i
        tags.append((phase, layer, mb))
    return _Rank(r, nodes, pos, tags, source=source)


class _Rewriter:
    def __init__(
        self,
        bundle: Any,
        plan: Plan,
        strategy: str,
        sequence_parallel: bool = False,
        twins: RankTwins | None = None,
    ) -> None:
        self.bundle, self.plan, self.strategy = bundle, plan, strategy
        self.sequence_parallel = sequence_parallel
        self.ranks: dict[int, _Rank] = {}
        source = bundle.nodes
        for r in sorted(source):
            src = twins.of.get(r) if twins is not None else None
            count = source.count(r) if isinstance(source, RankNodes) else len(source[r])
            if src is not None and len(twins.tags[src]) == count:
                self.ranks[r] = _twin_rank(r, self.ranks.get(src), source, twins.tags[src])
            else:
                self.ranks[r] = _read_rank(r, source)
        known = {r for g in plan.device_groups for r in g.ranks}
        if set(self.ranks) != known:
            raise RewriteError(
                f"bundle has ranks {_span(self.ranks)} but the deployment has ranks {_span(known)}"
            )
        # Twins share node ids and P2P tags (RankTwins), so both maxima are read once per set of twins.
        self.next_id = {
            r: max(bundle.next_id.get(r, 0), g.structure("end_id", lambda g=g: _end_id(g.nodes)))
            for r, g in self.ranks.items()
        }
        self.next_tag = 1 + max(
            (g.structure("max_tag", lambda g=g: _max_tag(g.nodes)) for g in self.ranks.values()), default=0
        )
        self.coll_by_pg: dict[int, dict[str, list[int]]] = {}
        # id(records) -> (records, {record position or node bytes: (pg_name, id)}): collectives read
        self._coll_keys: dict[int, tuple[Any, dict]] = {}
        # Groups the generator registered: its nodes name no other (so a group new to this rewrite has no
        # existing collective). Unknown for bundles read from disk, whose nodes are read instead.
        self._generated = twins is not None  # the generator's own bundle (its invariants hold)
        self._known_groups = frozenset(bundle.comm_groups) if self._generated else None
        self._group_of = {r: g for g in plan.device_groups for r in g.ranks}
        self._attr_cache: dict[tuple[str, type, Any], pb.AttributeProto] = {}

    # ---- helpers -------------------------------------------------------------------------------------
    def _node(
        self, nid: int, name: str, ntype: int, *, data_deps: Sequence[int], attrs: dict[str, Any]
    ) -> pb.Node:
        """traces.attrs.make_node, each attribute made once per (name, value): thousands of inserted nodes
        share their stage, group, phase and size attributes."""
        cache = self._attr_cache
        made = []
        for k, v in attrs.items():
            key = (k, type(v), v)  # type too: True == 1 but they are different attribute kinds
            a = cache.get(key)
            if a is None:
                a = cache[key] = make_attr(k, v)
            made.append(a)
        return pb.Node(id=nid, name=name, type=ntype, data_deps=data_deps, attr=made)

    def _id(self, r: int) -> int:
        nid = self.next_id[r]
        self.next_id[r] = nid + 1
        return nid

    def _group(self, r: int) -> Any:
        """The device group of rank r (the plan's PlanError for a rank in none)."""
        g = self._group_of.get(r)
        return g if g is not None else self.plan.group_of_rank(r)

    def _attrs(self, r: int, **extra: Any) -> dict[str, Any]:
        g = self._group_of[r]
        return {STAGE: g.pp_stage, DEVICE_GROUP: g.id, RESHARD: self.strategy, **extra}

    def _add(self, r: int, node: pb.Node, where: tuple[str, int]) -> int:
        """Queue `node` on rank r's graph: ("after" | "before", position of an original node)."""
        edit = self.ranks[r].edit
        side, position = where
        return edit.insert_after(node, position) if side == "after" else edit.insert_before(node, position)

    def _after(self, r: int, deps: Iterable[int]) -> tuple[str, int]:
        """Right after the last original node among `deps` (at the end when there is none)."""
        g = self.ranks[r]
        return "after", max((g.pos[d] for d in deps if d in g.pos), default=len(g.ids))

    def _same_pg_collectives(self, r: int, pg: str) -> list[int]:
        """Existing collectives of rank r on `pg` not after an optimizer node (so they come first everywhere)."""
        if self._known_groups is not None and pg not in self._known_groups:
            return []
        if r not in self.coll_by_pg:
            g = self.ranks[r]

            def before_opt() -> list[int]:
                tags = g._tags
                opt = [n.id for i, n in enumerate(g.nodes) if tags[i][0] == "opt"]
                after_opt = g.descendants(opt)
                return [
                    i for i, n in enumerate(g.nodes) if n.type == pb.COMM_COLL_NODE and n.id not in after_opt
                ]

            by_pg: dict[str, list[int]] = defaultdict(list)
            positions = g.structure("collectives_before_opt", before_opt)
            held = g.held(positions)
            if held is None:
                for i in positions:
                    n = g.peek(i)
                    by_pg[pg_name(n)].append(n.id)
            else:
                # (pg_name, id) by where the node is held: the ranks copied from one template share its
                # records (a device group's collectives), so each record is parsed once, not once per rank.
                records, where = held
                entry = self._coll_keys.get(id(records))
                if entry is None or entry[0] is not records:  # the entry holds its records: ids stay theirs
                    if len(self._coll_keys) >= _MAX_COLL_RECORDS:
                        self._coll_keys.clear()
                    entry = self._coll_keys[id(records)] = (records, {})
                known = entry[1]
                for h in where:
                    hit = known.get(h)  # a record position (int) or a patched node's bytes
                    if hit is None:
                        n = pb.Node.FromString(h if h.__class__ is bytes else records.payload(h))
                        hit = known[h] = (pg_name(n), n.id)
                    by_pg[hit[0]].append(hit[1])
            self.coll_by_pg[r] = by_pg
        return self.coll_by_pg[r].get(pg, [])

    def _collective(
        self,
        r: int,
        name: str,
        ctype: int,
        size: int,
        ranks: Sequence[int],
        deps: list[int],
        *,
        after_existing: bool = True,
        **attrs: Any,
    ) -> int:
        """A collective on the group of `ranks`; with `after_existing`, after the rank's existing collectives
        on that group (only safe for nodes nothing existing depends on but the optimizer)."""
        pg = self.bundle.new_group(ranks)
        if after_existing:
            deps = unique([*deps, *self._same_pg_collectives(r, pg)])
        node = self._node(
            self._id(r),
            name,
            pb.COMM_COLL_NODE,
            data_deps=deps,
            attrs={
                IS_CPU_OP: False,
                COMM_TYPE: ctype,
                COMM_SIZE: size,
                PG_NAME: pg,
                **self._attrs(r, **attrs),
            },
        )
        return self._add(r, node, self._after(r, deps))

    # ---- gradient synchronization ---------------------------------------------------------------------
    def gradient_sync(self, *, barriers: bool) -> None:
        """Per rank: DP barrier + one AllReduce per ring of each DP group, PBG barrier, optimizer deps."""
        replica_stages = defaultdict(set)
        for g in self.plan.device_groups:
            replica_stages[g.dp_replica].add(g.pp_stage)
        pbg_of = {r: pbg for pbg in self.plan.pipeline_barrier_groups for r in pbg}
        for r, g in self.ranks.items():
            bwd, sends = _backward_and_sends(g)
            # Sync starts once the rank's whole local backward is done (the DP barrier group of section
            # 4.5), not right after the covered layers: with one communication op in flight per rank
            # (ASTRA-sim's rule), a sync collective issued mid-backward holds the slot while a TP peer that
            # got there later waits on a TP collective of the next layer from this rank: a deadlock.
            ready = [*g.frontier([i for i, _ in bwd]), *sends]
            synced = self._sync_groups(r, bwd, ready, barriers)
            dg = self._group_of[r]
            final = synced
            if barriers and len(replica_stages[dg.dp_replica]) > 1:
                anchor = synced or unique(ready)
                final = [
                    self._collective(
                        r, f"pipeline_barrier[replica {dg.dp_replica}]", pb.BARRIER, 0, pbg_of[r], anchor,
                        **{LAYER: 0, PHASE: SYNC, MICRO_BATCH: -1, RING: -1, CHUNK: -1},
                    )
                ]  # fmt: skip
            tags = g._tags
            opt = g.structure(
                "opt", lambda g=g, tags=tags: [n.id for i, n in enumerate(g.nodes) if tags[i][0] == "opt"]
            )
            for nid in opt:
                g.edit.add_deps(nid, final)

    def _sync_groups(self, r: int, bwd: list[tuple[int, int]], ready: list[int], barriers: bool) -> list[int]:
        """Rank r's sync collectives of every DP group it is in, after `ready`; their ids."""
        synced: list[int] = []
        previous: list[int] = []
        # Groups in backward order (highest layers first), each after the previous one's rings: every
        # rank issues the sync collectives in one global order, so they cannot wait on each other in a cycle.
        for dp in sorted(self.plan.dp_groups, key=lambda d: -d.layers[0]):
            if r not in dp.ranks:
                continue
            lo, hi = dp.layers
            if not any(lo <= layer <= hi for _, layer in bwd):
                raise RewriteError(
                    f"rank {r}: no backward node of layers {lo}-{hi} (attributes {LAYER!r}/{PHASE!r} "
                    "missing?): cannot anchor the gradient synchronization"
                )
            previous = self._sync_group(r, dp, unique([*ready, *previous]), barriers)
            synced.extend(previous)
        return synced

    def _sync_group(self, r: int, dp: DpGroup, anchor: list[int], barrier: bool) -> list[int]:
        lo, hi = dp.layers
        common = {LAYER: 0, PHASE: SYNC, MICRO_BATCH: -1}
        deps = anchor
        if barrier:
            deps = [
                self._collective(
                    r,
                    f"dp_barrier[{lo}-{hi}]",
                    pb.BARRIER,
                    0,
                    dp.ranks,
                    anchor,
                    **common,
                    **{RING: -1, CHUNK: -1},
                )
            ]
        if self.strategy == "naive":
            # A homogeneous simulator's single DP ring over every member, one buffer size for all: the
            # largest local shard, d / min(t_i) (every byte any member holds goes round the ring).
            size = -(-dp.grad_bytes // min(dp.tps))
            return [
                self._collective(
                    r,
                    f"grad_sync[{lo}-{hi}]",
                    pb.ALL_REDUCE,
                    size,
                    dp.ranks,
                    deps,
                    **common,
                    **{RING: 0, CHUNK: -1},
                )
            ]
        return [
            self._collective(
                r, f"grad_sync[{lo}-{hi}]/ring{c}", pb.ALL_REDUCE, dp.chunk_bytes, dp.rings[c], deps,
                **common, **{RING: c, CHUNK: c},
            )
            for c in dp.rings_of(r)
        ]  # fmt: skip

    # ---- stage-boundary resharding --------------------------------------------------------------------
    def reshard_boundaries(self) -> None:
        """Replace the naive P2P nodes of every TP-changing boundary by the strategy's messages."""
        if self._generated and not any(b.reshard for b in self.plan.boundaries):
            # A generated bundle (twins given) sends pp_boundary transfers between adjacent stages of one
            # replica only, so with no boundary to reshard there is nothing to check or replace.
            return
        by_pair = {}
        for i, b in enumerate(self.plan.boundaries):
            by_pair[(b.src_group, b.dst_group)] = (i, "fwd")
            by_pair[(b.dst_group, b.src_group)] = (i, "bwd")
        keyed: dict[tuple[int, str, int], list[tuple[int, pb.Node]]] = defaultdict(list)
        for r, g in self.ranks.items():
            # Positions of the boundary transfers (types and pp_boundary are alike on twins).
            at = g.structure(
                "pp_p2p",
                lambda g=g: [
                    i
                    for i, n in enumerate(g.nodes)
                    if n.type in P2P_TYPES and get_int(n, PP_BOUNDARY, 0) == 1
                ],
            )
            for i in at:
                n = g.peek(i)
                src, dst = (r, comm_dst(n)) if n.type == pb.COMM_SEND_NODE else (comm_src(n), r)
                try:
                    pair = (self._group(src).id, self._group(dst).id)
                except PlanError as exc:
                    raise RewriteError(f"rank {r}: node {n.id} ({n.name}): {exc}") from None
                if pair not in by_pair:
                    raise RewriteError(
                        f"rank {r}: node {n.id} ({n.name}) is a pp_boundary transfer {src} -> {dst} between "
                        f"device groups {pair[0]} and {pair[1]}, which are not adjacent stages of one replica"
                    )
                bi, direction = by_pair[pair]
                if not self.plan.boundaries[bi].reshard:
                    continue
                mb = get_int(n, MICRO_BATCH, None)
                if mb is None:
                    raise RewriteError(
                        f"rank {r}: node {n.id} ({n.name}): pp_boundary node without {MICRO_BATCH!r}"
                    )
                keyed[(bi, direction, mb)].append((r, n))
        for key in sorted(keyed):
            bi, direction, mb = key
            self._reshard_one(self.plan.boundaries[bi], direction, mb, keyed[key])

    def _reshard_one(
        self, b: PipelineBoundary, direction: str, mb: int, old: list[tuple[int, pb.Node]]
    ) -> None:
        senders, receivers = (b.src_ranks, b.dst_ranks) if direction == "fwd" else (b.dst_ranks, b.src_ranks)
        where = f"replica {b.replica} stages {b.src_stage}->{b.dst_stage} {direction} micro-batch {mb}"
        old_on = _old_by_rank(old, senders, receivers, where)
        base: dict[int, list[int]] = {}
        for r in (*senders, *receivers):
            deps = unique(d for n in old_on[r] for d in (*n.data_deps, *n.ctrl_deps))
            if not old_on[r] and r in senders:
                deps = self._producer(r, direction, mb)
            base[r] = deps
        pos = {
            r: ("before", min(self.ranks[r].pos[n.id] for n in old_on[r]))
            if old_on[r]
            else self._after(r, base[r])
            for r in base
        }
        bp = _BoundaryPass(b, direction, mb, base, pos, _templates(old_on, senders, receivers))
        plan = reshard_plan(self.strategy, senders, receivers, b.tensor_bytes)
        sends, recvs = self._messages(bp, [m for m in plan.messages if m.nbytes > 0])
        gathered = {}
        if not self.sequence_parallel and len(receivers) > 1:
            for r in receivers:
                gathered[r] = self._gather(r, bp, [i for _, i in recvs[r]], old_on[r])
        for r, nodes in old_on.items():
            if r in senders:
                rep = sends[r]
            elif r in gathered:
                rep = [gathered[r]]
            else:
                rep = [i for _, i in recvs[r]]
            for n in nodes:
                self.ranks[r].edit.replace_all_uses(n.id, rep or unique([*n.data_deps, *n.ctrl_deps]))

    def _messages(
        self, bp: _BoundaryPass, msgs: list[Message]
    ) -> tuple[dict[int, list[int]], dict[int, list[tuple[int, int]]]]:
        """Each message as a send and its receive, in step order: (rank -> send ids, rank -> (step, recv
        id)); a send waits for its rank's receives of earlier steps."""
        recvs: dict[int, list[tuple[int, int]]] = defaultdict(list)  # rank -> (step, recv id)
        sends: dict[int, list[int]] = defaultdict(list)
        for m in sorted(msgs, key=lambda m: (m.step, m.ring, m.chunk, m.src, m.dst)):
            tag = self.next_tag
            self.next_tag += 1
            earlier = [i for s, i in recvs[m.src] if s < m.step]
            sends[m.src].append(self._p2p(bp, m, True, tag, unique([*bp.base[m.src], *earlier])))
            recvs[m.dst].append((m.step, self._p2p(bp, m, False, tag, bp.base[m.dst])))
        return sends, recvs

    def _gather(self, r: int, bp: _BoundaryPass, recvs: list[int], old: list[pb.Node]) -> int:
        """Without sequence parallelism every TP rank computes on the full activation (the generator sends
        it whole to each rank), so after receiving its 1/t shard a rank all-gathers it over its TP group,
        as Megatron's scatter-gather P2P does. The gather also waits for the consumer's predecessor in the
        rank's chain, so it takes the same place among the TP group's collectives on every member."""
        b, direction, mb, template = bp.b, bp.direction, bp.mb, bp.template[r]
        old_ids = {n.id for n in old}
        g = self.ranks[r]
        consumers = unique(c for o in old_ids for c in g.children(o) if c not in old_ids)
        chain = unique(d for c in consumers for d in g.deps(c) if d not in old_ids)
        receivers = b.dst_ranks if direction == "fwd" else b.src_ranks
        layer = get_int(template, LAYER, 0) if template is not None else 0
        return self._collective(
            r, f"pp_{direction}_mb{mb}/{self.strategy}/allgather", pb.ALL_GATHER,
            b.tensor_bytes // len(receivers), receivers, [*recvs, *chain], after_existing=False,
            **{LAYER: layer, PHASE: direction, MICRO_BATCH: mb, RING: -1, CHUNK: -1},
        )  # fmt: skip

    def _producer(self, r: int, direction: str, mb: int) -> list[int]:
        """Last nodes of this rank's `direction` pass of micro-batch `mb` (for a rank that sent nothing)."""
        g = self.ranks[r]
        tags = g._tags

        def last() -> list[int]:
            ids = [
                n.id
                for i, n in enumerate(g.nodes)
                if n.type not in P2P_TYPES and tags[i][0] == direction and tags[i][2] == mb
            ]
            return g.frontier(ids)

        return list(g.structure(f"producer {direction} {mb}", last))

    def _p2p(self, bp: _BoundaryPass, m: Message, send: bool, tag: int, deps: list[int]) -> int:
        """Message m's send (on its source) or receive (on its destination), inserted at the pass's place."""
        r = m.src if send else m.dst
        template = bp.template[r]
        direction, mb = bp.direction, bp.mb
        layer = get_int(template, LAYER, 0) if template is not None else 0
        kind = pb.COMM_SEND_NODE if send else pb.COMM_RECV_NODE
        verb = f"send_to{m.dst}" if send else f"recv_from{m.src}"
        node = self._node(
            self._id(r),
            f"pp_{direction}_mb{mb}/{self.strategy}/step{m.step}/{verb}/c{m.chunk}",
            kind,
            data_deps=deps,
            attrs={
                IS_CPU_OP: False,
                COMM_SRC: m.src,
                COMM_DST: m.dst,
                COMM_TAG: tag,
                COMM_SIZE: m.nbytes,
                PP_BOUNDARY: 1,
                **self._attrs(
                    r, **{LAYER: layer, PHASE: direction, MICRO_BATCH: mb, RING: m.ring, CHUNK: m.chunk}
                ),
            },
        )
        return self._add(r, node, bp.pos[r])

    # ---- commit ----------------------------------------------------------------------------------------
    def edited(self, *, copy: bool = False) -> dict[int, list[pb.Node]]:
        """The node lists of the ranks with queued edits, edited (on copies with `copy`)."""
        return {r: g.apply(copy=copy) for r, g in self.ranks.items() if g.edit}

    def commit(self) -> None:
        """Apply every queued removal, dependency redirection and insertion to the bundle."""
        for r, g in self.ranks.items():
            if not g.edit:
                continue
            held = g.apply_bytes()
            if held is not None:
                self.bundle.nodes.set_copy(r, held)
            else:
                self.bundle.nodes[r] = g.apply()
            self.bundle.next_id[r] = self.next_id[r]


_serialize = methodcaller("SerializeToString")


def _end_id(nodes: Sequence[pb.Node]) -> int:
    """One past the largest node id (0 for no nodes)."""
    return max((n.id + 1 for n in nodes), default=0)


def _max_tag(nodes: Sequence[pb.Node]) -> int:
    """The largest `comm_tag` of the P2P nodes (0 without any)."""
    return max((comm_tag(n, 0) for n in nodes if n.type in P2P_TYPES), default=0)


def _read_tags(n: pb.Node) -> tuple[str, int, int | None, bool]:
    """(phase, layer, micro_batch, has `reshard`) in one pass over the attributes (the rewriter's hot loop)."""
    phase, layer, mb, reshard = "", 0, None, False
    for a in n.attr:
        name = a.name
        if name == RESHARD:
            reshard = True
        elif name == PHASE or name == LAYER or name == MICRO_BATCH:
            kind = a.WhichOneof("value")
            value = getattr(a, kind) if kind is not None else None
            if name == PHASE and isinstance(value, str):
                phase = value
            elif name == LAYER and isinstance(value, int):
                layer = int(value)
            elif name == MICRO_BATCH and isinstance(value, int):
                mb = int(value)
    return phase, layer, mb, reshard


def _has_attr(n: pb.Node, name: str) -> bool:
    return any(a.name == name for a in n.attr)


def _span(ranks: Iterable[int]) -> str:
    rs = sorted(ranks)
    return f"{rs[0]}..{rs[-1]} ({len(rs)})" if rs else "none"


# ---- trace sets on disk ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RewriteSummary:
    """What `rewrite_trace_set` wrote and inserted."""

    out_dir: str
    name: str
    ranks: int
    nodes_before: int
    nodes_after: int
    inserted: int  # nodes carrying the `reshard` attribute
    groups_added: int


def read_bundle(path: str) -> tuple[Any, str]:
    """A trace set (folder, `<prefix>` or one file) as a TraceBundle with its process groups, and its prefix."""
    from xsim.tracegen.bundle import TraceBundle
    from xsim.traces.groups import resolve_groups
    from xsim.traces.traceset import discover

    ts = discover(path)
    files = [ts.load(r) for r in range(ts.num_ranks)]
    groups = resolve_groups(((f.path, f.nodes) for f in files), ts.num_ranks, directory=ts.directory)
    nodes = {r: list(f.nodes) for r, f in enumerate(files)}
    next_id = {r: 1 + max((n.id for n in ns), default=-1) for r, ns in nodes.items()}
    bundle = TraceBundle(nodes=nodes, comm_groups=dict(groups.groups), next_id=next_id)
    return bundle, os.path.basename(ts.prefix)


# Spec keys that shape the generated graph and its sizes; cluster, GPUs, profile and reshard do not.
GENERATION_KEYS = (
    "model", "seq_len", "micro_batches", "schedule", "dtype_bytes", "sequence_parallel", "allow_uneven_tp",
    "dp_bucket_bytes", "device_groups", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
    "grad_reduce_dtype", "sharding",
)  # fmt: skip


def _check_generated_from(path: str, deployment: Any) -> None:
    """A spec other than the one `xsim gen` wrote beside the traces would size the inserted collectives
    for another model or micro-batch count, silently; refuse it, naming the first differing key."""
    from xsim.tracegen.spec import load_spec, spec_to_mapping
    from xsim.traces.limits import max_set_metadata_bytes
    from xsim.traces.traceset import discover

    ts = discover(path)
    beside = os.path.join(ts.directory, DEPLOYMENT_FILE)
    if not os.path.isfile(beside):
        return  # not generated by xsim gen: the rewriter's own checks (tags, ranks) apply
    want = spec_to_mapping(load_spec(beside, max_set_metadata_bytes(ts.num_ranks)))
    have = spec_to_mapping(deployment)
    for key in GENERATION_KEYS:
        if want[key] != have[key]:
            raise RewriteError(
                f"{path}: the spec's {key} differs from {beside}, which generated these traces "
                f"({_short(have[key])} vs {_short(want[key])})"
            )


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def rewrite_trace_set(
    path: str,
    deployment: Any,
    strategy: str,
    out_dir: str,
    *,
    barriers: bool = True,
    identity: Any = None,
) -> RewriteSummary:
    """Read a trace set, rewrite it for `deployment` under `strategy`, write `<out>/<prefix>.<rank>.et`
    (each file's metadata carrying `identity`, a traces.setid.SetIdentity, when given)."""
    bundle, name = read_bundle(path)
    _check_generated_from(path, deployment)
    before = sum(len(v) for v in bundle.nodes.values())
    n_groups = len(bundle.comm_groups)
    try:
        rewrite_bundle(bundle, deployment, strategy, barriers=barriers)
    except RewriteError as exc:
        raise RewriteError(f"{path}: {exc}") from None  # which trace set the rank/node belongs to
    bundle.write(out_dir, name, identity=identity)
    after = sum(len(v) for v in bundle.nodes.values())
    inserted = sum(1 for v in bundle.nodes.values() for n in v if _has_attr(n, RESHARD))
    return RewriteSummary(
        out_dir, name, len(bundle.nodes), before, after, inserted, len(bundle.comm_groups) - n_groups
    )
