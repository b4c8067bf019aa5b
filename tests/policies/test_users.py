"""The ``users`` policy (docs/policies.md, users): its rule table as plain Python, its deletes and its writer contract against
real Cassandra, and the race of a purge with the user added back in another data centre.

The race runs the fault matrix's attempts (``tests.support.faults.FAULTS``) and prints its counts as a
``RELIABILITY`` line (``pytest -s``).
"""

import itertools
import random
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from purger.testing import injected
from purger.core.policy import Attempt, Candidate, Eligibility
from purger.core.times import epoch_ms, now_ms, parse_timestamp
from purger.core.vocabulary import (
    ALREADY_GONE, BEING_DELETED, EARLIER_ATTEMPT, NOT_YET_DUE, PURGED, SKIPPED, WOULD_DELETE, category,
)
from purger.policies import PolicyError, load_policy
from purger.policies.users import (
    MAILBOX_PERMISSION, PURGING, USER, USER_ABSENT, USER_ADDED, USER_REMOVED, VIRTUAL_ROOT, UserEvent, UserPurge,
    UsersPolicy,
)
from tests.support.faults import FAULTS
from tests.support.policies import (
    RecordingControl, emitted, fold_in_batches, keyspace_fixture, resources, topic_fixture,
)

GRACE_MS = 1_000
DCS = ("dc1", "dc2")
POLICY = load_policy("users", {"enabled": True, "data_centres": list(DCS), "user_grace": f"{GRACE_MS}ms"})
KIND = POLICY.kinds[0]


def added(t, dc, event_id=None):
    return UserEvent(event_id or f"added-{dc}-{t}", USER_ADDED, t, "u", dc)


def removed(t, dc, event_id=None):
    return UserEvent(event_id or f"removed-{dc}-{t}", USER_REMOVED, t, "u", dc)


def absent_since(t):
    return Eligibility(USER_ABSENT, t + GRACE_MS)


# One row per case: the events, then the expected eligibility (None: not by its events).
RULE_TABLE = {
    "no event yet": ([], None),
    "present in one data centre": ([added(10, "dc1")], None),
    "present in one, removed from the other": ([added(10, "dc1"), added(20, "dc2"), removed(30, "dc2")], None),
    "absent from all": ([added(10, "dc1"), added(20, "dc2"), removed(30, "dc1"), removed(40, "dc2")],
                        absent_since(40)),
    "the grace runs from the last removal, whichever arrives first": ([removed(50, "dc2"), removed(30, "dc1")],
                                                                      absent_since(50)),
    "removed, then added in another data centre": ([added(10, "dc1"), removed(30, "dc1"), added(50, "dc2")], None),
    "removed, then added again in the same one": ([added(10, "dc1"), removed(30, "dc1"), added(50, "dc1")], None),
    "added again, then removed again": ([added(10, "dc1"), removed(30, "dc1"), added(50, "dc1"),
                                         removed(70, "dc1")], absent_since(70)),
    "a data centre that never reported counts as absent": ([added(10, "dc1"), removed(30, "dc1")],
                                                           absent_since(30)),
    "only additions": ([added(10, "dc1"), added(20, "dc2")], None),
    "an unconfigured data centre's presence does not count": ([added(10, "dc3"), added(20, "dc1"),
                                                               removed(30, "dc1")], absent_since(30)),
    "an unconfigured data centre's removal does not count": ([removed(30, "dc3")], None),
    "nor does its later removal time": ([removed(30, "dc1"), removed(90, "dc3")], absent_since(30)),
    "equal times: the removal wins": ([added(30, "dc1", "b"), removed(30, "dc1", "a")], absent_since(30)),
}


@pytest.mark.parametrize("case", RULE_TABLE)
def test_rule_table(case):
    events, expected = RULE_TABLE[case]
    assert KIND.eligibility(KIND.fold(None, events)) == expected


@pytest.mark.parametrize("case", RULE_TABLE)
def test_rule_table_with_duplicates_in_every_order_and_batch(case):
    events, expected = RULE_TABLE[case]
    for order in itertools.permutations(events + events[-1:]):
        assert KIND.eligibility(KIND.fold(None, list(order))) == expected
        one_by_one = KIND.fold(None, [])
        for e in order:
            one_by_one = KIND.fold(one_by_one, [e])
        assert one_by_one == KIND.fold(None, list(order))


def test_a_data_centre_added_to_the_configuration_counts_for_users_already_known():
    state = KIND.fold(None, [added(10, "dc3"), removed(30, "dc1")])
    wider = load_policy("users", {"enabled": True, "data_centres": ["dc1", "dc2", "dc3"],
                                  "user_grace": f"{GRACE_MS}ms"}).kinds[0]
    assert KIND.eligibility(state) == absent_since(30) and wider.eligibility(state) is None


def test_the_policy_declares_its_events_kind_rule_and_tables():
    assert [(t.name, t.kind, t.id_field, t.required) for t in POLICY.event_types] == [
        (USER_ADDED, USER, "user_id", ("dc",)), (USER_REMOVED, USER, "user_id", ("dc",))]
    assert {(f.name, f.type, f.identifier) for f in POLICY.event_fields} == {
        ("user_id", "string", True), ("dc", "string", True)}
    assert KIND.name == USER and KIND.rule.name == USER_ABSENT and KIND.rule.period_ms == GRACE_MS
    assert set(UsersPolicy.tables) == {"users", "virtual_roots", "mailbox_permissions"}
    assert load_policy("users", {}).kinds[0].rule.period_ms == 7 * 86_400_000


@pytest.mark.parametrize("raw, key", [
    ({"data_centres": []}, "policies.users.data_centres"),
    ({"data_centres": ["dc1", "dc1"]}, "policies.users.data_centres"),
    ({"user_grace": "a week"}, "policies.users.user_grace"),
    ({"grace": "7d"}, "policies.users.grace"),
])
def test_a_bad_setting_names_its_key(raw, key):
    with pytest.raises(PolicyError, match=key):
        load_policy("users", raw)


def reference(events):
    """From the whole set at once: each configured data centre's last event by (event time, an addition before a
    removal, event id); eligible a grace after the latest of them if all are removals."""
    unique = {e.event_id: e for e in events}.values()
    last = {}
    for e in sorted(unique, key=lambda e: (e.event_time_ms, e.type == USER_REMOVED, e.event_id)):
        last[e.dc] = e
    counted = [last[dc] for dc in DCS if dc in last]
    if not counted or any(e.type == USER_ADDED for e in counted):
        return None
    return absent_since(max(e.event_time_ms for e in counted))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 20), st.sampled_from(("dc1", "dc2", "dc3"))), max_size=8),
       st.randoms())
def test_the_fold_matches_the_reference_model_under_duplicates_reordering_and_batches(changes, random):
    # Event ids are unique; a duplicate is the same event again.
    events = [(removed if is_removal else added)(t, dc, f"e{i}") for i, (is_removal, t, dc) in enumerate(changes)]
    assert KIND.eligibility(fold_in_batches(KIND, events, random)) == reference(events)


# --- against Cassandra and Kafka ---------------------------------------------------------------


keyspace = keyspace_fixture(UsersPolicy, "test_users")
topic = topic_fixture("test.users")


@pytest.fixture(scope="module")
def platform(config, keyspace, topic):
    from simulation.users import UsersPlatform

    platform = UsersPlatform(config.kafka, config.cassandra, topic, keyspace[1], POLICY.settings)
    yield platform
    platform.close()


HOUR = timedelta(hours=1)
MAILBOXES = ("inbox", "archive")


def purger(keyspace, grace="1h", dry_run=False):
    """A purger of the policy with ``grace``, and the control it reports its rechecks to."""
    session, name = keyspace
    control = RecordingControl("users")
    policy = load_policy("users", {"enabled": True, "user_grace": grace})
    return policy.purges(resources(session, name, control, dry_run))[USER], control


@pytest.fixture
def purge(keyspace):
    """purge(user_id, dry_run=False, batch="q/1") -> (outcomes, rechecks), with a grace of an hour."""

    def run(user_id, dry_run=False, failpoint=lambda name: None, batch="q/1"):
        users, control = purger(keyspace, dry_run=dry_run)
        with injected(failpoint):
            outcomes = list(users.purge(Candidate(USER, user_id, USER_ABSENT, eligible_at_ms=0),
                                        Attempt(batch=batch)))
        return outcomes, control.rechecks

    return run


def ago(period):
    return datetime.now(timezone.utc) - period


def new_user():
    return f"u-{uuid.uuid4().hex[:12]}"


def absent_user(platform, removed_ago=2 * HOUR):
    """A user with its rows, added in both data centres, then removed from both ``removed_ago``."""
    user_id = new_user()
    for dc in DCS:
        platform.add_user(user_id, dc, MAILBOXES, at=ago(removed_ago + HOUR))
    for dc in DCS:
        platform.remove_user(user_id, dc, at=ago(removed_ago))
    return user_id


def deleted(outcomes):
    return [(o.status, o.kind, o.id) for o in outcomes]


def intact(rows, present_in=None, state="live"):
    user = rows["user"]
    return (user is not None and set(user["present_in"] or ()) == set(present_in or ()) and user["state"] == state
            and rows["virtual_root"] == MAILBOXES[0] and set(rows["permissions"]) == set(MAILBOXES))


GONE = {"user": None, "virtual_root": None, "permissions": {}}


@pytest.mark.integration
def test_a_user_absent_everywhere_past_the_grace_loses_every_row_permissions_first(platform, purge):
    user_id = absent_user(platform)
    before = now_ms()
    outcomes, rechecks = purge(user_id)
    assert deleted(outcomes) == [(PURGED, MAILBOX_PERMISSION, f"{user_id}/archive"),
                                 (PURGED, MAILBOX_PERMISSION, f"{user_id}/inbox"),
                                 (PURGED, VIRTUAL_ROOT, user_id), (PURGED, None, None)]
    assert all(o.deleted_at_ms >= before for o in outcomes)
    assert platform.rows(user_id) == GONE and rechecks == []


@pytest.mark.integration
def test_a_user_present_in_one_data_centre_keeps_everything(platform, purge):
    user_id = new_user()
    for dc in DCS:
        platform.add_user(user_id, dc, MAILBOXES, at=ago(3 * HOUR))
    platform.remove_user(user_id, "dc1", at=ago(2 * HOUR))
    (outcome,), rechecks = purge(user_id)
    assert (outcome.status, outcome.reason) == (SKIPPED, "present: in dc2")
    assert intact(platform.rows(user_id), present_in={"dc2"}) and rechecks == []


@pytest.mark.integration
def test_a_user_absent_for_less_than_the_grace_is_kept_and_rechecked_when_due(platform, purge):
    user_id = absent_user(platform, removed_ago=timedelta(minutes=10))
    (outcome,), rechecks = purge(user_id)
    assert outcome.status == SKIPPED and outcome.reason.startswith("not yet due: user_absent at ")
    rows = platform.rows(user_id)
    assert intact(rows) and rechecks == [(USER, user_id, USER_ABSENT, epoch_ms(rows["user"]["updated_at"]) + 3_600_000)]


@pytest.mark.integration
def test_a_user_without_updated_at_is_dated_by_its_state_write_time_and_a_writer_in_between_keeps_it(
        platform, purge, keyspace):
    """SPEC 8.1 at delete time: users rows another writer inserted live and absent everywhere without updated_at, at
    a write time the test gives, each with its virtual root. Written 2 hours ago: purged (the claim by its undated
    condition). Written now: kept, rechecked at that write time plus the grace, not due at once. Written 2 hours
    ago, then added back in dc1 by a writer of the contract (updated_at set) between the purge's read and its
    claim: kept, with its rows."""
    session, name = keyspace
    due, young, raced = new_user(), new_user(), new_user()
    two_hours_ago, now_micros = int(ago(2 * HOUR).timestamp() * 1e6), int(time.time() * 1e6)
    for user_id, written in ((due, two_hours_ago), (young, now_micros), (raced, two_hours_ago)):
        session.execute(f"INSERT INTO {name}.users (user_id, state) VALUES (%s, 'live') USING TIMESTAMP {written}",
                        (user_id,))
        session.execute(f"INSERT INTO {name}.virtual_roots (user_id, mailbox) VALUES (%s, 'inbox')", (user_id,))

    outcomes, rechecks = purge(due)
    assert deleted(outcomes) == [(PURGED, VIRTUAL_ROOT, due), (PURGED, None, None)] and rechecks == []
    assert platform.rows(due) == GONE

    (outcome,), rechecks = purge(young)
    assert outcome.status == SKIPPED and outcome.reason.startswith("not yet due: user_absent at ")
    assert rechecks == [(USER, young, USER_ABSENT, now_micros // 1000 + 3_600_000)]

    read = UserPurge.read

    def read_then_added_back(self, candidate, serial=False):
        found = read(self, candidate, serial)
        if found is not None and found.updated_at is None:
            platform.add_user(raced, "dc1")
        return found

    with mock.patch.object(UserPurge, "read", read_then_added_back):
        (outcome,), _ = purge(raced)
    assert (outcome.status, outcome.reason) == (SKIPPED, "present: re-added while being purged")
    assert platform.rows(raced)["user"]["present_in"] == {"dc1"} and platform.rows(raced)["virtual_root"] is not None


@pytest.mark.integration
def test_a_dry_run_deletes_nothing(platform, purge):
    user_id = absent_user(platform)
    outcomes, rechecks = purge(user_id, dry_run=True)
    assert deleted(outcomes) == [(WOULD_DELETE, MAILBOX_PERMISSION, f"{user_id}/archive"),
                                 (WOULD_DELETE, MAILBOX_PERMISSION, f"{user_id}/inbox"),
                                 (WOULD_DELETE, VIRTUAL_ROOT, user_id), (WOULD_DELETE, None, None)]
    assert intact(platform.rows(user_id)) and rechecks == []
    assert deleted(purge(new_user(), dry_run=True)[0]) == [(ALREADY_GONE, None, None)]
    # Not yet due: kept, as in a real run, but a dry run sends no recheck (the engine's protocol, every policy).
    recent = absent_user(platform, removed_ago=timedelta(minutes=10))
    (outcome,), rechecks = purge(recent, dry_run=True)
    assert outcome.status == SKIPPED and outcome.reason.startswith(f"{NOT_YET_DUE}: ") and rechecks == []


@pytest.mark.integration
def test_a_gone_user_is_already_gone_unless_the_purger_meant_to_delete_it(platform, purge):
    """No intent (removed by another writer): already gone. The purger's own deletion found gone again: purged,
    from its intent, each row under the batch that meant it."""
    (outcome,), rechecks = purge(new_user())
    assert outcome.status == ALREADY_GONE and rechecks == []
    user_id = absent_user(platform)
    first, _ = purge(user_id)
    before = now_ms()
    again, rechecks = purge(user_id, batch="q/2")
    assert [(o.status, o.kind, o.id) for o in again] == [(o.status, o.kind, o.id) for o in first]
    assert {(category(o.reason), o.intent) for o in again} == {(EARLIER_ATTEMPT, "q/1")}
    assert all(o.deleted_at_ms >= before for o in again) and rechecks == []


@pytest.mark.integration
def test_an_erasure_of_a_user_an_orphan_sweep_claims_is_rechecked_then_gone_once_the_sweep_ends(
        platform, keyspace):
    """SPEC 11.3: an orphan sweep's placeholder for an absent user (``OrphanRows.claim``) is not the user's row:
    under an erasure it is kept with a recheck under the erasure (not a ``kept`` the certificate would end on), and
    once the sweep removed it, the recheck finds the user gone. A live user present in both data centres is
    erased at once, with its rows."""
    from purger.core.erasure import erasure_rule
    from purger.core.reconcile_descriptors import CLAIMED_BY

    session, name = keyspace
    rule = erasure_rule("20261206-abc")
    swept = new_user()
    session.execute(f"INSERT INTO {name}.users (user_id, state) VALUES (%s, %s) IF NOT EXISTS",
                    (swept, CLAIMED_BY + "q-sweep"))
    users, control = purger(keyspace)
    before = now_ms()
    (outcome,) = users.purge(Candidate(USER, swept, rule, eligible_at_ms=0), Attempt(batch="q/1"))
    assert (outcome.status, outcome.reason) == (SKIPPED, f"present: claimed by the {CLAIMED_BY}q-sweep")
    [(kind, object_id, recheck_rule, at_ms)] = control.rechecks
    assert (kind, object_id, recheck_rule) == (USER, swept, rule) and at_ms >= before
    session.execute(f"DELETE FROM {name}.users WHERE user_id = %s IF state = %s", (swept, CLAIMED_BY + "q-sweep"))
    users, control = purger(keyspace)
    (outcome,) = users.purge(Candidate(USER, swept, rule, eligible_at_ms=0), Attempt(batch="q/2"))
    assert outcome.status == ALREADY_GONE and control.rechecks == []

    live = new_user()
    for dc in DCS:
        platform.add_user(live, dc, MAILBOXES, at=ago(HOUR))
    outcomes = list(users.purge(Candidate(USER, live, rule, eligible_at_ms=0), Attempt(batch="q/3")))
    assert [o.status for o in outcomes] == [PURGED] * 4 and platform.rows(live) == GONE


class Crash(Exception):
    pass


def crash(name):
    if name == "after_user_dependent_delete":
        raise Crash(name)


@pytest.mark.integration
def test_a_purge_that_crashed_after_claiming_the_user_is_finished_by_the_retry(platform, purge):
    user_id = absent_user(platform)
    with pytest.raises(Crash, match="after_user_dependent_delete"):
        purge(user_id, failpoint=crash)
    rows = platform.rows(user_id)
    assert rows["user"]["state"] == PURGING and set(rows["permissions"]) == {"inbox"}
    (outcome,), _ = purge(user_id, dry_run=True)
    assert (outcome.status, outcome.reason) == (SKIPPED, f"{BEING_DELETED}: by a real run")
    outcomes, rechecks = purge(user_id)
    # The first permission row went with the crashed attempt, whose outcome was lost with it: the
    # journal kept its key, so the retry records it, by the earlier attempt.
    assert deleted(outcomes) == [(PURGED, MAILBOX_PERMISSION, f"{user_id}/archive"),
                                 (PURGED, MAILBOX_PERMISSION, f"{user_id}/inbox"), (PURGED, VIRTUAL_ROOT, user_id),
                                 (PURGED, None, None)]
    assert [o.reason and category(o.reason) for o in outcomes] == [EARLIER_ATTEMPT, None, None, None]
    assert platform.rows(user_id) == GONE and rechecks == []
    # Finished by a later batch instead (its recheck): the crashed attempt's row is recorded the same way,
    # under the batch that meant it, so the record is the one that batch would have written; so are the rows it
    # named and left, which the later batch deletes: a retry of the crashed batch, finding them gone, writes the
    # same records, not second ones.
    user_id = absent_user(platform)
    with pytest.raises(Crash, match="after_user_dependent_delete"):
        purge(user_id, failpoint=crash)
    outcomes, _ = purge(user_id, batch="q/2")
    assert deleted(outcomes) == [(PURGED, MAILBOX_PERMISSION, f"{user_id}/archive"),
                                 (PURGED, MAILBOX_PERMISSION, f"{user_id}/inbox"), (PURGED, VIRTUAL_ROOT, user_id),
                                 (PURGED, None, None)]
    assert [o.intent for o in outcomes] == ["q/1", "q/1", "q/1", None]


@pytest.mark.integration
def test_the_platforms_events_fold_to_the_deadline_the_row_gives(platform, topic):
    user_id = new_user()
    for dc in DCS:
        platform.add_user(user_id, dc, MAILBOXES)
    platform.remove_user(user_id, "dc2")
    platform.remove_user(user_id, "dc1")
    platform.flush()
    events = emitted(topic, user_id)
    assert [(e["type"], e["dc"]) for e in events] == [
        (USER_ADDED, "dc1"), (USER_ADDED, "dc2"), (USER_REMOVED, "dc2"), (USER_REMOVED, "dc1")]
    assert {k for e in events for k in e} == {"event_id", "type", "event_time", "user_id", "dc"}
    state = KIND.fold(None, [UserEvent(e["event_id"], e["type"], parse_timestamp(e["event_time"]), e["user_id"],
                                       e["dc"]) for e in events])
    assert KIND.eligibility(state) == absent_since(epoch_ms(platform.rows(user_id)["user"]["updated_at"]))


# --- the race: a purge against the user added back -----------------------------------------------

ATTEMPTS = FAULTS.attempts


@pytest.mark.integration
def test_a_user_added_back_while_being_purged_never_loses_a_row(keyspace, platform):
    """Each attempt: a user absent from every data centre for longer than the grace; then, released together,
    the purger purges it while the platform adds it back in dc2 with its virtual root and permissions, by the
    writer contract. Whichever wins, the user must end with every row it needs: a lost row is a live object
    deleted."""
    users, _ = purger(keyspace, grace="1s")
    lost, sides = [], Counter()

    def attempt(i):
        user_id = f"race-{uuid.uuid4().hex[:8]}-{i}"
        platform.add_user(user_id, "dc1", MAILBOXES, at=ago(timedelta(minutes=2)))
        platform.remove_user(user_id, "dc1", at=ago(timedelta(minutes=1)))
        gate = threading.Barrier(2)
        result = {}

        def purge():
            gate.wait()
            time.sleep(random.random() * 0.004)
            result["purge"] = list(users.purge(Candidate(USER, user_id, USER_ABSENT, 0), Attempt()))

        def add_back():
            gate.wait()
            time.sleep(random.random() * 0.004)
            platform.add_user(user_id, "dc2", MAILBOXES)

        threads = [threading.Thread(target=purge), threading.Thread(target=add_back)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sides["purge first" if result["purge"][-1].status == PURGED else "add first"] += 1
        if not intact(platform.rows(user_id), present_in={"dc2"}):
            lost.append(user_id)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(attempt, range(ATTEMPTS)))
    print(f"RELIABILITY users re-added while purged: attempts={ATTEMPTS}, purge first={sides['purge first']}, "
          f"add first={sides['add first']}, rows lost={len(lost)} ({time.monotonic() - started:.0f}s)")
    assert lost == []
    # The race was real: each side won some.
    assert sides["purge first"] and sides["add first"], sides
