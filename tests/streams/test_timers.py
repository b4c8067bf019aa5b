"""When the clock ticks (``streams.timers``): the timers the stateful stage registers, kept and merged as the
accumulator does on the workers and the driver, against a plain sorted set; and a clock loop that ticks at each
known timer's time, and on a quiet stream once every quiet interval."""

from __future__ import annotations

import logging

from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.accumulators import Accumulator

from purger.streams.timers import KEPT, KEPT_SAVED, SAVE_EVERY_S, Deadlines, EarliestTimers, SavedTimers, should_tick

timers = st.integers(min_value=0, max_value=10_000)


def on_a_worker(registered: list[int]) -> list[int]:
    """A task's accumulator: each registered timer added on its own, as the processor does."""
    param, value = EarliestTimers(), EarliestTimers().zero([])
    for timer in registered:
        value = param.addInPlace(value, [timer])
    return value


@given(st.lists(st.lists(timers, max_size=600), max_size=4))
@settings(max_examples=200)
def test_the_driver_gets_the_earliest_timers_of_every_task_whatever_their_number(tasks):
    param = EarliestTimers()
    merged = param.zero([])
    for task in tasks:
        merged = param.addInPlace(merged, on_a_worker(task))
    assert merged == sorted({t for task in tasks for t in task})[:KEPT]


def clock_loop(deadlines: Deadlines, start_ms: int, end_ms: int, interval_ms: int, quiet_ms: int) -> list[int]:
    """The clock's decisions on a caught-up, quiet stream, an ``interval_ms`` apart: the ticks it sends."""
    ticks: list[int] = []
    for now in range(start_ms, end_ms, interval_ms):
        if should_tick(now, False, False, deadlines.due(), ticks[-1] if ticks else None, quiet_ms):
            ticks.append(now)
            deadlines.ticked(now)
    return ticks


@given(st.lists(timers, max_size=50), st.integers(min_value=0, max_value=3_000))
@settings(max_examples=200)
def test_every_known_timer_is_fired_by_a_tick_within_an_interval_and_a_quiet_stream_ticks_seldom(registered, delay):
    interval, quiet = 1_000, 10_000
    accumulator = Accumulator(0, [], EarliestTimers())
    accumulator.add(on_a_worker(registered))
    deadlines = Deadlines(accumulator, watermark_delay_ms=delay)
    deadlines.collect()
    assert accumulator.value == []  # taken: the next batch's timers are its own
    ticks = clock_loop(deadlines, 0, 30_000, interval, quiet)
    for timer in registered:
        # The first tick whose watermark (the tick less the delay) passes the timer, within an interval of it.
        fired_by = next(t for t in ticks if t - delay > timer)
        assert fired_by <= timer + delay + interval
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert all(gap <= quiet for gap in gaps)
    # No more ticks than the timers' distinct seconds and the quiet ticks between them.
    assert len(ticks) <= len({(t + delay) // interval for t in registered}) + 30_000 // quiet + 1


def test_a_busy_or_behind_stream_ticks_every_interval_and_a_start_ticks_at_once():
    assert should_tick(5_000, behind=True, read_moved=False, due_ms=None, ticked_at_ms=4_000, quiet_ms=60_000)
    assert should_tick(5_000, behind=False, read_moved=True, due_ms=None, ticked_at_ms=4_000, quiet_ms=60_000)
    assert should_tick(5_000, behind=False, read_moved=False, due_ms=None, ticked_at_ms=None, quiet_ms=60_000)
    assert not should_tick(5_000, behind=False, read_moved=False, due_ms=6_000, ticked_at_ms=4_000, quiet_ms=60_000)


class TextFile:
    """A file's text, as the checkpoint's folder keeps it (``streams.checkpoint.CheckpointFiles``)."""

    def __init__(self, text: str | None = None) -> None:
        self.text, self.writes = text, 0

    def read(self) -> str | None:
        return self.text

    def write(self, text: str) -> None:
        self.text, self.writes = text, self.writes + 1

    def saved(self) -> SavedTimers:
        return SavedTimers(self.read, self.write, "/checkpoint/purger-clock")


class Monotonic:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def batches_registering(file: TextFile, batches: list[list[int]], delay: int, seconds_apart: float = 1.0,
                        stop: bool = True) -> Deadlines:
    """A run's Deadlines over ``file``: each batch's timers collected after it, as the sink does, batches
    ``seconds_apart``; then a stop's save."""
    accumulator, clock = Accumulator(0, [], EarliestTimers()), Monotonic()
    deadlines = Deadlines(accumulator, watermark_delay_ms=delay, saved=file.saved(), monotonic=clock)
    for batch in batches:
        accumulator.add(on_a_worker(batch))
        deadlines.collect()
        clock.now += seconds_apart
    if stop:
        deadlines.save()
    return deadlines


@given(st.lists(st.lists(timers, max_size=40), max_size=4), st.integers(min_value=0, max_value=3_000),
       st.integers(min_value=0, max_value=3_000))
@settings(max_examples=200)
def test_a_restart_ticks_for_the_timers_registered_before_it_whatever_its_watermark_delay(batches, delay, new_delay):
    """The state a restart continues from holds the timers of the run before: the restarted clock knows the
    earliest ``KEPT_SAVED`` of them and fires each within an interval, with the restart's watermark delay."""
    file = TextFile()
    batches_registering(file, batches, delay)
    restarted = Deadlines(Accumulator(0, [], EarliestTimers()), watermark_delay_ms=new_delay, saved=file.saved())
    interval, quiet = 1_000, 60_000
    ticks = clock_loop(restarted, 0, 20_000, interval, quiet)
    for timer in sorted({t for batch in batches for t in batch})[:KEPT_SAVED]:
        fired_by = next(t for t in ticks if t - new_delay > timer)
        assert fired_by <= timer + new_delay + interval


def test_the_file_is_written_when_the_earliest_timers_change_not_on_every_batch():
    file = TextFile()
    deadlines = batches_registering(file, [[5_000], [5_000], [], [7_000]], delay=1_000, seconds_apart=SAVE_EVERY_S)
    assert file.writes == 2  # the first batch and the last: the others added nothing
    assert deadlines.due() == 6_001


def test_a_busy_stream_writes_at_most_every_interval_an_earlier_timer_at_once_and_the_rest_at_the_stop():
    file = TextFile()
    later = [[10_000 + i] for i in range(20)]  # a batch a second, each adding a later timer
    batches_registering(file, [[9_000], *later], delay=0, stop=False)
    assert file.writes == 1  # 20 s of batches: within SAVE_EVERY_S of the first write
    batches_registering(file := TextFile(), [[9_000], *later, [8_000]], delay=0, stop=False)
    assert file.writes == 2  # an earlier timer: written at once
    batches_registering(file := TextFile(), [[9_000], *later], delay=0)
    assert file.writes == 2 and file.text == '{"timers_ms": [9000, %s]}' % ", ".join(str(t) for [t] in later)


def test_an_unreadable_or_unwritable_file_is_a_warning_naming_it_and_leaves_the_quiet_ticks(caplog):
    caplog.set_level(logging.WARNING, "purger.streams.timers")
    truncated = TextFile('{"timers_ms": [1, 2')
    assert Deadlines(Accumulator(0, [], EarliestTimers()), 1_000, saved=truncated.saved()).due() is None

    def refused(text: str) -> None:
        raise OSError("Permission denied")

    accumulator = Accumulator(0, [], EarliestTimers())
    deadlines = Deadlines(accumulator, 1_000, saved=SavedTimers(lambda: None, refused, "/checkpoint/purger-clock"))
    accumulator.add([3_000])
    deadlines.collect()  # the batch goes on
    assert deadlines.due() == 4_001
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["/checkpoint/purger-clock not read",
                                                                        "/checkpoint/purger-clock not written"]
