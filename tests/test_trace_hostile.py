"""Hostile inputs: each gives one clear line naming the file and node/byte, exit 2, no traceback, no hang."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
from xsim.traces.errors import TraceFormatError
from xsim.traces.stream import decode_stream

from tests.conftest import need_shared

HOSTILE = Path(__file__).resolve().parent / "data" / "hostile"

# file -> text the single error line must contain (the locator and the reason).
EXPECTED = {
    "empty.0.et": ["byte 0", "empty file"],
    "truncated.0.et": ["node #3", "byte 79", "past end of file"],
    "length_past_end.0.et": ["node #4", "byte 92", "past end of file"],
    "garbage.0.et": ["GlobalMetadata", "byte 0"],
    "varint_too_long.0.et": ["node #4", "byte 92", "varint32"],
    "bitflip.0.et": ["node #2", "does not decode"],
    "bad_gzip.0.et": ["corrupt gzip"],
    "cycle.0.et": ["node #0", "id 0", "cycle: 0 -> 1 -> 2 -> 0"],
    "dangling.0.et": ["node #3", "missing node 77"],
    "duplicate_id.0.et": ["node #3", "id 1 already used by node #1"],
    "wrong_type.0.et": ["node #1", "'comm_size' holds string_val"],
    "unknown_node_type.0.et": ["node #3", "unknown node type 42"],
    "unknown_comm_type.0.et": ["node #1", "unknown comm_type 99"],
    "coll_no_size.0.et": ["node #1", "without comm_size"],
    "send_no_peer.0.et": ["node #4", "without comm_dst"],
}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "xsim", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hostile_file_gives_one_clear_line(name: str) -> None:
    path = HOSTILE / name
    res = run_cli("trace", "validate", str(path))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert str(path) in lines[0]
    for text in EXPECTED[name]:
        assert text in lines[0], (text, lines[0])


@pytest.mark.parametrize("name", ["truncated.0.et", "garbage.0.et", "bitflip.0.et", "empty.0.et"])
def test_unreadable_file_fails_info_too(name: str) -> None:
    res = run_cli("trace", "info", str(HOSTILE / name))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.startswith("xsim: error: ")


def test_valid_base_is_clean() -> None:
    res = run_cli("trace", "validate", str(HOSTILE / "valid.0.et"))
    assert res.returncode == 0 and "OK" in res.stdout


def _flip_every_bit_checked(data: bytes, limit: int, seed: int) -> int:
    """Flip single bits; each result must decode or raise TraceFormatError, nothing else."""
    rng = random.Random(seed)
    positions = list(range(len(data) * 8))
    rng.shuffle(positions)
    decoded = 0
    for bit in positions[:limit]:
        buf = bytearray(data)
        buf[bit // 8] ^= 1 << (bit % 8)
        try:
            decode_stream(bytes(buf), "flip")
            decoded += 1
        except TraceFormatError:
            pass
    return decoded


def test_bit_flips_never_crash() -> None:
    data = (HOSTILE / "valid.0.et").read_bytes()
    decoded = _flip_every_bit_checked(data, len(data) * 8, seed=7)
    # Many flips (inside strings, varint values) still decode; that is allowed, crashing is not.
    assert 0 < decoded < len(data) * 8


def test_bit_flips_on_a_real_trace_never_crash() -> None:
    path = need_shared(
        "peer_traces", "chakra_et", "tutorials_micro2024_MLP_ModelParallel_32npus", "MLP_ModelParallel.0.et"
    )
    _flip_every_bit_checked(path.read_bytes(), 400, seed=11)


def test_regenerating_the_corpus_is_identical(tmp_path: Path) -> None:
    # The committed corpus is what make_hostile.py writes: no hand-edited bytes.
    import tests.data.make_hostile as mk

    before = {p.name: p.read_bytes() for p in HOSTILE.glob("*.et")}
    mk.HERE = tmp_path
    mk.main()
    after = {p.name: p.read_bytes() for p in tmp_path.glob("*.et")}
    assert before == after
