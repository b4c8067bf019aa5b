"""A stand-in for the messaging platform: it writes rows and blobs and emits lifecycle events.

The purger only reads events and deletes; this is the writer side that the
demo, the tests and the benchmarks play. Every change writes the Cassandra row
(with ``updated_at``) before it emits its event, as a real platform would.

Example::

    platform = Platform(config)
    platform.enqueue("m1", "p1", extract_count=1)
    platform.dequeue("m1", extract_count=0)
    platform.flush()
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable

from purger.config import PurgerConfig
from purger.connections import cassandra_session, kafka_producer, s3_client
from sinks.objects import payload_key
from streams.events import format_timestamp

INLINE_LIMIT = 10 * 1024  # payloads under 10 KiB live in the message row (SPEC section 2)


_last_moment = datetime.min.replace(tzinfo=timezone.utc)


def _now() -> datetime:
    """The wall clock, strictly increasing by at least a millisecond, as the spec's timestamps resolve.

    A platform's successive changes to one message must carry increasing event times.
    """
    global _last_moment
    _last_moment = max(datetime.now(timezone.utc), _last_moment + timedelta(milliseconds=1))
    return _last_moment


class Platform:
    def __init__(self, config: PurgerConfig) -> None:
        self.config = config
        self.session = cassandra_session(config.cassandra, config.cassandra.keyspace)
        self.stores = {dc: s3_client(store) for dc, store in config.stores.items()}
        self.producer = kafka_producer(config.kafka, acks="all", linger_ms=5)
        tables = config.cassandra
        self._insert_message = self.session.prepare(
            f"INSERT INTO {tables.messages_table} (message_id, mailbox, payload_id, payload_size, inline_payload, "
            "extract_count, extract_until, complete, deleted, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, false, ?, ?)"
        )
        self._insert_ref = self.session.prepare(
            f"INSERT INTO {tables.payload_refs_table} (payload_id, message_id) VALUES (?, ?)"
        )
        self._insert_payload = self.session.prepare(
            f"INSERT INTO {tables.payloads_table} (payload_id, size, dcs, state, last_ref_at, created_at) "
            "VALUES (?, ?, ?, 'live', ?, ?)"
        )
        self._set_count = self.session.prepare(
            f"UPDATE {tables.messages_table} SET extract_count = ?, updated_at = ? WHERE message_id = ?"
        )
        self._select_message = self.session.prepare(
            f"SELECT * FROM {tables.messages_table} WHERE message_id = ?"
        )

    def emit(self, event_type: str, message_id: str, at: datetime, **fields: Any) -> None:
        event = {"event_id": str(uuid.uuid4()), "type": event_type, "event_time": format_timestamp(at), "message_id": message_id}
        event.update(fields)
        self.producer.send(self.config.kafka.topics[0], key=message_id.encode(), value=json.dumps(event).encode())

    def enqueue(
        self,
        message_id: str,
        payload_id: str,
        *,
        extract_count: int | None = 1,
        size: int = 64 * 1024,
        mailbox: str = "inbox",
        dcs: Iterable[str] = ("dc1", "dc2"),
        at: datetime | None = None,
    ) -> None:
        """Create a message: its payload (inline or a blob in each data centre), row, reference, event."""
        at = at or _now()
        dcs = sorted(dcs)
        inline = size < INLINE_LIMIT
        body = (message_id.encode() * (size // max(len(message_id), 1) + 1))[:size]
        if not inline:
            for dc in dcs:
                self.stores[dc].put_object(Bucket=self.config.stores[dc].bucket, Key=payload_key(payload_id), Body=body)
            self.session.execute(self._insert_payload, (payload_id, size, set(dcs), at, at))
        self.session.execute(
            self._insert_message,
            (message_id, mailbox, payload_id, size, body if inline else None, extract_count, None, True, at, at),
        )
        self.session.execute(self._insert_ref, (payload_id, message_id))
        self.emit(
            "enqueue", message_id, at, mailbox=mailbox, payload_id=payload_id, payload_size=size, inline=inline,
            extract_count=extract_count, extract_until=None, complete=True, dcs=dcs,
        )

    def dequeue(self, message_id: str, extract_count: int, at: datetime | None = None) -> None:
        """A client extracted the message; the counter's new value is absolute."""
        at = at or _now()
        self.session.execute(self._set_count, (extract_count, at, message_id))
        self.emit("dequeue", message_id, at, extract_count=extract_count)

    def set_counter(self, message_id: str, extract_count: int, at: datetime | None = None) -> None:
        """An administrator set the counter (0 expires, above 0 revives)."""
        at = at or _now()
        self.session.execute(self._set_count, (extract_count, at, message_id))
        self.emit("extract_counter", message_id, at, extract_count=extract_count)

    def flush(self) -> None:
        self.producer.flush()

    def row(self, message_id: str) -> dict | None:
        found = self.session.execute(self._select_message, (message_id,)).one()
        return found._asdict() if found else None

    def blob_exists(self, payload_id: str, dc: str) -> bool:
        listing = self.stores[dc].list_objects_v2(Bucket=self.config.stores[dc].bucket, Prefix=payload_key(payload_id))
        return any(item["Key"] == payload_key(payload_id) for item in listing.get("Contents", []))

    def close(self) -> None:
        self.producer.close()
        self.session.cluster.shutdown()
