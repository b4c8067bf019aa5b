"""The Kafka source: Spark's built-in connector (spark-sql-kafka), subscribed to the events and clock topics.

Example::

    records = read_records(spark, config.kafka)  # key, value, topic, partition, offset, timestamp
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from purger.config import KafkaConfig


def read_records(spark: SparkSession, kafka: KafkaConfig, starting_offsets: str | None = None) -> DataFrame:
    """A streaming DataFrame of the raw records of the events topics and the clock topic.

    ``starting_offsets`` applies to a fresh checkpoint only: ``earliest``, ``latest`` or Spark's
    JSON offsets; an existing checkpoint resumes where it stopped.
    """
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", ",".join([*kafka.topics, kafka.clock_topic]))
        .option("startingOffsets", starting_offsets or kafka.starting_offsets)
        .option("maxOffsetsPerTrigger", kafka.max_offsets_per_trigger)
        # A topic recreated or truncated under us must not stop the purge; lost offsets are logged.
        .option("failOnDataLoss", "false")
        .load()
    )
