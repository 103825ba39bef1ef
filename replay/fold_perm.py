"""A rank-class fold's renamings pi_k as tables: the image of many ranks under one pi_k in one gather.

replay/fold.py's `_Ctx.perm` maps one rank at a time (its replica's coordinates, swapped with k's, looked up
again): ~10 us of Python a rank. The fold proof, the network check and the collectives table ask for the
image of whole groups under every pi_k (at 16,384 GPUs with 1,024 rank classes: ~8M ranks mapped, ~15 CPU-s,
docs/performance.md round 24y), so the same rule is tabulated once per pair of replicas here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PermTable:
    """pi_k(rank) = replicas[swap[k, replica of rank], position of rank in its replica]."""

    swap: np.ndarray  # (factor, factor): the replica pi_k sends replica kk onto
    replica: np.ndarray  # rank -> its replica
    position: np.ndarray  # rank -> its index in its replica
    replicas: np.ndarray  # (factor, replica length): the ranks of each replica

    def images(self, k: int, members: Sequence[int]) -> list[int]:
        """pi_k of each of `members`, in order."""
        at = np.asarray(members, dtype=np.int64)
        return self.replicas[self.swap[k, self.replica[at]], self.position[at]].tolist()


def perm_table(fold) -> PermTable:
    """The table of a rank-class fold's pi_k (`Fold.positions`): each coordinate of the replica swapped with
    k's, 0 <-> k's value, each on its own (replay/fold.py `_Ctx.perm`, the module docstring there)."""
    f = len(fold.replicas)
    coords = np.asarray([fold.coords(k) for k in range(f)], dtype=np.int64)  # (f, axes)
    lut = np.full(tuple(coords.max(axis=0) + 1), -1, dtype=np.int64)
    lut[tuple(coords.T)] = [fold.index(c) for c in coords.tolist()]
    a = coords[None, :, :]  # the replica's coordinates (kk)
    b = coords[:, None, :]  # k's
    swapped = np.where(a == 0, b, np.where(a == b, 0, a))  # (k, kk, axes)
    swap = lut[tuple(np.moveaxis(swapped, -1, 0))]
    reps = np.asarray(fold.replicas, dtype=np.int64)
    n = reps.size
    replica = np.empty(n, dtype=np.int64)
    position = np.empty(n, dtype=np.int64)
    replica[reps.reshape(-1)] = np.repeat(np.arange(f), reps.shape[1])
    position[reps.reshape(-1)] = np.tile(np.arange(reps.shape[1]), f)
    return PermTable(swap.astype(np.int32), replica, position, reps)


__all__ = ["PermTable", "perm_table"]
