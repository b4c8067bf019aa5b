"""Which run of a batch this is.

foreachBatch is at-least-once: a batch that failed runs again. The driver marks
each batch as attempted (a file beside the checkpoint), and Spark numbers task
attempts, so a retry knows it is one: an object it finds gone was deleted by
the attempt that failed, whose outcomes were lost with it.

Example::

    retried = not first_attempt(spark, f"{checkpoint}/purger-attempts", batch_id)
"""

from __future__ import annotations

from pyspark.sql import SparkSession


def first_attempt(spark: SparkSession, directory: str, batch_id: int, keep: int = 100) -> bool:
    """Mark batch ``batch_id`` as attempted (a file beside the checkpoint, on any Hadoop filesystem);
    False when an earlier attempt had marked it, i.e. this run of the batch is a retry."""
    hadoop = spark._jvm.org.apache.hadoop.fs  # type: ignore[union-attr]
    marker = hadoop.Path(f"{directory}/{batch_id}")
    fs = marker.getFileSystem(spark._jsc.hadoopConfiguration())  # type: ignore[union-attr]
    if fs.exists(marker):
        return False
    fs.create(marker, False).close()
    fs.delete(hadoop.Path(f"{directory}/{batch_id - keep}"), False)
    return True
