"""What a trace set holds: ranks, nodes by type, collectives by type and bytes, P2P, process groups."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from xsim.traces import attrs as A
from xsim.traces import pb
from xsim.traces.attrcheck import check_node
from xsim.traces.errors import AttributeTypeError
from xsim.traces.groups import ProcessGroups
from xsim.traces.stream import EtFile


@dataclass(frozen=True)
class TraceSummary:
    """Counts over every rank of a set; `to_json()` is the `xsim trace info --json` object."""

    prefix: str
    ranks: int
    nodes: int
    nodes_per_rank: tuple[int, ...]
    nodes_by_type: dict[str, int]
    # comm type -> {"count": nodes over all ranks, "instances": collectives as the replay counts them (one per
    # group and issue, matched across its members), "bytes": summed over the nodes}
    collectives: dict[str, dict[str, int]]
    p2p: dict[str, int]  # sends, recvs, send_bytes
    compute_micros: int
    process_groups: dict[str, list[int]]
    groups_source: str
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict with stable keys."""
        return {
            "prefix": self.prefix,
            "ranks": self.ranks,
            "nodes": self.nodes,
            "nodes_per_rank": list(self.nodes_per_rank),
            "nodes_by_type": dict(self.nodes_by_type),
            "collectives": {k: dict(v) for k, v in self.collectives.items()},
            # The replay summary's `num_collectives`: one per collective of a group, not one per rank.
            "num_collectives": sum(v["instances"] for v in self.collectives.values()),
            "p2p": dict(self.p2p),
            "compute_micros": self.compute_micros,
            "process_groups": {k: list(v) for k, v in self.process_groups.items()},
            "process_groups_source": self.groups_source,
            "metadata": self.metadata,
        }


def summarize(prefix: str, files: Sequence[EtFile], groups: ProcessGroups) -> TraceSummary:
    """Count nodes, collectives and P2P traffic over the files of a set."""
    by_type: Counter[str] = Counter()
    colls: dict[str, dict[str, int]] = {}
    p2p = {"sends": 0, "recvs": 0, "send_bytes": 0}
    compute = 0
    # (comm type, group) -> nodes per rank: a collective of a group is one instance however many members
    # issue it, so instances per group are the most any one rank issues (the replay matches by order).
    per_rank: dict[tuple[str, str], Counter[int]] = {}
    for rank, et in enumerate(files):
        for n in et.nodes:
            by_type[pb.node_type_name(n.type)] += 1
            # The rule validate and replay apply (traces.attrcheck): info must not count what they refuse.
            check_node(n, path=et.path, rank=rank if len(files) > 1 else None)
            try:
                if n.type == pb.COMM_COLL_NODE:
                    name = pb.comm_type_name(A.get_int(n, A.COMM_TYPE, pb.ALL_REDUCE))
                    entry = colls.setdefault(name, {"count": 0, "bytes": 0})
                    entry["count"] += 1
                    entry["bytes"] += A.get_int(n, A.COMM_SIZE, 0)
                    pg = A.get_str(n, A.PG_NAME, "")
                    per_rank.setdefault((name, pg), Counter())[rank] += 1
                elif n.type == pb.COMM_SEND_NODE:
                    p2p["sends"] += 1
                    p2p["send_bytes"] += A.get_int(n, A.COMM_SIZE, 0)
                elif n.type == pb.COMM_RECV_NODE:
                    p2p["recvs"] += 1
                elif n.type == pb.COMP_NODE:
                    compute += n.duration_micros
            except AttributeTypeError:
                continue  # reported by `xsim trace validate`; info only counts
    for (name, _), counts in per_rank.items():
        entry = colls[name]
        entry["instances"] = entry.get("instances", 0) + max(counts.values())
    meta: dict[str, Any] = {}
    if files:
        m = files[0].metadata
        if m.version:
            meta["version"] = m.version
        meta.update({k: v for k, v in A.attr_dict(m).items() if isinstance(v, str | int | float | bool)})
    return TraceSummary(
        prefix=prefix,
        ranks=len(files),
        nodes=sum(len(et.nodes) for et in files),
        nodes_per_rank=tuple(len(et.nodes) for et in files),
        nodes_by_type=dict(sorted(by_type.items())),
        collectives={
            k: {"count": v["count"], "instances": v["instances"], "bytes": v["bytes"]}
            for k, v in sorted(colls.items())
        },
        p2p=p2p,
        compute_micros=compute,
        process_groups={k: list(v) for k, v in sorted(groups.groups.items())},
        groups_source=groups.source,
        metadata=meta,
    )
