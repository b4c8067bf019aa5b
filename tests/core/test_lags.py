"""A batch's purge lags added up per task and merged on the driver (``purger.core.lags``), against a reference
model: every lag kept in a list, counted into the buckets and ranked."""

from __future__ import annotations

import math
import pickle
import random

from hypothesis import given, strategies as st

from purger.core.lags import LAG_BUCKETS, LAG_RANK_ERROR, LAG_SKETCH_K, Lags, cumulative

lag = st.floats(min_value=0, max_value=10 * 86400, allow_nan=False)


def by_tasks(lags_s: list[float], cuts: list[int]) -> Lags:
    """``lags_s`` observed by tasks cut at ``cuts``, each task's Lags pickled as an accumulator's update is,
    merged in order as the driver merges them."""
    bounds = sorted({0, len(lags_s), *(c % (len(lags_s) + 1) for c in cuts)})
    merged = Lags()
    for start, end in zip(bounds, bounds[1:]):
        merged.merge(pickle.loads(pickle.dumps(Lags.of(lags_s[start:end]))))
    return merged


def reference_counts(lags_s: list[float]) -> list[int]:
    """Per bucket, the lags above the bound before and at most its own (``le``); +Inf's last."""
    uppers = (*LAG_BUCKETS, math.inf)
    lowers = (-math.inf, *LAG_BUCKETS)
    return [sum(1 for x in lags_s if low < x <= high) for low, high in zip(lowers, uppers)]


@given(st.lists(lag, max_size=LAG_SKETCH_K), st.lists(st.integers(min_value=0), max_size=6),
       st.one_of(st.floats(min_value=0, max_value=1), st.integers(0, 100).map(lambda i: i / 100)))
def test_merged_tasks_count_sum_and_rank_every_lag_as_one_list_does(lags_s, cuts, q):
    lags = by_tasks(lags_s, cuts)
    assert lags.counts == reference_counts(lags_s)
    assert lags.count == len(lags_s)
    assert math.isclose(lags.sum_s, math.fsum(lags_s), rel_tol=1e-9, abs_tol=1e-6)
    assert [n for _, n in cumulative(lags.counts)][-1] == len(lags_s)
    if not lags_s:
        assert lags.quantile(q) is None
    else:
        # Up to k lags the sketch keeps every one: the quantile is the lag of inclusive rank q, exactly.
        ranked = sorted(lags_s)
        assert lags.quantile(q) == ranked[max(math.ceil(q * len(ranked)) - 1, 0)]


def test_past_k_lags_a_quantiles_rank_is_within_the_stated_error():
    rng = random.Random(7)
    lags_s = [rng.lognormvariate(2, 1.5) for _ in range(100_000)]
    lags = by_tasks(lags_s, [rng.randrange(100_000) for _ in range(16)])
    ranked = sorted(lags_s)
    for q in (0.5, 0.9, 0.99):
        rank = sum(1 for x in ranked if x <= lags.quantile(q)) / len(ranked)
        # The bound holds at 99% confidence; twice it, by far more (a failure here is not bad luck).
        assert abs(rank - q) <= 2 * LAG_RANK_ERROR, (q, rank)


def test_a_lag_on_a_bound_is_in_that_bounds_bucket_as_prometheus_counts_le():
    lags = Lags.of([1.0, 1.0001, 3600.0, 3600.5])
    assert cumulative(lags.counts)[:3] == [(1.0, 1), (2.0, 2), (5.0, 2)]
    assert cumulative(lags.counts)[-2:] == [(3600.0, 3), (math.inf, 4)]
