"""The ``units_of_work`` policy (docs/policies.md, units_of_work): a payment store's units of work and their objects.

A unit of work is one ``units_of_work`` row and its objects in ``uow_objects``
(a summary, message data, process data, process objects, custom objects). Its
events say when it started (with its journey type), finished and was archived;
the state keeps the earliest of each, so any order and duplicates fold alike.

=========  ===================================================================
rule       eligible on a day D (UTC) when
=========  ===================================================================
retention  ``finished_at`` is before the lower bound of D, which is D minus
           ``retention_period`` at 00:00 UTC; or, if not finished and
           ``terminal_only`` is false, ``started_at`` is before it. A journey
           type listed in ``archived_dependent_journey_types`` must also be
           archived by the start of D.
=========  ===================================================================

The rule is one pure function, ``eligible_on``, read by both halves through
``first_eligible_day``, the first day on which it holds (exact in calendar
terms: the lower bound never moves back from one day to the next): the
stream's deadline is the start of that day, and at delete time the row is due
once that day has begun by the wall clock. A unit archived during a day
counts from the next one, as a daily run at 00:00 would see it.

Writer contract (the race between a writer and a purge, as for payloads):

- ``units_of_work`` has one column of the purger's, ``purge_started_at``: null
  until a purge claims the unit, then never null again while the row exists.
- ``started_at`` is written with the row and never changes.
- A writer that finishes or archives a unit does so with ``UPDATE ... IF
  purge_started_at = null AND started_at != null``. Refused, the unit is being
  purged (it is past retention) or gone: the writer treats it as gone. (The
  second condition matters: on a missing row Cassandra takes ``= null`` as
  true and the update would create a row.)
- A writer that adds an object to an existing unit writes the object at
  QUORUM, then reads ``purge_started_at`` at SERIAL; set, or the row gone, it
  deletes its object and treats the unit as gone.
- The purger reads the row at ``cassandra.consistency`` (again at the serial
  consistency when it already carries a claim), finds it due once its
  ``first_eligible_day`` has begun by the wall clock, then claims it, which a
  stale read only makes fail: ``UPDATE ... SET purge_started_at = <now> IF
  purge_started_at = null AND started_at = <seen> AND finished_at = <seen> AND
  archived_at = <seen>`` (a null bound to ``= ?`` matches a null column).
  Only then does it delete the objects (their keys read at QUORUM, each
  deleted by its primary key), and last the row, ``IF purge_started_at =
  <claimed>``.

So no object of a unit that the check keeps is ever deleted: objects go only
after a claim, and a claim applies only to the very row that was checked. A
crash after the claim leaves ``purge_started_at`` set; the retry finishes the
purge, and writers keep out meanwhile.

Reconciliation reads an unclaimed row back as its events at its own times: the
start (with its journey type) at ``started_at``, the finish at
``finished_at`` and the archiving at ``archived_at`` when set
(``UnitsOfWorkPolicy.row_events``); folded, they are the row's state.

Example::

    from datetime import date
    from purger.policies import load_policy
    from purger.policies.units_of_work import UnitOfWorkState, eligible_on
    policy = load_policy("units_of_work", {"enabled": True, "retention_period": "P2Y"})
    policy.settings.period.lower_bound(date(2023, 5, 17))   # 2021-05-17 00:00 UTC
    finished = UnitOfWorkState("PAYMENT", started_at_ms=1_609_459_200_000, finished_at_ms=1_609_545_600_000)
    eligible_on(finished, date(2023, 5, 17), policy.settings)   # True: finished 2021-01-02
    policy.kinds[0].eligibility(finished)   # Eligibility(rule='retention', eligible_at_ms=1672704000000)
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass, replace
from datetime import date, datetime, time, timedelta, timezone
from functools import cached_property, partial
from typing import Any, Literal, Mapping, get_args

from pydantic import field_validator

from purger.core.events import Eligibility, EventField, EventType, ObjectKind, Rule, earliest
from purger.core.handles import Resources
from purger.core.policy import Policy, Settings
from purger.core.purge_protocol import Candidate, Dependent, Kept, ObjectPurge, Purge
from purger.core.restorations import RowImage
from purger.core.reconcile_descriptors import OrphanRows, Scanned, row_event
from purger.core.times import epoch_ms, format_timestamp, from_epoch_ms, now_ms
from purger.core.vocabulary import KEPT_BY_RULE, NOT_YET_DUE, reason

UNIT_OF_WORK = "unit_of_work"
UOW_OBJECT = "uow_object"  # the kind of a unit's object in the outcomes
RETENTION = "retention"
UOW_STARTED = "uow_started"
UOW_FINISHED = "uow_finished"
UOW_ARCHIVED = "uow_archived"

JourneyType = Literal["PAYMENT", "RECALL", "BULK", "BATCH"]
JOURNEY_TYPES: tuple[str, ...] = get_args(JourneyType)
COLLECTIONS = ("SUMMARY", "MDS", "PDS", "PROCESS", "CUSTOM")

DAY_MS = 86_400_000
_EPOCH_DAY = date(1970, 1, 1).toordinal()


def day_start_ms(day: date) -> int:
    """00:00 UTC of ``day``, in epoch milliseconds."""
    return (day.toordinal() - _EPOCH_DAY) * DAY_MS


def day_of(moment_ms: int) -> date:
    """The UTC day a moment falls on (integer arithmetic: exact for any millisecond)."""
    return date.fromordinal(_EPOCH_DAY + moment_ms // DAY_MS)


# --- the retention period ------------------------------------------------------------------------

_PERIOD = re.compile(r"P(?:(\d+)Y)?(?:(\d+)M)?(?:(\d+)W)?(?:(\d+)D)?")
_MAX_MONTHS = 12_000  # 1000 years: the lower bound stays a date Python can hold


def _plus_months(day: date, months: int) -> date:
    year, month = divmod(day.year * 12 + day.month - 1 + months, 12)
    return date(year, month + 1, min(day.day, calendar.monthrange(year, month + 1)[1]))


@dataclass(frozen=True)
class Period:
    """An ISO-8601 period of years, months and days (weeks are 7 days), in calendar terms."""

    years: int = 0
    months: int = 0
    days: int = 0

    @classmethod
    def parse(cls, text: str) -> Period:
        """``P2Y``, ``P18M``, ``P1Y6M``, ``P3W``, ``P30D``, ``P1Y2M3W4D``; no time part.

        >>> Period.parse("P1Y2M3W4D")
        Period(years=1, months=2, days=25)
        """
        match = _PERIOD.fullmatch(text)
        parts = [int(part or 0) for part in match.groups()] if match and text != "P" else None
        if parts is None or parts[0] * 12 + parts[1] + (parts[2] * 7 + parts[3]) // 28 > _MAX_MONTHS:
            raise ValueError(f"{text!r} is not a retention period; write an ISO-8601 period of years, months, "
                             "weeks and days of at most 1000 years, e.g. P2Y, P18M, P1Y6M, P3W or P30D "
                             "(no time part)")
        years, months, weeks, days = parts
        return cls(years, months, weeks * 7 + days)

    def subtract_from(self, day: date) -> date:
        """``day`` minus the period as java.time does it: years and months together, the day of the month
        clamped to the month's end (2024-02-29 minus P1Y is 2023-02-28), then the days."""
        return _plus_months(day, -(self.years * 12 + self.months)) - timedelta(days=self.days)

    def lower_bound(self, day: date) -> datetime:
        """The retention lower bound of execution date ``day``: ``day`` minus the period, at 00:00 UTC."""
        return datetime.combine(self.subtract_from(day), time(), timezone.utc)

    def first_day_past(self, day: date) -> date:
        """The first execution date whose lower bound falls on a day after ``day``."""
        # Adding the period is the inverse of subtracting it but for month-end clamping, so the answer is
        # a few days away at most; ``subtract_from`` never decreases from one day to the next, so stepping
        # to the boundary is exact.
        found = _plus_months(day + timedelta(days=self.days), self.years * 12 + self.months)
        while self.subtract_from(found) <= day:
            found += timedelta(days=1)
        while self.subtract_from(found - timedelta(days=1)) > day:
            found -= timedelta(days=1)
        return found


# --- settings ------------------------------------------------------------------------------------


class UnitsOfWorkSettings(Settings):
    """``[policies.units_of_work]``: the payment store's purge settings, and its tables."""

    retention_period: str = "P2Y"
    # Purge only units that have finished: a running unit is kept whatever its age.
    terminal_only: bool = False
    # Units of these journey types are purged only once archived.
    archived_dependent_journey_types: list[JourneyType] = []
    units_table: str = "units_of_work"
    objects_table: str = "uow_objects"

    @field_validator("retention_period")
    @classmethod
    def _a_period(cls, value: str) -> str:
        Period.parse(value)
        return value

    @cached_property
    def period(self) -> Period:
        return Period.parse(self.retention_period)


# --- events and state ----------------------------------------------------------------------------


@dataclass(frozen=True)
class UnitOfWorkEvent:
    event_id: str
    type: str
    event_time_ms: int
    unit_of_work_id: str
    journey_type: str | None = None


@dataclass(frozen=True)
class UnitOfWorkState:
    # From the earliest start (the lesser journey type at equal times).
    journey_type: str | None = None
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    archived_at_ms: int | None = None


def _earliest(current: int | None, moment_ms: int) -> int:
    return moment_ms if current is None else min(current, moment_ms)


def apply(state: UnitOfWorkState | None, event: UnitOfWorkEvent) -> UnitOfWorkState:
    """Fold one event into a unit's state: every field keeps its earliest value, so the result does not
    depend on the order of the events, nor on duplicates."""
    state = state or UnitOfWorkState()
    if event.type == UOW_STARTED:
        new = (event.event_time_ms, event.journey_type or "")
        if state.started_at_ms is None or new < (state.started_at_ms, state.journey_type or ""):
            return replace(state, started_at_ms=event.event_time_ms, journey_type=event.journey_type)
        return state
    if event.type == UOW_FINISHED:
        return replace(state, finished_at_ms=_earliest(state.finished_at_ms, event.event_time_ms))
    if event.type == UOW_ARCHIVED:
        return replace(state, archived_at_ms=_earliest(state.archived_at_ms, event.event_time_ms))
    return state


def row_state(row: Mapping[str, Any]) -> UnitOfWorkState:
    """A ``units_of_work`` row (or the same values) seen as the stream would see it."""
    return UnitOfWorkState(row["journey_type"], epoch_ms(row["started_at"]), epoch_ms(row["finished_at"]),
                           epoch_ms(row["archived_at"]))


# --- the rule ------------------------------------------------------------------------------------


def _retained_from(state: UnitOfWorkState, settings: UnitsOfWorkSettings) -> int | None:
    """The moment the retention runs from: the finish or, while running and not ``terminal_only``, the start."""
    if state.finished_at_ms is not None:
        return state.finished_at_ms
    return None if settings.terminal_only else state.started_at_ms


def _needs_archive(state: UnitOfWorkState, settings: UnitsOfWorkSettings) -> bool:
    # An unknown journey type (its start not seen) counts as not listed: the row, checked at delete time,
    # always has one, and a guess toward keeping would leave the unit behind.
    return state.journey_type in settings.archived_dependent_journey_types


def eligible_on(state: UnitOfWorkState, day: date, settings: UnitsOfWorkSettings) -> bool:
    """The rule ``retention`` on execution date ``day`` (UTC)."""
    start = _retained_from(state, settings)
    if start is None or start >= day_start_ms(settings.period.subtract_from(day)):
        return False
    return not _needs_archive(state, settings) or (
        state.archived_at_ms is not None and state.archived_at_ms <= day_start_ms(day))


def first_eligible_day(state: UnitOfWorkState, settings: UnitsOfWorkSettings) -> date | None:
    """The first day on which ``eligible_on`` holds (and every later one, until the state changes)."""
    start = _retained_from(state, settings)
    if start is None:
        return None
    first = settings.period.first_day_past(day_of(start))
    if not _needs_archive(state, settings):
        return first
    if state.archived_at_ms is None:
        return None
    # The first day that starts at or after the archiving.
    return max(first, day_of(state.archived_at_ms - 1) + timedelta(days=1))


def deadline_ms(state: UnitOfWorkState, settings: UnitsOfWorkSettings) -> int | None:
    """The event-time deadline: 00:00 UTC of the first eligible day."""
    first = first_eligible_day(state, settings)
    return None if first is None else day_start_ms(first)


def _why_kept(state: UnitOfWorkState, settings: UnitsOfWorkSettings) -> str:
    if _retained_from(state, settings) is None:
        return "running, and terminal_only is set" if state.started_at_ms is not None else "not started"
    return f"journey type {state.journey_type} is archived-dependent and not archived"


# The claim's condition: the row is still the one checked. The purger binds the values it saw; a null
# bound to ``= ?`` matches a null column, and a missing row fails since started_at or finished_at was seen.
_CLAIM_CHECK = "purge_started_at = null AND started_at = ? AND finished_at = ? AND archived_at = ?"


class UnitOfWorkKind(ObjectKind[UnitOfWorkState]):
    name = UNIT_OF_WORK
    state_class = UnitOfWorkState
    event_class = UnitOfWorkEvent

    def __init__(self, settings: UnitsOfWorkSettings) -> None:
        # A calendar period has no fixed length: ``started_at`` gives the whole deadline and the period is 0.
        # The check at delete time is the same function on the row; the claim conditions on the values read.
        self.rule: Rule[UnitOfWorkState] = Rule(RETENTION, 0, lambda s: deadline_ms(s, settings))

    def fold(self, state: UnitOfWorkState | None, events: list[UnitOfWorkEvent]) -> UnitOfWorkState:
        for event in events:
            state = apply(state, event)
        return state or UnitOfWorkState()

    def eligibility(self, state: UnitOfWorkState) -> Eligibility | None:
        return earliest((self.rule,), state)


# --- the delete-time half ------------------------------------------------------------------------


class UnitOfWorkPurge(ObjectPurge[Any]):
    """The purger's side of the writer contract (module docstring); one per executor process."""

    def __init__(self, resources: Resources, tables: dict[str, str], settings: UnitsOfWorkSettings) -> None:
        super().__init__(resources, tables)
        self.settings = settings
        prepare = self.tables.prepare
        self.read_unit = prepare("SELECT journey_type, started_at, finished_at, archived_at, purge_started_at "
                                 "FROM {units_of_work} WHERE unit_of_work_id = ?")
        self.claim_unit = prepare(f"UPDATE {{units_of_work}} SET purge_started_at = ? WHERE unit_of_work_id = ? "
                                  f"IF {_CLAIM_CHECK}")
        # Quorum: sees every object a writer added before its serial read found the unit unclaimed.
        self.read_objects = prepare("SELECT collection, object_id FROM {uow_objects} WHERE unit_of_work_id = ?",
                                    "quorum")
        self.delete_object = prepare(
            "DELETE FROM {uow_objects} WHERE unit_of_work_id = ? AND collection = ? AND object_id = ?")
        self.delete_unit = prepare("DELETE FROM {units_of_work} WHERE unit_of_work_id = ? IF purge_started_at = ?")

    def read(self, candidate: Candidate, serial: bool = False) -> Any | None:
        # Its objects went before it (the order of deletion), so a unit gone leaves nothing else to delete.
        return self.tables.one(self.read_unit, candidate.id, serial=serial)

    def claimed(self, row: Any) -> bool:
        return row.purge_started_at is not None

    def due(self, candidate: Candidate, row: Any) -> Eligibility | None:
        first = first_eligible_day(row_state(row._asdict()), self.settings)
        return None if first is None else Eligibility(RETENTION, day_start_ms(first))

    def why_kept(self, candidate: Candidate, row: Any, due: Eligibility | None) -> str:
        if due is None:
            return reason(KEPT_BY_RULE, _why_kept(row_state(row._asdict()), self.settings))
        return reason(NOT_YET_DUE, f"{RETENTION} from {day_of(due.eligible_at_ms).isoformat()}")

    def claim(self, candidate: Candidate, row: Any) -> Any | Kept:
        claimed_at = from_epoch_ms(now_ms())
        if self.tables.applied(self.claim_unit, claimed_at, candidate.id, row.started_at, row.finished_at,
                               row.archived_at):
            return row._replace(purge_started_at=claimed_at)
        # A writer got in between: look again with the row as it is now.
        return Kept(reason(KEPT_BY_RULE, "changed while being purged"), Eligibility(RETENTION, now_ms()))

    def dependents(self, candidate: Candidate, row: Any) -> list[Dependent]:
        uow = candidate.id
        return [Dependent(UOW_OBJECT, f"{uow}/{found.collection}/{found.object_id}",
                          partial(self.tables.execute, self.delete_object, uow, found.collection, found.object_id),
                          image=RowImage("uow_objects", (("unit_of_work_id", uow), ("collection", found.collection),
                                                         ("object_id", found.object_id))))
                for found in self.tables.all(self.read_objects, uow)]

    def image(self, candidate: Candidate) -> RowImage:
        return RowImage("units_of_work", (("unit_of_work_id", candidate.id),))

    def delete(self, candidate: Candidate, row: Any) -> bool:
        # On the claim: this attempt's, or the crashed attempt's it finishes.
        return self.tables.applied(self.delete_unit, candidate.id, row.purge_started_at)


# --- the policy ----------------------------------------------------------------------------------


class UnitsOfWorkPolicy(Policy):
    name = "units_of_work"
    settings_model = UnitsOfWorkSettings
    event_fields = (
        EventField("unit_of_work_id", "string", identifier=True),
        EventField("journey_type", "string", choices=JOURNEY_TYPES),
    )
    event_types = (
        EventType(UOW_STARTED, UNIT_OF_WORK, "unit_of_work_id", required=("journey_type",)),
        EventType(UOW_FINISHED, UNIT_OF_WORK, "unit_of_work_id"),
        EventType(UOW_ARCHIVED, UNIT_OF_WORK, "unit_of_work_id"),
    )
    tables = {
        "units_of_work": ("unit_of_work_id", "journey_type", "started_at", "finished_at", "archived_at",
                          "purge_started_at"),
        "uow_objects": ("unit_of_work_id", "collection", "object_id"),
    }
    scanned = (Scanned("units_of_work", UNIT_OF_WORK, "unit_of_work_id",
                       ("unit_of_work_id", "journey_type", "started_at", "finished_at", "archived_at",
                        "purge_started_at")),)
    # Objects left behind when their unit of work's row went without them.
    orphan_rows = (OrphanRows("uow_objects", ("unit_of_work_id", "collection", "object_id"), "units_of_work",
                              "unit_of_work_id", written="body"),)
    schema = """
CREATE TABLE IF NOT EXISTS {keyspace}.units_of_work (
  unit_of_work_id  text PRIMARY KEY,
  journey_type     text,       -- PAYMENT | RECALL | BULK | BATCH
  started_at       timestamp,  -- written with the row, never changed
  finished_at      timestamp,  -- reached a terminal global status, null while running
  archived_at      timestamp,  -- archived with all its objects, null if not
  purge_started_at timestamp   -- the purger's claim (writer contract), null until then
);
CREATE TABLE IF NOT EXISTS {keyspace}.uow_objects (
  unit_of_work_id text,
  collection      text,        -- SUMMARY | MDS | PDS | PROCESS | CUSTOM
  object_id       text,
  body            blob,
  PRIMARY KEY (unit_of_work_id, collection, object_id)
);
"""

    settings: UnitsOfWorkSettings

    def __init__(self, settings: UnitsOfWorkSettings) -> None:
        super().__init__(settings)
        self.kind = UnitOfWorkKind(settings)

    @property
    def kinds(self) -> tuple[ObjectKind, ...]:
        return (self.kind,)

    def purges(self, resources: Resources) -> dict[str, Purge]:
        return {UNIT_OF_WORK: UnitOfWorkPurge(resources, self.table_names(), self.settings)}

    def table_names(self) -> dict[str, str]:
        return {"units_of_work": self.settings.units_table, "uow_objects": self.settings.objects_table}

    def row_events(self, table: str, row: dict[str, Any]) -> list[dict[str, Any]]:
        """The start with its journey type, the finish and the archiving, each at its own column's time: folded,
        the row's state (``row_state``), which the check at delete time reads too. A claimed row reads the same:
        it was due when claimed and stays due, and the purge, finding it claimed, finishes it. Nothing from a row
        without its start or a known journey type (a row the writer contract did not write whole: ``started_at``
        and the journey type come with the row)."""
        if row["started_at"] is None or row["journey_type"] not in JOURNEY_TYPES:
            return []
        unit = row["unit_of_work_id"]
        found = [row_event("units_of_work", unit, UOW_STARTED, row["started_at"], unit_of_work_id=unit,
                           journey_type=row["journey_type"])]
        found += [row_event("units_of_work", unit, event_type, row[column], unit_of_work_id=unit)
                  for event_type, column in ((UOW_FINISHED, "finished_at"), (UOW_ARCHIVED, "archived_at"))
                  if row[column] is not None]
        return found

    def report_fields(self, day: date) -> dict[str, str]:
        """The payment store's PurgeReport fields for execution date ``day``."""
        return {
            "execution_date": day.isoformat(),
            "retention_period": self.settings.retention_period,
            "retention_lower_bound": format_timestamp(self.settings.period.lower_bound(day)),
            "terminal_only": str(self.settings.terminal_only).lower(),
            "archived_dependent_journey_types": ",".join(self.settings.archived_dependent_journey_types),
        }
