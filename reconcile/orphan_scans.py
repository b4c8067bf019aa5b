"""Orphans, step 2 (``reconcile.orphans``): a table's rows read whole by token range on the executors
(``reconcile.token_ranges``) at ``reconcile.consistency``, paced at ``reconcile.max_rows_per_second`` over all
tasks: a blobs table's ids, or a dependent table's rows with their parent's id and write time.

Example::

    ids = row_ids(spark, config, "orphan blobs of policies.mailbox", "payloads", "payload_id")   # id
    rows = dependents(spark, config, policy, policy.orphan_rows[0], "payload_refs", scanned)
    rows.columns                                                          # ['id', 'parent', 'written_ms']
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Iterator

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from purger.core.settings import PurgerConfig
from purger.core.policy import Policy
from purger.core.purge_protocol import key_id
from purger.core.reconcile_descriptors import OrphanRows
from purger.reconcile.token_ranges import scan_plan, scan_ranges
from purger.sinks.clients import executor_session
from purger.sinks.throttle import Pacer, per_task_rate

_IDS = StructType([StructField("id", StringType(), False)])
_ID_AND_COLUMN = StructType([StructField("id", StringType(), False), StructField("column", StringType())])
_DEPENDENTS = StructType([StructField("id", StringType(), False), StructField("parent", StringType(), False),
                          StructField("written_ms", LongType())])


def _scan_task(config: PurgerConfig, table: str, key: list[str], columns: list[str], rate: float,
               ranges: Iterator[tuple[int, int]]) -> Iterator[dict[str, Any]]:
    settings = config.reconcile
    pacer = Pacer(rate)
    rows = scan_ranges(executor_session(config), config.cassandra.keyspace, table, key, columns, list(ranges),
                       settings.consistency, settings.page_size)
    for row in rows:
        pacer.wait()
        yield row


def _scanned(spark: SparkSession, config: PurgerConfig, what: str, table: str, columns: list[str],
             keyed_by: list[str] | None, row: Callable[[dict[str, Any]], tuple]) -> DataFrame:
    """Every row of ``table`` read by token range on the executors (``columns``), each made a tuple by ``row``;
    ``keyed_by``: the partition key the table must have. ``LookupError`` naming ``what`` and the table."""
    settings = config.reconcile
    keyspace = config.cassandra.keyspace
    cores = spark.sparkContext.defaultParallelism
    try:
        plan = scan_plan(config.cassandra, table, cores, settings)
    except LookupError as error:
        raise LookupError(f"{what}: {error}; create it, or correct the policy's table name") from None
    if keyed_by is not None and plan.key != keyed_by:
        raise LookupError(f"{what}: {keyspace}.{table} is keyed by ({', '.join(plan.key)}), not by "
                          f"({', '.join(keyed_by)}): correct the policy's table name")
    rate = per_task_rate(settings.max_rows_per_second, plan.tasks, cores)
    return spark.sparkContext.parallelize(plan.ranges, plan.tasks).mapPartitions(
        partial(_scan_task, config, table, plan.key, columns, rate)).map(row)


def row_ids(spark: SparkSession, config: PurgerConfig, what: str, table: str, id_column: str) -> DataFrame:
    """The ids of every row of a table keyed by ``id_column``, read by token range on the executors."""
    rows = _scanned(spark, config, what, table, [id_column], [id_column], lambda row: (str(row[id_column]),))
    return spark.createDataFrame(rows, _IDS)


def id_and_column(spark: SparkSession, config: PurgerConfig, what: str, table: str, id_column: str, column: str
                  ) -> DataFrame:
    """Each row's ``id`` and ``column`` (as text, null kept) of a table keyed by ``id_column``, read by token
    range on the executors: an erasure's scan for a subject's rows (``purger.erase``)."""
    rows = _scanned(spark, config, what, table, [id_column, column], [id_column],
                    lambda row: (str(row[id_column]), None if row[column] is None else str(row[column])))
    return spark.createDataFrame(rows, _ID_AND_COLUMN)


def _row_id(orphans: OrphanRows, row: dict[str, Any]) -> str:
    """A dependent row's id in the ledger (``key_id``)."""
    return key_id(row[column] for column in orphans.key)


def dependents(spark: SparkSession, config: PurgerConfig, policy: Policy, orphans: OrphanRows,
                table: str, scanned: Any) -> DataFrame:
    """Every row of an ``OrphanRows`` table: its id, its parent's id and its write time (ms; None: none)."""
    written = [f"maxwritetime({orphans.written}) AS written"] if orphans.written else []

    def row(found: dict[str, Any]) -> tuple:
        scanned.add(1)
        at = found.get("written")
        return _row_id(orphans, found), str(found[orphans.parent_key]), None if at is None else at // 1000

    return spark.createDataFrame(
        _scanned(spark, config, f"orphan rows of policies.{policy.name}", table, [*orphans.key, *written], None, row),
        _DEPENDENTS)

