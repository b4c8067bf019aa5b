"""A conditional delete that timed out with only a minority's acceptance, and the platform's revival written
before the purger's serial read settles it (issue 51; RELIABILITY.md, "Races with other writers").

On Paxos v1 (Cassandra 5.0's default) a proposal accepted by a minority and not committed is finished by the
next Paxos round whose majority holds one of those replicas, re-proposed under that round's ballot, its cells
stamped with the new ballot's time (``StorageProxy.beginAndRepairPaxos``, ``Commit.newProposal``). The purger's
serial read after the timeout is such a round: it applies the delete over any plain write made since, which is
why the writer contract asks a revival to be a lightweight transaction (docs/policies.md, "What each write must
use"). The ring's nodes 2 and 3 answer the delete's proposal late (``answer_late``) and node 3 the settling
read's prepare: node 1 alone accepts the delete, and the next rounds' majority holds it.

The oracle is Cassandra's own answers to the test's writer: a plain revival acknowledged at QUORUM, or the
lightweight transaction's ``[applied]``, against the row read at ALL afterwards.
"""

from __future__ import annotations

import pytest
from cassandra import ConsistencyLevel

from purger.core.vocabulary import PURGED
from purger.policies.mailbox.rules import EXPIRED_BY_COUNTER
from purger.testing import injected
from simulation.mailbox import Platform
from tests.support.configs import mailbox
from tests.support.mailbox import message_purge, new_id, own, purge_message_all
from tests.support.waits import ago, now

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def platform(ring_config):
    platform = Platform(ring_config)
    yield platform
    platform.close()


def due_message(platform: Platform, config) -> str:
    """A message expired by its counter long ago, its payload inline (no blob)."""
    m, settings = new_id("paxos"), mailbox(config)
    platform.enqueue(m, f"p-{m}", size=100, at=ago(settings.expired_ttl))
    platform.dequeue(m, 0, at=ago(settings.expired_ttl))
    return m


def revive(platform: Platform, config, m: str, conditional: bool) -> bool:
    """The platform sets the message's counter again: a plain ``UPDATE`` at QUORUM (acknowledged: True), or the
    same as a lightweight transaction (``IF EXISTS``: whether it applied)."""
    statement = platform.session.prepare(
        f"UPDATE {mailbox(config).messages_table} SET extract_count = 1, updated_at = ? WHERE message_id = ?"
        + (" IF EXISTS" if conditional else ""))
    statement.consistency_level = ConsistencyLevel.QUORUM
    answer = platform.session.execute(statement, (now(), m))
    return answer.was_applied if conditional else True


def row_at_all(platform: Platform, config, m: str) -> bool:
    statement = platform.session.prepare(f"SELECT message_id FROM {mailbox(config).messages_table} "
                                         "WHERE message_id = ?")
    statement.consistency_level = ConsistencyLevel.ALL
    return platform.session.execute(statement, (m,)).one() is not None


def purge_with_revival_before_the_settling_read(paxos_ring, platform, config, conditional: bool
                                                ) -> tuple[str, bool, str]:
    """The delete's proposal accepted by node 1 alone (a timeout), the revival written, then the serial read
    whose majority holds node 1: the message, the revival's answer and the purge's outcome."""
    from purger.connectors import cassandra_session

    m = due_message(platform, config)
    session = cassandra_session(config.cassandra)
    purge, _ = message_purge(session, config)
    revived: list[bool] = []

    def at(name: str) -> None:
        if name == "before_message_delete":
            paxos_ring.answer_late(accepts=True)
        elif name == "after_message_delete_failed":
            paxos_ring.answer_late(promises=True)
            revived.append(revive(platform, config, m, conditional))

    try:
        with injected(at):
            outcome = own(purge_message_all(purge, m, EXPIRED_BY_COUNTER, f"p-{m}"))
    finally:
        paxos_ring.answer_late()
        session.cluster.shutdown()
    assert revived, "the delete did not fail: node 1 alone cannot have been the only one to accept it"
    return m, revived[0], outcome.status


def test_a_plain_revival_before_a_timed_out_deletes_settling_read_is_lost_on_paxos_v1(paxos_ring, ring_config,
                                                                                       platform):
    """Why the writer contract asks for a lightweight transaction: the plain revival, acknowledged at QUORUM,
    is gone under the delete that the serial read finished with a newer timestamp; the purger says purged."""
    m, acknowledged, status = purge_with_revival_before_the_settling_read(paxos_ring, platform, ring_config,
                                                                          conditional=False)
    assert acknowledged
    assert status == PURGED
    assert not row_at_all(platform, ring_config, m), "the plain revival was kept: the interleaving did not happen"


def test_a_conditional_revival_before_a_timed_out_deletes_settling_read_is_told_the_message_is_gone(
        paxos_ring, ring_config, platform):
    """The revival as the contract asks, a lightweight transaction whose majority holds node 1: it finishes the
    delete first and does not apply, so the platform knows the message went; nothing it revived is lost."""
    m, applied, status = purge_with_revival_before_the_settling_read(paxos_ring, platform, ring_config,
                                                                     conditional=True)
    kept = row_at_all(platform, ring_config, m)
    assert (applied, kept, status) == (False, False, PURGED)
