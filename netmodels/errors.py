"""Exception types of the network models; each renders as one clear line for the command line."""

from __future__ import annotations

from xsim.traces.errors import XsimError


class NetworkModelError(XsimError, ValueError):
    """Base of every error netmodels reports: bad topology, algorithm, rank, unit or config."""


class TopologyError(NetworkModelError):
    """A topology or cluster description is malformed (unknown kind, bad bandwidth, missing node)."""


class RankError(NetworkModelError):
    """A rank lies outside the topology, or a process group is empty or repeats a rank."""


class AlgorithmError(NetworkModelError):
    """An unknown collective kind or algorithm, or one the chosen model cannot run."""


class AstraConfigError(NetworkModelError):
    """An ASTRA-sim network YAML or system JSON is malformed or uses an unsupported feature."""


class UnitError(NetworkModelError):
    """A size, bandwidth or time string cannot be parsed."""
