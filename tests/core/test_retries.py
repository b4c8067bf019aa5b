"""Failures that go on (``purger.core.retries``, SPEC 10.4): each retry later than the last, to a cap, one error
record a day; against a reference model of a sequence of failures, and through the purge protocol."""

from __future__ import annotations

from datetime import datetime, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from purger.core.policy import Attempt
from purger.core.retries import failed_again
from purger.core.times import now_ms
from purger.core.vocabulary import ERROR
from tests.support.memory import MemoryFailures
from tests.core.test_purge_protocol import CANDIDATE, MemoryJournal, Thing, ThingPurge

RETRY, CAP = 60_000, 3_600_000
GAP = 2 * CAP + RETRY


@settings(max_examples=300, deadline=None)
@given(start=st.integers(1_700_000_000_000, 1_900_000_000_000),
       gaps=st.lists(st.one_of(st.integers(0, 4 * CAP), st.integers(0, 3 * 86_400_000)), min_size=1, max_size=40))
def test_each_retry_is_later_to_the_cap_and_one_error_a_day_is_recorded(start, gaps):
    """Reference: a streak's n-th failure waits RETRY * 2^(n-1), at most CAP; a failure after a quiet gap longer
    than two waits at the cap starts a streak; an error is recorded when no other was that UTC day."""
    failing, streak, recorded_days = None, 0, set()
    now = start
    for gap in gaps:
        now += gap
        streak = 1 if failing is None or now - failing.last_ms > GAP else streak + 1
        failing, retry = failed_again(failing, now, RETRY, CAP)
        day = datetime.fromtimestamp(now / 1000, timezone.utc).date()
        assert retry.failures == failing.failures == streak
        assert retry.at_ms - now == min(RETRY * 2 ** (streak - 1), CAP)
        assert retry.record == (day not in recorded_days)
        recorded_days.add(day)


def test_a_store_that_keeps_failing_is_rechecked_later_each_time_and_its_error_recorded_once_today():
    failures = MemoryFailures(retry_ms=1_000, cap_ms=4_000)
    thing = Thing(1)
    thing.failing = {"r0"}
    delays, recorded = [], []
    for _ in range(5):
        purge = ThingPurge(thing, MemoryJournal(), failures=failures)
        before = now_ms()
        outcomes = list(purge.purge(CANDIDATE, Attempt(batch="q/1")))
        [(_, _, _, at_ms)] = purge.control.rechecks
        delays.append(round((at_ms - before) / 1000))
        recorded += [o.recorded for o in outcomes if o.status == ERROR]
    assert delays == [1, 2, 4, 4, 4]
    assert recorded == [True, False, False, False, False]
    assert failures.failing[("thing", "t1")].failures == 5
