"""The policy interface (docs/policies.md, "The policy interface"): all the engine knows about a kind of
object. What a policy of one's own imports is in ``__all__``; the engine's view of the enabled policies is
``purger.core.policy_set``.

A policy is one kind of purge (``mailbox``, ``rule_events``, ``users``,
``units_of_work``, or one of a user's own). It says:

- its events: their fields (``EventField``) and types (``EventType``: which
  object each is about, by which id field, with which required fields);
- per kind of object (``ObjectKind``): the state kept per object and how
  events fold into it (any order and duplicates give the same state), and its
  eligibility, from the rules (``Rule``: an event-time deadline beside the CQL
  condition its conditional delete or claim carries at delete time);
- its delete-time half, a ``Purge`` per kind built on each executor from the
  shared ``Resources``: an ``ObjectPurge``, whose protocol the engine owns
  (read, due?, dry run, claim, journalled dependents, delete, rechecks,
  earlier attempts) and whose steps the policy fills in through its typed
  handle on its tables (``Tables``), one ``Outcome`` per decision;
- the reverse of its fold, for reconciliation (``purger reconcile``): the
  tables whose rows are its objects (``Scanned``) and how a row is re-expressed
  as the events that would have produced it (``Policy.row_events``);
- its configuration section (``settings_model``, a pydantic model) and the
  tables and columns it reads (for ``purger setup``).

The engine keys state by ``(kind, id)``; every kind belongs to exactly one
policy, so the kind names the policy as well as the object.

Example::

    from purger.policies import load_policy
    policy = load_policy("rule_events", {"enabled": True})
    kind = policy.kinds[0]
    state = kind.fold(None, [event])
    kind.eligibility(state)   # Eligibility(rule='rule_event_complete', eligible_at_ms=...)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
import hashlib
import json
from datetime import date, datetime, timedelta, timezone
from typing import Any, Callable, ClassVar, Generator, Generic, Iterable, Iterator, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from purger.core.failpoints import failpoint
from purger.core.times import format_timestamp, from_epoch_ms, now_ms
from purger.core.vocabulary import (
    ALREADY_GONE, BEING_DELETED, EARLIER_ATTEMPT, ERROR, PURGED, REMOVED_MEANWHILE, SKIPPED, WOULD_DELETE, reason,
)

__all__ = [
    "Attempt", "Candidate", "Consistency", "Control", "Dependent", "Eligibility", "EventField", "EventType",
    "Journal", "Kept", "Link", "ObjectKind", "ObjectPurge", "Outcome", "Policy", "Purge", "Resources", "Rule",
    "Blobs", "OrphanRows", "Scanned", "Settings", "Tables", "earliest", "key_id", "latest_write", "row_event",
]

S = TypeVar("S")

# The Spark type an event field is read as. A timestamp is ISO-8601 UTC text in the record and reaches
# the state as epoch milliseconds in ``<name>_ms``.
FieldType = Literal["string", "int", "long", "boolean", "strings", "timestamp"]


@dataclass(frozen=True)
class EventField:
    name: str
    type: FieldType
    # An identifier: at most MAX_ID_LENGTH characters (Cassandra keys stay small).
    identifier: bool = False
    # A count or a size: never negative.
    non_negative: bool = False
    # The values a string field may take (empty: any).
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Link:
    """An event that also concerns another object: it reaches that object as ``as_type``, keyed by
    ``id_field``, unless the boolean field ``unless`` is true (an enqueue links its message to a payload
    kept in the object stores, not to an inline one)."""

    kind: str
    id_field: str
    as_type: str
    unless: str | None = None


@dataclass(frozen=True)
class EventType:
    name: str
    kind: str  # the kind of object it is about
    id_field: str  # the field holding that object's id; the record key
    required: tuple[str, ...] = ()  # fields it must carry beyond event_id, type, event_time and the id
    links: tuple[Link, ...] = ()
    # Written by the purger's own sink: accepted on the control topic only, so no producer of the events
    # topics can steer the purger.
    control: bool = False


@dataclass(frozen=True)
class Eligibility:
    rule: str
    eligible_at_ms: int


@dataclass(frozen=True)
class Rule(Generic[S]):
    """One row of a policy's rule table: when its period started (``started_at``, from the state: in event
    time for the stream, from the row's own columns at delete time, so one function decides both), the
    period, and ``condition``: the CQL condition on the row that the policy's conditional ``DELETE`` or
    claim carries, its one ``?`` bound to the wall clock minus ``period_ms`` (``cutoff``). None when the
    claim conditions on the very values read instead (a calendar rule, a writer contract)."""

    name: str
    period_ms: int
    started_at: Callable[[S], int | None]
    condition: str | None = None

    def cutoff(self) -> datetime:
        """What ``condition``'s ``?`` is bound to: the wall clock minus the period."""
        return from_epoch_ms(now_ms() - self.period_ms)

    def eligible_at(self, state: S) -> int | None:
        start = self.started_at(state)
        return None if start is None else start + self.period_ms


def earliest(rules: Iterable[Rule[S]], state: S | None) -> Eligibility | None:
    """The earliest rule under which the object becomes eligible, or None if none applies."""
    if state is None:
        return None
    found = [Eligibility(rule.name, at) for rule in rules if (at := rule.eligible_at(state)) is not None]
    return min(found, key=lambda e: (e.eligible_at_ms, e.rule), default=None)


class ObjectKind(ABC, Generic[S]):
    """One kind of object with state: what the stateful stage keeps per object and when it is due.

    ``state_class`` is a frozen dataclass whose fields all have defaults, typed ``str``, ``int``,
    ``bool`` or ``tuple[str, ...]`` (optionally ``| None``): the engine derives the state store's
    schema from it. ``event_class`` is a frozen dataclass the engine builds from each event's fields
    by name (``event_id``, ``type``, ``event_time_ms``, then any event field, a timestamp as
    ``<name>_ms``, a list as a tuple).
    """

    name: ClassVar[str]
    state_class: ClassVar[type]
    event_class: ClassVar[type]

    @abstractmethod
    def fold(self, state: S | None, events: list[Any]) -> S:
        """Fold a batch of the object's events into its state; order and duplicates do not matter."""

    @abstractmethod
    def eligibility(self, state: S) -> Eligibility | None:
        """When the object becomes eligible, in event time, and under which rule; None: not by its events."""

    def hint(self, object_id: str, state: S) -> dict[str, Any]:
        """What the delete-time half needs to know of the state (JSON-able), carried with a candidate."""
        return {}


# --- the delete-time half ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """An object the stream found due: what the sink hands to the policy's purge."""

    kind: str
    id: str
    rule: str
    eligible_at_ms: int
    hint: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """One decision of the sink: a deletion (``purged``) or why not. ``kind`` and ``id`` default to the
    candidate's; a dependent deleted with it (a blob, a child row) names its own."""

    status: str
    reason: str | None = None
    dc: str | None = None
    deleted_at_ms: int | None = None
    kind: str | None = None
    id: str | None = None
    # A deletion recorded from an intent (``Journal``): the batch that meant to delete it, so the record is
    # the same whichever attempt or batch writes it, and the ledger keeps one. None: this attempt deleted it.
    intent: str | None = None


class Control(ABC):
    """The sink's reports back to the stateful stage (``purger.streams.control``)."""

    @abstractmethod
    def recheck(self, kind: str, object_id: str, rule: str, at_ms: int) -> None:
        """Look at the object again once the watermark passes ``at_ms``."""

    @abstractmethod
    def report(self, event_type: str, object_id: str, event_time_ms: int, **fields: Any) -> None:
        """Send one of a policy's own control events (``EventType.control``) about ``object_id``."""


class Journal(ABC):
    """The purger's intents (DELF's restoration log, in spirit): before a purge deletes anything of an
    object, it keeps what it is about to delete, each item with the batch that means to delete it
    (``Attempt.batch``). A row found gone is the purger's deletion only if its intent is there: a crash
    between a delete and its record loses the outcome, never the intent, and a row the platform removed
    itself has none. Keys are ``Dependent.key`` (the object itself: ``SELF``); an intent replaces the one
    before it."""

    @abstractmethod
    def intend(self, kind: str, object_id: str, intent: dict[str, str]) -> None:
        """Keep ``intent`` (key -> the batch that means to delete it) for the object, replacing any before."""

    @abstractmethod
    def intended(self, kind: str, object_id: str) -> dict[str, str]:
        """The object's intent (key -> batch); empty when there is none."""


Consistency = Literal["configured", "serial", "quorum", "local_quorum"]


class Tables(ABC):
    """A policy's typed handle on its Cassandra tables, made by the engine on each executor.

    CQL names tables by their reference names in braces (``{users}``, as in ``Policy.tables``); the handle
    puts the configured keyspace and names in, prepares each statement once and runs it at the configured
    consistency, or at the one asked for: ``serial`` reads see the outcome of every lightweight
    transaction, a writer's or a claim's, even one not yet settled.

    Example::

        read = tables.prepare("SELECT state, updated_at FROM {users} WHERE user_id = ?", "serial")
        row = tables.one(read, "u1")             # a named tuple, or None
        claim = tables.prepare("UPDATE {users} SET state = 'purging' WHERE user_id = ? IF state = 'live'")
        tables.applied(claim, "u1")               # True once the lightweight transaction applied
    """

    @abstractmethod
    def prepare(self, cql: str, consistency: Consistency = "configured") -> Any:
        """The prepared statement of ``cql``, its ``{table}`` names resolved."""

    @abstractmethod
    def one(self, statement: Any, *values: Any, serial: bool = False) -> Any | None:
        """The first row the statement returns (a named tuple), or None; ``serial``: read at the serial
        consistency this time, whatever the statement's own."""

    @abstractmethod
    def all(self, statement: Any, *values: Any) -> list[Any]:
        """Every row the statement returns, all pages."""

    @abstractmethod
    def applied(self, statement: Any, *values: Any) -> bool:
        """Run a lightweight transaction (``... IF ...``); whether it applied."""

    @abstractmethod
    def execute(self, statement: Any, *values: Any) -> None:
        """Run a plain write."""


@dataclass
class Resources:
    """What an executor shares between the policies' purges: made once per process by the engine."""

    # Each policy's handle on its tables: ``tables(policy.table_names())``.
    tables: Callable[[dict[str, str]], Tables]
    # purger.sinks.objects.ObjectStores: delete(key, dcs) -> {dc: error or None}
    stores: Any
    control: Control
    journal: Journal
    retry_ms: int  # when to try again after a store or Cassandra failed
    dry_run: bool  # decide and record would_delete; delete nothing


@dataclass(frozen=True, kw_only=True)
class Attempt:
    """The run of a batch a candidate is purged in."""

    # The batch, the same in each of its attempts: ``<query id>/<batch id>``; what its intents name.
    batch: str = ""


@dataclass(frozen=True)
class Dependent:
    """Something that leads from an object and goes before it (a child row, a blob in one data centre):
    its kind, id and data centre as the ledger names them, and its delete, which returns None once done or
    the error of a store that failed (raising is for Cassandra: the whole candidate is retried)."""

    kind: str
    id: str
    delete: Callable[[], str | None]
    dc: str | None = None
    # Whether it is still there, for what another writer's removal of the row may have left (``leftovers``); None:
    # the purger leaves that to reconciliation's orphan sweeps, which record what they delete.
    present: Callable[[], bool] | None = None

    @property
    def key(self) -> str:
        """How the journal keeps it."""
        return json.dumps([self.kind, self.id, self.dc])


@dataclass(frozen=True)
class Kept:
    """Why the row keeps the object now, and when it is worth looking again: ``recheck`` is the rule and the
    wall-clock moment (None: not by the purger; an event will bring the object back)."""

    reason: str
    recheck: Eligibility | None = None


class Purge(ABC):
    """A kind's delete-time half, one per executor process: double-check a candidate against its row and
    delete it, dependents first, yielding one ``Outcome`` per decision. Policies build theirs on
    ``ObjectPurge``, which runs the engine's one protocol."""

    @abstractmethod
    def purge(self, candidate: Candidate, attempt: Attempt) -> Iterator[Outcome]:
        """Double-check the candidate against its row and delete it, dependents first; yield outcomes."""


R = TypeVar("R")


class ObjectPurge(Purge, Generic[R]):
    """The purge protocol, once for every policy; a policy fills in the steps for one kind of object.

    For a candidate, the engine:

    1. reads the row (``read``) at the configured consistency: a decision not to delete (gone, kept, a dry
       run's) deletes nothing, so it costs no Paxos round. A row that carries a claim is read again
       serially, since the deletes that follow rest on that claim. Gone: with the purger's intent to delete
       it in the journal (``Journal``), the purger deleted it: ``purged`` from the intent, for the row and
       the dependents it names (what may be left of them, ``leftovers``, deleted again first); without
       one, ``already_gone`` (another writer removed it), and the leftovers that say they are there deleted
       and recorded as this attempt's.
    2. Not claimed yet (``claimed``): asks the row when it is due (``due``, the policy's rules applied to
       the row). Not due now: ``skipped`` with the policy's reason (``why_kept``) and, unless a dry run, a
       recheck when it will be (no sooner than ``stream.retry_interval`` under the candidate's own rule:
       the stream found it due, so the clocks differ a little). A dry run stops here: ``would_delete`` for
       each dependent and the object, and no recheck. Then the claim (``claim``, a lightweight
       transaction conditioned on the rule or on what was read, so a stale read only makes it fail); lost
       to a writer: ``skipped`` and a recheck.
    3. Claimed (now, or by an attempt that crashed; a dry run leaves it to the real run): the intent to
       delete the dependents (``dependents``) and the row is journalled, then the dependents are deleted in
       order, each one's outcome recorded; a store that failed leaves the row for a recheck after
       ``stream.retry_interval``. Then the row (``delete``, a lightweight transaction: the one step that
       deletes it). Not applied: the row, read again, says why (gone: another writer removed it; changed
       since it was read), and the intent no longer names it.
    4. After the row: what goes after it (``followers``, named in the intent with the row), each one's outcome
       recorded; then, whoever deleted the row, ``released`` (e.g. a message's payload, once nothing refers
       to it).

    A kind with no dependents and a rule that one conditional ``DELETE`` checks sets ``deletes_first``: that
    delete is its claim, so a due row is deleted at once.

    Example::

        class RouterPurge(ObjectPurge[Row]):
            def read(self, candidate, serial=False):
                return self.tables.one(self.read_router, candidate.id, serial=serial)
            def claimed(self, row): return bool(row.purging)
            def due(self, candidate, row): return Eligibility(INACTIVE, epoch_ms(row.last_connected_at) + period)
            def why_kept(self, candidate, row, due): return reason(NOT_YET_DUE, f"inactive at {due.eligible_at_ms}")
            def claim(self, candidate, row): ...
            def dependents(self, candidate, row): ...
            def delete(self, candidate, row): return self.tables.applied(self.delete_router, candidate.id)
    """

    deletes_first: ClassVar[bool] = False

    def __init__(self, resources: Resources, tables: dict[str, str]) -> None:
        self.resources = resources
        self.tables = resources.tables(tables)

    # --- the steps a policy fills in ---

    @abstractmethod
    def read(self, candidate: Candidate, serial: bool = False) -> R | None:
        """The object's row, None when it is gone: at the configured consistency, or at the serial one
        when ``serial`` (``Tables.one(..., serial=serial)``)."""

    def claimed(self, row: R) -> bool:
        """Whether the row carries a purge's claim (this one's, or an attempt's that crashed)."""
        return False

    @abstractmethod
    def due(self, candidate: Candidate, row: R) -> Eligibility | None:
        """When the row makes the object eligible, in wall-clock time, and under which rule: the policy's
        rules applied to the row. None: the row keeps it until an event says otherwise."""

    @abstractmethod
    def why_kept(self, candidate: Candidate, row: R, due: Eligibility | None) -> str:
        """The reason (``category: details``) the row keeps the object: ``due`` is in the future or None."""

    def claim(self, candidate: Candidate, row: R) -> R | Kept:
        """Claim the row for this purge, a lightweight transaction conditioned on what ``read`` saw: the row
        as the claim left it once it applied, else why the object is kept (a writer got in between) and when
        to look again."""
        return row

    def dependents(self, candidate: Candidate, row: R) -> list[Dependent]:
        """What goes before the row, in the order of deletion."""
        return []

    def keep_progress(self, candidate: Candidate, row: R, went: list[Dependent]) -> None:
        """A store failed: keep in the row which of ``dependents`` went, so that the recheck lists only those left
        (and takes those that went from the intent rather than deleting and recording them again). Only for
        dependents listed from the row, which ``dependents`` would still name once gone (a blob in each data
        centre of the row's list): one write when a store fails, none when all go. Default: nothing (a child row
        gone is not listed)."""

    @abstractmethod
    def delete(self, candidate: Candidate, row: R) -> bool:
        """The row's conditional delete: on its claim, or (``deletes_first``) on the candidate's rule; whether
        it applied."""

    def followers(self, candidate: Candidate, row: R) -> list[Dependent]:
        """What goes after the row, once it is deleted (a link that must last as long as the row does: a message's
        reference to its payload), read before the row's delete so that only what is there is named; journalled
        in the row's intent, deleted and recorded as dependents are. For a ``deletes_first`` kind: an attempt
        that claimed the row and crashed before its delete would take a follower gone since for its own."""
        return []

    def leftovers(self, candidate: Candidate) -> list[Dependent]:
        """What may be left of an object whose row is gone, deleted again (idempotently) before the intent's
        records: a dependent of ``dependents`` or a follower, by its ``Dependent.key``, that can be deleted without
        the row. Without the purger's intent, those whose ``present`` says they are there are deleted and
        recorded as this attempt's."""
        return []

    def released(self, candidate: Candidate, row: R | None) -> None:
        """What follows the row's going, whoever deleted it (``row``: as read before, if it was)."""

    def journalled_as(self, candidate: Candidate) -> tuple[str, str]:
        """The (kind, id) its intent is kept under in the journal: the candidate's, unless another purge could
        meet the same pair (an orphan blob of a data centre, beside its payload's own purge)."""
        return candidate.kind, candidate.id

    # --- the protocol ---

    def purge(self, candidate: Candidate, attempt: Attempt) -> Iterator[Outcome]:
        dry_run = self.resources.dry_run
        row = self.read(candidate)
        if row is not None and self.claimed(row) and not dry_run:
            row = self.read(candidate, serial=True)
        if row is None:
            yield from self._gone(candidate)
            return
        claimed_before = self.claimed(row)
        if not claimed_before:
            due = self.due(candidate, row)
            if due is None or due.eligible_at_ms > now_ms():
                yield self._kept(candidate, Kept(self.why_kept(candidate, row, due), due))
                return
            if dry_run:
                yield from (Outcome(WOULD_DELETE, kind=d.kind, id=d.id, dc=d.dc)
                            for d in self.dependents(candidate, row))
                yield Outcome(WOULD_DELETE, self._would_delete_reason(candidate, row, due))
                yield from (Outcome(WOULD_DELETE, kind=d.kind, id=d.id, dc=d.dc)
                            for d in self.followers(candidate, row))
                return
            if not self.deletes_first:
                failpoint(f"before_{candidate.kind}_claim")
                claimed = self.claim(candidate, row)
                if isinstance(claimed, Kept):
                    yield self._kept(candidate, claimed)
                    return
                row = claimed
        elif dry_run:
            yield Outcome(SKIPPED, reason(BEING_DELETED, "by a real run"))
            return
        found = self.dependents(candidate, row)
        following = self.followers(candidate, row)
        intent = yield from self._intend(candidate, found + following, claimed_before, attempt)
        went = yield from self._deleted_all(candidate, found)
        if len(went) < len(found):
            if went:
                self.keep_progress(candidate, row, went)
            return
        failpoint(f"before_{candidate.kind}_delete")
        if not self._deleted(candidate, row):
            del intent[SELF]  # what gone or changed the row, it was not this delete
            self.resources.journal.intend(*self.journalled_as(candidate), intent)
            yield from self._not_deleted(candidate, row)
            return
        failpoint(f"after_{candidate.kind}_delete")
        yield Outcome(PURGED, deleted_at_ms=now_ms())
        yield from self._deleted_all(candidate, following)
        self.released(candidate, row)

    def _deleted_all(self, candidate: Candidate, found: list[Dependent]
                     ) -> Generator[Outcome, None, list[Dependent]]:
        """``found`` deleted in order, each one's outcome; those that went. A store that failed leaves the object
        for a recheck after ``stream.retry_interval``."""
        went = []
        for number, dependent in enumerate(found):
            error = dependent.delete()
            if error is None:
                if number == 0:
                    failpoint(f"after_{candidate.kind}_dependent_delete")
                went.append(dependent)
                yield Outcome(PURGED, kind=dependent.kind, id=dependent.id, dc=dependent.dc, deleted_at_ms=now_ms())
            else:
                yield Outcome(ERROR, error, kind=dependent.kind, id=dependent.id, dc=dependent.dc)
        if len(went) < len(found):
            self._recheck(candidate, Eligibility(candidate.rule, now_ms() + self.resources.retry_ms))
        return went

    def _intend(self, candidate: Candidate, found: list[Dependent], claimed_before: bool, attempt: Attempt
                ) -> Generator[Outcome, None, dict[str, str]]:
        """Keep the intent to delete ``found`` and the row, in ``attempt``'s batch, before any of them goes.
        An attempt that claimed the row before (then crashed, or a store failed) left an intent: what it
        named and is gone now, it deleted; recorded here under its batch (the ledger keeps one record of
        each) and kept in the new intent, so a crash of this attempt records them again."""
        earlier = self.resources.journal.intended(*self.journalled_as(candidate)) if claimed_before else {}
        now = {d.key for d in found}
        done = {key: batch for key, batch in earlier.items() if key != SELF and key not in now}
        yield from recorded_from_intent(done)
        intent = {**done, **{key: attempt.batch for key in now}, SELF: attempt.batch}
        self.resources.journal.intend(*self.journalled_as(candidate), intent)
        return intent

    def _deleted(self, candidate: Candidate, row: R) -> bool:
        """``delete``, settled: a delete that failed may have applied all the same (a timeout, a connection
        lost once it was sent). A serial read, which finishes a Paxos round left in progress, then says:
        gone, it applied; there, it did not, and its error goes on (the candidate is rechecked). A read that
        fails too leaves it unsettled: the error goes on, and the intent settles it at the recheck."""
        try:
            return self.delete(candidate, row)
        except Exception:
            if self.read(candidate, serial=True) is not None:
                raise
            return True

    def _not_deleted(self, candidate: Candidate, row: R) -> Iterator[Outcome]:
        """The conditional delete did not apply: the row changed since it was read. Gone: another writer
        removed it in between. A claim on it: another attempt's, still at work. Otherwise a writer changed it."""
        now = self.read(candidate)
        if now is None:
            yield Outcome(ALREADY_GONE, reason(REMOVED_MEANWHILE, "between the purger's check and its delete"))
            yield from self._deleted_all(candidate, self._left_behind(candidate))
            self.released(candidate, row)
        elif self.claimed(now):
            yield self._kept(candidate, Kept(reason(BEING_DELETED, "by another attempt"),
                                             Eligibility(candidate.rule, now_ms())))
        else:
            due = self.due(candidate, now)
            yield self._kept(candidate, Kept(self.why_kept(candidate, now, due), due))

    def _would_delete_reason(self, candidate: Candidate, row: R, due: Eligibility) -> str | None:
        """A dry run's note on ``would_delete``; a policy may add what would follow."""
        return None

    def _kept(self, candidate: Candidate, kept: Kept) -> Outcome:
        if kept.recheck is not None:
            self._recheck(candidate, kept.recheck)
        return Outcome(SKIPPED, kept.reason)

    def _recheck(self, candidate: Candidate, at: Eligibility) -> None:
        """A recheck, never in a dry run; under the candidate's own rule, no sooner than ``retry_ms``."""
        if self.resources.dry_run:
            return
        soonest = now_ms() + (self.resources.retry_ms if at.rule == candidate.rule else 0)
        self.resources.control.recheck(candidate.kind, candidate.id, at.rule, max(at.eligible_at_ms, soonest))

    def _gone(self, candidate: Candidate) -> Iterator[Outcome]:
        """The row is gone. With the purger's intent to delete it, the purger deleted it: an attempt whose
        outcomes were lost, or a batch whose records the ledger may hold (whether they say ``purged`` or, for
        a delete a timeout left unsettled, ``error``): ``purged`` from the intent, the same record either way,
        for the row and the dependents it names, deleted again first in case (``leftovers``). Without one,
        another writer removed it: ``already_gone``, and what it left (a blob without its row) is the orphan
        sweep's, which records what it deletes. Either way, what follows the row's going."""
        if self.resources.dry_run:
            yield Outcome(ALREADY_GONE)
            return
        intent = self.resources.journal.intended(*self.journalled_as(candidate))
        if SELF not in intent:
            yield Outcome(ALREADY_GONE)
            yield from self._deleted_all(candidate, self._left_behind(candidate))
            self.released(candidate, None)
            return
        again = {leftover.key: leftover for leftover in self.leftovers(candidate)}
        failed = False
        for key in sorted(intent):
            error = again[key].delete() if key in again else None
            if error is not None:
                failed = True
                kind, object_id, dc = json.loads(key)
                yield Outcome(ERROR, error, kind=kind, id=object_id, dc=dc)
        if failed:
            self._recheck(candidate, Eligibility(candidate.rule, now_ms() + self.resources.retry_ms))
            return
        yield from recorded_from_intent(intent)
        self.released(candidate, None)


    def _left_behind(self, candidate: Candidate) -> list[Dependent]:
        """What another writer's removal of the row left that the purger deletes: the ``leftovers`` that say they
        are there (``Dependent.present``)."""
        return [leftover for leftover in self.leftovers(candidate)
                if leftover.present is not None and leftover.present()]


# The object's own key in an intent (``Journal``), beside its dependents' ``Dependent.key``.
SELF = json.dumps(None)


def key_id(values: Iterable[Any]) -> str:
    """How the ledger names a row by its primary key: the value of a one-column key, else the values as a JSON
    list (a ``payload_refs`` row: ``["p1","m1"]``)."""
    found = list(values)
    return str(found[0]) if len(found) == 1 else json.dumps(found, separators=(",", ":"))


def recorded_from_intent(intent: dict[str, str]) -> Iterator[Outcome]:
    """A ``purged`` outcome per deletion an intent names, under the batch that meant it; the object itself last."""
    for key, batch in sorted(intent.items(), key=lambda item: item[0] == SELF):
        details = f"found gone after the intent of batch {batch}"
        if key == SELF:
            yield Outcome(PURGED, reason(EARLIER_ATTEMPT, details), deleted_at_ms=now_ms(), intent=batch)
        else:
            kind, object_id, dc = json.loads(key)
            yield Outcome(PURGED, reason(EARLIER_ATTEMPT, details), kind=kind, id=object_id, dc=dc,
                          deleted_at_ms=now_ms(), intent=batch)


# The field a scanned row gains when its table has ``Scanned.referenced_by``.
REFERENCED = "referenced"


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
                + ((REFERENCED,) if self.referenced_by else ()))


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
    a null cell) is dated by the first reconcile that found the row without its parent, which is no earlier."""

    table: str
    key: tuple[str, ...]
    parent: str
    parent_key: str
    written: str | None = None


def row_event(table: str, object_id: str, event_type: str, at: datetime, **fields: Any) -> dict[str, Any]:
    """One event of a row's re-expression (``Policy.row_events``), as a record of the topics, at the row's
    own timestamp ``at``. Its id is the same at every scan of an unchanged row, so a second feed is a
    duplicate the fold takes as one. Fields that are None are left out; datetimes (naive ones are UTC, as
    the Cassandra driver returns them) become the events' timestamp text, sets and tuples lists."""
    values = {name: _record_value(value) for name, value in fields.items() if value is not None}
    at_text = format_timestamp(_utc(at))
    # Two events of a row may share a type and a time (a user's in two data centres): their fields tell them apart.
    digest = hashlib.sha1(json.dumps(values, sort_keys=True).encode()).hexdigest()[:8]
    return {"event_id": f"reconcile:{table}:{object_id}:{event_type}:{at_text}:{digest}", "type": event_type,
            "event_time": at_text, **values}


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment


def _record_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return format_timestamp(_utc(value))
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


class Settings(BaseModel):
    """A policy's configuration section, ``[policies.<name>]``; a policy's own model adds its keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    # A policy of one's own: the module that defines it (``module.path`` or ``module.path:ClassName``).
    module: str | None = None
    # Topics of its own, read besides ``kafka.topics``.
    topics: list[str] = []


class Policy(ABC):
    """A kind of purge. Subclasses set the class attributes and build their kinds from ``settings``."""

    name: ClassVar[str]
    settings_model: ClassVar[type[Settings]] = Settings
    event_fields: ClassVar[tuple[EventField, ...]]
    event_types: ClassVar[tuple[EventType, ...]]
    # table (by its reference name, as in ``schema``) -> the columns the purger reads or conditions on;
    # ``columns_read`` gives them under the configured names, for ``purger setup`` to check.
    tables: ClassVar[dict[str, tuple[str, ...]]] = {}
    # The reference schema of those tables (CQL, ``{keyspace}`` for the keyspace), for the local stack
    # and the tests; on a real platform the tables are the platform's own.
    schema: ClassVar[str] = ""

    # The tables reconciliation scans, each row one object of the policy (``row_events`` says how it is read).
    scanned: ClassVar[tuple[Scanned, ...]] = ()
    # Its blobs in the object stores, whose orphans reconciliation deletes.
    blobs: ClassVar[tuple[Blobs, ...]] = ()
    # Its tables of dependent rows, whose orphans (their parent row gone) reconciliation deletes.
    orphan_rows: ClassVar[tuple[OrphanRows, ...]] = ()

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @property
    @abstractmethod
    def kinds(self) -> tuple[ObjectKind, ...]:
        """Its kinds of object, each with state and one timer per object."""

    @abstractmethod
    def purges(self, resources: Resources) -> dict[str, Purge]:
        """Its delete-time half on an executor, a purge per kind (an ``ObjectPurge`` each; statements are
        prepared here, once)."""

    def row_events(self, table: str, row: dict[str, Any]) -> list[dict[str, Any]]:
        """The reverse of the fold, for reconciliation: the events that would have produced ``row`` of
        ``table`` (a ``Scanned`` table, by its reference name; ``row`` maps its ``columns`` to the driver's
        values), as records of the topics (``row_event``), with the row's own timestamps as event times.
        Folded, they give the object the state the row says it has: due when the row is due by the
        policy's rules, kept when it is kept. A policy's own control types may be among them (only the
        purger writes the reconcile topic). [] when the row says nothing the stream can use (a row being
        written, a claimed row). The default: the policy has no ``scanned`` tables."""
        return []

    def page_verdicts(self, table: str, columns: dict[str, list[Any]]) -> "PageVerdicts | None":
        """What each row of a page of ``table`` says on its own, judged on whole columns (column name ->
        the page's values, as ``row_events`` gets them one row at a time): exactly what folding each row's
        ``row_events`` gives (``purger.reconcile.verdict.row_verdict``), only faster, for the large tables of a
        reconcile. None, the default: the rows are judged one at a time."""
        return None

    def report_fields(self, day: date) -> dict[str, str]:
        """Extra fields of its rows in the daily report for ``day`` (e.g. the payment store's)."""
        return {}

    def table_names(self) -> dict[str, str]:
        """Each table of ``tables``, by its reference name, -> the name its settings give it. A policy whose
        settings name its tables says how; by default the reference names are the names."""
        return {table: table for table in self.tables}

    def columns_read(self) -> dict[str, frozenset[str]]:
        """The tables it reads, by their configured names, each with the columns it reads or conditions on,
        reconciliation's scans included: what ``purger setup`` and ``purger run`` check.

        Example::

            load_policy("mailbox", {"payloads_table": "blobs"}).columns_read()["blobs"]
            # frozenset({'payload_id', 'dcs', 'state', 'last_ref_at'})
        """
        names = self.table_names()
        read = {names[table]: set(columns) for table, columns in self.tables.items()}
        for scanned in self.scanned:
            read.setdefault(names[scanned.table], set()).update(scanned.columns)
        for orphans in self.orphan_rows:
            read.setdefault(names[orphans.table], set()).update(orphans.key + ((orphans.written,) if orphans.written else ()))
            read.setdefault(names[orphans.parent], set()).add(orphans.parent_key)
        return {table: frozenset(columns) for table, columns in read.items()}


