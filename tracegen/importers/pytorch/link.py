"""Joining host-trace ops to Kineto CPU ops: by record-function id, External id, or name/order alignment."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from xsim.tracegen.importers.pytorch.hostet import PG_INIT, HostTrace
from xsim.traces.kineto import KEvent, KinetoTrace

LOOKAHEAD = 64  # how far the order aligner searches past a mismatch (ops) before calling both unmatched
RARE = 4  # names occurring at most this often in the host trace vote for the alignment offset


@dataclass(frozen=True)
class Link:
    """host op id -> Kineto CPU event, with how it was found and the match rate."""

    matches: dict[int, KEvent]
    method: str  # "rf_id" | "external_id" | "order"
    eligible: int  # host ops that could match (every op but the roots and process-group metadata)

    @property
    def rate(self) -> float:
        """Matched share of the eligible host ops (0..1)."""
        return len(self.matches) / self.eligible if self.eligible else 0.0


def _eligible(host: HostTrace) -> list[int]:
    ops = [o for o in host.ops.values() if not o.is_root and o.name != PG_INIT]
    ops.sort(key=lambda o: (o.rf_id, o.id))
    return [o.id for o in ops]


def _by_key(host: HostTrace, ids: Sequence[int], events: Sequence[KEvent], arg: str) -> dict[int, KEvent]:
    table: dict[int, KEvent] = {}
    for e in events:
        key = e.args.get(arg)
        if isinstance(key, int):
            table.setdefault(key, e)
    out = {}
    for i in ids:
        op = host.ops[i]
        e = table.get(op.rf_id)
        if e is not None and e.name == op.name:
            out[i] = e
    return out


def _align(a: Sequence[str], b: Sequence[str], start: int) -> list[tuple[int, int]]:
    """Greedy monotone alignment of two name sequences, b read from `start` (a diff with bounded lookahead)."""
    pairs = []
    i, j = 0, max(0, start)
    na, nb = len(a), len(b)
    while i < na and j < nb:
        if a[i] == b[j]:
            pairs.append((i, j))
            i += 1
            j += 1
            continue
        jb = next((k for k in range(j + 1, min(nb, j + LOOKAHEAD)) if b[k] == a[i]), None)
        ia = next((k for k in range(i + 1, min(na, i + LOOKAHEAD)) if a[k] == b[j]), None)
        if jb is None and ia is None:
            i += 1
            j += 1
        elif ia is None or (jb is not None and jb - j <= ia - i):
            j = jb  # type: ignore[assignment]
        else:
            i = ia
    return pairs


def _align_best(a: Sequence[str], b: Sequence[str]) -> list[tuple[int, int]]:
    """Best alignment of host names `a` into Kineto names `b` over a few voted start offsets."""
    # A Kineto trace may hold many iterations and the host trace one: every rare host name votes for the
    # index offsets at which it occurs in Kineto; the best few offsets are then aligned in full.
    count = Counter(a)
    where: dict[str, list[int]] = defaultdict(list)
    for j, name in enumerate(b):
        if count.get(name, RARE + 1) <= RARE:
            where[name].append(j)
    votes: Counter[int] = Counter()
    for i, name in enumerate(a):
        if count[name] <= RARE:
            for j in where.get(name, ()):
                votes[j - i] += 1
    candidates = [0] + [off for off, _ in sorted(votes.items(), key=lambda kv: (-kv[1], kv[0]))[:4]]
    best: list[tuple[int, int]] = []
    for off in dict.fromkeys(candidates):
        pairs = _align(a, b, off)
        if len(pairs) > len(best):
            best = pairs
    return best


def _by_order(host: HostTrace, ids: Sequence[int], events: Sequence[KEvent]) -> dict[int, KEvent]:
    """Align each host thread with the Kineto thread whose op names it matches best."""
    host_threads: dict[int, list[int]] = defaultdict(list)
    for i in ids:
        host_threads[host.ops[i].tid].append(i)
    k_threads: dict[object, list[KEvent]] = defaultdict(list)
    for e in events:
        k_threads[(e.pid, e.tid)].append(e)
    for evs in k_threads.values():
        evs.sort(key=lambda e: (e.ts, -e.dur, e.index))
    scored = []
    for htid, hids in host_threads.items():
        a = [host.ops[i].name for i in hids]
        for ktid, evs in k_threads.items():
            pairs = _align_best(a, [e.name for e in evs])
            scored.append((len(pairs), str(htid), str(ktid), htid, ktid, pairs))
    scored.sort(key=lambda s: (-s[0], s[1], s[2]))
    out: dict[int, KEvent] = {}
    used_h, used_k = set(), set()
    for n, _, _, htid, ktid, pairs in scored:
        if n == 0 or htid in used_h or ktid in used_k:
            continue
        used_h.add(htid)
        used_k.add(ktid)
        hids, evs = host_threads[htid], k_threads[ktid]
        out.update({hids[i]: evs[j] for i, j in pairs})
    return out


def link(host: HostTrace, kineto: KinetoTrace) -> Link:
    """Match host ops to Kineto CPU ops, trying the exact joins first and name/order alignment last."""
    ids = _eligible(host)
    if kineto.has_record_function_id:
        m = _by_key(host, ids, kineto.cpu_ops, "Record function id")
        if len(m) >= 0.5 * len(ids):
            return Link(m, "rf_id", len(ids))
    ext = _by_key(host, ids, kineto.cpu_ops, "External id")
    if len(ext) >= 0.9 * len(ids):
        return Link(ext, "external_id", len(ids))
    order = _by_order(host, ids, kineto.cpu_ops)
    if len(order) > len(ext):
        return Link(order, "order", len(ids))
    return Link(ext, "external_id", len(ids))
