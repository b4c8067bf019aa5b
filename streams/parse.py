"""Event parsing: Kafka record bytes -> typed lifecycle events, or a reason they are bad input.

SPEC section 2 is the contract. Every record becomes one row with the typed
fields of the union of all event types, an ``event_time_ms`` (epoch
milliseconds, what the state machine works in) and ``error``: null for a good
event, otherwise the reason it is bad input. Bad rows never reach the state;
they go to the dead-letter topic with their original bytes.

Example::

    from streams.events import parse_events
    events = parse_events(kafka_df, control_topic="purger.control")  # kafka_df: the Kafka source's rows
    good = events.where("error IS NULL")
"""

from __future__ import annotations

from datetime import datetime, timezone

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from streams.state import DELETE, DEQUEUE, ENQUEUE, EXTRACT_COUNTER, EXTRACT_UNTIL, RELEASED, UPLOAD_COMPLETE
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

# The purger's own events, on its control topic only: clock ticks so an idle stream's watermark
# advances (streams/clock.py), and the purge sink's reports (sinks/purge.py).
CLOCK = "clock"
RECHECK = "recheck"
# Control events about no message share this key.
NO_MESSAGE = ""

# The fields each event type must carry beyond the common ones (SPEC section 2).
# Nullable fields (enqueue's extract_count and extract_until) are checked for type only.
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    ENQUEUE: ("mailbox", "payload_id", "payload_size", "inline", "complete", "dcs"),
    UPLOAD_COMPLETE: (),
    DEQUEUE: ("extract_count",),
    EXTRACT_COUNTER: ("extract_count",),
    EXTRACT_UNTIL: (),
    DELETE: (),
}
CONTROL_FIELDS: dict[str, tuple[str, ...]] = {
    CLOCK: (),
    # Look at an object again: kind (message | payload), rule, and its id in message_id or payload_id.
    RECHECK: ("kind", "rule"),
    # The last message referring to payload_id became eligible at event_time; the sink found no
    # reference left at observed_at.
    RELEASED: ("payload_id", "observed_at"),
}
COMMON_FIELDS = ("event_id", "type", "event_time", "message_id")
# Identifiers longer than this are bad input (Cassandra keys must stay small; no platform id is this long).
MAX_ID_LENGTH = 512
_ID_FIELDS = ("event_id", "type", "message_id", "mailbox", "payload_id")
_COUNT_FIELDS = ("payload_size", "extract_count")

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
        # Control events only.
        StructField("kind", StringType()),
        StructField("rule", StringType()),
        StructField("observed_at", StringType()),
    ]
)
_STRING_FIELDS = [f.name for f in EVENT_SCHEMA.fields if isinstance(f.dataType, StringType)]
# Optional timestamp fields, read as epoch milliseconds into `<name>_ms`.
TIMESTAMP_FIELDS = ("extract_until", "observed_at")
# The same fields read as text: a field present here but null in the typed parse has the wrong type.
# Only malformed JSON fills its corrupt-record column, since any JSON value reads as text.
_CORRUPT = "_corrupt_record"
_TEXT_SCHEMA = StructType([StructField(f.name, StringType()) for f in EVENT_SCHEMA] + [StructField(_CORRUPT, StringType())])
_TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSX"


def format_timestamp(moment: datetime) -> str:
    """The spec's timestamp text: ISO-8601 UTC with milliseconds, e.g. ``2026-01-01T07:58:00.000Z``."""
    moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def format_epoch_ms(epoch_ms: int) -> str:
    """``format_timestamp`` of epoch milliseconds."""
    return format_timestamp(datetime.fromtimestamp(epoch_ms / 1000, timezone.utc))


def _epoch_ms(text: Column) -> Column:
    return F.unix_millis(F.try_to_timestamp(text, F.lit(_TIMESTAMP_FORMAT)))


def _error(typed: Column, text: Column, value: Column, from_control: Column) -> Column:
    """The first reason the record is bad input, or null."""
    event_type = typed["type"]
    lifecycle = event_type.isin(*REQUIRED_FIELDS)
    control = from_control & event_type.isin(*CONTROL_FIELDS)
    checks: list[tuple[Column, Column]] = [
        (value.isNull(), F.lit("empty record (tombstone)")),
        (~F.is_valid_utf8(value), F.lit("value is not UTF-8")),
        (text.isNull() | typed.isNull() | text[_CORRUPT].isNotNull(), F.lit("value is not a JSON object")),
    ]
    checks += [
        (typed[name].isNull() & text[name].isNotNull(), F.lit(f"field {name} has the wrong type"))
        for name in EVENT_SCHEMA.fieldNames()
    ]
    # Spark's JSON reader turns any value into text for a string field; the raw JSON says whether it
    # was a string (or null). A number, boolean, object or array there is the wrong type.
    raw = value.cast("string")
    checks += [
        (raw.rlike(rf'(?<!\\)"{name}"\s*:\s*[-0-9tf{{\[]'), F.lit(f"field {name} has the wrong type"))
        for name in _STRING_FIELDS
    ]
    checks += [
        (F.length(typed[name]) > MAX_ID_LENGTH, F.lit(f"field {name} is longer than {MAX_ID_LENGTH} characters"))
        for name in _ID_FIELDS
    ]
    checks += [(typed[name] < 0, F.lit(f"field {name} is negative")) for name in _COUNT_FIELDS]
    for name in COMMON_FIELDS:
        # Control events may be about no message.
        missing = typed[name].isNull() & ~control if name == "message_id" else typed[name].isNull()
        checks.append((missing, F.lit(f"missing field {name}")))
    checks.append((~lifecycle & ~control, F.concat(F.lit("unknown type "), event_type)))
    checks.append((F.col("event_time_ms").isNull(), F.lit("event_time is not an ISO-8601 UTC timestamp")))
    checks += [
        (typed[name].isNotNull() & F.col(f"{name}_ms").isNull(), F.lit(f"{name} is not an ISO-8601 UTC timestamp"))
        for name in TIMESTAMP_FIELDS
    ]
    for event_type_name, fields in [*REQUIRED_FIELDS.items(), *CONTROL_FIELDS.items()]:
        for name in fields:
            checks.append(
                ((event_type == event_type_name) & typed[name].isNull(),
                 F.lit(f"{event_type_name} event lacks field {name}"))
            )
    checks.append(
        ((event_type == RECHECK) & ~typed["kind"].isin("message", "payload"),
         F.lit("recheck event kind is neither message nor payload"))
    )
    result = F.when(checks[0][0], checks[0][1])
    for condition, reason in checks[1:]:
        result = result.when(condition, reason)
    return result


def parse_events(records: DataFrame, control_topic: str) -> DataFrame:
    """Parse the Kafka source's rows (``key``, ``value``, ``topic``, ``partition``, ``offset``, ...).

    The result has the fields of ``EVENT_SCHEMA`` (``event_time`` and the ``TIMESTAMP_FIELDS`` as epoch
    milliseconds in ``event_time_ms``, ``extract_until_ms``, ...), the record's coordinates, its
    original bytes in ``value``, and ``error``. The purger's own event types are accepted from
    ``control_topic`` only.
    """
    json_text = F.when(F.is_valid_utf8("value"), F.col("value").cast("string"))
    parsed = records.select(
        "topic", "partition", "offset", "key", "value",
        F.from_json(json_text, EVENT_SCHEMA).alias("typed"),
        F.from_json(json_text, _TEXT_SCHEMA, {"columnNameOfCorruptRecord": _CORRUPT}).alias("text"),
    ).select(
        "*",
        *(_epoch_ms(F.col(f"typed.{name}")).alias(f"{name}_ms") for name in ("event_time", *TIMESTAMP_FIELDS)),
    )
    typed = F.col("typed")
    error = _error(typed, F.col("text"), F.col("value"), F.col("topic") == F.lit(control_topic))
    return parsed.select(
        "topic", "partition", "offset", "key", "value",
        *(typed[name].alias(name) for name in EVENT_SCHEMA.fieldNames() if name != "message_id"),
        F.coalesce(typed["message_id"], F.lit(NO_MESSAGE)).alias("message_id"),
        *(f"{name}_ms" for name in ("event_time", *TIMESTAMP_FIELDS)),
        error.alias("error"),
    )
