"""A reconcile's run (`purger reconcile`, and the running purger's schedule; the package's docstring maps the rest).

A table's job: **scan** it by token range (``token_ranges``), a page at a time, and judge each row on its own
(``verdict.page_verdicts``: on whole columns when the policy can, ``Policy.page_verdicts``), the pages going to
the JVM as Arrow batches; **compare** with the stream's state (``known_objects``: known or not); **feed back** the
rows the state does not know, and those their own verdict says are overdue: each re-expressed as its policy's
events (``Policy.row_events``), sent to the reconcile topic keyed by object id. Only the rows fed back pay for
their re-expression; a dry run keeps no row's values and counts what it would feed. The stream reads the topic
beside the events topics and decides as for any event, double-check included. Rows stay on the executors: the
driver gets the counts Spark observes on the way and nothing else. Before a policy's tables, its orphan rows;
after them, its orphan blobs (``orphans``); then the run's report.

Example::

    report = reconcile(spark, config)                 # every enabled policy
    report = reconcile(spark, config, ["mailbox"], dry_run=True)
"""

from __future__ import annotations

import json
import logging
import pickle
import time
import uuid
from contextlib import nullcontext
from dataclasses import asdict
from datetime import datetime, timezone
from functools import partial
from typing import Iterator

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType, BooleanType, DoubleType, LongType, StringType, StructField, StructType, TimestampType,
)

from purger.core.settings import PurgerConfig
from purger.core.failpoints import failpoint
from purger.core.policy import Policy
from purger.core.reconcile_descriptors import Scanned
from purger.core.times import duration_ms, now_ms
from purger.core.vocabulary import ALL_DCS
from purger.reconcile.known_objects import known_objects
from purger.reconcile.token_ranges import scan_pages, scan_plan
from purger.reconcile.verdict import (
    OVERDUE, UNKNOWN, ReconcileError, ReportRow, page_verdicts,
)
from purger.sinks.clients import executor_session
from purger.sinks.throttle import Pacer, per_task_rate

log = logging.getLogger(__name__)

# A scanned row, on the executors: its object, whether its re-expression has records, when they make it due,
# and the row's values (pickled, in ``Scanned.row_fields`` order; only when rows are fed back, to re-express the
# ones that are; none in a dry run).
_ROWS = StructType([
    StructField("kind", StringType()), StructField("id", StringType()), StructField("says", BooleanType()),
    StructField("rule", StringType()), StructField("eligible_at_ms", LongType()), StructField("row", BinaryType()),
])
_ARROW_ROWS = pa.schema([("kind", pa.string()), ("id", pa.string()), ("says", pa.bool_()), ("rule", pa.string()),
                         ("eligible_at_ms", pa.int64()), ("row", pa.binary())])
# The report's rows (``ledger.reconcile_path``).
REPORT_SCHEMA = StructType([
    StructField("run_id", StringType()), StructField("policy", StringType()), StructField("table", StringType()),
    StructField("dc", StringType()), StructField("scanned", LongType()), StructField("known", LongType()),
    StructField("unknown_fed", LongType()), StructField("overdue_fed", LongType()),
    StructField("orphans_found", LongType()), StructField("orphans_deleted", LongType()),
    StructField("started", TimestampType()), StructField("finished", TimestampType()),
    StructField("duration_s", DoubleType()), StructField("rows_per_s", DoubleType()),
    StructField("dry_run", BooleanType()),
    StructField("noncurrent_versions", LongType()), StructField("noncurrent_bytes", LongType()),
])


def _scan_task(config: PurgerConfig, scanned: Scanned, table: str, key: list[str], rate: float, keep_rows: bool,
               batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One Spark task: its token ranges read, each page's rows judged on their own (``page_verdicts``), a batch
    of Arrow columns per page."""
    settings = config.reconcile
    session = executor_session(config)
    policy_set = config.policy_set
    pacer = Pacer(rate)
    failpoint("in_reconcile_scan")
    ranges = [(start, end) for batch in batches for start, end in zip(*batch.to_pydict().values())]
    referenced_by = scanned.referenced_by and policy_set.policy_of(scanned.kind).table_names()[scanned.referenced_by]
    for names, rows in scan_pages(session, config.cassandra.keyspace, table, key, list(scanned.selected), ranges,
                                  settings.consistency, settings.page_size, referenced_by):
        if list(names) != list(scanned.row_fields):  # the feed re-expresses a row from its values in this order
            raise ReconcileError(f"reconcile of {table}: the scan read {names}, not {list(scanned.row_fields)}")
        pacer.wait(len(rows))
        verdicts = page_verdicts(policy_set, scanned, names, rows)
        at = names.index(scanned.id_column)
        yield pa.RecordBatch.from_pydict({
            "kind": [scanned.kind] * len(rows), "id": [str(row[at]) for row in rows], "says": verdicts.says,
            "rule": verdicts.rules, "eligible_at_ms": verdicts.eligible_at_ms,
            "row": [pickle.dumps(tuple(row)) for row in rows] if keep_rows else [None] * len(rows),
        }, schema=_ARROW_ROWS)


def _feed_reason(now: int, overdue_after_ms: int) -> Column:
    """Why a scanned row is fed back, or null: ``unknown`` when the stream's state does not hold its object,
    ``overdue`` when its own verdict says it has been due for more than ``overdue_after_ms``. A row that says
    nothing (no records) is never fed back."""
    known = F.coalesce(F.col("known"), F.lit(False))
    return (F.when(~F.col("says"), None).when(~known, UNKNOWN)
            .when(F.col("eligible_at_ms") < now - overdue_after_ms, OVERDUE))


def _last_committed_batch(spark: SparkSession, checkpoint: str) -> int | None:
    """The checkpoint's last committed batch, whose state the reconcile compares with; None when the
    checkpoint has no state yet (nothing is known): none written, or only the operators' metadata of a first
    batch that never committed (a purger stopped in it), whose ``maxBatchId`` is -1."""
    from pyspark.errors import AnalysisException

    # RocksDB state stores report to the driver's state store coordinator (see streams.pending).
    spark.streams.active
    try:
        batch = spark.read.format("state-metadata").load(checkpoint).agg(F.max("maxBatchId")).first()[0]
    except AnalysisException:
        return None
    return batch if batch is not None and batch >= 0 else None


def _scan_table(spark: SparkSession, config: PurgerConfig, policy: Policy, scanned: Scanned,
                known: DataFrame | None, run_id: str, dry_run: bool) -> ReportRow:
    table = policy.table_names()[scanned.table]
    report = ReportRow(run_id, policy.name, table, ALL_DCS, datetime.now(timezone.utc), dry_run=dry_run)
    settings = config.reconcile
    cores = spark.sparkContext.defaultParallelism
    try:
        plan = scan_plan(config.cassandra, table, cores, settings)
    except LookupError as error:
        raise ReconcileError(f"reconcile of policies.{policy.name}: {error}; create it, or correct the "
                             f"policy's table name") from None
    rate = per_task_rate(settings.max_rows_per_second, plan.tasks, cores)
    # A partition per task as planned (no shuffle), each with its token ranges.
    ranges_df = spark.createDataFrame(spark.sparkContext.parallelize(plan.ranges, plan.tasks), "start long, end long")
    rows = ranges_df.mapInArrow(partial(_scan_task, config, scanned, table, plan.key, rate, not dry_run), _ROWS)
    if known is not None:
        rows = rows.join(known, ["kind", "id"], "left")
    else:
        rows = rows.withColumn("known", F.lit(None).cast("boolean"))
    rows = rows.withColumn("reason", _feed_reason(now_ms(), duration_ms(settings.overdue_after)))
    # Counted on the way, in the JVM, from the tasks that succeed (Spark's observed metrics): only the rows fed
    # back go on to Python.
    counts = Observation(f"reconcile {run_id} {policy.name}.{table}")
    rows = rows.observe(counts, F.count(F.lit(1)).alias("scanned"),
                        F.count(F.when(F.col("known"), True)).alias("known"),
                        F.count(F.when(F.col("reason") == UNKNOWN, True)).alias("unknown"),
                        F.count(F.when(F.col("reason") == OVERDUE, True)).alias("overdue"))
    fed = rows.where(F.col("reason").isNotNull()).select("kind", "id", "row")
    spark.sparkContext.setJobDescription(f"reconcile {policy.name}: {table}")
    try:
        if not dry_run:
            fed = fed.mapInArrow(partial(_feed_task, config, scanned), "kind string")
        fed.write.format("noop").mode("overwrite").save()
    finally:
        spark.sparkContext.setJobDescription(None)
    found = counts.get
    report.scanned, report.known, report.unknown_fed, report.overdue_fed = (
        found["scanned"], found["known"], found["unknown"], found["overdue"])
    return report.finish()


def _feed_task(config: PurgerConfig, scanned: Scanned, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One Spark task of the feed: each row fed back re-expressed (``Policy.row_events``) and sent to the reconcile
    topic, keyed by object id, and all delivered before the task ends (a record Kafka did not take fails the task,
    ``connectors.NotDelivered``, which runs again, and is counted only then). Yields nothing."""
    from purger.connectors import TASK_RUNS_AGAIN, kafka_producer

    policy = config.policy_set.policy_of(scanned.kind)
    producer = kafka_producer(config.kafka, acks="all", linger_ms=20)
    sent = 0
    try:
        for batch in batches:
            columns = batch.to_pydict()
            for object_id, row in zip(columns["id"], columns["row"]):
                for record in policy.row_events(scanned.table, dict(zip(scanned.row_fields, pickle.loads(row)))):
                    producer.send(config.kafka.reconcile_topic, key=object_id.encode(),
                                  value=json.dumps(record, separators=(",", ":")).encode())
                sent += 1
        producer.flush(TASK_RUNS_AGAIN)
        if sent:  # the kill tests' moment: a task's rows fed back, before it is counted
            failpoint("in_reconcile_feed")
    finally:
        producer.close()
    yield from ()


def reconcile(spark: SparkSession, config: PurgerConfig, policy_names: list[str] | None = None,
              dry_run: bool = False, state_apart: bool = True, run_id: str | None = None) -> list[ReportRow]:
    """Reconcile the enabled policies (``policy_names`` of them, if given): a row of the report per
    policy, table and data centre, also appended to ``ledger.reconcile_path``, with ``run_id`` (a new one
    by default; `purger reconcile` gives the one its ledger record of who ran it names). The stream's state
    is read by a process of its own unless ``state_apart`` is False: for a process that ends after the
    reconcile (``purger.reconcile.known_objects``)."""
    from purger.reconcile.orphans import reconcile_orphan_rows, reconcile_orphans

    policy_set = config.policy_set
    chosen = [p for p in policy_set.policies if policy_names is None or p.name in policy_names]
    unknown = sorted(set(policy_names or ()) - {p.name for p in policy_set.policies})
    if unknown:
        raise ReconcileError(f"policy {', '.join(unknown)} is not enabled: enable it under [policies.<name>] "
                             f"or choose among {', '.join(p.name for p in policy_set.policies)}")
    run_id = run_id or uuid.uuid4().hex[:12]
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
