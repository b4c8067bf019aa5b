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


# A duration's units, each with its size in seconds and how many of it make the next unit.
_UNITS = (("ms", 0.001, 1000), ("s", 1, 60), ("min", 60, 60), ("h", 3600, 24), ("d", 86400, None))


def human_duration(value: float | int | timedelta | None) -> str:
    """A duration as a person reads it: the largest unit that keeps the number at 1 or more, one decimal
    under 10 (none when it is 0), no decimal from 10 on; nothing is ``0 s``. ``None`` (no figure) is ``-``.

    >>> [human_duration(s) for s in (0.85, 14, 3.2 * 3600, 856270.1, 90, 2.0, None)]
    ['850 ms', '14 s', '3.2 h', '9.9 d', '1.5 min', '2 s', '-']
    """
    if value is None:
        return "-"
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds == 0:
        return "0 s"
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    for unit, size, next_unit in _UNITS:
        number = seconds / size
        shown = f"{number:.1f}" if number < 10 else f"{number:.0f}"
        if next_unit is None or float(shown) < next_unit:
            if shown.endswith(".0"):
                shown = shown[:-2]
            return f"{sign}{shown} {unit}"
    raise AssertionError("unreachable: the last unit takes any number")
