"""The mailbox policy at delete time: double-checked deletes of messages, references, payloads and blobs.

The stream's state is a hint; the row is the truth. Each message rule
(``policies.mailbox.rules``) puts its ``check`` on a conditional ``DELETE`` (a
lightweight transaction), compared with the wall clock at delete time, so the
check and the delete are one atomic step and a revival that lands in between
makes the delete not apply. When it does not apply, the row says why, and when
(by the same rules) it is worth looking again.

A message candidate: its row goes by the conditional delete, then its
``payload_refs`` row; if no other message refers to the payload, the payload is
released (a ``payload_released`` control event) and its grace period starts. A
payload candidate, once its grace has passed, goes by the writer contract
(README): no reference left, ``live`` -> ``deleting`` on the ``last_ref_at``
seen, its blob deleted from each data centre with the progress kept in the
row's ``dcs``, and the row last. One store failing does not hold the others
back; the failed ones are retried after ``retry_interval``.

Dependents go before the record that leads to them, so a crash anywhere is
finished by the retry of the batch: a row found already gone still has its
reference, blobs and payload row seen to, all idempotently.

Example::

    deleter = MessageDeleter(session, "mailbox", MailboxSettings(), Retention())
    deleter.delete("m1", "expired_by_counter")  # RowOutcome(status='purged', ...)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Iterator

from purger.connectors import read_serially
from purger.core.policy import Attempt, Candidate, Eligibility, Outcome, Purger, Resources
from purger.core.times import epoch_ms, format_epoch_ms, from_epoch_ms, now_ms
from purger.core.vocabulary import (
    ALREADY_GONE, BEING_DELETED, EARLIER_ATTEMPT, ERROR, LIVE_REASON, NOT_YET_DUE, PURGED, RECENTLY_LINKED,
    REFERENCED, RELINKED, SKIPPED, WOULD_DELETE, reason,
)
from purger.policies.mailbox.rules import PAYLOAD as PAYLOAD_RULE
from purger.policies.mailbox.rules import Retention, eligibility
from purger.policies.mailbox.state import MESSAGE, PAYLOAD, RELEASED, MessageState

if TYPE_CHECKING:
    from cassandra.cluster import Session

    from purger.policies.mailbox import MailboxSettings

# A payload row's states in the writer contract.
LIVE = "live"
DELETING = "deleting"


def payload_key(payload_id: str) -> str:
    """Where a payload's blob lives in each data centre's bucket (SPEC section 3)."""
    return f"payloads/{payload_id}"


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
        return reason(LIVE_REASON, f"extract_count {state.extract_count}, extract_until {state.extract_until_ms}, "
                                   f"complete {state.complete}")
    return reason(NOT_YET_DUE, f"{due.rule} at {format_epoch_ms(due.eligible_at_ms)}")


class MessageDeleter:
    """Prepared statements on the messages and payload_refs tables; one instance per executor process."""

    def __init__(self, session: "Session", keyspace: str, settings: "MailboxSettings", retention: Retention) -> None:
        self.session = session
        self.retention = retention
        messages = f"{keyspace}.{settings.messages_table}"
        refs = f"{keyspace}.{settings.payload_refs_table}"
        self.conditional_delete = {
            name: session.prepare(f"DELETE FROM {messages} WHERE message_id = ? IF {rule.check}")
            for name, rule in retention.message_rules.items()
        }
        # Serial: sees the outcome of every lightweight transaction, including a not-yet-settled one.
        self.read = read_serially(session, session.prepare(f"SELECT * FROM {messages} WHERE message_id = ?"))
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
        period = self.retention.message_rules[rule].period_ms
        result = self.session.execute(self.conditional_delete[rule], (message_id, from_epoch_ms(now_ms() - period)))
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

    def __init__(self, session: "Session", keyspace: str, settings: "MailboxSettings") -> None:
        self.session = session
        table = f"{keyspace}.{settings.payloads_table}"
        self.read_statement = read_serially(
            session, session.prepare(f"SELECT state, last_ref_at, dcs FROM {table} WHERE payload_id = ?"))
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


class MailboxPurger(Purger):
    """Messages and payloads, in the order of deletion: a message's row, its reference, then (released)
    its payload's blobs per data centre and the payload's row."""

    def __init__(self, resources: Resources, settings: "MailboxSettings", retention: Retention) -> None:
        self.r = resources
        self.retention = retention
        self.messages = MessageDeleter(resources.session, resources.keyspace, settings, retention)
        self.payloads = PayloadRows(resources.session, resources.keyspace, settings)

    def purge(self, candidate: Candidate, attempt: Attempt) -> Iterator[Outcome]:
        if candidate.kind == MESSAGE:
            return self._message(candidate, attempt)
        return self._payload(candidate, attempt)

    def _message(self, c: Candidate, attempt: Attempt) -> Iterator[Outcome]:
        payload_id, inline = c.hint.get("payload_id"), c.hint.get("inline")
        if self.r.dry_run:
            row = self.messages.check(c.id, payload_id, inline)
            said = row.reason
            if row.status == WOULD_DELETE and row.payload_id and not row.inline \
                    and self.messages.referrer(row.payload_id, other_than=c.id) is None:
                said = f"{said}; payload {row.payload_id} would be released"
            yield Outcome(row.status, said)
            return
        row = self.messages.delete(c.id, c.rule, payload_id, inline)
        if row.status == PURGED:
            attempt.failpoint("after_message_delete")
        if row.status == ALREADY_GONE and attempt.retry:
            # The failed attempt's outcomes never reached the ledger: its deletions are recorded now.
            yield Outcome(PURGED, EARLIER_ATTEMPT, deleted_at_ms=now_ms())
        else:
            yield Outcome(row.status, row.reason, deleted_at_ms=now_ms() if row.status == PURGED else None)
        if row.status == SKIPPED:
            if row.recheck is not None:
                # The row will be eligible: look again then. Under the rule just checked, not sooner than
                # retry_interval (clocks may differ a little); under another rule, as soon as it is due.
                soonest = now_ms() + (self.r.retry_ms if row.recheck.rule == c.rule else 0)
                self.r.control.recheck(MESSAGE, c.id, row.recheck.rule, max(row.recheck.eligible_at_ms, soonest))
            return
        if row.payload_id is None:
            return
        self.messages.unreference(row.payload_id, c.id)
        # An inline payload goes with its row; only a stored one is released, when no reference is left.
        if not row.inline and self.messages.referrer(row.payload_id) is None:
            self.r.control.report(RELEASED, row.payload_id, c.eligible_at_ms, message_id=c.id,
                                  observed_at_ms=now_ms(), dcs=list(c.hint.get("dcs") or ()))

    def _payload(self, c: Candidate, attempt: Attempt) -> Iterator[Outcome]:
        grace_ms = self.retention.payload_grace_ms
        dcs = sorted(c.hint.get("dcs") or ())
        referrer = self.messages.referrer(c.id)
        if referrer is not None:
            yield Outcome(SKIPPED, reason(REFERENCED, f"by message {referrer}"))
            # Usually that message's own purge releases the payload again; the recheck covers a reference
            # that goes away otherwise (a writer that lost the race and removed its link).
            self.r.control.recheck(PAYLOAD, c.id, PAYLOAD_RULE, now_ms() + grace_ms)
            return
        row = self.payloads.read(c.id)
        if row is None:
            if self.r.dry_run:
                yield Outcome(ALREADY_GONE)
            elif attempt.retry:
                # Gone with the attempt that failed: the blobs went before the row; deleting again is harmless.
                for dc, error in self.r.stores.delete(payload_key(c.id), dcs).items():
                    yield Outcome(PURGED if error is None else ERROR, error or EARLIER_ATTEMPT, dc=dc,
                                  deleted_at_ms=now_ms() if error is None else None)
                yield Outcome(PURGED, EARLIER_ATTEMPT, deleted_at_ms=now_ms())
            else:
                self.r.stores.delete(payload_key(c.id), dcs)
                yield Outcome(ALREADY_GONE)
            return
        if row["state"] == LIVE:
            last_ref_ms = epoch_ms(row["last_ref_at"])
            if last_ref_ms is not None and last_ref_ms > now_ms() - grace_ms:
                yield Outcome(SKIPPED, reason(RECENTLY_LINKED, "within payload_grace"))
                self.r.control.recheck(PAYLOAD, c.id, PAYLOAD_RULE, last_ref_ms + grace_ms)
                return
            if self.r.dry_run:
                yield from (Outcome(WOULD_DELETE, dc=dc) for dc in sorted(row["dcs"] or ()))
                yield Outcome(WOULD_DELETE)
                return
            if not self.payloads.start_deleting(c.id, row["last_ref_at"]):
                yield Outcome(SKIPPED, reason(RELINKED, "while being purged"))
                self.r.control.recheck(PAYLOAD, c.id, PAYLOAD_RULE, now_ms() + grace_ms)
                return
        elif self.r.dry_run:
            yield Outcome(SKIPPED, reason(BEING_DELETED, "by a real run"))
            return
        elif attempt.retry:
            # Data centres the attempt that failed had finished: their records went with it.
            for dc in sorted(set(dcs) - set(row["dcs"] or ())):
                yield Outcome(PURGED, EARLIER_ATTEMPT, dc=dc, deleted_at_ms=now_ms())
        failed = False
        for dc in sorted(row["dcs"] or ()):
            # One data centre at a time, its progress in the row at once: a slow or failing store after it
            # does not hold back the record of what is done.
            error = self.r.stores.delete(payload_key(c.id), [dc])[dc]
            if error is None:
                self.payloads.deleted_from(c.id, dc)
                attempt.failpoint("after_blob_delete")
                yield Outcome(PURGED, dc=dc, deleted_at_ms=now_ms())
            else:
                failed = True
                yield Outcome(ERROR, error, dc=dc)
        if failed:
            self.r.control.recheck(PAYLOAD, c.id, PAYLOAD_RULE, now_ms() + self.r.retry_ms)
        elif self.payloads.delete(c.id):
            yield Outcome(PURGED, deleted_at_ms=now_ms())
