"""The running purger: the candidates stream (``streams.candidates``) into the purge sink
(``sinks.sink``), with its clock, its metrics and the daily report beside it.

Example::

    from purger.running import start_purger
    running = start_purger(spark, config)
    running.query.awaitTermination()
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from purger.core.config import PurgerConfig
from purger.metrics import PurgerMetrics
from purger.sinks.ledger import Ledger, Report
from purger.sinks.sink import PurgeSink, SinkClosed, StoppedWhileRefused
from purger.core.times import duration_ms
from purger.streams.candidates import candidates_stream
from purger.streams.clock import Clock

log = logging.getLogger(__name__)


@dataclass
class RunningPurger:
    query: StreamingQuery
    sink: PurgeSink
    clock: Clock
    metrics: PurgerMetrics
    release: Callable[[], None]  # the daily report's thread, the listener and the metrics endpoint
    # Stops the daily report's thread, cancelling a round under way (the first step of ``stop``).
    stop_reporting: Callable[[], None] = lambda: None
    # Set by ``stop``: False when a batch was cut in its deletions or its ledger write.
    stopped_cleanly: bool | None = None

    @property
    def failure(self) -> Exception | None:
        """The query's exception if it failed. A batch that reaches a closed sink is refused: it waits there
        for the stop, which ends it as a stop; one closed without a stop (or not stopped within
        ``sinks.sink.REFUSED_WAIT_S``) ends the query with ``SinkClosed``. It deleted nothing and runs
        again at the next start, so it is no failure.

        Example::

            running.stop()
            assert running.failure is None
        """
        error = self.query.exception()
        if error is None or any(refused.__name__ in str(error) for refused in (SinkClosed, StoppedWhileRefused)):
            return None
        return error

    def stop(self, wait_for_batch_s: float = 90) -> bool:
        """Stop promptly, and never while a batch deletes and records (unless that takes longer than
        ``wait_for_batch_s``): returns True, and sets ``stopped_cleanly``, when no batch was cut.

        The clock stops, and the daily report's round under way is cancelled (the report is only ever
        rewritten from the ledger). Then the sink closes: it waits for the batch in it, if any, which runs
        the whole micro-batch (the stateful stage, the deletions, the ledger write), and refuses later ones.
        The query stops at once after that, wherever its thread is: between batches, or planning or
        committing one, which a stop interrupts cleanly (an uncommitted batch runs again at the next start
        and its ledger write is idempotent). It does not wait for the trigger to end: with batches back to
        back the trigger is hardly ever idle, and that wait was what made a stop take up to 90 s.

        One wait remains: before the first batch of this start reaches the sink, its planning runs the
        stateful stage's set-up in a Python worker, and an interrupt there makes Spark log a storm of
        errors; that set-up takes seconds. A batch cut after ``wait_for_batch_s`` may have deleted without
        recording: its records are written when it runs again at the next start (RELIABILITY.md).
        """
        self.clock.stop()
        self.stop_reporting()
        deadline = time.monotonic() + wait_for_batch_s
        while (not self.sink.entered.is_set() and self.query.isActive and self.query.status["isTriggerActive"]
               and time.monotonic() < deadline):
            time.sleep(0.05)
        finished = self.sink.close(max(0.0, deadline - time.monotonic()))
        self.query.stop()
        self.release()
        self.stopped_cleanly = finished
        return finished


def start_purger(spark: SparkSession, config: PurgerConfig, starting_offsets: str | None = None,
                 starting_timestamp_ms: int | None = None) -> RunningPurger:
    """Make the ledger's table if absent, then start the query, its clock, and its metrics (served on
    ``metrics.port`` unless 0)."""
    stream = config.stream
    ledger = Ledger(spark, config.ledger)
    ledger.create()
    candidates = candidates_stream(spark, config, starting_offsets, starting_timestamp_ms)
    metrics = PurgerMetrics()
    listener = metrics.listener(stream.query_name)
    spark.streams.addListener(listener)
    server = metrics.serve(config.metrics.port) if config.metrics.port else None
    sink = PurgeSink(config, metrics, ledger)
    query = (
        candidates.writeStream.queryName(stream.query_name)
        .foreachBatch(sink)
        .option("checkpointLocation", stream.checkpoint_location)
        .trigger(processingTime=f"{duration_ms(stream.trigger_interval)} milliseconds")
        .start()
    )
    sink.bind(query.id)
    clock = Clock(config.kafka, stream.clock_interval.total_seconds()).start(query)
    report = Report(spark, config.ledger, config.policy_set)
    reporting = _every(config.ledger.report_interval.total_seconds(), report.refresh, "purger-report",
                       lambda: _set_up_report_thread(spark),
                       lambda: spark.sparkContext.cancelJobGroup(REPORT_JOB_GROUP))
    return RunningPurger(query, sink, clock, metrics, lambda: _stopped(spark, listener, server, reporting),
                         reporting)


# The daily report's jobs, which a stop cancels.
REPORT_JOB_GROUP = "purger-report"


def _set_up_report_thread(spark: SparkSession) -> None:
    """The report's jobs: in a scheduler pool of their own, named in the Spark UI beside the batches', and
    in a job group of their own, which a stop cancels."""
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", "purger-report")
    spark.sparkContext.setJobGroup(REPORT_JOB_GROUP, "daily report")


def _every(interval_s: float, action: Callable[[], None], name: str,
           setup: Callable[[], None] = lambda: None, cancel: Callable[[], None] = lambda: None,
           stop_within_s: float = 120) -> Callable[[], None]:
    """Run ``action`` every ``interval_s`` in a thread beside the query (Spark takes jobs from
    several threads), after ``setup`` in that thread, so it never lengthens a micro-batch. Returns
    ``stop``, which ends the thread: it calls ``cancel`` (the round's Spark jobs, each one it starts)
    until a round under way gives up, within ``stop_within_s``; a round cut so is no failure."""
    stopped = threading.Event()

    def run() -> None:
        setup()
        while not stopped.wait(interval_s):
            try:
                action()
            except Exception:  # the next round tries again; the ledger itself is unaffected
                if not stopped.is_set():
                    log.exception("%s failed", name)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()

    def stop() -> None:
        stopped.set()
        deadline = time.monotonic() + stop_within_s
        while thread.is_alive() and time.monotonic() < deadline:
            cancel()
            thread.join(timeout=0.2)

    return stop


def _stopped(spark: SparkSession, listener, server, stop_reporting: Callable[[], None]) -> None:
    stop_reporting()
    spark.streams.removeListener(listener)
    if server is not None:
        server.shutdown()
        server.server_close()
