"""The engine's purge protocol (``purger.core.policy.ObjectPurge``) on a claimed object's dependents: whatever
attempts of a batch crash, and wherever, each deleted row is recorded once by the attempt whose outcomes reach
the ledger. Plain Python: sets stand in for the rows and the journal (``purger.sinks.journal`` is tested on
Cassandra through the policies' crash tests)."""

from __future__ import annotations

import time
from collections import Counter
from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from purger.core.policy import (
    Attempt, Candidate, Control, Dependent, Eligibility, Journal, ObjectPurge, Outcome, Resources,
)
from purger.core.vocabulary import ALREADY_GONE, EARLIER_ATTEMPT, PURGED, SKIPPED, WOULD_DELETE

CANDIDATE = Candidate("thing", "t1", "rule", 0)


class Crash(Exception):
    pass


class MemoryJournal(Journal):
    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], tuple[str, set[str]]] = {}

    def keep(self, kind: str, object_id: str, batch: str, rows: set[str]) -> None:
        self.entries[(kind, object_id)] = (batch, set(rows))

    def kept(self, kind: str, object_id: str, batch: str) -> set[str] | None:
        found = self.entries.get((kind, object_id))
        return set(found[1]) if found and found[0] == batch else None


class RecordedControl(Control):
    def __init__(self) -> None:
        self.rechecks: list[tuple[str, str, str, int]] = []

    def recheck(self, kind: str, object_id: str, rule: str, at_ms: int) -> None:
        self.rechecks.append((kind, object_id, rule, at_ms))

    def report(self, event_type: str, object_id: str, event_time_ms: int, **fields: Any) -> None:
        raise AssertionError("no control events")


class Thing:
    """An object with ``n`` dependent rows, its row claimed before they go."""

    def __init__(self, n: int, due_at_ms: int = 0) -> None:
        self.rows = {f"r{i}" for i in range(n)}
        self.present, self.claimed, self.due_at_ms = True, False, due_at_ms
        # The row's delete times out: "after" it applied, "before" it did; None: it answers.
        self.delete_times_out: str | None = None
        self.failing: set[str] = set()  # dependent rows whose store fails now


class ThingPurge(ObjectPurge[Thing]):
    """A policy's steps, on memory."""

    def __init__(self, thing: Thing, journal: Journal, dry_run: bool = False) -> None:
        self.control = RecordedControl()
        super().__init__(Resources(lambda names: None, None, self.control, journal, retry_ms=1_000,
                                   dry_run=dry_run), {})
        self.thing = thing

    def read(self, candidate: Candidate, serial: bool = False) -> Thing | None:
        return self.thing if self.thing.present else None

    def claimed(self, row: Thing) -> bool:
        return row.claimed

    def due(self, candidate: Candidate, row: Thing) -> Eligibility | None:
        return Eligibility("rule", row.due_at_ms)

    def why_kept(self, candidate: Candidate, row: Thing, due: Eligibility | None) -> str:
        return "not yet due: later"

    def claim(self, candidate: Candidate, row: Thing) -> Thing:
        row.claimed = True
        return row

    def dependents(self, candidate: Candidate, row: Thing) -> list[Dependent]:
        return [Dependent("row", r, partial(self._delete_row, row, r)) for r in sorted(row.rows)]

    @staticmethod
    def _delete_row(row: Thing, r: str) -> str | None:
        if r in row.failing:
            return "store failed"
        row.rows.discard(r)
        return None

    def delete(self, candidate: Candidate, row: Thing) -> bool:
        if row.delete_times_out == "before":
            raise TimeoutError("the conditional delete timed out before it applied")
        row.present = False
        if row.delete_times_out == "after":
            raise TimeoutError("the conditional delete timed out once it had applied")
        return True


def purge(thing: Thing, journal: Journal, batch: str, retry: bool, crash_after: int | None) -> list[Outcome] | None:
    """One attempt; after ``crash_after`` deletes (the object's own included) it crashes: a kill, whose
    outcomes are lost."""
    outcomes: list[Outcome] = []
    try:
        for outcome in ThingPurge(thing, journal).purge(CANDIDATE, Attempt(retry, batch=batch)):
            outcomes.append(outcome)
            if crash_after is not None and len(outcomes) > crash_after:
                raise Crash()
    except Crash:
        return None
    return outcomes


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 5), crashes=st.lists(st.integers(0, 6), max_size=4))
def test_every_deleted_row_is_recorded_once_whatever_the_crashes(n, crashes):
    thing, journal, ledger, attempt = Thing(n), MemoryJournal(), None, 0
    while ledger is None:  # the batch runs again until an attempt ends; its outcomes go to the ledger
        ledger = purge(thing, journal, "q/7", retry=attempt > 0,
                       crash_after=crashes[attempt] if attempt < len(crashes) else None)
        attempt += 1
    assert thing.rows == set() and not thing.present
    assert sorted(o.id for o in ledger if o.kind == "row") == [f"r{i}" for i in range(n)]
    assert [o for o in ledger if o.kind is None] == ledger[-1:], "the object itself, once, last"
    assert all(o.status == PURGED for o in ledger)


def test_a_later_batch_finds_the_object_gone_and_records_nothing_again():
    """Not a retry of the batch that deleted it: that batch's outcomes reached the ledger."""
    thing, journal = Thing(3), MemoryJournal()
    assert purge(thing, journal, "q/7", retry=False, crash_after=None) is not None
    assert [o.status for o in purge(thing, journal, "q/8", retry=False, crash_after=None)] == [ALREADY_GONE]
    # A retry of another batch does not take this batch's journal for its own.
    [outcome] = purge(thing, journal, "q/9", retry=True, crash_after=None)
    assert (outcome.status, outcome.reason, outcome.kind) == (PURGED, EARLIER_ATTEMPT, None)


def test_a_dry_run_deletes_nothing_and_sends_no_recheck():
    thing = Thing(2)
    dry = ThingPurge(thing, MemoryJournal(), dry_run=True)
    outcomes = list(dry.purge(CANDIDATE, Attempt(False)))
    assert [(o.status, o.kind, o.id) for o in outcomes] == [(WOULD_DELETE, "row", "r0"), (WOULD_DELETE, "row", "r1"),
                                                           (WOULD_DELETE, None, None)]
    assert thing.rows == {"r0", "r1"} and thing.present and not thing.claimed
    later = Thing(2, due_at_ms=2**62)
    dry = ThingPurge(later, MemoryJournal(), dry_run=True)
    [kept] = dry.purge(CANDIDATE, Attempt(False))
    assert kept.status == SKIPPED and dry.control.rechecks == []


def test_a_recheck_under_the_candidates_rule_is_no_sooner_than_the_retry_interval():
    """The stream found it due and the row says a moment ago: the clocks differ a little."""
    now = int(time.time() * 1000)
    thing = Thing(1, due_at_ms=now + 10)
    real = ThingPurge(thing, MemoryJournal())
    [kept] = real.purge(CANDIDATE, Attempt(False))
    [(_, _, rule, at_ms)] = real.control.rechecks
    assert kept.status == SKIPPED and rule == "rule" and at_ms >= now + 1_000


def test_a_delete_whose_outcome_a_timeout_hid_is_settled_by_a_serial_read():
    """Applied all the same: purged, recorded now (no later batch would know it). Not applied: the error goes
    on, and the row with it, for the sink to record and recheck."""
    applied = Thing(1)
    applied.delete_times_out = "after"
    outcomes = list(ThingPurge(applied, MemoryJournal()).purge(CANDIDATE, Attempt(False, batch="q/7")))
    assert [(o.status, o.kind) for o in outcomes] == [(PURGED, "row"), (PURGED, None)] and not applied.present
    not_applied = Thing(0)
    not_applied.delete_times_out = "before"
    with pytest.raises(TimeoutError):
        list(ThingPurge(not_applied, MemoryJournal()).purge(CANDIDATE, Attempt(False, batch="q/7")))
    assert not_applied.present


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 4), failing=st.lists(st.sets(st.integers(0, 3)), max_size=3),
       crashes=st.lists(st.one_of(st.none(), st.integers(0, 6)), max_size=8))
def test_every_deleted_row_is_recorded_once_across_store_failures_rechecks_and_crashes(n, failing, crashes):
    """A store failing leaves the object claimed for a recheck in a later batch; any attempt of any batch may
    crash. The ledger gets the outcomes of each batch's attempt that ended."""
    thing, journal, ledger, crash = Thing(n), MemoryJournal(), [], iter(crashes)
    for batch in range(len(failing) + 1):
        thing.failing = {f"r{i}" for i in failing[batch]} if batch < len(failing) else set()
        outcomes, attempt = None, 0
        while outcomes is None:
            outcomes = purge(thing, journal, f"q/{batch}", retry=attempt > 0, crash_after=next(crash, None))
            attempt += 1
        ledger.extend(outcomes)
        if not thing.present:
            break
    assert thing.rows == set() and not thing.present
    purged = Counter((o.kind, o.id) for o in ledger if o.status == PURGED)
    assert purged == Counter({("row", f"r{i}"): 1 for i in range(n)} | {(None, None): 1}), ledger
