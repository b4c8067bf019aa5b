"""Reconciliation on the real servers (docs/reconciliation.md): rows the stream never heard of, fed back from
the store and purged or kept like the rest.

The module's platform writes into a keyspace and buckets of its own (a reconcile scans whole tables and lists
whole buckets). Its objects:

- *silent* ones: rows written with their events sent to a topic the purger does not read, as if the
  platform had existed before the purger or had failed to emit; of every policy, due and kept;
- *heard* ones: written with their events on the purger's events topic;
- *changed behind its back*: a message whose enqueue the stream read 41 days ago (counter 1), whose
  counter was then set to 0 forty days ago with no event;
- a payload shared by a due message and a live one, none of them heard of.

One purger runs for the module; ``reconcile`` runs beside it, as the scheduled one does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from pyspark.sql import functions as F

from devstack.stack import prepare
from purger.config import with_policies
from purger.reconcile.run import reconcile
from purger.running import start_purger
from purger.sinks.ledger import Ledger, Report
from purger.core.policy import key_id
from simulation.mailbox import Platform
from simulation.policy_objects import SETTINGS, PolicyObjects
from tests.support.configs import own_config, write_config
from tests.support.faults import FAULTS, killed_at, reliability
from tests.support.mailbox import end_state, write_work
from tests.support.waits import ago, now, wait_for

pytestmark = pytest.mark.integration

DAYS = timedelta(days=1)


@pytest.fixture(scope="module")
def reconciled(spark, config, tmp_path_factory):
    """The module's configuration (keyspace, topics, checkpoint, ledger of its own; every policy), a
    configuration of the same keyspace whose events go to a topic nobody reads, and the running purger."""
    run = uuid.uuid4().hex[:8]
    own = own_config(config, tmp_path_factory.mktemp("reconcile"), "reconcile")
    # Buckets of its own too: every blob in them without a row in its keyspace is an orphan.
    stores = {dc: store.model_copy(update={"bucket": f"reconcile-{run}-{dc}"}) for dc, store in own.stores.items()}
    own = own.model_copy(update={"cassandra": own.cassandra.model_copy(update={"keyspace": f"reconcile_{run}"}),
                                 "stores": stores})
    own = with_policies(own, {**own.policies, **SETTINGS})
    # The schedule: with no run recorded yet, the purger reconciles at its start, then hourly.
    own = own.model_copy(update={"reconcile": own.reconcile.model_copy(update={"interval": timedelta(hours=1)})})
    prepare(own, partitions=2)
    silent = own.model_copy(update={"kafka": own.kafka.model_copy(update={"topics": [f"test.{run}.unread"]})})
    prepare(silent, partitions=1)
    running = start_purger(spark, own)
    try:
        # The scheduled reconcile at the start, of the empty keyspace, counted for Prometheus: over before
        # the tests write.
        wait_for(lambda: running.metrics.reconcile_last_run._value.get() > 0, 120, "the scheduled reconcile")
        yield own, silent, running
    finally:
        running.stop()
        from purger.connectors import cassandra_session

        session = cassandra_session(own.cassandra)
        session.execute(f"DROP KEYSPACE IF EXISTS {own.cassandra.keyspace}", timeout=60)
        session.cluster.shutdown()


def test_rows_no_event_told_of_are_fed_back_purged_when_due_and_kept_when_not(spark, reconciled):
    own, silent, running = reconciled
    ttl = own.policy_set.policy_of("message").settings.deleted_ttl
    quiet, heard = Platform(silent), Platform(own)
    objects = PolicyObjects(silent)
    try:
        eligible, live = [], []
        # Silent messages: deleted long enough ago, each with its payload in both data centres; one live.
        write_work(quiet, "silent", 4, own, eligible, live)
        # A payload shared by a due message and a live one, neither heard of: the message goes, the payload stays.
        shared_due, shared_live = f"shared-due-{run_id()}", f"shared-live-{run_id()}"
        shared = f"p-shared-{run_id()}"
        quiet.enqueue(shared_due, shared, at=ago(ttl))
        quiet.enqueue(shared_live, shared, extract_count=1, shared=True)
        quiet.delete(shared_due, at=ago(ttl))
        # Heard of, counter 1 forty-one days ago; its counter set to 0 forty days ago with no event.
        behind = f"behind-{run_id()}"
        heard.enqueue(behind, f"p-{behind}", extract_count=1, at=now() - 41 * DAYS)
        quiet.set_counter(behind, 0, at=now() - 40 * DAYS)
        written = objects.write(f"silent-{run_id()}")
        # A user and a unit of work claimed by a purge cut short, whose checkpoint went with it: finished.
        claimed = {o.kind: o.id for o in written if o.eligible and o.kind in ("user", "unit_of_work")}
        quiet.session.execute("UPDATE users SET state = 'purging' WHERE user_id = %s", (claimed["user"],))
        quiet.session.execute("UPDATE units_of_work SET purge_started_at = %s WHERE unit_of_work_id = %s",
                              (now(), claimed["unit_of_work"]))
        # A blob whose payloads row was never written, in both data centres.
        orphan = f"orphan-{run_id()}"
        for dc, store in own.stores.items():
            quiet.stores[dc].put_object(Bucket=store.bucket, Key=f"payloads/{orphan}", Body=b"left behind")
        # An upload that died after its payload's blobs and row: live, no reference, last linked two days ago.
        stranded = f"p-stranded-{run_id()}"
        for dc, store in own.stores.items():
            quiet.stores[dc].put_object(Bucket=store.bucket, Key=f"payloads/{stranded}", Body=b"no message")
        quiet.session.execute("INSERT INTO payloads (payload_id, size, dcs, state, last_ref_at, created_at) "
                              "VALUES (%s, 10, %s, 'live', %s, %s)", (stranded, set(own.stores), ago(2 * DAYS),
                                                                       ago(2 * DAYS)))
        for platform in (quiet, heard):
            platform.flush()
        objects.flush()
        wait_for(lambda: running.query.lastProgress is not None
                 and known_to_stream(spark, own, "message", behind), 120, "the heard message in the state")

        # The state read in place, as `purger reconcile` reads it: the copy apart (a JVM's start) is the scheduled
        # reconcile's, which the module's purger ran, and the next test's.
        rows = reconcile(spark, own, state_apart=False)
        report = {(r.policy, r.table if r.dc == "all" else f"{r.table} in {r.dc}"): r for r in rows}

        messages = report[("mailbox", "messages")]
        assert messages.scanned == 8
        assert messages.known == 1 and messages.overdue_fed == 1  # the message changed behind the stream's back
        assert messages.unknown_fed == 7
        assert report[("mailbox", "payloads")].unknown_fed == 1  # the stranded payload, found unreferenced
        for dc in own.stores:
            assert report[("mailbox", f"payloads in {dc}")].orphans_deleted == 1
            assert not quiet.blob_exists(orphan, dc)
        for policy in ("rule_events", "users", "units_of_work"):
            table = report[(policy, policy)]  # its objects' table (the others: its orphan rows')
            assert (table.scanned, table.known, table.unknown_fed) == (2, 0, 2), policy

        eligible += [shared_due, behind]
        wait_for(lambda: all(quiet.row(m) is None for m in eligible) and quiet.payload_gone(stranded)
                 and all(objects.gone(o) for o in written if o.eligible), 180, "the due rows to be purged")
        assert quiet.row(shared_live) is not None and quiet.payload_intact(shared)
        assert all(objects.intact(o) for o in written if not o.eligible)
        wait_for(lambda: not leftovers(spark, quiet, own, eligible, live, (shared_due, shared), [orphan, stranded], written,
                                       objects), 60, "one ledger record per deletion")

        again = reconcile(spark, own, state_apart=False)
        assert sum(r.unknown_fed + r.overdue_fed for r in again) == 0, again
    finally:
        quiet.close()
        heard.close()
        objects.close()


def leftovers(spark, platform, config, eligible, live, shared_payload, payloads_alone, written, objects):
    """What ``end_state`` finds wrong, the shared payload aside (``shared_payload``: the due message and the
    payload; kept, so not in the ledger) and the payloads with no message added: the orphan blobs (a record in
    each data centre) and the stranded payload (its row too)."""
    shared_due, shared = shared_payload
    wrongly_deleted, missing, doubled, unexpected = end_state(
        spark, platform, config, [m for m in eligible if m != shared_due], live, objects, written)
    purged_shared = Ledger(spark, config.ledger).records().where(
        (F.col("status") == "purged") & (F.col("id") == shared_due)).count()
    assert not wrongly_deleted and not doubled and purged_shared == 1
    orphan, stranded = payloads_alone
    alone = {("payload", orphan, dc) for dc in config.stores} | {("payload", stranded, dc)
                                                                 for dc in (None, *config.stores)}
    shared_due_rows = {("message", shared_due, None), ("payload_refs", key_id([shared, shared_due]), None)}
    return (missing | alone - unexpected) | (unexpected - alone - shared_due_rows)


def test_the_state_copied_apart_is_the_state_read_in_place_and_a_failed_copy_says_why_in_a_line(spark, reconciled):
    """The scheduled reconciles read the stream's state in a process of their own (purger.reconcile.known_objects): what
    it copies is what the state holds, the copy is gone afterwards, and a copy that fails says why in a line."""
    from functools import reduce
    from pathlib import Path

    from pyspark.sql import DataFrame

    from purger.reconcile.verdict import ReconcileError
    from purger.reconcile.known_objects import known_objects
    from purger.reconcile.run import _last_committed_batch

    own, _, _ = reconciled
    checkpoint = own.stream.checkpoint_location
    batch = _last_committed_batch(spark, checkpoint)
    kinds = sorted({scanned.kind for policy in own.policy_set.policies for scanned in policy.scanned})
    assert batch is not None
    with (known_objects(spark, own, batch, kinds) as apart,
          known_objects(spark, own, batch, kinds, apart=False) as in_place):
        assert set(apart) == set(in_place) and "message" in apart
        copied, read = (sorted(reduce(DataFrame.unionByName, each.values()).collect()) for each in (apart, in_place))
        assert copied == read and copied
        assert Path(f"{checkpoint}.known").is_dir()
    assert not Path(f"{checkpoint}.known").exists()

    with pytest.raises(ReconcileError, match=rf"copying the state of {checkpoint} \(batch 999999\) for a "
                                             r"reconcile failed \(exit 1\): \S") as raised:
        with known_objects(spark, own, 999999, ["message"]):
            pass
    assert "\n" not in str(raised.value)


def known_to_stream(spark, config, kind: str, object_id: str) -> bool:
    from purger.reconcile.known_objects import known_objects
    from purger.reconcile.run import _last_committed_batch

    batch = _last_committed_batch(spark, config.stream.checkpoint_location)
    if batch is None:
        return False
    with known_objects(spark, config, batch, [kind], apart=False) as known:
        return kind in known and known[kind].where(F.col("id") == object_id).count() == 1


def run_id() -> str:
    return uuid.uuid4().hex[:6]


def test_a_reconcile_killed_in_its_scan_or_its_feed_loses_nothing(spark, reconciled, tmp_path):
    """`purger reconcile` in a process of its own is killed with SIGKILL (its whole process group) in its scan, at
    its first token range, and in its feed, once its first records are in the reconcile topic (both in full, one
    of them in turn in a bounded run: ``FaultMatrix.cases``); then a reconcile runs to its end. The end state is
    that of one uninterrupted reconcile: every due row gone, every
    live one intact, one ledger record per deletion."""
    own, silent, running = reconciled
    config_file = write_config(own, tmp_path / "purger.toml")
    quiet, objects = Platform(silent), PolicyObjects(silent)
    try:
        eligible, live = [], []
        write_work(quiet, "killed", 20, own, eligible, live)
        written = objects.write(f"killed-{run_id()}")
        quiet.flush()
        objects.flush()
        kills = Counter()
        points = ("in_reconcile_scan", "in_reconcile_feed")
        for point in FAULTS.cases(points, points, per_run=1):
            marker = tmp_path / f"{point}.fired"
            process = subprocess.Popen(
                [sys.executable, "-m", "purger", "reconcile", "--config", str(config_file), "--actor", "oncall@example",
                 "--reason", f"INC-{point}"],
                env={**os.environ, **killed_at(point, marker)},
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            try:
                assert process.wait(timeout=300) == -signal.SIGKILL and marker.exists(), point
            finally:
                with contextlib.suppress(ProcessLookupError):  # Spark's worker daemon, if it outlived the driver
                    os.killpg(process.pid, signal.SIGKILL)
            kills[point] += 1
        report = reconcile(spark, own, state_apart=False)  # the state read as `purger reconcile` reads it
        wait_for(lambda: all(quiet.row(m) is None for m in eligible)
                 and all(objects.gone(o) for o in written if o.eligible), 180, "the due rows to be purged")
        # A batch's rows go before its ledger commit: the records follow within the batch.
        found = {}

        def recorded() -> bool:
            found["end"] = end_state(spark, quiet, own, eligible, live, objects, written)
            return not found["end"][1]

        wait_for(recorded, 60, "one ledger record per deletion")
        wrongly_deleted, missing, doubled, unexpected = found["end"]
        reliability("reconcile killed in its scan or its feed", injected=sum(kills.values()),
                    survived=sum(kills.values()), wrongly_deleted=len(wrongly_deleted),
                    ledger_missing=len(missing), ledger_doubled=len(doubled), **kills)
        assert not wrongly_deleted and not missing and not doubled
        assert sum(r.unknown_fed for r in report) > 0  # the killed runs' feeds were cut short
        # Who ran each killed reconcile and why, recorded before it changed anything: a record per policy.
        commands = Ledger(spark, own.ledger).records().where(F.col("status") == "command").collect()
        assert sorted((r.rule, r.actor, r.reason, r.policy) for r in commands) == sorted(
            ("reconcile", "oncall@example", f"INC-{point}", policy.name)
            for point in kills for policy in own.policy_set.policies)
        assert len({r.id for r in commands}) == len(kills)
        # The daily report counts outcomes only.
        assert "command" not in {r.kind for r in Report(spark, own.ledger, own.policy_set).compute(now().date())
                                 .collect()}
    finally:
        quiet.close()
        objects.close()


def test_a_dry_run_from_the_command_line_feeds_and_deletes_nothing_and_prints_its_report(spark, reconciled,
                                                                                         tmp_path):
    """`purger reconcile --dry-run --policy mailbox`: exit 0, its report at 80 columns; nothing sent to the
    reconcile topic, the due row and the orphan blob still there, `would_delete` recorded for the orphan, in the
    dry run's ledger and not the real one's (SPEC 9.5), its report's rows in the dry run's reconcile report."""
    own, silent, running = reconciled
    ttl = own.policy_set.policy_of("message").settings.deleted_ttl
    quiet = Platform(silent)
    try:
        due, orphan = f"dry-{run_id()}", f"dry-orphan-{run_id()}"
        quiet.enqueue(due, f"p-{due}", at=ago(ttl))
        quiet.delete(due, at=ago(ttl))
        quiet.flush()
        for dc, store in own.stores.items():
            quiet.stores[dc].put_object(Bucket=store.bucket, Key=f"payloads/{orphan}", Body=b"left behind")
        fed = topic_records(own)
        result = subprocess.run(
            [sys.executable, "-m", "purger", "reconcile", "--dry-run", "--policy", "mailbox", "--config",
             str(write_config(own, tmp_path / "purger.toml"))],
            capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "80"})
        assert result.returncode == 0, result.stderr[-2000:]
        lines = [line.rstrip() for line in result.stdout.splitlines()]
        assert lines[0] == "Reconcile of mailbox (dry run: nothing fed back or deleted)"
        assert max(len(line) for line in lines) <= 80
        messages = next(line.split() for line in lines if line.split()[:2] == ["messages", "all"])
        assert int(messages[4]) >= 1  # the due row, unknown to the stream: counted, not fed
        assert topic_records(own) == fed
        assert quiet.row(due) is not None
        assert all(quiet.blob_exists(orphan, dc) for dc in own.stores)
        dry = own.as_dry_run().ledger
        records = Ledger(spark, dry).records().where(F.col("id") == orphan).collect()
        assert sorted((r.status, r.rule, r.dc) for r in records) == [
            ("would_delete", "orphan", dc) for dc in sorted(own.stores)]
        assert Ledger(spark, own.ledger).records().where(F.col("id") == orphan).count() == 0
        # A dry run changes nothing: no reason asked, no command recorded.
        assert Ledger(spark, dry).records().where(F.col("status") == "command").count() == 0
        runs = spark.read.format("delta").load(dry.reconcile_path).where(F.col("policy") == "mailbox")
        assert runs.count() > 0 and runs.where(~F.col("dry_run")).count() == 0
        real_runs = spark.read.format("delta").load(own.ledger.reconcile_path)
        assert real_runs.where(F.col("dry_run")).count() == 0  # only the running purger's scheduled ones
    finally:
        quiet.close()


def topic_records(config) -> int:
    """Records in the reconcile topic so far."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=config.kafka.bootstrap_servers)
    try:
        partitions = [TopicPartition(config.kafka.reconcile_topic, p)
                      for p in consumer.partitions_for_topic(config.kafka.reconcile_topic) or ()]
        return sum(consumer.end_offsets(partitions).values())
    finally:
        consumer.close()


def test_rows_without_their_rules_timestamp_are_dated_by_their_write_time(spark, reconciled):
    """SPEC 8.1: rows another writer inserted without the timestamp their rule runs from, none of them heard of by
    the stream: a message with its counter at 0 and no updated_at (its payload inline), and a live payload with its
    blobs, no message referring to it and no last_ref_at. Those written (by their write time) forty days ago go
    after a reconcile, each recorded purged once. Those written ten minutes ahead of the clock, young for this
    module's periods of seconds (one written now would be due before the reconcile ends), stay."""
    own, silent, _ = reconciled
    tables = own.policy_set.policy_of("message").settings
    quiet = Platform(silent)
    try:
        written = {}
        for age, moment in (("old", now() - 40 * DAYS), ("young", now() + timedelta(minutes=10))):
            m, p = f"undated-{age}-{run_id()}", f"p-undated-{age}-{run_id()}"
            at = f"USING TIMESTAMP {int(moment.timestamp() * 1e6)}"
            quiet.session.execute(
                f"INSERT INTO {tables.messages_table} (message_id, mailbox, payload_id, payload_size, inline_payload, "
                f"extract_count, complete, deleted, created_at) VALUES (%s, 'inbox', %s, 3, 0x616263, 0, true, false, "
                f"%s) {at}", (m, f"inline-{m}", moment))
            for dc, store in own.stores.items():
                quiet.stores[dc].put_object(Bucket=store.bucket, Key=f"payloads/{p}", Body=b"no reference")
            quiet.session.execute(f"INSERT INTO {tables.payloads_table} (payload_id, size, dcs, state, created_at) "
                                  f"VALUES (%s, 12, %s, 'live', %s) {at}", (p, set(own.stores), moment))
            written[age] = m, p
        (old_message, old_payload), (young_message, young_payload) = written["old"], written["young"]

        reconcile(spark, own, ["mailbox"], state_apart=False)  # the state read as `purger reconcile` reads it
        wait_for(lambda: quiet.row(old_message) is None and quiet.payload_gone(old_payload), 90,
                 "the old rows to be purged")
        expected = {("message", old_message, None)} | {("payload", old_payload, dc) for dc in (None, *own.stores)}

        def purged() -> Counter:
            return Counter((r["kind"], r["id"], r["dc"]) for r in Ledger(spark, own.ledger).records().where(
                (F.col("status") == "purged") & F.col("id").isin(*written["old"], *written["young"])).collect())

        wait_for(lambda: set(purged()) >= expected, 60, "their ledger records")
        assert purged() == Counter(expected)
        assert quiet.row(young_message) is not None and quiet.payload_intact(young_payload)
    finally:
        quiet.close()
