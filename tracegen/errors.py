"""Exception types of the trace generator; each renders as one line naming the spec file and the entry."""

from __future__ import annotations

from xsim.traces.errors import XsimError


class SpecError(XsimError):
    """A deployment spec that cannot be loaded or is inconsistent (bad key, overlapping ranks, ...)."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        self.message = message
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


class CatalogError(XsimError):
    """An unknown GPU or model name, or an override that makes no sense (negative bandwidth, ...)."""


class ProfileError(XsimError):
    """A profiled op-time table that cannot be read (missing column, bad shape, negative time)."""


class GeneratorError(XsimError):
    """The generator cannot produce traces for a valid spec (e.g. a missing optional stage)."""
