"""A rich progress bar on stderr for long replays (off when stderr is not a terminal)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# Replays shorter than this never show a bar: it would only flicker.
SHOW_AFTER_S = 0.5


@contextmanager
def progress_bar(
    total_label: str = "replay", enabled: bool = True
) -> Iterator[Callable[[int, int], None] | None]:
    """Yield a `(done, total)` callback that drives a bar once the run has lasted SHOW_AFTER_S."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    t0 = time.perf_counter()
    state: dict = {}

    def update(done: int, total: int) -> None:
        if "bar" not in state:
            if time.perf_counter() - t0 < SHOW_AFTER_S:
                return
            bar = Progress(
                TextColumn(f"[bold]{total_label}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("nodes"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            bar.start()
            state["bar"] = bar
            state["task"] = bar.add_task(total_label, total=total)
        state["bar"].update(state["task"], completed=done, total=total)

    try:
        yield update
    finally:
        if "bar" in state:
            state["bar"].stop()


# A phase (reading, generating, checking) shows its spinner or bar only once it has lasted this long.
PHASE_SHOW_AFTER_S = 1.0


def _console():
    from rich.console import Console

    return Console(stderr=True)


@contextmanager
def status(label: str, enabled: bool = True) -> Iterator[Callable[[], None]]:
    """A spinner with `label` on stderr once the phase has lasted PHASE_SHOW_AFTER_S; yields `stop()`.

    Quiet when stderr is not a terminal (pipes, CI, tests) or when disabled.
    """
    if not enabled or not sys.stderr.isatty():
        yield lambda: None
        return
    import threading

    from rich.status import Status

    lock = threading.Lock()
    state: dict = {}

    def show() -> None:
        with lock:
            if state.get("done"):
                return
            st = Status(f"{label} ...", console=_console())
            st.start()
            state["status"] = st

    def stop() -> None:
        timer.cancel()
        with lock:
            state["done"] = True
            if "status" in state:
                state.pop("status").stop()

    timer = threading.Timer(PHASE_SHOW_AFTER_S, show)
    timer.daemon = True
    timer.start()
    try:
        yield stop
    finally:
        stop()


@contextmanager
def replay_progress(enabled: bool = True) -> Iterator[Callable[[int, int], None] | bool]:
    """Progress of a whole replay: a spinner while traces are read and the program is built, then the bar."""
    if not enabled or not sys.stderr.isatty():
        yield False
        return
    with status("reading traces and building the replay") as stop, progress_bar() as bar:

        def update(done: int, total: int) -> None:
            stop()
            if bar is not None:
                bar(done, total)

        yield update


def track(items, label: str, total: int, enabled: bool = True) -> Iterator:
    """Iterate `items`, with a bar on stderr once the loop has lasted PHASE_SHOW_AFTER_S (TTY only)."""
    if not enabled or not sys.stderr.isatty():
        yield from items
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    t0 = time.perf_counter()
    bar = None
    task = None
    try:
        for i, item in enumerate(items):
            if bar is None and time.perf_counter() - t0 >= PHASE_SHOW_AFTER_S:
                bar = Progress(
                    TextColumn(f"[bold]{label}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    console=_console(),
                    transient=True,
                )
                bar.start()
                task = bar.add_task(label, total=total)
            if bar is not None:
                bar.update(task, completed=i)
            yield item
    finally:
        if bar is not None:
            bar.stop()
