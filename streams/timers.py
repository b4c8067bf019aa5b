"""When the clock must tick: the timers the stateful stage registers, reported to the driver.

Every batch costs a core-second or more of Spark's work (planning, the stateful stage's tasks and Python
workers, the state's commit), and the clock's ticks are what start batches on a quiet stream: a tick every
second kept an idle purger's core busy. So the clock ticks at ``stream.clock_interval`` only while there is
something to do, and otherwise once every ``stream.quiet_clock_interval``:

- while the events or the reconcile topic are being read (their offsets moved since the last tick), or a
  partition is behind (a backlog): as before, every ``clock_interval``;
- when a timer the stateful stage registered since the start comes due: the processor adds each timer it
  registers to an accumulator (``EarliestTimers``, the earliest ``KEPT`` of them a task), the sink hands
  the batch's to ``Deadlines`` after the batch's job, and the clock ticks once the wall clock passes the
  timer plus the watermark delay (the tick that moves the watermark past it);
- otherwise every ``quiet_clock_interval``: timers beyond what was kept fire at most that much later than
  they would have.

The earliest ``KEPT_SAVED`` timers known are saved beside the checkpoint (``SavedTimers``, the file
``purger-clock``), and a start reads them: a restart ticks for the timers its state held, not at the next
quiet tick. They are written after a batch that changed them, at most every ``SAVE_EVERY_S`` (on an object
store each write is a request; a busy stream changes them every batch) unless the earliest came earlier, and
at a stop. A timer that missed the file (a kill within ``SAVE_EVERY_S`` of its batch), or a file that cannot
be read or written, costs no batch: the timer fires at most ``quiet_clock_interval`` late, and a warning
names the file.

Nothing here decides a deletion: a tick only moves the watermark, and every deletion rests on the row read
again at delete time. What a late tick costs is a purge later by at most ``quiet_clock_interval``.

Example::

    files = CheckpointFiles(spark, "/checkpoint")                               # streams.checkpoint
    saved = SavedTimers(lambda: files.read_text(CLOCK_FILE), lambda text: files.write_text(CLOCK_FILE, text),
                        "/checkpoint/purger-clock")
    deadlines = Deadlines(spark.sparkContext.accumulator([], EarliestTimers()), watermark_delay_ms=10_000, saved)
    processor = PurgeProcessor(..., registered=deadlines.accumulator)
    deadlines.collect()                      # in the sink, after each batch's job
    deadlines.due()                          # in the clock: when a known timer wants a tick
    deadlines.save()                         # at a stop, after the sink's last batch
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
import time
from typing import Callable

from pyspark.accumulators import Accumulator, AccumulatorParam

# The earliest timers a task reports, and the earliest the driver keeps: enough for every timer of a quiet
# stream; a busy one ticks every clock_interval anyway (its topics are being read).
KEPT = 256
KEPT_ON_THE_DRIVER = 10_000
KEPT_SAVED = 1_000  # about 14 KB of JSON
SAVE_EVERY_S = 30.0
CLOCK_FILE = "purger-clock"  # in the checkpoint's folder, beside Spark's own

log = logging.getLogger(__name__)


def earliest(values: list[int], more: list[int], kept: int = KEPT) -> list[int]:
    """The ``kept`` earliest distinct values of both sorted lists, sorted.

    >>> earliest([1, 5, 9], [2, 5], kept=3)
    [1, 2, 5]
    """
    return sorted(set(values) | set(more))[:kept]


class EarliestTimers(AccumulatorParam):
    """An accumulator of the earliest ``KEPT`` timers (event-time milliseconds) registered, sorted."""

    def zero(self, value: list[int]) -> list[int]:
        return []

    def addInPlace(self, values: list[int], more: list[int]) -> list[int]:
        if len(more) == 1:  # one timer registered, on the worker: no sort of the whole list
            (timer,) = more
            at = bisect.bisect_left(values, timer)
            if at >= KEPT or (at < len(values) and values[at] == timer):
                return values
            values.insert(at, timer)
            del values[KEPT:]
            return values
        return earliest(values, more)


def should_tick(now_ms: int, behind: bool, read_moved: bool, due_ms: int | None, ticked_at_ms: int | None,
                quiet_ms: int) -> bool:
    """Whether the clock ticks now (the module docstring): while reading or behind, when a known timer is due
    (``due_ms``: the earliest time a tick fires one), or when the last tick (``ticked_at_ms``, wall clock) is
    ``quiet_ms`` old; and at the first chance after a start.

    >>> should_tick(10_000, False, False, None, 9_000, quiet_ms=60_000)
    False
    >>> should_tick(10_000, False, False, 10_000, 9_000, quiet_ms=60_000)
    True
    """
    return (behind or read_moved or ticked_at_ms is None or now_ms - ticked_at_ms >= quiet_ms
            or (due_ms is not None and due_ms <= now_ms))


class SavedTimers:
    """The earliest timers known, kept across restarts as a JSON document in a file beside the checkpoint
    (``read``, ``write``: its text; ``name``: the file, for the warnings)."""

    def __init__(self, read: Callable[[], str | None], write: Callable[[str], None], name: str) -> None:
        self.read, self.write, self.name = read, write, name

    def load(self) -> list[int]:
        """The timers saved (event-time ms, sorted); none when there is no file or it cannot be read."""
        try:
            text = self.read()
            return sorted({int(timer) for timer in json.loads(text)["timers_ms"]})[:KEPT_SAVED] if text else []
        except Exception as error:  # a truncated file, a store that does not answer: the quiet ticks remain
            log.warning("%s not read (%s): timers registered before this start fire at the next quiet tick",
                        self.name, str(error).splitlines()[0] if str(error) else type(error).__name__)
            return []

    def save(self, timers: list[int]) -> None:
        try:
            self.write(json.dumps({"timers_ms": timers}))
        except Exception as error:  # the batch has run; a restart falls back on the quiet ticks
            log.warning("%s not written (%s): after a restart, the timers known now fire at the next quiet tick",
                        self.name, str(error).splitlines()[0] if str(error) else type(error).__name__)


class Deadlines:
    """The times at which registered timers want a tick: filled by the sink after each batch (``collect``),
    read and emptied by the clock (``due``, ``ticked``); with ``saved``, loaded from it at the start and
    saved to it (the module docstring; ``monotonic``: the clock that paces the writes)."""

    def __init__(self, accumulator: Accumulator, watermark_delay_ms: int, saved: SavedTimers | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.accumulator = accumulator  # an EarliestTimers accumulator, which the stateful stage adds to
        self.watermark_delay_ms = watermark_delay_ms
        self.saved = saved
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._saving = threading.Lock()  # the sink's thread and a stop's
        # Sorted: wall-clock times at which a tick fires a timer. A tick at t moves the watermark to t - delay;
        # a timer fires once the watermark is past it.
        self._ticks_ms: list[int] = []
        self._saved_ms: list[int] = saved.load() if saved is not None else []
        self._saved_at: float | None = None  # monotonic seconds of this run's last write
        self._add(self._saved_ms)

    def _add(self, timers: list[int]) -> None:
        wanted = [timer + self.watermark_delay_ms + 1 for timer in timers]
        with self._lock:
            self._ticks_ms = earliest(self._ticks_ms, wanted, KEPT_ON_THE_DRIVER)

    def collect(self) -> None:
        """Take the timers the batch just run registered (its job has ended: every task's are in)."""
        timers = self.accumulator.value
        self.accumulator.value = []
        if timers:
            self._add(timers)
        if self.saved is not None:
            self._save(at_once=False)

    def save(self) -> None:
        """Write the timers known now if they changed since the last write (at a stop)."""
        if self.saved is not None:
            self._save(at_once=True)

    def _save(self, at_once: bool) -> None:
        with self._saving:
            with self._lock:
                kept = [tick - self.watermark_delay_ms - 1 for tick in self._ticks_ms[:KEPT_SAVED]]
            if kept == self._saved_ms:
                return
            now = self.monotonic()
            sooner = bool(kept) and (not self._saved_ms or kept[0] < self._saved_ms[0])
            if at_once or sooner or self._saved_at is None or now - self._saved_at >= SAVE_EVERY_S:
                self.saved.save(kept)
                self._saved_ms, self._saved_at = kept, now

    def due(self) -> int | None:
        """The earliest time a tick fires a known timer, if any."""
        with self._lock:
            return self._ticks_ms[0] if self._ticks_ms else None

    def ticked(self, at_ms: int) -> None:
        """A tick at ``at_ms`` was delivered: the timers it fires want no other."""
        with self._lock:
            del self._ticks_ms[:bisect.bisect_right(self._ticks_ms, at_ms)]
