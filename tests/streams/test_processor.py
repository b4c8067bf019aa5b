"""The stateful stage's processor (``streams.processor.PurgeProcessor``) in-process: no query, no JVM.

PySpark 4.1.4 has no helper to run a ``StatefulProcessor`` without a query: its ``StatefulProcessorHandle``,
value states and timers all go through ``StatefulProcessorApiClient``, a socket to the JVM's state server of
a running ``transformWithState`` (Spark's ``TwsTester`` came after 4.1). So the processor runs here on
``MemoryHandle``: value states per grouping key, stored as the API client stores them (the row checked
against the state's schema, converted with ``schema.toInternal`` and pickled; read back as a tuple), and
event-time timers that ``Harness.advance`` fires, earliest first, once the watermark has reached them
(Spark drops a timer as it fires it). The routing to keys and the watermark are Spark's, and the
integration tests' (``test_purge_stream``).
"""

from __future__ import annotations

import json
import random
from dataclasses import fields, replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.serializers import CPickleSerializer
from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues
from pyspark.sql.types import StructType, _make_type_verifier

from purger.config import build_config
from purger.core.schedule import Schedule
from purger.core.vocabulary import CLOCK, DEAD_LETTER, FORGOTTEN
from purger.policies.mailbox.state import Event
from purger.streams.control import RECHECK
from purger.streams.processor import OUTPUT_SCHEMA, PurgeProcessor, stored_kinds

DELETED_TTL_MS = 1_000
LINGER_MS = 2_000
FORGET_AFTER_MS = 100_000
POLICIES = build_config({"policies": {"mailbox": {"deleted_ttl": "1s", "expired_ttl": "10s"}}}).policy_set
MESSAGE = ("message", "m1")
# Every column a routed row carries for the processor (``streams.processor.routed``).
EVENT_COLUMNS = sorted({f.name for kind in POLICIES.kinds for f in fields(kind.event_class)} | {"rule"})
OTHER_COLUMNS = ("error", "topic", "partition", "offset", "key", "value", "watermark_time")


class MemoryValueState:
    """A value state of the current grouping key, kept as ``ValueStateClient`` sends it to the state server."""

    def __init__(self, handle: "MemoryHandle", name: str, schema: StructType) -> None:
        self.handle, self.name, self.schema = handle, name, schema
        self.verify = _make_type_verifier(schema)
        self.pickle = CPickleSerializer()

    def get(self) -> tuple | None:
        stored = self.handle.values.get((self.handle.key, self.name))
        return None if stored is None else tuple(self.pickle.loads(stored))

    def update(self, value: tuple) -> None:
        row = Row(**dict(zip(self.schema.fieldNames(), value, strict=True)))
        self.verify(row)  # a value the state server would refuse, refused here
        self.handle.values[(self.handle.key, self.name)] = self.pickle.dumps(self.schema.toInternal(row))

    def clear(self) -> None:
        self.handle.values.pop((self.handle.key, self.name), None)


class MemoryHandle:
    """What ``PurgeProcessor`` uses of a ``StatefulProcessorHandle``: value states and event-time timers, each
    of the grouping key being processed (``key``)."""

    def __init__(self) -> None:
        self.key: tuple[str, str] | None = None
        self.values: dict[tuple[Any, str], bytes] = {}
        self.timers: dict[tuple[str, str], set[int]] = {}

    def getValueState(self, name: str, schema: StructType, ttlDurationMs: int | None = None) -> MemoryValueState:
        assert self.key is None, "value states are made in init(), before any key"
        return MemoryValueState(self, name, schema)

    def registerTimer(self, expiry_ms: int) -> None:
        self.timers.setdefault(self.key, set()).add(expiry_ms)

    def deleteTimer(self, expiry_ms: int) -> None:
        assert expiry_ms in self.timers.get(self.key, ()), f"{self.key}: no timer at {expiry_ms} to delete"
        self.timers[self.key].discard(expiry_ms)


class Harness:
    """A ``PurgeProcessor`` on a ``MemoryHandle``: ``feed`` a key's rows of a batch, ``advance`` the watermark."""

    def __init__(self) -> None:
        self.handle = MemoryHandle()
        self.processor = PurgeProcessor(POLICIES, linger_ms=LINGER_MS, forget_after_ms=FORGET_AFTER_MS)
        self.processor.init(self.handle)
        self.kinds = stored_kinds(POLICIES)

    def feed(self, key: tuple[str, str], rows: list[Row], watermark_ms: int = 0) -> list[Row]:
        self.handle.key = key
        try:
            return list(self.processor.handleInputRows(key, iter(rows), TimerValues(-1, watermark_ms)))
        finally:
            self.handle.key = None

    def advance(self, watermark_ms: int) -> list[Row]:
        """Fire every timer at or before ``watermark_ms``: per key, earliest first, each dropped as it fires."""
        out = []
        for key in sorted(self.handle.timers):
            for expiry in sorted(t for t in self.handle.timers[key] if t <= watermark_ms):
                self.handle.timers[key].discard(expiry)
                self.handle.key = key
                try:
                    out += self.processor.handleExpiredTimer(key, TimerValues(-1, watermark_ms),
                                                             ExpiredTimerInfo(expiry))
                finally:
                    self.handle.key = None
        return out

    def timers(self, key: tuple[str, str]) -> set[int]:
        return self.handle.timers.get(key, set())

    def stored(self, key: tuple[str, str]) -> tuple[Any, Schedule] | None:
        kind = key[0]
        self.handle.key = key
        try:
            row = self.processor.values[kind].get()
        finally:
            self.handle.key = None
        return None if row is None else self.kinds[kind].from_row(row)


def routed(event: Event | None = None, **columns: Any) -> Row:
    """A row as ``routed`` gives it to the processor: an event's fields, or ``columns`` (a recheck, a bad
    record), every other column null."""
    values = dict.fromkeys(EVENT_COLUMNS + list(OTHER_COLUMNS))
    if event is not None:
        values.update({f.name: list(v) if isinstance(v := getattr(event, f.name), tuple) else v
                       for f in fields(event)})
    values.update(columns)
    return Row(**values)


def enqueue(t: int, event_id: str = "enq", **fields: Any) -> Event:
    defaults = dict(mailbox="inbox", payload_id="p1", payload_size=10, inline=False, extract_count=1,
                    complete=True, dcs=("dc1", "dc2"))
    return Event(event_id, "enqueue", t, "m1", **{**defaults, **fields})


def delete(t: int, event_id: str = "del") -> Event:
    return Event(event_id, "delete", t, "m1")


def recheck(rule: str, at_ms: int) -> Row:
    return routed(type=RECHECK, event_id=f"recheck-{at_ms}", event_time_ms=at_ms, rule=rule, message_id="m1")


def candidates(rows: list[Row]) -> list[tuple]:
    return [(r.kind, r.id, r.rule, r.eligible_at_ms) for r in rows]


# --- the fold and the timer --------------------------------------------------------------------------


def test_batches_fold_into_the_kinds_state_whatever_the_order_and_duplicates():
    events = [enqueue(100), Event("cnt", "dequeue", 200, "m1", extract_count=1), delete(300)]
    expected = POLICIES.policy_of("message").kinds[0].fold(None, events)
    for seed in range(5):
        arriving = events + random.Random(seed).sample(events, 2)
        random.Random(seed).shuffle(arriving)
        harness = Harness()
        for batch in (arriving[:2], arriving[2:]):
            assert harness.feed(MESSAGE, [routed(e) for e in batch]) == []
        state, schedule = harness.stored(MESSAGE)
        assert state == expected and state.dcs == ("dc1", "dc2")  # arrays come back as the state's tuples
        assert schedule == Schedule(timer_ms=300 + DELETED_TTL_MS)
        assert harness.timers(MESSAGE) == {300 + DELETED_TTL_MS}


def test_a_changed_deadline_moves_the_one_timer():
    harness = Harness()
    harness.feed(MESSAGE, [routed(enqueue(100, extract_count=None, extract_until_ms=50_000))])
    assert harness.timers(MESSAGE) == {50_000 + 10_000}  # expired_by_date: the date, then expired_ttl
    harness.feed(MESSAGE, [routed(delete(300))])
    assert harness.timers(MESSAGE) == {300 + DELETED_TTL_MS}  # the earlier rule's; the other one deleted
    assert harness.stored(MESSAGE)[1].timer_ms == 300 + DELETED_TTL_MS


def test_an_object_with_nothing_due_is_forgotten_forget_after_its_last_event_and_counted():
    harness = Harness()
    assert harness.feed(MESSAGE, [routed(enqueue(100))], watermark_ms=1_000) == []  # live: nothing due
    assert harness.timers(MESSAGE) == {1_000 + FORGET_AFTER_MS}
    # Each event puts it off; the one timer moves.
    assert harness.feed(MESSAGE, [routed(Event("cnt", "dequeue", 200, "m1", extract_count=2))], watermark_ms=5_000) == []
    assert harness.timers(MESSAGE) == {5_000 + FORGET_AFTER_MS}
    assert harness.advance(5_000 + FORGET_AFTER_MS - 1) == []
    [forgotten] = harness.advance(5_000 + FORGET_AFTER_MS)
    assert (forgotten.kind, forgotten.id, forgotten.rule, forgotten.eligible_at_ms) == ("message", "m1", FORGOTTEN, None)
    assert harness.stored(MESSAGE) is None and harness.timers(MESSAGE) == set()
    # A later event finds no state: the object is rebuilt from it, and what it makes due is a candidate as ever.
    out = harness.feed(MESSAGE, [routed(delete(300))], watermark_ms=6_000 + FORGET_AFTER_MS)
    assert candidates(out) == [("message", "m1", "deleted", 300 + DELETED_TTL_MS)]


FAR_MS = 10**12  # a date no watermark here reaches


@given(st.lists(st.tuples(st.integers(0, 3 * FORGET_AFTER_MS), st.integers(0, 3 * FORGET_AFTER_MS), st.booleans()),
                min_size=1, max_size=8))
@settings(max_examples=300, deadline=None)
def test_a_live_object_is_forgotten_at_the_first_advance_forget_after_its_last_event(steps):
    """Against a reference: however a live object's events and the watermark's advances interleave, and whether
    an event gives it a deadline far ahead (an extract-until date) or takes it away, it is forgotten and counted
    at the first advance of the watermark to ``forget_after`` past the watermark of the last event that left it
    with nothing due, never before, and kept with one timer until then."""
    harness = Harness()
    watermark = 0
    for number, (gap, advance, far) in enumerate(steps):
        watermark += gap
        until = Event(f"e{number}", "extract_until", watermark + number + 1, "m1",
                      extract_until_ms=FAR_MS if far else None)
        harness.feed(MESSAGE, [routed(enqueue(0)), routed(until)], watermark_ms=watermark)
        forget_at = None if far else watermark + FORGET_AFTER_MS
        watermark += advance
        out = harness.advance(watermark)
        forgotten = forget_at is not None and watermark >= forget_at
        assert [(r.kind, r.id, r.rule) for r in out] == ([("message", "m1", FORGOTTEN)] if forgotten else [])
        assert (harness.stored(MESSAGE) is None) == forgotten
        assert len(harness.timers(MESSAGE)) == (0 if forgotten else 1)


def test_an_object_that_was_a_candidate_is_forgotten_after_its_linger_uncounted():
    harness = Harness()
    harness.feed(MESSAGE, [routed(enqueue(100)), routed(delete(300))])
    assert candidates(harness.advance(300 + DELETED_TTL_MS)) == [("message", "m1", "deleted", 300 + DELETED_TTL_MS)]
    # Revived meanwhile (nothing due any more): its linger still runs from its firing, not forget_after.
    harness.feed(MESSAGE, [routed(enqueue(400, event_id="again"))], watermark_ms=300 + DELETED_TTL_MS + 1)
    assert harness.timers(MESSAGE) == {300 + DELETED_TTL_MS + LINGER_MS}
    assert harness.advance(300 + DELETED_TTL_MS + LINGER_MS) == []
    assert harness.stored(MESSAGE) is None


# --- expiry: the candidate, the linger, forgetting ---------------------------------------------------


def test_the_timer_emits_the_candidate_once_then_the_state_lingers_and_is_cleared():
    harness = Harness()
    harness.feed(MESSAGE, [routed(enqueue(100)), routed(delete(300))])
    due = 300 + DELETED_TTL_MS
    assert harness.advance(due - 1) == []
    out = harness.advance(due + 500)
    assert candidates(out) == [("message", "m1", "deleted", due)]
    [row] = out
    assert list(row.asDict()) == OUTPUT_SCHEMA.fieldNames()
    assert json.loads(row.hint) == {"payload_id": "p1", "inline": False, "dcs": ["dc1", "dc2"]}
    assert (row.reason, row.key, row.value, row.topic, row.partition, row.offset) == (None,) * 6
    # Kept for the linger, with its one timer at the linger's end, so late events and the sink's answer find it.
    _, schedule = harness.stored(MESSAGE)
    assert (schedule.fired_rule, schedule.fired_at_ms) == ("deleted", due)
    assert harness.timers(MESSAGE) == {due + 500 + LINGER_MS} == {schedule.linger_until_ms}
    # A late copy of its events changes nothing and emits nothing again.
    assert harness.feed(MESSAGE, [routed(delete(300))], watermark_ms=due + 600) == []
    assert harness.advance(due + 500 + LINGER_MS) == []
    assert harness.stored(MESSAGE) is None and harness.timers(MESSAGE) == set()


def test_an_object_already_due_when_its_events_arrive_is_emitted_at_once():
    harness = Harness()
    out = harness.feed(MESSAGE, [routed(enqueue(100)), routed(delete(300))], watermark_ms=5_000)
    assert candidates(out) == [("message", "m1", "deleted", 300 + DELETED_TTL_MS)]
    assert harness.timers(MESSAGE) == {5_000 + LINGER_MS}  # the linger's only: no timer left behind for the due time


def test_a_recheck_of_a_live_object_fires_with_the_rows_rule_and_the_earlier_of_two_stands():
    harness = Harness()
    harness.feed(MESSAGE, [routed(enqueue(100))])  # live by its events
    harness.feed(MESSAGE, [recheck("expired_by_date", 9_000), recheck("expired_by_counter", 7_000)])
    assert harness.timers(MESSAGE) == {7_000}
    assert candidates(harness.advance(7_500)) == [("message", "m1", "expired_by_counter", 7_000)]
    _, schedule = harness.stored(MESSAGE)
    assert schedule.recheck_at_ms is None and harness.timers(MESSAGE) == {7_500 + LINGER_MS}
    # Fired, so forgotten once its linger is over, like any fired object (``core.schedule``).
    assert harness.advance(7_500 + LINGER_MS) == []
    assert harness.stored(MESSAGE) is None and harness.timers(MESSAGE) == set()


def test_a_timer_of_an_object_whose_state_is_gone_emits_nothing():
    harness = Harness()
    harness.handle.timers[MESSAGE] = {1_000}
    assert harness.advance(2_000) == []


def test_a_payload_keeps_its_data_centres_through_the_store():
    harness = Harness()
    payload = ("payload", "p1")
    harness.feed(payload, [routed(replace(enqueue(100), type="link", message_id="m1"))])
    state, _ = harness.stored(payload)
    assert state.dcs == ("dc1", "dc2") and state.linked_at_ms == 100


# --- what the processor passes through or ignores ----------------------------------------------------


def bad_records(*offsets: int) -> list[Row]:
    """Bad records of partition 0 of ``mailbox.events``, as ``routed`` gives them (keyed by their partition)."""
    return [routed(type=None, error="value is not a JSON object", key=b"k", value=b"[1]", topic="mailbox.events",
                   partition=0, offset=offset) for offset in offsets]


def test_bad_records_pass_through_as_dead_letters_with_no_state():
    harness = Harness()
    out = harness.feed((DEAD_LETTER, "mailbox.events/0"), bad_records(7, 8))
    assert [(r.kind, r.id, r.reason, r.key, r.value, r.topic, r.partition, r.offset) for r in out] == [
        (DEAD_LETTER, f"mailbox.events/0/{o}", "value is not a JSON object", b"k", b"[1]", "mailbox.events", 0, o)
        for o in (7, 8)]
    assert all(r.rule is None and r.hint is None for r in out)
    assert harness.handle.values == {} and harness.handle.timers == {}


def test_each_bad_record_is_a_dead_letter_of_its_own_the_same_at_every_retry():
    """A dead letter's id is its ledger record's (``sinks.ledger``): one per bad record, so that a batch's merge into
    the ledger keeps each, and the same when the batch runs again, so that it keeps each once."""
    first = [r.id for r in Harness().feed((DEAD_LETTER, "mailbox.events/0"), bad_records(7, 8, 9))]
    retried = [r.id for r in Harness().feed((DEAD_LETTER, "mailbox.events/0"), bad_records(9, 7, 8))]
    assert len(set(first)) == 3 and sorted(retried) == sorted(first)


def test_clock_ticks_only_move_the_watermark():
    harness = Harness()
    assert harness.feed((CLOCK, "clock"), [routed(type=CLOCK, event_id="tick", event_time_ms=1_000)]) == []
    assert harness.handle.values == {} and harness.handle.timers == {}
