"""The local stack's servers as Maven bundles, fetched and cached like Spark's connectors (``purger.artifacts``).

Example::

    from devstack.artifacts import KAFKA
    from purger.artifacts import fetch
    jars = fetch(KAFKA)
"""

from purger.artifacts import Bundle, fetch, purger_home, spark_connector_jars

__all__ = ["CASSANDRA", "KAFKA", "S3PROXY", "fetch", "purger_home", "spark_connector_jars"]

KAFKA = Bundle(
    "kafka",
    # Kafka 3.9 declares its log4j binding compile-only, so the binding comes separately.
    ("org.apache.kafka:kafka_2.13:3.9.1", "org.slf4j:slf4j-reload4j:1.7.36"),
)
CASSANDRA = Bundle("cassandra", ("org.apache.cassandra:cassandra-all:5.0.9",))
S3PROXY = Bundle("s3proxy", ("org.gaul:s3proxy:3.0.0",))
