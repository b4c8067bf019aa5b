"""What the purge sink writes to Kafka: reports to the stateful stage, and dead letters.

Structured Streaming has no path from a sink back to the state, so the sink
reports on the purger's control topic, which the query reads:

- ``recheck``: look at this object again at ``event_time`` (the double-check kept
  it and the row says when it will be due, or a store or Cassandra failed);
- ``payload_released``: the last message referring to a payload became
  eligible at ``event_time``, and no reference was left at ``observed_at``;
  its grace period runs from ``event_time``.

Reports are keyed like the objects they name, and are idempotent: a retried
batch that sends them twice changes nothing. Each is flushed before the batch
ends, so a committed batch never loses one.

Bad records go to the dead-letter topic unchanged (key and value), with the
reason and where they came from in the record headers.

Example::

    reports = Reports(config.kafka)
    reports.recheck("message", "m1", "expired_by_date", at_ms=1_767_254_280_000)
    reports.flush()
"""

from __future__ import annotations

import json
import uuid

from core.config import KafkaConfig
from connectors import kafka_producer
from streams.events import RECHECK, format_epoch_ms
from streams.state import RELEASED


class Reports:
    def __init__(self, kafka: KafkaConfig) -> None:
        self.kafka = kafka
        self.producer = kafka_producer(kafka, acks="all", linger_ms=20)

    def _send(self, key: str, event: dict) -> None:
        event = {"event_id": str(uuid.uuid4()), **event}
        self.producer.send(self.kafka.control_topic, key=key.encode(), value=json.dumps(event).encode())

    def recheck(self, kind: str, object_id: str, rule: str, at_ms: int) -> None:
        id_field = "payload_id" if kind == "payload" else "message_id"
        self._send(object_id, {"type": RECHECK, "kind": kind, id_field: object_id, "rule": rule,
                               "event_time": format_epoch_ms(at_ms)})

    def released(self, payload_id: str, message_id: str, at_ms: int, observed_at_ms: int, dcs: list[str]) -> None:
        self._send(payload_id, {"type": RELEASED, "payload_id": payload_id, "message_id": message_id,
                                "event_time": format_epoch_ms(at_ms), "observed_at": format_epoch_ms(observed_at_ms), "dcs": dcs})

    def dead_letter(self, key: bytes | None, value: bytes | None, reason: str, topic: str, partition: int,
                    offset: int) -> None:
        headers = [("reason", reason.encode()), ("topic", topic.encode()),
                   ("partition", str(partition).encode()), ("offset", str(offset).encode())]
        # Kafka takes no record with neither key nor value; such a record came from another client.
        key = b"" if key is None and value is None else key
        self.producer.send(self.kafka.dead_letter_topic, key=key, value=value, headers=headers)

    def flush(self) -> None:
        self.producer.flush()
