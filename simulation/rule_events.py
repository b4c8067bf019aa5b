"""A stand-in for the platform's routing rules: it writes ``rule_events`` rows and emits their events.

The writer side of the ``rule_events`` policy (SPEC 7.1) that the tests and
the demo play. Every change writes the row (``status`` and ``updated_at``)
before it emits its ``rule_event_status`` event, keyed by ``rule_event_id``,
as a real platform would. A change may be dated in the past (``at``) to make
a row old.

Example::

    from datetime import datetime, timedelta, timezone
    from core.config import CassandraConfig, KafkaConfig
    platform = RuleEventsPlatform(KafkaConfig(), CassandraConfig(), "mailbox.events", "mailbox")
    week_ago = datetime.now(timezone.utc) - timedelta(days=8)
    platform.raise_event("r1", "m1", "route-to-archive", at=week_ago)
    platform.set_status("r1", "COMPLETE", at=week_ago + timedelta(minutes=1))
    platform.flush()
"""

from __future__ import annotations

import json
import threading
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from connectors import cassandra_session, kafka_producer
from core.config import CassandraConfig, KafkaConfig
from core.times import format_timestamp
from policies.rule_events import RULE_EVENT_STATUS, TABLE, UNPROCESSED


class RuleEventsPlatform:
    """The platform's writes of rule events, each followed by its event."""

    def __init__(self, kafka: KafkaConfig, cassandra: CassandraConfig, topic: str,
                 keyspace: str | None = None, table: str = TABLE) -> None:
        self.topic = topic
        self.producer = kafka_producer(kafka, acks="all", linger_ms=5)
        self.session = cassandra_session(cassandra)
        name = f"{keyspace or cassandra.keyspace}.{table}"
        self._insert = self.session.prepare(
            f"INSERT INTO {name} (rule_event_id, message_id, rule_name, status, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?)")
        self._update = self.session.prepare(f"UPDATE {name} SET status = ?, updated_at = ? WHERE rule_event_id = ?")
        self._select = self.session.prepare(f"SELECT * FROM {name} WHERE rule_event_id = ?")
        self._last = datetime.min.replace(tzinfo=timezone.utc)
        self._clock = threading.Lock()

    def raise_event(self, rule_event_id: str, message_id: str, rule_name: str, status: str = UNPROCESSED,
                    at: datetime | None = None) -> None:
        """A routing rule raised an event for a message: its row, then its first event."""
        at = at or self._now()
        self.session.execute(self._insert, (rule_event_id, message_id, rule_name, status, at, at))
        self._emit(rule_event_id, status, at, message_id=message_id, rule_name=rule_name)

    def set_status(self, rule_event_id: str, status: str, at: datetime | None = None) -> None:
        """The rule event's status changed (it may go back, e.g. FAILED to UNPROCESSED on a retry)."""
        at = at or self._now()
        self.session.execute(self._update, (status, at, rule_event_id))
        self._emit(rule_event_id, status, at)

    def row(self, rule_event_id: str) -> dict[str, Any] | None:
        found = self.session.execute(self._select, (rule_event_id,)).one()
        return found._asdict() if found else None

    def flush(self) -> None:
        """Wait until every event emitted so far is in Kafka."""
        self.producer.flush()

    def close(self) -> None:
        self.producer.close()
        self.session.cluster.shutdown()

    def _emit(self, rule_event_id: str, status: str, at: datetime, **first: str) -> None:
        event = {"event_id": str(uuid.uuid4()), "type": RULE_EVENT_STATUS, "event_time": format_timestamp(at),
                 "rule_event_id": rule_event_id, "status": status, **first}
        self.producer.send(self.topic, key=rule_event_id.encode(), value=json.dumps(event).encode())

    def _now(self) -> datetime:
        """The wall clock, strictly increasing by at least the millisecond the spec's timestamps keep:
        successive changes to one rule event carry increasing event times, as its row's writes are ordered."""
        with self._clock:
            self._last = max(datetime.now(timezone.utc), self._last + timedelta(milliseconds=1))
            return self._last
