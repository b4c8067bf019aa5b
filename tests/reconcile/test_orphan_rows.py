"""Dependent rows whose parent row is gone (SPEC 8.1; ``reconcile.orphans``, ``OrphanRowPurge``) against the real
Cassandra: found by a reconcile's scan, re-checked against the parent at the serial consistency just before the
delete, deleted once older than ``orphan_grace`` and recorded once in the ledger; young ones, ones whose parent
is there, and ones whose parent reappears are kept.

The test has a keyspace of its own, so what it counts is exactly what it wrote. An old row is written with an
old write time (``USING TIMESTAMP``); a ``payload_refs`` row has no regular column, so its age is when a reconcile
first found it without its message: a second reconcile past the grace deletes it. The oracle is Cassandra's
rows and the ledger's records, against what the test wrote.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import timedelta

import pytest

from devstack.stack import prepare
from purger.config import with_policies
from purger.connectors import cassandra_session
from purger.core.settings import ReconcileConfig
from purger.testing import injected
from purger.core.policy import key_id
from purger.core.vocabulary import NOT_YET_DUE, ORPHAN, PRESENT, PURGED, SKIPPED, WOULD_DELETE, category
from purger.reconcile.run import reconcile
from purger.sinks.journal import CassandraJournal
from purger.sinks.ledger import Ledger
from purger.core.vocabulary import ALL_DCS
from purger.reconcile.orphan_purges import FIRST_FOUND, Sweep, decide, ledger_query_id, orphan_purge
from purger.reconcile.orphans import reconcile_orphan_rows
from purger.core.times import duration_ms, now_ms, parse_timestamp
from purger.policies.mailbox.state import RELEASED
from simulation.policy_objects import SETTINGS
from tests.support.configs import own_config
from tests.support.faults import FAULTS, Stopped, stop_at

pytestmark = pytest.mark.integration

GRACE = timedelta(seconds=3)
LONG_AGO_US = int((time.time() - 3600) * 1_000_000)  # an hour ago: older than the grace
# A writer in progress: written within the grace whenever the test's reconciles run (the write time is the writer's).
YOUNG = f"USING TIMESTAMP {int((time.time() + 3600) * 1_000_000)}"


@pytest.fixture(scope="module")
def orphaned(config, tmp_path_factory):
    """A configuration with a keyspace, topics, buckets, checkpoint and ledger of its own, every policy enabled,
    a grace of seconds; and a session on that keyspace. The keyspace is dropped at the end."""
    run = uuid.uuid4().hex[:8]
    own = own_config(config, tmp_path_factory.mktemp("orphan-rows"), "orphan-rows")
    # Buckets of its own too: a reconcile of the mailbox sweeps them for orphan blobs of its keyspace.
    stores = {dc: store.model_copy(update={"bucket": f"orphan-rows-{run}-{dc}"}) for dc, store in own.stores.items()}
    own = own.model_copy(update={
        "cassandra": own.cassandra.model_copy(update={"keyspace": f"orphan_rows_{run}"}), "stores": stores,
        "reconcile": ReconcileConfig(orphan_grace=GRACE, orphan_grace_check=False),
    })
    own = with_policies(own, {**own.policies, **SETTINGS})
    prepare(own, partitions=1)
    keyspace = own.cassandra.keyspace
    session = cassandra_session(own.cassandra, keyspace)
    yield own, session
    session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
    session.cluster.shutdown()


def records(spark, config, table: str) -> dict[str, list[str]]:
    """The ledger's statuses of ``table``'s orphan rows, by row id."""
    found: dict[str, list[str]] = {}
    for record in Ledger(spark, config.ledger).records().where(f"kind = '{table}' AND rule = '{ORPHAN}'").collect():
        found.setdefault(record["id"], []).append(record["status"])
    return found


def released(config, payload_id: str) -> list[int]:
    """When the reconcile topic's releases of ``payload_id`` say it was released (epoch ms)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=config.kafka.bootstrap_servers, consumer_timeout_ms=2000)
    try:
        topic = config.kafka.reconcile_topic
        consumer.assign([TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()])
        consumer.seek_to_beginning()
        events = [json.loads(record.value) for record in consumer]
    finally:
        consumer.close()
    return [parse_timestamp(event["event_time"]) for event in events
            if event["type"] == RELEASED and event.get("payload_id") == payload_id]


def test_dependent_rows_without_their_parent_are_deleted_once_old_and_recorded_once(spark, orphaned):
    own, session = orphaned
    uid = uuid.uuid4().hex[:6]
    old = f"USING TIMESTAMP {LONG_AGO_US}"
    # users: an old virtual root and old permissions of a user whose row is gone; the same of a user whose row is
    # there; a young virtual root of a user not written yet (a writer in progress).
    session.execute(f"INSERT INTO users (user_id, state, updated_at) VALUES ('kept-{uid}', 'live', toTimestamp(now()))")
    for user in (f"gone-{uid}", f"kept-{uid}"):
        session.execute(f"INSERT INTO virtual_roots (user_id, mailbox) VALUES ('{user}', 'inbox') {old}")
        session.execute(f"INSERT INTO mailbox_permissions (user_id, mailbox, permissions) "
                        f"VALUES ('{user}', 'inbox', {{'read'}}) {old}")
    session.execute(f"INSERT INTO virtual_roots (user_id, mailbox) VALUES ('young-{uid}', 'inbox') {YOUNG}")
    # units of work: two old objects of a unit whose row is gone, one of a unit that is there, a young one.
    session.execute(f"INSERT INTO units_of_work (unit_of_work_id, journey_type) VALUES ('uow-kept-{uid}', 'PAYMENT')")
    for unit, collection in ((f"uow-gone-{uid}", "MDS"), (f"uow-gone-{uid}", "PDS"), (f"uow-kept-{uid}", "MDS")):
        session.execute(f"INSERT INTO uow_objects (unit_of_work_id, collection, object_id, body) "
                        f"VALUES ('{unit}', '{collection}', 'o1', 0x00) {old}")
    session.execute(f"INSERT INTO uow_objects (unit_of_work_id, collection, object_id, body) "
                    f"VALUES ('uow-young-{uid}', 'MDS', 'o1', 0x00) {YOUNG}")
    # payload_refs: a reference whose message is gone, the only one to its payload (live, last linked an hour ago);
    # a reference whose message is there.
    session.execute(f"INSERT INTO messages (message_id, mailbox, updated_at) VALUES ('m-kept-{uid}', 'inbox', "
                    "toTimestamp(now()))")
    session.execute(f"INSERT INTO payloads (payload_id, size, dcs, state, last_ref_at) VALUES ('p-{uid}', 1, "
                    f"{{'dc1'}}, 'live', {LONG_AGO_US // 1000}) {old}")
    session.execute(f"INSERT INTO payload_refs (payload_id, message_id) VALUES ('p-{uid}', 'm-gone-{uid}') {old}")
    session.execute(f"INSERT INTO payload_refs (payload_id, message_id) VALUES ('p-kept-{uid}', 'm-kept-{uid}') {old}")

    def present(cql: str) -> bool:
        return session.execute(cql).one() is not None

    run = uuid.uuid4().hex[:12]
    rows = {(row.policy, row.table): row for policy in own.policy_set.policies if policy.orphan_rows
            for row in reconcile_orphan_rows(spark, own, policy, run, dry_run=False)}
    assert (rows["users", "virtual_roots"].orphans_found, rows["users", "virtual_roots"].orphans_deleted) == (1, 1)
    assert (rows["users", "mailbox_permissions"].orphans_found,
            rows["users", "mailbox_permissions"].orphans_deleted) == (1, 1)
    assert (rows["units_of_work", "uow_objects"].orphans_found, rows["units_of_work", "uow_objects"].orphans_deleted) \
        == (2, 2)
    # The reference's age is not known yet: found now, kept for the grace.
    assert (rows["mailbox", "payload_refs"].orphans_found, rows["mailbox", "payload_refs"].orphans_deleted) == (1, 0)

    assert not present(f"SELECT * FROM virtual_roots WHERE user_id = 'gone-{uid}'")
    assert not present(f"SELECT * FROM mailbox_permissions WHERE user_id = 'gone-{uid}'")
    assert not present(f"SELECT * FROM users WHERE user_id = 'gone-{uid}'")  # each sweep's claim on it released
    assert not present(f"SELECT * FROM uow_objects WHERE unit_of_work_id = 'uow-gone-{uid}'")
    for kept in (f"SELECT * FROM virtual_roots WHERE user_id = 'kept-{uid}'",
                 f"SELECT * FROM virtual_roots WHERE user_id = 'young-{uid}'",
                 f"SELECT * FROM mailbox_permissions WHERE user_id = 'kept-{uid}'",
                 f"SELECT * FROM uow_objects WHERE unit_of_work_id = 'uow-kept-{uid}'",
                 f"SELECT * FROM uow_objects WHERE unit_of_work_id = 'uow-young-{uid}'",
                 f"SELECT * FROM payload_refs WHERE payload_id = 'p-{uid}' AND message_id = 'm-gone-{uid}'",
                 f"SELECT * FROM payload_refs WHERE payload_id = 'p-kept-{uid}'"):
        assert present(kept), kept

    time.sleep(GRACE.total_seconds() + 0.5)
    # A whole reconcile of the mailbox: its orphan rows first, then its scans.
    second = reconcile(spark, own, ["mailbox"], state_apart=False)  # the state read as `purger reconcile` reads it
    refs = next(row for row in second if row.table == "payload_refs")
    assert (refs.orphans_found, refs.orphans_deleted) == (1, 1)
    assert not present(f"SELECT * FROM payload_refs WHERE payload_id = 'p-{uid}'")
    assert present(f"SELECT * FROM payload_refs WHERE payload_id = 'p-kept-{uid}'")
    # The payload the dangling reference pinned, released by the same run's payloads scan at its last link.
    assert released(own, f"p-{uid}") == [LONG_AGO_US // 1000]
    assert present(f"SELECT * FROM virtual_roots WHERE user_id = 'young-{uid}'")
    assert present(f"SELECT * FROM uow_objects WHERE unit_of_work_id = 'uow-young-{uid}'")

    # One `purged` record per row deleted, whichever run deleted it; the reference's first sighting a `skipped`.
    assert records(spark, own, "virtual_roots") == {f"gone-{uid}": [PURGED]}
    assert records(spark, own, "mailbox_permissions") == {json.dumps([f"gone-{uid}", "inbox"], separators=(",", ":")):
                                                          [PURGED]}
    assert records(spark, own, "uow_objects") == {
        json.dumps([f"uow-gone-{uid}", collection, "o1"], separators=(",", ":")): [PURGED] for collection in ("MDS", "PDS")}
    assert sorted(records(spark, own, "payload_refs")[json.dumps([f"p-{uid}", f"m-gone-{uid}"],
                                                                 separators=(",", ":"))]) == [PURGED, SKIPPED]


def old_root_swept(orphaned, user: str) -> Sweep:
    """A virtual root of ``user`` written an hour ago without its user, and a real sweep of ``virtual_roots``."""
    own, session = orphaned
    policy = own.policy_set.policy_of("user")
    session.execute(f"INSERT INTO virtual_roots (user_id, mailbox) VALUES ('{user}', 'old-inbox') "
                    f"USING TIMESTAMP {LONG_AGO_US}")
    grace_ms = duration_ms(GRACE)
    return Sweep(policy.name, policy.orphan_rows[0], "virtual_roots", None, grace_ms, now_ms() - grace_ms, False,
                 ledger_query_id(uuid.uuid4().hex[:12], policy.name, "virtual_roots", ALL_DCS),
                 tuple(sorted(policy.table_names().items())))


def test_a_parent_that_reappears_before_the_delete_keeps_its_dependent(spark, orphaned):
    own, session = orphaned
    user = f"back-{uuid.uuid4().hex[:6]}"
    sweep = old_root_swept(orphaned, user)
    # The scan found it without its user; the user is written back before the decision.
    session.execute(f"INSERT INTO users (user_id, state, updated_at) VALUES ('{user}', 'live', toTimestamp(now()))")
    decided = decide(own, sweep, user, LONG_AGO_US // 1000, None)
    status, why = decided[5], decided[6]
    assert (status, category(why)) == (SKIPPED, PRESENT)
    assert session.execute(f"SELECT * FROM virtual_roots WHERE user_id = '{user}'").one() is not None


# The moments after the sweep read the user absent: before its claim, the writer's add wins (the claim fails);
# after it, the writer waits for the sweep's end. The decision each way.
ADDED_BACK = {"before_virtual_roots_claim": SKIPPED, "before_virtual_roots_delete": PURGED}


@pytest.mark.parametrize("moment", sorted(ADDED_BACK))
def test_a_user_added_back_during_the_decision_keeps_the_root_its_writer_wrote(orphaned, moment):
    """A user id used again: the writer of the contract adds the user (``IF NOT EXISTS``) and then writes its new
    virtual root, starting at ``moment``, after the sweep read the parent absent. The oracle is the writer's own
    lightweight transaction (it applied, at once or once the sweep released its claim) and the root it wrote,
    which must be there at the end; with ``DELETE ... IF EXISTS`` alone the sweep deleted the new root."""
    from simulation.users import UsersPlatform

    own, session = orphaned
    user = f"again-{uuid.uuid4().hex[:6]}"
    sweep = old_root_swept(orphaned, user)  # virtual_roots, claimed through users.state
    platform = UsersPlatform(own.kafka, own.cassandra, own.kafka.topics[0], own.cassandra.keyspace,
                             own.policy_set.policy_of("user").settings)
    added = threading.Event()
    writer = threading.Thread(target=lambda: (platform.add_user(user, "dc1", mailboxes=("new-inbox",)), added.set()))

    def writer_lands(name: str) -> None:
        if name == moment and not writer.is_alive() and not added.is_set():
            writer.start()
            added.wait(2)  # at once, unless the sweep's claim holds the user: then it waits for the release

    try:
        with injected(writer_lands):
            decided = decide(own, sweep, user, LONG_AGO_US // 1000, None)
        orphan_purge(own, sweep).release_claims(sweep.query_id)
        if writer.ident is not None:
            writer.join(30)
        assert added.is_set(), f"the sweep never reached {moment}, or the writer's add never applied"
        assert platform.rows(user)["virtual_root"] == "new-inbox", decided
        assert decided[5] == ADDED_BACK[moment], decided
        assert session.execute(f"SELECT state FROM users WHERE user_id = '{user}'").one().state == "live"
    finally:
        platform.close()


def test_a_dry_run_finds_orphan_rows_and_deletes_none(spark, orphaned):
    own, session = orphaned
    policy = own.policy_set.policy_of("unit_of_work")
    unit = f"uow-dry-{uuid.uuid4().hex[:6]}"
    session.execute(f"INSERT INTO uow_objects (unit_of_work_id, collection, object_id, body) "
                    f"VALUES ('{unit}', 'MDS', 'o1', 0x00) USING TIMESTAMP {LONG_AGO_US}")
    [row] = reconcile_orphan_rows(spark, own, policy, uuid.uuid4().hex[:12], dry_run=True)
    assert (row.orphans_found, row.orphans_deleted, row.dry_run) == (1, 1, True)
    assert session.execute(f"SELECT * FROM uow_objects WHERE unit_of_work_id = '{unit}'").one() is not None
    assert records(spark, own, "uow_objects").get(json.dumps([unit, "MDS", "o1"], separators=(",", ":"))) \
        == [WOULD_DELETE]


def test_a_dry_run_neither_writes_nor_clears_the_real_sweeps_first_found_notes(orphaned):
    """A ``payload_refs`` row's age is when a real sweep first found it without its message, noted in the journal
    the dry runs share. A dry run before the real sweep notes nothing; one that finds the message back clears
    nothing: the real sweep deletes the row a grace after its own first sighting, as it would without them."""
    own, session = orphaned
    policy = own.policy_set.policy_of("message")
    [orphans] = policy.orphan_rows  # payload_refs, aged from its first sighting
    names = tuple(sorted(policy.table_names().items()))
    grace_ms = duration_ms(GRACE)

    def sweep(dry_run: bool) -> Sweep:
        return Sweep(policy.name, orphans, dict(names)[orphans.table], None, grace_ms, now_ms() - grace_ms, dry_run,
                     ledger_query_id(uuid.uuid4().hex[:12], policy.name, orphans.table, ALL_DCS), names)

    uid = uuid.uuid4().hex[:6]
    payload, message = f"p-noted-{uid}", f"m-noted-{uid}"
    ref = key_id([payload, message])
    session.execute(f"INSERT INTO payload_refs (payload_id, message_id) VALUES ('{payload}', '{message}') "
                    f"USING TIMESTAMP {LONG_AGO_US}")
    journal = CassandraJournal(session, own.cassandra.keyspace, own.cassandra.journal_table)

    def first_found() -> set[str]:
        return journal.noted(FIRST_FOUND, f"{dict(names)[orphans.table]}/{ref}")

    def decided(dry_run: bool) -> tuple[str, str | None]:
        outcome = decide(own, sweep(dry_run), ref, None, None)
        return outcome[5], outcome[6] and category(outcome[6])

    assert decided(dry_run=True) == (SKIPPED, NOT_YET_DUE)
    assert first_found() == set()  # the dry run's sighting is no real one
    assert decided(dry_run=False) == (SKIPPED, NOT_YET_DUE)
    noted = first_found()
    assert len(noted) == 1

    session.execute(f"INSERT INTO messages (message_id, mailbox, updated_at) VALUES ('{message}', 'inbox', "
                    "toTimestamp(now()))")
    assert decided(dry_run=True) == (SKIPPED, PRESENT)
    assert first_found() == noted  # the real sweep's note stays
    session.execute(f"DELETE FROM messages WHERE message_id = '{message}'")

    time.sleep(max(0.0, (int(min(noted)) + grace_ms - now_ms()) / 1000) + 0.5)
    assert decided(dry_run=False) == (PURGED, None)
    assert session.execute(f"SELECT * FROM payload_refs WHERE payload_id = '{payload}'").one() is None


# What a stopped sweep leaves, per policy: a unit of work's objects (no claim), a user's root (under the sweep's
# claim on the absent user, which the next sweep releases). The rows written, the table, and the ids recorded.
STOPPED = {
    "unit_of_work": ("uow_objects", [("INSERT INTO uow_objects (unit_of_work_id, collection, object_id, body) "
                                      "VALUES ('{id}', '{c}', 'o1', 0x00)", c) for c in ("MDS", "PDS")]),
    "user": ("virtual_roots", [("INSERT INTO virtual_roots (user_id, mailbox) VALUES ('{id}', 'inbox')", None)]),
}


# A root kind a run in CI, in turn by the fault matrix's seed; each under `make faults-full`.
@pytest.mark.parametrize("kind", FAULTS.cases(sorted(STOPPED), sorted(STOPPED), 1))
def test_a_sweep_of_orphan_rows_stopped_before_its_ledger_write_is_recorded_by_the_next(spark, orphaned, kind):
    """Its rows are deleted and its records lost with it; the next sweep of the table records each deletion once,
    under the stopped sweep (compared with the rows the test wrote and finds gone), and releases its claims: a
    user it claimed can be added again."""
    own, session = orphaned
    policy = own.policy_set.policy_of(kind)
    table, inserts = STOPPED[kind]
    object_id = f"stopped-{uuid.uuid4().hex[:6]}"
    for insert, collection in inserts:
        session.execute(insert.format(id=object_id, c=collection) + f" USING TIMESTAMP {LONG_AGO_US}")
    ids = [json.dumps([object_id, collection, "o1"], separators=(",", ":")) if collection else object_id
           for _, collection in inserts]

    stopped = uuid.uuid4().hex[:12]
    with injected(stop_at("before_orphan_ledger_write")), pytest.raises(Stopped):
        reconcile_orphan_rows(spark, own, policy, stopped, dry_run=False)
    key = policy.orphan_rows[0].parent_key
    assert session.execute(f"SELECT * FROM {table} WHERE {key} = '{object_id}'").one() is None
    assert not any(found in records(spark, own, table) for found in ids)
    claims = [row.state for row in session.execute(f"SELECT state FROM users WHERE user_id = '{object_id}'")]
    assert claims == ([f"orphan sweep {ledger_query_id(stopped, 'users', table, ALL_DCS)}"] if kind == "user" else [])
    for _ in range(2):  # the second run has nothing left to record
        reconcile_orphan_rows(spark, own, policy, uuid.uuid4().hex[:12], dry_run=False)
    recorded = Ledger(spark, own.ledger).records().where(f"kind = '{table}' AND id LIKE '%{object_id}%'").collect()
    assert sorted((r.id, r.status, r.query_id) for r in recorded) == [
        (found, PURGED, ledger_query_id(stopped, policy.name, table, ALL_DCS)) for found in ids]
    assert session.execute(f"SELECT * FROM users WHERE user_id = '{object_id}'").one() is None