"""Per-rank interval unions (replay/metrics.py) against a plain merge written out here."""

from __future__ import annotations

import numpy as np
from xsim.replay.metrics import union_length


def _merge(intervals: list[tuple[int, int]]) -> int:
    """Length of a union of [s, e) intervals, by sorting and merging one at a time."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)


def test_union_length_hand_cases():
    rank = np.array([0, 0, 0, 1, 1, 2])
    s = np.array([0, 5, 20, 7, 7, 3])
    e = np.array([10, 15, 30, 7, 9, 3])  # rank 0: [0, 15) + [20, 30); rank 1: an empty one and [7, 9)
    assert union_length(rank, s, e, 4).tolist() == [25, 2, 0, 0]


def test_union_length_is_exact_past_float_precision_and_skips_empty_ranks():
    # Ranks 0 and 2 hold one interval each of 2**53 + 1 ns (a float64 sum would round it to 2**53);
    # rank 1 between them has none, rank 3 two touching ones: [0, 3) + [3, 5) = 5.
    big = 2**53 + 1
    rank = np.array([2, 0, 3, 3])
    s = np.array([7, 0, 0, 3], dtype=np.int64)
    e = np.array([7 + big, big, 3, 5], dtype=np.int64)
    assert union_length(rank, s, e, 4).tolist() == [big, 0, big, 5]


def test_union_length_equals_a_plain_merge_on_random_intervals():
    rng = np.random.default_rng(11)
    for _ in range(50):
        n, nr = int(rng.integers(1, 300)), int(rng.integers(1, 9))
        rank = rng.integers(0, nr, n)
        s = rng.integers(0, 1000, n)
        e = s + rng.integers(-5, 80, n)
        want = [
            _merge([(int(a), int(b)) for r, a, b in zip(rank, s, e, strict=True) if r == k])
            for k in range(nr)
        ]
        assert union_length(rank, s, e, nr).tolist() == want
