"""When an object becomes eligible for purge: SPEC section 4, one row per rule.

Each rule has two halves that say the same thing: ``eligible_at`` reads the
stream's state and says when, in event time, the retention period ends; and
``check`` is the CQL condition that the sink puts on its conditional ``DELETE``,
compared at delete time with ``now - period`` (the one bound parameter). The
stream's answer is a hint; the check on the row is the truth.

=====================  =====================================================  ==================
rule                   eligible when                                          period [default]
=====================  =====================================================  ==================
expired_by_counter     extract_count = 0 and it has been 0 for the period     expired_ttl [30d]
expired_by_date        extract_until is set and extract_until + period passed expired_ttl [30d]
incomplete             complete = false and created_at + period passed        incomplete_ttl [2d]
deleted                deleted (or the row is gone) and period passed since   deleted_ttl [0]
payload                no reference, and period passed since the last went    payload_grace [12h]
=====================  =====================================================  ==================

The earliest rule that applies wins. Inline payloads live in the message row
and go with it.

Example::

    from streams.rules import Retention, eligibility
    eligibility(state, Retention())  # Eligibility(rule='expired_by_counter', eligible_at_ms=...)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from core.config import RetentionConfig
from streams.state import MessageState, PayloadState

EXPIRED_BY_COUNTER = "expired_by_counter"
EXPIRED_BY_DATE = "expired_by_date"
INCOMPLETE = "incomplete"
DELETED = "deleted"
PAYLOAD = "payload"


def _ms(period) -> int:
    return int(period.total_seconds() * 1000)


@dataclass(frozen=True)
class Retention:
    """The periods of SPEC section 4, in milliseconds, with the spec's defaults."""

    expired_ttl_ms: int = 30 * 86_400_000
    incomplete_ttl_ms: int = 2 * 86_400_000
    deleted_ttl_ms: int = 0
    payload_grace_ms: int = 12 * 3_600_000

    @classmethod
    def from_config(cls, config: RetentionConfig) -> "Retention":
        return cls(
            expired_ttl_ms=_ms(config.expired_ttl),
            incomplete_ttl_ms=_ms(config.incomplete_ttl),
            deleted_ttl_ms=_ms(config.deleted_ttl),
            payload_grace_ms=_ms(config.payload_grace),
        )


@dataclass(frozen=True)
class Eligibility:
    rule: str
    eligible_at_ms: int


@dataclass(frozen=True)
class Rule:
    name: str
    period: Callable[[Retention], int]
    # When the period started, in event time, or None if the rule does not apply.
    started_at: Callable[[MessageState], int | None]
    # The CQL condition on the row at delete time; `?` is now minus the period.
    check: str

    def eligible_at(self, state: MessageState, retention: Retention) -> int | None:
        start = self.started_at(state)
        return None if start is None else start + self.period(retention)


MESSAGE_RULES: dict[str, Rule] = {
    rule.name: rule
    for rule in (
        Rule(EXPIRED_BY_COUNTER, lambda r: r.expired_ttl_ms,
             lambda s: s.counter_zero_since,
             # updated_at is the row's last change, so the counter has been 0 at least since then.
             "extract_count = 0 AND updated_at <= ?"),
        Rule(EXPIRED_BY_DATE, lambda r: r.expired_ttl_ms,
             lambda s: s.extract_until_ms,
             "extract_until <= ?"),
        Rule(INCOMPLETE, lambda r: r.incomplete_ttl_ms,
             lambda s: s.created_at_ms if s.complete is False else None,
             "complete = false AND created_at <= ?"),
        Rule(DELETED, lambda r: r.deleted_ttl_ms,
             lambda s: s.deleted_at_ms,
             "deleted = true AND updated_at <= ?"),
    )
}


def eligibility(state: MessageState | None, retention: Retention) -> Eligibility | None:
    """The earliest rule under which the message becomes eligible, or None if none applies."""
    if state is None:
        return None
    found = [
        Eligibility(name, at) for name, rule in MESSAGE_RULES.items()
        if (at := rule.eligible_at(state, retention)) is not None
    ]
    return min(found, key=lambda e: (e.eligible_at_ms, e.rule), default=None)


def payload_eligibility(state: PayloadState | None, retention: Retention) -> Eligibility | None:
    """A payload is eligible ``payload_grace`` after its last referring message went, unless relinked since."""
    if state is None or not state.released:
        return None
    return Eligibility(PAYLOAD, state.released_at_ms + retention.payload_grace_ms)
