"""The state machines, the rules and the schedule, as plain Python."""

import itertools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from purger.policies.mailbox.rules import (
    DELETED,
    EXPIRED_BY_COUNTER,
    EXPIRED_BY_DATE,
    INCOMPLETE,
    PAYLOAD,
    Eligibility,
    Retention,
    eligibility,
    payload_eligibility,
)
from purger.core.schedule import Schedule, due, next_timer, on_events, on_timer, recheck
from purger.policies.mailbox.state import (
    LINK,
    RELEASED,
    Event,
    MessageState,
    PayloadState,
    apply,
    apply_all,
    apply_all_payload,
)

RETENTION = Retention(expired_ttl_ms=1_000, incomplete_ttl_ms=2_000, deleted_ttl_ms=300, payload_grace_ms=500)


def enqueue(t, count=1, until=None, complete=True, event_id=None):
    return Event(event_id or f"enq-{t}", "enqueue", t, "m", mailbox="inbox", payload_id="p", payload_size=5,
                 inline=False, extract_count=count, extract_until_ms=until, complete=complete, dcs=("dc2", "dc1"))


def event(kind, t, event_id=None, **fields):
    return Event(event_id or f"{kind}-{t}", kind, t, "m", **fields)


def dequeue(t, count, event_id=None):
    return event("dequeue", t, event_id, extract_count=count)


def admin(t, count, event_id=None):
    return event("extract_counter", t, event_id, extract_count=count)


def until(t, date):
    return event("extract_until", t, extract_until_ms=date)


# One row per rule of docs/reference.md, Rules: the events, then the expected eligibility (None: kept).
RULE_TABLE = {
    "counter reaches 0": ([enqueue(10), dequeue(50, 0)], Eligibility(EXPIRED_BY_COUNTER, 50 + 1_000)),
    "counter revived": ([enqueue(10), dequeue(50, 0), admin(60, 1)], None),
    "counter expires again": ([enqueue(10), dequeue(50, 0), admin(60, 1), admin(70, 0)],
                              Eligibility(EXPIRED_BY_COUNTER, 70 + 1_000)),
    "not counter-based": ([enqueue(10, count=None)], None),
    "date from the enqueue": ([enqueue(10, until=5_000)], Eligibility(EXPIRED_BY_DATE, 5_000 + 1_000)),
    "date far in the future": ([enqueue(10, until=10**13)], Eligibility(EXPIRED_BY_DATE, 10**13 + 1_000)),
    "date moved": ([enqueue(10, until=5_000), until(20, 9_000)], Eligibility(EXPIRED_BY_DATE, 9_000 + 1_000)),
    "date cleared": ([enqueue(10, until=5_000), until(20, None)], None),
    "incomplete upload": ([enqueue(10, complete=False)], Eligibility(INCOMPLETE, 10 + 2_000)),
    "upload completed": ([enqueue(10, complete=False), event("upload_complete", 30)], None),
    "completed before its enqueue arrives": ([event("upload_complete", 30), enqueue(10, complete=False)], None),
    "deleted": ([enqueue(10), event("delete", 40)], Eligibility(DELETED, 40 + 300)),
    "deleted, known only by its delete": ([event("delete", 40)], Eligibility(DELETED, 40 + 300)),
    "earliest rule wins": ([enqueue(10, until=5_000), dequeue(20, 0)], Eligibility(EXPIRED_BY_COUNTER, 20 + 1_000)),
    "live": ([enqueue(10), dequeue(20, 1)], None),
}


@pytest.mark.parametrize("case", RULE_TABLE)
def test_rule_table(case):
    events, expected = RULE_TABLE[case]
    assert eligibility(apply_all(None, events), RETENTION) == expected


@pytest.mark.parametrize("case", RULE_TABLE)
def test_rule_table_with_duplicates_in_every_order(case):
    events, expected = RULE_TABLE[case]
    for order in itertools.permutations(events + events[-1:]):
        assert eligibility(apply_all(None, list(order)), RETENTION) == expected


def test_the_enqueue_records_the_payload():
    state = apply(None, enqueue(10))
    assert (state.payload_id, state.dcs, state.extract_count, state.created_at_ms) == ("p", ("dc1", "dc2"), 1, 10)


def test_the_counter_period_runs_from_its_last_setting_as_the_rows_updated_at_does():
    state = apply_all(None, [enqueue(10), dequeue(50, 0), admin(80, 0)])
    assert state.counter_zero_since == 80


def test_at_equal_times_the_value_nearer_to_purging_wins_whatever_the_arrival_order():
    for first, second in itertools.permutations([dequeue(50, 1, "b"), dequeue(50, 0, "a")]):
        assert apply(apply(None, first), second).extract_count == 0
    for first, second in itertools.permutations([until(50, 9_000), until(50, 3_000)]):
        assert apply(apply(None, first), second).extract_until_ms == 3_000


def test_nothing_known_is_not_eligible():
    assert eligibility(None, RETENTION) is None
    assert eligibility(MessageState(), RETENTION) is None


# --- payloads ---------------------------------------------------------------------------------

def link(t, message="m"):
    return Event(f"link-{message}-{t}", LINK, t, message, payload_id="p", dcs=("dc1",))


def released(t, message="m"):
    return Event(f"rel-{message}-{t}", RELEASED, t, message, payload_id="p", dcs=("dc2",))


def test_a_payload_is_eligible_a_grace_after_its_last_reference_went():
    state = apply_all_payload(None, [link(10), released(100)])
    assert payload_eligibility(state, RETENTION) == Eligibility(PAYLOAD, 100 + 500)
    assert state.dcs == ("dc1", "dc2")


def test_a_payload_linked_again_after_its_release_is_kept():
    for order in itertools.permutations([link(10), released(100), link(150, "m2")]):
        assert payload_eligibility(apply_all_payload(None, list(order)), RETENTION) is None


def test_a_payload_released_again_runs_its_grace_from_the_last_release():
    state = apply_all_payload(None, [link(10), released(100), link(150, "m2"), released(400, "m2")])
    assert payload_eligibility(state, RETENTION) == Eligibility(PAYLOAD, 900)


def test_a_linked_payload_is_not_eligible():
    assert payload_eligibility(apply_all_payload(None, [link(10)]), RETENTION) is None
    assert payload_eligibility(PayloadState(), RETENTION) is None


# --- the schedule -----------------------------------------------------------------------------

DUE = Eligibility(DELETED, 1_000)


def test_an_object_fires_once_its_due_time_is_behind_the_watermark():
    schedule = Schedule()
    assert next_timer(schedule, DUE) == 1_000
    assert on_timer(schedule, DUE, watermark_ms=900, linger_ms=100) == (None, schedule)
    emitted, kept = on_timer(schedule, DUE, watermark_ms=1_200, linger_ms=100)
    assert emitted == DUE and kept.linger_until_ms == 1_300
    # Fired: the same eligibility is not emitted again; the object is forgotten after its linger.
    assert due(kept, DUE) is None and next_timer(kept, DUE) == 1_300
    assert on_timer(kept, DUE, watermark_ms=1_300, linger_ms=100) == (None, None)


def test_a_changed_eligibility_fires_again():
    _, kept = on_timer(Schedule(), DUE, watermark_ms=1_200, linger_ms=100)
    later = Eligibility(EXPIRED_BY_COUNTER, 5_000)
    assert next_timer(kept, later) == 5_000


def test_a_recheck_fires_with_the_rows_rule_even_when_the_stream_sees_none():
    _, kept = on_timer(Schedule(), DUE, watermark_ms=1_200, linger_ms=100)
    kept = recheck(kept, EXPIRED_BY_DATE, 4_000)
    assert next_timer(kept, DUE) == 4_000 and next_timer(kept, None) == 4_000
    emitted, kept = on_timer(kept, None, watermark_ms=4_100, linger_ms=100)
    assert emitted == Eligibility(EXPIRED_BY_DATE, 4_000) and kept.recheck_at_ms is None


def test_of_two_rechecks_the_earlier_stands():
    schedule = recheck(recheck(Schedule(), EXPIRED_BY_DATE, 4_000), EXPIRED_BY_COUNTER, 3_000)
    assert (schedule.recheck_rule, schedule.recheck_at_ms) == (EXPIRED_BY_COUNTER, 3_000)
    assert recheck(schedule, EXPIRED_BY_DATE, 9_000) == schedule


def test_a_live_object_is_never_forgotten():
    assert on_timer(Schedule(), None, watermark_ms=10**12, linger_ms=100) == (None, Schedule())


# --- property: the state machine against a reference model ---------------------------------

NO_LIMIT = 2**62


def reference_eligibility(events: list[Event]) -> Eligibility | None:
    """The rules (docs/reference.md) computed from the whole set of events at once, not folded one by one."""
    unique = {e.event_id: e for e in events}.values()
    enqueues = [e for e in unique if e.type == "enqueue"]

    def latest(candidates, value):
        # Last writer by event time; at equal times the value nearer to purging; then the event id.
        best = max(candidates, default=None,
                   key=lambda e: (e.event_time_ms, -(NO_LIMIT if value(e) is None else value(e)), e.event_id))
        return best

    counter = latest([e for e in unique if e.type in ("enqueue", "dequeue", "extract_counter")],
                     lambda e: e.extract_count)
    dated = latest([e for e in unique if e.type in ("enqueue", "extract_until")], lambda e: e.extract_until_ms)
    deletes = [e.event_time_ms for e in unique if e.type == "delete"]
    completed = any(e.type == "upload_complete" for e in unique)
    found = []
    if counter is not None and counter.extract_count == 0:
        found.append(Eligibility(EXPIRED_BY_COUNTER, counter.event_time_ms + RETENTION.expired_ttl_ms))
    if dated is not None and dated.extract_until_ms is not None:
        found.append(Eligibility(EXPIRED_BY_DATE, dated.extract_until_ms + RETENTION.expired_ttl_ms))
    if enqueues and not completed and enqueues[0].complete is False:
        found.append(Eligibility(INCOMPLETE, min(e.event_time_ms for e in enqueues) + RETENTION.incomplete_ttl_ms))
    if deletes:
        found.append(Eligibility(DELETED, min(deletes) + RETENTION.deleted_ttl_ms))
    return min(found, key=lambda e: (e.eligible_at_ms, e.rule), default=None)


times = st.integers(0, 20)
lifecycle_event = st.one_of(
    st.builds(lambda t, c: dequeue(t, c), times, st.integers(0, 3)),
    st.builds(lambda t, c: admin(t, c), times, st.integers(0, 3)),
    st.builds(lambda t, d: until(t, d), times, st.one_of(st.none(), st.integers(0, 30))),
    st.builds(lambda t: event("upload_complete", t), times),
    st.builds(lambda t: event("delete", t), times),
)


@settings(max_examples=300, deadline=None)
@given(
    st.booleans(), st.one_of(st.none(), st.integers(0, 3)), st.one_of(st.none(), st.integers(0, 30)),
    st.lists(lifecycle_event, max_size=8), st.randoms(),
)
def test_the_state_machine_matches_the_reference_model_under_duplicates_and_reordering(
    complete, count, date, changes, random
):
    # Event ids are unique; a duplicate is the same event again.
    events = [enqueue(0, count=count, until=date, complete=complete)] + [
        replace(e, event_id=f"e{i}") for i, e in enumerate(changes)
    ]
    arrivals = events + random.sample(events, k=len(events) // 2)  # duplicates
    random.shuffle(arrivals)
    state = None
    for e in arrivals:
        state = apply(state, e)
    assert eligibility(state, RETENTION) == reference_eligibility(events)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 50), st.sampled_from("abc")), max_size=8), st.randoms())
def test_the_payload_state_matches_the_reference_model(changes, random):
    events = [(link if is_link else released)(t, m) for is_link, t, m in changes]
    arrivals = events + random.sample(events, k=len(events) // 2)
    random.shuffle(arrivals)
    links = [e.event_time_ms for e in events if e.type == LINK]
    releases = [e.event_time_ms for e in events if e.type == RELEASED]
    expected = None
    if releases and (not links or max(releases) >= max(links)):
        expected = Eligibility(PAYLOAD, max(releases) + RETENTION.payload_grace_ms)
    assert payload_eligibility(apply_all_payload(None, arrivals), RETENTION) == expected


def test_an_object_never_emitted_with_nothing_due_is_kept_forget_after_past_its_last_event():
    nothing_due = on_events(Schedule(), None, watermark_ms=1_000, forget_after_ms=500)
    assert nothing_due.linger_until_ms == 1_500 and next_timer(nothing_due, None) == 1_500
    assert on_timer(nothing_due, None, watermark_ms=1_499, linger_ms=100) == (None, nothing_due)
    assert on_timer(nothing_due, None, watermark_ms=1_500, linger_ms=100) == (None, None)
    # Something due again: the forgetting is off, the due time is its timer.
    assert on_events(nothing_due, DUE, watermark_ms=1_200, forget_after_ms=500).linger_until_ms is None
    # Once emitted (own eligibility or a recheck), its linger runs from that, whatever its events.
    _, fired = on_timer(Schedule(), DUE, watermark_ms=1_200, linger_ms=100)
    assert not fired.never_fired and on_events(fired, None, 1_250, 500) == fired
    _, rechecked = on_timer(recheck(Schedule(), EXPIRED_BY_COUNTER, 1_100), None, watermark_ms=1_200, linger_ms=100)
    assert not rechecked.never_fired and on_events(rechecked, None, 1_250, 500) == rechecked
