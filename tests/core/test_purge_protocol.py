"""The engine's purge protocol (``purger.core.purge_protocol.ObjectPurge``) on a claimed object's dependents: whatever
attempts of a batch crash, and wherever, and whoever else removes the row, each row the purger deleted has one
``purged`` record in the ledger and nothing else has one. Plain Python: sets stand in for the rows and the
journal, a dict keyed as ``sinks.ledger`` keys records for the ledger (``purger.sinks.journal`` and the ledger
are tested on the real servers through the policies' crash tests and tests/sinks/test_ledger_paths.py)."""

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
from purger.core.vocabulary import ALREADY_GONE, HELD, PURGED, REMOVED_MEANWHILE, SKIPPED, WOULD_DELETE, category
from tests.support.memory import MemoryFailures, MemoryHolds

CANDIDATE = Candidate("thing", "t1", "rule", 0)


class Crash(Exception):
    pass


class MemoryJournal(Journal):
    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], dict[str, str]] = {}

    def intend(self, kind: str, object_id: str, intent: dict[str, str]) -> None:
        self.entries[(kind, object_id)] = dict(intent)

    def intended(self, kind: str, object_id: str) -> dict[str, str]:
        return dict(self.entries.get((kind, object_id), {}))


class MemoryLedger:
    """Records by the identity ``sinks.ledger`` gives them: a deletion by the batch that meant it, a decision
    by its batch; a record already there is not written again."""

    def __init__(self) -> None:
        self.records: dict[tuple, Outcome] = {}

    def write(self, outcomes: list[Outcome], batch: str) -> None:
        for o in outcomes:
            self.records.setdefault((o.kind, o.id, o.dc, o.status, o.intent or batch), o)

    def purged(self) -> Counter:
        return Counter((o.kind, o.id) for o in self.records.values() if o.status == PURGED)


class RecordedControl(Control):
    def __init__(self) -> None:
        self.rechecks: list[tuple[str, str, str, int]] = []

    def recheck(self, kind: str, object_id: str, rule: str, at_ms: int) -> None:
        self.rechecks.append((kind, object_id, rule, at_ms))

    def report(self, event_type: str, object_id: str, event_time_ms: int, **fields: Any) -> None:
        raise AssertionError("no control events")


class Thing:
    """An object with ``n`` dependent rows, its row claimed before they go."""

    def __init__(self, n: int, due_at_ms: int = 0, links: int = 0, blobs: bool = False) -> None:
        self.rows = {f"r{i}" for i in range(n)}
        # What ``dependents`` lists: the rows that are there; or, for blobs (a payload's, listed from its row's
        # ``dcs``), the row's list, which a blob's delete leaves as it was (``keep_progress`` updates it).
        self.listed = set(self.rows) if blobs else self.rows
        # Rows that go after it (``ObjectPurge.followers``), as a message's reference to its payload.
        self.links = {f"l{i}" for i in range(links)}
        self.link_count = links
        self.present, self.claimed, self.due_at_ms = True, False, due_at_ms
        # The row's delete times out: "after" it applied, "before" it did; None: it answers.
        self.delete_times_out: str | None = None
        self.removed_meanwhile = False  # another writer removes the row between the check and the delete
        self.reads_fail = False  # the next read times out
        self.failing: set[str] = set()  # dependent rows whose store fails now


class ThingPurge(ObjectPurge[Thing]):
    """A policy's steps, on memory."""

    def __init__(self, thing: Thing, journal: Journal, dry_run: bool = False, holds: MemoryHolds | None = None,
                 failures: MemoryFailures | None = None) -> None:
        self.control = RecordedControl()
        self.holds = holds or MemoryHolds()
        super().__init__(Resources(lambda names: None, None, self.control, journal, self.holds,
                                   failures or MemoryFailures(), retry_ms=1_000, dry_run=dry_run), {})
        self.thing = thing

    def read(self, candidate: Candidate, serial: bool = False) -> Thing | None:
        if self.thing.reads_fail:
            self.thing.reads_fail = False
            raise TimeoutError("the read timed out")
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
        return [Dependent("row", r, partial(self._delete_row, row, r)) for r in sorted(row.listed)]

    def keep_progress(self, candidate: Candidate, row: Thing, went: list[Dependent]) -> None:
        row.listed -= {dependent.id for dependent in went}

    def followers(self, candidate: Candidate, row: Thing) -> list[Dependent]:
        return [link for link in self.leftovers(candidate) if link.present()]

    def leftovers(self, candidate: Candidate) -> list[Dependent]:
        links = self.thing.links
        return [Dependent("link", f"l{i}", partial(links.discard, f"l{i}"), present=partial(links.__contains__, f"l{i}"))
                for i in range(self.thing.link_count)]

    @staticmethod
    def _delete_row(row: Thing, r: str) -> str | None:
        if r in row.failing:
            return "store failed"
        row.rows.discard(r)  # a blob already gone is deleted again without an error, as a store does
        return None

    def delete(self, candidate: Candidate, row: Thing) -> bool:
        if row.delete_times_out == "before":
            raise TimeoutError("the conditional delete timed out before it applied")
        if row.removed_meanwhile:  # another writer got there between the check and the delete
            row.present = False
            return False
        row.present = False
        if row.delete_times_out in ("after", "after, and the read fails"):
            if row.delete_times_out == "after, and the read fails":
                row.reads_fail = True
            raise TimeoutError("the conditional delete timed out once it had applied")
        return True


def purge(thing: Thing, journal: Journal, batch: str, crash_after: int | None = None,
          holds: MemoryHolds | None = None) -> list[Outcome] | None:
    """One attempt; after ``crash_after`` deletes (the object's own included) it crashes: a kill, whose
    outcomes are lost."""
    outcomes: list[Outcome] = []
    try:
        for outcome in ThingPurge(thing, journal, holds=holds).purge(CANDIDATE, Attempt(batch=batch)):
            outcomes.append(outcome)
            if crash_after is not None and len(outcomes) > crash_after:
                raise Crash()
    except Crash:
        return None
    return outcomes


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 5), crashes=st.lists(st.integers(0, 6), max_size=4), blobs=st.booleans())
def test_every_deleted_row_is_recorded_once_whatever_the_crashes(n, crashes, blobs):
    thing, journal, ledger, outcomes, attempt = Thing(n, blobs=blobs), MemoryJournal(), MemoryLedger(), None, 0
    while outcomes is None:  # the batch runs again until an attempt ends; its outcomes go to the ledger
        outcomes = purge(thing, journal, "q/7", crash_after=crashes[attempt] if attempt < len(crashes) else None)
        attempt += 1
    ledger.write(outcomes, "q/7")
    assert thing.rows == set() and not thing.present
    assert ledger.purged() == Counter({("row", f"r{i}"): 1 for i in range(n)} | {(None, None): 1})
    assert [o for o in outcomes if o.kind is None] == outcomes[-1:], "the object itself, once, last"
    assert all(o.status == PURGED for o in outcomes)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 3), links=st.integers(1, 3), crashes=st.lists(st.integers(0, 8), max_size=4),
       later=st.booleans())
def test_what_goes_after_the_row_is_recorded_once_whatever_the_crashes(n, links, crashes, later):
    """Followers (a message's reference to its payload) go after the row, named in its intent: a crash after the
    row's delete leaves them to the retry, or to a later batch that finds the row gone; one record each."""
    thing, journal, ledger, outcomes, attempt = Thing(n, links=links), MemoryJournal(), MemoryLedger(), None, 0
    while outcomes is None:
        outcomes = purge(thing, journal, "q/7", crash_after=crashes[attempt] if attempt < len(crashes) else None)
        attempt += 1
    ledger.write(outcomes, "q/7")
    if later:
        ledger.write(purge(thing, journal, "q/8"), "q/8")
    assert thing.rows == set() and thing.links == set() and not thing.present
    assert ledger.purged() == Counter({("row", f"r{i}"): 1 for i in range(n)} | {("link", f"l{i}"): 1 for i in range(links)}
                                      | {(None, None): 1})


def test_what_another_writers_removal_left_behind_is_deleted_and_recorded_only_if_there():
    """The row gone without the purger's intent: a follower still there is the purger's deletion, one already
    gone is nobody's record; and so when the row goes between the check and the delete."""
    thing, journal, ledger = Thing(0, links=2), MemoryJournal(), MemoryLedger()
    thing.present = False
    thing.links.discard("l1")
    outcomes = purge(thing, journal, "q/7")
    assert [(o.status, o.kind, o.id) for o in outcomes] == [(ALREADY_GONE, None, None), (PURGED, "link", "l0")]
    ledger.write(outcomes, "q/7")
    ledger.write(purge(thing, journal, "q/8"), "q/8")
    assert ledger.purged() == Counter({("link", "l0"): 1}) and thing.links == set()
    racing = Thing(0, links=1)
    racing.removed_meanwhile = True
    assert [(o.status, o.kind) for o in purge(racing, MemoryJournal(), "q/9")] == [(ALREADY_GONE, None),
                                                                                  (PURGED, "link")]


def test_a_later_batch_or_a_replay_finds_the_object_gone_and_records_nothing_new():
    """The deletion, recorded by the batch that made it, is recorded again from its intent by a batch that
    finds the object gone (a recheck, a reconcile's feed, a replay into a fresh checkpoint): the same records,
    which the ledger keeps once. (A later batch cannot take the earlier batch's records for granted: it may have
    recorded an ``error`` for a delete a timeout left unsettled.)"""
    thing, journal, ledger = Thing(3), MemoryJournal(), MemoryLedger()
    ledger.write(purge(thing, journal, "q/7"), "q/7")
    for batch in ("q/8", "replay/0"):
        again = purge(thing, journal, batch)
        assert {o.intent for o in again} == {"q/7"} and all(o.status == PURGED for o in again)
        ledger.write(again, batch)
    assert ledger.purged() == Counter({("row", "r0"): 1, ("row", "r1"): 1, ("row", "r2"): 1, (None, None): 1})


def test_a_row_another_writer_removed_is_already_gone_in_any_batch_or_attempt():
    """No intent: the purger did not delete it, so nothing is ``purged``, whichever attempt finds it gone."""
    thing, journal = Thing(2), MemoryJournal()
    thing.present = False
    for batch in ("q/7", "q/7", "q/8"):
        assert [(o.status, o.kind) for o in purge(thing, journal, batch)] == [(ALREADY_GONE, None)]


def test_a_row_removed_between_the_check_and_the_delete_is_already_gone_and_stays_so():
    """The conditional delete does not apply, the row is gone: another writer's deletion. Its dependents were
    the purger's; the row is not, now or when a later batch finds it gone."""
    thing, journal, ledger = Thing(1), MemoryJournal(), MemoryLedger()
    thing.removed_meanwhile = True
    outcomes = purge(thing, journal, "q/7")
    assert [(o.status, o.kind) for o in outcomes] == [(PURGED, "row"), (ALREADY_GONE, None)]
    assert category(outcomes[-1].reason) == REMOVED_MEANWHILE
    ledger.write(outcomes, "q/7")
    ledger.write(purge(thing, journal, "q/8"), "q/8")
    assert ledger.purged() == Counter({("row", "r0"): 1})


def test_a_dry_run_deletes_nothing_and_sends_no_recheck():
    thing = Thing(2)
    dry = ThingPurge(thing, MemoryJournal(), dry_run=True)
    outcomes = list(dry.purge(CANDIDATE, Attempt()))
    assert [(o.status, o.kind, o.id) for o in outcomes] == [(WOULD_DELETE, "row", "r0"), (WOULD_DELETE, "row", "r1"),
                                                           (WOULD_DELETE, None, None)]
    assert thing.rows == {"r0", "r1"} and thing.present and not thing.claimed
    later = Thing(2, due_at_ms=2**62)
    dry = ThingPurge(later, MemoryJournal(), dry_run=True)
    [kept] = dry.purge(CANDIDATE, Attempt())
    assert kept.status == SKIPPED and dry.control.rechecks == []


def test_a_held_object_is_kept_under_its_hold_and_nothing_of_it_is_claimed_or_deleted():
    thing, holds = Thing(2), MemoryHolds()
    holds.place("thing:t1")
    held = ThingPurge(thing, MemoryJournal(), holds=holds)
    [kept] = held.purge(CANDIDATE, Attempt(batch="q/1"))
    assert kept.status == SKIPPED and category(kept.reason) == HELD and "thing:t1" in kept.reason
    assert thing.rows == {"r0", "r1"} and thing.present and not thing.claimed
    assert held.control.rechecks == [], "the release looks at it again, not a timer"
    assert holds.release("thing:t1") == {("thing", "t1", "rule")}


def test_a_dry_run_honours_holds_and_keeps_nothing_under_them():
    holds = MemoryHolds()
    holds.place("thing:t1")
    [kept] = ThingPurge(Thing(1), MemoryJournal(), dry_run=True, holds=holds).purge(CANDIDATE, Attempt())
    assert category(kept.reason) == HELD and holds.kept == {}


def test_a_hold_released_between_its_read_and_the_keep_leaves_a_recheck():
    class Released(MemoryHolds):
        def keep(self, hold, kind, object_id, rule):
            return False

    holds = Released()
    holds.place("thing:t1")
    purge = ThingPurge(Thing(1), MemoryJournal(), holds=holds)
    [kept] = purge.purge(CANDIDATE, Attempt())
    assert category(kept.reason) == HELD and [rule for _, _, rule, _ in purge.control.rechecks] == ["rule"]


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 4), steps=st.lists(st.one_of(st.just("hold"), st.just("release"), st.integers(0, 6)),
                                           max_size=8))
def test_while_a_hold_stands_nothing_is_deleted_and_after_its_release_each_row_is_recorded_once(n, steps):
    """Attempts, crashing after any deletion, with a hold placed and released between them (a claimed row a
    crash left included): no attempt that read a hold deletes anything, every candidate found held is kept under
    the hold until its release, and once released the purge ends with each row recorded once."""
    thing, journal, ledger, holds = Thing(n), MemoryJournal(), MemoryLedger(), MemoryHolds()
    found_held = False
    for step in steps + ["release"]:
        if step == "hold":
            if "thing:t1" not in holds.placed:
                holds.place("thing:t1")
        elif step == "release":
            if "thing:t1" in holds.placed:
                assert holds.release("thing:t1") == ({("thing", "t1", "rule")} if found_held else set())
                found_held = False
        elif thing.present:
            found_held = found_held or "thing:t1" in holds.placed
            before = (set(thing.rows), thing.present)
            outcomes = purge(thing, journal, "q/7", crash_after=step, holds=holds)
            if "thing:t1" in holds.placed:
                assert (set(thing.rows), thing.present) == before
                assert outcomes is None or [category(o.reason) for o in outcomes] == [HELD]
            elif outcomes is not None:
                ledger.write(outcomes, "q/7")
    outcomes = purge(thing, journal, "q/8", holds=holds)
    ledger.write(outcomes, "q/8")
    assert thing.rows == set() and not thing.present
    assert ledger.purged() == Counter({("row", f"r{i}"): 1 for i in range(n)} | {(None, None): 1})


def test_a_recheck_under_the_candidates_rule_is_no_sooner_than_the_retry_interval():
    """The stream found it due and the row says a moment ago: the clocks differ a little."""
    now = int(time.time() * 1000)
    thing = Thing(1, due_at_ms=now + 10)
    real = ThingPurge(thing, MemoryJournal())
    [kept] = real.purge(CANDIDATE, Attempt())
    [(_, _, rule, at_ms)] = real.control.rechecks
    assert kept.status == SKIPPED and rule == "rule" and at_ms >= now + 1_000


def test_a_delete_whose_outcome_a_timeout_hid_is_settled_by_a_serial_read():
    """Applied all the same: purged, recorded now. Not applied: the error goes on, and the row with it, for
    the sink to record and recheck."""
    applied = Thing(1)
    applied.delete_times_out = "after"
    outcomes = list(ThingPurge(applied, MemoryJournal()).purge(CANDIDATE, Attempt(batch="q/7")))
    assert [(o.status, o.kind) for o in outcomes] == [(PURGED, "row"), (PURGED, None)] and not applied.present
    not_applied = Thing(0)
    not_applied.delete_times_out = "before"
    with pytest.raises(TimeoutError):
        list(ThingPurge(not_applied, MemoryJournal()).purge(CANDIDATE, Attempt(batch="q/7")))
    assert not_applied.present


def outcomes_until_it_raises(thing: Thing, journal: MemoryJournal, batch: str) -> list[Outcome]:
    """An attempt of ``batch`` whose row delete raises (``TimeoutError``): the outcomes it yielded before."""
    first: list[Outcome] = []
    with pytest.raises(TimeoutError):
        for outcome in ThingPurge(thing, journal).purge(CANDIDATE, Attempt(batch=batch)):
            first.append(outcome)
    return first


def test_a_delete_a_timeout_hid_and_a_failed_read_left_unsettled_ends_purged_at_the_recheck():
    """The serial read fails too: the error goes on (the sink records ``error`` and rechecks). The recheck
    finds the row gone with the purger's intent: ``purged``, never left as an error."""
    thing, journal, ledger = Thing(1), MemoryJournal(), MemoryLedger()
    thing.delete_times_out = "after, and the read fails"
    ledger.write(outcomes_until_it_raises(thing, journal, "q/7"), "q/7")
    ledger.write(purge(thing, journal, "q/8"), "q/8")
    assert ledger.purged() == Counter({("row", "r0"): 1, (None, None): 1})


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 4), failing=st.lists(st.sets(st.integers(0, 3)), max_size=3),
       crashes=st.lists(st.one_of(st.none(), st.integers(0, 6)), max_size=8), blobs=st.booleans())
def test_every_deleted_row_is_recorded_once_across_store_failures_rechecks_and_crashes(n, failing, crashes, blobs):
    """A store failing leaves the object claimed for a recheck in a later batch; any attempt of any batch may
    crash. The ledger gets the outcomes of each batch's attempt that ended. Dependents listed from the row
    (``blobs``) are listed again at the recheck unless the row kept which went."""
    thing, journal, ledger, crash = Thing(n, blobs=blobs), MemoryJournal(), MemoryLedger(), iter(crashes)
    for batch in range(len(failing) + 1):
        thing.failing = {f"r{i}" for i in failing[batch]} if batch < len(failing) else set()
        outcomes = None
        while outcomes is None:
            outcomes = purge(thing, journal, f"q/{batch}", crash_after=next(crash, None))
        ledger.write(outcomes, f"q/{batch}")
        if not thing.present:
            break
    assert thing.rows == set() and not thing.present
    assert ledger.purged() == Counter({("row", f"r{i}"): 1 for i in range(n)} | {(None, None): 1}), ledger.records


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 4), blobs=st.booleans())
def test_dependents_deleted_before_a_row_delete_that_failed_are_recorded_once_by_the_recheck(n, blobs):
    """The dependents go, then the row's delete fails (Cassandra unavailable): the sink records what went and the
    error, and a later batch's recheck purges the row. What the first attempt named and deleted, the recheck
    finds listed still (a payload's blobs stay in its row's ``dcs`` unless a store failed) and deletes again:
    recorded under the batch that meant it, so the ledger keeps one record of each."""
    thing, journal, ledger = Thing(n, blobs=blobs), MemoryJournal(), MemoryLedger()
    thing.delete_times_out = "before"
    ledger.write(outcomes_until_it_raises(thing, journal, "q/7"), "q/7")
    thing.delete_times_out = None
    ledger.write(purge(thing, journal, "q/8"), "q/8")
    assert thing.rows == set() and not thing.present
    assert ledger.purged() == Counter({("row", f"r{i}"): 1 for i in range(n)} | {(None, None): 1})
