"""When the clock ticks and at what time (``purger.streams.clock``): the time up to which every partition has been
read (the wall clock for one read to its latest offset, the Kafka timestamp of the records read for one behind),
a backlog of the topics it is told to ignore (the reconcile topic's) aside; ``caught_up`` once every source has read
up to its latest offsets. Plain Python: the query's last progress as Spark writes it (its JSON), and the clock's
pure part against a reference model of Kafka partitions and their timestamps."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from purger.config import with_policies
from purger.running import start_purger
from purger.streams.clock import caught_up, next_tick_ms, read_up_to_ms, remember, source_offsets
from simulation.mailbox import Platform
from tests.support.configs import own_config
from tests.support.waits import ago, wait_for

RECONCILE = frozenset({"purger.reconcile"})


def query(*sources: tuple[dict, dict | None]) -> SimpleNamespace:
    progress = {"sources": [{"endOffset": end, "latestOffset": latest} for end, latest in sources]}
    return SimpleNamespace(lastProgress=SimpleNamespace(json=json.dumps(progress)))


def test_every_source_read_to_its_latest_offsets_is_caught_up():
    assert caught_up(query(({"events": {"0": 5, "1": 7}}, {"events": {"0": 5, "1": 7}}),
                           ({"purger.control": {"0": 2}}, {"purger.control": {"0": 2}})))


def test_an_events_partition_behind_holds_the_clock_back_whatever_is_ignored():
    behind = query(({"events": {"0": 5, "1": 6}}, {"events": {"0": 5, "1": 7}}))
    assert not caught_up(behind) and not caught_up(behind, ignoring=RECONCILE)


def test_the_reconcile_topics_backlog_holds_it_back_only_when_not_ignored():
    # A source of its own, as new checkpoints read it, and within the events' source, as older ones do.
    apart = query(({"events": {"0": 5}}, {"events": {"0": 5}}),
                  ({"purger.reconcile": {"0": 100}}, {"purger.reconcile": {"0": 90_000}}))
    within = query(({"events": {"0": 5}, "purger.reconcile": {"0": 100}},
                    {"events": {"0": 5}, "purger.reconcile": {"0": 90_000}}))
    for backlog in (apart, within):
        assert not caught_up(backlog) and caught_up(backlog, ignoring=RECONCILE)


def test_no_progress_yet_or_no_latest_offsets_is_not_caught_up():
    assert not caught_up(SimpleNamespace(lastProgress=None))
    assert not caught_up(query())
    assert not caught_up(query(({"events": {"0": 5}}, None)))


NOW = 1_800_000_000_000
A0, A1, B0 = ("events", 0), ("events", 1), ("other.events", 0)


def test_the_offsets_of_every_partition_of_every_source_the_ignored_topics_aside():
    progress = query(({"events": {"0": 5, "1": 7}, "purger.reconcile": {"0": 1}},
                      {"events": {"0": 9, "1": 7, "2": 4}, "purger.reconcile": {"0": 8}}),
                     ({"purger.control": {"0": 2}}, {"purger.control": {"0": 2}})).lastProgress
    assert source_offsets(progress, RECONCILE) == {
        ("events", 0): (5, 9), ("events", 1): (7, 7), ("events", 2): (None, 4), ("purger.control", 0): (2, 2)}
    assert source_offsets(None) is None and source_offsets(query(({"events": {"0": 5}}, None)).lastProgress) is None


def test_the_clock_is_the_lagging_partitions_time_read():
    offsets = {A0: (500, 900), A1: (700, 700), B0: (40, 60)}
    assert read_up_to_ms(offsets, {A0: NOW - 3_600_000, B0: NOW - 60_000}, NOW) == NOW - 3_600_000


def test_partitions_read_to_their_end_are_read_up_to_the_wall_clock():
    offsets = {A0: (900, 900), A1: (700, 700), B0: (0, 0)}
    assert read_up_to_ms(offsets, {A0: NOW - 3_600_000}, NOW) == NOW
    assert next_tick_ms(offsets, {}, NOW, NOW - 1_000) == NOW


def test_a_partition_behind_with_no_record_read_yet_holds_the_clock():
    # Nothing read of B0 yet (a new partition, or a fresh checkpoint's first batch): no tick, as before.
    for b0 in ((None, 60), (0, 60)):
        assert read_up_to_ms({A0: (900, 900), B0: b0}, {A0: NOW - 1_000}, NOW) is None
        assert next_tick_ms({A0: (900, 900), B0: b0}, {A0: NOW - 1_000}, NOW, None) is None


def test_a_timestamp_ahead_of_the_wall_clock_ticks_no_further_than_it():
    assert read_up_to_ms({A0: (5, 9)}, {A0: NOW + 3_600_000}, NOW) == NOW


def test_the_clock_never_goes_back():
    offsets = {A0: (500, 900)}
    assert next_tick_ms(offsets, {A0: NOW - 5_000}, NOW, ticked_ms=NOW - 5_000) is None
    assert next_tick_ms(offsets, {A0: NOW - 9_000}, NOW, ticked_ms=NOW - 5_000) is None
    assert next_tick_ms(offsets, {A0: NOW - 4_000}, NOW, ticked_ms=NOW - 5_000) == NOW - 4_000


def test_a_partition_keeps_the_highest_timestamp_read():
    read = remember({A0: NOW - 5_000, A1: NOW - 7_000}, {A0: NOW - 9_000, B0: NOW - 1_000})
    assert read == {A0: NOW - 5_000, A1: NOW - 7_000, B0: NOW - 1_000}


# The reference model: each partition a log of Kafka timestamps; at each step the query has read a prefix of each
# (never shorter than before) of the records there are then (never fewer); some stamped ahead of the wall clock. A partition is read up to the wall clock
# once read to its end, else up to the highest timestamp read; the clock is the least of them.
partitions = st.lists(st.lists(st.integers(0, 40_000), min_size=1, max_size=8), min_size=1, max_size=4)


@st.composite
def histories(draw, increasing: bool) -> tuple[list[list[int]], list[tuple[int, list[tuple[int, int]]]]]:
    logs = draw(partitions)
    if increasing:
        logs = [sorted(log) for log in logs]
    steps, now = [], 0
    latest, end = [0] * len(logs), [0] * len(logs)
    for _ in range(draw(st.integers(1, 12))):
        now += draw(st.integers(0, 3_000))
        latest = [draw(st.integers(latest[i], len(log))) for i, log in enumerate(logs)]
        end = [draw(st.integers(end[i], latest[i])) for i in range(len(logs))]
        steps.append((now + 10_000, list(zip(end, latest))))
    return logs, steps


def reference_read_up_to(logs: list[list[int]], offsets: list[tuple[int, int]], now: int) -> int | None:
    times = [now if end == latest else (max(log[:end]) if end else None) for log, (end, latest) in zip(logs, offsets)]
    return None if None in times else min(now, *times)


def run_clock(logs: list[list[int]], steps: list) -> list[tuple[int | None, int | None, int]]:
    """(tick, reference, now) per step: the clock given, as the thin part looks them up, the timestamps of the
    last records read from the partitions behind whose read offset moved."""
    read_ms: dict = {}
    looked_up: dict = {}
    ticked = None
    out = []
    for now, offsets in steps:
        by_partition = {("events", i): offset for i, offset in enumerate(offsets)}
        last_read = {p: logs[p[1]][end - 1] for p, (end, latest) in by_partition.items()
                     if 0 < end < latest and looked_up.get(p) != end}
        looked_up.update({p: by_partition[p][0] for p in last_read})
        read_ms = remember(read_ms, last_read)
        at = next_tick_ms(by_partition, read_ms, now, ticked)
        ticked = at if at is not None else ticked
        out.append((at, reference_read_up_to(logs, offsets, now), now))
    return out


@given(histories(increasing=False))
@settings(max_examples=150, deadline=None)
def test_the_clock_moves_forward_never_ahead_of_what_was_read_nor_of_the_wall_clock(history):
    ticks = [at for at, _, _ in run_clock(*history) if at is not None]
    assert ticks == sorted(set(ticks))
    for at, reference, now in run_clock(*history):
        if at is not None:
            assert reference is not None and at <= reference and at <= now


@given(histories(increasing=True))
@settings(max_examples=150, deadline=None)
def test_with_timestamps_increasing_per_partition_the_clock_is_the_time_read(history):
    ticked = None
    for at, reference, _ in run_clock(*history):
        expected = reference if reference is not None and (ticked is None or reference > ticked) else None
        assert at == expected
        ticked = at if at is not None else ticked


def test_a_purger_started_on_a_backlog_purges_what_is_due_at_its_head_before_reading_its_tail(spark, config, tmp_path):
    """SPEC 10.1, on the real servers: 20 messages due for weeks at the head of the events topic, 3,000 recent
    events behind them, read 150 records a batch (``kafka.max_offsets_per_trigger``). The clock ticks at the
    Kafka time read so far, so the head's rows go while the query is still behind the latest offsets (a clock
    that waited for the backlog's end would hold them until the twentieth batch)."""
    bound = 150
    own = own_config(config, tmp_path, "clock-backlog")
    own = own.model_copy(update={"kafka": own.kafka.model_copy(update={"max_offsets_per_trigger": bound})})
    topic = own.kafka.topics[0]
    platform, recent = Platform(own), Platform(own, events_only=True)
    head = [f"head-{uuid.uuid4().hex[:8]}-{i}" for i in range(20)]
    weeks_ago = ago(timedelta(weeks=3))
    for m in head:
        platform.enqueue(m, f"p-{m}", size=16, at=weeks_ago)  # inline: no blob
        platform.dequeue(m, 0, at=weeks_ago)  # due in expired_ttl (6 s) since: weeks ago
    platform.flush()
    for i in range(3_000):
        recent.enqueue(f"recent-{i}", f"p-recent-{i}", size=16)  # never due: its counter stays at 1
    recent.flush()
    started = time.monotonic()
    running = start_purger(spark, own, starting_offsets="earliest")
    try:
        wait_for(lambda: all(platform.row(m) is None for m in head), 180, "the head's due messages purged")
        read, latest = read_of(running.query, topic)
        assert read < latest, f"the events were read to their end ({read} of {latest}) before the purge: no backlog"
        print(f"head purged in {time.monotonic() - started:.1f} s, {read} of {latest} events read")
    finally:
        running.stop()
        platform.close()
        recent.close()


def read_of(query, topic: str) -> tuple[int, int]:
    """How many records of ``topic`` the query's last batch had read, and how many there were."""
    offsets = source_offsets(query.lastProgress) or {}
    read = [(end or 0, latest) for (t, _), (end, latest) in offsets.items() if t == topic]
    return sum(end for end, _ in read), sum(latest for _, latest in read)


def inline_message_at_zero(platform: Platform, prefix: str) -> tuple[str, datetime]:
    """A message without a blob whose count reached zero now, its events sent; and when."""
    from tests.support.waits import now

    m = f"{prefix}-{uuid.uuid4().hex[:8]}"
    platform.enqueue(m, f"p-{m}", size=16)
    zero_at = now()
    platform.dequeue(m, 0, at=zero_at)
    platform.flush()
    return m, zero_at


def test_a_quiet_purger_ticks_when_the_timer_it_registered_comes_due_not_at_its_quiet_interval(spark, config,
                                                                                                tmp_path):
    """SPEC 10: with ``stream.quiet_clock_interval`` at ten minutes, a message that comes due on a quiet stream is
    purged within seconds of its deadline: the timer the stateful stage registered reached the clock (through the
    accumulator and the sink), which ticked for it. Oracle: the row gone from Cassandra, and the time it took."""
    from tests.support.waits import now

    own = own_config(config, tmp_path, "clock-quiet", quiet_clock_interval=timedelta(minutes=10))
    platform = Platform(own)
    running = start_purger(spark, own)
    try:
        m, zero_at = inline_message_at_zero(platform, "quiet")
        ttl = own.policy_set.policy_of("message").settings.expired_ttl
        wait_for(lambda: platform.row(m) is None, 120, "the message due on a quiet stream")
        lag_s = (now() - zero_at - ttl).total_seconds()
        print(f"purged {lag_s:.1f} s after its deadline")
        assert lag_s < 60, "purged at a quiet tick, not at its timer"
    finally:
        running.stop()
        platform.close()


def saved_timers(path: Path) -> list[int] | None:
    """The timers saved in the clock's file; None before it is written, or while it is (a write replaces the
    file's content in place: a reader may meet it empty)."""
    try:
        return json.loads(path.read_text())["timers_ms"]
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def test_a_restarted_quiet_purger_ticks_for_the_timer_its_state_held_not_at_its_quiet_interval(spark, config,
                                                                                              tmp_path):
    """SPEC 10: the timer a run registered is in the state the next start continues from, and that start's clock
    knows it (the file ``purger-clock`` beside the checkpoint): with ``stream.quiet_clock_interval`` at ten
    minutes, a message read before a stop and due after the restart is purged within seconds of its deadline.
    Oracle: the row gone from Cassandra, and the time it took."""
    from purger.streams.timers import CLOCK_FILE
    from tests.support.waits import now

    mailbox = {**config.policies.get("mailbox", {}), "expired_ttl": "25s"}
    own = own_config(with_policies(config, {**config.policies, "mailbox": mailbox}), tmp_path, "clock-restart",
                     quiet_clock_interval=timedelta(minutes=10))
    platform = Platform(own)
    saved = tmp_path / "checkpoint" / CLOCK_FILE
    try:
        m, zero_at = inline_message_at_zero(platform, "restart")
        running = start_purger(spark, own)
        try:
            wait_for(lambda: saved_timers(saved), 60, "the message's timer saved beside the checkpoint")
        finally:
            running.stop()
        assert platform.row(m) is not None, "due only after the restart"
        again = start_purger(spark, own)
        try:
            deadline = zero_at + own.policy_set.policy_of("message").settings.expired_ttl
            assert now() < deadline, "the restart took longer than the message's ttl: no timer left to carry"
            wait_for(lambda: platform.row(m) is None, 120, "the message due after the restart")
            lag_s = (now() - deadline).total_seconds()
            print(f"purged {lag_s:.1f} s after its deadline")
            assert lag_s < 60, "purged at a quiet tick, not at the timer the state held"
        finally:
            again.stop()
    finally:
        platform.close()
