"""Symmetric-replica folding: replay one replica of identical ones and copy its timeline to the others.

A fold partitions the ranks into m replicas of equal length; replica 0 is simulated, and the i-th rank of
replica k mirrors the i-th rank of replica 0 under the renaming pi_k that swaps the two replicas rank by
rank. It is used only when it is proven:

* traces: every rank's nodes equal its representative's (ids, types, durations, deps, every attribute),
  except labels (node name, annotation columns) and rank references renamed by pi_k: a P2P peer is
  pi_k(the representative's peer), and a collective's process group is either the same group, closed
  under every pi_k (a data-parallel group holding position i of every replica), or a group inside replica
  k whose member list is pi_k(the representative's, member by member);
* compute: the compute model gives a folded rank the representative's device (and speed factor);
* network: the model is contention-free (analytical, ASTRA-sim congestion-unaware), so a transfer's time
  depends on its own endpoints alone; each distinct collective or P2P of the folded replay is also timed,
  once, on a private copy of the model for every replica's renamed version, and must give the same
  per-rank times (which also covers the positions of folded members inside a shared group).

By induction over the event loop, every folded rank then runs each node at its representative's instants,
so the result tables are the representative's rows under the folded ranks' own numbers and labels.

Rank classes (Fold.tp = T > 1, a compact set's `tp_positions`, traces/classes.py): replica k is TP
position k mod T of every stage of DP replica k div T, and pi_k swaps DP replica k div T with 0 and TP
position k mod T with 0 in every stage at once (an involution that also renames other replicas). A group
with folded members is then accepted ('partial') when it is fixed by the renamings that fix replica 0 rank
by rank (so the representatives' program is unchanged by them), each folded member's representative is a
member and the member's own pi maps the group onto itself (so it joins the same collective, issuing when
its representative does); each distinct image pi_k(group) is another group of the set, named by the
folded rank's file (or, by construction, its member set), timed once by the network check with its own
member order (rank pi_k(x) must finish when x does), and is a copy of the collective in the tables
(a TP group: one per DP replica; a DP group: one per TP position).

The trace condition is shown first on raw bytes (replay/fold_bytes.py: the folded file equals the
representative's with its labels swapped in), node by node with protobuf only where the bytes differ,
and for the whole file the old way when the byte comparison cannot decide.
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
from google.protobuf.message import DecodeError
from xsim.netmodels.api import CollectiveSpec, FixedDurations, NetworkModel, StaggeredStarts, TimingClasses
from xsim.netmodels.errors import NetworkModelError
from xsim.netmodels.models import capabilities_of
from xsim.netmodels.topology import Topology
from xsim.replay.compute import ComputeModel, timing_key_of
from xsim.replay.config import ReplayConfig
from xsim.replay.errors import FoldRefused, ReplayError
from xsim.replay.fold_bytes import Prediction, Template, predict_many, walk
from xsim.replay.program import ANNOTATION_COLUMNS, K_COLL, CollInfo, Program, resolve_group
from xsim.traces import pb
from xsim.traces.attrs import COMM_DST, COMM_SRC, DEVICE_GROUP, FLOAT_KINDS, INT_KINDS, PG_NAME
from xsim.traces.classes import CLASSES_FILE
from xsim.traces.columnar import F_INT32, F_INT64, F_STRING, F_UINT32, F_UINT64, RankColumns
from xsim.traces.errors import TraceFormatError
from xsim.traces.groups import ProcessGroups
from xsim.traces.io import DEPLOYMENT_FILE
from xsim.traces.limits import InputLimitError
from xsim.traces.stream import read_bytes
from xsim.traces.traceset import TraceSet
from xsim.traces.wire import attribute_field, name_field

_SCALAR_KINDS = frozenset(INT_KINDS | FLOAT_KINDS | {"bool_val", "string_val"})
# Attributes that may differ between a rank and its representative (checked separately where they matter).
_LABELS = frozenset(ANNOTATION_COLUMNS) | {COMM_SRC, COMM_DST, PG_NAME, "comm_group"}
_FAR = 2**62  # drains a private model copy's pending completions
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class Fold:
    """Replicas of equal length partitioning the ranks; replica 0 is simulated, the others mirror it."""

    replicas: tuple[tuple[int, ...], ...]
    source: str
    device_groups: Mapping[int, int] = field(default_factory=dict)  # rank -> deployment device group id
    # The generator made the replicas alike (a compact set's classes.json): verify derives each folded
    # rank's labels from its representative without a file to compare.
    by_construction: bool = False
    # rank -> its DP replica number, where node names carry it (a heterogeneous compact set's pipeline
    # barriers, "pipeline_barrier[replica 3]", tracegen/planner/rewrite.py); empty otherwise.
    dp_replicas: Mapping[int, int] = field(default_factory=dict)
    # TP positions folded per DP replica (a rank-class fold, traces/classes.py): replica k is position
    # k % tp of DP replica k // tp, and pi_k swaps DP replica 0 with k // tp and TP position 0 with k % tp
    # in every stage at once (the module docstring); 1: replica k is a DP replica, pi_k the plain swap.
    tp: int = 1
    # CP positions folded too (a compact set's `cp_positions`): the DP replica number d of k // tp is CP
    # position d % cp of data replica d // cp, and pi_k swaps the data replica and the CP position of k
    # with 0 as well; 1: none.
    cp: int = 1

    @property
    def factor(self) -> int:
        """How many replicas one simulated replica stands for."""
        return len(self.replicas)

    @property
    def positions(self) -> bool:
        """Whether replicas are rank classes (TP and/or CP positions folded), not whole DP replicas."""
        return self.tp > 1 or self.cp > 1

    def coords(self, k: int) -> tuple[int, int, int]:
        """Replica k's (data replica, CP position, TP position) in a rank-class fold."""
        d, t = divmod(k, self.tp)
        return (*divmod(d, self.cp), t)

    def index(self, c: Sequence[int]) -> int:
        """The replica at coordinates (data replica, CP position, TP position)."""
        return (c[0] * self.cp + c[1]) * self.tp + c[2]


def make_fold(
    replicas: Sequence[Sequence[int]],
    num_ranks: int,
    source: str,
    device_groups: Mapping[int, int] | None = None,
    by_construction: bool = False,
) -> Fold:
    """Check that `replicas` are equal-length lists partitioning 0..num_ranks-1."""
    reps = tuple(tuple(int(r) for r in rep) for rep in replicas)
    if not reps or any(len(r) != len(reps[0]) for r in reps):
        sizes = sorted({len(r) for r in reps})
        raise FoldRefused(f"fold ({source}): replicas must have the same number of ranks, got sizes {sizes}")
    ranks = sorted(r for rep in reps for r in rep)
    if ranks != list(range(num_ranks)):
        raise FoldRefused(
            f"fold ({source}): replicas must hold every rank 0..{num_ranks - 1} exactly once "
            f"({len(ranks)} entries, {len(set(ranks))} distinct)"
        )
    return Fold(reps, source, dict(device_groups or {}), by_construction)


def fold_from_deployment(doc: Mapping, where: str, num_ranks: int) -> Fold:
    """Candidate fold of a deployment: DP replicas whose device groups match stage by stage."""
    by_rep: dict[int, list[Mapping]] = {}
    try:
        for dg in doc["device_groups"]:
            by_rep.setdefault(int(dg.get("dp_replica", 0)), []).append(dg)
        reps = [sorted(v, key=lambda d: int(d.get("pp_stage", 0))) for _k, v in sorted(by_rep.items())]
        keys = ("gpu", "tp", "layers", "micro_batch", "pp_stage")
        first = reps[0]
        for k, rep in enumerate(reps[1:], 1):
            if len(rep) != len(first):
                raise FoldRefused(
                    f"{where}: cannot fold: replica {k} has {len(rep)} device groups, replica 0 has {len(first)}"
                )
            for a, b in zip(first, rep, strict=True):
                diff = [key for key in keys if a.get(key) != b.get(key)]
                if diff or len(a["ranks"]) != len(b["ranks"]):
                    what = (
                        ", ".join(f"{key} {b.get(key)!r} vs {a.get(key)!r}" for key in diff) or "rank count"
                    )
                    raise FoldRefused(
                        f"{where}: cannot fold: heterogeneous replicas: device group {b.get('id')} of replica "
                        f"{k} differs from device group {a.get('id')} of replica 0 ({what})"
                    )
        replicas = [[int(r) for dg in rep for r in dg["ranks"]] for rep in reps]
        dgs = {int(r): int(dg["id"]) for rep in reps for dg in rep for r in dg["ranks"]}
    except (KeyError, TypeError, ValueError) as exc:
        raise FoldRefused(f"{where}: cannot fold: malformed device_groups ({exc!r})") from None
    return make_fold(replicas, num_ranks, where, dgs)


def tp_fold_from_deployment(doc: Mapping, where: str, num_ranks: int) -> Fold:
    """Candidate fold of a deployment's TP ranks: replica t holds position t of every device group's ranks."""
    try:
        dgs = sorted(
            doc["device_groups"], key=lambda d: (int(d.get("dp_replica", 0)), int(d.get("pp_stage", 0)))
        )
        sizes = {len(dg["ranks"]) for dg in dgs}
        if len(sizes) != 1:
            raise FoldRefused(f"{where}: cannot fold TP ranks: device groups of {sorted(sizes)} ranks")
        width = sizes.pop()
        replicas = [[int(dg["ranks"][t]) for dg in dgs] for t in range(width)]
    except (KeyError, TypeError, ValueError) as exc:
        raise FoldRefused(f"{where}: cannot fold: malformed device_groups ({exc!r})") from None
    return make_fold(replicas, num_ranks, where + " (TP positions)")


def resolve_fold(fold, trace_set: TraceSet) -> Fold:
    """The candidate fold: given, from deployment.json beside the traces, or every rank its own replica."""
    n = trace_set.num_ranks
    c = trace_set.classes
    if c is not None and fold == "dp" and c.tp * c.cp > 1:
        return _dp_of_classes(c, n)
    if c is not None:
        if not (fold is True or fold == "auto"):
            raise FoldRefused(
                f"{trace_set.prefix}: a compact set folds by its own classes ({CLASSES_FILE}) only, not {fold!r}"
            )
        dgs = {
            r: d
            for rep, ds in zip(c.replicas, c.device_groups, strict=True)
            for r, d in zip(rep, ds, strict=True)
        }
        fold = make_fold(c.replicas, n, f"by construction, {CLASSES_FILE}", dgs, by_construction=True)
        fold = replace(fold, tp=c.tp, cp=c.cp)
        if c.dp_replicas:
            reps = {
                r: d
                for rep, ds in zip(c.replicas, c.dp_replicas, strict=True)
                for r, d in zip(rep, ds, strict=True)
            }
            fold = replace(fold, dp_replicas=reps)
        return fold
    if isinstance(fold, Fold):
        if fold.tp < 1 or fold.cp < 1 or len(fold.replicas) % (fold.tp * fold.cp):
            raise FoldRefused(
                f"fold ({fold.source}): {len(fold.replicas)} replicas are not DP x CP {fold.cp} x TP {fold.tp}"
            )
        return replace(make_fold(fold.replicas, n, fold.source, fold.device_groups), tp=fold.tp, cp=fold.cp)
    if fold == "tp":
        path = os.path.join(trace_set.directory, DEPLOYMENT_FILE)
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
        except (OSError, ValueError) as exc:
            raise FoldRefused(f"{path}: cannot read for folding TP ranks: {exc}") from None
        return tp_fold_from_deployment(doc, path, n)
    if fold is True or fold == "auto":
        path = os.path.join(trace_set.directory, DEPLOYMENT_FILE)
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as fh:
                    doc = json.load(fh)
            except (OSError, ValueError) as exc:
                raise FoldRefused(f"{path}: cannot read for folding: {exc}") from None
            return fold_from_deployment(doc, path, n)
        return make_fold([[r] for r in range(n)], n, "every rank alike")
    if isinstance(fold, Sequence) and not isinstance(fold, str):
        return make_fold(fold, n, "given replicas")
    raise ReplayError(f"fold must be True, 'auto', 'tp', a Fold or a list of replicas, got {fold!r}")


def _dp_of_classes(c, n: int) -> Fold:
    """A rank-class set folded by its data replicas only (its rank classes refused): replica d holds its
    entries d*w .. d*w + w - 1 (w = tp x cp), and pi_d is the construction's swap of data replica d with 0."""
    w = c.tp * c.cp
    ent = [[r for rep in c.replicas[d : d + w] for r in rep] for d in range(0, len(c.replicas), w)]
    dgs = {
        r: d
        for rep, ds in zip(c.replicas, c.device_groups, strict=True)
        for r, d in zip(rep, ds, strict=True)
    }
    return make_fold(ent, n, f"by construction, {CLASSES_FILE}", dgs, by_construction=True)


def check_models(
    fold: Fold, network: NetworkModel | None, compute: ComputeModel | None, config: ReplayConfig
) -> None:
    """Refuse a network model with contention or a compute model that treats replicas differently."""
    if config.comm_mode != "measured" and network is not None:
        if not capabilities_of(network).foldable:
            raise FoldRefused(
                f"cannot fold on network model {network.name!r}: folding needs a contention-free model "
                "(analytical, ASTRA-sim congestion-unaware, or --comm measured); with contention the other "
                "replicas' concurrent traffic, which a folded replay leaves out, would change the times"
            )
    for k, rep in enumerate(fold.replicas[1:], 1):
        for x, r in zip(rep, fold.replicas[0], strict=True):
            kx, kr = timing_key_of(compute, x), timing_key_of(compute, r)
            if kx is None:
                raise FoldRefused(
                    f"cannot fold with compute model {compute.name!r}: it cannot be shown to time ranks alike"
                )
            if kx != kr:
                raise FoldRefused(
                    f"cannot fold: compute model {compute.name!r} gives rank {x} (replica {k}) a different "
                    f"device or speed than its representative rank {r}"
                )


class _Ctx:
    """Fold bookkeeping shared by verification, the network check and expansion."""

    def __init__(self, fold: Fold, groups: ProcessGroups) -> None:
        self.fold = fold
        self.groups = groups
        self.where: dict[int, tuple[int, int]] = {
            r: (k, i) for k, rep in enumerate(fold.replicas) for i, r in enumerate(rep)
        }
        self._cls: dict[str, str] = {}

    def perm(self, k: int, rank: int) -> int:
        """pi_k: swap replica k with replica 0, rank by rank (a rank-class fold: swap the data replica, the
        CP position and the TP position of k with 0 in every stage, each on its own, Fold.tp / Fold.cp)."""
        kk, i = self.where[rank]
        reps = self.fold.replicas
        if self.fold.positions:
            c = [
                b if a == 0 else 0 if a == b else a
                for a, b in zip(self.fold.coords(kk), self.fold.coords(k), strict=True)
            ]
            return reps[self.fold.index(c)][i]
        if kk == 0:
            return reps[k][i]
        if kk == k:
            return reps[0][i]
        return rank

    def _stab(self, rank: int, axis: int, b: int) -> int:
        """The swap of coordinate `axis` (0: data replica, 1: CP position, 2: TP position) values 1 and b:
        generators of the renamings that fix replica 0 rank by rank (a rank-class fold)."""
        kk, i = self.where[rank]
        c = list(self.fold.coords(kk))
        c[axis] = b if c[axis] == 1 else 1 if c[axis] == b else c[axis]
        return self.fold.replicas[self.fold.index(c)][i]

    def group_class(self, key: str, members: tuple[int, ...]) -> str:
        """'inside' (all members in replica 0), 'shared' (closed under every pi_k), 'partial' (a rank-class
        fold's group with folded members, mapped by some pi_k onto another group: its copies) or
        'uneven'."""
        c = self._cls.get(key)
        if c is None:
            ks = {self.where[r][0] for r in members}
            if ks == {0}:
                c = "inside"
            elif self.fold.positions:
                c = self._classify(members)
            else:
                s = set(members)
                reps = self.fold.replicas
                closed = all(rep[self.where[r][1]] in s for r in members for rep in reps)
                c = "shared" if closed else "uneven"
            self._cls[key] = c
        return c

    def _classify(self, members: tuple[int, ...]) -> str:
        """A rank-class fold's group with folded members: fixed by the renamings that fix replica 0 (so its
        representatives' program is the same under them), each folded member's representative a member and
        the member's own renaming mapping the group onto itself (so it joins the same collective)."""
        fs = frozenset(members)
        f = self.fold
        for axis, n in enumerate((len(f.replicas) // (f.tp * f.cp), f.cp, f.tp)):
            for b in range(2, n):
                if frozenset(self._stab(r, axis, b) for r in members) != fs:
                    return "uneven"
        reps0 = self.fold.replicas[0]
        for x in members:
            kx, i = self.where[x]
            if kx and (reps0[i] not in fs or self.image(kx, members) != fs):
                return "uneven"
        if all(self.image(k, members) == fs for k in range(1, len(self.fold.replicas))):
            return "shared"
        return "partial"

    def image(self, k: int, members: Sequence[int]) -> frozenset[int]:
        """pi_k of a member set."""
        return frozenset(self.perm(k, m) for m in members)

    def by_set(self) -> dict[frozenset[int], str | None]:
        """Group keys by member set (None where two groups share one)."""
        if not hasattr(self, "_by_set"):
            out: dict[frozenset[int], str | None] = {}
            for key, members in self.groups.groups.items():
                fs = frozenset(members)
                out[fs] = None if fs in out else key
            self._by_set = out
        return self._by_set

    def image_key(self, k: int, members: tuple[int, ...], group: str, by_members: Mapping) -> str | None:
        """The key of the group pi_k maps `group` onto (None: no such group, or no one name for it): the
        group itself, a partial group's image by member set (its own member order), an inside group's
        copy by member list."""
        img = self.image(k, members)
        if img == frozenset(members):
            return group
        if self.group_class(group, members) == "partial":
            return self.by_set().get(img)
        return by_members.get(tuple(self.perm(k, m) for m in members))


class Copies:
    """Per replica k, which copy of a simulated group pi_k's image is (copies numbered by the first k
    giving each image; 0: the group itself), cached by group: the expansion's count of a record's copies."""

    def __init__(self, fold: Fold, groups: ProcessGroups) -> None:
        self.ctx = _Ctx(fold, groups)
        self._memo: dict[tuple[int, ...], np.ndarray] = {}

    def first(self, k: int, members: tuple[int, ...]) -> int:
        """The first member, in its own order, of the group pi_k maps `members` onto."""
        img = self.ctx.image(k, members)
        if img == frozenset(members):
            return members[0]
        key = self.ctx.by_set().get(img)
        return self.ctx.groups.groups[key][0] if key is not None else self.ctx.perm(k, members[0])

    def name(self, k: int, members: tuple[int, ...], group: str) -> str:
        """The key of the group pi_k maps `group` onto (the group's own where no one group holds it)."""
        key = self.ctx.image_key(k, members, group, {})
        return group if key is None else key

    def __call__(self, members: Sequence[int]) -> np.ndarray:
        """The copy index of each replica's image of `members` (all zeros: one copy, all distinct: m)."""
        key = tuple(members)
        out = self._memo.get(key)
        if out is None:
            out = np.zeros(self.ctx.fold.factor, dtype=np.int64)
            seen: dict[frozenset[int], int] = {frozenset(key): 0}
            for k in range(1, self.ctx.fold.factor):
                out[k] = seen.setdefault(self.ctx.image(k, key), len(seen))
            self._memo[key] = out
        return out


class SlotNames(Mapping):
    """node -> name, each node's name that of its slot: a folded rank's labels by construction, held as the
    representative's node and slot lists (shared by every rank of its class) and this rank's names per
    slot, not a dict per rank (3,072 ranks x thousands of collectives). Read-only."""

    __slots__ = ("_nodes", "_pos", "_slot", "_names")

    def __init__(
        self, nodes: Sequence[int], pos: Mapping[int, int], slot: Sequence[int], names: Sequence
    ) -> None:
        self._nodes, self._pos, self._slot, self._names = nodes, pos, slot, names

    def __getitem__(self, j: int):
        return self._names[self._slot[self._pos[j]]]

    def __iter__(self):
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def values(self) -> list:  # type: ignore[override]
        """The names in node order."""
        names = self._names
        return [names[s] for s in self._slot]

    def copy(self) -> SlotNames:
        """Itself (read-only)."""
        return self


@dataclass
class RankLabels:
    """What a folded rank's ops rows take from its own trace instead of its representative's."""

    names: dict[int, str] = field(default_factory=dict)  # local node index -> name
    annotations: dict[int, dict] = field(default_factory=dict)
    device_group: tuple[int, int] | None = None  # (representative's, own) device group id
    dg_nodes: list[int] = field(default_factory=list)  # nodes whose only difference is that id
    pg_names: dict[int, str | None] = field(default_factory=dict)
    keys: dict[int, str] = field(default_factory=dict)  # collective nodes: canonical group key
    id_delta: int = 0  # own node ids = representative's + id_delta (ASTRA-sim microbenchmarks number so)


def _sorted_nodes(nodes):
    ids = [n.id for n in nodes]
    if any(a >= b for a, b in zip(ids, ids[1:], strict=False)):
        return sorted(nodes, key=lambda n: n.id)
    return list(nodes)


def _annotations(node: pb.Node) -> dict:
    """The ops-table annotation values of a node, read by build_program's rules."""
    vals: dict = {}
    for a in node.attr:
        if a.name in ANNOTATION_COLUMNS and a.name not in vals:
            kind = a.WhichOneof("value")
            vals[a.name] = getattr(a, kind) if kind in _SCALAR_KINDS else None
    return {
        k: (str(v) if ANNOTATION_COLUMNS[k] == "str" else (None if isinstance(v, str) else int(v)))
        for k, v in vals.items()
        if v is not None
    }


def _comm_attrs(node: pb.Node) -> tuple[object, object, object]:
    """(comm_src, comm_dst, process group) as build_program reads them."""
    src = dst = pg = None
    for a in node.attr:
        an = a.name
        if an in (COMM_SRC, COMM_DST, PG_NAME, "comm_group"):
            kind = a.WhichOneof("value")
            v = getattr(a, kind) if kind in _SCALAR_KINDS else None
            if an == COMM_SRC:
                src = v
            elif an == COMM_DST:
                dst = v
            elif an == PG_NAME or pg is None:
                pg = v if isinstance(v, str) else (None if v is None else str(int(v)))
    return src, dst, pg


def _rep_annotation(prog: Program, g: int, name: str):
    """A representative node's annotation value (from its columns, or its dict when built node by node)."""
    a = prog.annotations.get(g)
    if a is not None:
        return a.get(name)
    col = prog.ann_cols.get(name)
    if col is None or ANNOTATION_COLUMNS[name] != "int":
        return None
    vals, ok = col
    return int(vals[g]) if ok[g] else None


def _dg_pattern(value: int) -> bytes:
    """The bytes of a node's `device_group` attribute as written by the generator (int64)."""
    return attribute_field(DEVICE_GROUP, value, "int64_val")


def verify(
    fold: Fold,
    trace_set: TraceSet,
    groups: ProcessGroups,
    prog: Program,
    rep_bytes: Mapping[int, tuple[RankColumns, int, bytes, int]] | None = None,
) -> list[RankLabels | None]:
    """Prove every folded rank mirrors its representative (see the module docstring); labels per rank.

    rep_bytes: representative rank -> (its columns decoded with spans, file index, file bytes, file's
    offset in the columns' buffer). A folded rank of such a representative is compared by raw bytes with
    the representative's file, labels swapped in (replay/fold_bytes.py); where that cannot show it equal,
    its file is decoded and compared node by node as before.
    """
    ctx = _Ctx(fold, groups)
    reps = fold.replicas[0]
    labels: list[RankLabels | None] = [None] * trace_set.num_ranks
    sets: dict[int, tuple[list[int], set[int], dict[int, CollInfo]]] = {}

    def comm_sets(i: int) -> tuple[list[int], set[int], dict[int, CollInfo]]:
        """For the exact proof of representative slot i: its nodes whose group or peers must be checked
        rank by rank; of those, the non-P2P ones whose group needs no more than an equal name (shared
        groups, or no group matching); and its collectives on groups inside replica 0."""
        if i not in sets:
            lo, hi = prog.rank_offset[i], prog.rank_offset[i + 1]
            comm = [g - lo for g in range(lo, hi) if prog.pg_name[g] is not None or g in prog.p2p]
            safe = {
                j
                for j in comm
                if lo + j not in prog.p2p
                and (
                    prog.kind[lo + j] != K_COLL
                    or ctx.group_class(prog.coll[lo + j].group, prog.coll[lo + j].members) == "shared"
                )
            }
            inside = {
                g - lo: c
                for g in range(lo, hi)
                if (c := prog.coll.get(g)) is not None
                and ctx.group_class(c.group, c.members) in ("inside", "partial")
            }
            sets[i] = (comm, safe, inside)
        return sets[i]

    by_members, templates = _templates(ctx, prog, rep_bytes)
    pg_keys: dict = {}  # (replica, group members) -> the key of the group pi_k(members)
    exact: dict[int, tuple[list, list[bytes]]] = {}  # representative slot -> (sorted nodes, their bytes)

    def rep_exact(i: int) -> tuple[list, list[bytes]]:
        if i not in exact:
            nodes = _sorted_nodes(trace_set.load(reps[i]).nodes)
            exact[i] = (nodes, [nd.SerializeToString() for nd in nodes])
        return exact[i]

    # Representative by representative (its replicas share one byte layout per label lengths).
    for i, r in enumerate(reps):
        layouts: dict = {}
        for k in range(1, fold.factor):
            x = fold.replicas[k][i]
            path = trace_set.paths[x]
            lab = labels[x] = RankLabels()
            if fold.by_construction:  # no file to compare: the labels follow from the construction
                if templates[i] is None or not _predict(
                    ctx, k, x, r, i, templates[i], prog, by_members, lab, layouts, pg_keys, want=False
                ):
                    raise _refuse(path, x, r, "its labels do not follow from its representative's file")
                continue
            if templates[i] is not None and _verify_bytes(
                ctx, k, x, r, i, templates[i], prog, by_members, lab, path, layouts, pg_keys
            ):
                continue
            lab = labels[x] = RankLabels()
            try:
                xn = _sorted_nodes(trace_set.load(x).nodes)
                comm_js, safe, inside = comm_sets(i)
                subs = _pg_subs(ctx, k, inside, prog, by_members, prog.rank_offset[i])
                args = (comm_js, safe, subs, lab, path)
                rn, rser = rep_exact(i)
                _verify_rank(ctx, k, x, r, xn, rn, rser, prog, i, *args)
            finally:
                trace_set.release(x)
        exact.pop(i, None)
        trace_set.release(r)
    return labels


def _templates(ctx: _Ctx, prog: Program, rep_bytes) -> tuple[dict, list]:
    """Group names by member list (None when two names share one: then no byte shortcut) and each
    representative slot's byte template (None: proven the exact way)."""
    by_members: dict[tuple[int, ...], str | None] = {}
    for key, members in ctx.groups.groups.items():
        by_members[members] = None if members in by_members else key
    colls, p2ps = _by_slot(prog, prog.coll), _by_slot(prog, prog.p2p)
    templates = [
        _template(ctx, prog, i, rep_bytes.get(r), colls[i], p2ps[i]) if rep_bytes is not None else None
        for i, r in enumerate(ctx.fold.replicas[0])
    ]
    return by_members, templates


def predicted_files(
    fold: Fold, groups: ProcessGroups, prog: Program, rep_bytes: Mapping
) -> Callable[[int], bytes]:
    """The bytes of each folded rank's file as its representative's template predicts it (a compact set's
    ranks that were not written: by construction their files; prog: the representatives' program)."""
    ctx = _Ctx(fold, groups)
    by_members, templates = _templates(ctx, prog, rep_bytes)
    layouts: dict[int, dict] = {}
    pg_keys: dict = {}

    def bytes_of(x: int) -> bytes:
        k, i = ctx.where[x]
        r = fold.replicas[0][i]
        rt = templates[i]
        pred = (
            _predict(ctx, k, x, r, i, rt, prog, by_members, RankLabels(), layouts.setdefault(i, {}), pg_keys)
            if rt is not None
            else False
        )
        if pred is False:
            raise FoldRefused(f"rank {x}: its file cannot be derived from its representative rank {r}'s")
        return pred.buf

    return bytes_of


@dataclass(frozen=True)
class _RepTemplate:
    """A representative's file as a byte template, with the label fields a folded rank's file renames."""

    tmpl: Template
    dg_nodes: np.ndarray  # nodes whose device_group is the representative's
    # The fields to swap (start, end, node, replacement slot), with and without the device_group ones.
    subs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    subs_no_dg: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    # Replacement slots: ("dg", value kind), ("pg", group members), ("peer", attribute, value kind, value) or
    # ("name", text before the peer, text after, peer; None: the rank's DP replica number in brackets).
    slots: list[tuple]
    pg_nodes: list[int]  # collectives on groups inside replica 0, and their slots
    pg_slots: list[int]
    name_nodes: list[int]  # P2P nodes whose name carries the peer, and their slots
    name_slots: list[int]
    reordered: bool = False  # the file's nodes are not in the program's (id) order

    @cached_property
    def pg_pos(self) -> dict[int, int]:
        """pg node -> its index in pg_nodes."""
        return {j: p for p, j in enumerate(self.pg_nodes)}

    @cached_property
    def name_pos(self) -> dict[int, int]:
        """Named P2P node -> its index in name_nodes."""
        return {j: p for p, j in enumerate(self.name_nodes)}

    @cached_property
    def name_first(self) -> list[tuple[int, int]]:
        """One (node, slot) per distinct name slot: a slot's name differs from the representative's
        node name for all its nodes or none (the name is the slot's text around the renamed peer)."""
        seen: dict[int, int] = {}
        for j, sl in zip(self.name_nodes, self.name_slots, strict=True):
            seen.setdefault(sl, j)
        return [(j, sl) for sl, j in seen.items()]


_INT_VALUE = {F_INT32: "int32_val", F_INT64: "int64_val", F_UINT32: "uint32_val", F_UINT64: "uint64_val"}


def _by_slot(prog: Program, nodes: Mapping[int, object]) -> list[list[int]]:
    """The keys of `nodes` (global node indices) in order, split by representative slot."""
    g = np.sort(np.fromiter(nodes, dtype=np.int64, count=len(nodes)))
    cut = np.searchsorted(g, np.asarray(prog.rank_offset, dtype=np.int64)).tolist()
    gl = g.tolist()
    return [gl[a:b] for a, b in zip(cut[:-1], cut[1:], strict=True)]


def _template(
    ctx: _Ctx, prog: Program, i: int, entry, colls: list[int], p2ps: list[int]
) -> _RepTemplate | None:
    """The byte template of representative slot i (its collectives and P2P nodes given, in order), or
    None when its ranks must be proven the exact way."""
    if entry is None:
        return None
    cols, f, rb, base = entry
    if cols.frame_start is None:
        return None
    lo_c, hi_c = int(cols.file_ptr[f]), int(cols.file_ptr[f + 1])
    lo, hi = prog.rank_offset[i], prog.rank_offset[i + 1]
    ids = cols.node_id[lo_c:hi_c]
    want = np.asarray(prog.node_id[lo:hi], dtype=np.int64)
    if hi_c - lo_c != hi - lo:
        return None
    # fi[j]: the file position of the program's node j. The generator writes nodes in id order but the
    # rewriter splices the nodes it inserts in place (a heterogeneous set's sync): the template keeps the
    # file's byte order, and node j's fields are read at its file position.
    fi = np.arange(hi - lo, dtype=np.int64)
    if not np.array_equal(ids, want):
        fi = np.argsort(ids, kind="stable")
        pos = np.searchsorted(ids[fi], want)
        if (pos >= len(fi)).any():
            return None
        fi = fi[pos]
        if not np.array_equal(ids[fi], want) or len(np.unique(ids)) != len(ids):
            return None  # built another way: node j would not be node j
    reordered = not np.array_equal(fi, np.arange(hi - lo))
    ns, ne = cols.name_start[lo_c:hi_c], cols.name_end[lo_c:hi_c]
    tmpl = Template(
        rb,
        cols.frame_start[lo_c:hi_c] - base,
        cols.payload_start[lo_c:hi_c] - base,
        cols.payload_end[lo_c:hi_c] - base,
        np.where(ns >= 0, ns - base, -1),
        np.where(ne >= 0, ne - base, -1),
    )

    def col(name):
        c = cols.attrs.get(name)
        if c is None:
            return None, None, None, None
        if not reordered:
            return (
                c,
                c.kind[lo_c:hi_c],
                c.value[lo_c:hi_c],
                (c.field_start[lo_c:hi_c], c.field_end[lo_c:hi_c]),
            )
        at = fi + lo_c  # in program order
        return c, c.kind[at], c.value[at], (c.field_start[at], c.field_end[at])

    name_s, name_e = (
        (tmpl.name_start[fi], tmpl.name_end[fi]) if reordered else (tmpl.name_start, tmpl.name_end)
    )

    r = ctx.fold.replicas[0][i]
    dg_r = ctx.fold.device_groups.get(r)
    c, kind, val, span = col(DEVICE_GROUP)
    empty = np.zeros(0, dtype=np.int64)
    dg = (empty, empty, empty, empty)
    if c is not None and dg_r is not None:
        sel = np.isin(kind, list(_INT_VALUE)) & (val == dg_r)
        js = np.nonzero(sel)[0]
        dg = (js, span[0][js] - base, span[1][js] - base, kind[js])
    pgc, pgk, pgv, pgspan = col(PG_NAME)
    cg, cgk, _v, _s = col("comm_group")
    pg = []
    pg_j, pg_info = [], []
    names = []  # (node, name field start, end, text before the peer's number, text after, peer)
    for g in colls:
        info = prog.coll[g]
        cls = ctx.group_class(info.group, info.members)
        if cls == "uneven":
            return None  # refused by the exact proof, with its message
        if cls in ("inside", "partial"):
            pg_j.append(g - lo)
            pg_info.append(info)
            rep_no = ctx.fold.dp_replicas.get(r)
            if rep_no is not None and name_s[g - lo] >= 0:
                word = f"[replica {rep_no}]"
                at = prog.name[g].rfind(word)
                if at >= 0:
                    j = g - lo
                    nm = prog.name[g]
                    names.append((j, int(name_s[j]), int(name_e[j]), nm[:at], nm[at + len(word) :], None))
    pg = []
    if pg_j:
        js = np.asarray(pg_j, dtype=np.int64)
        if pgc is None or (pgk[js] != F_STRING).any() or (cg is not None and (cgk[js] >= 0).any()):
            return None
        if any(pgc.strings[v] != info.group for v, info in zip(pgv[js].tolist(), pg_info, strict=True)):
            return None
        s0, e0 = (pgspan[0][js] - base).tolist(), (pgspan[1][js] - base).tolist()
        pg = list(zip(pg_j, s0, e0, pg_info, strict=True))
    peers = []
    for g in p2ps:
        info = prog.p2p.get(g)
        if info is None:
            continue
        if ctx.where[info.src][0] != 0 or ctx.where[info.dst][0] != 0:
            return None  # a P2P with another replica: refused by the exact proof
        j = g - lo
        peer = info.dst if info.src == r else info.src
        parts = _peer_in_name(prog.name[g], peer) if name_s[j] >= 0 else None
        if parts is not None:
            names.append((j, int(name_s[j]), int(name_e[j]), *parts, peer))
        for name in (COMM_SRC, COMM_DST):
            c, kind, val, span = col(name)
            if c is None or kind[j] < 0:
                continue
            if int(kind[j]) not in _INT_VALUE:
                return None
            s0, e0 = int(span[0][j]) - base, int(span[1][j]) - base
            peers.append((j, name, s0, e0, _INT_VALUE[int(kind[j])], int(val[j])))
    slots: list[tuple] = []
    slot_of: dict = {}

    def slot(key) -> int:
        if key not in slot_of:
            slot_of[key] = len(slots)
            slots.append(key)
        return slot_of[key]

    dg_js, dg_s, dg_e, dg_k = dg
    dg_slot = np.zeros(len(dg_k), dtype=np.int64)
    for kd in sorted(set(dg_k.tolist())):  # the value kinds (one, as the generator writes int64)
        dg_slot[dg_k == kd] = slot(("dg", _INT_VALUE[kd]))
    pg_slots = [slot(("pg", info.members, info.group)) for _j, _s0, _e0, info in pg]
    peer_slots = [slot(("peer", name, kd, v)) for _j, name, _s0, _e0, kd, v in peers]
    name_slots = [slot(("name", pre, post, peer)) for _j, _s0, _e0, pre, post, peer in names]
    rest = [(j, s0, e0, sl) for (j, s0, e0, _i), sl in zip(pg, pg_slots, strict=True)]
    rest += [(j, s0, e0, sl) for (j, _n, s0, e0, _k, _v), sl in zip(peers, peer_slots, strict=True)]
    rest += [(j, s0, e0, sl) for (j, s0, e0, *_p), sl in zip(names, name_slots, strict=True)]
    r_j = np.asarray([t[0] for t in rest], dtype=np.int64)
    r_s = np.asarray([t[1] for t in rest], dtype=np.int64)
    r_e = np.asarray([t[2] for t in rest], dtype=np.int64)
    r_sl = np.asarray([t[3] for t in rest], dtype=np.int64)
    no_dg = (r_s, r_e, fi[r_j], r_sl)  # owners: the nodes' file positions
    with_dg = (
        np.concatenate([dg_s, r_s]),
        np.concatenate([dg_e, r_e]),
        np.concatenate([fi[dg_js], fi[r_j]]),
        np.concatenate([dg_slot, r_sl]),
    )
    return _RepTemplate(
        tmpl, dg_js, with_dg, no_dg, slots, [t[0] for t in pg], pg_slots, [t[0] for t in names], name_slots,
        reordered,
    )  # fmt: skip


def _peer_in_name(name: str, peer: int) -> tuple[str, str] | None:
    """(text before, text after) the last number in a P2P node's name that is its peer's rank, or None.

    Generated P2P names carry the peer ("send_act.fwd.mb0.to8"): a folded rank's name is then predicted
    with pi_k(peer) in its place. A prediction only saves work: a name that does not follow it is found
    by the byte comparison and taken from the file like any other name (names are labels).
    """
    want = str(peer)
    for m in reversed(list(_DIGITS.finditer(name))):
        if m.group() == want:
            return name[: m.start()], name[m.end() :]
    return None


def _predict(
    ctx, k, x, r, i, rt: _RepTemplate, prog, by_members, lab, layouts: dict, pg_keys: dict, want: bool = True
) -> Prediction | bool:
    """Rank x's labels (into lab) as its representative r's template gives them, and with `want` the file
    x would be (replay/fold_bytes.py); False when the template cannot name x's groups."""
    lo = prog.rank_offset[i]
    dgs = ctx.fold.device_groups
    swap_dg = len(rt.dg_nodes) > 0 and x in dgs and dgs[x] != dgs[r]
    pool: list[bytes] = []
    keys: list[str | None] = []
    for sl in rt.slots:
        kind = sl[0]
        key = None
        fb = b""
        if kind in ("dg", "peer") and not want:
            pass  # no bytes wanted, and neither names a label the tables take
        elif kind == "dg":
            fb = attribute_field(DEVICE_GROUP, dgs[x], sl[1]) if swap_dg else b""
        elif kind == "pg":
            ck = (k, sl[1])  # replica k's copy of a group: the same for every TP position of a stage
            if ck not in pg_keys:
                pg_keys[ck] = ctx.image_key(k, sl[1], sl[2], by_members)
            key = pg_keys[ck]
            if key is None:
                return False
            fb = attribute_field(PG_NAME, key, "string_val") if want else b""
        elif kind == "peer":
            fb = attribute_field(sl[1], ctx.perm(k, sl[3]), sl[2])
        elif sl[3] is None:
            key = f"{sl[1]}[replica {ctx.fold.dp_replicas[x]}]{sl[2]}"
            fb = name_field(key) if want else b""
        else:
            key = f"{sl[1]}{ctx.perm(k, sl[3])}{sl[2]}"
            fb = name_field(key) if want else b""
        pool.append(fb)
        keys.append(key)
    if swap_dg:
        lab.device_group = (dgs[r], dgs[x])
        lab.dg_nodes = rt.dg_nodes
    if not want:  # by construction: nothing changes the labels later, so they are held per slot
        if rt.pg_nodes:
            lab.pg_names = lab.keys = SlotNames(rt.pg_nodes, rt.pg_pos, rt.pg_slots, keys)
        if rt.name_nodes and all(keys[sl] != prog.name[lo + j] for j, sl in rt.name_first):
            lab.names = SlotNames(rt.name_nodes, rt.name_pos, rt.name_slots, keys)
            return True
        for j, sl in zip(rt.name_nodes, rt.name_slots, strict=True):
            if keys[sl] != prog.name[lo + j]:
                lab.names[j] = keys[sl]
        return True
    if rt.pg_nodes:
        lab.pg_names = dict(zip(rt.pg_nodes, [keys[sl] for sl in rt.pg_slots], strict=True))
        lab.keys = lab.pg_names.copy()
    for j, sl in zip(rt.name_nodes, rt.name_slots, strict=True):
        if keys[sl] != prog.name[lo + j]:
            lab.names[j] = keys[sl]
    subs = rt.subs if swap_dg else rt.subs_no_dg
    return predict_many(rt.tmpl, *subs, pool, layouts.setdefault(swap_dg, {}))


def _verify_bytes(
    ctx, k, x, r, i, rt: _RepTemplate, prog, by_members, lab, path, layouts: dict, pg_keys: dict
) -> bool:
    """Prove rank x against the byte template of its representative r; False: prove it the exact way."""
    lo = prog.rank_offset[i]
    if rt.reordered:
        return False  # the byte walk names nodes by file position: the exact proof
    pred = _predict(ctx, k, x, r, i, rt, prog, by_members, lab, layouts, pg_keys)
    if pred is False:
        return False
    try:
        xb, _gz = read_bytes(path)
    except (TraceFormatError, InputLimitError):
        return False  # the exact path reports it
    t = rt.tmpl

    def check_node(j: int, payload: bytes) -> bool:
        try:
            a = pb.Node.FromString(payload)
        except DecodeError:
            return False
        b = pb.Node.FromString(t.buf[int(t.payload_start[j]) : int(t.payload_end[j])])
        if a.id != b.id:
            return False  # ids shifted (or reordered): the exact proof handles a constant shift
        lab.names.pop(j, None)  # its name is read from the file, not predicted
        _exact_node(x, r, a, b, 0, j, lab, path)
        if prog.pg_name[lo + j] is not None or lo + j in prog.p2p:  # its group or peers, as _verify_rank
            _verify_comm(ctx, k, x, r, a, lo + j, j, prog, lab, path)
        return True

    def renamed(j: int, name: str) -> None:
        if name != prog.name[lo + j]:
            lab.names[j] = name
        else:
            lab.names.pop(j, None)

    return walk(xb, pred, check_node, renamed)


def _refuse(path: str, x: int, r: int, what: str) -> FoldRefused:
    return FoldRefused(f"{path}: cannot fold rank {x} onto rank {r}: {what}")


def _pg_attr(name: str) -> bytes:
    return attribute_field(PG_NAME, name, "string_val")


def _pg_subs(ctx, k, inside: dict[int, CollInfo], prog: Program, by_members, lo: int) -> dict[int, tuple]:
    """Per collective on a group inside replica 0: (own pg_name bytes, representative's, own name, key),
    the group being replica k's copy pi_k(members); used to compare such nodes by bytes."""
    out: dict[int, tuple] = {}
    cache: dict[tuple[str, str], tuple | None] = {}
    for j, c in inside.items():
        s_r = prog.pg_name[lo + j]
        ck = (s_r, c.group)
        if ck not in cache:
            key = ctx.image_key(k, c.members, c.group, by_members)
            cache[ck] = None if key is None or s_r != c.group else (_pg_attr(key), _pg_attr(s_r), key, key)
        if cache[ck] is not None:
            out[j] = cache[ck]
    return out


def _verify_rank(ctx, k, x, r, xn, rn, rser, prog, i, comm_js, safe, subs, lab, path) -> None:
    if len(xn) != len(rn):
        raise _refuse(path, x, r, f"{len(xn)} nodes vs {len(rn)}")
    lo = prog.rank_offset[i]
    dgs = ctx.fold.device_groups
    pat_x = pat_r = None
    if x in dgs and r in dgs and dgs[x] != dgs[r]:
        lab.device_group = (dgs[r], dgs[x])
        pat_x, pat_r = _dg_pattern(dgs[x]), _dg_pattern(dgs[r])
    delta = lab.id_delta = xn[0].id - rn[0].id if xn else 0
    done: set[int] = set()  # communication nodes whose group the byte comparison already proved
    for j, (a, rb) in enumerate(zip(xn, rser, strict=True)):
        fb = a.SerializeToString()
        if fb == rb:
            if j in safe:
                done.add(j)  # the same group name, and that group is shared
            continue
        # The generator labels every node with its device group, and a TP collective names replica k's
        # copy of the group: equal once those attributes are swapped (exactly one occurrence each side, the
        # representative's annotation being that device group; the group being pi_k of the other's).
        fb2 = fb
        dg_hit = (
            pat_x is not None
            and fb.count(pat_x) == 1
            and rb.count(pat_r) == 1
            and _rep_annotation(prog, lo + j, DEVICE_GROUP) == lab.device_group[0]
        )
        if dg_hit:
            fb2 = fb2.replace(pat_x, pat_r)
        sub = subs.get(j)
        pg_hit = sub is not None and fb2.count(sub[0]) == 1 and rb.count(sub[1]) == 1
        if pg_hit:
            fb2 = fb2.replace(sub[0], sub[1])
        if (dg_hit or pg_hit) and fb2 == rb:
            if dg_hit:
                lab.dg_nodes.append(j)
            if pg_hit:
                lab.pg_names[j] = sub[2]
                lab.keys[j] = sub[3]
            if pg_hit or j in safe:
                done.add(j)
            continue
        _exact_node(x, r, a, rn[j], delta, j, lab, path)
    for j in comm_js:
        if j not in done:
            _verify_comm(ctx, k, x, r, xn[j], lo + j, j, prog, lab, path)


def _exact_node(
    x: int, r: int, a: pb.Node, b: pb.Node, delta: int, j: int, lab: RankLabels, path: str
) -> None:
    """Node a of rank x equals node b of its representative r but for labels and rank references."""
    ca, cb = pb.Node(), pb.Node()
    ca.CopyFrom(a)
    cb.CopyFrom(b)
    for c in (ca, cb):
        c.ClearField("name")
        c.ClearField("attr")
    if delta:  # ids (and the deps naming them) shifted by one constant: the same graph
        ca.id -= delta
        ca.data_deps[:] = [d - delta for d in ca.data_deps]
        ca.ctrl_deps[:] = [d - delta for d in ca.ctrl_deps]
    if ca != cb:
        raise _refuse(path, x, r, f"node {a.id} {a.name!r} differs beyond labels and rank numbers")
    aa, ba = a.attr[:], b.attr[:]
    if len(aa) != len(ba):
        raise _refuse(path, x, r, f"node {a.id} {a.name!r} has {len(aa)} attributes vs {len(ba)}")
    for p, q in zip(aa, ba, strict=True):
        if p != q and (p.name != q.name or p.name not in _LABELS):
            raise _refuse(path, x, r, f"node {a.id} {a.name!r}: attribute {p.name!r} differs")
    if a.name != b.name:
        lab.names[j] = a.name
    lab.annotations[j] = _annotations(a)


def _verify_comm(ctx, k, x, r, a, g, j, prog, lab, path) -> None:
    src, dst, pgv = _comm_attrs(a)
    kind = prog.kind[g]
    where = f"node {a.id} {a.name!r}"
    if g in prog.p2p:
        info = prog.p2p[g]
        send = a.type == pb.COMM_SEND_NODE
        src = x if (send and src is None) else src
        dst = x if (not send and dst is None) else dst
        for v, want, what in ((src, info.src, "comm_src"), (dst, info.dst, "comm_dst")):
            if ctx.where[want][0] != 0:
                raise _refuse(
                    path, x, r, f"{where}: rank {r} exchanges P2P with rank {want} of another replica"
                )
            if isinstance(v, str) or v is None or int(v) != ctx.perm(k, want):
                raise _refuse(path, x, r, f"{where}: {what} {v!r}, expected {ctx.perm(k, want)}")
        if pgv != prog.pg_name[g]:
            lab.pg_names[j] = pgv
        return
    pgn = pgv if pgv is not None else ""
    if pgn != prog.pg_name[g]:
        lab.pg_names[j] = pgn
    if kind != K_COLL:
        return  # timed by its own duration (or a host-side call): no group matching
    info = prog.coll[g]
    res = resolve_group(ctx.groups, pgn)
    if res is None:
        raise _refuse(path, x, r, f"{where}: pg_name {pgn!r} is not a known process group")
    key, members = res
    cls = ctx.group_class(info.group, info.members)
    if cls == "shared":
        if key != info.group:
            raise _refuse(path, x, r, f"{where}: group {key!r}, representative's {info.group!r}")
    elif cls == "inside":
        renamed = tuple(ctx.perm(k, m) for m in members)
        if any(ctx.where[m][0] != k for m in members) or renamed != info.members:
            raise _refuse(
                path,
                x,
                r,
                f"{where}: group {key!r} = {list(members)} is not replica {k}'s copy of "
                f"{info.group!r} = {list(info.members)}",
            )
        lab.keys[j] = key
    elif cls == "partial":  # the group pi_k maps it onto: itself (same key) or another (its copy)
        img = ctx.image(k, info.members)
        if frozenset(members) != img or (img == frozenset(info.members) and key != info.group):
            what = f"group {key!r} = {list(members)} is not replica {k}'s image of {info.group!r}"
            raise _refuse(path, x, r, f"{where}: {what} = {list(info.members)}")
        lab.keys[j] = key
    else:
        raise _refuse(
            path, x, r, f"{where}: group {info.group!r} = {list(info.members)} spans the replicas unevenly"
        )


def private_model(network: NetworkModel) -> NetworkModel:
    """A copy of the model with its own pending transfers and handles, sharing the topology (routes are a
    function of the topology alone) and, for a model with TimingClasses, its memo tables (a function of the
    transfers alone): what either copy has timed, the other looks up."""
    memo = {id(v): v for v in vars(network).values() if isinstance(v, Topology)}
    if isinstance(network, TimingClasses):
        memo.update((id(t), t) for t in network.memo_tables())
    return copy.deepcopy(network, memo)


class NetCheck:
    """Times each distinct transfer once per replica on a private copy of the (contention-free) model."""

    def __init__(self, fold: Fold, groups: ProcessGroups, network: NetworkModel) -> None:
        self.ctx = _Ctx(fold, groups)
        self.model = private_model(network)
        self.keyed = isinstance(self.model, TimingClasses)
        self.done: set = set()

    def _times(self, start) -> tuple[int, ...]:
        try:
            h = start()
            comps = self.model.advance(_FAR)
        except NetworkModelError as exc:
            raise ReplayError(f"fold check: network model: {exc}") from None
        c = next(c for c in comps if c.handle == h)
        return tuple(c.per_rank_finish_ns) or (c.finish_ns,)

    def collective(self, spec: CollectiveSpec) -> None:
        """Same per-rank times for every replica's version of `spec` (and inside a shared group)."""
        if spec in self.done:
            return
        ctx, m = self.ctx, self.model
        base = self._times(lambda: m.start_collective(0, spec))
        pos = {rk: p for p, rk in enumerate(spec.ranks)}
        reps = ctx.fold.replicas
        for rk, p in pos.items():
            kk, i = ctx.where[rk]
            if kk and base[p] != base[pos[reps[0][i]]]:
                raise FoldRefused(
                    f"cannot fold: network model {m.name!r} finishes rank {rk} at +{base[p]} ns but "
                    f"its representative rank {reps[0][i]} at +{base[pos[reps[0][i]]]} ns in {spec.kind} "
                    f"over {list(spec.ranks)}"
                )
        inside = all(ctx.where[rk][0] == 0 for rk in spec.ranks)
        if inside or ctx.fold.positions:
            # Each replica's copy: proven by its timing class where the model names one (the model's own
            # rule for collectives it times alike), else timed. A rank-class fold's group with folded
            # members has a copy per distinct image (a TP group: one per DP replica).
            key = m.timing_key(spec) if self.keyed else None
            seen = {frozenset(spec.ranks)}
            for k in range(1, ctx.fold.factor):
                if not inside:
                    img = ctx.image(k, spec.ranks)
                    if img in seen:
                        continue
                    seen.add(img)
                ranks = tuple(ctx.perm(k, rk) for rk in spec.ranks)
                if not inside:  # the image group in its own member order
                    gk = ctx.by_set().get(img)
                    if gk is None:
                        raise FoldRefused(f"cannot fold: no one process group holds ranks {sorted(img)}")
                    ranks = ctx.groups.groups[gk]
                ren = replace(spec, ranks=ranks, root=None if spec.root is None else ctx.perm(k, spec.root))
                if key is not None and m.timing_key(ren) == key:
                    continue
                got = self._times(lambda ren=ren: m.start_collective(0, ren))
                if not inside and len(got) == len(ranks):  # rank pi_k(x) finishes when x does
                    at = {rk: p for p, rk in enumerate(ranks)}
                    got = tuple(got[at[ctx.perm(k, rk)]] for rk in spec.ranks)
                if got != base:
                    raise FoldRefused(
                        f"cannot fold: network model {m.name!r} times {spec.kind} over "
                        f"{list(ren.ranks)} (replica {k}) differently from {list(spec.ranks)}: "
                        f"{max(got)} vs {max(base)} ns"
                    )
        self.done.add(spec)

    def p2p(self, src: int, dst: int, size: int) -> None:
        """Same time for every replica's version of a send."""
        key = (src, dst, size)
        if key in self.done:
            return
        ctx, m = self.ctx, self.model
        base = self._times(lambda: m.start_p2p(0, src, dst, size))
        for k in range(1, ctx.fold.factor):
            s, d = ctx.perm(k, src), ctx.perm(k, dst)
            got = self._times(lambda s=s, d=d: m.start_p2p(0, s, d, size))
            if got != base:
                raise FoldRefused(
                    f"cannot fold: network model {m.name!r} times a {size} B send {s}->{d} "
                    f"(replica {k}) as {got[0]} ns but {src}->{dst} as {base[0]} ns"
                )
        self.done.add(key)


class FoldChecked:
    """The network model of a folded run, as a decorator: the model itself, each distinct transfer first
    proven to time alike on every replica (NetCheck). Implements the NetworkModel API and the optional
    abilities a foldable model may have (FixedDurations, StaggeredStarts) when the model has them."""

    def __init__(self, inner: NetworkModel, check: NetCheck) -> None:
        self.inner, self.check = inner, check
        self.name, self.num_ranks = inner.name, inner.num_ranks

    def start_collective(self, now_ns: int, spec: CollectiveSpec) -> int:
        """netmodels.api.NetworkModel, after the check."""
        self.check.collective(spec)
        return self.inner.start_collective(now_ns, spec)

    def start_p2p(self, now_ns: int, src: int, dst: int, size_bytes: int) -> int:
        """netmodels.api.NetworkModel, after the check."""
        self.check.p2p(src, dst, size_bytes)
        return self.inner.start_p2p(now_ns, src, dst, size_bytes)

    def next_event_ns(self) -> int | None:
        """netmodels.api.NetworkModel."""
        return self.inner.next_event_ns()

    def advance(self, until_ns: int) -> list:
        """netmodels.api.NetworkModel."""
        return self.inner.advance(until_ns)


class _FixedChecked(FoldChecked):
    def fixed_collective_ns(self, spec: CollectiveSpec) -> int:
        """netmodels.api.FixedDurations, after the check."""
        self.check.collective(spec)
        return self.inner.fixed_collective_ns(spec)

    def fixed_p2p_ns(self, src: int, dst: int, size_bytes: int) -> int:
        """netmodels.api.FixedDurations, after the check."""
        self.check.p2p(src, dst, size_bytes)
        return self.inner.fixed_p2p_ns(src, dst, size_bytes)


class _StaggeredChecked(FoldChecked):
    def start_collective_issued(self, now_ns: int, spec: CollectiveSpec, issue_ns: tuple[int, ...]) -> int:
        """netmodels.api.StaggeredStarts, after the check."""
        self.check.collective(spec)
        return self.inner.start_collective_issued(now_ns, spec, issue_ns)


class _FixedStaggeredChecked(_FixedChecked, _StaggeredChecked):
    pass


def fold_checked(network: NetworkModel, fold: Fold, groups: ProcessGroups) -> FoldChecked:
    """`network` wrapped for a folded run (FoldChecked), with the optional abilities it has."""
    fixed, stag = isinstance(network, FixedDurations), isinstance(network, StaggeredStarts)
    cls = {
        (False, False): FoldChecked,
        (True, False): _FixedChecked,
        (False, True): _StaggeredChecked,
        (True, True): _FixedStaggeredChecked,
    }[fixed, stag]
    return cls(network, NetCheck(fold, groups, network))


__all__ = [
    "Copies",
    "Fold",
    "NetCheck",
    "check_models",
    "fold_checked",
    "fold_from_deployment",
    "make_fold",
    "private_model",
    "resolve_fold",
    "tp_fold_from_deployment",
    "verify",
]
