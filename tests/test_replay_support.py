"""Shared helpers of the replay tests: a tiny closed-form network model and small trace builders."""

from __future__ import annotations

import heapq
from pathlib import Path

from xsim.netmodels.api import CollectiveSpec, Completion
from xsim.traces import pb
from xsim.traces.attrs import make_node
from xsim.traces.traceset import discover, write_trace_set

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


class FakeNet:
    """Contract-E model with closed forms: a collective takes coll_ns(spec), a transfer p2p_ns(size)."""

    def __init__(self, num_ranks: int, coll_ns=lambda spec: 1000, p2p_ns=lambda size: 100 + size // 10):
        self.name = "fake"
        self.num_ranks = num_ranks
        self._coll = coll_ns
        self._p2p = p2p_ns
        self._pending: list[tuple[int, int, tuple[int, ...]]] = []
        self._next = 0
        self.started: list[tuple[int, object]] = []

    def start_collective(self, now_ns: int, spec: CollectiveSpec) -> int:
        self._next += 1
        self.started.append((now_ns, spec))
        f = now_ns + self._coll(spec)
        heapq.heappush(self._pending, (f, self._next, tuple(f for _ in spec.ranks)))
        return self._next

    def start_p2p(self, now_ns: int, src: int, dst: int, size_bytes: int) -> int:
        self._next += 1
        self.started.append((now_ns, (src, dst, size_bytes)))
        f = now_ns + self._p2p(size_bytes)
        heapq.heappush(self._pending, (f, self._next, (f, f)))
        return self._next

    def next_event_ns(self):
        return self._pending[0][0] if self._pending else None

    def advance(self, until_ns: int) -> list[Completion]:
        out = []
        while self._pending and self._pending[0][0] <= until_ns:
            f, h, prf = heapq.heappop(self._pending)
            out.append(Completion(h, f, prf))
        return out


def comp(nid, us, deps=(), **attrs):
    """A GPU compute node of `us` microseconds."""
    return make_node(nid, f"comp{nid}", pb.COMP_NODE, data_deps=deps, duration_micros=us, attrs=attrs or None)


def coll(nid, size, deps=(), ctype=pb.ALL_REDUCE, pg=None, **attrs):
    """A collective node."""
    a = {"comm_type": ctype, "comm_size": size, **attrs}
    if pg is not None:
        a["pg_name"] = pg
    return make_node(nid, f"coll{nid}", pb.COMM_COLL_NODE, data_deps=deps, attrs=a)


def send(nid, dst, tag, size, deps=()):
    """A send node."""
    a = {"comm_dst": dst, "comm_tag": tag, "comm_size": size}
    return make_node(nid, f"send{nid}", pb.COMM_SEND_NODE, data_deps=deps, attrs=a)


def recv(nid, src, tag, size, deps=()):
    """A recv node."""
    a = {"comm_src": src, "comm_tag": tag, "comm_size": size}
    return make_node(nid, f"recv{nid}", pb.COMM_RECV_NODE, data_deps=deps, attrs=a)


def write_set(tmp_path: Path, per_rank, name: str = "t"):
    """Write a trace set and return its TraceSet."""
    write_trace_set(tmp_path / name, per_rank)
    return discover(tmp_path / name)


def two_rank_pipeline(tmp_path: Path):
    """Rank 0 computes and sends an activation to rank 1; both then join an AllReduce (a trace set)."""
    r0 = [
        comp(1, 10, layer=1, phase="fwd"),
        send(2, dst=1, tag=1, size=4096, deps=[1]),
        coll(3, 1 << 20, deps=[2]),
    ]
    r1 = [
        recv(1, src=0, tag=1, size=4096),
        comp(2, 20, deps=[1], layer=2, phase="fwd"),
        coll(3, 1 << 20, deps=[2]),
    ]
    return write_set(tmp_path, [r0, r1])
