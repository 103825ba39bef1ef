"""Errors of the PyTorch importer: one line naming the file (and rank) that could not be used."""

from __future__ import annotations

from xsim.traces.errors import XsimError


class PyTorchImportError(XsimError):
    """A host execution trace or Kineto trace that cannot be imported; the message names the file."""

    def __init__(self, message: str, *, path: str | None = None, rank: int | None = None) -> None:
        where = ", ".join(x for x in (path, None if rank is None else f"rank {rank}") if x)
        super().__init__(f"{where}: {message}" if where else message)
        self.path = path
        self.rank = rank
