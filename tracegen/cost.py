"""What an iteration of a deployment buys and costs: tokens, GPU-hours and dollars (TCO per iteration)."""

from __future__ import annotations

from dataclasses import dataclass

from xsim.tracegen import deployment_pb2 as dpb
from xsim.tracegen.spec import gpu_specs, replicas

NS_PER_HOUR = 3_600 * 10**9


@dataclass(frozen=True)
class IterationCost:
    """Throughput and rental cost of one training iteration of a deployment."""

    iteration_ns: int
    tokens: int  # tokens trained per iteration, all data-parallel replicas together
    tokens_per_s: float
    gpu_hours: float
    usd: float | None  # None when a GPU of the deployment has no price (catalog or `gpus:` override)
    usd_per_million_tokens: float | None
    unpriced_gpus: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        """Plain JSON-able dict (keys of `xsim replay --json` and cost.json)."""
        return {
            "tokens_per_iteration": self.tokens,
            "tokens_per_s": round(self.tokens_per_s, 3),
            "gpu_hours_per_iteration": round(self.gpu_hours, 9),
            "cost_usd_per_iteration": None if self.usd is None else round(self.usd, 9),
            "cost_usd_per_million_tokens": None
            if self.usd_per_million_tokens is None
            else round(self.usd_per_million_tokens, 6),
            "unpriced_gpus": list(self.unpriced_gpus),
        }


def iteration_cost(dep: dpb.Deployment, iteration_ns: int) -> IterationCost:
    """Tokens per iteration (micro-batches x micro-batch x sequence, summed over replicas) and its price.

    Every rank is rented for the whole iteration, busy or idle, as a cluster is billed.
    """
    seq = dep.seq_len or dep.model.seq_len
    # Context parallelism splits each sequence over cp replicas: each holds seq / cp of its tokens.
    tokens = sum(
        dep.micro_batches * groups[0].micro_batch * seq // max(1, groups[0].cp)
        for groups in replicas(dep).values()
    )
    specs = gpu_specs(dep)
    rank_gpus = [dg.gpu for dg in dep.device_groups for _ in dg.ranks]
    hours = iteration_ns / NS_PER_HOUR
    unpriced = tuple(sorted({g for g in rank_gpus if specs[g].price_per_hour is None}))
    usd = None if unpriced else sum(specs[g].price_per_hour for g in rank_gpus) * hours
    seconds = iteration_ns / 1e9
    return IterationCost(
        iteration_ns=iteration_ns,
        tokens=tokens,
        tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
        gpu_hours=len(rank_gpus) * hours,
        usd=usd,
        usd_per_million_tokens=None if usd is None or not tokens else usd / tokens * 1e6,
        unpriced_gpus=unpriced,
    )
