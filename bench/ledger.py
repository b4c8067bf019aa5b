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
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.common import BenchRun
from purger.core.settings import LedgerConfig
from purger.sinks.ledger import Ledger
from purger.sinks.purge import OUTCOME_SCHEMA

SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
OPTIMIZE_WRITE = "delta.autoOptimize.optimizeWrite"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--commits", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

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


if __name__ == "__main__":
    main()
