"""The stateful stage: events keyed by object -> purge candidates and dead letters, with event-time timers.

Every parsed record is routed to the objects it is about, keyed by ``(kind, id)``
(each kind belongs to one policy, so the kind names the policy too):

- a policy's event to its object (``EventType.kind`` and ``id_field``), and to
  the objects it links (``EventType.links``: an enqueue of a stored payload
  reaches that payload as a ``link``);
- the sink's reports from the control topic to the object they name
  (``streams.control``);
- a bad record to ``dead_letter`` (keyed by its partition, ``topic/partition``), passed through untouched to
  the sink as a dead letter of its own (``dead_letter_id``);
- a clock tick to ``clock``, where it only moves the watermark.

The watermark is driven by clock ticks alone: events carry no watermark time,
so Spark never drops one as late. However late an event comes, it is applied,
and its kind's fold orders it by its ``event_time``. The watermark delay is how
long after a deadline the purger waits for stragglers.

Per object the processor keeps its state (the kind's ``state_class``) and its
schedule (``core.schedule``) in one value state named after the kind, and one
timer. When the watermark passes the object's due time it is emitted as a
candidate, with the kind's ``hint`` as JSON.

Example::

    from purger.streams.processor import purge_candidates
    candidates = purge_candidates(events, policies, watermark_delay_ms=10_000, forget_after_ms=30 * 86_400_000)
"""

from __future__ import annotations

import json
import os
import sys
import types
import typing
from dataclasses import dataclass, fields, replace
from typing import Any, Iterator

from pyspark.accumulators import Accumulator
from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import (
    ArrayType, BinaryType, BooleanType, DataType, IntegerType, LongType, StringType, StructField, StructType,
)

from purger.core.events import ObjectKind
from purger.core.policy_set import PolicySet
from purger.core.schedule import Schedule, next_timer, on_events, on_timer, recheck
from purger.core.vocabulary import CLOCK, DEAD_LETTER, FORGOTTEN
from purger.streams.control import RECHECK, control_target
from purger.streams.parse import timestamp_fields

# The module Spark runs (``python -m``), on the driver, at the first batch of each start of a query with a Python
# transformWithState, to set the stateful stage up (TransformWithStateInPySparkPythonPreInitRunner). It print()s
# five lines of its progress, one with the UDF's whole return schema, with a blank line after each; Spark copies
# the process's stdout raw onto the driver's stderr (PythonWorkerFactory's RedirectThread), so neither a Python
# logger's level nor Log4j can quiet it, and no Spark setting does. Its answers go over a socket, not stdout.
STATE_SETUP_WORKER = "pyspark.sql.streaming.transform_with_state_driver_worker"


def quiet_state_setup_worker() -> None:
    """In the stateful stage's set-up worker (``STATE_SETUP_WORKER``), its stdout to /dev/null; nothing elsewhere.

    Called when this module is imported, which that worker does when it unpickles the UDF (``PurgeProcessor``
    is pickled by reference): after its first line ("Starting Streaming TransformWithStateInPandas Python
    worker."), before the four others. Its errors still reach stderr."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name == STATE_SETUP_WORKER:
        sys.stdout = open(os.devnull, "w")


# Imported by the Python worker that sets the stateful stage up at each query start: its progress prints off.
quiet_state_setup_worker()

OUTPUT_SCHEMA = StructType(
    [
        StructField("kind", StringType(), False),  # a policy's kind of object, or dead_letter
        StructField("id", StringType(), False),
        # Candidates
        StructField("rule", StringType()),
        StructField("eligible_at_ms", LongType()),
        StructField("hint", StringType()),  # JSON: what the policy's purger needs of the state
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
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (hint,) = [h for h in typing.get_args(hint) if h is not type(None)]
    if typing.get_origin(hint) is tuple:
        return ArrayType(StringType())
    return {str: StringType(), int: LongType(), bool: BooleanType()}[hint]


@dataclass(frozen=True)
class _Stored:
    """One kind of object as kept in the state store: its state and schedule, side by side in one row."""

    kind: ObjectKind

    @property
    def schema(self) -> StructType:
        cls = self.kind.state_class
        return StructType(
            [StructField(f.name, _spark_type(typing.get_type_hints(owner)[f.name]))
             for owner in (cls, Schedule) for f in fields(owner)]
        )

    def accepts_none(self, name: str) -> bool:
        """Whether the field ``name`` takes None from the store (``from_row``): as it is read from state kept
        before the field was added (``streams.checkpoint``)."""
        for owner in (self.kind.state_class, Schedule):
            for f in fields(owner):
                if f.name == name:
                    hint = typing.get_type_hints(owner)[name]
                    return isinstance(f.default, tuple) or type(None) in typing.get_args(hint)
        raise KeyError(name)

    def to_row(self, state: Any, schedule: Schedule) -> tuple:
        return tuple(
            list(v) if isinstance(v, tuple) else v
            for obj in (state, schedule) for v in (getattr(obj, f.name) for f in fields(obj))
        )

    def from_row(self, row: Any) -> tuple[Any, Schedule]:
        values = list(row)
        state_fields = fields(self.kind.state_class)
        n = len(state_fields)
        state_values = [tuple(v or ()) if isinstance(f.default, tuple) else (tuple(v) if isinstance(v, list) else v)
                        for f, v in zip(state_fields, values[:n])]
        return self.kind.state_class(*state_values), Schedule(*values[n:])


def stored_kinds(policies: PolicySet) -> dict[str, _Stored]:
    return {kind.name: _Stored(kind) for kind in policies.kinds}


def dead_letter_id(topic: str, partition: int, offset: int) -> str:
    """A bad record's id, where Kafka keeps it: its ledger record's too (``sinks.ledger``), so the ledger keeps one
    record per bad record, the same when its batch runs again."""
    return f"{topic}/{partition}/{offset}"


def _output(**values: Any) -> Row:
    return Row(**{name: values.get(name) for name in _OUTPUT_FIELDS})


class PurgeProcessor(StatefulProcessor):
    """Keeps each object's state, schedule and timer. See the module docstring."""

    def __init__(self, policies: PolicySet, linger_ms: int, forget_after_ms: int,
                 registered: Accumulator | None = None) -> None:
        self.policies = policies
        self.linger_ms = linger_ms
        self.forget_after_ms = forget_after_ms
        self.registered = registered  # each timer registered, for the clock (``streams.timers``)

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.kinds = stored_kinds(self.policies)
        self.values = {name: handle.getValueState(name, stored.schema) for name, stored in self.kinds.items()}
        # Each kind's event class, and how to build it from a routed row.
        self.event_fields = {name: [f.name for f in fields(stored.kind.event_class)]
                             for name, stored in self.kinds.items()}

    def _event(self, kind: str, row: Row) -> Any:
        return self.kinds[kind].kind.event_class(
            *(tuple(v) if isinstance(v := row[c], list) else v for c in self.event_fields[kind]))

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: TimerValues) -> Iterator[Row]:
        kind, object_id = key
        if kind == DEAD_LETTER:
            for r in rows:
                yield _output(kind=DEAD_LETTER, id=dead_letter_id(r.topic, r.partition, r.offset), reason=r.error,
                              key=r.key, value=r.value, topic=r.topic, partition=r.partition, offset=r.offset)
            return
        if kind not in self.kinds:
            return  # clock ticks: they only move the watermark
        stored = self.kinds[kind]
        # get() alone (None when absent): each state call is a round trip to the JVM's state server.
        row = self.values[kind].get()
        state, schedule = stored.from_row(row) if row is not None else (None, Schedule())
        events = []
        for r in rows:
            if r.type == RECHECK:
                schedule = recheck(schedule, r.rule, r.event_time_ms)
            else:
                events.append(self._event(kind, r))
        state = stored.kind.fold(state, events)
        watermark_ms = timerValues.getCurrentWatermarkInMs()
        schedule = on_events(schedule, stored.kind.eligibility(state), watermark_ms, self.forget_after_ms)
        yield from self._decide(kind, object_id, state, schedule, watermark_ms)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Row]:
        kind, object_id = key
        row = self.values[kind].get()
        if row is None:
            return
        state, schedule = self.kinds[kind].from_row(row)
        schedule = replace(schedule, timer_ms=None)  # Spark removed the timer that fired
        yield from self._decide(kind, object_id, state, schedule, timerValues.getCurrentWatermarkInMs())

    def _decide(self, kind: str, object_id: str, state: Any, schedule: Schedule, watermark_ms: int) -> Iterator[Row]:
        """Emit the object if the watermark has passed its due time; then keep it with its next timer, or
        forget it. An object already due when its events arrive (a backlog, a replay) is decided here
        rather than by a timer that would fire later in this batch: five state calls fewer."""
        object_kind = self.kinds[kind].kind
        own = object_kind.eligibility(state)
        emitted, kept = on_timer(schedule, own, watermark_ms, self.linger_ms)
        if kept is None:
            if schedule.timer_ms is not None:
                self.handle.deleteTimer(schedule.timer_ms)
            self.values[kind].clear()
            if schedule.never_fired:  # counted, then dropped before the sink (``streams.candidates``)
                yield _output(kind=kind, id=object_id, rule=FORGOTTEN)
            return
        wanted = next_timer(kept, own)
        if wanted != kept.timer_ms:
            if kept.timer_ms is not None:
                self.handle.deleteTimer(kept.timer_ms)
            if wanted is not None:
                self.handle.registerTimer(wanted)
                if self.registered is not None:
                    self.registered.add([wanted])
            kept = replace(kept, timer_ms=wanted)
        self.values[kind].update(self.kinds[kind].to_row(state, kept))
        if emitted is not None:
            yield _output(kind=kind, id=object_id, rule=emitted.rule, eligible_at_ms=emitted.eligible_at_ms,
                          hint=json.dumps(object_kind.hint(object_id, state)))

    def close(self) -> None:
        pass


def _targets(policies: PolicySet) -> Column:
    """Per record, the (kind, id, type) of each object it is about."""
    t = F.col("type")
    target = lambda kind, object_id, as_type: F.struct(  # noqa: E731
        kind.alias("kind"), object_id.alias("id"), as_type.alias("type"))
    bad = F.col("error").isNotNull()
    control_kind, control_id = control_target(policies)
    kind, object_id = (F.when(bad, F.lit(DEAD_LETTER)),
                       F.when(bad, F.concat_ws("/", "topic", F.col("partition").cast("string"))))
    links = []
    for event_type in policies.event_types.values():
        this = t == event_type.name
        kind, object_id = kind.when(this, F.lit(event_type.kind)), object_id.when(this, F.col(event_type.id_field))
        for link in event_type.links:
            linked = ~bad & this & (~F.coalesce(F.col(link.unless), F.lit(False)) if link.unless else F.lit(True))
            links.append(F.when(linked, target(F.lit(link.kind), F.col(link.id_field), F.lit(link.as_type))))
    itself = target(kind.otherwise(control_kind), object_id.otherwise(control_id), t)
    return F.filter(F.array(itself, *links), lambda each: each.isNotNull() & each["kind"].isNotNull())


def routed(events: DataFrame, policies: PolicySet) -> DataFrame:
    """One row per (record, object it is about), keyed by ``kind`` and ``id``, with the watermark column.
    Events of a built-in policy that is not enabled (``ignored``) are dropped here."""
    t = F.col("type")
    event_columns = {"event_id", "event_time_ms", "rule"}
    event_columns |= {c for f in policies.fields.values()
                      for c in ([f"{f.name}_ms"] if f.type == "timestamp" else [f.name])}
    stamps = set(timestamp_fields(policies))
    event_columns -= stamps
    return events.where(~F.col("ignored")).withColumn("target", F.explode(_targets(policies))).select(
        F.col("target.kind").alias("kind"),
        F.col("target.id").alias("id"),
        F.col("target.type").alias("type"),
        *sorted(event_columns),
        "error", "topic", "partition", "offset",
        # The original bytes travel with bad records only.
        F.when(F.col("error").isNotNull(), F.col("key")).alias("key"),
        F.when(F.col("error").isNotNull(), F.col("value")).alias("value"),
        # Only clock ticks carry watermark time (see the module docstring); one that is bad input (a tick on an
        # events topic) moves no watermark, and is not dropped as late before reaching the dead letters.
        F.when((t == CLOCK) & F.col("error").isNull(), F.timestamp_millis("event_time_ms")).alias("watermark_time"),
    )


def purge_candidates(events: DataFrame, policies: PolicySet, watermark_delay_ms: int,
                     forget_after_ms: int, registered: Accumulator | None = None) -> DataFrame:
    """Parsed records in (``streams.parse.parse_events``), ``OUTPUT_SCHEMA`` rows out: purge candidates
    as objects come due, bad records as dead letters, and a row with rule ``FORGOTTEN`` for each object
    forgotten without ever having been a candidate (``core.schedule.on_events``). ``registered``: an accumulator
    (``streams.timers.EarliestTimers``) that each timer registered is added to."""
    return (
        routed(events, policies)
        .withWatermark("watermark_time", f"{watermark_delay_ms} milliseconds")
        .groupBy("kind", "id")
        .transformWithState(
            statefulProcessor=PurgeProcessor(policies, linger_ms=watermark_delay_ms,
                                             forget_after_ms=forget_after_ms, registered=registered),
            outputStructType=OUTPUT_SCHEMA,
            outputMode="Append",
            timeMode="EventTime",
        )
    )
