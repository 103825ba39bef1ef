"""Algorithm 3 (paper section 4.4 and appendix C): LCM-based gradient chunk sizes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xsim.tracegen.planner.rings import lcm_of


@dataclass(frozen=True)
class ChunkShare:
    """One device group's share: data_per_rank = d/t, chunk_multiplier = L/t, data_per_chunk_per_rank."""

    tp: int
    data_per_rank: int
    chunk_multiplier: int
    data_per_chunk_per_rank: int


def chunk_bytes(d: int, L: int) -> int:
    """Bytes of one chunk: d/L, rounded up so that L chunks cover all d bytes (the last one padded)."""
    return -(-d // L)


def chunk_extent(d: int, L: int, c: int) -> tuple[int, int]:
    """Byte range [start, end) of chunk c within a d-byte gradient (the padded tail is not data)."""
    cb = chunk_bytes(d, L)
    return min(c * cb, d), min((c + 1) * cb, d)


def chunk_shares(degrees: Sequence[int], d: int) -> tuple[ChunkShare, ...]:
    """Algorithm 3 for TP degrees t_1..t_k and volume d; exact when L divides d (else chunks padded)."""
    L = lcm_of(degrees)
    cb = chunk_bytes(d, L)
    return tuple(ChunkShare(t, (L // t) * cb, L // t, cb) for t in degrees)
