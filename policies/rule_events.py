"""The ``rule_events`` policy (docs/policies.md, rule_events): events raised by routing rules, kept per status for a period.

A mailbox platform raises an event for a message from one of its routing rules
and keeps its status in a ``rule_events`` row. Each status has its own
retention: a row is purged once it has had its status, unchanged, for that
status's period.

=========================  ========================================================  ==================
rule                       eligible when                                             period [default]
=========================  ========================================================  ==================
rule_event_complete        the status has been COMPLETE since the change to it       complete [7d]
rule_event_failed          the status has been FAILED since the change to it         failed [30d]
rule_event_unprocessed     the status has been UNPROCESSED since the change to it    unprocessed [30d]
rule_event_processing      the status has been PROCESSING since the change to it     processing [30d]
=========================  ========================================================  ==================

The stream keeps the latest status by event time (a status may go back, e.g.
FAILED to UNPROCESSED on a retry), and the period runs from that change, as the
row's ``updated_at`` does. The double-check at delete time is each rule's CQL
condition on a conditional ``DELETE``: the row still has that status and its
``updated_at`` is at least the period old by the wall clock. Deleted: the row.
Reconciliation reads a row back as one ``rule_event_status`` of its status at
its ``updated_at`` (``RuleEventsPolicy.row_events``).

A row without ``updated_at`` (written by no platform writer, which always sets
it) is dated by its status cell's write time (``status_changed_at``), at delete
time and by reconciliation alike: never skipped, never due at once. Its delete
carries ``updated_at = null`` in place of ``updated_at <= ?``, the period having
been checked on the row read (``Rule.undated``).

Example::

    from purger.policies import load_policy
    from purger.policies.rule_events import RULE_EVENT_STATUS, StatusEvent
    policy = load_policy("rule_events", {"enabled": True, "complete": "7d"})
    kind = policy.kinds[0]
    state = kind.fold(None, [StatusEvent("e1", RULE_EVENT_STATUS, 1_000, "r1", "COMPLETE", "m1", "route")])
    kind.eligibility(state)   # Eligibility(rule='rule_event_complete', eligible_at_ms=604801000)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from purger.core.settings import Duration
from purger.core.erasure import SubjectRows, is_erasure
from purger.core.events import Eligibility, EventField, EventType, ObjectKind, Rule, earliest
from purger.core.handles import Resources
from purger.core.policy import Policy, Settings
from purger.core.purge_protocol import Candidate, ObjectPurge, Purge, RuleWrite
from purger.core.restorations import RowImage
from purger.core.reconcile_descriptors import Scanned, dated, row_event
from purger.core.times import duration_ms, epoch_ms, format_epoch_ms, now_ms
from purger.core.vocabulary import KEPT_BY_RULE, NOT_YET_DUE, reason

KIND = "rule_event"
RULE_EVENT_STATUS = "rule_event_status"
TABLE = "rule_events"

UNPROCESSED = "UNPROCESSED"
PROCESSING = "PROCESSING"
COMPLETE = "COMPLETE"
FAILED = "FAILED"
STATUSES = (UNPROCESSED, PROCESSING, COMPLETE, FAILED)

# The rows as the purge reads them and as reconciliation scans them, with the write time that dates a row lacking
# its updated_at: its status's, which every change of status writes.
RULE_EVENTS = Scanned(TABLE, KIND, "rule_event_id", ("rule_event_id", "status", "updated_at"), written=("status",))


class RuleEventsSettings(Settings):
    """``[policies.rule_events]``: the table and the period of each status (the defaults of docs/policies.md)."""

    table: str = TABLE
    complete: Duration = timedelta(days=7)
    failed: Duration = timedelta(days=30)
    unprocessed: Duration = timedelta(days=30)
    processing: Duration = timedelta(days=30)


@dataclass(frozen=True)
class StatusEvent:
    """A ``rule_event_status`` event: the rule event was raised, or its status changed."""

    event_id: str
    type: str
    event_time_ms: int
    rule_event_id: str
    status: str
    # On the event that raised it only.
    message_id: str | None = None
    rule_name: str | None = None


@dataclass(frozen=True)
class RuleEventState:
    # The latest status by event time, when it was set and by which event: a last-writer-wins register.
    status: str | None = None
    status_at_ms: int | None = None
    status_event: str | None = None
    # What the raising event said; the same in every copy of it.
    message_id: str | None = None
    rule_name: str | None = None


def rule_name(status: str) -> str:
    """The rule that purges a row with ``status``: ``rule_event_<status>``."""
    return f"rule_event_{status.lower()}"


def _held(status: str, period: timedelta) -> Rule[RuleEventState]:
    """Eligible once the status has been ``status`` for ``period`` since the change to it; the row's
    ``updated_at`` is that change, so the check at delete time says the same of the row."""
    return Rule(rule_name(status), duration_ms(period),
                lambda s: s.status_at_ms if s.status == status else None,
                f"status = '{status}' AND updated_at <= ?",
                undated=f"status = '{status}' AND updated_at = null")


def rule_table(settings: RuleEventsSettings) -> dict[str, Rule[RuleEventState]]:
    """The rules (docs/policies.md, rule_events) by name, in its order, each with its deadline and its check at delete time."""
    return {rule.name: rule for rule in (
        _held(COMPLETE, settings.complete),
        _held(FAILED, settings.failed),
        _held(UNPROCESSED, settings.unprocessed),
        _held(PROCESSING, settings.processing),
    )}


class RuleEventKind(ObjectKind[RuleEventState]):
    """A rule event, keyed by ``rule_event_id``."""

    name = KIND
    state_class = RuleEventState
    event_class = StatusEvent

    def __init__(self, rules: dict[str, Rule[RuleEventState]]) -> None:
        self.rules = rules

    def fold(self, state: RuleEventState | None, events: list[StatusEvent]) -> RuleEventState:
        state = state or RuleEventState()
        for event in events:
            state = replace(state, message_id=state.message_id or event.message_id,
                            rule_name=state.rule_name or event.rule_name)
            if state.status is None or self._version(event.status, event.event_time_ms, event.event_id) \
                    > self._version(state.status, state.status_at_ms, state.status_event):
                state = replace(state, status=event.status, status_at_ms=event.event_time_ms,
                                status_event=event.event_id)
        return state

    def eligibility(self, state: RuleEventState) -> Eligibility | None:
        return earliest(self.rules.values(), state)

    def _version(self, status: str, at_ms: int, event_id: str) -> tuple[int, int, str]:
        """Last writer wins by event time. At equal times the status with the shorter period wins (a
        guess toward purging is caught by the double-check; one toward keeping would leave the row
        behind), then the event id, so any arrival order and duplicates give the same state."""
        return (at_ms, -self.rules[rule_name(status)].period_ms, event_id)


class RuleEventPurge(ObjectPurge[Any]):
    """Conditional deletes of ``rule_events`` rows, one prepared statement per rule: the delete, carrying the
    rule's condition, is the claim, so it comes first."""

    deletes_first = True

    def __init__(self, resources: Resources, tables: dict[str, str], rules: dict[str, Rule[RuleEventState]]) -> None:
        super().__init__(resources, tables)
        self.rules = rules
        self.deletes = {rule.name: RuleWrite(self.tables, f"DELETE FROM {{{TABLE}}} WHERE rule_event_id = ? IF", rule)
                        for rule in rules.values()}
        self.read_row = self.tables.prepare(
            f"SELECT {', '.join(RULE_EVENTS.selected)} FROM {{{TABLE}}} WHERE rule_event_id = ?")
        self.erase_row = self.tables.prepare(f"DELETE FROM {{{TABLE}}} WHERE rule_event_id = ? IF EXISTS")

    def read(self, candidate: Candidate, serial: bool = False) -> dict[str, Any] | None:
        found = self.tables.one(self.read_row, candidate.id, serial=serial)
        return found._asdict() if found else None

    def due(self, candidate: Candidate, row: Any) -> Eligibility | None:
        return earliest(self.rules.values(), _row_state(row))

    def why_kept(self, candidate: Candidate, row: Any, due: Eligibility | None) -> str:
        if due is not None and due.eligible_at_ms > now_ms():
            return reason(NOT_YET_DUE, f"{due.rule} at {format_epoch_ms(due.eligible_at_ms)}")
        return reason(KEPT_BY_RULE, f"{candidate.rule} did not hold (status {row['status']})")

    def image(self, candidate: Candidate) -> RowImage:
        return RowImage(TABLE, (("rule_event_id", candidate.id),))

    def delete(self, candidate: Candidate, row: dict[str, Any]) -> bool:
        if is_erasure(candidate.rule):
            return self.tables.applied(self.erase_row, candidate.id)
        eligible_at = self.rules[candidate.rule].eligible_at(_row_state(row))
        return self.deletes[candidate.rule].applied((candidate.id,), row["updated_at"] is not None, eligible_at)


def status_changed_at(row: dict[str, Any]) -> datetime | None:
    """When the row's status was last set, which its rules run from: ``updated_at``; for a row without it, its
    status cell's write time (``dated``)."""
    return dated(row, "updated_at", RULE_EVENTS)


def _row_state(row: dict[str, Any]) -> RuleEventState:
    """A row seen as the stream would see it: its status set at its last change (``status_changed_at``)."""
    return RuleEventState(status=row["status"], status_at_ms=epoch_ms(status_changed_at(row)))


class RuleEventsPolicy(Policy):
    """docs/policies.md, rule_events: rule events, purged by status."""

    name = "rule_events"
    settings_model = RuleEventsSettings
    event_fields = (
        EventField("rule_event_id", "string", identifier=True),
        EventField("status", "string", choices=STATUSES),
        EventField("message_id", "string", identifier=True),
        EventField("rule_name", "string"),
    )
    event_types = (EventType(RULE_EVENT_STATUS, KIND, "rule_event_id", required=("status",)),)
    tables = {TABLE: ("rule_event_id", "status", "updated_at")}
    scanned = (RULE_EVENTS,)
    # A mailbox's rule events: those of its messages (the mailbox policy's subject rows), by their message_id.
    subjects = (SubjectRows("mailbox", TABLE, KIND, "rule_event_id", "message_id", through="message"),)
    schema = f"""CREATE TABLE IF NOT EXISTS {{keyspace}}.{TABLE} (
  rule_event_id text PRIMARY KEY,
  message_id    text,
  rule_name     text,
  status        text,       -- UNPROCESSED | PROCESSING | COMPLETE | FAILED
  created_at    timestamp,
  updated_at    timestamp   -- last change of status
);"""

    def __init__(self, settings: RuleEventsSettings) -> None:
        super().__init__(settings)
        self.rules = rule_table(settings)
        self._kind = RuleEventKind(self.rules)

    @property
    def kinds(self) -> tuple[ObjectKind, ...]:
        return (self._kind,)

    def purges(self, resources: Resources) -> dict[str, Purge]:
        return {KIND: RuleEventPurge(resources, self.table_names(), self.rules)}

    def table_names(self) -> dict[str, str]:
        return {TABLE: self.settings.table}

    def row_events(self, table: str, row: dict[str, Any]) -> list[dict[str, Any]]:
        """The row's status, set at its last change (``status_changed_at``: ``updated_at``, else its status's
        write time): what the delete-time check reads too. A status outside the rule table has no rule to purge
        it, and no event can carry it."""
        changed_at = status_changed_at(row)
        if row["status"] not in STATUSES or changed_at is None:
            return []
        return [row_event(TABLE, row["rule_event_id"], RULE_EVENT_STATUS, changed_at,
                          rule_event_id=row["rule_event_id"], status=row["status"])]
