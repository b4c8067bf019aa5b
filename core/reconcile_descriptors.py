"""The reverse of a policy's fold, for reconciliation (``purger reconcile``, docs/policies.md, "Reconciliation:
the reverse of the fold"): the tables whose rows are its objects (``Scanned``) and how a row is re-expressed
as the events that would have produced it (``Policy.row_events``, each event made by ``row_event``), or judged
a page at a time (``PageVerdicts``), a row that lacks the timestamp its rules run from dated by its cells'
write times (``latest_write``, alike at the scan and at delete time); its blobs in the object stores
(``Blobs``) and its tables of dependent rows (``OrphanRows``), whose orphans reconciliation deletes. A policy
of one's own imports these from ``purger.core.policy``; ``purger.reconcile`` reads them.

Example::

    row_event("push_routers", "c1", "push_client_connected", datetime(2026, 1, 1, 7, 58), client_id="c1")
    # {'event_id': 'reconcile:push_routers:c1:push_client_connected:2026-01-01T07:58:00.000Z:3a70db64',
    #  'type': 'push_client_connected', 'event_time': '2026-01-01T07:58:00.000Z', 'client_id': 'c1'}
"""

from __future__ import annotations

from dataclasses import dataclass
import hashlib
import json
from datetime import datetime, timedelta
from typing import Any, Iterable

from purger.core.times import epoch_ms, format_epoch_ms

__all__ = ["REFERENCED_FIELD", "Blobs", "OrphanRows", "PageVerdicts", "Scanned", "dated", "latest_write", "row_event"]


# The field a scanned row gains when its table has ``Scanned.referenced_by``.
REFERENCED_FIELD = "referenced"


@dataclass(frozen=True)
class Scanned:
    """A table reconciliation reads whole: each row is one object of ``kind``, whose id is in ``id_column``;
    ``columns`` are the columns ``Policy.row_events`` needs (the id's among them). The table is named by its
    reference name, as in ``Policy.tables``.

    ``written``, some of ``columns`` (regular ones: a key's cells have no write time), are those whose write
    time the scan reads too, as ``writetime_<column>`` (``selected``): what dates a row that lacks the timestamp
    its rules run from (``latest_write``).

    ``referenced_by``, when set, names (by reference name) a table partitioned by the same key, whose
    partitions refer to the row's object (``payload_refs`` for ``payloads``): each scanned row then also
    has ``referenced``, whether that table holds a partition for its key, read in the same token range."""

    table: str
    kind: str
    id_column: str
    columns: tuple[str, ...]
    referenced_by: str | None = None
    written: tuple[str, ...] = ()

    @property
    def selected(self) -> tuple[str, ...]:
        """What a read of the row selects (CQL): its columns, then the write time of each of ``written``,
        named as the driver names it in a named tuple, for every result to name it alike."""
        return self.columns + tuple(f"writetime({column}) AS {_write_time(column)}" for column in self.written)

    @property
    def row_fields(self) -> tuple[str, ...]:
        """What a scanned row holds: what it selects (``writetime_<column>`` for a write time), and
        ``referenced`` with ``referenced_by``."""
        return (self.columns + tuple(_write_time(column) for column in self.written)
                + ((REFERENCED_FIELD,) if self.referenced_by else ()))


def _write_time(column: str) -> str:
    return f"writetime_{column}"


def latest_write(row: dict[str, Any], columns: Iterable[str]) -> datetime | None:
    """When the row's cells ``columns`` were last written, from their write times as it holds them
    (``Scanned.selected``: ``writetime_<column>``, microseconds since the epoch, None for a null cell): the
    latest, as the driver gives a timestamp column (to the millisecond, naive, in UTC), so that it compares with
    the row's own; None when none of them is set. One function for the scan and the delete-time read, so that
    both date a row alike."""
    found = [micros for column in columns if (micros := row[_write_time(column)]) is not None]
    return _EPOCH + timedelta(milliseconds=max(found) // 1000) if found else None


_EPOCH = datetime(1970, 1, 1)


def dated(row: dict[str, Any], column: str, scanned: Scanned) -> datetime | None:
    """When a row's rules run from: its timestamp ``column``; for a row without it (written by no platform
    writer, which always sets it), the latest write time of its cells ``scanned.written`` (``latest_write``),
    so that it is never skipped and never due at once. None: neither is set."""
    return row[column] if row[column] is not None else latest_write(row, scanned.written)


@dataclass(frozen=True)
class Blobs:
    """Blobs a policy keeps in every data centre's object store: the object of ``kind`` whose id is ``id``
    has its blob at ``prefix + id``, and its row, keyed by ``id_column``, in ``table`` (by its reference
    name). Reconciliation deletes a blob under ``prefix`` that has no row once it is older than
    ``reconcile.orphan_grace``; it never touches a key outside ``prefix``."""

    prefix: str
    kind: str
    table: str
    id_column: str


@dataclass(frozen=True)
class OrphanRows:
    """Rows of ``table`` (by its reference name, primary key ``key``) that lead from a row of ``parent``, whose
    partition key ``parent_key`` they hold under the same name (a ``payload_refs`` row from its message). The
    parent's purge deletes them first; a crash or another purger cut short may leave them behind, found by
    reconciliation: one without its parent row whose write time is older than ``reconcile.orphan_grace`` (a
    writer in progress writes it before or after its parent) is deleted, the parent read again at the serial
    consistency just before. The write time is that of the regular column ``written``; a table without one (or
    a null cell) is dated by the first reconcile that found the row without its parent, which is no earlier.

    ``claim``: a text column of ``parent`` that keeps the writers of the policy's contract from adding the parent
    while it holds a value of the purger's (the ``users`` row's ``state``: a writer adds a user only where there
    is no row or a ``live`` one). With one, a sweep claims the absent parent before deleting its rows, a
    placeholder row written with a lightweight transaction (``IF NOT EXISTS``) and removed at the sweep's end, so
    a writer adding the parent back in between waits for the sweep rather than losing what it writes after its
    add. Without one, the parent's ids are never used again (a message's, a unit of work's)."""

    table: str
    key: tuple[str, ...]
    parent: str
    parent_key: str
    written: str | None = None
    claim: str | None = None


# A sweep's claim on an absent parent: its claim column's value, then the sweep's name.
CLAIMED_BY = "orphan sweep "


def row_event(table: str, object_id: str, event_type: str, at: datetime, **fields: Any) -> dict[str, Any]:
    """One event of a row's re-expression (``Policy.row_events``), as a record of the topics, at the row's
    own timestamp ``at``. Its id is the same at every scan of an unchanged row, so a second feed is a
    duplicate the fold takes as one. Fields that are None are left out; datetimes (naive ones are UTC, as
    the Cassandra driver returns them) become the events' timestamp text, sets and tuples lists."""
    values = {name: _record_value(value) for name, value in fields.items() if value is not None}
    at_text = _timestamp_text(at)
    # Two events of a row may share a type and a time (a user's in two data centres): their fields tell them apart.
    digest = hashlib.sha1(json.dumps(values, sort_keys=True).encode()).hexdigest()[:8]
    return {"event_id": f"reconcile:{table}:{object_id}:{event_type}:{at_text}:{digest}", "type": event_type,
            "event_time": at_text, **values}


def _timestamp_text(moment: datetime) -> str:
    """A row's timestamp as the events' text: the millisecond it stands for (``epoch_ms``), which the driver's
    datetime may miss by microseconds."""
    return format_epoch_ms(epoch_ms(moment))


def _record_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return _timestamp_text(value)
    if isinstance(value, (set, frozenset, tuple, list)) or type(value).__name__ == "SortedSet":
        return sorted(value)
    return value


@dataclass(frozen=True)
class PageVerdicts:
    """A page's rows judged on their own (``Policy.page_verdicts``), one entry per row in each list: whether
    the row's re-expression has any record (``says``), and the rule and moment it makes its object due by
    (None: not by its row)."""

    says: list[bool]
    rules: list[str | None]
    eligible_at_ms: list[int | None]
