"""A rank-class fold's renamings pi_k as tables: the image of many ranks under one pi_k in one gather.

replay/fold.py's `_Ctx.perm` maps one rank at a time (its replica's coordinates, swapped with k's, looked up
again): ~10 us of Python a rank. The fold proof, the network check and the collectives table ask for the
image of whole groups under every pi_k (at 16,384 GPUs with 1,024 rank classes: ~8M ranks mapped, ~15 CPU-s,
docs/performance.md round 24y), so the same rule is tabulated once per pair of replicas here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class PermTable:
    """pi_k(rank) = replicas[row k[replica of rank], position of rank in its replica]; row k (the replica
    pi_k sends each replica onto) made on first use, int32: 4 B x factor^2 when every k is asked for (4 MiB
    at 1,024 rank classes, 64 MiB at 4,096)."""

    coords: np.ndarray  # (factor, axes): each replica's coordinates
    lut: np.ndarray  # coordinates -> replica
    replica: np.ndarray  # rank -> its replica
    position: np.ndarray  # rank -> its index in its replica
    replicas: np.ndarray  # (factor, replica length): the ranks of each replica
    rows: dict = field(default_factory=dict)

    def row(self, k: int) -> np.ndarray:
        """The replica pi_k sends each replica onto: each coordinate swapped with k's, 0 <-> k's value."""
        r = self.rows.get(k)
        if r is None:
            c, b = self.coords, self.coords[k]
            swapped = np.where(c == 0, b, np.where(c == b, 0, c))
            r = self.rows[k] = self.lut[tuple(swapped.T)].astype(np.int32)
        return r

    def images(self, k: int, members: Sequence[int]) -> list[int]:
        """pi_k of each of `members`, in order."""
        at = np.asarray(members, dtype=np.int64)
        return self.replicas[self.row(k)[self.replica[at]], self.position[at]].tolist()


def perm_table(fold) -> PermTable:
    """The table of a rank-class fold's pi_k (`Fold.positions`): each coordinate of the replica swapped with
    k's, 0 <-> k's value, each on its own (replay/fold.py `_Ctx.perm`, the module docstring there)."""
    f = len(fold.replicas)
    coords = np.asarray([fold.coords(k) for k in range(f)], dtype=np.int64)  # (f, axes)
    lut = np.full(tuple(coords.max(axis=0) + 1), -1, dtype=np.int64)
    lut[tuple(coords.T)] = [fold.index(c) for c in coords.tolist()]
    reps = np.asarray(fold.replicas, dtype=np.int64)
    n = reps.size
    replica = np.empty(n, dtype=np.int64)
    position = np.empty(n, dtype=np.int64)
    replica[reps.reshape(-1)] = np.repeat(np.arange(f), reps.shape[1])
    position[reps.reshape(-1)] = np.tile(np.arange(reps.shape[1]), f)
    return PermTable(coords, lut, replica, position, reps)


__all__ = ["PermTable", "perm_table"]
