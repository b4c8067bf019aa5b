"""Bad records to the dead-letter topic: unchanged (key and value), with the reason and where they came
from in the record headers. They are delivered at the producer's flush, which the
sink's task makes before it ends and which fails the task if Kafka did not take
one (``connectors.CheckedProducer``).

Example::

    DeadLetters(producer, "purger.dead-letter").send(key, value, "unknown type x", "mailbox.events", 0, 42)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from purger.connectors import CheckedProducer


# Kafka's default largest record is 1 MiB (``message.max.bytes``, the producer's ``max.request.size``); a
# bad record as large as that, with its headers, would not fit on the dead-letter topic.
LARGEST_VALUE = 1_000_000 - 64 * 1024


class DeadLetters:
    def __init__(self, producer: "CheckedProducer", topic: str) -> None:
        self.producer = producer
        self.topic = topic

    def send(self, key: bytes | None, value: bytes | None, reason: str, topic: str, partition: int,
             offset: int) -> None:
        headers = [("reason", reason.encode()), ("topic", topic.encode()),
                   ("partition", str(partition).encode()), ("offset", str(offset).encode())]
        if value is not None and len(value) + len(key or b"") > LARGEST_VALUE:
            headers.append(("original_size", str(len(value)).encode()))
            value = value[:max(0, LARGEST_VALUE - len(key or b""))]
        # Kafka takes no record with neither key nor value; such a record came from another client.
        key = b"" if key is None and value is None else key
        self.producer.send(self.topic, key=key, value=value, headers=headers)
