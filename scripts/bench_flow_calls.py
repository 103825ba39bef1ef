"""Time the flow model alone on the calls a real replay makes, and check every answer (issue 11).

    PYTHONPATH=<tree> python scripts/bench_flow_calls.py record TRACE_DIR CALLS.pkl
    PYTHONPATH=<tree> python scripts/bench_flow_calls.py replay CALLS.pkl

`record` runs `xsim replay TRACE_DIR --model flow` with the FlowModel of the tree on PYTHONPATH and pickles
its topology, options and every engine-facing call (start_collective, start_p2p, next_event_ns,
next_event_quiet, advance) with its answer. `replay` makes the same calls on a fresh FlowModel of the tree on PYTHONPATH, compares every
answer with the recorded one and prints the model's CPU seconds. Recording with one tree and replaying with
another checks that the two models answer the engine identically, which is what keeps the replay's times
and tables identical; the engine's own time is left out of the measurement.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time


def record(trace_dir: str, out: str) -> None:
    """Replay trace_dir under --model flow and pickle the flow model's calls and answers."""
    from xsim.netmodels import flow

    from xsim.cli import main

    calls: list[tuple] = []
    made: list[tuple] = []
    cls = flow.FlowModel
    init, start_c, start_p = cls.__init__, cls.start_collective, cls.start_p2p
    next_ev, advance = cls.next_event_ns, cls.advance
    quiet = getattr(cls, "next_event_quiet", None)
    inner = [False]  # next_event_quiet ends in next_event_ns: that call is the model's, not the engine's

    def _init(self, topology, *args, **kwargs):
        made.append((topology, args, kwargs))
        init(self, topology, *args, **kwargs)

    def _start_c(self, now, spec):
        h = start_c(self, now, spec)
        calls.append(("c", now, spec, h))
        return h

    def _start_p(self, now, src, dst, size):
        h = start_p(self, now, src, dst, size)
        calls.append(("p", now, (src, dst, size), h))
        return h

    def _next(self):
        r = next_ev(self)
        if not inner[0]:
            calls.append(("n", None, None, r))
        return r

    def _quiet(self, horizon):
        inner[0] = True
        try:
            r = quiet(self, horizon)
        finally:
            inner[0] = False
        calls.append(("q", horizon, None, r))
        return r

    def _advance(self, until):
        r = advance(self, until)
        calls.append(("a", until, None, r))
        return r

    cls.__init__, cls.start_collective, cls.start_p2p = _init, _start_c, _start_p
    cls.next_event_ns, cls.advance = _next, _advance
    if quiet is not None:
        cls.next_event_quiet = _quiet
    code = main(["replay", trace_dir, "--model", "flow", "--no-progress", "--json"])
    if code or len(made) != 1:
        raise SystemExit(f"replay of {trace_dir} failed or built {len(made)} flow models")
    topology, args, kwargs = made[0]
    with open(out, "wb") as f:
        pickle.dump({"topology": topology, "args": args, "kwargs": kwargs, "calls": calls}, f, protocol=5)
    print(f"{out}: {len(calls)} calls", file=sys.stderr)


def replay(path: str) -> int:
    """Make the recorded calls on a fresh FlowModel; print CPU seconds; exit 1 on any different answer."""
    from xsim.netmodels.flow import FlowModel

    with open(path, "rb") as f:
        rec = pickle.load(f)
    t0 = time.process_time()
    model = FlowModel(rec["topology"], *rec["args"], **rec["kwargs"])
    for i, (kind, arg, extra, want) in enumerate(rec["calls"]):
        if kind == "c":
            got = model.start_collective(arg, extra)
        elif kind == "p":
            got = model.start_p2p(arg, *extra)
        elif kind == "n":
            got = model.next_event_ns()
        elif kind == "q":
            got = model.next_event_quiet(arg)
        else:
            got = model.advance(arg)
        if got != want:
            print(f"{path}: call {i} ({kind} {arg}) answered {got!r}, recorded {want!r}", file=sys.stderr)
            return 1
    dt = time.process_time() - t0
    print(f"{path}: {len(rec['calls'])} calls, all answers equal, flow model {dt:.2f} CPU-s")
    return 0


def main() -> int:
    """Command line: record TRACE_DIR OUT | replay CALLS."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="replay a trace set under --model flow and pickle the model's calls")
    r.add_argument("trace_dir")
    r.add_argument("out")
    p = sub.add_parser("replay", help="time the flow model on recorded calls, checking every answer")
    p.add_argument("calls")
    a = ap.parse_args()
    if a.cmd == "record":
        record(a.trace_dir, a.out)
        return 0
    return replay(a.calls)


if __name__ == "__main__":
    sys.exit(main())
