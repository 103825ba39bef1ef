"""Which plans `xsim gen` may write compact: DP replicas that are one program up to labels.

The generator builds a rank of replica k as a copy of replica 0's rank of the same shape with its device
group id, group names and P2P peers patched in (workload._Generator._clone); when every replica has the
same stages (GPU, TP degree, layers, micro-batch, model chunks) and nothing rewrites one replica apart
from another, replica k's i-th rank is therefore replica 0's i-th rank renamed by pi_k (replay/fold.py),
and only replica 0's files need writing.

Expert and context parallelism (issue 28) tie replicas together: DP replica d is EP rank d mod ep of the
EP group of replicas d - d mod ep (workload.ep_groups) and CP rank d mod cp of its CP ring (cp_groups), so
its experts, routing, all-to-all peers and ring neighbours depend on its place in the group. The class unit
is then a block of lcm(ep, cp) consecutive replicas, a whole number of EP groups and CP rings: block k's
i-th rank is block 0's i-th rank renamed by the swap of the two blocks, which maps each EP group and CP
ring of block 0 onto the one of block k member for member (same EP/CP index, so the same experts, token
counts per expert and ring position) and leaves the expert-DP and DP gradient groups (one member per
block position) as they are.
"""

from __future__ import annotations

import math

from tracegen import deployment_pb2 as dpb
from tracegen.spec import replicas
from tracegen.workload import is_homogeneous
from traces.classes import RankClasses


def _stage_shape(dg: dpb.DeviceGroup) -> tuple:
    """What a stage's program depends on besides its ranks' numbers and its group id."""
    chunks = tuple((c.start, c.end) for c in dg.chunks)
    return (
        dg.gpu, dg.tp, len(dg.ranks), dg.layer_start, dg.layer_end, dg.micro_batch, dg.pp_stage, chunks, dg.ep, dg.cp
    )  # fmt: skip


def replica_block(dep: dpb.Deployment) -> int:
    """DP replicas per class unit: lcm of the EP and CP degrees (1 without expert or context parallelism)."""
    return math.lcm(
        *(max(1, dg.ep) for dg in dep.device_groups), *(max(1, dg.cp) for dg in dep.device_groups)
    )


def rank_classes(dep: dpb.Deployment, *, rewrite: bool) -> RankClasses | None:
    """The DP replicas of `dep` (blocks of replica_block replicas) as a class record when they are alike by
    construction, else None."""
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
    block = replica_block(dep)
    if len(reps) % block or len(reps) // block < 2:
        return None
    blocks = [[dg for rep in reps[b : b + block] for dg in rep] for b in range(0, len(reps), block)]
    ranks = tuple(tuple(r for dg in blk for r in dg.ranks) for blk in blocks)
    dgs = tuple(tuple(dg.id for dg in blk for _r in dg.ranks) for blk in blocks)
    n = sum(len(r) for r in ranks)
    if sorted(r for rep in ranks for r in rep) != list(range(n)):
        return None
    return RankClasses(dep.name, n, ranks, dgs)
