"""What the platform stand-ins share: an event record, and a writer of rows and events.

An event is JSON with ``event_id``, ``type``, ``event_time`` (the events'
timestamp text), the id of the object it is about in its id field, then its
own fields; its record key is that id.

Example::

    from datetime import datetime, timezone
    key, value = event_record("user_added", "user_id", "u1", datetime.now(timezone.utc), dc="dc1")
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from purger.connectors import cassandra_session, kafka_producer
from purger.core.settings import CassandraConfig, KafkaConfig
from purger.core.times import format_timestamp


def event_record(event_type: str, id_field: str, object_id: str, at: datetime, /,
                 **fields: Any) -> tuple[bytes, bytes]:
    """The (key, value) record of an event about ``object_id``, named in ``id_field``, at ``at``."""
    event = {"event_id": str(uuid.uuid4()), "type": event_type, "event_time": format_timestamp(at),
             id_field: object_id, **fields}
    return object_id.encode(), json.dumps(event).encode()


class EventWriter:
    """A stand-in that writes rows to Cassandra and emits their events to one topic, each keyed by the id of
    the object it is about, in the event field ``id_field``."""

    id_field: str

    def __init__(self, kafka: KafkaConfig, cassandra: CassandraConfig, topic: str) -> None:
        self.topic = topic
        self.producer = kafka_producer(kafka, acks="all", linger_ms=5)
        self.session = cassandra_session(cassandra)

    def flush(self) -> None:
        """Wait until every event emitted so far is in Kafka."""
        self.producer.flush()

    def close(self) -> None:
        self.producer.close()
        self.session.cluster.shutdown()

    def _emit(self, event_type: str, object_id: str, at: datetime, /, **fields: Any) -> None:
        key, value = event_record(event_type, self.id_field, object_id, at, **fields)
        self.producer.send(self.topic, key=key, value=value)
