"""The ``mailbox`` policy: messages and their payloads (docs/reference.md).

Two kinds of object, each with state and one timer: a ``message`` (its
lifecycle events, ``state.MessageState``) and a ``payload`` (the enqueues that
link messages to it and the sink's reports that its last message went,
``state.PayloadState``). The rules, with their event-time deadlines and their
checks at delete time, are ``rules``; the double-checked deletes and the
payload's writer contract are ``deletes``. For reconciliation, a ``messages``
row reads back as its lifecycle events (``message_events``) and a claimed
``payloads`` row as released (``payload_events``).

Example::

    from purger.policies import load_policy
    mailbox = load_policy("mailbox", {"expired_ttl": "10s"})
    message = mailbox.kinds[0]
    message.eligibility(message.fold(None, events))   # Eligibility(rule='expired_by_counter', ...)
"""

from __future__ import annotations

from datetime import timedelta
from functools import cached_property, partial
from typing import Any

from pydantic import field_validator

from purger.core.settings import Duration
from purger.core.events import Eligibility, EventField, EventType, Link, ObjectKind
from purger.core.handles import Resources
from purger.core.erasure import Follows, SubjectRows
from purger.core.policy import Policy, Settings
from purger.core.purge_protocol import Purge
from purger.core.reconcile_descriptors import REFERENCED_FIELD, Blobs, OrphanRows, PageVerdicts, row_event
from purger.policies.mailbox.deletes import (
    DELETING, LIVE, MESSAGES, PAYLOADS, MessagePurge, PayloadPurge, last_change, last_link,
)
from purger.policies.mailbox.rules import Retention, eligibility, payload_eligibility
from purger.policies.mailbox.verdicts import message_verdicts
from purger.policies.mailbox.state import (
    DELETE, DEQUEUE, ENQUEUE, EXTRACT_COUNTER, EXTRACT_UNTIL, LINK, MAILBOX, MESSAGE, PAYLOAD, RELEASED, UPLOAD_COMPLETE,
    Event, MessageState, PayloadState, apply_all, apply_all_payload,
)


class MailboxSettings(Settings):
    """``[policies.mailbox]``: the periods of docs/reference.md, Rules, with their defaults, and the table names."""

    enabled: bool = True
    expired_ttl: Duration = timedelta(days=30)
    incomplete_ttl: Duration = timedelta(days=2)
    deleted_ttl: Duration = timedelta(0)
    payload_grace: Duration = timedelta(hours=12)
    messages_table: str = "messages"
    payload_refs_table: str = "payload_refs"
    payloads_table: str = "payloads"

    @field_validator("payload_grace")
    @classmethod
    def _grace_covers_clock_skew(cls, grace: timedelta) -> timedelta:
        # The writer contract (docs/policies.md, mailbox) relies on the grace exceeding the clock skew between writers
        # and the purger: a link made within it is never mistaken for an old one.
        if grace < timedelta(seconds=1):
            raise ValueError("must be at least 1s, and more than the clock skew between hosts")
        return grace


class MessageKind(ObjectKind[MessageState]):
    name = MESSAGE
    state_class = MessageState
    event_class = Event

    def __init__(self, retention: Retention) -> None:
        self.retention = retention

    def fold(self, state: MessageState | None, events: list[Event]) -> MessageState:
        return apply_all(state, events) or MessageState()

    def eligibility(self, state: MessageState) -> Eligibility | None:
        return eligibility(state, self.retention)

    def hint(self, object_id: str, state: MessageState) -> dict[str, Any]:
        return {"payload_id": state.payload_id, "inline": state.inline, "dcs": list(state.dcs)}


class PayloadKind(ObjectKind[PayloadState]):
    name = PAYLOAD
    state_class = PayloadState
    event_class = Event

    def __init__(self, retention: Retention) -> None:
        self.retention = retention

    def fold(self, state: PayloadState | None, events: list[Event]) -> PayloadState:
        return apply_all_payload(state, events) or PayloadState()

    def eligibility(self, state: PayloadState) -> Eligibility | None:
        return payload_eligibility(state, self.retention)

    def hint(self, object_id: str, state: PayloadState) -> dict[str, Any]:
        return {"dcs": list(state.dcs)}


def _lifecycle(name: str, *required: str, links: tuple[Link, ...] = ()) -> EventType:
    return EventType(name, MESSAGE, "message_id", required, links)


def message_events(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A ``messages`` row as the lifecycle events that would have written it: its enqueue at ``created_at``, then
    what it says at its last change (``deletes.last_change``: ``updated_at``, or for a row without it the write
    time of its cells): the upload completed, the counter, the extract-until date, the delete. Folded, they make
    the message due when the check at delete time (``deletes.row_state``) would purge the row. Nothing from a row
    with no cell set; no enqueue from one its insert did not write (an update that found the row gone)."""
    updated = last_change(row)
    if updated is None:
        return []
    event = partial(row_event, "messages", row["message_id"], message_id=row["message_id"])
    found = []
    if all(row[column] is not None for column in ("created_at", "mailbox", "payload_id", "payload_size")):
        # The table keeps no data centres: the payload's purge reads them from the payloads row (whose
        # reconciliation carries them), and a message's copy only names blobs to delete again once that row is
        # gone. So none are claimed here; the fold takes the union of an enqueue's copies, so the real
        # enqueue's still count. A null ``complete`` is no upload in progress: the check reads ``complete = false``.
        found.append(event(ENQUEUE, row["created_at"], mailbox=row["mailbox"], payload_id=row["payload_id"],
                           payload_size=row["payload_size"], inline=row["inline_payload"] is not None,
                           complete=row["complete"] is not False, dcs=()))
    if row["complete"]:
        # Said apart from the enqueue: a copy of it that said incomplete (the real one) still folds to complete.
        found.append(event(UPLOAD_COMPLETE, updated))
    if row["extract_count"] is not None:
        found.append(event(EXTRACT_COUNTER, updated, extract_count=row["extract_count"]))
    if row["extract_until"] is not None:
        found.append(event(EXTRACT_UNTIL, updated, extract_until=row["extract_until"]))
    if row["deleted"]:
        found.append(event(DELETE, updated))
    return found


def payload_events(row: dict[str, Any], grace: timedelta) -> list[dict[str, Any]]:
    """A ``payloads`` row with no reference left as released at its last link (``deletes.last_link``: ``last_ref_at``,
    or for a row without it the write time of its state), where the purge's check runs the grace from: ``deleting``
    (a purge claimed it, having found none, and no writer can link it since; fed back, the stream finishes the
    purge), or ``live`` with no ``payload_refs`` partition (``referenced`` false: its messages went with no release,
    or an upload died after its payload row). A referenced ``live`` row says nothing: its messages' rows say it
    (their enqueues link it, their purges release it)."""
    last_ref = last_link(row)
    unreferenced = row["state"] == DELETING or (row["state"] == LIVE and row.get(REFERENCED_FIELD) is False)
    if not unreferenced or last_ref is None:
        return []
    if row["last_ref_at"] is None and row["state"] == DELETING:
        # Its state's write time is the claim's, which found the last link a grace old: released a grace before.
        last_ref -= grace
    # Found unreferenced no sooner than a grace after the last link, so after any enqueue that linked it (the
    # writers' clocks are within the grace): the stream does not take the release for an older one.
    return [row_event("payloads", row["payload_id"], RELEASED, last_ref, payload_id=row["payload_id"],
                      observed_at=last_ref + grace, dcs=row["dcs"] or ())]


class MailboxPolicy(Policy):
    name = "mailbox"
    settings_model = MailboxSettings
    event_fields = (
        EventField("message_id", "string", identifier=True),
        EventField("mailbox", "string", identifier=True),
        EventField("payload_id", "string", identifier=True),
        EventField("payload_size", "long", non_negative=True),
        EventField("inline", "boolean"),
        EventField("extract_count", "int", non_negative=True),
        EventField("extract_until", "timestamp"),
        EventField("complete", "boolean"),
        EventField("dcs", "strings"),
        # payload_released: when the sink found no reference left.
        EventField("observed_at", "timestamp"),
    )
    event_types = (
        # An enqueue of a payload kept in the object stores links the message to it.
        _lifecycle(ENQUEUE, "mailbox", "payload_id", "payload_size", "inline", "complete", "dcs",
                   links=(Link(PAYLOAD, "payload_id", LINK, unless="inline"),)),
        _lifecycle(UPLOAD_COMPLETE),
        _lifecycle(DEQUEUE, "extract_count"),
        _lifecycle(EXTRACT_COUNTER, "extract_count"),
        _lifecycle(EXTRACT_UNTIL),
        _lifecycle(DELETE),
        # The last message referring to the payload became eligible at event_time (its grace starts then).
        EventType(RELEASED, PAYLOAD, "payload_id", ("observed_at",), control=True),
    )
    tables = {
        "messages": ("message_id", "payload_id", "inline_payload", "extract_count", "extract_until", "complete",
                     "deleted", "created_at", "updated_at"),
        "payload_refs": ("payload_id", "message_id"),
        "payloads": ("payload_id", "dcs", "state", "last_ref_at"),
    }
    # Read as the purges read them, with the write times that date a row lacking its rule's timestamp.
    scanned = (MESSAGES, PAYLOADS)
    # A mailbox's messages, found by a scan of the messages (the table is keyed by message); their payloads follow
    # each message's erasure once no other message refers to them (``MessagePurge.released``).
    subjects = (SubjectRows(MAILBOX, "messages", MESSAGE, "message_id", "mailbox"),)
    # A message's erasure takes its payload (unless another message refers to it): its images too.
    follows = (Follows("messages", "payload_id", PAYLOAD),)
    schema = """
CREATE TABLE IF NOT EXISTS {keyspace}.messages (
  message_id text PRIMARY KEY, mailbox text, payload_id text, payload_size bigint, inline_payload blob,
  extract_count int, extract_until timestamp, complete boolean, deleted boolean,
  created_at timestamp, updated_at timestamp);
CREATE TABLE IF NOT EXISTS {keyspace}.payload_refs (
  payload_id text, message_id text, PRIMARY KEY (payload_id, message_id));
CREATE TABLE IF NOT EXISTS {keyspace}.payloads (
  payload_id text PRIMARY KEY, size bigint, dcs set<text>, state text, last_ref_at timestamp, created_at timestamp);
"""
    # A message's reference left behind when its row went without it: the payload it pins is released by the
    # payloads scan that follows. No regular column: dated by the first reconcile that finds it without its message.
    orphan_rows = (OrphanRows("payload_refs", ("payload_id", "message_id"), "messages", "message_id"),)
    # A payload's blob is at payloads/<payload_id> in each data centre's bucket (deletes.payload_key).
    blobs = (Blobs("payloads/", PAYLOAD, "payloads", "payload_id"),)
    settings: MailboxSettings

    @cached_property
    def retention(self) -> Retention:
        return Retention.from_settings(self.settings)

    @cached_property
    def kinds(self) -> tuple[ObjectKind, ...]:
        return (MessageKind(self.retention), PayloadKind(self.retention))

    def hold_scopes(self) -> tuple[str, ...]:
        # A payload is kept by the messages that refer to it, a held message's reference among them.
        return (MESSAGE, MAILBOX)

    def purges(self, resources: Resources) -> dict[str, Purge]:
        messages = MessagePurge(resources, self.table_names(), self.retention)
        return {MESSAGE: messages, PAYLOAD: PayloadPurge(resources, self.table_names(), self.retention, messages)}

    def table_names(self) -> dict[str, str]:
        return {"messages": self.settings.messages_table, "payload_refs": self.settings.payload_refs_table,
                "payloads": self.settings.payloads_table}

    def row_events(self, table: str, row: dict[str, Any]) -> list[dict[str, Any]]:
        """A ``messages`` row's lifecycle events (``message_events``); a ``payloads`` row's release
        (``payload_events``)."""
        if table == "messages":
            return message_events(row)
        return payload_events(row, self.settings.payload_grace)

    def page_verdicts(self, table: str, columns: dict[str, list[Any]]) -> PageVerdicts | None:
        """A page of ``messages`` judged on whole columns (``verdicts.message_verdicts``); ``payloads``, a few
        rows per blob, one row at a time."""
        return message_verdicts(self.retention, columns) if table == "messages" else None
