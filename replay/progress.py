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
