"""Spark's Python worker daemon (``spark.python.daemon.module``) with the workers' libraries already imported.

Each executor starts one daemon, which forks a Python worker whenever a task
needs one. Spark's own daemon imports only PySpark, so every new worker
imports pandas, Arrow, the Cassandra, S3 and Kafka clients and the policies
itself, seconds of CPU on the cores the running batches need; the first
batches after a start and every batch that starts a new worker waited for it
(BENCHMARKS.md, purge lag). Imported here once, before the fork, they are
in every worker from the start. Nothing here opens a connection or starts a
thread: a forked process must not inherit them.

The workers import PySpark and Py4J from their installed packages, and Spark's
archives on their ``PYTHONPATH`` (``pyspark.zip``, the Py4J zip, the
``spark-core`` jar, which holds no Python) leave their path: every task's start
calls ``importlib.invalidate_caches()``, which makes each archive's importer
read the archive's whole directory again (70-165 ms of CPU a task here, against
0.01 ms without them; BENCHMARKS.md).

What was imported is then frozen out of the garbage collector's reach
(``gc.freeze()``, as Python's documentation advises before a fork): a reused
worker runs a full collection after every task, which walked some 170,000
objects, 130,000 of them the libraries', in 64 ms a task: most of a worker's
CPU (BENCHMARKS.md, "Python workers"). What a task makes is collected as before.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import zipimport
from importlib.machinery import PathFinder


def _off_spark_archives() -> None:
    """Take the archives inside the installed PySpark package off ``sys.path`` and out of the importers' cache,
    when PySpark and Py4J are importable without them (as pip installs them); before anything is imported."""
    directories = [entry for entry in sys.path if not os.path.isfile(entry)]
    pyspark = PathFinder.find_spec("pyspark", directories)
    if pyspark is None or pyspark.origin is None or PathFinder.find_spec("py4j", directories) is None:
        return
    home = os.path.abspath(os.path.dirname(pyspark.origin))

    def spark_archive(path: str) -> bool:
        return os.path.isfile(path) and os.path.commonpath([home, os.path.abspath(path)]) == home

    sys.path[:] = [entry for entry in sys.path if not spark_archive(entry)]
    for path, importer in list(sys.path_importer_cache.items()):
        if isinstance(importer, zipimport.zipimporter) and spark_archive(importer.archive):
            del sys.path_importer_cache[path]


# What a worker of the purger imports: the stateful stage's (pandas, Arrow, the processor), the
# purge's (the clients, the policies) and a reconcile's (its scan and feed, the orphan blobs).
PRELOADED = ("pandas", "pyarrow", "pyspark.sql.pandas.serializers", "boto3", "cassandra.cluster", "kafka",
             "purger.sinks.clients", "purger.sinks.purge", "purger.streams.processor", "purger.reconcile.run",
             "purger.reconcile.orphans")

if __name__ == "__main__":
    _off_spark_archives()  # before the first import of PySpark
    for module in PRELOADED:
        importlib.import_module(module)
    daemon = importlib.import_module("pyspark.daemon")
    gc.collect()
    gc.freeze()  # what every worker inherits, never garbage: out of each task's collection
    daemon.manager()
