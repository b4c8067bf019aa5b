"""The clock: ticks on the control topic, the only thing that moves the watermark.

While the query has read every event there is (its sources' end offsets equal
the latest ones), the clock produces a tick stamped with the wall clock to the
control topic every ``interval``. The watermark is the last tick less the
watermark delay, so deadlines fire on time even when no event arrives. During
a backlog of events or a replay no tick is sent: no deadline fires before the
purger has read what the platform said up to now, so it decides with everything
it can know.

The reconcile topic's backlog does not stop the clock: its records are rows
read from Cassandra, re-expressed, and each deletion rests on the row read again
at delete time, not on them. A bootstrap's feed, read a slice a batch
(``kafka.reconcile_max_offsets_per_trigger``), would otherwise hold back the
purge of every new object until its last record is read.

A tick that Kafka does not take (the send or its flush fails) is logged and
not tried again: the next one, an interval later, stands for it.

Example::

    clock = Clock(config.kafka, interval_s=5).start(query)
    ...
    clock.stop()
"""

from __future__ import annotations

import json
import logging
import threading

from pyspark.sql.streaming import StreamingQuery

from purger.core.config import KafkaConfig
from purger.connectors import NotDelivered, kafka_producer
from purger.streams.control import tick

log = logging.getLogger(__name__)


def caught_up(query: StreamingQuery, ignoring: frozenset[str] = frozenset()) -> bool:
    """True when the last batch read up to the latest offsets of every source, the topics ``ignoring`` aside."""
    progress = query.lastProgress
    # The progress's own JSON: its dict view gives offsets as Python reprs.
    sources = json.loads(progress.json).get("sources") if progress is not None else None
    if not sources:
        return False
    for source in sources:
        end, latest = source.get("endOffset"), source.get("latestOffset")
        if not isinstance(end, dict) or not isinstance(latest, dict):
            return False
        if any(end.get(topic) != partitions for topic, partitions in latest.items() if topic not in ignoring):
            return False
    return True


class Clock:
    def __init__(self, kafka: KafkaConfig, interval_s: float) -> None:
        self.kafka = kafka
        self.interval_s = interval_s
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, query: StreamingQuery) -> "Clock":
        producer = kafka_producer(self.kafka)

        def run() -> None:
            try:
                while not self._stopped.wait(self.interval_s) and query.isActive:
                    if caught_up(query, ignoring=frozenset({self.kafka.reconcile_topic})):
                        producer.send(self.kafka.control_topic, tick())
                        try:
                            producer.flush(consequence=f"the next tick goes in {self.interval_s:g} s")
                        except NotDelivered as error:  # the clock keeps running: the watermark waits, no more
                            log.warning("clock tick not delivered: %s", error)
            finally:
                producer.close()

        self._thread = threading.Thread(target=run, name="purger-clock", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread:
            self._thread.join(timeout=10)
