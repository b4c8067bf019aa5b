"""The ``units_of_work`` policy: its period, its rule and the nine examples, its fold, and its purger on the
real Cassandra (and Kafka, for the platform's events)."""

from __future__ import annotations

import itertools
from datetime import date, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from purger.testing import injected
from purger.core.policy import Attempt, Candidate, Eligibility
from purger.core.times import now_ms, parse_timestamp
from purger.core.vocabulary import (
    EARLIER_ATTEMPT, KEPT_BY_RULE, NOT_YET_DUE, PURGED, SKIPPED, WOULD_DELETE, category,
)
from purger.policies import PolicyError, load_policy
from purger.policies.units_of_work import (
    JOURNEY_TYPES, RETENTION, UNIT_OF_WORK, UOW_ARCHIVED, UOW_FINISHED, UOW_OBJECT, UOW_STARTED,
    Period, UnitOfWorkEvent, UnitOfWorkState, UnitsOfWorkPolicy, UnitsOfWorkSettings, day_of, day_start_ms,
    deadline_ms, eligible_on, first_eligible_day, row_state,
)
from simulation.units_of_work import EXAMPLES_DATE, NINE_EXAMPLES, UnitsOfWorkPlatform
from tests.support.policies import (
    RecordingControl, arrivals, emitted, policy_keyspace, policy_topic, resources,
)

UTC = timezone.utc


# --- the period ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("P2Y", Period(2, 0, 0)), ("P18M", Period(0, 18, 0)), ("P1Y6M", Period(1, 6, 0)), ("P3W", Period(0, 0, 21)),
    ("P30D", Period(0, 0, 30)), ("P1Y2M3W4D", Period(1, 2, 25)), ("P0D", Period()),
])
def test_a_period_of_years_months_weeks_and_days_is_read(text, expected):
    assert Period.parse(text) == expected
    assert load_policy("units_of_work", {"retention_period": text}).settings.period == expected


@pytest.mark.parametrize("text", ["", "P", "2Y", "PT12H", "P1DT1H", "P1.5Y", "P-1Y", "p2y", " P2Y", "P1D2Y", "P2000Y"])
def test_a_bad_period_is_refused_naming_the_key_and_what_it_accepts(text):
    with pytest.raises(PolicyError) as refused:
        load_policy("units_of_work", {"retention_period": text})
    assert "policies.units_of_work.retention_period" in str(refused.value)
    assert "ISO-8601 period of years, months, weeks and days" in str(refused.value)


def test_an_unknown_journey_type_is_refused():
    with pytest.raises(PolicyError, match="archived_dependent_journey_types.0: Input should be 'PAYMENT'"):
        load_policy("units_of_work", {"archived_dependent_journey_types": ["CARD"]})


@pytest.mark.parametrize("day, period, expected", [
    (date(2023, 5, 17), "P2Y", date(2021, 5, 17)),
    (date(2024, 2, 29), "P1Y", date(2023, 2, 28)),  # the month's end clamps
    (date(2028, 2, 29), "P4Y", date(2024, 2, 29)),
    (date(2023, 3, 31), "P1M", date(2023, 2, 28)),
    (date(2024, 3, 31), "P1M", date(2024, 2, 29)),
    (date(2023, 3, 31), "P1M1D", date(2023, 2, 27)),  # months first, then days
    (date(2023, 1, 15), "P18M", date(2021, 7, 15)),
    (date(2023, 1, 1), "P3W", date(2022, 12, 11)),
    (date(2023, 7, 31), "P1Y5M", date(2022, 2, 28)),
])
def test_calendar_subtraction(day, period, expected):
    assert Period.parse(period).subtract_from(day) == expected


def test_the_lower_bound_is_at_midnight_utc():
    assert Period.parse("P2Y").lower_bound(EXAMPLES_DATE) == datetime(2021, 5, 17, tzinfo=UTC)


@settings(max_examples=300, deadline=None)
@given(st.dates(date(1990, 1, 1), date(2040, 12, 31)), st.integers(0, 5), st.integers(0, 30), st.integers(0, 70))
def test_the_first_day_past_is_exact(day, years, months, days):
    period = Period(years, months, days)
    first = period.first_day_past(day)
    assert period.subtract_from(first) > day >= period.subtract_from(first - timedelta(days=1))


# --- the rule: the nine examples, and the deadline against eligible_on -----------------------------

@pytest.mark.parametrize("example", NINE_EXAMPLES, ids=[e.name for e in NINE_EXAMPLES])
def test_the_nine_examples(example):
    assert eligible_on(row_state(example.row), EXAMPLES_DATE, UnitsOfWorkSettings(**example.settings)) is example.purged


moments = st.one_of(st.none(), st.integers(day_start_ms(date(1995, 1, 1)), day_start_ms(date(2035, 1, 1))))
states = st.builds(UnitOfWorkState, st.one_of(st.none(), st.sampled_from(JOURNEY_TYPES)), moments, moments, moments)
policy_settings = st.builds(
    lambda y, m, d, terminal, archived: UnitsOfWorkSettings(
        retention_period=f"P{y}Y{m}M{d}D", terminal_only=terminal, archived_dependent_journey_types=archived),
    st.integers(0, 3), st.integers(0, 14), st.integers(0, 40), st.booleans(),
    st.lists(st.sampled_from(JOURNEY_TYPES), unique=True, max_size=2),
)


@settings(max_examples=500, deadline=None)
@given(states, policy_settings, st.dates(date(1994, 1, 1), date(2042, 12, 31)))
def test_the_stream_deadline_agrees_with_eligible_on(state, config, day):
    deadline = deadline_ms(state, config)
    assert eligible_on(state, day, config) is (deadline is not None and day_start_ms(day) >= deadline)


@settings(max_examples=200, deadline=None)
@given(states, policy_settings)
def test_the_kind_is_due_at_the_start_of_the_first_eligible_day(state, config):
    first = first_eligible_day(state, config)
    expected = None if first is None else Eligibility(RETENTION, day_start_ms(first))
    assert UnitsOfWorkPolicy(config).kinds[0].eligibility(state) == expected


def test_archived_during_a_day_counts_from_the_next():
    config = UnitsOfWorkSettings(archived_dependent_journey_types=["BULK"])
    archived = datetime(2023, 5, 17, 9, 30, tzinfo=UTC)
    state = row_state(dict(journey_type="BULK", started_at=datetime(2020, 1, 1, tzinfo=UTC),
                           finished_at=datetime(2020, 1, 2, tzinfo=UTC), archived_at=archived))
    assert not eligible_on(state, date(2023, 5, 17), config) and eligible_on(state, date(2023, 5, 18), config)


# --- the policy's declarations --------------------------------------------------------------------

def test_the_policy_declares_its_events_kind_and_report_fields():
    policy = load_policy("units_of_work", {"enabled": True, "terminal_only": True,
                                           "archived_dependent_journey_types": ["BULK", "BATCH"]})
    assert isinstance(policy, UnitsOfWorkPolicy)
    assert [k.name for k in policy.kinds] == [UNIT_OF_WORK]
    assert {t.name: (t.kind, t.id_field, t.required) for t in policy.event_types} == {
        UOW_STARTED: (UNIT_OF_WORK, "unit_of_work_id", ("journey_type",)),
        UOW_FINISHED: (UNIT_OF_WORK, "unit_of_work_id", ()),
        UOW_ARCHIVED: (UNIT_OF_WORK, "unit_of_work_id", ()),
    }
    assert policy.report_fields(EXAMPLES_DATE) == {
        "execution_date": "2023-05-17", "retention_period": "P2Y",
        "retention_lower_bound": "2021-05-17T00:00:00.000Z", "terminal_only": "true",
        "archived_dependent_journey_types": "BULK,BATCH",
    }


# --- the fold -------------------------------------------------------------------------------------

def uow_event(kind, t, journey_type=None, event_id=None):
    return UnitOfWorkEvent(event_id or f"{kind}-{t}-{journey_type}", kind, t, "u", journey_type)


def test_every_arrival_order_and_duplicates_give_the_same_state():
    events = [uow_event(UOW_STARTED, 10, "BULK"), uow_event(UOW_FINISHED, 50), uow_event(UOW_ARCHIVED, 70),
              uow_event(UOW_FINISHED, 60, event_id="again")]
    kind = UnitsOfWorkPolicy(UnitsOfWorkSettings()).kinds[0]
    expected = UnitOfWorkState("BULK", 10, 50, 70)
    for order in itertools.permutations(events + events[:1]):
        assert kind.fold(None, list(order)) == expected
    assert kind.fold(kind.fold(None, events[:2]), events[2:]) == expected


reference_events = st.lists(st.tuples(st.sampled_from([UOW_STARTED, UOW_FINISHED, UOW_ARCHIVED]),
                                      st.integers(0, 20), st.sampled_from(JOURNEY_TYPES)), max_size=8)


@settings(max_examples=300, deadline=None)
@given(reference_events, st.randoms())
def test_the_fold_matches_the_reference_model(changes, random):
    events = [uow_event(kind, t, journey_type if kind == UOW_STARTED else None, f"e{i}")
              for i, (kind, t, journey_type) in enumerate(changes)]
    arriving = arrivals(events, random)
    # The whole set at once: the earliest start (its journey type, the lesser at equal times), finish, archive.
    starts = sorted((e.event_time_ms, e.journey_type) for e in events if e.type == UOW_STARTED)
    first = {kind: min((e.event_time_ms for e in events if e.type == kind), default=None)
             for kind in (UOW_FINISHED, UOW_ARCHIVED)}
    expected = UnitOfWorkState(starts[0][1] if starts else None, starts[0][0] if starts else None,
                               first[UOW_FINISHED], first[UOW_ARCHIVED])
    assert UnitsOfWorkPolicy(UnitsOfWorkSettings()).kinds[0].fold(None, arriving) == expected


# --- the purger on the real servers ---------------------------------------------------------------

class Crash(Exception):
    pass


def crash_at(name: str):
    def failpoint(reached: str) -> None:
        if reached == name:
            raise Crash(name)
    return failpoint


@pytest.fixture(scope="module")
def store(config):
    """A fresh keyspace with the policy's schema, a topic of its own, and the platform writing to both, on the
    session's servers."""
    with policy_keyspace(UnitsOfWorkPolicy, "test_uow", config.cassandra) as (session, keyspace), \
            policy_topic("test.uow", config.kafka) as topic:
        platform = UnitsOfWorkPlatform(config.kafka, config.cassandra, topic, keyspace, UnitsOfWorkSettings())
        yield session, keyspace, platform
        platform.close()


def purger_for(store, control, dry_run=False, **tweaks):
    session, keyspace, _ = store
    return UnitsOfWorkPolicy(UnitsOfWorkSettings(enabled=True, **tweaks)).purges(
        resources(session, keyspace, control, dry_run))[UNIT_OF_WORK]


def candidate(uow: str) -> Candidate:
    return Candidate(UNIT_OF_WORK, uow, RETENTION, now_ms())


def write(platform, uow: str, row: dict, children: int = 3) -> None:
    platform.start(uow, row["journey_type"], row["started_at"], children=children)
    for column, change in (("finished_at", platform.finish), ("archived_at", platform.archive)):
        if row[column] is not None:
            assert change(uow, row[column])


def years_ago(years: int, days: int = 0) -> datetime:
    return datetime.now(UTC) - timedelta(days=365 * years + days)


def today_example(row: dict) -> dict:
    """An example's row moved to today: each time as far from today's lower bound as from 2021-05-17."""
    period = Period.parse("P2Y")
    shift = period.lower_bound(day_of(now_ms())) - period.lower_bound(EXAMPLES_DATE)
    return {k: v + shift if isinstance(v, datetime) else v for k, v in row.items()}


@pytest.mark.integration
@pytest.mark.parametrize("number", range(len(NINE_EXAMPLES)), ids=[e.name for e in NINE_EXAMPLES])
def test_the_nine_examples_moved_to_today_are_purged_or_kept_whole(store, number):
    example = NINE_EXAMPLES[number]
    platform, uow = store[2], f"example-{number}"
    row = today_example(example.row)
    write(platform, uow, row)
    control = RecordingControl("units_of_work")
    outcomes = list(purger_for(store, control, **example.settings).purge(candidate(uow), Attempt()))
    if example.purged:
        assert [(o.status, o.kind) for o in outcomes] == [(PURGED, UOW_OBJECT)] * 3 + [(PURGED, None)]
        assert sorted(o.id for o in outcomes[:3]) == [f"{uow}/MDS/o1", f"{uow}/PDS/o2", f"{uow}/SUMMARY/o0"]
        assert platform.rows(uow) == (None, 0)
        assert control.rechecks == []
    else:
        [kept] = outcomes
        unit, children = platform.rows(uow)
        assert kept.status == SKIPPED and children == 3 and unit["purge_started_at"] is None
        due = deadline_ms(row_state(row), UnitsOfWorkSettings(**example.settings))
        assert category(kept.reason) == (KEPT_BY_RULE if due is None else NOT_YET_DUE)
        assert control.rechecks == ([] if due is None else [(UNIT_OF_WORK, uow, RETENTION, due)])


@pytest.mark.integration
def test_a_dry_run_deletes_nothing(store):
    platform = store[2]
    write(platform, "dry", dict(journey_type="PAYMENT", started_at=years_ago(3), finished_at=years_ago(3, -1),
                                archived_at=None), children=4)
    purger = purger_for(store, RecordingControl("units_of_work"), dry_run=True)
    outcomes = list(purger.purge(candidate("dry"), Attempt()))
    assert [(o.status, o.kind) for o in outcomes] == [(WOULD_DELETE, UOW_OBJECT)] * 4 + [(WOULD_DELETE, None)]
    assert len({o.id for o in outcomes[:4]}) == 4 and all(o.id.startswith("dry/") for o in outcomes[:4])
    unit, children = platform.rows("dry")
    assert unit["purge_started_at"] is None and children == 4
    # Not yet due: kept, as in a real run, but a dry run sends no recheck (the engine's protocol, every policy).
    write(platform, "dry-later", dict(journey_type="PAYMENT", started_at=years_ago(1), finished_at=years_ago(1, -1),
                                      archived_at=None), children=2)
    control = RecordingControl("units_of_work")
    [kept] = purger_for(store, control, dry_run=True).purge(candidate("dry-later"), Attempt())
    assert kept.status == SKIPPED and category(kept.reason) == NOT_YET_DUE and control.rechecks == []


@pytest.mark.integration
def test_a_crash_after_the_first_child_is_finished_by_the_retry_and_writers_keep_out_meanwhile(store):
    platform = store[2]
    write(platform, "crash", dict(journey_type="RECALL", started_at=years_ago(3), finished_at=years_ago(3, -1),
                                  archived_at=None), children=5)
    purger = purger_for(store, RecordingControl("units_of_work"))
    with pytest.raises(Crash), injected(crash_at("after_unit_of_work_dependent_delete")):
        list(purger.purge(candidate("crash"), Attempt(batch="q/1")))
    unit, children = platform.rows("crash")
    assert unit["purge_started_at"] is not None and children == 4
    # Claimed: a writer is refused, and treats the unit as gone.
    assert not platform.archive("crash", datetime.now(UTC))
    assert platform.rows("crash")[0]["archived_at"] is None
    outcomes = list(purger.purge(candidate("crash"), Attempt(batch="q/1")))
    # The first child went with the crashed attempt; the journal kept its key, so the retry records it.
    assert [(o.status, o.kind, o.reason and category(o.reason)) for o in outcomes] == [(PURGED, UOW_OBJECT, EARLIER_ATTEMPT)] + \
        [(PURGED, UOW_OBJECT, None)] * 4 + [(PURGED, None, None)]
    assert len({o.id for o in outcomes}) == 6
    assert platform.rows("crash") == (None, 0)
    # Found gone in another retry of the batch (its last attempt's outcomes lost too) or in a later batch: the
    # unit and every object its intent named, recorded from the intent under the batch that meant them (the
    # same records, which the ledger keeps once).
    for batch in ("q/1", "q/2"):
        again = list(purger.purge(candidate("crash"), Attempt(batch=batch)))
        assert {(o.status, o.kind, o.id, category(o.reason), o.intent) for o in again} == {
            (PURGED, o.kind, o.id, EARLIER_ATTEMPT, "q/1") for o in outcomes}
    assert not platform.finish("crash", datetime.now(UTC)) and platform.rows("crash") == (None, 0)


@pytest.mark.integration
def test_a_writer_finishing_the_unit_between_the_check_and_the_claim_keeps_it_whole(store):
    platform = store[2]
    write(platform, "race", dict(journey_type="BULK", started_at=years_ago(3), finished_at=None, archived_at=None))
    control = RecordingControl("units_of_work")
    purger = purger_for(store, control)
    finished_now = datetime.now(UTC)

    def writer_lands(name: str) -> None:
        if name == "before_unit_of_work_claim":
            assert platform.finish("race", finished_now)

    before = now_ms()
    with injected(writer_lands):
        [kept] = purger.purge(candidate("race"), Attempt())
    assert (kept.status, kept.reason) == (SKIPPED, f"{KEPT_BY_RULE}: changed while being purged")
    [(_, _, _, recheck_at)] = control.rechecks
    assert recheck_at >= before + 2000
    unit, children = platform.rows("race")
    assert unit["purge_started_at"] is None and children == 3
    # Looked at again: finished just now, so due in two years.
    [later] = purger.purge(candidate("race"), Attempt())
    assert later.status == SKIPPED and category(later.reason) == NOT_YET_DUE


@pytest.mark.integration
def test_the_platforms_events_fold_to_the_state_its_row_says(store):
    session, _, platform = store
    row = dict(journey_type="BATCH", started_at=years_ago(2), finished_at=years_ago(1), archived_at=years_ago(0, 1))
    write(platform, "events", row, children=1)
    platform.flush()
    events = emitted(platform.topic, "events", timeout_ms=5000)
    assert [e["type"] for e in events] == [UOW_STARTED, UOW_FINISHED, UOW_ARCHIVED]
    folded = UnitsOfWorkPolicy(UnitsOfWorkSettings()).kinds[0].fold(None, [
        UnitOfWorkEvent(e["event_id"], e["type"], parse_timestamp(e["event_time"]), e["unit_of_work_id"],
                        e.get("journey_type")) for e in events])
    assert folded == row_state(platform.rows("events")[0])
