"""What the purger knows about one object, folded from its events: plain Python, no Spark.

Two kinds of object have state, each keyed by its id:

- a message (``MessageState``), from the lifecycle events of docs/reference.md, Events;
- a payload (``PayloadState``), from the enqueues that link messages to it and
  from the sink's reports that its last referring message went (``released``).

All times are epoch milliseconds in event time. Events arrive out of order and
twice, so every field is order-independent: the enqueue's fields are the same
in every copy, but for what a copy read back from the row by reconciliation
cannot know (its data centres, whether the upload was complete at the time),
which combine (the union; incomplete if any copy says so); counter and
extract-until are last-writer-wins registers by event time;
``upload_complete`` and ``delete`` only ever set a flag or keep their earliest
time; payload times keep their latest value. Applying the same event twice, or
a batch in any order, gives the same state.

Example::

    from purger.policies.mailbox.state import Event, apply
    state = apply(None, Event("e1", "enqueue", 1_000, "m1", payload_id="p1", extract_count=1))
    state = apply(state, Event("e2", "dequeue", 2_000, "m1", extract_count=0))
    state.counter_zero_since  # 2000
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# The mailbox policy's kinds of object.
MESSAGE = "message"
PAYLOAD = "payload"
# The hold scope of every message of a mailbox (``mailbox:alice``, ``purger.core.holds``).
MAILBOX = "mailbox"

# Lifecycle event types (docs/reference.md, Events).
ENQUEUE = "enqueue"
UPLOAD_COMPLETE = "upload_complete"
DEQUEUE = "dequeue"
EXTRACT_COUNTER = "extract_counter"
EXTRACT_UNTIL = "extract_until"
DELETE = "delete"
# A payload's side of an enqueue: the message links to it (made by the stream from an enqueue).
LINK = "link"
# Reported by the purger's sink on the control topic: the last message that referred to a payload is gone.
RELEASED = "payload_released"


@dataclass(frozen=True)
class Event:
    event_id: str
    type: str
    event_time_ms: int
    message_id: str
    mailbox: str | None = None
    payload_id: str | None = None
    payload_size: int | None = None
    inline: bool | None = None
    extract_count: int | None = None
    extract_until_ms: int | None = None
    complete: bool | None = None
    dcs: tuple[str, ...] | None = None
    # A release: when the sink found no reference left (event_time is when the grace period starts).
    observed_at_ms: int | None = None


@dataclass(frozen=True)
class MessageState:
    # What the enqueue said; None until an enqueue has been seen.
    mailbox: str | None = None
    payload_id: str | None = None
    payload_size: int | None = None
    inline: bool | None = None
    dcs: tuple[str, ...] = ()
    created_at_ms: int | None = None
    enqueue_complete: bool | None = None
    upload_completed: bool = False
    # The counter (None: not counter-based) and the (time, event id) of the event that set it.
    extract_count: int | None = None
    extract_count_at_ms: int | None = None
    extract_count_event: str | None = None
    # The extract-until date (None: no date limit) and the event that set it.
    extract_until_ms: int | None = None
    extract_until_at_ms: int | None = None
    extract_until_event: str | None = None
    # The earliest delete.
    deleted_at_ms: int | None = None

    @property
    def complete(self) -> bool | None:
        """False while an upload is in progress; None when no event has said."""
        return True if self.upload_completed else self.enqueue_complete

    @property
    def counter_zero_since(self) -> int | None:
        """When the counter was last set to 0, if it is 0.

        The latest setting, not the first of a run of zeros: that is what the row's
        ``updated_at`` records, so the stream and the double-check agree.
        """
        return self.extract_count_at_ms if self.extract_count == 0 else None


@dataclass(frozen=True)
class PayloadState:
    dcs: tuple[str, ...] = ()
    # The latest enqueue that linked a message to the payload.
    linked_at_ms: int | None = None
    # The latest moment its last referring message went (eligible or deleted): the grace runs from it.
    released_at_ms: int | None = None
    # The latest moment the sink found no reference left.
    unreferenced_at_ms: int | None = None

    @property
    def released(self) -> bool:
        """No link is known to be newer than the last time no reference was found."""
        return self.unreferenced_at_ms is not None and (
            self.linked_at_ms is None or self.unreferenced_at_ms >= self.linked_at_ms
        )


_NO_LIMIT = 2**62  # ranks "not counter-based" and "no date" above any value


def _wins(time_ms: int, rank: int, event_id: str, current: tuple[int | None, int, str | None]) -> bool:
    """Last writer wins by event time. At equal times the value nearer to purging wins (a lower
    counter, an earlier date), since the double-check catches a wrong guess toward purging, while
    one toward keeping would leave the message behind; then the event id decides."""
    current_time, current_rank, current_event = current
    if current_time is None:
        return True
    return (time_ms, -rank, event_id) > (current_time, -current_rank, current_event or "")


# The last-writer-wins registers of a message: (value field, time field, event id field).
_COUNTER = ("extract_count", "extract_count_at_ms", "extract_count_event")
_UNTIL = ("extract_until_ms", "extract_until_at_ms", "extract_until_event")


def _set(state: MessageState, register: tuple[str, str, str], value: int | None, event: Event) -> MessageState:
    value_field, time_field, event_field = register
    current = getattr(state, value_field)
    current_version = (getattr(state, time_field), _NO_LIMIT if current is None else current,
                       getattr(state, event_field))
    if not _wins(event.event_time_ms, _NO_LIMIT if value is None else value, event.event_id, current_version):
        return state
    return replace(state, **{value_field: value, time_field: event.event_time_ms, event_field: event.event_id})


def _earliest(current: int | None, time_ms: int) -> int:
    return time_ms if current is None else min(current, time_ms)


def _latest(current: int | None, time_ms: int) -> int:
    return time_ms if current is None else max(current, time_ms)


def _complete(current: bool | None, said: bool | None) -> bool | None:
    """Two copies of an enqueue on its upload: incomplete if either says so (the row's copy says complete once
    the upload has completed since; its ``upload_complete`` says that), unknown only if neither says."""
    known = [value for value in (current, said) if value is not None]
    return all(known) if known else None


def apply(state: MessageState | None, event: Event) -> MessageState:
    """Fold one lifecycle event into a message's state (``None``: nothing known yet)."""
    state = state or MessageState()
    if event.type == ENQUEUE:
        state = replace(
            state, mailbox=event.mailbox, payload_id=event.payload_id, payload_size=event.payload_size,
            inline=event.inline, dcs=tuple(sorted(set(state.dcs) | set(event.dcs or ()))),
            enqueue_complete=_complete(state.enqueue_complete, event.complete),
            created_at_ms=_earliest(state.created_at_ms, event.event_time_ms),
        )
        # The enqueue sets the first values; a later change that arrived first still wins.
        state = _set(state, _COUNTER, event.extract_count, event)
        return _set(state, _UNTIL, event.extract_until_ms, event)
    if event.type in (DEQUEUE, EXTRACT_COUNTER):
        return _set(state, _COUNTER, event.extract_count, event)
    if event.type == EXTRACT_UNTIL:
        return _set(state, _UNTIL, event.extract_until_ms, event)
    if event.type == UPLOAD_COMPLETE:
        return replace(state, upload_completed=True)
    if event.type == DELETE:
        return replace(state, deleted_at_ms=_earliest(state.deleted_at_ms, event.event_time_ms))
    return state


def apply_payload(state: PayloadState | None, event: Event) -> PayloadState:
    """Fold a link (an enqueue seen from the payload's side) or a release into a payload's state."""
    state = state or PayloadState()
    dcs = tuple(sorted(set(state.dcs) | set(event.dcs or ())))
    if event.type == LINK:
        return replace(state, dcs=dcs, linked_at_ms=_latest(state.linked_at_ms, event.event_time_ms))
    if event.type == RELEASED:
        return replace(
            state, dcs=dcs, released_at_ms=_latest(state.released_at_ms, event.event_time_ms),
            unreferenced_at_ms=_latest(state.unreferenced_at_ms, event.observed_at_ms or event.event_time_ms),
        )
    return state


def apply_all(state: MessageState | None, events: list[Event]) -> MessageState | None:
    """Fold a batch of one message's events (the result does not depend on their order)."""
    for event in events:
        state = apply(state, event)
    return state


def apply_all_payload(state: PayloadState | None, events: list[Event]) -> PayloadState | None:
    for event in events:
        state = apply_payload(state, event)
    return state
