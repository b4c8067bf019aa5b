"""Each executor process's clients, made once per configuration: one Cassandra session, one S3 client
per data centre, one Kafka producer (the control topic's reports and the dead letters), and each
enabled policy's purger.

Example::

    clients = executor_clients(config)
    clients.purgers["message"].purge(candidate, attempt)
"""

from __future__ import annotations

import pickle
import threading
from dataclasses import dataclass

from core.config import PurgerConfig
from core.policy import Purger, Resources
from connectors import cassandra_session, kafka_producer
from policies import policy_set
from sinks.dead_letters import DeadLetters
from sinks.journal import CassandraJournal
from sinks.objects import ObjectStores
from streams.control import ControlWriter


@dataclass
class Clients:
    control: ControlWriter
    dead_letters: DeadLetters
    purgers: dict[str, Purger]  # by kind
    retry_ms: int

    def flush(self) -> None:
        self.control.flush()  # the dead letters share its producer


_lock = threading.Lock()
_made: dict[str, Clients] = {}


def executor_clients(config: PurgerConfig) -> Clients:
    """This executor process's clients for a configuration, made once."""
    key = pickle.dumps(config)  # not its JSON, where every secret reads "**********"
    with _lock:
        if key not in _made:
            policies = policy_set(config)
            producer = kafka_producer(config.kafka, acks="all", linger_ms=20)
            control = ControlWriter(producer, config.kafka.control_topic, policies)
            retry_ms = int(config.stream.retry_interval.total_seconds() * 1000)
            session = cassandra_session(config.cassandra)
            journal = CassandraJournal(session, config.cassandra.keyspace, config.cassandra.journal_table)
            resources = Resources(session, config.cassandra.keyspace, ObjectStores(config.stores), control, journal,
                                  retry_ms, config.stream.dry_run)
            purgers = {}
            for policy in policies.policies:
                purger = policy.purger(resources)
                purgers.update({kind.name: purger for kind in policy.kinds})
            _made[key] = Clients(control, DeadLetters(producer, config.kafka.dead_letter_topic), purgers, retry_ms)
        return _made[key]
