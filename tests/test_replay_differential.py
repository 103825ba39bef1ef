"""Differential tests of the replay engine against tests/replay_reference.py, a naive simulator of ASTRA-sim's
scheduling rules (chakra-et.md 3.2, astrasim-analytical.md 3.4), on random and hand-computed trace sets.

Random sets are deadlock-free by construction: a global sequence of steps (a compute, CPU or METADATA node
on one rank, a collective on a process group, a send/recv pair) is cut into per-rank programs whose
dependencies only point to earlier steps, and on every rank

- each collective depends (directly or transitively) on every earlier collective and send of its rank, so
  collectives issue in step order on every member (consistent per-group issue order) and a collective can
  only hold the comm slot once the sends of earlier steps are done (a send never waits for a peer);
- each send / recv depends on the previous send / recv with the same (src, dst, tag), so FIFO matching
  pairs them in step order.

By induction on the step every node then runs. Node ids are random (so dependencies point forward as often
as backward), nodes are written in random order, and each dependency is a data dep, a ctrl dep or both.
"""

from __future__ import annotations

import signal
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from xsim.replay import ReplayConfig, simulate
from xsim.replay.errors import ReplayDeadlock
from xsim.traces import pb
from xsim.traces.attrs import make_node
from xsim.traces.errors import XsimError
from xsim.traces.traceset import discover, write_trace_set

from tests.replay_reference import KIND_NAME, RefDeadlock, collective_ns, p2p_ns, reference_replay
from tests.test_replay_support import FakeNet

COMM_TYPES = sorted(KIND_NAME)
SIZES = (0, 4000, 8000, 16000, 40000)  # multiples of 8000 / 4 ns or 8 ns: comm times collide with compute


def closed_form_net(num_ranks: int) -> FakeNet:
    """The engine's network: contract-E model with the reference's closed forms."""
    return FakeNet(
        num_ranks,
        coll_ns=lambda spec: collective_ns(spec.kind, spec.size_bytes, len(spec.ranks)),
        p2p_ns=p2p_ns,
    )


@dataclass(frozen=True)
class NodeSpec:
    """One node of a generated rank program; deps are local indices into the rank's list."""

    node_type: int
    name: str
    duration_micros: int
    attrs: tuple[tuple[str, object], ...]
    data: tuple[int, ...]
    ctrl: tuple[int, ...]


@dataclass(frozen=True)
class Case:
    """A generated trace set before node ids are attached."""

    groups: dict[str, tuple[int, ...]]
    programs: tuple[tuple[NodeSpec, ...], ...]
    ids: tuple[tuple[int, ...], ...]  # per rank: local index -> node id
    file_order: tuple[tuple[int, ...], ...]  # per rank: local indices in the order they are written
    sends: tuple[tuple[int, int], ...]  # (rank, local index) of sends that are last on their (src, dst, tag)


def materialize(case: Case, drop: tuple[int, int] | None = None) -> list[list[pb.Node]]:
    """The per-rank pb.Node lists, optionally without one node, whose dependents inherit its deps (so every
    other ordering the construction relies on, e.g. collective -> send -> collective, survives)."""

    def bypass(r: int, deps: tuple[int, ...]) -> list[int]:
        if drop is None or drop[0] != r or drop[1] not in deps:
            return list(deps)
        gone = case.programs[r][drop[1]]
        return sorted({d for d in deps if d != drop[1]} | set(gone.data) | set(gone.ctrl))

    out = []
    for r, prog in enumerate(case.programs):
        ids = case.ids[r]
        nodes = []
        for i in case.file_order[r]:
            if drop == (r, i):
                continue
            s = prog[i]
            keep = bypass(r, s.data)
            keep_c = bypass(r, s.ctrl)
            nodes.append(
                make_node(
                    ids[i],
                    s.name,
                    s.node_type,
                    data_deps=[ids[d] for d in keep],
                    ctrl_deps=[ids[d] for d in keep_c],
                    duration_micros=s.duration_micros,
                    attrs=dict(s.attrs) or None,
                )
            )
        out.append(nodes)
    return out


@st.composite
def cases(draw, max_ranks: int = 6, max_steps: int = 40, with_p2p: bool = False) -> Case:
    """A random deadlock-free trace set (see the module docstring); with_p2p: at least 2 ranks and one send."""
    n = draw(st.integers(2 if with_p2p else 1, max_ranks))
    groups: dict[str, tuple[int, ...]] = {}
    if n >= 2:
        for gi in range(draw(st.integers(1, 3))):
            members = draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=n, unique=True))
            groups[str(gi + 1)] = tuple(sorted(members))
    pg_choices = [*groups, "", "0"] if n >= 2 else []
    progs: list[list[NodeSpec]] = [[] for _ in range(n)]
    anc: list[list[set[int]]] = [[] for _ in range(n)]  # per rank, local index -> ancestors
    comm_slot: list[list[int]] = [[] for _ in range(n)]  # collectives and sends so far, per rank
    last_p2p: dict[tuple[str, int, int, int], int] = {}  # ("send"|"recv", src, dst, tag) -> local index
    last_send_of_key: dict[tuple[int, int, int], tuple[int, int]] = {}

    def add(rank, node_type, name, us=0, attrs=(), must=()) -> int:
        prev = len(progs[rank])
        picked = draw(st.lists(st.integers(0, prev - 1), max_size=3, unique=True)) if prev else []
        data, ctrl = [], []
        ancestors: set[int] = set()
        for d in picked:
            ancestors |= anc[rank][d] | {d}
        for d in must:
            if d not in ancestors and d not in picked:
                picked.append(d)
                ancestors |= anc[rank][d] | {d}
        for d in picked:
            how = draw(st.sampled_from(("data", "data", "ctrl", "both", "twice")))
            if how != "ctrl":
                data.append(d)
            if how == "twice":  # a dependency listed twice counts once
                data.append(d)
            if how in ("ctrl", "both"):
                ctrl.append(d)
        progs[rank].append(NodeSpec(node_type, f"{name}{prev}", us, tuple(attrs), tuple(data), tuple(ctrl)))
        anc[rank].append(ancestors)
        return prev

    kinds = ["comp", "comp", "comp", "cpu", "meta"] + (["coll", "coll", "p2p", "p2p"] if n >= 2 else [])
    for step in range(draw(st.integers(1, max_steps))):
        k = "p2p" if with_p2p and step == 0 else draw(st.sampled_from(kinds))
        if k in ("comp", "cpu"):
            r = draw(st.integers(0, n - 1))
            attrs = (("is_cpu_op", True),) if k == "cpu" else ()
            add(r, pb.COMP_NODE, k, us=draw(st.integers(0, 4)), attrs=attrs)
        elif k == "meta":
            add(draw(st.integers(0, n - 1)), pb.METADATA_NODE, "meta")
        elif k == "coll":
            pg = draw(st.sampled_from(pg_choices))
            members = groups[pg] if pg in groups else tuple(range(n))
            ct = draw(st.sampled_from(COMM_TYPES))
            size = draw(st.sampled_from(SIZES))
            attrs = (("comm_type", ct), ("comm_size", size), ("pg_name", pg))
            for r in members:
                i = add(r, pb.COMM_COLL_NODE, "coll", attrs=attrs, must=comm_slot[r])
                comm_slot[r].append(i)
        else:
            src, dst = draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True))
            tag = draw(st.integers(0, 2))
            size = draw(st.sampled_from(SIZES))
            ks, kr = ("send", src, dst, tag), ("recv", src, dst, tag)
            i = add(
                src,
                pb.COMM_SEND_NODE,
                "send",
                attrs=(("comm_dst", dst), ("comm_tag", tag), ("comm_size", size)),
                must=[last_p2p[ks]] if ks in last_p2p else [],
            )
            last_p2p[ks] = i
            comm_slot[src].append(i)
            last_send_of_key[(src, dst, tag)] = (src, i)
            last_p2p[kr] = add(
                dst,
                pb.COMM_RECV_NODE,
                "recv",
                attrs=(("comm_src", src), ("comm_tag", tag), ("comm_size", size)),
                must=[last_p2p[kr]] if kr in last_p2p else [],
            )
    ids, order = [], []
    for r in range(n):
        m = len(progs[r])
        ids.append(tuple(draw(st.lists(st.integers(0, 3 * m + 5), min_size=m, max_size=m, unique=True))))
        order.append(tuple(draw(st.permutations(range(m)))))
    return Case(
        groups=groups,
        programs=tuple(tuple(p) for p in progs),
        ids=tuple(ids),
        file_order=tuple(order),
        sends=tuple(sorted(last_send_of_key.values())),
    )


@contextmanager
def no_hang(seconds: int = 20):
    """Fail instead of hanging when the engine does not return."""

    def boom(signum, frame):
        raise AssertionError(f"replay did not return within {seconds} s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run_engine(per_rank: list[list[pb.Node]], groups: dict[str, tuple[int, ...]], streams: bool = False):
    """replay.simulate on the set written to a temporary folder, with the closed-form network."""
    config = ReplayConfig(comm_streams="group" if streams else "shared")
    with tempfile.TemporaryDirectory() as d:
        write_trace_set(Path(d) / "t", per_rank)
        with no_hang():
            return simulate(
                discover(Path(d) / "t"), network=closed_form_net(len(per_rank)), groups=groups, config=config
            )


def assert_same(per_rank: list[list[pb.Node]], groups: dict[str, tuple[int, ...]], streams: bool = False):
    """Engine and reference give identical ready/start/end/wait per node and finish per rank."""
    ref = reference_replay(per_rank, groups, streams)
    res = run_engine(per_rank, groups, streams)
    got = {
        (row["rank"], row["node_id"]): (row["ready_ns"], row["start_ns"], row["end_ns"], row["wait_ns"])
        for row in res.ops.iter_rows(named=True)
    }
    want = {k: (n.ready, n.start, n.end, n.wait) for k, n in ref.nodes.items()}
    assert got.keys() == want.keys()
    diff = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    assert not diff, f"(ready, start, end, wait) engine vs reference: {diff}"
    assert res.ranks["finish_ns"].to_list() == ref.finish
    assert res.per_rank_finish_ns == ref.finish
    # P2P pairing: the send and the recv of a pair carry the same `p2p` id.
    pair_nodes: dict[int, list[tuple[int, int]]] = {}
    for row in res.ops.filter(res.ops["p2p"].is_not_null()).iter_rows(named=True):
        pair_nodes.setdefault(row["p2p"], []).append((row["rank"], row["node_id"]))
    got_pairs = sorted(tuple(sorted(v)) for v in pair_nodes.values())
    want_pairs = sorted(tuple(sorted([k, n.peer_node])) for k, n in ref.nodes.items() if n.op == "send")
    assert got_pairs == want_pairs
    # Collective instances: group, type, bytes, members, first / last arrival, start and end.
    got_c = sorted(
        (
            r["pg_name"],
            r["comm_type"],
            r["bytes"],
            r["ranks"],
            r["first_arrival_ns"],
            r["last_arrival_ns"],
            r["end_ns"],
        )
        for r in res.collectives.iter_rows(named=True)
    )
    want_c = sorted(
        (c.group, c.kind.upper(), c.size, len(c.members), c.first_arrival, c.last_arrival, c.end)
        for c in ref.collectives
    )
    assert got_c == want_c
    assert (res.collectives["start_ns"] == res.collectives["last_arrival_ns"]).all()
    return res, ref


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_random_trace_sets_match_reference(case: Case):
    """Per-node times and per-rank finish agree with the reference on random deadlock-free sets."""
    assert_same(materialize(case), case.groups)


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(cases(with_p2p=True))
def test_random_trace_sets_match_reference_with_streams(case: Case):
    """The same with communication streams (one per process group and one for sends, per rank)."""
    assert_same(materialize(case), case.groups, streams=True)


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(cases(with_p2p=True), st.data())
def test_dropped_send_deadlocks_with_named_ranks(case: Case, data):
    """Dropping the last send of a (src, dst, tag) leaves its recv unmatched: an XsimError naming every
    rank the reference finds stuck, each with one of its unfinished nodes, raised (not a hang)."""
    drop = data.draw(st.sampled_from(case.sends))
    per_rank = materialize(case, drop)
    with pytest.raises(RefDeadlock) as ref_exc:
        reference_replay(per_rank, case.groups)
    with pytest.raises(XsimError) as exc:
        run_engine(per_rank, case.groups)
    err = exc.value
    assert isinstance(err, ReplayDeadlock)
    ref = ref_exc.value
    assert err.time_ns == ref.time_ns
    assert err.remaining == sum(len(v) for v in ref.stuck.values())
    assert [s.rank for s in err.stuck] == sorted(ref.stuck)
    msg = str(err)
    assert msg.startswith(f"deadlock at t={ref.time_ns} ns:")
    for s in err.stuck:
        assert s.node_id in ref.stuck[s.rank]
        assert f"rank {s.rank}: node {s.node_id} " in msg
    assert "\n" not in msg  # one line: the CLI prints one `xsim: error:` line


# Hand-computed cases where an engine and a naive reading of the rules could plausibly disagree. Each
# expected table is worked out by hand from the rules (chakra-et.md 3.2, astrasim-analytical.md 3.4) and
# the closed forms of tests/replay_reference.py; both the engine and the reference must give it.


def _n(nid, kind, us=0, data=(), ctrl=(), **attrs):
    types = {"comp": pb.COMP_NODE, "meta": pb.METADATA_NODE, "coll": pb.COMM_COLL_NODE}
    types |= {"send": pb.COMM_SEND_NODE, "recv": pb.COMM_RECV_NODE}
    return make_node(
        nid,
        f"{kind}{nid}",
        types[kind],
        data_deps=data,
        ctrl_deps=ctrl,
        duration_micros=us,
        attrs=attrs or None,
    )


def check(per_rank, expected, finish, groups=None):
    """Engine and reference both give the hand-computed {(rank, id): (ready, start, end, wait)} and finish."""
    groups = groups or {}
    res, ref = assert_same(per_rank, groups)
    got = {k: (n.ready, n.start, n.end, n.wait) for k, n in ref.nodes.items()}
    assert got == expected
    assert ref.finish == finish


def test_smaller_id_first_when_ready_later_in_the_same_ns():
    # Compute id 0 (0..1000) and CPU id 9 (0..1000) finish at 1000; finishes are applied in (rank, id)
    # order, so id 5 (child of 0) becomes ready before id 3 (child of 9, through METADATA id 7, which
    # completes in 0 ns at 1000). Both are ready at 1000: the smaller id, 3, runs first (1000..3000),
    # then 5 (3000..4000).
    nodes = [
        _n(0, "comp", 1),
        _n(9, "comp", 1, is_cpu_op=True),
        _n(5, "comp", 1, data=[0]),
        _n(7, "meta", data=[9]),
        _n(3, "comp", 2, data=[7]),
    ]
    expected = {
        (0, 0): (0, 0, 1000, 0),
        (0, 9): (0, 0, 1000, 0),
        (0, 7): (1000, 1000, 1000, 0),
        (0, 3): (1000, 1000, 3000, 0),
        (0, 5): (1000, 3000, 4000, 0),
    }
    check([nodes], expected, [4000])


def test_metadata_at_time_zero_releases_its_child_before_issue():
    # METADATA id 1 completes at t=0, so compute 2 (its child) and compute 3 are both ready at 0:
    # 2 runs 0..1000, 3 runs 1000..2000. (The engine used to issue 3 first; fixed in replay/engine.py.)
    nodes = [_n(1, "meta"), _n(2, "comp", 1, data=[1]), _n(3, "comp", 1)]
    expected = {(0, 1): (0, 0, 0, 0), (0, 2): (0, 0, 1000, 0), (0, 3): (0, 1000, 2000, 0)}
    check([nodes], expected, [2000])


def _slot_case(coll_id: int, send_id: int):
    # Rank 0: an AllReduce over both ranks and a send to rank 1 (tag 7, 800 B), both ready at 0, and a
    # recv from rank 1 (tag 8). Rank 1: 5 us compute, then its AllReduce; a recv (tag 7) ready at 0; a send
    # to rank 0 (tag 8, 0 B) ready at 0.
    # Closed forms: AllReduce of 4000 B on 2 ranks = 2000 + 2 x 250 + 4000 // 4 = 3500 ns; transfer of
    # 800 B = 500 + 800 // 8 = 600 ns, of 0 B = 500 ns.
    ar = {"comm_type": pb.ALL_REDUCE, "comm_size": 4000, "pg_name": ""}
    r0 = [
        _n(coll_id, "coll", **ar),
        _n(send_id, "send", comm_dst=1, comm_tag=7, comm_size=800),
        _n(3, "recv", comm_src=1, comm_tag=8, comm_size=0),
    ]
    r1 = [
        _n(1, "comp", 5),
        _n(2, "coll", data=[1], **ar),
        _n(3, "recv", comm_src=0, comm_tag=7, comm_size=800),
        _n(4, "send", comm_dst=0, comm_tag=8, comm_size=0),
    ]
    return [r0, r1]


def test_collective_holds_the_comm_slot_while_a_send_waits():
    # Rank 0 issues the AllReduce (id 1 < 2) at 0; it holds the comm slot until rank 1 arrives at 5000 and
    # ends at 5000 + 3500 = 8500 (waited 5000). The send (ready at 0) issues at 8500 and arrives at 9100.
    # Rank 1's recv (tag 7) was posted at 0 and takes no slot: it waited 8500 for the send's issue, ends
    # 9100. Rank 1's send (id 4) is not blocked by that recv: it issues at 0 and arrives at 500, where
    # rank 0's recv (posted at 0, waited 0) ends.
    expected = {
        (0, 1): (0, 0, 8500, 5000),
        (0, 2): (0, 8500, 9100, 0),
        (0, 3): (0, 0, 500, 0),
        (1, 1): (0, 0, 5000, 0),
        (1, 2): (5000, 5000, 8500, 0),
        (1, 3): (0, 0, 9100, 8500),
        (1, 4): (0, 0, 500, 0),
    }
    check(_slot_case(coll_id=1, send_id=2), expected, [9100, 9100])


def test_send_with_smaller_id_goes_before_the_collective():
    # Same set with the ids of rank 0's AllReduce and send swapped: the send (id 1) issues at 0 and ends
    # at 600; the AllReduce (id 2) issues at 600, waits for rank 1 until 5000 (4400) and ends at 8500.
    expected = {
        (0, 2): (0, 600, 8500, 4400),
        (0, 1): (0, 0, 600, 0),
        (0, 3): (0, 0, 500, 0),
        (1, 1): (0, 0, 5000, 0),
        (1, 2): (5000, 5000, 8500, 0),
        (1, 3): (0, 0, 600, 0),
        (1, 4): (0, 0, 500, 0),
    }
    check(_slot_case(coll_id=2, send_id=1), expected, [8500, 8500])


def test_ctrl_deps_only():
    # Node 2 depends on 1 through ctrl_deps only, node 3 (a CPU op, which could otherwise run at 0 on its
    # own slot) on 2: 1 runs 0..2000, 2 runs 2000..3000, 3 runs 3000..4000.
    nodes = [_n(1, "comp", 2), _n(2, "comp", 1, ctrl=[1]), _n(3, "comp", 1, ctrl=[2], is_cpu_op=True)]
    expected = {(0, 1): (0, 0, 2000, 0), (0, 2): (2000, 2000, 3000, 0), (0, 3): (3000, 3000, 4000, 0)}
    check([nodes], expected, [4000])


def test_out_of_order_file_forward_deps_and_zero_duration():
    # Written in the order 5, 1, 4, 3; node 1 depends on the later id 5. Ready at 0: 3, 4, 5, issued by
    # id: 3 (2 us) 0..2000, 4 (0 us -> 1 ns) 2000..2001, 5 (3 us) 2001..5001; then 1 (1 us) 5001..6001.
    nodes = [_n(5, "comp", 3), _n(1, "comp", 1, data=[5]), _n(4, "comp", 0), _n(3, "comp", 2)]
    expected = {
        (0, 3): (0, 0, 2000, 0),
        (0, 4): (0, 2000, 2001, 0),
        (0, 5): (0, 2001, 5001, 0),
        (0, 1): (5001, 5001, 6001, 0),
    }
    check([nodes], expected, [6001])


def test_collectives_match_by_issue_order_per_group():
    # Ranks 0 and 1 share groups "1" and "2" (the same members). Each rank issues on group "1" first an
    # AllReduce of 0 B then one of 4000 B; rank 1 starts both 1 us later (compute id 1). Instance #0 of
    # group "1" starts at 1000 and lasts 2000 + 500 = 2500 -> 3500; instance #1 (4000 B) then starts at
    # 3500 (both issue it at once) and lasts 3500 -> 7000. The group-"2" AllGather (id 9 on rank 0, no
    # deps, but a larger id than the group-"1" collectives) waits for the comm slot: rank 0 issues it at
    # 7000; rank 1's depends on its id 3, so it is ready at 7000 too: 1500 + 500 = 2000 -> 9000.
    g = {"1": (0, 1), "2": (0, 1)}
    a0 = {"comm_type": pb.ALL_REDUCE, "comm_size": 0, "pg_name": "1"}
    a1 = {"comm_type": pb.ALL_REDUCE, "comm_size": 4000, "pg_name": "1"}
    ag = {"comm_type": pb.ALL_GATHER, "comm_size": 0, "pg_name": "2"}
    r0 = [_n(2, "coll", **a0), _n(3, "coll", data=[2], **a1), _n(9, "coll", **ag)]
    r1 = [
        _n(1, "comp", 1),
        _n(2, "coll", data=[1], **a0),
        _n(3, "coll", data=[2], **a1),
        _n(9, "coll", data=[3], **ag),
    ]
    expected = {
        (0, 2): (0, 0, 3500, 1000),
        (0, 3): (3500, 3500, 7000, 0),
        (0, 9): (0, 7000, 9000, 0),
        (1, 1): (0, 0, 1000, 0),
        (1, 2): (1000, 1000, 3500, 0),
        (1, 3): (3500, 3500, 7000, 0),
        (1, 9): (7000, 7000, 9000, 0),
    }
    check([r0, r1], expected, [9000, 9000], groups=g)


def test_collectives_of_two_groups_grabbing_the_comm_slots_deadlock():
    # As above but rank 1's AllGather has no dependency: at t=0 rank 0 issues its group-"1" AllReduce
    # (id 2) and rank 1, whose id 2 waits for its compute, issues the group-"2" AllGather (id 9). Each holds
    # its only comm slot waiting for the other rank (one comm op in flight, astrasim-analytical.md 3.4):
    # a deadlock, reported after the last event (compute 1 ends at 1000) with both ranks named.
    g = {"1": (0, 1), "2": (0, 1)}
    a0 = {"comm_type": pb.ALL_REDUCE, "comm_size": 0, "pg_name": "1"}
    ag = {"comm_type": pb.ALL_GATHER, "comm_size": 0, "pg_name": "2"}
    per_rank = [
        [_n(2, "coll", **a0), _n(9, "coll", **ag)],
        [_n(1, "comp", 1), _n(2, "coll", data=[1], **a0), _n(9, "coll", **ag)],
    ]
    with pytest.raises(RefDeadlock) as ref:
        reference_replay(per_rank, g)
    assert ref.value.time_ns == 1000 and ref.value.stuck == {0: [2, 9], 1: [2, 9]}
    with pytest.raises(ReplayDeadlock) as exc:
        run_engine(per_rank, g)
    assert str(exc.value) == (
        "deadlock at t=1000 ns: 4 node(s) on 2 rank(s) can never run: "
        "rank 0: node 2 'coll2' waits for collective #0 of group '1' (ALL_REDUCE, 0 B): rank(s) [1] never "
        "issued it; "
        "rank 1: node 9 'coll9' waits for collective #0 of group '2' (ALL_GATHER, 0 B): rank(s) [0] never "
        "issued it"
    )
