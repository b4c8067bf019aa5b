"""The foreachBatch sink, on the driver: purge on the executors, then the ledger and the metrics.

The batch's outcomes are computed once and kept on the executors (a local
checkpoint, so the deletes are never run twice to compute them again), appended
to the ledger exactly once per batch (``sinks.ledger``), and summed for the
metrics. The daily report is refreshed beside the query, not in it
(``purger.running``).

Example::

    sink = PurgeSink(config, metrics)
    query = candidates.writeStream.foreachBatch(sink).start()
    sink.bind(query.id)
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Protocol

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from core.config import PurgerConfig
from core.vocabulary import PURGED
from sinks.attempts import failpoint, first_attempt
from sinks.ledger import Ledger, lag_seconds
from sinks.purge import OUTCOME_SCHEMA, purge_partition
from sinks.throttle import per_task_rate


class BatchObserver(Protocol):
    """What is told of each batch's outcomes (``purger.metrics.PurgerMetrics``)."""

    totals: Counter[tuple[str, str]]

    def batch_done(self, counts: dict[tuple[str, str], int], lags_s: list[float], sink_seconds: float) -> None: ...


class SinkClosed(RuntimeError):
    """A batch reached the sink after the purger began to stop."""


class PurgeSink:
    """The ``foreachBatch`` function: purge on the executors, then the ledger and the metrics on the driver."""

    def __init__(self, config: PurgerConfig, observer: BatchObserver) -> None:
        self.config = config
        self.observer = observer
        self.query_id: str | None = None
        self._bound = threading.Event()
        self._ledger: Ledger | None = None  # made at the first batch, which brings the session
        self._gate = threading.Lock()  # held while a batch deletes and records
        self._closed = False

    def bind(self, query_id: str) -> None:
        """The query's id (kept in its checkpoint, so the same after a restart) names its ledger writes."""
        self.query_id = query_id
        self._bound.set()

    def close(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the batch under way to delete and record, then refuse the next
        ones. A query stopped between its deletions and its ledger write leaves them unrecorded until
        the batch runs again at the next start; a refused batch has deleted nothing."""
        finished = self._gate.acquire(timeout=timeout_s)
        self._closed = True
        if finished:
            self._gate.release()

    def __call__(self, candidates: DataFrame, batch_id: int) -> None:
        if not self._bound.wait(timeout=60):
            raise RuntimeError("PurgeSink.bind(query.id) was not called: the ledger cannot name its writes")
        with self._gate:
            if self._closed:
                raise SinkClosed(f"the purger is stopping: batch {batch_id} runs again from the checkpoint "
                                 "at the next start")
            self._purge(candidates, batch_id)

    def _purge(self, candidates: DataFrame, batch_id: int) -> None:
        spark = candidates.sparkSession
        config = self.config
        started = time.monotonic()
        rate = per_task_rate(config.stream.max_deletions_per_second, candidates.rdd.getNumPartitions(),
                             spark.sparkContext.defaultParallelism)
        retried = not first_attempt(spark, f"{config.stream.checkpoint_location}/purger-attempts", batch_id)
        query_id = self.query_id
        # Computed once and kept: computing the outcomes again would run the deletes again.
        outcomes = spark.createDataFrame(
            candidates.rdd.mapPartitions(lambda rows: purge_partition(rows, config, batch_id, rate, retried, query_id)),
            OUTCOME_SCHEMA,
        ).localCheckpoint(eager=True)
        counts = outcomes.groupBy("kind", "status").agg(
            F.count(F.lit(1)).alias("count"),
            F.collect_list(F.when(F.col("status") == PURGED, lag_seconds())).alias("lags"),
        ).collect()
        if counts:
            self._ledger = self._ledger or Ledger(spark, config.ledger)
            failpoint("before_ledger_write")
            self._ledger.append(outcomes, self.query_id, batch_id)
            failpoint("after_ledger_write")
            self.observer.batch_done({(r["kind"], r["status"]): r["count"] for r in counts},
                                     [lag for r in counts for lag in r["lags"]], time.monotonic() - started)
        outcomes.unpersist()

    @property
    def totals(self) -> Counter[tuple[str, str]]:
        return self.observer.totals
