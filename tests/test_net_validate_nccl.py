"""scripts/validate_nccl.py and the table it wrote into docs/netmodels.md agree (issue 23)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("validate_nccl", ROOT / "scripts" / "validate_nccl.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("validate_nccl", mod)  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


def test_page_and_script_hold_the_same_rows():
    vn = _script()
    sources, rows = vn.load_rows()
    assert [r.id for r in rows] == vn.doc_row_ids()
    assert len({r.id for r in rows}) == len(rows)
    # Every row names a source the data file describes, and the four collectives' sizes are nccl-tests'.
    assert all(r.source in sources for r in rows)


def test_page_rows_are_what_the_script_computes_now():
    # Three cheap rows recomputed: the page's lines are the script's lines, byte for byte.
    vn = _script()
    _, rows = vn.load_rows()
    pick = [r for r in rows if r.id in ("h200-1n-ar-32k", "h100-1n-ag-8g", "h100-2n-ar-ring-8g")]
    fresh = vn.table([vn.evaluate(r) for r in pick]).splitlines()[2:-2]
    page = (ROOT / "docs" / "netmodels.md").read_text()
    for line in fresh:
        assert line in page


def test_bus_bandwidth_conventions():
    vn = _script()
    assert vn.bus_factor("all_reduce", 16) == 2 * 15 / 16
    assert vn.bus_factor("all_gather", 8) == 7 / 8
    assert vn.chakra_size("all_gather", 8 << 20, 8) == 1 << 20  # nccl-tests size = whole output
    assert vn.chakra_size("reduce_scatter", 8 << 20, 8) == 8 << 20
