"""`xsim replay`'s allocator settings: large blocks come from glibc's heap, not one mmap each."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# In a child process (the settings are process-wide): allocate a 64 MiB block and report where it landed by
# the process's own memory map.
_PROBE = textwrap.dedent(
    """
    import sys
    from xsim.malloc import keep_freed_memory

    def maps():
        out = {}
        for line in open("/proc/self/maps"):
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out[parts[0]] = (hi - lo, parts[5] if len(parts) > 5 else "")
        return out

    took = keep_freed_memory() if sys.argv[1] == "tuned" else None
    before = maps()
    block = bytearray(64 << 20)
    after = maps()
    own = [size for key, (size, name) in after.items() if key not in before and not name and size >= 64 << 20]
    heap = max((size for size, name in after.values() if name == "[heap]"), default=0)
    print(took, len(own), heap >= 64 << 20)
    """
)


def _probe(mode: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.split("\n")[0]


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_a_large_block_comes_from_the_heap_after_keep_freed_memory() -> None:
    """glibc's default gives a 64 MiB block its own mapping; after the call it is carved from [heap]."""
    default = _probe("default")
    if default != "None 1 False":
        pytest.skip(f"this libc does not map large blocks on their own by default ({default})")
    assert _probe("tuned") == "True 0 True"


def test_the_replay_verb_asks_for_it_and_the_library_does_not() -> None:
    """Process-wide settings are the command line's choice: `xsim replay` sets them, `xsim.api` never does."""
    src = (REPO / "xsim" / "cmd_replay.py").read_text(encoding="utf-8")
    assert "keep_freed_memory()" in src
    for lib in ("replay", "traces", "netmodels", "tracegen", "xsim/api"):
        for path in (REPO / lib).rglob("*.py"):
            assert "keep_freed_memory" not in path.read_text(encoding="utf-8"), path


# In a child process: polars' allocator threads after table work, by the library alone or under the CLI.
_THREADS = textwrap.dedent(
    """
    import io, os, sys
    if sys.argv[1] == "cli":
        from xsim.cli import _run
        _run([])  # no verb: the usage, and the settings a verb would run under
    import polars as pl
    pl.DataFrame({"a": list(range(100_000))}).write_parquet(io.BytesIO())
    names = {open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")}
    print("jemalloc_bg_thd" in names)
    """
)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_the_cli_starts_polars_without_jemalloc_background_threads() -> None:
    """Under an address-space limit jemalloc's background threads could not start and it printed so without
    end, ignoring SIGTERM (docs/performance.md, round 24w): the CLI turns them off before polars loads."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    env["PYTHONPATH"] = str(REPO)

    def probe(mode: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", _THREADS, mode], cwd=REPO, env=env, capture_output=True, text=True,
            timeout=60, check=True,
        )  # fmt: skip
        return done.stdout.strip().splitlines()[-1]

    if probe("lib") != "True":
        pytest.skip("this polars build starts no jemalloc background thread")
    assert probe("cli") == "False"
