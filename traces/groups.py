"""Process groups (communicators) of a trace set: METADATA nodes, comm_group.json, or a given file."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

from xsim.traces import pb
from xsim.traces.errors import TraceError, XsimError
from xsim.traces.io import JsonFileError, read_json
from xsim.traces.limits import json_depth_error, short_repr

ALL_RANKS_NAMES = frozenset({"", "0"})  # ASTRA-sim: pg_name "" or "0" means every rank
_LEADING_INT = re.compile(r"^\s*[+-]?\d+")
# ASTRA-sim reads a group name through std::stoi, which throws past a 32-bit int: a leading integer of more
# digits than this names no group (and never reaches int(), which refuses 4,300+ digits).
_MAX_NAME_DIGITS = 18


@dataclass(frozen=True)
class ProcessGroups:
    """pg_name -> member ranks (in group order). Names "" and "0" mean all ranks unless "0" is defined."""

    num_ranks: int
    groups: Mapping[str, tuple[int, ...]]
    source: str = "default"
    # Groups of the set's comm_group.json left out because they name ranks beyond this one file (a single
    # `<prefix>.<rank>.et` opened alone): a collective on one of them is an error naming the whole set.
    outside: tuple[str, ...] = ()

    @cached_property
    def all_ranks(self) -> tuple[int, ...]:
        """Every rank, one tuple shared by all collectives on "" or "0" (one per call was O(ranks^2))."""
        return tuple(range(self.num_ranks))

    def members(self, name: str) -> tuple[int, ...] | None:
        """Ranks of group `name`, or None when the name is unknown.

        Names are matched as ASTRA-sim does, through `std::stoi`: its leading integer, so "1.0" is group 1
        (the ASTRA-sim artifacts' T2D example writes such names).
        """
        if name in self.groups:
            return self.groups[name]
        if name in ALL_RANKS_NAMES:
            return self.all_ranks
        m = _LEADING_INT.match(name)
        if m and len(m.group(0).strip().lstrip("+-")) <= _MAX_NAME_DIGITS:
            key = str(int(m.group(0)))
            if key in self.groups:
                return self.groups[key]
            if key == "0":
                return self.all_ranks
        return None


def load_comm_groups(
    path: str | os.PathLike[str], num_ranks: int | None = None
) -> dict[str, tuple[int, ...]]:
    """Read ASTRA-sim's `{"<id>": [ranks...]}` communicator file (value "empty" = no groups)."""
    p = os.fspath(path)
    try:
        # Bounded like every JSON input (size, nesting: traces.limits), so a deep file is one line too.
        raw = read_json(p)
    except JsonFileError as exc:
        if exc.reason.startswith("cannot read"):
            raise TraceError(
                f"cannot read comm-groups file: {exc.reason.removeprefix('cannot read: ')}", path=p
            ) from None
        not_json = exc.reason.startswith(("invalid", "truncated", "not a UTF-8"))
        raise TraceError(
            f"comm-groups file {'is not JSON: ' if not_json else ''}{exc.reason}", path=p
        ) from None
    if raw == "empty":
        return {}
    if not isinstance(raw, dict):
        raise TraceError('comm-groups file must be an object {"<id>": [ranks, ...]}', path=p)
    out: dict[str, tuple[int, ...]] = {}
    for key, ranks in raw.items():
        if ranks == "empty":
            continue
        if not isinstance(ranks, list) or not all(
            isinstance(r, int) and not isinstance(r, bool) for r in ranks
        ):
            raise TraceError(f"group {key!r}: ranks must be a list of integers", path=p)
        if len(set(ranks)) != len(ranks):
            raise TraceError(f"group {key!r}: a rank appears twice", path=p)
        if num_ranks is not None and any(r < 0 or r >= num_ranks for r in ranks):
            raise TraceError(f"group {key!r}: ranks outside 0..{num_ranks - 1}", path=p)
        out[str(key)] = tuple(ranks)
    return out


def parse_metadata_node(
    node: pb.Node, num_ranks: int, where: str | None = None
) -> dict[str, tuple[int, ...]]:
    """Process groups of a PyTorch `## process_group:init ##` METADATA node (empty ranks = all ranks)."""
    text = node.inputs.values.strip()
    # The PyTorch converter stores Python's str() of a one-element list: ['[{"pg_name": ...}]'].
    if text.startswith("['") and text.endswith("']"):
        text = text[2:-2]
    elif text.startswith('["') and text.endswith('"]'):
        try:
            text = json.loads(text)[0]
        except (ValueError, IndexError, TypeError, KeyError, RecursionError):
            pass
    if not text:
        return {}
    try:
        entries = json.loads(text.replace('\\"', '"'))
    except ValueError as exc:  # JSONDecodeError, or an integer of 4,300+ digits
        raise TraceError(
            f"process_group:init metadata is not JSON: {str(exc)[:200]}", path=where, node_id=node.id
        ) from None
    except RecursionError:
        entries = None
        deep = "nesting too deep to parse"
    else:
        deep = json_depth_error(entries, "")
    if deep is not None:
        raise TraceError(
            f"process_group:init metadata: {deep.removeprefix(': ')}", path=where, node_id=node.id
        ) from None
    out: dict[str, tuple[int, ...]] = {}
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict) or "pg_name" not in e:
            continue
        if not isinstance(e["pg_name"], str | int):
            raise TraceError(
                f"process_group:init metadata: pg_name {short_repr(e['pg_name'])} is not a name",
                path=where,
                node_id=node.id,
            )
        name = str(e["pg_name"])
        ranks = e.get("ranks")
        if not (ranks is None or isinstance(ranks, list)) or not all(
            isinstance(r, int) and not isinstance(r, bool) for r in ranks or ()
        ):
            raise TraceError(
                f"process_group:init metadata: group {short_repr(e['pg_name'])}: ranks must be a list of "
                f"integers, got {short_repr(ranks)}",
                path=where,
                node_id=node.id,
            )
        ranks = ranks or list(range(num_ranks))
        out[name] = tuple(ranks)
    return out


def groups_from_nodes(
    nodes: Iterable[pb.Node], num_ranks: int, where: str | None = None
) -> dict[str, tuple[int, ...]]:
    """Groups declared by METADATA nodes of one rank's trace."""
    out: dict[str, tuple[int, ...]] = {}
    for n in nodes:
        if n.type == pb.METADATA_NODE and "process_group:init" in n.name:
            out.update(parse_metadata_node(n, num_ranks, where))
    return out


def resolve_groups(
    trace_files: Iterable[tuple[str, Iterable[pb.Node]]],
    num_ranks: int,
    *,
    comm_groups: str | os.PathLike[str] | None = None,
    directory: str | None = None,
    prefix: str | None = None,
) -> ProcessGroups:
    """Groups for a set: `comm_groups` file if given, else a groups file beside the set, plus METADATA nodes.

    Beside the set means `comm_group.json` (ASTRA-sim examples, `xsim gen`) or `<prefix>.json` (STG writes
    its communicator groups so). An explicit file wins; METADATA groups fill names the files do not define.
    """
    groups: dict[str, tuple[int, ...]] = {}
    source = "default"
    for path, nodes in trace_files:
        for name, ranks in groups_from_nodes(nodes, num_ranks, path).items():
            groups.setdefault(name, ranks)
            source = "metadata"
    file = comm_groups
    if file is None and directory is not None:
        candidate = os.path.join(directory, "comm_group.json")
        if os.path.isfile(candidate):
            file = candidate
    if file is None and prefix is not None and _looks_like_groups(prefix + ".json"):
        file = prefix + ".json"
    outside: tuple[str, ...] = ()
    if file is not None and comm_groups is None and num_ranks == 1:
        # One file of a set opened alone (`xsim trace info out/fig1/figure1.0.et`): the set's groups name
        # the other ranks too. Keep the groups this rank alone forms; remember the others.
        every = load_comm_groups(file, None)
        outside = tuple(sorted(k for k, v in every.items() if any(r != 0 for r in v)))
        groups.update({k: v for k, v in every.items() if k not in outside})
        source = os.fspath(file)
    elif file is not None:
        groups.update(load_comm_groups(file, num_ranks))
        source = os.fspath(file)
    return ProcessGroups(num_ranks=num_ranks, groups=groups, source=source, outside=outside)


def _looks_like_groups(path: str) -> bool:
    """True for a `{"<id>": [ranks]}` file (STG's `<prefix>.json`), False for anything else or unreadable."""
    try:
        raw = read_json(path)
    except XsimError:
        return False
    return isinstance(raw, dict) and all(
        isinstance(v, list) and all(isinstance(r, int) for r in v) for v in raw.values()
    )
