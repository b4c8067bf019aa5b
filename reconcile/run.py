"""A reconcile's run (`purger reconcile`, and the running purger's schedule; the package's docstring maps the rest).

A table's job: **scan** it by token range (``token_ranges``), **re-express** each row and judge it on its own
(``verdict``), **compare** with the stream's state (``known_objects``: known or not), **feed back** the rows the
state does not know, and those their own events say are overdue, to the reconcile topic, keyed by object id.
The stream reads it beside the events topics and decides as for any event, double-check included. A dry run
feeds nothing and counts what it would feed. Rows stay on the executors: the driver gets the counts
(accumulators) and nothing else. Before a policy's tables, its orphan rows; after them, its orphan blobs
(``orphans``); then the run's report.

Example::

    report = reconcile(spark, config)                 # every enabled policy
    report = reconcile(spark, config, ["mailbox"], dry_run=True)
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from contextlib import nullcontext
from dataclasses import asdict
from datetime import datetime, timezone
from functools import partial
from typing import Any, Iterator

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType, BooleanType, DoubleType, LongType, StringType, StructField, StructType, TimestampType,
)

from purger.core.config import PurgerConfig
from purger.core.failpoints import failpoint
from purger.core.policy import Policy, Scanned
from purger.core.times import duration_ms, now_ms
from purger.core.vocabulary import ALL_DCS
from purger.reconcile.known_objects import known_objects
from purger.reconcile.token_ranges import scan_plan, scan_ranges
from purger.reconcile.verdict import (
    OVERDUE, UNKNOWN, ReconcileError, ReportRow, RowVerdict, feed_reason, row_verdict,
)
from purger.sinks.clients import executor_session
from purger.sinks.throttle import Pacer, per_task_rate

log = logging.getLogger(__name__)

# A scanned row, on the executors: its object, when its own events make it due, and those events (JSON).
_ROWS = StructType([
    StructField("kind", StringType()), StructField("id", StringType()), StructField("rule", StringType()),
    StructField("eligible_at_ms", LongType()), StructField("records", ArrayType(StringType())),
])
# The report's rows (``ledger.reconcile_path``).
REPORT_SCHEMA = StructType([
    StructField("run_id", StringType()), StructField("policy", StringType()), StructField("table", StringType()),
    StructField("dc", StringType()), StructField("scanned", LongType()), StructField("known", LongType()),
    StructField("unknown_fed", LongType()), StructField("overdue_fed", LongType()),
    StructField("orphans_found", LongType()), StructField("orphans_deleted", LongType()),
    StructField("started", TimestampType()), StructField("finished", TimestampType()),
    StructField("duration_s", DoubleType()), StructField("rows_per_s", DoubleType()),
    StructField("dry_run", BooleanType()),
])


def _scan_task(config: PurgerConfig, scanned: Scanned, table: str, key: list[str], rate: float,
               ranges: Iterator[tuple[int, int]]) -> Iterator[tuple[Any, ...]]:
    """One Spark task: its token ranges read, each row re-expressed and judged on its own."""
    settings = config.reconcile
    session = executor_session(config)
    policies = config.policy_set
    pacer = Pacer(rate)
    failpoint("in_reconcile_scan")
    referenced_by = scanned.referenced_by and policies.policy_of(scanned.kind).table_names()[scanned.referenced_by]
    rows = scan_ranges(session, config.cassandra.keyspace, table, key, list(scanned.selected), list(ranges),
                       settings.consistency, settings.page_size, referenced_by)
    for row in rows:
        pacer.wait()
        verdict = row_verdict(policies, scanned, row)
        yield (verdict.kind, verdict.id, verdict.rule, verdict.eligible_at_ms,
               [json.dumps(record, separators=(",", ":")) for record in verdict.records])


def _last_committed_batch(spark: SparkSession, checkpoint: str) -> int | None:
    """The checkpoint's last committed batch, whose state the reconcile compares with; None when the
    checkpoint has no state yet (nothing is known)."""
    from pyspark.errors import AnalysisException

    # RocksDB state stores report to the driver's state store coordinator (see streams.pending).
    spark.streams.active
    try:
        return spark.read.format("state-metadata").load(checkpoint).agg(F.max("maxBatchId")).first()[0]
    except AnalysisException:
        return None


def _scan_table(spark: SparkSession, config: PurgerConfig, policy: Policy, scanned: Scanned,
                known: DataFrame | None, run_id: str, dry_run: bool) -> ReportRow:
    table = policy.table_names()[scanned.table]
    report = ReportRow(run_id, policy.name, table, ALL_DCS, datetime.now(timezone.utc), dry_run=dry_run)
    settings = config.reconcile
    cores = spark.sparkContext.defaultParallelism
    try:
        key, ranges = scan_plan(config.cassandra, table, cores * 2 * settings.ranges_per_task)
    except LookupError as error:
        raise ReconcileError(f"reconcile of policies.{policy.name}: {error}; create it, or correct the "
                             f"policy's table name") from None
    tasks = max(1, len(ranges) // settings.ranges_per_task)
    rate = per_task_rate(settings.max_rows_per_second, tasks, cores)
    scan = spark.sparkContext.parallelize(ranges, tasks).mapPartitions(
        partial(_scan_task, config, scanned, table, key, rate))
    rows = spark.createDataFrame(scan, _ROWS)
    if known is not None:
        rows = rows.join(known, ["kind", "id"], "left")
    else:
        rows = rows.withColumn("known", F.lit(None).cast("boolean"))
    counters = [spark.sparkContext.accumulator(0) for _ in range(4)]
    spark.sparkContext.setJobDescription(f"reconcile {policy.name}: {table}")
    try:
        rows.foreachPartition(partial(_feed_task, config, dry_run, now_ms(), duration_ms(settings.overdue_after),
                                      counters))
    finally:
        spark.sparkContext.setJobDescription(None)
    report.scanned, report.known, report.unknown_fed, report.overdue_fed = (c.value for c in counters)
    return report.finish()


def _feed_task(config: PurgerConfig, dry_run: bool, now: int, overdue_after_ms: int, counters: list[Any],
               rows: Iterator[Any]) -> None:
    """One Spark task of the feed: each scanned row judged (``feed_reason``), those fed back sent to the
    reconcile topic, keyed by object id, and all delivered before the task ends (a record Kafka did not take
    fails the task, ``connectors.NotDelivered``, which runs again); its counts added to ``counters``
    (scanned, known, unknown, overdue) only then, which Spark applies once per task however often it runs."""
    from purger.connectors import TASK_RUNS_AGAIN, kafka_producer

    counts = [0, 0, 0, 0]
    producer = None if dry_run else kafka_producer(config.kafka, acks="all", linger_ms=20)
    try:
        for row in rows:
            verdict = RowVerdict(row.kind, row.id, row.records, row.rule, row.eligible_at_ms)
            reason = feed_reason(verdict, bool(row.known), now, overdue_after_ms)
            counts[0] += 1
            counts[1] += bool(row.known)
            counts[2] += reason == UNKNOWN
            counts[3] += reason == OVERDUE
            if reason is not None and producer is not None:
                for record in row.records:
                    producer.send(config.kafka.reconcile_topic, key=row.id.encode(), value=record.encode())
        if producer is not None:
            producer.flush(TASK_RUNS_AGAIN)
            if counts[2] + counts[3]:  # the kill tests' moment: a task's rows fed back, before it is counted
                failpoint("in_reconcile_feed")
    finally:
        if producer is not None:
            producer.close()
    for counter, n in zip(counters, counts):
        counter.add(n)


def reconcile(spark: SparkSession, config: PurgerConfig, policy_names: list[str] | None = None,
              dry_run: bool = False, state_apart: bool = True) -> list[ReportRow]:
    """Reconcile the enabled policies (``policy_names`` of them, if given): a row of the report per
    policy, table and data centre, also appended to ``ledger.reconcile_path``. The stream's state is read
    by a process of its own unless ``state_apart`` is False: for a process that ends after the reconcile
    (``purger.reconcile.known_objects``)."""
    from purger.reconcile.orphans import reconcile_orphan_rows, reconcile_orphans

    policies = config.policy_set
    chosen = [p for p in policies.policies if policy_names is None or p.name in policy_names]
    unknown = sorted(set(policy_names or ()) - {p.name for p in policies.policies})
    if unknown:
        raise ReconcileError(f"policy {', '.join(unknown)} is not enabled: enable it under [policies.<name>] "
                             f"or choose among {', '.join(p.name for p in policies.policies)}")
    run_id = uuid.uuid4().hex[:12]
    dry_run = dry_run or config.stream.dry_run
    # A dry run's records (the orphans' would_delete, the report's rows) go to the dry run's ledger and
    # reconcile report (``PurgerConfig.as_dry_run``), whichever checkpoint it compares with (`purger reconcile
    # --dry-run`: the real stream's, below).
    records = config.as_dry_run() if dry_run and not config.stream.dry_run else config
    checkpoint = config.stream.checkpoint_location
    batch = _last_committed_batch(spark, checkpoint)
    kinds = sorted({scanned.kind for policy in chosen for scanned in policy.scanned})
    report = []
    with known_objects(spark, config, batch, kinds, state_apart) if batch is not None else nullcontext({}) as known:
        for policy in chosen:
            try:
                # First: a payload that a dangling reference pinned is then released by the payloads scan.
                report += reconcile_orphan_rows(spark, records, policy, run_id, dry_run)
            except LookupError as error:  # a table missing or keyed otherwise
                raise ReconcileError(f"reconcile of policies.{policy.name}: {error}") from None
            for scanned in policy.scanned:
                row = _scan_table(spark, config, policy, scanned, known.get(scanned.kind), run_id, dry_run)
                log.info("reconciled %s.%s: %d rows in %.1f s, %d unknown and %d overdue %s", policy.name,
                         row.table, row.scanned, row.duration_s, row.unknown_fed, row.overdue_fed,
                         "found (dry run)" if dry_run else "fed back")
                report.append(row)
            try:
                report += reconcile_orphans(spark, records, policy, run_id, dry_run)
            except LookupError as error:  # its blobs' table missing or keyed otherwise
                raise ReconcileError(f"reconcile of policies.{policy.name}: {error}") from None
    append_report(spark, records, report)
    return report


def last_reconcile_finished_s(spark: SparkSession, config: PurgerConfig) -> float | None:
    """When the last reconcile recorded at ``ledger.reconcile_path`` finished, in seconds since the epoch;
    None if none is. A dry run's reconciles and a real purger's are counted apart: neither puts off the
    other's."""
    from delta.tables import DeltaTable

    from purger.sinks.ledger import use_s3a

    use_s3a(spark, config.ledger)
    path = config.ledger.reconcile_path
    if not DeltaTable.isDeltaTable(spark, path):
        return None
    runs = spark.read.format("delta").load(path).where(F.coalesce("dry_run", F.lit(False)) == config.stream.dry_run)
    last = runs.agg(F.max("finished")).first()[0]
    # PySpark gives a timestamp as a naive datetime in this process's local time, which timestamp() reads.
    return None if last is None else last.timestamp()


def next_reconcile_in_s(last_finished_s: float | None, config: PurgerConfig) -> float:
    """Seconds until the next scheduled reconcile: ``reconcile.interval`` after the last one finished
    (``last_reconcile_finished_s``), so a restart does not start the count again; 0 if none is recorded."""
    if last_finished_s is None:
        return 0.0
    return max(0.0, config.reconcile.interval.total_seconds() - (time.time() - last_finished_s))


def append_report(spark: SparkSession, config: PurgerConfig, report: list[ReportRow]) -> None:
    """A run's rows added to the reconcile report (``ledger.reconcile_path``), a Delta table."""
    from purger.sinks.ledger import use_s3a

    use_s3a(spark, config.ledger)
    (spark.createDataFrame([asdict(row) for row in report], REPORT_SCHEMA).write.format("delta").mode("append")
     .option("mergeSchema", "true").save(config.ledger.reconcile_path))
