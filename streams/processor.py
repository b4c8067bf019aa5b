"""The stateful stage: events keyed by object -> purge candidates and dead letters, with event-time timers.

Every parsed record is routed to the objects it is about, keyed by ``(kind, id)``:

- a lifecycle event to its message; an enqueue of a stored payload also to that
  payload, as a ``link``;
- the sink's reports from the control topic to the message or payload they name;
- a bad record to ``dead_letter``, passed through untouched to the sink;
- a clock tick to ``clock``, where it only moves the watermark.

The watermark is driven by clock ticks alone: lifecycle events carry no
watermark time, so Spark never drops one as late. However late an event comes,
it is applied, and the state machine orders it by its ``event_time``. The
watermark delay is how long after a deadline the purger waits for stragglers.

Per object the processor keeps its state (``streams.state``) and its schedule
(``streams.schedule``) in one value state, and one timer.

Example::

    from streams.processor import purge_candidates
    candidates = purge_candidates(events, retention, watermark_delay_ms=10_000)
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Iterator

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from streams.events import CLOCK, RECHECK
from streams.rules import Eligibility, Retention, eligibility, payload_eligibility
from streams.schedule import Schedule, next_timer, on_timer, recheck
from streams.state import (
    ENQUEUE,
    LINK,
    RELEASED,
    Event,
    MessageState,
    PayloadState,
    apply_all,
    apply_all_payload,
)

MESSAGE = "message"
PAYLOAD = "payload"
DEAD_LETTER = "dead_letter"

# The event columns the processor reads, in Event's field order.
EVENT_COLUMNS = [f.name for f in fields(Event)]

OUTPUT_SCHEMA = StructType(
    [
        StructField("kind", StringType(), False),  # message | payload | dead_letter
        StructField("id", StringType(), False),
        # Candidates
        StructField("rule", StringType()),
        StructField("eligible_at_ms", LongType()),
        StructField("payload_id", StringType()),
        StructField("inline", BooleanType()),
        StructField("dcs", ArrayType(StringType())),
        # Dead letters: the reason and the original record
        StructField("reason", StringType()),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
    ]
)
_OUTPUT_FIELDS = OUTPUT_SCHEMA.fieldNames()


def _spark_type(hint: Any) -> DataType:
    """The Spark type of a state field's annotation (``str | None``, ``int``, ``tuple[str, ...]``)."""
    if isinstance(hint, types.UnionType):
        (hint,) = [h for h in typing.get_args(hint) if h is not type(None)]
    if typing.get_origin(hint) is tuple:
        return ArrayType(StringType())
    return {str: StringType(), int: LongType(), bool: BooleanType()}[hint]


@dataclass(frozen=True)
class _Stored:
    """One kind of object as kept in the state store: its state class and schedule, side by side."""

    state_class: type
    fold: Callable[[Any, list[Event]], Any]
    eligible: Callable[[Any, Retention], Eligibility | None]

    @property
    def schema(self) -> StructType:
        return StructType(
            [StructField(f.name, _spark_type(typing.get_type_hints(cls)[f.name]))
             for cls in (self.state_class, Schedule) for f in fields(cls)]
        )

    def to_row(self, state: Any, schedule: Schedule) -> tuple:
        return tuple(
            list(v) if isinstance(v, tuple) else v
            for obj in (state, schedule) for v in (getattr(obj, f.name) for f in fields(obj))
        )

    def from_row(self, row: Any) -> tuple[Any, Schedule]:
        values = list(row)
        n = len(fields(self.state_class))
        state_values = [tuple(v or ()) if isinstance(f.default, tuple) else v
                        for f, v in zip(fields(self.state_class), values[:n])]
        return self.state_class(*state_values), Schedule(*values[n:])


STORED = {
    MESSAGE: _Stored(MessageState, apply_all, eligibility),
    PAYLOAD: _Stored(PayloadState, apply_all_payload, payload_eligibility),
}


def _output(**values: Any) -> Row:
    return Row(**{name: values.get(name) for name in _OUTPUT_FIELDS})


class PurgeProcessor(StatefulProcessor):
    """Keeps each object's state, schedule and timer. See the module docstring."""

    def __init__(self, retention: Retention, linger_ms: int) -> None:
        self.retention = retention
        self.linger_ms = linger_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.stored = {kind: handle.getValueState(kind, stored.schema) for kind, stored in STORED.items()}

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: TimerValues) -> Iterator[Row]:
        kind, object_id = key
        if kind == DEAD_LETTER:
            for r in rows:
                yield _output(kind=DEAD_LETTER, id=object_id, reason=r.error, key=r.key, value=r.value,
                              topic=r.topic, partition=r.partition, offset=r.offset)
            return
        if kind not in STORED:
            return  # clock ticks: they only move the watermark
        stored = STORED[kind]
        # get() alone (None when absent): each state call is a round trip to the JVM's state server.
        row = self.stored[kind].get()
        state, schedule = stored.from_row(row) if row is not None else (None, Schedule())
        events = []
        for r in rows:
            if r.type == RECHECK:
                schedule = recheck(schedule, r.rule, r.event_time_ms)
            else:
                events.append(Event(*(tuple(r[c]) if c == "dcs" and r[c] is not None else r[c] for c in EVENT_COLUMNS)))
        state = stored.fold(state, events) or stored.state_class()
        yield from self._decide(kind, object_id, state, schedule, timerValues.getCurrentWatermarkInMs())

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Row]:
        kind, object_id = key
        row = self.stored[kind].get()
        if row is None:
            return
        state, schedule = STORED[kind].from_row(row)
        schedule = replace(schedule, timer_ms=None)  # Spark removed the timer that fired
        yield from self._decide(kind, object_id, state, schedule, timerValues.getCurrentWatermarkInMs())

    def _decide(self, kind: str, object_id: str, state: Any, schedule: Schedule, watermark_ms: int) -> Iterator[Row]:
        """Emit the object if the watermark has passed its due time; then keep it with its next timer, or
        forget it. An object already due when its events arrive (a backlog, a replay) is decided here
        rather than by a timer that would fire later in this batch: five state calls fewer."""
        stored = STORED[kind]
        emitted, kept = on_timer(schedule, stored.eligible(state, self.retention), watermark_ms, self.linger_ms)
        if kept is None:
            if schedule.timer_ms is not None:
                self.handle.deleteTimer(schedule.timer_ms)
            self.stored[kind].clear()
            return
        self._keep(kind, state, kept)
        if emitted is not None:
            if kind == MESSAGE:
                payload = dict(payload_id=state.payload_id, inline=state.inline)
            else:
                payload = dict(payload_id=object_id, inline=False)
            yield _output(kind=kind, id=object_id, rule=emitted.rule, eligible_at_ms=emitted.eligible_at_ms,
                          dcs=list(state.dcs), **payload)

    def _keep(self, kind: str, state: Any, schedule: Schedule) -> None:
        """Store the object and move its one timer to where its schedule says."""
        stored = STORED[kind]
        wanted = next_timer(schedule, stored.eligible(state, self.retention))
        if wanted != schedule.timer_ms:
            if schedule.timer_ms is not None:
                self.handle.deleteTimer(schedule.timer_ms)
            if wanted is not None:
                self.handle.registerTimer(wanted)
            schedule = replace(schedule, timer_ms=wanted)
        self.stored[kind].update(stored.to_row(state, schedule))

    def close(self) -> None:
        pass


def routed(events: DataFrame) -> DataFrame:
    """One row per (record, object it is about), keyed by ``kind`` and ``id``, with the watermark column."""
    t = F.col("type")
    object_kind: Column = (
        F.when(F.col("error").isNotNull(), F.lit(DEAD_LETTER))
        .when(t == CLOCK, F.lit(CLOCK))
        .when(t == RECHECK, F.col("kind"))
        .when(t == RELEASED, F.lit(PAYLOAD))
        .otherwise(F.lit(MESSAGE))
    )
    object_id: Column = (
        F.when(F.col("error").isNotNull(), F.concat_ws("/", "topic", F.col("partition").cast("string")))
        .when(object_kind == PAYLOAD, F.col("payload_id"))
        .otherwise(F.col("message_id"))
    )
    itself = F.struct(object_kind.alias("kind"), object_id.alias("id"), t.alias("type"))
    # An enqueue of a payload kept in the object stores links a message to it.
    link = F.when(
        F.col("error").isNull() & (t == ENQUEUE) & ~F.col("inline"),
        F.struct(F.lit(PAYLOAD).alias("kind"), F.col("payload_id").alias("id"), F.lit(LINK).alias("type")),
    )
    targets = F.filter(F.array(itself, link), lambda target: target.isNotNull())
    return events.withColumn("target", F.explode(targets)).select(
        F.col("target.kind").alias("kind"),
        F.col("target.id").alias("id"),
        F.col("target.type").alias("type"),
        *[c for c in EVENT_COLUMNS if c != "type"],
        "rule", "error", "topic", "partition", "offset",
        # The original bytes travel with bad records only.
        F.when(F.col("error").isNotNull(), F.col("key")).alias("key"),
        F.when(F.col("error").isNotNull(), F.col("value")).alias("value"),
        # Only clock ticks carry watermark time (see the module docstring).
        F.when(t == CLOCK, F.timestamp_millis("event_time_ms")).alias("watermark_time"),
    )


def purge_candidates(events: DataFrame, retention: Retention, watermark_delay_ms: int) -> DataFrame:
    """Parsed records in (``streams.events.parse_events``), ``OUTPUT_SCHEMA`` rows out: purge candidates
    as objects come due, and bad records as dead letters."""
    return (
        routed(events)
        .withWatermark("watermark_time", f"{watermark_delay_ms} milliseconds")
        .groupBy("kind", "id")
        .transformWithState(
            statefulProcessor=PurgeProcessor(retention, linger_ms=watermark_delay_ms),
            outputStructType=OUTPUT_SCHEMA,
            outputMode="Append",
            timeMode="EventTime",
        )
    )
