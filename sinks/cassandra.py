"""Double-checked deletes of message rows: the check and the delete are one conditional statement.

The stream's state is a hint; the row is the truth. Each rule of SPEC section 4
becomes an ``IF`` clause on the ``DELETE`` (a lightweight transaction), compared
with the wall clock at delete time, so a revival that lands between the
stream's decision and the delete makes the delete not apply.

Example::

    deleter = MessageDeleter(session, config.cassandra, config.retention)
    deleter.delete("m1", "expired_by_counter")  # RowOutcome(status='purged', reason=None)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Callable

from cassandra import ConsistencyLevel

from purger.config import CassandraConfig, RetentionConfig
from streams.rules import EXPIRED_BY_COUNTER

if TYPE_CHECKING:
    from cassandra.cluster import Session

PURGED = "purged"
ALREADY_GONE = "already_gone"
SKIPPED = "skipped"


@dataclass(frozen=True)
class RowOutcome:
    status: str  # purged | already_gone | skipped
    reason: str | None = None  # why a skipped row was kept


@dataclass(frozen=True)
class _ConditionalDelete:
    condition: str  # the IF clause, with one bound parameter: the cutoff (now - ttl)
    ttl: timedelta  # how long the condition must have held, measured from the row's updated_at
    why_kept: Callable[[dict], str]  # explains a not-applied delete from the row's current values


def _counter_kept(existing: dict) -> str:
    if existing.get("extract_count") != 0:
        return f"revived: extract_count is {existing.get('extract_count')}"
    return "not yet due: the counter has not been 0 for expired_ttl"


class MessageDeleter:
    """Prepared conditional deletes, one per rule; ``delete`` runs the one for a candidate's rule."""

    def __init__(self, session: "Session", cassandra: CassandraConfig, retention: RetentionConfig) -> None:
        self.session = session
        table = f"{cassandra.keyspace}.{cassandra.messages_table}"
        self.rules: dict[str, _ConditionalDelete] = {
            # extract_count = 0 and it has been 0 for expired_ttl; updated_at is the row's last change.
            EXPIRED_BY_COUNTER: _ConditionalDelete(
                "extract_count = 0 AND updated_at <= ?", retention.expired_ttl, _counter_kept
            ),
        }
        self.statements = {
            rule: session.prepare(f"DELETE FROM {table} WHERE message_id = ? IF {check.condition}")
            for rule, check in self.rules.items()
        }
        self.exists = session.prepare(f"SELECT message_id FROM {table} WHERE message_id = ?")
        self.exists.consistency_level = ConsistencyLevel.SERIAL

    def delete(self, message_id: str, rule: str) -> RowOutcome:
        check = self.rules[rule]
        cutoff = datetime.now(timezone.utc) - check.ttl
        result = self.session.execute(self.statements[rule], (message_id, cutoff))
        if result.was_applied:
            return RowOutcome(PURGED)
        existing = result.one()._asdict()
        if self._gone(message_id, existing):
            # For example an earlier attempt of this batch deleted the row just before a crash.
            return RowOutcome(ALREADY_GONE)
        return RowOutcome(SKIPPED, check.why_kept(existing))

    def _gone(self, message_id: str, existing: dict) -> bool:
        # A not-applied LWT on a missing row returns nulls for the checked columns, as a row whose
        # columns are null would; only then is a serial read needed to tell the two apart.
        if any(value is not None for name, value in existing.items() if name != "applied"):
            return False
        return self.session.execute(self.exists, (message_id,)).one() is None
