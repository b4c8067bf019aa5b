"""The per-message state machine: plain Python, no Spark.

The state is what the purger has learnt about one message from its events.
``apply`` folds one event into it; ``streams.rules.eligibility`` says when the
message becomes eligible for purge. All times are epoch milliseconds in event
time.

Events arrive out of order and twice. Each field that events change is
last-writer-wins by event time (at equal times the lower counter, then the
event id, so the result does not depend on arrival order), and applying the
same event twice changes nothing.

Example::

    from streams.state import Event, apply
    state = apply(None, Event("e1", "enqueue", 1_000, "m1", payload_id="p1", extract_count=1))
    state = apply(state, Event("e2", "dequeue", 2_000, "m1", extract_count=0))
    state.counter_zero_since  # 2000
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


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


@dataclass(frozen=True)
class MessageState:
    # What the enqueue said; None until the enqueue has been seen.
    mailbox: str | None = None
    payload_id: str | None = None
    payload_size: int | None = None
    inline: bool | None = None
    dcs: tuple[str, ...] = field(default_factory=tuple)
    # The extract counter (None: not counter-based) and the (time, event id) of the event that set it.
    extract_count: int | None = None
    extract_count_version: tuple[int, str] | None = None
    # Since when the counter has been 0, by the event that brought it there.
    counter_zero_since: int | None = None


_NOT_COUNTER_BASED = 2**31


def _version(time_ms: int, count: int | None, event_id: str) -> tuple[int, int, str]:
    # At equal event times the lower counter wins: extractions only lower it, and a wrong guess
    # toward purging is caught by the double-check, while one toward keeping would leave it behind.
    return (time_ms, -(_NOT_COUNTER_BASED if count is None else count), event_id)


def _set_counter(state: MessageState, count: int | None, event: Event) -> MessageState:
    if state.extract_count_version is not None:
        current_time_ms, current_event_id = state.extract_count_version
        current = _version(current_time_ms, state.extract_count, current_event_id)
        if _version(event.event_time_ms, count, event.event_id) <= current:
            return state  # an older value arriving late: the newer one stands
    if count == 0:
        zero_since = state.counter_zero_since if state.extract_count == 0 else event.event_time_ms
    else:
        zero_since = None
    return replace(
        state, extract_count=count, extract_count_version=(event.event_time_ms, event.event_id),
        counter_zero_since=zero_since,
    )


def apply(state: MessageState | None, event: Event) -> MessageState:
    """Fold one event into the message's state (``None``: nothing known yet)."""
    state = state or MessageState()
    if event.type == "enqueue":
        state = replace(
            state,
            mailbox=event.mailbox,
            payload_id=event.payload_id,
            payload_size=event.payload_size,
            inline=event.inline,
            dcs=tuple(sorted(event.dcs or ())),
        )
        # The enqueue sets the counter's first value; a later dequeue that arrived first wins.
        return _set_counter(state, event.extract_count, event)
    if event.type in ("dequeue", "extract_counter"):
        return _set_counter(state, event.extract_count, event)
    return state


def apply_all(state: MessageState | None, events: list[Event]) -> MessageState | None:
    """Fold a batch of one message's events, in event-time order (a batch has none of its own)."""
    for event in sorted(events, key=lambda e: (e.event_time_ms, e.event_id)):
        state = apply(state, event)
    return state
