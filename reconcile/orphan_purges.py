"""Orphans, step 4 (``reconcile.orphans``): each orphan a sweep found, decided on the executors through the engine's
one purge protocol (``ObjectPurge``), paced at ``stream.max_deletions_per_second`` over all tasks: an orphan blob
(``OrphanBlobPurge``: the row read again at the serial consistency, then the blob's ``HEAD``) or a dependent row
whose parent is gone (``OrphanRowPurge``: the row, then its parent, at the serial consistency, then
``DELETE ... IF EXISTS``). A row that appeared, a parent that reappeared, or a blob rewritten since the listing or
younger than the grace keeps it (``skipped``); otherwise it is deleted (a dry run: ``would_delete``). Each
decision is one ``OUTCOME_SCHEMA`` record.

Example::

    sweep = Sweep("mailbox", policy.blobs[0], "payloads", "dc1", grace_ms, now_ms() - grace_ms, False,
                  ledger_query_id(run_id, "mailbox", "payloads", "dc1"))
    decide(config, sweep, "p-1", listed_ms, etag)   # ('mailbox', 'payload', 'p-1', 'orphan', 'dc1', 'purged', ...)
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from functools import partial
from typing import Any, Iterable, Iterator

from purger.connectors import CassandraTables
from purger.core.settings import ObjectStoreConfig, PurgerConfig
from purger.core.events import Eligibility
from purger.core.failpoints import failpoint
from purger.core.handles import Control, Resources
from purger.core.purge_protocol import Attempt, Candidate, Deleted, Kept, ObjectPurge, Outcome
from purger.core.reconcile_descriptors import CLAIMED_BY, Blobs, OrphanRows
from purger.core.times import duration_ms, epoch_ms, format_epoch_ms, now_ms
from purger.core.vocabulary import ALL_DCS, ERROR, NOT_YET_DUE, ORPHAN, PRESENT, reason
from purger.sinks.clients import executor_session, executor_store
from purger.sinks.failures import CassandraFailures
from purger.sinks.holds import CassandraHolds
from purger.sinks.journal import CassandraJournal
from purger.sinks.objects import delete_blob
from purger.sinks.purge import decided, outcome_row, worker_name

log = logging.getLogger(__name__)


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


def ledger_query_id(run_id: str, policy: str, table: str, dc: str) -> str:
    """The name of a run's ledger write for one data centre of a policy's blobs table, or (``dc`` ``all``) of
    its orphan rows of a table (batch 0)."""
    return f"reconcile-{run_id}-{policy}.{table}-{dc}"


# The journal's notes of the blobs and rows a sweep is about to delete (``CassandraJournal.note``), per sweep.
# Not an identifier, so no policy's kind of object.
SWEEP_DELETES = "(orphan sweep)"


# --- each executor process's purges, per configuration ---------------------------------------------------

_lock = threading.Lock()
# A process's purges of the sweeps it decides for, newest last: a run's sweeps, a few runs at the most.
_purges: dict[tuple[str, Sweep], "OrphanBlobPurge"] = {}
_PURGES_KEPT = 16


def orphan_purge(config: PurgerConfig, sweep: Sweep) -> "OrphanBlobPurge | OrphanRowPurge | ClaimingOrphanRowPurge":
    """This process's purge of a sweep's orphans, its statements prepared once."""
    session = executor_session(config)
    store = executor_store(config, sweep.dc) if isinstance(sweep.orphans, Blobs) else None
    with _lock:
        key = (config.key, sweep)
        if key not in _purges:
            journal = CassandraJournal(session, config.cassandra.keyspace, config.cassandra.journal_table)
            resources = Resources(partial(CassandraTables, session, config.cassandra.keyspace), None, _NoRecheck(),
                                  journal, CassandraHolds.of(session, config.cassandra),
                                  CassandraFailures.of(session, config), duration_ms(config.stream.retry_interval),
                                  sweep.dry_run)
            if isinstance(sweep.orphans, Blobs):
                _purges[key] = OrphanBlobPurge(resources, store, config.stores[sweep.dc], sweep)
            elif sweep.orphans.claim:
                _purges[key] = ClaimingOrphanRowPurge(resources, sweep)
            else:
                _purges[key] = OrphanRowPurge(resources, sweep)
            while len(_purges) > _PURGES_KEPT:
                del _purges[next(iter(_purges))]
        return _purges[key]


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

    def __init__(self, resources: Resources, store: Any, store_config: ObjectStoreConfig, sweep: Sweep) -> None:
        blobs = sweep.orphans
        super().__init__(resources, {blobs.table: sweep.table})
        self.sweep, self.prefix = sweep, blobs.prefix
        self.store, self.store_config, self.bucket = store, store_config, store_config.bucket
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

    def delete(self, candidate: Candidate, row: Blob) -> bool | Deleted:
        self.resources.journal.note(SWEEP_DELETES, self.sweep.query_id, {candidate.id})
        return delete_blob(self.store, self.store_config, self.prefix + candidate.id) or True

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


# The journal's notes of the parents a sweep claimed (``OrphanRows.claim``), per sweep: removed at its end, or by
# the next sweep of the table when it stopped before.
SWEEP_CLAIMS = "(orphan sweep claims)"


@dataclass(frozen=True)
class DependentRow:
    """What the double-check reads of a dependent row: whether its parent row is there (a placeholder of this
    sweep's claim is not), and when the row was written (or first found without its parent). ``claimed_by``:
    the sweep a placeholder parent is of."""

    parent_present: bool
    written_ms: int
    claimed_by: str | None = None


class OrphanRowPurge(ObjectPurge[DependentRow]):
    """A dependent row whose parent row is gone (``OrphanRows``), deleted through the engine's one protocol:
    read (the row, then its parent, both at the serial consistency), due? (its write time past the grace),
    dry run, the intent in the journal, then ``DELETE ... IF EXISTS``, so a row another writer removed in
    between is not recorded as the purger's. A parent that reappeared keeps it. A parent whose ids are used
    again (``ClaimingOrphanRowPurge``) is claimed first."""

    deletes_first = True

    def __init__(self, resources: Resources, sweep: Sweep) -> None:
        orphans = sweep.orphans
        super().__init__(resources, dict(sweep.tables))
        self.sweep, self.orphans = sweep, orphans
        where = " AND ".join(f"{column} = ?" for column in orphans.key)
        written = f"maxwritetime({orphans.written}) AS written" if orphans.written else orphans.key[0]
        self.read_row = self.tables.prepare(f"SELECT {written} FROM {{{orphans.table}}} WHERE {where}", "serial")
        parent_columns = ", ".join(filter(None, (orphans.parent_key, orphans.claim)))
        self.read_parent = self.tables.prepare(
            f"SELECT {parent_columns} FROM {{{orphans.parent}}} WHERE {orphans.parent_key} = ? LIMIT 1", "serial")
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
        parent = self.tables.one(self.read_parent, self._parent_id(candidate))
        claimed_by = self._claimed_by(parent)
        parent_present = parent is not None and claimed_by != self.sweep.query_id
        written = getattr(found, "written", None) if self.orphans.written else None
        if written is not None:
            return DependentRow(parent_present, written // 1000, claimed_by)
        return DependentRow(parent_present, self._first_found(candidate, parent_present), claimed_by)

    def _parent_id(self, candidate: Candidate) -> Any:
        return self._key(candidate)[self.orphans.key.index(self.orphans.parent_key)]

    def _claimed_by(self, parent: Any) -> str | None:
        """The sweep whose placeholder the parent row is; None for a writer's row, or none."""
        value = getattr(parent, self.orphans.claim, None) if parent is not None and self.orphans.claim else None
        return value[len(CLAIMED_BY):] if isinstance(value, str) and value.startswith(CLAIMED_BY) else None

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
        if row.parent_present and row.claimed_by:
            return reason(PRESENT, f"its {self.orphans.parent} row is claimed by orphan sweep {row.claimed_by}")
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


class ClaimingOrphanRowPurge(OrphanRowPurge):
    """A dependent row of a parent whose ids are used again (``OrphanRows.claim``: a user added back), deleted
    only under the sweep's claim on the absent parent: a placeholder row (``IF NOT EXISTS``) that the writers of
    the contract do not add over, written after the due check and before the intent, and removed at the sweep's
    end (``release_claims``). A writer adding the parent in between the parent's read and the claim makes the
    claim fail (``skipped``, present); one after the claim waits for the release, then writes a row no delete of
    this sweep can reach. Rows of one parent in the sweep's tasks share the claim."""

    deletes_first = False

    def __init__(self, resources: Resources, sweep: Sweep) -> None:
        super().__init__(resources, sweep)
        orphans = self.orphans
        self.claim_parent = self.tables.prepare(
            f"INSERT INTO {{{orphans.parent}}} ({orphans.parent_key}, {orphans.claim}) VALUES (?, ?) IF NOT EXISTS")
        self.release_parent = self.tables.prepare(
            f"DELETE FROM {{{orphans.parent}}} WHERE {orphans.parent_key} = ? IF {orphans.claim} = ?")

    def claim(self, candidate: Candidate, row: DependentRow) -> DependentRow | Kept:
        parent_id = self._parent_id(candidate)
        # Noted first: a sweep stopped after its claim leaves the note, and the next sweep of the table releases it.
        self.resources.journal.note(SWEEP_CLAIMS, self.sweep.query_id, {json.dumps(parent_id)})
        if not self.tables.applied(self.claim_parent, parent_id, CLAIMED_BY + self.sweep.query_id):
            # Another row of the same parent in this sweep may hold the claim; anything else is a writer's row.
            claimed_by = self._claimed_by(self.tables.one(self.read_parent, parent_id))
            if claimed_by != self.sweep.query_id:
                return Kept(self.why_kept(candidate, DependentRow(True, row.written_ms, claimed_by), None))
        return row

    def release_claims(self, query_id: str) -> int:
        """The sweep ``query_id``'s claims on parents removed (each only while still its placeholder), and its
        notes of them; how many it had noted. Its deletes are settled first: a serial read of each row it meant
        to delete finishes a conditional delete left in progress (one that timed out and whose settling read
        failed too, or a process killed), which Paxos v1 would otherwise finish later under a newer ballot, over
        the rows a writer wrote once the claim was gone (docs/policies.md, "What each write must use"). A read
        that fails raises with every claim kept: the next sweep of the table releases them."""
        journal = self.resources.journal
        for object_id in journal.noted(SWEEP_DELETES, query_id):
            self.tables.one(self.read_row, *self._key(Candidate(self.sweep.kind, object_id, ORPHAN, 0)))
        noted = journal.noted(SWEEP_CLAIMS, query_id)
        for parent_id in noted:
            self.tables.applied(self.release_parent, json.loads(parent_id), CLAIMED_BY + query_id)
        journal.unnote(SWEEP_CLAIMS, query_id, noted)
        return len(noted)


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
        purge = orphan_purge(config, sweep)
        candidate = purge.candidate(object_id, at_ms, etag)
        eligible_at_ms = candidate.eligible_at_ms
        [decided] = purge.purge(candidate, Attempt(batch=f"{sweep.query_id}/0"))  # no dependents: one outcome
        return orphan_outcome(sweep, object_id, eligible_at_ms, decided)
    except Exception as error:  # a store or Cassandra that failed: this one only, the next run tries again
        log.warning("orphan %s %s of %s in %s: %s", sweep.kind, object_id, sweep.table, sweep.dc or ALL_DCS, error)
        return orphan_outcome(sweep, object_id, eligible_at_ms, Outcome(ERROR, f"{type(error).__name__}: {error}"))


def orphan_outcome(sweep: Sweep, object_id: str, eligible_at_ms: int | None, outcome: Outcome) -> tuple:
    """An orphan's outcome as an ``OUTCOME_SCHEMA`` tuple (batch 0 of the sweep's ledger write)."""
    return outcome_row(sweep.policy, sweep.kind, object_id, ORPHAN, sweep.dc, outcome, eligible_at_ms, 0,
                       worker_name())


def decide_task(config: PurgerConfig, sweep: Sweep, rate: float, rows: Iterable[Any]) -> Iterator[tuple]:
    """One Spark task: its orphans decided, ``stream.delete_concurrency`` at a time, paced at ``rate``."""
    return decided(rows, lambda row: decide(config, sweep, row.id, row.at_ms, row.etag), config, "orphans", rate)


def _head(store: Any, bucket: str, key: str) -> dict[str, Any] | None:
    """The blob's ``HEAD``; None when it is gone."""
    from botocore.exceptions import ClientError

    try:
        return store.head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
            raise
        return None
