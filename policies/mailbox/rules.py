"""When a message or a payload is eligible for purge: the mailbox rules (docs/reference.md, Rules), one row per rule.

Each rule has two halves that say the same thing: ``started_at`` reads the
stream's state and says when, in event time, the retention period started; and
``check`` is the CQL condition that the purger puts on its conditional
``DELETE``, compared at delete time with ``now - period`` (the one bound
parameter). The stream's answer is a hint; the check on the row is the truth.

=====================  =====================================================  ==================
rule                   eligible when                                          period [default]
=====================  =====================================================  ==================
expired_by_counter     extract_count = 0 and it has been 0 for the period     expired_ttl [30d]
expired_by_date        extract_until is set and extract_until + period passed expired_ttl [30d]
incomplete             complete = false and created_at + period passed        incomplete_ttl [2d]
deleted                deleted (or the row is gone) and period passed since   deleted_ttl [0]
payload                no reference, and period passed since the last went    payload_grace [12h]
=====================  =====================================================  ==================

A row that lacks the ``updated_at`` the counter and deleted rules run from (written by no platform
writer, which always sets it) is dated by the write time of its cells (``deletes.last_change``), and its
delete carries the rule's ``undated`` condition (``Rule.undated``): ``updated_at = null`` in place of
``updated_at <= ?``, the period having been checked on the row read. Any platform write in between sets
``updated_at``, so the delete does not apply.

The earliest message rule that applies wins. Inline payloads live in the
message row and go with it. The payload's check is the writer contract
(docs/policies.md, mailbox): no ``payload_refs`` row, then ``live -> deleting`` on the
``last_ref_at`` seen, which must be the grace old.

Example::

    from purger.policies.mailbox.rules import Retention, eligibility
    eligibility(state, Retention())  # Eligibility(rule='expired_by_counter', eligible_at_ms=...)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from purger.core.times import duration_ms
from purger.core.events import Eligibility, Rule, earliest
from purger.policies.mailbox.state import MessageState, PayloadState

if TYPE_CHECKING:
    from purger.policies.mailbox import MailboxSettings

EXPIRED_BY_COUNTER = "expired_by_counter"
EXPIRED_BY_DATE = "expired_by_date"
INCOMPLETE = "incomplete"
DELETED = "deleted"
PAYLOAD = "payload"


@dataclass(frozen=True)
class Retention:
    """The periods of docs/reference.md, Rules, in milliseconds, with their defaults."""

    expired_ttl_ms: int = 30 * 86_400_000
    incomplete_ttl_ms: int = 2 * 86_400_000
    deleted_ttl_ms: int = 0
    payload_grace_ms: int = 12 * 3_600_000

    @classmethod
    def from_settings(cls, settings: "MailboxSettings") -> "Retention":
        return cls(
            expired_ttl_ms=duration_ms(settings.expired_ttl),
            incomplete_ttl_ms=duration_ms(settings.incomplete_ttl),
            deleted_ttl_ms=duration_ms(settings.deleted_ttl),
            payload_grace_ms=duration_ms(settings.payload_grace),
        )

    @cached_property
    def message_rules(self) -> dict[str, Rule[MessageState]]:
        """The message rules, in the order of docs/reference.md, Rules, each with its deadline and its checks at
        delete time."""
        return {rule.name: rule for rule in (
            Rule(EXPIRED_BY_COUNTER, self.expired_ttl_ms,
                 lambda s: s.counter_zero_since,
                 # updated_at is the row's last change, so the counter has been 0 at least since then.
                 "extract_count = 0 AND updated_at <= ?",
                 undated="extract_count = 0 AND updated_at = null"),
            Rule(EXPIRED_BY_DATE, self.expired_ttl_ms,
                 lambda s: s.extract_until_ms,
                 "extract_until <= ?"),
            Rule(INCOMPLETE, self.incomplete_ttl_ms,
                 lambda s: s.created_at_ms if s.complete is False else None,
                 "complete = false AND created_at <= ?"),
            Rule(DELETED, self.deleted_ttl_ms,
                 lambda s: s.deleted_at_ms,
                 "deleted = true AND updated_at <= ?",
                 undated="deleted = true AND updated_at = null"),
        )}

    @cached_property
    def payload_rule(self) -> Rule[PayloadState]:
        """Released and not linked since: the grace runs from the last referring message's going."""
        # At delete time, by the writer contract (docs/policies.md): no payload_refs row, and the claim
        # conditions on the last_ref_at read, at least payload_grace old.
        return Rule(PAYLOAD, self.payload_grace_ms, lambda s: s.released_at_ms if s.released else None)


def eligibility(state: MessageState | None, retention: Retention) -> Eligibility | None:
    """The earliest rule under which the message becomes eligible, or None if none applies."""
    return earliest(retention.message_rules.values(), state)


def payload_eligibility(state: PayloadState | None, retention: Retention) -> Eligibility | None:
    """A payload is eligible ``payload_grace`` after its last referring message went, unless relinked since."""
    return earliest((retention.payload_rule,), state)
