"""The stateful stage: events keyed by message id -> purge candidates, with event-time timers.

For each message the processor keeps its ``MessageState`` in a value state and
one event-time timer at the moment the message becomes eligible. When the
watermark passes the timer, the message is emitted as a purge candidate and its
state is dropped: events older than the watermark can no longer arrive, so
nothing is forgotten that could still matter.

Example::

    from streams.processor import purge_candidates
    candidates = purge_candidates(events, retention, watermark_delay="10 seconds")
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Iterator

from pyspark.sql import DataFrame, Row
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from streams.events import CLOCK
from streams.rules import Retention, eligibility
from streams.state import Event, MessageState, apply_all

# The event columns the processor reads, in Event's field order.
EVENT_COLUMNS = [f.name for f in fields(Event)]

STATE_SCHEMA = StructType(
    [
        StructField("mailbox", StringType()),
        StructField("payload_id", StringType()),
        StructField("payload_size", LongType()),
        StructField("inline", BooleanType()),
        StructField("dcs", ArrayType(StringType())),
        StructField("extract_count", IntegerType()),
        StructField("extract_count_time_ms", LongType()),
        StructField("extract_count_event_id", StringType()),
        StructField("counter_zero_since", LongType()),
        # The registered timer, so a changed deadline can delete the old one.
        StructField("timer_ms", LongType()),
    ]
)

CANDIDATE_SCHEMA = StructType(
    [
        StructField("message_id", StringType(), False),
        StructField("rule", StringType(), False),
        StructField("eligible_at_ms", LongType(), False),
        StructField("mailbox", StringType()),
        StructField("payload_id", StringType()),
        StructField("inline", BooleanType()),
        StructField("dcs", ArrayType(StringType())),
    ]
)


def _to_row(state: MessageState, timer_ms: int | None) -> tuple:
    version = state.extract_count_version or (None, None)
    return (
        state.mailbox, state.payload_id, state.payload_size, state.inline, list(state.dcs),
        state.extract_count, version[0], version[1], state.counter_zero_since, timer_ms,
    )


def _from_row(row: Any) -> tuple[MessageState, int | None]:
    (mailbox, payload_id, payload_size, inline, dcs, count, count_time, count_event,
     zero_since, timer_ms) = tuple(row)
    state = MessageState(
        mailbox=mailbox, payload_id=payload_id, payload_size=payload_size, inline=inline,
        dcs=tuple(dcs or ()), extract_count=count,
        extract_count_version=None if count_time is None else (count_time, count_event),
        counter_zero_since=zero_since,
    )
    return state, timer_ms


class MessageProcessor(StatefulProcessor):
    """Keeps one message's state and its purge timer. See the module docstring."""

    def __init__(self, retention: Retention) -> None:
        self.retention = retention

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.message = handle.getValueState("message", STATE_SCHEMA)

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: TimerValues) -> Iterator[Row]:
        events = [Event(*(r[c] for c in EVENT_COLUMNS)) for r in rows]
        events = [e for e in events if e.type != CLOCK]
        if not events:
            return iter([])
        state, timer_ms = _from_row(self.message.get()) if self.message.exists() else (None, None)
        state = apply_all(state, events)
        due = eligibility(state, self.retention)
        new_timer = due.eligible_at_ms if due else None
        if new_timer != timer_ms:
            if timer_ms is not None:
                self.handle.deleteTimer(timer_ms)
            if new_timer is not None:
                # A deadline already behind the watermark fires in this batch's timer pass.
                self.handle.registerTimer(new_timer)
        self.message.update(_to_row(state, new_timer))
        return iter([])

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Row]:
        if not self.message.exists():
            return iter([])
        state, _ = _from_row(self.message.get())
        due = eligibility(state, self.retention)
        self.message.clear()
        if due is None:
            return iter([])
        message_id = key[0] if isinstance(key, tuple) else key
        return iter(
            [Row(message_id=message_id, rule=due.rule, eligible_at_ms=due.eligible_at_ms,
                 mailbox=state.mailbox, payload_id=state.payload_id, inline=state.inline,
                 dcs=list(state.dcs))]
        )

    def close(self) -> None:
        pass


def purge_candidates(events: DataFrame, retention: Retention, watermark_delay: str) -> DataFrame:
    """Good events in, purge candidates out (``CANDIDATE_SCHEMA``), one per message that came due."""
    return (
        events.select(*EVENT_COLUMNS, (events.event_time_ms / 1000).cast("timestamp").alias("event_ts"))
        .withWatermark("event_ts", watermark_delay)
        .groupBy("message_id")
        .transformWithState(
            statefulProcessor=MessageProcessor(retention),
            outputStructType=CANDIDATE_SCHEMA,
            outputMode="Append",
            timeMode="EventTime",
        )
    )
