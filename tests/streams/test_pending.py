"""Pending purges read from a stopped purger's checkpoint, on the real servers.

This module has a configuration of its own: its topics, its checkpoint, and long periods
(expired_ttl 1h, incomplete_ttl 2h, deleted_ttl 30m, payload_grace 90m; rule events processing
80m, users user_grace 100m; units of work P2Y) so that nothing fires while the purger runs; the
listing looks 3 hours ahead. A unit of work comes due at the start of tomorrow (UTC), listed
only when that is within the window.
"""

import uuid
from datetime import datetime, timedelta, timezone

import pytest
from pyspark.sql import functions as F

from simulation.mailbox import Platform
from simulation.rule_events import RuleEventsPlatform
from simulation.units_of_work import UnitsOfWorkPlatform
from simulation.users import UsersPlatform
from devstack.stack import prepare
from purger.config import with_policies
from purger.connectors import kafka_producer
from purger.policies.mailbox.state import RELEASED
from purger.policies.rule_events import PROCESSING
from purger.policies.units_of_work import Period, day_of
from purger.streams.control import ControlWriter
from purger.streams.pending import pending_purges
from purger.running import start_purger
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

HOUR = timedelta(hours=1)


@pytest.fixture(scope="module")
def pending_config(config, tmp_path_factory):
    run = uuid.uuid4().hex[:8]
    own = config.model_copy(update={
        "kafka": config.kafka.model_copy(update={
            "topics": [f"test.{run}.events"],
            "control_topic": f"test.{run}.control",
            "dead_letter_topic": f"test.{run}.dead-letter",
            "reconcile_topic": f"test.{run}.reconcile",
        }),
        "policies": {**config.policies, "mailbox": {
            "expired_ttl": HOUR, "incomplete_ttl": 2 * HOUR, "deleted_ttl": HOUR / 2, "payload_grace": HOUR * 1.5},
            "rule_events": {"enabled": True, "processing": "80m"},
            "users": {"enabled": True, "user_grace": "100m", "data_centres": ["dc1", "dc2"]},
            "units_of_work": {"enabled": True}},
        "stream": config.stream.model_copy(update={"checkpoint": str(tmp_path_factory.mktemp("pending-checkpoint"))}),
    })
    own = with_policies(own)
    prepare(own, partitions=2)
    return own


def _epoch_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _processed_since(query, moment: datetime) -> bool:
    """A batch triggered after ``moment`` read up to the latest offsets of every source."""
    return any(
        datetime.fromisoformat(p["timestamp"]) > moment
        and all(s.get("endOffset") == s.get("latestOffset") for s in p["sources"])
        for p in query.recentProgress
    )


@pytest.fixture(scope="module")
def scheduled(spark, pending_config):
    """Objects with various deadlines, through the purger, which is then stopped.
    Returns the moment they count from, the ids by case and the expected listing."""
    t0 = datetime.fromtimestamp(_epoch_ms(datetime.now(timezone.utc)) / 1000, timezone.utc)
    before = t0 - timedelta(seconds=1)
    run = uuid.uuid4().hex[:8]
    ids = {name: f"pending-{run}-{name}"
           for name in ("counter", "incomplete", "deleted", "rechecked", "live", "far", "rule", "user", "unit")}
    platform = Platform(pending_config)
    try:
        platform.enqueue(ids["counter"], f"p-{ids['counter']}", extract_count=2, at=before)
        platform.dequeue(ids["counter"], 0, at=t0)
        platform.enqueue(ids["incomplete"], f"p-{ids['incomplete']}", complete=False, at=t0)
        platform.enqueue(ids["deleted"], f"p-{ids['deleted']}", at=before)
        platform.delete(ids["deleted"], at=t0)
        platform.enqueue(ids["rechecked"], f"p-{ids['rechecked']}", extract_count=2, at=t0)
        platform.enqueue(ids["live"], f"p-{ids['live']}", extract_count=2, at=t0)
        platform.enqueue(ids["far"], f"p-{ids['far']}", extract_count=None, extract_until=t0 + timedelta(days=10),
                         at=t0)
        platform.flush()
    finally:
        platform.close()
    kafka, cassandra, policies = pending_config.kafka, pending_config.cassandra, pending_config.policy_set
    topic, keyspace = kafka.topics[0], cassandra.keyspace
    rules = RuleEventsPlatform(kafka, cassandra, topic, keyspace)
    users = UsersPlatform(kafka, cassandra, topic, keyspace, policies.policy_of("user").settings)
    units = UnitsOfWorkPlatform(kafka, cassandra, topic, keyspace, policies.policy_of("unit_of_work").settings)
    # Finished just after today's lower bound: eligible from tomorrow.
    finished = Period.parse("P2Y").lower_bound(day_of(_epoch_ms(t0))) + timedelta(minutes=1)
    try:
        rules.raise_event(ids["rule"], f"m-{ids['rule']}", "forward", status=PROCESSING, at=t0)
        users.add_user(ids["user"], "dc1", at=before)
        users.remove_user(ids["user"], "dc1", at=t0)
        units.start(ids["unit"], "PAYMENT", finished - HOUR)
        units.finish(ids["unit"], finished)
    finally:
        for platform in (rules, users, units):
            platform.flush()
            platform.close()

    started = datetime.now(timezone.utc)
    running = start_purger(spark, pending_config)
    try:
        wait_for(lambda: _processed_since(running.query, started), what="the events to be processed")
        # The control topic is read from its end, so the reports go after the first batch.
        reports = ControlWriter(kafka_producer(pending_config.kafka), pending_config.kafka.control_topic,
                                pending_config.policy_set)
        try:
            reports.recheck("message", ids["rechecked"], "expired_by_date", at_ms=_epoch_ms(t0 + 0.75 * HOUR))
            reports.report(RELEASED, f"p-{ids['deleted']}", _epoch_ms(t0), message_id=ids["deleted"],
                           observed_at_ms=_epoch_ms(t0), dcs=["dc1", "dc2"])
            reports.flush()
        finally:
            reports.producer.close()
        sent = datetime.now(timezone.utc)
        wait_for(lambda: _processed_since(running.query, sent), what="the reports to be processed")
    finally:
        running.stop()
    assert running.failure is None

    tomorrow = datetime.combine(day_of(_epoch_ms(t0)) + timedelta(days=1), datetime.min.time(), timezone.utc)
    due = {
        ("message", ids["deleted"]): ("deleted", t0 + HOUR / 2, f"p-{ids['deleted']}"),
        ("message", ids["rechecked"]): ("expired_by_date", t0 + 0.75 * HOUR, f"p-{ids['rechecked']}"),
        ("message", ids["counter"]): ("expired_by_counter", t0 + HOUR, f"p-{ids['counter']}"),
        ("rule_event", ids["rule"]): ("rule_event_processing", t0 + HOUR * 4 / 3, None),
        ("payload", f"p-{ids['deleted']}"): ("payload", t0 + 1.5 * HOUR, None),
        ("user", ids["user"]): ("user_absent", t0 + HOUR * 5 / 3, None),
        ("message", ids["incomplete"]): ("incomplete", t0 + 2 * HOUR, f"p-{ids['incomplete']}"),
        ("unit_of_work", ids["unit"]): ("retention", tomorrow, None),
    }
    # Earliest first, within the 3 hours of the widest listing.
    expected = dict(sorted(((key, v) for key, v in due.items() if v[1] <= t0 + 3 * HOUR), key=lambda kv: kv[1][1]))
    return t0, ids, expected


def _listing(spark, config, until: datetime) -> list[tuple]:
    pending = pending_purges(spark, config.stream.checkpoint, until, config.policy_set)
    assert pending.columns == ["kind", "id", "rule", "due_at", "hint"]
    return [tuple(r) for r in pending.select("kind", "id", "rule", F.unix_millis("due_at"),
                                             F.get_json_object("hint", "$.payload_id")).collect()]


def _assert_lists(listing: list[tuple], expected: dict) -> None:
    assert [(kind, object_id) for kind, object_id, *_ in listing] == list(expected), "exactly these, earliest first"
    for kind, object_id, rule, due_ms, payload_id in listing:
        expected_rule, expected_due, expected_payload = expected[(kind, object_id)]
        assert (rule, payload_id) == (expected_rule, expected_payload), object_id
        assert abs(due_ms - _epoch_ms(expected_due)) <= 1000, f"{object_id}: due {due_ms}, expected {expected_due}"


def test_lists_what_comes_due_within_the_window_with_its_rule(spark, pending_config, scheduled):
    """Own eligibilities of every rule and a recheck; not the live message, nor one due in 10 days."""
    t0, ids, expected = scheduled
    listing = _listing(spark, pending_config, t0 + 3 * HOUR)
    _assert_lists(listing, expected)
    listed = {object_id for _, object_id, *_ in listing}
    assert ids["live"] not in listed and ids["far"] not in listed


def test_a_narrower_window_lists_only_the_earlier_ones(spark, pending_config, scheduled):
    t0, ids, expected = scheduled
    listing = _listing(spark, pending_config, t0 + 0.9 * HOUR)
    _assert_lists(listing, {key: value for key, value in expected.items() if value[1] < t0 + 0.9 * HOUR})
    assert len(listing) >= 2


def test_until_must_be_timezone_aware(spark, pending_config):
    with pytest.raises(ValueError, match="timezone-aware"):
        pending_purges(spark, pending_config.stream.checkpoint, datetime.now(), pending_config.policy_set)
