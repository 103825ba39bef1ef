"""One rank's Chakra graph from a linked host trace + Kineto trace.

Vertices are the matched host ops (CPU program order per Kineto thread), the GPU kernels/memcpys they
launch, and the gloo work of CPU collectives. Times come from Kineto, in integer nanoseconds.

Durations. A CPU op's node lasts from its start to the start of the next op on the same thread (its
exclusive time plus the host overhead before the next op), minus the time the thread was visibly
blocked: inside CUDA synchronization calls, while another CPU thread ran on its behalf (the autograd
thread during `backward()`), or after it finished while waiting for a collective's result. Each such wait
becomes a dependency instead (sync edge, fork/join edge, collective edge), so replaying the graph with
the measured durations reproduces the thread's timeline, and a faster device or network shortens it.

CPU ops are cut where a kernel launch or a synchronize call returns, and where the work of a blocking
gloo collective began (continuation vertices, same op), so a kernel waits only for the part of its
launcher before the launch, and only the part after a synchronize call or blocking call waits.

Dependencies (all from a lower id to a higher one; ids follow the time a node could start, so the graph
is acyclic by construction): program order per CPU thread; CPU op part -> GPU op it launched (Kineto
`correlation`); GPU stream order; GPU op -> CPU op part after a synchronize call that waited for it; CPU
fork/join across threads; c10d op -> its gloo work -> first op of the launching thread that starts after
the work ended (gloo sends are issued when c10d::send is called). Cross-rank adjustments (collective
tails, send durations) are made by `add_comm_tails` and `tracegen.importers.pytorch.import_pytorch`.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from xsim.tracegen.importers.pytorch.comms import (
    SEND,
    CommKind,
    comm_kind,
    is_nccl_kernel,
    nccl_kernel_coll,
    p2p_peer_tag,
    payload_bytes,
)
from xsim.tracegen.importers.pytorch.errors import PyTorchImportError
from xsim.tracegen.importers.pytorch.hostet import HostTrace
from xsim.tracegen.importers.pytorch.labels import Label, label_ops
from xsim.tracegen.importers.pytorch.link import Link
from xsim.traces import attrs as A
from xsim.traces import pb
from xsim.traces.kineto import SYNC_CALLS, KEvent, KinetoTrace
from xsim.traces.limits import short_repr

# Attribute names the importer writes besides the standard ones (documented in docs/pytorch-import.md).
MODULE = "module"  # string: nn.Module path or scope the op ran in
SOURCE_OP = "source_op"  # string: host op that launched a GPU kernel / collective
DURATION_NS = A.DURATION_NS  # int64: exact measured duration (duration_micros is rounded to whole µs)
PROFILER_STEP = "profiler_step"  # int64: N of the ProfilerStep#N window the op started in (-1: none)
TID = "tid"  # int64: Kineto thread (CPU ops) ; STREAM for GPU ops
RF_ID = "rf_id"
MEASURED_START_NS = "measured_start_ns"  # int64: Kineto start relative to the earliest rank's first op
START_OFFSET = "xsim::start_offset"  # a rank's late start relative to the earliest rank (host time)
START_ID, FIRST_ID = 1, 2
# int64: a collective's or send's Kineto duration where duration_ns was adjusted for the replay
KINETO_DUR_NS = "kineto_dur_ns"
TAIL_PREFIX = "xsim::comm_tail:"  # a rank finishing a collective later than the replay's common end


@dataclass
class Vertex:
    """A node under construction."""

    key: tuple[int, int, int]  # (start ns, kind order, sequence) -> the node id order
    name: str
    ts: int
    dur: int
    kind: str  # "cpu" | "gpu" | "comm" | "tail"
    host_id: int | None = None
    thread: Any = None
    stream: Any = None
    deps: set[int] = field(default_factory=set)  # indices into the vertex list
    comm: CommKind | None = None
    comm_bytes: int = 0
    source_op: str = ""
    peer: int | None = None
    tag: int = 0
    id: int = -1
    measured: int | None = None  # Kineto duration when `dur` was changed for the replay (collectives)
    issue_ts: int | None = None  # gloo P2P: when the c10d op that sent/received the data began


@dataclass
class RankGraph:
    """The imported graph of one rank plus what the import measured."""

    rank: int
    vertices: list[Vertex]
    labels: dict[int, Label]
    steps: dict[int, tuple[int, int]]  # ProfilerStep N -> (start ns, end ns)
    link: Link
    gpu_run: bool
    dropped_gpu_ops: int
    dropped_edges: int
    warnings: list[str]
    p2p: list[int] = field(default_factory=list)  # vertex indices of send/recv ops


def _containing(starts: list[int], t: int) -> int | None:
    """Index of the chain interval [starts[i], starts[i+1]) holding time t."""
    i = bisect.bisect_right(starts, t) - 1
    return i if i >= 0 else None


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _union_len(intervals: list[tuple[int, int]]) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _comm_of_host(host: HostTrace, hid: int) -> tuple[CommKind, int, str, int] | None:
    """(kind, payload bytes, op name, host id) of the nearest communication op among hid and ancestors."""
    seen = 0
    while hid in host.ops and seen < 64:
        op = host.ops[hid]
        kind = comm_kind(op.name)
        if kind is not None:
            size = payload_bytes(kind, op.inputs)
            if not size and op.parent in host.ops:
                parent = host.ops[op.parent]
                pk = comm_kind(parent.name)
                if pk is not None:
                    size = payload_bytes(pk, parent.inputs)
            return kind, size, op.name, hid
        if op.parent == hid:
            break
        hid = op.parent
        seen += 1
    return None


def _p2p_of_ancestors(host: HostTrace, hid: int) -> tuple[int | None, int]:
    """Peer and tag of the c10d send/recv op at or above hid (nccl:send sits below c10d::send)."""
    for _ in range(64):
        op = host.ops.get(hid)
        if op is None:
            break
        kind = comm_kind(op.name)
        if kind is not None and kind.peer_input is not None:
            return p2p_peer_tag(kind, op.inputs)
        if op.parent == hid:
            break
        hid = op.parent
    return None, 0


def _split_at_calls(
    verts: list[Vertex],
    chains: dict[Any, list[int]],
    kineto: KinetoTrace,
    seq: int,
    extra: dict[Any, list[int]],
) -> int:
    """Split CPU ops where a kernel launch or a synchronize call returns; returns the next sequence number.

    The part of an op before a launch returns is what the kernel waits for, and the part after a
    synchronize call returns is what waits for the GPU: a continuation vertex (same op, same labels)
    starts at each such point, so launch and sync edges attach where they happened inside the op.
    """
    gpu_corr = {e.args.get("correlation") for e in kineto.gpu_ops}
    cuts: dict[Any, list[int]] = defaultdict(list, {t: list(v) for t, v in extra.items()})
    for r in kineto.runtime:
        if r.name in SYNC_CALLS or r.args.get("correlation") in gpu_corr:
            cuts[(r.pid, r.tid)].append(r.ts + r.dur)
    for thread, idx in chains.items():
        times = sorted(set(cuts.get(thread, ())))
        if not times:
            continue
        out: list[int] = []
        starts = [verts[i].ts for i in idx]
        for k, vi in enumerate(idx):
            v = verts[vi]
            nxt = starts[k + 1] if k + 1 < len(idx) else v.ts + v.dur
            lo, hi = bisect.bisect_right(times, v.ts), bisect.bisect_left(times, nxt)
            out.append(vi)
            end = v.ts + v.dur
            for t in times[lo:hi]:
                part = Vertex(
                    key=(t, 0, seq),
                    name=v.name,
                    ts=t,
                    dur=max(0, end - t),
                    kind="cpu",
                    host_id=v.host_id,
                    thread=thread,
                )
                seq += 1
                prev = verts[out[-1]]
                prev.dur = t - prev.ts  # the earlier part runs up to the cut
                out.append(len(verts))
                verts.append(part)
        chains[thread] = out
    return seq


def gpu_run_of(kineto: KinetoTrace) -> bool:
    """True when the Kineto trace holds GPU activity."""
    return bool(kineto.gpu_ops)


def _match_gloo(
    verts: list[Vertex], host: HostTrace, kineto: KinetoTrace
) -> tuple[list[tuple[int, KEvent]], int]:
    """Pair each c10d op with its gloo work (k-th op of a kind with k-th work); also count unmatched ops."""
    comm_hosts = [
        vi
        for vi, v in enumerate(verts)
        if v.kind == "cpu" and v.name.startswith("c10d::") and comm_kind(v.name)
    ]
    queues: dict[tuple[Any, Any], list[int]] = defaultdict(list)
    for vi in sorted(comm_hosts, key=lambda i: (host.ops[verts[i].host_id].rf_id, verts[i].host_id)):
        kind = comm_kind(verts[vi].name)
        queues[(kind.coll, kind.p2p)].append(vi)
    work = sorted(kineto.comm_threads, key=lambda e: (_int(e.args.get("Record function id")), e.ts, e.index))
    pairs = []
    for w in work:
        kind = comm_kind(w.name)
        if kind is None:
            continue
        q = queues.get((kind.coll, kind.p2p))
        # Work that started before the next unmatched c10d op of its kind was issued belongs to an op
        # outside the host trace's window.
        if not q or w.ts < verts[q[0]].ts:
            continue
        pairs.append((q.pop(0), w))
    return pairs, sum(len(q) for q in queues.values())


def build_rank(rank: int, host: HostTrace, kineto: KinetoTrace, link: Link) -> RankGraph:
    """Vertices, timings and dependencies of one rank."""
    labels = label_ops(host)
    b = _RankBuilder(host, kineto)
    b.cpu_chains(link)
    gloo_pairs, blocking = b.cut_at_calls()
    b.chain_walls()
    b.fork_join()
    b.gpu_ops()
    b.sync_calls()
    b.gloo_work(gloo_pairs, blocking)
    b.final_durations()
    verts = b.verts
    dropped_edges = number(verts)
    steps = {n: (e.ts, e.end) for n, e in kineto.steps.items()}
    p2p = [i for i, v in enumerate(verts) if v.comm is not None and v.comm.p2p is not None]
    return RankGraph(
        rank, verts, labels, steps, link, bool(kineto.gpu_ops), b.dropped_gpu, dropped_edges, b.warnings, p2p
    )


class _RankBuilder:
    """One rank's vertices under construction; `build_rank` runs its phases in order."""

    def __init__(self, host: HostTrace, kineto: KinetoTrace) -> None:
        self.host, self.kineto = host, kineto
        self.warnings: list[str] = []
        self.verts: list[Vertex] = []
        self.seq = 0  # tie-break of vertex keys, in creation order
        self.chains: dict[Any, list[int]] = defaultdict(list)  # CPU thread -> its vertices in order
        self.thread_end: dict[Any, int] = {}
        self.starts: dict[Any, list[int]] = {}  # CPU thread -> start times of its chain
        self.blocked: dict[int, list[tuple[int, int]]] = defaultdict(list)  # vertex -> blocked intervals
        self.sync_wait: dict[int, int] = defaultdict(int)
        self.walls: dict[int, int] = {}  # CPU vertex -> start to next start on its thread
        self.busy_end: dict[int, int] = {}
        self.dropped_gpu = 0
        self.gpu_by_corr: list[tuple[int, Any, int]] = []  # (correlation, stream, vertex)

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq - 1

    def cpu_chains(self, link: Link) -> None:
        """CPU chains, one per Kineto thread, in start order (parents before their children)."""
        host = self.host
        depth: dict[int, int] = {}

        def _depth(hid: int) -> int:
            d, cur = 0, hid
            while cur in host.ops and host.ops[cur].parent != cur and d < 256:
                if cur in depth:
                    return depth[cur] + d
                cur = host.ops[cur].parent
                d += 1
            return d

        for hid in link.matches:
            depth[hid] = _depth(hid)
        matched = sorted(link.matches.items(), key=lambda kv: (kv[1].ts, -kv[1].dur, depth[kv[0]], kv[0]))
        for hid, ev in matched:
            v = Vertex(
                key=(ev.ts, 0, self._next_seq()),
                name=host.ops[hid].name,
                ts=ev.ts,
                dur=ev.dur,
                kind="cpu",
                host_id=hid,
                thread=(ev.pid, ev.tid),
            )
            self.chains[v.thread].append(len(self.verts))
            self.verts.append(v)
        verts = self.verts
        self.thread_end = {t: max(verts[i].ts + verts[i].dur for i in idx) for t, idx in self.chains.items()}

    def cut_at_calls(self) -> tuple[list[tuple[int, KEvent]], set[int]]:
        """Pair c10d ops with their gloo work and cut CPU ops at launches, syncs and blocking work starts;
        returns the pairs and the blocking calls among them."""
        verts = self.verts
        gloo_pairs, unmatched = _match_gloo(verts, self.host, self.kineto)
        if not gpu_run_of(self.kineto) and unmatched:
            self.warnings.append(f"{unmatched} c10d ops have no gloo work in Kineto; kept as CPU ops only")
        # gloo P2P work events do not time the transfer (the calling thread writes the data), so only
        # collectives are cut where their work began.
        blocking = {
            vi
            for vi, w in gloo_pairs
            # Blocking: the work began and ended inside the call (an async op returns before its work ends).
            if verts[vi].ts < w.ts
            and w.ts + w.dur <= verts[vi].ts + verts[vi].dur
            and comm_kind(verts[vi].name).p2p is None
        }
        extra_cuts: dict[Any, list[int]] = defaultdict(list)
        for vi, w in gloo_pairs:
            if vi in blocking:
                extra_cuts[verts[vi].thread].append(w.ts)
        self.seq = _split_at_calls(verts, self.chains, self.kineto, self.seq, extra_cuts)
        self.starts = {t: [verts[i].ts for i in idx] for t, idx in self.chains.items()}
        return gloo_pairs, blocking

    def item_at(self, thread: Any, t: int) -> int | None:
        """Position in `thread`'s chain of the op running at time t, or None."""
        if thread not in self.starts:
            return None
        k = _containing(self.starts[thread], t)
        if k is None or t > self.thread_end[thread]:
            return None
        return k

    def chain_walls(self) -> None:
        """Per chain interval: wall time and busy end; program order edges."""
        verts = self.verts
        for t, idx in self.chains.items():
            for k, vi in enumerate(idx):
                v = verts[vi]
                nxt = verts[idx[k + 1]].ts if k + 1 < len(idx) else self.thread_end[t]
                self.walls[vi] = max(0, nxt - v.ts)
                self.busy_end[vi] = v.ts + min(v.dur, self.walls[vi])
                if k + 1 < len(idx):
                    verts[idx[k + 1]].deps.add(vi)

    def fork_join(self) -> None:
        """Fork/join with other CPU threads: a thread idle while another one ran is blocked on it."""
        threads = list(self.chains)
        if len(threads) <= 1:
            return
        for t in threads:
            idx = self.chains[t]
            for k in range(len(idx) - 1):
                for u in threads:
                    if u != t:
                        self._join(idx, k, u)

    def _join(self, idx: list[int], k: int, u: Any) -> None:
        """Gap after op k of a chain `idx` against thread u's ops that ran inside it."""
        verts, walls, busy_end = self.verts, self.walls, self.busy_end
        vi, mi = idx[k], idx[k + 1]
        g0, g1 = busy_end[vi], verts[mi].ts
        if g1 <= g0:
            return
        su = self.starts[u]
        lo = bisect.bisect_left(su, verts[vi].ts)
        hi = bisect.bisect_left(su, g1)
        if lo >= hi:
            return
        inside = self.chains[u][lo:hi]
        # The other thread's ops cover their own gaps too (their durations run start to
        # next start), so the burst is covered up to its last op's end.
        ends = [verts[j].ts + walls[j] for j in inside[:-1]] + [busy_end[inside[-1]]]
        cover = [(max(g0, verts[j].ts), min(g1, e)) for j, e in zip(inside, ends, strict=True)]
        cover = [(s, e) for s, e in cover if e > s]
        if not cover:
            return
        self.blocked[vi].extend(cover)
        # The other thread starts where this one handed over: after this op if it began in
        # the gap, else after the op before it (it began while this op was still busy).
        first = inside[0]
        if verts[first].ts >= g0:
            verts[first].deps.add(vi)
        elif k > 0:
            verts[first].deps.add(idx[k - 1])
        last = max(inside, key=lambda j: verts[j].ts + verts[j].dur)
        if verts[last].ts + verts[last].dur <= g1:
            verts[mi].deps.add(last)

    def gpu_ops(self) -> None:
        """GPU ops: attach via correlation to the runtime call and the CPU op running it."""
        verts = self.verts
        rt_by_corr: dict[int, KEvent] = {}
        for r in self.kineto.runtime:
            c = r.args.get("correlation")
            if isinstance(c, int):
                rt_by_corr.setdefault(c, r)
        last_on_stream: dict[Any, int] = {}
        for g in sorted(self.kineto.gpu_ops, key=lambda e: (e.ts, e.index)):
            c = g.args.get("correlation")
            r = rt_by_corr.get(c) if isinstance(c, int) else None
            launcher = None
            if r is not None:
                k = self.item_at((r.pid, r.tid), r.ts)
                if k is not None:
                    launcher = self.chains[(r.pid, r.tid)][k]
            if launcher is None:
                self.dropped_gpu += 1
                continue
            stream = (g.args.get("device", g.pid), g.args.get("stream", g.tid))
            v = Vertex(
                key=(g.ts, 1, self._next_seq()),
                name=g.name,
                ts=g.ts,
                dur=g.dur,
                kind="gpu",
                stream=stream,
                host_id=verts[launcher].host_id,
                source_op=verts[launcher].name,
            )
            v.deps.add(launcher)
            if stream in last_on_stream:
                v.deps.add(last_on_stream[stream])
            vi = len(verts)
            verts.append(v)
            last_on_stream[stream] = vi
            self.gpu_by_corr.append((c, stream, vi))
            if is_nccl_kernel(g.name):
                self._nccl(v, g.name, verts[launcher].host_id)

    def _nccl(self, v: Vertex, kernel: str, host_id: int | None) -> None:
        """An NCCL kernel's collective (or P2P) from its host op, else from the kernel name."""
        info = _comm_of_host(self.host, host_id)
        coll = nccl_kernel_coll(kernel)
        if info is not None:
            kind, size, src, chid = info
            v.comm, v.comm_bytes, v.source_op = kind, size, src
            if kind.p2p is not None:
                v.peer, v.tag = _p2p_of_ancestors(self.host, chid)
        elif coll is not None:
            v.comm = CommKind(coll, None, 0)
        else:
            self.warnings.append(f"NCCL kernel {kernel[:40]!r} has no collective host op; kept as compute")
        v.kind = "comm" if v.comm is not None else "gpu"

    def sync_calls(self) -> None:
        """Synchronization calls: the CPU op after the call depends on the GPU work launched before it."""
        verts, chains = self.verts, self.chains
        self.gpu_by_corr.sort(key=lambda x: (x[0], x[2]))
        corrs = [c for c, _, _ in self.gpu_by_corr]
        for r in self.kineto.runtime:
            if r.name not in SYNC_CALLS:
                continue
            thread = (r.pid, r.tid)
            k = self.item_at(thread, r.ts)
            if k is None:
                continue
            vi = chains[thread][k]
            self.sync_wait[vi] += r.dur
            if k + 1 >= len(chains[thread]):
                continue
            mi = chains[thread][k + 1]
            c = r.args.get("correlation", 0)
            upto = bisect.bisect_left(corrs, c) if isinstance(c, int) else 0
            awaited: dict[Any, int] = {}
            for _, stream, gi in self.gpu_by_corr[:upto]:
                awaited[stream] = gi
            for gi in awaited.values():
                if verts[gi].ts < verts[mi].ts:
                    verts[mi].deps.add(gi)

    def gloo_work(self, gloo_pairs: list[tuple[int, KEvent]], blocking: set[int]) -> None:
        """gloo work: vertices, and the thread's wait for it."""
        verts, chains = self.verts, self.chains
        pos = {vi: (t, k) for t, idx in chains.items() for k, vi in enumerate(idx)}
        for vi, w in gloo_pairs:
            hv = verts[vi]
            host_op = self.host.ops[hv.host_id]
            hkind = comm_kind(hv.name)
            cv = Vertex(
                key=(w.ts, 2, self._next_seq()),
                name=w.name,
                ts=w.ts,
                dur=w.dur,
                kind="comm",
                thread=w.tid,
                host_id=hv.host_id,
                comm=hkind,
                comm_bytes=payload_bytes(hkind, host_op.inputs),
                source_op=hv.name,
            )
            if hkind.p2p is not None:
                cv.peer, cv.tag = p2p_peer_tag(hkind, host_op.inputs)
            ci = len(verts)
            verts.append(cv)
            k = bisect.bisect_left(self.starts[hv.thread], w.ts)
            idx = chains[hv.thread]
            if vi in blocking and 0 < k < len(idx) and verts[idx[k]].ts == w.ts:
                self._blocking_work(ci, w, idx, k)
            elif hkind.p2p is not None and vi in pos and pos[vi][1] > 0:
                # P2P: the data leaves when the c10d op is called (its gloo work only completes it), so the
                # transfer is issued after the op before it; import_pytorch sets its duration from the peer.
                cv.deps.add(chains[hv.thread][pos[vi][1] - 1])
                cv.issue_ts = hv.ts
                _await(verts, ci, hv.thread, chains, self.starts, self.busy_end, self.blocked)
            else:
                cv.deps.add(vi)
                _await(verts, ci, hv.thread, chains, self.starts, self.busy_end, self.blocked)

    def _blocking_work(self, ci: int, w: KEvent, idx: list[int], k: int) -> None:
        """A blocking call (barrier, ...): the work starts inside the c10d op, which was cut there; the
        part before issues it, the part after waits for it and then returns."""
        verts = self.verts
        verts[ci].deps.add(idx[k - 1])
        rem = idx[k]
        # Ordered where it could go on: after the work (and a late rank's tail), before the next op.
        end = min(w.ts + w.dur, verts[rem].ts + self.walls[rem])
        verts[rem].key = (end, 4, verts[rem].key[2])
        verts[rem].deps.add(ci)
        self.blocked[rem].append((w.ts, end))

    def final_durations(self) -> None:
        """Final CPU durations: wall time minus visible waits."""
        for vi, wall in self.walls.items():
            wait = self.sync_wait.get(vi, 0) + _union_len(self.blocked.get(vi, []))
            self.verts[vi].dur = max(0, wall - min(wall, wait))


def number(verts: list[Vertex]) -> int:
    """Ids in start-time order from FIRST_ID; drops (and counts) edges that would point backwards.

    Id 1 is reserved for the rank's start-offset node (written by to_nodes in multi-rank imports).
    Every edge then points from a lower id to a higher one, so the graph is acyclic.
    """
    order = sorted(range(len(verts)), key=lambda i: verts[i].key)
    for new_id, vi in enumerate(order, start=FIRST_ID):
        verts[vi].id = new_id
    dropped = 0
    for v in verts:
        keep = {d for d in v.deps if verts[d].id < v.id}
        dropped += len(v.deps) - len(keep)
        v.deps = keep
    return dropped


def add_comm_tails(graphs: list[RankGraph]) -> int:
    """Replay the ranks' unequal completion of each CPU (gloo) collective; returns the tails added.

    Measured replay starts a collective when its last member issues it and gives it one duration, the
    shortest member's. gloo work often completes later on some ranks (its runloop thread waits for a core),
    so each member's duration is counted from the last member's start (the Kineto duration stays in
    `kineto_dur_ns`), which makes the replayed collective end when the first rank really finished, and a
    rank that finished later gets a `xsim::comm_tail:<kind>` node of (its real end - that end) between the
    collective and what waited for it. Applies to CPU-only runs: the tail is a CPU-slot node.
    """
    if len(graphs) < 2 or any(g.gpu_run for g in graphs):
        return 0
    per_rank = [_collectives_by_kind(g) for g in graphs]
    added = 0
    for key in sorted(set().union(*per_rank), key=str):
        lists = [k.get(key, []) for k in per_rank]
        if len({len(x) for x in lists}) != 1:
            continue  # not every rank ran the same collectives: no instance matching
        for inst in zip(*lists, strict=True):
            vs = [g.vertices[vi] for g, vi in zip(graphs, inst, strict=True)]
            last_start = max(v.ts for v in vs)
            ends = [v.ts + v.dur for v in vs]
            if min(ends) < last_start:
                continue  # a rank finished before the last one began: not one collective
            # Each member's duration counts from the last arrival, so the engine's shortest duration
            # ends the collective when the first rank really finished; later ranks get a tail.
            common_end = min(ends)
            for v, end in zip(vs, ends, strict=True):
                v.measured = v.dur
                v.dur = end - last_start
            for g, vi in zip(graphs, inst, strict=True):
                added += _add_tail(g, vi, common_end)
    for g in graphs:
        number(g.vertices)
    return added


def _collectives_by_kind(g: RankGraph) -> dict[tuple[Any, Any], list[int]]:
    """A rank's CPU collectives (vertex indices in id order) by kind."""
    kinds: dict[tuple[Any, Any], list[int]] = defaultdict(list)
    for vi in sorted(range(len(g.vertices)), key=lambda i: g.vertices[i].id):
        v = g.vertices[vi]
        if v.kind == "comm" and v.comm is not None and v.comm.p2p is None:
            kinds[(v.comm.coll, v.comm.p2p)].append(vi)
    return kinds


def _add_tail(g: RankGraph, vi: int, common_end: int) -> int:
    """Collective vertex vi's tail (its real end - the collective's common end) between it and what waited
    for it; 1 when added, 0 when the rank finished at the common end."""
    v = g.vertices[vi]
    tail = v.ts + v.measured - common_end
    if tail <= 0:
        return 0
    name = f"{TAIL_PREFIX}{pb.comm_type_name(v.comm.coll).lower()}"
    t = Vertex(
        key=(common_end, 3, len(g.vertices)),
        name=name,
        ts=common_end,
        dur=tail,
        kind="tail",
        host_id=v.host_id,
        deps={vi},
    )
    ti = len(g.vertices)
    for u in g.vertices:
        if vi in u.deps:
            u.deps.discard(vi)
            u.deps.add(ti)
    g.vertices.append(t)
    return 1


def _await(
    verts: list[Vertex],
    ci: int,
    thread: Any,
    chains: dict[Any, list[int]],
    starts: dict[Any, list[int]],
    busy_end: dict[int, int],
    blocked: dict[int, list[tuple[int, int]]],
) -> None:
    """The launching thread's first op starting after collective `ci` ends depends on it."""
    if thread not in chains:
        return
    end = verts[ci].ts + verts[ci].dur
    k = bisect.bisect_left(starts[thread], end)
    if k >= len(chains[thread]):
        return
    mi = chains[thread][k]
    verts[mi].deps.add(ci)
    if k > 0:
        prev = chains[thread][k - 1]
        if end > busy_end[prev]:
            blocked[prev].append((busy_end[prev], end))


def first_start_ns(g: RankGraph) -> int:
    """Kineto start of the rank's earliest vertex."""
    return min((v.ts for v in g.vertices), default=0)


def to_nodes(
    g: RankGraph,
    host: HostTrace,
    pg_name: str,
    group_ranks: tuple[int, ...] | None = None,
    origin_ns: int | None = None,
) -> list[pb.Node]:
    """Chakra nodes of a rank graph (ids in time order); P2P peers are mapped to global ranks.

    With `origin_ns` (multi-rank imports: the earliest first op over all ranks), a START_OFFSET node of
    duration first_start - origin precedes every node without dependencies, so ranks start as skewed as
    they really were and the waits that skew caused in collectives are replayed.
    """
    nodes = []
    start = first_start_ns(g)
    if origin_ns is not None:
        off = max(0, start - origin_ns)
        nodes.append(
            A.make_node(
                START_ID,
                START_OFFSET,
                pb.COMP_NODE,
                duration_micros=round(off / 1000),
                attrs={A.IS_CPU_OP: g.gpu_run, DURATION_NS: off, PROFILER_STEP: -1, A.LAYER: 0, A.PHASE: ""},
            )
        )
    base = start if origin_ns is None else origin_ns
    for v in sorted(g.vertices, key=lambda v: v.id):
        ntype, attrs = _kind_attrs(g, v, pg_name, group_ranks)
        _add_measured_attrs(g, v, host, base, attrs)
        try:
            node = A.make_node(
                v.id,
                v.name,
                ntype,
                data_deps=sorted(g.vertices[d].id for d in v.deps)
                or ([START_ID] if origin_ns is not None else []),
                duration_micros=round(v.dur / 1000),
                attrs=attrs,
            )
        except (ValueError, TypeError):
            raise _field_error(v, attrs, host.path, g.rank) from None
        nodes.append(node)
    return nodes


def _kind_attrs(
    g: RankGraph, v: Vertex, pg_name: str, group_ranks: tuple[int, ...] | None
) -> tuple[int, dict[str, Any]]:
    """A vertex's node type and the attributes that go with it: a P2P's peers and tag, a collective's
    type, their size and group; where it runs (CPU or GPU)."""
    attrs: dict[str, Any] = {}
    if v.comm is None:
        # In a CPU-only run the host ops are the device work; in a GPU run they launch it.
        # Tails are rank-local completion of communication: on the CPU slot, never blocking compute.
        attrs[A.IS_CPU_OP] = (v.kind == "cpu" and g.gpu_run) or v.kind == "tail"
        return pb.COMP_NODE, attrs
    if v.comm.p2p is not None:
        peer = v.peer
        if peer is not None and group_ranks is not None and 0 <= peer < len(group_ranks):
            peer = group_ranks[peer]
        ntype = pb.COMM_SEND_NODE if v.comm.p2p == SEND else pb.COMM_RECV_NODE
        attrs[A.COMM_SRC] = g.rank if v.comm.p2p == SEND else (peer if peer is not None else -1)
        attrs[A.COMM_DST] = (peer if peer is not None else -1) if v.comm.p2p == SEND else g.rank
        attrs[A.COMM_TAG] = int(v.tag)
    else:
        ntype = pb.COMM_COLL_NODE
        attrs[A.COMM_TYPE] = int(v.comm.coll)
    attrs[A.COMM_SIZE] = int(v.comm_bytes)
    attrs[A.PG_NAME] = pg_name
    attrs[A.IS_CPU_OP] = False
    return ntype, attrs


def _add_measured_attrs(g: RankGraph, v: Vertex, host: HostTrace, base: int, attrs: dict[str, Any]) -> None:
    """A vertex's label (layer, phase, module), its measured times (base: the ns its start counts from),
    its step and where it ran (thread, stream, record function id)."""
    lab = g.labels.get(v.host_id) if v.host_id is not None else None
    attrs[A.LAYER] = lab.layer if lab else 0
    attrs[A.PHASE] = (
        ("sync" if v.comm is not None and lab and lab.phase in ("bwd", "") else lab.phase) if lab else ""
    )
    attrs[MODULE] = lab.module if lab else ""
    if v.source_op:
        attrs[SOURCE_OP] = v.source_op
    attrs[DURATION_NS] = int(v.dur)
    if v.measured is not None:
        attrs[KINETO_DUR_NS] = int(v.measured)
    attrs[MEASURED_START_NS] = int(v.ts - base)
    attrs[PROFILER_STEP] = _step_of(g.steps, v.ts)
    if v.kind == "cpu":
        attrs[TID] = int(v.thread[1]) if isinstance(v.thread[1], int) else 0
    if v.stream is not None and isinstance(v.stream[1], int):
        attrs[A.STREAM] = int(v.stream[1])
    if v.host_id is not None and v.kind == "cpu":
        attrs[RF_ID] = int(host.ops[v.host_id].rf_id)


def _field_error(v: Vertex, attrs: dict[str, Any], path: str, rank: int) -> PyTorchImportError:
    """The one attribute of an op whose value does not fit its Chakra field (an int32 tag of 2^40, ...)."""
    for name, value in attrs.items():
        try:
            A.make_attr(name, value)
        except (ValueError, TypeError):
            return PyTorchImportError(
                f"op {v.name[:60]!r}: {name} {short_repr(value, 40)} does not fit the trace's "
                f"{A.STANDARD_KINDS.get(name, 'integer')} field",
                path=path,
                rank=rank,
            )
    return PyTorchImportError(
        f"op {v.name[:60]!r}: id or duration does not fit the trace", path=path, rank=rank
    )


def _step_of(steps: dict[int, tuple[int, int]], ts: int) -> int:
    for n, (s, e) in steps.items():
        if s <= ts < e:
            return n
    return -1
