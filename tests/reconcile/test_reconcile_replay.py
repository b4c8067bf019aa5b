"""A replay that cannot see everything, completed by a reconcile (docs/reconciliation.md; docs/operations.md,
"Replay and the runbook").

The events topic loses its oldest records, as Kafka's retention removes them, before a replay into a fresh
checkpoint; the objects those records were about are unknown to the replay. A reconcile then finds their
rows and feeds them back, and the tables end as a run that saw every event leaves them: every due object of
every policy gone, every kept one intact, one ledger record per deletion.
"""

from __future__ import annotations

import uuid

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient

from devstack.stack import prepare
from purger.config import with_policies
from purger.connectors import cassandra_session, kafka_client
from purger.reconcile.run import reconcile
from purger.replay import follow, start_replay
from simulation.mailbox import Platform
from simulation.policy_objects import SETTINGS, PolicyObjects
from tests.support.configs import own_config
from tests.support.mailbox import end_state, write_work
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration


def test_a_replay_from_topics_that_lost_their_oldest_events_then_a_reconcile_ends_as_a_full_run(
        spark, config, tmp_path_factory):
    run = uuid.uuid4().hex[:8]
    own = own_config(with_policies(config, {**config.policies, **SETTINGS}), tmp_path_factory.mktemp("replay"),
                     "reconcile-replay")
    stores = {dc: store.model_copy(update={"bucket": f"replay-{run}-{dc}"}) for dc, store in own.stores.items()}
    own = own.model_copy(update={"cassandra": own.cassandra.model_copy(update={"keyspace": f"replay_{run}"}),
                                 "stores": stores})
    prepare(own, partitions=2)
    platform, objects = Platform(own), PolicyObjects(own)
    eligible: list[str] = []
    live: list[str] = []
    try:
        # The oldest history, whose events the topic will lose.
        write_work(platform, "lost", 4, own, eligible, live)
        written = objects.write(f"lost-{run}")
        objects.flush()
        lost_up_to = end_offsets(own)
        # Newer history, still in the topic.
        write_work(platform, "kept", 4, own, eligible, live)
        written += objects.write(f"kept-{run}")
        objects.flush()
        truncate(own, lost_up_to)

        running, backlog = start_replay(spark, own, since_ms=None)
        try:
            follow(running.query, backlog, show=False, timeout_s=180)
            lost = [m for m in eligible if m.startswith("lost-")]
            heard = [m for m in eligible if m.startswith("kept-")]
            wait_for(lambda: all(platform.row(m) is None for m in heard), 120, "the replay to purge what it read")
            assert all(platform.row(m) is not None for m in lost)  # nothing told the replay of them

            report = {(r.policy, r.table): r for r in reconcile(spark, own, state_apart=False)
                      if r.dc == "all"}  # the state read as `purger reconcile` reads it
            assert report[("mailbox", "messages")].unknown_fed >= len(lost)
            wait_for(lambda: all(platform.row(m) is None and platform.payload_gone(f"p-{m}") for m in eligible)
                     and all(objects.gone(o) for o in written if o.eligible), 180,
                     "every due object, heard of or not, to be purged")
        finally:
            running.stop()
        wrongly_deleted, missing, doubled, unexpected = end_state(spark, platform, own, eligible, live, objects,
                                                                  written)
        assert not wrongly_deleted and not missing and not doubled and not unexpected
        assert all(objects.intact(o) for o in written if not o.eligible)
    finally:
        platform.close()
        objects.close()
        session = cassandra_session(own.cassandra)
        session.execute(f"DROP KEYSPACE IF EXISTS {own.cassandra.keyspace}", timeout=60)
        session.cluster.shutdown()


def end_offsets(config) -> dict[TopicPartition, int]:
    consumer = KafkaConsumer(bootstrap_servers=config.kafka.bootstrap_servers)
    try:
        topic = config.kafka.topics[0]
        return consumer.end_offsets([TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)])
    finally:
        consumer.close()


def truncate(config, before: dict[TopicPartition, int]) -> None:
    """Delete the events topic's records before ``before``, as retention would."""
    admin = kafka_client(KafkaAdminClient, config.kafka)
    try:
        admin.delete_records(before)
    finally:
        admin.close()


def test_json_starting_offsets_that_leave_out_the_reconcile_topic_read_it_from_its_start(spark, config, tmp_path):
    """`purger run --starting-offsets '{"<events topic>": {...}}'`: Spark wants every partition of the source named;
    the reconcile topic, left out, is read from its start, and the events topic from the offsets given."""
    from purger.connectors import kafka_producer
    from purger.streams.source import read_records

    own = own_config(config, tmp_path, "offsets")
    events, fed = own.kafka.topics[0], own.kafka.reconcile_topic
    producer = kafka_producer(own.kafka, acks="all")
    try:
        for topic, partition, value in ((events, 0, b"e0"), (events, 0, b"e1"), (events, 1, b"e2"),
                                        (fed, 0, b"r0"), (fed, 1, b"r1")):
            producer.send(topic, value=value, partition=partition)
        producer.flush()
    finally:
        producer.close()
    offsets = f'{{"{events}": {{"0": 1, "1": -2}}}}'  # the first record of partition 0 skipped
    query = (read_records(spark, own, starting_offsets=offsets).writeStream.format("memory")
             .queryName(f"offsets_{uuid.uuid4().hex[:6]}").option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(180), "the Kafka source did not read to the end within 180 s"
        assert query.exception() is None
        read = {(row.topic, bytes(row.value)) for row in spark.table(query.name).collect()}
    finally:
        query.stop()
    assert read == {(events, b"e1"), (events, b"e2"), (fed, b"r0"), (fed, b"r1")}
