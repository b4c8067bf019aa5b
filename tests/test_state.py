"""The state machine and the rules, as plain Python."""

import itertools

from hypothesis import given
from hypothesis import strategies as st

from streams.rules import EXPIRED_BY_COUNTER, Eligibility, Retention, eligibility
from streams.state import Event, MessageState, apply, apply_all

TTL = 1_000
RETENTION = Retention(expired_ttl_ms=TTL)


def enqueue(t, count=1, event_id=None):
    return Event(event_id or f"enq-{t}", "enqueue", t, "m", mailbox="inbox", payload_id="p", payload_size=5,
                 inline=False, extract_count=count, dcs=("dc2", "dc1"))


def dequeue(t, count, event_id=None):
    return Event(event_id or f"deq-{t}", "dequeue", t, "m", extract_count=count)


def admin(t, count, event_id=None):
    return Event(event_id or f"adm-{t}", "extract_counter", t, "m", extract_count=count)


def test_enqueue_records_the_payload():
    state = apply(None, enqueue(10))
    assert state.payload_id == "p" and state.dcs == ("dc1", "dc2") and state.extract_count == 1
    assert eligibility(state, RETENTION) is None


def test_counter_reaching_zero_starts_the_period_at_that_event():
    state = apply_all(None, [enqueue(10), dequeue(50, 0)])
    assert state.counter_zero_since == 50
    assert eligibility(state, RETENTION) == Eligibility(EXPIRED_BY_COUNTER, 50 + TTL)


def test_a_revival_cancels_the_purge():
    state = apply_all(None, [enqueue(10), dequeue(50, 0), admin(60, 1)])
    assert state.extract_count == 1 and eligibility(state, RETENTION) is None


def test_expiring_again_restarts_the_period():
    state = apply_all(None, [enqueue(10), dequeue(50, 0), admin(60, 1), admin(70, 0)])
    assert eligibility(state, RETENTION).eligible_at_ms == 70 + TTL


def test_setting_zero_twice_keeps_the_first_start():
    state = apply_all(None, [enqueue(10), dequeue(50, 0), admin(80, 0)])
    assert state.counter_zero_since == 50


def test_an_older_value_arriving_late_does_not_win():
    state = apply_all(None, [enqueue(10), admin(60, 1)])
    state = apply(state, dequeue(50, 0))  # from before the revival, arriving after it
    assert state.extract_count == 1 and eligibility(state, RETENTION) is None


def test_a_message_not_counter_based_never_expires_by_counter():
    assert eligibility(apply(None, enqueue(10, count=None)), RETENTION) is None


def test_duplicates_change_nothing():
    events = [enqueue(10), dequeue(50, 0)]
    assert apply_all(None, events + events) == apply_all(None, events)


def test_nothing_known_is_not_eligible():
    assert eligibility(None, RETENTION) is None
    assert eligibility(MessageState(), RETENTION) is None


counter_events = st.lists(
    st.tuples(st.sampled_from(["dequeue", "extract_counter"]), st.integers(0, 50), st.integers(0, 2)),
    max_size=8,
)


@given(counter_events, st.randoms())
def test_arrival_order_and_duplicates_do_not_change_the_outcome(changes, random):
    """A simple reference model: the counter is the latest event's (by time, then lower count, then id)."""
    events = [enqueue(0)] + [
        Event(f"e{i}", kind, t, "m", extract_count=count) for i, (kind, t, count) in enumerate(changes)
    ]
    shuffled = events + random.sample(events, k=len(events) // 2)
    random.shuffle(shuffled)
    one_by_one = None
    for event in shuffled:
        one_by_one = apply(one_by_one, event)

    latest = max(events, key=lambda e: (e.event_time_ms, -e.extract_count, e.event_id))
    assert one_by_one.extract_count == latest.extract_count
    expected_due = eligibility(apply_all(None, events), RETENTION)
    if latest.extract_count == 0:
        assert eligibility(one_by_one, RETENTION).rule == EXPIRED_BY_COUNTER
    assert (eligibility(one_by_one, RETENTION) is None) == (expected_due is None)


def test_batch_order_does_not_matter():
    events = [enqueue(10), dequeue(50, 0), admin(60, 1), admin(70, 0)]
    results = {apply_all(None, list(p)) for p in itertools.permutations(events)}
    assert len(results) == 1


def test_at_equal_times_the_lower_counter_wins_whatever_the_arrival_order():
    one, zero = dequeue(50, 1, event_id="b"), dequeue(50, 0, event_id="a")
    for order in ([one, zero], [zero, one]):
        state = apply(apply(None, order[0]), order[1])
        assert state.extract_count == 0
