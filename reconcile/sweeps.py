"""Orphans, steps 3 to 5 (``reconcile.orphans``): a sweep, what a run does with the orphans it found (a DataFrame
of the blobs without a row, or the dependent rows without a parent).

One sweep of a bucket or table at a time, whatever the processes (the scheduled reconcile and a `purger
reconcile`): a sweep that deletes holds a lease in the journal (a lightweight transaction), renewed while it
runs; a sweep that finds the lease held by another sweeps nothing and says so in a line. Under the lease, it
notes itself in the journal as under way, has the orphans decided on the executors
(``reconcile.orphan_purges``, each blob or row noted before its delete), and records every decision in one
ledger write named ``reconcile-<run id>-<policy>.<table>-<dc>``, batch 0. The next sweep of the same bucket or
table records the deletions of one that never reached its ledger write (a purger stopped, a job failed): each
noted orphan that is gone, from the sweep's intent. A sweep whose write is in the ledger already is not swept
again by a run of the same id (``recorded_already``), so a re-run adds nothing twice.

Example::

    if not recorded_already(ledger, sweep, row, run_id):
        sweep_orphans(spark, config, ledger, sweep, "mailbox.payloads/dc1/bucket", found, row)   # counts into row
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from contextlib import contextmanager, nullcontext
from functools import partial
from typing import Iterator

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from purger.core.settings import PurgerConfig
from purger.core.failpoints import failpoint
from purger.core.purge_protocol import SELF, Candidate, recorded_from_intent
from purger.core.reconcile_descriptors import Blobs
from purger.core.vocabulary import ALL_DCS, ORPHAN, PURGED, WOULD_DELETE
from purger.reconcile.orphan_purges import (SWEEP_DELETES, ClaimingOrphanRowPurge, Sweep, decide_task, orphan_outcome,
                                            orphan_purge)
from purger.reconcile.verdict import ReportRow
from purger.sinks.clients import executor_session
from purger.sinks.journal import CassandraJournal
from purger.sinks.ledger import Ledger
from purger.sinks.purge import OUTCOME_SCHEMA
from purger.sinks.sink import outcome_storage
from purger.sinks.throttle import per_task_rate

log = logging.getLogger(__name__)

# The journal's notes of the sweeps under way (``CassandraJournal.note``), per bucket or table. Not an
# identifier, so no policy's kind of object.
OPEN_SWEEPS = "(orphan sweeps)"
# The leases of the sweeps (``CassandraJournal.lease``), per bucket or table. A sweep renews its lease every
# quarter of it; one whose process died holds its bucket or table until the lease runs out.
SWEEP_LEASES = "(orphan sweep lease)"
SWEEP_LEASE_S = 120


class SweepUnderWay(Exception):
    """Another sweep holds the lease of the bucket or table (its name: the exception's argument)."""


@contextmanager
def _leased(journal: CassandraJournal, sweeps_key: str, holder: str) -> Iterator[threading.Event]:
    """The sweeps of ``sweeps_key`` to ``holder`` alone while the block runs: the lease taken (``SweepUnderWay``
    if another sweep holds it), renewed, and given up at the end. The event it gives is set if the lease was lost
    meanwhile (a renewal found another holder, or none succeeded for as long as a lease lasts): another sweep may
    then have recorded some of this one's deletions."""
    other = journal.lease(SWEEP_LEASES, sweeps_key, holder, SWEEP_LEASE_S)
    if other is not None:
        raise SweepUnderWay(other)
    lost, done = threading.Event(), threading.Event()

    def renew() -> None:
        renewed = time.monotonic()
        while not done.wait(SWEEP_LEASE_S / 4):
            try:
                if journal.lease(SWEEP_LEASES, sweeps_key, holder, SWEEP_LEASE_S) is not None:
                    lost.set()
                renewed = time.monotonic()
            except Exception as error:  # Cassandra unreachable for a moment: tried again at the next renewal
                log.warning("orphan sweep %s: its lease of %s not renewed: %s", holder, sweeps_key, error)
                if time.monotonic() - renewed >= SWEEP_LEASE_S:
                    lost.set()

    renewing = threading.Thread(target=renew, name=f"purger-sweep-lease {sweeps_key}", daemon=True)
    renewing.start()
    try:
        yield lost
    finally:
        done.set()
        renewing.join()
        try:
            journal.give_up(SWEEP_LEASES, sweeps_key, holder)
        except Exception as error:  # the sweep's own outcome goes on; the lease runs out on its own
            log.warning("orphan sweep %s: its lease of %s not given up (it runs out within %d s): %s", holder,
                        sweeps_key, SWEEP_LEASE_S, error)


def recorded_already(ledger: Ledger, sweep: Sweep, row: ReportRow, run_id: str) -> bool:
    """Whether a run of the same id recorded the sweep already (its counts then into ``row``, from its records):
    a re-run sweeps nothing twice."""
    if not ledger.holds(sweep.query_id, 0):
        return False
    counts = {r["status"]: r["count"] for r in ledger.batch(sweep.query_id, 0).groupBy("status").count().collect()}
    row.orphans_found = sum(counts.values())
    row.orphans_deleted = counts.get(WOULD_DELETE if row.dry_run else PURGED, 0)
    log.info("orphans of %s.%s in %s: recorded already by run %s", sweep.policy, sweep.table,
             sweep.dc or ALL_DCS, run_id)
    return True


def sweep_orphans(spark: SparkSession, config: PurgerConfig, ledger: Ledger, sweep: Sweep, sweeps_key: str,
                  found: DataFrame, row: ReportRow) -> None:
    """A sweep's orphans (``found``: id, at_ms, etag) decided and recorded; its counts into ``row``.
    ``sweeps_key``: what its sweeps are of (a bucket, a table), for the journal's notes of those under way."""
    cores = spark.sparkContext.defaultParallelism
    tasks = max(1, cores)
    rate = per_task_rate(config.stream.max_deletions_per_second, tasks, cores)
    what = f"orphan {'blobs' if isinstance(sweep.orphans, Blobs) else 'rows'} of {sweep.table}"
    where = f" in {sweep.dc}" if sweep.dc else ""
    description = f"reconcile {sweep.policy}: {what}{where}"
    spark.sparkContext.setJobDescription(description)
    journal = CassandraJournal(executor_session(config), config.cassandra.keyspace, config.cassandra.journal_table)
    by_status: Counter[str] = Counter()
    try:
        # A dry run deletes nothing, and so takes no lease and notes nothing.
        with nullcontext(None) if sweep.dry_run else _leased(journal, sweeps_key, sweep.query_id) as lost:
            if not sweep.dry_run:
                _record_stopped_sweeps(spark, config, ledger, journal, sweep, sweeps_key)
                journal.note(OPEN_SWEEPS, sweeps_key, {sweep.query_id})
            # Computed once and kept (in two executors on a cluster): computing the outcomes again would delete
            # again.
            outcomes = spark.createDataFrame(
                found.repartition(tasks).rdd.mapPartitions(partial(decide_task, config, sweep, rate)),
                OUTCOME_SCHEMA,
            ).localCheckpoint(eager=True, storageLevel=outcome_storage(spark))
            counted = outcomes.groupBy("status", F.col("intent").isNotNull().alias("from_intent")).count().collect()
            for counts in counted:
                by_status[counts["status"]] += counts["count"]
            if by_status:
                spark.sparkContext.setJobDescription(f"{description}: ledger")
                failpoint("before_orphan_ledger_write")
                # Records the ledger may hold: a task run again finds its orphans gone after their intents; a
                # sweep that lost its lease may have had some recorded by the sweep that took it.
                may_hold = any(counts["from_intent"] for counts in counted) or bool(lost and lost.is_set())
                ledger.append(outcomes, sweep.query_id, 0, may_hold=may_hold)
            outcomes.unpersist()
            if not sweep.dry_run:
                _release_claims(config, sweep, sweep.query_id)
                journal.unnote(OPEN_SWEEPS, sweeps_key, {sweep.query_id})
    except SweepUnderWay as holder:
        log.warning("%s of %s%s: sweep %s holds %s, so this run sweeps nothing there (the next run sweeps what is "
                    "left; the lease of a sweep whose process died runs out within %d s)", what, sweep.policy, where,
                    holder, sweeps_key, SWEEP_LEASE_S)
    finally:
        spark.sparkContext.setJobDescription(None)
    row.orphans_found = sum(by_status.values())
    row.orphans_deleted = by_status.get(WOULD_DELETE if sweep.dry_run else PURGED, 0)
    log.info("%s of %s%s: %d past orphan_grace, %d %s, %s", what, sweep.policy, where, row.orphans_found,
             row.orphans_deleted, "would be deleted (dry run)" if sweep.dry_run else "deleted",
             ", ".join(f"{count} {status}" for status, count in sorted(by_status.items())) or "no decision")


def _record_stopped_sweeps(spark: SparkSession, config: PurgerConfig, ledger: Ledger, journal: CassandraJournal,
                           sweep: Sweep, sweeps_key: str) -> None:
    """The deletions of earlier sweeps of the same bucket or table that never reached their ledger write (a
    purger stopped mid-sweep, a job failed): each orphan such a sweep noted and that is gone now, recorded under
    that sweep, from its intent (the same record as its own, had it been written; the ledger keeps one)."""
    purge = orphan_purge(config, sweep)
    for earlier in sorted(journal.noted(OPEN_SWEEPS, sweeps_key) - {sweep.query_id}):
        if not ledger.holds(earlier, 0):
            gone = [found for found in sorted(journal.noted(SWEEP_DELETES, earlier))
                    if purge.read(Candidate(sweep.kind, found, ORPHAN, 0), serial=True) is None]
            records = [orphan_outcome(sweep, found, None, outcome) for found in gone
                       for outcome in recorded_from_intent({SELF: f"{earlier}/0"})]
            if records:
                ledger.append(spark.createDataFrame(records, OUTCOME_SCHEMA), earlier, 0)
            log.warning("orphans of %s in %s: sweep %s stopped before its ledger write; %d of its deletions "
                        "recorded now", sweep.table, sweep.dc or ALL_DCS, earlier, len(records))
        _release_claims(config, sweep, earlier)
        journal.unnote(OPEN_SWEEPS, sweeps_key, {earlier})


def _release_claims(config: PurgerConfig, sweep: Sweep, query_id: str) -> None:
    """The claims on absent parents that the sweep ``query_id`` of ``sweep``'s table made, removed once none of
    its deletions can still run: at its end, or by the next sweep under the lease when it stopped before."""
    purge = orphan_purge(config, sweep)
    if isinstance(purge, ClaimingOrphanRowPurge):
        released = purge.release_claims(query_id)
        if released:
            log.info("orphan rows of %s: %d claims of sweep %s on absent %s rows released", sweep.table, released,
                     query_id, purge.orphans.parent)
