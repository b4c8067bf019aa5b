"""Event parsing: Kafka record bytes -> typed events of the enabled policies, or the reason they are bad input.

docs/reference.md, Events and each policy's events (``core.events.EventField`` and
``EventType``) are the contract. Every record becomes one row with the typed
fields of the union of all enabled policies' events and the control protocol's
(``streams.control``), ``event_time_ms`` and ``<timestamp field>_ms`` (epoch
milliseconds, what the states work in), ``ignored`` (an event of a built-in
policy that is not enabled: counted, not dead-lettered) and ``error``: null for
a good event, otherwise the reason it is bad input. Bad rows never reach the
state; they go to the dead-letter topic with their original bytes.

Example::

    from purger.streams.parse import parse_events
    events = parse_events(kafka_df, ["purger.control", "purger.reconcile"], policies)  # the Kafka source's rows
    good = events.where("error IS NULL")
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType, BooleanType, DataType, IntegerType, LongType, StringType, StructField, StructType,
)

from purger.core.events import EventField
from purger.core.policy_set import COMMON_FIELDS, PolicySet
from purger.core.times import SPARK_TIMESTAMP_FORMAT
from purger.streams import control

# Identifiers longer than this are bad input (Cassandra keys must stay small; no platform id is this long).
MAX_ID_LENGTH = 512
_SPARK_TYPES: dict[str, DataType] = {
    "string": StringType(), "timestamp": StringType(), "int": IntegerType(), "long": LongType(),
    "boolean": BooleanType(), "strings": ArrayType(StringType()),
}
# Only malformed JSON fills its corrupt-record column, since any JSON value reads as text.
_CORRUPT = "_corrupt_record"


def event_fields(policies: PolicySet) -> list[EventField]:
    """Every field a record may carry: the common ones, the control protocol's, the policies'."""
    common = [EventField(name, "timestamp" if name == "event_time" else "string", identifier=name != "event_time")
              for name in COMMON_FIELDS]
    found = {f.name: f for f in [*common, *control.FIELDS, *policies.fields.values()]}
    return list(found.values())


def event_schema(policies: PolicySet) -> StructType:
    return StructType([StructField(f.name, _SPARK_TYPES[f.type]) for f in event_fields(policies)])


def timestamp_fields(policies: PolicySet) -> list[str]:
    """Fields read as epoch milliseconds into ``<name>_ms``, ``event_time`` first."""
    return [f.name for f in event_fields(policies) if f.type == "timestamp"]


def _epoch_ms(text: Column) -> Column:
    return F.unix_millis(F.try_to_timestamp(text, F.lit(SPARK_TIMESTAMP_FORMAT)))


def _error(typed: Column, text: Column, value: Column, from_control: Column, policies: PolicySet) -> Column:
    """The first reason the record is bad input, or null."""
    fields = event_fields(policies)
    event_type = typed["type"]
    lifecycle = [t for t in policies.event_types.values() if not t.control]
    control_only = control.control_types(policies)
    accepted = event_type.isin(*(t.name for t in lifecycle), *policies.ignored_types) | (
        from_control & event_type.isin(*control_only))
    checks: list[tuple[Column, Column]] = [
        (value.isNull(), F.lit("empty record (tombstone)")),
        (~F.is_valid_utf8(value), F.lit("value is not UTF-8")),
        (text.isNull() | typed.isNull() | text[_CORRUPT].isNotNull(), F.lit("value is not a JSON object")),
    ]
    checks += [(typed[f.name].isNull() & text[f.name].isNotNull(), F.lit(f"field {f.name} has the wrong type"))
               for f in fields]
    # Spark's JSON reader turns any value into text for a string field; the raw JSON says whether it
    # was a string (or null). A number, boolean, object or array there is the wrong type.
    raw = value.cast("string")
    checks += [
        (raw.rlike(rf'(?<!\\)"{f.name}"\s*:\s*[-0-9tf{{\[]'), F.lit(f"field {f.name} has the wrong type"))
        for f in fields if f.type in ("string", "timestamp")
    ]
    checks += [
        (F.length(typed[f.name]) > MAX_ID_LENGTH, F.lit(f"field {f.name} is longer than {MAX_ID_LENGTH} characters"))
        for f in fields if f.identifier
    ]
    checks += [(typed[f.name] < 0, F.lit(f"field {f.name} is negative")) for f in fields if f.non_negative]
    checks += [(typed[f.name].isNotNull() & ~typed[f.name].isin(*f.choices),
                F.lit(f"field {f.name} is none of {', '.join(f.choices)}")) for f in fields if f.choices]
    checks += [(typed[name].isNull(), F.lit(f"missing field {name}")) for name in COMMON_FIELDS]
    checks += [((event_type == t.name) & typed[t.id_field].isNull(), F.lit(f"missing field {t.id_field}"))
               for t in policies.event_types.values()]
    checks.append((~accepted, F.concat(F.lit("unknown type "), event_type)))
    checks += [
        (typed[name].isNotNull() & F.col(f"{name}_ms").isNull(), F.lit(f"{name} is not an ISO-8601 UTC timestamp"))
        for name in timestamp_fields(policies)
    ]
    checks += [
        ((event_type == t.name) & typed[name].isNull(), F.lit(f"{t.name} event lacks field {name}"))
        for t in policies.event_types.values() for name in t.required
    ]
    checks += control.control_errors(typed, policies)
    result = F.when(checks[0][0], checks[0][1])
    for condition, reason in checks[1:]:
        result = result.when(condition, reason)
    return result


def parse_events(records: DataFrame, own_topics: list[str], policies: PolicySet) -> DataFrame:
    """Parse the Kafka source's rows (``key``, ``value``, ``topic``, ``partition``, ``offset``, ...).

    The result has every event field (``event_time`` and the timestamp fields also as epoch milliseconds
    in ``<name>_ms``), the record's coordinates, its original bytes in ``value``, ``ignored`` and ``error``.
    Control event types are accepted only from ``own_topics``, which only the purger writes (the control
    and reconcile topics).
    """
    schema = event_schema(policies)
    text_schema = StructType([StructField(f.name, StringType()) for f in schema] + [StructField(_CORRUPT, StringType())])
    stamps = timestamp_fields(policies)
    json_text = F.when(F.is_valid_utf8("value"), F.col("value").cast("string"))
    parsed = records.select(
        "topic", "partition", "offset", "key", "value",
        F.from_json(json_text, schema).alias("typed"),
        F.from_json(json_text, text_schema, {"columnNameOfCorruptRecord": _CORRUPT}).alias("text"),
    ).select("*", *(_epoch_ms(F.col(f"typed.{name}")).alias(f"{name}_ms") for name in stamps))
    typed = F.col("typed")
    error = _error(typed, F.col("text"), F.col("value"), F.col("topic").isin(*own_topics), policies)
    return parsed.select(
        "topic", "partition", "offset", "key", "value",
        *(typed[name].alias(name) for name in schema.fieldNames()),
        *(f"{name}_ms" for name in stamps),
        error.alias("error"),
    ).withColumn("ignored", F.col("error").isNull() & F.col("type").isin(*policies.ignored_types))
