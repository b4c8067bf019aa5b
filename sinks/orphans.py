"""Orphan blobs (docs/reconciliation.md, point 5): blobs under a policy's prefix (``Policy.blobs``) that
no row of its table names, deleted once older than ``reconcile.orphan_grace``.

For each ``Blobs`` of the policy and each data centre, one Spark job:

1. **List** the data centre's bucket under the prefix in Spark tasks, split by the first character
   after the prefix: a shard per letter and digit (``ListObjectsV2`` with ``Prefix=<prefix><c>``) and a
   catch-all for every other first character (``list_shard``), so each key under the prefix is listed
   exactly once and no key outside it at all. Blobs younger than the grace are dropped at once.
2. **Scan** the table's ids by token range (``connectors.token_ranges``) at ``reconcile.consistency``,
   paced at ``reconcile.max_rows_per_second`` over all tasks; scanned once per ``Blobs`` and kept for
   every data centre.
3. **Anti-join** the two in Spark: the blobs left have no row. Nothing is collected on the driver.
4. **Decide** each on the executors (``decide``), paced at ``stream.max_deletions_per_second`` over all
   tasks: just before the delete, the row is read again at the serial consistency, then the blob's age
   (``HEAD``); a row that appeared, or a blob rewritten since the listing or younger than the grace, keeps
   it (``skipped``). Otherwise it is deleted (a dry run: ``would_delete``). The re-read of the row comes
   first and the ``HEAD`` last, so an upload (its blob first, then its row) that starts after the listing
   is caught by one of the two, whichever the moment.
5. **Record** every decision, one ledger record each (rule ``orphan``, its data centre), in one write
   per data centre named ``reconcile-<run id>-<policy>.<table>-<dc>``, batch 0: a data centre whose
   write is in the ledger already is not swept again by a run of the same id, so a re-run adds nothing
   twice.

Example::

    report = reconcile_orphans(spark, config, config.policy_set.policies[0], run_id, dry_run=False)
    [(r.dc, r.orphans_found, r.orphans_deleted) for r in report]   # [('dc1', 3, 3), ('dc2', 1, 1)]
"""

from __future__ import annotations

import logging
import os
import socket
import string
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from typing import Any, Iterable, Iterator

from pyspark import StorageLevel, TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from purger.connectors import CassandraTables, s3_client
from purger.connectors.token_ranges import scan_plan, scan_ranges
from purger.core.config import PurgerConfig
from purger.core.failpoints import failpoint
from purger.core.policy import Blobs, Policy
from purger.core.reconcile import ReportRow
from purger.core.times import duration_ms, epoch_ms, format_epoch_ms, now_ms
from purger.core.vocabulary import (
    ALREADY_GONE, EARLIER_ATTEMPT, ERROR, NOT_YET_DUE, ORPHAN, PRESENT, PURGED, SKIPPED, WOULD_DELETE, reason,
)
from purger.sinks.clients import executor_session
from purger.sinks.journal import CassandraJournal
from purger.sinks.ledger import Ledger
from purger.sinks.purge import OUTCOME_SCHEMA
from purger.sinks.throttle import Pacer, bounded_map, per_task_rate

log = logging.getLogger(__name__)

# The first characters after the prefix that have a listing of their own; every other one (and a key that
# is the prefix itself) goes to the catch-all.
SHARD_CHARACTERS = string.digits + string.ascii_uppercase + string.ascii_lowercase
# Above every character: <prefix><c><MAX_CHARACTER> comes after nearly every key under <prefix><c>
# (code-point order is S3's UTF-8 byte order).
MAX_CHARACTER = "\U0010ffff"

_LISTED = StructType([StructField("id", StringType(), False), StructField("last_modified_ms", LongType(), False),
                      StructField("etag", StringType())])
_IDS = StructType([StructField("id", StringType(), False)])


@dataclass(frozen=True)
class Sweep:
    """One data centre's sweep of a policy's blobs, as its executor tasks see it: the policy, its
    ``Blobs``, its table by the configured name, the grace and the run's cutoff (blobs listed as last
    modified before it are old enough), whether it deletes, and its name in the ledger."""

    policy: str
    blobs: Blobs
    table: str
    dc: str
    grace_ms: int
    cutoff_ms: int
    dry_run: bool
    query_id: str


def ledger_query_id(run_id: str, policy: str, table: str, dc: str) -> str:
    """The name of a run's ledger write for one data centre of a policy's blobs table (batch 0)."""
    return f"reconcile-{run_id}-{policy}.{table}-{dc}"


# --- each executor process's clients, per configuration ---------------------------------------------------

_lock = threading.Lock()
_s3: dict[tuple[str, str], Any] = {}
_row_reads: dict[tuple[str, str, str], tuple[CassandraTables, Any]] = {}


def _store(config: PurgerConfig, dc: str) -> Any:
    """This process's S3 client for a data centre's store, made once per configuration."""
    with _lock:
        if (config.key, dc) not in _s3:
            _s3[config.key, dc] = s3_client(config.stores[dc])
        return _s3[config.key, dc]


def _row_read(config: PurgerConfig, blobs: Blobs, table: str) -> tuple[CassandraTables, Any]:
    """The table handle and the serial read of a blob's row, prepared once per process and configuration."""
    key = (config.key, table, blobs.id_column)
    session = executor_session(config)
    with _lock:
        if key not in _row_reads:
            tables = CassandraTables(session, config.cassandra.keyspace, {blobs.table: table})
            statement = tables.prepare(
                f"SELECT {blobs.id_column} FROM {{{blobs.table}}} WHERE {blobs.id_column} = ? LIMIT 1", "serial")
            _row_reads[key] = (tables, statement)
        return _row_reads[key]


def _worker() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# --- 1. the listing ---------------------------------------------------------------------------------------


def list_shard(client: Any, bucket: str, prefix: str, first: str | None, shards: str = SHARD_CHARACTERS,
               page_size: int = 1000) -> Iterator[dict[str, Any]]:
    """The listing's items of one shard: every key under ``prefix + first``, or (``first`` None, the
    catch-all) every key under ``prefix`` whose first character after it is not one of ``shards``. The
    catch-all skips over the shards' keys by ``StartAfter`` and filters what it still meets of them, so
    the shards together list each key under the prefix exactly once. ``page_size``: keys per request.

    Pages follow one another by ``StartAfter`` (the page's last key), not by continuation tokens: some
    S3-compatible stores (s3proxy) hand back a token they then misread for a key outside the Basic
    Multilingual Plane, and the listing would start over for ever."""
    listed_prefix = prefix if first is None else prefix + first
    start_after: str | None = None
    jumped: set[str] = set()
    while True:
        arguments = {"Bucket": bucket, "Prefix": listed_prefix, "MaxKeys": page_size,
                     **({"StartAfter": start_after} if start_after is not None else {})}
        page = client.list_objects_v2(**arguments)
        items = page.get("Contents", [])
        if first is not None:
            yield from items
        else:
            yield from (item for item in items if item["Key"] == prefix
                        or item["Key"][len(prefix):len(prefix) + 1] not in shards)
        if not page.get("IsTruncated") or not items:
            return
        last = items[-1]["Key"]
        if last == start_after:
            raise RuntimeError(f"the listing of {bucket}/{listed_prefix} does not move on past {last!r}")
        following = last
        character = last[len(prefix):len(prefix) + 1]
        if first is None and character and character in shards:
            # Among a shard's keys: jump past (nearly) all of them, once per shard; after that on from the
            # last key, so the listing always moves on in the store's own order (s3proxy's is UTF-16's,
            # not UTF-8's: keys with a character from U+E000 to U+FFFF come after the jump).
            jump = prefix + character + MAX_CHARACTER
            if jump > last and jump not in jumped:
                jumped.add(jump)
                following = jump
        start_after = following


def _list_task(config: PurgerConfig, prefix: str, dc: str, cutoff_ms: int, listed: Any,
               shards: Iterable[str | None]) -> Iterator[tuple[str, int, str | None]]:
    """One Spark task: its shards of a data centre's bucket, each blob under the prefix old enough by the
    listing as ``(id, last_modified_ms, etag)``. A key that is the prefix itself or ends in ``/`` (a
    folder's marker) names no object and is left alone."""
    client = _store(config, dc)
    bucket = config.stores[dc].bucket
    count = 0
    for first in shards:
        for item in list_shard(client, bucket, prefix, first):
            object_id = item["Key"][len(prefix):]
            if not object_id or object_id.endswith("/"):
                continue
            count += 1
            modified = epoch_ms(item["LastModified"])
            if modified < cutoff_ms:
                yield object_id, modified, item.get("ETag")
    listed.add(count)


def _listed(spark: SparkSession, config: PurgerConfig, prefix: str, dc: str, cutoff_ms: int,
            listed: Any) -> DataFrame:
    shards: list[str | None] = [*SHARD_CHARACTERS, None]
    tasks = min(len(shards), spark.sparkContext.defaultParallelism * 4)
    rows = spark.sparkContext.parallelize(shards, tasks).mapPartitions(
        partial(_list_task, config, prefix, dc, cutoff_ms, listed))
    return spark.createDataFrame(rows, _LISTED)


# --- 2. the table's ids -----------------------------------------------------------------------------------


def _scan_task(config: PurgerConfig, table: str, key: list[str], id_column: str, rate: float,
               ranges: Iterator[tuple[int, int]]) -> Iterator[tuple[str]]:
    settings = config.reconcile
    pacer = Pacer(rate)
    rows = scan_ranges(executor_session(config), config.cassandra.keyspace, table, key, [id_column], list(ranges),
                       settings.consistency, settings.page_size)
    for row in rows:
        pacer.wait()
        yield (str(row[id_column]),)


def _row_ids(spark: SparkSession, config: PurgerConfig, policy: Policy, blobs: Blobs, table: str) -> DataFrame:
    """The ids of every row of the blobs' table, read by token range on the executors."""
    settings = config.reconcile
    keyspace = config.cassandra.keyspace
    cores = spark.sparkContext.defaultParallelism
    try:
        key, ranges = scan_plan(config.cassandra, table, cores * 2 * settings.ranges_per_task)
    except LookupError as error:
        raise LookupError(f"orphan blobs of policies.{policy.name}: {error}; create it, or correct the "
                          "policy's table name") from None
    if key != [blobs.id_column]:
        raise LookupError(f"orphan blobs of policies.{policy.name}: {keyspace}.{table} is keyed by "
                          f"({', '.join(key)}), not by {blobs.id_column}: correct the policy's table name")
    tasks = max(1, len(ranges) // settings.ranges_per_task)
    rate = per_task_rate(settings.max_rows_per_second, tasks, cores)
    rows = spark.sparkContext.parallelize(ranges, tasks).mapPartitions(
        partial(_scan_task, config, table, key, blobs.id_column, rate))
    return spark.createDataFrame(rows, _IDS)


# --- 4. the decision, blob by blob ------------------------------------------------------------------------


def decide(config: PurgerConfig, sweep: Sweep, object_id: str, listed_ms: int, etag: str | None,
           retry: bool = False) -> tuple:
    """The decision on one blob the listing found without a row, old enough, as an ``OUTCOME_SCHEMA``
    tuple: the row read again at the serial consistency, then the blob's ``HEAD``, then the delete.
    ``retry``: the task is a retry, so a blob found gone was deleted by the attempt that failed."""
    blobs = sweep.blobs
    key = blobs.prefix + object_id

    def outcome(status: str, why: str | None = None, deleted_at_ms: int | None = None) -> tuple:
        return (sweep.policy, blobs.kind, object_id, ORPHAN, sweep.dc, status, why, listed_ms + sweep.grace_ms,
                now_ms(), deleted_at_ms, 0, _worker())

    try:
        from botocore.exceptions import ClientError

        client, bucket = _store(config, sweep.dc), config.stores[sweep.dc].bucket
        tables, read_row = _row_read(config, blobs, sweep.table)
        failpoint("before_orphan_delete")
        if tables.one(read_row, object_id) is not None:
            return outcome(SKIPPED, reason(PRESENT, f"its {sweep.table} row was written since the scan"))
        try:
            head = client.head_object(Bucket=bucket, Key=key)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                raise
            if retry and not sweep.dry_run:
                return outcome(PURGED, EARLIER_ATTEMPT, now_ms())
            return outcome(ALREADY_GONE)
        modified = epoch_ms(head["LastModified"])
        if modified > listed_ms or (etag and head.get("ETag") and head["ETag"] != etag):
            return outcome(SKIPPED, reason(NOT_YET_DUE, f"rewritten at {format_epoch_ms(modified)}, since the "
                                                        "listing"))
        if modified > now_ms() - sweep.grace_ms:
            return outcome(SKIPPED, reason(NOT_YET_DUE, f"last modified at {format_epoch_ms(modified)}, within "
                                                        "orphan_grace"))
        if sweep.dry_run:
            return outcome(WOULD_DELETE)
        client.delete_object(Bucket=bucket, Key=key)
        return outcome(PURGED, deleted_at_ms=now_ms())
    except Exception as error:  # a store or Cassandra that failed: this blob only, the next run tries again
        log.warning("orphan blob %s in %s: %s", key, sweep.dc, error)
        return outcome(ERROR, f"{type(error).__name__}: {error}")


def _decide_task(config: PurgerConfig, sweep: Sweep, rate: float, rows: Iterable[Any]) -> Iterator[tuple]:
    """One Spark task: its blobs decided, ``stream.delete_concurrency`` at a time, paced at ``rate``."""
    task = TaskContext.get()
    # Any second run of the partition (a task or stage retry) is a retry: what it finds gone, the first deleted.
    journal = CassandraJournal(executor_session(config), config.cassandra.keyspace, config.cassandra.journal_table)
    retry = not sweep.dry_run and not journal.first_start(sweep.query_id, task.partitionId() if task else 0)
    pacer = Pacer(rate)

    def paced(row: Any) -> Any:
        pacer.wait()
        return row

    concurrency = config.stream.delete_concurrency
    with ThreadPoolExecutor(concurrency, thread_name_prefix="orphans") as pool:
        yield from bounded_map(pool, lambda row: decide(config, sweep, row.id, row.last_modified_ms, row.etag, retry),
                               map(paced, rows), concurrency)


# --- the run ----------------------------------------------------------------------------------------------


def reconcile_orphans(spark: SparkSession, config: PurgerConfig, policy: Policy, run_id: str,
                      dry_run: bool) -> list[ReportRow]:
    """Delete the orphan blobs of ``policy`` (each of its ``Blobs``) in every data centre: a row of the
    report per ``Blobs`` and data centre, ``scanned`` the keys listed under the prefix, ``orphans_found``
    the blobs without a row older than ``reconcile.orphan_grace``, ``orphans_deleted`` those deleted (in
    a dry run, those that would be). Each decision is a ledger record."""
    report: list[ReportRow] = []
    ledger = Ledger(spark, config.ledger)
    for blobs in policy.blobs:
        table = policy.table_names()[blobs.table]
        ids: DataFrame | None = None
        try:
            for dc in sorted(config.stores):
                query_id = ledger_query_id(run_id, policy.name, table, dc)
                row = ReportRow(run_id, policy.name, table, dc, datetime.now(timezone.utc), dry_run=dry_run)
                if ledger.holds(query_id, 0):
                    _from_ledger(ledger, query_id, row)
                    log.info("orphan blobs of %s.%s in %s: recorded already by run %s", policy.name, table, dc,
                             run_id)
                else:
                    if ids is None:
                        ids = _row_ids(spark, config, policy, blobs, table).persist(StorageLevel.MEMORY_AND_DISK)
                    _sweep(spark, config, ledger, policy, blobs, table, dc, ids, query_id, dry_run, row)
                report.append(row.finish())
        finally:
            if ids is not None:
                ids.unpersist()
    return report


def _sweep(spark: SparkSession, config: PurgerConfig, ledger: Ledger, policy: Policy, blobs: Blobs, table: str,
           dc: str, ids: DataFrame, query_id: str, dry_run: bool, row: ReportRow) -> None:
    """One data centre's sweep: listed, anti-joined, decided and recorded; its counts into ``row``."""
    grace_ms = duration_ms(config.reconcile.orphan_grace)
    sweep = Sweep(policy.name, blobs, table, dc, grace_ms, now_ms() - grace_ms, dry_run, query_id)
    listed = spark.sparkContext.accumulator(0)
    orphans = _listed(spark, config, blobs.prefix, dc, sweep.cutoff_ms, listed).join(ids, "id", "left_anti")
    cores = spark.sparkContext.defaultParallelism
    tasks = max(1, cores)
    rate = per_task_rate(config.stream.max_deletions_per_second, tasks, cores)
    description = f"reconcile {policy.name}: orphan blobs of {table} in {dc}"
    spark.sparkContext.setJobDescription(description)
    try:
        # Computed once and kept: computing the outcomes again would delete again.
        outcomes = spark.createDataFrame(
            orphans.repartition(tasks).rdd.mapPartitions(partial(_decide_task, config, sweep, rate)),
            OUTCOME_SCHEMA,
        ).localCheckpoint(eager=True)
        by_status = {r["status"]: r["count"] for r in outcomes.groupBy("status").count().collect()}
        if by_status:
            spark.sparkContext.setJobDescription(f"{description}: ledger")
            ledger.append(outcomes, query_id, 0, first_attempt=True)
        outcomes.unpersist()
    finally:
        spark.sparkContext.setJobDescription(None)
    row.scanned = listed.value
    row.orphans_found = sum(by_status.values())
    row.orphans_deleted = by_status.get(WOULD_DELETE if dry_run else PURGED, 0)
    log.info("orphan blobs of %s.%s in %s: %d listed under %s, %d without a row past orphan_grace, %d %s, %s",
             policy.name, table, dc, row.scanned, blobs.prefix, row.orphans_found, row.orphans_deleted,
             "would be deleted (dry run)" if dry_run else "deleted",
             ", ".join(f"{count} {status}" for status, count in sorted(by_status.items())) or "no decision")


def _from_ledger(ledger: Ledger, query_id: str, row: ReportRow) -> None:
    """A sweep recorded already by a run of the same id: its counts, from its records."""
    counts = {r["status"]: r["count"] for r in ledger.records().where(F.col("query_id") == query_id)
              .groupBy("status").count().collect()}
    row.orphans_found = sum(counts.values())
    row.orphans_deleted = counts.get(WOULD_DELETE if row.dry_run else PURGED, 0)
