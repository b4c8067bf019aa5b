"""The Kafka sources: Spark's built-in connector (spark-sql-kafka) on the events topics and the purger's own.

Example::

    records = read_records(spark, config)  # key, value, topic, partition, offset, timestamp
"""

from __future__ import annotations

import json
from functools import reduce

from pyspark.sql import DataFrame, SparkSession

from purger.connectors import kafka_client, spark_kafka_options
from purger.core.settings import KafkaConfig, PurgerConfig
from purger.policies import events_topics


# How long the broker may hold a fetch at a partition's end (Kafka's default: 500 ms). After each poll, Spark's
# consumer asks for the partition's offset range; the broker answers a connection's requests in order, so that
# request waits behind the fetch the consumer sends ahead for the next records, and a task that read a quiet
# partition took this long (BENCHMARKS.md, "Kafka's fetch wait"). ``kafka.properties`` may set another.
SOURCE_FETCH_MAX_WAIT_MS = 10


def _kafka(spark: SparkSession, kafka: KafkaConfig, topics: list[str], starting_offsets: str,
           max_offsets_per_trigger: int, starting_timestamp_ms: int | None = None) -> DataFrame:
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.fetch.max.wait.ms", str(SOURCE_FETCH_MAX_WAIT_MS))
        .options(**spark_kafka_options(kafka))
        .option("subscribe", ",".join(topics))
    )
    if starting_timestamp_ms is not None:
        # The first offset of each partition at or after that time; partitions with none start at their end.
        reader = (reader.option("startingTimestamp", str(starting_timestamp_ms))
                  .option("startingOffsetsByTimestampStrategy", "latest"))
    else:
        reader = reader.option("startingOffsets", starting_offsets)
    return (
        reader.option("maxOffsetsPerTrigger", max_offsets_per_trigger)
        # A topic recreated or truncated under us must not stop the purge; lost offsets are logged.
        .option("failOnDataLoss", "false")
        .load()
    )


def read_records(spark: SparkSession, config: PurgerConfig, starting_offsets: str | None = None,
                 starting_timestamp_ms: int | None = None, reconcile_apart: bool = True) -> DataFrame:
    """The raw records of the events topics, the reconcile topic and the control topic, as one streaming
    DataFrame.

    ``starting_offsets`` applies to a fresh checkpoint only: ``earliest``, ``latest`` or Spark's JSON
    offsets, or else ``starting_timestamp_ms`` (a replay from a time); an existing checkpoint resumes
    where it stopped. The reconcile topic is a source of its own (``reconcile_apart``), read at most
    ``kafka.reconcile_max_offsets_per_trigger`` records a batch: Spark shares a source's limit among its
    partitions in proportion to their backlog, so within the events' source a bootstrap's feed would take
    nearly all of each batch and the live events a sliver. A checkpoint started before it was apart
    (``streams.checkpoint.reconcile_apart``) keeps it in the events' source, as Spark fixes a checkpoint's
    sources. A partition new to a checkpoint is read from its start, so what a reconcile feeds again makes
    up for a fresh checkpoint that starts the reconcile topic at its end. The control topic starts from its
    end: a replay rebuilds its rechecks and releases from the events, and old clock ticks would only move the
    watermark ahead of the replay.
    """
    kafka = config.kafka
    start = starting_offsets or kafka.starting_offsets
    events = [*events_topics(config)] + ([] if reconcile_apart else [kafka.reconcile_topic])
    sources = [(events, kafka.max_offsets_per_trigger)]
    if reconcile_apart:
        sources.append(([kafka.reconcile_topic], kafka.reconcile_max_offsets_per_trigger))
    records = [_kafka(spark, kafka, topics, every_topic_named(kafka, topics, start), limit, starting_timestamp_ms)
               for topics, limit in sources]
    records.append(_kafka(spark, kafka, [kafka.control_topic], "latest", kafka.max_offsets_per_trigger))
    return reduce(DataFrame.unionByName, records)


def every_topic_named(kafka: KafkaConfig, topics: list[str], starting_offsets: str) -> str:
    """Spark's JSON starting offsets for a source of ``topics`` must name each of its partitions and no
    other: those of ``topics`` are kept, and a topic they leave out (the reconcile topic, which a user's
    offsets for the events topics would not name) starts at its earliest offset (-2). ``earliest`` and
    ``latest`` pass as they are."""
    if not starting_offsets.lstrip().startswith("{"):
        return starting_offsets
    offsets = {topic: partitions for topic, partitions in json.loads(starting_offsets).items() if topic in topics}
    missing = [topic for topic in topics if topic not in offsets]
    if not missing:
        return json.dumps(offsets)
    from kafka import KafkaConsumer

    consumer = kafka_client(KafkaConsumer, kafka)
    try:
        for topic in missing:
            offsets[topic] = {str(partition): -2 for partition in sorted(consumer.partitions_for_topic(topic) or ())}
    finally:
        consumer.close()
    return json.dumps(offsets)
