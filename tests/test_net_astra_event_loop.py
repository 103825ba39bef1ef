"""The ASTRA-sim mode's event loop and tick lists run same-time events in ASTRA-sim's order (issue 30 round 4).

Rules (netmodels/astra_events.py, from ASTRA-sim's EventQueue and Sys::try_register_event): events of one
time run in the order they were scheduled; an event scheduled with a sequence number reserved earlier runs at
that reserved place; a rank's system-layer events of one tick run together where the tick's first event was
registered, and an event registered for a tick whose list is running joins its end. The expected orders
below are worked out by hand from these rules.
"""

from __future__ import annotations

from xsim.netmodels.astra_events import EventLoop, SysEvents


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
