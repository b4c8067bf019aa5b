"""The purger's own metrics, for a scraper: a Prometheus endpoint on the driver.

The sink adds each batch's outcomes (``batch_done``); a ``ProgressFollower`` adds what Spark knows of the
query (its start and end, rates, batch duration, watermark, state rows, candidates); each scheduled
reconcile adds its report (``reconciled``). The alerts of deploy/prometheus/purger-rules.yml read them.

    purger_outcomes_total{kind,status}      purged, skipped, errors, dead letters, ...
    purger_purge_lag_seconds                deletion time - eligibility time (histogram)
    purger_deletions_per_second             the last batch's purged objects per second of sink time
    purger_candidates_total{kind}           candidates, each paced by the cap, purger_max_deletions_per_second
    purger_forgotten_total{kind}            objects dropped from the state that never were candidates
    purger_input_rows_per_second, purger_processed_rows_per_second, purger_batch_duration_seconds,
    purger_last_batch_timestamp_seconds, purger_watermark_lag_seconds, purger_watermark_timestamp_seconds,
    purger_state_rows, purger_query_active, purger_query_started_timestamp_seconds
    purger_reconcile_rows_total{policy,table,count}      scanned, known, unknown_fed, overdue_fed
    purger_reconcile_orphans_total{policy,table,dc,count}      orphans_found, orphans_deleted (blobs: their
        data centre; dependent rows without their parent: dc "all")
    purger_reconcile_last_rows{policy,table,count}, purger_reconcile_last_orphans{policy,table,dc,count}: the last run's
    purger_reconcile_last_run_timestamp_seconds, purger_reconcile_duration_seconds, purger_reconcile_interval_seconds

Example::

    metrics = PurgerMetrics(max_deletions_per_second=1000, reconcile_interval_s=86400)
    metrics.serve(9108)          # http://127.0.0.1:9108/metrics
    follower = metrics.follow(query)   # its progress, read every second
    ...
    follower.stop()
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter as PromCounter, Gauge, start_http_server
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString
from py4j.protocol import Py4JError
from pyspark.sql.streaming import StreamingQuery

from purger.core.lags import Lags, cumulative
from purger.core.vocabulary import DEAD_LETTER, DEAD_LETTERED, PURGED
from purger.core.vocabulary import ALL_DCS

# A reconcile report row's counts: a table's scan (data centre ``ALL_DCS``), a data centre's orphan sweep.
ROW_COUNTS = ("scanned", "known", "unknown_fed", "overdue_fed")
ORPHAN_COUNTS = ("orphans_found", "orphans_deleted")
# ... and, of a data centre's bucket that keeps versions, what deletes left there: the last run's only.
VERSION_COUNTS = ("noncurrent_versions", "noncurrent_bytes")
# streams.candidates observes each kind's candidates as "<kind>_candidates" in the observed metrics "purger".
_CANDIDATES = "_candidates"
# ... and each kind's objects forgotten without ever having been a candidate as "<kind>_forgotten".
_FORGOTTEN = "_forgotten"


class LagHistogram:
    """purger_purge_lag_seconds, a histogram added to a batch at a time from its tasks' merged counts
    (``core.lags.Lags``), not a deletion at a time as ``prometheus_client.Histogram`` observes."""

    NAME = "purger_purge_lag_seconds"

    def __init__(self, registry: CollectorRegistry) -> None:
        self.counts = Lags().counts
        self.sum_s = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def add(self, lags: Lags) -> None:
        with self._lock:
            self.counts = [a + b for a, b in zip(self.counts, lags.counts)]
            self.sum_s += lags.sum_s

    def collect(self) -> Iterable[HistogramMetricFamily]:
        with self._lock:
            buckets, sum_s = cumulative(self.counts), self.sum_s
        yield HistogramMetricFamily(self.NAME, "Deletion time minus eligibility time", sum_value=sum_s,
                                    buckets=[(floatToGoString(bound), n) for bound, n in buckets])


class PurgerMetrics:
    def __init__(self, max_deletions_per_second: float, reconcile_interval_s: float) -> None:
        # A registry per instance: several queries (or tests) in one process each keep their own.
        self.registry = CollectorRegistry()
        self.totals: Counter[tuple[str, str]] = Counter()
        r = self.registry
        self.outcomes = PromCounter("purger_outcomes", "Sink outcomes", ["kind", "status"], registry=r)
        # At 0 from the start: the first dead letters are then an increase, which an alert sees.
        self.outcomes.labels(DEAD_LETTER, DEAD_LETTERED)
        self.lag = LagHistogram(r)
        self.deletions_per_second = Gauge("purger_deletions_per_second",
                                          "Purged objects per second of the last batch's sink time", registry=r)
        self.candidates = PromCounter("purger_candidates", "Candidates by kind, each paced by the deletion cap",
                                      ["kind"], registry=r)
        self.stuck = Gauge("purger_objects_stuck", "Objects whose purge has failed for over an hour, still "
                           "retried (of the failures table's first 10,000 rows)", registry=r)
        self.forgotten = PromCounter("purger_forgotten", "Objects dropped from the state without ever having been "
                                     "a candidate, stream.forget_after after their last event", ["kind"], registry=r)
        Gauge("purger_max_deletions_per_second", "stream.max_deletions_per_second: the cap on candidates purged "
              "per second", registry=r).set(max_deletions_per_second)
        self.input_rate = Gauge("purger_input_rows_per_second", "Spark: input rows per second", registry=r)
        self.processed_rate = Gauge("purger_processed_rows_per_second", "Spark: processed rows per second",
                                    registry=r)
        self.batch_duration = Gauge("purger_batch_duration_seconds", "Spark: the last batch's duration", registry=r)
        self.last_batch = Gauge("purger_last_batch_timestamp_seconds", "When the last batch finished", registry=r)
        self.watermark_lag = Gauge("purger_watermark_lag_seconds", "Wall clock minus the watermark", registry=r)
        self.watermark = Gauge("purger_watermark_timestamp_seconds", "The watermark, as of the last batch",
                               registry=r)
        self.state_rows = Gauge("purger_state_rows", "Objects kept in the state store", registry=r)
        self.query_active = Gauge("purger_query_active", "1 while the query runs", registry=r)
        self.query_started_at = Gauge("purger_query_started_timestamp_seconds", "When the query last started",
                                      registry=r)
        self.reconcile_rows = PromCounter("purger_reconcile_rows", "Reconcile: rows scanned, known to the stream, "
                                          "fed back", ["policy", "table", "count"], registry=r)
        self.reconcile_orphans = PromCounter("purger_reconcile_orphans", "Reconcile: orphan blobs and rows found, "
                                             "deleted", ["policy", "table", "dc", "count"], registry=r)
        self.reconcile_last_rows = Gauge("purger_reconcile_last_rows", "The last reconcile's rows scanned, known "
                                         "to the stream, fed back", ["policy", "table", "count"], registry=r)
        self.reconcile_last_orphans = Gauge("purger_reconcile_last_orphans", "The last reconcile's orphan blobs "
                                            "and rows found, deleted", ["policy", "table", "dc", "count"], registry=r)
        self.reconcile_last_run = Gauge("purger_reconcile_last_run_timestamp_seconds",
                                        "When the last reconcile finished", registry=r)
        self.reconcile_duration = Gauge("purger_reconcile_duration_seconds", "The last reconcile's duration",
                                        registry=r)
        Gauge("purger_reconcile_interval_seconds", "reconcile.interval: 0 when the schedule is off",
              registry=r).set(reconcile_interval_s)

    def batch_done(self, counts: dict[tuple[str, str], int], lags: Lags, sink_seconds: float) -> None:
        """One batch's outcome counts by (kind, status), the purge lags of its deletions, and its sink time."""
        for (kind, status), n in counts.items():
            self.totals[(kind, status)] += n
            self.outcomes.labels(kind, status).inc(n)
        self.lag.add(lags)
        purged = sum(n for (_, status), n in counts.items() if status == PURGED)
        self.deletions_per_second.set(purged / sink_seconds if sink_seconds > 0 else 0)

    def reconciled(self, rows: list, duration_s: float) -> None:
        """A reconcile run's report rows (``purger.reconcile.verdict.ReportRow``): added to the totals, and the run's
        counts, zeros included, in place of the previous run's."""
        last_rows: Counter[tuple[str, str, str]] = Counter()
        last_orphans: Counter[tuple[str, str, str, str]] = Counter()
        for row in rows:
            for count in ROW_COUNTS:
                if getattr(row, count):
                    self.reconcile_rows.labels(row.policy, row.table, count).inc(getattr(row, count))
                if row.dc == ALL_DCS:
                    last_rows[(row.policy, row.table, count)] += getattr(row, count)
            for count in ORPHAN_COUNTS:
                if getattr(row, count):
                    self.reconcile_orphans.labels(row.policy, row.table, row.dc, count).inc(getattr(row, count))
                # Every row, zeros included: a table whose orphans are gone says 0, not the last run's count.
                last_orphans[(row.policy, row.table, row.dc, count)] += getattr(row, count)
            if row.dc != ALL_DCS:
                for count in VERSION_COUNTS:
                    last_orphans[(row.policy, row.table, row.dc, count)] += getattr(row, count)
        for labels, n in last_rows.items():
            self.reconcile_last_rows.labels(*labels).set(n)
        for labels, n in last_orphans.items():
            self.reconcile_last_orphans.labels(*labels).set(n)
        self.reconcile_last_run.set(time.time())
        self.reconcile_duration.set(duration_s)

    def progress(self, progress: dict) -> None:
        """Spark's view of a batch (a ``StreamingQueryProgress`` as a dict)."""
        self.input_rate.set(progress.get("inputRowsPerSecond") or 0)
        self.processed_rate.set(progress.get("processedRowsPerSecond") or 0)
        self.batch_duration.set((progress.get("batchDuration") or 0) / 1000)
        self.last_batch.set(_epoch_s(progress["timestamp"]) + (progress.get("batchDuration") or 0) / 1000)
        self.state_rows.set(sum(op.get("numRowsTotal", 0) for op in progress.get("stateOperators", [])))
        watermark = (progress.get("eventTime") or {}).get("watermark")
        if watermark:
            self.watermark.set(_epoch_s(watermark))
            self.watermark_lag.set(time.time() - _epoch_s(watermark))
        for name, n in ((progress.get("observedMetrics") or {}).get("purger") or {}).items():
            if name.endswith(_CANDIDATES):
                self.candidates.labels(name.removesuffix(_CANDIDATES)).inc(n)
            elif name.endswith(_FORGOTTEN) and n:
                self.forgotten.labels(name.removesuffix(_FORGOTTEN)).inc(n)

    def query_started(self, started_s: float) -> None:
        self.query_active.set(1)
        self.query_started_at.set(started_s)

    def query_ended(self) -> None:
        self.query_active.set(0)

    def serve(self, port: int, host: str = "127.0.0.1"):
        """Serve ``/metrics`` on ``host`` (an address of this machine; ``0.0.0.0`` for every interface) and
        ``port``; returns the server (``shutdown()`` stops it)."""
        try:
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as error:
            raise OSError(error.errno, f"the metrics endpoint cannot listen on {host} port {port} (metrics.host, "
                          f"metrics.port): {error.strerror or error}") from error
        return server

    def follow(self, query: StreamingQuery, interval_s: float = 1.0) -> "ProgressFollower":
        """Feed this instance ``query``'s progress from now on, read every ``interval_s`` (``ProgressFollower``)."""
        return ProgressFollower(self, query, interval_s).start()


def _epoch_s(moment: str) -> float:
    """Seconds since the epoch of a time in Spark's progress and events, e.g. ``2026-11-20T09:12:30.250Z``."""
    return datetime.strptime(moment, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


Progress = Mapping[str, Any]


def executed(progress: Progress) -> bool:
    """A batch's progress, not the one Spark adds while the query waits for data (no ``addBatch`` in it)."""
    return "addBatch" in (progress.get("durationMs") or {})


def batches_since(last: Progress, recent: Callable[[], Iterable[Progress]], seen: int | None) -> list[Progress]:
    """The progress of each batch run after batch ``seen`` (None: none seen yet), in order, given the query's
    last progress and, asked only when batches ran between two reads, its recent ones."""
    if executed(last) and (seen is None or last["batchId"] == seen + 1):
        return [last]
    return sorted((p for p in recent() if executed(p) and (seen is None or p["batchId"] > seen)),
                  key=lambda p: p["batchId"])


class ProgressFollower:
    """Reads the query's progress every ``interval_s`` and feeds ``metrics`` each batch's, once; the query's end
    when it is no longer active, or at ``stop``.

    Not a ``StreamingQueryListener``: PySpark hands a Python listener each event converted field by field
    over Py4J (the state operators' custom metrics, the observed rows: a few hundred calls a batch), which
    cost an idle purger a quarter of its CPU (BENCHMARKS.md, "What an idle purger costs"). A read here is
    three calls, and the recent progress only when batches ran faster than the reads.
    """

    def __init__(self, metrics: PurgerMetrics, query: StreamingQuery, interval_s: float) -> None:
        self.metrics = metrics
        self.query = query
        self.interval_s = interval_s
        self.seen: int | None = None  # the last batch fed
        self._read: str | None = None  # the timestamp of the last progress read
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="purger-progress", daemon=True)

    def start(self) -> "ProgressFollower":
        self.metrics.query_started(time.time())
        self._thread.start()
        return self

    def stop(self) -> None:
        """Feed the last batches, then the query's end."""
        self._stopped.set()
        self._thread.join()
        self.read()
        self.metrics.query_ended()

    def read(self) -> None:
        """Feed the batches run since the last read."""
        try:
            last = self.query.lastProgress
            if last is None or last["timestamp"] == self._read:
                return
            self._read = last["timestamp"]
            for progress in batches_since(last, lambda: self.query.recentProgress, self.seen):
                self.metrics.progress(json.loads(progress.json))
                self.seen = progress["batchId"]
        except Py4JError:  # the session already stopped: nothing more to read
            pass

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            self.read()
            try:
                if not self.query.isActive:
                    self.metrics.query_ended()
                    return
            except Py4JError:
                return
