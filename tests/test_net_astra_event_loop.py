"""The ASTRA-sim mode's event loop and tick lists run same-time events in ASTRA-sim's order (issue 30 round 4).

Rules (netmodels/astra_events.py, from ASTRA-sim's EventQueue and Sys::try_register_event): events of one
time run in the order they were scheduled; an event scheduled with a sequence number reserved earlier runs at
that reserved place; a rank's system-layer events of one tick run together where the tick's first event was
registered, and an event registered for a tick whose list is running joins its end. The expected orders
below are worked out by hand from these rules.
"""

from __future__ import annotations

from xsim.netmodels.astra_events import (
    AstraWorld,
    CollectiveRun,
    EventLoop,
    PacketAlgo,
    RingAlgo,
    Stream,
    SysEvents,
    UnawareNet,
)


def _log(out: list, name: str):
    return lambda _arg: out.append(name)


def test_same_time_events_run_in_scheduling_order_and_new_ones_at_now_join_the_end() -> None:
    loop, out = EventLoop(), []
    loop.at(5, _log(out, "a"))
    loop.at(3, lambda _a: (out.append("b"), loop.at(5, _log(out, "d")), loop.at(3, _log(out, "e"))))
    loop.at(5, _log(out, "c"))
    loop.run_until(None)
    # t=3: b, then e (scheduled at 3 while 3 runs); t=5: a, c (scheduled first), then d.
    assert out == ["b", "e", "a", "c", "d"]


def test_a_reserved_number_runs_at_its_reserved_place() -> None:
    loop, out = EventLoop(), []
    r = loop.reserve()  # taken before x and y are scheduled
    loop.at(5, _log(out, "x"))
    loop.at(5, _log(out, "y"))
    loop.put(5, r, _log(out, "reserved"), None)
    loop.run_until(None)
    assert out == ["reserved", "x", "y"]


def test_a_ranks_tick_list_runs_together_and_a_running_list_takes_joiners() -> None:
    loop, out = EventLoop(), []
    sys_ = SysEvents(loop)

    def a(_arg) -> None:
        out.append("a")
        sys_.at(0, 0, _log(out, "d"))  # rank 0's tick 5 is running: joins after c

    def b(_arg) -> None:
        out.append("b")
        sys_.at(0, 0, _log(out, "e"))  # rank 0's tick-5 list has run: a new list, after everything so far

    sys_.at(0, 5, a)  # rank 0, tick 5: the list's first event
    loop.at(5, b)
    sys_.at(1, 5, _log(out, "f"))  # rank 1, tick 5: its own list, after b
    sys_.at(0, 5, _log(out, "c"))  # joins rank 0's list: right after a, before b
    loop.run_until(None)
    assert out == ["a", "c", "d", "b", "f", "e"]


def test_a_stopped_run_resumes_inside_its_time() -> None:
    loop, out, flag = EventLoop(), [], []
    loop.at(4, _log(out, "p"))
    loop.at(4, lambda _a: (out.append("q"), flag.append(1)))
    loop.at(4, _log(out, "r"))
    loop.at(9, _log(out, "s"))
    assert loop.run_quiet(8, flag, []) == 4  # stopped right after q
    assert out == ["p", "q"]
    assert loop.next_time() == 4  # r is still due at 4
    loop.at(4, _log(out, "late"))  # scheduled at 4 now: after r
    loop.run_until(4)
    assert out == ["p", "q", "r", "late"]
    assert loop.next_time() == 9
    flag.clear()
    assert loop.run_quiet(20, flag, []) is None
    assert out[-1] == "s" and loop.next_time() is None


def test_a_run_stopped_on_its_times_last_event_leaves_that_time_empty() -> None:
    loop, flag = EventLoop(), []
    loop.at(4, lambda _a: flag.append(1))
    loop.at(7, lambda _a: None)
    assert loop.run_quiet(10, flag, []) == 4
    assert loop.next_time() == 7


def test_a_times_tick_lists_go_with_it_and_a_registration_after_it_ran_starts_a_new_list() -> None:
    # Sys::call_events erases a tick's list once it has run; a registration for that tick afterwards makes a
    # new list, scheduled after whatever is already at that time. Here the last fresh number before the
    # engine's work at 5 is rank 0's tick-5 list's (z was registered first), the case where a list kept by
    # number alone would still look open: d must not run before c.
    loop, out = EventLoop(), []
    sys_ = SysEvents(loop)
    sys_.at(0, 8, _log(out, "z"))  # rank 0, tick 8
    sys_.at(0, 5, _log(out, "a"))  # rank 0, tick 5: a new list
    sys_.at(0, 5, _log(out, "b"))  # joins it
    loop.run_until(5)  # the model advanced to 5: every event of 5 has run
    assert sorted(loop.ticks) == [8]  # tick 5's lists went with time 5
    sys_.at(1, 0, _log(out, "c"))  # the engine starts work at 5: rank 1 first
    sys_.at(0, 0, _log(out, "d"))  # rank 0's tick-5 list has run: a new list, after c
    loop.run_until(None)
    assert out == ["a", "b", "c", "d", "z"]
    assert loop.ticks == {}


def test_a_ring_is_made_as_a_ring_algo_whatever_the_constructor() -> None:
    world = AstraWorld(lambda loop: UnawareNet(loop, lambda s, d, m: 100), 10, 1600.0, 1, True)
    run = CollectiveRun(world, 0, (0, 1, 2, 3), [[(0, None)]], lambda r: None)
    made = [
        PacketAlgo(world.ctx, Stream(run, 0, [], 0, (0, 0)), (0, 1, 2, 3), 0, False, "all_reduce", algo, 4096)
        for algo in ("ring", "direct")
    ]
    assert type(made[0]) is RingAlgo and type(made[1]) is PacketAlgo
    # Ring AllReduce of p = 4: 2 (p - 1) = 6 messages of 4096 / 4 = 1024 bytes, the whole-system bus delay
    # (endpoint-delay 10), reduction 3 x floor(1024 B / 1600 B/ns) = 0 ns.
    assert (made[0].streams_left, made[0].msg, made[0].bus, made[0]._red) == (6, 1024, 10, 0)
