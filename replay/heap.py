"""Giving the C heap's free pages back to the kernel between the build and the event loop."""

from __future__ import annotations

import sys


def return_freed_heap() -> bool:
    """malloc_trim(0): release the free pages of glibc's heap (True when glibc did so).

    A folded build frees its representatives' columns and byte templates (numpy arrays, which glibc serves
    from its heap once its mmap threshold has risen), leaving holes in the middle of the heap that glibc
    keeps mapped. The event loop and the tables then allocate mostly Python objects, whose arenas pymalloc
    maps apart from that heap, so the holes would count in the peak RSS untouched: 1,029 -> 886 MiB on
    Narayanan's 1T row at m = 128, same CPU time (docs/performance.md, round 24t). A one-shot release,
    not an allocator setting (those stay the command line's: xsim/malloc.py).
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes  # ~4 ms; only here

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False  # not glibc (musl has no malloc_trim)
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    return bool(trim(0))
