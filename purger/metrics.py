"""The purger's own metrics, for a scraper: a Prometheus endpoint on the driver.

The sink adds each batch's outcomes (``batch_done``); a ``StreamingQueryListener``
adds what Spark knows of the query (rates, batch duration, watermark, state rows).

    purger_outcomes_total{kind,status}      purged, skipped, errors, dead letters, ...
    purger_purge_lag_seconds                deletion time - eligibility time (histogram)
    purger_deletions_per_second             the last batch's purged objects per second of sink time
    purger_input_rows_per_second, purger_processed_rows_per_second, purger_batch_duration_seconds,
    purger_watermark_lag_seconds, purger_state_rows
    purger_reconcile_rows_total{policy,table,count}      scanned, known, unknown_fed, overdue_fed
    purger_reconcile_orphans_total{policy,dc,count}      orphans_found, orphans_deleted
    purger_reconcile_last_run_timestamp_seconds, purger_reconcile_duration_seconds

Example::

    metrics = PurgerMetrics()
    metrics.serve(9108)          # http://127.0.0.1:9108/metrics
    spark.streams.addListener(metrics.listener())
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timezone

from prometheus_client import CollectorRegistry, Counter as PromCounter, Gauge, Histogram, start_http_server
from pyspark.sql.streaming import StreamingQueryListener

from purger.core.vocabulary import PURGED

_LAG_BUCKETS = (1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 900, 3600, float("inf"))


class PurgerMetrics:
    def __init__(self) -> None:
        # A registry per instance: several queries (or tests) in one process each keep their own.
        self.registry = CollectorRegistry()
        self.totals: Counter[tuple[str, str]] = Counter()
        r = self.registry
        self.outcomes = PromCounter("purger_outcomes", "Sink outcomes", ["kind", "status"], registry=r)
        self.lag = Histogram("purger_purge_lag_seconds", "Deletion time minus eligibility time",
                             buckets=_LAG_BUCKETS, registry=r)
        self.deletions_per_second = Gauge("purger_deletions_per_second",
                                          "Purged objects per second of the last batch's sink time", registry=r)
        self.input_rate = Gauge("purger_input_rows_per_second", "Spark: input rows per second", registry=r)
        self.processed_rate = Gauge("purger_processed_rows_per_second", "Spark: processed rows per second",
                                    registry=r)
        self.batch_duration = Gauge("purger_batch_duration_seconds", "Spark: the last batch's duration", registry=r)
        self.watermark_lag = Gauge("purger_watermark_lag_seconds", "Wall clock minus the watermark", registry=r)
        self.state_rows = Gauge("purger_state_rows", "Objects kept in the state store", registry=r)
        self.reconcile_rows = PromCounter("purger_reconcile_rows", "Reconcile: rows scanned, known to the stream, "
                                          "fed back", ["policy", "table", "count"], registry=r)
        self.reconcile_orphans = PromCounter("purger_reconcile_orphans", "Reconcile: orphan blobs found, deleted",
                                             ["policy", "dc", "count"], registry=r)
        self.reconcile_last_run = Gauge("purger_reconcile_last_run_timestamp_seconds",
                                        "When the last reconcile finished", registry=r)
        self.reconcile_duration = Gauge("purger_reconcile_duration_seconds", "The last reconcile's duration",
                                        registry=r)

    def batch_done(self, counts: dict[tuple[str, str], int], lags_s: list[float], sink_seconds: float) -> None:
        """One batch's outcome counts by (kind, status), the purge lags of its deletions, and its sink time."""
        for (kind, status), n in counts.items():
            self.totals[(kind, status)] += n
            self.outcomes.labels(kind, status).inc(n)
        for lag in lags_s:
            self.lag.observe(lag)
        purged = sum(n for (_, status), n in counts.items() if status == PURGED)
        self.deletions_per_second.set(purged / sink_seconds if sink_seconds > 0 else 0)

    def reconciled(self, rows: list, duration_s: float) -> None:
        """A reconcile run's report rows (``purger.reconcile.ReportRow``)."""
        for row in rows:
            for count in ("scanned", "known", "unknown_fed", "overdue_fed"):
                if getattr(row, count):
                    self.reconcile_rows.labels(row.policy, row.table, count).inc(getattr(row, count))
            for count in ("orphans_found", "orphans_deleted"):
                if getattr(row, count):
                    self.reconcile_orphans.labels(row.policy, row.dc, count).inc(getattr(row, count))
        self.reconcile_last_run.set(datetime.now(timezone.utc).timestamp())
        self.reconcile_duration.set(duration_s)

    def progress(self, progress: dict) -> None:
        """Spark's view of a batch (a ``StreamingQueryProgress`` as a dict)."""
        self.input_rate.set(progress.get("inputRowsPerSecond") or 0)
        self.processed_rate.set(progress.get("processedRowsPerSecond") or 0)
        self.batch_duration.set((progress.get("batchDuration") or 0) / 1000)
        self.state_rows.set(sum(op.get("numRowsTotal", 0) for op in progress.get("stateOperators", [])))
        watermark = (progress.get("eventTime") or {}).get("watermark")
        if watermark:
            moment = datetime.strptime(watermark, "%Y-%m-%dT%H:%M:%S.%f%z")
            self.watermark_lag.set((datetime.now(timezone.utc) - moment).total_seconds())

    def serve(self, port: int):
        """Serve ``/metrics`` on ``port``; returns the server (``shutdown()`` stops it)."""
        server, _thread = start_http_server(port, addr="0.0.0.0", registry=self.registry)
        return server

    def listener(self, query_name: str) -> StreamingQueryListener:
        return _ProgressListener(self, query_name)


class _ProgressListener(StreamingQueryListener):
    def __init__(self, metrics: PurgerMetrics, query_name: str) -> None:
        self.metrics = metrics
        self.query_name = query_name

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        if event.progress.name == self.query_name:
            self.metrics.progress(json.loads(event.progress.json))

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass
