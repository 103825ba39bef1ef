"""The one adapter from a resolved deployment to a replayed plan: generate, write, replay, price.

Every sweep and search task goes through `gen_and_replay`, which makes the same xsim.api calls as
`xsim gen` and `xsim replay --out`, with the same defaults (the generator's recorded op times, the spec's
cluster), so a sweep row equals the replay of that spec on its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from xsim.tracegen import deployment_pb2 as dpb
from xsim.tracegen.memory import RankMemory


@dataclass(frozen=True)
class Replayed:
    """What a sweep row needs from one gen + replay."""

    summary: dict[str, Any]  # ReplayResult.summary_dict()
    cost: dict[str, Any]  # IterationCost.to_json()
    ranks: list[dict[str, Any]]  # the ranks table, one dict per rank
    memory: list[RankMemory]


def gen_and_replay(dep: dpb.Deployment, out_dir: str, network_model: str = "analytical") -> Replayed:
    """Generate `dep` into out_dir/traces (with memory.json), replay it into out_dir/result, and price it."""
    from xsim import api

    traces = os.path.join(out_dir, "traces")
    gen = api.generate(dep, api.GenerateOptions(out=traces, name=dep.name, force=True))
    run = api.simulate(traces, api.ReplayOptions(network=api.NetworkOptions(model=network_model)))
    api.write_outputs(run, api.OutputOptions(out=os.path.join(out_dir, "result")))
    summary = run.result.summary_dict()
    return Replayed(summary, run.cost or {}, run.result.ranks.sort("rank").to_dicts(), list(gen.memory))
