"""The foreachBatch sink, on the driver: purge on the executors, then the ledger and the metrics.

The batch's outcomes are computed once and kept on the executors (a local
checkpoint, so the deletes are never run twice to compute them again), counted
by the same job's tasks as they go (an accumulator, so a batch with nothing to
purge is one Spark job), appended to the ledger exactly once per batch
(``sinks.ledger``), and summed for the metrics and one INFO line
(``batch_summary``). Each step's jobs carry the batch
and the step as their description in the Spark UI. The daily report is
refreshed beside the query, not in it (``purger.running``).

Example::

    sink = PurgeSink(config, metrics, ledger)
    query = candidates.writeStream.foreachBatch(sink).start()
    sink.bind(query.id)
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Protocol

from pyspark import StorageLevel
from pyspark.accumulators import Accumulator, AccumulatorParam
from pyspark.sql import DataFrame, SparkSession

from purger.core.settings import PurgerConfig
from purger.core.lags import Lags
from purger.core.vocabulary import ALREADY_GONE, DEAD_LETTERED, ERROR, PURGED, SKIPPED, WOULD_DELETE
from purger.core.failpoints import failpoint
from purger.core.times import human_duration
from purger.sinks.attempts import first_attempt, first_attempted_ms
from purger.sinks.ledger import Ledger, lag_seconds
from purger.sinks.purge import OUTCOME_SCHEMA, purge_partition, to_ledger
from purger.sinks.throttle import per_task_rate

log = logging.getLogger(__name__)


class BatchObserver(Protocol):
    """What is told of each batch's outcomes (``purger.metrics.PurgerMetrics``)."""

    totals: Counter[tuple[str, str]]

    def batch_done(self, counts: dict[tuple[str, str], int], lags: Lags, sink_seconds: float) -> None: ...


_SUMMARY_STATUSES = ((PURGED, "purged"), (WOULD_DELETE, "would be deleted"), (ALREADY_GONE, "already gone"),
                     (SKIPPED, "skipped"), (ERROR, "errors"), (DEAD_LETTERED, "dead-lettered"))
_SUMMARY_WHEN_ANY = {WOULD_DELETE, ALREADY_GONE}  # a dry run's and a replay's: shown when there are some


def batch_summary(batch_id: int, counts: dict[tuple[str, str], int], lags: Lags, sink_seconds: float) -> str:
    """The purger's line for a batch: its outcome records (the report's ``candidates``) by status, the
    p99 purge lag of its deletions (from their sketch, as the daily report's), and the sink's time.

    >>> batch_summary(42, {("message", "purged"): 3, ("payload", "purged"): 9, ("message", "skipped"): 1},
    ...               Lags.of([2.0, 4.0, 3.0]), 1.43)
    'batch 42: 13 candidates, 12 purged, 1 skipped, 0 errors, 0 dead-lettered, lag p99 4 s, in 1.4 s'
    """
    by_status: Counter[str] = Counter()
    for (_, status), n in counts.items():
        by_status[status] += n
    shown = [f"{by_status[status]} {label}" for status, label in _SUMMARY_STATUSES
             if by_status[status] or status not in _SUMMARY_WHEN_ANY]
    if lags.count:
        shown.append(f"lag p99 {human_duration(lags.quantile(0.99))}")
    return (f"batch {batch_id}: {sum(by_status.values())} candidates, {', '.join(shown)}, "
            f"in {human_duration(sink_seconds)}")


class OutcomeTally(AccumulatorParam):
    """Outcome rows (``OUTCOME_SCHEMA`` tuples) counted by (kind, status), with the purge lags of the
    deletions (``core.lags.Lags``) and the number recorded from an intent (which the ledger may hold already):
    added up by each task of the purge job, merged on the driver a task at a time. Spark merges a task's
    additions once, from its successful attempt only."""

    KIND, STATUS, ELIGIBLE_AT, DELETED_AT, INTENT = (
        OUTCOME_SCHEMA.fieldNames().index(name)
        for name in ("kind", "status", "eligible_at_ms", "deleted_at_ms", "intent"))

    def zero(self, value: Any = None) -> tuple[Counter[tuple[str, str]], Lags, list[int]]:
        return Counter(), Lags(), [0]

    def addInPlace(self, total: Any, more: Any) -> tuple[Counter[tuple[str, str]], Lags, list[int]]:
        total[0].update(more[0])
        total[1].merge(more[1])
        total[2][0] += more[2][0]
        return total

    @classmethod
    def counted(cls, outcomes: Iterator[tuple], tally: Accumulator) -> Iterator[tuple]:
        """Pass the ledger's rows of ``outcomes`` on (``to_ledger``), then add the counts and lags of every one,
        recorded or not, to ``tally``. A deletion without both times (a policy that does not say when it
        deleted) is counted and has no lag."""
        counts, lags, from_intent = cls().zero()

        def counting() -> Iterator[tuple]:
            for outcome in outcomes:
                counts[(outcome[cls.KIND], outcome[cls.STATUS])] += 1
                eligible_at, deleted_at = outcome[cls.ELIGIBLE_AT], outcome[cls.DELETED_AT]
                if outcome[cls.STATUS] == PURGED and eligible_at is not None and deleted_at is not None:
                    lags.observe(lag_seconds(eligible_at, deleted_at))
                from_intent[0] += outcome[cls.INTENT] is not None
                yield outcome

        yield from to_ledger(counting())
        tally.add((counts, lags, from_intent))


@contextmanager
def job_description(spark: SparkSession, description: str) -> Iterator[None]:
    """Name the jobs run inside in the Spark UI; then restore the description before (Spark's own for the
    micro-batch). foreachBatch runs in the query's thread, whose local properties the jobs carry."""
    context = spark.sparkContext
    before = context.getLocalProperty("spark.job.description")
    context.setJobDescription(description)
    try:
        yield
    finally:
        context.setJobDescription(before)  # type: ignore[arg-type]  # None removes it


def outcome_storage(spark: SparkSession) -> StorageLevel:
    """Where a batch's outcomes are kept until the ledger has them: on a cluster, in two executors, so losing
    one between the deletes and the ledger write loses none of them; in local mode, in the one process."""
    local = spark.sparkContext.master.startswith("local")
    return StorageLevel.MEMORY_AND_DISK if local else StorageLevel.MEMORY_AND_DISK_2


class SinkClosed(RuntimeError):
    """A batch reached the sink after the purger began to stop, and no stop followed (``PurgeSink._refuse``)."""


class StoppedWhileRefused(RuntimeError):
    """A batch refused by a closed sink, ended by the query's stop (``PurgeSink._refuse``): no failure."""


def _not_a_stopped_batch(record: logging.LogRecord) -> bool:
    """py4j logs, at ERROR with its traceback, every exception a Python callback raises, the foreachBatch
    function's included: not this one, which is how a refused batch ends at a stop."""
    return not (record.exc_info and isinstance(record.exc_info[1], StoppedWhileRefused))


# How many times a batch is purged when its outcomes are lost with executors before the ledger has them.
PURGE_RUNS = 3
# How long a batch refused by a closed sink waits for the query's stop before ending the query itself.
REFUSED_WAIT_S = 10
# What Spark recognises, in the foreachBatch function's error, as a JVM call of it interrupted by the query's
# stop (the text py4j gives such an error): the query then ends as stopped, not failed.
_INTERRUPTED_BY_STOP = ("py4j.protocol.Py4JJavaError: An error occurred while calling Thread.sleep\n"
                        ": java.lang.InterruptedException: the purger is stopping")


class PurgeSink:
    """The ``foreachBatch`` function: purge on the executors, then the ledger and the metrics on the driver."""

    def __init__(self, config: PurgerConfig, observer: BatchObserver, ledger: Ledger,
                 after_batch: Callable[[], None] | None = None) -> None:
        self.config = config
        # Called once a batch's job has ended (the timers it registered go to the clock: streams.timers).
        self.after_batch = after_batch
        self.observer = observer
        self.query_id: str | None = None
        self._bound = threading.Event()
        self.ledger = ledger
        self._gate = threading.Lock()  # held while a batch deletes and records
        self._closed = False
        # The last batch that deleted and recorded here, since this start.
        self.last_batch: int | None = None
        # Set while a batch waits at the closed sink for the query's stop (``_refuse``).
        self.refusing = threading.Event()
        self._tally: Accumulator | None = None  # made at the first batch, with the session's context
        logging.getLogger("py4j.clientserver").addFilter(_not_a_stopped_batch)  # once: the same function

    def bind(self, query_id: str) -> None:
        """The query's id (kept in its checkpoint, so the same after a restart) names its ledger writes."""
        self.query_id = query_id
        self._bound.set()

    def close(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the batch under way to delete and record, then refuse the next
        ones. A query stopped between its deletions and its ledger write leaves them unrecorded until
        the batch runs again at the next start; a refused batch has deleted nothing. Returns False when
        the batch under way did not end in time (it is cut when the query stops)."""
        finished = self._gate.acquire(timeout=timeout_s)
        self._closed = True
        if finished:
            self._gate.release()
        return finished

    def __call__(self, candidates: DataFrame, batch_id: int) -> None:
        if not self._bound.wait(timeout=60):
            raise RuntimeError("PurgeSink.bind(query.id) was not called: the ledger cannot name its writes")
        with self._gate:
            refused = self._closed
            if not refused:
                self._purge(candidates, batch_id)
                self.last_batch = batch_id
        if refused:
            self._refuse(candidates.sparkSession, batch_id)

    def _refuse(self, spark: SparkSession, batch_id: int) -> None:
        """A batch that reached the sink after ``close``: it deletes nothing and runs again at the next start.

        It waits in the JVM, on the query's thread (PySpark pins a callback's calls to the thread that made
        it), for the ``query.stop()`` that follows ``close`` (``RunningPurger.stop`` waits for ``refusing``):
        the stop's interrupt then ends the batch quietly, and Spark takes an interrupted JVM call of the
        foreachBatch function for a stop, not a failure (no error logged, no exception kept). Raising at
        once would end the query with an error, logged with its whole plan. Without a stop within
        ``REFUSED_WAIT_S`` the batch ends the query with ``SinkClosed``."""
        from py4j.protocol import Py4JJavaError

        self.refusing.set()
        try:
            spark.sparkContext._jvm.java.lang.Thread.sleep(int(REFUSED_WAIT_S * 1000))
        except Py4JJavaError as error:
            if error.java_exception.getClass().getName() != "java.lang.InterruptedException":
                raise
            # Said again in short: Spark reads the error's text with a regular expression that overflows
            # the query thread's stack on a long one, the Java stack trace of the original (SPARK's
            # StreamExecution.PROXY_ERROR); the query thread then dies instead of stopping.
            raise StoppedWhileRefused(_INTERRUPTED_BY_STOP) from None
        raise SinkClosed(f"the purger is stopping: batch {batch_id} runs again from the checkpoint at the next start")

    def _purge(self, candidates: DataFrame, batch_id: int) -> None:
        spark = candidates.sparkSession
        config = self.config
        started = time.monotonic()
        rate = per_task_rate(config.stream.max_deletions_per_second, candidates.rdd.getNumPartitions(),
                             spark.sparkContext.defaultParallelism)
        attempts = f"{config.stream.checkpoint_location}/purger-attempts"
        retried = not first_attempt(spark, attempts, batch_id)
        # What an earlier attempt recorded, it recorded since then: a retry's merge reads those days only.
        began_ms = first_attempted_ms(spark, attempts, batch_id)
        query_id = self.query_id
        if self._tally is None:
            self._tally = spark.sparkContext.accumulator(OutcomeTally().zero(), OutcomeTally())
        tally = self._tally
        for run in range(1, PURGE_RUNS + 1):
            tally.value = OutcomeTally().zero()  # one batch at a time (the gate)
            # Computed once and kept: computing the outcomes again would run the deletes again. This job runs
            # the whole micro-batch: the events read, the stateful stage, and the purge of its candidates.
            with job_description(spark, f"batch {batch_id}: purge candidates"):
                outcomes = spark.createDataFrame(
                    candidates.rdd.mapPartitions(lambda rows: OutcomeTally.counted(
                        purge_partition(rows, config, batch_id, rate, query_id), tally)),
                    OUTCOME_SCHEMA,
                ).localCheckpoint(eager=True, storageLevel=outcome_storage(spark))
            by_kind_and_status, lags, (from_intent,) = tally.value
            tally.value = OutcomeTally().zero()  # the batch's sketch is not kept past it (core.lags.Lags)
            try:
                if by_kind_and_status:
                    with job_description(spark, f"batch {batch_id}: ledger"):
                        failpoint("before_ledger_write")
                        self.ledger.append(outcomes, self.query_id, batch_id, may_hold=retried or from_intent > 0,
                                           began_ms=began_ms)
                        failpoint("after_ledger_write")
                break
            except Exception as error:
                if run == PURGE_RUNS or "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND" not in str(error):
                    raise
                # Every copy of some outcomes went with the executors that held them. Purging the batch
                # again is a retry: what it finds gone, it records from the first run's intents.
                log.warning("batch %d: outcomes lost with their executors before the ledger had them; purging "
                            "the batch again (run %d of %d)", batch_id, run + 1, PURGE_RUNS)
                retried = True
            finally:
                outcomes.unpersist()
        if self.after_batch is not None:
            self.after_batch()
        if by_kind_and_status:
            by_kind_and_status = dict(by_kind_and_status)
            sink_seconds = time.monotonic() - started
            self.observer.batch_done(by_kind_and_status, lags, sink_seconds)
            log.info("%s", batch_summary(batch_id, by_kind_and_status, lags, sink_seconds))

    @property
    def totals(self) -> Counter[tuple[str, str]]:
        return self.observer.totals
