"""Pending purges: what the stateful stage will emit in the next hours, read from the checkpoint.

Nothing is asked of the running query: Spark's state data source (``format("statestore")``)
reads the state of the checkpoint's last committed batch, so this works while the purger runs,
after it stopped, or on a copy of its checkpoint. Two reads of the one ``transformWithState``
operator are joined:

- the registered timers (``readRegisteredTimers``): ``key`` (kind, id) and
  ``expiration_timestamp_ms``, one per object, since the processor keeps one timer an object;
- the object's value state (``stateVarName``: the kind's name, e.g. ``message``): ``key`` and ``value``,
  a struct laid out as ``streams.processor._Stored.schema`` and decoded by its ``from_row``.

A timer is a purge only when ``core.schedule.on_timer`` would emit something at it: the end of
a linger after a purge (when the state is forgotten) is not listed.

Example::

    from datetime import datetime, timedelta, timezone
    from purger.streams.pending import pending_purges
    until = datetime.now(timezone.utc) + timedelta(hours=24)
    pending_purges(spark, "checkpoints/purger", until, config.policy_set).show()
    # kind     id   rule                due_at               hint
    # message  m1   expired_by_counter  2026-11-22 09:12:00  {"payload_id": "p1", ...}
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import reduce
from typing import Callable

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from purger.core.policy_set import PolicySet
from purger.core.schedule import on_timer
from purger.streams.processor import _Stored, stored_kinds


def _due(stored: _Stored) -> Callable[[Row, int], tuple[str, str] | None]:
    """The rule the object's candidate will carry when its timer fires, and its hint; None if it fires none."""

    def due(value: Row, timer_ms: int) -> tuple[str, str] | None:
        state, schedule = stored.from_row(value)
        # As handleExpiredTimer does, with the watermark just reaching the timer.
        emitted, _ = on_timer(schedule, stored.kind.eligibility(state), watermark_ms=timer_ms, linger_ms=0)
        return None if emitted is None else (emitted.rule, json.dumps(stored.kind.hint("", state)))

    return due


def _state(spark: SparkSession, checkpoint: str, option: str, value: str | bool) -> DataFrame:
    return spark.read.format("statestore").option(option, value).load(checkpoint)


def pending_purges(spark: SparkSession, checkpoint: str, until: datetime, policies: PolicySet) -> DataFrame:
    """One row per object whose timer is due before ``until``, overdue ones included, earliest first:
    ``kind``, ``id``, ``rule``, ``due_at`` (timestamp) and ``hint`` (what the candidate will carry, JSON:
    a message's ``payload_id``, for example).

    ``rule`` is what the purge will be for: a recheck the sink asked for when that is what is due,
    else the object's own eligibility under ``policies``, which must be the purger's (others would
    name rules the purger does not apply). ``due_at`` is the timer, in event time: the
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
    due_type = StructType([StructField("rule", StringType()), StructField("hint", StringType())])
    for kind, stored in stored_kinds(policies).items():
        values = _state(spark, checkpoint, "stateVarName", kind).select(
            F.col("key.kind").alias("kind"), F.col("key.id").alias("id"), "value")
        # Nondeterministic only so that the filter on its result is not pushed below it, which would run it twice.
        due = F.udf(_due(stored), due_type, useArrow=False).asNondeterministic()
        per_kind.append(
            timers.join(values, ["kind", "id"])
            .select("kind", "id", due("value", "timer_ms").alias("due"), F.timestamp_millis("timer_ms").alias("due_at"))
            .select("kind", "id", "due.rule", "due_at", "due.hint")
        )
    return reduce(DataFrame.unionByName, per_kind).where(F.col("rule").isNotNull()).orderBy("due_at", "kind", "id")
