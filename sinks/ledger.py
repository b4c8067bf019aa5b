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
intent) is a ``MERGE`` on ``record_id`` that inserts only the new ones, reading
only the days those can be in (``earliest_decision``) and, in them, the files of
the batches that can have written them (``first_meaning_batch``); any other (a
batch's first attempt deleting afresh) appends without reading the table.

With ``ledger.pseudonymise`` on, the ledger holds no id in clear: each is written as its keyed hash, and each
reason as its category (``core.pseudonyms``); ``purger ledger find ID`` hashes the id to find its records.

The ledger keeps itself small: Delta's optimized writes, auto compaction and
log checkpoints (``TABLE_PROPERTIES``), and a daily ``Ledger.upkeep``, run by
the running purger, that compacts the last days, deletes the days older than
``ledger.retention`` and vacuums.

The report has one row per day, policy, object kind and data centre (``all`` for the
Cassandra rows), counts over that day's ledger records. It is kept up to date
incrementally: each refresh reads the records written since the last (the
ledger's change feed) and adds them to their days' rows, so its cost follows
what was written since, not the day's volume; a row of its own says up to which
ledger version it counts. The purge lag's percentiles come from a mergeable
sketch, within a stated rank error (``LAG_RANK_ERROR``). The running purger
refreshes every ``ledger.report_interval``; ``purger report`` refreshes, then
prints a day.

Paths are local directories or ``s3a://bucket/path`` (with ``ledger.s3``).

Example::

    ledger = Ledger(spark, config.ledger)
    ledger.append(outcomes, query_id, batch_id, may_hold=False)
    ledger.records().where("status = 'purged'").count()
    report = Report(spark, config.ledger, config.policy_set)
    report.refresh()                   # the records written since the last refresh
    report.rows(date(2026, 11, 21))
    ledger.record_command("reconcile", ["mailbox"], actor="jdoe", reason="INC-4711", run="5f0c3a9e21b4")
    ledger.find("m-1")                 # the records of message m-1, in a pseudonymised ledger too
    ledger.upkeep(date(2026, 11, 22))  # compaction of the last days, retention, vacuum
"""

from __future__ import annotations

import logging
import threading
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

from purger.core.settings import LedgerConfig
from purger.core.lags import LAG_RANK_ERROR, LAG_SKETCH_K
from purger.core.policy_set import PolicySet
from purger.core.pseudonyms import Pseudonyms
from purger.core.vocabulary import ALL_DCS, COMMAND, NOT_RESTORED, PURGED, RESTORED, SKIPPED, STATUSES
from purger.sinks.journal import JOURNAL_TTL_S

# Delta's optimistic concurrency: two writers of the report (or the first two creating it) conflict.
_CONFLICTS = (ConcurrentAppendException, ConcurrentDeleteReadException, ConcurrentWriteException,
              MetadataChangedException, ProtocolChangedException)

LAG_PERCENTILES = (0.5, 0.95, 0.99)

log = logging.getLogger(__name__)
CHANGE_FEED = "delta.enableChangeDataFeed"

# Delta's own upkeep, as the ledger's table properties (set at creation and on a ledger made without them):
# each commit's files written in fewer, larger ones, and small files of a partition compacted after a commit
# (a day of 2 s batches is tens of files, not 43,200); the log checkpointed every 10 commits (Delta's default,
# kept explicit); the log's entries and the files a compaction, DELETE or VACUUM leaves kept long enough for
# a reader's time travel and a query under way. The change feed: the daily report reads new records from it
# (``Report.refresh``).
TABLE_PROPERTIES = {
    CHANGE_FEED: "true",
    "delta.autoOptimize.optimizeWrite": "true",
    "delta.autoOptimize.autoCompact": "true",
    "delta.checkpointInterval": "10",
    "delta.logRetentionDuration": "interval 30 days",
    "delta.deletedFileRetentionDuration": "interval 7 days",
}
# The days before today the upkeep compacts again: yesterday's files (written until midnight), and those of
# the days before, when upkeeps were missed (a purger stopped). A day compacted already costs a log read.
COMPACTED_DAYS = 7
# How far a record's date may fall before the time its batch began: the executors' clocks (``decided_at``)
# against the filesystem's (the batch's mark, ``sinks.attempts``).
CLOCK_SKEW = timedelta(hours=1)
# One upkeep at a time in a process (the running purger's rounds, a ``purger`` command beside them).
_upkeep_lock = threading.Lock()


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


def _as_written(outcomes: DataFrame, pseudonyms: Pseudonyms, ids_written: bool = False) -> DataFrame:
    """The outcomes' ids and reasons as the ledger writes them (``core.pseudonyms``): a keyed hash of each id (in
    a Python function: the key stays out of the query's plan and the Spark UI; not again where ``ids_written``:
    ids read from the ledger) and each reason's category."""
    if not pseudonyms.on:
        return outcomes
    category = {"reason": F.substring_index("reason", ":", 1)}
    if ids_written:
        return outcomes.withColumns(category)
    keyed_hash = F.udf(pseudonyms.id, "string")
    return outcomes.withColumns({"id": keyed_hash("id"), **category})


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


def earliest_decision(began_ms: int | None, now: datetime | None = None) -> datetime:
    """The earliest decision (``decided_at``) a record a batch that began at ``began_ms`` writes can meet in the
    ledger as the same record; its day is the earliest ``date`` partition the batch's write reads.

    A record's decision is made by an attempt of the batch that records it, so never before the batch began
    (less ``CLOCK_SKEW``). A record from an intent is the same record as the one the batch that meant the
    deletion wrote, if it did, before that intent expired: an intent of unknown age, or a batch of unknown
    start (``began_ms`` None), bounds it by the journal's ``JOURNAL_TTL_S`` instead."""
    now = now or datetime.now(timezone.utc)
    earliest = now - timedelta(seconds=JOURNAL_TTL_S) - CLOCK_SKEW
    if began_ms is not None:
        earliest = max(earliest, datetime.fromtimestamp(began_ms / 1000, timezone.utc) - CLOCK_SKEW)
    return earliest


def first_day(began_ms: int | None, now: datetime | None = None) -> date:
    """The earliest day (``date`` partition) a record of a batch that began at ``began_ms`` can be in
    (``earliest_decision``)."""
    return earliest_decision(began_ms, now).date()


def first_meaning_batch(query_id: str, batch_id: int, intents: set[str]) -> int | None:
    """The earliest batch of ``query_id`` that can have written a record of batch ``batch_id`` and of these
    ``intents`` (``<query id>/<batch id>`` each): a record is the same record only when the same batch meant
    it (``_record_id``), and the batch that meant it, or a later one finding its intent, wrote it. None when an
    intent is another query's (a checkpoint set aside by a replay): any batch of this query may have written
    those."""
    batches = [batch_id]
    for intent in intents:
        query, _, batch = intent.rpartition("/")
        if query != query_id or not batch.lstrip("-").isdigit():
            return None
        batches.append(int(batch))
    return min(batches)


class Ledger:
    def __init__(self, spark: SparkSession, ledger: LedgerConfig) -> None:
        self.spark = spark
        self.path = ledger.path
        self.retention = ledger.retention
        self.pseudonyms = Pseudonyms.of(ledger)
        use_s3a(spark, ledger)

    def append(self, outcomes: DataFrame, query_id: str, batch_id: int, may_hold: bool = True,
               began_ms: int | None = None, ids_written: bool = False) -> None:
        """Add a batch's outcomes (``sinks.purge.OUTCOME_SCHEMA``), each record once by its ``record_id``;
        ``may_hold``: some may be there already (a retry, records from an intent), so only the new go in,
        reading only the days those can be in: since the batch began (``began_ms``, its first attempt), or,
        with records from another batch's intent or no ``began_ms``, since the oldest intent (``earliest_decision``),
        and of those days the files of the batches that can have written them (``first_meaning_batch``).

        >>> Ledger(spark, config.ledger).append(outcomes, query.id, 7)   # a second call adds nothing
        """
        outcomes = _as_written(outcomes, self.pseudonyms, ids_written)
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
            own = f"{query_id}/{batch_id}"
            intents = {row["intent"] for row in outcomes.where(F.col("intent").isNotNull() & (F.col("intent") != own))
                       .select("intent").distinct().collect()}
            if intents:
                began_ms = None  # another batch's intent: that batch's start is not known here
            self._merge(records.dropDuplicates(["record_id"]), earliest_decision(began_ms), query_id,
                        first_meaning_batch(query_id, batch_id, intents))
            return
        (
            records.write.format("delta").mode("append").partitionBy("date")
            # A ledger written before the policy or record_id column existed takes it on.
            .option("mergeSchema", "true")
            .save(self.path)
        )

    @retry(retry=retry_if_exception_type(_CONFLICTS), stop=stop_after_attempt(5), wait=wait_random(0.2, 2),
           reraise=True)
    def _merge(self, records: DataFrame, earliest: datetime, query_id: str, from_batch: int | None) -> None:
        """Insert the records whose ``record_id`` is not in the ledger, reading only the days from ``earliest``'s
        (the partitions the records it may meet can be in: ``earliest_decision``) and, when no other query wrote
        since ``earliest``, only the files of this query's batches from ``from_batch`` on (``first_meaning_batch``;
        Delta's statistics of ``batch_id`` skip the others): a retried batch reads its own files, not its day's.
        It reads what it writes into, so an append committed meanwhile (the stream's batch beside a reconcile's
        sweep) or a compaction of a day it reads makes it conflict: redone, as the report's refresh is."""
        condition = f"ledger.date >= '{earliest.date().isoformat()}' AND ledger.record_id = new.record_id"
        if from_batch is not None and not self._written_by_others(earliest, query_id):
            condition += f" AND ledger.batch_id >= {from_batch}"
        (
            DeltaTable.forPath(self.spark, self.path).alias("ledger")
            .merge(records.alias("new"), condition)
            .whenNotMatchedInsertAll()
            .execute()
        )

    def _written_by_others(self, earliest: datetime, query_id: str) -> bool:
        """Whether a query other than ``query_id`` recorded a decision since ``earliest`` (after a replay, the
        checkpoint it set aside put back): its batches' ids say nothing of this query's. Reads two columns of
        the files Delta's statistics of ``decided_at`` do not skip; commands' and restores' records never meet a
        batch's."""
        others = self.records().where(
            (F.col("date") >= F.lit(earliest.date())) & (F.col("decided_at") >= F.lit(earliest))
            & ~F.col("query_id").eqNullSafe(query_id)
            & ~F.col("status").isin(COMMAND, RESTORED, NOT_RESTORED))
        return bool(others.limit(1).count())

    def record_command(self, command: str, policies: list[str], actor: str, reason: str, run: str) -> None:
        """Who ran ``command`` (``reconcile``, ``replay``) on ``policies`` and why: a record per policy, ``id``
        ``<command>/<run>`` (a reconcile's report rows carry the same run id), written before the command
        changes anything, so that one cut short is on record too. A ledger written before the ``actor``
        column existed takes it on."""
        from purger.sinks.purge import worker_name

        now = datetime.now(timezone.utc)
        rows = [(policy, COMMAND, f"{command}/{run}", command, None, COMMAND, reason, None, now, None, None, -1,
                 run, worker_name(), now.date(), actor) for policy in policies]
        records = self.spark.createDataFrame(rows, _COMMAND_SCHEMA).select(
            F.sha2(F.to_json(F.array("policy", "kind", "id", "status")), 256).alias("record_id"), "*")
        records.write.format("delta").mode("append").partitionBy("date").option("mergeSchema", "true").save(self.path)

    def create(self) -> None:
        """Make the table if it is not there, or give a ledger of an earlier version its new columns (a merge
        inserts every column the table has), as ``append`` does: an append of no records; then its
        ``TABLE_PROPERTIES`` (the change feed the daily report reads among them), where it lacks them. The purger
        does it before its first batch, which then does not pay for it and for a new JVM's first Delta write
        (seconds, BENCHMARKS.md)."""
        if not self.exists() or not {"record_id", "actor"} <= set(self.records().columns):
            from purger.sinks.purge import OUTCOME_SCHEMA

            self.append(self.spark.createDataFrame([], OUTCOME_SCHEMA), "", -1, may_hold=False)
        properties = DeltaTable.forPath(self.spark, self.path).detail().first()["properties"]
        missing = {key: value for key, value in TABLE_PROPERTIES.items() if properties.get(key) != value}
        if missing:
            settings = ", ".join(f"'{key}' = '{value}'" for key, value in missing.items())
            self.spark.sql(f"ALTER TABLE delta.`{self.path}` SET TBLPROPERTIES ({settings})")

    def version(self) -> int:
        """The table's latest version."""
        return DeltaTable.forPath(self.spark, self.path).history(1).first()["version"]

    def inserted(self, after: int, up_to: int) -> DataFrame:
        """The records written in versions ``after`` (exclusive) to ``up_to``, from the change feed: each
        version's added records only, however many the table holds."""
        return (self.spark.read.format("delta").option("readChangeFeed", "true")
                .option("startingVersion", after + 1).option("endingVersion", up_to).load(self.path)
                .where(F.col("_change_type") == "insert").drop("_change_type", "_commit_version", "_commit_timestamp"))

    def batch(self, query_id: str, batch_id: int, began_ms: int | None = None) -> DataFrame:
        """The records a batch wrote, read from the days they can be in (``first_day``: since ``began_ms``,
        when it began, if known)."""
        return self.records().where((F.col("date") >= F.lit(first_day(began_ms))) & (F.col("query_id") == query_id)
                                    & (F.col("batch_id") == batch_id))

    def holds(self, query_id: str, batch_id: int, began_ms: int | None = None) -> bool:
        """Whether the batch's records are in the ledger (a Delta commit holds all of them or none).
        Ledgers written by earlier versions, with Delta's ``txnAppId``, carry the same columns."""
        if not self.exists():
            return False
        return bool(self.batch(query_id, batch_id, began_ms).limit(1).count())

    @retry(retry=retry_if_exception_type(_CONFLICTS), stop=stop_after_attempt(5), wait=wait_random(0.2, 2),
           reraise=True)
    def upkeep(self, today: date) -> bool:
        """Compact the last ``COMPACTED_DAYS`` days before ``today`` (what auto compaction left: a day's last
        files), delete the days older than ``ledger.retention``, then vacuum the files no version within
        ``delta.deletedFileRetentionDuration`` (7 days) reads. False, doing nothing, when another upkeep is
        under way in this process. Each step is one Delta commit; one that conflicts with a batch's write (a
        compaction of a day a retried batch's merge reads) is redone, as the merge is."""
        if not _upkeep_lock.acquire(blocking=False):
            return False
        try:
            if not self.exists():
                return True
            table = DeltaTable.forPath(self.spark, self.path)
            compacted_from = today - timedelta(days=COMPACTED_DAYS)
            table.optimize().where(f"date >= '{compacted_from.isoformat()}' AND date < '{today.isoformat()}'") \
                .executeCompaction()
            # Whole days (the partition column alone): Delta drops their files without reading them.
            table.delete(F.col("date") < F.lit(today - self.retention))
            # VACUUM lists the table's directories in a Spark job of this many tasks, 10,000 by default: minutes
            # of empty tasks on a few cores. A few per core lists 400 days' directories as fast.
            listing = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
            set_before = self.spark.conf.get(listing, None)
            self.spark.conf.set(listing, str(4 * self.spark.sparkContext.defaultParallelism))
            try:
                table.vacuum()
            finally:
                if set_before is None:
                    self.spark.conf.unset(listing)
                else:
                    self.spark.conf.set(listing, set_before)
            return True
        finally:
            _upkeep_lock.release()

    def exists(self) -> bool:
        return DeltaTable.isDeltaTable(self.spark, self.path)

    def find(self, object_id: str, kind: str | None = None, since: date | None = None) -> list[Row]:
        """Every record of the object ``object_id`` (of ``kind``, if given; decided on ``since`` or later, if
        given: only those days' partitions are read), oldest decision first: its id as the ledger wrote it, a
        keyed hash in a pseudonymised ledger; none when there is no ledger yet."""
        if not self.exists():
            return []
        found = self.records().where(F.col("id") == self.pseudonyms.id(object_id))
        if since is not None:
            found = found.where(F.col("date") >= F.lit(since))
        if kind is not None:
            found = found.where(F.col("kind") == kind)
        return found.orderBy("decided_at", "kind", F.coalesce("dc", F.lit(""))).collect()

    def records(self, as_of: int | None = None) -> DataFrame:
        """Every record (as of version ``as_of``, if given); query it with the DataFrame API or SQL
        (``delta.`<path>```)."""
        reader = self.spark.read.format("delta")
        return (reader.option("versionAsOf", as_of) if as_of is not None else reader).load(self.path)


# A command's records: the ledger's columns (``Ledger.append``) and who ran it.
_COMMAND_SCHEMA = ("policy string, kind string, id string, rule string, dc string, status string, reason string, "
                   "eligible_at timestamp, decided_at timestamp, deleted_at timestamp, lag_s double, batch_id long, "
                   "query_id string, worker string, date date, actor string")


# The purge lag's percentiles come from a KLL sketch (Spark's ``kll_sketch_agg_double``, with the batches' k,
# ``core.lags``), which merges: a refresh adds its records' sketch to the day's. The report states the bound
# in each row (``lag_rank_error``).
# The report's own row that says up to which ledger version its rows count: no date, so no day's query meets it.
_PROGRESS = {"policy": "", "kind": "", "dc": ""}


class ReportProgressMoved(RuntimeError):
    """Another refresh counted the same records first: this one is redone from the progress it left."""


def _quantile(sketch: str, p: float) -> str:
    return (f"CASE WHEN kll_sketch_get_n_double({sketch}) > 0 "
            f"THEN kll_sketch_get_quantile_double({sketch}, {p}) END")


class Report:
    """A row per day, policy, kind and data centre: counts by status, skips by reason, purge lag percentiles,
    the day's first and last decision; kept up to date incrementally (``refresh``)."""

    def __init__(self, spark: SparkSession, ledger: LedgerConfig, policy_set: PolicySet) -> None:
        self.spark = spark
        self.ledger = Ledger(spark, ledger)
        self.path = ledger.report_path
        self.policy_set = policy_set
        # The ledger version this instance last found counted: a refresh at the same version reads nothing more
        # (an idle purger's round is then one look at the ledger's log, not a read of the report too).
        self._counted_to: int | None = None

    def _policy_fields(self, days: list[date]) -> Column:
        """Each policy's own report fields for the row's day (``Policy.report_fields``), as a map."""
        result = F.create_map().cast("map<string,string>")
        for day in days:
            for policy in self.policy_set.policies:
                extra = policy.report_fields(day)
                if extra:
                    literal = F.create_map(*(F.lit(v) for item in sorted(extra.items()) for v in item))
                    result = F.when((F.col("date") == F.lit(day)) & (F.col("policy") == policy.name),
                                    literal).otherwise(result)
        return result

    def _counted(self, records: DataFrame) -> DataFrame:
        """The records' partial report: per day, policy, kind and data centre, what adds up (counts by status,
        skips by reason, the lag's sketch, the first and last decision), finished into a report's rows
        (``_finished``)."""
        records = (
            records.where(~F.col("status").isin(COMMAND, RESTORED, NOT_RESTORED))
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
        counts = records.groupBy(*group).agg(
            F.count(F.lit(1)).alias("candidates"),
            *(F.count(F.when(F.col("status") == s, True)).alias(s) for s in STATUSES),
            F.kll_sketch_agg_double(F.when(F.col("status") == PURGED, F.col("lag_s")), LAG_SKETCH_K)
            .alias("lag_sketch"),
            F.min("decided_at").alias("started_at"),
            F.max("decided_at").alias("finished_at"),
        )
        return counts.join(by_reason, group, "left").select(
            *group, "candidates", *STATUSES,
            F.coalesce("skipped_by_reason", F.create_map().cast("map<string,bigint>")).alias("skipped_by_reason"),
            "lag_sketch", "started_at", "finished_at")

    def _finished(self, counted: DataFrame, version: int) -> DataFrame:
        days = [row["date"] for row in counted.select("date").distinct().collect()]
        return counted.select(
            "date", "policy", "kind", "dc", "candidates", *STATUSES, "skipped_by_reason",
            *(F.expr(_quantile("lag_sketch", p)).alias(f"lag_p{int(p * 100)}_s") for p in LAG_PERCENTILES),
            "started_at", "finished_at",
            (F.unix_timestamp("finished_at") - F.unix_timestamp("started_at")).alias("duration_s"),
            self._policy_fields(days).alias("policy_fields"),
            F.current_timestamp().alias("updated_at"),
            "lag_sketch", F.lit(LAG_RANK_ERROR).alias("lag_rank_error"), F.lit(version).alias("ledger_version"))

    def compute(self, day: date) -> DataFrame:
        """A day's report from all its ledger records, read afresh (``purger status``; the refresh's reference):
        per policy, kind and data centre, counts by status, skips by reason, purge lag percentiles (seconds),
        the first and last decision of the day, and the policy's own fields."""
        version = self.ledger.version()
        return self._finished(self._counted(self.ledger.records(version).where(F.col("date") == F.lit(day))),
                              version)

    def _progress(self) -> int | None:
        """The ledger version the report's rows count up to; None without a report, or one written before it
        said (its rows are rebuilt)."""
        if not DeltaTable.isDeltaTable(self.spark, self.path):
            return None
        report = self.spark.read.format("delta").load(self.path)
        if "ledger_version" not in report.columns:
            return None
        found = report.where(F.col("date").isNull() & (F.col("policy") == "")).select("ledger_version").first()
        return None if found is None else found[0]

    def _with_progress(self, rows: DataFrame, version: int) -> DataFrame:
        """``rows`` and the progress row, which says they count the ledger up to ``version``."""
        progress = self.spark.createDataFrame([(None, *_PROGRESS.values(), version)],
                                              "date date, policy string, kind string, dc string, ledger_version long")
        return rows.unionByName(progress, allowMissingColumns=True)

    def _rebuild(self, version: int) -> None:
        """Every day's rows from the ledger as of ``version``, and the progress at it: the first refresh, and
        one whose next records the change feed no longer has."""
        rows = self._finished(self._counted(self.ledger.records(version)), version)
        (
            self._with_progress(rows, version).write.format("delta").mode("overwrite")
            .partitionBy("date").option("overwriteSchema", "true").save(self.path)
        )

    def _add(self, after: int, version: int) -> None:
        """The records written after ledger version ``after`` up to ``version`` added to their days' rows, and
        the progress moved to ``version``, in one commit; refused whole if another refresh moved it first."""
        added = self._finished(self._counted(self.ledger.inserted(after, version)), version)
        merged = "kll_sketch_merge_double(coalesce(t.lag_sketch, s.lag_sketch), coalesce(s.lag_sketch, t.lag_sketch))"
        summed = {
            "candidates": "t.candidates + s.candidates",
            **{status: f"t.{status} + s.{status}" for status in STATUSES},
            "skipped_by_reason": "map_zip_with(t.skipped_by_reason, s.skipped_by_reason, "
                                 "(k, a, b) -> coalesce(a, 0) + coalesce(b, 0))",
            "lag_sketch": merged,
            **{f"lag_p{int(p * 100)}_s": _quantile(merged, p) for p in LAG_PERCENTILES},
            "started_at": "least(t.started_at, s.started_at)",
            "finished_at": "greatest(t.finished_at, s.finished_at)",
            "duration_s": "unix_timestamp(greatest(t.finished_at, s.finished_at)) - "
                          "unix_timestamp(least(t.started_at, s.started_at))",
            "policy_fields": "s.policy_fields", "updated_at": "s.updated_at",
            "lag_rank_error": "s.lag_rank_error", "ledger_version": "s.ledger_version",
        }
        (
            DeltaTable.forPath(self.spark, self.path).alias("t")
            .merge(self._with_progress(added, version).alias("s"),
                   "t.date <=> s.date AND t.policy = s.policy AND t.kind = s.kind AND t.dc = s.dc")
            .whenMatchedUpdate(condition="s.date IS NULL", set={"ledger_version": (
                f"CASE WHEN t.ledger_version = {after} THEN s.ledger_version "
                f"ELSE raise_error('{ReportProgressMoved.__name__}') END")})
            .whenMatchedUpdate(set=summed)
            .whenNotMatchedInsertAll()
            .execute()
        )

    @retry(retry=retry_if_exception_type((*_CONFLICTS, ReportProgressMoved)), stop=stop_after_attempt(5),
           wait=wait_random(0.2, 2), reraise=True)
    def refresh(self) -> None:
        """Bring the report up to the ledger's latest version: the records written since the last refresh
        (read from the ledger's change feed) added to their days' rows; its cost follows what was written
        since, not the day's volume. The first refresh, or one after the change feed lost the records since
        the last (``delta.logRetentionDuration``), rebuilds every day from the ledger. When two run at once
        (the purger's and ``purger report``), one loses and is redone from the other's progress."""
        from pyspark.errors import AnalysisException, PySparkException

        if not self.ledger.exists():
            return
        version = self.ledger.version()
        if version == self._counted_to:  # another refresh can have counted up to it too, never past it
            return
        after = self._progress()
        if after is None:
            self._rebuild(version)
        elif version > after:
            try:
                self._add(after, version)
            except PySparkException as error:
                if ReportProgressMoved.__name__ in str(error):  # the progress row's raise_error
                    raise ReportProgressMoved() from None
                if not isinstance(error, AnalysisException):
                    raise
                # The change feed off for those versions, or its files gone: every day counted again, once.
                log.warning("daily report %s: the ledger's change feed does not have its versions after %d (%s); "
                            "rebuilding every day from the ledger", self.path, after,
                            (str(error).strip().splitlines() or [type(error).__name__])[0])
                self._rebuild(version)
        self._counted_to = version

    def rows(self, day: date) -> list[Row]:
        if not DeltaTable.isDeltaTable(self.spark, self.path):
            return []
        return (
            self.spark.read.format("delta").load(self.path)
            .where(F.col("date") == F.lit(day)).orderBy("policy", "kind", "dc").collect()
        )
