"""Orphans (docs/reconciliation.md, points 5 and 8.1): blobs under a policy's prefix (``Policy.blobs``) that
no row of its table names, and dependent rows whose parent row is gone (``Policy.orphan_rows``), deleted once
older than ``reconcile.orphan_grace``, each through the engine's one purge protocol and recorded.

Orphan rows: per ``OrphanRows`` of the policy, one Spark job scans the table by token range (its key and the
write time of its ``written`` column) and its parent's ids, anti-joins them, and decides each row without a
parent by ``OrphanRowPurge`` (the row and its parent read again at the serial consistency just before the
delete), recorded as below in one write named ``reconcile-<run id>-<policy>.<table>-all``. A reconcile runs them
before its scans, so a payload a dangling reference pinned is released by the payloads scan that follows.

For each ``Blobs`` of the policy and each data centre, one Spark job, a module a step:

1. **List** the data centre's bucket under the prefix in Spark tasks (``reconcile.orphan_listing``), split
   by the first character after the prefix: a shard per letter and digit and a catch-all for every other
   first character, so each key under the prefix is listed exactly once and no key outside it at all.
   Blobs younger than the grace are dropped at once.
2. **Scan** the table's ids by token range (``reconcile.orphan_scans``) at ``reconcile.consistency``,
   paced at ``reconcile.max_rows_per_second`` over all tasks; scanned once per ``Blobs`` and kept for
   every data centre.
3. **Anti-join** the two in Spark: the blobs left have no row. Nothing is collected on the driver.
4. **Decide** each on the executors (``reconcile.orphan_purges``), paced at
   ``stream.max_deletions_per_second`` over all tasks: just before the delete, the row is read again at the
   serial consistency, then the blob's age (``HEAD``); a row that appeared, or a blob rewritten since the
   listing or younger than the grace, keeps it (``skipped``). Otherwise it is deleted (a dry run:
   ``would_delete``). The re-read of the row comes first and the ``HEAD`` last, so an upload (its blob
   first, then its row) that starts after the listing is caught by one of the two, whichever the moment.
5. **Record** every decision (``reconcile.sweeps``), one ledger record each (rule ``orphan``, its data
   centre), in one write per data centre named ``reconcile-<run id>-<policy>.<table>-<dc>``, batch 0: a
   data centre whose write is in the ledger already is not swept again by a run of the same id, so a
   re-run adds nothing twice. A sweep notes itself in the journal as under way, and each blob it is about
   to delete; the next sweep of the same bucket records the deletions of one that never reached its ledger
   write (a purger stopped, a job failed): each noted blob that is gone, from the sweep's intent.

One sweep of a bucket or table at a time, whatever the processes (the scheduled reconcile and a `purger
reconcile`): a sweep that deletes holds a lease in the journal (``reconcile.sweeps``). Only under the lease is
a sweep noted as under way taken for one that stopped.

Example::

    report = reconcile_orphans(spark, config, config.policy_set.policies[0], run_id, dry_run=False)
    [(r.dc, r.orphans_found, r.orphans_deleted) for r in report]   # [('dc1', 3, 3), ('dc2', 1, 1)]
    reconcile_orphan_rows(spark, config, policy, run_id, dry_run=False)   # [ReportRow(table='payload_refs', ...)]
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from purger.core.settings import PurgerConfig
from purger.core.policy import Policy
from purger.core.times import duration_ms, now_ms
from purger.core.vocabulary import ALL_DCS
from purger.reconcile.orphan_listing import listed_blobs, noncurrent_versions
from purger.reconcile.orphan_purges import Sweep, ledger_query_id
from purger.reconcile.orphan_scans import dependents, row_ids
from purger.reconcile.sweeps import recorded_already, sweep_orphans
from purger.reconcile.verdict import ReportRow
from purger.sinks.ledger import Ledger

log = logging.getLogger(__name__)


def reconcile_orphans(spark: SparkSession, config: PurgerConfig, policy: Policy, run_id: str,
                      dry_run: bool) -> list[ReportRow]:
    """Delete the orphan blobs of ``policy`` (each of its ``Blobs``) in every data centre: a row of the
    report per ``Blobs`` and data centre, ``scanned`` the keys listed under the prefix, ``orphans_found``
    the blobs without a row older than ``reconcile.orphan_grace``, ``orphans_deleted`` those deleted (in
    a dry run, those that would be). Each decision is a ledger record."""
    report: list[ReportRow] = []
    ledger = Ledger(spark, config.ledger)
    grace_ms = duration_ms(config.reconcile.orphan_grace)
    for blobs in policy.blobs:
        table = policy.table_names()[blobs.table]
        ids: DataFrame | None = None
        try:
            for dc in sorted(config.stores):
                sweep = Sweep(policy.name, blobs, table, dc, grace_ms, now_ms() - grace_ms, dry_run,
                              ledger_query_id(run_id, policy.name, table, dc))
                row = ReportRow(run_id, policy.name, table, dc, datetime.now(timezone.utc), dry_run=dry_run)
                if not recorded_already(ledger, sweep, row, run_id):
                    if ids is None:
                        ids = row_ids(spark, config, f"orphan blobs of policies.{policy.name}", table,
                                       blobs.id_column).persist(StorageLevel.MEMORY_AND_DISK)
                    listed = spark.sparkContext.accumulator(0)
                    found = listed_blobs(spark, config, blobs.prefix, dc, sweep.cutoff_ms, listed).join(
                        ids, "id", "left_anti")
                    sweep_orphans(spark, config, ledger, sweep,
                                  f"{policy.name}.{table}/{dc}/{config.stores[dc].bucket}",
                                  found.select("id", F.col("last_modified_ms").alias("at_ms"), "etag"), row)
                    row.scanned = listed.value
                    row.noncurrent_versions, row.noncurrent_bytes = noncurrent_versions(spark, config, blobs.prefix, dc)
                    if row.noncurrent_versions:
                        log.info("orphan blobs of %s in %s: %d noncurrent versions under %s (%d bytes), what deletes "
                                 "left in a bucket that keeps versions", policy.name, dc, row.noncurrent_versions,
                                 blobs.prefix, row.noncurrent_bytes)
                report.append(row.finish())
        finally:
            if ids is not None:
                ids.unpersist()
    return report


def reconcile_orphan_rows(spark: SparkSession, config: PurgerConfig, policy: Policy, run_id: str,
                          dry_run: bool) -> list[ReportRow]:
    """Delete the dependent rows of ``policy`` whose parent row is gone (each of its ``OrphanRows``): a row of
    the report per table, ``scanned`` its rows, ``orphans_found`` those without a parent written before the
    grace (or with no write time), ``orphans_deleted`` those deleted (in a dry run, those that would be). Each
    decision is a ledger record."""
    report: list[ReportRow] = []
    ledger = Ledger(spark, config.ledger)
    grace_ms = duration_ms(config.reconcile.orphan_grace)
    names = policy.table_names()
    for orphans in policy.orphan_rows:
        table = names[orphans.table]
        sweep = Sweep(policy.name, orphans, table, None, grace_ms, now_ms() - grace_ms, dry_run,
                      ledger_query_id(run_id, policy.name, table, ALL_DCS), tuple(sorted(names.items())))
        row = ReportRow(run_id, policy.name, table, ALL_DCS, datetime.now(timezone.utc), dry_run=dry_run)
        if not recorded_already(ledger, sweep, row, run_id):
            what = f"orphan rows of policies.{policy.name}"
            scanned = spark.sparkContext.accumulator(0)
            parents = row_ids(spark, config, what, names[orphans.parent], orphans.parent_key)
            found = (dependents(spark, config, policy, orphans, table, scanned)
                     .join(parents, F.col("parent") == parents["id"], "left_anti")
                     .where(F.col("written_ms").isNull() | (F.col("written_ms") < sweep.cutoff_ms)))
            sweep_orphans(spark, config, ledger, sweep, f"{policy.name}.{table}/{ALL_DCS}",
                          found.select("id", F.col("written_ms").alias("at_ms"),
                                       F.lit(None).cast("string").alias("etag")), row)
            row.scanned = scanned.value
        report.append(row.finish())
    return report
