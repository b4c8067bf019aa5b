"""The enabled policies as the engine sees them (not part of the plug-in API: ``purger.core.policy`` is).

Example::

    from purger.core.policy_set import PolicySet
    policies = PolicySet([mailbox], ignored_types={"user_added", "user_removed"})
    policies.kind("message").fold(None, events)
"""

from __future__ import annotations

from typing import Iterable

from purger.core.events import EventField, EventType, ObjectKind
from purger.core.policy import Policy

# The engine's own fields, on every event (docs/reference.md, Events) and on its control events (streams.control).
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
