"""A deliberately simple reference simulator of ASTRA-sim's scheduling rules, for differential tests of replay/.

Written for clarity, not speed: every step rescans every node. It imports nothing from replay/ and follows
only the rules as the reference documents state them:

- chakra-et.md 3.2 / astrasim-analytical.md 3.4: a node is ready when all its data_deps and ctrl_deps
  finished (FeederV3's union). Per rank, ready nodes are issued in ascending node id, each only when its own
  resource is free: one GPU compute op, one GPU communication op (collective or send) and one CPU op
  (`is_cpu_op`) in flight; RECV nodes take no slot. COMP duration = duration_micros x 1000 ns, 0 -> 1 ns.
  METADATA completes with zero time.
- astrasim-analytical.md 3.4: collectives are matched across ranks by issue order (here: the k-th
  collective a rank issues on group G is instance k of G) and start when the last member issued; the
  network time is a closed form identical for every member (the stand-in for a network model).
- chakra-et.md 3.1: send/recv are matched on (src, dst, tag); a send starts its transfer when issued and
  finishes when the data arrives, a recv finishes at max(its posting, the arrival). pg_name "" or "0" =
  all ranks.
- Communication streams (docs/replay.md, "Communication streams"; xsim's default outside ASTRA-sim mode):
  with `streams=True`, the single communication slot becomes one slot per process group (its collectives)
  plus one for sends, per rank, as NCCL runs each communicator on its own stream.
- Same-instant rule (docs/replay.md, "Tie-breaking"): everything that finishes at one ns, including the
  zero-time cascade it releases (METADATA, recvs whose data is already there), is applied before any rank
  issues at that ns, so two nodes ready at one ns always issue smaller id first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from xsim.traces import pb
from xsim.traces.attrs import comm_dst, comm_size, comm_src, comm_tag, comm_type, is_cpu_op, pg_name

# Chakra CollectiveCommType -> contract-E kind names, written out here (not taken from replay/).
KIND_NAME = {
    pb.ALL_REDUCE: "all_reduce",
    pb.ALL_GATHER: "all_gather",
    pb.REDUCE_SCATTER: "reduce_scatter",
    pb.ALL_TO_ALL: "all_to_all",
    pb.BROADCAST: "broadcast",
}
# Stand-in network (any closed form does; these are chosen so that times are often whole microseconds and
# therefore collide, which exercises the same-instant rules): a collective lasts BASE[kind] +
# 250 ns per member + size // 4 ns; a transfer 500 ns + size // 8 ns.
COLL_BASE_NS = {
    "all_reduce": 2000,
    "all_gather": 1500,
    "reduce_scatter": 1500,
    "all_to_all": 3000,
    "broadcast": 1000,
}


def collective_ns(kind: str, size_bytes: int, num_members: int) -> int:
    """Closed-form duration of one collective, the same for every member."""
    return COLL_BASE_NS[kind] + 250 * num_members + size_bytes // 4


def p2p_ns(size_bytes: int) -> int:
    """Closed-form duration of one point-to-point transfer."""
    return 500 + size_bytes // 8


@dataclass
class RefNode:
    """One node with its static facts (from the trace) and its simulated times (filled in by the run)."""

    rank: int
    id: int
    name: str
    slot: str | None  # "compute", "cpu", "comm" or None (recv, metadata: no slot)
    op: str  # "compute", "coll", "send", "recv", "zero"
    deps: frozenset[int]
    dur_ns: int = 0
    group: str = ""
    members: tuple[int, ...] = ()
    kind: str = ""
    size: int = 0
    src: int = -1
    dst: int = -1
    tag: int = -1
    ready: int | None = None
    start: int | None = None
    end: int | None = None  # known as soon as it is determined (may lie in the future)
    wait: int = 0
    arrival: int | None = None  # sends: when the data arrives at the receiver
    peer_node: tuple[int, int] | None = None  # send/recv: (rank, id) of the node it was matched with

    def finished_by(self, t: int) -> bool:
        """True when the node's end is known and not after t."""
        return self.end is not None and self.end <= t


class RefDeadlock(Exception):
    """Nothing can progress but nodes remain."""

    def __init__(self, time_ns: int, stuck: dict[int, list[int]]) -> None:
        self.time_ns = time_ns
        self.stuck = stuck  # rank -> ids of its unfinished nodes
        super().__init__(f"deadlock at t={time_ns} ns on ranks {sorted(stuck)}")


@dataclass(frozen=True)
class RefCollective:
    """One collective instance: group key, kind, bytes, members' first and last issue, end."""

    group: str
    kind: str
    size: int
    members: tuple[int, ...]
    first_arrival: int
    last_arrival: int
    end: int


@dataclass
class RefResult:
    """Per-node times keyed by (rank, node id), per-rank finish times and the collective instances."""

    nodes: dict[tuple[int, int], RefNode]
    finish: list[int] = field(default_factory=list)
    collectives: list[RefCollective] = field(default_factory=list)


def _to_ref(
    rank: int, node: pb.Node, groups: Mapping[str, tuple[int, ...]], num_ranks: int, streams: bool
) -> RefNode:
    deps = frozenset(node.data_deps) | frozenset(node.ctrl_deps)
    base = {"rank": rank, "id": node.id, "name": node.name, "deps": deps}
    if node.type == pb.COMP_NODE:
        slot = "cpu" if is_cpu_op(node) else "compute"
        return RefNode(**base, slot=slot, op="compute", dur_ns=node.duration_micros * 1000 or 1)
    if node.type == pb.COMM_COLL_NODE:
        name = pg_name(node)
        key = "" if name in ("", "0") else name  # "" and "0" both mean all ranks
        members = tuple(range(num_ranks)) if key == "" else tuple(groups[key])
        return RefNode(
            **base,
            slot=f"comm group {key}" if streams else "comm",
            op="coll",
            group=key,
            members=members,
            kind=KIND_NAME[comm_type(node)],
            size=comm_size(node),
        )
    if node.type == pb.COMM_SEND_NODE:
        return RefNode(
            **base,
            slot="comm p2p" if streams else "comm",
            op="send",
            src=rank,
            dst=comm_dst(node),
            tag=comm_tag(node),
            size=comm_size(node),
        )
    if node.type == pb.COMM_RECV_NODE:
        return RefNode(
            **base,
            slot=None,
            op="recv",
            src=comm_src(node),
            dst=rank,
            tag=comm_tag(node),
            size=comm_size(node),
        )
    if node.type == pb.METADATA_NODE:
        return RefNode(**base, slot=None, op="zero")
    raise ValueError(f"reference simulator does not model node type {node.type}")


def reference_replay(
    per_rank: Sequence[Sequence[pb.Node]], groups: Mapping[str, tuple[int, ...]], streams: bool = False
) -> RefResult:
    """Simulate the trace set; raises RefDeadlock when nodes remain that can never run."""
    num_ranks = len(per_rank)
    nodes = {
        (r, n.id): _to_ref(r, n, groups, num_ranks, streams) for r, ns in enumerate(per_rank) for n in ns
    }
    by_rank = [sorted((nodes[(r, n.id)] for n in ns), key=lambda x: x.id) for r, ns in enumerate(per_rank)]
    coll_count: dict[tuple[str, int], int] = {}  # (group, rank) -> collectives issued so far
    instances: dict[str, list[dict[int, RefNode]]] = {}  # group -> instance k -> {rank: node}
    sends: dict[tuple[int, int, int], list[RefNode]] = {}  # unmatched sends per (src, dst, tag), FIFO
    recvs: dict[tuple[int, int, int], list[RefNode]] = {}  # unmatched posted recvs per key, FIFO

    done_colls: list[RefCollective] = []

    def pair(s: RefNode, r: RefNode) -> None:
        r.end = max(r.start, s.arrival)
        r.wait = max(0, s.start - r.start)
        s.peer_node, r.peer_node = (r.rank, r.id), (s.rank, s.id)

    def settle(t: int) -> None:
        """Mark readiness at t and run the zero-time cascade (metadata, recv posting) to a fixpoint."""
        changed = True
        while changed:
            changed = False
            for rank_nodes in by_rank:
                for n in rank_nodes:
                    if n.ready is not None:
                        continue
                    if not all(nodes[(n.rank, d)].finished_by(t) for d in n.deps):
                        continue
                    n.ready = t
                    changed = True
                    if n.op == "zero":
                        n.start = n.end = t
                    elif n.op == "recv":
                        n.start = t
                        key = (n.src, n.dst, n.tag)
                        if sends.get(key):
                            pair(sends[key].pop(0), n)
                        else:
                            recvs.setdefault(key, []).append(n)

    def issue(t: int) -> bool:
        """Issue, per rank and slot, the smallest-id ready node when the slot is free; True if any issued."""
        any_issued = False
        for rank_nodes in by_rank:
            for slot in (
                "compute",
                "cpu",
                *sorted({n.slot for n in rank_nodes if n.slot not in (None, "compute", "cpu")}),
            ):
                if any(n.slot == slot and n.start is not None and not n.finished_by(t) for n in rank_nodes):
                    continue  # the slot is busy
                ready = [n for n in rank_nodes if n.slot == slot and n.ready is not None and n.start is None]
                if not ready:
                    continue
                n = min(ready, key=lambda x: x.id)
                n.start = t
                any_issued = True
                if n.op == "compute":
                    n.end = t + n.dur_ns
                elif n.op == "send":
                    n.arrival = n.end = t + p2p_ns(n.size)
                    key = (n.src, n.dst, n.tag)
                    if recvs.get(key):
                        pair(n, recvs[key].pop(0))
                    else:
                        sends.setdefault(key, []).append(n)
                else:  # collective: join instance k of its group
                    k = coll_count.get((n.group, n.rank), 0)
                    coll_count[(n.group, n.rank)] = k + 1
                    inst_list = instances.setdefault(n.group, [])
                    if k == len(inst_list):
                        inst_list.append({})
                    inst = inst_list[k]
                    inst[n.rank] = n
                    if len(inst) == len(n.members):
                        # The last member arrived: everybody ends together after the closed-form time.
                        kinds = {(m.kind, m.size) for m in inst.values()}
                        if len(kinds) != 1:
                            raise ValueError(
                                f"collective #{k} of group {n.group!r}: members disagree {kinds}"
                            )
                        d = collective_ns(n.kind, n.size, len(n.members))
                        for m in inst.values():
                            m.end = t + d
                            m.wait = t - m.start
                        first = min(m.start for m in inst.values())
                        done_colls.append(RefCollective(n.group, n.kind, n.size, n.members, first, t, t + d))
        return any_issued

    t = 0
    while True:
        while True:  # apply everything that happens at t; issuing only starts future events
            settle(t)
            if not issue(t):
                break
        future = [n.end for n in nodes.values() if n.end is not None and n.end > t]
        if not future:
            break
        t = min(future)

    left = {}
    for r, rank_nodes in enumerate(by_rank):
        ids = [n.id for n in rank_nodes if not n.finished_by(t)]
        if ids:
            left[r] = ids
    if left:
        raise RefDeadlock(t, left)
    finish = [max((n.end for n in rank_nodes), default=0) for rank_nodes in by_rank]
    return RefResult(nodes, finish, done_colls)
