"""Pipeline schedules: the order in which one stage runs forward and backward passes of micro-batches."""

from __future__ import annotations

FWD, BWD = "F", "B"


def gpipe(num_micro_batches: int) -> list[tuple[str, int]]:
    """GPipe (Huang et al. 2019): every forward, then every backward, both in micro-batch order.

    Backward order follows torch.distributed.pipelining.ScheduleGPipe (micro-batch 0 first).
    """
    return [(FWD, m) for m in range(num_micro_batches)] + [(BWD, m) for m in range(num_micro_batches)]


def one_f_one_b(num_micro_batches: int, num_stages: int, stage: int) -> list[tuple[str, int]]:
    """1F1B / PipeDream-Flush (Narayanan et al. 2021), as Megatron-LM's non-interleaved schedule.

    Stage k warms up with min(P-k-1, M) forwards, then alternates one forward and one backward, and
    cools down with the remaining backwards.
    """
    m_total = num_micro_batches
    warmup = min(num_stages - stage - 1, m_total)
    order = [(FWD, m) for m in range(warmup)]
    next_f, next_b = warmup, 0
    for _ in range(m_total - warmup):
        order.append((FWD, next_f))
        next_f += 1
        order.append((BWD, next_b))
        next_b += 1
    order.extend((BWD, m) for m in range(next_b, m_total))
    return order


def interleaved(
    num_micro_batches: int, num_stages: int, stage: int, chunks: int, all_warmup_at_m_eq_p: bool = False
) -> list[tuple[str, int, int]]:
    """Interleaved 1F1B (Narayanan et al. 2021 section 2.2) as (kind, model chunk, micro-batch) triples.

    Megatron-LM's forward_backward_pipelining_with_interleaving: the M*V passes of a stage are taken in
    groups of P micro-batches per model chunk (forward k runs chunk (k mod PV) // P, backward k the mirror
    chunk V-1-that), micro-batch (k // PV)*P + k mod P of that chunk; stage k warms up with
    min((P-k-1)*2 + (V-1)*P, M*V) forwards, then alternates one forward and one backward, then cools down.
    M must be a multiple of P (the caller checks), as Megatron requires. `all_warmup_at_m_eq_p`: Megatron-LM
    before 2024-11 (Framework.pp_all_warmup_at_m_eq_p): with M = P every stage warms up with all M*V forwards.
    """
    p, v = num_stages, chunks
    total = num_micro_batches * v

    def chunk_of(k: int, forward: bool) -> int:
        c = (k % (p * v)) // p
        return c if forward else v - 1 - c

    def mb_of(k: int) -> int:
        return (k // (p * v)) * p + k % p

    warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)
    if all_warmup_at_m_eq_p and num_micro_batches == p:
        warmup = total
    order = [(FWD, chunk_of(k, True), mb_of(k)) for k in range(warmup)]
    for k in range(total - warmup):
        f = k + warmup
        order.append((FWD, chunk_of(f, True), mb_of(f)))
        order.append((BWD, chunk_of(k, False), mb_of(k)))
    order.extend((BWD, chunk_of(k, False), mb_of(k)) for k in range(total - warmup, total))
    return order


def stage_order(schedule: str, num_micro_batches: int, num_stages: int, stage: int) -> list[tuple[str, int]]:
    """The pass order of one stage under `schedule` ("gpipe" or "1f1b"), one model chunk."""
    if schedule == "1f1b":
        return one_f_one_b(num_micro_batches, num_stages, stage)
    return gpipe(num_micro_batches)
