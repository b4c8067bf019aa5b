"""When a message becomes eligible for purge (SPEC section 4), in event time.

Each rule reads like its row in the spec's table: a condition on the state and
the moment the retention period started. The earliest rule that applies wins.
These are the stream's hints; ``sinks.cassandra`` re-checks the same rule
against the Cassandra row at delete time.

Example::

    from streams.rules import Retention, eligibility
    eligibility(state, Retention(expired_ttl_ms=30 * 86_400_000))
    # Eligibility(rule='expired_by_counter', eligible_at_ms=...)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

from purger.config import RetentionConfig
from streams.state import MessageState

EXPIRED_BY_COUNTER = "expired_by_counter"


@dataclass(frozen=True)
class Retention:
    """The periods of SPEC section 4, in milliseconds."""

    expired_ttl_ms: int = int(timedelta(days=30).total_seconds() * 1000)

    @classmethod
    def from_config(cls, config: RetentionConfig) -> "Retention":
        return cls(expired_ttl_ms=int(config.expired_ttl.total_seconds() * 1000))


@dataclass(frozen=True)
class Eligibility:
    rule: str
    eligible_at_ms: int


def _expired_by_counter(state: MessageState, retention: Retention) -> int | None:
    # extract_count = 0, and it has been 0 for expired_ttl
    if state.extract_count == 0 and state.counter_zero_since is not None:
        return state.counter_zero_since + retention.expired_ttl_ms
    return None


RULES: dict[str, Callable[[MessageState, Retention], int | None]] = {
    EXPIRED_BY_COUNTER: _expired_by_counter,
}


def eligibility(state: MessageState | None, retention: Retention) -> Eligibility | None:
    """The earliest rule under which the message becomes eligible, or None if none applies."""
    if state is None:
        return None
    found = [
        Eligibility(rule, at) for rule, when in RULES.items() if (at := when(state, retention)) is not None
    ]
    return min(found, key=lambda e: e.eligible_at_ms, default=None)
