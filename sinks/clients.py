"""Each executor process's clients, made once per configuration: one Cassandra session, one S3 client
per data centre, one Kafka producer (the control topic's reports and the dead letters), and each
enabled policy's purger.

Example::

    clients = executor_clients(config)
    clients.purges["message"].purge(candidate, attempt)
"""

from __future__ import annotations

import threading
from functools import partial
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from purger.core.times import duration_ms
from purger.core.settings import PurgerConfig
from purger.core.handles import Resources
from purger.core.purge_protocol import Purge
from purger.connectors import CassandraTables, cassandra_session, kafka_producer, s3_client
from purger.sinks.dead_letters import DeadLetters
from purger.sinks.failures import CassandraFailures
from purger.sinks.holds import CassandraHolds
from purger.sinks.journal import CassandraJournal
from purger.sinks.objects import ObjectStores
from purger.sinks.restorations import CassandraRestorations
from purger.streams.control import ControlWriter

if TYPE_CHECKING:
    from cassandra.cluster import Session


@dataclass
class Clients:
    control: ControlWriter
    dead_letters: DeadLetters
    purges: dict[str, Purge]  # by kind
    failures: CassandraFailures
    journal: CassandraJournal
    stores: ObjectStores

    def flush(self) -> None:
        """What the purges left to send: the control reports."""
        self.control.flush()  # the dead letters share its producer


_lock = threading.Lock()
_made: dict[str, Clients] = {}
_sessions: dict[str, "Session"] = {}
_stores: dict[tuple[str, str], Any] = {}


def executor_session(config: PurgerConfig) -> "Session":
    """This executor process's Cassandra session for a configuration, made once: the purges' and the
    reconcile scans' (``reconcile.token_ranges``)."""
    with _lock:
        return _session(config)


def executor_store(config: PurgerConfig, dc: str) -> Any:
    """This executor process's S3 client for a data centre's store, made once per configuration: a reconcile's
    listing and its orphan blobs' purges (``reconcile.orphan_listing``, ``reconcile.orphan_purges``)."""
    with _lock:
        if (config.key, dc) not in _stores:
            _stores[config.key, dc] = s3_client(config.stores[dc])
        return _stores[config.key, dc]


def _session(config: PurgerConfig) -> "Session":
    if config.key not in _sessions:
        _sessions[config.key] = cassandra_session(config.cassandra)
    return _sessions[config.key]


def executor_clients(config: PurgerConfig) -> Clients:
    """This executor process's clients for a configuration, made once."""
    key = config.key
    with _lock:
        if key not in _made:
            policy_set = config.policy_set
            producer = kafka_producer(config.kafka, acks="all", linger_ms=20)
            control = ControlWriter(producer, config.kafka.control_topic, policy_set)
            retry_ms = duration_ms(config.stream.retry_interval)
            session = _session(config)
            journal = CassandraJournal(session, config.cassandra.keyspace, config.cassandra.journal_table)
            stores = ObjectStores(config.stores)
            failures = CassandraFailures.of(session, config)
            resources = Resources(partial(CassandraTables, session, config.cassandra.keyspace), stores, control,
                                  journal, CassandraHolds.of(session, config.cassandra), failures, retry_ms,
                                  config.stream.dry_run, CassandraRestorations.of(session, config, stores))
            purges = {kind: purge for policy in policy_set.policies for kind, purge in policy.purges(resources).items()}
            _made[key] = Clients(control, DeadLetters(producer, config.kafka.dead_letter_topic), purges, failures,
                                 journal, stores)
        return _made[key]
