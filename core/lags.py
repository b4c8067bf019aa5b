"""The purge lags of a batch's deletions, added up where the deletions are made. Plain Python.

Each task of the purge job observes its deletions' lags into a ``Lags``: a Prometheus histogram's counts
(``LAG_BUCKETS``) and sum, and a KLL sketch (Apache DataSketches, k = ``LAG_SKETCH_K``, as the daily
report's) for percentiles. The driver merges one ``Lags`` per task, never a list of every lag: its work
for a batch is per task, whatever the batch deleted.

A percentile from the sketch is a lag whose rank among the lags merged is within ``LAG_RANK_ERROR`` of the
one asked for (DataSketches' bound for k = 200, at 99% confidence); under ``LAG_SKETCH_K`` lags it is one of
them, exactly ranked.

Example::

    lags = Lags.of([2.0, 4.0, 3.0])    # or one at a time: lags.observe(1.5)
    lags.count, lags.sum_s, lags.quantile(0.99)   # (3, 9.0, 4.0)
    cumulative(lags.counts)[:2]                   # [(1.0, 0), (2.0, 1)]
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Iterable

from datasketches import kll_doubles_sketch

# The histogram's upper bounds, in seconds (``le``); a last bucket, +Inf, takes the rest.
LAG_BUCKETS = (1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)
LAG_SKETCH_K = 200
LAG_RANK_ERROR = 0.0133


def cumulative(counts: list[int]) -> list[tuple[float, int]]:
    """(upper bound, lags at most that) for each bucket of ``Lags.counts``, +Inf last: a Prometheus
    histogram's buckets."""
    running, buckets = 0, []
    for bound, n in zip((*LAG_BUCKETS, float("inf")), counts):
        running += n
        buckets.append((bound, running))
    return buckets


class Lags:
    """Lags observed and merged: per bucket counts (the last is +Inf's), their sum, and their sketch, made at
    the first lag: an empty Lags holds no native object (the library reports the ones alive at exit)."""

    __slots__ = ("counts", "sum_s", "sketch")

    def __init__(self) -> None:
        self.counts = [0] * (len(LAG_BUCKETS) + 1)
        self.sum_s = 0.0
        self.sketch: kll_doubles_sketch | None = None

    @classmethod
    def of(cls, lags_s: Iterable[float]) -> "Lags":
        lags = cls()
        for lag_s in lags_s:
            lags.observe(lag_s)
        return lags

    def observe(self, lag_s: float) -> None:
        # A lag equal to a bound is in that bound's bucket, as Prometheus counts ``le``.
        self.counts[bisect_left(LAG_BUCKETS, lag_s)] += 1
        self.sum_s += lag_s
        if self.sketch is None:
            self.sketch = kll_doubles_sketch(LAG_SKETCH_K)
        self.sketch.update(lag_s)

    def merge(self, other: "Lags") -> "Lags":
        """Add ``other``'s lags to these; returns self."""
        self.counts = [a + b for a, b in zip(self.counts, other.counts)]
        self.sum_s += other.sum_s
        if other.sketch is not None:
            if self.sketch is None:
                self.sketch = kll_doubles_sketch(LAG_SKETCH_K)
            self.sketch.merge(other.sketch)
        return self

    @property
    def count(self) -> int:
        return sum(self.counts)

    def quantile(self, q: float) -> float | None:
        """The lag at rank ``q`` (0 to 1), within ``LAG_RANK_ERROR``; None when no lag was observed."""
        # Inclusive, as DataSketches' Java (Spark's sketch functions) ranks: the least lag at least q of all are at most.
        return None if self.sketch is None else self.sketch.get_quantile(q, inclusive=True)

    # A task's Lags reaches the driver pickled (an accumulator's update): the sketch travels as its bytes.
    def __getstate__(self) -> tuple[list[int], float, bytes | None]:
        return self.counts, self.sum_s, None if self.sketch is None else self.sketch.serialize()

    def __setstate__(self, state: tuple[list[int], float, bytes | None]) -> None:
        self.counts, self.sum_s, sketch = state
        self.sketch = None if sketch is None else kll_doubles_sketch.deserialize(sketch)

    def __repr__(self) -> str:
        return f"Lags(count={self.count}, sum_s={self.sum_s}, p99={self.quantile(0.99)})"
