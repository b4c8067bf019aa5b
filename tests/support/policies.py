"""What the policy tests (``rule_events``, ``users``, ``units_of_work``) share: a control that records
rechecks, a keyspace and a topic of a test module's own, the events a platform emitted, and the arrivals a
fold must withstand.

The servers are the session's: the fixtures use the ``config`` fixture (which starts or finds the servers
and honours PURGER_KAFKA_BOOTSTRAP, PURGER_CASSANDRA_HOSTS and PURGER_S3_ENDPOINT), so a module of them runs
alone; a helper given no configuration takes the same environment overrides (``environment_config``).

Example::

    keyspace = keyspace_fixture(UsersPolicy, "test_users")   # a module fixture on `config`: (session, name)
    topic = topic_fixture("test.users")                      # a module fixture on `config`: the topic's name
    control = RecordingControl("users")
    state = fold_in_batches(kind, events, random)
"""

from __future__ import annotations

import json
import random as _random
import time
import uuid
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import pytest
from functools import partial

from purger.core.settings import CassandraConfig, KafkaConfig, PurgerConfig
from purger.core.policy import Control, ObjectKind, Policy, Resources
from devstack.stack import keyspace_replication
from purger.setup import create_own_tables
from purger.sinks.failures import CassandraFailures
from purger.sinks.holds import CassandraHolds
from purger.sinks.journal import CassandraJournal


class RecordingControl(Control):
    """Records the rechecks a purger asks for; ``report`` fails, naming ``policy``, which sends no control
    events of its own."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.rechecks: list[tuple[str, str, str, int]] = []

    def recheck(self, kind: str, object_id: str, rule: str, at_ms: int) -> None:
        self.rechecks.append((kind, object_id, rule, at_ms))

    def report(self, event_type: str, object_id: str, event_time_ms: int, **fields: Any) -> None:
        raise AssertionError(f"{self.policy} sends no control events of its own")


def resources(session: Any, keyspace: str, control: Control, dry_run: bool = False) -> Resources:
    """What a policy's purger needs, on ``keyspace`` (made by ``policy_keyspace``): no object stores."""
    from purger.connectors import CassandraTables

    cassandra = CassandraConfig(keyspace=keyspace)
    return Resources(partial(CassandraTables, session, keyspace), stores=None, control=control,
                     journal=CassandraJournal(session, keyspace, cassandra.journal_table),
                     holds=CassandraHolds.of(session, cassandra),
                     failures=CassandraFailures(session, keyspace, cassandra.failures_table, 2_000, 60_000),
                     retry_ms=2_000, dry_run=dry_run)


def environment_config() -> PurgerConfig:
    """The default configuration with the environment's endpoint overrides (PURGER_KAFKA_BOOTSTRAP,
    PURGER_CASSANDRA_HOSTS, PURGER_S3_ENDPOINT), as the session's ``config`` fixture has its endpoints."""
    from purger.config import build_config

    return build_config({})


@contextmanager
def policy_keyspace(policy_class: type[Policy], prefix: str, cassandra: CassandraConfig) -> Iterator[tuple[Any, str]]:
    """A fresh keyspace ``<prefix>_<random>`` on ``cassandra``'s nodes with the policy's schema and the purger's
    journal: (a Cassandra session, its name); dropped after, and the session shut down."""
    from purger.connectors import cassandra_session

    session = cassandra_session(cassandra)
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    session.execute(f"CREATE KEYSPACE {name} WITH replication = {keyspace_replication(session)}")
    try:
        for statement in policy_class.schema.format(keyspace=name).split(";"):
            if statement.strip():
                session.execute(statement)
        create_own_tables(session, CassandraConfig(), name)
        yield session, name
    finally:
        session.execute(f"DROP KEYSPACE {name}")
        session.cluster.shutdown()


@contextmanager
def policy_topic(prefix: str, kafka: KafkaConfig) -> Iterator[str]:
    """A fresh topic ``<prefix>.<random>`` of one partition on ``kafka``'s brokers; deleted after."""
    from kafka.admin import KafkaAdminClient, NewTopic

    from purger.connectors import kafka_client

    admin = kafka_client(KafkaAdminClient, kafka)
    name = f"{prefix}.{uuid.uuid4().hex[:8]}"
    try:
        admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])
        yield name
        admin.delete_topics([name])
    finally:
        admin.close()


def keyspace_fixture(policy_class: type[Policy], prefix: str):
    """A module fixture ``keyspace``: ``policy_keyspace(policy_class, prefix)`` on the session's Cassandra."""

    @pytest.fixture(scope="module")
    def keyspace(config):
        with policy_keyspace(policy_class, prefix, config.cassandra) as found:
            yield found

    return keyspace


def topic_fixture(prefix: str):
    """A module fixture ``topic``: ``policy_topic(prefix)`` on the session's Kafka."""

    @pytest.fixture(scope="module")
    def topic(config):
        with policy_topic(prefix, config.kafka) as name:
            yield name

    return topic


def emitted(topic: str, object_id: str, timeout_ms: int = 10_000, kafka: KafkaConfig | None = None
            ) -> list[dict[str, Any]]:
    """The events on ``topic`` (on ``kafka``'s brokers, by default the environment's) keyed by ``object_id``,
    in order, as JSON: every record from the start up to the topic's end as this is called (the producer has
    flushed), which must be read within ``timeout_ms``."""
    from kafka import KafkaConsumer, TopicPartition

    from purger.connectors import kafka_client

    consumer = kafka_client(KafkaConsumer, kafka or environment_config().kafka, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        assert partitions, f"no topic {topic}"
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        end = consumer.end_offsets(partitions)
        deadline = time.monotonic() + timeout_ms / 1000
        records = []
        while any(consumer.position(p) < end[p] for p in partitions):
            assert time.monotonic() < deadline, f"{topic}: not read to its end within {timeout_ms} ms"
            for batch in consumer.poll(timeout_ms=500).values():
                records += batch
        return [json.loads(r.value) for r in sorted(records, key=lambda r: (r.partition, r.offset))
                if r.key == object_id.encode() and r.offset < end[TopicPartition(r.topic, r.partition)]]
    finally:
        consumer.close()


def arrivals(events: Sequence[Any], random: _random.Random) -> list[Any]:
    """The events as they may arrive: half of them again (a duplicate is the same event again), in any order."""
    arriving = list(events) + random.sample(list(events), k=len(events) // 2)
    random.shuffle(arriving)
    return arriving


def fold_in_batches(kind: ObjectKind, events: Sequence[Any], random: _random.Random) -> Any:
    """``kind``'s state from the ``arrivals`` of ``events``, folded in batches of random sizes, as micro-batches
    bring them."""
    pending, state = arrivals(events, random), None
    while pending:
        size = random.randint(1, len(pending))
        state, pending = kind.fold(state, pending[:size]), pending[size:]
    return state
