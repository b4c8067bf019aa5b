"""The SparkSession the purger runs in: connectors on the class path, RocksDB state, small footprint.

Example::

    from purger.spark import spark_session
    spark = spark_session(config.stream)
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from purger.artifacts import spark_connector_jars
from purger.config import StreamConfig


def spark_session(stream: StreamConfig, app_name: str = "purger") -> SparkSession:
    """Get or create the session; a second call in the same process returns the same one."""
    jars = ",".join(str(jar) for jar in spark_connector_jars())
    return (
        SparkSession.builder.appName(app_name)
        .master(stream.master)
        .config("spark.driver.memory", stream.driver_memory)
        .config("spark.jars", jars)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        # Python transformWithState refuses the default HDFS-backed provider.
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.shuffle.partitions", stream.shuffle_partitions)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.metricsEnabled", "true")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
