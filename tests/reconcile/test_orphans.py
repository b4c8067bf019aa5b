"""Orphan blobs (reconcile.orphans) against the real Cassandra and S3: listed, anti-joined with the payloads rows,
re-checked just before the delete, and recorded in the ledger once.

Each test has buckets of its own (one per data centre), so what it counts is exactly what it wrote; the
payloads table is the shared one, with ids of the test's own. LastModified is the store's clock, so an old
blob is made by waiting past a short ``orphan_grace`` (``orphan_grace_check = false``).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from purger.connectors import cassandra_session, s3_client
from purger.core.settings import LedgerConfig, ReconcileConfig
from purger.testing import injected
from purger.core.purge_protocol import SELF
from purger.core.times import duration_ms, epoch_ms, now_ms
from purger.core.vocabulary import (
    ALREADY_GONE, EARLIER_ATTEMPT, NOT_YET_DUE, ORPHAN, PRESENT, PURGED, SKIPPED, WOULD_DELETE, category,
)
from purger.sinks.ledger import Ledger
from purger.sinks.clients import executor_session
from purger.sinks.journal import CassandraJournal
from purger.reconcile.orphan_listing import MAX_CHARACTER, list_shard
from purger.reconcile.orphan_purges import Sweep, decide, ledger_query_id
from purger.reconcile.orphans import reconcile_orphans
from purger.reconcile.sweeps import SWEEP_LEASES
from devstack.stack import create_schema
from purger.running import RECONCILE_JOB_GROUP, start_purger
from tests.support.configs import own_config
from tests.support.faults import FAULTS, Stopped, stop_at
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration

GRACE = timedelta(seconds=4)
PREFIX = "payloads/"


@pytest.fixture(scope="module")
def payloads(config):
    """Write and remove rows of the payloads table; removes what it wrote at the end."""
    session = cassandra_session(config.cassandra, config.cassandra.keyspace)
    table = config.policy_set.policy_of("payload").settings.payloads_table
    insert = session.prepare(f"INSERT INTO {table} (payload_id, size, dcs, state, last_ref_at, created_at) "
                             "VALUES (?, 1, {'dc1', 'dc2'}, 'live', ?, ?)")
    remove = session.prepare(f"DELETE FROM {table} WHERE payload_id = ?")
    written: list[str] = []

    class Rows:
        def add(self, payload_id: str) -> None:
            at = datetime.now(timezone.utc)
            session.execute(insert, (payload_id, at, at))
            written.append(payload_id)

    yield Rows()
    for payload_id in written:
        session.execute(remove, (payload_id,))
    session.cluster.shutdown()


class Stores:
    """A test's own bucket in each data centre, on the real S3."""

    def __init__(self, config) -> None:
        self.client = s3_client(config.stores["dc1"])
        self.buckets = {dc: f"orphans-{uuid.uuid4().hex[:10]}-{dc}" for dc in ("dc1", "dc2")}
        for bucket in self.buckets.values():
            self.client.create_bucket(Bucket=bucket)

    def put(self, key: str, *dcs: str, body: bytes = b"blob") -> None:
        for dc in dcs or tuple(self.buckets):
            self.client.put_object(Bucket=self.buckets[dc], Key=key, Body=body)

    def exists(self, key: str, dc: str) -> bool:
        listing = self.client.list_objects_v2(Bucket=self.buckets[dc], Prefix=key)
        return any(item["Key"] == key for item in listing.get("Contents", []))

    def head(self, key: str, dc: str) -> dict:
        return self.client.head_object(Bucket=self.buckets[dc], Key=key)

    def keys(self, dc: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.buckets[dc])
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def remove(self) -> None:
        for dc, bucket in self.buckets.items():
            # A filesystem-backed store lists folders as keys ending in "/" (slow to delete); they go with
            # their last key.
            for key in self.keys(dc):
                if not key.endswith("/"):
                    self.client.delete_object(Bucket=bucket, Key=key)
            self.client.delete_bucket(Bucket=bucket)


@pytest.fixture
def stores(config):
    made = Stores(config)
    yield made
    made.remove()


@pytest.fixture
def orphans_config(config, stores, tmp_path):
    """The session's configuration on the test's buckets (both through the direct endpoint), a ledger of the
    test's own and a grace of a few seconds."""
    endpoint = config.stores["dc1"].endpoint
    return config.model_copy(update={
        "stores": {dc: config.stores[dc].model_copy(update={"bucket": bucket, "endpoint": endpoint})
                   for dc, bucket in stores.buckets.items()},
        "reconcile": ReconcileConfig(orphan_grace=GRACE, orphan_grace_check=False),
        "ledger": LedgerConfig(path=str(tmp_path / "records"), report_path=str(tmp_path / "report"),
                               reconcile_path=str(tmp_path / "reconcile")),
    })


def mailbox_policy(config):
    return config.policy_set.policy_of("payload")


def past_grace() -> None:
    """Wait until what was written so far is older than the grace (LastModified counts whole seconds)."""
    time.sleep(GRACE.total_seconds() + 1.5)


def records(spark, config, query_id: str | None = None) -> list:
    ledger = Ledger(spark, config.ledger)
    if not ledger.exists():
        return []
    found = ledger.records()
    if query_id is not None:
        found = found.where(found.query_id == query_id)
    return found.collect()


def test_old_orphans_are_deleted_in_each_data_centre_and_recorded_and_nothing_else_is(
        spark, orphans_config, stores, payloads):
    uid = uuid.uuid4().hex[:8]
    # Ids whose first characters go to shards of their own (a letter, a capital) and to the catch-all.
    only_dc1, only_dc2, both, nested = f"a{uid}", f"_{uid}", f"é{uid}", f"Z{uid}/part"
    stores.put(PREFIX + only_dc1, "dc1")
    stores.put(PREFIX + only_dc2, "dc2")
    stores.put(PREFIX + both)
    stores.put(PREFIX + nested)
    with_row = f"r{uid}"
    stores.put(PREFIX + with_row)
    payloads.add(with_row)
    outside = [f"other/{uid}", f"payloadsX/{uid}", f"payloads{uid}", f"x{PREFIX}{uid}"]
    for key in outside:
        stores.put(key)
    past_grace()
    young = f"y{uid}"
    stores.put(PREFIX + young, "dc1")
    run_id = uuid.uuid4().hex[:12]

    report = reconcile_orphans(spark, orphans_config, mailbox_policy(orphans_config), run_id, dry_run=False)

    deleted = {(only_dc1, "dc1"), (only_dc2, "dc2"), (both, "dc1"), (both, "dc2"), (nested, "dc1"), (nested, "dc2")}
    for object_id, dc in deleted:
        assert not stores.exists(PREFIX + object_id, dc), (object_id, dc)
    for dc in ("dc1", "dc2"):
        assert stores.exists(PREFIX + with_row, dc)
        for key in outside:
            assert stores.exists(key, dc), key
    assert stores.exists(PREFIX + young, "dc1")

    found = records(spark, orphans_config)
    assert sorted((r.id, r.dc) for r in found) == sorted(deleted)
    for record in found:
        assert (record.policy, record.kind, record.rule, record.status) == ("mailbox", "payload", ORPHAN, PURGED)
        assert record.query_id == ledger_query_id(run_id, "mailbox", "payloads", record.dc)
        assert record.batch_id == 0
        assert record.deleted_at is not None and record.lag_s >= 0
        assert record.eligible_at < record.deleted_at

    by_dc = {row.dc: row for row in report}
    assert sorted(by_dc) == ["dc1", "dc2"]
    for dc, row in by_dc.items():
        assert (row.run_id, row.policy, row.table, row.dry_run) == (run_id, "mailbox", "payloads", False)
        assert row.orphans_found == row.orphans_deleted == 3
        assert row.finished is not None and row.duration_s > 0
    # Under payloads/: dc1 holds the three orphans, the blob with a row and the young one; dc2 no young one.
    assert (by_dc["dc1"].scanned, by_dc["dc2"].scanned) == (5, 4)


def test_a_dry_run_deletes_nothing_and_no_run_records_anything_twice(spark, orphans_config, stores):
    uid = uuid.uuid4().hex[:8]
    orphan = f"d{uid}"
    stores.put(PREFIX + orphan)
    past_grace()
    policy = mailbox_policy(orphans_config)

    dry = uuid.uuid4().hex[:12]
    for _ in range(2):  # the blob is still there for the second run, which must not record it again
        report = reconcile_orphans(spark, orphans_config, policy, dry, dry_run=True)
        assert [(r.dc, r.orphans_found, r.orphans_deleted, r.dry_run) for r in report] == [
            ("dc1", 1, 1, True), ("dc2", 1, 1, True)]
    for dc in ("dc1", "dc2"):
        assert stores.exists(PREFIX + orphan, dc)
    found = records(spark, orphans_config)
    assert sorted((r.id, r.dc, r.status, r.rule) for r in found) == [
        (orphan, "dc1", WOULD_DELETE, ORPHAN), (orphan, "dc2", WOULD_DELETE, ORPHAN)]
    assert all(r.deleted_at is None for r in found)

    real = uuid.uuid4().hex[:12]
    for _ in range(2):
        report = reconcile_orphans(spark, orphans_config, policy, real, dry_run=False)
        assert [(r.dc, r.orphans_found, r.orphans_deleted) for r in report] == [("dc1", 1, 1), ("dc2", 1, 1)]
    for dc in ("dc1", "dc2"):
        assert not stores.exists(PREFIX + orphan, dc)
        assert [(r.id, r.status) for r in records(spark, orphans_config, ledger_query_id(real, "mailbox", "payloads", dc))
                ] == [(orphan, PURGED)]

    # Another run finds nothing left, and records nothing.
    again = uuid.uuid4().hex[:12]
    report = reconcile_orphans(spark, orphans_config, policy, again, dry_run=False)
    assert [(r.orphans_found, r.orphans_deleted) for r in report] == [(0, 0), (0, 0)]
    assert len(records(spark, orphans_config)) == 4


def sweep(config, grace: timedelta = timedelta(0), dry_run: bool = False, dc: str = "dc1") -> Sweep:
    policy = mailbox_policy(config)
    grace_ms = duration_ms(grace)
    return Sweep(policy.name, policy.blobs[0], "payloads", dc, grace_ms, now_ms() - grace_ms, dry_run,
                 f"test-{uuid.uuid4().hex[:8]}")


def listed(stores, object_id: str, dc: str = "dc1") -> tuple[int, str]:
    """The blob as a listing would have seen it: last modified and ETag."""
    head = stores.head(PREFIX + object_id, dc)
    return epoch_ms(head["LastModified"]), head["ETag"]


def outcome(values: tuple) -> dict:
    from purger.sinks.purge import OUTCOME_SCHEMA

    return dict(zip(OUTCOME_SCHEMA.names, values))



@pytest.mark.skipif(not FAULTS.full, reason="the stopped purger's sweep (below) is this recovery in CI: "
                                          "`make faults-full` runs it for a sweep stopped alone")
def test_a_sweep_stopped_before_its_ledger_write_is_recorded_by_the_next(spark, orphans_config, stores):
    """Its blobs are deleted and its records lost with it; the next sweep of the bucket finds the sweep's notes
    and records each of those deletions, once, under the stopped sweep (compared with the blobs the test put
    and finds gone, not with the purger's counts)."""
    uid = uuid.uuid4().hex[:8]
    orphans = [f"s{uid}", f"t{uid}"]
    for orphan in orphans:
        stores.put(PREFIX + orphan, "dc1")
    past_grace()
    policy = mailbox_policy(orphans_config)

    stopped = uuid.uuid4().hex[:12]
    with injected(stop_at("before_orphan_ledger_write")), pytest.raises(Stopped):
        reconcile_orphans(spark, orphans_config, policy, stopped, dry_run=False)
    assert not any(stores.exists(PREFIX + orphan, "dc1") for orphan in orphans)
    assert records(spark, orphans_config) == []
    for _ in range(2):  # the second run has nothing left to record
        reconcile_orphans(spark, orphans_config, policy, uuid.uuid4().hex[:12], dry_run=False)
    found = [(r.id, r.dc, r.status, r.query_id) for r in records(spark, orphans_config) if r.status == PURGED]
    assert sorted(found) == [(orphan, "dc1", PURGED, ledger_query_id(stopped, "mailbox", "payloads", "dc1"))
                             for orphan in orphans]


def test_two_reconciles_at_once_sweep_each_bucket_once_and_record_each_deletion_once(spark, orphans_config, stores,
                                                                                  caplog):
    """The scheduled reconcile and a `purger reconcile` at the same moment. The first is held in its sweep of
    dc1, after its deletes and before its ledger write, until the second has run whole; then it goes on. The
    second must not take the first for a stopped sweep (it would record the first's deletions, which the first
    then records again): it finds dc1's lease held and sweeps nothing there, and sweeps dc2, whose lease is
    free. Checked against the blobs the test put and finds gone: one ``purged`` record each, and both leases
    free at the end."""
    uid = uuid.uuid4().hex[:8]
    orphans = [f"c{i}{uid}" for i in range(3)]
    for orphan in orphans:
        stores.put(PREFIX + orphan)
    past_grace()
    policy = mailbox_policy(orphans_config)
    first_run, second_run = uuid.uuid4().hex[:12], uuid.uuid4().hex[:12]
    held, second_done = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def hold_the_first(name: str) -> None:
        if name == "before_orphan_ledger_write" and threading.current_thread().name == "first" \
                and not held.is_set():
            held.set()
            second_done.wait(180)

    def run(run_id: str) -> None:
        try:
            reconcile_orphans(spark, orphans_config, policy, run_id, dry_run=False)
        except BaseException as error:  # noqa: BLE001 (reported by the test's thread)
            failures.append(error)

    with injected(hold_the_first), caplog.at_level(logging.WARNING, logger="purger.reconcile.sweeps"):
        first = threading.Thread(target=run, args=(first_run,), name="first")
        first.start()
        try:
            wait_for(held.is_set, 180, "the first sweep of dc1 to reach its ledger write")
            run(second_run)
        finally:
            second_done.set()
            first.join(300)
    assert not failures and not first.is_alive(), failures
    assert not any(stores.exists(PREFIX + orphan, dc) for orphan in orphans for dc in ("dc1", "dc2"))
    found = [(r.id, r.dc, r.query_id) for r in records(spark, orphans_config) if r.status == PURGED]
    assert sorted(found) == sorted(
        [(orphan, "dc1", ledger_query_id(first_run, "mailbox", "payloads", "dc1")) for orphan in orphans]
        + [(orphan, "dc2", ledger_query_id(second_run, "mailbox", "payloads", "dc2")) for orphan in orphans])
    assert any(f"sweep {ledger_query_id(first_run, 'mailbox', 'payloads', 'dc1')} holds" in r.getMessage()
               for r in caplog.records)
    journal = CassandraJournal(executor_session(orphans_config), orphans_config.cassandra.keyspace,
                               orphans_config.cassandra.journal_table)
    for dc, bucket in stores.buckets.items():
        key = f"mailbox.payloads/{dc}/{bucket}"
        assert journal.lease(SWEEP_LEASES, key, "probe", 5) is None, key  # given up by both
        journal.give_up(SWEEP_LEASES, key, "probe")


def test_a_lease_is_one_holders_until_given_up_or_run_out(config):
    """The journal's leases on the real Cassandra: taken by one holder, refused to another (who learns the
    holder's name), renewed by its holder, free again once given up, and once run out."""
    journal = CassandraJournal(executor_session(config), config.cassandra.keyspace, config.cassandra.journal_table)
    key = f"lease-test-{uuid.uuid4().hex[:8]}"
    assert journal.lease(SWEEP_LEASES, key, "a", 30) is None
    assert journal.lease(SWEEP_LEASES, key, "b", 30) == "a"
    assert journal.lease(SWEEP_LEASES, key, "a", 30) is None  # renewed
    journal.give_up(SWEEP_LEASES, key, "b")  # not b's to give up
    assert journal.lease(SWEEP_LEASES, key, "b", 30) == "a"
    journal.give_up(SWEEP_LEASES, key, "a")
    assert journal.lease(SWEEP_LEASES, key, "b", 2) is None
    wait_for(lambda: journal.lease(SWEEP_LEASES, key, "a", 30) is None, 10, "b's lease to run out")
    journal.give_up(SWEEP_LEASES, key, "a")


def test_a_row_written_just_before_the_delete_keeps_the_blob(orphans_config, stores, payloads):
    """The failpoint is where an upload's row lands between the anti-join and the delete: the serial re-read
    sees it. (Spark's Python workers are other processes, so the decision runs here, on the real servers.)"""
    uid = uuid.uuid4().hex[:8]
    racing, alone = f"f{uid}", f"g{uid}"
    stores.put(PREFIX + racing, "dc1")
    stores.put(PREFIX + alone, "dc1")
    reached = []

    def upload_lands(name: str) -> None:
        reached.append(name)
        if name == "before_orphan_delete" and len(reached) == 1:
            payloads.add(racing)

    with injected(upload_lands):
        kept = outcome(decide(orphans_config, sweep(orphans_config), racing, *listed(stores, racing)))
        gone = outcome(decide(orphans_config, sweep(orphans_config), alone, *listed(stores, alone)))
    assert [name for name in reached if "orphan" in name] == ["before_orphan_delete"] * 2
    assert (kept["status"], category(kept["reason"])) == (SKIPPED, PRESENT)
    assert (kept["kind"], kept["id"], kept["rule"], kept["dc"]) == ("payload", racing, ORPHAN, "dc1")
    assert stores.exists(PREFIX + racing, "dc1")
    assert gone["status"] == PURGED and gone["deleted_at_ms"] is not None
    assert not stores.exists(PREFIX + alone, "dc1")


def test_a_blob_rewritten_or_young_at_the_recheck_is_kept_and_a_gone_one_is_said_so(orphans_config, stores):
    uid = uuid.uuid4().hex[:8]
    rewritten, young, gone, dry = f"h{uid}", f"i{uid}", f"j{uid}", f"k{uid}"
    for object_id in (rewritten, young, dry):
        stores.put(PREFIX + object_id, "dc1")

    # Listed earlier, with other contents: rewritten since.
    modified, _ = listed(stores, rewritten)
    result = outcome(decide(orphans_config, sweep(orphans_config), rewritten, modified - 10_000, '"other"'))
    assert (result["status"], category(result["reason"])) == (SKIPPED, NOT_YET_DUE)
    assert "rewritten" in result["reason"]
    assert stores.exists(PREFIX + rewritten, "dc1")

    # Younger than the grace at the recheck (as a clock that moved on, or a listing's cutoff that erred).
    result = outcome(decide(orphans_config, sweep(orphans_config, grace=timedelta(hours=1)), young,
                            *listed(stores, young)))
    assert (result["status"], category(result["reason"])) == (SKIPPED, NOT_YET_DUE)
    assert "orphan_grace" in result["reason"]
    assert stores.exists(PREFIX + young, "dc1")

    # A dry run decides, and deletes nothing.
    result = outcome(decide(orphans_config, sweep(orphans_config, dry_run=True), dry, *listed(stores, dry)))
    assert result["status"] == WOULD_DELETE and result["deleted_at_ms"] is None
    assert stores.exists(PREFIX + dry, "dc1")

    # Gone meanwhile: already gone (another writer deleted it). Found gone after the sweep's intent (a task run
    # again after it deleted the blob): purged, under the intent's run.
    result = outcome(decide(orphans_config, sweep(orphans_config), gone, now_ms() - 60_000, None))
    assert result["status"] == ALREADY_GONE
    again = sweep(orphans_config)
    journal = CassandraJournal(executor_session(orphans_config), orphans_config.cassandra.keyspace,
                               orphans_config.cassandra.journal_table)
    journal.intend(f"{ORPHAN} payload", f"dc1/{gone}", {SELF: f"{again.query_id}/0"})
    result = outcome(decide(orphans_config, again, gone, now_ms() - 60_000, None))
    assert (result["status"], category(result["reason"]), result["intent"]) == (
        PURGED, EARLIER_ATTEMPT, f"{again.query_id}/0")


def test_the_shards_list_every_key_under_the_prefix_exactly_once_and_none_outside(stores):
    # Beyond ASCII too, and characters the store may order otherwise than by code point (s3proxy: UTF-16).
    firsts = ["0", "9", "A", "a", "aa", "a" + MAX_CHARACTER + "x", "a\ue000", "b", "z", "-", "_", "~", "é", "中", "+x",
              ".y", "\ue000", "\U00010000"]
    inside = [PREFIX + f"{first}{n}" for first in firsts for n in range(3)] + [PREFIX + "a/b", PREFIX + "é/c"]
    outside = ["other/a1", "payloadsX/a1", "payloads-a1", "a/payloads/a1"]
    for key in inside + outside:
        stores.put(key, "dc1")
    shards = "0Aab9"
    bucket = stores.buckets["dc1"]
    for page_size in (1000, 2, 1):  # small pages: the catch-all's jumps over the shards' keys are exercised
        seen = [item["Key"] for first in [*shards, None]
                for item in list_shard(stores.client, bucket, PREFIX, first, shards, page_size)]
        # A filesystem-backed store lists folders as keys ending in "/": the sweep leaves them alone.
        seen = [key for key in seen if not key.endswith("/")]
        assert sorted(seen) == sorted(inside), page_size


def test_a_purger_stopped_in_its_scheduled_sweep_has_each_deletion_recorded_after_its_restart(
        spark, config, stores, tmp_path, caplog):
    """A running purger's scheduled reconcile is held in its sweep of dc1's orphan blobs, after their deletes and
    before its ledger write, and the purger is stopped the way SIGTERM stops it (``RunningPurger.stop``, which
    cancels the reconcile's Spark jobs): the write is cut. Restarted, the purger reconciles at once (no run was
    recorded) and records those deletions under the cut sweep, then sweeps dc2. Checked against the blobs the
    test put and finds gone: one ``purged`` record each.

    A keyspace of its own, so that the scheduled reconcile scans only what this test wrote."""
    uid = uuid.uuid4().hex[:8]
    # No clock ticks, and nothing on its topics: the stream runs no batch and keeps no state, so the restart's
    # reconcile copies none (this is a test of the sweep).
    own = own_config(config, tmp_path, "stopped-sweep", clock_interval=timedelta(hours=1))
    endpoint = config.stores["dc1"].endpoint
    own = own.model_copy(update={
        "cassandra": own.cassandra.model_copy(update={"keyspace": f"stopped_sweep_{uid}"}),
        "stores": {dc: own.stores[dc].model_copy(update={"bucket": bucket, "endpoint": endpoint})
                   for dc, bucket in stores.buckets.items()},
        "reconcile": own.reconcile.model_copy(update={"interval": timedelta(hours=1), "orphan_grace": GRACE}),
    })
    create_schema(own)
    orphans = [f"o{i}{uid}" for i in range(4)]
    for key in orphans:
        stores.put(PREFIX + key)
    past_grace()

    held, stopping = threading.Event(), threading.Event()

    def hold_the_first_write(name: str) -> None:
        if name == "before_orphan_ledger_write" and not held.is_set():
            held.set()
            stopping.wait(120)

    def cancel_often() -> None:
        # The stop's cancelling, every 10 ms rather than its 200: it lands on the ledger write's first job.
        for _ in range(300):
            spark.sparkContext.cancelJobGroup(RECONCILE_JOB_GROUP)
            time.sleep(0.01)

    try:
        with injected(hold_the_first_write):
            running = start_purger(spark, own)
            stopper = threading.Thread(target=running.stop)
            try:
                wait_for(held.is_set, 180, "the scheduled sweep to reach its ledger write")
                stopper.start()
                wait_for(running.reconciling.stopped.is_set, 30, "the stop to begin")
            finally:
                canceller = threading.Thread(target=cancel_often)
                canceller.start()
                stopping.set()
                if stopper.ident is None:  # the hold never reached
                    running.stop()
                stopper.join(180)
                canceller.join()
        assert running.failure is None
        assert not any(stores.exists(PREFIX + orphan, "dc1") for orphan in orphans)
        assert all(stores.exists(PREFIX + orphan, "dc2") for orphan in orphans)  # its sweep never began
        assert records(spark, own) == []  # deleted, and not recorded

        with caplog.at_level(logging.WARNING, logger="purger.reconcile.sweeps"):
            running = start_purger(spark, own)
            try:
                wait_for(lambda: running.metrics.reconcile_last_run._value.get() > 0, 180,
                         "the restart's scheduled reconcile")
            finally:
                running.stop()
        assert any("stopped before its ledger write; 4 of its deletions recorded now" in r.getMessage()
                   for r in caplog.records)
        assert not any(stores.exists(PREFIX + orphan, dc) for orphan in orphans for dc in ("dc1", "dc2"))
        found = records(spark, own)
        assert sorted((r.id, r.dc, r.status, r.rule) for r in found) == sorted(
            (orphan, dc, PURGED, ORPHAN) for orphan in orphans for dc in ("dc1", "dc2"))
        cut = {r.query_id for r in found if r.dc == "dc1"}
        assert len(cut) == 1 and cut != {r.query_id for r in found if r.dc == "dc2"}
    finally:
        session = cassandra_session(own.cassandra)
        session.execute(f"DROP KEYSPACE IF EXISTS {own.cassandra.keyspace}", timeout=60)
        session.cluster.shutdown()
