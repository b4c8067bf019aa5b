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
(docs/policies.md, mailbox): no reference left, ``live`` -> ``deleting`` on the ``last_ref_at``
seen, its blob deleted from each data centre, and the row last. One store
failing does not hold the others back: the data centres done then leave the
row's ``dcs`` in one write, and the failed ones are retried after
``retry_interval``.

A row that lacks the timestamp its rule runs from (a message's ``updated_at``, a
payload's ``last_ref_at``) is dated by the write time of its cells, read with it
(``last_change``, ``last_link``): never skipped, never due at once. A message
so dated goes by its rule's undated condition (``Rule.undated``, ``RuleWrite``),
a payload by the same claim, bound to the null ``last_ref_at`` read: a platform
write in between sets the timestamp, and then neither applies.

Dependents go before the record that leads to them, so a crash anywhere is
finished by the retry of the batch: a row the purger meant to delete and finds
gone still has its reference, blobs and payload row seen to, all idempotently.

Both run in the engine's one protocol (``purger.core.policy.ObjectPurge``): a
message's conditional delete is its claim (``deletes_first``); a payload is
claimed, its blobs are its dependents (one per data centre), its row goes last.

Example::

    purges = MailboxPolicy(MailboxSettings()).purges(resources)
    list(purges["message"].purge(Candidate("message", "m1", "expired_by_counter", 0), Attempt()))
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial
from typing import Any

from purger.core.erasure import is_erasure
from purger.core.events import Eligibility
from purger.core.handles import Resources
from purger.core.purge_protocol import Candidate, Deleted, Dependent, Kept, ObjectPurge, RuleWrite, key_id
from purger.core.reconcile_descriptors import Scanned, dated, latest_write
from purger.core.restorations import BlobImage, RowImage
from purger.core.times import epoch_ms, format_epoch_ms, now_ms
from purger.core.vocabulary import LIVE_REASON, NOT_YET_DUE, RECENTLY_LINKED, REFERENCED, RELINKED, reason
from purger.policies.mailbox.rules import PAYLOAD as PAYLOAD_RULE
from purger.policies.mailbox.rules import Retention, eligibility
from purger.policies.mailbox.state import MAILBOX, MESSAGE, PAYLOAD, RELEASED, MessageState

# A payload row's states in the writer contract.
LIVE = "live"
DELETING = "deleting"

# The rows as the purges read them and as reconciliation scans them (``MailboxPolicy.scanned``), with the write
# times that date a row lacking its rule's timestamp: the same for both, so both date it alike. A message's: every
# cell its events are read from but the key's (it has none) and updated_at's (null when it is needed). A payload's:
# its state's (dcs is a set, each element with a write time of its own).
MESSAGES = Scanned("messages", MESSAGE, "message_id",
                   ("message_id", "mailbox", "payload_id", "payload_size", "inline_payload", "extract_count",
                    "extract_until", "complete", "deleted", "created_at", "updated_at"),
                   written=("mailbox", "payload_id", "payload_size", "inline_payload", "extract_count",
                            "extract_until", "complete", "deleted", "created_at"))
PAYLOADS = Scanned("payloads", PAYLOAD, "payload_id", ("payload_id", "dcs", "state", "last_ref_at"),
                   referenced_by="payload_refs", written=("state",))


def payload_key(payload_id: str) -> str:
    """Where a payload's blob lives in each data centre's bucket (docs/reference.md, Tables and object stores)."""
    return f"payloads/{payload_id}"


def last_change(row: dict[str, Any]) -> datetime | None:
    """A ``messages`` row's last change, which its counter and deleted rules run from: ``updated_at``, which every
    platform write sets; for a row without it, the latest write time of its cells, and no earlier than its
    ``created_at``. None: no cell is set."""
    if row["updated_at"] is not None:
        return row["updated_at"]
    written = latest_write(row, MESSAGES.written)
    if written is None or row["created_at"] is None:
        return written
    # Whatever the clocks of the writers: the row's enqueue, at created_at, would otherwise outrank its last change.
    return max(written, row["created_at"])


def last_link(row: dict[str, Any]) -> datetime | None:
    """When a ``payloads`` row was last linked, which its grace runs from: ``last_ref_at``, which the writer contract
    sets at every link; for a row without it (never linked so), the write time of its state. None: neither is set."""
    return dated(row, "last_ref_at", PAYLOADS)


def row_state(row: dict[str, Any]) -> MessageState:
    """A message row seen as the stream would see it: every field set by its last change (``last_change``)."""
    updated = epoch_ms(last_change(row))
    return MessageState(
        mailbox=row.get("mailbox"), payload_id=row.get("payload_id"), payload_size=row.get("payload_size"),
        inline=row.get("inline_payload") is not None, created_at_ms=epoch_ms(row.get("created_at")),
        enqueue_complete=row.get("complete"),
        extract_count=row.get("extract_count"), extract_count_at_ms=updated,
        extract_until_ms=epoch_ms(row.get("extract_until")), extract_until_at_ms=updated,
        deleted_at_ms=updated if row.get("deleted") else None,
    )


def _why_kept(state: MessageState, due: Eligibility | None) -> str:
    if due is None:
        return reason(LIVE_REASON, f"extract_count {state.extract_count}, extract_until {state.extract_until_ms}, "
                                   f"complete {state.complete}")
    return reason(NOT_YET_DUE, f"{due.rule} at {format_epoch_ms(due.eligible_at_ms)}")


class MessagePurge(ObjectPurge[dict[str, Any]]):
    """A message: its row by the conditional delete of the candidate's rule, then its ``payload_refs`` row,
    and its payload released when no other message refers to it. One instance per executor process."""

    deletes_first = True

    def __init__(self, resources: Resources, tables: dict[str, str], retention: Retention) -> None:
        super().__init__(resources, tables)
        self.retention = retention
        prepare = self.tables.prepare
        self.conditional_delete = {name: RuleWrite(self.tables, "DELETE FROM {messages} WHERE message_id = ? IF", rule)
                                   for name, rule in retention.message_rules.items()}
        # An erasure's: whatever the row says, as long as it is there.
        self.erase_row = prepare("DELETE FROM {messages} WHERE message_id = ? IF EXISTS")
        self.read_row = prepare(f"SELECT {', '.join(MESSAGES.selected)} FROM {{messages}} WHERE message_id = ?")
        self.delete_ref = prepare("DELETE FROM {payload_refs} WHERE payload_id = ? AND message_id = ?")
        self.read_ref = prepare("SELECT message_id FROM {payload_refs} WHERE payload_id = ? AND message_id = ?")
        self.two_refs = prepare("SELECT message_id FROM {payload_refs} WHERE payload_id = ? LIMIT 2")

    def read(self, candidate: Candidate, serial: bool = False) -> dict[str, Any] | None:
        found = self.tables.one(self.read_row, candidate.id, serial=serial)
        return found._asdict() if found else None

    def due(self, candidate: Candidate, row: dict[str, Any]) -> Eligibility | None:
        return eligibility(row_state(row), self.retention)

    def why_kept(self, candidate: Candidate, row: dict[str, Any], due: Eligibility | None) -> str:
        return _why_kept(row_state(row), due)

    def scopes(self, candidate: Candidate, row: dict[str, Any]) -> list[str]:
        return [f"{MESSAGE}:{candidate.id}"] + ([f"{MAILBOX}:{row['mailbox']}"] if row["mailbox"] else [])

    def image(self, candidate: Candidate) -> RowImage:
        return RowImage("messages", (("message_id", candidate.id),))

    def delete(self, candidate: Candidate, row: dict[str, Any]) -> bool:
        if is_erasure(candidate.rule):
            return self.tables.applied(self.erase_row, candidate.id)
        # This rule's period (``due`` checked the earliest rule's), for a row dated by its cells' write time.
        eligible_at = self.retention.message_rules[candidate.rule].eligible_at(row_state(row))
        return self.conditional_delete[candidate.rule].applied((candidate.id,), row["updated_at"] is not None,
                                                               eligible_at)

    def _would_delete_reason(self, candidate: Candidate, row: dict[str, Any], due: Eligibility) -> str | None:
        payload_id, inline = _payload_of(candidate, row)
        said = f"due: {due.rule}"
        if payload_id and not inline and self.referrer(payload_id, other_than=candidate.id) is None:
            said = f"{said}; payload {payload_id} would be released"
        return said

    def followers(self, candidate: Candidate, row: dict[str, Any]) -> list[Dependent]:
        # The reference goes after the row: before it, a message revived in between would lose it.
        payload_id, _ = _payload_of(candidate, row)
        reference = self._reference(candidate.id, payload_id)
        return [reference] if reference is not None and reference.present() else []

    def leftovers(self, candidate: Candidate) -> list[Dependent]:
        reference = self._reference(candidate.id, _payload_of(candidate, None)[0])
        return [] if reference is None else [reference]

    def _reference(self, message_id: str, payload_id: str | None) -> Dependent | None:
        """The message's ``payload_refs`` row, as the ledger names it (its table and key)."""
        if payload_id is None:
            return None
        return Dependent(
            "payload_refs", key_id([payload_id, message_id]),
            lambda: self.tables.execute(self.delete_ref, payload_id, message_id),
            present=lambda: self.tables.one(self.read_ref, payload_id, message_id) is not None,
            image=RowImage("payload_refs", (("payload_id", payload_id), ("message_id", message_id))))

    def released(self, candidate: Candidate, row: dict[str, Any] | None) -> None:
        payload_id, inline = _payload_of(candidate, row)
        # An inline payload goes with its row; only a stored one is released, when no reference is left.
        if payload_id is None or inline:
            return
        if self.referrer(payload_id) is None:
            self.resources.control.report(RELEASED, payload_id, candidate.eligible_at_ms, message_id=candidate.id,
                                          observed_at_ms=now_ms(), dcs=list(candidate.hint.get("dcs") or ()))
        if is_erasure(candidate.rule):
            # Erased with it, not after its grace; or, another message referring to it, kept for that one, in a
            # record of the erasure's own (its certificate says why).
            self.resources.control.recheck(PAYLOAD, payload_id, candidate.rule, now_ms())

    def referrer(self, payload_id: str, other_than: str | None = None) -> str | None:
        """A message referring to the payload (other than ``other_than``), or None."""
        found = self.tables.all(self.two_refs, payload_id)
        return next((r.message_id for r in found if r.message_id != other_than), None)


def _payload_of(candidate: Candidate, row: dict[str, Any] | None) -> tuple[str | None, bool | None]:
    """The message's payload and whether it is inline, as the candidate's hint or else its row says."""
    if candidate.hint.get("payload_id") is not None or row is None:
        return candidate.hint.get("payload_id"), candidate.hint.get("inline")
    return row["payload_id"], row["inline_payload"] is not None


@dataclass(frozen=True)
class PayloadRow:
    """A payload's row (None fields when gone) and a message still referring to it, if any."""

    state: str | None
    last_ref_at: Any
    dcs: frozenset[str]
    referrer: str | None
    # When it was last linked, which the grace runs from (``last_link``).
    linked_at: datetime | None = None


class PayloadPurge(ObjectPurge[PayloadRow]):
    """A payload, by the writer contract (docs/policies.md, mailbox): no reference left, ``live`` -> ``deleting`` on the
    ``last_ref_at`` seen, its blob deleted from each data centre, and the row last. One store failing does not
    hold the others back: the data centres done leave the row's ``dcs`` then (``keep_progress``)."""

    def __init__(self, resources: Resources, tables: dict[str, str], retention: Retention,
                 messages: MessagePurge) -> None:
        super().__init__(resources, tables)
        self.grace_ms = retention.payload_grace_ms
        self.messages = messages
        prepare = self.tables.prepare
        self.read_row = prepare(f"SELECT {', '.join(PAYLOADS.selected)} FROM {{payloads}} WHERE payload_id = ?")
        self.mark_deleting = prepare(
            f"UPDATE {{payloads}} SET state = '{DELETING}' WHERE payload_id = ? IF state = '{LIVE}' AND last_ref_at = ?")
        # `dcs` are the stores that still hold the payload: those whose blob went leave it when another fails.
        self.remove_dcs = prepare(f"UPDATE {{payloads}} SET dcs = dcs - ? WHERE payload_id = ? IF state = '{DELETING}'")
        self.delete_row = prepare(f"DELETE FROM {{payloads}} WHERE payload_id = ? IF state = '{DELETING}'")

    def read(self, candidate: Candidate, serial: bool = False) -> PayloadRow | None:
        referrer = self.messages.referrer(candidate.id)
        found = self.tables.one(self.read_row, candidate.id, serial=serial)
        if found is None and referrer is None:
            return None
        if found is None:
            return PayloadRow(None, None, frozenset(), referrer)
        return PayloadRow(found.state, found.last_ref_at, frozenset(found.dcs or ()), referrer,
                          last_link(found._asdict()))

    def claimed(self, row: PayloadRow) -> bool:
        return row.state == DELETING and row.referrer is None

    def scopes(self, candidate: Candidate, row: PayloadRow) -> list[str]:
        # Kept while a message refers to it, and a held message keeps its reference: no hold names a payload.
        return []

    def image(self, candidate: Candidate) -> RowImage:
        return RowImage("payloads", (("payload_id", candidate.id),))

    def erasable(self, candidate: Candidate, row: PayloadRow) -> Kept | None:
        # Another message's too: kept for it. Linked within its grace (a writer's link whose reference row is not
        # written yet): erased once the grace ends, as any purge of it waits.
        if row.referrer is not None:
            return Kept(self.why_kept(candidate, row, None))
        due = self.due(candidate, row)
        if due is None or due.eligible_at_ms > now_ms():
            return Kept(self.why_kept(candidate, row, due),
                        None if due is None else Eligibility(candidate.rule, due.eligible_at_ms))
        return None

    def due(self, candidate: Candidate, row: PayloadRow) -> Eligibility | None:
        if row.referrer is not None:
            # Usually that message's own purge releases the payload again; the recheck covers a reference
            # that goes away otherwise (a writer that lost the race and removed its link).
            return Eligibility(PAYLOAD_RULE, now_ms() + self.grace_ms)
        linked_ms = epoch_ms(row.linked_at)
        # No state to claim it by (nor last_ref_at): kept, as the claim, conditioned on state, would keep it.
        return None if linked_ms is None else Eligibility(PAYLOAD_RULE, linked_ms + self.grace_ms)

    def why_kept(self, candidate: Candidate, row: PayloadRow, due: Eligibility | None) -> str:
        if row.referrer is not None:
            return reason(REFERENCED, f"by message {row.referrer}")
        if due is None:
            return reason(LIVE_REASON, f"state {row.state!r}, no last_ref_at")
        return reason(RECENTLY_LINKED, "within payload_grace")

    def claim(self, candidate: Candidate, row: PayloadRow) -> PayloadRow | Kept:
        # Bound to the last_ref_at read, null included: a link since sets it, and the claim does not apply.
        if self.tables.applied(self.mark_deleting, candidate.id, row.last_ref_at):
            return replace(row, state=DELETING, referrer=None)
        return Kept(reason(RELINKED, "while being purged"), Eligibility(PAYLOAD_RULE, now_ms() + self.grace_ms))

    def dependents(self, candidate: Candidate, row: PayloadRow) -> list[Dependent]:
        return [Dependent(PAYLOAD, candidate.id, partial(self._delete_blob, candidate.id, dc), dc=dc,
                          image=BlobImage(dc, payload_key(candidate.id)))
                for dc in sorted(row.dcs)]

    def keep_progress(self, candidate: Candidate, row: PayloadRow, went: list[Dependent]) -> None:
        # One lightweight transaction when a store fails, none when every blob goes (the row's delete follows).
        self.tables.execute(self.remove_dcs, {dependent.dc for dependent in went}, candidate.id)

    def delete(self, candidate: Candidate, row: PayloadRow) -> bool:
        return self.tables.applied(self.delete_row, candidate.id)

    def leftovers(self, candidate: Candidate) -> list[Dependent]:
        # The blobs go before the row, so they are usually gone too; deleting again is harmless.
        return [Dependent(PAYLOAD, candidate.id, partial(self._delete_blob, candidate.id, dc), dc=dc)
                for dc in sorted(candidate.hint.get("dcs") or ())]

    def _delete_blob(self, payload_id: str, dc: str) -> str | Deleted | None:
        return self.resources.stores.delete(payload_key(payload_id), [dc])[dc]
