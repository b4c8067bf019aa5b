"""A policy's events, the kinds of object they fold into, and the rules that make those objects due: the
event-time half of the policy interface (docs/policies.md, "The policy interface"), what the stateful stage
knows of a policy. A policy of one's own imports these from ``purger.core.policy``.

- its events: their fields (``EventField``) and types (``EventType``: which
  object each is about, by which id field, with which required fields);
- per kind of object (``ObjectKind``): the state kept per object and how
  events fold into it (any order and duplicates give the same state), and its
  eligibility, from the rules (``Rule``: an event-time deadline beside the CQL
  condition its conditional delete or claim carries at delete time).

The engine keys state by ``(kind, id)``; every kind belongs to exactly one
policy, so the kind names the policy as well as the object.

Example::

    inactive = Rule("inactive", 3_600_000, started_at=lambda state: state.last_connected_ms)
    earliest([inactive], state)   # Eligibility(rule='inactive', eligible_at_ms=state.last_connected_ms + 3_600_000)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, ClassVar, Generic, Iterable, Literal, TypeVar

from purger.core.times import from_epoch_ms, now_ms

__all__ = ["Eligibility", "EventField", "EventType", "FieldType", "Link", "ObjectKind", "Rule", "earliest"]

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
    claim conditions on the very values read instead (a calendar rule, a writer contract).

    ``undated``: the condition carried instead on a row read without the timestamp ``condition`` compares with
    its ``?`` (that timestamp ``= null``), which is dated by its cells' write time (``dated``); None:
    ``condition`` compares no such timestamp (``purge_protocol.RuleWrite``)."""

    name: str
    period_ms: int
    started_at: Callable[[S], int | None]
    condition: str | None = None
    undated: str | None = None

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
