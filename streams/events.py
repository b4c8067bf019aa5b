"""Event parsing: Kafka record bytes -> typed lifecycle events, or a reason they are bad input.

SPEC section 2 is the contract. Every record becomes one row with the typed
fields of the union of all event types, an ``event_time_ms`` (epoch
milliseconds, what the state machine works in) and ``error``: null for a good
event, otherwise the reason it is bad input. Bad rows never reach the state.

Example::

    from streams.events import parse_events
    events = parse_events(kafka_df)  # kafka_df: the Kafka source's columns
    good = events.where("error IS NULL")
"""

from __future__ import annotations

from datetime import datetime, timezone

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

# Emitted by the purger itself on its clock topic so an idle stream's watermark advances.
CLOCK = "clock"
# Clock ticks are about no message; they share this key and the processor ignores them.
CLOCK_KEY = ""

# The fields each event type must carry beyond the common ones (SPEC section 2).
# Nullable fields (enqueue's extract_count and extract_until) are checked for type only.
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "enqueue": ("mailbox", "payload_id", "payload_size", "inline", "complete", "dcs"),
    "upload_complete": (),
    "dequeue": ("extract_count",),
    "extract_counter": ("extract_count",),
    "extract_until": (),
    "delete": (),
    CLOCK: (),
}
COMMON_FIELDS = ("event_id", "type", "event_time", "message_id")

EVENT_SCHEMA = StructType(
    [
        StructField("event_id", StringType()),
        StructField("type", StringType()),
        StructField("event_time", StringType()),
        StructField("message_id", StringType()),
        StructField("mailbox", StringType()),
        StructField("payload_id", StringType()),
        StructField("payload_size", LongType()),
        StructField("inline", BooleanType()),
        StructField("extract_count", IntegerType()),
        StructField("extract_until", StringType()),
        StructField("complete", BooleanType()),
        StructField("dcs", ArrayType(StringType())),
    ]
)
# The same fields read as text: a field present here but null in the typed parse has the wrong type.
# Only malformed JSON fills its corrupt-record column, since any JSON value reads as text.
_CORRUPT = "_corrupt_record"
_TEXT_SCHEMA = StructType([StructField(f.name, StringType()) for f in EVENT_SCHEMA] + [StructField(_CORRUPT, StringType())])
_TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSX"


def format_timestamp(moment: datetime) -> str:
    """The spec's timestamp text: ISO-8601 UTC with milliseconds, e.g. ``2026-01-01T07:58:00.000Z``."""
    moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _epoch_ms(text: Column) -> Column:
    return F.unix_millis(F.try_to_timestamp(text, F.lit(_TIMESTAMP_FORMAT)))


def _error(typed: Column, text: Column, value: Column, event_time_ms: Column, extract_until_ms: Column) -> Column:
    """The first reason the record is bad input, or null."""
    checks: list[tuple[Column, str]] = [
        (value.isNull(), F.lit("empty record (tombstone)")),
        (~F.is_valid_utf8(value), F.lit("value is not UTF-8")),
        (text.isNull() | typed.isNull() | text[_CORRUPT].isNotNull(), F.lit("value is not a JSON object")),
    ]
    checks += [
        (typed[name].isNull() & text[name].isNotNull(), F.lit(f"field {name} has the wrong type"))
        for name in EVENT_SCHEMA.fieldNames()
    ]
    for name in COMMON_FIELDS:
        if name == "message_id":
            # Clock ticks are the one event about no message.
            missing = typed[name].isNull() & (typed["type"] != CLOCK)
        else:
            missing = typed[name].isNull()
        checks.append((missing, F.lit(f"missing field {name}")))
    checks.append((~typed["type"].isin(*REQUIRED_FIELDS), F.concat(F.lit("unknown type "), typed["type"])))
    checks.append((event_time_ms.isNull(), F.lit("event_time is not an ISO-8601 UTC timestamp")))
    checks.append(
        (typed["extract_until"].isNotNull() & extract_until_ms.isNull(),
         F.lit("extract_until is not an ISO-8601 UTC timestamp"))
    )
    for event_type, fields in REQUIRED_FIELDS.items():
        for name in fields:
            checks.append(
                ((typed["type"] == event_type) & typed[name].isNull(),
                 F.lit(f"{event_type} event lacks field {name}"))
            )
    result = F.when(checks[0][0], checks[0][1])
    for condition, reason in checks[1:]:
        result = result.when(condition, reason)
    return result


def parse_events(records: DataFrame) -> DataFrame:
    """Parse the Kafka source's rows (``key``, ``value``, ``topic``, ``partition``, ``offset``, ...).

    The result has the fields of ``EVENT_SCHEMA`` (``event_time`` and ``extract_until`` as epoch
    milliseconds in ``event_time_ms`` and ``extract_until_ms``), the record's coordinates, its
    original bytes in ``value``, and ``error``.
    """
    json_text = F.when(F.is_valid_utf8("value"), F.col("value").cast("string"))
    parsed = records.select(
        "topic", "partition", "offset", "value",
        F.from_json(json_text, EVENT_SCHEMA).alias("typed"),
        F.from_json(json_text, _TEXT_SCHEMA, {"columnNameOfCorruptRecord": _CORRUPT}).alias("text"),
    ).select(
        "*",
        _epoch_ms(F.col("typed.event_time")).alias("event_time_ms"),
        _epoch_ms(F.col("typed.extract_until")).alias("extract_until_ms"),
    )
    typed = F.col("typed")
    return parsed.select(
        "topic", "partition", "offset", "value",
        *(typed[name].alias(name) for name in EVENT_SCHEMA.fieldNames() if name != "message_id"),
        F.coalesce(typed["message_id"], F.lit(CLOCK_KEY)).alias("message_id"),
        "event_time_ms",
        "extract_until_ms",
        _error(typed, F.col("text"), F.col("value"), F.col("event_time_ms"), F.col("extract_until_ms")).alias("error"),
    )
