"""Congestion-aware ASTRA-sim mode releases every member of a collective at its own finish (issue 30, item 2).

ASTRA-sim ends a rank's collective node when that rank's own streams exit (DataSet::notify_stream_finished),
so a double binary tree's root goes on long before its leaves, and its next traffic shares links with the
tree's messages still in flight. The expected numbers are worked out by hand below from the rules in
docs/netmodels.md (astra_events.py's table); ASTRA-sim 518bd51's congestion-aware binary printed the same
per-rank cycles for each case (run with scripts/astra_compare.py, 2026-12-01).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from xsim.netmodels import CollectiveSpec, simulate_collective
from xsim.netmodels.astra import astra_model
from xsim.replay import simulate

from tests.test_replay_support import SHARED, coll, comp, recv, send, write_set

MIB = 1 << 20
B50 = 50 * 2**30 / 1e9  # 50 GB/s in bytes/ns, GB = 2^30 (reference section 2)
RING8 = "topology: [ Ring ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n"
# Ring_4chunks.json's values (endpoint-delay 10, local-mem-bw 1600 GB/s) with one chunk and the tree.
SYSTEM = {
    "scheduling-policy": "LIFO",
    "endpoint-delay": 10,
    "active-chunks-per-dimension": 1,
    "preferred-dataset-splits": 1,
    "all-reduce-implementation": ["doubleBinaryTree"],
    "collective-optimization": "localBWAware",
    "local-mem-bw": 1600,
}
T = math.floor(500 + MIB / B50)  # one hop, store-and-forward: floor(alpha + m/B) = 20031
HOLD = math.floor(MIB / B50)  # a link is busy floor(m/B) = 19531 per message
E = 10  # a bundle's memory-bus crossing (endpoint-delay)
R = 3 * math.floor(MIB / 1600)  # a reduction: three passes at local-mem-bw = 1965


def tree_finishes() -> dict[int, int]:
    """The DBMAX tree of 8 (root 7 -> 3 -> {1, 5} -> leaves {0, 2} and {4, 6}) on the aware Ring-8.

    Ring routes (shortest way, clockwise on a tie): leaf -> 1 or 5 one hop, 1 -> 3 and 5 -> 3 two hops,
    3 -> 7 four hops (clockwise 3,4,5,6,7), 7 -> 3 four hops (clockwise 7,0,1,2,3); no two messages of one
    phase share a directed link, so nothing queues. Up: leaves send after one crossing (E); 1 and 5 receive
    both children at E + T, reduce both (the two bundles overlap: E + R once) and send; 3 likewise two hops
    later; 7 reduces (E + R), sends down and exits. Down: 3 after 4 T + E + R, then 1 and 5 after 2 T + E + R;
    the leaves exit one crossing after the data lands (T + E).
    """
    up3 = E + T + (E + R) + 2 * T + (E + R)
    root = up3 + 4 * T + (E + R)
    mid3 = root + 4 * T + E + R
    mid15 = mid3 + 2 * T + E + R
    leaf = mid15 + T + E
    return {7: root, 3: mid3, 1: mid15, 5: mid15, 0: leaf, 2: leaf, 4: leaf, 6: leaf}


@pytest.fixture
def configs(tmp_path: Path) -> tuple[Path, Path]:
    net, sysj = tmp_path / "net.yml", tmp_path / "sys.json"
    net.write_text(RING8)
    sysj.write_text(json.dumps(SYSTEM))
    return net, sysj


def test_hand_worked_tree_matches_astra_sims_printed_cycles() -> None:
    # ASTRA-sim (aware binary, Ring_8npus.yml, this system) printed 290329 / 270288 / 228251 / 146152.
    f = tree_finishes()
    assert (f[0], f[1], f[3], f[7]) == (290_329, 270_288, 228_251, 146_152)


def test_model_per_rank_finishes(configs) -> None:
    c = simulate_collective(
        astra_model(*configs, congestion_aware=True), CollectiveSpec("all_reduce", MIB, tuple(range(8)))
    )
    f = tree_finishes()
    assert c.per_rank_finish_ns == tuple(f[r] for r in range(8))


def test_replay_releases_each_member_at_its_own_finish(tmp_path, configs) -> None:
    # AllReduce, then 5 us of compute on every rank: each rank ends 5000 ns after its own tree finish (before
    # issue 30 every rank ended at the leaves' 290329 + 5000).
    ts = write_set(tmp_path, [[coll(1, MIB), comp(2, 5, deps=[1])]] * 8)
    res = simulate(ts, network=astra_model(*configs, congestion_aware=True))
    f = tree_finishes()
    assert res.per_rank_finish_ns == [f[r] + 5000 for r in range(8)]


@pytest.mark.parametrize("dst", [3, 0])
def test_early_member_traffic_queues_behind_the_tree(tmp_path, configs, dst: int) -> None:
    # Root 7 exits at `root` having just put the 1 MiB down-message to 3 on link 7->0 (route 7,0,1,2,3); its
    # next node sends 1 MiB to `dst` on the same route, so it waits HOLD behind the tree's message on the
    # first link and, arriving at each later device exactly as that link frees, every hop after: it lands
    # HOLD + hops x T after `root`. The receiver posts its recv after its own AllReduce and ends at the later
    # of that and the arrival; the sender ends at the arrival.
    f = tree_finishes()
    hops = 4 if dst == 3 else 1
    arrival = f[7] + HOLD + hops * T
    assert arrival == (245_807 if dst == 3 else 185_714)  # ASTRA-sim printed both
    per_rank = []
    for r in range(8):
        if r == 7:
            tail = send(2, dst, 9, MIB, deps=[1])
        elif r == dst:
            tail = recv(2, 7, 9, MIB, deps=[1])
        else:
            tail = comp(2, 5, deps=[1])
        per_rank.append([coll(1, MIB), tail])
    res = simulate(write_set(tmp_path, per_rank), network=astra_model(*configs, congestion_aware=True))
    want = [f[r] + 5000 for r in range(8)]
    want[7], want[dst] = arrival, max(arrival, f[dst])
    assert res.per_rank_finish_ns == want


MICRO = SHARED / "peer_traces" / "chakra_et" / "astra-sim_microbenchmarks" / "all_reduce" / "8npus_1MB"


@pytest.mark.skipif(not MICRO.is_dir(), reason="../shared peer traces absent")
def test_four_chunk_tree_on_every_rank_as_astra_sim(tmp_path) -> None:
    # ASTRA-sim's microbenchmark (1 MiB AllReduce, Ring-8) with Ring_4chunks.json and doubleBinaryTree: the
    # aware binary printed these per NPU (streams alternate trees, so the ranks differ by position in both).
    sysj = tmp_path / "sys.json"
    sysj.write_text(json.dumps({**SYSTEM, "preferred-dataset-splits": 4}))
    net = tmp_path / "net.yml"
    net.write_text(RING8)
    res = simulate(MICRO / "all_reduce", network=astra_model(net, sysj, congestion_aware=True))
    assert res.per_rank_finish_ns == [271210, 309892, 304500, 309892, 293237, 309892, 304500, 309892]


def test_members_start_as_they_issue_on_the_aware_switch(tmp_path) -> None:
    # Switch-8, 1 MiB, one chunk, endpoint-delay 1, reductions free (local-mem-bw 1e9 GB/s): every message
    # crosses an uplink and a downlink, each floor(500 + m/B) = T, holding the link HOLD. Rank 3 computes 50 us
    # and then issues; the others issue at 0 and go ahead without it (no barrier in ASTRA-sim):
    # leaves send at 1; 0's and 2's messages meet on the switch's link to 1 (0's first): 1 + 2T and
    # 1 + HOLD + 2T, likewise 4 and 6 at 5. 1 and 5 send up one crossing after the second; their messages meet
    # on the link to 3 (1's first): 3 has both at up = 1 + HOLD + 2T + 1 + HOLD + 2T, long after its issue at
    # 50000; it sends one crossing later, 7 answers one crossing after arrival (root done), 3 sends to 1 then
    # 5 over its one uplink (5's message waits HOLD), each of 1 and 5 to its two leaves likewise, and a leaf
    # ends one crossing after its data lands. (Started all at rank 3's issue, every time would move by ~50 us.)
    net, sysj = tmp_path / "net.yml", tmp_path / "sys.json"
    net.write_text(RING8.replace("Ring", "Switch"))
    sysj.write_text(json.dumps({**SYSTEM, "endpoint-delay": 1, "local-mem-bw": 1e9}))
    per_rank = [[coll(2, MIB)]] * 3 + [[comp(1, 50), coll(2, MIB, deps=[1])]] + [[coll(2, MIB)]] * 4
    res = simulate(write_set(tmp_path, per_rank), network=astra_model(net, sysj, congestion_aware=True))
    up3 = 1 + HOLD + 2 * T + 1 + HOLD + 2 * T
    root = up3 + 1 + 2 * T + 1
    mid3 = root + 2 * T + 1
    mid1, mid5 = mid3 + 2 * T + 1, mid3 + HOLD + 2 * T + 1
    want = {7: root, 3: mid3, 1: mid1, 5: mid5}
    want.update(
        {0: mid1 + 2 * T + 1, 2: mid1 + HOLD + 2 * T + 1, 4: mid5 + 2 * T + 1, 6: mid5 + HOLD + 2 * T + 1}
    )
    # ASTRA-sim's aware binary printed these cycles for this trace set and configs.
    assert [want[r] for r in range(8)] == [279441, 239378, 298972, 199315, 298972, 258909, 318503, 159252]
    assert res.per_rank_finish_ns == [want[r] for r in range(8)]


def test_open_and_issue_refuse_misuse(configs) -> None:
    from xsim.netmodels.errors import NetworkModelError

    spec = CollectiveSpec("all_reduce", MIB, tuple(range(8)))
    with pytest.raises(NetworkModelError, match="congestion-aware"):
        astra_model(*configs).open_collective(0, spec)
    model = astra_model(*configs, congestion_aware=True)
    h = model.open_collective(0, spec)
    model.issue_member(0, h, 3)
    with pytest.raises(NetworkModelError, match="member 3 is not waiting"):
        model.issue_member(5, h, 3)
    for pos in (0, 1, 2, 4, 5, 6, 7):
        model.issue_member(5, h, pos)
    with pytest.raises(NetworkModelError, match="member 0 is not waiting"):
        model.issue_member(5, h, 0)


def test_closed_form_members_are_reported_at_their_own_times(configs) -> None:
    # A closed form known at start (aware mode: a collective alone on an idle network) with unequal member
    # finishes: the earlier members come out of member_finishes at their times, the completion at the last.
    model = astra_model(*configs, congestion_aware=True)
    h = model._register((30, 10, 30))
    assert model.next_event_ns() == 10
    assert model.advance(10) == [] and model.member_finishes() == [(h, 1, 10)]
    (c,) = model.advance(30)
    assert c.handle == h and c.per_rank_finish_ns == (30, 10, 30) and model.member_finishes() == []
