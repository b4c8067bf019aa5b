"""The objects the stream's state knows, for a reconcile: copied out of the checkpoint by a process of its own.

A reconcile compares what it scans with the stream's state as of the checkpoint's last committed batch,
read with Spark's state data source (``format("statestore")``). Each such read opens a RocksDB instance
per state partition, and Spark 4.1 never frees an instance's statistics when it closes it
(SPARK-56523): read in the purger's own JVM, every scheduled reconcile would leave native memory behind
for as long as the purger runs (BENCHMARKS.md, the soak). So the read runs in a short-lived Spark of its
own (local mode, on the driver's machine, which already reads the checkpoint), which writes each kind's
``(kind, id)`` as Parquet beside the checkpoint, and ends, taking that memory with it. The reconcile's
scans then join with the copy on the executors, and the copy is deleted when the reconcile ends. The
copy costs a JVM's start (about 10 s of a core): a process that ends after its reconcile anyway
(``purger reconcile``) reads the state in place instead.

Example::

    with known_objects(spark, config, batch=41, kinds=["message", "payload"]) as known:
        known["message"]        # DataFrame: kind, id, known (True); a kind without state is absent
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from purger.core.settings import PurgerConfig
from purger.reconcile.verdict import ReconcileError


# What the copying process is given, on its standard input (the configuration's secrets stay off its command
# line): the configuration, the batch whose state is copied, the kinds, and where the copy goes. Pickled as
# Spark ships the configuration to the executors (its policies' rules hold closures).
@dataclass(frozen=True)
class _Request:
    config: PurgerConfig
    batch: int
    kinds: list[str]
    to: str


# Copies under way in this process, which ``stop_copies`` ends (a purger's stop cancels its reconcile).
_copying: set[subprocess.Popen] = set()
_lock = threading.Lock()
# How the copying process's own error line starts.
_SAID = "state copy failed: "
# A state read of millions of objects streams them from RocksDB into Parquet: a small heap does.
_COPY_DRIVER_MEMORY = "1g"


@contextmanager
def known_objects(spark: SparkSession, config: PurgerConfig, batch: int, kinds: list[str], apart: bool = True
                  ) -> Iterator[dict[str, DataFrame]]:
    """Per kind of ``kinds`` the stream's state holds as of ``batch``: a DataFrame of ``kind``, ``id`` and
    ``known`` (True). ``apart``, the copy lives at ``<checkpoint>.known`` until the block ends; else
    the state is read in ``spark`` itself, for a process that ends after its reconcile (``purger
    reconcile``), where what Spark keeps of the read goes with it."""
    if not apart:
        yield _known(_read(spark, config.stream.checkpoint_location, batch, kinds))
        return
    # One copy at a time: a purger's reconciles run one after the other; one killed leaves its copy here.
    to = f"{config.stream.checkpoint_location}.known"
    _delete(spark, to)
    try:
        copied = _copy(config, batch, kinds, to)
        yield _known({kind: spark.read.parquet(f"{to}/{kind}") for kind in copied})
    finally:
        _delete(spark, to)


def _known(ids: dict[str, DataFrame]) -> dict[str, DataFrame]:
    return {kind: values.withColumn("known", F.lit(True)) for kind, values in ids.items()}


def _read(spark: SparkSession, checkpoint: str, batch: int, kinds: list[str]) -> dict[str, DataFrame]:
    """Each kind's ``(kind, id)`` in the state of ``checkpoint`` as of ``batch``; a kind the stream has not kept
    yet (a policy enabled since) is absent. Each kind's own state variable only: every partition read opens a
    RocksDB instance."""
    from pyspark.errors import AnalysisException

    # RocksDB state stores report to the driver's state store coordinator (see streams.pending).
    spark.streams.active
    known = {}
    for kind in kinds:
        try:
            values = (spark.read.format("statestore").option("batchId", batch).option("stateVarName", kind)
                      .load(checkpoint))
        except AnalysisException:
            continue
        known[kind] = values.select(F.col("key.kind").alias("kind"), F.col("key.id").alias("id"))
    return known


def stop_copies() -> None:
    """End the copies under way in this process (their reconcile fails, as one cancelled does)."""
    with _lock:
        for process in _copying:
            process.kill()


def _copy(config: PurgerConfig, batch: int, kinds: list[str], to: str) -> list[str]:
    """Run the copy in a Python process and a JVM of their own; the kinds copied (those with state)."""
    # Without the gateway of this process's JVM (spark-submit's), the copy starts a local JVM of its own.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    process = subprocess.Popen([sys.executable, "-m", "purger.reconcile.known_objects"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    with _lock:
        _copying.add(process)
    try:
        out, err = process.communicate(cloudpickle.dumps(_Request(config, batch, kinds, to)))
    finally:
        with _lock:
            _copying.discard(process)
    if process.returncode != 0:
        said = [line[len(_SAID):] for line in err.decode(errors="replace").splitlines() if line.startswith(_SAID)]
        raise ReconcileError(f"copying the state of {config.stream.checkpoint_location} (batch {batch}) for a "
                             f"reconcile failed (exit {process.returncode}): "
                             f"{said[-1] if said else 'it was ended before it said why'}")
    return [kind for kind in out.decode().split() if kind in kinds]  # what else it printed is not a kind


def _delete(spark: SparkSession, path: str) -> None:
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).delete(hadoop_path, True)


def _write_copy(request: _Request) -> None:
    """In the copying process: each kind's known objects as Parquet under ``request.to``; its name printed."""
    from purger.sinks.ledger import use_s3a
    from purger.spark import spark_session

    stream = request.config.stream.model_copy(update={"master": "local[*]", "driver_memory": _COPY_DRIVER_MEMORY})
    spark = spark_session(stream, app_name="purger-reconcile-state", log_level="ERROR", one_off=True)
    use_s3a(spark, request.config.ledger)
    for kind, values in _read(spark, request.config.stream.checkpoint_location, request.batch, request.kinds).items():
        values.write.mode("overwrite").parquet(f"{request.to}/{kind}")
        print(kind, flush=True)


if __name__ == "__main__":
    try:
        _write_copy(pickle.load(sys.stdin.buffer))
    except Exception as error:  # said in a line the parent finds (Spark's own lines come before it)
        print(f"{_SAID}{(str(error).strip().splitlines() or [type(error).__name__])[0]}", file=sys.stderr)
        sys.exit(1)
