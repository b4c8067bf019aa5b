"""`purger status`: its screen at 80 columns and its JSON from what it read; its readers of the metrics
endpoint, Prometheus's alerts and Spark's checkpoint logs; and, on the real servers, the counts it reads
from a ledger and a reconcile report, and a line for each source it could not read."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from purger.core.vocabulary import STATUSES
from purger.status import (
    Batch, HeldScope, Lags, Query, Reconciled, Status, Stuck, Unreadable, alert_facts, as_json, last_batch, read_alerts, read_query,
    render,
)
from tests.support.configs import free_port
from tests.support.rules import alerts
from tests.support.screens import at_80

AT = datetime(2026, 11, 26, 10, 15, 3, tzinfo=timezone.utc)
LONG_PATH = "s3a://purger-ledger-production-eu-west/" + "records/" * 6
ZERO = dict.fromkeys(STATUSES, 0)


def status(**read) -> Status:
    """What status read of a purger that runs and keeps up, with ``read`` in place of any part."""
    return Status(**{
        "at": AT, "checkpoint": "/var/lib/purger/checkpoint", "ledger": LONG_PATH, "reconcile_interval_s": 86400,
        "query": Query(True, AT - timedelta(hours=2, minutes=13)),
        "batch": Batch(4211, AT - timedelta(seconds=2), 1.3, AT - timedelta(seconds=4),
                       4212, AT - timedelta(seconds=1)),
        "today": {"engine": {**ZERO, "dead_lettered": 3},
                  "mailbox": {**ZERO, "purged": 1200345, "skipped": 567, "error": 12},
                  "units_of_work": {**ZERO, "purged": 15, "already_gone": 2}},
        "lags": Lags(118, {"p50": 3.1, "p95": 4.0, "p99": 5.2}),
        "reconcile": Reconciled("3f2a9c01b2d4", AT - timedelta(hours=8, minutes=12), AT - timedelta(hours=8),
                                False, {"mailbox": {"scanned": 4000000, "unknown_fed": 7, "overdue_fed": 1,
                                                    "orphans_found": 2},
                                        "units_of_work": {"scanned": 300, "unknown_fed": 0, "overdue_fed": 0,
                                                          "orphans_found": 0}}),
        "holds": [HeldScope("mailbox:alice", "case 2026-117", "jdoe", AT - timedelta(days=3), 12),
                  HeldScope("user:u7", "DSAR review", "legal-app", None, 0),
                  HeldScope("user:u9", "", "", None, 4, release_cut_short=True)],
        "stuck": [Stuck("payload", "p-9", 30, int((AT - timedelta(hours=26)).timestamp() * 1000),
                        "no object store configured for data centre 'dc3'")],
        **read})


def figures(lines: list[str], first: str) -> list[list[str]]:
    """The words after ``first`` of each line that starts with it: a policy's row in each table."""
    return [line.split()[1:] for line in lines if line.split()[:1] == [first]]


def test_the_screen_reads_at_80_columns_and_without_prometheus_shows_the_facts_of_the_alerts():
    lines = [line.rstrip() for line in at_80(render(status()))]
    text = "\n".join(lines)
    assert lines[0] == "Purger status at 2026-11-26 10:15:03 UTC"
    assert "running, since 2026-11-26 08:02:03 UTC (2.2 h ago)" in text
    stopped = " ".join(" ".join(at_80(render(status(query=Query(False, AT - timedelta(hours=3)))))).split())
    assert "query not running, last started 2026-11-26 07:15:03 UTC (3 h ago)" in stopped
    assert "4211, committed 2026-11-26 10:15:01 UTC (2 s ago), took 1.3 s" in text
    assert "batch 4212 at 2026-11-26 10:15:02 UTC (1 s ago), not committed" in text
    assert "4 s behind the wall clock" in text
    assert "p50 3.1 s, p95 4 s, p99 5.2 s (118 deletions)" in text
    # Today's outcomes by policy; already gone shown since some are, would delete not.
    today, reconciled = figures(lines, "mailbox")
    assert today == ["1200345", "0", "567", "12", "0"], text
    assert figures(lines, "engine") == [["0", "0", "0", "0", "3"]], text
    assert "would" not in text
    assert "finished 2026-11-26 02:15:03 UTC (8 h ago), took 12 min" in text
    assert reconciled == ["4000000", "7", "1", "2"], text
    assert "Legal holds: 2 in force, keeping 12 objects; 1 releases cut short" in lines
    assert figures(lines, "mailbox:alice") == [["12", "2026-11-23", "10:15:03", "UTC", "(3", "d", "ago)", "jdoe:",
                                                "case", "2026-117"]], text
    assert figures(lines, "user:u7") == [["0", "-", "legal-app:", "DSAR", "review"]], text
    assert " ".join(" ".join(figures(lines, "user:u9")[0]).split()).startswith("4 - released, but not looked at"), text
    assert "`purger release user:u9` again" in " ".join(text.split()), text
    assert "Legal holds: none in force" in at_80(render(status(holds=[])))
    assert "Failing for over an hour: 1 objects, still retried" in [line.rstrip() for line in lines]
    assert figures(lines, "payload") == [["p-9", "30", "2026-11-25", "08:15:03", "UTC", "(1.1", "d", "ago)", "no",
                                          "object", "store", "configured"]], text
    assert "Failing for over an hour: none" in at_80(render(status(stuck=[])))
    # No threshold: the facts only, and where to get the alerts themselves.
    assert "Alerts: they need Prometheus (--prometheus URL); what the main ones are about:" in lines
    facts = dict(alert_facts(status()))
    assert set(facts) <= set(alerts()), "a fact about an alert the rules do not have"
    assert facts["PurgerDown"] == "query running"
    assert facts["PurgerErrorsRising"] == "errors: 12 of 1200941 decisions today (0.0%)"
    assert facts["PurgerRecordsDeadLettered"] == "dead letters today: 3"
    assert facts["PurgerReconcileFoundOverdue"] == "overdue rows in the last reconcile: 1"
    assert facts["PurgerReconcileMissing"] == "last finished 8 h ago; reconcile.interval 1 d"
    for name, fact in facts.items():
        assert f"{name} {fact}" in " ".join(text.split()), (name, text)
    assert "Could not read" not in text


def test_what_could_not_be_read_is_a_line_each_and_its_parts_say_unknown():
    unread = ["checkpoint /var/lib/purger/checkpoint does not exist: no purger has run with this "
              "stream.checkpoint (purger run makes it); check the path",
              "metrics endpoint http://127.0.0.1:9108/metrics did not answer ([Errno 111] Connection refused)"]
    lines = at_80(render(status(query=None, batch=None, today=None, lags=None, reconcile=None, unread=unread)))
    text = "\n".join(lines)
    words = " ".join(text.split())
    assert "query unknown (metrics not read)" in words and "last batch unknown (checkpoint not read)" in words
    assert "Today, 2026-11-26 (UTC): ledger not read" in text and "Last reconcile: not read" in text
    assert "Legal holds: not read" in at_80(render(status(holds=None)))
    assert dict(alert_facts(status(query=None)))["PurgerDown"] == "unknown: metrics not read"
    said = " ".join(text[text.index("Could not read:"):].split())
    assert all(f"- {' '.join(line.split())}" in said for line in unread), text


def test_prometheuss_alerts_are_listed_firing_first_and_only_the_purgers():
    answer = {"status": "success", "data": {"alerts": [
        {"labels": {"alertname": "PurgerWatermarkBehind", "severity": "warning"}, "state": "pending",
         "annotations": {"summary": "Watermark 12m behind the wall clock on purger-driver:9108"},
         "activeAt": "2026-11-26T10:05:03Z"},
        {"labels": {"alertname": "PurgerDown", "severity": "critical", "job": "purger"}, "state": "firing",
         "annotations": {"summary": "Purger purger on purger-driver:9108 is down"},
         "activeAt": "2026-11-26T09:15:03.5Z"},
        {"labels": {"alertname": "DiskFull"}, "state": "firing", "annotations": {}, "activeAt": "2026-11-26T09:00:00Z"},
    ]}}
    with serving(json.dumps(answer).encode()) as url:
        alerts = read_alerts(url)
    assert [(a.name, a.state) for a in alerts] == [("PurgerDown", "firing"), ("PurgerWatermarkBehind", "pending")]
    shown = render(status(alerts=alerts, prometheus="http://prometheus.internal:9090"))
    lines = [line.rstrip() for line in at_80(shown)]
    assert any(line.split()[:4] == ["PurgerDown", "firing", "(critical)", "1"] for line in lines), lines
    assert "Alerts from http://prometheus.internal:9090" in lines
    empty = "\n".join(at_80(render(status(alerts=[], prometheus="http://prometheus.internal:9090"))))
    assert "Alerts from http://prometheus.internal:9090: none firing or pending" in empty


def test_the_json_form_has_every_figure_and_null_for_what_was_not_read():
    found = json.loads(as_json(status(reconcile=None, unread=["reconcile report ledger/reconcile does not exist"])))
    assert found["at"] == "2026-11-26T10:15:03+00:00"
    assert found["query"] == {"running": True, "since": "2026-11-26T08:02:03+00:00"}
    assert found["batch"]["id"] == 4211 and found["batch"]["planned"] == 4212
    assert found["today"]["mailbox"]["purged"] == 1200345 and found["today"]["engine"]["dead_lettered"] == 3
    assert found["lags"] == {"deletions": 118, "percentiles_s": {"p50": 3.1, "p95": 4.0, "p99": 5.2}}
    assert found["reconcile"] is None and found["alerts"] is None and found["prometheus"] is None
    assert found["unread"] == ["reconcile report ledger/reconcile does not exist"]


def test_the_last_batch_is_read_from_spark_logs_files():
    """A commit and an offsets file as Spark 4.1 writes them (a checkpoint of tests/integration/test_operations.py)."""
    commit = 'v1\n{"nextBatchWatermarkMs":1795662654298}'
    offsets = ('v1\n{"batchWatermarkMs":1795662648834,"batchTimestampMs":1795662656933,"conf":{"spark.sql.shuffle'
               '.partitions":"2"}}\n{"test.ops.events":{"0":34,"1":31}}\n{"test.ops.control":{"0":62}}')
    batch = last_batch(12, commit, 1795662663714, offsets, (13, 1795662664001))
    assert batch.id == 12 and batch.duration_s == pytest.approx(6.781)
    assert batch.committed_at == datetime(2026, 11, 26, 3, 11, 3, 714000, tzinfo=timezone.utc)
    assert batch.watermark == datetime(2026, 11, 26, 3, 10, 54, 298000, tzinfo=timezone.utc)
    assert (batch.planned, batch.planned_at.second) == (13, 4)
    first = last_batch(0, 'v1\n{"nextBatchWatermarkMs":0}', 1795662663714, None, None)
    assert (first.duration_s, first.watermark, first.planned) == (None, None, None)


def test_the_query_is_read_from_a_purgers_metrics_endpoint_and_an_unanswered_one_is_a_line():
    from purger.metrics import PurgerMetrics

    metrics = PurgerMetrics(max_deletions_per_second=1000, reconcile_interval_s=86400)
    port = free_port()
    server = metrics.serve(port)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        assert read_query(url) == Query(False, None)
        metrics.query_started(AT.timestamp())
        assert read_query(url) == Query(True, AT)
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(Unreadable) as unanswered:
        read_query(url)
    assert str(unanswered.value).startswith(f"metrics endpoint {url} did not answer (")
    assert "give --metrics" in str(unanswered.value) and "\n" not in str(unanswered.value)
    with serving(b"# nothing of the purger's\n") as other, pytest.raises(Unreadable, match="not a purger's"):
        read_query(other)


def test_an_endpoint_that_cannot_listen_names_the_keys():
    from purger.metrics import PurgerMetrics

    metrics = PurgerMetrics(max_deletions_per_second=1000, reconcile_interval_s=86400)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=rf"cannot listen on 127.0.0.1 port {port} \(metrics.host, metrics.port\)"):
            metrics.serve(port, "127.0.0.1")


class serving:
    """A local HTTP server answering ``body`` to every GET, for the time of a ``with``; its URL."""

    def __init__(self, body: bytes) -> None:
        class Answer(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Answer)

    def __enter__(self) -> str:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_port}"

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- on the real servers ----------------------------------------------------------------------------------


def test_status_reports_the_ledgers_and_reconciles_counts_and_a_line_for_the_checkpoint_and_metrics(
        spark, config, tmp_path):
    """A ledger and a reconcile report written as the purger writes them, no checkpoint, no purger running:
    `purger status --json` gives today's counts and the last reconcile's as written, and one line each for
    the checkpoint and the metrics endpoint, with no stack trace (the screen's lines: the unit tests above)."""
    from typer.testing import CliRunner

    from purger.cli import app
    from purger.reconcile.verdict import ReportRow
    from purger.reconcile.run import append_report
    from purger.sinks.ledger import Ledger
    from purger.sinks.purge import OUTCOME_SCHEMA
    from tests.support.configs import own_config, write_config
    from tests.support.waits import now

    own = own_config(config, tmp_path, "status")
    at = int(now().timestamp() * 1000)
    yesterday = at - 86_400_000

    def outcome(policy, kind, status, decided_ms=at, lag_s=None, dc=None, reason=None):
        deleted = decided_ms if status == "purged" else None
        eligible = decided_ms - int(lag_s * 1000) if lag_s is not None else decided_ms
        return (policy, kind, uuid.uuid4().hex[:8], "deleted", dc, status, reason, eligible, decided_ms, deleted, 1,
                "host:1", None)

    records = [outcome("mailbox", "message", "purged", lag_s=lag) for lag in (5, 10, 20)]
    records += [outcome("mailbox", "payload", "purged", lag_s=30, dc="dc1"),
                outcome("mailbox", "message", "skipped", reason="live: extract_count 1"),
                outcome("mailbox", "message", "error", reason="error: Cassandra timed out"),
                outcome("users", "user", "purged", lag_s=40),
                outcome("engine", "dead_letter", "dead_lettered", reason="not json: ..."),
                outcome("engine", "dead_letter", "dead_lettered", reason="not json: ..."),
                # Yesterday's: neither today's nor the last hour's.
                outcome("mailbox", "message", "purged", decided_ms=yesterday, lag_s=900)]
    Ledger(spark, own.ledger).append(spark.createDataFrame(records, OUTCOME_SCHEMA), "query-a", 1, may_hold=False)

    def run(run_id, finished_ago_s, dry_run=False, **counts):
        row = ReportRow(run_id, "mailbox", "messages", "all", now() - timedelta(seconds=finished_ago_s + 30),
                        dry_run=dry_run, **counts).finish()
        row.finished = now() - timedelta(seconds=finished_ago_s)
        return row

    append_report(spark, own, [run("older", 7200, scanned=10, unknown_fed=9, overdue_fed=9),
                         run("last", 600, scanned=50, unknown_fed=4, overdue_fed=2),
                         run("dry", 60, dry_run=True, scanned=50, unknown_fed=8)])

    config_file = write_config(own, tmp_path / "purger.toml")
    found = CliRunner().invoke(app, ["status", "--config", str(config_file), "--json"])
    assert found.exit_code == 0 and "Traceback" not in found.output, found.output
    read = json.loads(found.stdout)
    assert read["today"]["mailbox"] == {**ZERO, "purged": 4, "skipped": 1, "error": 1}
    assert read["today"]["users"]["purged"] == 1 and read["today"]["engine"]["dead_lettered"] == 2
    assert read["lags"]["deletions"] == 5
    assert read["lags"]["percentiles_s"]["p50"] == pytest.approx(20) and read["lags"]["percentiles_s"]["p99"] <= 40
    assert read["reconcile"]["by_policy"]["mailbox"] == {"scanned": 50, "unknown_fed": 4, "overdue_fed": 2,
                                                          "orphans_found": 0}
    assert read["reconcile"]["dry_run"] is False
    assert read["query"] is None and read["batch"] is None and read["alerts"] is None
    assert isinstance(read["holds"], list)  # the table's holds, whatever other tests left in force
    assert isinstance(read["stuck"], list)
    metrics, checkpoint = read["unread"]
    assert checkpoint.startswith(f"checkpoint {own.stream.checkpoint_location} does not exist: ")
    assert metrics.startswith(f"metrics endpoint http://127.0.0.1:{own.metrics.port}/metrics did not answer (")


def test_the_last_batch_is_read_from_a_checkpoint_spark_wrote(spark, tmp_path):
    """A query of one batch with a watermark 2 s behind its only event: its commit, duration and watermark,
    through Hadoop's filesystem as for any checkpoint."""
    from purger.status import read_checkpoint
    from tests.support.waits import now

    events = tmp_path / "events"
    events.mkdir()
    (events / "1.json").write_text('{"at": "2026-11-26T10:00:00Z"}\n')
    checkpoint = str(tmp_path / "checkpoint")
    started = now()
    (spark.readStream.schema("at timestamp").json(str(events)).withWatermark("at", "2 seconds")
     .writeStream.format("noop").option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
     .awaitTermination(60))
    batch = read_checkpoint(spark, checkpoint)
    assert batch.id == 0 and batch.planned is None
    assert started - timedelta(seconds=1) <= batch.committed_at <= now()
    assert 0 < batch.duration_s < 60
    assert batch.watermark == datetime(2026, 11, 26, 9, 59, 58, tzinfo=timezone.utc)
