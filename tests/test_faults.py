"""Issue 27 item 7: the fault-injection campaign in CI (scripts/fault_campaign.py, one trial per verb and
fault, seed 2027): SIGKILL/SIGTERM/SIGINT at a random time or write point of `gen`, `replay --out` and
`sweep`, ENOSPC and EROFS from the injectable writer, two writers on one folder. Every output folder must be
the old data or the new data byte for byte, never a mix; no traceback; the rerun completes and leaves no
leftovers. The longer campaign and its counts: docs/robustness.md."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SEED = 2027


def _campaign():
    from scripts import fault_campaign

    return fault_campaign


@pytest.mark.parametrize("verb", ["gen", "replay", "sweep"])
def test_faults_leave_old_or_new_data_never_a_mix(tmp_path: Path, verb: str) -> None:
    fc = _campaign()
    res = fc.run_campaign(tmp_path, SEED, trials=1, verbs=(verb,))[verb]
    want = {f for f in fc.FAULTS if not (verb == "sweep" and f == "concurrent")}
    assert set(res) == want
    for fault, cell in res.items():
        assert cell.trials == 1
        assert cell.old + cell.new + cell.partial + cell.mixes == cell.trials
        assert (cell.mixes, cell.tracebacks, cell.rerun_failures) == (0, 0, 0), (fault, cell.notes)
