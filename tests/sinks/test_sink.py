"""The sink's outcome counts, added up by the purge job's own tasks (``sinks.sink.OutcomeTally``)."""

from __future__ import annotations

from collections import Counter

import pytest

from purger.core.vocabulary import ALREADY_GONE, ERROR, PURGED, SKIPPED
from purger.sinks.sink import OutcomeTally

pytestmark = pytest.mark.integration  # Spark (a JVM), though no server


def outcome(kind: str, status: str, eligible_at_ms: int | None, deleted_at_ms: int | None,
            intent: str | None = None, recorded: bool = True) -> tuple:
    """An ``OUTCOME_SCHEMA`` tuple, and whether the ledger records it, as ``purge_partition`` yields it."""
    return ("mailbox", kind, "x", "rule", None, status, None, eligible_at_ms, 0, deleted_at_ms, 7, "host:1", intent,
            recorded)


def test_the_purge_jobs_tasks_count_every_outcome_and_the_lag_of_each_deletion(spark):
    outcomes = [
        outcome("message", PURGED, 1_000, 3_500),
        outcome("message", PURGED, 2_000, 2_250),
        outcome("payload", PURGED, 1_000, 11_000),
        outcome("message", SKIPPED, 1_000, None),
        outcome("payload", ALREADY_GONE, 1_000, None),
        outcome("message", ERROR, 1_000, None),
        # An error after the object's first today: counted, not recorded.
        outcome("message", ERROR, 1_000, None, recorded=False),
        # A policy that does not say when it deleted: counted, with no lag (as the ledger's lag_s is null).
        outcome("message", PURGED, 1_000, None),
        # A deletion recorded from the purger's intent (the ledger may hold it already): counted apart too.
        outcome("message", PURGED, 1_000, 4_000, intent="q/6"),
    ]
    tally = spark.sparkContext.accumulator(OutcomeTally().zero(), OutcomeTally())
    passed_on = (spark.sparkContext.parallelize(outcomes, 3)
                 .mapPartitions(lambda rows: OutcomeTally.counted(rows, tally)).collect())

    assert passed_on == [o[:-1] for o in outcomes if o[-1]]
    counts, lags, (from_intent,) = tally.value
    assert counts == Counter({("message", PURGED): 4, ("payload", PURGED): 1, ("message", SKIPPED): 1,
                              ("payload", ALREADY_GONE): 1, ("message", ERROR): 2})
    # The lags of the four deletions with both times: 0.25, 2.5, 3.0 and 10.0 s, merged from three tasks.
    assert (lags.count, lags.sum_s, lags.quantile(0.0), lags.quantile(1.0)) == (4, 15.75, 0.25, 10.0)
    assert lags.counts[:4] == [1, 0, 2, 1] and from_intent == 1
    tally.value = OutcomeTally().zero()  # the session keeps its accumulators: no sketch left alive at its exit
