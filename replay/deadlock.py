"""Explaining a replay that stopped with nodes left: per stuck rank, the first blocked node and its reason."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xsim.replay.errors import ReplayDeadlock, StuckNode
from xsim.replay.matching import CollectiveInstance, CollectiveMatcher, P2PMatcher
from xsim.replay.program import Program
from xsim.traces import pb


@dataclass(frozen=True)
class StoppedRun:
    """The engine where a replay stopped with nodes left: its time, how many nodes are left, each node's
    start, end and ready times (-1: not yet) and dependencies remaining, the matchers, and the nodes whose
    transfers the network model holds."""

    prog: Program
    t: int
    left: int
    start: Sequence[int]
    end: Sequence[int]
    ready: Sequence[int]
    remaining: Sequence[int]
    colls: CollectiveMatcher
    p2ps: P2PMatcher
    in_network: set[int]


def explain_deadlock(run: StoppedRun) -> ReplayDeadlock:
    """The deadlock error: what each rank's first blocked node waits for."""
    prog = run.prog
    waiting_recv = run.p2ps.waiting_recvs()
    inst_of = run.colls.waiting()
    stuck: list[StuckNode] = []
    for rank in range(prog.num_ranks):
        lo, hi = prog.rank_offset[rank], prog.rank_offset[rank + 1]
        unfinished = [g for g in range(lo, hi) if run.end[g] < 0]
        if not unfinished:
            continue
        found = (
            _waits_for_partner(run, unfinished, inst_of, waiting_recv)
            or _waits_for_slot(run, unfinished)
            or _waits_for_parent(run, unfinished)
            or (unfinished[0], "an unknown condition")
        )
        chosen, reason = found
        stuck.append(StuckNode(prog.rank_of(chosen), int(prog.node_id[chosen]), prog.name[chosen], reason))
    return ReplayDeadlock(run.t, run.left, stuck)


def _waits_for_partner(
    run: StoppedRun, unfinished: list[int], inst_of: dict[int, CollectiveInstance], waiting_recv: set[int]
) -> tuple[int, str] | None:
    """The first started node waiting on other ranks (a collective's members, a send) or the network."""
    prog = run.prog
    for g in unfinished:
        if run.start[g] < 0:
            continue
        if g in inst_of:
            inst = inst_of[g]
            info = prog.coll[g]
            return g, (
                f"collective #{inst.index} of group {inst.key or '(all ranks)'!r} "
                f"({pb.comm_type_name(info.comm_type)}, {info.size} B): rank(s) {inst.missing()} never issued it"
            )
        if g in waiting_recv:
            info = prog.p2p[g]
            return g, f"a send from rank {info.src} with tag {info.tag} (unmatched recv, {info.size} B)"
        if g in run.in_network:
            return g, "the network model to complete its transfer (it never did)"
    return None


def _waits_for_slot(run: StoppedRun, unfinished: list[int]) -> tuple[int, str] | None:
    """The first ready node not started: its queue's slot is held."""
    prog = run.prog
    for g in unfinished:
        if run.ready[g] >= 0 and run.start[g] < 0:
            q = prog.queue[g]
            holders = [h for h in unfinished if run.start[h] >= 0 and prog.queue[h] == q]
            what = prog.describe(holders[0]) if holders else "nothing"
            return g, f"a free slot on {prog.queue_label[q]} (held by {what})"
    return None


def _waits_for_parent(run: StoppedRun, unfinished: list[int]) -> tuple[int, str] | None:
    """The first node with dependencies left whose parent (an unfinished node of the rank) is named."""
    prog = run.prog
    parents: dict[int, int] = {}
    for p in unfinished:
        for c in prog.children(p):
            parents.setdefault(c, p)
    for g in unfinished:
        if run.remaining[g] > 0 and g in parents:
            p = parents[g]
            return g, f"dependency on node {int(prog.node_id[p])} {prog.name[p]!r} (unfinished)"
    return None
