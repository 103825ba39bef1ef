"""The one adapter from a resolved deployment to a replayed plan: generate, write, replay, price.

Every sweep and search task goes through `gen_and_replay`, which calls the library functions that
`xsim gen` and `xsim replay --json` call, with the same defaults (catalog roofline per rank, the spec's
cluster), so a sweep row equals the replay of that spec on its own. When the API module (xsim/api.py) lands,
this is the only function to point at it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from tracegen import deployment_pb2 as dpb
from tracegen.memory import RankMemory, deployment_memory, write_memory


@dataclass(frozen=True)
class Replayed:
    """What a sweep row needs from one gen + replay."""

    summary: dict[str, Any]  # ReplayResult.summary_dict()
    cost: dict[str, Any]  # IterationCost.to_json()
    ranks: list[dict[str, Any]]  # the ranks table, one dict per rank
    memory: list[RankMemory]


def gen_and_replay(dep: dpb.Deployment, out_dir: str, network_model: str = "analytical") -> Replayed:
    """Generate `dep` into out_dir/traces (with memory.json), replay it into out_dir/result, and price it."""
    from netmodels.cluster import build_cluster
    from netmodels.models import build_model
    from replay import DeviceProfile, RooflineModel, simulate
    from tracegen.catalog import gpu
    from tracegen.cost import iteration_cost
    from tracegen.spec import save_deployment
    from tracegen.workload import generate
    from traces.traceset import discover

    traces = os.path.join(out_dir, "traces")
    result_dir = os.path.join(out_dir, "result")
    bundle = generate(dep)
    bundle.write(traces, dep.name)
    save_deployment(dep, os.path.join(traces, "deployment.json"))
    memory = deployment_memory(dep)
    write_memory(memory, traces)
    network = build_model(network_model, build_cluster(json.loads(dep.cluster_json)))
    # As `xsim replay` does for a set with deployment.json: the catalog's achieved rates per rank.
    profiles = {}
    for dg in dep.device_groups:
        spec = gpu(dg.gpu)
        prof = DeviceProfile(spec.peak_flops * spec.gemm_eff, spec.mem_bw * spec.mem_eff, spec.name)
        profiles.update({int(r): prof for r in dg.ranks})
    result = simulate(discover(traces), network=network, compute=RooflineModel(profiles=profiles))
    result.save(result_dir)
    summary = result.summary_dict()
    cost = iteration_cost(dep, summary["iteration_time_ns"]).to_json()
    with open(os.path.join(result_dir, "cost.json"), "w", encoding="utf-8") as fh:
        json.dump(cost, fh, indent=1)
        fh.write("\n")
    return Replayed(summary, cost, result.ranks.sort("rank").to_dicts(), memory)
