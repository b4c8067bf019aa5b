"""The purge query, top to bottom: Kafka sources -> parsed events -> stateful stage -> purge sink.

Example::

    from streams.query import start_purger
    running = start_purger(spark, config)
    running.query.awaitTermination()
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from purger.config import PurgerConfig
from sinks.purge import PurgeSink
from streams.clock import Clock
from streams.events import parse_events
from streams.processor import DEAD_LETTER, MESSAGE, PAYLOAD, purge_candidates
from streams.rules import Retention
from streams.source import read_records


def _ms(duration: timedelta) -> int:
    return int(duration.total_seconds() * 1000)


@dataclass
class RunningPurger:
    query: StreamingQuery
    sink: PurgeSink
    clock: Clock

    def stop(self, wait_for_batch_s: float = 30) -> None:
        """Stop between micro-batches when one ends within ``wait_for_batch_s``.

        Interrupting a batch inside the Python state server makes Spark log an error storm;
        the work itself is safe either way, since the batch is redone from the checkpoint.
        """
        self.clock.stop()
        deadline = time.monotonic() + wait_for_batch_s
        while self.query.isActive and self.query.status["isTriggerActive"] and time.monotonic() < deadline:
            time.sleep(0.05)
        self.query.stop()


def start_purger(spark: SparkSession, config: PurgerConfig, starting_offsets: str | None = None) -> RunningPurger:
    stream = config.stream
    records = read_records(spark, config.kafka, starting_offsets)
    events = parse_events(records, config.kafka.control_topic)
    outputs = purge_candidates(events, Retention.from_config(config.retention), _ms(stream.watermark_delay))
    # Per batch, in the query's progress (observedMetrics) and so on the Spark UI's streaming page.
    outputs = outputs.observe(
        "purger",
        *(F.count(F.when(F.col("kind") == kind, True)).alias(name)
          for kind, name in ((MESSAGE, "message_candidates"), (PAYLOAD, "payload_candidates"),
                             (DEAD_LETTER, "dead_lettered"))),
    )
    sink = PurgeSink(config)
    query = (
        outputs.writeStream.queryName(stream.query_name)
        .foreachBatch(sink)
        .option("checkpointLocation", stream.checkpoint)
        .trigger(processingTime=f"{_ms(stream.trigger_interval)} milliseconds")
        .start()
    )
    clock = Clock(config.kafka, stream.clock_interval.total_seconds()).start(query)
    return RunningPurger(query, sink, clock)
