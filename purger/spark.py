"""The SparkSession the purger runs in: connectors on the class path, RocksDB state, small footprint.

Example::

    from purger.spark import spark_session
    spark = spark_session(config.stream)
"""

from __future__ import annotations

import os
from importlib.resources import as_file, files
from urllib.parse import urlparse

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from purger.core.settings import StreamConfig
from purger.logs import log4j2_options


# Spark's speculative execution: a second attempt of a slow task, run beside the first.
SPECULATION = "spark.speculation"
# The ledger's files that auto compaction takes as small, in bytes (Delta's default: 64 MiB).
LEDGER_MIN_FILE_SIZE = 1 << 20


def speculation_refusal(conf: SparkConf) -> str | None:
    """Why the purger refuses to run in a Spark application whose ``conf`` turns speculative execution on (a
    cluster's spark-defaults.conf may), else None: a speculative attempt of a task runs the same batch's
    deletes a second time, at once, and Spark keeps the outcomes of the attempt that ends first, which may have
    found the objects gone by the other's deletes."""
    if conf.get(SPECULATION, "false").strip().lower() != "true":  # as Spark reads a boolean: trimmed, any case
        return None
    return (f"{SPECULATION} is true in this Spark application (spark-defaults.conf or --conf): a speculative "
            f"task would run a batch's deletes twice at once; set {SPECULATION}=false for the purger's "
            f"application (--conf {SPECULATION}=false)")


# Spark's default, true, lets anyone who reaches the UI's port kill the purge's jobs and stages; off unless the
# driver's Spark configuration sets it (spark-submit's --conf, spark-defaults.conf, PYSPARK_SUBMIT_ARGS):
# docs/operations.md, "Securing a running purger".
UI_KILL_ENABLED = "spark.ui.killEnabled"


def _submitted() -> bool:
    """True in a driver that spark-submit started (its JVM is already there) with a master."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return False
    SparkContext._ensure_initialized()  # connects to spark-submit's JVM, whose settings SparkConf reads
    return SparkConf().contains("spark.master")


def spark_session(stream: StreamConfig, app_name: str = "purger", log_level: str = "WARN",
                  one_off: bool = False) -> SparkSession:
    """Get or create the session; a second call in the same process returns the same one.

    Spark logs at ``log_level`` from its JVM's start (``purger.logs.spark_level``). A ``one_off`` session is
    a command's that reads a little and prints it (``purger report``, ``purger pending``): no Spark UI, the
    plain Python worker daemon (its few Python tasks do not pay for the purge's imports), and a JVM that
    compiles with the quick compiler only, which spends less of a short run's CPU compiling.

    Under spark-submit, its ``--master``, ``--jars`` and memory settings win over the configuration's. The UI
    kills no job or stage unless the Spark configuration the driver starts with sets ``spark.ui.killEnabled``.
    """
    builder = SparkSession.builder.appName(app_name)
    submitted = _submitted()
    if not submitted:
        # The connector jars, fetched with Maven into the local cache; spark-submit brings its own --jars.
        from purger.artifacts import spark_connector_jars

        jars = ",".join(str(jar) for jar in spark_connector_jars())
        java_options = log4j2_options(log_level)
        if one_off:
            # C1 only: on 2 cores the C2 compiler's threads took seconds of a short command's CPU (`purger
            # report` on a small ledger, its session and report: about 45 s with C2, 26 s without, under load).
            # A report of a very large day would run its aggregation slower.
            java_options["spark.driver.extraJavaOptions"] += " -XX:TieredStopAtLevel=1"
        builder = (
            builder.master(stream.master)
            .config("spark.driver.memory", stream.driver_memory)
            .config("spark.jars", jars)
            # The purger's log settings for the JVM started here; spark-submit is given them (devstack.cluster).
            .config(map=java_options)
        )
        if one_off:
            builder = builder.config("spark.ui.enabled", "false")
        else:
            # New Python workers are forked with pandas, Arrow, the clients and the policies already
            # imported (purger/worker_daemon.py), so a start's first batches do not wait for imports.
            # Only here, where the executors import the purger from the driver's installation: a
            # submitted job's may have it only in its --py-files, which the daemon cannot import from.
            builder = builder.config("spark.python.daemon.module", "purger.worker_daemon")
    if urlparse(stream.checkpoint).scheme in ("", "file"):
        # On a local disk, Hadoop's FileContext (Spark's default) starts a chmod and a readlink process for
        # each checkpoint file (offsets, commits, each state partition's changelog); its FileSystem starts
        # none: 48 processes and threads a batch instead of 150, and a batch 15% shorter (bench.batch).
        # A rename on a local disk is atomic either way. Other file systems keep Spark's default.
        builder = builder.config(
            "spark.sql.streaming.checkpointFileManagerClass",
            "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager")
    # The pools' file as a file on disk: a submitted driver imports the purger from its --py-files zip. Spark
    # reads it once, as the session's context starts.
    with as_file(files("purger") / "fairscheduler.xml") as pools:
        builder = (
            builder.config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
            .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
            # Each ledger commit rebuilds the table's snapshot in this many tasks: Delta's 50 made it a
            # 53-task job per batch; the ledger's log is small (BENCHMARKS.md, bench.ledger).
            .config("spark.databricks.delta.snapshotPartitions", "2")
            # Auto compaction rewrites the files of a partition smaller than this with each round of new small
            # files: with Delta's default (64 MiB) a day's file under it is rewritten every 50 commits, and every
            # copy it replaces stays on disk until VACUUM, 7 days on (BENCHMARKS.md, "Auto compaction's leftovers").
            .config("spark.databricks.delta.autoCompact.minFileSize", str(LEDGER_MIN_FILE_SIZE))
            # Python transformWithState refuses the default HDFS-backed provider.
            .config(
                "spark.sql.streaming.stateStore.providerClass",
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
            )
            # Memory for the state does not grow with the objects kept: RocksDB's caches and write buffers
            # share one bounded pool per executor, and the rest of the state is on disk (BENCHMARKS.md).
            .config("spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage", "true")
            .config("spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB", stream.state_memory_mb)
            # Each batch's state commit writes a changelog of its changes rather than a new snapshot of
            # every partition's files (snapshots are made in the background): a cheaper batch (bench.batch).
            .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
            # State in Avro, so that a policy's state may gain a field across an upgrade (Spark's state schema
            # evolution; streams/checkpoint.py). A checkpoint keeps the encoding it was started with (its offsets
            # log), so one started before 0.2.0 stays in unsaferow. Spark's own streaming aggregations refuse Avro:
            # one run in this session sets unsaferow for its start (as bench.stateful does).
            .config("spark.sql.streaming.stateStore.encodingFormat", "avro")
            .config("spark.sql.shuffle.partitions", stream.shuffle_partitions)
            # The report's and the reconciles' jobs (purger/running.py) run in pools of their own, and a
            # micro-batch's tasks take a free core before theirs (fairscheduler.xml): a batch waits for neither.
            .config("spark.scheduler.mode", "FAIR")
            .config("spark.scheduler.allocation.file", str(pools))
            .config("spark.sql.session.timeZone", "UTC")
            # The query's rates, latency, watermark and state sizes in Spark's metrics system, served with
            # the executors' metrics for Prometheus on the UI's port (/metrics/prometheus).
            .config("spark.sql.streaming.metricsEnabled", "true")
            .config("spark.metrics.conf.*.sink.prometheusServlet.class",
                    "org.apache.spark.metrics.sink.PrometheusServlet")
            .config("spark.metrics.conf.*.sink.prometheusServlet.path", "/metrics/prometheus")
            .config("spark.ui.prometheus.enabled", "true")
            .config("spark.ui.showConsoleProgress", "false")
        )
        if not submitted:
            # The JVM started now with every setting above, as getOrCreate would start it, so that what else its
            # Spark configuration holds (spark-defaults.conf, PYSPARK_SUBMIT_ARGS) can be read before the session.
            SparkContext._ensure_initialized(conf=SparkConf(loadDefaults=False).setAll(builder._options.items()))
        if not SparkConf().contains(UI_KILL_ENABLED):
            builder = builder.config(UI_KILL_ENABLED, "false")
        return builder.getOrCreate()
