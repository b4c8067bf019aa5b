"""Reconciliation's pure half (docs/reconciliation.md): what a scanned row says, and whether it is fed back.

A scanned row (``Scanned``) is re-expressed by its policy as the events that would have
produced it (``Policy.row_events``). Folded as the stream would fold them, they give the
row's object a state, hence an eligibility: the row's own verdict, independent of the
stream. A row is fed back to the reconcile topic when the stream's state does not know its
object, or when that verdict says it has been due for more than ``overdue_after``
(``purger.reconcile.run``, in the JVM). A scan judges a page of rows at once (``page_verdicts``): on whole columns when
the policy says how (``Policy.page_verdicts``, held equal to the fold by tests/reconcile/test_verdict.py),
else one row at a time.

Example::

    from purger.reconcile.verdict import row_verdict
    verdict = row_verdict(policies, scanned, row)   # policies: a PolicySet; row: column -> value
    verdict.records      # the row's events, as records of the topics
    verdict.eligible_at_ms
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from functools import cache
from typing import Any

from purger.core.events import Eligibility
from purger.core.reconcile_descriptors import PageVerdicts, Scanned
from purger.core.policy_set import PolicySet
from purger.core.times import parse_timestamp

# Why a row is fed back, as the reconcile report counts them.
UNKNOWN = "unknown"
OVERDUE = "overdue"


class ReconcileError(RuntimeError):
    """A reconcile that cannot start or go on (a table missing, the state's copy failing): one line naming
    what and what to do."""


@dataclass(frozen=True)
class RowVerdict:
    """A scanned row's object (``kind``, ``id``), its re-expression (``records``) and when it is due by
    them alone (``eligible_at_ms``; None: not by its row, or the row said nothing)."""

    kind: str
    id: str
    records: list[dict[str, Any]]
    rule: str | None
    eligible_at_ms: int | None


def routed_events(policies: PolicySet, record: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """``(kind, id, event)`` for each object a record is about, as the stream routes it
    (``purger.streams.processor``): its own object, by its type's id field, and each object it links,
    unless the link's ``unless`` field is true. ``event`` is the kind's ``event_class``."""
    event_type = policies.event_types[record["type"]]
    targets = [(event_type.kind, record.get(event_type.id_field), event_type.name)]
    targets += [(link.kind, record.get(link.id_field), link.as_type) for link in event_type.links
                if not (link.unless and record.get(link.unless))]
    return [(kind, object_id, _event(policies, kind, {**record, "type": as_type}))
            for kind, object_id, as_type in targets if object_id is not None]


def _event(policies: PolicySet, kind: str, record: dict[str, Any]) -> Any:
    """The kind's event class from a record: ``event_time`` and timestamp fields as ``<name>_ms``, lists
    as tuples, what the record lacks as None (the stream builds it the same way from its columns)."""
    values: dict[str, Any] = {}
    for name, value in record.items():
        known = policies.fields.get(name)
        if name == "event_time" or (known is not None and known.type == "timestamp"):
            values[f"{name}_ms"] = None if value is None else parse_timestamp(value)
        else:
            values[name] = tuple(value) if isinstance(value, list) else value
    event_class = policies.kind(kind).event_class
    return event_class(**{name: values.get(name) for name in _field_names(event_class)})


@cache
def _field_names(event_class: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(event_class))


def row_verdict(policies: PolicySet, scanned: Scanned, row: dict[str, Any]) -> RowVerdict:
    """What ``row`` of ``scanned`` says of its object, folded from its re-expression alone."""
    object_id = str(row[scanned.id_column])
    records = policies.policy_of(scanned.kind).row_events(scanned.table, row)
    events = [event for record in records for kind, routed_id, event in routed_events(policies, record)
              if kind == scanned.kind and routed_id == object_id]
    kind = policies.kind(scanned.kind)
    due: Eligibility | None = kind.eligibility(kind.fold(None, events)) if events else None
    return RowVerdict(scanned.kind, object_id, records, due and due.rule, due and due.eligible_at_ms)


def page_verdicts(policies: PolicySet, scanned: Scanned, names: list[str],
                  rows: list[tuple[Any, ...]]) -> PageVerdicts:
    """Each row of a page of ``scanned`` (values in the order of ``names``) judged on its own: by its policy on
    whole columns (``Policy.page_verdicts``), or else one row at a time (``row_verdict``)."""
    columns = {name: list(values) for name, values in zip(names, zip(*rows))} if rows else {name: [] for name in names}
    found = policies.policy_of(scanned.kind).page_verdicts(scanned.table, columns)
    if found is not None:
        return found
    verdicts = [row_verdict(policies, scanned, dict(zip(names, row))) for row in rows]
    return PageVerdicts([bool(v.records) for v in verdicts], [v.rule for v in verdicts],
                        [v.eligible_at_ms for v in verdicts])


@dataclass
class ReportRow:
    """A row of a run's report (``ledger.reconcile_path``; ``purger.reconcile.run.REPORT_SCHEMA``): one per run,
    policy, table and data centre (``all`` for a table's scan, a data centre's name for its orphan blobs,
    ``purger.reconcile.orphans``)."""

    run_id: str
    policy: str
    table: str
    dc: str
    started: datetime
    finished: datetime | None = None
    scanned: int = 0
    known: int = 0
    unknown_fed: int = 0
    overdue_fed: int = 0
    orphans_found: int = 0
    orphans_deleted: int = 0
    # Orphan blobs' data centres in a bucket that keeps versions: its noncurrent versions under the prefix and
    # their bytes, what deletes left behind (docs/operations.md, "Versioned buckets").
    noncurrent_versions: int = 0
    noncurrent_bytes: int = 0
    dry_run: bool = False
    duration_s: float = field(init=False, default=0.0)
    rows_per_s: float = field(init=False, default=0.0)

    def finish(self) -> "ReportRow":
        self.finished = datetime.now(timezone.utc)
        self.duration_s = (self.finished - self.started).total_seconds()
        self.rows_per_s = self.scanned / self.duration_s if self.duration_s > 0 else 0.0
        return self
