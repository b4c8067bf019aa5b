"""Erasure on request (``purger.core.erasure``): the protocol under an erasure's rule, the schedule's rechecks, and
the certificate's maths. Plain Python, the protocol on ``tests/core/test_purge_protocol.py``'s objects in memory;
the command on the real servers is tests/integration/test_policies_stream.py's."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from purger.core.erasure import Certificate, certificate, erasure_rule, is_erasure, request_of
from purger.core.policy import Attempt, Candidate, Eligibility, Kept
from purger.core.schedule import Schedule, recheck
from purger.core.times import now_ms
from purger.core.vocabulary import ALREADY_GONE, ERROR, HELD, PURGED, SKIPPED, category
from tests.core.test_purge_protocol import MemoryJournal, Thing, ThingPurge
from tests.support.memory import MemoryHolds

RULE = erasure_rule("20261206-0a1b2c3d")
YEARS_MS = 3 * 365 * 86_400_000


def erase(thing: Thing, holds: MemoryHolds | None = None, kept: Kept | None = None) -> tuple[ThingPurge, list]:
    purge = ThingPurge(thing, MemoryJournal(), holds=holds)
    if kept is not None:
        purge.erasable = lambda candidate, row: kept
    return purge, list(purge.purge(Candidate("thing", "t1", RULE, now_ms()), Attempt(batch="q/9")))


def test_the_rule_names_its_request():
    assert is_erasure(RULE) and request_of(RULE) == "20261206-0a1b2c3d"
    assert not is_erasure("expired_by_date") and not is_erasure(None) and request_of("expired_by_date") is None


def test_an_object_due_in_years_is_purged_now_with_its_dependents_under_an_erasure():
    thing = Thing(2, due_at_ms=now_ms() + YEARS_MS)
    _, outcomes = erase(thing)
    assert not thing.present and thing.rows == set()
    assert [(o.status, o.kind, o.id) for o in outcomes] == [
        (PURGED, "row", "r0"), (PURGED, "row", "r1"), (PURGED, None, None)]


def test_a_hold_wins_over_an_erasure_and_keeps_it_for_the_release():
    thing, holds = Thing(1, due_at_ms=now_ms() + YEARS_MS), MemoryHolds()
    holds.place("thing:t1")
    _, outcomes = erase(thing, holds)
    assert thing.present and thing.rows == {"r0"}
    assert [(o.status, category(o.reason)) for o in outcomes] == [(SKIPPED, HELD)]
    # The release looks at it again under the erasure's rule: the erasure goes on then.
    assert holds.release("thing:t1") == {("thing", "t1", RULE)}


def test_what_the_row_still_keeps_is_kept_and_looked_at_again_only_when_the_policy_says():
    thing = Thing(1)
    purge, outcomes = erase(thing, kept=Kept("referenced: by message m2"))
    assert thing.present and [(o.status, o.reason) for o in outcomes] == [(SKIPPED, "referenced: by message m2")]
    assert purge.control.rechecks == []
    # A payload linked within its grace: erased when the grace ends, under the erasure, at that time.
    later = now_ms() + 60_000
    purge, outcomes = erase(thing, kept=Kept("recently linked: within payload_grace", Eligibility(RULE, later)))
    assert thing.present and purge.control.rechecks == [("thing", "t1", RULE, later)]


def test_a_row_changed_under_the_erasure_is_looked_at_again_under_it_not_under_its_own_rule():
    thing = Thing(0, due_at_ms=now_ms() + YEARS_MS)
    thing.delete_times_out = None
    purge = ThingPurge(thing, MemoryJournal())
    purge.delete = lambda candidate, row: False  # a writer changed the row between the check and the delete
    outcomes = list(purge.purge(Candidate("thing", "t1", RULE, now_ms()), Attempt(batch="q/9")))
    assert [o.status for o in outcomes] == [SKIPPED] and thing.present
    assert [(kind, rule) for kind, _, rule, _ in purge.control.rechecks] == [("thing", RULE)]


def test_an_erasure_recheck_stands_over_any_other_and_no_other_replaces_it():
    pending = recheck(Schedule(), "expired_by_date", 1_000)
    assert (recheck(pending, RULE, 5_000).recheck_rule, recheck(pending, RULE, 5_000).recheck_at_ms) == (RULE, 5_000)
    erased = recheck(Schedule(), RULE, 5_000)
    assert recheck(erased, "expired_by_date", 1_000) == erased
    assert recheck(erased, "expired_by_date", 9_000) == erased
    assert recheck(erased, RULE, 2_000).recheck_at_ms == 2_000, "of two erasures, the earlier"
    assert recheck(erased, RULE, 9_000) == erased


def record(kind: str, object_id: str, status: str, at: int, reason: str | None = None, dc: str | None = None,
           batch: int = 1) -> dict:
    return {"policy": "p", "kind": kind, "id": object_id, "dc": dc, "status": status, "reason": reason,
            "deleted_at": at if status == PURGED else None, "decided_at": at,
            "record_id": f"{kind}/{object_id}/{dc}/{status}/{at}", "batch_id": batch}


def test_the_certificate_lists_deletions_with_their_dependents_and_what_was_kept_and_why():
    records = [
        record("payload_refs", '["p1","m1"]', PURGED, 2), record("message", "m1", PURGED, 1),
        record("payload", "p1", PURGED, 3, dc="dc1"), record("payload", "p1", PURGED, 3, dc="dc2"),
        record("message", "m2", SKIPPED, 1, reason="held: mailbox:alice since ...: case 42"),
        record("message", "m3", SKIPPED, 1, reason="held: message:m3: case 7"),
        record("message", "m3", PURGED, 9),  # released, then erased
        record("message", "m4", ALREADY_GONE, 1),
        record("message", "m5", SKIPPED, 1, reason="being deleted: by another attempt"),
        record("message", "m6", ERROR, 1, reason="dc2: connection refused"),
        record("message", "m8", PURGED, 1), record("payload", "p8", SKIPPED, 2, reason="referenced: by message n1"),
    ]
    found = certificate("mailbox:alice", "r", [("message", f"m{n}") for n in range(1, 9)], records)
    assert [(e.kind, e.id, e.dc) for e in found.deleted] == [
        ("message", "m1", None), ("message", "m3", None), ("message", "m8", None), ("payload", "p1", "dc1"),
        ("payload", "p1", "dc2"),
        ("payload_refs", '["p1","m1"]', None)]
    assert [(e.id, e.reason) for e in found.kept] == [("m2", "held: mailbox:alice since ...: case 42"),
                                                      ("p8", "referenced: by message n1")]
    assert [e.id for e in found.gone] == ["m4"]
    assert found.pending == [("message", "m5"), ("message", "m6"), ("message", "m7")] and not found.complete


decisions = st.lists(st.tuples(st.integers(0, 4), st.sampled_from([PURGED, ALREADY_GONE, SKIPPED, ERROR]),
                               st.booleans(), st.integers(0, 20)), max_size=20)


@settings(max_examples=300, deadline=None)
@given(asked=st.sets(st.integers(0, 4), max_size=5), decided=decisions)
def test_each_object_asked_for_is_in_one_place_of_the_certificate_as_its_last_settling_decision_says(asked, decided):
    """Against a reference: an object with a deletion is deleted; any other's place is its last decision among
    those found gone and held skips (ties by record), pending without one."""
    records = [record("message", f"m{n}", status, at, reason="held: x: y" if held else "being deleted: z")
               for n, status, held, at in decided]
    found: Certificate = certificate("mailbox:a", "r", [("message", f"m{n}") for n in asked], records)
    places = {}
    for e in found.deleted:
        places.setdefault(e.id, []).append("deleted")
    for name, entries in (("kept", found.kept), ("gone", found.gone)):
        for e in entries:
            places.setdefault(e.id, []).append(name)
    for _, object_id in found.pending:
        places.setdefault(object_id, []).append("pending")
    for n in asked:
        settling = sorted((str(r["decided_at"]), r["record_id"], r["status"]) for r in records
                          if r["id"] == f"m{n}" and (r["status"] in (PURGED, ALREADY_GONE) or (
                              r["status"] == SKIPPED and r["reason"].startswith("held"))))
        last = PURGED if any(s == PURGED for *_, s in settling) else settling[-1][2] if settling else None
        expected = {PURGED: "deleted", ALREADY_GONE: "gone", SKIPPED: "kept", None: "pending"}[last]
        assert set(places[f"m{n}"]) == {expected}


def test_an_object_due_by_its_own_rule_before_its_erasure_is_emitted_under_the_erasure():
    """A payload released by an erased message: its own eligibility (the release and its grace) may come before the
    erasure's recheck; the candidate is the erasure's all the same, so its records are the request's."""
    from purger.core.schedule import on_timer

    pending = recheck(Schedule(), RULE, 5_000)
    emitted, kept = on_timer(pending, Eligibility("payload", 3_000), watermark_ms=4_000, linger_ms=1_000)
    assert emitted == Eligibility(RULE, 5_000) and kept.recheck_at_ms is None
