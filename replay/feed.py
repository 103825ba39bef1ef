"""A bounded hand-off of items from a producer thread to a consumer, for writing tables concurrently.

The ops table of a folded replay is written twice, as CSV and as Parquet, from the same chunks (replay/
result.py). polars releases the GIL while it encodes, so on two cores the chunks' rows and CSV text can
be made on one thread while the Parquet writer encodes the previous chunks on another (docs/
performance.md round 24y). Each file still has one writer taking the chunks in order, so the bytes are a
sequential write's. An exception on the producer ends the stream and is raised again by `close`, on the
caller's thread, with its own type (an out-of-memory there is still the CLI's one line, xsim/oom.py).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

# Queue polling period (s) of a producer waiting for room: how soon it notices the consumer gave up.
_POLL_S = 0.05


class _Stopped(Exception):
    """The consumer is gone: the producer stops quietly."""


class Feed:
    """Items from `produce(put)` on a thread of their own, taken in order by `items()`; at most `depth`
    items wait between the two (the memory of `depth` chunks)."""

    _END = object()

    def __init__(self, produce: Callable[[Callable[[object], None]], None], depth: int = 2) -> None:
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(produce,), name="xsim-feed", daemon=True)
        self._thread.start()

    def _put(self, item: object) -> None:
        while True:
            if self._stop.is_set():
                raise _Stopped
            try:
                self._q.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                continue

    def _run(self, produce: Callable[[Callable[[object], None]], None]) -> None:
        try:
            produce(self._put)
        except _Stopped:
            return
        except BaseException as exc:  # noqa: BLE001 - raised again on the caller's thread by close()
            self._error = exc
        try:
            self._put(self._END)
        except _Stopped:
            pass

    def items(self) -> Iterator:
        """The producer's items in order; ends early (without raising) when the producer failed."""
        while True:
            item = self._q.get()
            if item is self._END:
                return
            yield item

    def close(self) -> None:
        """Stop the producer if it is still running, wait for it, and raise its exception if it had one."""
        self._stop.set()
        self._thread.join()
        if self._error is not None:
            raise self._error


__all__ = ["Feed"]
