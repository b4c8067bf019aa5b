"""The ledger's upkeep (``sinks.ledger.Ledger.upkeep``, docs/operations.md "The ledger's upkeep"): its Delta
table properties on a new ledger and an upgraded one, small appends compacted, days past ``ledger.retention``
deleted and vacuumed, and the write path's reads bounded by the days its records can be in.

Records are written straight into a ledger of the test's own, with the days they are decided on.
"""

from __future__ import annotations

import shutil
import time
from datetime import date, datetime, time as clock_time, timedelta, timezone
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from purger.core.vocabulary import PURGED, SKIPPED
from purger.sinks import ledger as ledger_module
from purger.sinks.ledger import TABLE_PROPERTIES, Ledger
from purger.sinks.purge import OUTCOME_SCHEMA

TODAY = datetime.now(timezone.utc).date()
QUERY = "upkeep-test"


@pytest.fixture
def ledger(spark, config_for_ledger, tmp_path):
    return Ledger(spark, config_for_ledger(tmp_path / "ledger"))


@pytest.fixture
def config_for_ledger():
    from purger.config import build_config

    return lambda path: build_config({"ledger": {"path": str(path)}}).ledger


def noon_ms(day: date) -> int:
    return int(datetime.combine(day, clock_time(12), timezone.utc).timestamp() * 1000)


def outcomes(spark, ids, day: date, batch: int, status: str = SKIPPED, intent: str | None = None, hour: int = 12):
    """One record per id, decided at ``hour`` (noon) on ``day`` by ``batch``."""
    at = noon_ms(day) + (hour - 12) * 3_600_000
    rows = [("mailbox", "message", i, "r", None, status, "test: upkeep" if status == SKIPPED else None, at, at,
             at if status == PURGED else None, batch, "test:0", intent) for i in ids]
    return spark.createDataFrame(rows, OUTCOME_SCHEMA)


def files_per_day(spark, ledger: Ledger) -> dict[date, int]:
    files = DeltaTable.forPath(spark, ledger.path).toDF().select("date", F.input_file_name().alias("file"))
    return {r["date"]: r["files"] for r in files.groupBy("date").agg(F.countDistinct("file").alias("files"))
            .collect()}


def properties(spark, ledger: Ledger) -> dict[str, str]:
    return DeltaTable.forPath(spark, ledger.path).detail().first()["properties"]


@pytest.mark.integration
def test_the_ledger_has_its_upkeep_properties_when_made_and_when_upgraded(spark, ledger):
    ledger.create()
    assert TABLE_PROPERTIES.items() <= properties(spark, ledger).items()

    # A ledger of an earlier version: made by an append, without the properties.
    shutil.rmtree(ledger.path)
    ledger.append(outcomes(spark, ["a"], TODAY, 1), QUERY, 1, may_hold=False)
    assert not TABLE_PROPERTIES.items() <= properties(spark, ledger).items()
    ledger.create()
    assert TABLE_PROPERTIES.items() <= properties(spark, ledger).items()
    versions = DeltaTable.forPath(spark, ledger.path).history().count()
    ledger.create()  # set once: a start of an upgraded purger commits nothing
    assert DeltaTable.forPath(spark, ledger.path).history().count() == versions


@pytest.mark.integration
def test_auto_compaction_keeps_a_day_to_few_files(spark, ledger):
    """The table property turns Delta's auto compaction on (its threshold lowered here from 50 files to 4)."""
    ledger.create()
    spark.conf.set("spark.databricks.delta.autoCompact.minNumFiles", "4")
    try:
        for batch in range(5):  # one more than the threshold: five files, unless compacted
            ledger.append(outcomes(spark, [f"m{batch}-{n}" for n in range(3)], TODAY, batch), QUERY, batch,
                          may_hold=False)
    finally:
        spark.conf.unset("spark.databricks.delta.autoCompact.minNumFiles")
    assert files_per_day(spark, ledger)[TODAY] < 5
    assert ledger.records().count() == 15


@pytest.mark.integration
def test_the_upkeep_compacts_a_day_deletes_the_days_past_retention_and_vacuums(spark, ledger):
    yesterday, kept_longest = TODAY - timedelta(days=1), TODAY - ledger.retention
    ledger.create()
    # Fewer appends than auto compaction's threshold (50 files): yesterday is left in a file per batch.
    for batch in range(3):
        ledger.append(outcomes(spark, [f"y{batch}-{n}" for n in range(2)], yesterday, batch), QUERY, batch,
                      may_hold=False)
    expired = [kept_longest - timedelta(days=1), kept_longest - timedelta(days=90)]
    for day in [*expired, kept_longest]:
        ledger.append(outcomes(spark, [f"d{day}"], day, 100), QUERY, 100, may_hold=False)
    assert files_per_day(spark, ledger)[yesterday] == 3

    assert ledger.upkeep(TODAY)

    assert files_per_day(spark, ledger) == {yesterday: 1, kept_longest: 1}
    assert ledger.records().where(F.col("date") == yesterday).count() == 6
    operations = [r["operation"] for r in DeltaTable.forPath(spark, ledger.path).history().collect()]
    assert {"OPTIMIZE", "DELETE", "VACUUM START", "VACUUM END"} <= set(operations)
    # Deleted days' files stay for delta.deletedFileRetentionDuration (readers under way, time travel), then
    # a later upkeep's VACUUM removes them; a day's directory is gone with its last file.
    for day in expired:
        assert list(Path(ledger.path, f"date={day}").glob("*.parquet"))
    assert ledger.upkeep(TODAY)  # nothing more to do: a day compacted already is not compacted again
    assert files_per_day(spark, ledger) == {yesterday: 1, kept_longest: 1}


def test_an_upkeep_under_way_is_not_run_again_beside_it(config_for_ledger, tmp_path):
    ledger = Ledger(None, config_for_ledger(tmp_path / "ledger"))  # type: ignore[arg-type]  # a local path: no Spark
    with ledger_module._upkeep_lock:
        assert ledger.upkeep(TODAY) is False


@pytest.mark.integration
def test_a_retried_batch_and_holds_read_only_the_days_since_the_batch_began(spark, ledger):
    """A day within the intents' 30 days made unreadable (its file removed behind Delta's back): the write path
    never reads it when it knows when the batch began, and does when it does not (as every read did before)."""
    old_day = TODAY - timedelta(days=20)
    ledger.create()
    # Of the same batch, so that Delta's statistics of batch_id skip nothing: the bound alone keeps it unread.
    ledger.append(outcomes(spark, ["old"], old_day, 7), QUERY, 7, may_hold=False)
    ledger.append(outcomes(spark, ["first", "deleted"], TODAY, 7), QUERY, 7, may_hold=False)
    for parquet in Path(ledger.path, f"date={old_day}").glob("*.parquet"):
        parquet.unlink()
    began_ms = noon_ms(TODAY) - 60_000  # of the day the records are on, even in a run across midnight

    assert ledger.holds(QUERY, 7, began_ms)
    with pytest.raises(Exception, match="(?i)not.?exist|FileNotFound"):
        ledger.holds(QUERY, 7)

    # Batch 7 retried: its first records again (found in today's partition), one new.
    retried = outcomes(spark, ["first", "deleted", "new"], TODAY, 7)
    ledger.append(retried, QUERY, 7, may_hold=True, began_ms=began_ms)
    assert sorted(r["id"] for r in ledger.batch(QUERY, 7, began_ms).collect()) == ["deleted", "first", "new"]
    assert ledger.records().where(F.col("date") == TODAY).count() == 3
    # A record from another batch's intent may meet one written up to 30 days ago: every such day is read.
    from_intent = outcomes(spark, ["gone"], TODAY, 7, status=PURGED, intent=f"{QUERY}/5")
    with pytest.raises(Exception, match="(?i)not.?exist|FileNotFound"):
        ledger.append(from_intent, QUERY, 7, may_hold=True, began_ms=began_ms)


@pytest.mark.integration
def test_a_retried_batch_reads_its_own_files_not_its_days_unless_another_query_wrote_since(spark, ledger):
    """An earlier batch's file of the same day made unreadable: batch 7's retry never reads it (Delta's
    statistics of batch_id skip it); a record from that earlier batch's intent does, and so does every retry
    once another query recorded a decision since the batch began (its batch ids say nothing of this one's)."""
    ledger.create()
    ledger.append(outcomes(spark, ["earlier"], TODAY, 5, hour=8), QUERY, 5, may_hold=False)
    batch_5_files = list(Path(ledger.path, f"date={TODAY}").glob("*.parquet"))
    ledger.append(outcomes(spark, ["first"], TODAY, 7), QUERY, 7, may_hold=False)
    for parquet in batch_5_files:
        parquet.unlink()
    began_ms = noon_ms(TODAY)  # batch 7 began at noon, batch 5 decided at 8: past the clock's skew

    ledger.append(outcomes(spark, ["first", "new"], TODAY, 7), QUERY, 7, may_hold=True, began_ms=began_ms)
    assert sorted(r["id"] for r in ledger.batch(QUERY, 7, began_ms).collect()) == ["first", "new"]
    from_earlier_intent = outcomes(spark, ["gone"], TODAY, 7, status=PURGED, intent=f"{QUERY}/5")
    with pytest.raises(Exception, match="(?i)not.?exist|FileNotFound"):
        ledger.append(from_earlier_intent, QUERY, 7, may_hold=True, began_ms=began_ms)
    ledger.append(outcomes(spark, ["elsewhere"], TODAY, 2), "another-query", 2, may_hold=False)
    with pytest.raises(Exception, match="(?i)not.?exist|FileNotFound"):
        ledger.append(outcomes(spark, ["first"], TODAY, 7), QUERY, 7, may_hold=True, began_ms=began_ms)


@pytest.mark.integration
def test_a_deletion_another_query_recorded_from_a_batchs_intent_is_not_recorded_again_by_its_retry(spark, ledger):
    """A replay's query found batch 7's deletion done and recorded it from the intent, in its own batch 2; the
    checkpoint it set aside put back, batch 7 retried records the same deletion: the ledger holds it once."""
    ledger.create()
    ledger.append(outcomes(spark, ["kept"], TODAY, 7), QUERY, 7, may_hold=False)
    ledger.append(outcomes(spark, ["gone"], TODAY, 2, status=PURGED, intent=f"{QUERY}/7"), "replay-query", 2,
                  may_hold=True)
    ledger.append(outcomes(spark, ["kept", "gone"], TODAY, 7, status=PURGED), QUERY, 7, may_hold=True,
                  began_ms=noon_ms(TODAY))
    assert ledger.records().where(F.col("id") == "gone").count() == 1


def test_a_failed_upkeep_is_one_line_and_the_purger_goes_on(config_for_ledger, tmp_path, caplog):
    from purger.config import build_config
    from purger.running import _upkeep

    ledger = Ledger(None, config_for_ledger(tmp_path / "ledger"))  # type: ignore[arg-type]  # no session: it fails
    with caplog.at_level("WARNING", logger="purger.running"):
        _upkeep(ledger, build_config({}))  # no undo window: no copies to expire
    [line] = [r.getMessage() for r in caplog.records if r.name == "purger.running"]
    assert line.startswith(f"ledger {ledger.path}: upkeep failed, tried again at the next round: ")
    assert "\n" not in line and not any(r.exc_info for r in caplog.records)
