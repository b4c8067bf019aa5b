"""Bad records to the dead-letter topic: unchanged (key and value), with the reason and where they came
from in the record headers.

Example::

    DeadLetters(producer, "purger.dead-letter").send(key, value, "unknown type x", "mailbox.events", 0, 42)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kafka import KafkaProducer


class DeadLetters:
    def __init__(self, producer: "KafkaProducer", topic: str) -> None:
        self.producer = producer
        self.topic = topic

    def send(self, key: bytes | None, value: bytes | None, reason: str, topic: str, partition: int,
             offset: int) -> None:
        headers = [("reason", reason.encode()), ("topic", topic.encode()),
                   ("partition", str(partition).encode()), ("offset", str(offset).encode())]
        # Kafka takes no record with neither key nor value; such a record came from another client.
        key = b"" if key is None and value is None else key
        self.producer.send(self.topic, key=key, value=value, headers=headers)
