"""The audit ledger and the daily purge report: two Delta tables.

The ledger has one record per outcome of the purge sink: every deletion
(``status = 'purged'``, with its rule, eligible-at, deleted-at, data centre and
batch id), and every decision not to delete (``skipped`` with the reason,
``already_gone``, ``error``, ``dead_lettered``, and a dry run's
``would_delete``). A batch's records go in one Delta transaction and carry the
query's id and the batch id. Each command that changes what is deleted
(``purger reconcile``, ``purger replay``) is a record too, ``status = 'command'``,
one per policy it concerns, with who ran it (``actor``) and why (``reason``):
an auditor reads it beside the records of its effect (``Ledger.record_command``).

Each record has a ``record_id``, the same every time the same thing is recorded:
for a deletion, its policy, kind, id, data centre and the batch that meant it
(the intent's, ``core.handles.Journal``), so a deletion recorded by the attempt
that made it and again from its intent (a retried batch, a later batch finding
it gone) is one record; for a decision not to delete, its object (a dead
letter's is its bad record, ``topic/partition/offset``), batch and status. A
write that may meet records already there (a retried batch, or records from an
intent) is a ``MERGE`` on ``record_id`` that inserts only the new ones; any
other (a batch's first attempt deleting afresh) appends without reading the
table.

The report has one row per day, policy, object kind and data centre (``all`` for the
Cassandra rows), computed from that day's ledger records, so its figures are
counts over the ledger by construction. The running purger rewrites today's rows
every ``ledger.report_interval``; ``purger report`` rewrites a day's rows, then
prints them.

Paths are local directories or ``s3a://bucket/path`` (with ``ledger.s3``).

Example::

    ledger = Ledger(spark, config.ledger)
    ledger.append(outcomes, query_id, batch_id, may_hold=False)
    ledger.records().where("status = 'purged'").count()
    Report(spark, config.ledger, config.policy_set).refresh(date(2026, 11, 21))
    ledger.record_command("reconcile", ["mailbox"], actor="jdoe", reason="INC-4711", run="5f0c3a9e21b4")
"""

from __future__ import annotations

import os
import socket
from datetime import date, datetime, timedelta, timezone
from typing import Any

from delta.exceptions import (
    ConcurrentAppendException, ConcurrentDeleteReadException, ConcurrentWriteException, MetadataChangedException,
    ProtocolChangedException,
)
from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random

from purger.core.config import LedgerConfig
from purger.core.policy_set import PolicySet
from purger.core.vocabulary import ALL_DCS, COMMAND, PURGED, SKIPPED, STATUSES
from purger.sinks.journal import JOURNAL_TTL_S

# Delta's optimistic concurrency: two writers of the report (or the first two creating it) conflict.
_CONFLICTS = (ConcurrentAppendException, ConcurrentDeleteReadException, ConcurrentWriteException,
              MetadataChangedException, ProtocolChangedException)

LAG_PERCENTILES = (0.5, 0.95, 0.99)


def lag_seconds(eligible_at_ms: Any, deleted_at_ms: Any) -> Any:
    """Purge lag: deleted-at minus eligible-at, in seconds; of two numbers, or of two columns."""
    return (deleted_at_ms - eligible_at_ms) / 1000


def _timestamp(ms_column: str) -> Column:
    return F.timestamp_millis(F.col(ms_column))


def _record_id(query_id: str, batch_id: int) -> Column:
    """What makes a record the same record whenever it is written (the module's docstring): a deletion's
    identity is the batch that meant it, a decision's the batch that made it."""
    batch = F.coalesce(F.col("intent"), F.lit(f"{query_id}/{batch_id}"))
    return F.sha2(F.to_json(F.array("policy", "kind", "id", F.coalesce("dc", F.lit("")), "status", batch)), 256)


def use_s3a(spark: SparkSession, ledger: LedgerConfig) -> None:
    """Point s3a:// at the configured endpoint (session settings reach Hadoop's filesystem)."""
    if not any(path.startswith("s3a://") for path in (ledger.path, ledger.report_path, ledger.reconcile_path)):
        return
    s3 = ledger.s3
    if s3.credentials == "keys":
        # Spark's UI shows these settings with the secret redacted (spark.redaction.regex).
        credentials = {"fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
                       "fs.s3a.access.key": s3.access_key, "fs.s3a.secret.key": s3.secret_key.get_secret_value()}
    else:
        credentials = {"fs.s3a.aws.credentials.provider":
                       "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider"}
    for key, value in {
        "fs.s3a.endpoint": s3.endpoint,
        "fs.s3a.endpoint.region": s3.region,
        **credentials,
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": str(s3.endpoint.startswith("https")).lower(),
    }.items():
        spark.conf.set(key, value)


class Ledger:
    def __init__(self, spark: SparkSession, ledger: LedgerConfig) -> None:
        self.spark = spark
        self.path = ledger.path
        use_s3a(spark, ledger)

    def append(self, outcomes: DataFrame, query_id: str, batch_id: int, may_hold: bool = True) -> None:
        """Add a batch's outcomes (``sinks.purge.OUTCOME_SCHEMA``), each record once by its ``record_id``;
        ``may_hold``: some may be there already (a retry, records from an intent), so only the new go in.

        >>> Ledger(spark, config.ledger).append(outcomes, query.id, 7)   # a second call adds nothing
        """
        records = outcomes.select(
            _record_id(query_id, batch_id).alias("record_id"),
            "policy", "kind", "id", "rule", "dc", "status", "reason",
            _timestamp("eligible_at_ms").alias("eligible_at"),
            _timestamp("decided_at_ms").alias("decided_at"),
            _timestamp("deleted_at_ms").alias("deleted_at"),
            lag_seconds(F.col("eligible_at_ms"), F.col("deleted_at_ms")).alias("lag_s"),
            F.lit(batch_id).cast(outcomes.schema["batch_id"].dataType).alias("batch_id"),
            F.lit(query_id).alias("query_id"),
            "worker",
            F.to_date(_timestamp("decided_at_ms")).alias("date"),
            F.lit(None).cast("string").alias("actor"),  # a command's (``record_command``), none of the purge's
        )
        if may_hold and self.exists():
            self._merge(records.dropDuplicates(["record_id"]))
            return
        (
            records.write.format("delta").mode("append").partitionBy("date")
            # A ledger written before the policy or record_id column existed takes it on.
            .option("mergeSchema", "true")
            .save(self.path)
        )

    @retry(retry=retry_if_exception_type(_CONFLICTS), stop=stop_after_attempt(5), wait=wait_random(0.2, 2),
           reraise=True)
    def _merge(self, records: DataFrame) -> None:
        """Insert the records whose ``record_id`` is not in the ledger. A deletion's records are at most
        ``JOURNAL_TTL_S`` apart (an intent lives that long), so only those days' partitions are read. It
        reads what it writes into, so an append committed meanwhile (the stream's batch beside a reconcile's
        sweep) makes it conflict: redone, as the report's refresh is."""
        since = (datetime.now(timezone.utc) - timedelta(seconds=JOURNAL_TTL_S + 2 * 86_400)).date()
        (
            DeltaTable.forPath(self.spark, self.path).alias("ledger")
            .merge(records.alias("new"), f"ledger.date >= '{since.isoformat()}' AND ledger.record_id = new.record_id")
            .whenNotMatchedInsertAll()
            .execute()
        )

    def record_command(self, command: str, policies: list[str], actor: str, reason: str, run: str) -> None:
        """Who ran ``command`` (``reconcile``, ``replay``) on ``policies`` and why: a record per policy, ``id``
        ``<command>/<run>`` (a reconcile's report rows carry the same run id), written before the command
        changes anything, so that one cut short is on record too. A ledger written before the ``actor``
        column existed takes it on."""
        now = datetime.now(timezone.utc)
        rows = [(policy, COMMAND, f"{command}/{run}", command, None, COMMAND, reason, None, now, None, None, -1,
                 run, f"{socket.gethostname()}:{os.getpid()}", now.date(), actor) for policy in policies]
        records = self.spark.createDataFrame(rows, _COMMAND_SCHEMA).select(
            F.sha2(F.to_json(F.array("policy", "kind", "id", "status")), 256).alias("record_id"), "*")
        records.write.format("delta").mode("append").partitionBy("date").option("mergeSchema", "true").save(self.path)

    def create(self) -> None:
        """Make the table if it is not there, or give a ledger of an earlier version its new columns (a merge
        inserts every column the table has), as ``append`` does: an append of no records. The purger does it before its first batch, which then
        does not pay for it and for a new JVM's first Delta write (seconds, BENCHMARKS.md)."""
        if not self.exists() or not {"record_id", "actor"} <= set(self.records().columns):
            from purger.sinks.purge import OUTCOME_SCHEMA

            self.append(self.spark.createDataFrame([], OUTCOME_SCHEMA), "", -1, may_hold=False)

    def holds(self, query_id: str, batch_id: int) -> bool:
        """Whether the batch's records are in the ledger (a Delta commit holds all of them or none).
        Ledgers written by earlier versions, with Delta's ``txnAppId``, carry the same columns."""
        if not self.exists():
            return False
        written = self.records().where((F.col("query_id") == query_id) & (F.col("batch_id") == batch_id))
        return bool(written.limit(1).count())

    def exists(self) -> bool:
        return DeltaTable.isDeltaTable(self.spark, self.path)

    def records(self) -> DataFrame:
        """Every record; query it with the DataFrame API or SQL (``delta.`<path>```)."""
        return self.spark.read.format("delta").load(self.path)


# A command's records: the ledger's columns (``Ledger.append``) and who ran it.
_COMMAND_SCHEMA = ("policy string, kind string, id string, rule string, dc string, status string, reason string, "
                   "eligible_at timestamp, decided_at timestamp, deleted_at timestamp, lag_s double, batch_id long, "
                   "query_id string, worker string, date date, actor string")


class Report:
    def __init__(self, spark: SparkSession, ledger: LedgerConfig, policies: PolicySet) -> None:
        self.spark = spark
        self.ledger = Ledger(spark, ledger)
        self.path = ledger.report_path
        self.policies = policies

    def _policy_fields(self, day: date) -> Column:
        """Each policy's own report fields for the day (``Policy.report_fields``), as a map."""
        result = F.create_map().cast("map<string,string>")
        for policy in self.policies.policies:
            extra = policy.report_fields(day)
            if extra:
                literal = F.create_map(*(F.lit(v) for item in sorted(extra.items()) for v in item))
                result = F.when(F.col("policy") == policy.name, literal).otherwise(result)
        return result

    def compute(self, day: date) -> DataFrame:
        """A day's report from the ledger: per policy, kind and data centre, counts by status, skips by
        reason, purge lag percentiles (seconds), the first and last decision of the day, and the
        policy's own fields."""
        records = (
            self.ledger.records()
            .where((F.col("date") == F.lit(day)) & (F.col("status") != COMMAND))
            .withColumn("dc", F.coalesce("dc", F.lit(ALL_DCS)))
            # Records written before there were policies are all the mailbox's.
            .withColumn("policy", F.coalesce("policy", F.lit("mailbox")))
        )
        group = ["date", "policy", "kind", "dc"]
        by_reason = (
            records.where(F.col("status") == SKIPPED)
            .groupBy(*group, F.split("reason", ":").getItem(0).alias("category"))
            .count()
            .groupBy(*group)
            .agg(F.map_from_entries(F.collect_list(F.struct("category", "count"))).alias("skipped_by_reason"))
        )
        lags = F.percentile(F.when(F.col("status") == PURGED, F.col("lag_s")),
                            F.array(*(F.lit(p) for p in LAG_PERCENTILES)))
        counts = records.groupBy(*group).agg(
            F.count(F.lit(1)).alias("candidates"),
            *(F.count(F.when(F.col("status") == s, True)).alias(s) for s in STATUSES),
            lags.alias("lags"),
            F.min("decided_at").alias("started_at"),
            F.max("decided_at").alias("finished_at"),
        )
        return (
            counts.join(by_reason, group, "left")
            .select(
                *group, "candidates", *STATUSES,
                F.coalesce("skipped_by_reason", F.create_map().cast("map<string,bigint>")).alias("skipped_by_reason"),
                *(F.col("lags").getItem(i).alias(f"lag_p{int(p * 100)}_s") for i, p in enumerate(LAG_PERCENTILES)),
                "started_at", "finished_at",
                (F.unix_timestamp("finished_at") - F.unix_timestamp("started_at")).alias("duration_s"),
                self._policy_fields(day).alias("policy_fields"),
                F.current_timestamp().alias("updated_at"),
            )
        )

    @retry(retry=retry_if_exception_type(_CONFLICTS), stop=stop_after_attempt(5), wait=wait_random(0.2, 2),
           reraise=True)
    def refresh(self, day: date | None = None) -> None:
        """Rewrite one day's rows (today, UTC, by default) from the ledger. When two run at once (the
        purger's and ``purger report``), one loses Delta's optimistic check and is redone."""
        if not self.ledger.exists():
            return
        day = day or datetime.now(timezone.utc).date()
        (
            self.compute(day).write.format("delta").mode("overwrite").partitionBy("date")
            .option("replaceWhere", f"date = '{day.isoformat()}'")
            # A report written before the policy columns existed takes them on.
            .option("mergeSchema", "true")
            .save(self.path)
        )

    def rows(self, day: date) -> list[Row]:
        if not DeltaTable.isDeltaTable(self.spark, self.path):
            return []
        return (
            self.spark.read.format("delta").load(self.path)
            .where(F.col("date") == F.lit(day)).orderBy("policy", "kind", "dc").collect()
        )
