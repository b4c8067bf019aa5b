"""A stand-in for the messaging platform: it writes rows and blobs and emits lifecycle events.

The purger only reads events and deletes; this is the writer side that the
demo, the tests and the benchmarks play. Every change writes the Cassandra row
(with ``updated_at``) before it emits its event, as a real platform would.

Example::

    platform = Platform(config)
    platform.enqueue("m1", "p1", extract_count=1)
    platform.enqueue("m2", "p1", shared=True)   # links to p1 by the writer contract (docs/policies.md, mailbox)
    platform.dequeue("m1", extract_count=0)
    platform.flush()
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Iterable, Iterator

from purger.core.settings import PurgerConfig
from purger.connectors import cassandra_session, kafka_producer, s3_client
from purger.core.times import format_timestamp
from purger.policies.mailbox.deletes import payload_key
from simulation.clock import now  # successive changes to one message carry increasing event times
from simulation.events import event_record

INLINE_LIMIT = 10 * 1024  # payloads under 10 KiB live in the message row (docs/reference.md, Events)


class Platform:
    """The platform's writes, with events. With ``events_only`` it emits the same events but writes no
    rows or blobs: for benchmarks of the stateful stage, which never reads them."""

    def __init__(self, config: PurgerConfig, events_only: bool = False) -> None:
        self.config = config
        self.events_only = events_only
        # Events alone come millions at a time: larger, later batches spare the sender thread's wake-ups.
        batching = dict(linger_ms=50, batch_size=1 << 20) if events_only else dict(linger_ms=5)
        self.producer = kafka_producer(config.kafka, acks="all", **batching)
        self._held = threading.local()  # events held by ``holding``, per thread
        if events_only:
            return
        self.session = cassandra_session(config.cassandra, config.cassandra.keyspace)
        self.stores = {dc: s3_client(store) for dc, store in config.stores.items()}
        tables = config.policy_set.policy_of("message").settings
        self._messages, self._refs, self._payloads = (
            tables.messages_table, tables.payload_refs_table, tables.payloads_table)
        self._insert_message = self.session.prepare(
            f"INSERT INTO {self._messages} (message_id, mailbox, payload_id, payload_size, inline_payload, "
            "extract_count, extract_until, complete, deleted, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, false, ?, ?)"
        )
        self._insert_ref = self.session.prepare(
            f"INSERT INTO {self._refs} (payload_id, message_id) VALUES (?, ?)"
        )
        self._delete_ref = self.session.prepare(
            f"DELETE FROM {self._refs} WHERE payload_id = ? AND message_id = ?"
        )
        self._insert_payload = self.session.prepare(
            f"INSERT INTO {self._payloads} (payload_id, size, dcs, state, last_ref_at, created_at) "
            "VALUES (?, ?, ?, 'live', ?, ?) IF NOT EXISTS"
        )
        self._touch_payload = self.session.prepare(
            f"UPDATE {self._payloads} SET last_ref_at = ? WHERE payload_id = ? IF state = 'live'"
        )
        self._select_message = self.session.prepare(f"SELECT * FROM {self._messages} WHERE message_id = ?")
        self._select_payload = self.session.prepare(f"SELECT * FROM {self._payloads} WHERE payload_id = ?")
        self._select_refs = self.session.prepare(f"SELECT message_id FROM {self._refs} WHERE payload_id = ?")
        self._updates: dict[str, Any] = {}
        self._updates_lock = threading.Lock()

    def emit(self, event_type: str, message_id: str, at: datetime, **fields: Any) -> None:
        record = event_record(event_type, "message_id", message_id, at, **fields)
        held = getattr(self._held, "events", None)
        if held is not None:
            held.append(record)
        else:
            self.send([record])

    @contextmanager
    def holding(self) -> Iterator[list[tuple[bytes, bytes]]]:
        """Write rows as usual, but hold the events emitted inside; ``send`` them later, in any order.

        Example::

            with platform.holding() as events:
                platform.set_counter("m1", 1)
            platform.send(events * 2)  # late, and twice
        """
        self._held.events = []
        try:
            yield self._held.events
        finally:
            self._held.events = None

    def send(self, records: Iterable[tuple[bytes, bytes]]) -> None:
        """Produce (key, value) records to the events topic."""
        for key, value in records:
            self.producer.send(self.config.kafka.topics[0], key=key, value=value)

    def _update(self, message_id: str, at: datetime, revives: bool = False, **columns: Any) -> bool:
        """Set ``columns`` and ``updated_at``. A write that ``revives`` the message is a lightweight transaction
        (``IF EXISTS``), as the writer contract asks (docs/policies.md, "What each write must use"), a millisecond
        after the message's plain writes (Cassandra stamps it with its millisecond clock); False when the
        message was gone, purged first."""
        if self.events_only:
            return True
        names = sorted(columns)
        statement_key = ",".join(names) + (" if exists" if revives else "")
        with self._updates_lock:
            if statement_key not in self._updates:
                assignments = ", ".join(f"{name} = ?" for name in names)
                self._updates[statement_key] = self.session.prepare(
                    f"UPDATE {self._messages} SET {assignments}, updated_at = ? WHERE message_id = ?"
                    + (" IF EXISTS" if revives else ""))
        if revives:
            time.sleep(0.002)
        answer = self.session.execute(self._updates[statement_key], (*(columns[n] for n in names), at, message_id))
        return answer.was_applied if revives else True

    def link(self, message_id: str, payload_id: str, at: datetime | None = None) -> bool:
        """Refer a message to an existing payload, by the writer contract (docs/policies.md, mailbox).

        Returns False when the payload is being purged: the caller must store a new payload instead.
        """
        if self.events_only:
            return True
        self.session.execute(self._insert_ref, (payload_id, message_id))
        if self.session.execute(self._touch_payload, (at or now(), payload_id)).was_applied:
            return True
        self.session.execute(self._delete_ref, (payload_id, message_id))
        return False

    def enqueue(
        self,
        message_id: str,
        payload_id: str,
        *,
        extract_count: int | None = 1,
        extract_until: datetime | None = None,
        complete: bool = True,
        size: int = 64 * 1024,
        mailbox: str = "inbox",
        dcs: Iterable[str] = ("dc1", "dc2"),
        at: datetime | None = None,
        shared: bool = False,
    ) -> str:
        """Create a message: its payload (inline, a new blob in each data centre, or with ``shared`` a link
        to an existing one), row, reference and event. Returns the payload id it got: a shared payload
        being purged is replaced by a new one, ``<payload_id>.<message_id>``."""
        at = at or now()
        dcs = sorted(dcs)
        inline = size < INLINE_LIMIT
        if shared and not inline and not self.link(message_id, payload_id, at):
            payload_id = f"{payload_id}.{message_id}"
            shared = False
        if not self.events_only:
            body = (message_id.encode() * (size // max(len(message_id), 1) + 1))[:size]
            self._store(message_id, payload_id, mailbox, size, body if inline else None, extract_count,
                        extract_until, complete, dcs, at, blob=None if shared or inline else body, shared=shared)
        self.emit(
            "enqueue", message_id, at, mailbox=mailbox, payload_id=payload_id, payload_size=size, inline=inline,
            extract_count=extract_count, extract_until=extract_until and format_timestamp(extract_until),
            complete=complete, dcs=dcs,
        )
        return payload_id

    def _store(self, message_id: str, payload_id: str, mailbox: str, size: int, inline_payload: bytes | None,
               extract_count: int | None, extract_until: datetime | None, complete: bool, dcs: list[str],
               at: datetime, blob: bytes | None, shared: bool) -> None:
        """The writes of an enqueue: the blob in each data centre and its payload row, the reference, the row."""
        if blob is not None:
            for dc in dcs:
                self.stores[dc].put_object(Bucket=self.config.stores[dc].bucket, Key=payload_key(payload_id), Body=blob)
            self.session.execute(self._insert_payload, (payload_id, size, set(dcs), at, at))
        if not shared:
            self.session.execute(self._insert_ref, (payload_id, message_id))
        self.session.execute(
            self._insert_message,
            (message_id, mailbox, payload_id, size, inline_payload, extract_count, extract_until, complete, at, at),
        )

    def dequeue(self, message_id: str, extract_count: int, at: datetime | None = None) -> None:
        """A client extracted the message; the counter's new value is absolute."""
        at = at or now()
        self._update(message_id, at, extract_count=extract_count)
        self.emit("dequeue", message_id, at, extract_count=extract_count)

    def set_counter(self, message_id: str, extract_count: int, at: datetime | None = None) -> None:
        """An administrator set the counter (0 expires, above 0 revives)."""
        at = at or now()
        self._update(message_id, at, revives=extract_count > 0, extract_count=extract_count)
        self.emit("extract_counter", message_id, at, extract_count=extract_count)

    def set_extract_until(self, message_id: str, until: datetime | None, at: datetime | None = None) -> None:
        """An administrator set, moved or cleared (None) the extract-until date."""
        at = at or now()
        self._update(message_id, at, revives=True, extract_until=until)
        self.emit("extract_until", message_id, at, extract_until=until and format_timestamp(until))

    def upload_complete(self, message_id: str, at: datetime | None = None) -> None:
        at = at or now()
        self._update(message_id, at, revives=True, complete=True)
        self.emit("upload_complete", message_id, at)

    def delete(self, message_id: str, at: datetime | None = None) -> None:
        """A user or administrator deleted the message: the row is marked, the purger removes it."""
        at = at or now()
        self._update(message_id, at, deleted=True)
        self.emit("delete", message_id, at)

    def flush(self) -> None:
        self.producer.flush()

    def row(self, message_id: str) -> dict | None:
        found = self.session.execute(self._select_message, (message_id,)).one()
        return found._asdict() if found else None

    def payload_row(self, payload_id: str) -> dict | None:
        found = self.session.execute(self._select_payload, (payload_id,)).one()
        return found._asdict() if found else None

    def references(self, payload_id: str) -> set[str]:
        return {r.message_id for r in self.session.execute(self._select_refs, (payload_id,))}

    def payload_gone(self, payload_id: str) -> bool:
        """Its row and its blob in every configured data centre are gone."""
        return self.payload_row(payload_id) is None and not any(
            self.blob_exists(payload_id, dc) for dc in self.config.stores)

    def payload_intact(self, payload_id: str) -> bool:
        """Live, with its blob in every configured data centre."""
        row = self.payload_row(payload_id)
        return row is not None and row["state"] == "live" and all(
            self.blob_exists(payload_id, dc) for dc in self.config.stores)

    def blob_exists(self, payload_id: str, dc: str) -> bool:
        listing = self.stores[dc].list_objects_v2(Bucket=self.config.stores[dc].bucket, Prefix=payload_key(payload_id))
        return any(item["Key"] == payload_key(payload_id) for item in listing.get("Contents", []))

    def close(self) -> None:
        self.producer.close()
        if not self.events_only:
            self.session.cluster.shutdown()
