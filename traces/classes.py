"""A compact set's class record (classes.json): which ranks were written and which mirror them.

`xsim gen` writes only the files of DP replica 0 of a symmetric plan (every replica the same program up
to labels) and records here how the others map onto it: replica k's i-th rank is replica 0's i-th rank
with its device group id, its groups (replica k's copy of a group inside replica 0, the same shared
group) and its P2P peers renamed by pi_k, the swap of replica k with replica 0 rank by rank (the fold of
replay/fold.py). Where a stage's TP ranks are alike too (`tp_positions` T > 1), the entries are rank
classes: entry k holds TP position k % T of every stage of DP replica k // T, only entry 0 (one rank per
stage) is written, and pi_k swaps DP replica k // T with 0 and TP position k % T with 0 at once (the ring
form of context parallelism: a CP block of cp DP replicas in the DP replica's place, entry 0 one rank per
stage and CP position, tracegen/compact.py). With
`cp_positions` C > 1 (context parallelism, all-gather form) DP replica d is CP position d % C of data
replica d // C, and pi_k swaps data replica, CP position and TP position with 0 at once. With
`ep_positions` E > 1 (expert parallelism under a routing that loads every EP rank alike, tracegen/compact.py)
DP replica d is EP-group position d % E of EP block d // E (E the DP replicas one EP group spans), in the
place of the CP position. The replay folds by that construction; a verb that needs every rank's file refuses the
set in one line naming `xsim gen --all-ranks`. A heterogeneous plan's entries are super-replicas, each
holding replicas of every class in one order (tracegen/compact.py); `classes` lists them by class.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from xsim.traces.errors import TraceSetError
from xsim.traces.io import read_json

CLASSES_FILE = "classes.json"
FORMAT = "xsim-rank-classes"
VERSION = 1


@dataclass(frozen=True)
class RankClasses:
    """Replicas of a compact set: replica 0 is written, replica k's i-th rank mirrors replica 0's i-th."""

    prefix: str  # the set's file prefix (<prefix>.<rank>.et)
    num_ranks: int
    replicas: tuple[tuple[int, ...], ...]
    device_groups: tuple[tuple[int, ...], ...]  # per replica, per position: the rank's device group id
    # A heterogeneous plan's classes of DP replica (the deployment's dp_replica numbers of each), whose
    # replicas the entries of `replicas` group into super-replicas (tracegen/compact.py); () when one class.
    classes: tuple[tuple[int, ...], ...] = ()
    # Per replica, per position: the rank's DP replica number, which names of nodes the rewriter adds carry
    # (a folded rank's is predicted from it); () when one class.
    dp_replicas: tuple[tuple[int, ...], ...] = ()
    # Rank classes (issue 24): TP positions folded per DP replica. Entry k is TP position k % tp of every
    # stage of DP replica k // tp, and mirrors entry 0 under the swap of DP replica k // tp with 0 and of
    # TP position k % tp with 0 in every stage at once (replay/fold.py); 1: entries are DP replicas.
    tp: int = 1
    # CP positions folded too (`cp_positions` C > 1, issue 28, the all-gather form): an entry's DP replica
    # number d (k // tp) is CP position d % C of data replica d // C, and pi_k swaps the data replica, the
    # CP position and the TP position of k with 0 at once; 1: no CP positions folded.
    cp: int = 1
    # EP positions folded (`ep_positions` E > 1, issue 28, a routing that loads every EP rank alike): as
    # `cp`, with EP groups for CP groups: DP replica d is position d % E of the E replicas one EP group
    # spans (its EP block d // E); never with cp > 1. 1: none.
    ep: int = 1

    @property
    def width(self) -> int:
        """Entries per data replica (EP block): the TP x CP x EP positions folded (1: whole replicas)."""
        return self.tp * self.cp * self.ep

    @property
    def written(self) -> tuple[int, ...]:
        """The ranks whose files the set holds (the representatives)."""
        return self.replicas[0]

    def to_json(self) -> dict:
        """The classes.json document."""
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "prefix": self.prefix,
            "num_ranks": self.num_ranks,
            "written": "replica 0"
            if self.width == 1
            else "TP position 0 of replica 0"
            if self.cp == self.ep == 1
            else "TP and CP position 0 of data replica 0"
            if self.cp > 1
            else "TP and EP position 0 of EP block 0",
            "replicas": [list(r) for r in self.replicas],
            "device_groups": [list(d) for d in self.device_groups],
        }
        if self.classes:
            doc["classes"] = [list(c) for c in self.classes]
            doc["dp_replicas"] = [list(d) for d in self.dp_replicas]
        if self.tp > 1:
            doc["tp_positions"] = self.tp
        if self.cp > 1:
            doc["cp_positions"] = self.cp
        if self.ep > 1:
            doc["ep_positions"] = self.ep
        return doc


def compact_refusal(what: str, classes: RankClasses) -> str:
    """The one line a verb that needs every rank's file gives on a compact set."""
    return (
        f"{what} needs every rank's trace file, but this is a compact set ({len(classes.written):,} of "
        f"{classes.num_ranks:,} ranks written, the others mirror them: {CLASSES_FILE}): regenerate it with "
        "`xsim gen --all-ranks`"
    )


def write_classes(directory: str, classes: RankClasses) -> str:
    """Write DIR/classes.json (atomically); returns its path."""
    path = os.path.join(directory, CLASSES_FILE)
    text = json.dumps(classes.to_json(), separators=(",", ":")) + "\n"
    from xsim.traces.outputs import atomic_write_text  # the writer only: a replay reads

    return atomic_write_text(path, text)


def read_classes(directory: str, prefix: str) -> RankClasses | None:
    """The class record beside the files of `prefix` (a path prefix), or None when the set is complete."""
    path = os.path.join(directory or ".", CLASSES_FILE)
    if not os.path.isfile(path):
        return None
    doc = read_json(path)
    try:
        if doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise ValueError(f"format {doc.get('format')!r} version {doc.get('version')!r}")
        if doc["prefix"] != os.path.basename(prefix):
            return None  # another set's record
        n = int(doc["num_ranks"])
        reps = tuple(tuple(int(r) for r in rep) for rep in doc["replicas"])
        dgs = tuple(tuple(int(d) for d in rep) for rep in doc["device_groups"])
        kinds = tuple(tuple(int(j) for j in c) for c in doc.get("classes", ()))
        dprs = tuple(tuple(int(d) for d in rep) for rep in doc.get("dp_replicas", ()))
        tp, cp = int(doc.get("tp_positions", 1)), int(doc.get("cp_positions", 1))
        ep = int(doc.get("ep_positions", 1))
        if cp > 1 and ep > 1:
            raise ValueError(f"cp_positions {cp} with ep_positions {ep} (one of them at most)")
        w = tp * cp * ep
        if min(tp, cp, ep) < 1 or len(reps) % w or (w > 1 and (kinds or dprs)):
            both = f"tp_positions {tp}" + (f" x cp_positions {cp}" if cp != 1 else "")
            both += f" x ep_positions {ep}" if ep != 1 else ""
            raise ValueError(f"{both} does not divide {len(reps)} entries of one class")
        if dprs and [len(d) for d in dprs] != [len(r) for r in reps]:
            raise ValueError("replicas and DP replica numbers of unequal lengths")
        if not reps or sorted(r for rep in reps for r in rep) != list(range(n)):
            raise ValueError(f"the replicas do not hold ranks 0..{n - 1} once each")
        if any(len(rep) != len(reps[0]) for rep in reps) or [len(d) for d in dgs] != [len(r) for r in reps]:
            raise ValueError("replicas and device groups of unequal lengths")
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise TraceSetError(f"malformed rank-class record ({exc})", path=path) from None
    return RankClasses(os.path.basename(prefix), n, reps, dgs, kinds, dprs, tp, cp, ep)
