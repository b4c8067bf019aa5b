"""The Cassandra side of a purge: double-checked deletes of message rows, references and payload rows.

The stream's state is a hint; the row is the truth. Each rule of
``streams.rules`` puts its ``check`` on a conditional ``DELETE`` (a lightweight
transaction), compared with the wall clock at delete time, so the check and the
delete are one atomic step and a revival that lands in between makes the delete
not apply. When it does not apply, the row says why, and when (by the same
rules) it is worth looking again.

Payload rows follow the writer contract of the README: a payload goes from
``live`` to ``deleting`` only by a conditional update on the ``last_ref_at`` seen
when no reference was left; writers link only while it is ``live``.

Example::

    deleter = MessageDeleter(session, config.cassandra, Retention())
    deleter.delete("m1", "expired_by_counter")  # RowOutcome(status='purged', ...)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from cassandra import ConsistencyLevel

from core.config import CassandraConfig
from streams.events import format_epoch_ms
from streams.rules import MESSAGE_RULES, Eligibility, Retention, eligibility
from streams.state import MessageState

if TYPE_CHECKING:
    from cassandra.cluster import Session

PURGED = "purged"
ALREADY_GONE = "already_gone"
SKIPPED = "skipped"
WOULD_DELETE = "would_delete"  # a dry run's decision
LIVE = "live"
DELETING = "deleting"


def epoch_ms(moment: datetime | None) -> int | None:
    """Cassandra's timestamps come back naive, in UTC."""
    if moment is None:
        return None
    return int(moment.replace(tzinfo=timezone.utc).timestamp() * 1000)


def now_ms() -> int:
    return int(datetime.now(timezone.utc).timestamp() * 1000)


def _cutoff(period_ms: int) -> datetime:
    return datetime.fromtimestamp((now_ms() - period_ms) / 1000, timezone.utc)


def row_state(row: dict[str, Any]) -> MessageState:
    """A message row seen as the stream would see it: every field set by its last change, at ``updated_at``."""
    updated = epoch_ms(row.get("updated_at"))
    return MessageState(
        mailbox=row.get("mailbox"), payload_id=row.get("payload_id"), payload_size=row.get("payload_size"),
        inline=row.get("inline_payload") is not None, created_at_ms=epoch_ms(row.get("created_at")),
        enqueue_complete=row.get("complete"),
        extract_count=row.get("extract_count"), extract_count_at_ms=updated,
        extract_until_ms=epoch_ms(row.get("extract_until")), extract_until_at_ms=updated,
        deleted_at_ms=updated if row.get("deleted") else None,
    )


@dataclass(frozen=True)
class RowOutcome:
    status: str  # purged | would_delete | already_gone | skipped
    # Why a row was kept, as "<category>: <details>" (the daily report counts the categories).
    reason: str | None = None
    # The message's payload, as the candidate or the row said.
    payload_id: str | None = None
    inline: bool | None = None
    # For a skipped row that a rule will make eligible later: when to look again.
    recheck: Eligibility | None = None


def _why_kept(state: MessageState, due: Eligibility | None) -> str:
    if due is None:
        return (f"live: extract_count {state.extract_count}, extract_until {state.extract_until_ms}, "
                f"complete {state.complete}")
    return f"not yet due: {due.rule} at {format_epoch_ms(due.eligible_at_ms)}"


class MessageDeleter:
    """Prepared statements on the messages and payload_refs tables; one instance per executor process."""

    def __init__(self, session: "Session", cassandra: CassandraConfig, retention: Retention) -> None:
        self.session = session
        self.retention = retention
        messages = f"{cassandra.keyspace}.{cassandra.messages_table}"
        refs = f"{cassandra.keyspace}.{cassandra.payload_refs_table}"
        self.conditional_delete = {
            name: session.prepare(f"DELETE FROM {messages} WHERE message_id = ? IF {rule.check}")
            for name, rule in MESSAGE_RULES.items()
        }
        self.read = session.prepare(f"SELECT * FROM {messages} WHERE message_id = ?")
        # Serial: sees the outcome of every lightweight transaction, including a not-yet-settled one.
        self.read.consistency_level = ConsistencyLevel.SERIAL
        self.delete_ref = session.prepare(f"DELETE FROM {refs} WHERE payload_id = ? AND message_id = ?")
        self.two_refs = session.prepare(f"SELECT message_id FROM {refs} WHERE payload_id = ? LIMIT 2")

    def row(self, message_id: str) -> dict[str, Any] | None:
        found = self.session.execute(self.read, (message_id,)).one()
        return found._asdict() if found else None

    def delete(self, message_id: str, rule: str, payload_id: str | None = None,
               inline: bool | None = None) -> RowOutcome:
        """Delete the row if ``rule`` holds on it now; otherwise say why not and when to look again."""
        if payload_id is None:
            # The stream never saw the enqueue (for example a replay from a timestamp): ask the row.
            row = self.row(message_id)
            if row is not None:
                payload_id, inline = row["payload_id"], row["inline_payload"] is not None
        period = MESSAGE_RULES[rule].period(self.retention)
        result = self.session.execute(self.conditional_delete[rule], (message_id, _cutoff(period)))
        if result.was_applied:
            return RowOutcome(PURGED, payload_id=payload_id, inline=inline)
        # For example an earlier attempt of this batch deleted the row just before a crash.
        return self._judge(self.row(message_id), payload_id, inline, deleting=False)

    def check(self, message_id: str, payload_id: str | None = None, inline: bool | None = None) -> RowOutcome:
        """A dry run of ``delete``: ``would_delete`` if some rule holds on the row now; deletes nothing."""
        row = self.row(message_id)
        if row is not None:
            payload_id, inline = row["payload_id"], row["inline_payload"] is not None
        return self._judge(row, payload_id, inline, deleting=True)

    def _judge(self, row: dict[str, Any] | None, payload_id: str | None, inline: bool | None,
               deleting: bool) -> RowOutcome:
        """What the row says: gone, due now under a rule (when ``deleting``), or kept until when."""
        if row is None:
            return RowOutcome(ALREADY_GONE, payload_id=payload_id, inline=inline)
        state = row_state(row)
        due = eligibility(state, self.retention)
        if deleting and due is not None and due.eligible_at_ms <= now_ms():
            return RowOutcome(WOULD_DELETE, f"due: {due.rule}", payload_id=payload_id, inline=inline)
        return RowOutcome(SKIPPED, _why_kept(state, due), payload_id=payload_id, inline=inline, recheck=due)

    def unreference(self, payload_id: str, message_id: str) -> None:
        """Remove the message's reference to its payload."""
        self.session.execute(self.delete_ref, (payload_id, message_id))

    def referrer(self, payload_id: str, other_than: str | None = None) -> str | None:
        """A message referring to the payload (other than ``other_than``), or None."""
        found = self.session.execute(self.two_refs, (payload_id,))
        return next((r.message_id for r in found if r.message_id != other_than), None)


class PayloadRows:
    """The payloads table: the purger's side of the writer contract. One instance per executor process."""

    def __init__(self, session: "Session", cassandra: CassandraConfig) -> None:
        self.session = session
        table = f"{cassandra.keyspace}.{cassandra.payloads_table}"
        self.read_statement = session.prepare(f"SELECT state, last_ref_at, dcs FROM {table} WHERE payload_id = ?")
        self.read_statement.consistency_level = ConsistencyLevel.SERIAL
        self.mark_deleting = session.prepare(
            f"UPDATE {table} SET state = '{DELETING}' WHERE payload_id = ? IF state = '{LIVE}' AND last_ref_at = ?"
        )
        # Each data centre's progress is kept in the row: `dcs` are the stores that still hold the payload.
        self.remove_dc = session.prepare(
            f"UPDATE {table} SET dcs = dcs - ? WHERE payload_id = ? IF state = '{DELETING}'"
        )
        self.delete_row = session.prepare(f"DELETE FROM {table} WHERE payload_id = ? IF state = '{DELETING}'")

    def read(self, payload_id: str) -> dict[str, Any] | None:
        found = self.session.execute(self.read_statement, (payload_id,)).one()
        return found._asdict() if found else None

    def start_deleting(self, payload_id: str, last_ref_at: datetime | None) -> bool:
        """``live`` -> ``deleting``, only if nobody linked since ``last_ref_at`` was read."""
        return self.session.execute(self.mark_deleting, (payload_id, last_ref_at)).was_applied

    def deleted_from(self, payload_id: str, dc: str) -> None:
        self.session.execute(self.remove_dc, ({dc}, payload_id))

    def delete(self, payload_id: str) -> bool:
        return self.session.execute(self.delete_row, (payload_id,)).was_applied
