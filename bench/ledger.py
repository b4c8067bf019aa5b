"""The ledger's cost per batch: one Delta append of a batch's outcomes, as the sink makes it.

Appends ``--rows`` outcomes per commit into a ledger that already has ``--commits`` commits, taking the
ways of appending in turn, so all are measured in the same run under the same load:

- a batch's first attempt, as the sink appends it (no read of the table), into a ledger with its upkeep's
  table properties (``TABLE_PROPERTIES``: optimized writes, auto compaction);
- the same into a ledger with optimized writes off (auto compaction alone): what optimized writes cost a batch;
- a retried batch: the ledger is read for the batch's records first (``Ledger.holds``), then appended;
- Delta's own idempotent write (``txnAppId`` and ``txnVersion``, the sink's way before), which rebuilds
  the table's state at every commit to find the application's last version;
- the same with Delta's default ``snapshotPartitions`` (50) instead of the purger's (``purger.spark``).

The baseline is a plain Parquet append of the same rows.

    python -m bench.ledger --rows 200 --commits 25 --rounds 10

``--day`` measures the ledger at a day's volume (SPEC 10.2) instead: a batch's append (``--rows`` outcomes, the
sink's first attempt), a retried batch's ``MERGE`` (half its records already there) and the daily report's
refresh after each, ``--rounds`` times, first once the ledger holds today's first 100 batches, then once it
holds the whole day's (``--day-batches`` batches of ``--rows``, 43,200 at the 2 s trigger). The day is written
in fewer, larger commits (``--bulk-rows`` records each, through the same ``Ledger.append``); the live data
files of today's partition are counted before and after the upkeep's compaction. The target: each at the
day's end within 1.2x of itself at 100 batches.

    python -m bench.ledger --day --rows 500 --rounds 5

``--compaction`` measures what auto compaction leaves on disk (SPEC 10.2): ``--commits`` batches of ``--rows``
outcomes appended, as the sink appends them, into ledgers that differ only in the session's
``spark.databricks.delta.autoCompact.minFileSize`` while they are written (``--min-file-sizes``, MiB;
``default``: Delta's own, half its 128 MiB target), a batch into each in turn. At the end, each ledger's bytes
on disk (its data files, the live ones and those its compactions replaced, kept until ``VACUUM``) against its
live bytes, its live files, and a batch's median append. The baseline is the ledger with Delta's default.

    python -m bench.ledger --compaction --rows 500 --commits 1000
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import date, timedelta
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.common import BenchRun
from purger.core.settings import LedgerConfig
from purger.sinks.ledger import Ledger, Report
from purger.sinks.purge import OUTCOME_SCHEMA

SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
OPTIMIZE_WRITE = "delta.autoOptimize.optimizeWrite"
MIN_FILE_SIZE = "spark.databricks.delta.autoCompact.minFileSize"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--commits", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--day", action="store_true", help="the ledger at a day's volume (SPEC 10.2)")
    parser.add_argument("--day-batches", type=int, default=43_200, help="with --day: a day's batches")
    parser.add_argument("--bulk-rows", type=int, default=100_000, help="with --day: records a commit of the day")
    parser.add_argument("--compaction", action="store_true", help="what auto compaction leaves on disk")
    parser.add_argument("--min-file-sizes", default="default,8,1",
                        help="with --compaction: autoCompact.minFileSize of each ledger, in MiB")
    args = parser.parse_args()
    if args.day:
        day(args)
        return
    if args.compaction:
        compaction(args)
        return

    run = BenchRun.start("ledger")
    spark = run.spark()
    purger_partitions = spark.conf.get(SNAPSHOT_PARTITIONS)
    at = int(time.time() * 1000)
    outcomes = spark.createDataFrame(
        [("mailbox", "message", f"m{i}", "expired_by_counter", None, "purged", None, at - 5000, at, at, 0, "bench:1", None)
         for i in range(args.rows)], OUTCOME_SCHEMA).cache()
    outcomes.count()
    ledger = Ledger(spark, run.config.ledger)
    plain_writes = Ledger(spark, LedgerConfig(path=str(run.work / "ledger-plain-writes")))
    for each in (ledger, plain_writes):
        each.create()
    spark.sql(f"ALTER TABLE delta.`{plain_writes.path}` SET TBLPROPERTIES ('{OPTIMIZE_WRITE}' = 'false')")
    batch = 0
    for _ in range(args.commits):
        for each in (ledger, plain_writes):
            each.append(outcomes, run.run, batch, may_hold=False)
        batch += 1

    # name -> (session settings for the append, whether it is the batch's first attempt)
    ways: dict[str, tuple[dict[str, str], bool]] = {
        "a batch's first attempt (the purger's)": ({}, True),
        "a batch's first attempt, optimized writes off": ({}, True),
        "a retried batch (a MERGE on the records' ids)": ({}, False),
        f"Delta's idempotent write, txnAppId (before), snapshotPartitions {purger_partitions}":
            ({TXN_APP_ID: run.run}, True),
        "Delta's idempotent write, txnAppId, Delta's default snapshotPartitions (50)":
            ({TXN_APP_ID: run.run, SNAPSHOT_PARTITIONS: "50"}, True),
    }
    timings: dict[str, list[float]] = {name: [] for name in [*ways, "parquet"]}
    for _ in range(args.rounds):
        for name, (settings, first_attempt) in ways.items():
            for key, value in settings.items():
                spark.conf.set(key, value)
            if TXN_APP_ID in settings:
                spark.conf.set(TXN_VERSION, str(batch))
            started = time.perf_counter()
            (plain_writes if "optimized writes off" in name else ledger).append(
                outcomes, run.run, batch, may_hold=not first_attempt)
            timings[name].append(time.perf_counter() - started)
            for key in [*settings, TXN_VERSION]:
                spark.conf.unset(key)
            spark.conf.set(SNAPSHOT_PARTITIONS, purger_partitions)
            batch += 1
        started = time.perf_counter()
        outcomes.write.mode("append").parquet(str(run.work / "parquet"))
        timings["parquet"].append(time.perf_counter() - started)

    appended = ledger.records().count() + plain_writes.records().count()
    if appended != (batch + args.commits) * args.rows:
        raise RuntimeError(f"the ledgers hold {appended} records, {(batch + args.commits) * args.rows} expected")
    parquet = statistics.median(timings.pop("parquet"))
    details = {"rows": args.rows, "commits_before": args.commits, "rounds": args.rounds}
    for name, seconds in timings.items():
        run.record(f"ledger append, {name}, median", statistics.median(seconds), "s",
                   baseline=("plain Parquet append", parquet), **details)
    spark.stop()


def outcomes_of(spark: SparkSession, prefix: str, rows: int, at_ms: int) -> DataFrame:
    """``rows`` purged messages decided at ``at_ms``, their ids starting with ``prefix``, as the sink's batch
    hands them to the ledger (``OUTCOME_SCHEMA``)."""
    return spark.range(rows).select(
        F.lit("mailbox").alias("policy"), F.lit("message").alias("kind"),
        F.concat(F.lit(prefix), F.col("id").cast("string")).alias("id"), F.lit("expired_by_counter").alias("rule"),
        F.lit(None).cast("string").alias("dc"), F.lit("purged").alias("status"),
        F.lit(None).cast("string").alias("reason"), F.lit(at_ms - 5000).alias("eligible_at_ms"),
        F.lit(at_ms).alias("decided_at_ms"), F.lit(at_ms).alias("deleted_at_ms"),
        F.lit(0).cast("long").alias("batch_id"),
        F.lit("bench:1").alias("worker"), F.lit(None).cast("string").alias("intent"))


def day(args: argparse.Namespace) -> None:
    """The ledger's write path and report at 100 batches and at a day's (``--day``)."""
    run = BenchRun.start("ledger")
    spark = run.spark()
    ledger = Ledger(spark, run.config.ledger)
    report = Report(spark, run.config.ledger, run.config.policy_set)
    ledger.create()
    batch = 0

    def now_ms() -> int:
        return int(time.time() * 1000)

    def append_batches(count: int) -> None:
        nonlocal batch
        for _ in range(count):
            ledger.append(outcomes_of(spark, f"b{batch}-", args.rows, now_ms()), run.run, batch, may_hold=False)
            batch += 1

    def measure() -> dict[str, float]:
        """Median seconds of a batch's append, a retried batch's merge and a refresh after each."""
        nonlocal batch
        timings: dict[str, list[float]] = {"append": [], "merge": [], "refresh": []}
        report.refresh()
        for _ in range(args.rounds):
            for step, may_hold in (("append", False), ("merge", True)):
                at = now_ms()
                if may_hold:  # a retry: the first half of its records written by the attempt before it
                    ledger.append(outcomes_of(spark, f"b{batch}-", args.rows // 2, at), run.run, batch,
                                  may_hold=False)
                started = time.perf_counter()
                ledger.append(outcomes_of(spark, f"b{batch}-", args.rows, at), run.run, batch, may_hold=may_hold,
                              began_ms=at)
                timings[step].append(time.perf_counter() - started)
                started = time.perf_counter()
                report.refresh()
                timings["refresh"].append(time.perf_counter() - started)
                batch += 1
        return {step: statistics.median(seconds) for step, seconds in timings.items()}

    def live_files() -> int:
        return spark.sql(f"DESCRIBE DETAIL delta.`{ledger.path}`").first()["numFiles"]

    append_batches(100)
    early = measure()
    files_early = live_files()
    written = batch * args.rows
    day_rows = args.day_batches * args.rows
    started = time.perf_counter()
    while written < day_rows:
        rows = min(args.bulk_rows, day_rows - written)
        ledger.append(outcomes_of(spark, f"b{batch}-", rows, now_ms()), run.run, batch, may_hold=False)
        written, batch = written + rows, batch + 1
        print(f"day: {written:,} of {day_rows:,} records", flush=True)
    bulk_s = time.perf_counter() - started
    files_day = live_files()
    late = measure()
    ledger.upkeep(date.today() + timedelta(days=1))  # as the next day's upkeep compacts this one
    files_compacted = live_files()
    records = ledger.records().count()
    details = {"rows": args.rows, "rounds": args.rounds, "day_batches": args.day_batches, "bulk_rows": args.bulk_rows,
               "records": records, "bulk_s": round(bulk_s, 1)}
    names = {"append": "a batch's append", "merge": "a retried batch's merge", "refresh": "the report's refresh"}
    for step, name in names.items():
        run.record(f"ledger at a day's volume: {name}, median", late[step], "s",
                   baseline=("at 100 batches", early[step]), target="<= 1.2x", **details)
    run.record("ledger at a day's volume: live data files", files_day, "files",
               baseline=("at 100 batches", files_early), **details)
    run.record("ledger at a day's volume: live data files after the upkeep's compaction", files_compacted, "files",
               **details)
    spark.stop()


def compaction(args: argparse.Namespace) -> None:
    """Bytes on disk against live bytes, after ``--commits`` batches, per ``autoCompact.minFileSize``."""
    run = BenchRun.start("ledger")
    spark = run.spark()
    configured = spark.conf.get(MIN_FILE_SIZE, None)
    sizes = args.min_file_sizes.split(",")
    ledgers = {size: Ledger(spark, LedgerConfig(path=str(run.work / f"ledger-min-{size}"))) for size in sizes}
    timings: dict[str, list[float]] = {size: [] for size in sizes}
    for each in ledgers.values():
        each.create()
    for batch in range(args.commits):
        at = int(time.time() * 1000)
        for size, ledger in ledgers.items():
            if size == "default":
                spark.conf.unset(MIN_FILE_SIZE)
            else:
                spark.conf.set(MIN_FILE_SIZE, str(int(float(size) * 2**20)))
            started = time.perf_counter()
            ledger.append(outcomes_of(spark, f"b{batch}-", args.rows, at), run.run, batch, may_hold=False)
            timings[size].append(time.perf_counter() - started)
        if batch % 100 == 99:
            print(f"compaction: {batch + 1} of {args.commits} batches", flush=True)
    if configured is None:
        spark.conf.unset(MIN_FILE_SIZE)
    else:
        spark.conf.set(MIN_FILE_SIZE, configured)

    def on_disk(ledger: Ledger) -> int:
        return sum(path.stat().st_size for path in Path(ledger.path).rglob("*.parquet")
                   if "_delta_log" not in path.parts and "_change_data" not in path.parts)

    details = {"rows": args.rows, "commits": args.commits}
    measured = {}
    for size, ledger in ledgers.items():
        detail = spark.sql(f"DESCRIBE DETAIL delta.`{ledger.path}`").first()
        measured[size] = (on_disk(ledger), detail["sizeInBytes"], detail["numFiles"],
                          statistics.median(timings[size]))
        if ledger.records().count() != args.commits * args.rows:
            raise RuntimeError(f"ledger {size} holds {ledger.records().count()} records")
    base_disk, base_live, base_files, base_append = measured.get("default", measured[sizes[0]])
    for size, (disk, live, files, append) in measured.items():
        name = "autoCompact.minFileSize " + ("Delta's default (64 MiB)" if size == "default" else f"{size} MiB")
        run.record(f"ledger compaction, {name}: bytes on disk over live bytes", round(disk / live, 2), "x",
                   baseline=("Delta's default", round(base_disk / base_live, 2)), live_bytes=live, disk_bytes=disk,
                   **details)
        run.record(f"ledger compaction, {name}: live data files", files, "files",
                   baseline=("Delta's default", base_files), **details)
        run.record(f"ledger compaction, {name}: a batch's append, median", append, "s",
                   baseline=("Delta's default", base_append), **details)
    print(os.linesep.join(f"{size}: {disk:,} bytes on disk, {live:,} live, {files} files, {append:.3f} s"
                          for size, (disk, live, files, append) in measured.items()))
    spark.stop()


if __name__ == "__main__":
    main()
