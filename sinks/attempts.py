"""Which run of a batch this is, and the failpoints of the kill tests.

foreachBatch is at-least-once: a batch that failed runs again. The driver marks
each batch as attempted (a file beside the checkpoint), and Spark numbers task
attempts, so a retry knows it is one: an object it finds gone was deleted by
the attempt that failed, whose outcomes were lost with it.

Example::

    retried = not first_attempt(spark, f"{checkpoint}/purger-attempts", batch_id)
    failpoint("before_ledger_write")   # does nothing unless PURGER_FAILPOINT names it
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from pyspark.sql import SparkSession


def failpoint(name: str) -> None:
    """Fault injection for the kill tests (tests/test_faults.py): with ``PURGER_FAILPOINT=<name>`` the
    first process to reach ``name`` kills the purger's whole process group (kill -9), once per
    ``PURGER_FAILPOINT_MARKER`` file. Without the variable it does nothing."""
    if os.environ.get("PURGER_FAILPOINT") != name:
        return
    try:
        Path(os.environ["PURGER_FAILPOINT_MARKER"]).open("x").close()
    except FileExistsError:
        return
    # The session's group: the driver and its JVM (PySpark's worker daemon has a group of its own).
    os.killpg(os.getsid(0), signal.SIGKILL)


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
