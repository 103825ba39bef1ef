"""An unfolded replay of a compact set derives the unwritten ranks' files from replica 0 while it builds
the program; that source (replica 0's columns, file bytes, program and templates) is gone before the event
loop runs (issue 24 item 5; docs/performance.md round 24w: 994 -> 823 MiB on 256 ranks)."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import xsim.replay.simulation as simulation

from xsim import api


def test_the_compact_source_is_released_before_the_engine_runs(tmp_path: Path, monkeypatch) -> None:
    """The source callable is alive while the program is built, dead when run_engine starts."""
    spec = {"name": "rel", "model": "llama2-7b", "seq_len": 128, "micro_batches": 2,
            "parallel": {"gpu": "H100", "tp": 2, "pp": 2, "dp": 2}}  # fmt: skip
    api.generate(spec, api.GenerateOptions(out=str(tmp_path / "set")))
    refs: list[weakref.ref] = []
    seen: dict[str, bool] = {}
    make, run = simulation.compact_source, simulation.run_engine

    def source(*a, **k):
        fn = make(*a, **k)
        refs.append(weakref.ref(fn))
        return fn

    def engine(*a, **k):
        gc.collect()  # the cyclic collector is paused during the replay; only references count here
        seen["alive"] = any(r() is not None for r in refs)
        return run(*a, **k)

    monkeypatch.setattr(simulation, "compact_source", source)
    monkeypatch.setattr(simulation, "run_engine", engine)
    res = api.simulate(str(tmp_path / "set"), api.ReplayOptions(fold=False, progress=False)).result
    assert len(refs) == 1 and seen == {"alive": False}
    assert res.summary_dict()["num_ranks"] == 8 and res.fold_factor == 1
