"""Pending purges: what the stateful stage will emit in the next hours, read from the checkpoint.

Nothing is asked of the running query: Spark's state data source (``format("statestore")``)
reads the state of the checkpoint's last committed batch, so this works while the purger runs,
after it stopped, or on a copy of its checkpoint. Two reads of the one ``transformWithState``
operator are joined:

- the registered timers (``readRegisteredTimers``): ``key`` (kind, id) and
  ``expiration_timestamp_ms``, one per object, since the processor keeps one timer an object;
- the object's value state (``stateVarName`` ``message`` or ``payload``): ``key`` and ``value``,
  a struct laid out as ``streams.processor._Stored.schema`` and decoded by ``STORED[kind].from_row``.

A timer is a purge only when ``streams.schedule.on_timer`` would emit something at it: the end of
a linger after a purge (when the state is forgotten) is not listed.

Example::

    from datetime import datetime, timedelta, timezone
    from streams.pending import pending_purges
    from streams.rules import Retention
    until = datetime.now(timezone.utc) + timedelta(hours=24)
    pending_purges(spark, "checkpoints/purger", until, Retention.from_config(config.retention)).show()
    # kind     id   rule                due_at               payload_id
    # message  m1   expired_by_counter  2026-11-22 09:12:00  p1
"""

from __future__ import annotations

from datetime import datetime
from functools import reduce
from typing import Callable

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from streams.processor import MESSAGE, STORED
from streams.rules import Retention
from streams.schedule import on_timer


def _rule_at(kind: str, retention: Retention) -> Callable[[Row, int], str | None]:
    """The rule the object's candidate will carry when its timer fires, or None if it fires none."""
    stored = STORED[kind]

    def rule(value: Row, timer_ms: int) -> str | None:
        state, schedule = stored.from_row(value)
        # As handleExpiredTimer does, with the watermark just reaching the timer.
        emitted, _ = on_timer(schedule, stored.eligible(state, retention), watermark_ms=timer_ms, linger_ms=0)
        return None if emitted is None else emitted.rule

    return rule


def _state(spark: SparkSession, checkpoint: str, option: str, value: str | bool) -> DataFrame:
    return spark.read.format("statestore").option(option, value).load(checkpoint)


def pending_purges(spark: SparkSession, checkpoint: str, until: datetime, retention: Retention) -> DataFrame:
    """One row per object whose timer is due before ``until``, overdue ones included, earliest first:
    ``kind``, ``id``, ``rule``, ``due_at`` (timestamp) and ``payload_id`` (messages only; null for a payload).

    ``rule`` is what the purge will be for: a recheck the sink asked for when that is what is due,
    else the object's own eligibility under ``retention``, which must be the purger's (a different
    one would name rules the purger does not apply). ``due_at`` is the timer, in event time: the
    object becomes a candidate once the watermark passes it, i.e. about the watermark delay (plus a
    clock interval and a trigger) later in wall-clock time; a stopped purger purges nothing.

    Raises if the checkpoint has no committed batch yet. ``until`` must be timezone-aware.
    """
    if until.tzinfo is None:
        raise ValueError("until must be timezone-aware, e.g. datetime.now(timezone.utc) + timedelta(hours=1)")
    until_ms = int(until.timestamp() * 1000)
    # RocksDB state stores report to the driver's state store coordinator, which a session only has
    # once its streaming query manager exists: without this, a session that never ran a query fails.
    spark.streams.active
    timers = (
        _state(spark, checkpoint, "readRegisteredTimers", True)
        .where(F.col("expiration_timestamp_ms") < until_ms)
        .select(F.col("key.kind").alias("kind"), F.col("key.id").alias("id"),
                F.col("expiration_timestamp_ms").alias("timer_ms"))
    )
    per_kind = []
    for kind in STORED:
        values = _state(spark, checkpoint, "stateVarName", kind).select(
            F.col("key.kind").alias("kind"), F.col("key.id").alias("id"), "value")
        # Nondeterministic only so that the filter on its result is not pushed below it, which would run it twice.
        rule = F.udf(_rule_at(kind, retention), StringType(), useArrow=False).asNondeterministic()
        per_kind.append(
            timers.join(values, ["kind", "id"])
            .select(
                "kind", "id",
                rule("value", "timer_ms").alias("rule"),
                F.timestamp_millis("timer_ms").alias("due_at"),
                (F.col("value.payload_id") if kind == MESSAGE else F.lit(None).cast(StringType())).alias("payload_id"),
            )
        )
    return reduce(DataFrame.unionByName, per_kind).where(F.col("rule").isNotNull()).orderBy("due_at", "kind", "id")
