"""Make trace sets: generate from a deployment spec, plan, rewrite a generated set, import PyTorch runs."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from xsim.traces.io import DEPLOYMENT_FILE

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
    from xsim.tracegen.spec import load_spec as load
    from xsim.tracegen.spec import read_gpu_file

    return load(spec, max_bytes, read_gpu_file(gpu_file) if gpu_file else None)


def check_cluster(dep, spec_path: str) -> None:
    """Build a spec's explicit cluster now, so a typo in it fails here, naming the spec, not at replay."""
    from xsim.netmodels.cluster import build_cluster
    from xsim.netmodels.errors import NetworkModelError
    from xsim.tracegen.errors import SpecError
    from xsim.tracegen.spec import num_ranks

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
    from xsim.api.network import deployment_collective_seconds
    from xsim.replay.progress import status
    from xsim.tracegen.compact import rank_classes
    from xsim.tracegen.deployment_pb2 import Deployment
    from xsim.tracegen.errors import GeneratorError, SpecError
    from xsim.tracegen.memory import deployment_memory, write_memory
    from xsim.tracegen.spec import NAME_RE, gpu_notes, num_ranks, save_deployment
    from xsim.tracegen.workload import generate as make

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
    from xsim.tracegen.set_identity import deployment_set_id
    from xsim.traces.classes import write_classes
    from xsim.traces.outputs import whole_folder
    from xsim.traces.setid import SetIdentity, trace_set_kind, write_set_file

    ranks = num_ranks(dep)
    variant = "gen" if options.rewrite else "gen-raw"
    ident = SetIdentity(deployment_set_id(dep, ranks, variant), ranks, dep.name, variant)
    classes = None if options.all_ranks else rank_classes(dep, rewrite=options.rewrite)
    only = None if classes is None else classes.written
    inputs = [os.fspath(where)] if isinstance(spec, str | os.PathLike) else []
    # The set goes into a fresh sibling folder swapped in whole (traces.outputs.whole_folder): a kill, a
    # full disk or a second writer leaves the earlier set as it was; a folder holding files of another
    # set (or the user's) is refused before any work, or with force replaced as a whole.
    with whole_folder(
        options.out, trace_set_kind(options.out, dep.name), inputs=inputs, force=options.force
    ) as stage:
        try:
            with status("generating traces"):
                # The contention windows: each collective as the replay's default network model times it.
                timer = deployment_collective_seconds(dep)
                bundle = make(dep, rewrite=options.rewrite, only=only, comm_time=timer)
        except GeneratorError as exc:
            raise GeneratorError(f"{os.fspath(where)}: {exc}") from None
        try:
            with status("writing traces"):
                staged = bundle.write(stage, dep.name, identity=ident)
            save_deployment(dep, os.path.join(stage, DEPLOYMENT_FILE))
            # Memory per rank beside the traces (the replay summary reads it; docs/decide.md).
            mem = deployment_memory(dep)
            write_memory(mem, stage)
            write_set_file(stage, ident)
            if classes is not None:
                write_classes(stage, classes)
        except OSError as exc:
            raise GeneratorError(f"{options.out}: cannot write traces: {exc.strerror or exc}") from None
    paths = [os.path.join(options.out, os.path.basename(p)) for p in staged]
    return Generated(dep, tuple(paths), bundle.node_count(), tuple(mem), tuple(gpu_notes(dep)), classes)


def plan(spec: SpecSource):
    """The heterogeneity-aware plan of a spec (DP groups, rings, chunks, barrier groups, boundaries)."""
    from xsim.tracegen.planner import build_plan

    return build_plan(load_spec(spec))


def rewrite(
    traces: str,
    out: str,
    *,
    spec: SpecSource | None = None,
    reshard: str | None = None,
    barriers: bool = True,
    force: bool = False,
):
    """Rewrite a set generated without the rewrite; writes it with deployment.json as one folder written
    whole (traces.outputs.whole_folder); returns the resolved deployment and the summary."""
    from xsim.tracegen.planner.rewrite import rewrite_trace_set
    from xsim.tracegen.set_identity import deployment_set_id, plan_id_of
    from xsim.tracegen.spec import save_deployment
    from xsim.traces.errors import XsimError
    from xsim.traces.outputs import whole_folder
    from xsim.traces.setid import SetIdentity, check_identity, trace_set_kind, write_set_file
    from xsim.traces.traceset import discover

    cap = None
    ts = discover(traces)
    spec_path = spec if isinstance(spec, str | os.PathLike) else None
    if spec is None:
        from xsim.traces.limits import max_set_metadata_bytes

        spec = spec_path = os.path.join(ts.directory, DEPLOYMENT_FILE)
        if not os.path.isfile(spec):
            raise XsimError(f"{traces}: no {DEPLOYMENT_FILE} beside the traces: pass --spec")
        cap = max_set_metadata_bytes(ts.num_ranks)  # the set's own: grows with it
    dep = load_spec(spec, cap)
    beside = os.path.join(ts.directory, DEPLOYMENT_FILE)
    check_identity(ts, plan_id_of(load_spec(beside, cap) if os.path.isfile(beside) else None))
    dep.reshard = reshard or dep.reshard or "xsim"
    variant = f"rewrite:{dep.reshard}" + ("" if barriers else ":no-barriers")
    name = os.path.basename(ts.prefix)
    ident = SetIdentity(deployment_set_id(dep, ts.num_ranks, variant), ts.num_ranks, name, variant)
    inputs = [*ts.paths, *([spec_path] if spec_path else [])]
    with whole_folder(out, trace_set_kind(out, name), inputs=inputs, force=force) as stage:
        summary = rewrite_trace_set(traces, dep, dep.reshard, stage, barriers=barriers, identity=ident)
        save_deployment(dep, os.path.join(stage, DEPLOYMENT_FILE))
        write_set_file(stage, ident)
    return dep, replace(summary, out_dir=out)


def import_pytorch(et: Sequence[str], kineto: Sequence[str], out: str | None = None, *, force: bool = False):
    """Join each rank's PyTorch execution trace with its Kineto trace; write PREFIX.<rank>.et when `out`,
    the folder of PREFIX written whole (traces.outputs.whole_folder) with set.json.

    Returns (ImportResult, written paths).
    """
    from xsim.tracegen.importers.pytorch import import_pytorch as join
    from xsim.traces.outputs import check_path_text

    if out is not None:
        check_path_text(os.fspath(out))
    result = join(list(et), list(kineto))
    if out is None:
        return result, []
    from xsim.traces.outputs import whole_folder
    from xsim.traces.setid import SetIdentity, make_set_id, trace_set_kind, write_set_file

    prefix = os.fspath(out)
    folder, name = os.path.split(prefix)
    if not name:
        from xsim.traces.errors import XsimError

        raise XsimError(f"{prefix}: --out is a prefix (e.g. out/run/run), not a folder")
    ranks = len(result.nodes)
    # The plan of an import is what it joined: the process groups, each rank's node count and the input
    # files (names and sizes): the same inputs give the same id, another run's another.
    plan = json.dumps(
        {
            "groups": {k: list(v) for k, v in sorted(result.comm_groups.items())},
            "nodes": [len(result.nodes[r]) for r in sorted(result.nodes)],
            "inputs": [[os.path.basename(p), os.path.getsize(p)] for p in (*et, *kineto)],
        },
        sort_keys=True,
    )
    ident = SetIdentity(make_set_id(plan, ranks, "import"), ranks, name, "import")
    with whole_folder(
        folder or ".", trace_set_kind(folder or ".", name), inputs=[*et, *kineto], force=force, label=prefix
    ) as stage:
        staged = result.write(os.path.join(stage, name), identity=ident)
        write_set_file(stage, ident)
    return result, [os.path.join(folder, os.path.basename(p)) for p in staged]
