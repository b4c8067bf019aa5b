"""Replay: the events topics again, from the earliest offset or from a time, into a fresh checkpoint.

Replay is recovery (docs/reference.md, Guarantees): the state is rebuilt from the events,
every object that became eligible is a candidate again, and the double-check
makes the ones already purged ``already_gone``. While the query is behind, the
clock ticks at the Kafka time it has read up to in every partition
(``streams.clock``), so an object is decided once the replay has read what was
written before its deadline. The old checkpoint is kept beside the new one, renamed.

Example::

    running, backlog = start_replay(spark, config, since_ms=None)    # None: the earliest offset
    follow(running.query, backlog)                                   # a progress bar until caught up
    running.query.awaitTermination()                                 # then it keeps running
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery
from tqdm import tqdm

from purger.connectors import kafka_client
from purger.core.settings import ConfigError, PurgerConfig
from purger.output import human_duration
from purger.policies import events_topics
from purger.streams.clock import caught_up
from purger.running import RunningPurger, start_purger


@dataclass(frozen=True)
class Backlog:
    """Where a replay starts and the end it must reach, per (topic, partition)."""

    starts: dict[tuple[str, int], int]
    ends: dict[tuple[str, int], int]

    @property
    def total(self) -> int:
        return sum(max(0, self.ends[p] - self.starts[p]) for p in self.ends)

    def done(self, end_offsets: dict[str, dict[str, int]]) -> int:
        """Records read so far, from the ``endOffset`` maps of a query's progress.

        >>> Backlog({("t", 0): 10}, {("t", 0): 30}).done({"t": {"0": 25}})
        15
        """
        read = 0
        for (topic, partition), end in self.ends.items():
            offset = end_offsets.get(topic, {}).get(str(partition), self.starts[(topic, partition)])
            read += max(0, min(offset, end) - self.starts[(topic, partition)])
        return read


def backlog(config: PurgerConfig, since_ms: int | None) -> Backlog:
    """The events topics' offsets at ``since_ms`` (or their beginning) and their current ends."""
    consumer = kafka_client(KafkaConsumer, config.kafka)
    try:
        partitions = [TopicPartition(t, p) for t in events_topics(config)
                      for p in sorted(consumer.partitions_for_topic(t) or ())]
        ends = consumer.end_offsets(partitions)
        if since_ms is None:
            starts = consumer.beginning_offsets(partitions)
        else:
            found = consumer.offsets_for_times({tp: since_ms for tp in partitions})
            starts = {tp: found[tp].offset if found.get(tp) else ends[tp] for tp in partitions}
    finally:
        consumer.close()
    key = lambda tp: (tp.topic, tp.partition)  # noqa: E731
    return Backlog({key(tp): starts[tp] for tp in partitions}, {key(tp): ends[tp] for tp in partitions})


def set_aside(checkpoint: str) -> Path | None:
    """Rename an existing local checkpoint to ``<checkpoint>.replaced-<UTC time>``; return the new name."""
    if "://" in checkpoint and not checkpoint.startswith("file://"):
        raise ConfigError(
            f"stream.checkpoint: {checkpoint} is not a local path; for a replay set it to a new, empty location"
        )
    path = Path(checkpoint.removeprefix("file://"))
    if not path.exists():
        return None
    aside = path.with_name(f"{path.name}.replaced-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}")
    path.rename(aside)
    return aside


def start_replay(spark: SparkSession, config: PurgerConfig, since_ms: int | None) -> tuple[RunningPurger, Backlog]:
    """Set the checkpoint aside and start the purger on the events from ``since_ms`` (None: the earliest)."""
    set_aside(config.stream.checkpoint_location)
    to_read = backlog(config, since_ms)
    running = start_purger(spark, config, starting_offsets="earliest", starting_timestamp_ms=since_ms)
    return running, to_read


def follow(query: StreamingQuery, to_read: Backlog, show: bool = True, poll_s: float = 1.0,
           timeout_s: float | None = None, stop: threading.Event | None = None) -> bool:
    """Wait until the query has read the backlog and caught up, with a progress bar when ``show``.
    Returns True then, or False as soon as ``stop`` is set."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with tqdm(total=to_read.total, unit="events", desc="replay", disable=not show) as bar:
        while query.isActive:
            if stop is not None and stop.is_set():
                return False
            last = query.lastProgress
            # The progress's own JSON: its dict view gives offsets as Python reprs.
            progress = json.loads(last.json) if last is not None else {}
            ends: dict[str, dict[str, int]] = {}
            for source in progress.get("sources", []):
                ends.update(source.get("endOffset") or {})
            read = to_read.done(ends)
            bar.update(read - bar.n)  # a disabled bar keeps no count, hence `read`
            if read >= to_read.total and caught_up(query):
                return True
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"the replay read {read} of {to_read.total} events in {human_duration(timeout_s)}")
            time.sleep(poll_s)
    raise RuntimeError(f"the query stopped during the replay: {query.exception()}")
