"""The delete path against the real Cassandra and S3, without the stream: double-checks and the payload protocol."""

import random
import threading
import time
from datetime import datetime, timedelta, timezone
from unittest import mock

import pytest

from purger.connectors import cassandra_session
from purger.connectors.request_counts import PAXOS_ROUNDS, RequestCounts
from purger.core.purge_protocol import SELF, Attempt, Candidate, Dependent, key_id
from purger.core.times import now_ms
from purger.core.vocabulary import ALREADY_GONE, EARLIER_ATTEMPT, ERROR, PURGED, SKIPPED, WOULD_DELETE, category
from purger.policies.mailbox.deletes import DELETING, payload_key
from purger.policies.mailbox.rules import DELETED, EXPIRED_BY_COUNTER, EXPIRED_BY_DATE, INCOMPLETE, PAYLOAD
from purger.sinks.failures import CassandraFailures
from purger.sinks.journal import CassandraJournal
from purger.sinks.objects import ObjectStores
from purger.sinks.purge import purge_partition, to_ledger
from tests.support.configs import mailbox
from tests.support.mailbox import (candidate, message_purge, new_id, own, purge, purge_message, purge_message_all,
                                   unreferenced_payload)
from tests.support.waits import ago

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def deleter(config):
    session = cassandra_session(config.cassandra)
    yield message_purge(session, config)
    session.cluster.shutdown()


# rule -> (make it eligible, revive it). Each builds on a fresh message `m`.
def counter_case(platform, r, m):
    platform.enqueue(m, f"p-{m}", at=ago(r.expired_ttl))
    platform.dequeue(m, 0, at=ago(r.expired_ttl))


def date_case(platform, r, m):
    platform.enqueue(m, f"p-{m}", extract_count=None, extract_until=ago(r.expired_ttl), at=ago(r.expired_ttl))


def incomplete_case(platform, r, m):
    platform.enqueue(m, f"p-{m}", complete=False, at=ago(r.incomplete_ttl))


def deleted_case(platform, r, m):
    platform.enqueue(m, f"p-{m}", at=ago(r.deleted_ttl))
    platform.delete(m, at=ago(r.deleted_ttl))


ELIGIBLE = {EXPIRED_BY_COUNTER: counter_case, EXPIRED_BY_DATE: date_case, INCOMPLETE: incomplete_case,
            DELETED: deleted_case}
REVIVE = {
    EXPIRED_BY_COUNTER: lambda platform, m: platform.set_counter(m, 3),
    EXPIRED_BY_DATE: lambda platform, m: platform.set_extract_until(m, datetime.now(timezone.utc) + timedelta(days=1)),
    INCOMPLETE: lambda platform, m: platform.upload_complete(m),
}


@pytest.mark.parametrize("rule", list(ELIGIBLE))
def test_an_eligible_row_is_deleted_once(platform, deleter, config, rule):
    m = new_id()
    ELIGIBLE[rule](platform, mailbox(config), m)
    purge, control = deleter
    outcomes = purge_message_all(purge, m, rule, payload_id=f"p-{m}")
    outcome = own(outcomes)
    assert outcome.status == PURGED and platform.row(m) is None
    # Its payload_refs row, deleted after it, recorded beside it.
    assert [(o.status, o.kind, o.id) for o in outcomes if o.kind] == [(PURGED, "payload_refs", key_id([f"p-{m}", m]))]
    # Its payload, referred to by no other message, is released.
    assert [(event, payload) for event, payload, *_ in control.reports if payload == f"p-{m}"] == \
        [("payload_released", f"p-{m}")]
    # A later batch finds the row gone: the purger's own deletion, recorded again from its intent under the
    # batch that meant it (the same record, which the ledger keeps once).
    again = purge_message(purge, m, rule, payload_id=f"p-{m}", batch="q/2")
    assert (again.status, category(again.reason), again.intent) == (PURGED, EARLIER_ATTEMPT, "q/1")


@pytest.mark.parametrize("rule", list(REVIVE))
def test_a_row_revived_after_the_streams_decision_is_kept(platform, deleter, config, rule):
    m = new_id()
    ELIGIBLE[rule](platform, mailbox(config), m)
    REVIVE[rule](platform, m)  # lands after the stream decided, before the delete
    purge, control = deleter
    outcome = purge_message(purge, m, rule, payload_id=f"p-{m}")
    assert outcome.status == SKIPPED and platform.row(m) is not None
    assert all(at_ms > time.time() * 1000 for kind, object_id, _, at_ms in control.rechecks if object_id == m), outcome


def test_a_row_not_yet_due_by_the_wall_clock_is_kept_and_says_when(platform, deleter, config):
    m = new_id()
    platform.enqueue(m, f"p-{m}")
    platform.dequeue(m, 0)  # zero just now: expired_ttl has not passed
    purge, control = deleter
    outcome = purge_message(purge, m, EXPIRED_BY_COUNTER, payload_id=f"p-{m}")
    assert outcome.status == SKIPPED and outcome.reason.startswith("not yet due: expired_by_counter")
    expected = platform.row(m)["updated_at"].replace(tzinfo=timezone.utc) + mailbox(config).expired_ttl
    assert [r for r in control.rechecks if r[1] == m] == \
        [("message", m, EXPIRED_BY_COUNTER, int(expected.timestamp() * 1000))]


def test_the_stream_not_knowing_the_payload_asks_the_row(platform, deleter, config):
    m = new_id()
    counter_case(platform, mailbox(config), m)
    purge, control = deleter
    assert purge_message(purge, m, EXPIRED_BY_COUNTER, payload_id=None).status == PURGED
    assert platform.session.execute(f"SELECT * FROM {mailbox(config).payload_refs_table} WHERE payload_id = %s",
                                    (f"p-{m}",)).one() is None
    assert [payload for _, payload, *_ in control.reports if payload == f"p-{m}"] == [f"p-{m}"]


def test_a_message_without_updated_at_is_dated_by_its_write_time_and_a_writer_in_between_keeps_it(
        platform, deleter, config):
    """SPEC 8.1 at delete time: rows another writer inserted without updated_at, counter 0, at a write time the test
    gives. Written a day ago: deleted (by the undated condition). Written now: kept, its recheck at that write time
    plus the period, not due at once. Written a day ago, then updated by a platform writer (updated_at set, counter
    still 0) between the purge's read and its delete: not deleted."""
    r = mailbox(config)
    purge, control = deleter
    due, young, raced = new_id(), new_id(), new_id()
    day_ago, now_micros = int((time.time() - 86_400) * 1e6), int(time.time() * 1e6)
    for m, written in ((due, day_ago), (young, now_micros), (raced, day_ago)):
        platform.session.execute(
            f"INSERT INTO {r.messages_table} (message_id, mailbox, payload_id, payload_size, extract_count, complete, "
            f"deleted) VALUES (%s, 'inbox', %s, 10, 0, true, false) USING TIMESTAMP {written}", (m, f"p-{m}"))

    assert purge_message(purge, due, EXPIRED_BY_COUNTER, payload_id=f"p-{due}").status == PURGED
    assert platform.row(due) is None

    kept = purge_message(purge, young, EXPIRED_BY_COUNTER, payload_id=f"p-{young}")
    assert kept.status == SKIPPED and kept.reason.startswith("not yet due: expired_by_counter")
    assert [c for c in control.rechecks if c[1] == young] == [
        ("message", young, EXPIRED_BY_COUNTER, now_micros // 1000 + int(r.expired_ttl.total_seconds() * 1000))]
    assert platform.row(young) is not None

    read = purge.read

    def read_then_a_platform_write(candidate: Candidate, serial: bool = False):
        found = read(candidate, serial)
        if found is not None and found["updated_at"] is None:
            platform.set_counter(raced, 0)
        return found

    with mock.patch.object(purge, "read", read_then_a_platform_write):
        outcome = purge_message(purge, raced, EXPIRED_BY_COUNTER, payload_id=f"p-{raced}")
    assert outcome.status == SKIPPED
    assert platform.row(raced)["updated_at"] is not None and platform.row(raced)["extract_count"] == 0


def test_a_dry_run_decides_as_a_real_run_and_deletes_nothing_nor_rechecks(platform, config):
    """The engine's protocol, the same for every policy: would_delete with what would follow, no recheck."""
    session = cassandra_session(config.cassandra)
    try:
        dry, control = message_purge(session, config, dry_run=True)
        due, later = new_id(), new_id()
        counter_case(platform, mailbox(config), due)
        platform.enqueue(later, f"p-{later}")
        platform.dequeue(later, 0)
        outcome = purge_message(dry, due, EXPIRED_BY_COUNTER, payload_id=f"p-{due}")
        assert (outcome.status, outcome.reason) == (
            WOULD_DELETE, f"due: {EXPIRED_BY_COUNTER}; payload p-{due} would be released")
        kept = purge_message(dry, later, EXPIRED_BY_COUNTER, payload_id=f"p-{later}")
        assert kept.status == SKIPPED and kept.reason.startswith("not yet due: ")
        assert platform.row(due) is not None and platform.row(later) is not None
        assert control.rechecks == [] and control.reports == []
    finally:
        session.cluster.shutdown()


def test_a_decision_not_to_delete_takes_no_paxos_round_a_deleted_message_one_and_a_deleted_payload_two(
        platform, config):
    """Counted by the driver's own hook: a lightweight transaction or a serial read is a Paxos round. A payload
    in two data centres: its claim and its row's delete, none for the blobs' progress when both go."""
    session = cassandra_session(config.cassandra)
    counts = RequestCounts.attach(session)
    try:
        messages, _ = message_purge(session, config)
        payloads = config.policy_set.policy_of("message").purges(messages.resources)["payload"]
        r = mailbox(config)
        due, later, live = new_id(), new_id(), new_id()
        counter_case(platform, r, due)
        platform.enqueue(later, f"p-{later}", extract_count=0)
        platform.enqueue(live, f"p-{live}", extract_count=1, at=ago(r.expired_ttl))
        counts.taken()

        def decided(purge, kind, object_id, rule, hint):
            outcome = own(purge.purge(Candidate(kind, object_id, rule, now_ms(), hint), Attempt()))
            taken = counts.taken()
            return outcome.status, sum(taken[k] for k in PAXOS_ROUNDS)

        # Found gone again after its purge: recorded from the purger's intent, with no Paxos round either.
        for m, expected in ((due, (PURGED, 1)), (due, (PURGED, 0)), (later, (SKIPPED, 0)), (live, (SKIPPED, 0))):
            assert decided(messages, "message", m, EXPIRED_BY_COUNTER, {"payload_id": f"p-{m}"}) == expected, m
        assert decided(payloads, "payload", f"p-{live}", PAYLOAD, {}) == (SKIPPED, 0)  # referenced
        assert decided(payloads, "payload", new_id("pay"), PAYLOAD, {}) == (ALREADY_GONE, 0)
        unreferenced = unreferenced_payload(platform, config)
        counts.taken()
        assert decided(payloads, "payload", unreferenced, PAYLOAD, {}) == (PURGED, 2)
        assert platform.payload_gone(unreferenced)
    finally:
        counts.detach()
        session.cluster.shutdown()


def test_a_partition_run_again_in_its_batch_records_what_the_first_run_deleted(platform, config):
    """However Spark runs a partition again (a task, a stage or the batch retried), the second run records the
    message the first deleted from its intent, as the same record; so does a later batch."""
    m = new_id()
    counter_case(platform, mailbox(config), m)
    query = new_id("query")
    runs = [[(o[1], o[5], o[6]) for o in purge_partition([candidate("message", m, EXPIRED_BY_COUNTER,
                                                                    payload_id=f"p-{m}")], config, 7, query_id=query)]
            for _ in range(2)]
    assert [[(kind, status, why and category(why)) for kind, status, why in run] for run in runs] == [
        [("message", PURGED, None), ("payload_refs", PURGED, None)],
        [("payload_refs", PURGED, EARLIER_ATTEMPT), ("message", PURGED, EARLIER_ATTEMPT)]]
    later = to_ledger(purge_partition([candidate("message", m, EXPIRED_BY_COUNTER, payload_id=f"p-{m}")], config, 8,
                                      query_id=query))
    assert [(o[1], o[5], o[-1]) for o in later] == [("payload_refs", PURGED, f"{query}/7"),
                                                    ("message", PURGED, f"{query}/7")]


def test_payload_blobs_go_from_every_data_centre(platform, config):
    m = new_id()
    platform.enqueue(m, f"p-{m}", dcs=("dc1", "dc2"))
    assert platform.blob_exists(f"p-{m}", "dc1") and platform.blob_exists(f"p-{m}", "dc2")
    stores = ObjectStores(config.stores)
    assert stores.delete(payload_key(f"p-{m}"), ["dc1", "dc2"]) == {"dc1": None, "dc2": None}
    assert not platform.blob_exists(f"p-{m}", "dc1") and not platform.blob_exists(f"p-{m}", "dc2")
    # Deleting again is harmless; an unknown data centre is reported, not raised.
    errors = stores.delete(payload_key(f"p-{m}"), ["dc1", "dc9"])
    assert errors["dc1"] is None and "dc9" in errors["dc9"]


def test_a_payload_found_gone_is_the_purgers_deletion_only_with_its_intent(platform, config):
    """The platform removed the row itself, leaving the blobs: already gone, nothing recorded as purged, and the
    blobs left to the orphan sweep (which records what it deletes). A payload the purger meant to delete, found
    gone with its blobs left (another writer removed the row after the intent): the blobs deleted again, and
    every deletion of the intent recorded, under the batch that meant it."""
    table = mailbox(config).payloads_table
    p = unreferenced_payload(platform, config)
    platform.session.execute(f"DELETE FROM {table} WHERE payload_id = %s", (p,))
    [outcome] = purge(config, candidate("payload", p, PAYLOAD))
    assert outcome["status"] == ALREADY_GONE
    assert platform.blob_exists(p, "dc1") and platform.blob_exists(p, "dc2")

    meant = unreferenced_payload(platform, config)
    journal = CassandraJournal(platform.session, config.cassandra.keyspace, config.cassandra.journal_table)
    journal.intend("payload", meant, {Dependent("payload", meant, print, dc).key: "q/1" for dc in ("dc1", "dc2")}
                   | {SELF: "q/1"})
    platform.session.execute(f"DELETE FROM {table} WHERE payload_id = %s", (meant,))
    outcomes = purge(config, candidate("payload", meant, PAYLOAD))
    assert [(o["dc"], o["status"], category(o["reason"]), o["intent"]) for o in outcomes] == [
        ("dc1", PURGED, EARLIER_ATTEMPT, "q/1"), ("dc2", PURGED, EARLIER_ATTEMPT, "q/1"),
        (None, PURGED, EARLIER_ATTEMPT, "q/1")]
    assert platform.payload_gone(meant)


# --- the payload protocol, through the sink's own code --------------------------------------

def test_a_purged_message_releases_its_payload_only_when_no_other_refers_to_it(platform, config):
    r = mailbox(config)
    first, second, p = new_id(), new_id(), new_id("pay")
    platform.enqueue(first, p, at=ago(r.expired_ttl))
    assert platform.enqueue(second, p, shared=True, at=ago(r.expired_ttl)) == p
    for m in (first, second):
        platform.dequeue(m, 0, at=ago(r.expired_ttl))
    purge(config, candidate("message", first, EXPIRED_BY_COUNTER, payload_id=p))
    assert platform.references(p) == {second} and platform.payload_row(p)["state"] == "live"
    purge(config, candidate("message", second, EXPIRED_BY_COUNTER, payload_id=p))
    assert platform.references(p) == set()
    outcomes = purge(config, candidate("payload", p, PAYLOAD))
    assert [(o["dc"], o["status"]) for o in outcomes] == [("dc1", PURGED), ("dc2", PURGED), (None, PURGED)]
    assert platform.payload_row(p) is None
    assert not platform.blob_exists(p, "dc1") and not platform.blob_exists(p, "dc2")


def test_a_referenced_or_recently_linked_payload_is_kept(platform, config):
    referenced = unreferenced_payload(platform, config)
    platform.session.execute(
        f"INSERT INTO {mailbox(config).payload_refs_table} (payload_id, message_id) VALUES (%s, 'someone')",
        (referenced,))
    [outcome] = purge(config, candidate("payload", referenced, PAYLOAD))
    assert (outcome["status"], outcome["reason"]) == (SKIPPED, "referenced: by message someone")

    recent = new_id("pay")
    platform.enqueue(new_id("msg"), recent)
    platform.session.execute(f"DELETE FROM {mailbox(config).payload_refs_table} WHERE payload_id = %s", (recent,))
    [outcome] = purge(config, candidate("payload", recent, PAYLOAD))
    assert (outcome["status"], outcome["reason"]) == (SKIPPED, "recently linked: within payload_grace")
    for p in (referenced, recent):
        assert platform.payload_row(p)["state"] == "live" and platform.blob_exists(p, "dc1")


def test_one_data_centre_failing_does_not_hold_the_others_back(platform, config, dc2_proxy):
    p = unreferenced_payload(platform, config)
    dc2_proxy.cut()
    try:
        outcomes = purge(config, candidate("payload", p, PAYLOAD))
    finally:
        dc2_proxy.restore()
    assert [(o["dc"], o["status"]) for o in outcomes] == [("dc1", PURGED), ("dc2", ERROR)]
    # dc1's progress is kept in the row, in the one write dc2's failure calls for; writers can no longer link to it.
    row = platform.payload_row(p)
    assert row["state"] == DELETING and row["dcs"] == {"dc2"}
    assert not platform.blob_exists(p, "dc1") and platform.blob_exists(p, "dc2")
    # The retry, a batch of its own, finishes dc2 only, then the row; dc1's deletion is recorded again from the
    # intent, under the first batch: the same record, which the ledger keeps once.
    outcomes = purge(config, candidate("payload", p, PAYLOAD))
    assert [(o["dc"], o["status"], o["intent"] is not None) for o in outcomes] == [
        ("dc1", PURGED, True), ("dc2", PURGED, False), (None, PURGED, False)]
    assert platform.payload_row(p) is None and not platform.blob_exists(p, "dc2")
    assert {o["status"] for o in purge(config, candidate("payload", p, PAYLOAD))} == {PURGED}  # from the intent


def test_writers_linking_to_payloads_being_purged_never_lose_a_referenced_payload(platform, config):
    """Writers follow the contract (link, then touch IF live; on failure store a new payload) while the
    purger purges the same payloads. Every payload a writer linked to must keep its row and blobs."""
    payloads = [unreferenced_payload(platform, config) for _ in range(40)]
    linked: dict[str, list[str]] = {}
    lost_races = []
    stop = threading.Event()

    def writer(seed):
        chooser = random.Random(seed)
        while not stop.is_set():
            p = chooser.choice(payloads)
            m = new_id("w")
            if platform.link(m, p):
                linked.setdefault(p, []).append(m)
            else:
                lost_races.append(p)

    def purger():
        for p in random.sample(payloads, len(payloads)):
            purge(config, candidate("payload", p, PAYLOAD))
            time.sleep(random.random() * 0.05)

    writers = [threading.Thread(target=writer, args=(seed,)) for seed in range(3)]
    for thread in writers:
        thread.start()
    purgers = [threading.Thread(target=purger) for _ in range(2)]
    for thread in purgers:
        thread.start()
    for thread in purgers:
        thread.join()
    stop.set()
    for thread in writers:
        thread.join()

    wrongly_deleted = [p for p in linked if not platform.payload_intact(p)]
    purged = [p for p in payloads if platform.payload_row(p) is None]
    print(f"links: {sum(map(len, linked.values()))} to {len(linked)} payloads, lost races: {len(lost_races)}, "
          f"payloads purged: {len(purged)}, referenced payloads deleted: {len(wrongly_deleted)}")
    assert wrongly_deleted == []
    # The race was real: some payloads were purged, some linked first, and nothing referenced was both.
    assert purged and linked and not set(purged) & set(linked)
    for p in purged:
        assert platform.payload_gone(p)


def test_a_purge_that_keeps_failing_is_tried_later_each_time_and_its_error_recorded_once_a_day(platform, config):
    """SPEC 10.4 on the real servers: a payload naming a data centre no store is configured for fails at every
    attempt. Its blobs in the stores there go at the first; its error is a ledger row the first time only; the
    failures table counts the attempts, and lists it among the objects failing."""
    p = unreferenced_payload(platform, config)
    platform.session.execute(f"UPDATE {mailbox(config).payloads_table} SET dcs = dcs + {{'dc3'}} "
                             "WHERE payload_id = %s", (p,))
    attempts = [purge(config, candidate("payload", p, PAYLOAD, dcs=("dc1", "dc2", "dc3"))) for _ in range(3)]
    errors = [[(row["dc"], category(row["reason"])) for row in rows if row["status"] == ERROR] for rows in attempts]
    assert errors == [[("dc3", "no object store configured for data centre 'dc3'")], [], []], errors
    assert not platform.blob_exists(p, "dc1") and not platform.blob_exists(p, "dc2")
    assert platform.payload_row(p)["dcs"] == {"dc3"}
    failures = CassandraFailures.of(platform.session, config)
    [stuck] = [each for each in failures.stuck(now_ms(), longer_than_ms=-1) if each.id == p]
    assert stuck.kind == "payload" and stuck.failures == 3 and "dc3" in stuck.error
