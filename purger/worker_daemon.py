"""Spark's Python worker daemon (``spark.python.daemon.module``) with the workers' libraries already imported.

Each executor starts one daemon, which forks a Python worker whenever a task
needs one. Spark's own daemon imports only PySpark, so every new worker
imports pandas, Arrow, the Cassandra, S3 and Kafka clients and the policies
itself, seconds of CPU on the cores the running batches need; the first
batches after a start and every batch that starts a new worker waited for it
(BENCHMARKS.md, purge lag). Imported here once, before the fork, they are
in every worker from the start. Nothing here opens a connection or starts a
thread: a forked process must not inherit them.
"""

from __future__ import annotations

import importlib

from pyspark import daemon

# What a worker of the purger imports: the stateful stage's (pandas, Arrow, the processor), the
# purge's (the clients, the policies) and a reconcile's (its scan and feed, the orphan blobs).
PRELOADED = ("pandas", "pyarrow", "pyspark.sql.pandas.serializers", "boto3", "cassandra.cluster", "kafka",
             "purger.sinks.clients", "purger.sinks.purge", "purger.streams.processor", "purger.reconcile.run",
             "purger.reconcile.orphans")

if __name__ == "__main__":
    for module in PRELOADED:
        importlib.import_module(module)
    daemon.manager()
