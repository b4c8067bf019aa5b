"""The daily report's refresh as the day grows: incremental (the ledger's change feed since the last refresh)
against a re-read of the whole day (the refresh before SPEC 10.3).

The ledger is filled with ``--records`` outcomes of today, then ``--grow`` times as many; at each volume, each
round appends ``--added`` records (a report interval's worth) and times, under the same load:

- the refresh (``Report.refresh``): the added records read from the change feed and merged into the day's rows;
- the day's report computed from all its records (what each refresh did before), written to Spark's noop sink;
- the baseline: a native Spark aggregation of the same records (counts by kind, data centre and status).

    python -m bench.report --records 100000 --grow 10 --added 1000 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import datetime, timezone

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.common import BenchRun
from purger.sinks.ledger import Ledger, Report
from purger.sinks.purge import OUTCOME_SCHEMA


def outcomes(spark: SparkSession, n: int, batch: int) -> DataFrame:
    """``n`` outcomes of today, as the sink makes them: most purged, some skipped, lags up to a day."""
    now = int(time.time() * 1000)
    status = F.element_at(F.array(*(F.lit(s) for s in ("purged", "purged", "purged", "skipped", "already_gone"))),
                          (F.col("id") % 5 + 1).cast("int"))
    return spark.range(n).select(
        F.lit("mailbox").alias("policy"), F.when(F.col("id") % 2 == 0, "message").otherwise("payload").alias("kind"),
        F.concat(F.lit(f"m{batch}-"), F.col("id").cast("string")).alias("id"), F.lit("deleted").alias("rule"),
        F.when(F.col("id") % 3 == 0, F.lit(None)).otherwise(F.lit("dc1")).alias("dc"), status.alias("status"),
        F.when(status == "skipped", F.lit("live: counter 1")).alias("reason"),
        (F.lit(now) - (F.col("id") * 7919) % 86_400_000).alias("eligible_at_ms"), F.lit(now).alias("decided_at_ms"),
        F.when(status == "purged", F.lit(now)).alias("deleted_at_ms"), F.lit(batch).alias("batch_id"),
        F.lit("bench:1").alias("worker"), F.lit(None).cast("string").alias("intent"),
    ).select([F.col(f.name).cast(f.dataType) for f in OUTCOME_SCHEMA.fields])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--grow", type=int, default=10)
    parser.add_argument("--added", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    run = BenchRun.start("report")
    spark = run.spark()
    ledger, report = Ledger(spark, run.config.ledger), Report(spark, run.config.ledger, run.config.policy_set)
    ledger.create()
    day = datetime.now(timezone.utc).date()
    batch, held = 0, 0
    for volume in (args.records, args.records * args.grow):
        ledger.append(outcomes(spark, volume - held, batch), run.run, batch, may_hold=False)
        batch, held = batch + 1, volume
        report.refresh()  # counts the bulk (a rebuild the first time)
        timings: dict[str, list[float]] = {"incremental": [], "whole day": [], "native": []}
        for _ in range(args.rounds):
            ledger.append(outcomes(spark, args.added, batch), run.run, batch, may_hold=False)
            batch, held = batch + 1, held + args.added
            started = time.perf_counter()
            report.refresh()
            timings["incremental"].append(time.perf_counter() - started)
            records = ledger.records().where(F.col("date") == F.lit(day))
            started = time.perf_counter()
            report._finished(report._counted(records), ledger.version()).write.format("noop").mode("overwrite").save()
            timings["whole day"].append(time.perf_counter() - started)
            started = time.perf_counter()
            records.groupBy("kind", "dc", "status").count().write.format("noop").mode("overwrite").save()
            timings["native"].append(time.perf_counter() - started)
        counted = sum(r["candidates"] for r in report.rows(day))
        if counted != held:
            raise RuntimeError(f"the report counts {counted} records, the ledger holds {held}")
        native = ("native Spark aggregation of the day's records", statistics.median(timings["native"]))
        details = {"day_records": held, "added": args.added, "rounds": args.rounds}
        run.record(f"report refresh, incremental, {held:,} records in the day, median",
                   statistics.median(timings["incremental"]), "s", baseline=native, **details)
        run.record(f"report of the whole day (the refresh before), {held:,} records, median",
                   statistics.median(timings["whole day"]), "s", baseline=native, **details)
    spark.stop()


if __name__ == "__main__":
    main()
