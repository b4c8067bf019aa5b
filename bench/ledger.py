"""The ledger's cost per batch: one Delta append of a batch's outcomes, as the sink makes it.

Appends ``--rows`` outcomes per commit into a ledger that already has ``--commits`` commits, alternating
Delta's ``snapshotPartitions`` between its default (50) and the purger's (``purger.spark``), so both are
measured in the same run under the same load; the baseline is a plain Parquet append of the same rows.

    python -m bench.ledger --rows 200 --commits 25 --rounds 10
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.common import BenchRun
from sinks.ledger import Ledger
from sinks.purge import OUTCOME_SCHEMA

SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"
DELTA_DEFAULT = "50"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--commits", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    run = BenchRun.start("ledger")
    spark = run.spark()
    purger_setting = spark.conf.get(SNAPSHOT_PARTITIONS)
    at = int(time.time() * 1000)
    outcomes = spark.createDataFrame(
        [("mailbox", "message", f"m{i}", "expired_by_counter", None, "purged", None, at - 5000, at, at, 0, "bench:1")
         for i in range(args.rows)], OUTCOME_SCHEMA).cache()
    outcomes.count()
    ledger = Ledger(spark, run.config.ledger)
    batch = 0
    for _ in range(args.commits):
        ledger.append(outcomes, run.run, batch)
        batch += 1

    timings: dict[str, list[float]] = {DELTA_DEFAULT: [], purger_setting: [], "parquet": []}
    for _ in range(args.rounds):
        for setting in (DELTA_DEFAULT, purger_setting):
            spark.conf.set(SNAPSHOT_PARTITIONS, setting)
            started = time.perf_counter()
            ledger.append(outcomes, run.run, batch)
            timings[setting].append(time.perf_counter() - started)
            batch += 1
        started = time.perf_counter()
        outcomes.write.mode("append").parquet(str(run.work / "parquet"))
        timings["parquet"].append(time.perf_counter() - started)
    spark.conf.set(SNAPSHOT_PARTITIONS, purger_setting)

    parquet = statistics.median(timings["parquet"])
    details = {"rows": args.rows, "commits_before": args.commits, "rounds": args.rounds}
    run.record(f"ledger append, Delta's default snapshotPartitions ({DELTA_DEFAULT}), median",
               statistics.median(timings[DELTA_DEFAULT]), "s", baseline=("plain Parquet append", parquet), **details)
    run.record(f"ledger append, the purger's snapshotPartitions ({purger_setting}), median",
               statistics.median(timings[purger_setting]), "s", baseline=("plain Parquet append", parquet), **details)
    spark.stop()


if __name__ == "__main__":
    main()
