"""Event parsing, run by Spark on records shaped like the Kafka source's."""

import json

import pytest

from purger.config import build_config
from purger.streams.parse import parse_events

pytestmark = pytest.mark.integration  # Spark (a JVM), though no server

CONTROL = "purger.control"

GOOD = {
    "enqueue": {"event_id": "e1", "type": "enqueue", "event_time": "2026-01-01T07:58:00.000Z", "message_id": "m1",
                "mailbox": "inbox", "payload_id": "p1", "payload_size": 20000, "inline": False,
                "extract_count": 2, "extract_until": None, "complete": True, "dcs": ["dc1", "dc2"]},
    "dequeue": {"event_id": "e2", "type": "dequeue", "event_time": "2026-01-01T08:00:00.000Z",
                "message_id": "m1", "extract_count": 1},
    "extract_counter": {"event_id": "e3", "type": "extract_counter", "event_time": "2026-01-01T08:01:00.000Z",
                        "message_id": "m1", "extract_count": 0},
}


def parse(spark, values, topic="mailbox.events"):
    records = spark.createDataFrame(
        [(None, v, topic, 0, i, None) for i, v in enumerate(values)],
        "key binary, value binary, topic string, partition int, offset long, timestamp timestamp",
    )
    return parse_events(records, [CONTROL], build_config({}).policy_set).orderBy("offset").collect()


def test_good_events_parse_to_typed_rows(spark):
    rows = parse(spark, [json.dumps(e).encode() for e in GOOD.values()])
    assert [r.error for r in rows] == [None, None, None]
    enqueue, dequeue, admin = rows
    assert enqueue.event_time_ms == 1767254280000
    assert (enqueue.payload_size, enqueue.inline, list(enqueue.dcs)) == (20000, False, ["dc1", "dc2"])
    assert enqueue.extract_count == 2 and enqueue.extract_until_ms is None
    assert (dequeue.type, dequeue.extract_count) == ("dequeue", 1)
    assert (admin.type, admin.extract_count) == ("extract_counter", 0)


TICK = b'{"event_id": "c", "type": "clock", "event_time": "2026-01-01T08:00:00.000Z"}'
RECHECK = (b'{"event_id": "r", "type": "recheck", "event_time": "2026-01-01T08:00:00.000Z", "kind": "payload",'
           b' "payload_id": "p1", "rule": "payload"}')


def test_control_events_parse_on_the_control_topic(spark):
    tick, recheck = parse(spark, [TICK, RECHECK], topic=CONTROL)
    assert tick.error is None and tick.type == "clock"
    assert recheck.error is None and (recheck.kind, recheck.payload_id, recheck.rule) == ("payload", "p1", "payload")


def test_control_events_are_bad_input_on_an_events_topic(spark):
    """So a producer on the events topics cannot steer the purger's schedule."""
    rows = parse(spark, [TICK, RECHECK])
    assert [r.error for r in rows] == ["unknown type clock", "unknown type recheck"]
    [row] = parse(spark, [with_("type", "recheck")])
    assert row.error == "unknown type recheck"


def test_a_clock_tick_on_an_events_topic_moves_no_watermark_and_is_dead_lettered(spark):
    """Only a tick of the control topic carries watermark time: one on an events topic, however far in the future
    (or the past, where Spark would drop it as late before the dead letters), is a dead letter like any bad record."""
    from purger.core.vocabulary import DEAD_LETTER
    from purger.streams.processor import routed

    future = b'{"event_id": "f", "type": "clock", "event_time": "2999-01-01T00:00:00.000Z"}'
    records = spark.createDataFrame(
        [(None, value, topic, 0, offset, None)
         for offset, (value, topic) in enumerate([(future, "mailbox.events"), (TICK, "mailbox.events"), (TICK, CONTROL)])],
        "key binary, value binary, topic string, partition int, offset long, timestamp timestamp")
    policies = build_config({}).policy_set
    rows = routed(parse_events(records, [CONTROL], policies), policies).orderBy("offset").collect()
    assert [(r.kind, r.watermark_time is None) for r in rows] == [(DEAD_LETTER, True), (DEAD_LETTER, True),
                                                                  ("clock", False)]


def with_(name, value, base="dequeue"):
    event = dict(GOOD[base])
    event[name] = value
    return json.dumps(event).encode()


def without(name, base="dequeue"):
    event = dict(GOOD[base])
    del event[name]
    return json.dumps(event).encode()


@pytest.mark.parametrize(
    "value, reason",
    [
        (None, "empty record (tombstone)"),
        (b"", "value is not a JSON object"),
        (b'{"event_id": "e1", "type": "deq', "value is not a JSON object"),
        (b"\xff\xfe\x00garbage", "value is not UTF-8"),
        (b"[1, 2]", "value is not a JSON object"),
        (without("message_id"), "missing field message_id"),
        (without("event_id"), "missing field event_id"),
        (with_("type", "archive"), "unknown type archive"),
        (with_("extract_count", "many"), "field extract_count has the wrong type"),
        (with_("event_time", "yesterday"), "event_time is not an ISO-8601 UTC timestamp"),
        (with_("event_time", "2026-02-30T25:00:00.000Z"), "event_time is not an ISO-8601 UTC timestamp"),
        (without("extract_count"), "dequeue event lacks field extract_count"),
        (without("payload_id", base="enqueue"), "enqueue event lacks field payload_id"),
        (with_("inline", "yes", base="enqueue"), "field inline has the wrong type"),
    ],
)
def test_bad_input_carries_its_reason(spark, value, reason):
    [row] = parse(spark, [value])
    assert row.error == reason
    assert row.value == (bytearray(value) if value is not None else None)
