"""The whole job on the real servers: events through Kafka, the stateful stage, deletes in Cassandra and S3.

The test configuration's periods: expired_ttl 6s, incomplete_ttl 8s, deleted_ttl 1s, payload_grace 3s,
watermark delay 2s, clock every 1s, retry after 2s; this module's purger forgets an object with nothing due
``FORGET_AFTER`` after its last event.
"""

import json
import random
import re
import time
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone
from functools import partial

import pytest
from kafka import KafkaConsumer, TopicPartition
from pyspark.sql import functions as F

from purger.core.holds import Scope
from purger.core.policy import key_id
from purger.core.times import now_ms
from purger.holds import holds_in_force, place_hold, release_hold
from purger.running import start_purger
from purger.sinks.ledger import Ledger
from tests.support.configs import mailbox
from tests.support.faults import FAULTS, bad_records, reliability
from tests.support.waits import ago, now, observed, rows_dropped_as_late, wait_for, wait_for_watermark

pytestmark = pytest.mark.integration


FORGET_AFTER = timedelta(seconds=15)


# The module's purger keeps what it deletes restorable this long (docs/operations.md, "Undo").
UNDO_WINDOW = timedelta(hours=1)


def with_undo(config):
    return config.model_copy(update={"undo": config.undo.model_copy(update={"window": UNDO_WINDOW})})


@pytest.fixture(scope="module")
def purger(spark, config):
    running = start_purger(spark, with_undo(config).model_copy(update={
        "stream": config.stream.model_copy(update={"forget_after": FORGET_AFTER})}))
    yield running
    running.stop()
    assert running.failure is None


def test_every_rule_purges_the_eligible_and_keeps_the_revived_whatever_the_order(purger, platform, config):
    """The mailbox rules (docs/reference.md, Rules), one row per case; events arrive shuffled and each twice."""
    r = mailbox(config)
    run = uuid.uuid4().hex[:8]
    far_future = now() + timedelta(days=365)
    cases = {
        # name: (steps, eligible)
        "counter reaches 0": (lambda p, m: (p.enqueue(m, f"p-{m}", extract_count=2, at=ago(r.expired_ttl)),
                                            p.dequeue(m, 0, at=ago(r.expired_ttl))), True),
        "counter revived": (lambda p, m: (p.enqueue(m, f"p-{m}", at=ago(r.expired_ttl)),
                                          p.dequeue(m, 0, at=ago(r.expired_ttl)), p.set_counter(m, 2)), False),
        "inline payload": (lambda p, m: (p.enqueue(m, f"p-{m}", size=100, at=ago(r.expired_ttl)),
                                         p.dequeue(m, 0, at=ago(r.expired_ttl))), True),
        "date passed": (lambda p, m: p.enqueue(m, f"p-{m}", extract_count=None, extract_until=ago(r.expired_ttl),
                                               at=ago(r.expired_ttl)), True),
        "date moved into the future": (lambda p, m: (
            p.enqueue(m, f"p-{m}", extract_count=None, extract_until=ago(r.expired_ttl), at=ago(r.expired_ttl)),
            p.set_extract_until(m, far_future)), False),
        "date cleared": (lambda p, m: (
            p.enqueue(m, f"p-{m}", extract_count=None, extract_until=ago(r.expired_ttl), at=ago(r.expired_ttl)),
            p.set_extract_until(m, None)), False),
        "date far in the future": (lambda p, m: p.enqueue(m, f"p-{m}", extract_count=None,
                                                          extract_until=far_future), False),
        "incomplete upload": (lambda p, m: p.enqueue(m, f"p-{m}", complete=False, at=ago(r.incomplete_ttl)), True),
        "upload completed": (lambda p, m: (p.enqueue(m, f"p-{m}", complete=False, at=ago(r.incomplete_ttl)),
                                           p.upload_complete(m)), False),
        "deleted": (lambda p, m: (p.enqueue(m, f"p-{m}"), p.delete(m, at=ago(r.deleted_ttl))), True),
        "live": (lambda p, m: (p.enqueue(m, f"p-{m}", extract_count=2), p.dequeue(m, 1)), False),
    }
    messages = {name: f"{run}-{i}" for i, name in enumerate(cases)}
    with platform.holding() as events:
        for name, (steps, _) in cases.items():
            steps(platform, messages[name])
    records = events * 2
    random.Random(7).shuffle(records)
    platform.send(records)
    platform.flush()
    sent = now()

    eligible = {name for name, (_, due) in cases.items() if due}
    wait_for(lambda: all(platform.row(messages[name]) is None for name in eligible),
             what="every eligible message's row to be deleted")
    stored = [messages[name] for name in eligible if name != "inline payload"]
    wait_for(lambda: all(platform.payload_gone(f"p-{m}") for m in stored), timeout_s=60,
             what="their payloads, after payload_grace, from both data centres")
    # Every deadline the kept ones could have had is behind the watermark now.
    wait_for_watermark(purger.query, sent + timedelta(seconds=3))
    for name in set(cases) - eligible:
        m = messages[name]
        assert platform.row(m) is not None, f"{name}: wrongly deleted"
        assert platform.payload_intact(f"p-{m}"), f"{name}: payload wrongly deleted"
    assert platform.references(f"p-{messages['inline payload']}") == set()


def test_a_shared_payload_goes_only_with_its_last_message(purger, platform, config):
    r = mailbox(config)
    first, second, p = (f"shared-{uuid.uuid4().hex[:8]}-{n}" for n in ("a", "b", "p"))
    platform.enqueue(first, p, at=ago(r.expired_ttl))
    assert platform.enqueue(second, p, shared=True) == p
    platform.dequeue(first, 0, at=ago(r.expired_ttl))
    platform.flush()
    wait_for(lambda: platform.row(first) is None, what="the first message to be purged")
    time.sleep(r.payload_grace.total_seconds() + 3)
    assert platform.payload_intact(p) and platform.references(p) == {second}

    platform.dequeue(second, 0, at=ago(r.expired_ttl))
    platform.flush()
    wait_for(lambda: platform.row(second) is None, what="the second message to be purged")
    wait_for(lambda: platform.payload_gone(p), timeout_s=60, what="the payload, once its grace passed")


def test_an_idle_stream_still_purges_on_time(purger, platform, config):
    """No event follows the expiry: only the clock moves the watermark."""
    m = f"idle-{uuid.uuid4().hex[:8]}"
    platform.enqueue(m, f"p-{m}")
    zero_at = now()
    platform.dequeue(m, 0, at=zero_at)
    platform.flush()
    wait_for(lambda: platform.row(m) is None, what="the expired message on a quiet stream")
    lag_s = (now() - zero_at - mailbox(config).expired_ttl).total_seconds()
    # The watermark delay, a clock interval and a trigger or two, plus the recheck of a row whose
    # updated_at is a few milliseconds after the event time.
    print(f"purge lag on an idle stream: {lag_s:.1f}s")
    assert lag_s < 15


def test_a_live_message_is_forgotten_after_its_last_event_and_its_deletion_still_purges_it(purger, platform):
    """SPEC 10.4: a live message (its counter above 0, no date) and its payload have nothing due: dropped from
    the state ``FORGET_AFTER`` after their events, and counted. The message's deletion, later, is an event of
    its own: the message and then its payload are purged as ever."""
    forgotten = purger.metrics.forgotten
    before = {kind: forgotten.labels(kind)._value.get() for kind in ("message", "payload")}
    m = f"forgotten-{uuid.uuid4().hex[:8]}"
    platform.enqueue(m, f"p-{m}")
    platform.flush()
    wait_for(lambda: all(forgotten.labels(kind)._value.get() > before[kind] for kind in before),
             timeout_s=FORGET_AFTER.total_seconds() + 60, what="the live message and its payload forgotten")
    assert platform.row(m) is not None and platform.payload_intact(f"p-{m}")
    platform.delete(m)
    platform.flush()
    wait_for(lambda: platform.row(m) is None and platform.payload_gone(f"p-{m}"), timeout_s=90,
             what="the message deleted after it was forgotten, then its payload")


def held_objects(config, scope: Scope) -> int:
    """How many objects the hold on ``scope`` keeps now, from the holds table."""
    return next((count for hold, count in holds_in_force(config) if hold.scope == str(scope)), 0)


def test_a_held_mailbox_keeps_its_due_message_until_the_release_then_it_goes_with_no_event(
        purger, platform, config, spark):
    """SPEC 11.1: a hold wins over retention; a release makes what became due meanwhile purgeable with no event
    needed. Beside it, a due message of another mailbox goes as ever. Checked in Cassandra and both stores."""
    r = mailbox(config)
    run = uuid.uuid4().hex[:8]
    scope = Scope("mailbox", f"held-{run}")
    held, free = f"{run}-held", f"{run}-free"
    assert place_hold(spark, config, scope, "case 42", "test", wait_s=60).already is None
    platform.enqueue(held, f"p-{held}", mailbox=scope.id, at=ago(r.expired_ttl))
    platform.dequeue(held, 0, at=ago(r.expired_ttl))
    platform.enqueue(free, f"p-{free}", at=ago(r.expired_ttl))
    platform.dequeue(free, 0, at=ago(r.expired_ttl))
    platform.flush()
    wait_for(lambda: platform.row(free) is None and held_objects(config, scope) == 1, timeout_s=60,
             what="the message of a mailbox with no hold purged, the held one kept under its hold")
    assert platform.row(held) is not None and platform.payload_intact(f"p-{held}")
    assert release_hold(config, scope) == 1
    wait_for(lambda: platform.row(held) is None and platform.payload_gone(f"p-{held}"), timeout_s=60,
             what="the message released, then its payload, with no new event")
    assert held_objects(config, scope) == 0


def as_stored(platform, config, m: str) -> tuple:
    """Message ``m``'s rows as Cassandra returns them (``SELECT JSON *``: its row, its payload's, its reference) and
    its payload's blob's bytes in each data centre; None for each one not there."""
    from purger.policies.mailbox.deletes import payload_key

    def json_of(table: str, where: str, *key: str) -> str | None:
        found = platform.session.execute(f"SELECT JSON * FROM {table} WHERE {where}", key).one()
        return found[0] if found else None

    blobs = tuple(platform.stores[dc].get_object(Bucket=store.bucket, Key=payload_key(f"p-{m}"))["Body"].read()
                  if platform.blob_exists(f"p-{m}", dc) else None for dc, store in sorted(config.stores.items()))
    return (json_of("messages", "message_id = %s", m), json_of("payloads", "payload_id = %s", f"p-{m}"),
            json_of("payload_refs", "payload_id = %s AND message_id = %s", f"p-{m}", m), blobs)


def purged_due(spark, platform, config, run: str, n: int, mailboxes: list[str] | None = None
               ) -> tuple[list[str], dict[str, tuple]]:
    """``n`` messages due at once (of ``mailboxes``, one each), with stored payloads, as stored before, once purged
    with their payloads and recorded."""
    r = mailbox(config)
    messages = [f"{run}-undo-{i}" for i in range(n)]
    for m, mailbox_id in zip(messages, mailboxes or ["mbox"] * n):
        platform.enqueue(m, f"p-{m}", mailbox=mailbox_id, at=ago(r.expired_ttl))
        platform.dequeue(m, 0, at=ago(r.expired_ttl))
    platform.flush()
    before = {m: as_stored(platform, config, m) for m in messages}
    assert all(None not in (rows[:3] + rows[3]) for rows in before.values())
    wait_for(lambda: all(platform.row(m) is None and platform.payload_gone(f"p-{m}") for m in messages), timeout_s=60,
             what="the messages and their payloads purged")
    # And recorded (the row, the payload's and its blob in each store): a batch writes its records once its deletes
    # are done, and a restore reads the ledger.
    ids = messages + [f"p-{m}" for m in messages]
    wait_for(lambda: Ledger(spark, config.ledger).records().where(
        (F.col("status") == "purged") & F.col("id").isin(ids)).count() == 4 * n, timeout_s=60,
        what="the messages' and payloads' deletions in the ledger")
    return messages, before


def test_an_undo_after_a_wrong_period_puts_every_row_and_blob_back_held_until_released(purger, platform, config,
                                                                                     spark):
    """SPEC 11.2: messages due by the tests' periods in seconds (a policy wrong by a unit) are purged, with their
    references, payload rows and blobs in both data centres. A restore of the policy since the test began puts back
    every row as it was (each ``SELECT JSON *`` equal) and every blob's bytes, records each ``restored`` in the
    ledger, and holds each message: an event that makes one due again finds it held, not deleted; released, it goes
    again with no new event. Checked against what the test read in Cassandra and both stores before the purge."""
    from purger.restore import new_run, plan_restore, restore

    began = now_ms() - 1_000
    messages, before = purged_due(spark, platform, config, uuid.uuid4().hex[:8], 3)
    snapshot = partial(as_stored, platform, config)

    restore_run = new_run()
    # Its ids: the module's other tests' deletions in the same minutes are not this test's to restore.
    plan = plan_restore(spark, config, "mailbox", began, now_ms(), ids=messages + [f"p-{m}" for m in messages])
    done = restore(spark, config, "mailbox", plan, restore_run, "test", "expired_ttl set in seconds")
    assert done.not_restored == [] and done.held == sorted(f"message:{m}" for m in messages)
    restored = Counter((d.kind, d.image.id, d.dc) for d in done.restored)
    assert restored == Counter({("message", m, None) for m in messages}
                               | {("payload_refs", json.dumps([f"p-{m}", m], separators=(",", ":")), None)
                                  for m in messages}
                               | {("payload", f"p-{m}", dc) for m in messages for dc in ("dc1", "dc2", None)})
    assert {m: snapshot(m) for m in messages} == before
    records = Ledger(spark, config.ledger).records().where(f"query_id = 'restore/{restore_run}'").collect()
    assert Counter((rec.kind, rec.id, rec.dc, rec.status) for rec in records) == Counter(
        {(kind, object_id, dc, "restored") for kind, object_id, dc in restored})

    # The policy, still wrong, finds one due again: held, not deleted; released, it goes with no new event.
    again = messages[0]
    platform.dequeue(again, 0)
    platform.flush()
    scope = Scope("message", again)
    wait_for(lambda: held_objects(config, scope) == 1, timeout_s=60, what="the restored message kept under its hold")
    assert platform.row(again) is not None and platform.payload_intact(f"p-{again}")
    assert release_hold(config, scope) == 1
    wait_for(lambda: platform.row(again) is None and platform.payload_gone(f"p-{again}"), timeout_s=60,
             what="the restored message, released, purged again with its payload")
    assert all(snapshot(m) == before[m] for m in messages[1:])


def test_an_erasure_removes_the_subjects_images_from_the_undo_window_but_what_a_hold_keeps(purger, platform, config,
                                                                                          spark):
    """SPEC 11.3 with 11.2: messages of a mailbox purged by retention, their images and payloads' copies kept; the
    mailbox's erasure removes them (its rows' images in Cassandra, its blobs' copies in both stores, the names
    they were found by), but a message held after its purge keeps its images and its payload's; another
    mailbox's purged message keeps all of its. Checked in the tables and the buckets against what the test wrote."""
    from purger.erase import find_objects, new_request, remove_images, wait_for_certificate
    from purger.policies.mailbox.deletes import payload_key
    from purger.sinks.restorations import read_images

    began = now_ms() - 1_000
    run = uuid.uuid4().hex[:8]
    subject, other = Scope("mailbox", f"erased-{run}"), f"other-{run}"
    messages, _ = purged_due(spark, platform, config, run, 4, [subject.id] * 3 + [other])
    erased, held = messages[:2], messages[2]
    assert place_hold(spark, config, Scope("message", held), "case 11", "test", wait_s=60).already is None

    def kept() -> tuple[set, set]:
        """The roots with images in the window, and the payloads with a copy in each store, of this test's."""
        images = {(i.root_kind, i.root_id) for i in read_images(platform.session, config, began, now_ms())
                  if run in i.root_id}
        copies = {(dc, m) for m in messages for dc, store in config.stores.items() for listed in
                  platform.stores[dc].list_objects_v2(Bucket=store.bucket, Prefix=config.undo.prefix).get(
                      "Contents", []) if listed["Key"].endswith(payload_key(f"p-{m}"))}
        return images, copies

    everything = {("message", m) for m in messages} | {("payload", f"p-{m}") for m in messages}
    both = {(dc, m) for m in messages for dc in config.stores}
    assert kept() == (everything, both)

    request = new_request()
    asked = find_objects(spark, config, subject)
    assert asked == []  # purged already: only their images are left
    done = remove_images(with_undo(config), subject, asked,
                         wait_for_certificate(spark, config, subject, request, asked, 30))
    assert done.images_removed >= 2 * (2 + 1 + 2)  # a message's row and reference, its payload's row and two copies
    assert [(e.kind, e.id, e.reason.split(":")[0]) for e in done.images_kept] == [("message", held, "held")]
    assert kept() == (everything - {("message", m) for m in erased} - {("payload", f"p-{m}") for m in erased},
                      {(dc, m) for dc, m in both if m not in erased})
    names = f"{config.cassandra.keyspace}.{config.cassandra.restoration_names_table}"
    days = {datetime.fromtimestamp(at / 1000, timezone.utc).date() for at in (began, now_ms())}
    assert {row.root_id for day in days for row in platform.session.execute(
        f"SELECT root_id FROM {names} WHERE name = %s AND day = %s", (str(subject), day))} == {held}
    release_hold(config, Scope("message", held))


def test_a_hold_placed_while_its_scope_is_being_purged_is_in_force_when_the_command_returns(
        purger, platform, config, spark):
    """SPEC 11.1: messages of a mailbox being purged, a hold placed on it meanwhile: whatever was there when
    ``place_hold`` returned is there after, in Cassandra, however many batches follow; all of it goes at the
    release."""
    r = mailbox(config)
    run = uuid.uuid4().hex[:8]
    scope = Scope("mailbox", f"busy-{run}")
    messages = [f"{run}-{n}" for n in range(300)]
    for m in messages:  # inline payloads: the rows alone, so the purge is quick
        platform.enqueue(m, f"p-{m}", size=100, mailbox=scope.id, at=ago(r.expired_ttl))
        platform.dequeue(m, 0, at=ago(r.expired_ttl))
    platform.flush()
    wait_for(lambda: platform.row(messages[0]) is None or platform.row(messages[-1]) is None, timeout_s=60,
             what="the mailbox's purge to begin")
    placed = place_hold(spark, config, scope, "case 43", "test", wait_s=120)
    there = {m for m in messages if platform.row(m) is not None}
    assert there, "the purge ended before the hold: nothing was in flight to stop"
    # What the batch in flight purged (every message it purged: the ledger does not name mailboxes), of these
    # among them, was purged before the command returned.
    assert placed.already is None and not placed.exact
    assert {object_id for kind, object_id, _ in placed.purged if kind == "message"} & set(messages) <= \
        set(messages) - there
    wait_for(lambda: held_objects(config, scope) == len(there), timeout_s=60,
             what="every message left decided held")
    assert {m for m in messages if platform.row(m) is not None} == there, "deleted after the hold was in force"
    print(f"{len(messages) - len(there)} purged before the hold, {len(there)} held")
    assert release_hold(config, scope) == len(there)
    wait_for(lambda: all(platform.row(m) is None for m in there), timeout_s=90, what="the released messages")


def test_late_events_are_applied_not_dropped(purger, platform, config):
    """A revival whose event comes after the stream fired still protects its message (the row is checked),
    and once applied the state neither forgets nor resurrects anything: a later expiry purges it on time."""
    m = f"late-{uuid.uuid4().hex[:8]}"
    platform.enqueue(m, f"p-{m}")
    zero_at = now()
    platform.dequeue(m, 0, at=zero_at)
    platform.flush()
    with platform.holding() as revival:
        platform.set_counter(m, 1)  # the row is revived now; its event is held back
    deadline = zero_at + mailbox(config).expired_ttl
    wait_for_watermark(purger.query, deadline + timedelta(seconds=2))
    assert platform.row(m)["extract_count"] == 1, "the double-check kept the revived row"
    platform.send(revival)  # far behind the watermark now
    platform.flush()
    time.sleep(3)
    assert platform.row(m) is not None
    platform.dequeue(m, 0)
    platform.flush()
    wait_for(lambda: platform.row(m) is None, what="the message, expired again after the late revival")
    wait_for(lambda: platform.payload_gone(f"p-{m}"), timeout_s=60, what="its payload")
    # A copy of an old event for the purged message changes nothing and stops nothing.
    platform.send(revival)
    platform.flush()
    time.sleep(3)
    assert platform.row(m) is None and platform.payload_gone(f"p-{m}")
    assert rows_dropped_as_late(purger.query) == 0
    assert purger.query.isActive


@pytest.mark.skipif(not FAULTS.full, reason="in CI, tests/sinks/test_purge.py's data centre failing, and the stream's "
                                          "retries through the Cassandra outage: `make faults-full` runs it")
def test_a_failing_data_centre_is_retried_until_done(purger, platform, config, dc2_proxy):
    m = f"dcfail-{uuid.uuid4().hex[:8]}"
    p = f"p-{m}"
    platform.enqueue(m, p, at=ago(mailbox(config).expired_ttl + mailbox(config).payload_grace))
    dc2_proxy.cut()
    try:
        platform.dequeue(m, 0, at=ago(mailbox(config).expired_ttl + mailbox(config).payload_grace))
        platform.flush()
        wait_for(lambda: not platform.blob_exists(p, "dc1"), what="dc1's blob, while dc2 fails")
        # A request through the cut proxy may hang until the client's read timeout (3 x 30 s) before it fails.
        wait_for(lambda: purger.sink.totals[("payload", "error")] >= 1, timeout_s=120,
                 what="an error outcome for dc2's blob")
        # dc1's progress is in the row once dc2 has failed, and dc2 stays to do while it fails.
        row = platform.payload_row(p)
        assert row["state"] == "deleting" and row["dcs"] == {"dc2"}
    finally:
        dc2_proxy.restore()
    wait_for(lambda: platform.payload_gone(p), timeout_s=60, what="dc2's blob and the payload row, once dc2 is back")


def test_a_corpus_of_bad_input_is_dead_lettered_and_deletes_nothing(purger, platform, config, spark):
    """Over 1,000 malformed records of 16 kinds naming live messages, and records a careless reader would take
    for a deletion of one (a delete with a bad time, a dequeue to 0 of the wrong type, a recheck from outside):
    every one lands in the dead-letter topic with its reason, the stream goes on, and nothing is deleted
    because of them (the messages read back from Cassandra and the stores, and the ledger)."""
    run = uuid.uuid4().hex[:6]
    live = [f"bad-input-live-{run}-{i}" for i in range(20)]
    for i, m in enumerate(live):
        # Live, some one step from eligible: a corrupted dequeue to 0 or delete must not tip them over.
        platform.enqueue(m, f"p-{m}", extract_count=1 + i % 2)
    delete_with_bad_time = json.dumps({"event_id": "x", "type": "delete", "event_time": "yesterday",
                                       "message_id": live[0]}).encode()
    zero_with_wrong_type = json.dumps({"event_id": "y", "type": "dequeue", "event_time": "2026-01-01T00:00:00.000Z",
                                       "message_id": live[1], "extract_count": "0"}).encode()
    recheck_from_outside = json.dumps({"event_id": "z", "type": "recheck", "event_time": "2026-01-01T00:00:00.000Z",
                                       "message_id": live[0], "kind": "message", "rule": "deleted"}).encode()
    records = bad_records(live, 1000)
    corpus = [(key, value) for _, key, value in records]
    corpus += [(live[0].encode(), delete_with_bad_time), (live[1].encode(), zero_with_wrong_type),
               (b"k", recheck_from_outside)]
    # The dead-letter topic from where it ends now: the module's other tests' letters are not these.
    consumer = KafkaConsumer(bootstrap_servers=config.kafka.bootstrap_servers, consumer_timeout_ms=2000,
                             max_partition_fetch_bytes=2 * 1024 * 1024)
    partitions = [TopicPartition(config.kafka.dead_letter_topic, p)
                  for p in consumer.partitions_for_topic(config.kafka.dead_letter_topic)]
    consumer.assign(partitions)
    consumer.seek_to_end(*partitions)
    for partition in partitions:
        consumer.position(partition)
    dead_lettered_before = purger.sink.totals[("dead_letter", "dead_lettered")]
    platform.send(corpus)
    good = f"bad-input-good-{run}"
    platform.enqueue(good, f"p-{good}", at=ago(mailbox(config).deleted_ttl))
    platform.delete(good, at=ago(mailbox(config).deleted_ttl))
    platform.flush()

    letters = []
    try:
        deadline = time.monotonic() + 180
        while len(letters) < len(corpus) and time.monotonic() < deadline:
            letters += list(consumer)
    finally:
        consumer.close()
    wait_for(lambda: platform.row(good) is None, what="a good message after the bad ones")
    assert purger.query.isActive

    received = Counter((x.key if x.key is not None else b"", x.value) for x in letters)
    missing = Counter((key if key is not None else b"", value) for key, value in corpus) - received
    assert not missing, f"{sum(missing.values())} bad records not dead-lettered"
    reasons, why = Counter(), {}
    for x in letters:
        headers = dict(x.headers)
        assert headers["reason"] and headers["topic"].decode() == config.kafka.topics[0]
        reasons[headers["reason"].decode().split(" ")[0]] += 1
        why[x.value] = headers["reason"]
    assert why[delete_with_bad_time] == b"event_time is not an ISO-8601 UTC timestamp"
    assert why[zero_with_wrong_type] == b"field extract_count has the wrong type"
    wrongly_deleted = [m for m in live if platform.row(m) is None or not platform.payload_intact(f"p-{m}")]
    named = set(live) | {f"p-{m}" for m in live} | {key_id([f"p-{m}", m]) for m in live}
    caused = Ledger(spark, config.ledger).records().where(
        (F.col("status") == "purged") & F.col("id").isin(*named)).count()
    kinds = {kind for kind, _, _ in records}
    reliability("bad input", injected=len(corpus), kinds=len(kinds),
                dead_lettered=len(letters), crashes=0, wrongly_deleted=len(wrongly_deleted) + caused)
    assert wrongly_deleted == [] and caused == 0
    assert len(kinds) >= 15 and len(reasons) >= 8, reasons
    assert purger.sink.totals[("dead_letter", "dead_lettered")] - dead_lettered_before >= len(corpus)
    wait_for(lambda: observed(purger.query, "dead_lettered") >= 1, what="dead letters in the observed metrics")


def command_killed_at(config, tmp_path, *arguments: str, kill_at: str | None = None):
    """``purger ARGUMENTS`` in a process of its own on ``config``: its ``CompletedProcess``; with ``kill_at``,
    SIGKILLed at that failpoint (asserted), its stderr then in ``tmp_path/<kill_at>.stderr``."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys

    from tests.support import ROOT
    from tests.support.configs import write_config
    from tests.support.faults import killed_at

    command = [sys.executable, "-m", "purger", *arguments, "--config", str(write_config(config, tmp_path / "p.toml"))]
    if kill_at is None:
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    marker = tmp_path / f"{kill_at}.fired"
    with open(tmp_path / f"{kill_at}.stderr", "w") as stderr:
        process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **killed_at(kill_at, marker)},
                                   stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
        try:
            assert process.wait(timeout=300) == -signal.SIGKILL and marker.exists(), kill_at
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    return None


# The commands' kills, a matrix of four: each a `purger` process or two of a Spark session each (about 20 s
# apiece here). Bounded, a run kills one of them, the next on the next day; `make faults-full`, each.
COMMAND_KILLS = ("after_hold_placed", "after_hold_lifted", "erase_half_sent", "restore_half_done")
KILLED_COMMANDS = FAULTS.cases(COMMAND_KILLS, COMMAND_KILLS, per_run=1)


def skip_unless_killed(*failpoints: str) -> None:
    if not set(failpoints) & set(KILLED_COMMANDS):
        pytest.skip(f"bounded fault matrix: this run kills {', '.join(KILLED_COMMANDS)} (`make faults-full`: each)")


def test_hold_and_release_killed_midway_then_run_again_end_as_if_never_killed(purger, platform, config, tmp_path):
    """SPEC 11: `purger hold` killed (SIGKILL) just after the hold is written, and `purger release` just after
    it lifted the hold, before its rechecks: each run again (bounded, one of the two killed, in turn). The hold is
    in force from the first (the due message is kept under it), the release cut short is listed by `purger holds`
    with what to do, and once run again the message goes with no new event: the end state of a hold and a release
    never killed. Checked against the message's row and payload in Cassandra and the holds table."""
    skip_unless_killed("after_hold_placed", "after_hold_lifted")
    r = mailbox(config)
    run = uuid.uuid4().hex[:8]
    scope = Scope("mailbox", f"killed-{run}")
    purger_command = partial(command_killed_at, config, tmp_path)

    hold = ("hold", str(scope), "--reason", "case 44", "--actor", "test")
    if "after_hold_placed" in KILLED_COMMANDS:
        purger_command(*hold, kill_at="after_hold_placed")
        again = purger_command(*hold)
        assert again.returncode == 0 and "already held: held: " in again.stdout and "case 44" in again.stdout, again
    else:
        placed = purger_command(*hold)
        assert placed.returncode == 0 and f"{scope} held: in force" in placed.stdout, placed

    held = f"{run}-held"
    platform.enqueue(held, f"p-{held}", mailbox=scope.id, at=ago(r.expired_ttl))
    platform.dequeue(held, 0, at=ago(r.expired_ttl))
    platform.flush()
    wait_for(lambda: held_objects(config, scope) == 1, timeout_s=60, what="the due message kept under the hold")

    release = ("release", str(scope), "--reason", "case 44 closed", "--actor", "test")
    if "after_hold_lifted" in KILLED_COMMANDS:
        purger_command(*release, kill_at="after_hold_lifted")
        listed = purger_command("holds", "--json")
        assert listed.returncode == 0, listed.stderr[-2000:]
        assert [h for h in json.loads(listed.stdout) if h["scope"] == str(scope)] == [{
            "scope": str(scope), "reason": None, "placed_by": None, "placed_at": None, "held_objects": 1,
            "release_cut_short": True}]
        time.sleep(3)  # more than a recheck's interval: nothing looked at it again, the release's rechecks not sent
        assert platform.row(held) is not None

    finished = purger_command(*release)
    assert finished.returncode == 0 and "1 held objects looked at again" in finished.stdout, finished
    wait_for(lambda: platform.row(held) is None and platform.payload_gone(f"p-{held}"), timeout_s=60,
             what="the message released, then its payload, with no new event")
    listed = purger_command("holds", "--json")
    assert [h for h in json.loads(listed.stdout) if h["scope"] == str(scope)] == []


def test_an_erasure_killed_midway_then_run_again_with_its_request_ends_as_if_never_killed(purger, platform, config,
                                                                                        tmp_path):
    """SPEC 11.3: `purger erase` SIGKILLed once half its objects were asked for, then run again with the request
    id it printed first: every message of the mailbox and its payload gone (Cassandra, both stores), another
    mailbox's kept, and the second run's certificate (`--json`) names every deletion of both runs once."""
    skip_unless_killed("erase_half_sent")
    run = uuid.uuid4().hex[:8]
    subject = f"erase-{run}"
    messages = [f"{run}-{n}" for n in range(6)]
    for m in messages:  # never dequeued: live for years
        platform.enqueue(m, f"p-{m}", mailbox=subject)
    platform.enqueue(f"{run}-kept", f"p-{run}-kept", mailbox=f"other-{run}")
    platform.flush()
    erase = ["erase", f"mailbox:{subject}", "--reason", "GDPR request 12", "--actor", "test"]
    command_killed_at(config, tmp_path, *erase, kill_at="erase_half_sent")
    request = re.search(r"request (\S+):", (tmp_path / "erase_half_sent.stderr").read_text()).group(1)
    finished = command_killed_at(config, tmp_path, *erase, "--request", request, "--json", "--wait", "120")
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert all(platform.row(m) is None and platform.payload_gone(f"p-{m}") for m in messages)
    assert platform.row(f"{run}-kept") is not None and platform.payload_intact(f"p-{run}-kept")
    done = json.loads(finished.stdout)
    assert done["complete"] and done["request"] == request and done["kept"] == done["gone"] == []
    assert done["images_removed"] == 0 and done["images_kept"] == []  # live for years: no purge kept an image
    deleted = Counter((e["kind"], e["id"], e["dc"]) for e in done["deleted"])
    assert deleted == Counter({("message", m, None) for m in messages}
                              | {("payload_refs", json.dumps([f"p-{m}", m], separators=(",", ":")), None)
                                 for m in messages}
                              | {("payload", f"p-{m}", dc) for m in messages for dc in ("dc1", "dc2", None)})


def test_a_restore_killed_midway_then_run_again_with_its_run_ends_as_if_never_killed(purger, platform, config,
                                                                                     tmp_path, spark):
    """SPEC 11.2: `purger restore` SIGKILLed once half of what it puts back is back (its holds placed, no ledger
    record yet), then run again with the run id it printed first: every row and blob as the test read them before
    the purge, and the ledger's records of the run each once, `restored`."""

    skip_unless_killed("restore_half_done")
    began = datetime.now(timezone.utc) - timedelta(seconds=2)
    messages, before = purged_due(spark, platform, config, uuid.uuid4().hex[:8], 2)
    restore = ["restore", "--policy", "mailbox", "--since", f"{began:%Y-%m-%dT%H:%M:%S}", "--reason",
               "expired_ttl set in seconds", "--actor", "test"]
    for m in messages:
        restore += ["--id", m, "--id", f"p-{m}"]
    command_killed_at(config, tmp_path, *restore, kill_at="restore_half_done")
    run = re.search(r"run (\S+):", (tmp_path / "restore_half_done.stderr").read_text()).group(1)
    finished = command_killed_at(config, tmp_path, *restore, "--run", run, "--json")
    assert finished.returncode == 0, finished.stderr[-3000:]
    done = json.loads(finished.stdout)
    assert {e["status"] for e in done["deletions"]} == {"restored"} and len(done["deletions"]) == 5 * len(messages)
    assert {m: as_stored(platform, config, m) for m in messages} == before
    records = Ledger(spark, config.ledger).records().where(f"query_id = 'restore/{run}'").collect()
    assert Counter((rec.kind, rec.id, rec.dc, rec.status) for rec in records) == Counter(
        {(e["kind"], e["id"], e["dc"], "restored") for e in done["deletions"]})
