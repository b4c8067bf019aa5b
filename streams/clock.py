"""The clock: ticks on the control topic, the only thing that moves the watermark.

Every ``interval`` the clock sends a tick to the control topic stamped with the
time up to which the query has read every partition of its sources: for a
partition read to its latest offset, the wall clock; for one behind, the Kafka
timestamp of the records read from it (``read_up_to_ms``). The watermark is
the last tick less the watermark delay. So deadlines fire on time on a quiet
stream, and through a backlog (after an outage, during a replay or a
bootstrap, at a rate above ``kafka.max_offsets_per_trigger`` a batch) a
deadline fires once the purger has read everything the platform wrote before
it, not everything there is: objects due long ago are purged from the first
batches on while the rest is read. A tick never goes beyond the wall clock or
back, and none is sent while a partition behind has no record read yet.

What it assumes of the platform's producers: the Kafka timestamps of each
partition roughly increase (CreateTime set by producers with clocks close to
the purger's, or LogAppendTime, set by the broker). Where they do not, the
clock reads the timestamp of the last record read from each partition behind
(one fetch per such partition each time its read offset moves, nothing per
record), and keeps the highest seen: a record stamped earlier than records
before it makes the clock later, never earlier, than the time read; a record
stamped ahead of the others moves the clock up to its timestamp (never past
the wall clock), and an event read after it that would have put a deadline
off arrives after the deadline fired. Neither deletes anything live: events
are never dropped as late (``streams.processor``), an object already due is
decided when its events arrive, and every deletion rests on the row read
again at delete time (the double-check decides; the clock only decides when
to ask). What a wrong timestamp can cost is an object purged later than it
could have been, or a candidate the double-check keeps.

The reconcile topic's backlog does not stop the clock: its records are rows
read from Cassandra, re-expressed, and each deletion rests on the row read again
at delete time, not on them. A bootstrap's feed, read a slice a batch
(``kafka.reconcile_max_offsets_per_trigger``), would otherwise hold back the
purge of every new object until its last record is read.

On a quiet stream the clock does not tick every interval: it ticks while
the topics are read or a partition is behind, when a timer it knows of comes
due, and otherwise every ``quiet_s`` (``streams.timers``).

A tick that Kafka does not take (the send or its flush fails) is logged and
not tried again: the next one, an interval later, stands for it.

Example::

    clock = Clock(config.kafka, interval_s=1, quiet_s=60, deadlines=deadlines).start(query)
    ...
    clock.stop()
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Mapping

from pyspark.sql.streaming import StreamingQuery

from purger.core.settings import KafkaConfig
from purger.core.times import now_ms
from purger.connectors import NotDelivered, kafka_client, kafka_producer
from purger.streams.control import tick
from purger.streams.timers import Deadlines, should_tick

log = logging.getLogger(__name__)

# A Kafka partition: (topic, partition).
Partition = tuple[str, int]
# How long the clock waits for the last records read of the partitions behind, each time it looks them up.
LOOKUP_WAIT_S = 2.0


def source_offsets(progress: Any, ignoring: frozenset[str] = frozenset()) -> dict[Partition, tuple[int | None, int]] | None:
    """Per partition of the query's sources (the topics ``ignoring`` aside), the offset its last batch read up
    to (None if it read none of it) and its latest offset, from the query's last progress; None without one or
    while a source has no offsets yet."""
    # The progress's own JSON: its dict view gives offsets as Python reprs.
    sources = json.loads(progress.json).get("sources") if progress is not None else None
    if not sources:
        return None
    offsets: dict[Partition, tuple[int | None, int]] = {}
    for source in sources:
        end, latest = source.get("endOffset"), source.get("latestOffset")
        if not isinstance(end, dict) or not isinstance(latest, dict):
            return None
        for topic, partitions in latest.items():
            if topic not in ignoring:
                read = end.get(topic) or {}
                offsets.update({(topic, int(p)): (read.get(p), offset) for p, offset in partitions.items()})
    return offsets


def caught_up(query: StreamingQuery, ignoring: frozenset[str] = frozenset()) -> bool:
    """True when the last batch read up to the latest offsets of every source, the topics ``ignoring`` aside."""
    offsets = source_offsets(query.lastProgress, ignoring)
    return offsets is not None and all(end is not None and end >= latest for end, latest in offsets.values())


def remember(read_ms: Mapping[Partition, int], last_read_ms: Mapping[Partition, int]) -> dict[Partition, int]:
    """The highest Kafka timestamp read per partition, given the timestamps of the last records read."""
    return {**read_ms, **{p: max(t, read_ms.get(p, t)) for p, t in last_read_ms.items()}}


def read_up_to_ms(offsets: Mapping[Partition, tuple[int | None, int]], read_ms: Mapping[Partition, int],
                  now_ms: int) -> int | None:
    """The time up to which every partition has been read: ``now_ms`` for one read to its latest offset, else
    the highest Kafka timestamp read from it (``read_ms``), never beyond ``now_ms``; None while a partition
    behind has none."""
    up_to = now_ms
    for partition, (end, latest) in offsets.items():
        if end is not None and end >= latest:
            continue
        if partition not in read_ms:
            return None
        up_to = min(up_to, read_ms[partition])
    return up_to


def next_tick_ms(offsets: Mapping[Partition, tuple[int | None, int]], read_ms: Mapping[Partition, int],
                 now_ms: int, ticked_ms: int | None) -> int | None:
    """The time of the next tick (``read_up_to_ms``), or None when it is unknown or would not move past the
    last one delivered (``ticked_ms``): the clock never goes back.

    >>> next_tick_ms({("events", 0): (5, 9), ("events", 1): (7, 7)}, {("events", 0): 1_000}, 2_000, None)
    1000
    >>> next_tick_ms({("events", 0): (5, 9)}, {("events", 0): 1_000}, 2_000, 1_000) is None
    True
    """
    at_ms = read_up_to_ms(offsets, read_ms, now_ms)
    return at_ms if at_ms is not None and (ticked_ms is None or at_ms > ticked_ms) else None


class LastRecordsRead:
    """The Kafka timestamps of the last records the query read from the partitions behind, looked up in Kafka:
    one fetch per such partition each time its read offset moves (a batch at most), none per record."""

    def __init__(self, kafka: KafkaConfig) -> None:
        self.kafka = kafka
        self._consumer = None
        self._looked_up: dict[Partition, int] = {}  # the read offset last looked up, per partition

    def timestamps_ms(self, offsets: Mapping[Partition, tuple[int | None, int]]) -> dict[Partition, int]:
        wanted = {p: end for p, (end, latest) in offsets.items()
                  if end is not None and 0 < end < latest and self._looked_up.get(p) != end}
        if not wanted:
            return {}
        try:
            found = self._fetch(wanted)
        except Exception as error:  # Kafka unreachable: the clock waits, and looks again at its next tick
            log.warning("clock: the last records read of %s could not be looked up: %s",
                        ", ".join(f"{t}/{p}" for t, p in sorted(wanted)), error)
            return {}
        self._looked_up.update(wanted)
        return found

    def _fetch(self, wanted: dict[Partition, int]) -> dict[Partition, int]:
        from kafka import KafkaConsumer, TopicPartition

        if self._consumer is None:
            self._consumer = kafka_client(KafkaConsumer, self.kafka, group_id=None, enable_auto_commit=False,
                                          max_partition_fetch_bytes=65_536)
        consumer = self._consumer
        partitions = {TopicPartition(*p): p for p in wanted}
        consumer.assign(list(partitions))
        for tp, p in partitions.items():
            consumer.seek(tp, wanted[p] - 1)
        found: dict[Partition, int] = {}
        pending = set(partitions)
        deadline = time.monotonic() + LOOKUP_WAIT_S
        while pending and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=100).items():
                if tp in pending:
                    pending.discard(tp)
                    consumer.pause(tp)
                    # A record past the read offset (the one before it compacted or expired) was not read yet.
                    read = [r.timestamp for r in records if r.offset < wanted[partitions[tp]] and r.timestamp >= 0]
                    if read:
                        found[partitions[tp]] = max(read)
        consumer.resume(*partitions)
        return found

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()


class Clock:
    """Ticks on the control topic (the module docstring); with ``deadlines``, only while there is something
    to do, and otherwise every ``quiet_s`` (``streams.timers``)."""

    def __init__(self, kafka: KafkaConfig, interval_s: float, quiet_s: float | None = None,
                 deadlines: Deadlines | None = None) -> None:
        self.kafka = kafka
        self.interval_s = interval_s
        self.quiet_ms = int((quiet_s if quiet_s is not None else interval_s) * 1000)
        self.deadlines = deadlines
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, query: StreamingQuery) -> "Clock":
        producer = kafka_producer(self.kafka)
        last_records = LastRecordsRead(self.kafka)
        reconcile, control = self.kafka.reconcile_topic, self.kafka.control_topic

        def run() -> None:
            read_ms: dict[Partition, int] = {}
            ticked_ms: int | None = None
            ticked_at_ms: int | None = None  # the wall clock at the last tick delivered
            read_at_tick: dict[Partition, int | None] = {}  # what was read of the topics at the last tick
            try:
                while not self._stopped.wait(self.interval_s) and query.isActive:
                    every = source_offsets(query.lastProgress)
                    if every is None:
                        continue
                    offsets = {p: o for p, o in every.items() if p[0] != reconcile}
                    read = {p: end for p, (end, _) in every.items() if p[0] != control}
                    read_ms = remember(read_ms, last_records.timestamps_ms(offsets))
                    now = now_ms()
                    at_ms = next_tick_ms(offsets, read_ms, now, ticked_ms)
                    if at_ms is None:
                        continue
                    # Without deadlines, a tick every interval, as if a timer were always due.
                    due = self.deadlines.due() if self.deadlines is not None else now
                    if not should_tick(now, at_ms < now, read != read_at_tick, due, ticked_at_ms, self.quiet_ms):
                        continue
                    producer.send(control, tick(at_ms))
                    try:
                        producer.flush(consequence=f"the next tick goes in {self.interval_s:g} s")
                    except NotDelivered as error:  # the clock keeps running: the watermark waits, no more
                        log.warning("clock tick not delivered: %s", error)
                        continue
                    ticked_ms, ticked_at_ms, read_at_tick = at_ms, now, read
                    if self.deadlines is not None:
                        self.deadlines.ticked(at_ms)
            finally:
                last_records.close()
                producer.close()

        self._thread = threading.Thread(target=run, name="purger-clock", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread:
            self._thread.join(timeout=10)
