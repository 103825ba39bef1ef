"""Import real PyTorch profiles (host execution trace + Kineto trace per rank) as a Chakra trace set.

    result = import_pytorch(["et.0.json.gz", "et.1.json.gz"], ["kineto.0.json.gz", "kineto.1.json.gz"])
    result.write("out/run")          # out/run.0.et, out/run.1.et, out/comm_group.json
    for r in result.ranks: print(r.rank, r.match_rate, r.method)

Only the trace files and the standard library/numpy are needed (no torch). See docs/pytorch-import.md.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xsim.tracegen.importers.pytorch.build import (
    RankGraph,
    add_comm_tails,
    build_rank,
    first_start_ns,
    to_nodes,
)
from xsim.tracegen.importers.pytorch.errors import PyTorchImportError
from xsim.tracegen.importers.pytorch.hostet import PG_INIT, HostTrace, load_host_trace
from xsim.tracegen.importers.pytorch.link import Link, link
from xsim.traces import attrs as A
from xsim.traces import pb
from xsim.traces.kineto import KinetoTrace, load_kineto
from xsim.traces.limits import short_repr
from xsim.traces.outputs import atomic_write_text
from xsim.traces.traceset import write_trace_set

__all__ = ["ImportResult", "RankImport", "PyTorchImportError", "import_pytorch", "MIN_MATCH_RATE"]

# Below this share of matched host ops the Kineto file does not describe the host trace's run (another
# rank or run); the real pairs we know match 46% (ResNet, whose Kineto comes from a run without DDP) or more.
MIN_MATCH_RATE = 0.10


@dataclass(frozen=True)
class RankImport:
    """Per-rank outcome of an import."""

    rank: int
    et_path: str
    kineto_path: str
    schema: str
    method: str  # how host ops were joined to Kineto: rf_id | external_id | order
    matched: int
    eligible: int
    nodes: int
    gpu_ops: int
    dropped_gpu_ops: int
    warnings: tuple[str, ...]

    @property
    def match_rate(self) -> float:
        """Matched share of host ops."""
        return self.matched / self.eligible if self.eligible else 0.0


@dataclass
class ImportResult:
    """Per-rank nodes, process groups and match statistics of an import."""

    nodes: dict[int, list[pb.Node]]
    comm_groups: dict[str, tuple[int, ...]]
    ranks: list[RankImport]
    metadata: pb.GlobalMetadata

    def write(self, prefix: str | os.PathLike[str], identity: Any = None) -> list[str]:
        """Write `<prefix>.<rank>.et` for every rank and comm_group.json beside them (each file's metadata
        carrying `identity`, a traces.setid.SetIdentity, when given)."""
        from xsim.traces.setid import stamp

        prefix = os.fspath(prefix)
        meta = self.metadata if identity is None else stamp(self.metadata, identity)
        folder = os.path.dirname(prefix) or "."
        numeric = {k: list(v) for k, v in self.comm_groups.items() if k.isdigit()}
        try:
            os.makedirs(folder, exist_ok=True)
            paths = write_trace_set(prefix, self.nodes, meta)
            if numeric:
                path = os.path.join(folder, "comm_group.json")
                atomic_write_text(path, json.dumps(numeric, sort_keys=True) + "\n")
                paths.append(path)
        except OSError as exc:
            raise PyTorchImportError(
                f"cannot write the trace set: {exc.strerror or exc}", path=prefix
            ) from None
        return paths


def _ranks(entry: dict, world: int, path: str) -> tuple[int, ...]:
    ranks = entry.get("ranks") or list(range(world))
    name = short_repr(entry.get("pg_name"))
    if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        raise PyTorchImportError(f"process group {name}: ranks must be integers", path=path)
    if len(set(ranks)) != len(ranks):
        raise PyTorchImportError(f"process group {name}: a rank appears twice", path=path)
    return tuple(ranks)


def _groups(
    hosts: Sequence[HostTrace], kinetos: Sequence[KinetoTrace], world: int
) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """Process groups by name, and the file that defined each."""
    out: dict[str, tuple[int, ...]] = {}
    source: dict[str, str] = {}
    for k in kinetos:
        for c in k.pg_config:
            out.setdefault(str(c.get("pg_name")), _ranks(c, world, k.path))
            source.setdefault(str(c.get("pg_name")), k.path)
    for h in hosts:
        for e in h.process_groups:
            out.setdefault(str(e["pg_name"]), _ranks(e, world, h.path))
            source.setdefault(str(e["pg_name"]), h.path)
    return out, source


def _check_group_ranks(groups: dict[str, tuple[int, ...]], source: dict[str, str], world: int) -> None:
    """Every group's ranks lie in the run: the run's ranks are the pairs given, and a group naming others
    would import fine and fail only at replay."""
    for name in sorted(groups):
        outside = [r for r in groups[name] if not 0 <= r < world]
        if outside:
            raise PyTorchImportError(
                f"process group {short_repr(name)} names rank {short_repr(outside[0], 24)}, outside this "
                f"run's ranks 0..{world - 1} ({world} trace pair(s) given: import every rank of the run together)",
                path=source[name],
            )


def _default_pg(groups: dict[str, tuple[int, ...]], world: int) -> str:
    """The group a collective without a recorded group name ran on: the default group (all ranks)."""
    full = sorted(name for name, r in groups.items() if sorted(r) == list(range(world)))
    return "0" if "0" in full else (full[0] if full else "")


def _rank_order(kinetos: Sequence[KinetoTrace]) -> list[int]:
    ranks = [k.rank for k in kinetos]
    if all(r is not None for r in ranks) and sorted(ranks) == list(range(len(ranks))):
        return [int(r) for r in ranks]  # type: ignore[arg-type]
    if len(ranks) > 1 and all(r is not None for r in ranks) and len(set(ranks)) != len(ranks):
        dup = [r for r, n in Counter(ranks).items() if n > 1][0]
        paths = [k.path for k in kinetos if k.rank == dup]
        raise PyTorchImportError(
            f"rank {dup} appears in several Kineto files ({', '.join(paths[1:])})", path=paths[0]
        )
    return list(range(len(kinetos)))  # file order


def _check_pair(h: HostTrace, k: KinetoTrace, rank: int, rate: float, pid: int | None) -> list[str]:
    warnings = []
    if rate < MIN_MATCH_RATE:
        raise PyTorchImportError(
            f"only {rate:.1%} of the host trace's ops match this Kineto trace (from another rank or run?);"
            f" host trace {h.path}",
            path=k.path,
            rank=rank,
        )
    kpids = {e.pid for e in k.cpu_ops[:50]}
    if pid is not None and kpids and pid not in kpids:
        msg = (
            f"Kineto was recorded by process {sorted(map(str, kpids))[0]}, the host trace by {pid}: "
            "not the same process"
        )
        if (k.world_size or 1) > 1:
            raise PyTorchImportError(
                f"{msg} (another rank or run?); host trace {h.path}", path=k.path, rank=rank
            )
        warnings.append(msg + "; timings come from another run of the same program")
    return warnings


def import_pytorch(et_paths: Sequence[str], kineto_paths: Sequence[str]) -> ImportResult:
    """Import one (host ET, Kineto) pair per rank; ranks from Kineto distributedInfo, else file order."""
    hosts, kinetos = _load_pairs(et_paths, kineto_paths)
    ranks = _rank_order(kinetos)
    world = len(hosts)
    for k in kinetos:
        if k.world_size is not None and k.world_size != world and world > 1:
            raise PyTorchImportError(
                f"Kineto says world_size {k.world_size} but {world} rank pairs were given", path=k.path
            )
    groups, group_source = _groups(hosts, kinetos, world)
    default_pg = _default_pg(groups, world)
    graphs: dict[int, tuple[RankGraph, HostTrace, list[str]]] = {}
    for h, k, r in zip(hosts, kinetos, ranks, strict=True):
        lk = link(h, k)
        warnings = _check_pair(h, k, r, lk.rate, h.pid)
        warnings += _window_warning(k, lk)
        g = build_rank(r, h, k, lk)
        graphs[r] = (g, h, warnings + g.warnings)
    _check_group_ranks(groups, group_source, world)
    _match_p2p(graphs, groups.get(default_pg))
    tails = add_comm_tails([graphs[r][0] for r in sorted(graphs)])
    nodes: dict[int, list[pb.Node]] = {}
    infos = []
    pg_meta = _pg_metadata_node(groups, world)
    # Ranks of one run share the host clock (one machine; Kineto timestamps of several hosts are only as
    # aligned as their clocks): the earliest first op is the common origin.
    origin = min(first_start_ns(g) for g, _, _ in graphs.values()) if world > 1 else None
    for r in sorted(graphs):
        g, h, warnings = graphs[r]
        ns = to_nodes(g, h, default_pg, groups.get(default_pg), origin)
        nodes[r] = [pg_meta, *ns]
        infos.append(
            RankImport(
                rank=r,
                et_path=h.path,
                kineto_path=kinetos[ranks.index(r)].path,
                schema=h.schema,
                method=g.link.method,
                matched=len(g.link.matches),
                eligible=g.link.eligible,
                nodes=len(ns),
                gpu_ops=sum(1 for v in g.vertices if v.kind in ("gpu",) or (v.kind == "comm" and v.stream)),
                dropped_gpu_ops=g.dropped_gpu_ops,
                warnings=tuple(warnings),
            )
        )
    meta = _global_metadata(hosts[0].schema, tails, graphs, kinetos, ranks, origin)
    return ImportResult(nodes=nodes, comm_groups=groups, ranks=infos, metadata=meta)


def _load_pairs(
    et_paths: Sequence[str], kineto_paths: Sequence[str]
) -> tuple[list[HostTrace], list[KinetoTrace]]:
    """Every rank's host trace and Kineto trace, read; one of each per rank."""
    if not et_paths:
        raise PyTorchImportError("no host execution trace given")
    hosts = [load_host_trace(p) for p in et_paths]
    if not kineto_paths:
        h = hosts[0]
        raise PyTorchImportError(
            f"host-only trace (schema {h.schema}, {len(h.ops)} ops) is rejected: host execution traces carry"
            " no op durations (times come from Kineto); pass each rank's Kineto trace with --kineto",
            path=h.path,
        )
    if len(et_paths) != len(kineto_paths):
        raise PyTorchImportError(
            f"{len(et_paths)} host traces but {len(kineto_paths)} Kineto traces: give one pair per rank"
        )
    return hosts, [load_kineto(p) for p in kineto_paths]


def _global_metadata(
    schema: str,
    tails: int,
    graphs: dict[int, tuple[RankGraph, HostTrace, list[str]]],
    kinetos: list[KinetoTrace],
    ranks: list[int],
    origin: int | None,
) -> pb.GlobalMetadata:
    """The set's GlobalMetadata: producer, device, recorded GPU, and who recorded each rank from when."""
    meta = pb.GlobalMetadata(version="0.0.4")
    A.set_attr(meta, "schema", schema)
    A.set_attr(meta, "producer", "xsim import pytorch")
    A.set_attr(meta, "comm_tails", tails)
    A.set_attr(meta, "pytorch_device", "cuda" if any(g.gpu_run for g, _, _ in graphs.values()) else "cpu")
    # The recorded GPU (Kineto deviceProperties), so a what-if needs no --from-gpu and can check one.
    names = sorted({k.device_name for k in kinetos if k.device_name})
    if names:
        A.set_attr(meta, "recorded_device", names[0] if len(names) == 1 else " | ".join(names))
    # Who recorded each rank (read by `xsim validate` to check that --real is this run, issue 26 item 3):
    # the Kineto process id and the absolute ns that `measured_start_ns` counts from, per rank in order.
    A.set_attr(
        meta, "kineto_pids", [kineto_pid(kinetos[ranks.index(r)]) for r in sorted(graphs)], "int64_list"
    )
    A.set_attr(
        meta,
        "measured_origin_ns",
        [origin if origin is not None else first_start_ns(graphs[r][0]) for r in sorted(graphs)],
        "int64_list",
    )
    return meta


def kineto_pid(k: KinetoTrace) -> int:
    """The process that recorded a Kineto trace: its CPU ops' most common integer pid (-1 when none)."""

    pids = Counter(e.pid for e in k.cpu_ops if isinstance(e.pid, int) and not isinstance(e.pid, bool))
    return pids.most_common(1)[0][0] if pids else -1


def _window_warning(k: KinetoTrace, lk: Link) -> list[str]:
    """Warn when the matched ops are spread over many more Kineto ops than matched (several iterations)."""
    if not lk.matches:
        return []
    t0 = min(e.ts for e in lk.matches.values())
    t1 = max(e.end for e in lk.matches.values())
    inside = sum(1 for e in k.cpu_ops if t0 <= e.ts <= t1)
    if inside > 1.5 * len(lk.matches):
        return [
            f"the {len(lk.matches)} matched ops span {inside} Kineto CPU ops: the Kineto trace holds other"
            " iterations or another program between them, so op times are approximate"
        ]
    return []


def _pg_metadata_node(groups: dict[str, tuple[int, ...]], world: int) -> pb.Node:
    """A `## process_group:init ##` METADATA node in the form ASTRA-sim and traces.groups parse."""
    entries = [
        {"pg_name": name, "ranks": list(ranks), "group_size": len(ranks)}
        for name, ranks in sorted(groups.items(), key=lambda kv: (len(kv[0]), kv[0]))
    ]
    node = A.make_node(0, PG_INIT, pb.METADATA_NODE, attrs={A.IS_CPU_OP: True})
    node.inputs.values = json.dumps(entries)
    return node


def _match_p2p(
    graphs: dict[int, tuple[RankGraph, HostTrace, list[str]]], group: tuple[int, ...] | None
) -> None:
    """Pair every send with a recv on its peer (k-th send src->dst with k-th recv, same tag); sizes must agree."""
    sends: dict[tuple[int, int, int], list[tuple[int, int]]] = defaultdict(list)
    recvs: dict[tuple[int, int, int], list[tuple[int, int]]] = defaultdict(list)

    def glob(peer: int | None) -> int | None:
        if peer is None or group is None or not 0 <= peer < len(group):
            return peer
        return group[peer]

    for r, (g, _, _) in graphs.items():
        for vi in g.p2p:
            v = g.vertices[vi]
            peer = glob(v.peer)
            if peer is None:
                continue
            if v.comm.p2p == "send":
                sends[(r, peer, v.tag)].append((v.comm_bytes, v.id))
            else:
                recvs[(peer, r, v.tag)].append((v.comm_bytes, v.id))
    by_id = {r: {v.id: v for v in g.vertices} for r, (g, _, _) in graphs.items()}
    for key in sorted(set(sends) | set(recvs)):
        s, rv = sends.get(key, []), recvs.get(key, [])
        src, dst, tag = key
        if src not in graphs or dst not in graphs:
            continue  # the peer's trace was not given: nothing to check
        if len(s) != len(rv):
            raise PyTorchImportError(
                f"{len(s)} sends from rank {src} to rank {dst} (tag {tag}) but {len(rv)} matching recvs",
                path=graphs[dst][1].path,
                rank=dst,
            )
        for (sb, sid), (rb, rid) in zip(s, rv, strict=True):
            sv, rvx = by_id[src][sid], by_id[dst][rid]
            if sv.issue_ts is not None:
                # gloo: the data left when c10d::send was called and was in when the recv's work ended;
                # measured replay times the transfer by the send's duration from that issue.
                sv.measured = sv.dur
                sv.dur = max(0, rvx.ts + rvx.dur - sv.issue_ts)
            if sb != rb:
                raise PyTorchImportError(
                    f"send node {sid} of rank {src} carries {sb} bytes but the matching recv node {rid} of"
                    f" rank {dst} {rb} bytes (tag {tag})",
                    path=graphs[dst][1].path,
                    rank=dst,
                )
