"""The ledger as evidence (docs/reliability.md, "The ledger's semantics"), path by path, on the real servers: the
sink's own purge of a partition (``sinks.purge.purge_partition``) and the Delta ledger's write
(``sinks.ledger.Ledger.append``), with the faults that once made the ledger miss or invent a deletion. Each test
compares the ledger with what the test's platform wrote and removed itself (the oracle), never with the
purger's own counts: 0 deletions without a record, 0 records without a deletion, 0 doubled.

RELIABILITY.md's ledger-path table names each test here.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from pyspark.sql import functions as F

from purger.testing import injected
from purger.core.vocabulary import ALREADY_GONE, PURGED
from purger.policies.mailbox.rules import EXPIRED_BY_COUNTER
from purger.sinks.ledger import Ledger
from purger.sinks.purge import OUTCOME_SCHEMA, purge_partition, to_ledger
from tests.support.configs import mailbox
from tests.support.mailbox import candidate, new_id
from tests.support.waits import ago

pytestmark = pytest.mark.integration


class Crash(BaseException):
    """A kill of the task at a failpoint: its outcomes are lost (not an ``Exception``, which the purge of one
    candidate would record as an error)."""


@pytest.fixture
def ledger(spark, config, tmp_path):
    return Ledger(spark, config.ledger.model_copy(update={"path": str(tmp_path / "ledger")}))


def due_message(platform, config) -> str:
    """A message expired by its counter long ago, with its own payload in both data centres."""
    m, r = new_id("evidence"), mailbox(config)
    platform.enqueue(m, f"p-{m}", at=ago(r.expired_ttl))
    platform.dequeue(m, 0, at=ago(r.expired_ttl))
    return m


def run(spark, config, ledger, query, batch, ids, crash_at=None):
    """One attempt of ``batch``: its messages purged by the sink's code, then its outcomes written to the ledger
    as the sink writes them (``may_hold`` when a record may be there already). A crash at ``crash_at`` loses the
    attempt's outcomes (returns None)."""
    rows = [candidate("message", m, EXPIRED_BY_COUNTER, payload_id=f"p-{m}") for m in ids]

    def crash(name):
        if name == crash_at:
            raise Crash(name)

    try:
        with injected(crash):
            outcomes = list(to_ledger(purge_partition(rows, config, batch, query_id=query)))
    except Crash:
        return None
    frame = spark.createDataFrame(outcomes, OUTCOME_SCHEMA)
    from_intent = any(o[-1] is not None for o in outcomes)
    ledger.append(frame, query, batch, may_hold=from_intent or batch_retried(ledger, query, batch))
    return outcomes


def batch_retried(ledger, query, batch) -> bool:
    return ledger.exists() and ledger.holds(query, batch)


def purged_records(ledger) -> Counter:
    messages = ledger.records().where((F.col("status") == PURGED) & (F.col("kind") == "message"))
    return Counter(r["id"] for r in messages.collect())


def test_a_batch_retried_after_its_ledger_write_records_what_the_retry_newly_deletes(spark, config, platform, ledger):
    """The retry runs every purge again: the first attempt's deletion is found gone and recorded from its intent
    (the same record), a row that became due meanwhile is deleted and recorded; nothing doubles."""
    query, first, meanwhile = new_id("q"), due_message(platform, config), new_id("evidence")
    platform.enqueue(meanwhile, f"p-{meanwhile}")  # live for now
    run(spark, config, ledger, query, 5, [first, meanwhile])
    r = mailbox(config)
    platform.dequeue(meanwhile, 0, at=ago(r.expired_ttl))  # due now: the retry will delete it
    run(spark, config, ledger, query, 5, [first, meanwhile])
    deleted = {m for m in (first, meanwhile) if platform.row(m) is None}
    assert deleted == {first, meanwhile}
    assert purged_records(ledger) == Counter({first: 1, meanwhile: 1})


@pytest.mark.parametrize("crash_at", ["after_message_delete", "before_message_delete"])
def test_a_task_killed_around_its_delete_is_recorded_once_by_the_retry(spark, config, platform, ledger, crash_at):
    """Killed once the row is deleted, before its outcome reached the ledger: the retry finds it gone with the
    purger's intent and records it. Killed before anything: the retry deletes it itself."""
    query, m = new_id("q"), due_message(platform, config)
    assert run(spark, config, ledger, query, 3, [m], crash_at=crash_at) is None
    run(spark, config, ledger, query, 3, [m])
    run(spark, config, ledger, query, 4, [m])  # a later batch finding it gone again (a recheck, a feed)
    assert platform.row(m) is None
    assert purged_records(ledger) == Counter({m: 1})


def test_a_row_the_platform_removed_itself_is_never_recorded_as_purged(spark, config, platform, ledger):
    """No intent: the purger did not delete it, in a first attempt or a retry of the batch."""
    query, m = new_id("q"), due_message(platform, config)
    platform.session.execute(f"DELETE FROM {mailbox(config).messages_table} WHERE message_id = %s", (m,))
    for _ in range(2):
        [outcome] = [o for o in run(spark, config, ledger, query, 8, [m]) if o[1] == "message"]
        assert outcome[5] == ALREADY_GONE
    assert purged_records(ledger) == Counter()


def test_a_retried_batchs_bad_records_are_each_recorded_once(spark, config, ledger):
    """Three bad records of one partition, from the stateful stage's processor through the sink, in a batch whose
    ledger write is a merge (a retry: its first attempt died before it), then run once more: one ``dead_lettered``
    record each. They once shared an id (their partition's), and the merge kept one per partition."""
    from pyspark.sql import Row

    from purger.core.vocabulary import DEAD_LETTER, DEAD_LETTERED
    from purger.streams.processor import PurgeProcessor

    topic, query = config.kafka.topics[0], new_id("q")
    bad = [Row(error="value is not a JSON object", key=b"k", value=b"[1]", topic=topic, partition=0, offset=offset)
           for offset in (7, 8, 9)]
    letters = list(PurgeProcessor(config.policy_set, 0, 0).handleInputRows((DEAD_LETTER, f"{topic}/0"), iter(bad), None))
    ledger.create()
    for _ in range(2):
        outcomes = list(to_ledger(purge_partition(letters, config, 6, query_id=query)))
        ledger.append(spark.createDataFrame(outcomes, OUTCOME_SCHEMA), query, 6, may_hold=True)
    recorded = ledger.records().where(F.col("status") == DEAD_LETTERED).collect()
    assert Counter(r["id"] for r in recorded) == Counter({f"{topic}/0/{offset}": 1 for offset in (7, 8, 9)})


@pytest.fixture
def held_cassandra(config):
    """A session of the purger's own on Cassandra through a TCP proxy that can hold its answers, with a short
    request timeout; the proxy and the session."""
    from cassandra.cluster import EXEC_PROFILE_DEFAULT

    from purger.connectors import cassandra_session
    from tests.support.faults import TcpProxy

    proxy = TcpProxy(config.cassandra.hosts[0], config.cassandra.port).start()
    session = cassandra_session(config.cassandra.model_copy(update={"port": proxy.port}))
    session.get_execution_profile(EXEC_PROFILE_DEFAULT).request_timeout = 2
    yield proxy, session
    proxy.release()
    session.cluster.shutdown()


def test_a_conditional_delete_whose_answer_never_came_ends_purged_once(spark, config, platform, ledger,
                                                                        held_cassandra):
    """The conditional delete reaches Cassandra and applies, its answer is held past the driver's timeout, and
    the serial read that should settle it times out too: the candidate is an ``error`` (and rechecked). The
    recheck finds the row gone with the purger's intent: ``purged``, one record, never left as an error."""
    from cassandra import OperationTimedOut

    from purger.core.policy import Attempt, Candidate
    from purger.core.times import now_ms
    from tests.support.mailbox import message_purge, own

    proxy, session = held_cassandra
    purge, _ = message_purge(session, config)
    query, m = new_id("q"), due_message(platform, config)
    candidate_ = Candidate("message", m, EXPIRED_BY_COUNTER, now_ms(), {"payload_id": f"p-{m}"})

    def answers_held(name):
        if name == "before_message_delete":
            proxy.hold()

    with injected(answers_held), pytest.raises(OperationTimedOut):
        list(purge.purge(candidate_, Attempt(batch=f"{query}/1")))
    proxy.release()
    assert platform.row(m) is None, "the delete reached Cassandra and applied"
    error = outcome_row(m, "error", f"{query}/1", None)
    outcomes = list(purge.purge(candidate_, Attempt(batch=f"{query}/2")))
    recheck = own(outcomes)
    assert (recheck.status, recheck.intent) == (PURGED, f"{query}/1")
    # The payload_refs row its intent named, left by the attempt that raised: deleted at the recheck, recorded.
    assert [(o.kind, o.status, o.intent) for o in outcomes if o.kind] == [("payload_refs", PURGED, f"{query}/1")]
    assert platform.session.execute(f"SELECT * FROM {mailbox(config).payload_refs_table} WHERE payload_id = %s",
                                    (f"p-{m}",)).one() is None
    ledger.append(spark.createDataFrame([error], OUTCOME_SCHEMA), query, 1, may_hold=False)
    ledger.append(spark.createDataFrame([outcome_row(m, PURGED, f"{query}/2", recheck.intent)], OUTCOME_SCHEMA),
                  query, 2)
    assert purged_records(ledger) == Counter({m: 1})


def outcome_row(message_id, status, batch, intent):
    """An ``OUTCOME_SCHEMA`` row as the sink makes it for a message of this module."""
    from purger.core.times import now_ms

    at = now_ms()
    return ("mailbox", "message", message_id, EXPIRED_BY_COUNTER, None, status, None, at, at,
            at if status == PURGED else None, int(batch.rsplit("/", 1)[1]), "test:1", intent)


def test_the_platform_deleting_rows_under_a_running_purger_is_never_recorded_as_the_purgers(spark, config, tmp_path):
    """A running purger purges due messages while the platform removes some of the same messages itself, each
    with a conditional delete (``DELETE ... IF EXISTS``) racing the purger's own: exactly one of the two applies,
    and Cassandra's answer says which (the oracle). A message the platform removed has no ``purged`` record
    (``already_gone``); one the purger removed has exactly one; what the platform's removal left (the message's
    ``payload_refs`` row, its payload) the purger deletes and records once."""
    import random
    import threading

    from purger.running import start_purger
    from simulation.mailbox import Platform
    from tests.support.configs import own_config
    from tests.support.mailbox import deletable, end_state
    from tests.support.waits import wait_for

    own = own_config(config, tmp_path, "platform-deletes")
    platform = Platform(own)
    ids = deletable(platform, own, 40, "removed")  # due at once
    remove = platform.session.prepare(f"DELETE FROM {own.cassandra.keyspace}.{mailbox(own).messages_table} "
                                      "WHERE message_id = ? IF EXISTS")
    removed_by_platform: set[str] = set()
    rng = random.Random(7)
    # 24 of the 40 removed by the platform: 4 before the purger starts, 20 at once as soon as the purger's first
    # deletion shows (racing its batch); the 16 others are the purger's alone.
    before, racing = (lambda sample: (sample[:4], sample[4:]))(rng.sample(ids, 24))
    for m in before:
        if platform.session.execute(remove, (m,)).was_applied:
            removed_by_platform.add(m)
    others = [m for m in ids if m not in before]

    def platform_removes() -> None:
        while all(platform.row(m) is not None for m in rng.sample(others, 8)):
            time.sleep(0.01)
        for m, applied in zip(racing, [platform.session.execute_async(remove, (m,)) for m in racing]):
            if applied.result().was_applied:
                removed_by_platform.add(m)

    running = start_purger(spark, own)
    remover = threading.Thread(target=platform_removes, name="platform-removes")
    remover.start()
    try:
        remover.join(timeout=120)
        wait_for(lambda: all(platform.row(m) is None and platform.payload_gone(f"p-{m}") for m in ids), 180,
                 "every message, platform's or purger's, and its payload gone")
        decided = Ledger(spark, own.ledger)
        wait_for(lambda: {r["id"] for r in decided.records().where(F.col("kind") == "message").collect()} >= set(ids),
                 120, "a decision on every message in the ledger")
    finally:
        running.stop()
    wrongly_deleted, missing, doubled, unexpected = end_state(spark, platform, own, ids, [])
    platform.close()
    # Each side won some: the platform those it removed first, the purger at least the 16 the platform left.
    assert set(before) <= removed_by_platform <= set(before + racing)
    print(f"of the {len(racing)} removals racing the purger's batch, the platform's applied: "
          f"{len(removed_by_platform) - len(before)}")
    # Only the platform's removals lack a record: the messages themselves, nothing they left behind.
    assert (wrongly_deleted, missing, doubled, unexpected) == (
        [], {("message", m, None) for m in removed_by_platform}, set(), set())
    statuses = Counter((r["id"], r["status"]) for r in decided.records().where(F.col("kind") == "message").collect())
    assert all(statuses[(m, ALREADY_GONE)] >= 1 for m in removed_by_platform)
