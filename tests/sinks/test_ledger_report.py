"""The daily report kept up to date incrementally (SPEC 10.3): each refresh reads only the ledger records written
since the last one (the change feed) and adds them to their days' rows.

The oracle is the ledger itself, read whole: after every refresh, each row's counts equal counts over its day's
records, and each lag percentile ranks within the stated error among the day's lags. A refresh that read its
progress before another refresh moved it is refused whole, and a report written before the progress existed is
rebuilt from the ledger."""

from __future__ import annotations

import random
from collections import Counter
from datetime import date, datetime, timedelta, timezone

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from purger.config import load_config
from purger.core.vocabulary import STATUSES
from purger.sinks.ledger import LAG_PERCENTILES, Ledger, Report, ReportProgressMoved
from purger.sinks.purge import OUTCOME_SCHEMA
from tests.support.report import ranked_within

pytestmark = pytest.mark.integration

TODAY = datetime.now(timezone.utc).replace(hour=12)
YESTERDAY = TODAY - timedelta(days=1)


def write_batch(spark, ledger: Ledger, rng: random.Random, batch: int, n: int, when: datetime = TODAY) -> None:
    """``n`` outcomes of batch ``batch``, decided at ``when``: deletions with lags up to a day, skips, errors."""
    decided = int(when.timestamp() * 1000)
    rows = []
    for i in range(n):
        status = rng.choice(["purged", "purged", "purged", "skipped", "error", "already_gone"])
        reason = rng.choice(["live: counter 1", "not yet due: 3 s", "referenced: m9"]) if status == "skipped" else None
        rows.append(("mailbox", rng.choice(["message", "payload"]), f"m{batch}-{i}", "deleted",
                     rng.choice([None, "dc1", "dc2"]), status, reason, decided - rng.randrange(1, 86_400_000),
                     decided, decided if status == "purged" else None, batch, "host:1", None))
    # A retried batch's records go through a merge, a first attempt's are appended: the feed holds both.
    ledger.append(spark.createDataFrame(rows, OUTCOME_SCHEMA), "query", batch, may_hold=batch % 2 == 0)


def agrees_with_the_ledger(report: Report, ledger: Ledger, day: date) -> None:
    rows = {(r["kind"], r["dc"]): r for r in report.rows(day)}
    groups: dict[tuple[str, str], list] = {}
    for r in ledger.records().where((F.col("date") == F.lit(day)) & (F.col("status") != "command")).collect():
        groups.setdefault((r["kind"], r["dc"] or "all"), []).append(r)
    assert set(rows) == set(groups)
    for key, group in groups.items():
        row = rows[key]
        assert row["candidates"] == len(group), key
        assert {s: row[s] for s in STATUSES} == {s: sum(r["status"] == s for r in group) for s in STATUSES}, key
        assert dict(row["skipped_by_reason"]) == dict(Counter(
            r["reason"].split(":")[0] for r in group if r["status"] == "skipped")), key
        lags = [r["lag_s"] for r in group if r["status"] == "purged"]
        for p in LAG_PERCENTILES:
            assert ranked_within(lags, p, row[f"lag_p{int(p * 100)}_s"], row["lag_rank_error"]), (key, p)
        assert (row["started_at"], row["finished_at"]) == (min(r["decided_at"] for r in group),
                                                          max(r["decided_at"] for r in group)), key


def ledger_and_report(spark, tmp_path) -> tuple[Ledger, Report]:
    """A ledger and its report of their own, with the built-in policies' report fields (no server needed)."""
    config = load_config(None)
    ledger_config = config.ledger.model_copy(update={"path": str(tmp_path / "ledger"),
                                                     "report_path": str(tmp_path / "report")})
    return Ledger(spark, ledger_config), Report(spark, ledger_config, config.policy_set)


def test_each_refresh_adds_only_what_was_written_since_and_agrees_with_the_whole_ledger(spark, tmp_path):
    ledger, report = ledger_and_report(spark, tmp_path)
    ledger.create()
    rng = random.Random(7)
    write_batch(spark, ledger, rng, 1, 300)  # over k = 200 deletions a group: the sketch compacts
    report.refresh()  # the first: every day rebuilt from the ledger
    agrees_with_the_ledger(report, ledger, TODAY.date())
    for batch in (2, 3):
        counted = report._progress()
        write_batch(spark, ledger, rng, batch, rng.randrange(20, 120))
        write_batch(spark, ledger, rng, 100 + batch, 10, when=YESTERDAY)  # late records of yesterday
        ledger.record_command("reconcile", ["mailbox"], "jdoe", "INC-1", f"run{batch}")  # not an outcome
        latest = ledger.version()
        # What this refresh reads: the records of the versions written since, not the day's.
        assert ledger.inserted(counted, latest).where(F.col("status") != "command").count() == \
            ledger.records().where(F.col("batch_id").isin(batch, 100 + batch)).count()
        report.refresh()
        assert report._progress() == latest
        agrees_with_the_ledger(report, ledger, TODAY.date())
    agrees_with_the_ledger(report, ledger, YESTERDAY.date())
    # A refresh at the version it counted up to reads nothing more (an idle purger's round every interval).
    counted_up_to = report._progress
    report._progress = lambda: pytest.fail("a refresh with nothing new read the report")
    report.refresh()
    report._progress = counted_up_to

    # A refresh that read the progress before another moved it counts nothing twice: refused whole.
    write_batch(spark, ledger, rng, 9, 40)
    counted, latest = report._progress(), ledger.version()
    report.refresh()
    with pytest.raises(Exception, match=ReportProgressMoved.__name__):
        report._add(counted, latest)
    agrees_with_the_ledger(report, ledger, TODAY.date())


def test_a_report_written_before_its_progress_existed_is_rebuilt_from_the_ledger(spark, tmp_path):
    ledger, report = ledger_and_report(spark, tmp_path)
    ledger.create()
    write_batch(spark, ledger, random.Random(3), 1, 30)
    # The release before's rows: a day's counts, no sketch, no progress.
    (report.compute(TODAY.date()).drop("lag_sketch", "lag_rank_error", "ledger_version").withColumn("purged", F.lit(0))
     .write.format("delta").partitionBy("date").save(report.path))
    assert report._progress() is None
    report.refresh()
    agrees_with_the_ledger(report, ledger, TODAY.date())
    assert report._progress() == ledger.version()
    assert "ledger_version" in DeltaTable.forPath(spark, report.path).toDF().columns
