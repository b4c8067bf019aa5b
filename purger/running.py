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
from purger.sinks.sink import PurgeSink, SinkClosed
from purger.streams.candidates import candidates_stream, ms
from purger.streams.clock import Clock

log = logging.getLogger(__name__)


@dataclass
class RunningPurger:
    query: StreamingQuery
    sink: PurgeSink
    clock: Clock
    metrics: PurgerMetrics
    release: Callable[[], None]  # the listener and the metrics endpoint

    @property
    def failure(self) -> Exception | None:
        """The query's exception if it failed. A batch that reached the sink in the moment between
        ``stop`` closing the sink and stopping the query is refused (``SinkClosed``) and ends the query
        with that exception; it deleted nothing and runs again at the next start, so it is no failure.

        Example::

            running.stop()
            assert running.failure is None
        """
        error = self.query.exception()
        return None if error is None or SinkClosed.__name__ in str(error) else error

    def stop(self, wait_for_batch_s: float = 90) -> None:
        """Stop between micro-batches when one ends within ``wait_for_batch_s``; in any case not
        while the sink deletes and records (unless that takes longer than ``wait_for_batch_s``).

        Interrupting a batch inside the Python state server makes Spark log an error storm, and
        one that has deleted but not written its ledger records leaves them to the next start;
        the work itself is safe either way, since the batch is redone from the checkpoint.
        """
        self.clock.stop()
        deadline = time.monotonic() + wait_for_batch_s
        while self.query.isActive and self.query.status["isTriggerActive"] and time.monotonic() < deadline:
            time.sleep(0.05)
        self.sink.close(wait_for_batch_s)
        self.query.stop()
        self.release()


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
        .trigger(processingTime=f"{ms(stream.trigger_interval)} milliseconds")
        .start()
    )
    sink.bind(query.id)
    clock = Clock(config.kafka, stream.clock_interval.total_seconds()).start(query)
    report = Report(spark, config.ledger, config.policy_set)
    reporting = _every(config.ledger.report_interval.total_seconds(), report.refresh, "purger-report",
                       lambda: _set_up_report_thread(spark))
    return RunningPurger(query, sink, clock, metrics, lambda: _stopped(spark, listener, server, reporting))


def _set_up_report_thread(spark: SparkSession) -> None:
    """The report's jobs: in a scheduler pool of their own, and named in the Spark UI beside the batches'."""
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", "purger-report")
    spark.sparkContext.setJobDescription("daily report")


def _every(interval_s: float, action: Callable[[], None], name: str,
           setup: Callable[[], None] = lambda: None) -> Callable[[], None]:
    """Run ``action`` every ``interval_s`` in a thread beside the query (Spark takes jobs from
    several threads), after ``setup`` in that thread, so it never lengthens a micro-batch. Returns
    ``stop``, which waits for a round under way, so that none is cut off by the session stopping."""
    stopped = threading.Event()

    def run() -> None:
        setup()
        while not stopped.wait(interval_s):
            try:
                action()
            except Exception:  # the next round tries again; the ledger itself is unaffected
                log.exception("%s failed", name)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()

    def stop() -> None:
        stopped.set()
        thread.join(timeout=120)

    return stop


def _stopped(spark: SparkSession, listener, server, stop_reporting: Callable[[], None]) -> None:
    stop_reporting()
    spark.streams.removeListener(listener)
    if server is not None:
        server.shutdown()
        server.server_close()
