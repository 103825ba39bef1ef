"""Allocator settings for the verbs that build many large numpy arrays (the CLI's `replay`)."""

from __future__ import annotations

import sys

# mallopt(3) parameter numbers, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Blocks up to this size come from the heap instead of their own mmap. 256 MiB is above any array one
# decode batch or one rank's columns make (2 MB batches, docs/performance.md) and was measured, not fitted.
_MMAP_THRESHOLD = 256 << 20
# Freed heap memory above this is given back to the kernel; 1 GiB keeps what a replay frees for its next
# arrays.
_TRIM_THRESHOLD = 1 << 30


def keep_freed_memory() -> bool:
    """Make glibc's malloc reuse freed memory for the next arrays instead of unmapping and refaulting it.

    With glibc's defaults every large numpy temporary is a fresh mmap and its pages are faulted in again
    (~7 us per 4 KiB page on the shared VM): 0.9-1.0 of ~6.5 CPU-s of the unfolded 512-rank replay were
    system time, 0.45-0.6 with these settings, with the same peak RSS (docs/performance.md, round 4).
    Process-wide, so only the command line calls it, never the library. Returns whether glibc took both
    settings (False elsewhere: musl, macOS, Windows).
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes  # ~4 ms; only here

    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (e.g. musl has no mallopt)
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    )
