"""The Kineto (torch.profiler chrome-trace) side: CPU ops, launches, GPU ops, gloo work, steps."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from xsim.traces.errors import XsimError
from xsim.traces.io import read_json

CPU_CATS = frozenset({"cpu_op", "user_annotation"})
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver"})
# Runtime calls that block the calling CPU thread until earlier GPU work is done (CUDA runtime API docs:
# cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize; plain cudaMemcpy is synchronous).
SYNC_CALLS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "hipDeviceSynchronize",
    }
)
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
# Kineto times are microseconds (floats) since the epoch: today ~1.8e15 us, 1.8e18 ns. Times past 2^62 ns
# (year 2116) cannot come from a clock and would overflow the int64 nanoseconds of the traces once a
# duration is added; durations are bounded like every trace duration (traces.attrcheck: < 2^53 ns).
MAX_TS_NS = 1 << 62
MAX_DUR_NS = 1 << 53
MAX_STEP_DIGITS = 18  # ProfilerStep#N must fit the int64 `profiler_step` attribute


class KinetoError(XsimError):
    """A Kineto trace that cannot be used; the message names the file."""

    def __init__(self, reason: str, *, path: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.reason = reason
        self.path = path


@dataclass(frozen=True, slots=True)
class KEvent:
    """One complete ('X') Kineto event, times in integer nanoseconds."""

    index: int
    name: str
    cat: str
    ts: int
    dur: int
    pid: Any
    tid: Any
    args: dict[str, Any]

    @property
    def end(self) -> int:
        """End time in ns."""
        return self.ts + self.dur


@dataclass
class KinetoTrace:
    """A parsed Kineto trace split by role."""

    path: str
    cpu_ops: list[KEvent]
    runtime: list[KEvent]
    gpu_ops: list[KEvent]
    comm_threads: list[KEvent]  # gloo work on pt_gloo_runloop threads (durations of CPU collectives)
    steps: dict[int, KEvent]  # ProfilerStep#N
    rank: int | None
    world_size: int | None
    pg_config: list[dict[str, Any]] = field(default_factory=list)
    device_name: str | None = None

    @property
    def has_record_function_id(self) -> bool:
        """True when CPU ops carry args['Record function id'] (recent PyTorch)."""
        return any("Record function id" in e.args for e in self.cpu_ops)


def _ns(us: Any) -> int:
    """Microseconds (a JSON number) -> integer ns; ValueError for anything not a finite number."""
    if isinstance(us, bool) or not isinstance(us, int | float | str):
        raise ValueError("not a number")
    ns = float(us) * 1000
    if not math.isfinite(ns):
        raise ValueError("not finite")
    return round(ns)


def _event(i: int, e: dict[str, Any], path: str) -> KEvent:
    """One 'X' event with its times checked: finite, ts within the clock's range, 0 <= dur < 2^53 ns."""
    try:
        ts, dur = _ns(e["ts"]), _ns(e.get("dur", 0))
        ev = KEvent(
            i,
            str(e["name"]),
            str(e.get("cat", "")),
            ts,
            dur,
            e.get("pid"),
            e.get("tid"),
            e.get("args") if isinstance(e.get("args"), dict) else {},
        )
    except (KeyError, TypeError, ValueError, OverflowError):
        raise KinetoError(
            f"Kineto event #{i} has no ts/dur or one that is not a finite number", path=path
        ) from None
    if not -MAX_TS_NS < ts < MAX_TS_NS:
        raise KinetoError(
            f"Kineto event #{i} {ev.name[:60]!r}: ts {ts / 1e3:.6g} us is outside +-2^62 ns (not a clock time)",
            path=path,
        )
    if not 0 <= dur < MAX_DUR_NS:
        what = "negative" if dur < 0 else "2^53 ns or longer"
        raise KinetoError(
            f"Kineto event #{i} {ev.name[:60]!r}: duration {dur / 1e3:.6g} us is {what}", path=path
        )
    return ev


# Event args the importer matches events by (dict keys, set members): each must be hashable and fit int64.
_ID_ARGS = ("correlation", "External id", "Record function id", "stream", "device")


def _id_ok(x: Any) -> bool:
    """A usable pid/tid: a string, a float, or an integer that fits an int64 attribute."""
    return isinstance(x, (float, str, type(None))) or isinstance(x, int) and -(2**63) <= x < 2**63


def _as_list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def load_kineto(path: str | os.PathLike[str]) -> KinetoTrace:
    """Read a Kineto trace and sort its events into CPU ops, runtime calls, GPU ops and gloo work."""
    p = os.fspath(path)
    doc = read_json(p)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        if isinstance(doc, dict) and "nodes" in doc:
            raise KinetoError("this is a host execution trace; pass it with --et, not --kineto", path=p)
        raise KinetoError("not a Kineto trace (no 'traceEvents' list)", path=p)
    thread_names = _thread_names(doc["traceEvents"])
    cpu, rt, gpu, comm = [], [], [], []
    steps: dict[int, KEvent] = {}
    for i, e in enumerate(doc["traceEvents"]):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        ev = _checked_event(i, e, p)
        if ev.cat in CPU_CATS:
            step = _step_number(i, ev, p)
            if step is not None:
                steps[step] = ev
            if ev.name.startswith("gloo:") or "gloo" in thread_names.get((ev.pid, ev.tid), ""):
                comm.append(ev)
            else:
                cpu.append(ev)
        elif ev.cat in RUNTIME_CATS:
            rt.append(ev)
        elif ev.cat in GPU_CATS:
            gpu.append(ev)
    info = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    devices = doc.get("deviceProperties") if isinstance(doc.get("deviceProperties"), list) else []
    return KinetoTrace(
        path=p,
        cpu_ops=cpu,
        runtime=rt,
        gpu_ops=gpu,
        comm_threads=comm,
        steps=steps,
        rank=int(info["rank"]) if isinstance(info.get("rank"), int) else None,
        world_size=int(info["world_size"]) if isinstance(info.get("world_size"), int) else None,
        pg_config=[c for c in _as_list(info.get("pg_config")) if isinstance(c, dict)],
        device_name=str(devices[0].get("name")) if devices and isinstance(devices[0], dict) else None,
    )


def _thread_names(events: list) -> dict[tuple[Any, Any], str]:
    """(pid, tid) -> the thread's name, from the trace's thread_name metadata events."""
    thread_names: dict[tuple[Any, Any], str] = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "thread_name":
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            name = str(args.get("name", ""))
            key = (e.get("pid"), e.get("tid"))
            if not all(isinstance(x, (int, float, str, type(None))) for x in key):
                continue  # an unhashable pid/tid (a list) names no thread
            # A thread is renamed when the gloo runloop starts; keep the more specific name.
            if "gloo" in name or key not in thread_names:
                thread_names[key] = name
    return thread_names


def _checked_event(i: int, e: dict, p: str) -> KEvent:
    """Complete event #i as a KEvent, its ids (pid, tid and the id args) int64 numbers or strings."""
    ev = _event(i, e, p)
    if not all(_id_ok(x) for x in (ev.pid, ev.tid)):
        raise KinetoError(f"Kineto event #{i}: pid and tid must be int64 numbers or strings", path=p)
    bad = next((k for k in _ID_ARGS if not _id_ok(ev.args.get(k))), None)
    if bad is not None:
        raise KinetoError(f"Kineto event #{i}: args {bad!r} must be an int64 number or a string", path=p)
    return ev


def _step_number(i: int, ev: KEvent, p: str) -> int | None:
    """N of a ProfilerStep#N event, None for any other event."""
    m = STEP_RE.match(ev.name)
    if not m:
        return None
    if len(m.group(1)) > MAX_STEP_DIGITS:
        raise KinetoError(
            f"Kineto event #{i}: step number of {len(m.group(1))} digits in ProfilerStep#"
            f" (at most {MAX_STEP_DIGITS})",
            path=p,
        )
    return int(m.group(1))
