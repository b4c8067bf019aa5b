"""The purger's reads against the tombstones its own deletes leave (docs/operations.md, Tables and tombstones).

One payload shared by more messages than Cassandra's default ``tombstone_warn_threshold`` (1,000): their
references purged through the purger's own code leave that many row tombstones in the payload's ``payload_refs``
partition, which the purger's reference check (``MessagePurge.two_refs``) scans past. The tombstones it meets
are Cassandra's own figure, from the read's trace; a purged message's own row and intent, beside, meet none that
count. The journal, the purger's own table, is created with its TTL and compacted by day windows.
"""

import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from purger.connectors import cassandra_session
from purger.policies.mailbox import MailboxPolicy
from purger.policies.mailbox.rules import EXPIRED_BY_COUNTER, PAYLOAD
from purger.policies.mailbox.state import MESSAGE, RELEASED
from purger.core.vocabulary import PURGED, SKIPPED
from purger.sinks.journal import JOURNAL_TTL_S
from tests.support.mailbox import candidate, message_purge, new_id, purge, purge_message
from tests.support.policies import policy_keyspace
from tests.support.configs import mailbox
from tests.support.waits import ago

pytestmark = pytest.mark.integration

# Cassandra's defaults (cassandra.yaml): a read meeting more tombstones than these warns, or fails.
TOMBSTONE_WARN_THRESHOLD = 1_000
TOMBSTONE_FAILURE_THRESHOLD = 100_000
# More messages on one payload than the warning threshold: one reference left, sorted after the purged ones.
SHARING = 1_200

_READ = re.compile(r"Read (\d+) live rows and (\d+) tombstone cells")


def live_and_tombstones(session: Any, statement: Any, *values: Any) -> tuple[int, int]:
    """The live rows and tombstones Cassandra says ``statement`` met (summed over the trace's reads)."""
    result = session.execute(statement, values, trace=True)
    events = result.get_query_trace(max_wait_sec=30).events
    found = [tuple(map(int, m.groups())) for e in events if (m := _READ.search(e.description))]
    assert found, f"no read in the trace: {[e.description for e in events]}"
    return sum(live for live, _ in found), sum(tombstones for _, tombstones in found)


def test_the_reference_check_meets_each_purged_reference_once_and_stays_under_the_failure_threshold(
        platform, config):
    r = mailbox(config)
    tag, p = new_id("tomb"), new_id("pay")
    purged = [f"{tag}-a-{n:05d}" for n in range(SHARING - 1)]
    survivor = f"{tag}-z"  # sorts last: the check scans past every purged reference before it
    platform.enqueue(purged[0], p, extract_count=0, at=ago(r.expired_ttl))
    with ThreadPoolExecutor(8) as pool:
        linked = list(pool.map(lambda m: platform.enqueue(m, p, extract_count=0, shared=True,
                                                          at=ago(r.expired_ttl)), purged[1:] + [survivor]))
    assert set(linked) == {p} and len(platform.references(p)) == SHARING

    session = cassandra_session(config.cassandra)
    try:
        messages, control = message_purge(session, config)
        with ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(lambda m: purge_message(messages, m, EXPIRED_BY_COUNTER, p), purged))
        assert {o.status for o in outcomes} == {PURGED}
        assert platform.references(p) == {survivor} and not control.reports
        # A purged message's own row and intent: its deleted partition and the set its intent's insert replaced
        # are not counted towards the thresholds.
        assert live_and_tombstones(session, messages.read_row, purged[0]) == (0, 0)
        assert live_and_tombstones(session, messages.resources.journal.select, MESSAGE, purged[0]) == (1, 0)

        # The check each purge made, as it is now: past every purged reference to the one left.
        assert messages.referrer(p) == survivor
        live, tombstones = live_and_tombstones(session, messages.two_refs, p)
        assert live == 1 and TOMBSTONE_WARN_THRESHOLD < tombstones == SHARING - 1 < TOMBSTONE_FAILURE_THRESHOLD
        [kept] = purge(config, candidate("payload", p, PAYLOAD))
        assert (kept["status"], kept["reason"]) == (SKIPPED, f"referenced: by message {survivor}")

        # The last message: its check finds none left and releases the payload, whose purge checks again.
        assert purge_message(messages, survivor, EXPIRED_BY_COUNTER, p).status == PURGED
        assert [(event, payload) for event, payload, _, _ in control.reports] == [(RELEASED, p)]
        live, tombstones = live_and_tombstones(session, messages.two_refs, p)
        assert (live, tombstones) == (0, SHARING)
        outcomes = purge(config, candidate("payload", p, PAYLOAD))
        assert [(o["dc"], o["status"]) for o in outcomes] == [("dc1", PURGED), ("dc2", PURGED), (None, PURGED)]
        assert platform.payload_gone(p)
    finally:
        session.cluster.shutdown()


def test_the_journal_is_created_with_its_ttl_and_compacted_by_day_windows(config):
    with policy_keyspace(MailboxPolicy, "tombstones", config.cassandra) as (session, keyspace):
        table = session.execute(
            "SELECT default_time_to_live, compaction FROM system_schema.tables "
            "WHERE keyspace_name = %s AND table_name = %s", (keyspace, config.cassandra.journal_table)).one()
    assert table.default_time_to_live == JOURNAL_TTL_S == 30 * 24 * 3600
    assert table.compaction["class"].endswith(".TimeWindowCompactionStrategy")
    assert (table.compaction["compaction_window_unit"], table.compaction["compaction_window_size"]) == ("DAYS", "1")
