"""Clients for the three servers, built from the configuration, with errors that name the address; a module
each, their public names here:

- ``cassandra_client``: a session on the nodes (``cassandra_session``), a read at the serial consistency
  (``read_serially``), a policy's handle on its tables (``CassandraTables``);
- ``object_store``: an S3 client for a data centre's object store (``s3_client``);
- ``kafka_clients``: kafka-python's clients (``kafka_client``, ``kafka_client_options``), a producer whose
  flush raises ``NotDelivered`` for a record Kafka did not take (``kafka_producer``, ``CheckedProducer``),
  and the Spark Kafka source's options (``spark_kafka_options``);
- ``errors``: ``ServerUnavailable``, what the Cassandra and Kafka clients raise when a server does not
  answer or refuses them;
- ``request_counts``: every request a Cassandra session sends, counted by what it costs the cluster.

Example::

    from purger.config import load_config
    from purger.connectors import cassandra_session, read_serially, s3_client
    config = load_config()
    session = cassandra_session(config.cassandra)
    read = read_serially(session, session.prepare("SELECT * FROM mailbox.messages WHERE message_id = ?"))
    s3 = s3_client(config.stores["dc1"])
    consumer = KafkaConsumer(**kafka_client_options(config.kafka, KafkaConsumer))
    producer = kafka_producer(config.kafka)           # its flush raises NotDelivered for a record Kafka did not take
    reader = spark.read.format("kafka").options(**spark_kafka_options(config.kafka))
"""

from purger.connectors.cassandra_client import CassandraTables, cassandra_session, read_serially
from purger.connectors.errors import ServerUnavailable
from purger.connectors.kafka_clients import (
    TASK_RUNS_AGAIN,
    CheckedProducer,
    KafkaRefused,
    NotDelivered,
    kafka_client,
    kafka_client_options,
    kafka_producer,
    spark_kafka_options,
)
from purger.connectors.object_store import s3_client

__all__ = [
    "CassandraTables",
    "CheckedProducer",
    "KafkaRefused",
    "NotDelivered",
    "ServerUnavailable",
    "TASK_RUNS_AGAIN",
    "cassandra_session",
    "kafka_client",
    "kafka_client_options",
    "kafka_producer",
    "read_serially",
    "s3_client",
    "spark_kafka_options",
]
