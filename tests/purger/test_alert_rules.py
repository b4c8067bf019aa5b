"""The Prometheus rules shipped in deploy/prometheus/, and the metrics they read.

promtool checks ``purger-rules.yml`` and runs its unit tests (``purger-rules.test.yml``: for each alert,
series for which it fires and series for which it stays quiet); each alert has its annotations and a
runbook section in docs/operations.md; and every metric a rule reads is one ``PurgerMetrics`` exports,
set where the purger learns its value. promtool is Debian's ``prometheus`` package, which ``make install``
installs: without it these tests fail rather than skip. No server, no JVM.

Example::

    python -m pytest tests/purger/test_alert_rules.py
    cd deploy/prometheus && promtool test rules purger-rules.test.yml
"""

from __future__ import annotations

import re
from datetime import datetime, timezone


from purger.core.lags import Lags
from purger.reconcile.verdict import ReportRow
from purger.metrics import PurgerMetrics, batches_since, executed
from tests.support.rules import ROOT, RULE_TESTS, RULES, alerts, run_promtool

OPERATIONS = ROOT / "docs" / "operations.md"


def test_promtool_finds_the_rules_valid():
    checked = run_promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


def test_each_alert_fires_and_stays_quiet_as_its_unit_tests_expect():
    tested = run_promtool("test", "rules", RULE_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_each_alert_has_its_annotations_a_runbook_section_and_tests_both_ways():
    sections = set(re.findall(r"^### (\w+)$", OPERATIONS.read_text().split("\n## Alerts and their runbooks\n")[1]
                              .split("\n## ")[0], flags=re.M))
    rule_tests = RULE_TESTS.read_text()
    fires = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n", rule_tests))
    quiet = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts: \[\]", rule_tests))
    assert alerts(), RULES
    for name, block in alerts().items():
        for annotation in ("summary", "description"):
            assert re.search(rf"^\s+{annotation}: \S", block, flags=re.M), (name, annotation)
        assert f"runbook_url: docs/operations.md#{name.lower()}\n" in block, name
        assert name in sections, f"docs/operations.md has no section ### {name}"
        assert name in fires and name in quiet, f"{name}: no unit test where it fires, or none where it does not"
    assert sections == set(alerts()), "a runbook section without its alert"


def spark_time(moment: datetime) -> str:
    """A time as Spark's progress and listener events write it."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


BATCH_STARTED = datetime(2026, 11, 20, 9, 12, 30, 250000, tzinfo=timezone.utc)
WATERMARK = datetime(2026, 11, 20, 9, 12, 28, tzinfo=timezone.utc)


def progress(message_candidates: int, payload_candidates: int) -> dict:
    """A batch's ``StreamingQueryProgress`` as JSON, with the purger's observed metrics."""
    return {
        "timestamp": spark_time(BATCH_STARTED), "batchDuration": 1500, "inputRowsPerSecond": 40.0,
        "processedRowsPerSecond": 35.0, "eventTime": {"watermark": spark_time(WATERMARK)},
        "stateOperators": [{"numRowsTotal": 120}],
        "observedMetrics": {"purger": {"message_candidates": message_candidates,
                                       "payload_candidates": payload_candidates, "dead_lettered": 2,
                                       "message_forgotten": 2, "payload_forgotten": 0},
                            "purger.input": {"ignored": 0}},
    }


def test_a_batch_tells_when_it_finished_the_watermark_and_its_candidates():
    metrics = PurgerMetrics(max_deletions_per_second=500, reconcile_interval_s=86400)
    sample = metrics.registry.get_sample_value
    metrics.progress(progress(3, 1))
    metrics.progress(progress(2, 0))
    assert sample("purger_last_batch_timestamp_seconds") == BATCH_STARTED.timestamp() + 1.5
    assert sample("purger_watermark_timestamp_seconds") == WATERMARK.timestamp()
    assert sample("purger_candidates_total", {"kind": "message"}) == 5
    assert sample("purger_candidates_total", {"kind": "payload"}) == 1
    assert sample("purger_candidates_total", {"kind": "dead_lettered"}) is None  # no candidates: bad records
    assert sample("purger_forgotten_total", {"kind": "message"}) == 4
    assert sample("purger_max_deletions_per_second") == 500
    assert sample("purger_reconcile_interval_seconds") == 86400
    # At 0 from the start, so that the first dead letters are an increase the alert sees.
    assert sample("purger_outcomes_total", {"kind": "dead_letter", "status": "dead_lettered"}) == 0


def batch(batch_id: int, ran: bool = True) -> dict:
    """A progress as Spark keeps it: a batch's (with its ``addBatch``), or one added while the query waits."""
    return {"batchId": batch_id, "timestamp": f"2026-11-20T09:12:{batch_id:02d}.000Z",
            "durationMs": {"addBatch": 5, "triggerExecution": 9} if ran else {"triggerExecution": 1}}


def test_each_batch_is_followed_once_whether_one_or_several_ran_between_two_reads():
    recent = [batch(3), batch(4), batch(5), batch(6, ran=False)]
    asked = []

    def recent_progress() -> list[dict]:
        asked.append(True)
        return recent

    # The next batch alone: its progress is the last, the recent ones are not asked for.
    assert batches_since(batch(4), recent_progress, 3) == [batch(4)] and not asked
    assert batches_since(batch(5), recent_progress, None) == [batch(5)] and not asked
    # Two batches between two reads, or a wait after them: each batch since, in order, once.
    assert [p["batchId"] for p in batches_since(batch(5), recent_progress, 3)] == [4, 5]
    assert [p["batchId"] for p in batches_since(batch(6, ran=False), recent_progress, 3)] == [4, 5]
    assert batches_since(batch(6, ran=False), recent_progress, 5) == []
    assert not executed(batch(6, ran=False)) and executed(batch(6))


def report_row(table: str, dc: str, **counts: int) -> ReportRow:
    return ReportRow("run-1", "mailbox", table, dc, datetime.now(timezone.utc), **counts).finish()


def test_a_reconcile_replaces_the_last_runs_counts_and_adds_to_the_totals():
    metrics = PurgerMetrics(max_deletions_per_second=1000, reconcile_interval_s=86400)
    sample = metrics.registry.get_sample_value
    first = [report_row("messages", "all", scanned=50, known=40, unknown_fed=6, overdue_fed=4),
             report_row("payloads", "all", scanned=20, known=20),
             report_row("payloads", "dc1", orphans_found=7, orphans_deleted=7),
             report_row("payloads", "dc2", orphans_found=1),
             report_row("payload_refs", "all", scanned=9, orphans_found=2, orphans_deleted=1)]
    metrics.reconciled(first, 12.0)
    last_rows = {"policy": "mailbox", "table": "messages"}
    assert sample("purger_reconcile_last_rows", {**last_rows, "count": "overdue_fed"}) == 4
    assert sample("purger_reconcile_last_rows", {**last_rows, "count": "unknown_fed"}) == 6
    assert sample("purger_reconcile_last_rows", {"policy": "mailbox", "table": "payloads", "count": "overdue_fed"}) == 0
    blobs = {"policy": "mailbox", "table": "payloads"}
    assert sample("purger_reconcile_last_orphans", {**blobs, "dc": "dc1", "count": "orphans_found"}) == 7
    assert sample("purger_reconcile_last_orphans", {**blobs, "dc": "dc2", "count": "orphans_deleted"}) == 0
    refs = {"policy": "mailbox", "table": "payload_refs", "dc": "all"}
    assert sample("purger_reconcile_last_orphans", {**refs, "count": "orphans_found"}) == 2
    assert sample("purger_reconcile_orphans_total", {**refs, "count": "orphans_deleted"}) == 1
    assert sample("purger_reconcile_last_run_timestamp_seconds") > 0
    metrics.reconciled([report_row("messages", "all", scanned=50, known=50), report_row("payload_refs", "all")], 3.0)
    assert sample("purger_reconcile_last_orphans", {**refs, "count": "orphans_found"}) == 0
    assert sample("purger_reconcile_last_rows", {**last_rows, "count": "overdue_fed"}) == 0
    assert sample("purger_reconcile_rows_total", {**last_rows, "count": "overdue_fed"}) == 4
    assert sample("purger_reconcile_duration_seconds") == 3.0


def test_every_metric_the_rules_read_is_exported():
    metrics = PurgerMetrics(max_deletions_per_second=1000, reconcile_interval_s=86400)
    metrics.query_started(BATCH_STARTED.timestamp())
    metrics.batch_done({("message", "purged"): 3, ("message", "error"): 1}, Lags.of([2.0, 3.5, 4.0]), 1.0)
    metrics.progress(progress(3, 1))
    metrics.reconciled([report_row("messages", "all", scanned=5, known=5),
                        report_row("payloads", "dc1", orphans_found=1)], 1.0)
    exported = {sample.name for family in metrics.registry.collect() for sample in family.samples}
    # A rule's own series (level:metric:operations) are recorded, not scraped.
    read = set(re.findall(r"(?<![\w:])purger_\w+(?![\w:])", RULES.read_text()))
    assert read, RULES
    assert read <= exported, sorted(read - exported)
