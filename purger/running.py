"""The running purger: the candidates stream (``streams.candidates``) into the purge sink
(``sinks.sink``), with its clock, its metrics, the daily report, the ledger's daily upkeep and the scheduled
reconciles beside it.

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
from datetime import datetime, timezone
from typing import Callable

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from purger.connectors.errors import ServerUnavailable
from purger.core.settings import PurgerConfig
from purger.reconcile.known_objects import stop_copies
from purger.metrics import ProgressFollower, PurgerMetrics
from purger.reconcile.run import last_reconcile_finished_s, next_reconcile_in_s, reconcile
from purger.sinks.ledger import Ledger, Report
from purger.sinks.sink import PurgeSink, SinkClosed, StoppedWhileRefused
from purger.core.times import duration_ms, now_ms
from purger.streams.candidates import candidates_stream
from purger.streams.checkpoint import CheckpointFiles, check_continuable, reconcile_apart
from purger.streams.clock import Clock
from purger.streams.timers import CLOCK_FILE, Deadlines, EarliestTimers, SavedTimers

log = logging.getLogger(__name__)


@dataclass
class RunningPurger:
    query: StreamingQuery
    sink: PurgeSink
    clock: Clock
    deadlines: Deadlines  # saved at the stop, after the sink's last batch
    metrics: PurgerMetrics
    release: Callable[[], None]  # the daily report's thread, the progress follower and the metrics endpoint
    # The daily report's rounds beside the query, which ``stop`` ends (``Every``).
    reporting: "Every | None" = None
    # The scheduled reconciles (``reconcile.interval``), which ``stop`` cancels: the next run does the work.
    reconciling: "Every | None" = None
    # The ledger's daily upkeep (``Ledger.upkeep``), which ``stop`` cancels: the next round does the work.
    upkeeping: "Every | None" = None
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

        The clock stops, and the daily report starts no more rounds. Then the sink closes: it waits for
        the batch in it, if any, which runs the whole micro-batch (the stateful stage, the deletions, the
        ledger write), and refuses later ones. The query then stops at the first quiet moment: its thread
        idle between triggers, or the next batch waiting at the closed sink (``PurgeSink._refuse``), which
        comes as soon as that batch is planned: within a trigger interval or so, not after the batches
        that follow (waiting for an idle trigger alone made a stop take up to 90 s when batches ran back to
        back). Interrupted elsewhere (committing a batch, planning one, the first batch's set-up of the
        stateful stage in a Python worker) Spark and Hadoop log stack traces, though the stop is safe.

        A batch cut after ``wait_for_batch_s`` may have deleted without recording: its records are
        written when it runs again at the next start (RELIABILITY.md). A report round under way goes on
        beside; one still running ``REPORT_GRACE_S`` after the stop began is cancelled (the report is only
        ever rewritten from the ledger, at the next round).
        """
        began = time.monotonic()
        deadline = began + wait_for_batch_s
        self.clock.stop()
        for rounds in (self.reporting, self.reconciling, self.upkeeping):
            if rounds is not None:
                rounds.stop_soon()
        finished = self.sink.close(wait_for_batch_s)
        self.deadlines.save()
        while (self.query.isActive and self.query.status["isTriggerActive"] and not self.sink.refusing.is_set()
               and time.monotonic() < deadline):
            time.sleep(0.05)
        self.query.stop()
        if self.reconciling is not None:
            self.reconciling.join()
        if self.reporting is not None:
            self.reporting.join(max(0.0, began + REPORT_GRACE_S - time.monotonic()))
        self.release()
        self.stopped_cleanly = finished
        return finished


def start_purger(spark: SparkSession, config: PurgerConfig, starting_offsets: str | None = None,
                 starting_timestamp_ms: int | None = None) -> RunningPurger:
    """Make the ledger's table if absent, then start the query, its clock, and its metrics (served on
    ``metrics.host`` and ``metrics.port`` unless the port is 0). A checkpoint this release cannot continue from
    raises ``CheckpointRefused`` before anything starts (``streams.checkpoint``)."""
    stream = config.stream
    for warning in check_continuable(spark, config):
        log.warning(warning)
    apart = reconcile_apart(spark, config)
    if not apart:
        log.warning("checkpoint %s reads kafka.reconcile_topic %s within the events' source, as started by 0.2.0 or "
                    "earlier: a reconcile's feed shares kafka.max_offsets_per_trigger with the events, and a bootstrap "
                    "holds new purges back; a new checkpoint (purger replay --from earliest) reads it apart",
                    stream.checkpoint_location, config.kafka.reconcile_topic)
    ledger = Ledger(spark, config.ledger)
    ledger.create()
    files = CheckpointFiles(spark, stream.checkpoint_location)
    saved = SavedTimers(lambda: files.read_text(CLOCK_FILE), lambda text: files.write_text(CLOCK_FILE, text),
                        f"{stream.checkpoint_location}/{CLOCK_FILE}")
    deadlines = Deadlines(spark.sparkContext.accumulator([], EarliestTimers()), duration_ms(stream.watermark_delay),
                          saved)
    candidates = candidates_stream(spark, config, starting_offsets, starting_timestamp_ms, apart,
                                   deadlines.accumulator)
    metrics = PurgerMetrics(stream.max_deletions_per_second, config.reconcile.interval.total_seconds())
    server = metrics.serve(config.metrics.port, config.metrics.host) if config.metrics.port else None
    sink = PurgeSink(config, metrics, ledger, after_batch=deadlines.collect)
    query = (
        candidates.writeStream.queryName(stream.query_name)
        .foreachBatch(sink)
        .option("checkpointLocation", stream.checkpoint_location)
        .trigger(processingTime=f"{duration_ms(stream.trigger_interval)} milliseconds")
        .start()
    )
    sink.bind(query.id)
    follower = metrics.follow(query)
    clock = Clock(config.kafka, stream.clock_interval.total_seconds(), stream.quiet_clock_interval.total_seconds(),
                  deadlines).start(query)
    report = Report(spark, config.ledger, config.policy_set)
    reporting = Every(config.ledger.report_interval.total_seconds(), report.refresh, "purger-report",
                      lambda: set_up_thread(spark, REPORT_JOB_GROUP, "daily report"),
                      lambda: spark.sparkContext.cancelJobGroup(REPORT_JOB_GROUP))
    upkeeping = Every(UPKEEP_INTERVAL_S, lambda: _upkeep(ledger, config), UPKEEP_JOB_GROUP,
                      lambda: set_up_thread(spark, UPKEEP_JOB_GROUP, "ledger upkeep", pool=REPORT_JOB_GROUP),
                      lambda: spark.sparkContext.cancelJobGroup(UPKEEP_JOB_GROUP), first_in=lambda: UPKEEP_FIRST_IN_S)
    reconciling = None
    if config.reconcile.interval:
        reconciling = Every(config.reconcile.interval.total_seconds(), lambda: _reconcile(spark, config, metrics),
                            RECONCILE_JOB_GROUP, lambda: set_up_thread(spark, RECONCILE_JOB_GROUP, "reconcile"),
                            lambda: _cancel_reconcile(spark),
                            first_in=lambda: _first_reconcile_in_s(spark, config, metrics))
    counting = Every(config.ledger.report_interval.total_seconds(), lambda: _count_stuck(config, metrics),
                     "purger-stuck")
    beside = [each for each in (reporting, reconciling, upkeeping, counting) if each is not None]
    return RunningPurger(query, sink, clock, deadlines, metrics, lambda: _stopped(follower, server, beside),
                         reporting, reconciling, upkeeping)


# The daily report's jobs, which a stop cancels when a round outlasts REPORT_GRACE_S: a round of a warm
# purger takes a few seconds; cancelling one makes Spark and Delta log the cancelled jobs' tasks.
REPORT_JOB_GROUP = "purger-report"
REPORT_GRACE_S = 5
# The scheduled reconciles' jobs, which a stop cancels at once.
RECONCILE_JOB_GROUP = "purger-reconcile"
# The ledger's upkeep: its jobs in the report's pool, in a group of their own, which a stop cancels at once.
# Daily, and a while after a start (after the first batches' warm-up), so that a purger restarted more often
# than daily keeps its ledger too; a round with nothing to do costs a few reads of the Delta log.
UPKEEP_JOB_GROUP = "purger-ledger-upkeep"
UPKEEP_INTERVAL_S = 24 * 3600
UPKEEP_FIRST_IN_S = 10 * 60


def set_up_thread(spark: SparkSession, group: str, description: str, pool: str | None = None) -> None:
    """A thread's jobs beside the batches' (the report's, the reconciles', the ledger's upkeep): in a scheduler
    pool (``group``'s own unless ``pool``), named in the Spark UI, whose tasks take only the cores the batches
    leave (purger/fairscheduler.xml), and in a job group of their own, which a stop cancels."""
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", pool or group)
    spark.sparkContext.setJobGroup(group, description)


def _upkeep(ledger: Ledger, config: PurgerConfig) -> None:
    """A round of the ledger's upkeep, and of the undo window's copies (``expire_copies``); a failure is one line
    (the next round, a day later, tries again)."""
    from purger.sinks.restorations import expire_copies

    started = time.monotonic()
    try:
        gone = expire_copies(config, datetime.now(timezone.utc).date())
        if gone:
            log.info("undo window: %d copies of blobs past it deleted", gone)
    except Exception as error:
        log.warning("undo window: expiring the copies of blobs failed, tried again at the next round: %s: %s",
                    type(error).__name__, (str(error).strip().splitlines() or [""])[0])
    try:
        if ledger.upkeep(datetime.now(timezone.utc).date()):
            log.info("ledger %s: upkeep done in %.0f s", ledger.path, time.monotonic() - started)
        else:
            log.info("ledger %s: upkeep under way already; this round skipped", ledger.path)
    except Exception as error:
        first_line = (str(error).strip().splitlines() or [""])[0]
        log.warning("ledger %s: upkeep failed, tried again at the next round: %s: %s", ledger.path, type(error).__name__,
                    first_line)


def _count_stuck(config: PurgerConfig, metrics: PurgerMetrics) -> None:
    """``purger_objects_stuck``: a scan of the failures table, which holds the objects that failed this week."""
    from purger.sinks.clients import executor_session
    from purger.sinks.failures import STUCK_AFTER_MS, CassandraFailures

    failures = CassandraFailures.of(executor_session(config), config)
    metrics.stuck.set(len(failures.stuck(now_ms(), STUCK_AFTER_MS)))


def _cancel_reconcile(spark: SparkSession) -> None:
    """A reconcile's Spark jobs, and its copy of the state if one is under way (``purger.reconcile.known_objects``)."""
    spark.sparkContext.cancelJobGroup(RECONCILE_JOB_GROUP)
    stop_copies()


def _reconcile(spark: SparkSession, config: PurgerConfig, metrics: PurgerMetrics) -> None:
    started = time.monotonic()
    metrics.reconciled(reconcile(spark, config), time.monotonic() - started)


def _first_reconcile_in_s(spark: SparkSession, config: PurgerConfig, metrics: PurgerMetrics) -> float:
    """Seconds until the first scheduled reconcile. Meanwhile the last one recorded is the metrics' last
    run, so that a restart does not look like a reconcile missed (deploy/prometheus/purger-rules.yml)."""
    finished_s = last_reconcile_finished_s(spark, config)
    if finished_s is not None:
        metrics.reconcile_last_run.set(finished_s)
    return next_reconcile_in_s(finished_s, config)


class Every:
    """Runs ``action`` every ``interval_s`` in a thread beside the query (Spark takes jobs from several
    threads), after ``setup`` in that thread, so it never lengthens a micro-batch; the first round after
    ``first_in()`` seconds (asked in the thread), by default an interval. ``stop_soon`` starts no more
    rounds; ``join`` waits for a round under way, then calls ``cancel`` (its Spark jobs, each one it
    starts) until it gives up. A round cut so is no failure."""

    def __init__(self, interval_s: float, action: Callable[[], None], name: str,
                 setup: Callable[[], None] = lambda: None, cancel: Callable[[], None] = lambda: None,
                 first_in: Callable[[], float] | None = None) -> None:
        self.name = name
        self.cancel = cancel
        self.stopped = threading.Event()

        def run() -> None:
            try:
                setup()
                wait_s = first_in() if first_in is not None else interval_s
            except Exception:  # a stop that came first (the session going); else the rounds go on all the same
                if not self.stopped.is_set():
                    log.exception("%s: starting failed", name)
                wait_s = interval_s
            while not self.stopped.wait(wait_s):
                try:
                    action()
                except ServerUnavailable as unavailable:  # its message names the address and what to check
                    if not self.stopped.is_set():
                        log.warning("%s: %s; the next round tries again", name, unavailable)
                except Exception:  # the next round tries again; the ledger itself is unaffected
                    if not self.stopped.is_set():
                        log.exception("%s failed", name)
                wait_s = interval_s

        self.thread = threading.Thread(target=run, name=name, daemon=True)
        self.thread.start()

    def stop_soon(self) -> None:
        self.stopped.set()

    def join(self, grace_s: float = 0, within_s: float = 120) -> None:
        """Stop: wait ``grace_s`` for a round under way, then cancel it; give up after ``within_s``."""
        self.stop_soon()
        self.thread.join(timeout=grace_s)
        deadline = time.monotonic() + within_s
        while self.thread.is_alive() and time.monotonic() < deadline:
            self.cancel()
            self.thread.join(timeout=0.2)


def _stopped(follower: ProgressFollower, server, beside: list[Every]) -> None:
    for rounds in beside:
        rounds.join()
    follower.stop()
    if server is not None:
        server.shutdown()
        server.server_close()
