"""Failures that go on: a purge that failed is tried again later and later, to a cap, and its error is recorded in
the ledger once a day (SPEC 10.4), so an object whose failure never heals (a payload naming a data centre no store
is configured for, a row the driver cannot decode) costs a few attempts an hour and one record a day, not one a
retry interval. Pure: ``purger.sinks.failures`` keeps each failing object's ``Failing`` in Cassandra.

Example::

    failing, retry = failed_again(None, now_ms=0, retry_ms=60_000, cap_ms=3_600_000)
    retry                                        # Retry(at_ms=60_000, record=True, failures=1)
    failed_again(failing, 60_000, 60_000, 3_600_000)[1]   # Retry(at_ms=180_000, record=False, failures=2)
    backoff_ms(8, retry_ms=60_000, cap_ms=3_600_000)      # 3_600_000: capped
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import date

from purger.core.handles import Retry
from purger.core.times import from_epoch_ms

__all__ = ["Failing", "backoff_ms", "failed_again", "next_failing", "record_today"]


@dataclass(frozen=True)
class Failing:
    """An object whose purge failed: how many times in a row, since when, when last, and the day (UTC) its error
    last went to the ledger."""

    failures: int
    first_ms: int
    last_ms: int
    recorded_on: date | None = None


def next_failing(before: Failing | None, now_ms: int, streak_gap_ms: int) -> Failing:
    """The object failed again at ``now_ms``: one more failure in its streak, or a new streak when it had not
    failed for ``streak_gap_ms`` (it got through, or was not tried, meanwhile)."""
    if before is None or now_ms - before.last_ms > streak_gap_ms:
        return Failing(1, now_ms, now_ms, before.recorded_on if before else None)
    return replace(before, failures=before.failures + 1, last_ms=now_ms)


def backoff_ms(failures: int, retry_ms: int, cap_ms: int) -> int:
    """How long after its ``failures``-th failure in a row an object is tried again: ``retry_ms``, doubled at
    each failure, to ``cap_ms``."""
    return min(retry_ms << min(failures - 1, 62), max(cap_ms, retry_ms))


def record_today(failing: Failing, now_ms: int) -> tuple[bool, Failing]:
    """Whether this failure's error goes to the ledger (the first of its UTC day), and the ``Failing`` that says
    so."""
    today = from_epoch_ms(now_ms).date()
    if failing.recorded_on == today:
        return False, failing
    return True, replace(failing, recorded_on=today)


def failed_again(before: Failing | None, now_ms: int, retry_ms: int, cap_ms: int) -> tuple[Failing, Retry]:
    """An object that was ``before`` failed at ``now_ms``: what to keep of it, and its ``Retry``. A streak ends
    when the object was not failing for a whole backoff at the cap and more."""
    record, failing = record_today(next_failing(before, now_ms, 2 * cap_ms + retry_ms), now_ms)
    return failing, Retry(now_ms + backoff_ms(failing.failures, retry_ms, cap_ms), record, failing.failures)
