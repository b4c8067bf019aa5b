"""Time formats: the events' ISO-8601 UTC text with milliseconds, and epoch milliseconds.

Conversions are whole numbers, exact over every timestamp the Cassandra driver decodes (years 1 to 9999): a
float of a moment's seconds, times 1000, is a millisecond short for about 1% of moments before 2020 or after
2033.

Example::

    format_epoch_ms(1_767_254_280_000)   # '2026-01-01T07:58:00.000Z'
    parse_timestamp('2026-01-01T07:58:00.000Z')   # 1767254280000
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

# The same format as Spark's pattern in streams.parse.
SPARK_TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSX"

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def format_timestamp(moment: datetime) -> str:
    """the events' timestamp text: ISO-8601 UTC with milliseconds (the moment's, truncated), four-digit years,
    e.g. ``2026-01-01T07:58:00.000Z``."""
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def format_epoch_ms(epoch_ms: int) -> str:
    """``format_timestamp`` of epoch milliseconds."""
    return format_timestamp(from_epoch_ms(epoch_ms))


def parse_timestamp(text: str) -> int:
    """Epoch milliseconds of the events' timestamp text."""
    return epoch_ms(datetime.fromisoformat(text.replace("Z", "+00:00")))


def nearest_ms(micros: Any) -> Any:
    """Microseconds since the epoch to the nearest millisecond (a half up), of a number or of a numpy array:
    ``epoch_ms`` and reconciliation's columns (``policies.mailbox.verdicts``) alike."""
    return (micros + 500) // 1000


def epoch_ms(moment: datetime | None) -> int | None:
    """Epoch milliseconds of a datetime; Cassandra's timestamps come back naive, in UTC. The nearest: the driver
    decodes a timestamp through a float of seconds, up to 16 microseconds off its millisecond far from 1970."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return nearest_ms((moment - _EPOCH) // timedelta(microseconds=1))


def now_ms() -> int:
    """The wall clock, in epoch milliseconds: what the double-checks compare rows with."""
    return int(datetime.now(timezone.utc).timestamp() * 1000)


def from_epoch_ms(epoch_ms: int) -> datetime:
    """A timezone-aware UTC datetime (what a bound CQL timestamp parameter takes)."""
    return _EPOCH + timedelta(milliseconds=epoch_ms)


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
