"""Explaining a replay that stopped with nodes left: per stuck rank, the first blocked node and its reason."""

from __future__ import annotations

from collections.abc import Sequence

from xsim.replay.errors import ReplayDeadlock, StuckNode
from xsim.replay.matching import CollectiveMatcher, P2PMatcher
from xsim.replay.program import Program
from xsim.traces import pb


def explain_deadlock(
    prog: Program,
    t: int,
    left: int,
    start: Sequence[int],
    end: Sequence[int],
    ready: Sequence[int],
    remaining: Sequence[int],
    colls: CollectiveMatcher,
    p2ps: P2PMatcher,
    in_network: set[int],
) -> ReplayDeadlock:
    """The deadlock error: what each rank's first blocked node waits for."""
    waiting_recv = p2ps.waiting_recvs()
    inst_of = colls.waiting()
    stuck: list[StuckNode] = []
    for rank in range(prog.num_ranks):
        lo, hi = prog.rank_offset[rank], prog.rank_offset[rank + 1]
        unfinished = [g for g in range(lo, hi) if end[g] < 0]
        if not unfinished:
            continue
        reason = None
        chosen = None
        for g in unfinished:
            if start[g] < 0:
                continue
            if g in inst_of:
                inst = inst_of[g]
                info = prog.coll[g]
                reason = (
                    f"collective #{inst.index} of group {inst.key or '(all ranks)'!r} "
                    f"({pb.comm_type_name(info.comm_type)}, {info.size} B): rank(s) {inst.missing()} never issued it"
                )
            elif g in waiting_recv:
                info = prog.p2p[g]
                reason = f"a send from rank {info.src} with tag {info.tag} (unmatched recv, {info.size} B)"
            elif g in in_network:
                reason = "the network model to complete its transfer (it never did)"
            else:
                continue
            chosen = g
            break
        if chosen is None:
            for g in unfinished:
                if ready[g] >= 0 and start[g] < 0:
                    q = prog.queue[g]
                    holders = [h for h in unfinished if start[h] >= 0 and prog.queue[h] == q]
                    what = prog.describe(holders[0]) if holders else "nothing"
                    chosen, reason = g, f"a free slot on {prog.queue_label[q]} (held by {what})"
                    break
        if chosen is None:
            parents: dict[int, int] = {}
            for p in unfinished:
                for c in prog.children(p):
                    parents.setdefault(c, p)
            for g in unfinished:
                if remaining[g] > 0 and g in parents:
                    p = parents[g]
                    chosen = g
                    reason = f"dependency on node {int(prog.node_id[p])} {prog.name[p]!r} (unfinished)"
                    break
        if chosen is None:
            chosen, reason = unfinished[0], "an unknown condition"
        stuck.append(StuckNode(prog.rank_of(chosen), int(prog.node_id[chosen]), prog.name[chosen], reason))
    return ReplayDeadlock(t, left, stuck)
