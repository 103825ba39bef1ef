"""One rank's nodes as columns in the program builder's row order (ascending node id): what the builder,
its lint pass and the compute models (`durations(rank, columns, rows)`) read."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from xsim.traces import pb
from xsim.traces.attrs import DURATION_NS, IS_CPU_OP
from xsim.traces.columnar import F_BOOL, F_INT32, F_INT64, F_STRING, F_UINT32, F_UINT64, RankColumns

# Lookup by attribute kind + 1 (kind -1 = absent): integer value fields, and those plus bool.
IS_INT = np.zeros(65, dtype=bool)
IS_INT[[f + 1 for f in (F_INT32, F_INT64, F_UINT32, F_UINT64)]] = True
IS_INT_OR_BOOL = IS_INT.copy()
IS_INT_OR_BOOL[F_BOOL + 1] = True


# A record of numpy arrays: no generated eq, hash or repr (why: traces/columnar.py, AttrColumn).
@dataclass(eq=False, repr=False)
class RankView:
    """Rank `rank`'s slice of decoded columns (file `f` of `cols`), rows in ascending node id.

    `memo` is the builder's, shared by every rank it builds: compute models keep their per-build caches
    there (keyed by the model), so nothing outlives the build.
    """

    rank: int
    path: str
    cols: RankColumns
    sel: slice | np.ndarray  # the rows in `cols`: a slice, or indices when the file is not sorted by id
    ids: np.ndarray
    names: list[str]
    node_type: np.ndarray
    exact: bool  # the builder's rule for recorded durations (ReplayConfig.durations)
    memo: dict = field(default_factory=dict)
    _recorded: dict = field(default_factory=dict, repr=False)

    @property
    def n(self) -> int:
        """Rows (nodes) of the rank."""
        return len(self.ids)

    def kind(self, name: str) -> np.ndarray:
        """Per row: the attribute's value field number, 0 = present without a value, -1 = absent."""
        c = self.cols.attrs.get(name)
        return np.full(self.n, -1, dtype=np.int8) if c is None else c.kind[self.sel]

    def value(self, name: str) -> np.ndarray:
        """Per row: the attribute's integer / bool value (string: an index into its column's strings)."""
        c = self.cols.attrs.get(name)
        return np.zeros(self.n, dtype=np.int64) if c is None else c.value[self.sel]

    def at(self, rows: np.ndarray) -> np.ndarray:
        """Rows as indices into `cols`."""
        return (self.sel.start + rows) if isinstance(self.sel, slice) else self.sel[rows]

    def node(self, row: int) -> pb.Node:
        """Row `row` as a protobuf message (scalar compute models, error messages)."""
        return self.cols.node(int(self.at(np.asarray([row]))[0]))

    def recorded_as(self, exact: bool) -> np.ndarray:
        """ASTRA-sim's replay rule per row: duration_micros x 1000 ns, 0 -> 1; with `exact`, xsim's exact
        `duration_ns` attribute (an integer kind, >= 0) first (replay/compute.py, replay_duration_ns)."""
        got = self._recorded.get(exact)
        if got is None:
            rec = self.cols.duration_micros[self.sel] * 1000
            if exact:
                k = self.kind(DURATION_NS)
                v = self.value(DURATION_NS)
                rec = np.where((k > 0) & (k != F_STRING) & (k != F_BOOL) & (v >= 0), v, rec)
            rec[rec == 0] = 1
            got = self._recorded[exact] = rec
        return got

    @property
    def recorded(self) -> np.ndarray:
        """Recorded durations by the builder's rule."""
        return self.recorded_as(self.exact)

    def is_cpu(self) -> np.ndarray:
        """Per row: `is_cpu_op` true (an integer or bool kind, non-zero)."""
        k = self.kind(IS_CPU_OP)
        return IS_INT_OR_BOOL[k + 1] & (self.value(IS_CPU_OP) != 0)
