"""Time formats: the events' ISO-8601 UTC text with milliseconds, and epoch milliseconds.

Example::

    format_epoch_ms(1_767_254_280_000)   # '2026-01-01T07:58:00.000Z'
    parse_timestamp('2026-01-01T07:58:00.000Z')   # 1767254280000
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

# The same format as Spark's pattern in streams.parse.
SPARK_TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSX"


def format_timestamp(moment: datetime) -> str:
    """the events' timestamp text: ISO-8601 UTC with milliseconds, e.g. ``2026-01-01T07:58:00.000Z``."""
    moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def format_epoch_ms(epoch_ms: int) -> str:
    """``format_timestamp`` of epoch milliseconds."""
    return format_timestamp(datetime.fromtimestamp(epoch_ms / 1000, timezone.utc))


def parse_timestamp(text: str) -> int:
    """Epoch milliseconds of the events' timestamp text."""
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def epoch_ms(moment: datetime | None) -> int | None:
    """Epoch milliseconds of a datetime; Cassandra's timestamps come back naive, in UTC."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


def now_ms() -> int:
    """The wall clock, in epoch milliseconds: what the double-checks compare rows with."""
    return int(datetime.now(timezone.utc).timestamp() * 1000)


def from_epoch_ms(epoch_ms: int) -> datetime:
    """A timezone-aware UTC datetime (what a bound CQL timestamp parameter takes)."""
    return datetime.fromtimestamp(epoch_ms / 1000, timezone.utc)


def duration_ms(duration: timedelta) -> int:
    """A duration in whole milliseconds (the state, the timers and the rules count in them)."""
    return duration // timedelta(milliseconds=1)
