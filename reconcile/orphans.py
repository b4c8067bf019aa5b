"""Orphans (docs/reconciliation.md, points 5 and 8.1): blobs under a policy's prefix (``Policy.blobs``) that
no row of its table names, and dependent rows whose parent row is gone (``Policy.orphan_rows``), deleted once
older than ``reconcile.orphan_grace``, each through the engine's one purge protocol and recorded.

Orphan rows: per ``OrphanRows`` of the policy, one Spark job scans the table by token range (its key and the
write time of its ``written`` column) and its parent's ids, anti-joins them, and decides each row without a
parent by ``OrphanRowPurge`` (the row and its parent read again at the serial consistency just before the
delete), recorded as below in one write named ``reconcile-<run id>-<policy>.<table>-all``. A reconcile runs them
before its scans, so a payload a dangling reference pinned is released by the payloads scan that follows.

For each ``Blobs`` of the policy and each data centre, one Spark job:

1. **List** the data centre's bucket under the prefix in Spark tasks, split by the first character
   after the prefix: a shard per letter and digit (``ListObjectsV2`` with ``Prefix=<prefix><c>``) and a
   catch-all for every other first character (``list_shard``), so each key under the prefix is listed
   exactly once and no key outside it at all. Blobs younger than the grace are dropped at once.
2. **Scan** the table's ids by token range (``reconcile.token_ranges``) at ``reconcile.consistency``,
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
   twice. A sweep notes itself in the journal as under way, and each blob it is about to delete; the
   next sweep of the same bucket records the deletions of one that never reached its ledger write (a
   purger stopped, a job failed): each noted blob that is gone, from the sweep's intent.

One sweep of a bucket or table at a time, whatever the processes (the scheduled reconcile and a `purger
reconcile`): a sweep that deletes holds a lease in the journal (a lightweight transaction), renewed while it
runs; a sweep that finds the lease held by another sweeps nothing and says so in a line. Only under the lease
is a sweep noted as under way taken for one that stopped.

Example::

    report = reconcile_orphans(spark, config, config.policy_set.policies[0], run_id, dry_run=False)
    [(r.dc, r.orphans_found, r.orphans_deleted) for r in report]   # [('dc1', 3, 3), ('dc2', 1, 1)]
    reconcile_orphan_rows(spark, config, policy, run_id, dry_run=False)   # [ReportRow(table='payload_refs', ...)]
"""

from __future__ import annotations

import json
import logging
import os
import socket
import string
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from typing import Any, Callable, Iterable, Iterator

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from purger.connectors import CassandraTables, s3_client
from purger.core.config import PurgerConfig
from purger.core.failpoints import failpoint
from purger.core.events import Eligibility
from purger.core.handles import Control, Resources
from purger.core.policy import Policy
from purger.core.purge_protocol import SELF, Attempt, Candidate, ObjectPurge, Outcome, key_id, recorded_from_intent
from purger.core.reconcile_descriptors import Blobs, OrphanRows
from purger.core.times import duration_ms, epoch_ms, format_epoch_ms, now_ms
from purger.core.vocabulary import (
    ALL_DCS, ERROR, NOT_YET_DUE, ORPHAN, PRESENT, PURGED, WOULD_DELETE, reason,
)
from purger.reconcile.token_ranges import scan_plan, scan_ranges
from purger.reconcile.verdict import ReportRow
from purger.sinks.clients import executor_session
from purger.sinks.failures import CassandraFailures
from purger.sinks.holds import CassandraHolds
from purger.sinks.journal import CassandraJournal
from purger.sinks.ledger import Ledger
from purger.sinks.purge import OUTCOME_SCHEMA
from purger.sinks.sink import outcome_storage
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
    """A sweep of a policy's orphans, as its executor tasks see it: the policy, what it sweeps (one data
    centre's ``Blobs``, or ``OrphanRows`` in every data centre: ``dc`` None), the table by its configured name,
    the policy's table names (reference -> configured), the grace and the run's cutoff (what was last written
    before it is old enough), whether it deletes, and its name in the ledger."""

    policy: str
    orphans: Blobs | OrphanRows
    table: str
    dc: str | None
    grace_ms: int
    cutoff_ms: int
    dry_run: bool
    query_id: str
    tables: tuple[tuple[str, str], ...] = ()

    @property
    def kind(self) -> str:
        """What its ledger records name: the blobs' kind of object, or the orphan rows' table (reference name)."""
        return self.orphans.kind if isinstance(self.orphans, Blobs) else self.orphans.table


# The journal's notes of the sweeps (``CassandraJournal.note``): per bucket, the sweeps under way; per sweep,
# the blobs it is about to delete. Not identifiers, so no policy's kind of object.
OPEN_SWEEPS = "(orphan sweeps)"
SWEEP_DELETES = "(orphan sweep)"
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


def ledger_query_id(run_id: str, policy: str, table: str, dc: str) -> str:
    """The name of a run's ledger write for one data centre of a policy's blobs table, or (``dc`` ``all``) of
    its orphan rows of a table (batch 0)."""
    return f"reconcile-{run_id}-{policy}.{table}-{dc}"


# --- each executor process's clients, per configuration ---------------------------------------------------

_lock = threading.Lock()
_s3: dict[tuple[str, str], Any] = {}


def _store(config: PurgerConfig, dc: str) -> Any:
    """This process's S3 client for a data centre's store, made once per configuration."""
    with _lock:
        if (config.key, dc) not in _s3:
            _s3[config.key, dc] = s3_client(config.stores[dc])
        return _s3[config.key, dc]


# A process's purges of the sweeps it decides for, newest last: a run's sweeps, a few runs at the most.
_purges: dict[tuple[str, Sweep], "OrphanBlobPurge"] = {}
_PURGES_KEPT = 16


def _orphan_purge(config: PurgerConfig, sweep: Sweep) -> "OrphanBlobPurge | OrphanRowPurge":
    """This process's purge of a sweep's orphans, its statements prepared once."""
    session = executor_session(config)
    store = _store(config, sweep.dc) if isinstance(sweep.orphans, Blobs) else None
    with _lock:
        key = (config.key, sweep)
        if key not in _purges:
            journal = CassandraJournal(session, config.cassandra.keyspace, config.cassandra.journal_table)
            resources = Resources(partial(CassandraTables, session, config.cassandra.keyspace), None, _NoRecheck(),
                                  journal, CassandraHolds.of(session, config.cassandra),
                                  CassandraFailures.of(session, config), duration_ms(config.stream.retry_interval),
                                  sweep.dry_run)
            if isinstance(sweep.orphans, Blobs):
                _purges[key] = OrphanBlobPurge(resources, store, config.stores[sweep.dc].bucket, sweep)
            else:
                _purges[key] = OrphanRowPurge(resources, sweep)
            while len(_purges) > _PURGES_KEPT:
                del _purges[next(iter(_purges))]
        return _purges[key]


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


# --- 2. the tables' rows ----------------------------------------------------------------------------------


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


def _row_ids(spark: SparkSession, config: PurgerConfig, what: str, table: str, id_column: str) -> DataFrame:
    """The ids of every row of a table keyed by ``id_column``, read by token range on the executors."""
    rows = _scanned(spark, config, what, table, [id_column], [id_column], lambda row: (str(row[id_column]),))
    return spark.createDataFrame(rows, _IDS)


def _row_id(orphans: OrphanRows, row: dict[str, Any]) -> str:
    """A dependent row's id in the ledger (``key_id``)."""
    return key_id(row[column] for column in orphans.key)


def _dependents(spark: SparkSession, config: PurgerConfig, policy: Policy, orphans: OrphanRows,
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


_DEPENDENTS = StructType([StructField("id", StringType(), False), StructField("parent", StringType(), False),
                          StructField("written_ms", LongType())])


# --- 4. the decision, one by one --------------------------------------------------------------------------


@dataclass(frozen=True)
class Blob:
    """What the double-check reads of an orphan blob: whether its table's row appeared since the scan, and the
    blob's own age and version (its ``HEAD``)."""

    row_present: bool
    modified_ms: int
    etag: str | None


# What holds name an orphan by: nothing. Its parent row is gone, and with it every scope a policy reads from it; a
# hold on what the orphan belonged to kept that row (``ObjectPurge.scopes``).
NO_SCOPE: list[str] = []


class OrphanBlobPurge(ObjectPurge[Blob]):
    """An orphan blob of one data centre, deleted through the engine's one protocol (``ObjectPurge``): read
    (the row again at the serial consistency, then the blob's ``HEAD``), due?, dry run, the intent in the
    journal, delete. Its check comes just before its delete, as a ``deletes_first`` kind's conditional delete
    would (S3 has none): the re-read of the row first and the ``HEAD`` last, so an upload (its blob first,
    then its row) that starts after the listing is caught by one of the two, whichever the moment."""

    deletes_first = True

    def __init__(self, resources: Resources, store: Any, bucket: str, sweep: Sweep) -> None:
        blobs = sweep.orphans
        super().__init__(resources, {blobs.table: sweep.table})
        self.sweep, self.prefix = sweep, blobs.prefix
        self.store, self.bucket = store, bucket
        self.read_row = self.tables.prepare(
            f"SELECT {blobs.id_column} FROM {{{blobs.table}}} WHERE {blobs.id_column} = ? LIMIT 1", "serial")

    def candidate(self, object_id: str, listed_ms: int, etag: str | None) -> Candidate:
        """A blob the listing found without a row, last modified at ``listed_ms``."""
        return Candidate(self.sweep.kind, object_id, ORPHAN, listed_ms + self.sweep.grace_ms,
                         {"listed_ms": listed_ms, "etag": etag})

    def read(self, candidate: Candidate, serial: bool = False) -> Blob | None:
        if not serial:
            failpoint("before_orphan_delete")
        row_present = self.tables.one(self.read_row, candidate.id) is not None
        head = _head(self.store, self.bucket, self.prefix + candidate.id)
        return None if head is None else Blob(row_present, epoch_ms(head["LastModified"]), head.get("ETag"))

    def due(self, candidate: Candidate, row: Blob) -> Eligibility | None:
        if row.row_present or self._rewritten(candidate, row):
            return None
        return Eligibility(ORPHAN, row.modified_ms + self.sweep.grace_ms)

    def why_kept(self, candidate: Candidate, row: Blob, due: Eligibility | None) -> str:
        if row.row_present:
            return reason(PRESENT, f"its {self.sweep.table} row was written since the scan")
        modified = format_epoch_ms(row.modified_ms)
        if self._rewritten(candidate, row):
            return reason(NOT_YET_DUE, f"rewritten at {modified}, since the listing")
        return reason(NOT_YET_DUE, f"last modified at {modified}, within orphan_grace")

    def delete(self, candidate: Candidate, row: Blob) -> bool:
        self.resources.journal.note(SWEEP_DELETES, self.sweep.query_id, {candidate.id})
        self.store.delete_object(Bucket=self.bucket, Key=self.prefix + candidate.id)
        return True

    def scopes(self, candidate: Candidate, row: Any) -> list[str]:
        return NO_SCOPE

    def journalled_as(self, candidate: Candidate) -> tuple[str, str]:
        # Not a kind of object: an orphan blob's intent never meets its payload's own purge's.
        return f"{ORPHAN} {candidate.kind}", f"{self.sweep.dc}/{candidate.id}"

    @staticmethod
    def _rewritten(candidate: Candidate, row: Blob) -> bool:
        listed_etag = candidate.hint.get("etag")
        return row.modified_ms > candidate.hint["listed_ms"] or bool(listed_etag and row.etag
                                                                     and row.etag != listed_etag)


# The journal's notes of when a reconcile first found a dependent row without its parent, for a row without a
# write time of its own (``OrphanRows.written``): per table and row, the moments (ms) it was found so.
FIRST_FOUND = "(orphan row found)"


@dataclass(frozen=True)
class DependentRow:
    """What the double-check reads of a dependent row: whether its parent row is there, and when the row was
    written (or first found without its parent)."""

    parent_present: bool
    written_ms: int


class OrphanRowPurge(ObjectPurge[DependentRow]):
    """A dependent row whose parent row is gone (``OrphanRows``), deleted through the engine's one protocol:
    read (the row, then its parent, both at the serial consistency), due? (its write time past the grace),
    dry run, the intent in the journal, then ``DELETE ... IF EXISTS``, so a row another writer removed in
    between is not recorded as the purger's. A parent that reappeared keeps it."""

    deletes_first = True

    def __init__(self, resources: Resources, sweep: Sweep) -> None:
        orphans = sweep.orphans
        super().__init__(resources, dict(sweep.tables))
        self.sweep, self.orphans = sweep, orphans
        where = " AND ".join(f"{column} = ?" for column in orphans.key)
        written = f"maxwritetime({orphans.written}) AS written" if orphans.written else orphans.key[0]
        self.read_row = self.tables.prepare(f"SELECT {written} FROM {{{orphans.table}}} WHERE {where}", "serial")
        self.read_parent = self.tables.prepare(
            f"SELECT {orphans.parent_key} FROM {{{orphans.parent}}} WHERE {orphans.parent_key} = ? LIMIT 1", "serial")
        self.delete_row = self.tables.prepare(f"DELETE FROM {{{orphans.table}}} WHERE {where} IF EXISTS")

    def candidate(self, object_id: str, written_ms: int | None, etag: str | None = None) -> Candidate:
        """A row the scan found without its parent, written at ``written_ms`` (None: not known yet)."""
        due_at = now_ms() if written_ms is None else written_ms + self.sweep.grace_ms
        return Candidate(self.sweep.kind, object_id, ORPHAN, due_at)

    def scopes(self, candidate: Candidate, row: Any) -> list[str]:
        return NO_SCOPE

    def _key(self, candidate: Candidate) -> list[Any]:
        return json.loads(candidate.id) if len(self.orphans.key) > 1 else [candidate.id]

    def read(self, candidate: Candidate, serial: bool = False) -> DependentRow | None:
        key = self._key(candidate)
        found = self.tables.one(self.read_row, *key)
        if found is None:
            return None
        parent_id = key[self.orphans.key.index(self.orphans.parent_key)]
        parent_present = self.tables.one(self.read_parent, parent_id) is not None
        written = getattr(found, "written", None) if self.orphans.written else None
        if written is not None:
            return DependentRow(parent_present, written // 1000)
        return DependentRow(parent_present, self._first_found(candidate, parent_present))

    def _first_found(self, candidate: Candidate, parent_present: bool) -> int:
        """When a reconcile first found the row without its parent (now, if none did before); no earlier than
        its write, so its grace runs no sooner than from that. A parent present clears what was found. The notes
        are the real sweeps' (one journal for both): a dry run reads them, to decide as a real run would, and
        writes and clears none, so that it never moves a real sweep's deletion."""
        journal, now = self.resources.journal, now_ms()
        found = {int(moment) for moment in journal.noted(FIRST_FOUND, self._noted_as(candidate))}
        if parent_present:
            if found and not self.resources.dry_run:
                journal.unnote(FIRST_FOUND, self._noted_as(candidate), {str(moment) for moment in found})
            return now
        if not found and not self.resources.dry_run:
            journal.note(FIRST_FOUND, self._noted_as(candidate), {str(now)})
        return min(found, default=now)

    def _noted_as(self, candidate: Candidate) -> str:
        return f"{self.sweep.table}/{candidate.id}"

    def due(self, candidate: Candidate, row: DependentRow) -> Eligibility | None:
        return None if row.parent_present else Eligibility(ORPHAN, row.written_ms + self.sweep.grace_ms)

    def why_kept(self, candidate: Candidate, row: DependentRow, due: Eligibility | None) -> str:
        if row.parent_present:
            return reason(PRESENT, f"its {self.orphans.parent} row was written since the scan")
        since = "written" if self.orphans.written else "first found without its parent"
        return reason(NOT_YET_DUE, f"{since} at {format_epoch_ms(row.written_ms)}, within orphan_grace")

    def delete(self, candidate: Candidate, row: DependentRow) -> bool:
        self.resources.journal.note(SWEEP_DELETES, self.sweep.query_id, {candidate.id})
        return self.tables.applied(self.delete_row, *self._key(candidate))

    def released(self, candidate: Candidate, row: DependentRow | None) -> None:
        if not self.orphans.written:
            journal = self.resources.journal
            journal.unnote(FIRST_FOUND, self._noted_as(candidate), journal.noted(FIRST_FOUND, self._noted_as(candidate)))

    def journalled_as(self, candidate: Candidate) -> tuple[str, str]:
        # Not a kind of object: the purge of the row's parent never meets it.
        return f"{ORPHAN} {candidate.kind}", f"{self.sweep.table}/{candidate.id}"


class _NoRecheck(Control):
    """An orphan kept is looked at again by the next sweep, not by the stream."""

    def recheck(self, kind: str, object_id: str, rule: str, at_ms: int) -> None:
        pass

    def report(self, event_type: str, object_id: str, event_time_ms: int, **fields: Any) -> None:
        raise AssertionError("an orphan's purge reports nothing")


def decide(config: PurgerConfig, sweep: Sweep, object_id: str, at_ms: int | None, etag: str | None) -> tuple:
    """The decision on one orphan the sweep found (a blob last modified at ``at_ms``; a row written then, None:
    not known), old enough, by the sweep's purge: its ``OUTCOME_SCHEMA`` tuple, one record. One found gone is
    this sweep's deletion when its intent is in the journal (a task run again), another writer's otherwise."""
    eligible_at_ms = None
    try:
        purge = _orphan_purge(config, sweep)
        candidate = purge.candidate(object_id, at_ms, etag)
        eligible_at_ms = candidate.eligible_at_ms
        [decided] = purge.purge(candidate, Attempt(batch=f"{sweep.query_id}/0"))  # no dependents: one outcome
        return _outcome_row(sweep, object_id, eligible_at_ms, decided)
    except Exception as error:  # a store or Cassandra that failed: this one only, the next run tries again
        log.warning("orphan %s %s of %s in %s: %s", sweep.kind, object_id, sweep.table, sweep.dc or ALL_DCS, error)
        return _outcome_row(sweep, object_id, eligible_at_ms, Outcome(ERROR, f"{type(error).__name__}: {error}"))


def _outcome_row(sweep: Sweep, object_id: str, eligible_at_ms: int | None, outcome: Outcome) -> tuple:
    """An orphan's outcome as an ``OUTCOME_SCHEMA`` tuple (batch 0 of the sweep's ledger write)."""
    return (sweep.policy, sweep.kind, object_id, ORPHAN, sweep.dc, outcome.status, outcome.reason,
            eligible_at_ms, now_ms(), outcome.deleted_at_ms, 0, _worker(), outcome.intent)


def _decide_task(config: PurgerConfig, sweep: Sweep, rate: float, rows: Iterable[Any]) -> Iterator[tuple]:
    """One Spark task: its orphans decided, ``stream.delete_concurrency`` at a time, paced at ``rate``."""
    pacer = Pacer(rate)

    def paced(row: Any) -> Any:
        pacer.wait()
        return row

    concurrency = config.stream.delete_concurrency
    with ThreadPoolExecutor(concurrency, thread_name_prefix="orphans") as pool:
        yield from bounded_map(pool, lambda row: decide(config, sweep, row.id, row.at_ms, row.etag),
                               map(paced, rows), concurrency)


# --- the runs ---------------------------------------------------------------------------------------------


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
                if not _recorded_already(ledger, sweep, row, run_id):
                    if ids is None:
                        ids = _row_ids(spark, config, f"orphan blobs of policies.{policy.name}", table,
                                       blobs.id_column).persist(StorageLevel.MEMORY_AND_DISK)
                    listed = spark.sparkContext.accumulator(0)
                    found = _listed(spark, config, blobs.prefix, dc, sweep.cutoff_ms, listed).join(ids, "id", "left_anti")
                    _sweep(spark, config, ledger, sweep, f"{policy.name}.{table}/{dc}/{config.stores[dc].bucket}",
                           found.select("id", F.col("last_modified_ms").alias("at_ms"), "etag"), row)
                    row.scanned = listed.value
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
        if not _recorded_already(ledger, sweep, row, run_id):
            what = f"orphan rows of policies.{policy.name}"
            scanned = spark.sparkContext.accumulator(0)
            parents = _row_ids(spark, config, what, names[orphans.parent], orphans.parent_key)
            found = (_dependents(spark, config, policy, orphans, table, scanned)
                     .join(parents, F.col("parent") == parents["id"], "left_anti")
                     .where(F.col("written_ms").isNull() | (F.col("written_ms") < sweep.cutoff_ms)))
            _sweep(spark, config, ledger, sweep, f"{policy.name}.{table}/{ALL_DCS}",
                   found.select("id", F.col("written_ms").alias("at_ms"), F.lit(None).cast("string").alias("etag")),
                   row)
            row.scanned = scanned.value
        report.append(row.finish())
    return report


def _recorded_already(ledger: Ledger, sweep: Sweep, row: ReportRow, run_id: str) -> bool:
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


def _sweep(spark: SparkSession, config: PurgerConfig, ledger: Ledger, sweep: Sweep, sweeps_key: str,
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
                found.repartition(tasks).rdd.mapPartitions(partial(_decide_task, config, sweep, rate)),
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
    purge = _orphan_purge(config, sweep)
    for earlier in sorted(journal.noted(OPEN_SWEEPS, sweeps_key) - {sweep.query_id}):
        if not ledger.holds(earlier, 0):
            gone = [found for found in sorted(journal.noted(SWEEP_DELETES, earlier))
                    if purge.read(Candidate(sweep.kind, found, ORPHAN, 0), serial=True) is None]
            records = [_outcome_row(sweep, found, None, outcome) for found in gone
                       for outcome in recorded_from_intent({SELF: f"{earlier}/0"})]
            if records:
                ledger.append(spark.createDataFrame(records, OUTCOME_SCHEMA), earlier, 0)
            log.warning("orphans of %s in %s: sweep %s stopped before its ledger write; %d of its deletions "
                        "recorded now", sweep.table, sweep.dc or ALL_DCS, earlier, len(records))
        journal.unnote(OPEN_SWEEPS, sweeps_key, {earlier})


def _head(store: Any, bucket: str, key: str) -> dict[str, Any] | None:
    """The blob's ``HEAD``; None when it is gone."""
    from botocore.exceptions import ClientError

    try:
        return store.head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
            raise
        return None
