"""A stand-in for the push platform: the writer side of ``push_clients_policy``'s contract.

It writes the ``push_routers`` and ``push_messages`` rows as the contract in
``push_clients_policy`` says (the router row only by lightweight transactions,
a connect waiting out a purge that holds the row), then emits the event of each
registration or connection to Kafka as JSON (``event_id``, ``type``,
``event_time``, ``client_id``), keyed by ``client_id``. A connection may be
dated in the past (``at``) to make a client inactive, and its event held back
(``emit=False``) to play one that is late.

Example::

    from purger.config import load_config
    config = load_config("purger.toml")
    platform = PushClientsPlatform(config.kafka, config.cassandra, config.kafka.topics[0])
    platform.connect("c1", endpoint="https://push.example/c1")   # registers it: push_client_registered
    platform.send_message("c1", "m1", b"hello")                   # True: stored for c1
    platform.connect("c1")                                        # push_client_connected
    platform.flush()
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from cassandra import ConsistencyLevel
from kafka import KafkaProducer

from purger.connectors import cassandra_session, read_serially
from purger.core.settings import CassandraConfig, KafkaConfig
from purger.core.times import format_timestamp
from push_clients_policy import MESSAGES, PUSH_CLIENT_CONNECTED, PUSH_CLIENT_REGISTERED, ROUTERS

# How long a connect waits before trying again while a purge holds the client's router row.
RETRY_S = 0.005


class PushClientsPlatform:
    """The platform's writes of push clients and their messages, each connection followed by its event."""

    def __init__(self, kafka: KafkaConfig, cassandra: CassandraConfig, topic: str,
                 keyspace: str | None = None) -> None:
        self.topic = topic
        self.producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all", linger_ms=5)
        self.session = cassandra_session(cassandra)
        prepare = self.session.prepare
        routers, messages = (f"{keyspace or cassandra.keyspace}.{table}" for table in (ROUTERS, MESSAGES))
        # (a) A connect never creates a row: on a missing one, "purging = null" alone would apply.
        self._connect = prepare(f"UPDATE {routers} SET last_connected_at = ? WHERE client_id = ? "
                                "IF purging = null AND last_connected_at != null")
        # (b) A registration.
        self._register = prepare(f"INSERT INTO {routers} (client_id, endpoint, last_connected_at) "
                                 "VALUES (?, ?, ?) IF NOT EXISTS")
        # (c) A message, then the router's word on it.
        self._write_message = prepare(f"INSERT INTO {messages} (client_id, message_id, body) VALUES (?, ?, ?)")
        self._unwrite_message = prepare(f"DELETE FROM {messages} WHERE client_id = ? AND message_id = ?")
        for statement in (self._write_message, self._unwrite_message):
            statement.consistency_level = ConsistencyLevel.LOCAL_QUORUM
        self._read_router = read_serially(self.session, prepare(f"SELECT * FROM {routers} WHERE client_id = ?"))
        self._read_messages = prepare(f"SELECT message_id, body FROM {messages} WHERE client_id = ?")
        self._read_messages.consistency_level = ConsistencyLevel.LOCAL_QUORUM
        self._last = datetime.min.replace(tzinfo=timezone.utc)
        self._clock = threading.Lock()

    def connect(self, client_id: str, endpoint: str | None = None, at: datetime | None = None,
                emit: bool = True) -> str:
        """The client connected: its router row says so, then its event (unless ``emit`` is False).
        An unknown client registers (with ``endpoint``, by default one made of its id); a client whose
        row a purge holds waits for the purge to end and registers anew. Returns the event type."""
        at = at or self._now()
        endpoint = endpoint or f"https://push.example/{client_id}"
        while True:
            if self.session.execute(self._connect, (at, client_id)).was_applied:
                event_type = PUSH_CLIENT_CONNECTED
                break
            if self.session.execute(self._register, (client_id, endpoint, at)).was_applied:
                event_type = PUSH_CLIENT_REGISTERED
                break
            time.sleep(RETRY_S)  # a purge holds the row: it deletes it soon
        if emit:
            self._emit(event_type, client_id, at)
        return event_type

    def send_message(self, client_id: str, message_id: str, body: bytes) -> bool:
        """Store a message for the client: True if stored; False if the client is gone or being purged
        (the message row is removed again, so none is left without its router)."""
        self.session.execute(self._write_message, (client_id, message_id, body))
        router = self.session.execute(self._read_router, (client_id,)).one()
        if router is None or router.purging:
            self.session.execute(self._unwrite_message, (client_id, message_id))
            return False
        return True

    def router(self, client_id: str) -> dict[str, Any] | None:
        found = self.session.execute(self._read_router, (client_id,)).one()
        return found._asdict() if found else None

    def messages(self, client_id: str) -> dict[str, bytes]:
        return {r.message_id: r.body for r in self.session.execute(self._read_messages, (client_id,))}

    def flush(self) -> None:
        """Wait until every event emitted so far is in Kafka."""
        self.producer.flush()

    def close(self) -> None:
        self.producer.close()
        self.session.cluster.shutdown()

    def _emit(self, event_type: str, client_id: str, at: datetime) -> None:
        event = {"event_id": str(uuid.uuid4()), "type": event_type, "event_time": format_timestamp(at),
                 "client_id": client_id}
        self.producer.send(self.topic, key=client_id.encode(), value=json.dumps(event).encode())

    def _now(self) -> datetime:
        """The wall clock, strictly increasing by at least the millisecond events keep."""
        with self._clock:
            self._last = max(datetime.now(timezone.utc), self._last + timedelta(milliseconds=1))
            return self._last
