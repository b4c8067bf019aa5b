"""A claimed object's dependents (core.policy.delete_dependents, found_gone): whatever attempts of a batch
crash, and wherever, each deleted row is recorded once by the attempt whose outcomes reach the ledger. Plain
Python: sets stand in for the rows and the journal (sinks.journal is tested on Cassandra through the
policies' crash tests)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from purger.core.policy import Attempt, Candidate, Dependent, Journal, Outcome, delete_dependents, found_gone
from purger.core.vocabulary import ALREADY_GONE, EARLIER_ATTEMPT, PURGED

CANDIDATE = Candidate("thing", "t1", "rule", 0)


class Crash(Exception):
    pass


class Kept(Journal):
    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], tuple[str, set[str]]] = {}

    def keep(self, kind: str, object_id: str, batch: str, rows: set[str]) -> None:
        self.entries[(kind, object_id)] = (batch, set(rows))

    def kept(self, kind: str, object_id: str, batch: str) -> set[str] | None:
        found = self.entries.get((kind, object_id))
        return set(found[1]) if found and found[0] == batch else None


class Thing:
    """An object with ``n`` dependent rows, purged as a policy's purger does: claim, dependents, the row;
    ``crash_after`` deletes of this attempt, it crashes (a kill: its outcomes are lost)."""

    def __init__(self, n: int) -> None:
        self.rows = {f"r{i}" for i in range(n)}
        self.present, self.claimed = True, False
        self.journal = Kept()

    def purge(self, batch: str, retry: bool, crash_after: int | None) -> list:
        deletes = 0

        def deleted(action):
            nonlocal deletes
            action()
            deletes += 1
            if crash_after is not None and deletes > crash_after:
                raise Crash()

        attempt = Attempt(retry, batch=batch)
        try:
            if not self.present:
                return list(found_gone(CANDIDATE, self.journal, attempt, dry_run=False))
            claimed_before, self.claimed = self.claimed, True
            found = [Dependent("row", r, lambda r=r: deleted(lambda: self.rows.discard(r))) for r in sorted(self.rows)]
            outcomes = list(delete_dependents(CANDIDATE, found, claimed_before, self.journal, attempt, "x"))
            deleted(lambda: setattr(self, "present", False))
            return outcomes + [Outcome(PURGED)]
        except Crash:
            return None


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 5), crashes=st.lists(st.integers(0, 6), max_size=4))
def test_every_deleted_row_is_recorded_once_whatever_the_crashes(n, crashes):
    thing, ledger, attempt = Thing(n), None, 0
    while ledger is None:  # the batch runs again until an attempt ends; its outcomes go to the ledger
        ledger = thing.purge("q/7", retry=attempt > 0, crash_after=crashes[attempt] if attempt < len(crashes) else None)
        attempt += 1
    assert thing.rows == set() and not thing.present
    assert sorted(o.id for o in ledger if o.kind == "row") == [f"r{i}" for i in range(n)]
    assert [o for o in ledger if o.kind is None] == ledger[-1:], "the object itself, once, last"
    assert all(o.status == PURGED for o in ledger)


def test_a_later_batch_finds_the_object_gone_and_records_nothing_again():
    """Not a retry of the batch that deleted it: that batch's outcomes reached the ledger."""
    thing = Thing(3)
    assert thing.purge("q/7", retry=False, crash_after=None) is not None
    assert [o.status for o in thing.purge("q/8", retry=False, crash_after=None)] == [ALREADY_GONE]
    # A retry of another batch does not take this batch's journal for its own.
    [outcome] = thing.purge("q/9", retry=True, crash_after=None)
    assert (outcome.status, outcome.reason, outcome.kind) == (PURGED, EARLIER_ATTEMPT, None)
