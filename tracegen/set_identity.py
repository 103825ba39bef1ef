"""The identity of the trace set a deployment generates: its plan keys hashed with the rank count and how the
set was made (traces/setid.py holds the id's form, set.json and the per-file checks; this module knows the
spec, which `traces` may not import)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from xsim.traces.setid import make_set_id

# Spec keys that shape the generated graph (as tracegen.planner.rewrite.GENERATION_KEYS) plus the name (the
# files' prefix) and the reshard strategy (the rewrite's inserted collectives); cluster, GPUs, prices and
# the compute model do not change the files, so a what-if edit of deployment.json keeps the set's id.
PLAN_KEYS = (
    "name", "model", "seq_len", "micro_batches", "schedule", "dtype_bytes", "sequence_parallel",
    "allow_uneven_tp", "dp_bucket_bytes", "device_groups", "overlap_grad_reduce", "overlap_param_gather",
    "tp_comm_overlap", "grad_reduce_dtype", "sharding", "reshard",
)  # fmt: skip
# Plan keys added later: hashed only when the spec sets them, so a set generated before a key existed (every
# such set leaves it unset) keeps its id and its deployment.json still checks against it.
LATER_PLAN_KEYS = (
    "dp_shard",
    "defer_embedding_wgrad_compute",
    "wgrad_deferral_limit",
    "overlap_param_gather_with_optimizer_step",
    "data_parallel_sharding_strategy",
    "fsdp_double_buffer",
    "dist_optimizer_impl",
)


def deployment_set_id(dep: Any, ranks: int, variant: str) -> str:
    """The id of the set a resolved Deployment generates (or rewrites) under `variant`."""
    from xsim.tracegen.spec import spec_to_mapping

    m = spec_to_mapping(dep)
    keys = PLAN_KEYS + tuple(k for k in LATER_PLAN_KEYS if m.get(k))
    plan = json.dumps({k: m.get(k) for k in keys}, sort_keys=True, separators=(",", ":"))
    return make_set_id(plan, ranks, variant)


def plan_id_of(dep: Any) -> Callable[[int, str], str] | None:
    """What traces.setid.check_identity asks of a set's deployment.json: its id for (ranks, variant)."""
    if dep is None:
        return None
    return lambda ranks, variant: deployment_set_id(dep, ranks, variant)
