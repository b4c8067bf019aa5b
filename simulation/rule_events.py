"""A stand-in for the platform's routing rules: it writes ``rule_events`` rows and emits their events.

The writer side of the ``rule_events`` policy (docs/policies.md, rule_events) that the tests and
the demo play. Every change writes the row (``status`` and ``updated_at``)
before it emits its ``rule_event_status`` event, keyed by ``rule_event_id``,
as a real platform would. A change may be dated in the past (``at``) to make
a row old.

Example::

    from datetime import datetime, timedelta, timezone
    from purger.core.settings import CassandraConfig, KafkaConfig
    platform = RuleEventsPlatform(KafkaConfig(), CassandraConfig(), "mailbox.events", "mailbox")
    week_ago = datetime.now(timezone.utc) - timedelta(days=8)
    platform.raise_event("r1", "m1", "route-to-archive", at=week_ago)
    platform.set_status("r1", "COMPLETE", at=week_ago + timedelta(minutes=1))
    platform.flush()
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from purger.core.settings import CassandraConfig, KafkaConfig
from purger.policies.rule_events import RULE_EVENT_STATUS, TABLE, UNPROCESSED
from simulation.clock import now
from simulation.events import EventWriter


class RuleEventsPlatform(EventWriter):
    """The platform's writes of rule events, each followed by its event."""

    id_field = "rule_event_id"

    def __init__(self, kafka: KafkaConfig, cassandra: CassandraConfig, topic: str,
                 keyspace: str | None = None, table: str = TABLE) -> None:
        super().__init__(kafka, cassandra, topic)
        name = f"{keyspace or cassandra.keyspace}.{table}"
        self._insert = self.session.prepare(
            f"INSERT INTO {name} (rule_event_id, message_id, rule_name, status, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?)")
        # A status change may revive the event: a lightweight transaction, as the writer contract asks.
        self._update = self.session.prepare(
            f"UPDATE {name} SET status = ?, updated_at = ? WHERE rule_event_id = ? IF EXISTS")
        self._select = self.session.prepare(f"SELECT * FROM {name} WHERE rule_event_id = ?")

    def raise_event(self, rule_event_id: str, message_id: str, rule_name: str, status: str = UNPROCESSED,
                    at: datetime | None = None) -> None:
        """A routing rule raised an event for a message: its row, then its first event."""
        at = at or now()
        self.session.execute(self._insert, (rule_event_id, message_id, rule_name, status, at, at))
        self._emit(RULE_EVENT_STATUS, rule_event_id, at, status=status, message_id=message_id, rule_name=rule_name)

    def set_status(self, rule_event_id: str, status: str, at: datetime | None = None) -> None:
        """The rule event's status changed (it may go back, e.g. FAILED to UNPROCESSED on a retry), a millisecond
        after the row's plain insert (Cassandra stamps a lightweight transaction with its millisecond clock)."""
        at = at or now()
        time.sleep(0.002)
        self.session.execute(self._update, (status, at, rule_event_id))
        self._emit(RULE_EVENT_STATUS, rule_event_id, at, status=status)

    def row(self, rule_event_id: str) -> dict[str, Any] | None:
        found = self.session.execute(self._select, (rule_event_id,)).one()
        return found._asdict() if found else None
