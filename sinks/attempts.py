"""Which run of a batch this is.

foreachBatch is at-least-once: a batch that failed runs again. The driver marks
each batch as attempted (a file beside the checkpoint), and Spark numbers task
attempts, so a retry knows it is one: an object it finds gone was deleted by
the attempt that failed, whose outcomes were lost with it.

Example::

    retried = not first_attempt(spark, f"{checkpoint}/purger-attempts", batch_id)
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession


def _marker(spark: SparkSession, directory: str, batch_id: int) -> tuple[Any, Any]:
    """The filesystem and path of batch ``batch_id``'s mark."""
    marker = spark._jvm.org.apache.hadoop.fs.Path(f"{directory}/{batch_id}")  # type: ignore[union-attr]
    return marker.getFileSystem(spark._jsc.hadoopConfiguration()), marker  # type: ignore[union-attr]


def first_attempt(spark: SparkSession, directory: str, batch_id: int, keep: int = 100) -> bool:
    """Mark batch ``batch_id`` as attempted (a file beside the checkpoint, on any Hadoop filesystem);
    False when an earlier attempt had marked it, i.e. this run of the batch is a retry."""
    fs, marker = _marker(spark, directory, batch_id)
    if fs.exists(marker):
        return False
    fs.create(marker, False).close()
    fs.delete(_marker(spark, directory, batch_id - keep)[1], False)
    return True


def first_attempted_ms(spark: SparkSession, directory: str, batch_id: int) -> int | None:
    """When batch ``batch_id`` was first attempted (its mark's time, by the filesystem's clock), in ms since the
    epoch; None when it has no mark. Whatever any attempt of it recorded, it recorded after that."""
    fs, marker = _marker(spark, directory, batch_id)
    if not fs.exists(marker):
        return None
    return int(fs.getFileStatus(marker).getModificationTime())
