"""replay/heap.py: the heap's free pages go back to the kernel (glibc's malloc_trim)."""

from __future__ import annotations

import sys

import pytest
from xsim.replay.heap import return_freed_heap


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap")
def test_holes_in_the_heap_are_returned() -> None:
    # 64 KiB blocks come from the heap (below glibc's 128 KiB mmap threshold); freeing all but every 64th
    # leaves ~200 MiB of holes below live blocks, which free() alone does not return.
    blocks = [bytearray(b"\x01" * (64 << 10)) for _ in range(3200)]
    keep = blocks[::64]
    del blocks
    before = _rss_kib()
    assert return_freed_heap()
    assert before - _rss_kib() > 100_000  # KiB
    assert len(keep) == 50
