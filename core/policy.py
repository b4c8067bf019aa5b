"""The policy interface (SPEC 7.4): all the engine knows about a kind of object.

A policy is one kind of purge (``mailbox``, ``rule_events``, ``users``,
``units_of_work``, or one of a user's own). It says:

- its events: their fields (``EventField``) and types (``EventType``: which
  object each is about, by which id field, with which required fields);
- per kind of object (``ObjectKind``): the state kept per object and how
  events fold into it (any order and duplicates give the same state), and its
  eligibility, from the rules (``Rule``: an event-time deadline beside the CQL
  check the row must pass at delete time);
- its delete-time half (``Purger``), built on each executor from the shared
  ``Resources``: the double-checked deletes in its order of deletion, the
  blobs if any, one ``Outcome`` per decision;
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
from datetime import date
from typing import Any, Callable, ClassVar, Generic, Iterable, Iterator, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from purger.core.times import now_ms
from purger.core.vocabulary import ALREADY_GONE, EARLIER_ATTEMPT, PURGED

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
    """One row of a policy's rule table: when the retention period started, in event time, and the CQL
    condition the row must satisfy at delete time, where ``?`` is the wall clock minus ``period_ms``."""

    name: str
    period_ms: int
    started_at: Callable[[S], int | None]
    check: str

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
    """An object the stream found due: what the sink hands to the policy's ``Purger``."""

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


class Control(ABC):
    """The sink's reports back to the stateful stage (``streams.control``)."""

    @abstractmethod
    def recheck(self, kind: str, object_id: str, rule: str, at_ms: int) -> None:
        """Look at the object again once the watermark passes ``at_ms``."""

    @abstractmethod
    def report(self, event_type: str, object_id: str, event_time_ms: int, **fields: Any) -> None:
        """Send one of a policy's own control events (``EventType.control``) about ``object_id``."""


class Journal(ABC):
    """What a claimed purge is about to delete, kept before it deletes any (``delete_dependents``): a crash
    between two deletes loses the outcomes of those made, and the retry, finding them gone, could not tell
    which they were. Entries are per batch (``Attempt.batch``), so only a retry of the same batch reads one."""

    @abstractmethod
    def keep(self, kind: str, object_id: str, batch: str, rows: set[str]) -> None:
        """Keep ``rows`` (``kind:id`` of each dependent) for ``batch``'s purge of the object."""

    @abstractmethod
    def kept(self, kind: str, object_id: str, batch: str) -> set[str] | None:
        """What ``batch`` kept for the object; None if it kept nothing."""


@dataclass
class Resources:
    """What an executor shares between the policies' purgers: made once per process."""

    session: Any  # cassandra.cluster.Session
    keyspace: str
    stores: Any  # sinks.objects.ObjectStores: delete(key, dcs) -> {dc: error or None}
    control: Control
    journal: Journal
    retry_ms: int  # when to try again after a store or Cassandra failed
    dry_run: bool  # decide and record would_delete; delete nothing


@dataclass(frozen=True)
class Attempt:
    """The run of a batch a candidate is purged in."""

    # A retried batch or task: an object found gone was deleted by the attempt that failed, whose
    # outcomes were lost with it, so it is recorded as purged now.
    retry: bool
    # Fault injection for the kill tests (``sinks.attempts.failpoint``).
    failpoint: Callable[[str], None] = lambda name: None
    # The batch, the same in each of its attempts: ``<query id>/<batch id>``.
    batch: str = ""


@dataclass(frozen=True)
class Dependent:
    """A row that leads from an object and goes before it: its kind and id as the ledger names them, and
    its delete."""

    kind: str
    id: str
    delete: Callable[[], Any]


def delete_dependents(candidate: Candidate, found: list[Dependent], claimed_before: bool, journal: Journal,
                      attempt: Attempt, failpoint: str) -> Iterator[Outcome]:
    """Delete a claimed object's dependents in order, each one's outcome yielded, once the journal keeps
    them. ``claimed_before``: the claim was found, made by an attempt that failed; in a retry of its batch,
    each dependent that attempt kept and that is gone now is recorded as purged by it."""
    keys = {f"{d.kind}:{d.id}" for d in found}
    kept = journal.kept(candidate.kind, candidate.id, attempt.batch) if claimed_before and attempt.retry else None
    if kept is None:
        journal.keep(candidate.kind, candidate.id, attempt.batch, keys)
    else:
        yield from _deleted_earlier(kept - keys)
    for number, dependent in enumerate(found):
        dependent.delete()
        if number == 0:
            attempt.failpoint(failpoint)
        yield Outcome(PURGED, kind=dependent.kind, id=dependent.id, deleted_at_ms=now_ms())


def found_gone(candidate: Candidate, journal: Journal | None, attempt: Attempt, dry_run: bool) -> Iterator[Outcome]:
    """The object's row is gone. In a retried batch the attempt that failed deleted it, and the dependents
    it kept in the ``journal`` (None: the object has none), all recorded as purged now; otherwise
    ``already_gone``."""
    if not attempt.retry or dry_run:
        yield Outcome(ALREADY_GONE)
        return
    if journal is not None:
        yield from _deleted_earlier(journal.kept(candidate.kind, candidate.id, attempt.batch) or set())
    yield Outcome(PURGED, EARLIER_ATTEMPT, deleted_at_ms=now_ms())


def _deleted_earlier(keys: set[str]) -> Iterator[Outcome]:
    for key in sorted(keys):
        kind, object_id = key.split(":", 1)
        yield Outcome(PURGED, EARLIER_ATTEMPT, kind=kind, id=object_id, deleted_at_ms=now_ms())


class Purger(ABC):
    """A policy's delete-time half, one per executor process."""

    @abstractmethod
    def purge(self, candidate: Candidate, attempt: Attempt) -> Iterator[Outcome]:
        """Double-check the candidate against its row and delete it, dependents first; yield outcomes."""


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

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @property
    @abstractmethod
    def kinds(self) -> tuple[ObjectKind, ...]:
        """Its kinds of object, each with state and one timer per object."""

    @abstractmethod
    def purger(self, resources: Resources) -> Purger:
        """Its delete-time half on an executor (prepare statements here, once)."""

    def report_fields(self, day: date) -> dict[str, str]:
        """Extra fields of its rows in the daily report for ``day`` (e.g. the payment store's)."""
        return {}

    def table_names(self) -> dict[str, str]:
        """Each table of ``tables``, by its reference name, -> the name its settings give it. A policy whose
        settings name its tables says how; by default the reference names are the names."""
        return {table: table for table in self.tables}

    def columns_read(self) -> dict[str, frozenset[str]]:
        """The tables it reads, by their configured names, each with the columns it reads or conditions on:
        what ``purger setup`` and ``purger run`` check.

        Example::

            load_policy("mailbox", {"payloads_table": "blobs"}).columns_read()["blobs"]
            # frozenset({'payload_id', 'dcs', 'state', 'last_ref_at'})
        """
        names = self.table_names()
        return {names[table]: frozenset(columns) for table, columns in self.tables.items()}


# The engine's own fields, on every event (SPEC section 2) and on its control events (streams.control).
COMMON_FIELDS = ("event_id", "type", "event_time")


class PolicySet:
    """The enabled policies, seen as the engine needs them: by kind, by event type, and the union of
    their event fields. ``ignored_types`` are the event types of the built-in policies that are not
    enabled: their records are ignored and counted, not dead-lettered.

    Example::

        policies = PolicySet([mailbox], ignored_types={"user_added", "user_removed"})
        policies.kind("message").fold(None, events)
    """

    def __init__(self, policies: list[Policy], ignored_types: Iterable[str] = ()) -> None:
        self.policies = list(policies)
        self.ignored_types = frozenset(ignored_types)
        self._kinds: dict[str, tuple[Policy, ObjectKind]] = {}
        self.event_types: dict[str, EventType] = {}
        self.fields: dict[str, EventField] = {}
        for policy in self.policies:
            for kind in policy.kinds:
                if kind.name in self._kinds:
                    raise ValueError(f"policies.{policy.name}: kind {kind.name!r} is also "
                                     f"policy {self._kinds[kind.name][0].name!r}'s")
                self._kinds[kind.name] = (policy, kind)
            for event_type in policy.event_types:
                if event_type.name in self.event_types:
                    raise ValueError(f"policies.{policy.name}: event type {event_type.name!r} is also another "
                                     "policy's; give it a name of its own")
                self.event_types[event_type.name] = event_type
            for f in policy.event_fields:
                known = self.fields.setdefault(f.name, f)
                if known.type != f.type:
                    raise ValueError(f"policies.{policy.name}: event field {f.name!r} is a {f.type} here and a "
                                     f"{known.type} in another policy; rename one")

    @property
    def kinds(self) -> list[ObjectKind]:
        return [kind for _, kind in self._kinds.values()]

    def kind(self, name: str) -> ObjectKind:
        return self._kinds[name][1]

    def policy_of(self, kind: str) -> Policy:
        return self._kinds[kind][0]

    def id_field(self, kind: str) -> str:
        """The field that holds an object's id in its events (its first event type's)."""
        return next(t.id_field for t in self.event_types.values() if t.kind == kind)
