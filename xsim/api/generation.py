"""Make trace sets: generate from a deployment spec, plan, rewrite a generated set, import PyTorch runs."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from traces.io import DEPLOYMENT_FILE

SpecSource = str | os.PathLike[str] | Mapping[str, Any]


@dataclass(frozen=True)
class GenerateOptions:
    """What `generate` writes and how."""

    out: str  # output folder (created if missing)
    name: str | None = None  # file prefix (default: the spec's name)
    rewrite: bool = True  # the planner's rewrite: heterogeneous gradient sync and pipeline resharding
    force: bool = False  # replace another set's trace files in `out` (default: refuse to mix two sets)
    gpu_file: str | None = None  # hypothetical GPUs (tracegen.spec.read_gpu_file), recorded when used
    # Every rank's file; default: a symmetric plan writes its DP replica 0 and classes.json (compact set).
    all_ranks: bool = False


@dataclass(frozen=True)
class Generated:
    """A generated trace set on disk."""

    deployment: Any  # the resolved tracegen Deployment (also written as deployment.json)
    paths: tuple[str, ...]  # per-rank .et files (comm_group.json, deployment.json, memory.json beside them)
    nodes: int  # nodes over the ranks written
    memory: tuple = ()  # tracegen.memory.RankMemory per rank (also written as memory.json)
    notes: tuple[str, ...] = ()  # what hypothetical GPUs borrow from known ones (tracegen.spec.gpu_notes)
    classes: Any = None  # traces.classes.RankClasses of a compact set (classes.json), else None


def load_spec(spec: SpecSource, max_bytes: int | None = None, gpu_file: str | None = None):
    """A deployment spec (.yaml/.toml/.json path or a mapping) as a checked tracegen Deployment (max_bytes:
    the file's size limit, default the spec limit; gpu_file: hypothetical GPUs it may use)."""
    from tracegen.spec import load_spec as load
    from tracegen.spec import read_gpu_file

    return load(spec, max_bytes, read_gpu_file(gpu_file) if gpu_file else None)


def check_cluster(dep, spec_path: str) -> None:
    """Build a spec's explicit cluster now, so a typo in it fails here, naming the spec, not at replay."""
    from netmodels.cluster import build_cluster
    from netmodels.errors import NetworkModelError
    from tracegen.errors import SpecError
    from tracegen.spec import num_ranks

    if dep.cluster_derived:
        return  # derived from the device groups; V100-only sets have no preset and are replayed with --topology
    try:
        topo = build_cluster(json.loads(dep.cluster_json), need=num_ranks(dep))
    except NetworkModelError as exc:
        raise SpecError(f"cluster: {exc}", path=spec_path) from None
    if topo.num_ranks < num_ranks(dep):
        raise SpecError(
            f"cluster: {topo.num_ranks} ranks, but the device groups have {num_ranks(dep)}", path=spec_path
        )


def generate(spec, options: GenerateOptions) -> Generated:
    """Per-rank Chakra traces, comm_group.json, deployment.json and memory.json of a spec (a SpecSource or
    an already resolved tracegen Deployment), written to options.out."""
    from replay.progress import status
    from tracegen.compact import rank_classes
    from tracegen.deployment_pb2 import Deployment
    from tracegen.errors import GeneratorError, SpecError
    from tracegen.memory import deployment_memory, write_memory
    from tracegen.spec import NAME_RE, gpu_notes, num_ranks, save_deployment
    from tracegen.workload import generate as make
    from traces.outputs import prepare_set_folder

    where = spec if isinstance(spec, str | os.PathLike) else "spec"
    if isinstance(spec, Deployment):
        dep = Deployment()
        dep.CopyFrom(spec)  # the caller's message stays as it was (options.name may rename the copy)
    else:
        dep = load_spec(spec, gpu_file=options.gpu_file)
    check_cluster(dep, os.fspath(where))
    if options.name:
        if not NAME_RE.match(options.name):
            raise SpecError(f"--name {options.name!r} is not a file-name-safe word (letters, digits, . _ -)")
        dep.name = options.name
    # Before any work: a folder holding another set is refused (or, with force, cleared), never mixed.
    prepare_set_folder(options.out, dep.name, num_ranks(dep), options.force)
    classes = None if options.all_ranks else rank_classes(dep, rewrite=options.rewrite)
    only = None if classes is None else classes.written
    try:
        with status("generating traces"):
            bundle = make(dep, rewrite=options.rewrite, only=only)
    except GeneratorError as exc:
        raise GeneratorError(f"{os.fspath(where)}: {exc}") from None
    try:
        with status("writing traces"):
            paths = bundle.write(options.out, dep.name)
        save_deployment(dep, os.path.join(options.out, DEPLOYMENT_FILE))
        # Memory per rank beside the traces (the replay summary reads it; docs/decide.md).
        mem = deployment_memory(dep)
        write_memory(mem, options.out)
        _record_classes(options.out, dep.name, classes)
    except OSError as exc:
        raise GeneratorError(f"{options.out}: cannot write traces: {exc.strerror or exc}") from None
    return Generated(dep, tuple(paths), bundle.node_count(), tuple(mem), tuple(gpu_notes(dep)), classes)


def _record_classes(out: str, name: str, classes) -> None:
    """Write a compact set's classes.json and drop this set's files of ranks it does not write (an earlier
    `--all-ranks` run's); a set with every rank drops an earlier compact run's classes.json."""
    from traces.classes import CLASSES_FILE, write_classes

    if classes is None:
        stale = os.path.join(out, CLASSES_FILE)
        if os.path.isfile(stale):
            os.unlink(stale)
        return
    write_classes(out, classes)
    kept = set(classes.written)
    for r in range(classes.num_ranks):
        if r not in kept:
            for ext in (".et", ".json"):
                p = os.path.join(out, f"{name}.{r}{ext}")
                if os.path.isfile(p) and not os.path.islink(p):
                    os.unlink(p)


def plan(spec: SpecSource):
    """The heterogeneity-aware plan of a spec (DP groups, rings, chunks, barrier groups, boundaries)."""
    from tracegen.planner import build_plan

    return build_plan(load_spec(spec))


def rewrite(
    traces: str,
    out: str,
    *,
    spec: SpecSource | None = None,
    reshard: str | None = None,
    barriers: bool = True,
):
    """Rewrite a set generated without the rewrite; writes it with deployment.json; returns the summary."""
    from tracegen.planner.rewrite import rewrite_trace_set
    from tracegen.spec import save_deployment
    from traces.errors import XsimError

    cap = None
    if spec is None:
        from traces.limits import max_set_metadata_bytes
        from traces.traceset import discover

        folder = traces if os.path.isdir(traces) else os.path.dirname(traces) or "."
        spec = os.path.join(folder, DEPLOYMENT_FILE)
        if not os.path.isfile(spec):
            raise XsimError(f"{traces}: no {DEPLOYMENT_FILE} beside the traces: pass --spec")
        cap = max_set_metadata_bytes(discover(traces).num_ranks)  # the set's own: grows with it
    dep = load_spec(spec, cap)
    dep.reshard = reshard or dep.reshard or "xsim"
    summary = rewrite_trace_set(traces, dep, dep.reshard, out, barriers=barriers)
    save_deployment(dep, os.path.join(out, DEPLOYMENT_FILE))
    return dep, summary


def import_pytorch(et: Sequence[str], kineto: Sequence[str], out: str | None = None):
    """Join each rank's PyTorch execution trace with its Kineto trace; write PREFIX.<rank>.et when `out`.

    Returns (ImportResult, written paths).
    """
    from tracegen.importers.pytorch import import_pytorch as join

    result = join(list(et), list(kineto))
    return result, (result.write(out) if out is not None else [])
