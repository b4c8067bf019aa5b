"""The ``rule_events`` policy (docs/policies.md, rule_events): its rule table as plain Python, its deletes against real Cassandra."""

import itertools
import time
import uuid
from datetime import datetime, timedelta, timezone
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from purger.core.policy import Attempt, Candidate, Eligibility
from purger.core.times import epoch_ms, now_ms, parse_timestamp
from purger.core.vocabulary import ALREADY_GONE, EARLIER_ATTEMPT, PURGED, SKIPPED, WOULD_DELETE, category
from purger.policies import PolicyError, load_policy
from purger.policies.rule_events import (
    COMPLETE, FAILED, KIND, PROCESSING, RULE_EVENT_STATUS, STATUSES, TABLE, UNPROCESSED, RuleEventPurge,
    RuleEventsPolicy, StatusEvent, rule_name,
)
from tests.support.policies import (
    RecordingControl, emitted, fold_in_batches, keyspace_fixture, resources, topic_fixture,
)

# Distinct periods, but two equal ones, so both halves of the tie rule are exercised.
PERIODS_MS = {COMPLETE: 7_000, FAILED: 30_000, UNPROCESSED: 30_000, PROCESSING: 10_000}
POLICY = load_policy("rule_events", {"enabled": True, **{s.lower(): f"{ms}ms" for s, ms in PERIODS_MS.items()}})
KIND_ = POLICY.kinds[0]


def raised(t, status=UNPROCESSED, event_id=None):
    return StatusEvent(event_id or f"raised-{t}", RULE_EVENT_STATUS, t, "r", status, "m", "route")


def changed(t, status, event_id=None):
    return StatusEvent(event_id or f"{status}-{t}", RULE_EVENT_STATUS, t, "r", status)


def due(status, t):
    return Eligibility(rule_name(status), t + PERIODS_MS[status])


# One row per case: the events, then the expected eligibility (None: not by its events).
RULE_TABLE = {
    "no event yet": ([], None),
    "raised unprocessed": ([raised(10)], due(UNPROCESSED, 10)),
    "processing": ([raised(10), changed(20, PROCESSING)], due(PROCESSING, 20)),
    "complete": ([raised(10), changed(20, PROCESSING), changed(30, COMPLETE)], due(COMPLETE, 30)),
    "failed": ([raised(10), changed(20, PROCESSING), changed(30, FAILED)], due(FAILED, 30)),
    "raised complete": ([raised(10, COMPLETE)], due(COMPLETE, 10)),
    "failed goes back to unprocessed on a retry": ([raised(10), changed(20, FAILED), changed(40, UNPROCESSED)],
                                                   due(UNPROCESSED, 40)),
    "complete changed to a longer period": ([raised(10), changed(20, COMPLETE), changed(50, PROCESSING)],
                                            due(PROCESSING, 50)),
    "the same status again runs from its latest setting": ([raised(10, COMPLETE), changed(60, COMPLETE)],
                                                           due(COMPLETE, 60)),
    "equal times: the shorter period wins": ([raised(10), changed(20, FAILED, "b"), changed(20, COMPLETE, "a")],
                                             due(COMPLETE, 20)),
    "equal times and periods: the event id decides": (
        [raised(10), changed(20, FAILED, "b"), changed(20, UNPROCESSED, "a")], due(FAILED, 20)),
}


@pytest.mark.parametrize("case", RULE_TABLE)
def test_rule_table(case):
    events, expected = RULE_TABLE[case]
    assert KIND_.eligibility(KIND_.fold(None, events)) == expected


@pytest.mark.parametrize("case", RULE_TABLE)
def test_rule_table_with_duplicates_in_every_order(case):
    events, expected = RULE_TABLE[case]
    for order in itertools.permutations(events + events[-1:]):
        assert KIND_.eligibility(KIND_.fold(None, list(order))) == expected


def test_the_raising_event_gives_message_and_rule_whenever_it_arrives():
    state = KIND_.fold(KIND_.fold(None, [changed(20, COMPLETE)]), [raised(10)])
    assert (state.status, state.message_id, state.rule_name) == (COMPLETE, "m", "route")


def test_one_rule_per_status_with_its_check():
    policy = load_policy("rule_events", {"enabled": True})
    assert {name: (rule.period_ms, rule.condition) for name, rule in policy.rules.items()} == {
        "rule_event_complete": (7 * 86_400_000, "status = 'COMPLETE' AND updated_at <= ?"),
        "rule_event_failed": (30 * 86_400_000, "status = 'FAILED' AND updated_at <= ?"),
        "rule_event_unprocessed": (30 * 86_400_000, "status = 'UNPROCESSED' AND updated_at <= ?"),
        "rule_event_processing": (30 * 86_400_000, "status = 'PROCESSING' AND updated_at <= ?"),
    }


def test_a_bad_period_names_its_key():
    with pytest.raises(PolicyError, match=r"policies\.rule_events\.complete"):
        load_policy("rule_events", {"enabled": True, "complete": "bogus"})


# --- property: the fold against a reference model --------------------------------------------


def reference(events):
    """The latest status from the whole set at once: sorted by (event time, shorter period, event id)."""
    unique = {e.event_id: e for e in events}.values()
    last = max(unique, key=lambda e: (e.event_time_ms, -PERIODS_MS[e.status], e.event_id), default=None)
    return None if last is None else due(last.status, last.event_time_ms)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.sampled_from(STATUSES)), max_size=8), st.randoms())
def test_the_fold_matches_the_reference_model_under_duplicates_reordering_and_batches(changes, random):
    # Event ids are unique; a duplicate is the same event again.
    events = [changed(t, status, f"e{i}") for i, (t, status) in enumerate(changes)]
    assert KIND_.eligibility(fold_in_batches(KIND_, events, random)) == reference(events)


# --- against Cassandra and Kafka ---------------------------------------------------------------


keyspace = keyspace_fixture(RuleEventsPolicy, "test_rule_events")
topic = topic_fixture("test.rule_events")


@pytest.fixture(scope="module")
def platform(config, keyspace, topic):
    from simulation.rule_events import RuleEventsPlatform

    platform = RuleEventsPlatform(config.kafka, config.cassandra, topic, keyspace[1])
    yield platform
    platform.close()


@pytest.fixture
def purge(keyspace):
    """purge(id, rule, dry_run=False, batch="q/1") -> (outcomes, rechecks), with the default periods."""
    session, name = keyspace
    policy = load_policy("rule_events", {"enabled": True})

    def run(rule_event_id, rule, dry_run=False, batch="q/1"):
        control = RecordingControl("rule_events")
        purger = policy.purges(resources(session, name, control, dry_run))[KIND]
        outcomes = list(purger.purge(Candidate(KIND, rule_event_id, rule, eligible_at_ms=0), Attempt(batch=batch)))
        return outcomes, control.rechecks

    return run


DAY = timedelta(days=1)
DEFAULT_PERIODS = {COMPLETE: 7 * DAY, FAILED: 30 * DAY, UNPROCESSED: 30 * DAY, PROCESSING: 30 * DAY}


def ago(period):
    return datetime.now(timezone.utc) - period


def new_id():
    return f"r-{uuid.uuid4().hex[:12]}"


@pytest.mark.integration
@pytest.mark.parametrize("status", STATUSES)
def test_a_row_with_its_status_for_the_period_is_purged(platform, purge, status):
    rule_event_id = new_id()
    platform.raise_event(rule_event_id, "m1", "route", status, at=ago(DEFAULT_PERIODS[status] + DAY))
    before = now_ms()
    (outcome,), rechecks = purge(rule_event_id, rule_name(status))
    assert outcome.status == PURGED and outcome.deleted_at_ms >= before
    assert rechecks == [] and platform.row(rule_event_id) is None


@pytest.mark.integration
def test_a_row_not_yet_due_is_kept_and_rechecked_when_it_is(platform, purge):
    rule_event_id = new_id()
    platform.raise_event(rule_event_id, "m1", "route", COMPLETE, at=ago(DAY))
    (outcome,), rechecks = purge(rule_event_id, rule_name(COMPLETE))
    assert outcome.status == SKIPPED and outcome.reason.startswith("not yet due: rule_event_complete at ")
    updated = epoch_ms(platform.row(rule_event_id)["updated_at"])
    assert rechecks == [(KIND, rule_event_id, "rule_event_complete", updated + 7 * 86_400_000)]


@pytest.mark.integration
def test_a_row_whose_status_changed_since_is_kept_under_its_new_status(platform, purge):
    rule_event_id = new_id()
    platform.raise_event(rule_event_id, "m1", "route", COMPLETE, at=ago(8 * DAY))
    platform.set_status(rule_event_id, FAILED, at=ago(DAY))
    (outcome,), rechecks = purge(rule_event_id, rule_name(COMPLETE))
    assert outcome.status == SKIPPED and outcome.reason.startswith("not yet due: rule_event_failed at ")
    row = platform.row(rule_event_id)
    assert row["status"] == FAILED
    assert rechecks == [(KIND, rule_event_id, "rule_event_failed", epoch_ms(row["updated_at"]) + 30 * 86_400_000)]


@pytest.mark.integration
def test_a_row_without_updated_at_is_dated_by_its_status_write_time_and_a_platform_write_in_between_keeps_it(
        platform, purge, keyspace):
    """SPEC 8.1 at delete time: rows another writer inserted COMPLETE without updated_at, at a write time the test
    gives. Written 8 days ago: purged (by the undated condition). Written now: kept, rechecked at that write time
    plus the period, not due at once. Written 8 days ago, then set COMPLETE again by the platform (updated_at set)
    between the purge's read and its delete: kept."""
    session, name = keyspace
    due, young, raced = new_id(), new_id(), new_id()
    long_ago, now_micros = int(ago(8 * DAY).timestamp() * 1e6), int(time.time() * 1e6)
    for rule_event_id, written in ((due, long_ago), (young, now_micros), (raced, long_ago)):
        session.execute(f"INSERT INTO {name}.{TABLE} (rule_event_id, status) VALUES (%s, '{COMPLETE}') "
                        f"USING TIMESTAMP {written}", (rule_event_id,))

    (outcome,), rechecks = purge(due, rule_name(COMPLETE))
    assert outcome.status == PURGED and rechecks == [] and platform.row(due) is None

    (outcome,), rechecks = purge(young, rule_name(COMPLETE))
    assert outcome.status == SKIPPED and outcome.reason.startswith("not yet due: rule_event_complete at ")
    assert rechecks == [(KIND, young, "rule_event_complete", now_micros // 1000 + 7 * 86_400_000)]
    assert platform.row(young) is not None

    read = RuleEventPurge.read

    def read_then_a_platform_write(self, candidate, serial=False):
        found = read(self, candidate, serial)
        if found is not None and found["updated_at"] is None:
            platform.set_status(raced, COMPLETE)
        return found

    with mock.patch.object(RuleEventPurge, "read", read_then_a_platform_write):
        (outcome,), _ = purge(raced, rule_name(COMPLETE))
    assert outcome.status == SKIPPED and platform.row(raced)["updated_at"] is not None


@pytest.mark.integration
def test_a_row_due_under_another_rule_is_rechecked_at_once_and_then_purged(platform, purge):
    rule_event_id = new_id()
    platform.raise_event(rule_event_id, "m1", "route", FAILED, at=ago(40 * DAY))
    platform.set_status(rule_event_id, COMPLETE, at=ago(8 * DAY))
    before = now_ms()
    (outcome,), rechecks = purge(rule_event_id, rule_name(FAILED))
    assert (outcome.status, outcome.reason) == (SKIPPED, "kept: rule_event_failed did not hold (status COMPLETE)")
    [(_, _, rule, at_ms)] = rechecks
    assert rule == "rule_event_complete" and before <= at_ms <= now_ms()
    (outcome,), _ = purge(rule_event_id, rule)
    assert outcome.status == PURGED


@pytest.mark.integration
def test_a_gone_row_is_already_gone_unless_the_purger_meant_to_delete_it(platform, purge):
    """No intent (the platform removed it): already gone, in any batch. The purger's own deletion found gone
    again (a retry whose first attempt's outcomes were lost, a later batch, a replay): purged, from its intent,
    under the batch that meant it, so the ledger keeps one record."""
    (outcome,), rechecks = purge(new_id(), rule_name(COMPLETE))
    assert outcome.status == ALREADY_GONE and rechecks == []
    old = new_id()
    platform.raise_event(old, "m1", "route", COMPLETE, at=ago(8 * DAY))
    assert [o.status for o in purge(old, rule_name(COMPLETE))[0]] == [PURGED]
    before = now_ms()
    (outcome,), rechecks = purge(old, rule_name(COMPLETE), batch="q/2")
    assert (outcome.status, category(outcome.reason), outcome.intent) == (PURGED, EARLIER_ATTEMPT, "q/1")
    assert outcome.deleted_at_ms >= before and rechecks == []


@pytest.mark.integration
def test_a_dry_run_deletes_nothing(platform, purge):
    old, fresh, gone = new_id(), new_id(), new_id()
    platform.raise_event(old, "m1", "route", COMPLETE, at=ago(8 * DAY))
    platform.raise_event(fresh, "m2", "route", COMPLETE, at=ago(DAY))
    assert [o.status for o in purge(old, rule_name(COMPLETE), dry_run=True)[0]] == [WOULD_DELETE]
    (outcome,), rechecks = purge(fresh, rule_name(COMPLETE), dry_run=True)
    assert outcome.status == SKIPPED and outcome.reason.startswith("not yet due: ") and rechecks == []
    assert [o.status for o in purge(gone, rule_name(COMPLETE), dry_run=True)[0]] == [ALREADY_GONE]
    assert platform.row(old) is not None and platform.row(fresh) is not None


@pytest.mark.integration
def test_the_platforms_events_fold_to_the_deadline_the_row_gives(platform, topic):
    rule_event_id = new_id()
    platform.raise_event(rule_event_id, "m1", "route-to-archive")
    platform.set_status(rule_event_id, PROCESSING)
    platform.set_status(rule_event_id, COMPLETE)
    platform.flush()
    events = emitted(topic, rule_event_id)
    assert [e["status"] for e in events] == [UNPROCESSED, PROCESSING, COMPLETE]
    assert {k for e in events for k in e} == {
        "event_id", "type", "event_time", "rule_event_id", "status", "message_id", "rule_name"}
    assert (events[0]["message_id"], events[0]["rule_name"]) == ("m1", "route-to-archive")
    kind = load_policy("rule_events", {"enabled": True}).kinds[0]
    state = kind.fold(None, [StatusEvent(e["event_id"], e["type"], parse_timestamp(e["event_time"]), e["rule_event_id"],
                                         e["status"], e.get("message_id"), e.get("rule_name")) for e in events])
    row = platform.row(rule_event_id)
    assert (state.message_id, state.rule_name) == (row["message_id"], row["rule_name"])
    assert kind.eligibility(state) == Eligibility("rule_event_complete", epoch_ms(row["updated_at"]) + 7 * 86_400_000)
