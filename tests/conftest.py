"""Shared test helpers: where the peer traces live (skip cleanly when ../shared is absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
PEER = SHARED / "peer_traces"


def need_shared(*parts: str) -> Path:
    """Path under ../shared, or skip the test when that folder (or the file) is absent."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} not available (../shared absent)")
    return p
