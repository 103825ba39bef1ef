"""Generation runs with the cyclic collector paused (docs/performance.md, round 24t).

With it on, full collections came at a rate that grows with the nodes made, and each walked every list
held so far: the 1T row's generation grew faster than its nodes. Pinned by counting collections.
"""

from __future__ import annotations

import gc
from pathlib import Path

from xsim.tracegen import generate
from xsim.tracegen.spec import load_spec

SPEC = Path(__file__).resolve().parent.parent / "examples" / "table4_c01.yaml"


def _collections_during_generate() -> tuple[int, int]:
    """(collections started while generating, nodes generated)."""
    dep = load_spec(str(SPEC))
    seen: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(count)
    try:
        bundle = generate(dep)
    finally:
        gc.callbacks.remove(count)
    return len(seen), bundle.node_count()


def test_no_collection_runs_while_generating_and_the_collector_is_restored() -> None:
    assert gc.isenabled()
    runs, nodes = _collections_during_generate()
    assert nodes > 1000  # enough allocations that a running collector would have started
    assert runs == 0
    assert gc.isenabled()


def test_a_collector_paused_by_the_caller_stays_paused() -> None:
    gc.disable()
    try:
        runs, _nodes = _collections_during_generate()
        assert runs == 0
        assert not gc.isenabled()
    finally:
        gc.enable()
