"""Which plans `xsim gen` may write compact: DP replicas that are one program up to labels.

The generator builds a rank of replica k as a copy of replica 0's rank of the same shape with its device
group id, group names and P2P peers patched in (workload._Generator._clone); when every replica has the
same stages (GPU, TP degree, layers, micro-batch, model chunks) and nothing rewrites one replica apart
from another, replica k's i-th rank is therefore replica 0's i-th rank renamed by pi_k (replay/fold.py),
and only replica 0's files need writing.
"""

from __future__ import annotations

from tracegen import deployment_pb2 as dpb
from tracegen.spec import replicas
from tracegen.workload import is_homogeneous
from traces.classes import RankClasses


def _stage_shape(dg: dpb.DeviceGroup) -> tuple:
    """What a stage's program depends on besides its ranks' numbers and its group id."""
    chunks = tuple((c.start, c.end) for c in dg.chunks)
    return (dg.gpu, dg.tp, len(dg.ranks), dg.layer_start, dg.layer_end, dg.micro_batch, dg.pp_stage, chunks)


def rank_classes(dep: dpb.Deployment, *, rewrite: bool) -> RankClasses | None:
    """The DP replicas of `dep` as a class record when they are alike by construction, else None."""
    reps = list(replicas(dep).values())
    if len(reps) < 2 or not is_homogeneous(dep):
        return None
    shape = [_stage_shape(dg) for dg in reps[0]]
    if any([_stage_shape(dg) for dg in rep] != shape for rep in reps[1:]):
        return None
    # The rewrite (tracegen.planner.rewrite) leaves a homogeneous plan alone but for stage boundaries
    # that change the TP degree (resharding), which it skips for interleaved plans.
    tps = [dg.tp for dg in reps[0]]
    if rewrite and dep.virtual_stages <= 1 and any(a != b for a, b in zip(tps, tps[1:], strict=False)):
        return None
    ranks = tuple(tuple(r for dg in rep for r in dg.ranks) for rep in reps)
    dgs = tuple(tuple(dg.id for dg in rep for _r in dg.ranks) for rep in reps)
    n = sum(len(r) for r in ranks)
    if sorted(r for rep in ranks for r in rep) != list(range(n)):
        return None
    return RankClasses(dep.name, n, ranks, dgs)
