"""Communication streams (docs/replay.md, "Communication streams"): hand-computed small cases.

Default: per rank, one in-order stream per process group (its collectives) and one for pipeline sends, so
collectives of different groups and sends overlap each other; on one stream they run one after another.
ASTRA-sim's network models keep its one-slot rule (every communication op of a rank on one slot).
"""

from __future__ import annotations

import json

import pytest
from xsim.netmodels.astra import astra_model
from xsim.replay import ReplayConfig, ReplayError, simulate
from xsim.traces import pb

from tests.test_replay_support import FakeNet, coll, comp, recv, send, write_set

GROUPS = {"1": (0, 1), "2": (0, 1)}  # two communicators over the same two ranks


def _ends(res) -> dict[tuple[int, int], int]:
    return {(r["rank"], r["node_id"]): r["end_ns"] for r in res.ops.iter_rows(named=True)}


def _fake(spec_ns: dict[int, int]) -> FakeNet:
    """Collectives last spec_ns[size] ns; sends 100 + size // 10 ns."""
    return FakeNet(2, coll_ns=lambda spec: spec_ns[spec.size_bytes])


def test_two_groups_overlap(tmp_path) -> None:
    # Both collectives are ready at t = 0 on both ranks. Streams: group 1's (5 us) and group 2's (3 us) run
    # at once: they end at 5000 and 3000 ns. Shared slot: group 2's waits for group 1's: 5000 + 3000.
    per = [[coll(1, 100, pg="1"), coll(2, 200, pg="2")] for _ in range(2)]
    ts = write_set(tmp_path, per)
    net = {100: 5000, 200: 3000}
    ends = _ends(simulate(ts, network=_fake(net), groups=GROUPS))
    assert [ends[(r, 1)] for r in (0, 1)] == [5000, 5000]
    assert [ends[(r, 2)] for r in (0, 1)] == [3000, 3000]
    shared = ReplayConfig(comm_streams="shared")
    ends = _ends(simulate(ts, network=_fake(net), groups=GROUPS, config=shared))
    assert [ends[(r, 2)] for r in (0, 1)] == [8000, 8000]


def test_same_group_serialized(tmp_path) -> None:
    # Two collectives of one group share its stream: 0-5000, then 5000-8000, in either mode.
    per = [[coll(1, 100, pg="1"), coll(2, 200, pg="1")] for _ in range(2)]
    ts = write_set(tmp_path, per)
    for cfg in (ReplayConfig(), ReplayConfig(comm_streams="shared")):
        ends = _ends(simulate(ts, network=_fake({100: 5000, 200: 3000}), groups=GROUPS, config=cfg))
        assert ends[(0, 1)] == 5000 and ends[(0, 2)] == 8000


def test_send_beside_collective_and_sends_serialized(tmp_path) -> None:
    # Rank 0: a 4 us collective of group 1, then two sends to rank 1 (1000 B: 100 + 100 = 200 ns each).
    # Streams: the sends run beside the collective on the pipeline stream, one after the other: 0-200,
    # 200-400; rank 1's recvs finish with them. Shared slot: after the collective, 4000-4200 and 4200-4400.
    per = [
        [coll(1, 100, pg="1"), send(2, dst=1, tag=7, size=1000), send(3, dst=1, tag=8, size=1000)],
        [coll(1, 100, pg="1"), recv(2, src=0, tag=7, size=1000), recv(3, src=0, tag=8, size=1000)],
    ]
    ts = write_set(tmp_path, per)
    ends = _ends(simulate(ts, network=_fake({100: 4000}), groups=GROUPS))
    assert (ends[(0, 2)], ends[(0, 3)], ends[(1, 2)], ends[(1, 3)]) == (200, 400, 200, 400)
    assert ends[(0, 1)] == 4000
    cfg = ReplayConfig(comm_streams="shared")
    ends = _ends(simulate(ts, network=_fake({100: 4000}), groups=GROUPS, config=cfg))
    assert (ends[(0, 2)], ends[(0, 3)], ends[(1, 3)]) == (4200, 4400, 4400)


def test_streams_overlap_compute_as_graph_allows(tmp_path) -> None:
    # comp (2 us) -> coll group 1 (3 us) and, independent of it, coll group 2 (3 us) after comp too:
    # streams: both at 2000, end 5000; shared: 2000-5000 then 5000-8000.
    per = [[comp(1, 2), coll(2, 100, deps=[1], pg="1"), coll(3, 100, deps=[1], pg="2")] for _ in range(2)]
    ts = write_set(tmp_path, per)
    res = simulate(ts, network=_fake({100: 3000}), groups=GROUPS)
    assert res.iteration_time_ns == 5000
    res = simulate(ts, network=_fake({100: 3000}), groups=GROUPS, config=ReplayConfig(comm_streams="shared"))
    assert res.iteration_time_ns == 8000


def test_astra_network_keeps_one_slot(tmp_path) -> None:
    # ASTRA-sim's congestion-unaware model (compatible mode): "auto" resolves to the shared slot, so two
    # groups' collectives run one after the other, each taking the ring closed form T; 2 T in all.
    net_yml = tmp_path / "net.yml"
    net_yml.write_text("topology: [ Ring ]\nnpus_count: [ 2 ]\nbandwidth: [ 50 ]\nlatency: [ 500 ]\n")
    sys_json = tmp_path / "sys.json"
    sys_json.write_text(
        json.dumps(
            {
                "scheduling-policy": "LIFO",
                "endpoint-delay": 10,
                "active-chunks-per-dimension": 1,
                "preferred-dataset-splits": 1,
                "all-reduce-implementation": ["ring"],
                "all-gather-implementation": ["ring"],
                "reduce-scatter-implementation": ["ring"],
                "all-to-all-implementation": ["ring"],
                "collective-optimization": "localBWAware",
                "local-mem-bw": 1600,
                "boost-mode": 0,
            }
        )
    )
    one = [[coll(1, 1 << 20, pg="1")] for _ in range(2)]
    t1 = simulate(write_set(tmp_path / "a", one), network=astra_model(net_yml, sys_json), groups=GROUPS)
    two = [[coll(1, 1 << 20, pg="1"), coll(2, 1 << 20, pg="2")] for _ in range(2)]
    t2 = simulate(write_set(tmp_path / "b", two), network=astra_model(net_yml, sys_json), groups=GROUPS)
    assert t2.iteration_time_ns == 2 * t1.iteration_time_ns
    streams = ReplayConfig(comm_streams="group")
    t3 = simulate(
        write_set(tmp_path / "b", two), network=astra_model(net_yml, sys_json), groups=GROUPS, config=streams
    )
    assert t3.iteration_time_ns == t1.iteration_time_ns  # contention-free model: full overlap


def test_bad_comm_streams_value() -> None:
    with pytest.raises(ReplayError, match="comm_streams must be one of auto, group, shared"):
        ReplayConfig(comm_streams="nccl")


def test_tcomm_and_cpu_comm_keep_rules(tmp_path) -> None:
    # A BROADCAST replayed by its duration (ASTRA-sim's rule) still occupies its group's stream: two of them
    # on group 1 (2 us each) run back to back, beside a group 2 collective (1 us): ends 2000, 4000 and 1000.
    per = [
        [
            coll(1, 8, ctype=pb.BROADCAST, pg="1"),
            coll(2, 8, ctype=pb.BROADCAST, pg="1"),
            coll(3, 100, pg="2"),
        ]
        for _ in range(2)
    ]
    for rank in per:
        rank[0].duration_micros = rank[1].duration_micros = 2
    ts = write_set(tmp_path, per)
    cfg = ReplayConfig(duration_comm_types=frozenset({pb.BROADCAST}))
    ends = _ends(simulate(ts, network=_fake({100: 1000}), groups=GROUPS, config=cfg))
    assert (ends[(0, 1)], ends[(0, 2)], ends[(0, 3)]) == (2000, 4000, 1000)


@pytest.mark.parametrize("second", ["collective", "send"])
def test_flow_model_streams_share_links(tmp_path, second) -> None:
    # ring:2 at 50 GB/s (50 bytes/ns) and 500 ns: a 1 MB all-gather over ranks {0, 1} alone takes
    # 500 + 1e6 / 50 = 20500 ns. A second 1 MB transfer on another stream (group 2's all-gather, or a
    # send on the pipeline stream) crosses the same links at the same time: max-min fairness halves both
    # rates, so both end at 500 + 2e6 / 50 = 40500 ns; the contention-free analytical model keeps 20500.
    from xsim.netmodels.cluster import topology_from_spec
    from xsim.netmodels.models import build_model

    size = 1_000_000
    if second == "collective":
        per = [
            [coll(1, size, ctype=pb.ALL_GATHER, pg="1"), coll(2, size, ctype=pb.ALL_GATHER, pg="2")]
            for _ in range(2)
        ]
    else:
        per = [
            [send(1, dst=1, tag=1, size=size), coll(2, size, ctype=pb.ALL_GATHER, pg="1")],
            [recv(1, src=0, tag=1, size=size), coll(2, size, ctype=pb.ALL_GATHER, pg="1")],
        ]
    ts = write_set(tmp_path, per)
    one = write_set(tmp_path / "one", [[coll(1, size, ctype=pb.ALL_GATHER, pg="1")] for _ in range(2)])

    def run(model: str, trace_set) -> list[int]:
        net = build_model(model, topology_from_spec("ring:2:50GBps:500ns"))
        return simulate(trace_set, network=net, groups=GROUPS).per_rank_finish_ns

    assert run("flow", one) == [20500, 20500]
    assert run("flow", ts) == [40500, 40500]
    assert run("analytical", ts) == [20500, 20500]
