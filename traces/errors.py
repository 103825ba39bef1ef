"""Exception types of the trace layer; every message names the file, rank and node where known."""

from __future__ import annotations


class XsimError(Exception):
    """Base of every error xsim reports to a user as one clear line (packages other than netmodels)."""


class TraceError(XsimError):
    """A problem with a trace: carries the file, rank, node index/id and byte offset where known."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        rank: int | None = None,
        node_index: int | None = None,
        node_id: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.message = message
        self.path = path
        self.rank = rank
        self.node_index = node_index
        self.node_id = node_id
        self.offset = offset
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.path is not None:
            where.append(str(self.path))
        if self.rank is not None:
            where.append(f"rank {self.rank}")
        if self.node_index is not None:
            where.append("GlobalMetadata" if self.node_index < 0 else f"node #{self.node_index}")
        if self.node_id is not None:
            where.append(f"id {self.node_id}")
        if self.offset is not None:
            where.append(f"byte {self.offset}")
        return f"{': '.join([', '.join(where)] if where else [])}{': ' if where else ''}{self.message}"


class TraceFormatError(TraceError):
    """The bytes are not a readable Chakra stream (truncated, garbage, undecodable message)."""


class AttributeTypeError(TraceError):
    """An attribute holds a value of the wrong kind (a string where a number is expected, ...)."""


class TraceSetError(TraceError):
    """A set of per-rank files is incomplete or inconsistent (gaps in ranks, no files)."""


class DuplicateAttributeError(AttributeTypeError):
    """An attribute name the tools interpret appears twice on one node (which copy counts is ambiguous)."""
