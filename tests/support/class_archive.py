"""A class-data sharing archive of the classes a Spark JVM of the tests loads, so that each JVM the suite starts
(its SparkSession, each ``python -m purger.job``, ``purger reconcile`` and spark-submit driver) maps them from
one file instead of reading, parsing and verifying them from Spark's, Delta's and the connectors' jars.

A purger's start, to its query running, took 27-33 s without the archive and 21 s with it on 2 cores
(docs/development.md, "Where the suite's time goes"). The archive is made once per machine, by a JVM that
starts a session as the tests do, runs a Delta write and a stateful streaming query, and exits through
``System.exit`` (JDK 17's ``-XX:ArchiveClassesAtExit``); it is kept under the purger's cache, named after
what it depends on (the JVM, pyspark and the connector jars), so a change of any makes a new one.

A JVM whose class path does not match the archive's (the release before's, in tests/integration/test_upgrades.py) runs
without it, silently (``-Xlog:cds*=off``).

    python -m tests.support.class_archive      # makes the archive if missing, prints its path
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

from purger.artifacts import purger_home, spark_connector_jars

JIT = "-XX:TieredStopAtLevel=1"
QUIET = "-Xlog:cds*=off"  # a mismatched or missing archive is not worth a line in a test's output


def archive_path() -> Path:
    """Where the archive for this machine's JVM, pyspark and connector jars is kept."""
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    key = "\n".join([java, pyspark.__version__, *sorted(str(jar) for jar in spark_connector_jars()), JIT])
    return purger_home() / "cds" / f"spark-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def java_options(short_lived: bool = True) -> str:
    """The options for the tests' Spark JVMs: the archive, made first if missing (about a minute, once per
    machine); and for a ``short_lived`` one (a purger's process, a command's) C1 alone, whose compiler threads
    take less of two cores than C2's in the minutes it lives."""
    archive = archive_path()
    if not archive.exists():
        archive.parent.mkdir(parents=True, exist_ok=True)
        # An archive is about 200 MB: those made for another JVM, pyspark or jars, and a killed dump's part, go.
        for stale in archive.parent.glob("spark-*"):
            stale.unlink(missing_ok=True)
        partial = archive.with_suffix(f".{os.getpid()}.partial")
        try:
            subprocess.run([sys.executable, "-m", "tests.support.class_archive", "--dump"],
                           cwd=Path(__file__).parents[2], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env={**os.environ, "SPARK_SUBMIT_OPTS": f"{JIT} -XX:ArchiveClassesAtExit={partial} {QUIET}"},
                           timeout=600)
            if partial.exists():
                partial.replace(archive)
        except subprocess.TimeoutExpired:
            partial.unlink(missing_ok=True)
    options = [JIT] if short_lived else []
    if archive.exists():
        options += [f"-XX:SharedArchiveFile={archive}", QUIET]
    return " ".join(options)


def _dump() -> None:
    """The classes to archive: a session as the tests start it, a Delta write and read, a stateful streaming
    query to Spark's noop sink; then the JVM exits, and writes the archive as it does."""
    import tempfile

    from pyspark.sql import functions as F

    from purger.config import build_config
    from purger.spark import spark_session

    spark = spark_session(build_config({"stream": {"shuffle_partitions": 2}}).stream, app_name="class-archive")
    spark.conf.set("spark.sql.streaming.stateStore.encodingFormat", "unsaferow")  # Spark's aggregation refuses Avro
    with tempfile.TemporaryDirectory() as tmp:
        spark.range(10).write.format("delta").save(f"{tmp}/table")
        spark.read.format("delta").load(f"{tmp}/table").count()
        counts = (spark.readStream.format("rate").option("rowsPerSecond", 10).load()
                  .groupBy((F.col("value") % 3).alias("key")).count())
        query = (counts.writeStream.format("noop").outputMode("update").trigger(processingTime="1 second")
                 .option("checkpointLocation", f"{tmp}/checkpoint").start())
        time.sleep(8)
        query.stop()
    jvm = spark.sparkContext._gateway.proc
    try:
        spark._jvm.System.exit(0)
    except Exception:  # the JVM went away mid-call, as it should; it writes the archive as it exits
        pass
    jvm.wait(timeout=300)


if __name__ == "__main__":
    if sys.argv[1:] == ["--dump"]:
        _dump()
    else:
        print(java_options())
