"""Exception type of the planner: one line naming the spec entry (device group, layer) at fault."""

from __future__ import annotations

from xsim.traces.errors import XsimError


class PlanError(XsimError):
    """A deployment the planner cannot plan: overlapping ranks, a TP degree that does not match, ..."""
