"""Which plans `xsim gen` may write compact: DP replicas that are one program up to labels.

The generator builds a rank of replica k as a copy of the first rank built of the same shape with its device
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

The all-gather form of context parallelism (cp_comm_type "all_gather") is the exception: its CP ranks run
one program (each the same attention op under causal load balancing, the K/V AllGather and ReduceScatter
over the whole CP group, which every swap of CP positions maps onto itself), so its positions are rank
classes like TP positions (_tp_classes, classes.json cp_positions). The ring form's CP ranks are alike up
to labels too, but only under rotations (rank c sends to c + 1 and receives from c - 1), which the fold's
swaps are not, and its ring steps are timed per CP rank: its CP positions stay whole. Its TP positions still
fold: a class is TP position t of a CP block (the cp DP replicas of one ring), every stage of every CP
position; the K/V ring pairs TP position t of CP rank c with TP position t of c +- 1, so each ring lies in
one class and the TP swap maps TP position 0's rings onto position t's member for member (as it maps
pipeline sends). Without TP it keeps blocks.

Expert parallelism under a routing that loads every EP rank alike is the other exception (issue 28):
when every source (EP rank x expert-TP rank) routes the same tokens to each expert and each EP rank's
experts get the same share of them (uniform routing; a weights or tokens table or a seeded draw that comes
out so; a padded capacity), every EP rank sends and receives the same bytes to and from every peer, runs
its grouped GEMMs on the same number of copies, and the generator emits each all-to-all as one ALL_TO_ALL
collective over the EP group (tracegen.moe_ops.even_bytes): the EP ranks differ only in which experts they
hold (no op carries their ids) and their group names, and every swap of EP positions maps the EP group onto
itself. The positions are then rank classes like TP positions (classes.json `ep_positions` E, the DP
replicas one EP group spans: ep, or ep / tp under etp 1, where an EP group also spans the TP positions).
`ep_alike` decides it from the routing spec, at every MoE layer (a seeded draw differs per layer) and
every stage's token count; a skewed routing (EP ranks of different loads, P2P all-to-alls whose peers only
rotations map onto each other) keeps blocks. Expert and context parallelism together keep blocks.

A heterogeneous plan has several classes of replica (replicas with the same stages are one class;
examples/hetero1024.yaml has two). Its replicas are grouped into g = gcd(class sizes) super-replicas,
each holding n_c / g replicas of every class c in one order, so super-replica k's i-th rank has the same
stage, GPU and TP position as super-replica 0's; the fold machinery then folds the super-replicas as it
folds replicas. The generator's copies make them alike rank by rank; the rewriter (the heterogeneous
gradient sync, tracegen/planner/rewrite.py) makes them alike when every DP group and ring it adds is
mapped onto itself by each swap pi_k and gives a rank the rings its representative has (checked here on
the plan); a TP change at a stage boundary (resharding numbers its messages with set-wide tags) keeps
the plan whole.
"""

from __future__ import annotations

import math
from dataclasses import replace

from xsim.tracegen import deployment_pb2 as dpb
from xsim.tracegen.spec import replicas
from xsim.tracegen.workload import is_homogeneous
from xsim.traces.classes import RankClasses


def _stage_shape(dg: dpb.DeviceGroup) -> tuple:
    """What a stage's program depends on besides its ranks' numbers and its group id."""
    chunks = tuple((c.start, c.end) for c in dg.chunks)
    return (
        dg.gpu, dg.tp, len(dg.ranks), dg.layer_start, dg.layer_end, dg.micro_batch, dg.pp_stage, chunks, dg.ep, dg.cp
    )  # fmt: skip


def replica_block(dep: dpb.Deployment) -> int:
    """DP replicas per class unit: lcm of the replicas an EP group spans (ep, or ep / tp under etp 1), the
    CP degree and hybrid sharding's shard group (dp_shard: a swap of two shard groups maps each replicate
    group onto itself); 1 without any of them."""
    return math.lcm(
        *(max(1, dg.ep // (dg.tp if dg.etp == 1 else 1)) for dg in dep.device_groups),
        *(max(1, dg.cp) for dg in dep.device_groups),
        max(1, dep.dp_shard),
    )


def _kinds(reps: list[list[dpb.DeviceGroup]]) -> list[list[int]]:
    """Indices of the replicas of each class (replicas with the same stage shapes), in first-seen order."""
    by_shape: dict[tuple, list[int]] = {}
    for k, rep in enumerate(reps):
        by_shape.setdefault(tuple(_stage_shape(dg) for dg in rep), []).append(k)
    return list(by_shape.values())


def _plan_symmetric(dep: dpb.Deployment, supers: tuple[tuple[int, ...], ...]) -> bool:
    """Whether the rewriter's DP groups and rings are mapped onto themselves by every super-replica swap
    and give each rank the rings of its representative (so its edits are the representative's, renamed)."""
    from xsim.tracegen.planner import (
        build_plan,  # the planner builds on the generator, not the other way round
    )

    plan = build_plan(dep)
    if any(b.reshard for b in plan.boundaries):
        return False
    where = {r: (k, i) for k, rep in enumerate(supers) for i, r in enumerate(rep)}
    for dp in plan.dp_groups:
        sets = [frozenset(dp.ranks), *(frozenset(ring) for ring in dp.rings)]
        for k, rep in enumerate(supers[1:], 1):

            def pi(r: int, k: int = k) -> int:
                kk, i = where[r]
                return supers[k][i] if kk == 0 else supers[0][i] if kk == k else r

            if any(frozenset(map(pi, s)) != s for s in sets):
                return False
            if any(
                dp.rings_of(x) != dp.rings_of(r) for x, r in zip(rep, supers[0], strict=True) if x in sets[0]
            ):
                return False
    return True


def rank_classes(dep: dpb.Deployment, *, rewrite: bool) -> RankClasses | None:
    """The DP replicas of `dep` (blocks of replica_block replicas) as a class record when they are alike by
    construction, else None."""
    reps = list(replicas(dep).values())
    if len(reps) < 2:
        return _tp_classes(dep, reps)
    if not is_homogeneous(dep):
        return _hetero_classes(dep, reps, rewrite)
    shape = [_stage_shape(dg) for dg in reps[0]]
    if any([_stage_shape(dg) for dg in rep] != shape for rep in reps[1:]):
        return None
    # The rewrite (tracegen.planner.rewrite) leaves a homogeneous plan alone but for stage boundaries
    # that change the TP degree (resharding), which it skips for interleaved plans.
    tps = [dg.tp for dg in reps[0]]
    if rewrite and dep.virtual_stages <= 1 and any(a != b for a, b in zip(tps, tps[1:], strict=False)):
        return None
    tpc = _tp_classes(dep, reps)
    if tpc is not None:
        return tpc
    block = replica_block(dep)
    if len(reps) % block or len(reps) // block < 2:
        return None
    blocks = [[dg for rep in reps[b : b + block] for dg in rep] for b in range(0, len(reps), block)]
    ranks = tuple(tuple(r for dg in blk for r in dg.ranks) for blk in blocks)
    dgs = tuple(tuple(dg.id for dg in blk for _r in dg.ranks) for blk in blocks)
    return _record(dep, ranks, dgs)


def _ep_block(dep: dpb.Deployment) -> int:
    """DP replicas an EP group spans (1 without expert parallelism)."""
    return math.lcm(*(max(1, dg.ep // (dg.tp if dg.etp == 1 else 1)) for dg in dep.device_groups))


def ep_alike(dep: dpb.Deployment) -> bool:
    """Whether the EP ranks of every stage run one program up to labels (module docstring): at every MoE
    layer, every source routes the same tokens per expert and each EP rank's experts get the same share
    (the balanced all-to-all of tracegen.moe_ops.even_bytes). True without expert parallelism."""
    from xsim.tracegen.moe_ops import even_bytes, moe_loads
    from xsim.tracegen.spec import chunk_ranges, model_arch

    eps = [dg for dg in dep.device_groups if dg.ep > 1]
    if not eps:
        return True
    if dep.moe_token_dispatcher_type == "flex":  # DeepEP's node and rail groups do not map onto each other
        return False
    model = model_arch(dep)
    moe = model.moe
    if moe is None:
        return False
    seq = int(dep.seq_len or model.seq_len)
    seen: set[tuple[int, int, int, int]] = set()
    for dg in eps:
        etp = 1 if dg.etp == 1 else dg.tp  # the expert TP degree: each of its ranks routes its own tokens
        # the tokens one source routes (tracegen.ops.Ctx.norm_tokens): its micro-batch's seq / cp, and its
        # 1/tp sequence slice under sequence parallelism
        tokens = dg.micro_batch * (seq // max(1, dg.cp))
        if dep.sequence_parallel and dg.tp > 1:
            tokens = -(-tokens // dg.tp)
        for start, end in chunk_ranges(dg):
            for layer in range(start, end + 1):
                # only a seeded draw depends on the layer (tracegen.moe.expert_tokens)
                key = (tokens, dg.ep, etp, layer if moe.routing.distribution == "zipf" else 0)
                if not moe.is_moe(layer) or key in seen:
                    continue
                seen.add(key)
                if not even_bytes(moe_loads(moe, tokens, layer, dg.ep * etp), moe, dg.ep, 1, 1):
                    return False
    return True


def _tp_classes(dep: dpb.Deployment, reps: list[list[dpb.DeviceGroup]]) -> RankClasses | None:
    """Rank classes (DP replica x TP position, and the CP or EP position under context or expert
    parallelism; module docstring) of a plan whose positions are alike by construction, or None: one TP
    degree T everywhere, T > 1 or CP C > 1 or EP positions E > 1, one TP group per device group, replicas
    of one shape (so no resharding; interleaved plans fold alike), context parallelism in its all-gather form
    (CP positions folded) or its ring form with T > 1 (TP positions of whole CP blocks), expert parallelism
    only under a routing that loads its ranks alike, not both."""
    tps = {dg.tp for dg in dep.device_groups}
    cp = max(max(1, dg.cp) for dg in dep.device_groups)
    has_ep = any(dg.ep > 1 for dg in dep.device_groups)
    # EP positions only where the routing loads them alike (under etp 1 the TP positions are EP ranks too)
    if has_ep and (cp > 1 or not ep_alike(dep)):
        return None
    ep = _ep_block(dep)
    if len(tps) != 1 or replica_block(dep) != cp * ep:
        return None
    if (tp := tps.pop()) < 2 and cp < 2 and ep < 2:
        return None
    # The ring form's neighbours map onto each other only under rotations of the CP positions, which the
    # fold's swaps are not: its CP positions stay whole, each class a TP position of a whole CP block
    # (every ring of it, each at one TP position), and only the TP positions fold (module docstring).
    ring = cp > 1 and (dep.cp_comm_type or "p2p") != "all_gather"
    if ring and tp < 2:
        return None
    if not is_homogeneous(dep) or any(len(dg.ranks) != tp for dg in dep.device_groups):
        return None
    shape = [_stage_shape(dg) for dg in reps[0]]
    if any([_stage_shape(dg) for dg in rep] != shape for rep in reps[1:]):
        return None
    units = (
        [[dg for rep in reps[b : b + cp] for dg in rep] for b in range(0, len(reps), cp)] if ring else reps
    )
    ranks = tuple(tuple(dg.ranks[t] for dg in unit) for unit in units for t in range(tp))
    dgs = tuple(tuple(dg.id for dg in unit) for unit in units for _t in range(tp))
    rc = _record(dep, ranks, dgs)
    return None if rc is None else replace(rc, tp=tp, cp=1 if ring else cp, ep=ep)


def _hetero_classes(
    dep: dpb.Deployment, reps: list[list[dpb.DeviceGroup]], rewrite: bool
) -> RankClasses | None:
    """Super-replicas of a plan with several classes of replica (module docstring), or None."""
    kinds = _kinds(reps)
    g = 0
    for members in kinds:
        g = math.gcd(g, len(members))
    # Expert / context parallelism ties replicas into blocks (above); their heterogeneous plans stay whole.
    if g < 2 or dep.virtual_stages > 1 or replica_block(dep) > 1:
        return None
    # Super-replica k: replicas [k*m_c, (k+1)*m_c) of each class c, m_c = n_c / g, classes in first-seen order.
    parts = [
        [members[k * (len(members) // g) : (k + 1) * (len(members) // g)] for members in kinds]
        for k in range(g)
    ]
    order = [[j for part in sup for j in part] for sup in parts]
    ranks = tuple(tuple(r for j in sup for dg in reps[j] for r in dg.ranks) for sup in order)
    dgs = tuple(tuple(dg.id for j in sup for dg in reps[j] for _r in dg.ranks) for sup in order)
    dprs = tuple(tuple(dg.dp_replica for j in sup for dg in reps[j] for _r in dg.ranks) for sup in order)
    if rewrite and not _plan_symmetric(dep, ranks):
        return None
    replica_ids = [reps[j][0].dp_replica for j in range(len(reps))]
    classes = tuple(tuple(replica_ids[j] for j in members) for members in kinds)
    return _record(dep, ranks, dgs, classes, dprs)


def _record(
    dep: dpb.Deployment,
    ranks: tuple[tuple[int, ...], ...],
    dgs: tuple[tuple[int, ...], ...],
    classes: tuple[tuple[int, ...], ...] = (),
    dprs: tuple[tuple[int, ...], ...] = (),
) -> RankClasses | None:
    n = sum(len(r) for r in ranks)
    if sorted(r for rep in ranks for r in rep) != list(range(n)):
        return None
    return RankClasses(dep.name, n, ranks, dgs, classes, dprs)
