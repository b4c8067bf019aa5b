"""What the purger sends to its own topics (SPEC 9.4 and 9.5), on the real Kafka.

A record Kafka does not take fails the flush of whatever sent it, with one line naming the topic and the
address, and nothing is counted as sent: the control reports and dead letters shared by a purge task's
threads, the reconcile feed, the clock (which logs it and ticks on). A dry run's ticks and reports go to a
control topic of its own, never to the real purger's.

The failures are real: a topic whose ``max.message.bytes`` no record fits, which the broker refuses, and a
record over the producer's own ``max_request_size``, which kafka-python refuses at the send.
"""

from __future__ import annotations

import json
import logging
import pickle
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from types import SimpleNamespace

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
import pyarrow as pa

from purger.connectors import NotDelivered, kafka_client, kafka_producer
from purger.core.settings import KafkaConfig
from purger.core.times import now_ms
from purger.reconcile.run import _feed_task
from purger.running import start_purger
from purger.setup import set_up
from purger.sinks.clients import executor_clients
from purger.sinks.dead_letters import DeadLetters
from purger.streams.clock import Clock
from purger.streams.control import ControlWriter
from simulation.mailbox import Platform
from tests.support.configs import own_config
from tests.support.waits import now, wait_for, wait_for_watermark

REFUSED = "MessageSizeTooLargeError: The server has a configurable maximum message size"


@pytest.fixture
def new_topic(config):
    """Make a topic of this test's own, one partition, ``topic_configs`` as given; deleted after the test."""
    admin = kafka_client(KafkaAdminClient, config.kafka)
    made = []

    def make(**topic_configs: str) -> str:
        name = f"test.sends.{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(name, 1, 1, topic_configs=topic_configs)])
        made.append(name)
        return name

    yield make
    admin.delete_topics(made)
    admin.close()


@pytest.fixture
def refusing_topic(new_topic) -> str:
    """A topic whose brokers take no record: a record batch alone is over its 64 bytes."""
    return new_topic(**{"max.message.bytes": "64"})


def values(kafka: KafkaConfig, topic: str) -> list[bytes]:
    """Every record value in ``topic``, read to its end."""
    consumer = kafka_client(KafkaConsumer, kafka)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        end = consumer.end_offsets(partitions)
        found: list[bytes] = []
        deadline = time.monotonic() + 30
        while any(consumer.position(p) < end[p] for p in partitions) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                found.extend(r.value for r in records)
        return found
    finally:
        consumer.close()


def refusal(config, topic: str, records: int) -> str:
    plural = "s" if records > 1 else ""
    return f"sending to Kafka at {config.kafka.bootstrap_servers} failed for {records} record{plural} of topic {topic} ("


def test_control_reports_kafka_refuses_fail_the_flush_in_one_line_naming_topic_and_address(config, new_topic,
                                                                                            refusing_topic):
    producer = kafka_producer(config.kafka, acks="all", linger_ms=20)  # as the sink's executors make it
    reports = ControlWriter(producer, refusing_topic, config.policy_set)
    try:
        for i in range(3):
            reports.recheck("message", f"m{i}", "expired_by_date", at_ms=now_ms())
        with pytest.raises(NotDelivered) as refused:
            reports.flush()
        line = str(refused.value)
        assert "\n" not in line
        assert line.startswith(refusal(config, refusing_topic, 3) + REFUSED)
        assert line.endswith("check that the brokers answer and that the topic exists and takes such records; "
                             "the task fails and runs again")
        reports.flush()  # each failure is told once: the task that runs again starts clean

        # The next task of the process, on the same producer, is delivered: kafka-python's producer that had
        # a record refused would abort every later one.
        control = new_topic()
        ControlWriter(producer, control, config.policy_set).recheck("message", "m9", "expired_by_date", 0)
        producer.flush()
    finally:
        producer.close()
    assert [json.loads(v)["message_id"] for v in values(config.kafka, control)] == ["m9"]


def test_reports_and_dead_letters_from_a_purges_threads_are_each_checked(config, new_topic):
    """The purge's pool shares one writer: every report is delivered or counted in the one error, per topic."""
    control, dead_letter = new_topic(), new_topic()
    # Dead letters over the producer's max_request_size, refused at the send: the reports still go.
    producer = kafka_producer(config.kafka, acks="all", linger_ms=20, max_request_size=10_000)
    reports = ControlWriter(producer, control, config.policy_set)
    dead_letters = DeadLetters(producer, dead_letter)  # the same producer, as the sink's clients share it

    def purge(i: int) -> None:
        reports.recheck("message", f"m{i}", "expired_by_date", at_ms=now_ms())
        if i % 10 == 0:
            dead_letters.send(b"k", b"x" * 20_000, "not an event", "events", 0, i)

    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(purge, range(400)))
        with pytest.raises(NotDelivered) as refused:
            reports.flush()  # the sink's flush: the dead letters' records too
        line = str(refused.value)
        assert line.startswith(refusal(config, dead_letter, 40) + "MessageSizeTooLargeError: The message is")
        assert control not in line
    finally:
        producer.close()
    assert len(values(config.kafka, control)) == 400
    assert values(config.kafka, dead_letter) == []


def test_a_record_the_client_refuses_at_the_send_fails_the_flush(config, new_topic):
    topic = new_topic()
    producer = kafka_producer(config.kafka, max_request_size=1000)
    try:
        DeadLetters(producer, topic).send(b"k", b"x" * 2000, "too large", "events", 0, 1)  # no error yet
        with pytest.raises(NotDelivered) as refused:
            producer.flush()
        assert str(refused.value).startswith(refusal(config, topic, 1) + "MessageSizeTooLargeError: The message is")
    finally:
        producer.close()
    assert values(config.kafka, topic) == []


def feed(config, topic: str, ids: list[str]) -> None:
    """The reconcile feed's task on ``messages`` rows of ``ids`` that the stream does not know, fed back to
    ``topic``: rows as the scan passes them on (their values pickled in ``Scanned.row_fields`` order)."""
    own = config.model_copy(update={"kafka": config.kafka.model_copy(update={"reconcile_topic": topic})})
    scanned = next(s for s in config.policy_set.policy_of("message").scanned if s.table == "messages")
    at = datetime(2026, 1, 1)
    values = {"mailbox": "inbox", "payload_id": "p1", "payload_size": 10, "inline_payload": b"x", "extract_count": 1,
              "extract_until": None, "complete": True, "deleted": None, "created_at": at, "updated_at": at}
    rows = [pickle.dumps(tuple({"message_id": i, **values}.get(name) for name in scanned.row_fields)) for i in ids]
    batch = pa.RecordBatch.from_pydict({"kind": ["message"] * len(ids), "id": ids, "row": rows})
    assert list(_feed_task(own, scanned, iter([batch]))) == []


def test_a_reconcile_feeds_backlog_is_read_a_slice_a_batch_and_holds_back_neither_the_clock_nor_new_purges(
        spark, config, tmp_path):
    """A bootstrap's feed (6,000 records: live rows, 100 a batch at most here) and, once it is being read, a
    message that comes due 6 s later: it is purged while the reconcile topic still has a backlog, so the clock
    ticked on through it (a clock that waited for it would hold the purge back until the last record)."""
    bound = 100
    own = own_config(config, tmp_path, "feed-backlog")
    own = own.model_copy(update={"kafka": own.kafka.model_copy(update={"reconcile_max_offsets_per_trigger": bound})})
    topic = own.kafka.reconcile_topic
    running = start_purger(spark, own)
    platform = Platform(own)
    try:
        wait_for(lambda: running.query.lastProgress is not None, 120, "the purger's first batch")
        feed(own, topic, [f"backlog-{i}" for i in range(2_000)])
        wait_for(lambda: read_of(running.query, topic)[0] > 0, 60, "the feed being read")
        m = f"due-{uuid.uuid4().hex[:8]}"
        platform.enqueue(m, f"p-{m}", extract_count=1)
        platform.dequeue(m, 0)  # due in expired_ttl (6 s)
        platform.flush()
        wait_for(lambda: platform.row(m) is None, 90, "the message come due during the feed's backlog, purged")
        read, latest = read_of(running.query, topic)
        assert read < latest, f"the feed was read to its end ({read} of {latest}) before the purge: no backlog"
        batches = [json.loads(p.json) for p in running.query.recentProgress]
        assert max(source["numInputRows"] for p in batches for source in p["sources"]
                   if topic in source["description"]) <= bound
    finally:
        running.stop()
        platform.close()


def read_of(query, topic: str) -> tuple[int, int]:
    """How many records of ``topic`` the query's last batch had read, and how many there were."""
    progress = query.lastProgress
    for source in json.loads(progress.json)["sources"] if progress is not None else []:
        if topic in (source.get("latestOffset") or {}):
            return sum((source.get("endOffset") or {}).get(topic, {}).values()), sum(source["latestOffset"][topic].values())
    return 0, 0


def test_the_reconcile_feed_fails_its_task_when_a_record_is_not_delivered(config, new_topic, refusing_topic):
    """Its rows are then not counted (the counts are the metrics Spark observes of the tasks that succeed)."""
    with pytest.raises(NotDelivered) as refused:
        feed(config, refusing_topic, [f"m{i}" for i in range(5)])
    assert str(refused.value).startswith(refusal(config, refusing_topic, 15) + REFUSED)

    delivered = new_topic()
    feed(config, delivered, ["m1", "m2"])
    found = [json.loads(v) for v in values(config.kafka, delivered)]
    assert sorted((r["message_id"], r["type"]) for r in found) == [
        ("m1", "enqueue"), ("m1", "extract_counter"), ("m1", "upload_complete"),
        ("m2", "enqueue"), ("m2", "extract_counter"), ("m2", "upload_complete")]


def test_the_clock_logs_a_tick_kafka_refuses_and_ticks_on(config, refusing_topic, caplog):
    # A query that has read everything, as the clock asks of Spark's, so that it ticks.
    read = {"events": {"0": 1}}
    query = SimpleNamespace(isActive=True, lastProgress=SimpleNamespace(
        json=json.dumps({"sources": [{"endOffset": read, "latestOffset": read}]})))
    kafka = config.kafka.model_copy(update={"control_topic": refusing_topic})
    def told() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "purger.streams.clock"]

    with caplog.at_level(logging.WARNING, logger="purger.streams.clock"):
        clock = Clock(kafka, interval_s=0.2).start(query)
        try:
            wait_for(lambda: len(told()) >= 3, 30, "three ticks refused")
            assert any(t.name == "purger-clock" for t in threading.enumerate())
        finally:
            clock.stop()
    for line in told():
        assert line.startswith("clock tick not delivered: " + refusal(config, refusing_topic, 1) + REFUSED), line
        assert line.endswith("; the next tick goes in 0.2 s") and "\n" not in line, line


def test_a_dry_run_ticks_and_reports_on_a_control_topic_of_its_own(spark, config, tmp_path_factory):
    """SPEC 9.5: a dry run beside a real purger on the same configuration sends nothing to the real one's
    control topic, which `purger setup` creates beside its own."""
    real = own_config(config, tmp_path_factory.mktemp("dry-control"), "dry-control")
    dry = real.as_dry_run()
    bootstrap = config.kafka.bootstrap_servers
    assert (f"topic {real.kafka.control_topic}.dry-run (kafka.control_topic of a dry run: 1 partition, kept 30 days) "
            f"on Kafka {bootstrap}") in set_up(real).created
    running = start_purger(spark, dry)
    try:
        # Its own ticks, read back from its own topic; a fresh query's first batches are slow on a busy machine.
        wait_for_watermark(running.query, now(), timeout_s=240)
        reports = executor_clients(dry).control  # the sink's writer, as a dry run's executors make it
        reports.recheck("message", "m-dry", "expired_by_date", at_ms=now_ms())
        reports.flush()
    finally:
        running.stop()
    assert values(real.kafka, real.kafka.control_topic) == []
    sent = [json.loads(v) for v in values(dry.kafka, dry.kafka.control_topic)]
    assert {r["type"] for r in sent} == {"clock", "recheck"}
