"""Legal holds (docs/operations.md, "Legal holds"): a scope, ``KIND:ID``, under which nothing is deleted while
its hold stands, whatever the rules say. A policy names the scope kinds it takes part in (``Policy.hold_scopes``:
its kinds, and the mailbox's ``mailbox``) and the scopes each object falls under (``ObjectPurge.scopes``: a
message's own and its mailbox's). The purge protocol asks ``Holds.held`` before it claims or deletes anything;
a candidate found held is ``skipped`` with reason ``held`` and kept under the hold (``Holds.keep``) so that the
release looks at it again, with no event needed. The engine's ``Holds`` is ``purger.sinks.holds.CassandraHolds``.

Example::

    scope = Scope.parse("mailbox:alice")          # Scope(kind='mailbox', id='alice')
    str(scope)                                    # 'mailbox:alice'
    holds.held(["message:m1", "mailbox:alice"])   # Hold(scope='mailbox:alice', reason='case 42', ...) or None
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from purger.core.times import format_epoch_ms
from purger.core.vocabulary import HELD, reason

__all__ = ["Hold", "Holds", "Scope"]


@dataclass(frozen=True)
class Scope:
    """What a hold covers: every object of ``kind`` ``id`` (``message:m1``), or under it (``mailbox:alice``)."""

    kind: str
    id: str

    @classmethod
    def parse(cls, text: str) -> Scope:
        """``KIND:ID``; the id may hold colons, the kind may not. A ``ValueError`` says what to write."""
        kind, colon, object_id = text.partition(":")
        if not colon or not kind.strip() or not object_id:
            raise ValueError(f"scope {text!r}: write KIND:ID, e.g. mailbox:alice or message:m1")
        return cls(kind.strip(), object_id)

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}"


@dataclass(frozen=True)
class Hold:
    """A hold in force: its scope, why, who placed it and when (epoch milliseconds; None: a platform's hold
    that did not say)."""

    scope: str
    reason: str
    placed_by: str
    placed_at_ms: int | None

    def why(self) -> str:
        """The reason of a candidate skipped under it (``held: ...``)."""
        since = f" since {format_epoch_ms(self.placed_at_ms)}" if self.placed_at_ms is not None else ""
        by = f" by {self.placed_by}" if self.placed_by else ""
        return reason(HELD, f"{self.scope}{since}{by}: {self.reason}")


class Holds(ABC):
    """The holds in force, as the purge protocol reads them on an executor."""

    @abstractmethod
    def held(self, scopes: list[str]) -> Hold | None:
        """The first hold in force over any of ``scopes``: one that was placed before this read began is seen,
        from any data centre; None when none is. No scopes: no read."""

    @abstractmethod
    def keep(self, hold: Hold, kind: str, object_id: str, rule: str) -> bool:
        """Keep a candidate found held under ``hold``, for its release to look at it again; False when the hold
        was released since it was read: the candidate is looked at again soon instead."""
