"""One check of the node attributes xsim reads, shared by `trace info`, `trace validate` and replay.

Each verb used to read attributes its own way: info and validate took the first of two `comm_size`, replay
the last; replay crashed on a NaN `comm_size` that validate called a type error and info skipped. Here is
the one rule (docs/trace-format.md, "Attribute rules"), applied node by node (`node_problem`) or, on the
replay's builder, to whole columns at once (`columns_first_problem`, a lint pass over a rank's columns):

* a name below appears at most once per node;
* integer names hold an integer oneof (or bool), never a float, string or list, and fit int64;
* sizes, FLOP counts and durations are non-negative and below documented bounds, so every sum the result
  tables hold stays exact;
* `pg_name` is a string (or integer) of at most MAX_PG_NAME_CHARS characters; `phase`/`reshard` strings;
  `is_cpu_op` a bool (or integer).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from xsim.traces import attrs as A
from xsim.traces.errors import AttributeTypeError, DuplicateAttributeError
from xsim.traces.limits import short_repr

INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)
# Durations: below 2^53 ns (104 days), the integers float64 holds exactly; the timeline writes
# microseconds as JSON doubles and the tables' float statistics divide them.
MAX_DURATION_NS = 1 << 53
MAX_DURATION_MICROS = -(-MAX_DURATION_NS // 1000)  # duration_micros at or past this is >= 2^53 ns
# Bytes of one collective, P2P message or op's tensors: 2^40 (1 TiB), ~4x the largest GPU memory
# (B300: 288 GB). A rank holds at most 2^23 nodes (traces.limits.DEFAULT_MAX_NODES), so a rank's byte
# total stays below 2^63 and the int64 `comm_bytes`/`bytes` columns never wrap.
MAX_BYTES = 1 << 40
# FLOPs of one op: below 2^53 (9e15), exact in the float64 the roofline divides them in; the largest
# GEMM of a 175B model step is ~1e13.
MAX_OPS = 1 << 53
# A process group name: PyTorch writes short counters ("0", "12") or descriptions; ASTRA-sim reads the
# leading integer with std::stoi. A 5,000-digit name once broke int() with a traceback.
MAX_PG_NAME_CHARS = 256

_INT_KINDS = A.INT_KINDS | {"bool_val"}
# name -> (lowest, highest) accepted integer value.
INT_RULES: dict[str, tuple[int, int]] = {
    A.COMM_TYPE: (INT64_MIN, INT64_MAX),
    A.COMM_SRC: (INT64_MIN, INT64_MAX),
    A.COMM_DST: (INT64_MIN, INT64_MAX),
    A.COMM_TAG: (INT64_MIN, INT64_MAX),
    A.STREAM: (INT64_MIN, INT64_MAX),
    "comm_group": (INT64_MIN, INT64_MAX),
    A.COMM_SIZE: (0, MAX_BYTES),
    A.TENSOR_SIZE: (0, MAX_BYTES),
    A.NUM_OPS: (0, MAX_OPS),
    A.DURATION_NS: (0, MAX_DURATION_NS - 1),
    A.LAYER: (INT64_MIN, INT64_MAX),
    A.MICRO_BATCH: (INT64_MIN, INT64_MAX),
    A.STAGE: (INT64_MIN, INT64_MAX),
    A.DEVICE_GROUP: (INT64_MIN, INT64_MAX),
    A.RING: (INT64_MIN, INT64_MAX),
    A.CHUNK: (INT64_MIN, INT64_MAX),
}
STR_NAMES = frozenset({A.PHASE, A.RESHARD})
CHECKED = frozenset(INT_RULES) | STR_NAMES | {A.PG_NAME, A.IS_CPU_OP}
_BOUND_TEXT = {MAX_BYTES: "2^40", MAX_OPS: "2^53", MAX_DURATION_NS - 1: "2^53 - 1", INT64_MAX: "2^63 - 1"}


def _int_problem(name: str, v: int) -> str | None:
    lo, hi = INT_RULES[name]
    if v < lo:
        return f"{name} {v} is negative" if lo == 0 else f"{name} {short_repr(v)} is below -2^63"
    if v > hi:
        return f"{name} {short_repr(v)} is past {_BOUND_TEXT[hi]} (docs/trace-format.md, attribute rules)"
    return None


def attr_problem(a: Any) -> str | None:
    """What is wrong with one attribute of a checked name, or None."""
    name = a.name
    kind = a.WhichOneof("value")
    value = getattr(a, kind) if kind is not None else None
    shown = "no value" if kind is None else kind
    if name in INT_RULES:
        if kind not in _INT_KINDS:
            return f"{name} {short_repr(value)} is not an integer (attribute {name!r} holds {shown})"
        return _int_problem(name, int(value))
    if name == A.PG_NAME:
        if kind == "string_val":
            if len(value) > MAX_PG_NAME_CHARS:
                return f"pg_name of {len(value):,} characters (at most {MAX_PG_NAME_CHARS})"
            return None
        if kind in A.INT_KINDS:
            return None
        return f"pg_name {short_repr(value)} is not a group name (attribute 'pg_name' holds {shown})"
    if name == A.IS_CPU_OP:
        if kind in _INT_KINDS:
            return None
        return f"is_cpu_op {short_repr(value)} is not a boolean (attribute 'is_cpu_op' holds {shown})"
    if name in STR_NAMES and kind != "string_val":
        return f"{name} {short_repr(value)} is not a string (attribute {name!r} holds {shown})"
    return None


def node_problem(node: Any) -> str | None:
    """The first problem of a node's checked attributes or its duration, or None when it has none."""
    found = _first_problem(node)
    return None if found is None else found[0]


def _first_problem(node: Any) -> tuple[str, bool] | None:
    """(message, is a duplicate name) of the node's first problem, or None."""
    if node.duration_micros >= MAX_DURATION_MICROS:
        return f"duration_micros {node.duration_micros} is 2^53 ns or longer", False
    attrs = node.attr
    if not len(attrs):
        return None
    seen: set[str] = set()
    # Slicing a upb repeated field is ~5x faster than iterating it (replay/program.py measures the same).
    for a in attrs[:]:
        name = a.name
        if name not in CHECKED:
            continue
        if name in seen:
            return A.duplicate_attr_error(name).message, True
        seen.add(name)
        rule = INT_RULES.get(name)
        if rule is not None:
            kind = a.WhichOneof("value")
            if kind in _INT_KINDS and rule[0] <= getattr(a, kind) <= rule[1]:
                continue  # the common case, without building a message
        problem = attr_problem(a)
        if problem is not None:
            return problem, False
    return None


def check_node(
    node: Any, *, path: str | None = None, rank: int | None = None, index: int | None = None
) -> None:
    """Raise the one error for a node with a problem: AttributeTypeError, or DuplicateAttributeError."""
    found = _first_problem(node)
    if found is None:
        return
    cls = DuplicateAttributeError if found[1] else AttributeTypeError
    raise cls(found[0], path=path, rank=rank, node_index=index, node_id=node.id)


def columns_problem(
    columns: Any, sel: Any, duration_micros: np.ndarray, int_ok: np.ndarray, string_field: int
) -> bool:
    """True when some node of decoded columns breaks a rule (the replay's builder checks a whole batch of
    files with this once; when none breaks it, no rank of the batch needs its lint pass).

    columns: attribute name -> column with `kind` (value field number per node, -1 absent, 0 no value),
    `value` (int64) and `strings`; sel: the nodes in those columns; int_ok: a lookup by kind + 1 that is
    True for the integer and bool fields. A yes/no with early exits (the common answer, no, costs a few
    reductions per name); `columns_first_problem` locates the node when the answer is yes.
    """
    if len(duration_micros) and int(duration_micros.max()) >= MAX_DURATION_MICROS:
        return True
    for name in CHECKED.intersection(columns):
        col = columns[name]
        k = col.kind[sel]
        present = k >= 0
        if not present.any():
            continue
        k = k[present]
        if name in INT_RULES or name == A.IS_CPU_OP:
            if not int_ok[k + 1].all():
                return True  # a string, or no value
            lo, hi = INT_RULES.get(name, (INT64_MIN, INT64_MAX))
            if lo > INT64_MIN or hi < INT64_MAX:
                v = col.value[sel][present]
                if int(v.min()) < lo or int(v.max()) > hi:
                    return True
        elif name == A.PG_NAME:
            if not (int_ok[k + 1] | (k == string_field)).all():
                return True
            if any(len(x) > MAX_PG_NAME_CHARS for x in col.strings):
                return True
        elif not (k == string_field).all():
            return True
    return False


def columns_first_problem(
    columns: Any, sel: Any, duration_micros: np.ndarray, int_ok: np.ndarray, string_field: int
) -> int | None:
    """The first node (an index into `sel`) of one rank's columns that breaks a rule, or None: the lint
    pass of the replay's builder, which then names the problem with `node_problem` on that node.

    Arguments as `columns_problem`'s. Columns decoded from protobuf messages may also hold kinds the
    decoder declines (floats, lists, a name twice: traces/node_columns.py's F_OTHER); every one of those
    breaks the rule, and none is an integer, bool or string kind, so the checks below catch them.
    """
    bad = np.asarray(duration_micros >= MAX_DURATION_MICROS)
    for name in CHECKED.intersection(columns):
        col = columns[name]
        k = col.kind[sel]
        present = k >= 0
        if not present.any():
            continue
        if name in INT_RULES or name == A.IS_CPU_OP:
            is_int = int_ok[k + 1]
            bad = bad | (present & ~is_int)
            lo, hi = INT_RULES.get(name, (INT64_MIN, INT64_MAX))
            if lo > INT64_MIN or hi < INT64_MAX:
                v = col.value[sel]
                bad = bad | (present & is_int & ((v < lo) | (v > hi)))
        elif name == A.PG_NAME:
            is_str = k == string_field
            bad = bad | (present & ~(int_ok[k + 1] | is_str))
            long = np.asarray([len(x) > MAX_PG_NAME_CHARS for x in col.strings] + [False], dtype=bool)
            if long.any():
                bad = bad | (is_str & long[np.where(is_str, col.value[sel], len(col.strings))])
        else:
            bad = bad | (present & (k != string_field))
    hit = np.flatnonzero(bad)
    return int(hit[0]) if len(hit) else None
